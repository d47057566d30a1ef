// Crawl throughput (issue 4): crawl cycles over N registered apps, each read
// in full (its details page and 1000 newest reviews: 8 Play Store responses)
// from the replay Play Store with the rate limit lifted, and published with
// the appliance's producer settings (acks=all, idempotent) to an embedded
// broker. The goal: 1000 responses/s on two cores, RSS under 256 MB.
//
//	go test -run '^$' -bench CrawlCycle -benchtime 1x .
//
// One iteration is one cycle over every app; the machine is noisy, so one is
// enough. PLAYWATCH_BENCH_APPS sets N (200), PLAYWATCH_BENCH_WORKERS the
// CRAWL_WORKERS values to compare, e.g. "2,4,8,16". The default, 8: the
// replay server answers at once, so a worker is either busy on a core or
// waiting for its sends (the producer lingers 10 ms, then the acks, twice per
// app); with fewer workers the cores idle, with more only memory grows.
//
// Metrics: responses/s (Play Store responses fetched, parsed and published),
// reviews/s (review messages the broker confirmed), peak-RSS-MB (VmHWM of
// this process during the cycles), and the CPU time per response of this
// process and of each child. The cores are shared with the replay server
// and, on a busy machine, with others: responses/s follows the load, CPU per
// response much less; two free cores would answer about
// 2000 / (cpu-ms/response + replay-cpu-ms/response) responses a second.
//
// The replay Play Store runs in a child process: it caches a 1.2 MB page per
// app, which is no part of the appliance. With broker=embedded the broker
// runs in this process, as in the appliance; with broker=child it runs in
// another child, which separates its share (broker-RSS-MB,
// broker-cpu-ms/response). These runs crawl without the raw archive;
// archive=compare crawls with and without it in turns and reports the ratio
// of the CPU times (rawarchive_bench_test.go).
package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	// benchReplayEnv makes TestReplayPlayStoreProcess serve the replay Play
	// Store for that many benchmark apps.
	benchReplayEnv = "PLAYWATCH_BENCH_REPLAY_APPS"
	// benchBrokerEnv makes TestEmbeddedBrokerProcess serve an embedded broker.
	benchBrokerEnv = "PLAYWATCH_BENCH_BROKER"
	// benchPeerPrefix starts the line in which a child process gives its address.
	benchPeerPrefix = "bench-peer-addr: "

	benchReviewsPerApp = 1000
	// benchResponsesPerApp: the details page and ceil(1000/150) reviews pages.
	benchResponsesPerApp = 8
)

func benchPackage(i int) string { return fmt.Sprintf("com.bench.app%04d", i) }

// crawlBench is what the runs share: the registered apps, the replay Play
// Store's process and one client of it.
type crawlBench struct {
	apps      int
	registry  *appStore
	known     *pgKnownReviews
	store     *playStoreClient
	storeReg  *prometheus.Registry
	replayPID string
	archive   *switchArchiver // off but in archive=compare's cycles with the archive
}

func BenchmarkCrawlCycle(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("reads memory and CPU time from /proc (Linux)")
	}
	workerCounts := benchEnvInts(b, "PLAYWATCH_BENCH_WORKERS", "8")
	cb := &crawlBench{apps: benchEnvInts(b, "PLAYWATCH_BENCH_APPS", "200")[0], storeReg: prometheus.NewRegistry(), archive: &switchArchiver{}}
	logger := testLogger(b)

	var replayURL string
	replayURL, cb.replayPID = startBenchPeer(b, "TestReplayPlayStoreProcess", fmt.Sprintf("%s=%d", benchReplayEnv, cb.apps))
	pool := newTestPool(b)
	cb.registry, cb.known = newAppStore(pool), newPGKnownReviews(pool)
	for i := range cb.apps {
		if _, err := cb.registry.Create(context.Background(), newApp{PackageName: benchPackage(i)}); err != nil {
			b.Fatal(err)
		}
	}

	// One Play Store client for every run: the replay server caches its
	// answers per NID cookie, that is per client. The rate limit is lifted:
	// no token bucket, no gap between requests, a slot for every worker.
	pc := defaultProxyPoolConfig()
	pc.RateLimitRequests, pc.MinGap, pc.MaxInFlight = 0, 0, slices.Max(workerCounts)
	proxies, err := newProxyPool(pc, cb.storeReg, logger)
	if err != nil {
		b.Fatal(err)
	}
	sc := defaultPlayStoreConfig()
	sc.BaseURL = replayURL
	if cb.store, err = newPlayStoreClient(sc, proxies, cb.archive, cb.storeReg, logger); err != nil {
		b.Fatal(err)
	}
	// The warm-up reads every app once, publishing nothing, so that the
	// cycles find every answer ready instead of making the replay server
	// synthesize pages on the same two cores.
	cfg := benchCrawlConfig(b, slices.Max(workerCounts))
	warm := newCycleCrawler(cycleConfigOf(cfg), cb.registry, cb.store, cb.known, discardPublisher{}, prometheus.NewRegistry(), logger)
	if sum, err := warm.RunCycle(context.Background()); err != nil || sum.StatsOK != cb.apps || sum.ReviewsOK != cb.apps {
		b.Fatalf("warm-up: %s, %v", sum, err)
	}

	for _, where := range []string{"embedded", "child"} {
		for _, workers := range workerCounts {
			b.Run(fmt.Sprintf("broker=%s/workers=%d", where, workers), func(b *testing.B) {
				if where == "child" {
					addr, pid := startBenchPeer(b, "TestEmbeddedBrokerProcess", benchBrokerEnv+"=1")
					cb.run(b, workers, []string{addr}, pid)
					return
				}
				_, brokers := newTestBroker(b, b.TempDir())
				cb.run(b, workers, brokers, "")
			})
		}
	}
	b.Run(fmt.Sprintf("broker=embedded/workers=%d/archive=compare", workerCounts[0]), func(b *testing.B) {
		cb.runArchiveOverhead(b, workerCounts[0])
	})
}

