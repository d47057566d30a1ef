package main

import (
	"context"
	"slices"
	"testing"
)

// Migration 17 on a filled database counts what was stored before it:
// reviews (labelled, with topics, in two storefronts) and listings written
// at schema version 16 are in the rollups after it.
func TestMigrationRollupsCountTheStoredRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTestPoolAtVersion(t, 16,
		`INSERT INTO apps_registry_application (id, package_name) VALUES (1, 'org.telegram.messenger'), (2, 'com.example.empty')`,
		`INSERT INTO app_stats (application_id, country, lang, score, crawled_at)
		 SELECT 1, 'us', 'en', 4 + h / 10.0, timestamptz '2026-06-01T00:00:00Z' + make_interval(hours => h) FROM generate_series(0, 29) h`,
		`INSERT INTO reviews (application_id, review_id, score, content, at, last_synced_at, sentiment, topics)
		 SELECT 1, 'gp:' || i, 1 + i % 5, 'text', timestamptz '2026-05-01T00:00:00Z' + make_interval(mins => 13 * i), now(),
		        (ARRAY['POSITIVE', 'NEGATIVE', NULL])[1 + i % 3], CASE WHEN i % 2 = 0 THEN ARRAY['crash'] END
		   FROM generate_series(1, 40) i`,
		`INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		 SELECT id, 1, 'us', 'en', now() FROM reviews UNION ALL SELECT id, 1, 'gb', 'en', now() FROM reviews WHERE score = 5`)
	state, err := migrateSchema(ctx, pool, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(state.Applied, 17) {
		t.Fatalf("applied %v, want 17", state.Applied)
	}
	rollupsMustMatch(t, ctx, pool, "migrated")
	got := storedRows(t, pool, `SELECT country, sum(reviews)::bigint FROM review_rollup_totals GROUP BY 1 ORDER BY 1`)
	if !slices.Equal(got, []string{" 40", "gb 8", "us 40"}) {
		t.Errorf("totals by storefront %q, want 40 app-wide, 40 in us, 8 in gb", got)
	}
	if n := count(t, pool, `SELECT sum(reviews) FROM review_topic_rollup_hourly WHERE country = '' AND topic = 'crash'`); n != 20 {
		t.Errorf("%d app-wide crash reviews, want 20", n)
	}
	if n := count(t, pool, `SELECT sum(listings) FROM app_stats_rollup_daily`); n != 30 {
		t.Errorf("%d listings in the daily rollup, want 30", n)
	}
}
