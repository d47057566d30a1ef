package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// peakRSS is a process's VmHWM from /proc, in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var n int64
	// The broker deletes segments meanwhile: a file gone is not counted.
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		if info, err := d.Info(); err == nil {
			n += info.Size()
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The appliance with a 32 MiB broker budget is fed twice its budget of
// review-sized records while its consumer stores them. Its broker keeps at
// most the budget plus a segment per partition on disk, and a restart, after
// a clean stop and after kill -9 (when kfake reads every partition whole),
// peaks below the budget plus 150 MB.
func TestFaultBrokerBudgetBoundsDiskAndRestartMemory(t *testing.T) {
	requireFaultSuite(t)
	const budget = 32 << 20
	const partitions, apps = 9, 30 // 3 topics of 3 partitions
	segment := budget / 256
	bin := buildPlaywatch(t)
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	var pkgs []string
	for i := range apps {
		pkgs = append(pkgs, fmt.Sprintf("com.example.fill%02d", i))
	}
	registerApps(t, pool, pkgs...)
	dataDir := filepath.Join(t.TempDir(), "data")
	brokerDir := filepath.Join(dataDir, "broker")
	logPath := filepath.Join(t.TempDir(), "playwatch.log")
	env := managedApplianceEnv(t, dataDir, map[string]string{"DATABASE_URL": dbURL, "PLAYWATCH_BROKER_MAX_BYTES": "32MiB"})
	logApplianceOnFailure(t, logPath, 60)
	a := startAppliance(t, bin, env, logPath, "--roles", "registry,consumer")
	brokers := []string{env["PLAYWATCH_BROKER_ADDR"]}

	// Review messages with 600 random characters of content: about what
	// a real review weighs, and as incompressible.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	began := time.Now()
	var sent int64
	for i := 0; sent < 2*budget; i++ {
		var recs []*kgo.Record
		for j := range 2000 {
			raw := make([]byte, 450)
			rand.Read(raw)
			content := base64.StdEncoding.EncodeToString(raw)
			m := reviewMessage{PackageName: pkgs[(i*2000+j)%apps], ReviewID: fmt.Sprintf("gp:fill-%d-%d", i, j),
				Content: &content, At: began, CrawledAt: began}
			b, err := m.encodeJSON()
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, &kgo.Record{Topic: topicReviews, Key: []byte(m.PackageName), Value: b})
			sent += int64(len(b))
		}
		if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// 600 random characters are about 600 distinct trigrams a review for the
	// search index (migration 15), far more than a real review's: storing
	// them is slow, and this test is about the broker's bytes, not speed.
	waitStored(t, 8*time.Minute, brokers, pool, testConsumerOptions().Group)
	t.Logf("produced %d MiB of reviews; stored %d rows %s after the start", sent>>20,
		count(t, pool, `SELECT count(*) FROM reviews`), time.Since(began).Round(time.Millisecond))

	diskBound := int64(budget + partitions*segment + 1<<20) // and 1 MiB for indexes and state files
	waitFor(t, 30*time.Second, "the broker to trim to its budget", func() bool { return dirBytes(t, brokerDir) <= diskBound })
	t.Logf("broker directory: %d KiB (bound %d KiB); peak RSS while filling %d MiB",
		dirBytes(t, brokerDir)>>10, diskBound>>10, peakRSS(t, a.cmd.Process.Pid)>>20)

	memBound := int64(budget + 150e6)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		_ = a.stop(t, sig, time.Minute)
		a = startAppliance(t, bin, env, logPath, "--roles", "registry,consumer")
		time.Sleep(2 * time.Second)
		rss, disk := peakRSS(t, a.cmd.Process.Pid), dirBytes(t, brokerDir)
		t.Logf("restart after %v: peak RSS %d MiB (bound %d MiB), broker directory %d KiB", sig, rss>>20, memBound>>20, disk>>10)
		if rss > memBound {
			t.Errorf("restart after %v: peak RSS %d MiB, over the budget + 150 MB (%d MiB)", sig, rss>>20, memBound>>20)
		}
		if disk > diskBound {
			t.Errorf("restart after %v: broker directory %d KiB, over the budget + a segment per partition (%d KiB)", sig, disk>>10, diskBound>>10)
		}
	}
	if err := a.stop(t, syscall.SIGTERM, time.Minute); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// The appliance with a 1 MiB broker budget crawls while no storage consumer
// runs. Once the reviews nobody has stored fill a partition's share, the
// crawl waits instead of publishing (a metric and a log line say so), and
// the broker trims none of them. When a consumer starts, the crawl goes on,
// every review is stored, and the broker then trims the stored records to
// the share. About half a minute: in the fault suite.
func TestFaultBrokerBudgetHoldsTheCrawlUntilTheConsumerStores(t *testing.T) {
	requireFaultSuite(t)
	const apps, reviewsPerApp = 12, 1500
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	replay := newReplayPlayStore(t)
	var pkgs []string
	for i := range apps {
		pkg := fmt.Sprintf("com.example.budget%d", i)
		replay.setApp(pkg, replayApp{Reviews: reviewsPerApp})
		pkgs = append(pkgs, pkg)
	}
	registerApps(t, pool, pkgs...)
	env := applianceEnv(t, filepath.Join(t.TempDir(), "data"), map[string]string{
		"DATABASE_URL":               dbURL,
		"PLAYWATCH_BROKER_MAX_BYTES": "1MiB",
		"PLAYSTORE_URL":              replay.URL,
		"RATE_LIMIT_REQUESTS":        "0",
		"EGRESS_MIN_GAP":             "0s",
		"REVIEWS_PER_APP":            fmt.Sprint(reviewsPerApp),
		"CRAWL_WORKERS":              "1",
	})
	base, stop, logs := startRun(t, env, "--roles", "registry,crawler")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("playwatch run:\n%s", logs)
		}
	})
	brokers := []string{env["PLAYWATCH_BROKER_ADDR"]}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	share := int64(1<<20) / 16 * 8 / 3 // reviews: 8 of 16 parts (raw-pages has 6), over 3 partitions

	waitFor(t, 60*time.Second, "the crawl to wait for room on the broker", func() bool {
		return scrapeMetric(t, base, "playwatch_publish_backpressure_waits_total", `topic="reviews"`) >= 1
	})
	// A whole trim pass has run since the share filled up (the second to
	// end from now began after it): it deleted nothing.
	passes := scrapeMetric(t, base, "playwatch_broker_trim_passes_total", "")
	waitFor(t, 30*time.Second, "a trim pass over the full partitions", func() bool {
		return scrapeMetric(t, base, "playwatch_broker_trim_passes_total", "") >= passes+2
	})
	bytes, starts, ends := brokerShares(t, adm, topicReviews)
	starts.Each(func(o kadm.ListedOffset) {
		if o.Offset != 0 {
			t.Errorf("reviews/%d starts at %d: records nobody stored were trimmed", o.Partition, o.Offset)
		}
	})
	if n := scrapeMetric(t, base, "playwatch_crawl_cycles_total", ""); n != 0 {
		t.Fatalf("%v cycles done while the broker had no room", n)
	}
	if !strings.Contains(logs.String(), "waiting before publishing") {
		t.Errorf("no log line says the crawl waits:\n%s", logs)
	}
	t.Logf("held back: reviews partitions hold %v bytes (share %d), end offsets %v", bytes, share, ends)

	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 60*time.Second, "the crawl cycle to finish", func() bool {
		return scrapeMetric(t, base, "playwatch_crawl_cycles_total", "") >= 1
	})
	waitStored(t, 60*time.Second, brokers, pool, testConsumerOptions().Group)
	if n := count(t, pool, `SELECT count(*) FROM reviews`); n != apps*reviewsPerApp {
		t.Errorf("%d reviews stored, want %d", n, apps*reviewsPerApp)
	}
	if n := count(t, pool, `SELECT count(*) FROM app_stats`); n != apps {
		t.Errorf("%d app_stats rows, want %d", n, apps)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	if !strings.Contains(logs.String(), "the broker has room again") {
		t.Errorf("no log line says the crawl went on:\n%s", logs)
	}

	// Stored, the records are trimmed down to the share.
	waitFor(t, 30*time.Second, "the broker to trim the stored reviews to their share", func() bool {
		bytes, _, _ := brokerShares(t, adm, topicReviews)
		for _, n := range bytes {
			if n > share {
				return false
			}
		}
		return true
	})
	bytes, starts, _ = brokerShares(t, adm, topicReviews)
	trimmed := false
	starts.Each(func(o kadm.ListedOffset) { trimmed = trimmed || o.Offset > 0 })
	if !trimmed {
		t.Errorf("nothing trimmed: %v", bytes)
	}
	if n := scrapeMetric(t, base, "playwatch_broker_trimmed_records_total", `topic="reviews"`); n <= 0 {
		t.Errorf("trimmed records metric %v", n)
	}
	t.Logf("after storing: reviews partitions hold %v bytes, start offsets %v", bytes, starts)
	if err := tc.stop(); err != nil {
		t.Error(err)
	}
	if err := stop(); err != nil {
		t.Error(err)
	}
}
