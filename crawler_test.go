package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// crawlFixture is a crawler wired to real things: registered apps in
// Postgres, a replay Play Store over HTTP, an embedded broker over TCP.
type crawlFixture struct {
	replay  *replayPlayStore
	store   *testPlayStore
	broker  *embeddedBroker
	brokers []string
	pool    *pgxpool.Pool
	apps    *appStore
	pub     *publisher
	crawler *cycleCrawler
	reg     *prometheus.Registry
}

func newCrawlFixture(t *testing.T, cfg cycleConfig, tune func(*proxyPoolConfig, *playStoreConfig)) *crawlFixture {
	t.Helper()
	f := &crawlFixture{replay: newReplayPlayStore(t), pool: newTestPool(t), reg: prometheus.NewRegistry()}
	f.apps = newAppStore(f.pool)
	f.store = newTestPlayStore(t, f.replay.URL, tune)
	f.broker, f.brokers = newTestBroker(t, t.TempDir())
	f.pub = newTestPublisher(t, f.brokers, testProducerSettings)
	f.crawler = newCycleCrawler(cfg, f.apps, f.store.client, newPGKnownReviews(f.pool), f.pub, f.reg, testLogger(t))
	return f
}

func (f *crawlFixture) register(t *testing.T, pkg string, iranian bool) {
	t.Helper()
	if _, err := f.apps.Create(context.Background(), newApp{PackageName: pkg, IsIranianApp: iranian}); err != nil {
		t.Fatal(err)
	}
}

func testCrawlerConfig(workers, reviews int) cycleConfig {
	return cycleConfig{crawlerConfig: crawlerConfig{Interval: time.Hour, ReviewsPerApp: reviews, AppTimeout: time.Minute}, Workers: workers,
		FullSyncInterval: 24 * time.Hour, Locales: testLocales, Clock: systemClock{}}
}

