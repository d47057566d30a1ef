package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// replayFault is what the replay server answers instead of the real thing.
type replayFault int

const (
	faultNone        replayFault = iota
	fault404                     // no listing
	fault429                     // rate limited, with Retry-After when the app sets RetryAfter
	fault503                     // older throttling answer
	fault500                     // backend error
	faultCaptcha                 // 302 to /sorry/index (captcha)
	faultConsent                 // 302 to consent.google.com
	faultCutBody                 // 200 whose connection closes half-way through the body
	faultTruncated               // complete 200 carrying only the first half of the page
	faultNoDataBlock             // 200 HTML page without any data block
	faultRPCError                // reviews: 200 with a null payload and an error entry
	faultSlow                    // headers only after 2 s (or when the client gives up)
	faultNoReviewIDs             // reviews: the page as it is, but its records without a review id
)

// replayApp configures one package on the replay server; the zero value is a
// healthy app with the default title and 300 reviews.
type replayApp struct {
	Title   string // default "App <package>"
	Reviews int    // reviews on the store; 0 = 300, negative = none
	Persian bool   // reviews in Persian with emoji (and a stray U+0000)
	// Replies: review i has a developer reply when i is a multiple of it;
	// 0 = every 5th, negative = none.
	Replies int
	// New reviews were written since: they come before review 0, newest
	// first, as reviews -New … -1 (addReviews adds more).
	New int
	// Edits: new-review slot k (negative) is old review i edited (editReview):
	// its text changed, and it moved from its place to the head with the
	// slot's time, as Google's newest-first order does with an edit.
	Edits map[int]int
	// RepliesAdded: old review i got a developer reply since, at that time
	// (replyTo); it stays in its place.
	RepliesAdded map[int]time.Time

	// Faults are consumed one per request, in order; then Always applies to
	// every further request (faultNone: answer normally).
	DetailsFaults, ReviewsFaults []replayFault
	DetailsAlways, ReviewsAlways replayFault
	RetryAfter                   string // Retry-After header sent with fault429

	// DetailsPage replaces the synthesized page (e.g. an edited fixture).
	DetailsPage []byte
	// NotIn are storefront countries (gl) where the app is not published:
	// every request from them answers 404.
	NotIn []string
}

// replayPlayStore is a local Play Store built from the recorded fixtures. It
// serves a details page and newest-first reviews for ANY package name (the
// Minecraft page with the package and title substituted; reviews generated
// in the recorded record layout, paged by count and continuation token),
// with per-package fault injection and request counting. Like Google, it
// pins a review paging to the NID cookie of its first page: a continuation
// sent without that cookie gets an error entry.
type replayPlayStore struct {
	*httptest.Server
	t testing.TB

	template      []byte // details page of templatePackage
	fixturePages  map[string][]byte
	mu            sync.Mutex
	apps          map[string]*replayApp
	faultsUsed    map[string]int // "details pkg" -> faults consumed
	pages         map[string][]byte
	reviewPages   map[string][]byte // generated answers, by request
	counts        map[string]int    // "details pkg" / "reviews pkg" -> requests
	locales       map[string]string // "details pkg" / "reviews pkg" -> "hl/gl" of the last request
	inLocale      map[string]int    // "details pkg hl/gl" / "reviews pkg hl/gl" -> requests
	nextNID       int
	lastReviewReq url.Values // hl/gl of the last reviews request
	lastPageSize  int
	proxied       int                 // requests that came through a proxy (Via header)
	vias          map[string][]string // "details pkg" / "reviews pkg" -> Via of each request ("" direct)
	sorryHits     int                 // requests that reached the captcha page
	// shiftTo, when set (shiftTimesTo), is where each app's newest recorded
	// review or listing time is moved; shifts memoizes each app's shift.
	shiftTo time.Time
	shifts  map[string]time.Duration
}

const (
	replayTemplatePackage = "com.mojang.minecraftpe"
	replayTemplateTitle   = "Minecraft: Dream it, Build it!"
	// replayNewest is the time of every app's newest generated review.
	replayNewest = 1783000000
)

