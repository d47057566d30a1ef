package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fleetMember is one instance's crawler role in the test process: its
// scheduler and its crawl worker, on the fixture's database and broker.
type fleetMember struct {
	sched  *scheduler
	worker *crawlWorker
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
}

func startFleetMember(t *testing.T, f *crawlFixture, lease time.Duration) *fleetMember {
	t.Helper()
	m := &fleetMember{reg: prometheus.NewRegistry(), done: make(chan struct{})}
	cr := newCrawler(f.crawler.cfg, f.store.client, newPGKnownReviews(f.pool), f.pub, m.reg, testLogger(t))
	producer, err := kgo.NewClient(append(producerOptions(testProducerSettings), kgo.SeedBrokers(f.brokers...))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	adm, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adm.Close)
	cfg := schedulerConfig{Interval: time.Hour, Lease: lease, NewAppCheck: 100 * time.Millisecond, JobsGroup: "crawl-test", Locales: testLocales}
	m.sched = newScheduler(cfg, f.apps.pool, f.apps, producer, kadm.NewClient(adm), cr.metrics, m.reg, testLogger(t))
	m.worker = newCrawlWorker(cr, newLeaseEpochs(f.pool), f.crawler.cycle.Workers, m.reg, testLogger(t))
	jobs, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(f.brokers...)}, m.worker.clientOptions(cfg.JobsGroup, lease)...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.done)
		var wg sync.WaitGroup
		wg.Go(func() { _ = m.sched.Run(ctx) })
		_ = m.worker.Run(ctx, jobs)
		wg.Wait()
		jobs.Close()
	}()
	t.Cleanup(m.stop)
	return m
}

func (m *fleetMember) stop() {
	m.cancel()
	<-m.done
}

func (m *fleetMember) metric(t *testing.T, name string) float64 {
	return metricValue(t, m.reg, name, nil)
}

