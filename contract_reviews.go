package main

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// The reviews topic: one review as seen by one crawl, key = package_name
// (docs/design.md "reviews", docs/schema.md "reviews").
const topicReviews = "reviews"

// reviewMessage is one review as seen by one crawl. CrawledAt becomes
// reviews.last_synced_at. The fields after CrawledAt came later: a message
// of an older playwatch lacks them, and they are stored as NULL; one without
// Country and Lang is stored in its app's first storefront.
type reviewMessage struct {
	PackageName   string     `json:"package_name"`
	ReviewID      string     `json:"review_id"`
	UserName      *string    `json:"user_name"`
	ThumbsUpCount int64      `json:"thumbs_up_count"`
	Score         *int       `json:"score"`
	Content       *string    `json:"content"`
	At            time.Time  `json:"at"`
	CrawledAt     time.Time  `json:"crawled_at"`
	ReplyContent  *string    `json:"reply_content"`
	RepliedAt     *time.Time `json:"replied_at"`
	AppVersion    *string    `json:"app_version"`
	// Country and Lang are the storefront the review was read in (both or
	// neither): review_storefronts records each one a review was seen in.
	Country string `json:"country"`
	Lang    string `json:"lang"`
}

// reviewMessageFrom maps one review of pkg, read in storefront loc, to its
// message (docs/playstore-protocol.md §5.2).
func reviewMessageFrom(pkg string, loc locale, r review) reviewMessage {
	m := reviewMessage{
		PackageName:  pkg,
		ReviewID:     r.ReviewID,
		UserName:     cleanTextPtr(r.UserName),
		Score:        r.Score,
		Content:      cleanTextPtr(r.Content),
		At:           r.At,
		CrawledAt:    messageTime(r.FetchedAt),
		ReplyContent: cleanTextPtr(r.ReplyContent),
		RepliedAt:    r.RepliedAt,
		AppVersion:   cleanTextPtr(r.AppVersion),
		Country:      loc.Country,
		Lang:         loc.Lang,
	}
	if r.ThumbsUpCount != nil {
		m.ThumbsUpCount = *r.ThumbsUpCount
	}
	return m
}