// run runs cycles with the appliance's producer, publisher and crawler,
// checks that every message reached the broker and reports the metrics.
// brokerPID is the broker's process when it is not this one.
func (cb *crawlBench) run(b *testing.B, workers int, brokers []string, brokerPID string) {
	cr := cb.newPublishingCrawler(b, workers, brokers, prometheus.NewRegistry())
	okResponses := func() float64 {
		return metricValue(b, cb.storeReg, "playwatch_playstore_requests_total", map[string]string{"outcome": "ok"})
	}
	pids := []string{"self", cb.replayPID}
	if brokerPID != "" {
		pids = append(pids, brokerPID)
	}
	cpu := make([]time.Duration, len(pids))
	responsesBefore := okResponses()

	// Start from the live heap only, not from garbage of the setup.
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the peak RSS (%v): peak-RSS-MB includes the setup", err)
	}
	for i, pid := range pids {
		cpu[i] = -processCPU(b, pid)
	}
	reviews := 0
	for b.Loop() {
		sum, err := cr.RunCycle(context.Background())
		if err != nil || sum.StatsOK != cb.apps || sum.ReviewsOK != cb.apps || sum.Reviews != cb.apps*benchReviewsPerApp {
			b.Fatalf("cycle: %s, %v", sum, err)
		}
		reviews += sum.Reviews
	}
	elapsed := b.Elapsed().Seconds()
	for i, pid := range pids {
		cpu[i] += processCPU(b, pid)
	}
	// Before the checks below, which make the broker read.
	peak := peakRSSMB(b, "self")
	brokerPeak := 0.0
	if brokerPID != "" {
		brokerPeak = peakRSSMB(b, brokerPID)
	}

	responses := okResponses() - responsesBefore
	if want := b.N * cb.apps * benchResponsesPerApp; int(responses) != want {
		b.Fatalf("%v Play Store responses, want %d", responses, want)
	}
	if got := endOffsets(b, brokers, topicAppStats); got != int64(b.N*cb.apps) {
		b.Fatalf("%d app-stats messages on the topic, want %d", got, b.N*cb.apps)
	}
	if got := endOffsets(b, brokers, topicReviews); got != int64(reviews) {
		b.Fatalf("%d reviews messages on the topic, want %d", got, reviews)
	}
	checkFirstMessages(b, brokers)
	perResponse := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / responses }
	b.ReportMetric(responses/elapsed, "responses/s")
	b.ReportMetric(float64(reviews)/elapsed, "reviews/s")
	b.ReportMetric(peak, "peak-RSS-MB")
	b.ReportMetric(perResponse(cpu[0]), "cpu-ms/response")
	b.ReportMetric(perResponse(cpu[1]), "replay-cpu-ms/response")
	if brokerPID != "" {
		b.ReportMetric(brokerPeak, "broker-RSS-MB")
		b.ReportMetric(perResponse(cpu[2]), "broker-cpu-ms/response")
	}
}

// newPublishingCrawler is a crawler of cb's apps with workers workers that
// publishes to brokers with the appliance's producer, which closes when b
// ends, and its publisher, both with their metrics in reg.
func (cb *crawlBench) newPublishingCrawler(b *testing.B, workers int, brokers []string, reg *prometheus.Registry) *cycleCrawler {
	cfg := benchCrawlConfig(b, workers)
	logger := testLogger(b)
	producer, err := newProducer(cfg, brokers)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(producer.Close)
	return newCycleCrawler(cycleConfigOf(cfg), cb.registry, cb.store, cb.known, newPublisher(producer, cfg.Producer, reg, logger), reg, logger)
}

