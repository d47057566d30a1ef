package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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
	cr := newCrawler(f.crawler.cfg, f.apps, f.store.client, newPGKnownReviews(f.pool), f.pub, m.reg, testLogger(t))
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
	m.worker = newCrawlWorker(cr, f.crawler.cfg.Workers, m.reg, testLogger(t))
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
	job, err := m.sched.jobRecord(crawlCycle{ID: 1, PlannedAt: planned}, app{PackageName: "com.example.fleet03"})
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
	if _, err := pool.Exec(ctx, `UPDATE scheduler_lease SET expires_at = now() - interval '1s'`); err != nil {
		t.Fatal(err)
	}
	if err := b.acquire(ctx); err != nil || b.epoch != 2 {
		t.Fatalf("takeover: %v, epoch %d", err, b.epoch)
	}
	// a still believes it leads; what it would write is refused.
	registerApps(t, pool, "com.example.one")
	a.ledEpoch = a.epoch
	if err := a.planCycle(ctx, nil); err == nil || a.epoch != 0 {
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
	pool := newTestPool(t)
	_, brokers := newTestBroker(t, t.TempDir())
	ctx := context.Background()
	registerApps(t, pool, "com.example.planned")
	if _, err := pool.Exec(ctx, `INSERT INTO crawl_cycles (id, planned_at, leader, leader_epoch, apps, job_end_offsets, published_at, finished_at)
		VALUES (1, now(), 'gone', 1, 1, '{}', now(), now())`); err != nil {
		t.Fatal(err)
	}
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
	if job.PackageName != "com.example.meanwhile" || job.CycleID != 0 || !job.FullResync {
		t.Errorf("job %+v, want a full read of com.example.meanwhile by the new-app watch", job)
	}
	if job.PlannedAt.Before(messageTime(registered)) || job.PlannedAt.After(dbNow) {
		t.Errorf("job crawled at %v, want the database's time between the registration %v and %v", job.PlannedAt, registered, dbNow)
	}
	if n := count(t, pool, `SELECT count(*) FROM crawl_cycles`); n != 1 {
		t.Errorf("%d cycles, want 1 (the next is due in an hour)", n)
	}
}
