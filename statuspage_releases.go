package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Releases and ratings: the app page's table and chart per app version
// (reviews.app_version and the listing's app_stats.version), and the
// rating chart's marks where each version appeared, per storefront. One
// query per page, bounded to the last releasesWindow of the storefront's
// review rollups and listings (both by (application_id, country, lang, …)).

const (
	// releasesShown is how many versions the page lists, newest first; one
	// more is read so that the oldest shown has a previous to compare with.
	releasesShown  = 10
	releasesWindow = 180 * 24 * time.Hour
	// A version is worse than the previous one when, with at least
	// releaseMinReviews reviews each, its mean stars fell by
	// releaseStarsDrop or its share negative rose by releaseNegativeRise.
	releaseMinReviews   = 20
	releaseStarsDrop    = 0.5
	releaseNegativeRise = 0.15
)

// releaseStat is one app version of the last releasesWindow.
type releaseStat struct {
	Version   string
	FirstSeen time.Time // the earliest of its first listing and its first review
	Reviews   int64
	MeanStars *float64 // nil: no review with stars
	Labelled  int64    // reviews the sentiment job has labelled
	Negative  int64    // of them, NEGATIVE
	Topics    []string // its reviews' most frequent topics, at most 3
}

// share is the share of labelled reviews that are negative; ok is false
// when none is labelled.
func (r releaseStat) share() (v float64, ok bool) {
	if r.Labelled == 0 {
		return 0, false
	}
	return float64(r.Negative) / float64(r.Labelled), true
}

// appReleasesSQL: $1 the app's id, $2 now, $3 how many versions, $4 and
// $5 the storefront's country and lang. The reviews' counts, stars and
// topics per version are the storefront's hourly rollups of the 180 days
// (migration 17; the first review of a version is its first hour, score 0
// is "no stars"); the versions of its listings come from app_stats.
const appReleasesSQL = `WITH r AS (
	SELECT app_version AS version, min(hour) FILTER (WHERE reviews > 0) AS first_review, sum(reviews)::bigint AS n,
		(sum(score * reviews) FILTER (WHERE score > 0))::float8 / nullif(sum(reviews) FILTER (WHERE score > 0), 0) AS mean,
		coalesce(sum(reviews) FILTER (WHERE sentiment <> ''), 0)::bigint AS labelled,
		coalesce(sum(reviews) FILTER (WHERE sentiment = 'NEGATIVE'), 0)::bigint AS neg
	FROM review_rollup_hourly
	WHERE application_id = $1 AND country = $4 AND lang = $5
	  AND hour > $2::timestamptz - interval '180 days' AND hour <= $2 AND app_version <> ''
	GROUP BY app_version HAVING sum(reviews) > 0),
t AS (SELECT version, (array_agg(topic ORDER BY n DESC, topic))[1:3] AS topics
	FROM (SELECT app_version AS version, topic, sum(reviews) AS n FROM review_topic_rollup_hourly
		WHERE application_id = $1 AND country = $4 AND lang = $5
		  AND hour > $2::timestamptz - interval '180 days' AND hour <= $2 AND app_version <> ''
		GROUP BY 1, 2 HAVING sum(reviews) > 0) c
	GROUP BY version),
s AS (SELECT version, min(crawled_at) AS first_listing FROM app_stats
	WHERE application_id = $1 AND country = $4 AND lang = $5
	  AND crawled_at > $2::timestamptz - interval '180 days' AND crawled_at <= $2 AND coalesce(version, '') <> ''
	GROUP BY version)
SELECT coalesce(r.version, s.version) AS version, least(r.first_review, s.first_listing) AS first_seen,
	coalesce(r.n, 0), r.mean, coalesce(r.labelled, 0), coalesce(r.neg, 0), coalesce(t.topics, '{}')
FROM r FULL JOIN s ON s.version = r.version
LEFT JOIN t ON t.version = coalesce(r.version, s.version)
ORDER BY first_seen DESC, version LIMIT $3`

// loadAppReleases is the app's versions, newest first, releasesShown + 1
// of them at most.
func loadAppReleases(ctx context.Context, tx pgx.Tx, appID int64, front locale, now time.Time) ([]releaseStat, error) {
	return queryRows(ctx, tx, fmt.Sprintf("releases of app %d", appID), func(row pgx.CollectableRow, r *releaseStat) error {
		return row.Scan(&r.Version, &r.FirstSeen, &r.Reviews, &r.MeanStars, &r.Labelled, &r.Negative, &r.Topics)
	}, appReleasesSQL, appID, now, releasesShown+1, front.Country, front.Lang)
}

