package main

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The whole appliance (crawler, embedded broker, managed PostgreSQL, storage
// consumer) is killed with SIGKILL in the middle of a crawl cycle and started
// again on the same data directory, which finishes the cycle. Every record the broker acknowledged
// reaches PostgreSQL exactly once: once the consumer has drained the topics,
// their distinct records and the rows are the same, and no record is on a
// topic twice.
func TestFaultApplianceKilledMidCycle(t *testing.T) {
	requireFaultSuite(t)
	const apps, reviewsPerApp = 12, 150
	began := time.Now()
	bin := buildPlaywatch(t)
	t.Logf("go build took %s", time.Since(began).Round(time.Millisecond))
	replay := newReplayPlayStore(t)
	dataDir := filepath.Join(tempDataDir(t), "data")
	logPath := filepath.Join(t.TempDir(), "playwatch.log")
	env := managedApplianceEnv(t, dataDir, map[string]string{
		"PLAYSTORE_URL": replay.URL,
		// The crawl is paced by the default minimum gap of 1 s between
		// two requests of an egress: two per app, a cycle of 24 s.
		"RATE_LIMIT_REQUESTS":       "0",
		"REVIEWS_PER_APP":           strconv.Itoa(reviewsPerApp),
		"CRAWL_WORKERS":             "3",
		"CRAWL_INTERVAL":            "1h",
		"CONSUMER_MAX_POLL_RECORDS": "500",
		// Run 3 reads every review again, as the checks expect.
		"REVIEWS_FULL_SYNC_INTERVAL": "0s",
	})
	logApplianceOnFailure(t, logPath, 80)

	// Run 1 registers the apps over HTTP; the cycle at the start of run 2
	// crawls them.
	a := startAppliance(t, bin, env, logPath, "--roles", "registry")
	registerReplayApps(t, replay, a.base, "killed", apps, reviewsPerApp)
	if err := a.stop(t, syscall.SIGTERM, time.Minute); err != nil {
		t.Fatalf("run 1 exited with %v", err)
	}

	// Run 2 is killed once a third of the cycle's reviews are confirmed.
	runStart := time.Now()
	a = startAppliance(t, bin, env, logPath)
	var confirmed, stored float64
	waitFor(t, time.Minute, "a third of the reviews confirmed", func() bool {
		confirmed = a.metric(t, "playwatch_publish_messages_produced_total", `topic="reviews"`)
		return confirmed >= apps*reviewsPerApp/3
	})
	stored = a.metric(t, "playwatch_consumer_rows_written_total", `table="reviews"`)
	if err := a.stop(t, syscall.SIGKILL, 30*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("run 2 exited with %v, want killed", err)
	}
	killedAt := time.Now()
	t.Logf("killed run 2 %s after its start with %v of %d reviews confirmed and %v review rows stored",
		killedAt.Sub(runStart).Round(time.Millisecond), confirmed, apps*reviewsPerApp, stored)

	// Run 3 finishes run 2's cycle: it crawls the jobs run 2 had not
	// committed, at the cycle's planned time; the consumer resumes from the
	// offsets stored with the rows.
	a = startAppliance(t, bin, env, logPath)
	t.Logf("run 3 ready %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	waitFor(t, 2*time.Minute, "run 3 to finish the cycle", func() bool {
		return a.metric(t, "playwatch_crawl_cycles_total", "") == 1
	})
	redone := a.metric(t, "playwatch_crawl_app_paths_total", `outcome="ok",path="reviews"`)
	if redone < 1 || redone > apps {
		t.Errorf("run 3 crawled the reviews of %v apps, want those of the jobs run 2 left, 1 to %d", redone, apps)
	}
	cfg := attachedTestConfig(t, dataDir)
	pool, err := pgxpool.New(context.Background(), cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	drainStart := time.Now()
	waitStored(t, 2*time.Minute, cfg.KafkaBrokers, pool, cfg.ConsumerGroup)
	t.Logf("consumer drained %s after run 3's cycle", time.Since(drainStart).Round(time.Millisecond))

	tt := tallyTopics(t, cfg.KafkaBrokers)
	// Run 2's confirmed reviews survived the kill.
	if got := tt.records - len(tt.stats); float64(got) < confirmed {
		t.Errorf("%d review records on the topic, but %v were confirmed before the kill", got, confirmed)
	}
	// A job run 2 crawled but had not committed is crawled again at the
	// same crawled_at: on the topics twice, in the tables once.
	for k := range tt.stats {
		tt.stats[k] = 1
	}
	for k := range tt.reviews {
		tt.reviews[k] = 1
	}
	checkTopicsMatchDatabase(t, tt, pool)
	if n := count(t, pool, `SELECT count(*) FROM reviews`); n != apps*reviewsPerApp {
		t.Errorf("%d reviews rows, want %d", n, apps*reviewsPerApp)
	}
	if n := count(t, pool, `SELECT count(*) FROM app_stats`); n != apps {
		t.Errorf("%d app_stats rows for %d app-stats records; want one per app for the one cycle", n, len(tt.stats))
	}
	t.Logf("topics: %d records (%d app-stats, %d distinct reviews); database: the same, no dead letters",
		tt.records, len(tt.stats), tt.distinctReviews())
	pool.Close()
	if err := a.stop(t, syscall.SIGTERM, time.Minute); err != nil {
		t.Errorf("run 3 exited with %v after SIGTERM", err)
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}