func newReplayPlayStore(t testing.TB) *replayPlayStore {
	t.Helper()
	s := &replayPlayStore{
		t:           t,
		template:    readPlaystoreFixture(t, "details_com.mojang.minecraftpe_en_us.html"),
		apps:        make(map[string]*replayApp),
		faultsUsed:  make(map[string]int),
		pages:       make(map[string][]byte),
		reviewPages: make(map[string][]byte),
		counts:      make(map[string]int),
		locales:     make(map[string]string),
		inLocale:    make(map[string]int),
		vias:        make(map[string][]string),
		shifts:      make(map[string]time.Duration),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /store/apps/details", s.serveDetails)
	mux.HandleFunc("POST /_/PlayStoreUi/data/batchexecute", s.serveReviews)
	mux.HandleFunc("/sorry/", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.sorryHits++
		s.mu.Unlock()
		http.Error(w, "Our systems have detected unusual traffic", http.StatusTooManyRequests)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// setApp configures pkg (replacing an earlier configuration).
func (s *replayPlayStore) setApp(pkg string, app replayApp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.apps[pkg] = &app
	delete(s.pages, pkg)
	delete(s.faultsUsed, "details "+pkg)
	delete(s.faultsUsed, "reviews "+pkg)
	delete(s.shifts, pkg)
}

// shiftTimesTo makes the store serve every app's recorded times (reviews,
// developer replies, the listing's update and release) moved forward by
// one shift per app, so that the app's newest one is at newest, give or take
// a second: the demo's reviews are then of the last hours, not months old.
// Tests that check the recorded times leave it unset.
func (s *replayPlayStore) shiftTimesTo(newest time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shiftTo = newest
	clear(s.shifts)
}

// useFixtureReviews makes pkg answer with the two recorded UsvDTd pages: the
// first request gets page 1, the token of page 1 gets page 2, and page 2's
// token gets the empty answer that ends a paging.
func (s *replayPlayStore) useFixtureReviews(pkg string) {
	p1 := readPlaystoreFixture(s.t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	p2 := readPlaystoreFixture(s.t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page2.txt")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fixturePages = map[string][]byte{"": p1, fixtureToken(s.t, p1): p2, fixtureToken(s.t, p2): replayFrames("UsvDTd", "[]")}
	if s.apps[pkg] == nil {
		s.apps[pkg] = &replayApp{}
	}
}

func fixtureToken(t testing.TB, body []byte) string {
	page, err := parseReviewsAnswer(body, "UsvDTd")
	if err != nil {
		t.Fatal(err)
	}
	return page.NextToken
}

// addReviews writes n new reviews of pkg at the head of its reviews.
func (s *replayPlayStore) addReviews(pkg string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apps[pkg] == nil {
		s.apps[pkg] = &replayApp{}
	}
	s.apps[pkg].New += n
}

// editReview edits pkg's review i (0 or above): a new text, a new time at
// the head (a new-review slot). It reports false if i was edited already.
// The maps are copied, not changed: a request may be reading them.
func (s *replayPlayStore) editReview(pkg string, i int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.apps[pkg]
	if slices.Contains(slices.Collect(maps.Values(a.Edits)), i) {
		return false
	}
	a.New++
	a.Edits = maps.Clone(a.Edits)
	if a.Edits == nil {
		a.Edits = map[int]int{}
	}
	a.Edits[-a.New] = i
	return true
}

// replyTo adds a developer reply, given now on the store, to pkg's review i
// (0 or above). It reports false if i has a reply.
func (s *replayPlayStore) replyTo(pkg string, i int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.apps[pkg]
	if _, ok := replayReviewReply(*a, i); ok {
		return false
	}
	a.RepliesAdded = maps.Clone(a.RepliesAdded)
	if a.RepliesAdded == nil {
		a.RepliesAdded = map[int]time.Time{}
	}
	a.RepliesAdded[i] = replayReviewAt(-a.New).Add(time.Second)
	return true
}

// requests counts the requests for endpoint ("details" or "reviews") of pkg.
func (s *replayPlayStore) requests(endpoint, pkg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[endpoint+" "+pkg]
}

// locale returns "hl/gl" of the last request for endpoint of pkg.
func (s *replayPlayStore) locale(endpoint, pkg string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.locales[endpoint+" "+pkg]
}

// requestsIn counts the requests for endpoint of pkg in the storefront
// loc ("hl/gl").
func (s *replayPlayStore) requestsIn(endpoint, pkg, loc string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inLocale[endpoint+" "+pkg+" "+loc]
}

// viasOf is the Via header of each request for endpoint and pkg: which
// egress (forward proxy) sent it, "" for a direct request.
func (s *replayPlayStore) viasOf(endpoint, pkg string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.vias[endpoint+" "+pkg])
}

func (s *replayPlayStore) totalRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.counts {
		n += c
	}
	return n
}

// nidsIssued counts the NID cookies handed out (one per cookie jar).
func (s *replayPlayStore) nidsIssued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nextNID
}

// lastReviewsRequest returns the query and page size of the last reviews
// request.
func (s *replayPlayStore) lastReviewsRequest() (query url.Values, pageSize int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastReviewReq, s.lastPageSize
}

func (s *replayPlayStore) captchaFetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sorryHits
}

// setFixturePage makes the fixture reviews answer body to token.
func (s *replayPlayStore) setFixturePage(token string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fixturePages[token] = body
}

func (s *replayPlayStore) proxiedRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxied
}

