// Incremental review paging (issue 15), in steady state: N apps (200) whose
// 1000 newest reviews are stored, each getting 0–5 new reviews an hour, and
// now and then an edit of an old review (new text, moved to the head with a
// new time, as the store does) and a developer reply to an old review (in
// its place), all seeded, the same in both runs. They are crawled for 24
// hourly cycles by the full read of every cycle (REVIEWS_FULL_SYNC_INTERVAL=0s)
// and by the incremental one (24h: one full resync a day per app, spread over
// the cycles). Both runs go through the replay Play Store, the embedded
// broker and the storage consumer into their own PostgreSQL database. The
// goal: at least 3.5× fewer Play Store requests per app and hour (about 2.25
// instead of 8).
//
// The full run must store every edit and reply in the cycle after it; the
// two runs must end with the same rows but for the edited and replied
// reviews. What the incremental run misses of those is reported, not
// required: an edit moves its review to the head, where the next cycle
// reads it; a reply to an old review is below the page where the paging
// stops, so it waits for the app's next full resync (README "Freshness").
//
//	go test -run '^$' -bench IncrementalCrawl -benchtime 1x .
//
// PLAYWATCH_BENCH_APPS sets N. Metrics: requests per app-hour of each run,
// and their ratio; of the incremental run, the edits and replies still not
// stored at the end, and the mean cycles an edit or reply waited before it
// was stored.
package main

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func BenchmarkIncrementalCrawl(b *testing.B) {
	apps := benchEnvInts(b, "PLAYWATCH_BENCH_APPS", "200")[0]
	const hours = 24
	for b.Loop() {
		full := runSteadyState(b, newReplayPlayStore(b), apps, hours, 0)
		incremental := runSteadyState(b, newReplayPlayStore(b), apps, hours, 24*time.Hour)
		if full.rows != incremental.rows || full.checksum != incremental.checksum || full.stats != incremental.stats {
			b.Fatalf("the runs stored different rows, edited and replied reviews aside: full read %d reviews (%s), %d app_stats; incremental %d (%s), %d",
				full.rows, full.checksum, full.stats, incremental.rows, incremental.checksum, incremental.stats)
		}
		if full.edits.missed != 0 || full.replies.missed != 0 || full.edits.waited != 0 || full.replies.waited != 0 {
			b.Fatalf("the full read of every cycle missed edits or replies: %+v, %+v", full.edits, full.replies)
		}
		if full.edits.made != incremental.edits.made || full.replies.made != incremental.replies.made || incremental.replies.made == 0 {
			b.Fatalf("the runs made different changes: %+v %+v, %+v %+v", full.edits, full.replies, incremental.edits, incremental.replies)
		}
		perAppHour := func(r steadyStateRun) float64 { return float64(r.requests) / float64(apps*hours) }
		b.ReportMetric(perAppHour(full), "full-requests/app-hour")
		b.ReportMetric(perAppHour(incremental), "incremental-requests/app-hour")
		b.ReportMetric(perAppHour(full)/perAppHour(incremental), "fewer-requests-×")
		b.ReportMetric(float64(incremental.rows), "review-rows")
		b.ReportMetric(float64(incremental.edits.made), "edits")
		b.ReportMetric(float64(incremental.edits.missed), "edits-missed-at-end")
		b.ReportMetric(incremental.edits.meanWait(), "edit-cycles-waited")
		b.ReportMetric(float64(incremental.replies.made), "replies")
		b.ReportMetric(float64(incremental.replies.missed), "replies-missed-at-end")
		b.ReportMetric(incremental.replies.meanWait(), "reply-cycles-waited")
	}
}

// steadyStateRun is what one run of BenchmarkIncrementalCrawl measured.
type steadyStateRun struct {
	requests       int    // Play Store requests of the measured cycles
	rows, stats    int    // reviews and app_stats rows at the end
	checksum       string // of every review row but its sync times, edited and replied ones left out
	edits, replies changeCatch
}

// changeCatch says how a run caught the changes of one kind to old reviews.
type changeCatch struct {
	made   int // changes made on the store
	missed int // not stored when the run ended
	waited int // cycles after the first that the stored ones waited, summed
}

func (c changeCatch) meanWait() float64 {
	if c.made == c.missed {
		return 0
	}
	return float64(c.waited) / float64(c.made-c.missed)
}

