package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produceSync writes n keyed records to topic and waits for their acks.
func produceSync(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%5)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	produce(t, brokers, recs...)
}

// What the embedded broker acknowledged survives a restart from its DataDir.
func TestEmbeddedBrokerKeepsRecordsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	b1, err := startEmbeddedBroker(embeddedBrokerOptions{Addr: "127.0.0.1:0", DataDir: dir, RetentionCheck: time.Minute}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := b1.Addrs()[0]
	createTestTopics(t, b1.Addrs(), topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	produceSync(t, b1.Addrs(), topicReviews, 100)
	b1.Close()

	b2, err := startEmbeddedBroker(embeddedBrokerOptions{Addr: addr, DataDir: dir, RetentionCheck: time.Minute}, testLogger(t))
	if err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	defer b2.Close()
	// Creating the topics again is a no-op.
	createTestTopics(t, b2.Addrs(), topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	recs := consumeAll(t, b2.Addrs(), topicReviews, 100)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Value)] = true
	}
	if len(recs) != 100 || len(seen) != 100 {
		t.Fatalf("after restart: %d records, %d distinct, want 100", len(recs), len(seen))
	}
}

// brokerReadyz is /readyz's status and its broker check.
func brokerReadyz(t *testing.T, base string) (int, string) {
	t.Helper()
	code, body := httpDo(t, "GET", base+"/readyz", "")
	var r struct {
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	return code, r.Checks["broker"]
}

// produceValues writes one record per value, each padded to 4 KiB, and
// returns the values the broker acknowledged and the first error.
func produceValues(t *testing.T, brokers []string, topic string, values ...string) ([]string, error) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordDeliveryTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, v := range values {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(v), Value: []byte(v + "\n" + strings.Repeat(".", 4<<10))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var acked []string
	results := cl.ProduceSync(ctx, recs...)
	for _, r := range results {
		if r.Err == nil {
			acked = append(acked, string(r.Record.Key))
		}
	}
	return acked, results.FirstErr()
}

func numbered(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// A broker that cannot write its files is not ready: /readyz answers 503
// naming the failure while it lasts, a metric counts the failed writes, and
// a produce fails instead of being acknowledged. Once the broker can write
// again /readyz answers 200, and exactly the acknowledged records are there,
// also after a restart. Read-only: the directory made immutable (chattr, as
// root ignores permissions); disk full: a 1 MiB tmpfs filled up.
func TestEmbeddedBrokerWriteFailureMakesItUnready(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		skipOrFailUnderCI(t, "needs root: chattr and mount")
	}
	t.Run("read-only", func(t *testing.T) {
		if _, err := exec.LookPath("chattr"); err != nil {
			skipOrFailUnderCI(t, "chattr is not on PATH (Debian: apt-get install e2fsprogs)")
		}
		chattr := func(flag, dir string) error {
			if out, err := exec.Command("chattr", "-R", flag, dir).CombinedOutput(); err != nil {
				return fmt.Errorf("chattr -R %s %s: %v %s", flag, dir, err, out)
			}
			return nil
		}
		probe := t.TempDir()
		if err := chattr("+i", probe); err != nil {
			skipOrFailUnderCI(t, "the file system of the temp dir has no immutable flag: %v", err)
		}
		if err := chattr("-i", probe); err != nil {
			t.Fatal(err)
		}
		checkBrokerWriteFailure(t, func(dir string) (fail, fix func() error) {
			t.Cleanup(func() { chattr("-i", dir) })
			return func() error { return chattr("+i", dir) }, func() error { return chattr("-i", dir) }
		})
	})
	t.Run("disk full", func(t *testing.T) {
		checkBrokerWriteFailure(t, func(dir string) (fail, fix func() error) {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
				skipOrFailUnderCI(t, "mount a tmpfs: %v %s", err, out)
			}
			t.Cleanup(func() { exec.Command("umount", dir).Run() })
			filler := filepath.Join(dir, "filler")
			return func() error {
					err := os.WriteFile(filler, make([]byte, 2<<20), 0o600)
					if !errors.Is(err, syscall.ENOSPC) {
						return fmt.Errorf("filling the tmpfs: %v, want ENOSPC", err)
					}
					return nil
				}, func() error {
					return os.Remove(filler)
				}
		})
	})
}