// app returns pkg's configuration (the default one if none was set).
func (s *replayPlayStore) app(pkg string) replayApp {
	if a := s.apps[pkg]; a != nil {
		return *a
	}
	return replayApp{}
}

// countAndFault records a request and returns the fault to inject, if any.
func (s *replayPlayStore) countAndFault(endpoint, pkg string, r *http.Request) (replayApp, replayFault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := endpoint + " " + pkg
	s.counts[key]++
	s.locales[key] = r.URL.Query().Get("hl") + "/" + r.URL.Query().Get("gl")
	s.inLocale[key+" "+s.locales[key]]++
	if r.Header.Get("Via") != "" {
		s.proxied++
	}
	s.vias[key] = append(s.vias[key], r.Header.Get("Via"))
	app := s.app(pkg)
	if slices.Contains(app.NotIn, r.URL.Query().Get("gl")) {
		return app, fault404
	}
	queue, always := app.DetailsFaults, app.DetailsAlways
	if endpoint == "reviews" {
		queue, always = app.ReviewsFaults, app.ReviewsAlways
	}
	if used := s.faultsUsed[key]; used < len(queue) {
		s.faultsUsed[key]++
		return app, queue[used]
	}
	return app, always
}

// nid returns the request's NID cookie, issuing a new one when it has none.
func (s *replayPlayStore) nid(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie("NID"); err == nil {
		return c.Value
	}
	s.mu.Lock()
	s.nextNID++
	v := "nid" + strconv.Itoa(s.nextNID)
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: "NID", Value: v, Path: "/", HttpOnly: true})
	return v
}

// detailsPackage is the package a details request asks for, or "" once it
// has answered 400 to a request that lacks id, hl or gl.
func detailsPackage(w http.ResponseWriter, r *http.Request) string {
	q := r.URL.Query()
	pkg := q.Get("id")
	if pkg == "" || q.Get("hl") == "" || q.Get("gl") == "" {
		http.Error(w, "id, hl and gl are required", http.StatusBadRequest)
		return ""
	}
	return pkg
}