// The single-instance path on the embedded broker: the scheduler leads,
// plans one cycle into crawl-jobs, the worker crawls every app once with the
// cycle's planned time as crawled_at, and the cycle is finished once the
// workers' commits reach the jobs' end offsets. A job that breaks the
// contract is skipped and committed; a redelivered job crawls at the same
// crawled_at; an app registered mid-cycle gets a job of its own.
func TestSchedulerCycleThroughCrawlJobs(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(3, 20), nil)
	createTestTopics(t, f.brokers, topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	const apps = 9
	for i := range apps {
		pkg := fmt.Sprintf("com.example.fleet%02d", i)
		f.replay.setApp(pkg, replayApp{Reviews: 20})
		f.register(t, pkg, i == 0)
	}
	// A bad job already waits on the topic; the workers skip it.
	produce(t, f.brokers, rec(topicCrawlJobs, "x", []byte(`{"cycle_id":1,"package_name":"not a package"}`)))

	m := startFleetMember(t, f, 6*time.Second)
	ctx := context.Background()
	var planned time.Time
	waitFor(t, 20*time.Second, "cycle 1 to finish", func() bool {
		var finished *time.Time
		err := f.apps.pool.QueryRow(ctx, `SELECT planned_at, finished_at FROM crawl_cycles WHERE id = 1`).Scan(&planned, &finished)
		return err == nil && finished != nil
	})
	if got := m.metric(t, "playwatch_scheduler_leader"); got != 1 {
		t.Errorf("leader gauge %v, want 1", got)
	}
	for i := range apps {
		pkg := fmt.Sprintf("com.example.fleet%02d", i)
		if n := f.replay.requests("details", pkg); n != 1 {
			t.Errorf("%s: listing requested %d times, want 1", pkg, n)
		}
	}
	if got := f.replay.locale("details", "com.example.fleet00"); got != "fa/ir" {
		t.Errorf("the Iranian app was read in %s", got)
	}
	for _, r := range consumeAll(t, f.brokers, topicAppStats, apps) {
		var s appStatsMessage
		if err := jsonUnmarshalStrict(r.Value, &s); err != nil {
			t.Fatal(err)
		}
		if !s.CrawledAt.Equal(planned) {
			t.Errorf("%s crawled_at %v, want the cycle's planned time %v", s.PackageName, s.CrawledAt, planned)
		}
	}
	if n := endOffsets(t, f.brokers, topicAppStats); n != apps {
		t.Errorf("%d app-stats records, want %d", n, apps)
	}
	for name, want := range map[string]float64{
		"playwatch_crawl_cycles_total": 1, "playwatch_crawl_jobs_invalid_total": 1,
		"playwatch_crawl_jobs_done_total": apps, "playwatch_crawl_jobs_published_total": apps,
	} {
		if got := m.metric(t, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	waitFor(t, 5*time.Second, "no job lag", func() bool { return m.metric(t, "playwatch_crawl_jobs_lag_records") == 0 })

	// A job delivered again (another leader published it before it died)
	// crawls at the same time, so app_stats takes it once, and in the
	// locale the job carries: that leader had other PLAYSTORE_* settings.
	job, err := m.sched.jobRecord(crawlCycle{ID: 1, PlannedAt: planned}, app{PackageName: "com.example.fleet03"}, testLocales.Default)
	if err != nil {
		t.Fatal(err)
	}
	var jm crawlJobMessage
	if err := jsonUnmarshalStrict(job.Value, &jm); err != nil {
		t.Fatal(err)
	}
	jm.Lang, jm.Country = "de", "at"
	if job.Value, err = jm.encode(); err != nil {
		t.Fatal(err)
	}
	produce(t, f.brokers, job)
	// An app registered mid-cycle gets a job of the new-app watch.
	f.replay.setApp("com.example.late", replayApp{Reviews: 5})
	f.register(t, "com.example.late", false)
	waitFor(t, 10*time.Second, "the new app and the redelivered job crawled", func() bool {
		return m.metric(t, "playwatch_crawl_jobs_done_total") == apps+2
	})
	var again []time.Time
	var late appStatsMessage
	for _, r := range consumeAll(t, f.brokers, topicAppStats, apps+2) {
		var s appStatsMessage
		if err := jsonUnmarshalStrict(r.Value, &s); err != nil {
			t.Fatal(err)
		}
		switch s.PackageName {
		case "com.example.fleet03":
			again = append(again, s.CrawledAt)
		case "com.example.late":
			late = s
		}
	}
	if len(again) != 2 || !again[0].Equal(planned) || !again[1].Equal(planned) {
		t.Errorf("the app of the redelivered job crawled at %v, want twice at %v", again, planned)
	}
	if got := f.replay.locale("details", "com.example.fleet03"); got != "de/at" {
		t.Errorf("the redelivered job was read in %s, not in its own de/at", got)
	}
	if !late.CrawledAt.After(planned) {
		t.Errorf("the new app crawled at %v, before the cycle's %v", late.CrawledAt, planned)
	}
	if n := count(t, f.apps.pool, `SELECT count(*) FROM crawl_cycles`); n != 1 {
		t.Errorf("%d cycles planned, want 1 (the next is due in an hour)", n)
	}
}

// Two schedulers on one database: one leads; the other takes over once the
// leader resigns, and a leader whose lease passed to another plans nothing.
func TestSchedulerLeaseOneLeader(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	cfg := schedulerConfig{Interval: time.Hour, Lease: 10 * time.Second, JobsGroup: "g"}
	a := newScheduler(cfg, pool, newAppStore(pool), nil, nil, newCrawlMetrics(prometheus.NewRegistry(), time.Hour), prometheus.NewRegistry(), testLogger(t))
	b := newScheduler(cfg, pool, newAppStore(pool), nil, nil, newCrawlMetrics(prometheus.NewRegistry(), time.Hour), prometheus.NewRegistry(), testLogger(t))
	for _, s := range []*scheduler{a, b} {
		if err := s.acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if a.epoch != 1 || b.epoch != 0 {
		t.Fatalf("epochs %d and %d, want a leading with 1", a.epoch, b.epoch)
	}
	if err := a.renew(ctx, 1); err != nil || a.epoch != 1 {
		t.Fatalf("renew: %v, epoch %d", err, a.epoch)
	}
	// The lease runs out (the leader stalled): b takes it with epoch 2.
	mustExec(t, pool, `UPDATE scheduler_lease SET expires_at = now() - interval '1s'`)
	if err := b.acquire(ctx); err != nil || b.epoch != 2 {
		t.Fatalf("takeover: %v, epoch %d", err, b.epoch)
	}
	// a still believes it leads; what it would write is refused.
	registerApps(t, pool, "com.example.one")
	a.ledEpoch = a.epoch
	if _, err := a.planCycle(ctx, nil); err == nil || a.epoch != 0 {
		t.Errorf("the old leader planned a cycle (err %v), epoch %d", err, a.epoch)
	}
	if n := count(t, pool, `SELECT count(*) FROM crawl_cycles`); n != 0 {
		t.Errorf("%d cycles planned by a leader without the lease", n)
	}
	b.resign()
	if err := a.acquire(ctx); err != nil || a.epoch != 3 {
		t.Fatalf("after b resigned: %v, epoch %d", err, a.epoch)
	}
}

// A leader that starts after the current cycle was planned (a restart, a
// takeover) counts as planned only the apps whose row predates the cycle:
// an app registered since gets its new-app job at once, on the database's
// clock, and the apps of the cycle get none.
func TestSchedulerRestartCrawlsAppsTheCycleMissed(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	_, brokers := newTestBroker(t, t.TempDir())
	ctx := context.Background()
	registerApps(t, pool, "com.example.planned")
	mustExec(t, pool, `INSERT INTO crawl_cycles (id, planned_at, leader, leader_epoch, apps, job_end_offsets, published_at, finished_at)
		VALUES (1, now(), 'gone', 1, 1, '{}', now(), now())`)
	registerApps(t, pool, "com.example.meanwhile") // while no instance led
	var registered time.Time
	if err := pool.QueryRow(ctx, `SELECT created_at FROM apps_registry_application WHERE package_name = 'com.example.meanwhile'`).Scan(&registered); err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(append(producerOptions(testProducerSettings), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	cfg := schedulerConfig{Interval: time.Hour, Lease: 10 * time.Second, NewAppCheck: time.Hour, JobsGroup: "g", Locales: testLocales}
	s := newScheduler(cfg, pool, newAppStore(pool), producer, nil, newCrawlMetrics(prometheus.NewRegistry(), time.Hour), prometheus.NewRegistry(), testLogger(t))
	if err := s.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	s.ledEpoch = s.currentEpoch()
	if err := s.lead(ctx, jobOffsets{}, nil); err != nil {
		t.Fatal(err)
	}
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if n := endOffsets(t, brokers, topicCrawlJobs); n != 1 {
		t.Fatalf("%d jobs published, want 1: the app registered after the cycle", n)
	}
	job, bad := decodeCrawlJob(consumeAll(t, brokers, topicCrawlJobs, 1)[0].Value, time.Now().Add(time.Minute))
	if bad != nil {
		t.Fatalf("the job: %v", bad)
	}
	if job.PackageName != "com.example.meanwhile" || job.CycleID != 0 || !job.FullResync || job.LeaseEpoch != s.ledEpoch {
		t.Errorf("job %+v, want a full read of com.example.meanwhile by the new-app watch", job)
	}
	if job.PlannedAt.Before(messageTime(registered)) || job.PlannedAt.After(dbNow) {
		t.Errorf("job crawled at %v, want the database's time between the registration %v and %v", job.PlannedAt, registered, dbNow)
	}
	if n := count(t, pool, `SELECT count(*) FROM crawl_cycles`); n != 1 {
		t.Errorf("%d cycles, want 1 (the next is due in an hour)", n)
	}
}

// Issue 20 item 3: what the new-app watch crawled is in the database, per
// cycle, app and storefront, so that a leader started after it (a restart,
// a takeover) does not crawl the app again in the same cycle: until the next
// planned cycle the store sees one listing request for it.
func TestSchedulerNewAppCrawledOnceAcrossRestart(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 10), nil)
	createTestTopics(t, f.brokers, topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	const planned, late = "com.example.planned", "ir.example.late"
	f.replay.setApp(planned, replayApp{Reviews: 5})
	f.replay.setApp(late, replayApp{Reviews: 5})
	f.register(t, planned, false)
	m := startFleetMember(t, f, 6*time.Second)
	waitFor(t, 20*time.Second, "cycle 1 to finish", func() bool {
		return count(t, f.pool, `SELECT count(*) FROM crawl_cycles WHERE id = 1 AND finished_at IS NOT NULL`) == 1
	})
	f.register(t, late, true)
	waitFor(t, 20*time.Second, "the new-app watch's crawl", func() bool {
		return m.metric(t, "playwatch_crawl_jobs_done_total") == 2
	})
	var country, lang string
	var epoch int64
	if err := f.pool.QueryRow(context.Background(), `SELECT j.country, j.lang, j.lease_epoch FROM crawl_new_app_jobs j
		JOIN apps_registry_application a ON a.id = j.application_id WHERE j.cycle_id = 1 AND a.package_name = $1`, late).Scan(&country, &lang, &epoch); err != nil {
		t.Fatalf("the watch's job in crawl_new_app_jobs: %v", err)
	}
	if country != "ir" || lang != "fa" || epoch != 1 {
		t.Errorf("recorded storefront %s/%s under epoch %d, want ir/fa under 1", country, lang, epoch)
	}
	m.stop()
	// The next leader (this process restarted) looks for new apps every
	// 100 ms; a second of looks finds none.
	m = startFleetMember(t, f, 6*time.Second)
	waitFor(t, 10*time.Second, "the new leader", func() bool { return m.metric(t, "playwatch_scheduler_leader") == 1 })
	time.Sleep(time.Second)
	for pkg, want := range map[string]int{planned: 1, late: 1} {
		if n := f.replay.requests("details", pkg); n != want {
			t.Errorf("%s: %d listing requests before the next cycle, want %d", pkg, n, want)
		}
	}
	if n := m.metric(t, "playwatch_crawl_jobs_published_total"); n != 0 {
		t.Errorf("the new leader published %v jobs, want none before the next cycle", n)
	}
}

// Issue 20 item 10: a leader that started on an empty registry plans a
// cycle as soon as the first app is registered, rather than crawling it
// with the new-app watch and showing "none planned yet" for an interval.
func TestSchedulerFirstAppStartsACycle(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 10), nil)
	createTestTopics(t, f.brokers, topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	m := startFleetMember(t, f, 6*time.Second)
	// An empty cycle sets the last-cycle time without a row.
	waitFor(t, 10*time.Second, "the leader to find no apps", func() bool {
		return m.metric(t, "playwatch_crawl_last_cycle_timestamp_seconds") > 0
	})
	if n := count(t, f.pool, `SELECT count(*) FROM crawl_cycles`); n != 0 {
		t.Fatalf("%d cycles planned on an empty registry", n)
	}
	const first = "com.example.first"
	f.replay.setApp(first, replayApp{Reviews: 5})
	f.register(t, first, false)
	waitFor(t, 10*time.Second, "a cycle with the first app to finish", func() bool {
		return count(t, f.pool, `SELECT count(*) FROM crawl_cycles WHERE apps = 1 AND finished_at IS NOT NULL`) == 1
	})
	if n := f.replay.requests("details", first); n != 1 {
		t.Errorf("%d listing requests, want 1", n)
	}
	if n := m.metric(t, "playwatch_crawl_new_apps_total"); n != 0 {
		t.Errorf("%v new-app watch jobs, want none: the cycle crawled the app", n)
	}
}

// Issue 20 item 4, the leader's side: it produces only until its renewal
// deadline minus the margin, and every job carries the epoch it was planned
// under, also the jobs another leader publishes again for a cycle planned
// under an earlier epoch.
func TestSchedulerStopsProducingPastItsLeaseDeadline(t *testing.T) {
	pool := newTestPool(t)
	_, brokers := newTestBroker(t, t.TempDir())
	ctx := context.Background()
	registerApps(t, pool, "com.example.one")
	a := newLeadingScheduler(t, pool, brokers)
	// The last renewal was sent 7.5 s ago: the database still counts the
	// lease as a's (8 s), but it is past a's deadline minus the margin.
	a.leaseMu.Lock()
	a.renewedAt = time.Now().Add(-a.part(0.75))
	a.leaseMu.Unlock()
	if c, err := a.planCycle(ctx, nil); c == nil || !errors.Is(err, errLeaseDeadline) {
		t.Fatalf("planning past the deadline: cycle %v, %v; want the cycle recorded and its publishing refused", c, err)
	}
	if n := endOffsets(t, brokers, topicCrawlJobs); n != 0 {
		t.Fatalf("%d jobs published past the lease deadline", n)
	}
	// The lease passes to b, which publishes the jobs of a's cycle under
	// a's epoch: they were planned under it.
	mustExec(t, pool, `UPDATE scheduler_lease SET expires_at = now()`)
	b := newLeadingScheduler(t, pool, brokers)
	if err := b.lead(ctx, jobOffsets{}, nil); err != nil {
		t.Fatal(err)
	}
	recs := consumeAll(t, brokers, topicCrawlJobs, 1)
	job, bad := decodeCrawlJob(recs[0].Value, time.Now().Add(time.Minute))
	if bad != nil {
		t.Fatal(bad)
	}
	if job.CycleID != 1 || job.LeaseEpoch != a.ledEpoch || b.ledEpoch == a.ledEpoch {
		t.Errorf("the republished job: cycle %d, lease epoch %d; want cycle 1 under a's epoch %d (b leads under %d)", job.CycleID, job.LeaseEpoch, a.ledEpoch, b.ledEpoch)
	}
	var aBegan, aEnded, bBegan time.Time
	if err := pool.QueryRow(ctx, `SELECT (SELECT began_at FROM scheduler_epochs WHERE epoch = $1), (SELECT ended_at FROM scheduler_epochs WHERE epoch = $1),
		(SELECT began_at FROM scheduler_epochs WHERE epoch = $2)`, a.ledEpoch, b.ledEpoch).Scan(&aBegan, &aEnded, &bBegan); err != nil {
		t.Fatal(err)
	}
	if !aBegan.Before(job.PlannedAt) || !job.PlannedAt.Before(aEnded) || bBegan.Before(aEnded) {
		t.Errorf("epochs: a [%v, %v), b from %v; the cycle planned at %v", aBegan, aEnded, bBegan, job.PlannedAt)
	}
}

// Issue 20 item 4, the workers' side: a job is crawled when its planned_at
// lies within its lease epoch, also after a takeover, and when it has no
// epoch (an older playwatch); one planned when its epoch had ended, or
// under an epoch the database never had, is dropped, counted and committed.
func TestCrawlWorkerDropsJobsOutsideTheirLeaseEpoch(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 5), nil)
	createTestTopics(t, f.brokers, topicSpec{Partitions: 1, Replication: -1, Retention: time.Hour})
	ctx := context.Background()
	var now time.Time
	if err := f.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	now = messageTime(now)
	// Epoch 1 led for half an hour until an hour ago, epoch 2 since.
	mustExec(t, f.pool, `INSERT INTO scheduler_epochs (epoch, holder, began_at, ended_at) VALUES
		(1, 'old', $1::timestamptz - interval '90 minutes', $1::timestamptz - interval '60 minutes'),
		(2, 'new', $1::timestamptz - interval '60 minutes', $1::timestamptz + interval '1 minute')`, now)
	jobs := []struct {
		pkg     string
		epoch   int64
		planned time.Time
		crawled bool
	}{
		{"com.example.queued", 1, now.Add(-80 * time.Minute), true}, // a cycle planned under epoch 1, queued over the takeover
		{"com.example.deposed", 1, now.Add(-time.Minute), false},    // epoch 1's leader after its lease had passed
		{"com.example.current", 2, now, true},                       // the leader now
		{"com.example.older", 0, now, true},                         // an older playwatch: no epoch
		{"com.example.unknown", 7, now, false},                      // no such epoch
		{"com.example.early", 2, now.Add(-61 * time.Minute), false}, // before epoch 2 began
		{"com.example.renewed", 2, now.Add(30 * time.Second), true}, // within epoch 2's renewed lease
	}
	var recs []*kgo.Record
	for _, j := range jobs {
		f.replay.setApp(j.pkg, replayApp{Reviews: 1})
		f.register(t, j.pkg, false)
		b, err := crawlJobMessage{CycleID: 1, PlannedAt: j.planned, PackageName: j.pkg, Lang: "en", Country: "us", LeaseEpoch: j.epoch}.encode()
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec(topicCrawlJobs, j.pkg, b))
	}
	produce(t, f.brokers, recs...)
	reg := prometheus.NewRegistry()
	cr := newCrawler(f.crawler.cfg, f.store.client, newPGKnownReviews(f.pool), f.pub, reg, testLogger(t))
	w := newCrawlWorker(cr, newLeaseEpochs(f.pool), 2, reg, testLogger(t))
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(f.brokers...)}, w.clientOptions("crawl-test", 6*time.Second)...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx, cl) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 20*time.Second, "every job done or dropped", func() bool {
		return metricValue(t, reg, "playwatch_crawl_jobs_done_total", nil)+metricValue(t, reg, "playwatch_crawl_jobs_lease_passed_total", nil) == float64(len(jobs))
	})
	if n := metricValue(t, reg, "playwatch_crawl_jobs_lease_passed_total", nil); n != 3 {
		t.Errorf("playwatch_crawl_jobs_lease_passed_total = %v, want 3", n)
	}
	for _, j := range jobs {
		want := 0
		if j.crawled {
			want = 1
		}
		if n := f.replay.requests("details", j.pkg); n != want {
			t.Errorf("%s (epoch %d, planned %v): %d listing requests, want %d", j.pkg, j.epoch, j.planned.Sub(now), n, want)
		}
	}
}

