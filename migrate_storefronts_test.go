package main

import (
	"context"
	"slices"
	"testing"
)

// Upgrading a filled database to storefronts keeps every row: app_stats and
// reviews written at schema version 15, for an Iranian and a non-Iranian
// app, are all there after migration 16, unchanged, each app_stats row in
// the storefront the default PLAYSTORE_* settings read it in (ir/fa, us/en)
// and each review with one review_storefronts row of that storefront, first
// seen when the review was; and the widened key lets a second storefront's
// row of the same crawl in.
func TestMigrationStorefrontsKeepsEveryRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTestPoolAtVersion(t, 15,
		`INSERT INTO apps_registry_application (id, package_name, is_iranian_app) VALUES
			(1, 'ir.divar', true), (2, 'org.telegram.messenger', false), (3, 'com.example.empty', false)`,
		`INSERT INTO app_stats (application_id, score, ratings, version, crawled_at, ratings_5, developer)
		 SELECT a, 3 + h / 10.0, 1000 * h, '1.' || h, timestamptz '2026-06-01T00:00:00Z' + make_interval(hours => h), h, 'Dev ' || a
		   FROM generate_series(1, 2) a, generate_series(0, 9) h`,
		`INSERT INTO reviews (application_id, review_id, user_name, score, content, at, first_seen_at, last_synced_at, first_at, search_text, search_version)
		 SELECT a, 'gp:' || a || '-' || i, 'user ' || i, 1 + i % 5, 'text ' || i, timestamptz '2026-05-01T00:00:00Z' + make_interval(mins => i),
		        timestamptz '2026-05-02T00:00:00Z' + make_interval(mins => i), timestamptz '2026-06-01T00:00:00Z',
		        timestamptz '2026-05-01T00:00:00Z' + make_interval(mins => i), 'text ' || i, 1
		   FROM generate_series(1, 2) a, generate_series(1, 7) i`)
	statsRows := `SELECT id, application_id, score, ratings, version, crawled_at, ratings_5, developer FROM app_stats`
	reviewRows := `SELECT id, application_id, review_id, user_name, score, content, at, first_seen_at, last_synced_at, first_at FROM reviews`
	statsBefore, reviewsBefore := storedRows(t, pool, statsRows), storedRows(t, pool, reviewRows)
	if len(statsBefore) != 20 || len(reviewsBefore) != 14 {
		t.Fatalf("filled %d app_stats and %d reviews rows, want 20 and 14", len(statsBefore), len(reviewsBefore))
	}

	state, err := migrateSchema(ctx, pool, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(state.Applied) == 0 || state.Applied[0] != 16 {
		t.Fatalf("applied %v, want 16 first", state.Applied)
	}
	if got := storedRows(t, pool, statsRows); !slices.Equal(got, statsBefore) {
		t.Errorf("app_stats changed:\n%q\nwas\n%q", got, statsBefore)
	}
	if got := storedRows(t, pool, reviewRows); !slices.Equal(got, reviewsBefore) {
		t.Errorf("reviews changed:\n%q\nwas\n%q", got, reviewsBefore)
	}
	if got := storedRows(t, pool, `SELECT application_id, country, lang, count(*) FROM app_stats GROUP BY 1, 2, 3`); !slices.Equal(got, []string{"1 ir fa 10", "2 us en 10"}) {
		t.Errorf("app_stats by storefront %q, want ir/fa for the Iranian app, us/en for the other", got)
	}
	if got := storedRows(t, pool, `SELECT f.application_id, f.country, f.lang, count(*) FROM review_storefronts f GROUP BY 1, 2, 3`); !slices.Equal(got, []string{"1 ir fa 7", "2 us en 7"}) {
		t.Errorf("review_storefronts by storefront %q, want one row per review in its app's storefront", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews r JOIN review_storefronts f ON f.review_id = r.id
		WHERE f.application_id = r.application_id AND f.first_seen_at = r.first_seen_at`); n != 14 {
		t.Errorf("%d reviews have their review_storefronts row with their app and first_seen_at, want 14", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM app_storefronts`); n != 0 {
		t.Errorf("%d app_storefronts rows: an app registered before reads in its default storefront, with none", n)
	}
	// The same crawl of the Iranian app read in the US too.
	if _, err := pool.Exec(ctx, `INSERT INTO app_stats (application_id, country, lang, crawled_at) VALUES (1, 'us', 'en', '2026-06-01T00:00:00Z')`); err != nil {
		t.Errorf("a second storefront's row of the same crawl: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO app_stats (application_id, country, lang, crawled_at) VALUES (1, 'ir', 'fa', '2026-06-01T00:00:00Z')`); err == nil {
		t.Error("a second row of one crawl and storefront was let in")
	}
}