func (s *replayPlayStore) serveDetails(w http.ResponseWriter, r *http.Request) {
	pkg := detailsPackage(w, r)
	if pkg == "" {
		return
	}
	s.nid(w, r)
	app, fault := s.countAndFault("details", pkg, r)
	page := s.detailsPage(pkg, app)
	if d := s.timeShift(pkg, app); d != 0 {
		page = shiftListingTimes(s.t, page, d)
	}
	if s.writeFault(w, r, fault, app, page) {
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(page)
}

// detailsPage synthesizes (once) pkg's page from the template fixture.
func (s *replayPlayStore) detailsPage(pkg string, app replayApp) []byte {
	if app.DetailsPage != nil {
		return app.DetailsPage
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pages[pkg]; p != nil {
		return p
	}
	title := app.Title
	if title == "" {
		title = "App " + pkg
	}
	quoted, _ := json.Marshal(title)
	p := bytes.ReplaceAll(s.template, []byte(replayTemplatePackage), []byte(pkg))
	p = bytes.ReplaceAll(p, []byte(replayTemplateTitle), quoted[1:len(quoted)-1])
	s.pages[pkg] = p
	return p
}

// writeFault answers with fault and reports whether it did.
func (s *replayPlayStore) writeFault(w http.ResponseWriter, r *http.Request, fault replayFault, app replayApp, body []byte) bool {
	switch fault {
	case faultNone:
		return false
	case fault404:
		http.Error(w, "Not Found", http.StatusNotFound)
	case fault429:
		if app.RetryAfter != "" {
			w.Header().Set("Retry-After", app.RetryAfter)
		}
		http.Error(w, "Too Many Requests", http.StatusTooManyRequests)
	case fault503:
		http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
	case fault500:
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
	case faultCaptcha:
		http.Redirect(w, r, "/sorry/index?continue="+url.QueryEscape(r.URL.String()), http.StatusFound)
	case faultConsent:
		http.Redirect(w, r, "https://consent.google.com/ml?continue="+url.QueryEscape(r.URL.String()), http.StatusFound)
	case faultCutBody:
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body[:len(body)/2])
		panic(http.ErrAbortHandler) // closes the connection mid-body
	case faultTruncated:
		_, _ = w.Write(body[:len(body)/2])
	case faultNoDataBlock:
		_, _ = io.WriteString(w, "<!doctype html><html><head><title>Google Play</title></head><body><script>var x = 1;</script></body></html>")
	case faultRPCError:
		_, _ = w.Write(replayErrorFrames("UsvDTd"))
	case faultSlow:
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
		_, _ = w.Write(body)
	default:
		s.t.Errorf("replay server: unknown fault %d", fault)
	}
	return true
}

// reviewsRequest is a decoded UsvDTd/oCPfdb batchexecute request.
type reviewsRequest struct {
	rpc, pkg, token string
	sort, count     int
}

// decodeReviewsRequest checks the request the way Google would need it.
func decodeReviewsRequest(r *http.Request) (reviewsRequest, error) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		return reviewsRequest{}, fmt.Errorf("content type %q", ct)
	}
	if err := r.ParseForm(); err != nil {
		return reviewsRequest{}, err
	}
	var env [][][]any
	if err := json.Unmarshal([]byte(r.PostForm.Get("f.req")), &env); err != nil || len(env) != 1 || len(env[0]) != 1 || len(env[0][0]) != 4 {
		return reviewsRequest{}, fmt.Errorf("envelope %q: %v", r.PostForm.Get("f.req"), err)
	}
	call := env[0][0]
	rpc, _ := call[0].(string)
	argText, _ := call[1].(string)
	if call[3] != "generic" {
		return reviewsRequest{}, fmt.Errorf("envelope %v", call)
	}
	// [null,null,[2,sort,[count,null,token],null,[]],[pkg,7]]
	var args []any
	if err := json.Unmarshal([]byte(argText), &args); err != nil || len(args) != 4 {
		return reviewsRequest{}, fmt.Errorf("args %q: %v", argText, err)
	}
	opts, _ := args[2].([]any)
	target, _ := args[3].([]any)
	if len(opts) != 5 || len(target) != 2 || target[1] != 7.0 {
		return reviewsRequest{}, fmt.Errorf("args %q", argText)
	}
	paging, _ := opts[2].([]any)
	if len(paging) != 3 {
		return reviewsRequest{}, fmt.Errorf("paging %v", opts[2])
	}
	req := reviewsRequest{rpc: rpc}
	req.pkg, _ = target[0].(string)
	sort, _ := opts[1].(float64)
	count, _ := paging[0].(float64)
	req.sort, req.count = int(sort), int(count)
	if paging[2] != nil {
		tok, ok := paging[2].(string)
		if !ok || tok == "" {
			return reviewsRequest{}, fmt.Errorf("token %v", paging[2])
		}
		req.token = tok
	}
	if req.pkg == "" || req.count <= 0 {
		return reviewsRequest{}, fmt.Errorf("args %q", argText)
	}
	return req, nil
}

