package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"
)

// appDetails is what the details page says about one app
// (docs/playstore-protocol.md §2.5).
// Pointers are nullable: nil means the page did not carry the field.
type appDetails struct {
	PackageName string
	Block       string   // key of the data block read, e.g. "ds:5"
	Slots       int      // length of the app message array
	SparseKeys  []string // field numbers of the trailing object, if any

	Title        string
	Genre        *string
	GenreID      *string
	InstallsText *string
	MinInstalls  *int64
	RealInstalls *int64
	Score        *float64
	ScoreText    *string
	Ratings      *int64
	ReviewsCount *int64
	Histogram    *[5]int64 // ratings of 1 to 5 stars, in that order
	Version      *string
	AdSupported  bool
	AdsLabel     *string // "Contains ads"; nil when the app has no ads
	UpdatedAt    *time.Time
	UpdatedText  *string

	Developer           *string
	DeveloperID         *string
	DeveloperInternalID *string

	PriceMicros *int64
	Currency    *string
	PriceText   *string
	Free        *bool
	OffersIAP   bool
	// AvailableCode is 2 when installable in the storefront, 1 for
	// pre-registration.
	AvailableCode *int64
	Released      *string
	ReleasedAt    *time.Time
	ContentRating *string
	// RecentChangesHTML is the "what's new" text, in HTML.
	RecentChangesHTML *string

	// FetchedAt is when the response arrived: the message's crawled_at.
	FetchedAt time.Time
}

// review is one record of a reviews page (docs/playstore-protocol.md §3.4).
type review struct {
	ReviewID      string
	UserName      *string
	UserImage     *string
	Score         *int
	Content       *string
	At            time.Time
	ThumbsUpCount *int64
	ReplyContent  *string
	RepliedAt     *time.Time
	AppVersion    *string
	// FetchedAt is when the page carrying the review arrived.
	FetchedAt time.Time
}

// reviewsPage is one decoded batchexecute answer.
type reviewsPage struct {
	Reviews   []review
	NextToken string // "" on the last page
	Skipped   int    // records without id or timestamp, unusable downstream
}

// parseError says which part of a response could not be read; Path names the
// place in the terms of docs/playstore-protocol.md (§2.3, §3.2), e.g.
// "ds:5[1][2][0][0] (title)".
type parseError struct {
	Path   string
	Detail string
}

func (e *parseError) Error() string {
	if e.Detail == "" {
		return "cannot parse Play Store response at " + e.Path
	}
	return "cannot parse Play Store response at " + e.Path + ": " + e.Detail
}

// reason is the metric label and summary key of a parse failure: what the
// parser found wrong, without the block keys and positions of Path, which
// vary from page to page.
func (e *parseError) reason() string {
	if e.Detail == "" {
		return "unreadable"
	}
	return e.Detail
}

// parseRecovering runs parse on body; a panic of the parser becomes a
// *parseError ("parser panicked") naming the panic, so a page the parser
// breaks on is that app's parse error, counted like any other.
func parseRecovering[T any](parse func([]byte) (T, error), body []byte) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			var zero T
			v, err = zero, fmt.Errorf("%w: %w", &parseError{Path: "the page", Detail: "parser panicked"}, recoveredPanic(p))
		}
	}()
	return parse(body)
}

const (
	detailsRPC = "Ws7gDc"
	// fallbackDetailsBlock is where every page since Aug 2022 keeps the app,
	// used only when the routing table itself is missing.
	fallbackDetailsBlock = "ds:5"
)

// parseDetailsPage reads the app record out of a details page. Only the
// routing table and the candidate blocks are touched, never the whole HTML.
func parseDetailsPage(page []byte) (appDetails, error) {
	block, key, err := findDetailsBlock(page)
	if err != nil {
		return appDetails{}, err
	}
	return readDetails(block, key)
}

