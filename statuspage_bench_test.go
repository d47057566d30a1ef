package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Status page benchmark sizes: 500 apps, each with a review every
// statusBenchReviewStep (about 0.9 an hour) and a listing every 6 hours per
// storefront; the first statusBenchTwoFronts apps are watched in ir/fa and us/en,
// the others in us/en. 1M reviews are 90 days of that, 10M the same apps
// with 900 days: the same recent days under 10 times the history.
const (
	statusBenchApps       = 500
	statusBenchTwoFronts  = 100
	statusBenchReviewStep = 90 * 24 * time.Hour / 2000
)

// historyBench is one database of the benchmark: its page and a server
// for it, reading on the connections `run` gives the page (openReadPool).
type historyBench struct {
	name string
	page *statusPage
	url  string
}

// BenchmarkStatusPageHistory reads the overview, one app's page and the
// per-app gauges (their background read) of two databases, 1M and 10M
// stored reviews, alternating between them read by read so that both
// figures meet the same load of a noisy machine: ms/read for each and x1M,
// the 10M figure over the 1M one (flat: about 1). Run it with
//
//	go test -run '^$' -bench StatusPageHistory -benchtime 5x -timeout 90m .
//
// (with -short, 1M alone: about a tenth of the load time).
//
// The rows are written with generate_series straight into the tables
// (triggers off, secondary indexes rebuilt after the load, search_text
// left NULL), then `rollup rebuild` fills the rollups, as after an upgrade.
func BenchmarkStatusPageHistory(b *testing.B) {
	sizes := []struct {
		name    string
		reviews int // per app
	}{{"1M", 2000}, {"10M", 20000}}
	if testing.Short() {
		sizes = sizes[:1]
	}
	var dbs []historyBench
	for _, size := range sizes {
		start := time.Now()
		url := newTestDatabase(b)
		pool := newTestPoolFor(b, url)
		seedBenchApps(b, pool)
		seedBenchHistory(b, pool, 0, size.reviews)
		var stored int64
		if err := pool.QueryRow(b.Context(), `SELECT count(*) FROM reviews`).Scan(&stored); err != nil {
			b.Fatal(err)
		}
		b.Logf("%s: %d reviews stored and rolled up in %s", size.name, stored, time.Since(start).Round(time.Second))
		readPool, err := openReadPool(b.Context(), url, time.Minute, 4)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(readPool.Close)
		srv, page := statusPageOn(b, statusDB{readPool}, newMetricsRegistry("bench"), "", 4)
		dbs = append(dbs, historyBench{name: size.name, page: page, url: srv.URL})
	}
	get := func(b *testing.B, h historyBench, path string) {
		resp, err := http.Get(h.url + path)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s %s: %d", h.name, path, resp.StatusCode)
		}
	}
	reads := []struct {
		name string
		read func(*testing.B, historyBench)
	}{
		{"overview", func(b *testing.B, h historyBench) { get(b, h, "/") }},
		{"app", func(b *testing.B, h historyBench) { get(b, h, "/apps/com.example.bench7") }},
		{"gauges", func(b *testing.B, h historyBench) {
			h.page.appGauges.refresh(b.Context())
			if !h.page.appGauges.ok {
				b.Fatalf("%s: the per-app gauges could not be read", h.name)
			}
		}},
	}
	var summary strings.Builder
	for _, r := range reads {
		b.Run(r.name, func(b *testing.B) {
			spent := make([]time.Duration, len(dbs))
			for _, h := range dbs {
				r.read(b, h) // warm: the first read after the load pays for the cache
			}
			for b.Loop() {
				for i, h := range dbs {
					began := time.Now()
					r.read(b, h)
					spent[i] += time.Since(began)
				}
			}
			ms := make([]float64, len(dbs))
			for i, h := range dbs {
				ms[i] = float64(spent[i].Microseconds()) / 1000 / float64(b.N)
				b.ReportMetric(ms[i], "ms/read-"+h.name)
			}
			line := fmt.Sprintf("%s: %.1f ms at %s", r.name, ms[0], dbs[0].name)
			if len(dbs) > 1 {
				b.ReportMetric(ms[1]/ms[0], "x1M")
				line += fmt.Sprintf(", %.1f ms at %s (x%.2f)", ms[1], dbs[1].name, ms[1]/ms[0])
			}
			summary.WriteString(line + "\n")
		})
	}
	b.Logf("status page reads at %d apps:\n%s", statusBenchApps, summary.String())
}