// encodeJSON returns exactly what json.Marshal(m) returns (the bytes are the
// contract; TestPublishReviewJSONIsEncodingJSON holds them together), several
// times faster: a crawl encodes a thousand reviews per app, and reflection
// took a quarter of the crawler's CPU.
func (m *reviewMessage) encodeJSON() ([]byte, error) {
	// Keys, numbers and times take at most 360 bytes.
	n := 360 + len(m.PackageName) + len(m.ReviewID)
	for _, s := range []*string{m.UserName, m.Content, m.ReplyContent, m.AppVersion, &m.Country, &m.Lang} {
		if s != nil {
			n += len(*s)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, `{"package_name":`...)
	b = appendJSONString(b, &m.PackageName)
	b = append(b, `,"review_id":`...)
	b = appendJSONString(b, &m.ReviewID)
	b = append(b, `,"user_name":`...)
	b = appendJSONString(b, m.UserName)
	b = append(b, `,"thumbs_up_count":`...)
	b = strconv.AppendInt(b, m.ThumbsUpCount, 10)
	b = append(b, `,"score":`...)
	if m.Score == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(*m.Score), 10)
	}
	b = append(b, `,"content":`...)
	b = appendJSONString(b, m.Content)
	b = append(b, `,"at":`...)
	b, err := appendJSONTime(b, m.At)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"crawled_at":`...)
	if b, err = appendJSONTime(b, m.CrawledAt); err != nil {
		return nil, err
	}
	b = append(b, `,"reply_content":`...)
	b = appendJSONString(b, m.ReplyContent)
	b = append(b, `,"replied_at":`...)
	if m.RepliedAt == nil {
		b = append(b, "null"...)
	} else if b, err = appendJSONTime(b, *m.RepliedAt); err != nil {
		return nil, err
	}
	b = append(b, `,"app_version":`...)
	b = appendJSONString(b, m.AppVersion)
	b = append(b, `,"country":`...)
	b = appendJSONString(b, &m.Country)
	b = append(b, `,"lang":`...)
	b = appendJSONString(b, &m.Lang)
	return append(b, '}'), nil
}

// appendJSONString appends *s as encoding/json writes it, null for nil. A
// string with nothing to escape is copied; any other goes through
// json.Marshal, so that every escape is encoding/json's own.
func appendJSONString(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	for _, r := range *s {
		if r < ' ' || r == '"' || r == '\\' || r == '<' || r == '>' || r == '&' ||
			r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
			q, _ := json.Marshal(*s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, *s...)
	return append(b, '"')
}

// appendJSONTime appends t as time.Time's MarshalJSON writes it, failing
// where it fails (a year outside 0-9999).
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return nil, err
	}
	return append(b, '"'), nil
}

func (m *reviewMessage) validate(now time.Time) *invalidRecord {
	c := checks{now: now}
	c.packageName(m.PackageName)
	c.requiredText("review_id", m.ReviewID, maxVarchar255)
	c.timestamp("at", &m.At, true)
	c.timestamp("crawled_at", &m.CrawledAt, true)
	c.text("user_name", m.UserName, maxVarchar255)
	c.text("content", m.Content, 0)
	c.count("thumbs_up_count", m.ThumbsUpCount, math.MaxInt32)
	if m.Score != nil && (*m.Score < 1 || *m.Score > 5) {
		c.fail(reasonOutOfRange, "score is %d, a review's score is 1 to 5", *m.Score)
	}
	c.text("reply_content", m.ReplyContent, 0)
	c.timestamp("replied_at", m.RepliedAt, false)
	c.text("app_version", m.AppVersion, maxVersion)
	c.storefront(m.Country, m.Lang)
	return c.result()
}

func (m *reviewMessage) packageName() string   { return m.PackageName }
func (m *reviewMessage) newestTime() time.Time { return m.CrawledAt }
func (m *reviewMessage) storefront() locale    { return locale{Lang: m.Lang, Country: m.Country} }
func (m *reviewMessage) setStorefront(l locale) {
	m.Country, m.Lang = l.Country, l.Lang
}

// reviewRow is one row of reviews.
type reviewRow = row[reviewMessage]

// reviewsContract keeps the latest version of each review, and records each
// storefront a review was seen in (review_storefronts). The upsert never
// sets sentiment (the sentiment job's), first_seen_at or application_id, and
// only a strictly newer crawl replaces a stored version, its reply and app
// version included: a redelivery, a replay or two partitions read out of
// order never bring back older data.
var reviewsContract = newTableContract(tableContract[reviewMessage, *reviewMessage]{
	topic: topicReviews,
	table: "reviews",
	columns: []column[reviewMessage]{
		{"review_id", "text", func(m *reviewMessage) any { return m.ReviewID }},
		{"user_name", "text", func(m *reviewMessage) any { return m.UserName }},
		{"thumbs_up_count", "integer", func(m *reviewMessage) any { return m.ThumbsUpCount }},
		{"score", "smallint", func(m *reviewMessage) any { return m.Score }},
		{"content", "text", func(m *reviewMessage) any { return m.Content }},
		{"at", "timestamptz", func(m *reviewMessage) any { return m.At }},
		{"last_synced_at", "timestamptz", func(m *reviewMessage) any { return m.CrawledAt }},
		{"reply_content", "text", func(m *reviewMessage) any { return m.ReplyContent }},
		{"replied_at", "timestamptz", func(m *reviewMessage) any { return m.RepliedAt }},
		{"app_version", "text", func(m *reviewMessage) any { return m.AppVersion }},
		// The search columns (reviews_search.go): the normal form is Go
		// code, so it is computed here and stored with the review.
		{"search_text", "text", func(m *reviewMessage) any { return searchTextOf(m.Content) }},
		{"search_version", "smallint", func(m *reviewMessage) any { return searchTextVersion }},
		// Set on insert only: the reviews API's paging key never moves.
		{"first_at", "timestamptz", func(m *reviewMessage) any { return m.At }},
	},
	conflict: `ON CONFLICT (review_id) DO UPDATE SET
	user_name = EXCLUDED.user_name, thumbs_up_count = EXCLUDED.thumbs_up_count, score = EXCLUDED.score,
	content = EXCLUDED.content, at = EXCLUDED.at, last_synced_at = EXCLUDED.last_synced_at,
	reply_content = EXCLUDED.reply_content, replied_at = EXCLUDED.replied_at, app_version = EXCLUDED.app_version,
	search_text = EXCLUDED.search_text, search_version = EXCLUDED.search_version
WHERE EXCLUDED.last_synced_at > t.last_synced_at`,
	prepare:    keepNewestReviews,
	afterWrite: recordReviewStorefronts,
})

// keepNewestReviews keeps one version of each review of a batch: the one
// with the latest crawled_at (the first of equal ones, as the upsert's
// guard would). ON CONFLICT cannot update one row twice in a statement.
// rows stay as they are: every one of them names a storefront the review
// was seen in (recordReviewStorefronts).
func keepNewestReviews(rows []reviewRow) []reviewRow {
	seen := make(map[string]int, len(rows))
	out := make([]reviewRow, 0, len(rows))
	for _, r := range rows {
		if i, ok := seen[r.msg.ReviewID]; ok {
			if r.msg.CrawledAt.After(out[i].msg.CrawledAt) {
				out[i] = r
			}
			continue
		}
		seen[r.msg.ReviewID] = len(out)
		out = append(out, r)
	}
	return out
}