func (s *replayPlayStore) serveReviews(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req, err := decodeReviewsRequest(r)
	if err != nil || q.Get("hl") == "" || q.Get("gl") == "" {
		http.Error(w, fmt.Sprintf("bad reviews request: %v", err), http.StatusBadRequest)
		return
	}
	nid := s.nid(w, r)
	app, fault := s.countAndFault("reviews", req.pkg, r)
	s.mu.Lock()
	s.lastReviewReq, s.lastPageSize = q, req.count
	fixture := s.fixturePages
	s.mu.Unlock()
	noIDs := fault == faultNoReviewIDs
	if noIDs {
		fault = faultNone
	}
	if s.writeFault(w, r, fault, app, replayFrames(req.rpc, "[]")) {
		return
	}
	if fixture != nil && req.pkg == "com.google.android.apps.translate" {
		page, ok := fixture[req.token]
		if !ok {
			page = replayErrorFrames(req.rpc)
		}
		_, _ = w.Write(s.shiftReviews(req, app, page))
		return
	}
	if req.sort != sortNewest {
		http.Error(w, "the replay server serves newest first only", http.StatusBadRequest)
		return
	}
	offset := 0
	if req.token != "" {
		tokPkg, tokOffset, tokNID, ok := decodeReplayToken(req.token)
		if !ok || tokPkg != req.pkg {
			http.Error(w, "bad token", http.StatusBadRequest)
			return
		}
		if tokNID != nid {
			// Google answers a continuation from an unknown session with an
			// error entry.
			_, _ = w.Write(replayErrorFrames(req.rpc))
			return
		}
		offset = tokOffset
	}
	_, _ = w.Write(s.shiftReviews(req, app, s.generatedReviews(req, app, offset, nid, noIDs)))
}

// timeShift is how far pkg's recorded times move under shiftTimesTo (0
// without it): from the newest of its reviews, their replies and its
// listing's update to s.shiftTo, in whole seconds so that the listing's
// stamps stay whole.
func (s *replayPlayStore) timeShift(pkg string, app replayApp) time.Duration {
	s.mu.Lock()
	to, fixture := s.shiftTo, s.fixturePages
	d, known := s.shifts[pkg]
	s.mu.Unlock()
	if to.IsZero() || known {
		return d
	}
	var newest time.Time
	if fixture != nil && pkg == "com.google.android.apps.translate" {
		for _, body := range fixture {
			page, _ := parseReviewsAnswer(body, "UsvDTd")
			for _, r := range page.Reviews {
				newest = laterTime(newest, r.At)
				if r.RepliedAt != nil {
					newest = laterTime(newest, *r.RepliedAt)
				}
			}
		}
	} else {
		// A reply comes an hour after its review, so the newest reply (of
		// the first review with one, among the first every-th) may be
		// newer than the newest review.
		for i := -app.New; i < -app.New+max(app.Replies, 5); i++ {
			newest = laterTime(newest, replayReviewAt(i))
			if replied, ok := replayReviewReply(app, i); ok {
				newest = laterTime(newest, replied)
			}
		}
	}
	if details, err := parseDetailsPage(s.detailsPage(pkg, app)); err == nil && details.UpdatedAt != nil {
		newest = laterTime(newest, *details.UpdatedAt)
	}
	d = to.Sub(newest).Truncate(time.Second)
	s.mu.Lock()
	s.shifts[pkg] = d
	s.mu.Unlock()
	return d
}

func laterTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// shiftReviews moves the review and reply times of a reviews answer by
// pkg's timeShift.
func (s *replayPlayStore) shiftReviews(req reviewsRequest, app replayApp, body []byte) []byte {
	d := s.timeShift(req.pkg, app)
	if d == 0 {
		return body
	}
	frames, err := decodeJSONNumbers(bytes.TrimPrefix(body, []byte(")]}'\n\n")))
	if err != nil {
		s.t.Errorf("replay server: shift %s reviews: %v", req.pkg, err)
		return body
	}
	list, _ := frames.([]any)
	for _, f := range list {
		frame, _ := f.([]any)
		if len(frame) < 3 || frame[0] != "wrb.fr" {
			continue
		}
		text, ok := frame[2].(string)
		if !ok {
			continue
		}
		payload, err := decodeJSONNumbers([]byte(text))
		if err != nil {
			s.t.Errorf("replay server: shift %s reviews: %v", req.pkg, err)
			return body
		}
		if p, ok := payload.([]any); ok && len(p) > 0 {
			records, _ := p[0].([]any)
			for _, rec := range records {
				r, _ := rec.([]any)
				if len(r) > 7 {
					shiftStamp(r[5], d) // [seconds, nanos] written
					if reply, ok := r[7].([]any); ok && len(reply) > 2 {
						shiftStamp(reply[2], d) // replied
					}
				}
			}
		}
		frame[2] = string(encodeJSON(s.t, payload))
	}
	return append([]byte(")]}'\n\n"), encodeJSON(s.t, frames)...)
}

// shiftListingTimes moves the update and release times of a details page
// by d, their texts ("Jul 6, 2026") with them.
func shiftListingTimes(t testing.TB, page []byte, d time.Duration) []byte {
	return editDetailsBlock(t, page, func(r []any) {
		for _, slot := range []int{10, 145} {
			if slot >= len(r) {
				continue
			}
			stamp, _ := r[slot].([]any) // released: [text, [seconds, nanos]]
			if slot == 145 && len(stamp) > 0 {
				stamp, _ = stamp[0].([]any) // updated: [[text, [seconds, nanos]]]
			}
			if len(stamp) < 2 {
				continue
			}
			if at, ok := shiftStamp(stamp[1], d); ok {
				if _, isText := stamp[0].(string); isText {
					stamp[0] = at.UTC().Format("Jan 2, 2006")
				}
			}
		}
	})
}

// shiftStamp moves the [seconds, nanos] stamp v (decoded with json.Number)
// by d in place and returns the new time.
func shiftStamp(v any, d time.Duration) (time.Time, bool) {
	stamp, _ := v.([]any)
	if len(stamp) < 1 {
		return time.Time{}, false
	}
	n, _ := stamp[0].(json.Number)
	sec, err := n.Int64()
	if err != nil {
		return time.Time{}, false
	}
	at := time.Unix(sec, 0).Add(d)
	stamp[0] = json.Number(strconv.FormatInt(at.Unix(), 10))
	return at, true
}