// releasesSection is the app page's releases table and chart.
type releasesSection struct {
	Rows  []releaseView // newest version first
	Chart chart
}

// releaseView is one row of the app page's releases table.
type releaseView struct {
	Version, FirstSeen, Reviews, MeanStars, Negative, Topics string
	Worse                                                    string // why it is worse than the previous version; empty if it is not
}

// worseThan says how cur drew clearly worse reviews than prev, or "".
func worseThan(cur, prev releaseStat) string {
	if cur.Reviews < releaseMinReviews || prev.Reviews < releaseMinReviews || cur.MeanStars == nil || prev.MeanStars == nil {
		return ""
	}
	// The epsilon keeps 3.9 - 3.4 = 0.4999… a drop of 0.5.
	worse := *prev.MeanStars-*cur.MeanStars >= releaseStarsDrop-1e-9
	cs, cok := cur.share()
	ps, pok := prev.share()
	if cok && pok && cs-ps >= releaseNegativeRise-1e-9 {
		worse = true
	}
	if !worse {
		return ""
	}
	why := fmt.Sprintf("worse than %s: mean stars %.1f vs %.1f", prev.Version, *cur.MeanStars, *prev.MeanStars)
	if cok && pok {
		why += fmt.Sprintf(", negative %.0f%% vs %.0f%%", 100*cs, 100*ps)
	}
	return why
}

// releaseViews is the table of stats (newest first): releasesShown rows,
// each compared with the version before it.
func releaseViews(stats []releaseStat) []releaseView {
	var out []releaseView
	for i, r := range stats[:min(len(stats), releasesShown)] {
		v := releaseView{Version: r.Version, FirstSeen: r.FirstSeen.UTC().Format("2 Jan 2006 15:04"), Reviews: groupDigits(r.Reviews),
			MeanStars: optFloat(r.MeanStars, "%.2f"), Negative: "—", Topics: strings.Join(r.Topics, ", ")}
		if s, ok := r.share(); ok {
			v.Negative = fmt.Sprintf("%.0f %%", 100*s)
		}
		if i+1 < len(stats) {
			v.Worse = worseThan(r, stats[i+1])
		}
		out = append(out, v)
	}
	return out
}

// releasesChart draws the mean stars of each shown version, oldest on the
// left; a version worse than the previous one is a "worse" bar.
func releasesChart(stats []releaseStat) chart {
	c := newChart("releases", "Mean stars per version", "stars of its reviews, last 180 days")
	shown := stats[:min(len(stats), releasesShown)]
	var drawn []int // indexes into shown, oldest first, of versions with stars
	for i := len(shown) - 1; i >= 0; i-- {
		if shown[i].MeanStars != nil {
			drawn = append(drawn, i)
		}
	}
	if len(drawn) == 0 {
		c.Empty = "no review of these versions has stars"
		return c
	}
	ys := scale{0, 5, c.Plot.Bottom(), c.Plot.Y}
	for v := 0; v <= 5; v++ {
		c.YTicks = append(c.YTicks, tick{ys.at(float64(v)), fmt.Sprint(v)})
	}
	slot := c.Plot.W / float64(len(drawn))
	for k, i := range drawn {
		r := shown[i]
		x := c.Plot.X + float64(k)*slot
		class := "rel"
		if i+1 < len(stats) && worseThan(r, stats[i+1]) != "" {
			class = "rel worse"
		}
		y := ys.at(*r.MeanStars)
		c.Bars = append(c.Bars, bar{X: x + slot*0.2, Y: y, W: slot * 0.6, H: c.Plot.Bottom() - y, Class: class,
			Label: fmt.Sprintf("%s: mean stars %.2f of %s reviews", r.Version, *r.MeanStars, groupDigits(r.Reviews))})
		c.XTicks = append(c.XTicks, tick{x + slot/2, shortText(r.Version, 9)}) // 9 characters fit a slot of 10 versions
		c.Points++
	}
	return c
}

// releaseMarks are the versions' first-seen times, for the rating chart.
func releaseMarks(stats []releaseStat) []timeMark {
	var out []timeMark
	for _, r := range stats[:min(len(stats), releasesShown)] {
		out = append(out, timeMark{T: r.FirstSeen, Label: shortText(r.Version, 12),
			Title: "version " + r.Version + " first seen " + r.FirstSeen.UTC().Format("2 Jan 2006 15:04 UTC")})
	}
	return out
}