// findDetailsBlock returns the app message R (block[1][2]) and the key of its
// block: among blocks routed to Ws7gDc, the one whose R[0][0] is a string
// (docs/playstore-protocol.md §2.3).
func findDetailsBlock(page []byte) (jsonValue, string, error) {
	candidates := routedBlocks(page, detailsRPC)
	if len(candidates) == 0 {
		candidates = []string{fallbackDetailsBlock}
	}
	for key, data := range dataBlocks(page) {
		if !slices.Contains(candidates, key) || !json.Valid(data) {
			continue
		}
		r := jsonValue(data).get(1, 2)
		if r.get(0, 0).isString() {
			return r, key, nil
		}
	}
	return nil, "", &parseError{
		Path:   strings.Join(candidates, "|") + "[1][2][0][0]",
		Detail: "no " + detailsRPC + " data block holds an app title",
	}
}

// routedBlocks reads the page's routing table (a JS object literal, not JSON:
// `'ds:5' : {id:'Ws7gDc',request:[...]}`) and returns the keys routed to rpc.
func routedBlocks(page []byte, rpc string) []string {
	start := bytes.Index(page, []byte("AF_dataServiceRequests"))
	if start < 0 {
		return nil
	}
	table := page[start:]
	if end := bytes.Index(table, []byte("AF_initDataChunkQueue")); end >= 0 {
		table = table[:end]
	}
	var keys []string
	for {
		i := bytes.Index(table, []byte("'ds:"))
		if i < 0 {
			return keys
		}
		table = table[i+1:]
		key, rest, ok := cutDigitsKey(table)
		if !ok {
			continue
		}
		rest = bytes.TrimLeft(rest, " ")
		if !bytes.HasPrefix(rest, []byte(":")) {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " ")
		if !bytes.HasPrefix(rest, []byte("{")) {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " ")
		if !bytes.HasPrefix(rest, []byte("id:")) {
			continue
		}
		rest = bytes.TrimLeft(rest[3:], " ")
		if id, _, ok := cutQuoted(rest); ok && string(id) == rpc {
			keys = append(keys, key)
		}
	}
}

// cutDigitsKey reads `ds:<digits>'` at the start of b.
func cutDigitsKey(b []byte) (key string, rest []byte, ok bool) {
	if !bytes.HasPrefix(b, []byte("ds:")) {
		return "", nil, false
	}
	n := 3
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	if n == 3 || n >= len(b) || b[n] != '\'' {
		return "", nil, false
	}
	return string(b[:n]), b[n+1:], true
}

// cutQuoted reads a single-quoted JS string at the start of b.
func cutQuoted(b []byte) (value, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '\'' {
		return nil, nil, false
	}
	end := bytes.IndexByte(b[1:], '\'')
	if end < 0 {
		return nil, nil, false
	}
	return b[1 : 1+end], b[2+end:], true
}

// dataBlocks yields the key and raw JSON payload of every
// `>AF_initDataCallback({key: 'ds:N', hash: 'H', data:<JSON>, sideChannel: {}});</script`
// (docs/playstore-protocol.md §2.2).
func dataBlocks(page []byte) iter.Seq2[string, []byte] {
	marker := []byte(">AF_initDataCallback(")
	return func(yield func(string, []byte) bool) {
		for {
			i := bytes.Index(page, marker)
			if i < 0 {
				return
			}
			page = page[i+len(marker):]
			end := bytes.Index(page, []byte("</script"))
			if end < 0 {
				end = len(page)
			}
			script := page[:end]
			page = page[end:]
			key, data, ok := splitDataBlock(script)
			if ok && !yield(key, data) {
				return
			}
		}
	}
}

// splitDataBlock takes the text of one AF_initDataCallback call apart.
func splitDataBlock(script []byte) (key string, data []byte, ok bool) {
	k := bytes.Index(script, []byte("ds:"))
	if k < 0 {
		return "", nil, false
	}
	key, _, ok = cutDigitsKey(script[k:])
	if !ok {
		return "", nil, false
	}
	d := bytes.Index(script, []byte("data:"))
	// The payload may itself contain the end marker inside a string, so the
	// last occurrence is the real end.
	e := bytes.LastIndex(script, []byte(", sideChannel:"))
	if d < 0 || e < d+len("data:") {
		return "", nil, false
	}
	return key, bytes.TrimSpace(script[d+len("data:") : e]), true
}

