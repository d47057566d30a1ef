package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// buildPlaywatch builds the binary into a temp dir.
func buildPlaywatch(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "playwatch")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// appliance is `playwatch run` as a child process of the test.
type appliance struct {
	cmd    *exec.Cmd
	base   string        // http://PLAYWATCH_HTTP_ADDR
	exited chan struct{} // closed when the process has been reaped
	err    error         // its exit status, once exited
}

// startAppliance starts `playwatch run args...` with env, its output
// appended to logPath, and waits until /readyz answers 200.
func startAppliance(t *testing.T, bin string, env map[string]string, logPath string, args ...string) *appliance {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	fmt.Fprintf(logFile, "==== playwatch run %s\n", strings.Join(args, " "))
	a := &appliance{cmd: exec.Command(bin, append([]string{"run"}, args...)...), base: "http://" + env["PLAYWATCH_HTTP_ADDR"], exited: make(chan struct{})}
	a.cmd.Env = os.Environ()
	for k, v := range env {
		a.cmd.Env = append(a.cmd.Env, k+"="+v)
	}
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = childProcAttr(false)
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		a.err = a.cmd.Wait()
		close(a.exited)
	}()
	t.Cleanup(func() {
		if a.running() {
			a.cmd.Process.Kill()
			<-a.exited
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if resp, err := http.Get(a.base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return a
			}
		}
		if !a.running() {
			t.Fatalf("playwatch run exited during start-up: %v\n%s", a.err, fileTail(logPath, 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("playwatch run not ready after 2 minutes\n%s", fileTail(logPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *appliance) running() bool {
	select {
	case <-a.exited:
		return false
	default:
		return true
	}
}

// stop sends sig and waits for the process to exit; it returns the exit status.
func (a *appliance) stop(t *testing.T, sig syscall.Signal, timeout time.Duration) error {
	t.Helper()
	if a.running() {
		if err := a.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-a.exited:
		return a.err
	case <-time.After(timeout):
		t.Fatalf("playwatch run did not exit within %s of %v", timeout, sig)
		return nil
	}
}

// metric scrapes the appliance's /metrics (see scrapeMetric).
func (a *appliance) metric(t *testing.T, name, labels string) float64 {
	t.Helper()
	return scrapeMetric(t, a.base, name, labels)
}

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
	env := map[string]string{
		"PLAYWATCH_DATA_DIR":    dataDir,
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
		"DATABASE_URL":          "",
		"KAFKA_BROKERS":         "",
		"PLAYSTORE_URL":         replay.URL,
		// The crawl is paced by the default minimum gap of 1 s between
		// two requests of an egress: two per app, a cycle of 24 s.
		"RATE_LIMIT_REQUESTS":       "0",
		"REVIEWS_PER_APP":           strconv.Itoa(reviewsPerApp),
		"CRAWL_WORKERS":             "3",
		"CRAWL_INTERVAL":            "1h",
		"CONSUMER_MAX_POLL_RECORDS": "500",
		// Run 3 reads every review again, as the checks expect.
		"REVIEWS_FULL_SYNC_INTERVAL": "0s",
	}
	defer func() {
		if t.Failed() {
			t.Logf("playwatch log:\n%s", fileTail(logPath, 80))
		}
	}()

	// Run 1 registers the apps over HTTP; the cycle at the start of run 2
	// crawls them.
	a := startAppliance(t, bin, env, logPath, "--roles", "registry")
	for i := range apps {
		pkg := fmt.Sprintf("com.example.killed%02d", i)
		replay.setApp(pkg, replayApp{Reviews: reviewsPerApp})
		if code, body := httpDo(t, "POST", a.base+"/api/v1/apps", fmt.Sprintf(`{"package_name":%q}`, pkg)); code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", pkg, code, body)
		}
	}
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
	cfg, err := loadTestConfig(map[string]string{"PLAYWATCH_DATA_DIR": dataDir})
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _, err = attachedConfig(cfg); err != nil {
		t.Fatal(err)
	}
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