// decodeJSONNumbers decodes b keeping numbers exact (json.Number).
func decodeJSONNumbers(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// encodeJSON encodes v as Google does: no HTML escaping.
func encodeJSON(t testing.TB, v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Errorf("replay server: %v", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// generatedReviews builds (once: benchmarks replay the same pages) the
// answer with reviews offset.. of req.pkg; noIDs leaves out each record's
// review id (faultNoReviewIDs). The pages of an app with new reviews are
// built afresh: they change from cycle to cycle.
func (s *replayPlayStore) generatedReviews(req reviewsRequest, app replayApp, offset int, nid string, noIDs bool) []byte {
	key := fmt.Sprintf("%s|%d|%d|%s|%v|%d|%d|%v", req.pkg, offset, req.count, nid, app.Persian, app.Reviews, app.Replies, noIDs)
	s.mu.Lock()
	cached := s.reviewPages[key]
	s.mu.Unlock()
	if cached != nil && app.New == 0 && len(app.RepliesAdded) == 0 {
		return cached
	}
	total := app.Reviews
	switch {
	case total == 0:
		total = 300
	case total < 0:
		total = 0
	}
	total += app.New
	// order maps a position to its review: by default position p holds
	// review p-New; an edit takes its review out of its place.
	review := func(p int) []any { return replayReviewRecord(req.pkg, p-app.New, app) }
	if len(app.Edits) > 0 {
		moved := map[int]bool{}
		for _, i := range app.Edits {
			moved[i] = true
		}
		order := make([]int, 0, total)
		for i := -app.New; i < total-app.New; i++ {
			if !moved[i] {
				order = append(order, i)
			}
		}
		total = len(order)
		review = func(p int) []any {
			i := order[p]
			orig, edited := app.Edits[i]
			if !edited {
				return replayReviewRecord(req.pkg, i, app)
			}
			r := replayReviewRecord(req.pkg, orig, app)
			at := replayReviewAt(i)
			r[4], r[5] = r[4].(string)+" (edited)", []any{at.Unix(), at.Nanosecond()}
			return r
		}
	}
	end := min(offset+req.count, total)
	records := make([]any, 0, max(end-offset, 0))
	for p := offset; p < end; p++ {
		rec := review(p)
		if noIDs {
			rec[0] = nil
		}
		records = append(records, rec)
	}
	text := []byte("[]")
	if len(records) > 0 {
		next := []any{nil}
		if end < total {
			next = append(next, encodeReplayToken(req.pkg, end, nid))
		}
		var err error
		if text, err = json.Marshal([]any{records, next}); err != nil {
			s.t.Error(err)
		}
	}
	body := replayFrames(req.rpc, string(text))
	if app.New == 0 && len(app.RepliesAdded) == 0 {
		s.mu.Lock()
		s.reviewPages[key] = body
		s.mu.Unlock()
	}
	return body
}

// replayFrames wraps a payload the way batchexecute does (no rt=c).
func replayFrames(rpc, payload string) []byte {
	frames, _ := json.Marshal([]any{
		[]any{"wrb.fr", rpc, payload, nil, nil, nil, "generic"},
		[]any{"di", 42},
		[]any{"af.httprm", 42, "-1234567890", 17},
	})
	return append([]byte(")]}'\n\n"), frames...)
}

func replayErrorFrames(rpc string) []byte {
	frames, _ := json.Marshal([]any{
		[]any{"wrb.fr", rpc, nil, nil, nil, []any{5, nil, []any{[]any{"type.googleapis.com/wireless.android.finsky.boq.web.data.store.error.PlayDataError", []any{1}}}}, "generic"},
		[]any{"di", 42},
	})
	return append([]byte(")]}'\n\n"), frames...)
}

func encodeReplayToken(pkg string, offset int, nid string) string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%s|%d|%s", pkg, offset, nid))
}

func decodeReplayToken(tok string) (pkg string, offset int, nid string, ok bool) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", 0, "", false
	}
	parts := strings.Split(string(raw), "|")
	if len(parts) != 3 {
		return "", 0, "", false
	}
	offset, err = strconv.Atoi(parts[1])
	return parts[0], offset, parts[2], err == nil
}

// replayReviewID and replayReviewAt say what review i (0 = newest of the
// recording, negative = written since) of pkg is, so tests can check ids and
// exact timestamps.
func replayReviewID(pkg string, i int) string {
	h := fnv.New32a()
	_, _ = io.WriteString(h, pkg)
	if i < 0 {
		return fmt.Sprintf("%08x-new-%d", h.Sum32(), -i)
	}
	return fmt.Sprintf("%08x-%04x-4%03x-8000-%012d", h.Sum32(), i/4096%65536, i%4096, i)
}

func replayReviewAt(i int) time.Time {
	// 37 s apart, nanos below and above 100 ms (the JS library's pitfall).
	return time.Unix(replayNewest-int64(i)*37, int64(i%10)*77_000_000).UTC()
}

// replayReviewReply says whether review i of app has a developer reply, and
// when it was given.
func replayReviewReply(app replayApp, i int) (time.Time, bool) {
	every := app.Replies
	if every == 0 {
		every = 5
	}
	return replayReviewAt(i).Add(time.Hour + 5*time.Millisecond), every > 0 && i%every == 0
}

// replayReplyText is the text of every developer reply.
const replayReplyText = "Thanks for the review! We fixed it in 1.6 & later."

// replayReviewVersion is the app version review i was written for; three
// reviews in four name one.
func replayReviewVersion(i int) (string, bool) {
	return "1." + strconv.Itoa(i%7) + ".0", i%4 != 0
}