// readDetails reads the fields of docs/playstore-protocol.md §2.5 from R.
func readDetails(r jsonValue, block string) (appDetails, error) {
	title, ok := r.get(0, 0).str()
	if !ok {
		return appDetails{}, &parseError{Path: block + "[1][2][0][0] (title)", Detail: "missing"}
	}
	d := appDetails{
		Block:               block,
		Title:               title,
		Genre:               r.get(79, 0, 0, 0).strPtr(),
		GenreID:             r.get(79, 0, 0, 2).strPtr(),
		Developer:           r.get(68, 0).strPtr(),
		Released:            r.get(10, 0).strPtr(),
		ContentRating:       r.get(9, 0).strPtr(),
		DeveloperInternalID: r.get(68, 2).strPtr(),
		AvailableCode:       r.get(18, 0).int64Ptr(),
	}
	var last jsonValue
	for _, e := range r.elements() {
		last = e
		d.Slots++
	}
	if last.isObject() {
		d.SparseKeys = last.keys()
	}

	installs := r.index(13)
	d.InstallsText = installs.index(0).strPtr()
	d.MinInstalls = installs.index(1).int64Ptr()
	d.RealInstalls = installs.index(2).int64Ptr()

	rating := r.index(51)
	d.ScoreText = rating.get(0, 0).strPtr()
	d.Score = rating.get(0, 1).float64Ptr()
	d.Ratings = rating.get(2, 1).int64Ptr()
	d.ReviewsCount = rating.get(3, 1).int64Ptr()
	// Only all five counts make a histogram.
	var hist [5]int64
	stars := 0
	for s := range hist {
		if n, ok := rating.get(1, s+1, 1).int64(); ok {
			hist[s] = n
			stars++
		}
	}
	if stars == len(hist) {
		d.Histogram = &hist
	}
	if t, ok := timestamp(r.get(10, 1)); ok {
		d.ReleasedAt = &t
	}
	d.RecentChangesHTML = r.get(144, 1, 1).strPtr()

	d.Version = r.get(140, 0, 0, 0).strPtr()

	updated := r.get(145, 0)
	d.UpdatedText = updated.index(0).strPtr()
	if sec, ok := updated.get(1, 0).int64(); ok {
		t := time.Unix(sec, 0).UTC()
		d.UpdatedAt = &t
	}

	if ads := r.index(48); ads.present() {
		d.AdSupported = true
		d.AdsLabel = ads.index(0).strPtr()
	}

	d.DeveloperID = developerID(r.get(68, 1, 4, 2))

	offer := r.get(57, 0, 0, 0, 0, 1, 0)
	d.PriceMicros = offer.index(0).int64Ptr()
	d.Currency = offer.index(1).strPtr()
	d.PriceText = offer.index(2).strPtr()
	if d.PriceMicros != nil {
		free := *d.PriceMicros == 0
		d.Free = &free
	}
	if iap, ok := r.get(19, 0).str(); ok && iap != "" {
		d.OffersIAP = true
	}
	return d, nil
}

// developerID takes the id parameter of the developer page link, verbatim
// (`/store/apps/developer?id=Raise+Right` gives "Raise+Right").
func developerID(link jsonValue) *string {
	s, ok := link.str()
	if !ok {
		return nil
	}
	_, id, found := strings.Cut(s, "id=")
	if !found {
		return nil
	}
	id, _, _ = strings.Cut(id, "&")
	return &id
}

// parseReviewsAnswer reads a reviews page out of a batchexecute answer: the
// payload of the rpcid frame, read and checked in one pass.
func parseReviewsAnswer(body []byte, rpcid string) (reviewsPage, error) {
	buf := payloadBuffers.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= maxPooledPayload {
			payloadBuffers.Put(buf)
		}
	}()
	payload, err := parseBatchexecute(body, rpcid, buf)
	if err != nil || payload == nil {
		return reviewsPage{}, err
	}
	return parseReviewsPayload(payload, fmt.Sprintf(`["wrb.fr",%q][2]`, rpcid))
}

// payloadBuffers holds the buffers reviews payloads are unescaped into. A
// page's payload is ~110 KB, and allocating one per page (and collecting it)
// took about a tenth of the parse. Reuse is safe because nothing read from a
// payload points into it: every string is copied out.
var payloadBuffers = sync.Pool{New: func() any { return new([]byte) }}

// reviewBuffers holds the slices parseReviewsPayload gathers reviews in.
var reviewBuffers = sync.Pool{New: func() any { return new([]review) }}