// benchCrawlConfig is the appliance's configuration for the benchmark.
func benchCrawlConfig(b *testing.B, workers int) Config {
	cfg, err := loadTestConfig(map[string]string{
		"CRAWL_WORKERS":   strconv.Itoa(workers),
		"REVIEWS_PER_APP": strconv.Itoa(benchReviewsPerApp),
		// Every cycle reads every app in full (the incremental crawl has
		// BenchmarkIncrementalCrawl).
		"REVIEWS_FULL_SYNC_INTERVAL": "0s",
	})
	if err != nil {
		b.Fatal(err)
	}
	return cfg
}

// discardPublisher drops what it is given.
type discardPublisher struct{}

func (discardPublisher) PublishAppStats(context.Context, appStatsMessage) error { return nil }

func (discardPublisher) PublishReviews(context.Context, string, []reviewMessage) error { return nil }

// processCPU is the CPU time (user and system) process pid ("self" or a
// number) has used. The cores are shared by this process and its children,
// and with others on a shared machine, so CPU per response says more than
// responses per second.
func processCPU(b *testing.B, pid string) time.Duration {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// utime and stime are fields 14 and 15, counted from the pid; the
	// command in parentheses before them may contain spaces.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%s/stat: %q", pid, stat)
	}
	// In clock ticks of USER_HZ, which is 100 on Linux.
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// peakRSSMB reads VmHWM of /proc/<pid>/status, in MB.
func peakRSSMB(b testing.TB, pid string) float64 {
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				b.Fatalf("VmHWM %q: %v", v, err)
			}
			return float64(kb) / 1024
		}
	}
	b.Fatalf("no VmHWM in /proc/%s/status", pid)
	return 0
}

// checkFirstMessages reads the first message of each topic back and checks
// that it says what the replay server served.
func checkFirstMessages(b *testing.B, brokers []string) {
	var stats appStatsMessage
	var rev reviewMessage
	for topic, m := range map[string]any{topicAppStats: &stats, topicReviews: &rev} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		recs := cl.PollRecords(ctx, 1).Records()
		cancel()
		cl.Close()
		if len(recs) == 0 {
			b.Fatalf("nothing read from %s", topic)
		}
		if err := jsonUnmarshalStrict(recs[0].Value, m); err != nil {
			b.Fatalf("%s message %s: %v", topic, recs[0].Value, err)
		}
	}
	if stats.Title == nil || *stats.Title != "App "+stats.PackageName || stats.MinInstalls == nil ||
		rev.Content == nil || !strings.HasPrefix(*rev.Content, "Review ") || !strings.Contains(*rev.Content, rev.PackageName) {
		b.Fatalf("messages do not hold what was served: %+v, %+v", stats, rev)
	}
}

// startBenchPeer runs this test binary again with only the test named test,
// which serves something in that child process and prints its address. The
// child ends when its stdin closes: at cleanup, or when this process dies.
func startBenchPeer(b *testing.B, test, env string) (addr, pid string) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	addrs := make(chan string, 1)
	drained := make(chan struct{})
	var output strings.Builder // what the test framework printed, for a failure
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), benchPeerPrefix); ok {
				addrs <- a
			} else {
				output.WriteString(sc.Text() + "\n")
			}
		}
	}()
	b.Cleanup(func() {
		stdin.Close()
		select {
		case <-drained:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-drained
		}
		_ = cmd.Wait()
	})
	select {
	case addr = <-addrs:
		return addr, strconv.Itoa(cmd.Process.Pid)
	case <-drained:
		b.Fatalf("%s ended without giving its address:\n%s", test, output.String())
	case <-time.After(2 * time.Minute):
		b.Fatalf("%s gave no address within 2 minutes", test)
	}
	return "", ""
}

// serveBenchPeer gives addr to the parent process and waits until it closes
// our stdin or a signal comes.
func serveBenchPeer(addr string) {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	fmt.Printf("%s%s\n", benchPeerPrefix, addr)
	select {
	case <-stop:
	case <-eof:
	}
}

// TestReplayPlayStoreProcess is no test: BenchmarkCrawlCycle runs it in a
// child process to serve the replay Play Store there.
func TestReplayPlayStoreProcess(t *testing.T) {
	v := os.Getenv(benchReplayEnv)
	if v == "" {
		t.Skip("serves the replay Play Store for BenchmarkCrawlCycle when " + benchReplayEnv + " is set")
	}
	apps, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", benchReplayEnv, v, err)
	}
	rs := newReplayPlayStore(t)
	for i := range apps {
		// More than 1000, so that every reviews page is a full one.
		rs.setApp(benchPackage(i), replayApp{Reviews: 5000})
	}
	serveBenchPeer(rs.URL)
}

// TestEmbeddedBrokerProcess is no test: BenchmarkCrawlCycle runs it in a
// child process to keep the broker's memory apart from the crawler's.
func TestEmbeddedBrokerProcess(t *testing.T) {
	if os.Getenv(benchBrokerEnv) == "" {
		t.Skip("serves an embedded broker for BenchmarkCrawlCycle when " + benchBrokerEnv + " is set")
	}
	_, brokers := newTestBroker(t, t.TempDir())
	serveBenchPeer(brokers[0])
}