// One cycle over 20 apps with mixed locales and three broken ones: every
// message of the contract is on its topic exactly once with the right key.
func TestCrawlCycleTwentyApps(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(5, 200), nil)
	const (
		gone      = "com.example.gone"
		noReviews = "com.example.noreviews"
		noDetails = "com.example.nodetails"
	)
	wantReviews := map[string]int{}
	for i := range 17 {
		pkg, iranian := fmt.Sprintf("com.example.app%02d", i), i%4 == 0
		if iranian {
			pkg = fmt.Sprintf("ir.example.app%02d", i)
		}
		stored := []int{300, 40, 150, 0}[i%4] // 0: the replay default, 300
		f.replay.setApp(pkg, replayApp{Reviews: stored, Persian: iranian})
		f.register(t, pkg, iranian)
		wantReviews[pkg] = min(200, []int{300, 40, 150, 300}[i%4])
	}
	f.replay.setApp(gone, replayApp{DetailsAlways: fault404})
	f.replay.setApp(noReviews, replayApp{ReviewsAlways: fault500})
	f.replay.setApp(noDetails, replayApp{DetailsAlways: faultNoDataBlock, Reviews: 60})
	wantReviews[noDetails] = 60
	for _, pkg := range []string{gone, noReviews, noDetails} {
		f.register(t, pkg, false)
	}
	if _, err := f.apps.Create(context.Background(), newApp{PackageName: "com.example.inactive"}); err != nil {
		t.Fatal(err)
	}
	if err := f.apps.Deactivate(context.Background(), "com.example.inactive"); err != nil {
		t.Fatal(err)
	}

	before := time.Now()
	sum, err := f.crawler.RunCycle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range wantReviews {
		total += n
	}
	if sum.Apps != 20 || sum.StatsOK != 18 || sum.ReviewsOK != 18 || sum.Reviews != total {
		t.Fatalf("summary %s, want app_stats 18/20, reviews 18/20, %d review messages", sum, total)
	}
	wantFailures := map[string]int{"stats/not_found": 1, "stats/parse_error": 1, "reviews/not_found": 1, "reviews/error": 1}
	if fmt.Sprint(sum.Failures) != fmt.Sprint(wantFailures) {
		t.Errorf("failures %v, want %v", sum.Failures, wantFailures)
	}
	if !strings.HasPrefix(sum.String(), "app_stats: 18/20, reviews: 18/20") {
		t.Errorf("summary line %q", sum)
	}

	// The unknown package was asked for once, never retried, and its reviews
	// were not requested; the inactive app was not crawled.
	if n := f.replay.requests("details", gone); n != 1 {
		t.Errorf("the 404 app's details were requested %d times", n)
	}
	if n := f.replay.requests("reviews", gone) + f.replay.requests("details", "com.example.inactive"); n != 0 {
		t.Errorf("%d requests for the 404 app's reviews or the inactive app", n)
	}
	for pkg := range wantReviews {
		want := crawlTestStorefront(pkg)
		if got := f.replay.locale("details", pkg) + " " + f.replay.locale("reviews", pkg); got != want+" "+want {
			t.Errorf("%s was read with %s, want %s", pkg, got, want)
		}
	}

	stats := consumeAll(t, f.brokers, topicAppStats, 18)
	seenStats := map[string]bool{}
	for _, r := range stats {
		var m appStatsMessage
		if err := jsonUnmarshalStrict(r.Value, &m); err != nil {
			t.Fatal(err)
		}
		if string(r.Key) != m.PackageName || seenStats[m.PackageName] {
			t.Errorf("key %q, package %q (seen before: %v)", r.Key, m.PackageName, seenStats[m.PackageName])
		}
		seenStats[m.PackageName] = true
		if got := m.Lang + "/" + m.Country; got != crawlTestStorefront(m.PackageName) {
			t.Errorf("app-stats of %s in storefront %s, want the job's %s", m.PackageName, got, crawlTestStorefront(m.PackageName))
		}
		// The replay pages are the Minecraft fixture with the package and title replaced.
		if *m.Title != "App "+m.PackageName || *m.Genre != "Arcade" || *m.MinInstalls != 50000000 || *m.Score != 4.315863 ||
			*m.Ratings != 5715302 || *m.ReviewsCount != 633450 || *m.Version != "1.26.32.2" || *m.AdSupported ||
			m.AppUpdatedAt.Unix() != 1782338684 || m.CrawledAt.Before(before.Add(-time.Second)) || m.CrawledAt.After(time.Now()) {
			t.Errorf("app-stats %s", r.Value)
		}
		for _, field := range []string{`"min_installs":`, `"score":`, `"ratings":`, `"reviews_count":`, `"version":`, `"ad_supported":`, `"app_updated_at":"2026-`, `"crawled_at":"`} {
			if !strings.Contains(string(r.Value), field) {
				t.Errorf("app-stats lacks %s: %s", field, r.Value)
			}
		}
	}
	if seenStats[gone] || seenStats[noDetails] || !seenStats[noReviews] {
		t.Errorf("stats published for %v", seenStats)
	}

	perApp := map[string]int{}
	ids := map[string]bool{}
	for _, r := range consumeAll(t, f.brokers, topicReviews, total) {
		var m reviewMessage
		if err := jsonUnmarshalStrict(r.Value, &m); err != nil {
			t.Fatal(err)
		}
		if string(r.Key) != m.PackageName || ids[m.ReviewID] || m.ReviewID == "" || m.Score == nil || *m.Score < 1 || *m.Score > 5 ||
			m.At.IsZero() || m.CrawledAt.Before(m.At) || m.UserName == nil || m.Content == nil {
			t.Errorf("review %s (key %s)", r.Value, r.Key)
		}
		if strings.HasPrefix(m.PackageName, "ir.") && !strings.ContainsAny(*m.Content, "اآبپتثجچحخدذرزژسشصضطظعغفقکگلمنوهی") {
			t.Errorf("an Iranian app's review is not Persian: %q", *m.Content)
		}
		if strings.ContainsRune(*m.Content, 0) {
			t.Errorf("a NUL reached the message: %q", *m.Content)
		}
		if got := m.Lang + "/" + m.Country; got != crawlTestStorefront(m.PackageName) {
			t.Errorf("review of %s in storefront %s, want the job's %s", m.PackageName, got, crawlTestStorefront(m.PackageName))
		}
		ids[m.ReviewID] = true
		perApp[m.PackageName]++
	}
	if fmt.Sprint(perApp) != fmt.Sprint(wantReviews) {
		t.Errorf("reviews per app %v, want %v", perApp, wantReviews)
	}

	for _, c := range []struct {
		path, outcome string
		want          float64
	}{{pathStats, "ok", 18}, {pathReviews, "ok", 18}, {pathStats, "not_found", 1}, {pathReviews, "error", 1}} {
		if got := testutil.ToFloat64(f.crawler.metrics.apps.WithLabelValues(c.path, c.outcome)); got != c.want {
			t.Errorf("playwatch_crawl_app_paths_total{%s,%s} = %v, want %v", c.path, c.outcome, got, c.want)
		}
	}
	if got := testutil.ToFloat64(f.crawler.metrics.lastSuccess.WithLabelValues("com.example.app01", testLocales.Default.Country, testLocales.Default.Lang, pathReviews)); got < float64(before.Unix()) {
		t.Errorf("freshness of com.example.app01 = %v", got)
	}
	if got := testutil.ToFloat64(f.pub.metrics.produced.WithLabelValues(topicReviews)); got != float64(total) {
		t.Errorf("produced reviews = %v, want %d", got, total)
	}
}

