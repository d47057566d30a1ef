package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PostgreSQL stops in the middle of a batch transaction and comes back on
// the same data directory: the consumer pauses, retries, resumes, and every
// record is stored once, none dead-lettered. A dedicated cluster, so that
// the shared test server is not disturbed.
func TestConsumerSurvivesPostgresRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logger := testLogger(t)
	dataDir := tempDataDir(t) // laid out like $PLAYWATCH_DATA_DIR
	// This test plays the appliance that owns the data directory.
	holdDataDir(t, dataDir)
	pg, pool, opts := startDedicatedPostgres(t, dataDir, true)

	brokers := newConsumerTestBroker(t)
	const pkg, n = "org.telegram.messenger", 2000
	registerApps(t, pool, pkg)
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, rec(topicReviews, pkg, msgJSON(reviewFields(pkg, fmt.Sprintf("r%d", i), testCrawl))))
	}
	produce(t, brokers, recs...)

	// The fifth batch transaction waits inside, before COMMIT, until the
	// server is down.
	inside, serverDown := make(chan struct{}), make(chan struct{})
	batches := 0
	copts := testConsumerOptions()
	copts.MaxPollRecords = 100
	tc := startTestConsumer(t, pool, brokers, copts, consumerHooks{beforeCommit: func(context.Context) error {
		if batches++; batches == 5 {
			close(inside)
			<-serverDown
		}
		return nil
	}})
	select {
	case <-inside:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not get to its fifth batch")
	}
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	close(serverDown)
	waitFor(t, 20*time.Second, "the consumer to pause", func() bool {
		return metricValue(t, tc.reg, "playwatch_consumer_paused", nil) == 1
	})
	pg = startTestManagedPostgres(t, opts, logger)
	waitFor(t, 30*time.Second, "every review", func() bool {
		var c int
		return pool.QueryRow(ctx, `SELECT count(*) FROM reviews`).Scan(&c) == nil && c == n
	})
	waitFor(t, 10*time.Second, "the consumer to resume", func() bool {
		return metricValue(t, tc.reg, "playwatch_consumer_paused", nil) == 0
	})
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	if c := count(t, pool, `SELECT count(*) FROM dead_letter_events`); c != 0 {
		t.Errorf("%d dead letters after a database restart, want 0", c)
	}
	if c := count(t, pool, `SELECT sum(next_offset) FROM consumer_offsets WHERE topic = 'reviews'`); c != n {
		t.Errorf("stored offsets sum to %d, want %d", c, n)
	}
	if v := metricValue(t, tc.reg, "playwatch_consumer_db_blocked_seconds_total", nil); v <= 0 {
		t.Errorf("blocked seconds = %v, want > 0", v)
	}
	if v := metricValue(t, tc.reg, "playwatch_consumer_db_errors_total", map[string]string{"kind": "transient"}); v < 1 {
		t.Errorf("transient errors = %v, want at least 1", v)
	}

	// The dlq tools attach to the managed server of a running appliance, as
	// this test publishes it, instead of taking its data directory over.
	unpublish, err := publishRunning(dataDir, runningPlaywatch{PID: os.Getpid(), Version: version, DatabaseURL: pg.DSN(), Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer unpublish()
	var out bytes.Buffer
	env := map[string]string{"PLAYWATCH_DATA_DIR": dataDir, "LOG_LEVEL": "warn"}
	if err := run(ctx, []string{"dlq", "list"}, envFunc(env), &out, io.Discard); err != nil || !strings.Contains(out.String(), "0 dead letters") {
		t.Errorf("dlq list beside the running server: %v\n%s", err, out.String())
	}
	if err := pool.Ping(ctx); err != nil {
		t.Errorf("the server is gone after dlq list: %v", err)
	}
}
