// Incremental review paging (issue 15), in steady state: N apps (200) whose
// 1000 newest reviews are stored, each getting 0–5 new reviews an hour
// (seeded, the same in both runs), crawled for 24 hourly cycles by the full
// read of every cycle (REVIEWS_FULL_SYNC_INTERVAL=0s) and by the incremental
// one (24h: one full resync a day per app, spread over the cycles). Both
// runs go through the replay Play Store, the embedded broker and the storage
// consumer into their own PostgreSQL database, and must end with the same
// review rows. The goal: at least 3.5× fewer Play Store requests per app
// and hour (about 2.25 instead of 8).
//
//	go test -run '^$' -bench IncrementalCrawl -benchtime 1x .
//
// PLAYWATCH_BENCH_APPS sets N. Metrics: requests per app-hour of each run,
// and their ratio.
package main

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func BenchmarkIncrementalCrawl(b *testing.B) {
	apps := benchEnvInts(b, "PLAYWATCH_BENCH_APPS", "200")[0]
	const hours = 24
	replay := newReplayPlayStore(b)
	for b.Loop() {
		full := runSteadyState(b, replay, apps, hours, 0)
		incremental := runSteadyState(b, replay, apps, hours, 24*time.Hour)
		if full.rows != incremental.rows || full.checksum != incremental.checksum || full.stats != incremental.stats {
			b.Fatalf("the runs stored different rows: full read %d reviews (%s), %d app_stats; incremental %d (%s), %d",
				full.rows, full.checksum, full.stats, incremental.rows, incremental.checksum, incremental.stats)
		}
		perAppHour := func(r steadyStateRun) float64 { return float64(r.requests) / float64(apps*hours) }
		b.ReportMetric(perAppHour(full), "full-requests/app-hour")
		b.ReportMetric(perAppHour(incremental), "incremental-requests/app-hour")
		b.ReportMetric(perAppHour(full)/perAppHour(incremental), "fewer-requests-×")
		b.ReportMetric(float64(incremental.rows), "review-rows")
	}
}

// steadyStateRun is what one run of BenchmarkIncrementalCrawl measured.
type steadyStateRun struct {
	requests    int    // Play Store requests of the measured cycles
	rows, stats int    // reviews and app_stats rows at the end
	checksum    string // of every review row but its sync times
}

// runSteadyState stores every app's newest 1000 reviews with a first cycle,
// then runs hours hourly cycles with fullSync as REVIEWS_FULL_SYNC_INTERVAL,
// each after the store got its new reviews, and each stored before the next.
func runSteadyState(b *testing.B, replay *replayPlayStore, apps, hours int, fullSync time.Duration) steadyStateRun {
	ctx := context.Background()
	pool := newTestPool(b)
	registry := newAppStore(pool)
	for i := range apps {
		replay.setApp(benchPackage(i), replayApp{Reviews: 5000})
		if _, err := registry.Create(ctx, newApp{PackageName: benchPackage(i)}); err != nil {
			b.Fatal(err)
		}
	}
	_, brokers := newTestBroker(b, b.TempDir())
	opts := testConsumerOptions()
	opts.MaxPollRecords = 5000
	consumer := startTestConsumer(b, pool, brokers, opts, consumerHooks{})
	const workers = 8
	store := newTestPlayStore(b, replay.URL, func(p *proxyPoolConfig, _ *playStoreConfig) { p.MaxInFlight = workers })
	clk := newFakeClock(false)
	cfg := testCrawlerConfig(workers, benchReviewsPerApp)
	cfg.Clock, cfg.FullSyncInterval = clk, fullSync
	cr := newCrawler(cfg, registry, store.client, newPGKnownReviews(pool), newTestPublisher(b, brokers, testProducerSettings),
		prometheus.NewRegistry(), testLogger(b))

	// Crawl times after the replay's reviews, in the consumer's past.
	start := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	cycle := func(at time.Time) {
		clk.mu.Lock()
		clk.now = at
		clk.mu.Unlock()
		sum, err := cr.RunCycle(ctx)
		if err != nil || sum.StatsOK != apps || sum.ReviewsOK != apps {
			b.Fatalf("cycle at %s: %s, %v", at, sum, err)
		}
		waitDrained(b, pool, consumer.cl, opts.Group)
	}
	cycle(start.Add(-time.Hour))
	before := replay.totalRequests()
	rng := rand.New(rand.NewPCG(15, 15))
	for h := range hours {
		for i := range apps {
			replay.addReviews(benchPackage(i), rng.IntN(6))
		}
		cycle(start.Add(time.Duration(h) * time.Hour))
	}
	run := steadyStateRun{requests: replay.totalRequests() - before, stats: count(b, pool, `SELECT count(*) FROM app_stats`)}
	if err := pool.QueryRow(ctx, `
SELECT count(*), md5(string_agg(concat_ws('|', review_id, at, md5(content), thumbs_up_count, score, reply_content, replied_at, app_version), ',' ORDER BY review_id))
FROM reviews`).Scan(&run.rows, &run.checksum); err != nil {
		b.Fatal(err)
	}
	if err := consumer.stop(); err != nil {
		b.Fatal(err)
	}
	return run
}
