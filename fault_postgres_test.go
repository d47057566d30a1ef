package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PostgreSQL is stopped for 30 s while the storage consumer is busy with a
// steady stream of reviews, then started again on the same data directory.
// The consumer pauses, retries with its production backoff, resumes, and
// stores every review exactly once; no record becomes a dead letter.
func TestFaultPostgresDownWhileConsumerBusy(t *testing.T) {
	requireFaultSuite(t)
	const outage, rate = 30 * time.Second, 2000 // reviews per second
	began := time.Now()
	ctx := context.Background()
	logger := testLogger(t)
	// A cluster of its own, so that the shared test server is not disturbed.
	pg, pool, opts := startDedicatedPostgres(t, tempDataDir(t), true)
	pkgs := []string{"org.telegram.messenger", "com.whatsapp", "org.thoughtcrime.securesms"}
	registerApps(t, pool, pkgs...)
	brokers := newConsumerTestBroker(t)

	cfg, err := loadTestConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	copts := consumerOptionsFrom(cfg) // the production batch size, linger and backoff
	tc := startTestConsumer(t, pool, brokers, copts, consumerHooks{})

	// The stream: every 50 ms a tenth of a second's worth of new reviews,
	// spread over three apps (so over every partition), until stopped.
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	var sent atomic.Int64
	stopStream, streamDone := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopStream:
				streamDone <- nil
				return
			case <-tick.C:
			}
			recs := make([]*kgo.Record, rate/20)
			for i := range recs {
				n := sent.Add(1)
				pkg := pkgs[n%int64(len(pkgs))]
				recs[i] = rec(topicReviews, pkg, msgJSON(reviewFields(pkg, fmt.Sprintf("pg-outage-%d", n), testCrawl)))
			}
			if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				streamDone <- err
				return
			}
		}
	}()
	// -1 while the database cannot answer.
	stored := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM reviews`).Scan(&n); err != nil {
			return -1
		}
		return n
	}

	waitFor(t, 30*time.Second, "the consumer to store 5000 reviews", func() bool { return stored() >= 5000 })
	before := stored()
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	waitFor(t, 20*time.Second, "the consumer to pause", func() bool {
		return metricValue(t, tc.reg, "playwatch_consumer_paused", nil) == 1
	})
	// Real time: the consumer's backoff grows to its 10 s cap meanwhile.
	time.Sleep(outage - time.Since(down))
	startTestManagedPostgres(t, opts, logger)
	up, backlog := time.Now(), int(sent.Load())
	waitFor(t, 30*time.Second, "the consumer to resume", func() bool {
		return metricValue(t, tc.reg, "playwatch_consumer_paused", nil) == 0
	})
	resumed := time.Now()
	// The stream goes on until the consumer has caught up with what came
	// during the outage, then stops.
	waitFor(t, 30*time.Second, "the outage's backlog to be stored", func() bool { return stored() >= backlog })
	close(stopStream)
	if err := <-streamDone; err != nil {
		t.Fatalf("the stream: %v", err)
	}
	total := int(sent.Load())
	waitFor(t, time.Minute, fmt.Sprintf("all %d reviews", total), func() bool { return stored() == total })
	if err := tc.stop(); err != nil {
		t.Fatalf("consumer: %v", err)
	}

	if n := stored(); n != total {
		t.Errorf("%d reviews stored, %d sent", n, total)
	}
	if n := count(t, pool, `SELECT count(DISTINCT review_id) FROM reviews`); n != total {
		t.Errorf("%d distinct review ids stored, %d sent", n, total)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters after a database outage, want 0", n)
	}
	if n := count(t, pool, `SELECT sum(next_offset) FROM consumer_offsets WHERE topic = 'reviews'`); n != total {
		t.Errorf("stored offsets sum to %d, want %d", n, total)
	}
	if n := endOffsets(t, brokers, topicReviews); n != int64(total) {
		t.Errorf("the topic holds %d records, %d were sent", n, total)
	}
	blocked := metricValue(t, tc.reg, "playwatch_consumer_db_blocked_seconds_total", nil)
	if min := (outage - 5*time.Second).Seconds(); blocked < min {
		t.Errorf("blocked seconds = %.1f, want at least %.0f", blocked, min)
	}
	errs := map[string]float64{}
	for _, kind := range []string{"transient", "data", "blocked"} {
		errs[kind] = metricValue(t, tc.reg, "playwatch_consumer_db_errors_total", map[string]string{"kind": kind})
	}
	if errs["transient"] < 1 || errs["data"] != 0 {
		t.Errorf("database errors by kind %v: want transient ones only", errs)
	}
	t.Logf("%d reviews stored before the outage, %d in all; database down %s, consumer resumed %s after the restart, blocked %.1f s; errors %v; took %s",
		before, total, up.Sub(down).Round(time.Millisecond), resumed.Sub(up).Round(time.Millisecond), blocked, errs,
		time.Since(began).Round(time.Millisecond))
}

// The 20-round version of TestManagedPostgresRestartRightAfterKill.
func TestFaultPostgresRestartRightAfterKill(t *testing.T) {
	requireFaultSuite(t)
	restartRightAfterKill(t, 20)
}