// Issue 20 item 15: `crawl --once` plans its cycle through the scheduler: it
// refuses while another instance holds the lease, naming it, and otherwise
// takes the lease for the cycle, records it in crawl_cycles, crawls its
// jobs from crawl-jobs, prints the summary and gives the lease up.
func TestCrawlOncePlansThroughTheScheduler(t *testing.T) {
	t.Parallel()
	replay := newReplayPlayStore(t)
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	_, brokers := newTestBroker(t, t.TempDir())
	registerApps(t, pool, "com.example.one", "com.example.two")
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir(),
		"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "20", "SCHEDULER_LEASE": "6s"}
	ctx := context.Background()
	mustExec(t, pool, `INSERT INTO scheduler_lease (name, holder, epoch, expires_at) VALUES ('crawl', 'elsewhere/42/beef', 1, now() + interval '1 minute')`)
	var out strings.Builder
	err := run(ctx, []string{"crawl", "--once"}, envFunc(env), &out, io.Discard)
	if !errors.Is(err, errLeaseHeld) || !strings.Contains(err.Error(), "elsewhere/42/beef") {
		t.Fatalf("crawl --once beside a leader: %v, want a refusal naming elsewhere/42/beef", err)
	}
	if n := replay.totalRequests(); n != 0 || count(t, pool, `SELECT count(*) FROM crawl_cycles`) != 0 {
		t.Fatalf("the refused crawl sent %d store requests or planned a cycle", n)
	}
	mustExec(t, pool, `UPDATE scheduler_lease SET expires_at = now()`)
	if err := run(ctx, []string{"crawl", "--once"}, envFunc(env), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "app_stats: 2/2, reviews: 2/2 (40 review messages)") {
		t.Errorf("crawl --once printed %q", out.String())
	}
	if n := count(t, pool, `SELECT count(*) FROM crawl_cycles WHERE id = 1 AND apps = 2 AND leader_epoch = 2 AND finished_at IS NOT NULL`); n != 1 {
		t.Errorf("%d finished cycles of 2 apps under epoch 2, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM scheduler_lease WHERE expires_at <= now()`); n != 1 {
		t.Error("crawl --once kept the lease")
	}
	for _, pkg := range []string{"com.example.one", "com.example.two"} {
		if n := replay.requests("details", pkg); n != 1 {
			t.Errorf("%s: %d listing requests, want 1", pkg, n)
		}
	}
}

// Issue 20 item 15: `crawl` without --once is the crawler role of run: it
// leads, plans the cycle, runs the new-app watch, and gives the lease up
// when it stops.
func TestCrawlCommandIsTheScheduler(t *testing.T) {
	t.Parallel()
	replay := newReplayPlayStore(t)
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	_, brokers := newTestBroker(t, t.TempDir())
	registerApps(t, pool, "com.example.one")
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir(),
		"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "20",
		"SCHEDULER_LEASE": "6s", "CRAWL_NEW_APP_CHECK": "200ms"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"crawl"}, envFunc(env), io.Discard, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("crawl: %v", err)
		}
		if n := count(t, pool, `SELECT count(*) FROM scheduler_lease WHERE expires_at <= now()`); n != 1 {
			t.Error("crawl kept the lease after it stopped")
		}
	}()
	waitFor(t, 30*time.Second, "cycle 1 to finish", func() bool {
		return count(t, pool, `SELECT count(*) FROM crawl_cycles WHERE id = 1 AND apps = 1 AND finished_at IS NOT NULL`) == 1
	})
	registerApps(t, pool, "com.example.two")
	waitFor(t, 30*time.Second, "the new-app watch's crawl", func() bool {
		return count(t, pool, `SELECT count(*) FROM crawl_new_app_jobs WHERE cycle_id = 1`) == 1 && replay.requests("reviews", "com.example.two") == 1
	})
	if n := replay.requests("details", "com.example.one"); n != 1 {
		t.Errorf("%d listing requests of the cycle's app, want 1", n)
	}
}

