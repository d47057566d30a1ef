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
// and its two partial hours at either end from the raw reviews seen in the
// storefront (reviews (application_id, at), then review_storefronts' key),
// so "the last hour" is the last 60 minutes, as before the rollups, and the
// cost is that of two hours of reviews however long the history.

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

// gaugeWindowSQL sums, for the storefront sf of the outer query, the rows
// of a review rollup in the window (now - window, now] ($1 now): whole
// hours from rollup's buckets (bucketWhere narrows them, bucketValue is
// what a bucket adds), the partial first and last hours from the raw
// reviews (rawWhere narrows them, rawValue is what a review adds). from is
// the rest of the raw reviews' FROM after "reviews r JOIN review_storefronts
// s" (a CROSS JOIN unnest for the topics).
func gaugeWindowSQL(rollup, window, bucketValue, bucketWhere, rawFrom, rawValue, rawWhere string) string {
	start := `$1::timestamptz - interval '` + window + `'`
	raw := func(cond string) string {
		return `SELECT ` + rawValue + ` FROM reviews r JOIN review_storefronts s ON s.review_id = r.id AND s.country = sf.country AND s.lang = sf.lang` + rawFrom + `
		WHERE r.application_id = sf.id AND ` + rawWhere + ` AND ` + cond
	}
	return `SELECT ` + bucketValue + ` FROM ` + rollup + `
		WHERE application_id = sf.id AND country = sf.country AND lang = sf.lang AND ` + bucketWhere + `
			AND hour > date_trunc('hour', ` + start + `, 'UTC') AND hour < date_trunc('hour', $1::timestamptz, 'UTC')
		UNION ALL
		` + raw(`r.at > `+start+` AND r.at < date_trunc('hour', `+start+`, 'UTC') + interval '1 hour'`) + `
		UNION ALL
		` + raw(`r.at >= date_trunc('hour', $1::timestamptz, 'UTC') AND r.at <= $1`)
}

// negativeInSQL counts the storefront's NEGATIVE reviews of the window.
func negativeInSQL(window string) string {
	return `SELECT coalesce(sum(n), 0)::bigint FROM (` +
		gaugeWindowSQL("review_rollup_hourly", window, "reviews AS n", "sentiment = 'NEGATIVE'", "", "1", "r.sentiment = 'NEGATIVE'") + `) w`
}

// appGaugesSQL: $1 now; $2 … $5 the default storefronts of an app
// registered without any (appStorefrontsSQL, storefrontArgs).
var appGaugesSQL = `
WITH fronts AS MATERIALIZED (
	SELECT a.id, a.package_name, sf.country, sf.lang FROM apps_registry_application a ` + appStorefrontsSQL + `
	WHERE a.is_active)
SELECT sf.package_name, sf.country, sf.lang, l.score, l.ratings, coalesce(l.real_installs, l.min_installs),
	t.pos, t.neu, t.neg, t.none, (` + negativeInSQL("1 hour") + `), (` + negativeInSQL("7 days") + `), nw.newest, tp.topics, tp.counts
FROM fronts AS sf
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
		SELECT topic, sum(n)::bigint AS n FROM (` +
	gaugeWindowSQL("review_topic_rollup_hourly", "7 days", "topic, reviews AS n", "true", " CROSS JOIN unnest(r.topics) AS topic", "topic, 1", "true") + `) w
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
