package main

import (
	"context"
	"fmt"
	"html"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The app-stats topic: one crawl of one app's store listing, key =
// package_name (docs/design.md "app-stats", docs/schema.md "app_stats").
const topicAppStats = "app-stats"

// appStatsMessage is one crawl of one app's store listing. Pointers are the
// nullable metrics: a metric the store did not show is null, never a zero
// that looks like data. The fields after CrawledAt came later: a message of
// an older playwatch lacks them, and they are stored as NULL; one without
// Country and Lang is stored in its app's first storefront.
type appStatsMessage struct {
	PackageName  string     `json:"package_name"`
	Title        *string    `json:"title"`
	Genre        *string    `json:"genre"`
	MinInstalls  *int64     `json:"min_installs"`
	Score        *float64   `json:"score"`
	Ratings      *int64     `json:"ratings"`
	ReviewsCount *int64     `json:"reviews_count"`
	Version      *string    `json:"version"`
	AdSupported  *bool      `json:"ad_supported"`
	AppUpdatedAt *time.Time `json:"app_updated_at"`
	CrawledAt    time.Time  `json:"crawled_at"`
	RealInstalls *int64     `json:"real_installs"`
	// Histogram is the number of ratings of 1 to 5 stars, in that order;
	// pointers, so that a null count is refused rather than read as 0.
	Histogram     []*int64   `json:"histogram"`
	Developer     *string    `json:"developer"`
	ReleasedAt    *time.Time `json:"released_at"`
	RecentChanges *string    `json:"recent_changes"`
	// Country and Lang are the storefront the listing was read in (both or
	// neither).
	Country string `json:"country"`
	Lang    string `json:"lang"`
}

// appStatsFromDetails maps a details result, read in storefront loc, to its
// message (docs/playstore-protocol.md §5.1).
func appStatsFromDetails(d appDetails, loc locale) appStatsMessage {
	m := appStatsMessage{
		PackageName:   d.PackageName,
		Title:         cleanTextPtr(&d.Title),
		Genre:         cleanTextPtr(d.Genre),
		MinInstalls:   d.MinInstalls,
		Ratings:       d.Ratings,
		ReviewsCount:  d.ReviewsCount,
		Version:       cleanTextPtr(d.Version),
		AdSupported:   &d.AdSupported,
		AppUpdatedAt:  d.UpdatedAt,
		CrawledAt:     messageTime(d.FetchedAt),
		RealInstalls:  d.RealInstalls,
		Developer:     cleanTextPtr(d.Developer),
		ReleasedAt:    d.ReleasedAt,
		RecentChanges: recentChangesText(d.RecentChangesHTML),
		Country:       loc.Country,
		Lang:          loc.Lang,
	}
	// An average below one star only appears on unrated listings ("0.0"
	// over 0 ratings): that zero is not data.
	if d.Score != nil && *d.Score >= 1 {
		m.Score = d.Score
	}
	if d.Histogram != nil {
		for i := range d.Histogram {
			m.Histogram = append(m.Histogram, &d.Histogram[i])
		}
	}
	return m
}

// lineBreaks are the HTML line breaks of the "what's new" text.
var lineBreaks = strings.NewReplacer("<br>", "\n", "<br/>", "\n", "<br />", "\n")

// recentChangesText is the page's "what's new" HTML as plain text: line
// breaks as newlines, entities decoded.
func recentChangesText(s *string) *string {
	if s == nil {
		return nil
	}
	text := html.UnescapeString(lineBreaks.Replace(*s))
	return cleanTextPtr(&text)
}

func (m *appStatsMessage) validate(now time.Time) *invalidRecord {
	c := checks{now: now}
	c.packageName(m.PackageName)
	c.timestamp("crawled_at", &m.CrawledAt, true)
	c.text("title", m.Title, maxVarchar255)
	c.text("genre", m.Genre, maxCategory)
	c.text("version", m.Version, maxVersion)
	c.optCount("min_installs", m.MinInstalls)
	c.optCount("ratings", m.Ratings)
	c.optCount("reviews_count", m.ReviewsCount)
	c.number("score", m.Score, 0, 5, false)
	c.timestamp("app_updated_at", m.AppUpdatedAt, false)
	c.optCount("real_installs", m.RealInstalls)
	if m.Histogram != nil && len(m.Histogram) != 5 {
		c.fail(reasonBadValue, "histogram has %d counts, the contract wants five (1 to 5 stars)", len(m.Histogram))
	}
	for i, n := range m.Histogram {
		switch {
		case n == nil:
			c.fail(reasonWrongType, "histogram[%d] is null, the contract wants a count", i)
		case *n < 0:
			c.fail(reasonOutOfRange, "histogram[%d] is %d, a count cannot be negative", i, *n)
		}
	}
	c.text("developer", m.Developer, maxVarchar255)
	c.timestamp("released_at", m.ReleasedAt, false)
	c.text("recent_changes", m.RecentChanges, 0)
	c.storefront(m.Country, m.Lang)
	return c.result()
}

func (m *appStatsMessage) packageName() string   { return m.PackageName }
func (m *appStatsMessage) newestTime() time.Time { return m.CrawledAt }
func (m *appStatsMessage) storefront() locale    { return locale{Lang: m.Lang, Country: m.Country} }
func (m *appStatsMessage) setStorefront(l locale) {
	m.Country, m.Lang = l.Country, l.Lang
}

// ratingsOf returns the column value of the ratings of stars (1 to 5).
func ratingsOf(stars int) func(*appStatsMessage) any {
	return func(m *appStatsMessage) any {
		if m.Histogram == nil {
			return nil
		}
		return *m.Histogram[stars-1]
	}
}

// statRow is one row of app_stats.
type statRow = row[appStatsMessage]

// appStatsContract appends one row per crawl of a storefront;
// (application_id, country, lang, crawled_at) is the idempotency key, so a
// redelivered message adds nothing. The newest
// title and genre of a batch fill the app's empty registry names.
var appStatsContract = newTableContract(tableContract[appStatsMessage, *appStatsMessage]{
	topic: topicAppStats,
	table: "app_stats",
	columns: []column[appStatsMessage]{
		{"min_installs", "bigint", func(m *appStatsMessage) any { return m.MinInstalls }},
		{"score", "double precision", func(m *appStatsMessage) any { return m.Score }},
		{"ratings", "bigint", func(m *appStatsMessage) any { return m.Ratings }},
		{"reviews_count", "bigint", func(m *appStatsMessage) any { return m.ReviewsCount }},
		{"version", "text", func(m *appStatsMessage) any { return m.Version }},
		{"ad_supported", "boolean", func(m *appStatsMessage) any { return m.AdSupported }},
		{"app_updated_at", "timestamptz", func(m *appStatsMessage) any { return m.AppUpdatedAt }},
		{"crawled_at", "timestamptz", func(m *appStatsMessage) any { return m.CrawledAt }},
		{"real_installs", "bigint", func(m *appStatsMessage) any { return m.RealInstalls }},
		{"ratings_1", "bigint", ratingsOf(1)},
		{"ratings_2", "bigint", ratingsOf(2)},
		{"ratings_3", "bigint", ratingsOf(3)},
		{"ratings_4", "bigint", ratingsOf(4)},
		{"ratings_5", "bigint", ratingsOf(5)},
		{"developer", "text", func(m *appStatsMessage) any { return m.Developer }},
		{"released_at", "timestamptz", func(m *appStatsMessage) any { return m.ReleasedAt }},
		{"recent_changes", "text", func(m *appStatsMessage) any { return m.RecentChanges }},
		// Set by the consumer where the message names none (an older
		// playwatch's): the app's first storefront.
		{"country", "text", func(m *appStatsMessage) any { return storefrontCode(m.Country) }},
		{"lang", "text", func(m *appStatsMessage) any { return storefrontCode(m.Lang) }},
	},
	conflict:   "ON CONFLICT (application_id, country, lang, crawled_at) DO NOTHING",
	afterWrite: fillRegistry,
})

// tableRegistry is the table whose empty names app-stats fill.
const tableRegistry = "apps_registry_application"

// fillRegistry sets an app's display_name and category from the newest
// store title and genre of the batch where they are NULL or empty; a value
// somebody set is never overwritten.
func fillRegistry(ctx context.Context, tx pgx.Tx, rows []statRow) (rowCounts, error) {
	newest := map[int64]*statRow{}
	for i := range rows {
		r := &rows[i]
		if r.msg.Title == nil && r.msg.Genre == nil {
			continue
		}
		if n, ok := newest[r.appID]; !ok || r.msg.CrawledAt.After(n.msg.CrawledAt) {
			newest[r.appID] = r
		}
	}
	if len(newest) == 0 {
		return nil, nil
	}
	ids := make([]int64, 0, len(newest))
	for id := range newest {
		ids = append(ids, id)
	}
	slices.Sort(ids) // one lock order for all writers
	titles, genres := make([]*string, len(ids)), make([]*string, len(ids))
	for i, id := range ids {
		titles[i], genres[i] = newest[id].msg.Title, newest[id].msg.Genre
	}
	tag, err := tx.Exec(ctx, `
		UPDATE apps_registry_application a SET
			display_name = CASE WHEN coalesce(a.display_name, '') = '' AND f.title <> '' THEN f.title ELSE a.display_name END,
			category     = CASE WHEN coalesce(a.category, '') = '' AND f.genre <> '' THEN f.genre ELSE a.category END
		FROM unnest($1::bigint[], $2::text[], $3::text[]) AS f(id, title, genre)
		WHERE a.id = f.id
		  AND ((coalesce(a.display_name, '') = '' AND f.title <> '') OR (coalesce(a.category, '') = '' AND f.genre <> ''))`,
		ids, titles, genres)
	if err != nil {
		return nil, fmt.Errorf("fill registry names: %w", err)
	}
	return rowCounts{tableRegistry: tag.RowsAffected()}, nil
}