// A cycle whose jobs the broker lost (data/broker deleted, a new cluster)
// would wait forever for commits past offsets the new log never reaches:
// the leader finishes it and plans the next one.
func TestSchedulerFinishesACycleWhoseJobsTheBrokerLost(t *testing.T) {
	t.Parallel()
	pool, brokers := newSchedulerBed(t, 3, "com.example.lost")
	ctx := context.Background()
	insertLostCycle(t, pool, `{"0": 40, "1": 0, "2": 7}`)
	s := newLeadingScheduler(t, pool, brokers)
	lead := func() {
		t.Helper()
		offs, offsErr := s.jobOffsets(ctx)
		if err := s.lead(ctx, offs, offsErr); err != nil {
			t.Fatal(err)
		}
	}
	lead()
	if !lostCycleFinished(t, pool) {
		t.Error("the cycle whose jobs the broker lost is not finished")
	}
	lead() // the next step plans: the finished cycle is overdue
	if n := count(t, pool, `SELECT count(*) FROM crawl_cycles WHERE id = 2`); n != 1 {
		t.Error("no next cycle planned after the lost one")
	}
}

// insertLostCycle stores cycle 1 as a leader gone since published it two
// hours ago, with jobs up to endOffsets (JSON, by partition) that the
// broker of the test never had.
func insertLostCycle(t *testing.T, pool *pgxpool.Pool, endOffsets string) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO crawl_cycles (id, planned_at, leader, leader_epoch, apps, job_end_offsets, published_at)
		VALUES (1, now() - interval '2 hours', 'gone', 1, 1, $1, now() - interval '2 hours')`, endOffsets)
}

// lostCycleFinished says whether insertLostCycle's cycle is finished.
func lostCycleFinished(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM crawl_cycles WHERE id = 1 AND finished_at IS NOT NULL`) == 1
}

