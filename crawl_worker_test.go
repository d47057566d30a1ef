package main

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// committingClient records the offsets the worker commits.
type committingClient struct {
	mu        sync.Mutex
	committed []int64
}

func (c *committingClient) PollRecords(context.Context, int) kgo.Fetches { return nil }
func (c *committingClient) AllowRebalance()                              {}
func (c *committingClient) CommitRecords(_ context.Context, rs ...*kgo.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rs {
		c.committed = append(c.committed, r.Offset)
	}
	return nil
}

func (c *committingClient) offsets() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.committed)
}

// A partition a rebalance moves away keeps its running job until the job
// ends and is committed, so that its new owner does not crawl the app
// again; one that outlasts the drain is abandoned uncommitted, and at
// shutdown the drain does not wait.
func TestCrawlWorkerDrainsARevokedPartition(t *testing.T) {
	t.Parallel()
	w := newCrawlWorker(nil, nil, 4, prometheus.NewRegistry(), testLogger(t))
	w.runCtx = t.Context()
	cl := &committingClient{}
	moving := map[string][]int32{topicCrawlJobs: {3}}

	running := &kgo.Record{Partition: 3, Offset: 10}
	jctx := w.track(running).ctx
	other := &kgo.Record{Partition: 1, Offset: 5}
	otherCtx := w.track(other).ctx
	revoked := make(chan struct{})
	go func() {
		w.revoked(t.Context(), nil, moving)
		close(revoked)
	}()
	select {
	case <-revoked:
		t.Fatal("the rebalance went on before the partition's running job ended")
	case <-time.After(100 * time.Millisecond):
	}
	if jctx.Err() != nil {
		t.Fatal("the running job was cancelled while the partition drained")
	}
	w.complete(t.Context(), cl, running)
	select {
	case <-revoked:
	case <-time.After(5 * time.Second):
		t.Fatal("the rebalance still waits after the running job ended")
	}
	if got := cl.offsets(); !slices.Equal(got, []int64{10}) {
		t.Fatalf("committed %v, want the drained job's offset 10", got)
	}
	if otherCtx.Err() != nil {
		t.Fatal("a partition the member keeps was cancelled")
	}

	// A job that outlasts the drain: abandoned, never committed.
	stuck := &kgo.Record{Partition: 1, Offset: 6}
	w.complete(t.Context(), cl, other)
	stuckCtx := w.track(stuck).ctx
	began := time.Now()
	w.drain([]int32{1}, 100*time.Millisecond)
	if waited := time.Since(began); waited < 100*time.Millisecond {
		t.Fatalf("drain returned after %s with a job running", waited)
	}
	w.abandon(t.Context(), nil, map[string][]int32{topicCrawlJobs: {1}})
	if stuckCtx.Err() == nil {
		t.Fatal("the job that outlasted the drain was not cancelled")
	}
	w.complete(t.Context(), cl, stuck)
	if got := cl.offsets(); !slices.Equal(got, []int64{10, 5}) {
		t.Fatalf("committed %v, want 10 and 5 only: the abandoned job is not committed", got)
	}

	// Shutdown: the jobs are cancelled, and the revoke of every partition
	// does not wait for them.
	ctx, stop := context.WithCancel(t.Context())
	w.runCtx = ctx
	w.track(&kgo.Record{Partition: 4, Offset: 1})
	stop()
	began = time.Now()
	w.revoked(t.Context(), nil, map[string][]int32{topicCrawlJobs: {4}})
	if waited := time.Since(began); waited > time.Second {
		t.Fatalf("the revoke at shutdown waited %s for cancelled jobs", waited)
	}
}

