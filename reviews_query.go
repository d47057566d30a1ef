package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// The reviews API's query (GET /api/v1/reviews, the /reviews page, the
// exports and `playwatch export`): its parameters, their checks, its SQL
// and its exact paging.
//
// Paging is keyset paging pinned to the reviews stored when the first page
// was read: the cursor holds the largest reviews.id then, and the walk
// orders by a key that never changes (first_at, id), so every review that
// matches throughout a walk comes exactly once however many reviews are
// stored or re-synced meanwhile. sort=thumbs_up orders by thumbs_up_count,
// which a re-sync changes: that order is best effort.

const (
	defaultReviewLimit = 50
	maxReviewLimit     = 500
	maxSearchRunes     = 200
)

// reviewSorts are the values of sort.
var reviewSorts = []string{"newest", "oldest", "thumbs_up"}

// reviewQueryParams are the query parameters of GET /api/v1/reviews.
var reviewQueryParams = []string{"package", "country", "lang", "q", "stars", "sentiment", "text_lang", "topic", "version", "has_reply",
	"since", "until", "sort", "limit", "cursor", "format", "bom"}

// reviewFilter is what selects reviews; zero fields do not filter.
type reviewFilter struct {
	Packages   []string
	Countries  []string // a storefront (review_storefronts) of one of these countries
	Langs      []string // and of one of these languages
	Q          string
	Patterns   []string // searchPatterns(Q)
	Stars      []int16
	Sentiments []string
	TextLangs  []string
	Topics     []string
	Version    *string
	HasReply   *bool
	Since      time.Time
	Until      time.Time
	Sort       string
}

// reviewQuery is one request: the filter, the page size, where the walk is.
type reviewQuery struct {
	reviewFilter
	Limit  int
	Cursor *reviewCursor
	Format string // json, csv, ndjson
	BOM    bool
}

// reviewCursor is where a walk is: after the review with key Key
// (first_at in Unix microseconds, or thumbs_up_count) and id ID, among the
// reviews up to MaxID. Its text form, "MAXID.KEY.ID", is all digits, so the
// OpenAPI document says exactly which cursors are accepted; one of another
// query's walk is only a position in this one.
type reviewCursor struct {
	MaxID, Key, ID int64
}

var reviewCursorRe = regexp.MustCompile(`^([0-9]{1,18})\.([0-9]{1,18})\.([0-9]{1,18})$`)

func (c reviewCursor) encode() string {
	return fmt.Sprintf("%d.%d.%d", c.MaxID, c.Key, c.ID)
}

func decodeReviewCursor(s string) (reviewCursor, error) {
	m := reviewCursorRe.FindStringSubmatch(s)
	if m == nil {
		return reviewCursor{}, errors.New("not a cursor")
	}
	var c reviewCursor
	c.MaxID, _ = strconv.ParseInt(m[1], 10, 64)
	c.Key, _ = strconv.ParseInt(m[2], 10, 64)
	c.ID, _ = strconv.ParseInt(m[3], 10, 64)
	return c, nil
}

// paramError is a bad query parameter: the answer is 400 naming it.
type paramError struct {
	param string
	msg   string
}

func (e *paramError) Error() string { return e.param + ": " + e.msg }

func badParam(param, format string, args ...any) error {
	return &paramError{param, fmt.Sprintf(format, args...)}
}

// paramOneOf refuses a value of param that is not one of allowed.
func paramOneOf(param, v string, allowed []string) error {
	if !slices.Contains(allowed, v) {
		return badParam(param, "%q is not one of %s", v, strings.Join(allowed, ", "))
	}
	return nil
}