// crawl --once finishes such a cycle too, instead of waiting for it forever.
func TestCrawlOnceFinishesACycleWhoseJobsTheBrokerLost(t *testing.T) {
	t.Parallel()
	pool, brokers := newSchedulerBed(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	insertLostCycle(t, pool, `{"0": 40}`)
	s := newLoneScheduler(t, pool, brokers)
	c, err := s.RunOnce(ctx)
	if err != nil || c != nil {
		t.Fatalf("crawl --once with no active apps: %v, %v; want no cycle and no error", c, err)
	}
	if !lostCycleFinished(t, pool) {
		t.Error("the cycle whose jobs the broker lost is not finished")
	}
}

// A partition of a cycle's jobs that crawl-jobs no longer has (a new,
// smaller topic) is lost as well; one it has is lost only below its end.
func TestJobOffsetsLost(t *testing.T) {
	o := jobOffsets{end: map[int32]int64{0: 10, 1: 3}}
	if got := o.lost(map[int32]int64{0: 10, 1: 2}); got != nil {
		t.Errorf("ends within the log reported lost: %v", got)
	}
	if got := o.lost(map[int32]int64{0: 11}); len(got) != 1 {
		t.Errorf("an end past the log: lost %v, want partition 0", got)
	}
	if got := o.lost(map[int32]int64{2: 1}); len(got) != 1 {
		t.Errorf("a partition the topic lacks: lost %v, want partition 2", got)
	}
}

// A cycle an older playwatch planned and did not publish whole has an epoch
// scheduler_epochs lacks: its jobs go out again without one, and the
// workers crawl them instead of dropping them as a passed lease's.
func TestSchedulerRepublishesAnOlderPlaywatchsCycleWithoutEpoch(t *testing.T) {
	t.Parallel()
	pool, brokers := newSchedulerBed(t, 1, "com.example.upgraded")
	ctx := context.Background()
	mustExec(t, pool, `INSERT INTO crawl_cycles (id, planned_at, leader, leader_epoch) VALUES (1, now(), 'older', 41)`)
	s := newLeadingScheduler(t, pool, brokers)
	if err := s.lead(ctx, jobOffsets{}, nil); err != nil {
		t.Fatal(err)
	}
	job, bad := decodeCrawlJob(consumeAll(t, brokers, topicCrawlJobs, 1)[0].Value, time.Now().Add(time.Minute))
	if bad != nil {
		t.Fatalf("the job: %v", bad)
	}
	if job.CycleID != 1 || job.LeaseEpoch != 0 {
		t.Errorf("job %+v, want cycle 1's job without a lease epoch", job)
	}
}

// panickingStore panics on every listing: a page or job no code foresaw.
type panickingStore struct{ storeReader }

func (panickingStore) Details(context.Context, string, string, string) (appDetails, error) {
	panic("a listing nobody foresaw")
}

// A crawl that panics fails that job alone: logged, counted as invalid and
// committed, so a restart does not meet it again; the worker goes on.
func TestCrawlWorkerSurvivesAPanickingJob(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 5), nil)
	createTestTopics(t, f.brokers, topicSpec{Partitions: 1, Replication: -1, Retention: time.Hour})
	reg := prometheus.NewRegistry()
	cr := newCrawler(f.crawler.cfg, panickingStore{f.store.client}, newPGKnownReviews(f.pool), f.pub, reg, testLogger(t))
	w := newCrawlWorker(cr, newLeaseEpochs(f.pool), 1, reg, testLogger(t))
	f.register(t, "com.example.panics", false)
	b, err := crawlJobMessage{CycleID: 1, PlannedAt: messageTime(time.Now()), PackageName: "com.example.panics", Lang: "en", Country: "us"}.encode()
	if err != nil {
		t.Fatal(err)
	}
	w.runJobRecovering(context.Background(), rec(topicCrawlJobs, "com.example.panics", b), time.Now())
	if got := metricValue(t, reg, "playwatch_crawl_jobs_invalid_total", nil); got != 1 {
		t.Errorf("invalid jobs %v, want 1", got)
	}
	if got := metricValue(t, reg, "playwatch_crawl_workers_busy", nil); got != 0 {
		t.Errorf("busy workers %v after the panic, want 0", got)
	}
}

