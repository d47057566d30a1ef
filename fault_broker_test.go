package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// detailsHook runs fn once, before the store listing of pkg is read: a
// fault that starts at a known point in the middle of a cycle.
type detailsHook struct {
	storeReader
	pkg  string
	fn   func()
	once sync.Once
}

func (h *detailsHook) Details(ctx context.Context, pkg, lang, country string) (appDetails, error) {
	if pkg == h.pkg {
		h.once.Do(h.fn)
	}
	return h.storeReader.Details(ctx, pkg, lang, country)
}

// The embedded broker goes away in the middle of a cycle for longer than
// every retry of the producer, then comes back on the same address and data
// directory. The app being crawled when it went fails closed on both paths
// instead of stalling the cycle, the apps after it go through, nothing is on
// a topic twice, and the next cycle fills the gap; the storage consumer,
// which lost the broker too, stores exactly what the topics hold.
func TestFaultBrokerOutageMidCycle(t *testing.T) {
	requireFaultSuite(t)
	const apps, reviewsPerApp, outageApp = 8, 150, 3
	began := time.Now()
	ctx := context.Background()
	logger := testLogger(t)
	dir := t.TempDir()
	startBroker := func(addr string) (*embeddedBroker, error) {
		return startEmbeddedBroker(embeddedBrokerOptions{Addr: addr, DataDir: dir, RetentionCheck: time.Minute}, logger)
	}
	b, err := startBroker("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	brokers := b.Addrs()
	createTestTopics(t, brokers, topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})

	pool := newTestPool(t)
	registry := newAppStore(pool)
	replay := newReplayPlayStore(t)
	pkgs := make([]string, apps)
	for i := range pkgs {
		pkgs[i] = fmt.Sprintf("com.example.outage%d", i)
		replay.setApp(pkgs[i], replayApp{Reviews: reviewsPerApp})
		if _, err := registry.Create(ctx, newApp{PackageName: pkgs[i]}); err != nil {
			t.Fatal(err)
		}
	}
	// Test-sized producer: records fail after 1 s, their resends come 300 ms
	// apart, and a send waits 2 s for confirmations.
	settings := producerSettings{Acks: "all", Idempotent: true, Retries: 5, RetryBackoff: 100 * time.Millisecond,
		RequestTimeout: time.Second, DeliveryTimeout: time.Second, AppRetryDelays: []time.Duration{300 * time.Millisecond, 300 * time.Millisecond}}
	pub := newTestPublisher(t, brokers, settings)
	failedClosed := func(topic string) float64 { return testutil.ToFloat64(pub.metrics.failedClosed.WithLabelValues(topic)) }

	// One worker crawls the apps in registration order, so every app before
	// the outage app is confirmed before the broker goes.
	down := make(chan time.Time, 1)
	hook := &detailsHook{storeReader: newRealTimePlayStore(t, replay.URL).client, pkg: pkgs[outageApp], fn: func() {
		b.Close()
		down <- time.Now()
	}}
	// Every cycle reads every review: the checks count them per cycle.
	ccfg := testCrawlerConfig(1, reviewsPerApp)
	ccfg.FullSyncInterval = 0
	cr := newCycleCrawler(ccfg, registry, hook, newPGKnownReviews(pool), pub, prometheus.NewRegistry(), logger)
	opts := testConsumerOptions()
	tc := startTestConsumer(t, pool, brokers, opts, consumerHooks{})

	// The broker comes back once the outage app's reviews have failed
	// closed: the outage outlasted every retry of both its paths. A crawl
	// that waits for the broker instead gets it back after 30 s.
	type restart struct {
		b          *embeddedBroker
		outage     time.Duration
		failedOver bool // the reviews failed closed during the outage
		err        error
	}
	restarted := make(chan restart, 1)
	go func() {
		wentDown := <-down
		deadline := wentDown.Add(30 * time.Second)
		for failedClosed(topicReviews) < 1 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		failedOver := failedClosed(topicReviews) >= 1
		b2, err := startBroker(brokers[0])
		restarted <- restart{b: b2, outage: time.Since(wentDown), failedOver: failedOver, err: err}
	}()

	sum1, err := cr.RunCycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var r restart
	select {
	case r = <-restarted:
	case <-time.After(time.Minute):
		t.Fatal("the broker was never restarted")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(r.b.Close)
	t.Logf("cycle 1 with a %s broker outage: %s", r.outage.Round(time.Millisecond), sum1)
	if !r.failedOver {
		t.Fatalf("the crawl waited for the broker for %s instead of failing closed", r.outage.Round(time.Millisecond))
	}
	wantFailures := map[string]int{"stats/publish_failed": 1, "reviews/publish_failed": 1}
	if sum1.StatsOK != apps-1 || sum1.ReviewsOK != apps-1 || sum1.Reviews != (apps-1)*reviewsPerApp ||
		fmt.Sprint(sum1.Failures) != fmt.Sprint(wantFailures) {
		t.Fatalf("cycle 1: %s; want app_stats and reviews %d/%d, %d review messages, failures %v",
			sum1, apps-1, apps, (apps-1)*reviewsPerApp, wantFailures)
	}
	if s, r := failedClosed(topicAppStats), failedClosed(topicReviews); s != 1 || r != 1 {
		t.Errorf("failed closed: app-stats %v, reviews %v; want 1 each", s, r)
	}

	sum2, err := cr.RunCycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cycle 2: %s", sum2)
	if sum2.StatsOK != apps || sum2.ReviewsOK != apps || sum2.Reviews != apps*reviewsPerApp || len(sum2.Failures) != 0 {
		t.Fatalf("cycle 2: %s; want every app on both paths", sum2)
	}

	// Every other app is on the topics once per cycle. The outage app's
	// cycle-1 records are there once or not at all: the client keeps what
	// it sent to the vanished broker and delivers it, without duplicates,
	// when the broker is back.
	tt := tallyTopics(t, brokers)
	late := pkgs[outageApp]
	for _, pkg := range pkgs {
		if pkg == late {
			continue
		}
		if tt.statsOf[pkg] != 2 || tt.reviewsOf[pkg] != 2*reviewsPerApp {
			t.Errorf("%s: %d app-stats and %d reviews records, want 2 and %d", pkg, tt.statsOf[pkg], tt.reviewsOf[pkg], 2*reviewsPerApp)
		}
	}
	lateStats, lateReviews := tt.statsOf[late]-1, tt.reviewsOf[late]-reviewsPerApp
	if (lateStats != 0 && lateStats != 1) || (lateReviews != 0 && lateReviews != reviewsPerApp) {
		t.Errorf("the outage app has %d app-stats and %d reviews records, want 1 or 2 and %d or %d",
			tt.statsOf[late], tt.reviewsOf[late], reviewsPerApp, 2*reviewsPerApp)
	}
	t.Logf("delivered after the outage, from the cycle-1 sends that failed closed: %d app-stats, %d reviews", lateStats, lateReviews)
	if tt.distinctReviews() != apps*reviewsPerApp || tt.byApp[late] != reviewsPerApp {
		t.Errorf("%d distinct reviews (%d of the outage app), want %d (%d)",
			tt.distinctReviews(), tt.byApp[late], apps*reviewsPerApp, reviewsPerApp)
	}
	waitStored(t, time.Minute, brokers, pool, opts.Group)
	checkTopicsMatchDatabase(t, tt, pool)
	if n, want := count(t, pool, `SELECT count(*) FROM app_stats`), 2*apps-1+lateStats; n != want {
		t.Errorf("%d app_stats rows, want %d", n, want)
	}
	if n, want := count(t, pool, `SELECT count(*) FROM reviews`), apps*reviewsPerApp; n != want {
		t.Errorf("%d reviews rows, want %d", n, want)
	}
	if err := tc.stop(); err != nil {
		t.Errorf("consumer: %v", err)
	}
	t.Logf("residual resends: app-stats %v, reviews %v; took %s",
		testutil.ToFloat64(pub.metrics.residualRetries.WithLabelValues(topicAppStats)),
		testutil.ToFloat64(pub.metrics.residualRetries.WithLabelValues(topicReviews)), time.Since(began).Round(time.Millisecond))
}