// crawlTestStorefront is the lang/country TestCrawlCycleTwentyApps reads
// an app in: Persian for Iran for the ir.* apps, English for the US else.
func crawlTestStorefront(pkg string) string {
	if strings.HasPrefix(pkg, "ir.") {
		return "fa/ir"
	}
	return "en/us"
}

func TestCrawlCycleWithoutApps(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 10), nil)
	sum, err := f.crawler.RunCycle(context.Background())
	if err != nil || sum.Apps != 0 || f.replay.totalRequests() != 0 {
		t.Fatalf("empty registry: %+v, %v, %d requests", sum, err, f.replay.totalRequests())
	}
}

// A broker that rejects every produce for a while: the residual resend
// delivers each review exactly once.
func TestCrawlTransientBrokerFaultIsAbsorbed(t *testing.T) {
	t.Parallel()
	f, h := newProduceOutageFixture(t, 3)
	f.pub.clock = onEveryWait(func(time.Duration) { h.Remove() })

	sum, err := f.crawler.RunCycle(context.Background())
	if err != nil || sum.StatsOK != 3 || sum.ReviewsOK != 3 || sum.Reviews != 450 {
		t.Fatalf("summary %s, %v", sum, err)
	}
	if got := testutil.ToFloat64(f.pub.metrics.residualRetries.WithLabelValues(topicReviews)) +
		testutil.ToFloat64(f.pub.metrics.residualRetries.WithLabelValues(topicAppStats)); got < 1 {
		t.Errorf("no residual resend happened (%v)", got)
	}
	ids := reviewIDsOnTopic(t, f.brokers, 450)
	if len(ids) != 450 {
		t.Fatalf("%d distinct reviews, want 450", len(ids))
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s on the topic %d times", id, n)
		}
	}
	if len(consumeAll(t, f.brokers, topicAppStats, 3)) != 3 {
		t.Error("app-stats missing")
	}
}

// An outage longer than every retry: the first app fails closed on both
// paths, the cycle goes on, and the apps after it are published once the
// broker is back.
func TestCrawlLongBrokerOutageFailsClosed(t *testing.T) {
	t.Parallel()
	f, h := newProduceOutageFixture(t, 1)
	// One worker crawls the apps in order: app0's two paths use up three
	// waits each; the broker comes back at the next one (app1's first).
	var waits atomic.Int32
	f.pub.clock = onEveryWait(func(time.Duration) {
		if waits.Add(1) == 7 {
			h.Remove()
		}
	})
	sum, err := f.crawler.RunCycle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"stats/publish_failed": 1, "reviews/publish_failed": 1}
	if sum.StatsOK != 2 || sum.ReviewsOK != 2 || sum.Reviews != 300 || fmt.Sprint(sum.Failures) != fmt.Sprint(want) {
		t.Fatalf("summary %s", sum)
	}
	if got := testutil.ToFloat64(f.crawler.metrics.apps.WithLabelValues(pathStats, "publish_failed")); got != 1 {
		t.Errorf("publish_failed stats = %v", got)
	}
	for _, r := range consumeAll(t, f.brokers, topicAppStats, 2) {
		if string(r.Key) == "com.example.app0" {
			t.Errorf("app0's stats were published after failing closed")
		}
	}
	ids := reviewIDsOnTopic(t, f.brokers, 300)
	for id, n := range ids {
		if n != 1 || strings.Contains(id, "app0") {
			t.Errorf("%s on the topic %d times", id, n)
		}
	}
}

// inFlightCounter wraps the real client and tracks how many apps are being
// read at once.
type inFlightCounter struct {
	storeReader
	mu            sync.Mutex
	inFlight, max int
}

func (c *inFlightCounter) Details(ctx context.Context, pkg, lang, country string) (appDetails, error) {
	c.mu.Lock()
	c.inFlight++
	c.max = max(c.max, c.inFlight)
	c.mu.Unlock()
	return c.storeReader.Details(ctx, pkg, lang, country)
}

func (c *inFlightCounter) Reviews(ctx context.Context, pkg, lang, country string, n int, stop func([]review) bool) ([]review, error) {
	defer func() {
		c.mu.Lock()
		c.inFlight--
		c.mu.Unlock()
	}()
	return c.storeReader.Reviews(ctx, pkg, lang, country, n, stop)
}