// newSchedulerBed is a database with pkgs registered and a broker of the
// test's own with playwatch's topics of the given partitions.
func newSchedulerBed(t *testing.T, partitions int, pkgs ...string) (*pgxpool.Pool, []string) {
	t.Helper()
	pool := newTestPool(t)
	_, brokers := newTestBroker(t, t.TempDir())
	createTestTopics(t, brokers, topicSpec{Partitions: partitions, Replication: -1, Retention: time.Hour})
	registerApps(t, pool, pkgs...)
	return pool, brokers
}

// newLeadingScheduler is newLoneScheduler holding the lease and leading
// under its epoch.
func newLeadingScheduler(t *testing.T, pool *pgxpool.Pool, brokers []string) *scheduler {
	t.Helper()
	s := newLoneScheduler(t, pool, brokers)
	if err := s.acquire(context.Background()); err != nil || s.currentEpoch() == 0 {
		t.Fatalf("acquire: %v, epoch %d", err, s.currentEpoch())
	}
	s.ledEpoch = s.currentEpoch()
	return s
}

// newLoneScheduler is a scheduler on pool and brokers with an hour's
// interval and a 10 s lease, not running: the test drives it.
func newLoneScheduler(t *testing.T, pool *pgxpool.Pool, brokers []string) *scheduler {
	t.Helper()
	producer, err := kgo.NewClient(append(producerOptions(testProducerSettings), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adm.Close)
	cfg := schedulerConfig{Interval: time.Hour, Lease: 10 * time.Second, NewAppCheck: time.Hour, JobsGroup: "g", Locales: testLocales}
	return newScheduler(cfg, pool, newAppStore(pool), producer, kadm.NewClient(adm), newCrawlMetrics(prometheus.NewRegistry(), time.Hour), prometheus.NewRegistry(), testLogger(t))
}