// seedBenchApps registers the benchmark's apps and storefronts.
func seedBenchApps(b testing.TB, pool *pgxpool.Pool) {
	b.Helper()
	for _, sql := range []string{
		`INSERT INTO apps_registry_application (package_name, display_name)
			SELECT 'com.example.bench' || i, 'Bench app ' || i FROM generate_series(1, ` + fmt.Sprint(statusBenchApps) + `) i`,
		`INSERT INTO app_storefronts (application_id, position, country, lang)
			SELECT a.id, v.p, v.c, v.l FROM apps_registry_application a, (VALUES (0, 'ir', 'fa'), (1, 'us', 'en')) v(p, c, l)
			WHERE a.id <= (SELECT min(id) FROM apps_registry_application) + ` + fmt.Sprint(statusBenchTwoFronts-1),
	} {
		if _, err := pool.Exec(b.Context(), sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
}

// seedBenchHistory adds each app's reviews from,...,to-1 (counted back from
// statusNow, one every statusBenchReviewStep), their storefronts (in a
// two-storefront app review number g is seen in ir/fa when g % 10 <= 5, in
// us/en when it is >= 5: every tenth in both), and the listings of the same span, then rebuilds the rollups.
func seedBenchHistory(b testing.TB, pool *pgxpool.Pool, from, to int) {
	b.Helper()
	ctx := b.Context()
	step := statusBenchReviewStep.Seconds()
	fronts := `(SELECT a.id, coalesce(s.country, 'us') AS country, coalesce(s.lang, 'en') AS lang, s.position
		FROM apps_registry_application a LEFT JOIN app_storefronts s ON s.application_id = a.id)`
	bulkLoad(b, pool, []string{
		fmt.Sprintf(`INSERT INTO reviews (application_id, review_id, user_name, score, content, at, first_at, sentiment, topics,
			app_version, first_seen_at, last_synced_at)
			SELECT a.id, 'bench-' || a.id || '-' || g, 'user ' || g, 1 + g %% 5, 'review text ' || g,
				$1::timestamptz - make_interval(secs => g * %[1]f), $1::timestamptz - make_interval(secs => g * %[1]f),
				(ARRAY['POSITIVE', 'NEUTRAL', 'NEGATIVE', NULL])[1 + g %% 4],
				CASE WHEN g %% 4 = 3 THEN NULL ELSE (ARRAY['{crash}', '{}', '{ads,login}'])[1 + g %% 3]::text[] END,
				'1.' || (100 - g / 200), $1::timestamptz - make_interval(secs => g * %[1]f) + interval '1 hour',
				$1::timestamptz - make_interval(secs => g * %[1]f) + interval '1 hour'
			FROM apps_registry_application a, generate_series(%[2]d, %[3]d) g`, step, from, to-1),
		fmt.Sprintf(`INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
			SELECT r.id, r.application_id, f.country, f.lang, r.first_seen_at
			FROM reviews r JOIN %s f ON f.id = r.application_id
			WHERE r.at <= $1::timestamptz - make_interval(secs => %[2]d * %[3]f) AND r.at > $1::timestamptz - make_interval(secs => %[4]d * %[3]f)
				AND (f.position IS NULL OR (round(extract(epoch FROM $1::timestamptz - r.at) / %[3]f)::int %% 10 - 5) * (2 * f.position - 1) >= 0)`, fronts, from, step, to),
		fmt.Sprintf(`INSERT INTO app_stats (application_id, country, lang, min_installs, real_installs, score, ratings, crawled_at,
			ratings_1, ratings_2, ratings_3, ratings_4, ratings_5, version)
			SELECT f.id, f.country, f.lang, 1000000, 1000000 + h * 17, 3.5 + (h %% 100) / 100.0, 50000 + h,
				$1::timestamptz - make_interval(hours => 6 * h) - make_interval(mins => coalesce(f.position, 0)),
				1000, 2000, 3000, 4000, 5000, '1.' || (100 - h / 36)
			FROM %s f, generate_series(%d, %d) h`, fronts, from*int(step)/21600, to*int(step)/21600-1),
	})
	if _, err := rebuildRollups(ctx, pool, "", nil); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		b.Fatal(err)
	}
}

// bulkLoad runs the inserts as a restore would: the rollup triggers off
// (the rollups are rebuilt after), the secondary indexes of the loaded tables dropped
// first and built again after, which is much faster than keeping a dozen
// indexes of reviews up to date row by row. The tables end as the schema
// has them.
func bulkLoad(b testing.TB, pool *pgxpool.Pool, inserts []string) {
	b.Helper()
	ctx := b.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	var names, defs []string
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(i.indexrelid::regclass::text), '{}'), coalesce(array_agg(pg_get_indexdef(i.indexrelid)), '{}')
		FROM pg_index i WHERE i.indrelid IN ('reviews'::regclass, 'review_storefronts'::regclass, 'app_stats'::regclass)
			AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid)`).Scan(&names, &defs); err != nil {
		b.Fatal(err)
	}
	run := func(sql string, args ...any) {
		b.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	for _, n := range names {
		run(`DROP INDEX ` + n)
	}
	tables := []string{"reviews", "review_storefronts", "app_stats"}
	for _, t := range tables {
		run(`ALTER TABLE ` + t + ` DISABLE TRIGGER USER`)
	}
	run(`SET maintenance_work_mem = '512MB'`)
	for _, sql := range inserts {
		run(sql, statusNow)
	}
	for _, t := range tables {
		run(`ALTER TABLE ` + t + ` ENABLE TRIGGER USER`)
	}
	for _, d := range defs {
		run(d)
	}
}

// The benchmark's rows are what it says, on a small history: every
// review stored once and seen in its storefronts, the rollups rebuilt
// equal to the raw tables, and the gauges of a two-storefront app in both.
func TestBenchSeedShape(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	seedBenchApps(t, pool)
	seedBenchHistory(t, pool, 0, 10)
	seedBenchHistory(t, pool, 10, 20)
	var reviews, seen, listings int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM reviews), (SELECT count(DISTINCT review_id) FROM review_storefronts),
		(SELECT count(*) FROM app_stats)`).Scan(&reviews, &seen, &listings); err != nil {
		t.Fatal(err)
	}
	if reviews != statusBenchApps*20 || seen != reviews || listings != 3*(statusBenchApps+statusBenchTwoFronts) {
		t.Errorf("%d reviews, %d seen in a storefront, %d listings; want %d, all, %d", reviews, seen, listings, statusBenchApps*20, 3*(statusBenchApps+statusBenchTwoFronts))
	}
	if diffs, err := checkRollups(ctx, pool); err != nil || len(diffs) > 0 {
		t.Errorf("rollups after the load: %v, differences %v", err, diffs)
	}
	base, page := gaugeServer(t, pool)
	page.appGauges.refresh(ctx)
	m := scrapeMetrics(t, base)
	for _, k := range []string{
		gaugeKey("playwatch_app_reviews", "com.example.bench1", "ir", "fa", "sentiment", "NEGATIVE"),
		gaugeKey("playwatch_app_reviews", "com.example.bench1", "us", "en", "sentiment", "NEGATIVE"),
		gaugeKey("playwatch_app_reviews", "com.example.bench200", "us", "en", "sentiment", "NEGATIVE"),
	} {
		if m[k] == 0 {
			t.Errorf("%s = %v, want reviews", k, m[k])
		}
	}
	if _, ok := m[gaugeKey("playwatch_app_score", "com.example.bench200", "ir", "fa")]; ok {
		t.Error("a one-storefront app has an ir/fa series")
	}
}