var (
	textLangRe = regexp.MustCompile(`^[a-z]{2,8}$`)
	topicRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,39}$`)
)

// parseReviewQuery reads the query parameters; formats says which values
// of format are accepted (the page takes none).
func parseReviewQuery(vals url.Values, now time.Time, formats []string) (reviewQuery, error) {
	q := reviewQuery{Limit: defaultReviewLimit, Format: "json"}
	q.Sort = "newest"
	for key, vs := range vals {
		if !slices.Contains(reviewQueryParams, key) || (key == "format" || key == "bom") && formats == nil {
			return q, badParam(key, "unknown query parameter (known: %s)", strings.Join(reviewQueryParams, ", "))
		}
		if len(vs) > 1 {
			return q, badParam(key, "given %d times; give it once (lists are comma-separated)", len(vs))
		}
	}
	p := reviewParams(vals)
	if err := p.filters(&q, now); err != nil {
		return q, err
	}
	if err := p.paging(&q, formats); err != nil {
		return q, err
	}
	return q, nil
}

// reviewParams are the query parameters of a reviews request, each given
// at most once.
type reviewParams url.Values

func (p reviewParams) get(k string) (string, bool) {
	vs, ok := p[k]
	if !ok {
		return "", false
	}
	return vs[0], true
}

// list reads the comma-separated list k (nil when absent), each item
// checked by check (an error says what is wrong with item s, and is named
// with k); an item given twice counts once.
func (p reviewParams) list(k string, check func(s string) error) ([]string, error) {
	v, ok := p.get(k)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			return nil, badParam(k, "%q has an empty item", v)
		}
		if err := check(s); err != nil {
			return nil, badParam(k, "%v", err)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// listParam is a list parameter: its items go to into (nil: check keeps
// them itself), each checked by check.
type listParam struct {
	name  string
	into  *[]string
	check func(s string) error
}

// lists reads the list parameters in their order, up to the first error.
func (p reviewParams) lists(params ...listParam) error {
	for _, l := range params {
		items, err := p.list(l.name, l.check)
		if err != nil {
			return err
		}
		if l.into != nil {
			*l.into = items
		}
	}
	return nil
}

// validItem is a list item check by validate, whose error is named with
// the item.
func validItem(validate func(string) error) func(string) error {
	return func(s string) error {
		if err := validate(s); err != nil {
			return fmt.Errorf("%q: %w", s, err)
		}
		return nil
	}
}

// matchingItem is a list item check: the item matches re, else it is not
// what re stands for.
func matchingItem(re *regexp.Regexp, what string) func(string) error {
	return func(s string) error {
		if !re.MatchString(s) {
			return fmt.Errorf("%q is not %s", s, what)
		}
		return nil
	}
}

// filters reads the parameters that choose reviews, and answers the first
// bad one, in this order: package, storefront, text, stars, sentiment,
// language, topic, version, reply and time.
func (p reviewParams) filters(q *reviewQuery, now time.Time) error {
	if err := p.lists(
		listParam{"package", &q.Packages, validItem(validatePackageName)},
		listParam{"country", &q.Countries, validItem(func(s string) error { return validateCountryFilter("country", s) })},
		listParam{"lang", &q.Langs, validItem(func(s string) error { return validateLang("lang", s) })},
	); err != nil {
		return err
	}
	if v, ok := p.get("q"); ok {
		if !utf8.ValidString(v) || v == "" || utf8.RuneCountInString(v) > maxSearchRunes {
			return badParam("q", "must be 1 to %d characters of text", maxSearchRunes)
		}
		// A q without a word (only punctuation) matches nothing.
		q.Patterns, q.Q = searchPatterns(v), v
	}
	if err := p.lists(
		listParam{"stars", nil, func(s string) error {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 5 {
				return fmt.Errorf("%q is not 1 to 5 (a list: 1,2)", s)
			}
			if !slices.Contains(q.Stars, int16(n)) {
				q.Stars = append(q.Stars, int16(n))
			}
			return nil
		}},
		listParam{"sentiment", nil, func(s string) error {
			u := strings.ToUpper(s)
			if u != "POSITIVE" && u != "NEUTRAL" && u != "NEGATIVE" {
				return fmt.Errorf("%q is not POSITIVE, NEUTRAL or NEGATIVE", s)
			}
			if !slices.Contains(q.Sentiments, u) {
				q.Sentiments = append(q.Sentiments, u)
			}
			return nil
		}},
		listParam{"text_lang", &q.TextLangs, matchingItem(textLangRe, "a language code such as fa or en")},
		listParam{"topic", &q.Topics, matchingItem(topicRe, "a topic (lower-case letters, digits, _ and -, at most 40)")},
	); err != nil {
		return err
	}
	return p.versionReplyTime(q, now)
}

func (p reviewParams) versionReplyTime(q *reviewQuery, now time.Time) error {
	if v, ok := p.get("version"); ok {
		if v == "" || !utf8.ValidString(v) || utf8.RuneCountInString(v) > maxVersion {
			return badParam("version", "must be 1 to %d characters", maxVersion)
		}
		q.Version = &v
	}
	if v, ok := p.get("has_reply"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil || (v != "true" && v != "false") {
			return badParam("has_reply", "must be true or false, not %q", v)
		}
		q.HasReply = &b
	}
	for _, k := range []string{"since", "until"} {
		v, ok := p.get(k)
		if !ok {
			continue
		}
		t, err := parseReviewTime(v, now)
		if err != nil {
			return badParam(k, "%v", err)
		}
		if k == "since" {
			q.Since = t
		} else {
			q.Until = t
		}
	}
	return nil
}

// paging reads how the answer is cut and written: sort, limit, format,
// bom and cursor.
func (p reviewParams) paging(q *reviewQuery, formats []string) error {
	if v, ok := p.get("sort"); ok {
		if err := paramOneOf("sort", v, reviewSorts); err != nil {
			return err
		}
		q.Sort = v
	}
	if v, ok := p.get("limit"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxReviewLimit {
			return badParam("limit", "must be an integer from 1 to %d, not %q", maxReviewLimit, v)
		}
		q.Limit = n
	}
	if v, ok := p.get("format"); ok {
		if err := paramOneOf("format", v, formats); err != nil {
			return err
		}
		q.Format = v
	}
	if v, ok := p.get("bom"); ok {
		if v != "0" && v != "1" {
			return badParam("bom", "must be 0 or 1, not %q", v)
		}
		q.BOM = v == "1" && q.Format == "csv" // the other formats have none
	}
	if v, ok := p.get("cursor"); ok {
		c, err := decodeReviewCursor(v)
		if err != nil {
			return badParam("cursor", "%q is not a next_cursor (MAXID.KEY.ID, digits)", v)
		}
		q.Cursor = &c
	}
	return nil
}

// parseReviewTime is an RFC 3339 time or a positive duration before now
// (7d, 24h).
func parseReviewTime(v string, now time.Time) (time.Time, error) {
	if d, err := parseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration before now such as 7d or 24h", v)
}

// values is the filter as query parameters (the page's links, the CSV
// download).
func (f reviewFilter) values() url.Values {
	v := url.Values{}
	join := func(k string, s []string) {
		if len(s) > 0 {
			v.Set(k, strings.Join(s, ","))
		}
	}
	join("package", f.Packages)
	join("country", f.Countries)
	join("lang", f.Langs)
	if f.Q != "" {
		v.Set("q", f.Q)
	}
	var stars []string
	for _, s := range f.Stars {
		stars = append(stars, strconv.Itoa(int(s)))
	}
	join("stars", stars)
	join("sentiment", f.Sentiments)
	join("text_lang", f.TextLangs)
	join("topic", f.Topics)
	if f.Version != nil {
		v.Set("version", *f.Version)
	}
	if f.HasReply != nil {
		v.Set("has_reply", strconv.FormatBool(*f.HasReply))
	}
	if !f.Since.IsZero() {
		v.Set("since", f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		v.Set("until", f.Until.UTC().Format(time.RFC3339))
	}
	if f.Sort != "newest" {
		v.Set("sort", f.Sort)
	}
	return v
}

// reviewOut is one review of the answer, its fields in the order of the
// CSV columns.
type reviewOut struct {
	PackageName string     `json:"package_name"`
	ReviewID    string     `json:"review_id"`
	UserName    *string    `json:"user_name"`
	Stars       *int16     `json:"stars"`
	Text        *string    `json:"text"`
	At          time.Time  `json:"at"`
	ThumbsUp    int64      `json:"thumbs_up"`
	AppVersion  *string    `json:"app_version"`
	TextLang    *string    `json:"text_lang"`
	Sentiment   *string    `json:"sentiment"`
	Topics      []string   `json:"topics"`
	ReplyText   *string    `json:"reply_text"`
	RepliedAt   *time.Time `json:"replied_at"`
	URL         string     `json:"url"`
	// Storefronts are those the review was seen in, first seen first.
	Storefronts []locale `json:"storefronts"`
}

// reviewCSVFields are the JSON field names of reviewOut, in order: the CSV
// header.
var reviewCSVFields = []string{"package_name", "review_id", "user_name", "stars", "text", "at", "thumbs_up", "app_version",
	"text_lang", "sentiment", "topics", "reply_text", "replied_at", "url", "storefronts"}

// reviewPage is one page of a walk; Next is nil after the last one.
type reviewPage struct {
	Reviews []reviewOut
	Next    *reviewCursor
}

// reviewPager reads pages of reviews; reviewsDB is the one playwatch uses.
type reviewPager interface {
	page(ctx context.Context, q reviewQuery) (reviewPage, error)
}

// reviewsDB reads the reviews on pool (in `run`, the read pool), each page
// one statement: no transaction stays open across pages.
type reviewsDB struct {
	pool    querier
	locales localeDefaults // a review's link is in its app's language
}

// playReviewURL is a review on Google Play.
func playReviewURL(pkg, reviewID, lang string) string {
	return "https://play.google.com/store/apps/details?id=" + url.QueryEscape(pkg) + "&reviewId=" + url.QueryEscape(reviewID) +
		"&hl=" + url.QueryEscape(lang)
}

// reviewsSQL builds the page's statement.
func reviewsSQL(q reviewQuery, appIDs []int64, maxID int64) (string, []any) {
	args := []any{maxID}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	// id + 0: the pin keeps nearly every row, so the primary key is never
	// the index to read them by.
	where := []string{"r.id + 0 <= $1"}
	switch {
	case len(appIDs) == 1:
		where = append(where, "r.application_id = "+arg(appIDs[0]))
	case len(appIDs) > 1:
		where = append(where, "r.application_id = ANY("+arg(appIDs)+"::bigint[])")
	}
	if len(q.Countries) > 0 || len(q.Langs) > 0 {
		// Through review_storefronts' primary key, per review: the other
		// filters and the order choose the reviews read.
		sf := []string{"rs.review_id = r.id", "rs.application_id = r.application_id"} // the second: its index by app and storefront
		if len(q.Countries) > 0 {
			sf = append(sf, "rs.country = ANY("+arg(q.Countries)+"::text[])")
		}
		if len(q.Langs) > 0 {
			sf = append(sf, "rs.lang = ANY("+arg(q.Langs)+"::text[])")
		}
		where = append(where, "EXISTS (SELECT FROM review_storefronts rs WHERE "+strings.Join(sf, " AND ")+")")
	}
	for _, p := range q.Patterns {
		where = append(where, "r.search_text LIKE "+arg(p))
	}
	if len(q.Stars) > 0 {
		where = append(where, "r.score = ANY("+arg(q.Stars)+"::smallint[])")
	}
	if len(q.Sentiments) > 0 {
		where = append(where, "r.sentiment = ANY("+arg(q.Sentiments)+"::text[])")
	}
	if len(q.TextLangs) > 0 {
		where = append(where, "r.text_lang = ANY("+arg(q.TextLangs)+"::text[])")
	}
	if len(q.Topics) > 0 {
		where = append(where, "r.topics && "+arg(q.Topics)+"::text[]")
	}
	if q.Version != nil {
		where = append(where, "r.app_version = "+arg(*q.Version))
	}
	if q.HasReply != nil {
		if *q.HasReply {
			where = append(where, "r.reply_content IS NOT NULL")
		} else {
			where = append(where, "r.reply_content IS NULL")
		}
	}
	if !q.Since.IsZero() {
		where = append(where, "r.at >= "+arg(q.Since))
	}
	if !q.Until.IsZero() {
		where = append(where, "r.at < "+arg(q.Until))
	}
	key, dir, cmp := "r.first_at", "DESC", "<"
	switch q.Sort {
	case "oldest":
		dir, cmp = "ASC", ">"
	case "thumbs_up":
		key = "r.thumbs_up_count"
	}
	if c := q.Cursor; c != nil {
		var k string
		if q.Sort == "thumbs_up" {
			k = arg(c.Key) + "::bigint" // a cursor's key may be past integer
		} else {
			k = arg(time.UnixMicro(c.Key))
		}
		where = append(where, "("+key+", r.id) "+cmp+" ("+k+", "+arg(c.ID)+")")
	}
	order := key
	if len(q.Patterns) > 0 {
		// A search reads the matches through the trigram index and sorts
		// them: walking the order's index until enough match would read
		// all of it for a rare word.
		order += " + " + map[bool]string{true: "0", false: "interval '0'"}[q.Sort == "thumbs_up"]
	}
	sql := `SELECT r.id, a.package_name, a.is_iranian_app, r.review_id, r.user_name, r.score, r.content, r.at,
	r.thumbs_up_count, r.app_version, r.text_lang, r.sentiment, r.topics, r.reply_content, r.replied_at, r.first_at,
	array(SELECT rs.country || ' ' || rs.lang FROM review_storefronts rs WHERE rs.review_id = r.id ORDER BY rs.first_seen_at, rs.country, rs.lang)
FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id
WHERE ` + strings.Join(where, " AND ") + `
ORDER BY ` + order + " " + dir + ", r.id " + dir + `
LIMIT ` + arg(q.Limit+1)
	return sql, args
}

func (db reviewsDB) page(ctx context.Context, q reviewQuery) (reviewPage, error) {
	var page reviewPage
	var appIDs []int64
	if len(q.Packages) > 0 {
		var err error
		if appIDs, err = queryAll(ctx, db.pool, "reviews: packages", pgx.RowTo[int64],
			`SELECT id FROM apps_registry_application WHERE package_name = ANY($1)`, q.Packages); err != nil {
			return page, err
		}
		if len(appIDs) == 0 {
			return page, nil // none registered: no review
		}
	}
	maxID := int64(0)
	if q.Cursor != nil {
		maxID = q.Cursor.MaxID
	} else {
		rows, err := db.pool.Query(ctx, `SELECT coalesce(max(id), 0) FROM reviews`)
		if err != nil {
			return page, fmt.Errorf("reviews: newest id: %w", err)
		}
		if maxID, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64]); err != nil {
			return page, fmt.Errorf("reviews: newest id: %w", err)
		}
	}
	if len(q.Patterns) == 0 && q.Q != "" || q.Version != nil && strings.ContainsRune(*q.Version, 0) {
		return page, nil // a q without a word; a version no stored text can hold
	}
	sql, args := reviewsSQL(q, appIDs, maxID)
	rows, err := db.pool.Query(ctx, sql, args...)
	if err != nil {
		return page, fmt.Errorf("reviews: %w", err)
	}
	var ids []int64
	var keys []int64
	var r reviewOut
	var id int64
	var iranian bool
	var thumbs int32
	var firstAt *time.Time
	var seenIn []string
	_, err = pgx.ForEachRow(rows, []any{&id, &r.PackageName, &iranian, &r.ReviewID, &r.UserName, &r.Stars, &r.Text, &r.At,
		&thumbs, &r.AppVersion, &r.TextLang, &r.Sentiment, &r.Topics, &r.ReplyText, &r.RepliedAt, &firstAt, &seenIn}, func() error {
		out := r
		out.Storefronts = make([]locale, len(seenIn))
		for i, s := range seenIn {
			out.Storefronts[i] = splitStorefront(s)
		}
		out.At = out.At.UTC()
		if out.RepliedAt != nil {
			t := out.RepliedAt.UTC()
			out.RepliedAt = &t
		}
		out.ThumbsUp = int64(thumbs)
		lang := db.locales.forApp(iranian).Lang
		if len(out.Storefronts) > 0 { // the language it was first read in
			lang = out.Storefronts[0].Lang
		}
		out.URL = playReviewURL(out.PackageName, out.ReviewID, lang)
		page.Reviews = append(page.Reviews, out)
		ids = append(ids, id)
		if q.Sort == "thumbs_up" {
			keys = append(keys, int64(thumbs))
		} else if firstAt != nil {
			keys = append(keys, firstAt.UnixMicro())
		} else {
			keys = append(keys, out.At.UnixMicro())
		}
		r = reviewOut{}
		return nil
	})
	if err != nil {
		return reviewPage{}, fmt.Errorf("reviews: %w", err)
	}
	if len(page.Reviews) > q.Limit {
		page.Reviews = page.Reviews[:q.Limit]
		last := q.Limit - 1
		page.Next = &reviewCursor{MaxID: maxID, Key: keys[last], ID: ids[last]}
	}
	return page, nil
}