// maxPooledPayload keeps a rare huge answer from pinning its buffer.
const maxPooledPayload = 1 << 20

// parseBatchexecute returns the payload of the rpcid answer in a batchexecute
// body, in either framing (docs/playstore-protocol.md §3.2), unescaped into
// *buf but not yet checked: parseReviewsPayload checks it while reading it.
// A nil payload with a nil error means the server answered "nothing" (no more
// reviews); a null payload with an error entry is a transient backend error.
func parseBatchexecute(body []byte, rpcid string, buf *[]byte) (jsonValue, error) {
	for rest := body; ; {
		i := bytes.IndexByte(rest, '[')
		if i < 0 {
			return nil, &parseError{Path: fmt.Sprintf(`batchexecute ["wrb.fr",%q] frame`, rpcid), Detail: "not in the answer"}
		}
		// One array of frames; the chunked framing sends several.
		var match rpcFrame
		end, ok := walkArray(rest, i, func(_, start int) (int, bool) {
			if match.found || start >= len(rest) || rest[start] != '[' {
				_, end, ok := scanValue(rest, start)
				return end, ok
			}
			f, end, ok := readFrame(rest, start, rpcid, buf)
			if ok && f.found {
				match = f
			}
			return end, ok
		})
		if match.found {
			return match.payload(rpcid)
		}
		if !ok {
			return nil, &parseError{Path: "batchexecute frames", Detail: "malformed or cut short"}
		}
		rest = rest[end:]
	}
}

// rpcFrame is what parseBatchexecute keeps of a frame
// ["wrb.fr", rpcid, payload, _, _, error entry, ...].
type rpcFrame struct {
	found   bool      // [0] is "wrb.fr" and [1] the rpcid sought
	text    jsonValue // [2] decoded, when isText
	isText  bool      // [2] is a string that decodes
	badText bool      // [2] is a string that does not
	entry   jsonValue // [5]
}

// readFrame reads the frame at b[i]. The payload string of the frame sought
// is decoded into *buf in the pass that finds its end.
func readFrame(b []byte, i int, rpcid string, buf *[]byte) (rpcFrame, int, bool) {
	var f rpcFrame
	var name, id string
	end, ok := walkArray(b, i, func(n, start int) (int, bool) {
		if n == 2 && name == "wrb.fr" && id == rpcid && start < len(b) && b[start] == '"' {
			text, end, ok := appendUnquoted((*buf)[:0], b, start)
			if ok {
				// No UTF-8 repair: every string read from the text is
				// repaired then.
				*buf, f.text, f.isText = text, text, true
				return end, true
			}
			// A string with a bad escape still has an end.
			_, end, ok = scanValue(b, start)
			f.badText = ok
			return end, ok
		}
		s, e, ok := scanValue(b, start)
		switch {
		case !ok:
			return 0, false
		case n == 0:
			name, _ = jsonValue(b[s:e]).str()
		case n == 1:
			id, _ = jsonValue(b[s:e]).str()
		case n == 5:
			f.entry = b[s:e]
		}
		return e, true
	})
	f.found = ok && name == "wrb.fr" && id == rpcid
	return f, end, ok
}

// payload returns the frame's payload, or the error its entry at [5] stands
// for when the payload is null.
func (f rpcFrame) payload(rpcid string) (jsonValue, error) {
	switch {
	case f.isText:
		text := bytes.TrimSpace(f.text)
		if text == nil {
			// Empty text is a payload too (parseReviewsPayload rejects
			// it), not the absence of one.
			text = f.text[:0:0]
		}
		return jsonValue(text), nil
	case f.badText:
		return nil, &parseError{Path: fmt.Sprintf(`["wrb.fr",%q][2]`, rpcid), Detail: "bad string"}
	case f.entry.present():
		return nil, fmt.Errorf("%w: %s answered %s", errRPCEntry, rpcid, truncate(string(f.entry), 200))
	}
	return nil, nil
}