// runSteadyState stores every app's newest 1000 reviews with a first cycle,
// then runs hours hourly cycles with fullSync as REVIEWS_FULL_SYNC_INTERVAL,
// each after the store got its new reviews, edits and replies, and each
// stored before the next. After each cycle it looks which changes are
// stored.
func runSteadyState(b *testing.B, replay *replayPlayStore, apps, hours int, fullSync time.Duration) steadyStateRun {
	ctx := context.Background()
	pool := newTestPool(b)
	registry := newAppStore(pool)
	var active []app
	for i := range apps {
		replay.setApp(benchPackage(i), replayApp{Reviews: 5000})
		a, err := registry.Create(ctx, newApp{PackageName: benchPackage(i)})
		if err != nil {
			b.Fatal(err)
		}
		active = append(active, a)
	}
	_, brokers := newTestBroker(b, b.TempDir())
	opts := testConsumerOptions()
	opts.MaxPollRecords = 5000
	consumer := startTestConsumer(b, pool, brokers, opts, consumerHooks{})
	const workers = 8
	store := newTestPlayStore(b, replay.URL, func(p *proxyPoolConfig, _ *playStoreConfig) { p.MaxInFlight = workers })
	cfg := testCrawlerConfig(workers, benchReviewsPerApp)
	cfg.FullSyncInterval = fullSync
	cr := newCycleCrawler(cfg, registry, store.client, newPGKnownReviews(pool), newTestPublisher(b, brokers, testProducerSettings),
		prometheus.NewRegistry(), testLogger(b))

	// Crawl times after the replay's reviews, in the consumer's past. A
	// cycle crawls every app in workers goroutines, as the crawl workers
	// do, each job planned as the scheduler plans it an hour after the
	// last.
	start := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	cycle := func(at time.Time) {
		jobs := make(chan app)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failed []appResult
		for range workers {
			wg.Go(func() {
				for a := range jobs {
					r := cr.crawlApp(ctx, crawlJob{App: a, CrawledAt: at, Locale: cfg.Locales.forApp(a.IsIranianApp),
						FullResync: fullResyncDue(a.PackageName, at, at.Add(-time.Hour), fullSync)})
					if r.statsErr != nil || r.reviewsErr != nil {
						mu.Lock()
						failed = append(failed, r)
						mu.Unlock()
					}
				}
			})
		}
		for _, a := range active {
			jobs <- a
		}
		close(jobs)
		wg.Wait()
		if len(failed) > 0 {
			b.Fatalf("cycle at %s: %d apps failed, the first %+v", at, len(failed), failed[0])
		}
		waitDrained(b, pool, consumer.cl, opts.Group)
	}
	cycle(start.Add(-time.Hour))
	before := replay.totalRequests()

	// A change to an old review, made before the cycle of hour made.
	type change struct {
		reply bool // else an edit
		made  int
	}
	pending := map[string]change{} // by review id
	var run steadyStateRun
	var changed []string // every review changed, each once at most
	rng := rand.New(rand.NewPCG(15, 15))
	for h := range hours {
		for i := range apps {
			pkg := benchPackage(i)
			replay.addReviews(pkg, rng.IntN(6))
			// Old reviews of the newer half of the stored window, which
			// the day's new reviews do not push out of REVIEWS_PER_APP.
			edit, reply := rng.IntN(10) == 0, rng.IntN(5) == 0
			edited, replied := rng.IntN(benchReviewsPerApp/2), rng.IntN(benchReviewsPerApp/2)
			if id := replayReviewID(pkg, edited); edit && !slices.Contains(changed, id) && replay.editReview(pkg, edited) {
				changed, pending[id] = append(changed, id), change{made: h}
				run.edits.made++
			}
			if id := replayReviewID(pkg, replied); reply && !slices.Contains(changed, id) && replay.replyTo(pkg, replied) {
				changed, pending[id] = append(changed, id), change{reply: true, made: h}
				run.replies.made++
			}
		}
		cycle(start.Add(time.Duration(h) * time.Hour))
		ids := slices.Collect(maps.Keys(pending))
		rows, err := pool.Query(ctx, `SELECT review_id, content LIKE '% (edited)', reply_content IS NOT NULL FROM reviews WHERE review_id = ANY($1)`, ids)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
			var id string
			var isEdited, isReplied bool
			if err := rows.Scan(&id, &isEdited, &isReplied); err != nil {
				b.Fatal(err)
			}
			switch c := pending[id]; {
			case c.reply && isReplied:
				run.replies.waited += h - c.made
			case !c.reply && isEdited:
				run.edits.waited += h - c.made
			default:
				continue
			}
			delete(pending, id)
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range pending {
		if c.reply {
			run.replies.missed++
		} else {
			run.edits.missed++
		}
	}
	run.requests, run.stats = replay.totalRequests()-before, count(b, pool, `SELECT count(*) FROM app_stats`)
	if err := pool.QueryRow(ctx, `
SELECT count(*), md5(string_agg(concat_ws('|', review_id, at, md5(content), thumbs_up_count, score, reply_content, replied_at, app_version), ',' ORDER BY review_id)
  FILTER (WHERE review_id <> ALL($1)))
FROM reviews`, changed).Scan(&run.rows, &run.checksum); err != nil {
		b.Fatal(err)
	}
	if err := consumer.stop(); err != nil {
		b.Fatal(err)
	}
	return run
}