// Never more than CRAWL_WORKERS apps in flight, and one token bucket for all
// of them: with a burst of 5 (about) every request after the fifth waits.
func TestCrawlBoundedWorkersShareTheRateLimit(t *testing.T) {
	cfg := testCrawlerConfig(3, 150)
	cfg.AppTimeout = 1000 * time.Hour // the pool's fake clock runs ahead of real deadlines
	f := newCrawlFixture(t, cfg, func(p *proxyPoolConfig, _ *playStoreConfig) {
		p.RateLimitRequests, p.RateLimitPeriod = 5, time.Minute
	})
	counter := &inFlightCounter{storeReader: f.store.client}
	f.crawler.store = counter
	for i := range 12 {
		f.register(t, fmt.Sprintf("com.example.app%02d", i), false)
	}
	// The first three apps answer slowly, so the workers surely overlap.
	for i := range 3 {
		f.replay.setApp(fmt.Sprintf("com.example.app%02d", i), replayApp{DetailsFaults: []replayFault{faultSlow}})
	}
	sum, err := f.crawler.RunCycle(context.Background())
	if err != nil || sum.StatsOK != 12 || sum.ReviewsOK != 12 {
		t.Fatalf("summary %s, %v", sum, err)
	}
	if counter.max > 3 {
		t.Errorf("%d apps in flight with CRAWL_WORKERS=3", counter.max)
	}
	if counter.max != 3 {
		t.Errorf("at most %d apps were in flight, want the 3 workers busy at once", counter.max)
	}
	requests := f.replay.totalRequests()
	waits := metricValue(t, f.store.reg, "playwatch_ratelimit_waits_total", map[string]string{"proxy": "direct"})
	// One shared bucket: every request after the burst of 5 waits, but for the
	// odd token that the fake clock's jumps refill meanwhile. A bucket per
	// worker would let 3×5 requests through without waiting.
	if int(waits) < requests-5-2 || int(waits) > requests-5 {
		t.Errorf("%v token waits for %d requests, want about %d: one bucket shared by every worker", waits, requests, requests-5)
	}
}

