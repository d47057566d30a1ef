package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The per-app gauges' read (app_gauges.go): one row per active app and
// storefront. The listing is the storefront's newest app_stats row (its
// unique key (application_id, country, lang, crawled_at) read backwards);
// the reviews come from the rollups of migration 17 (docs/schema.md
// §Rollups): review_rollup_totals for the counts by sentiment, the hourly
// buckets for the windows. A window's whole hours are read from the buckets
// and its two partial hours at either end from the raw reviews, so "the
// last hour" is the last 60 minutes, as before the rollups. The partial
// hours of every storefront are read once, by time (reviews_at_idx, then
// review_storefronts' key), and joined to the storefronts: read per
// storefront, PostgreSQL walked a whole partial hour of every app for each
// storefront once the history was large (at 10M reviews; both indexes
// estimate one row there). Either way the cost is that of a few hours of
// reviews however long the history.

// appGaugeRow is one app's business numbers in one storefront for /metrics.
type appGaugeRow struct {
	Package, Country, Lang string
	Score                  *float64
	Ratings                *int64
	Installs               *int64 // real_installs, else min_installs
	Reviews                sentimentCounts
	Negative1h, Negative7d int64 // NEGATIVE reviews whose time is within the last hour, 7 days
	NewestReviewAt         *time.Time
	Topics7d               map[string]int64 // reviews of the last 7 days by topic (statuspage_topics.go)
}

// A window (now - w, now] ($1 now) is its first partial hour, its whole
// hours and its last partial hour, the one now is in.
func windowStart(w string) string { return `$1::timestamptz - interval '` + w + `'` }

// inFirstHourSQL: a review's time is in the window's first partial hour.
func inFirstHourSQL(w string) string {
	return `(at > ` + windowStart(w) + ` AND at < date_trunc('hour', ` + windowStart(w) + `, 'UTC') + interval '1 hour')`
}

// inPartialHoursSQL: a review's time is in one of the window's partial hours.
func inPartialHoursSQL(w string) string {
	return `(` + inFirstHourSQL(w) + ` OR at >= date_trunc('hour', $1::timestamptz, 'UTC') AND at <= $1)`
}

// wholeHoursSQL narrows a rollup's buckets of the storefront sf of the
// outer query to the window's whole hours.
func wholeHoursSQL(w string) string {
	return `application_id = sf.id AND country = sf.country AND lang = sf.lang
			AND hour > date_trunc('hour', ` + windowStart(w) + `, 'UTC') AND hour < date_trunc('hour', $1::timestamptz, 'UTC')`
}

