package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The rollups of migration 17 (docs/schema.md §Rollups): statement triggers
// keep them in every writer's transaction; this file rebuilds them from the
// raw tables and checks them against those.

// rollupRetries is how often one app's rebuild is tried again after a
// transient error (a deadlock with a writer, a lost connection).
const rollupRetries = 3

// rebuildRollups recomputes the rollups of every app (or of the app named
// pkg, when not empty) from reviews, review_storefronts and app_stats, each
// app in its own transaction: rollups_rebuild_app locks that app's rollups
// alone (its writers wait for it, the others go on). progress is told after
// each app. It returns how many apps it rebuilt.
func rebuildRollups(ctx context.Context, pool *pgxpool.Pool, pkg string, progress func(done, total int, pkg string)) (int, error) {
	type appRef struct {
		id  int64
		pkg string
	}
	rows, err := pool.Query(ctx, `SELECT id, package_name FROM apps_registry_application WHERE $1 = '' OR package_name = $1 ORDER BY id`, pkg)
	if err != nil {
		return 0, fmt.Errorf("rollup rebuild: list apps: %w", err)
	}
	var apps []appRef
	var a appRef
	if _, err := pgx.ForEachRow(rows, []any{&a.id, &a.pkg}, func() error {
		apps = append(apps, a)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("rollup rebuild: list apps: %w", err)
	}
	if pkg != "" && len(apps) == 0 {
		return 0, fmt.Errorf("rollup rebuild: no app %q in the registry", pkg)
	}
	for i, a := range apps {
		var err error
		for try := 0; ; try++ {
			_, err = pool.Exec(ctx, `SELECT rollups_rebuild_app($1)`, a.id)
			if err == nil || try == rollupRetries || classifyDBError(err) != dbTransient || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
		}
		if err != nil {
			return i, fmt.Errorf("rollup rebuild: app %s: %w", a.pkg, err)
		}
		if progress != nil {
			progress(i+1, len(apps), a.pkg)
		}
	}
	return len(apps), nil
}

// rollupDiff is one rollup row that differs from the raw tables' count.
type rollupDiff struct {
	Table, Key string
	Got, Want  string // the rollup's values and the raw tables' ("" for no row)
}

// rollupCheckLimit bounds the differences reported per table.
const rollupCheckLimit = 100

// rollupCheckSQL compares each rollup table with the same aggregate of the
// raw tables, written here again (not rollups_rebuild_app's), so that a
// mistake in either shows; a row counting 0 is no row.
var rollupCheckSQL = []struct{ table, sql string }{
	{"review_rollup_hourly", reviewRollupCheckSQL("review_rollup_hourly", []string{"at", "app_version", "score", "sentiment"}, "x",
		"date_trunc('hour', at, 'UTC') AS hour", "coalesce(app_version, '') AS app_version", "coalesce(score, 0) AS score", "coalesce(sentiment, '') AS sentiment")},
	{"review_topic_rollup_hourly", reviewRollupCheckSQL("review_topic_rollup_hourly", []string{"at", "app_version", "sentiment", "topics"}, "x CROSS JOIN unnest(x.topics) AS topic",
		"date_trunc('hour', at, 'UTC') AS hour", "coalesce(app_version, '') AS app_version", "topic", "coalesce(sentiment, '') AS sentiment")},
	{"review_rollup_totals", reviewRollupCheckSQL("review_rollup_totals", []string{"score", "sentiment"}, "x",
		"coalesce(score, 0) AS score", "coalesce(sentiment, '') AS sentiment")},
	// The sums of scores may differ in their last bits (the order of the
	// additions); the newest listing is the one of the latest crawled_at.
	{"app_stats_rollup_daily", `
WITH w AS (
	SELECT DISTINCT ON (application_id, country, lang, date_trunc('day', crawled_at, 'UTC'))
		application_id, country, lang, date_trunc('day', crawled_at, 'UTC') AS day,
		count(*) OVER d AS listings, coalesce(sum(score) OVER d, 0) AS score_sum, count(score) OVER d AS score_n,
		crawled_at AS last_crawled_at, score AS last_score, ratings AS last_ratings,
		real_installs AS last_real_installs, min_installs AS last_min_installs
	FROM app_stats
	WINDOW d AS (PARTITION BY application_id, country, lang, date_trunc('day', crawled_at, 'UTC'))
	ORDER BY application_id, country, lang, date_trunc('day', crawled_at, 'UTC'), crawled_at DESC)
SELECT row(coalesce(g.application_id, w.application_id), coalesce(g.country, w.country), coalesce(g.lang, w.lang),
		coalesce(g.day, w.day))::text,
	coalesce(row(g.listings, round(g.score_sum::numeric, 6), g.score_n, g.last_crawled_at, g.last_score, g.last_ratings,
		g.last_real_installs, g.last_min_installs)::text, ''),
	coalesce(row(w.listings, round(w.score_sum::numeric, 6), w.score_n, w.last_crawled_at, w.last_score, w.last_ratings,
		w.last_real_installs, w.last_min_installs)::text, '')
FROM app_stats_rollup_daily g FULL JOIN w USING (application_id, country, lang, day)
WHERE g.application_id IS NULL OR w.application_id IS NULL
	OR (g.listings, g.score_n, g.last_crawled_at, g.last_score, g.last_ratings, g.last_real_installs, g.last_min_installs)
		IS DISTINCT FROM (w.listings, w.score_n, w.last_crawled_at, w.last_score, w.last_ratings, w.last_real_installs, w.last_min_installs)
	OR abs(g.score_sum - w.score_sum) > 1e-6 * greatest(1, abs(w.score_sum))
ORDER BY 1 LIMIT $1`},
}

// reviewRollupCheckSQL is the check of a review rollup table: x holds each
// review twice, once for all storefronts (” country and lang) and once per
// storefront it was seen in, with the columns cols; w counts the rows of from
// (x, or x joined to more) by app, storefront and keys, each key an
// expression named by its last word (its AS name, or the column itself); the
// rollup's rows with the same names are compared with w's.
func reviewRollupCheckSQL(table string, cols []string, from string, keys ...string) string {
	names := []string{"application_id", "country", "lang"}
	for _, k := range keys {
		names = append(names, k[strings.LastIndex(k, " ")+1:])
	}
	var rCols, groupBy, either []string
	for _, c := range cols {
		rCols = append(rCols, "r."+c)
	}
	for i, n := range names {
		groupBy = append(groupBy, strconv.Itoa(i+1))
		either = append(either, "coalesce(g."+n+", w."+n+")")
	}
	return `
WITH x AS (
	SELECT application_id, ''::varchar AS country, ''::varchar AS lang, ` + strings.Join(cols, ", ") + ` FROM reviews
	UNION ALL
	SELECT r.application_id, f.country, f.lang, ` + strings.Join(rCols, ", ") + `
	FROM review_storefronts f JOIN reviews r ON r.id = f.review_id),
w AS (
	SELECT application_id, country, lang, ` + strings.Join(keys, ", ") + `, count(*) AS n
	FROM ` + from + ` GROUP BY ` + strings.Join(groupBy, ", ") + `),
g AS (SELECT * FROM ` + table + ` WHERE reviews <> 0)
SELECT row(` + strings.Join(either, ", ") + `)::text,
	coalesce(g.reviews::text, ''), coalesce(w.n::text, '')
FROM g FULL JOIN w USING (` + strings.Join(names, ", ") + `)
WHERE g.reviews IS DISTINCT FROM w.n ORDER BY 1 LIMIT $1`
}

// checkRollups compares every rollup table with the raw tables, in one
// snapshot, and returns the differences (at most rollupCheckLimit per
// table). It reads every stored review: a check, not a page.
func checkRollups(ctx context.Context, pool *pgxpool.Pool) ([]rollupDiff, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("rollup check: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only: nothing to keep
	var out []rollupDiff
	for _, c := range rollupCheckSQL {
		rows, err := tx.Query(ctx, c.sql, rollupCheckLimit)
		if err != nil {
			return nil, fmt.Errorf("rollup check: %s: %w", c.table, err)
		}
		d := rollupDiff{Table: c.table}
		if _, err := pgx.ForEachRow(rows, []any{&d.Key, &d.Got, &d.Want}, func() error {
			out = append(out, d)
			return nil
		}); err != nil {
			return nil, fmt.Errorf("rollup check: %s: %w", c.table, err)
		}
	}
	return out, nil
}

// errRollupDiffers is `rollup check`'s error when a rollup differs.
var errRollupDiffers = errors.New("the rollups differ from the raw tables: run playwatch rollup rebuild")