// `playwatch crawl --once` runs one cycle over the registry and prints its
// summary; `playwatch fetch` prints one app's messages.
func TestCrawlAndFetchCommands(t *testing.T) {
	t.Parallel()
	replay := newReplayPlayStore(t)
	replay.setApp("com.example.gone", replayApp{DetailsAlways: fault404})
	dbURL := newTestDatabase(t)
	_, brokers := newTestBroker(t, t.TempDir())
	apps := newAppStore(newTestPoolFor(t, dbURL))
	for _, pkg := range []string{"com.example.one", "com.example.two"} {
		if _, err := apps.Create(context.Background(), newApp{PackageName: pkg}); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir(),
		"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "20"}
	var out strings.Builder
	if err := run(context.Background(), []string{"crawl", "--once"}, envFunc(env), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "app_stats: 2/2, reviews: 2/2 (40 review messages)") {
		t.Fatalf("crawl --once printed %q", out.String())
	}
	if n := len(consumeAll(t, brokers, topicReviews, 40)); n != 40 {
		t.Fatalf("%d reviews on the topic", n)
	}

	out.Reset()
	if err := run(context.Background(), []string{"fetch", "--reviews", "7", "--lang", "fa", "--country", "ir", "org.telegram.messenger"}, envFunc(env), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 8 || !strings.Contains(lines[0], `"title":"App org.telegram.messenger"`) || !strings.Contains(lines[7], `"review_id":`) {
		t.Fatalf("fetch printed:\n%s", out.String())
	}
	if got := replay.locale("reviews", "org.telegram.messenger"); got != "fa/ir" {
		t.Errorf("fetch read the reviews with %s", got)
	}
	err := run(context.Background(), []string{"fetch", "com.example.gone"}, envFunc(env), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("fetch of an unknown app: %v", err)
	}
}

// The shutdown timeout counts from the end of the work, not from its start:
// a `crawl --once` longer than PLAYWATCH_SHUTDOWN_TIMEOUT still stops
// cleanly, its producer flushed.
func TestCrawlOnceOutlastingShutdownTimeout(t *testing.T) {
	t.Parallel()
	replay := newReplayPlayStore(t)
	_, brokers := newTestBroker(t, t.TempDir())
	dbURL := newTestDatabase(t)
	apps := newAppStore(newTestPoolFor(t, dbURL))
	for _, pkg := range []string{"com.example.slow1", "com.example.slow2"} {
		replay.setApp(pkg, replayApp{DetailsFaults: []replayFault{faultSlow}}) // 2 s each, one after the other
		if _, err := apps.Create(context.Background(), newApp{PackageName: pkg}); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir(),
		"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "10",
		"CRAWL_WORKERS": "1", "PLAYWATCH_SHUTDOWN_TIMEOUT": "3s"}
	start := time.Now()
	var out strings.Builder
	if err := run(context.Background(), []string{"crawl", "--once"}, envFunc(env), &out, io.Discard); err != nil {
		t.Fatalf("crawl --once of %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if took := time.Since(start); took < 4*time.Second || !strings.HasPrefix(out.String(), "app_stats: 2/2, reviews: 2/2") {
		t.Fatalf("the cycle took %v (want it longer than the 3s shutdown timeout) and printed %q", took, out.String())
	}
	if n := endOffsets(t, brokers, topicAppStats); n != 2 {
		t.Errorf("%d app-stats records on the topic, want 2", n)
	}
}

// The failure streak counts an app that never succeeded, a success resets
// it, and an app that is no longer active loses its per-app series.
func TestCrawlFailureStreakAndForget(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(2, 5), nil)
	const gone, good = "com.example.gone", "com.example.good"
	f.replay.setApp(gone, replayApp{DetailsAlways: fault404})
	f.register(t, gone, false)
	f.register(t, good, false)
	streak := func(pkg, path string) float64 {
		return metricValue(t, f.reg, "playwatch_crawl_consecutive_failures", map[string]string{"package": pkg, "path": path})
	}
	for cycle := 1; cycle <= 2; cycle++ {
		if _, err := f.crawler.RunCycle(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := streak(gone, pathStats); got != float64(cycle) {
			t.Errorf("cycle %d: %s stats streak %v, want %d", cycle, gone, got, cycle)
		}
		if got := streak(good, pathReviews); got != 0 {
			t.Errorf("cycle %d: %s reviews streak %v, want 0", cycle, good, got)
		}
	}
	if got := metricValue(t, f.reg, "playwatch_crawl_interval_seconds", nil); got != 3600 {
		t.Errorf("playwatch_crawl_interval_seconds = %v, want 3600", got)
	}
	f.replay.setApp(gone, replayApp{})
	if _, err := f.crawler.RunCycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := streak(gone, pathStats); got != 0 {
		t.Errorf("after a success the streak is %v, want 0", got)
	}
	if err := f.apps.Deactivate(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	if _, err := f.crawler.RunCycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(f.crawler.metrics.failures) + testutil.CollectAndCount(f.crawler.metrics.lastSuccess); n != 4 {
		t.Errorf("%d per-app series after deactivating %s, want 4 (%s's two paths, twice)", n, gone, good)
	}
}

// An instance drops the per-app series of an app it has not crawled for
// 2 × CRAWL_INTERVAL (its crawl-jobs partition moved to another instance)
// at the next scrape, whether the app last succeeded or failed; apps it
// still crawls, failing ones included, keep theirs.
func TestCrawlMetricsForgetAppsNotCrawled(t *testing.T) {
	reg := prometheus.NewRegistry()
	const interval = 250 * time.Millisecond
	c := &crawler{metrics: newCrawlMetrics(reg, interval)}
	const moved, movedFailing, kept, failing = "com.example.moved", "com.example.movedfailing", "com.example.kept", "com.example.failing"
	broken := fmt.Errorf("connection reset")
	c.observe(moved, testLocales.Default, pathStats, nil)
	c.observe(movedFailing, testLocales.Default, pathReviews, broken)
	series := func() int {
		n, err := testutil.GatherAndCount(reg, "playwatch_crawl_last_success_timestamp_seconds", "playwatch_crawl_consecutive_failures")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := series(); n != 3 {
		t.Fatalf("%d per-app series after the first crawls, want 3", n)
	}
	time.Sleep(2*interval + 100*time.Millisecond)
	c.observe(kept, testLocales.Default, pathStats, nil)
	c.observe(failing, testLocales.Default, pathStats, broken)
	if n := series(); n != 3 {
		t.Errorf("%d per-app series, want 3 (%s's two, %s's streak): %s and %s were not crawled for 2 intervals", n, kept, failing, moved, movedFailing)
	}
	if got := metricValue(t, reg, "playwatch_crawl_consecutive_failures", map[string]string{"package": failing, "path": pathStats}); got != 1 {
		t.Errorf("%s streak %v, want 1", failing, got)
	}
	c.observe(moved, testLocales.Default, pathStats, broken)
	if got := metricValue(t, reg, "playwatch_crawl_consecutive_failures", map[string]string{"package": moved, "path": pathStats}); got != 1 {
		t.Errorf("%s back on this instance: streak %v, want 1 (counted afresh)", moved, got)
	}
}