// checkBrokerWriteFailure runs the appliance; prepare gets its broker
// directory before the start and returns how to break and mend its writes.
func checkBrokerWriteFailure(t *testing.T, prepare func(brokerDir string) (fail, fix func() error)) {
	dataDir := filepath.Join(t.TempDir(), "data")
	fail, fix := prepare(filepath.Join(dataDir, "broker"))
	env := map[string]string{
		"DATABASE_URL":          newTestDatabase(t),
		"PLAYWATCH_DATA_DIR":    dataDir,
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
	}
	base, stop, logs := startRun(t, env, "--roles", "registry")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("playwatch run:\n%s", logs)
		}
	})
	brokers := []string{env["PLAYWATCH_BROKER_ADDR"]}
	acked, err := produceValues(t, brokers, topicAppStats, numbered("before", 20)...)
	if err != nil {
		t.Fatal(err)
	}
	if code, check := brokerReadyz(t, base); code != http.StatusOK {
		t.Fatalf("/readyz before the failure: %d %q", code, check)
	}

	if err := fail(); err != nil {
		t.Fatal(err)
	}
	during, err := produceValues(t, brokers, topicAppStats, numbered("during", 50)...)
	if err == nil {
		t.Error("every record was acknowledged while the broker could not write")
	}
	t.Logf("produce during the failure: %d of 50 acknowledged, %v", len(during), err)
	acked = append(acked, during...)
	code, check := brokerReadyz(t, base)
	if code != http.StatusServiceUnavailable || !strings.Contains(check, "cannot write") {
		t.Errorf("/readyz while the broker cannot write: %d, broker %q; want 503 naming the write failure", code, check)
	}
	t.Logf("/readyz while the broker cannot write: %d, broker: %s", code, check)
	if n := scrapeMetric(t, base, "playwatch_broker_persist_failures_total", ""); n < 1 {
		t.Errorf("playwatch_broker_persist_failures_total = %v, want at least 1", n)
	}

	if err := fix(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "/readyz to answer 200 once the broker can write", func() bool {
		code, _ := brokerReadyz(t, base)
		return code == http.StatusOK
	})
	after, err := produceValues(t, brokers, topicAppStats, numbered("after", 20)...)
	if err != nil {
		t.Fatalf("produce once the broker can write again: %v", err)
	}
	acked = append(acked, after...)
	checkValues := func(when string) {
		got := map[string]int{}
		for _, r := range consumeAll(t, brokers, topicAppStats, int(endOffsets(t, brokers, topicAppStats))) {
			got[string(r.Key)]++
		}
		for _, v := range acked {
			if got[v] != 1 {
				t.Errorf("%s: acknowledged record %s is there %d times", when, v, got[v])
			}
		}
		if len(got) != len(acked) {
			t.Errorf("%s: %d distinct records on the topic, want the %d acknowledged ones", when, len(got), len(acked))
		}
	}
	checkValues("after the failure")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	_, stop, _ = startRun(t, env, "--roles", "registry")
	checkValues("after a restart")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A failed write the probe did not see (a disk with room for the probe but
// not for a batch) keeps the broker unready for a while; one the probe saw
// too is over once the probe succeeds.
func TestBrokerWritesHoldAFailureTheProbeMissed(t *testing.T) {
	w := &brokerWrites{failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})}
	if err := w.recent(); err != nil {
		t.Fatalf("no failure yet: %v", err)
	}
	w.failed("persist batch reviews-0: write: no space left on device")
	if err := w.recent(); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("just after a failed write: %v", err)
	}
	w.probeFailed()
	if err := w.recent(); err != nil {
		t.Fatalf("after a failed probe that saw the cause: %v", err)
	}
	w.failed("persist batch reviews-1: write: no space left on device")
	if err := w.recent(); err == nil || !strings.Contains(err.Error(), "2 failed writes") {
		t.Fatalf("a failure after the probe's: %v", err)
	}
	w.at = time.Now().Add(-brokerWriteFailureHold)
	if err := w.recent(); err != nil {
		t.Fatalf("%s after the last failure: %v", brokerWriteFailureHold, err)
	}
	if n := testutil.ToFloat64(w.failures); n != 2 {
		t.Errorf("counted %v failures, want 2", n)
	}
}
