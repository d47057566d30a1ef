package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Storefronts on the status page: the overview shows each app once with
// its storefronts side by side, the app page one storefront at a time
// (?storefront=COUNTRY-LANG, the first by default) with a block comparing
// the newest listing of each.

// appStorefrontsSQL is the lateral table sf (position, country, lang) of
// the app a: its app_storefronts rows, else its default storefront from
// is_iranian_app and the PLAYSTORE_* settings ($2 default country, $3
// Iranian country, $4 default lang, $5 Iranian lang), as
// localeDefaults.storefronts resolves it.
const appStorefrontsSQL = `CROSS JOIN LATERAL (
	SELECT f.position, f.country::text AS country, f.lang::text AS lang FROM app_storefronts f WHERE f.application_id = a.id
	UNION ALL
	SELECT 0, CASE WHEN a.is_iranian_app THEN $3::text ELSE $2::text END, CASE WHEN a.is_iranian_app THEN $5::text ELSE $4::text END
	WHERE NOT EXISTS (SELECT 1 FROM app_storefronts f WHERE f.application_id = a.id)) sf`

// storefrontArgs are the parameters $2 … $5 of appStorefrontsSQL.
func storefrontArgs(d localeDefaults) []any {
	return []any{d.Default.Country, d.Iranian.Country, d.Default.Lang, d.Iranian.Lang}
}

// storefrontLabel is a storefront as the pages show it: "ir/fa".
func storefrontLabel(l locale) string { return l.Country + "/" + l.Lang }

// storefrontParam is a storefront as the app page's ?storefront= takes it:
// "ir-fa" (the country has no dash, so "br-pt-BR" is br and pt-BR).
func storefrontParam(l locale) string { return l.Country + "-" + l.Lang }

// parseStorefrontParam splits ?storefront=; ok is false for a value that
// is not COUNTRY-LANG.
func parseStorefrontParam(v string) (l locale, ok bool) {
	country, lang, found := strings.Cut(v, "-")
	if !found || parseLocaleCode(country) != nil || parseLocaleCode(lang) != nil {
		return locale{}, false
	}
	return locale{Lang: lang, Country: country}, true
}

// storefrontLink is one entry of the app page's storefront switch.
type storefrontLink struct {
	Label, Href string
	Current     bool
}

func storefrontSwitch(pkg string, fronts []locale, current locale) []storefrontLink {
	if len(fronts) < 2 {
		return nil
	}
	var out []storefrontLink
	for _, f := range fronts {
		out = append(out, storefrontLink{Label: storefrontLabel(f), Current: f == current,
			Href: "/apps/" + url.PathEscape(pkg) + "?storefront=" + url.QueryEscape(storefrontParam(f))})
	}
	return out
}

// storefrontNames is the storefronts as a sentence: "ir/fa, us/en".
func storefrontNames(fronts []locale) string {
	names := make([]string, len(fronts))
	for i, f := range fronts {
		names[i] = storefrontLabel(f)
	}
	return strings.Join(names, ", ")
}

// appStorefrontRowsSQL is the app page's storefronts: $1 the app's id,
// $2 … $5 as in appStorefrontsSQL.
const appStorefrontRowsSQL = `SELECT sf.country, sf.lang FROM apps_registry_application a ` + appStorefrontsSQL + `
	WHERE a.id = $1 ORDER BY sf.position`

func loadAppStorefronts(ctx context.Context, tx pgx.Tx, appID int64, d localeDefaults) ([]locale, error) {
	return queryRows(ctx, tx, fmt.Sprintf("storefronts of app %d", appID), func(row pgx.CollectableRow, l *locale) error {
		return row.Scan(&l.Country, &l.Lang)
	}, appStorefrontRowsSQL, append([]any{appID}, storefrontArgs(d)...)...)
}

// storefrontCompare is one storefront's column of the comparison block:
// its newest listing.
type storefrontCompare struct {
	Front     locale
	At        *time.Time
	Score     *float64
	Ratings   *int64
	Installs  *int64 // real_installs, else min_installs
	Histogram [5]*int64
}

// appCompareSQL is the newest listing of each storefront of an app: $1
// the app's id, $2 and $3 the storefronts' countries and langs. One index
// lookup of app_stats (application_id, country, lang, crawled_at) each.
const appCompareSQL = `SELECT f.country, f.lang, s.crawled_at, s.score, s.ratings, coalesce(s.real_installs, s.min_installs),
	s.ratings_1, s.ratings_2, s.ratings_3, s.ratings_4, s.ratings_5
FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS f(country, lang, i)
LEFT JOIN LATERAL (
	SELECT crawled_at, score, ratings, real_installs, min_installs, ratings_1, ratings_2, ratings_3, ratings_4, ratings_5
	FROM app_stats WHERE application_id = $1 AND country = f.country AND lang = f.lang ORDER BY crawled_at DESC LIMIT 1) s ON true
ORDER BY f.i`

func loadStorefrontCompare(ctx context.Context, tx pgx.Tx, appID int64, fronts []locale) ([]storefrontCompare, error) {
	countries, langs := make([]string, len(fronts)), make([]string, len(fronts))
	for i, f := range fronts {
		countries[i], langs[i] = f.Country, f.Lang
	}
	return queryRows(ctx, tx, fmt.Sprintf("storefronts compared of app %d", appID), func(row pgx.CollectableRow, c *storefrontCompare) error {
		return row.Scan(&c.Front.Country, &c.Front.Lang, &c.At, &c.Score, &c.Ratings, &c.Installs,
			&c.Histogram[0], &c.Histogram[1], &c.Histogram[2], &c.Histogram[3], &c.Histogram[4])
	}, appCompareSQL, appID, countries, langs)
}

// compareView is the app page's comparison block: one column per
// storefront, the current one marked.
type compareView struct {
	Fronts []compareColumn
}

type compareColumn struct {
	Label, Href, Score, Ratings, Installs, Crawled string
	Current                                        bool
	Stars                                          []compareStar // 5 ★ first
}

// compareStar is one bar of a storefront's histogram, as a share of its
// ratings (the bar's width in percent).
type compareStar struct {
	Label, Count, Share string
	Class               string
	Width               int
}

func compareViewOf(pkg string, cs []storefrontCompare, current locale, now time.Time) compareView {
	var v compareView
	for _, c := range cs {
		col := compareColumn{Label: storefrontLabel(c.Front), Current: c.Front == current,
			Href:  "/apps/" + url.PathEscape(pkg) + "?storefront=" + url.QueryEscape(storefrontParam(c.Front)),
			Score: optFloat(c.Score, "%.2f"), Ratings: optInt(c.Ratings), Installs: optInt(c.Installs), Crawled: "no listing stored"}
		if c.At != nil {
			col.Crawled = ago(now.Sub(*c.At))
		}
		var total int64
		for _, n := range c.Histogram {
			total += orZero(n)
		}
		for star := 5; star >= 1; star-- {
			n := orZero(c.Histogram[star-1])
			s := compareStar{Label: fmt.Sprintf("%d ★", star), Count: groupDigits(n), Share: "—", Class: fmt.Sprintf("h%d", star)}
			if total > 0 {
				s.Width = int(100 * n / total)
				s.Share = fmt.Sprintf("%.0f %%", 100*float64(n)/float64(total))
			}
			col.Stars = append(col.Stars, s)
		}
		v.Fronts = append(v.Fronts, col)
	}
	return v
}
