package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// rollupsMustMatch fails the test with each difference checkRollups finds.
func rollupsMustMatch(t *testing.T, ctx context.Context, pool *pgxpool.Pool, when string) {
	t.Helper()
	diffs, err := checkRollups(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("%s: %s %s: rollup %q, raw tables %q", when, d.Table, d.Key, d.Got, d.Want)
	}
}

// Raw writes of every kind the writers make keep the rollups equal to the
// raw tables' counts: a new review, a review seen in a second storefront,
// an upsert that changes nothing, an edit that moves `at` and the stars, a
// label and topics, a listing (twice, the second skipped).
func TestRollupsFollowRawWrites(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	mustExec(t, pool, `INSERT INTO apps_registry_application (id, package_name) VALUES (1, 'com.example.a'), (2, 'com.example.b')`)
	upsert := `INSERT INTO reviews AS t (application_id, review_id, score, content, at, last_synced_at, app_version)
		VALUES ($1, $2, $3, 'text', $4, $5, $6)
		ON CONFLICT (review_id) DO UPDATE SET score = EXCLUDED.score, at = EXCLUDED.at, last_synced_at = EXCLUDED.last_synced_at,
			app_version = EXCLUDED.app_version WHERE EXCLUDED.last_synced_at > t.last_synced_at`
	mustExec(t, pool, upsert, 1, "r1", 5, "2026-03-01T10:15:00Z", "2026-03-01T11:00:00Z", "1.0")
	mustExec(t, pool, upsert, 1, "r2", 1, "2026-03-01T10:45:00Z", "2026-03-01T11:00:00Z", nil)
	mustExec(t, pool, upsert, 2, "r3", nil, "2026-03-01T12:00:00Z", "2026-03-01T13:00:00Z", "2.0")
	mustExec(t, pool, `INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		SELECT id, application_id, 'us', 'en', now() FROM reviews`)
	mustExec(t, pool, `INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		SELECT id, application_id, 'gb', 'en', now() FROM reviews WHERE review_id = 'r1'
		ON CONFLICT DO NOTHING`)
	mustExec(t, pool, `INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		SELECT id, application_id, 'gb', 'en', now() FROM reviews WHERE review_id = 'r1'
		ON CONFLICT DO NOTHING`) // a redelivery: nothing inserted, nothing counted
	rollupsMustMatch(t, ctx, pool, "stored")

	var n int64
	if err := pool.QueryRow(ctx, `SELECT sum(reviews) FROM review_rollup_hourly WHERE application_id = 1 AND country = 'gb'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("app 1 in gb: %d reviews (%v), want 1", n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT reviews FROM review_rollup_hourly WHERE application_id = 1 AND country = '' AND lang = ''
		AND hour = '2026-03-01T10:00:00Z' AND app_version = '' AND score = 1 AND sentiment = ''`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("app 1's 1-star review without version at 10:00: %d (%v), want 1", n, err)
	}

	mustExec(t, pool, upsert, 1, "r1", 5, "2026-03-01T10:15:00Z", "2026-03-01T11:00:00Z", "1.0") // a redelivery
	mustExec(t, pool, upsert, 1, "r1", 2, "2026-03-02T08:00:00Z", "2026-03-02T09:00:00Z", "1.1") // an edit: a new hour, stars, version
	mustExec(t, pool, `UPDATE reviews SET sentiment = 'NEGATIVE', topics = '{crash,ads}' WHERE review_id IN ('r1', 'r2')`)
	mustExec(t, pool, `UPDATE reviews SET sentiment = 'POSITIVE', topics = '{}' WHERE review_id = 'r2'`)
	mustExec(t, pool, `UPDATE reviews SET thumbs_up_count = 3`) // nothing a rollup counts
	stats := `INSERT INTO app_stats (application_id, country, lang, crawled_at, score, ratings, real_installs)
		VALUES ($1, 'us', 'en', $2, $3, 10, 100) ON CONFLICT (application_id, country, lang, crawled_at) DO NOTHING`
	mustExec(t, pool, stats, 1, "2026-03-01T10:00:00Z", 4.5)
	mustExec(t, pool, stats, 1, "2026-03-01T12:00:00Z", 4.0)
	mustExec(t, pool, stats, 1, "2026-03-01T12:00:00Z", 4.0)
	mustExec(t, pool, stats, 1, "2026-03-01T09:00:00Z", nil)
	rollupsMustMatch(t, ctx, pool, "updated")

	if err := pool.QueryRow(ctx, `SELECT reviews FROM review_topic_rollup_hourly WHERE application_id = 1 AND country = 'gb'
		AND hour = '2026-03-02T08:00:00Z' AND topic = 'crash' AND sentiment = 'NEGATIVE' AND app_version = '1.1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("r1's crash topic in gb: %d (%v), want 1", n, err)
	}
	var listings, scored int64
	var last float64
	if err := pool.QueryRow(ctx, `SELECT listings, score_n, last_score FROM app_stats_rollup_daily WHERE application_id = 1
		AND day = '2026-03-01T00:00:00Z'`).Scan(&listings, &scored, &last); err != nil || listings != 3 || scored != 2 || last != 4.0 {
		t.Fatalf("app 1's listings of 1 March: %d, %d scored, last %v (%v); want 3, 2, 4", listings, scored, last, err)
	}

	// A damaged rollup shows in the check and is repaired by the rebuild.
	mustExec(t, pool, `UPDATE review_rollup_totals SET reviews = reviews + 7 WHERE application_id = 2`)
	mustExec(t, pool, `DELETE FROM app_stats_rollup_daily`)
	diffs, err := checkRollups(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string]bool{}
	for _, d := range diffs {
		tables[d.Table] = true
	}
	if !tables["review_rollup_totals"] || !tables["app_stats_rollup_daily"] || len(tables) != 2 {
		t.Fatalf("check found differences in %v, want review_rollup_totals and app_stats_rollup_daily", tables)
	}
	var progress []string
	done, err := rebuildRollups(ctx, pool, "", func(done, total int, pkg string) { progress = append(progress, pkg) })
	if err != nil || done != 2 || len(progress) != 2 {
		t.Fatalf("rebuild: %d apps, progress %v, %v", done, progress, err)
	}
	rollupsMustMatch(t, ctx, pool, "rebuilt")
	if _, err := rebuildRollups(ctx, pool, "com.example.none", nil); err == nil {
		t.Fatal("rebuild of an unknown package succeeded")
	}
}

// rollup rebuild writes an app's hourly buckets in key order (migration
// 18), so that a storefront's recent hours are adjacent on disk: read in
// the heap's order, the buckets of a storefront come hour after hour.
func TestRollupRebuildWritesInKeyOrder(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedBenchApps(t, pool)
	seedBenchHistory(t, pool, 0, 200)
	var disorder, buckets int64
	if err := pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE hour < lag), count(*) FROM (
			SELECT hour, lag(hour) OVER (PARTITION BY country, lang ORDER BY ctid) FROM review_rollup_hourly
			WHERE application_id = (SELECT min(id) FROM apps_registry_application)) b`).Scan(&disorder, &buckets); err != nil {
		t.Fatal(err)
	}
	if buckets < 200 || disorder != 0 {
		t.Errorf("%d of %d hourly buckets lie on disk before an earlier hour of their storefront, want 0", disorder, buckets)
	}
}