// replayReviewRecord builds review i of pkg in the 17-slot UsvDTd layout. A
// new review (negative i) takes its stars, thumbs and version from review -i.
func replayReviewRecord(pkg string, i int, app replayApp) []any {
	at := replayReviewAt(i)
	k := max(i, -i)
	name := fmt.Sprintf("User %d", i)
	content := fmt.Sprintf("Review %d of %s: works fine", i, pkg)
	if app.Persian {
		name = fmt.Sprintf("کاربر %d", i)
		content = fmt.Sprintf("نظر %d: برنامه خیلی خوبیه 👍🏽🇮🇷\nممنون\u0000", i)
	}
	var reply any
	if replied, ok := replayReviewReply(app, i); ok {
		reply = []any{"Developer", replayReplyText, []any{replied.Unix(), replied.Nanosecond()}}
	} else if replied, ok := app.RepliesAdded[i]; ok {
		reply = []any{"Developer", replayReplyText, []any{replied.Unix(), replied.Nanosecond()}}
	}
	var version any
	if v, ok := replayReviewVersion(k); ok {
		version = v
	}
	image := []any{nil, 2, nil, []any{nil, nil, "https://play-lh.googleusercontent.com/a/u" + strconv.Itoa(k) + "=mo"}}
	return []any{
		replayReviewID(pkg, i), []any{name, image}, k%5 + 1, nil, content,
		[]any{at.Unix(), at.Nanosecond()}, k % 13, reply, nil,
		[]any{"1100" + strconv.Itoa(k), name, nil, []any{image, true}}, version,
		nil, nil, nil, nil, nil, 1,
	}
}

// editDetailsBlock rewrites the app message R of a details page with edit
// (R decoded by encoding/json, numbers kept exact) and returns the new page.
func editDetailsBlock(t testing.TB, page []byte, edit func(r []any)) []byte {
	t.Helper()
	for key, data := range dataBlocks(page) {
		if key != "ds:5" {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var block []any
		if err := dec.Decode(&block); err != nil {
			t.Fatal(err)
		}
		r := block[1].([]any)[2].([]any)
		edit(r)
		edited, err := json.Marshal(block)
		if err != nil {
			t.Fatal(err)
		}
		start := bytes.Index(page, data)
		return slices.Concat(page[:start], edited, page[start+len(data):])
	}
	t.Fatal("no ds:5 block")
	return nil
}

// testPlayStore is a client wired to a replay server, with fake clocks that
// fire at once and record every wait: the client's (backoff) and the pool's
// (bench cool-downs, rate limit, gaps).
type testPlayStore struct {
	client    *playStoreClient
	pool      *proxyPool
	clock     *fakeClock // client: backoff waits
	poolClock *fakeClock
	reg       *prometheus.Registry
}

// newTestPlayStore builds a client for baseURL; tune may adjust the configs.
func newTestPlayStore(t testing.TB, baseURL string, tune func(*proxyPoolConfig, *playStoreConfig)) *testPlayStore {
	t.Helper()
	ts := &testPlayStore{clock: newFakeClock(true), poolClock: newFakeClock(true), reg: prometheus.NewRegistry()}
	poolCfg := defaultProxyPoolConfig()
	poolCfg.RateLimitRequests, poolCfg.MinGap, poolCfg.Clock, poolCfg.Random = 0, 0, ts.poolClock, fixedRandom(0.5)
	clientCfg := defaultPlayStoreConfig()
	clientCfg.BaseURL, clientCfg.Clock, clientCfg.Random = baseURL, ts.clock, fixedRandom(0.5)
	if tune != nil {
		tune(&poolCfg, &clientCfg)
	}
	log := slog.New(slog.DiscardHandler)
	var err error
	if ts.pool, err = newProxyPool(poolCfg, ts.reg, log); err != nil {
		t.Fatal(err)
	}
	if ts.client, err = newPlayStoreClient(clientCfg, ts.pool, nil, ts.reg, log); err != nil {
		t.Fatal(err)
	}
	return ts
}

func requestsMetric(t testing.TB, ts *testPlayStore, outcome string) float64 {
	return metricValue(t, ts.reg, "playwatch_playstore_requests_total", map[string]string{"outcome": outcome, "proxy": "direct"})
}