// appGaugesSQL: $1 now; $2 … $5 the default storefronts of an app
// registered without any (appStorefrontsSQL, storefrontArgs).
var appGaugesSQL = `
WITH fronts AS MATERIALIZED (
	SELECT a.id, a.package_name, sf.country, sf.lang FROM apps_registry_application a ` + appStorefrontsSQL + `
	WHERE a.is_active),
-- The reviews of the windows' partial hours, every storefront's: the 7 d
-- window's first hour, the 1 h window's first hour and the current hour.
edge AS MATERIALIZED (
	SELECT r.application_id, s.country::text AS country, s.lang::text AS lang, r.sentiment, r.topics, r.at
	FROM reviews r JOIN review_storefronts s ON s.review_id = r.id
	WHERE ` + inFirstHourSQL("7 days") + ` OR ` + inPartialHoursSQL("1 hour") + `),
edge_negative AS (
	SELECT application_id, country, lang,
		count(*) FILTER (WHERE ` + inPartialHoursSQL("1 hour") + `) AS n1h,
		count(*) FILTER (WHERE ` + inPartialHoursSQL("7 days") + `) AS n7d
	FROM edge WHERE sentiment = 'NEGATIVE' GROUP BY application_id, country, lang),
edge_topics AS (
	SELECT application_id, country, lang, array_agg(topic) AS topics, array_agg(n) AS counts FROM (
		SELECT application_id, country, lang, topic, count(*) AS n FROM edge CROSS JOIN unnest(topics) AS topic
		WHERE ` + inPartialHoursSQL("7 days") + ` GROUP BY application_id, country, lang, topic) c
	GROUP BY application_id, country, lang)
SELECT sf.package_name, sf.country, sf.lang, l.score, l.ratings, coalesce(l.real_installs, l.min_installs),
	t.pos, t.neu, t.neg, t.none,
	(SELECT coalesce(sum(reviews), 0)::bigint FROM review_rollup_hourly WHERE sentiment = 'NEGATIVE' AND ` + wholeHoursSQL("1 hour") + `) + coalesce(en.n1h, 0),
	(SELECT coalesce(sum(reviews), 0)::bigint FROM review_rollup_hourly WHERE sentiment = 'NEGATIVE' AND ` + wholeHoursSQL("7 days") + `) + coalesce(en.n7d, 0),
	nw.newest, tp.topics, tp.counts
FROM fronts AS sf
LEFT JOIN edge_negative en ON en.application_id = sf.id AND en.country = sf.country AND en.lang = sf.lang
LEFT JOIN edge_topics et ON et.application_id = sf.id AND et.country = sf.country AND et.lang = sf.lang
LEFT JOIN LATERAL (
	SELECT score, ratings, real_installs, min_installs FROM app_stats
	WHERE application_id = sf.id AND country = sf.country AND lang = sf.lang ORDER BY crawled_at DESC LIMIT 1) l ON true
CROSS JOIN LATERAL (
	SELECT coalesce(sum(reviews) FILTER (WHERE sentiment = 'POSITIVE'), 0)::bigint AS pos,
		coalesce(sum(reviews) FILTER (WHERE sentiment = 'NEUTRAL'), 0)::bigint AS neu,
		coalesce(sum(reviews) FILTER (WHERE sentiment = 'NEGATIVE'), 0)::bigint AS neg,
		coalesce(sum(reviews) FILTER (WHERE sentiment = ''), 0)::bigint AS none
	FROM review_rollup_totals WHERE application_id = sf.id AND country = sf.country AND lang = sf.lang) t
-- The newest review is in the newest bucket that counts one: only that
-- hour's reviews are read.
CROSS JOIN LATERAL (
	SELECT max(r.at) AS newest
	FROM reviews r JOIN review_storefronts s ON s.review_id = r.id AND s.country = sf.country AND s.lang = sf.lang
	WHERE r.application_id = sf.id AND r.at >= (
		SELECT max(hour) FROM review_rollup_hourly
		WHERE application_id = sf.id AND country = sf.country AND lang = sf.lang AND reviews > 0)) nw
CROSS JOIN LATERAL (
	SELECT array_agg(topic ORDER BY topic) AS topics, array_agg(n ORDER BY topic) AS counts FROM (
		SELECT topic, sum(n)::bigint AS n FROM (
			SELECT topic, reviews AS n FROM review_topic_rollup_hourly WHERE ` + wholeHoursSQL("7 days") + `
			UNION ALL
			SELECT * FROM unnest(et.topics, et.counts)) w
		GROUP BY topic HAVING sum(n) > 0) c) tp
ORDER BY sf.package_name, sf.country, sf.lang`

func loadAppGauges(ctx context.Context, tx pgx.Tx, now time.Time, locales localeDefaults) ([]appGaugeRow, error) {
	rows, err := tx.Query(ctx, appGaugesSQL, append([]any{now}, storefrontArgs(locales)...)...)
	if err != nil {
		return nil, fmt.Errorf("app gauges: %w", err)
	}
	defer rows.Close()
	var out []appGaugeRow
	for rows.Next() {
		var g appGaugeRow
		var topics []string
		var counts []int64
		if err := rows.Scan(&g.Package, &g.Country, &g.Lang, &g.Score, &g.Ratings, &g.Installs,
			&g.Reviews.Positive, &g.Reviews.Neutral, &g.Reviews.Negative, &g.Reviews.None, &g.Negative1h, &g.Negative7d,
			&g.NewestReviewAt, &topics, &counts); err != nil {
			return nil, fmt.Errorf("app gauges: %w", err)
		}
		if len(topics) != len(counts) {
			return nil, fmt.Errorf("app gauges: %s %s/%s: %d topics, %d counts", g.Package, g.Country, g.Lang, len(topics), len(counts))
		}
		g.Topics7d = make(map[string]int64, len(topics))
		for i, t := range topics {
			g.Topics7d[t] = counts[i]
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("app gauges: %w", err)
	}
	return out, nil
}
