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
	env := map[string]string{
		"DATABASE_URL":               dbURL,
		"PLAYWATCH_DATA_DIR":         dataDir,
		"PLAYWATCH_HTTP_ADDR":        freeAddr(t),
		"PLAYWATCH_BROKER_ADDR":      freeAddr(t),
		"PLAYWATCH_BROKER_MAX_BYTES": "32MiB",
		"KAFKA_BROKERS":              "",
	}
	defer func() {
		if t.Failed() {
			t.Logf("playwatch log:\n%s", fileTail(logPath, 60))
		}
	}()
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