// A job whose partition came to this member after the job was planned is
// skipped when both paths of its app were crawled since (by the
// partition's last owner, which died before committing), and crawled when
// the app's last crawl is older than the job; a member that had the
// partition all along crawls a job delivered again.
func TestCrawlWorkerSkipsAJobItsPartitionsLastOwnerCrawled(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 5), nil)
	createTestTopics(t, f.brokers, topicSpec{Partitions: 1, Replication: -1, Retention: time.Hour})
	const crawled, older = "com.example.crawled", "com.example.older"
	job := func(pkg string, planned time.Time) *kgo.Record {
		t.Helper()
		f.replay.setApp(pkg, replayApp{Reviews: 3})
		b, err := crawlJobMessage{CycleID: 2, PlannedAt: messageTime(planned), PackageName: pkg, Lang: "en", Country: "us"}.encode()
		if err != nil {
			t.Fatal(err)
		}
		return rec(topicCrawlJobs, pkg, b)
	}
	member := func() (*crawlWorker, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		cr := newCrawler(f.crawler.cfg, f.store.client, newPGKnownReviews(f.pool), f.pub, reg, testLogger(t))
		return newCrawlWorker(cr, newLeaseEpochs(f.pool), 2, reg, testLogger(t)), reg
	}
	f.register(t, crawled, false)
	f.register(t, older, false)
	planned := time.Now().Add(-time.Minute)
	last, _ := member()
	next, reg := member()

	// The last owner had the partition when the job was planned.
	j := job(crawled, planned)
	last.runJob(t.Context(), j, planned.Add(-time.Hour))
	next.runJob(t.Context(), j, time.Now())
	if n := f.replay.requests("details", crawled); n != 1 {
		t.Errorf("%d listing requests for the job its last owner crawled, want 1", n)
	}
	if n := metricValue(t, reg, "playwatch_crawl_jobs_crawled_already_total", nil); n != 1 {
		t.Errorf("playwatch_crawl_jobs_crawled_already_total = %v, want 1", n)
	}
	// Delivered again to the member that had the partition all along.
	last.runJob(t.Context(), j, planned.Add(-time.Hour))
	if n := f.replay.requests("details", crawled); n != 2 {
		t.Errorf("%d listing requests after a redelivery to the same member, want 2", n)
	}

	// The last owner's crawl failed in a path: the job is crawled again.
	const failed = "com.example.failed"
	j = job(failed, planned)
	f.replay.setApp(failed, replayApp{Reviews: 3, ReviewsAlways: fault500})
	f.register(t, failed, false)
	last.runJob(t.Context(), j, planned.Add(-time.Hour))
	next.runJob(t.Context(), j, time.Now())
	if n := f.replay.requests("details", failed); n != 2 {
		t.Errorf("%d listing requests for a job whose reviews path failed at its last owner, want 2", n)
	}

	// The app's last crawl was the cycle before: the job is crawled.
	last.runJob(t.Context(), job(older, planned), planned.Add(-time.Hour))
	time.Sleep(10 * time.Millisecond)
	next.runJob(t.Context(), job(older, time.Now().Add(crawledAgainMargin)), time.Now())
	if n := f.replay.requests("details", older); n != 2 {
		t.Errorf("%d listing requests for an app crawled the cycle before, want 2", n)
	}
	if n := metricValue(t, reg, "playwatch_crawl_jobs_crawled_already_total", nil); n != 1 {
		t.Errorf("playwatch_crawl_jobs_crawled_already_total = %v, want still 1", n)
	}
}

// A partition dates from when it came to the member (the group's
// assignment), not from its first job: a job planned after that is crawled
// without asking app_crawl_outcomes, even when it is polled long after it
// was planned and its app was crawled meanwhile by other means.
func TestCrawlWorkerDatesAPartitionFromItsAssignment(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 5), nil)
	createTestTopics(t, f.brokers, topicSpec{Partitions: 1, Replication: -1, Retention: time.Hour})
	const pkg = "com.example.kept"
	f.replay.setApp(pkg, replayApp{Reviews: 3})
	f.register(t, pkg, false)
	reg := prometheus.NewRegistry()
	known := newPGKnownReviews(f.pool)
	w := newCrawlWorker(newCrawler(f.crawler.cfg, f.store.client, known, f.pub, reg, testLogger(t)), newLeaseEpochs(f.pool), 2, reg, testLogger(t))
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(f.brokers...)}, w.clientOptions("crawl-assigned", 6*time.Second)...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, cl) }()
	defer func() { cancel(); <-done }()
	var came time.Time
	waitFor(t, 20*time.Second, "crawl-jobs partition 0 assigned", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		came = w.assignedAt[0]
		return !came.IsZero()
	})

	planned := came.Add(2 * crawledAgainMargin)
	time.Sleep(time.Until(planned.Add(2 * crawledAgainMargin)))
	for _, path := range []string{pathStats, pathReviews} {
		if err := known.RecordOutcome(t.Context(), pkg, locale{Lang: "en", Country: "us"}, path, crawlOutcome{At: time.Now(), Outcome: crawlOK}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := crawlJobMessage{CycleID: 3, PlannedAt: messageTime(planned), PackageName: pkg, Lang: "en", Country: "us"}.encode()
	if err != nil {
		t.Fatal(err)
	}
	produce(t, f.brokers, rec(topicCrawlJobs, pkg, b))
	waitFor(t, 20*time.Second, "the job done or skipped", func() bool {
		return metricValue(t, reg, "playwatch_crawl_jobs_done_total", nil)+metricValue(t, reg, "playwatch_crawl_jobs_crawled_already_total", nil) == 1
	})
	if n := metricValue(t, reg, "playwatch_crawl_jobs_crawled_already_total", nil); n != 0 {
		t.Errorf("playwatch_crawl_jobs_crawled_already_total = %v, want 0: the job was planned after the partition came to the member", n)
	}
	if n := f.replay.requests("details", pkg); n != 1 {
		t.Errorf("%d listing requests, want 1", n)
	}
}