// parseReviewsPayload reads the reviews and the next-page token out of a
// UsvDTd/oCPfdb payload: [[review...], [null, token], ...]
// (docs/playstore-protocol.md §3.3). One pass over the ~110 KB reads the
// reviews and checks that the payload is exactly one JSON value; when it is
// not, the *parseError's path is at (where the payload came from) followed by
// the element that could not be read.
func parseReviewsPayload(payload jsonValue, at string) (reviewsPage, error) {
	var page reviewsPage
	// The reviews are gathered in a pooled slice and copied out at their
	// exact number: growing page.Reviews by appending allocated twice that.
	scratch := reviewBuffers.Get().(*[]review)
	reviews := (*scratch)[:0]
	defer func() {
		clear(reviews) // the pool must not keep the strings alive
		*scratch = reviews[:0]
		reviewBuffers.Put(scratch)
	}()
	place := ""
	var end int
	var ok bool
	if payload.isArray() {
		end, ok = walkArray(payload, 0, func(n, start int) (int, bool) {
			if n == 0 && start < len(payload) && payload[start] == '[' {
				end, ok := eachRecord(payload, start, make([]jsonValue, reviewSlots), func(rec []jsonValue) {
					if rv, ok := readReview(rec); ok {
						reviews = append(reviews, rv)
					} else {
						page.Skipped++
					}
				})
				if !ok {
					place = fmt.Sprintf("[0][%d]", len(reviews)+page.Skipped)
				}
				return end, ok
			}
			s, e, ok := scanValue(payload, start)
			if !ok {
				place = fmt.Sprintf("[%d]", n)
				return 0, false
			}
			if n == 1 {
				page.NextToken, _ = payload[s:e].index(1).str()
			}
			return e, true
		})
	} else {
		_, end, ok = scanValue(payload, 0)
	}
	if !ok {
		return reviewsPage{}, &parseError{Path: at + place, Detail: "payload is not one JSON value: malformed or cut short"}
	}
	if skipSpace(payload, end) != len(payload) {
		return reviewsPage{}, &parseError{Path: at, Detail: "payload is not one JSON value: text follows it"}
	}
	if len(reviews) > 0 {
		page.Reviews = slices.Clone(reviews)
	}
	return page, nil
}

// reviewSlots is how many slots of a review record readReview looks at.
const reviewSlots = 11

// readReview reads one review from its first reviewSlots slots; ok is false
// without an id or a time.
func readReview(f []jsonValue) (review, bool) {
	id, ok := f[0].str()
	if !ok || id == "" {
		return review{}, false
	}
	at, ok := timestamp(f[5])
	if !ok {
		return review{}, false
	}
	// The nullable fields point into one allocation per review rather than
	// one each: a page has 150 reviews, and allocation was a third of the
	// parse time.
	v := new(reviewValues)
	rv := review{ReviewID: id, At: at}
	rv.UserName = setString(&v.userName, f[1].index(0))
	rv.UserImage = setString(&v.userImage, f[1].get(1, 3, 2))
	rv.Content = setString(&v.content, f[4])
	rv.AppVersion = setString(&v.appVersion, f[10])
	if n, ok := f[6].int64(); ok {
		v.thumbsUp = n
		rv.ThumbsUpCount = &v.thumbsUp
	}
	if s, ok := f[2].int64(); ok && s >= 1 && s <= 5 {
		v.score = int(s)
		rv.Score = &v.score
	}
	if reply := f[7]; reply.present() {
		rv.ReplyContent = setString(&v.reply, reply.index(1))
		if t, ok := timestamp(reply.index(2)); ok {
			v.repliedAt = t
			rv.RepliedAt = &v.repliedAt
		}
	}
	return rv, true
}

// reviewValues backs the pointer fields of one review.
type reviewValues struct {
	userName, userImage, content, appVersion, reply string
	thumbsUp                                        int64
	score                                           int
	repliedAt                                       time.Time
}

// setString decodes src into dst and returns dst, or nil when src is not a
// string.
func setString(dst *string, src jsonValue) *string {
	s, ok := src.str()
	if !ok {
		return nil
	}
	*dst = s
	return dst
}

// timestamp reads [seconds, nanos] exactly.
func timestamp(v jsonValue) (time.Time, bool) {
	sec, ok := v.index(0).int64()
	if !ok {
		return time.Time{}, false
	}
	nanos, _ := v.index(1).int64()
	if nanos < 0 || nanos >= int64(time.Second) {
		nanos = 0
	}
	return time.Unix(sec, nanos).UTC(), true
}
