package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// flipParser is today's parser, except that while reject is set it refuses
// every page: a layout change, and then its fix.
type flipParser struct{ reject atomic.Bool }

var errLayoutChanged = &parseError{Path: "ds:5[1][2]", Detail: "layout changed"}

func (p *flipParser) details(b []byte) (appDetails, error) {
	if p.reject.Load() {
		return appDetails{}, errLayoutChanged
	}
	return storeParser{}.details(b)
}

func (p *flipParser) reviews(b []byte) (reviewsPage, error) {
	if p.reject.Load() {
		return reviewsPage{}, errLayoutChanged
	}
	return storeParser{}.reviews(b)
}

// createRawPagesTopic adds raw-pages to a test broker.
func createRawPagesTopic(t testing.TB, brokers []string) {
	t.Helper()
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		if err := ensureTopics(ctx, adm, topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour}, []string{topicRawPages}, testLogger(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// newTestArchive is the raw archive on a client of its own, flushed and
// closed at cleanup; flush waits for what it holds.
func newTestArchive(t testing.TB, brokers []string, reg prometheus.Registerer) (a *rawArchive, flush func()) {
	t.Helper()
	cl, err := kgo.NewClient(append(rawProducerOptions(testProducerSettings), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if a, err = newRawArchive(cl, reg, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	return a, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// reparseRange runs a reparse of everything on raw-pages since since; trim,
// when set, runs after the range is planned and before it is read.
func reparseRange(t testing.TB, brokers []string, rp *reparser, since time.Time, trim func(rawRange)) reparseSummary {
	t.Helper()
	var rng rawRange
	var err error
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		rng, err = planRawRange(ctx, adm, reparseWindow{Since: since})
	})
	if err != nil {
		t.Fatal(err)
	}
	if trim != nil {
		trim(rng)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(rng.offsets()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	rp.logStarts = rawLogStarts(kadm.NewClient(admCl))
	rp.fetch = rawRecordFetcher([]kgo.Opt{kgo.SeedBrokers(brokers...)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sum, err := rp.run(ctx, cl, rng)
	if err != nil {
		t.Fatalf("reparse: %v (%s)", err, sum)
	}
	return sum
}

// A layout change: the crawl's parser rejects the pages of an app, so
// nothing of it is stored, but its pages are in raw-pages with the crawl's
// time. Once the parser reads them, reparse stores what the crawl would have
// (crawled_at the crawl's own), and a second reparse stores nothing new.
func TestReparseStoresPagesTheCrawlCouldNotParse(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.relayout"
	pool := newTestPool(t)
	registerApps(t, pool, pkg)
	replay := newReplayPlayStore(t)
	replay.setApp(pkg, replayApp{Reviews: 40})
	_, brokers := newTestBroker(t, t.TempDir())
	createRawPagesTopic(t, brokers)

	reg := prometheus.NewRegistry()
	archive, flush := newTestArchive(t, brokers, reg)
	parser := &flipParser{}
	parser.reject.Store(true)
	ts := newTestPlayStore(t, replay.URL, func(_ *proxyPoolConfig, c *playStoreConfig) { c.Parser = parser })
	ts.client.archiver = archive
	pub := newTestPublisher(t, brokers, testProducerSettings)
	cr := newCycleCrawler(cycleConfig{crawlerConfig: crawlerConfig{Interval: time.Hour, ReviewsPerApp: 100, AppTimeout: time.Minute}, Workers: 1, Locales: testLocales, Clock: systemClock{}},
		newAppStore(pool), ts.client, newPGKnownReviews(pool), pub, prometheus.NewRegistry(), testLogger(t))
	began := time.Now()
	sum, err := cr.RunCycle(context.Background())
	if err != nil || sum.StatsOK != 0 || sum.ReviewsOK != 0 || sum.Failures["stats/parse_error"] != 1 || sum.Failures["reviews/parse_error"] != 1 {
		t.Fatalf("crawl with the old parser: %s, %v", sum, err)
	}
	flush()
	for kind, want := range map[string]float64{pageDetails: 1, pageReviews: 1} {
		if got := metricValue(t, reg, "playwatch_raw_pages_archived_total", map[string]string{"kind": kind}); got != want {
			t.Errorf("%s pages archived: %v, want %v", kind, got, want)
		}
		if got := metricValue(t, reg, "playwatch_raw_page_bytes_archived_total", map[string]string{"kind": kind}); got < 1000 {
			t.Errorf("%s bytes archived: %v", kind, got)
		}
	}
	for path, want := range map[string]float64{pathStats: 1, pathReviews: 1} {
		if got := metricValue(t, ts.reg, "playwatch_parse_failures_total", map[string]string{"path": path, "reason": "layout changed"}); got != want {
			t.Errorf("parse failures of %s: %v, want %v", path, got, want)
		}
	}
	if got := metricValue(t, reg, "playwatch_raw_archive_failures_total", nil); got != 0 {
		t.Errorf("archive failures: %v", got)
	}

	// The app's first storefront is another one now: the reparsed messages
	// keep the storefront the pages were read in, from their headers.
	if _, err := pool.Exec(context.Background(), `INSERT INTO app_storefronts (application_id, position, country, lang)
		SELECT id, 0, 'de', 'de' FROM apps_registry_application WHERE package_name = $1`, pkg); err != nil {
		t.Fatal(err)
	}
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	t.Cleanup(func() { _ = tc.stop() })
	rp := &reparser{parser: parser, pub: pub}
	if sum := reparseRange(t, brokers, rp, began.Add(-time.Minute), nil); sum.Read != 2 || sum.Parsed != 0 || sum.Failing["details: layout changed"] != 1 ||
		sum.Failing["reviews: layout changed"] != 1 || sum.Stats+sum.Reviews != 0 {
		t.Fatalf("reparse with the old parser: %s", sum)
	}

	parser.reject.Store(false)
	if sum := reparseRange(t, brokers, rp, began.Add(-time.Minute), nil); sum.Read != 2 || sum.Parsed != 2 || len(sum.Failing) != 0 || sum.Stats != 1 || sum.Reviews != 40 {
		t.Fatalf("reparse with the fixed parser: %s", sum)
	}
	waitFor(t, 30*time.Second, "the reparsed app-stats and reviews stored", func() bool {
		return count(t, pool, `SELECT count(*) FROM app_stats`) == 1 && count(t, pool, `SELECT count(*) FROM reviews`) == 40
	})
	if n := count(t, pool, `SELECT (SELECT count(*) FROM app_stats WHERE country = 'us' AND lang = 'en')
		+ (SELECT count(*) FROM review_storefronts WHERE country = 'us' AND lang = 'en')`); n != 41 {
		t.Errorf("%d rows in the storefront read (us/en), want the app-stats row and 40 reviews", n)
	}
	// The crawl's time, from the header, on every row: one crawl, one time.
	var statsAt, syncedMin, syncedMax time.Time
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT crawled_at FROM app_stats), min(last_synced_at), max(last_synced_at) FROM reviews`).
		Scan(&statsAt, &syncedMin, &syncedMax); err != nil {
		t.Fatal(err)
	}
	if !statsAt.Equal(syncedMin) || !statsAt.Equal(syncedMax) || statsAt.Before(began.Add(-time.Second)) || statsAt.After(began.Add(time.Second)) {
		t.Errorf("app_stats crawled_at %s, reviews last_synced_at %s..%s; want the cycle's start %s", statsAt, syncedMin, syncedMax, began)
	}
	raw := consumeAll(t, brokers, topicRawPages, 2)
	for _, r := range raw {
		if h := recordHeader(r, headerCrawledAt); h != statsAt.UTC().Format(time.RFC3339Nano) || string(r.Key) != pkg {
			t.Errorf("raw page %s: key %s, crawled_at %q, want %s", recordHeader(r, headerKind), r.Key, h, statsAt.UTC().Format(time.RFC3339Nano))
		}
	}

	// Twice: the same messages again, and nothing new in the tables.
	if sum := reparseRange(t, brokers, rp, began.Add(-time.Minute), nil); sum.Stats != 1 || sum.Reviews != 40 {
		t.Fatalf("second reparse: %s", sum)
	}
	published := endOffsets(t, brokers, topicAppStats, topicReviews)
	waitFor(t, 30*time.Second, "the consumer past the second reparse", func() bool {
		return int64(count(t, pool, `SELECT coalesce(sum(next_offset), 0)::int FROM consumer_offsets WHERE topic IN ('app-stats', 'reviews')`)) == published
	})
	if n, m := count(t, pool, `SELECT count(*) FROM app_stats`), count(t, pool, `SELECT count(*) FROM reviews WHERE last_synced_at = $1`, statsAt); n != 1 || m != 40 {
		t.Errorf("after the second reparse: %d app_stats rows, %d reviews of the crawl's time; want 1 and 40", n, m)
	}
}

// A page the archive cannot keep (the broker does not have the topic) is
// counted and the crawl goes on; with the topic, every page is kept with
// the headers of docs/design.md.
func TestRawArchiveHeadersAndFailures(t *testing.T) {
	const pkg = "com.example.headers"
	_, brokers := newTestBroker(t, t.TempDir())
	reg := prometheus.NewRegistry()
	archive, flush := newTestArchive(t, brokers, reg)
	crawled := time.Date(2026, 7, 1, 10, 0, 0, 123456789, time.UTC)
	fetched := crawled.Add(3 * time.Second)
	body := readPlaystoreFixture(t, "details_com.mojang.minecraftpe_en_us.html")
	page := rawPage{Kind: pageDetails, Package: pkg, Lang: "fa", Country: "ir", URL: "https://play.google.com/store/apps/details?id=" + pkg,
		Status: 200, FetchedAt: fetched, CrawledAt: crawled, Body: body}

	// No raw-pages topic yet: the record fails, the caller never knows.
	archive.archive(context.Background(), page)
	waitFor(t, 30*time.Second, "the failure counted", func() bool {
		return metricValue(t, reg, "playwatch_raw_archive_failures_total", nil) == 1
	})

	createRawPagesTopic(t, brokers)
	archive.archive(context.Background(), page)
	flush()
	recs := consumeAll(t, brokers, topicRawPages, 1)
	r := recs[0]
	want := map[string]string{headerURL: page.URL, headerKind: "details", headerLang: "fa", headerCountry: "ir", headerStatus: "200",
		headerFetchedAt: "2026-07-01T10:00:03.123456789Z", headerCrawledAt: "2026-07-01T10:00:00.123456Z", headerParserVersion: parserVersion,
		headerEncoding: "zstd"}
	for k, v := range want {
		if got := recordHeader(r, k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if len(r.Headers) != len(want) || string(r.Key) != pkg {
		t.Errorf("key %s, headers %v", r.Key, r.Headers)
	}
	dec := newTestRawPageDecoder(t)
	got, err := dec.decode(r)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("decoded %d bytes (%v), archived %d", len(got), err, len(body))
	}
	if len(r.Value) > len(body)/3 {
		t.Errorf("a details page of %d bytes archived in %d", len(body), len(r.Value))
	}
	if n := metricValue(t, reg, "playwatch_raw_page_bytes_archived_total", map[string]string{"kind": "details"}); n != float64(len(r.Value)) {
		t.Errorf("bytes archived %v, the record holds %d", n, len(r.Value))
	}

	// A record of another encoding, or one that decodes to more than
	// maxRawPageBytes (whether its frame says so or not), is refused.
	huge := make([]byte, maxRawPageBytes+1)
	var unsized bytes.Buffer // a streamed frame does not say its size
	zw, err := zstd.NewWriter(&unsized, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(huge); err != nil || zw.Close() != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]*kgo.Record{
		"encoding":    {Value: r.Value, Headers: []kgo.RecordHeader{{Key: headerEncoding, Value: []byte("gzip")}}},
		"no encoding": {Value: r.Value},
		"sized bomb":  {Value: archive.compress(huge), Headers: r.Headers},
		"bomb":        {Value: unsized.Bytes(), Headers: r.Headers},
		"truncated":   {Value: r.Value[:len(r.Value)/2], Headers: r.Headers},
		"garbage":     {Value: []byte{0x10, 1, 2, 3}, Headers: r.Headers},
	} {
		if got, err := dec.decode(bad); err == nil {
			t.Errorf("%s: decoded %d bytes", name, len(got))
		}
	}
}

func newTestRawPageDecoder(tb testing.TB) *rawPageDecoder {
	tb.Helper()
	d, err := newRawPageDecoder(1)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.close)
	return d
}

// playwatch reparse attaches like the other one-off commands and reports
// what it did; --dry-run publishes nothing, --package leaves the other
// apps' pages alone.
func TestReparseCommand(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.reparse"
	replay := newReplayPlayStore(t)
	replay.setApp(pkg, replayApp{Reviews: 5})
	dbURL := newTestDatabase(t)
	registerApps(t, newTestPoolFor(t, dbURL), pkg)
	_, brokers := newTestBroker(t, t.TempDir())
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir(),
		"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "5", "LOG_LEVEL": "warn"}
	playwatch := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, envFunc(env), &out, &errOut); err != nil {
			t.Fatalf("playwatch %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
		return out.String()
	}
	playwatch("crawl", "--once")
	stats := endOffsets(t, brokers, topicAppStats)
	for _, c := range []struct {
		args     []string
		want     string
		newStats int64
	}{
		{[]string{"--dry-run"}, "pages read: 2, parsed: 2, still failing: none; messages not published (dry run): 1 app-stats, 5 reviews", 0},
		{[]string{"--package", "com.example.other"}, "pages read: 0, parsed: 0, still failing: none; messages published: 0 app-stats, 0 reviews", 0},
		{[]string{"--since", "1h", "--until", time.Now().Add(time.Minute).Format(time.RFC3339)}, "pages read: 2, parsed: 2, still failing: none; messages published: 1 app-stats, 5 reviews", 1},
	} {
		if out := playwatch(append([]string{"reparse"}, c.args...)...); !strings.HasPrefix(out, c.want) {
			t.Errorf("reparse %v printed %q, want %q", c.args, out, c.want)
		}
		if got := endOffsets(t, brokers, topicAppStats); got != stats+c.newStats {
			t.Errorf("reparse %v: %d app-stats messages, want %d", c.args, got, stats+c.newStats)
		}
		stats += c.newStats
	}
	var errOut bytes.Buffer
	err := run(context.Background(), []string{"reparse", "--since", "yesterday"}, envFunc(env), &bytes.Buffer{}, &errOut)
	if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), "--since") {
		t.Errorf("reparse --since yesterday: %v", err)
	}
}

// checkKcatReadsRawPages reads raw-pages with kcat (librdkafka): every
// page franz-go reads, with its key and headers, and the bytes of the value
// exactly as archived.
func checkKcatReadsRawPages(t *testing.T, kcat, broker string, brokers []string, pkg string, n int) {
	t.Helper()
	recs := consumeAll(t, brokers, topicRawPages, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kcat, "-C", "-b", broker, "-t", topicRawPages, "-o", "beginning", "-e", "-q",
		"-f", "%p %o %k %S %h\n").Output()
	if err != nil {
		t.Fatalf("kcat -C -t %s: %v", topicRawPages, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(recs) {
		t.Fatalf("kcat read %d raw pages, franz-go %d:\n%s", len(lines), len(recs), out)
	}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) != 5 || f[2] != pkg {
			t.Fatalf("kcat line %q", line)
		}
		i := slices.IndexFunc(recs, func(r *kgo.Record) bool {
			return strconv.Itoa(int(r.Partition)) == f[0] && strconv.FormatInt(r.Offset, 10) == f[1]
		})
		if i < 0 || f[3] != strconv.Itoa(len(recs[i].Value)) || !strings.Contains(f[4], headerEncoding+"="+rawEncoding) ||
			!strings.Contains(f[4], headerCrawledAt+"="+recordHeader(recs[i], headerCrawledAt)) {
			t.Fatalf("kcat line %q does not match a record franz-go reads", line)
		}
		value, err := exec.CommandContext(ctx, kcat, "-C", "-b", broker, "-t", topicRawPages, "-p", f[0], "-o", f[1], "-c", "1", "-e", "-q",
			"-f", "%s").Output()
		if err != nil || !bytes.Equal(value, recs[i].Value) {
			t.Fatalf("kcat's value of %s/%s: %d bytes (%v), franz-go's %d", f[0], f[1], len(value), err, len(recs[i].Value))
		}
		body, err := newTestRawPageDecoder(t).decode(&kgo.Record{Value: value, Headers: recs[i].Headers})
		if err != nil || len(body) < 1000 {
			t.Fatalf("the value kcat read does not decode: %d bytes, %v", len(body), err)
		}
	}
}

// Whatever a raw-pages record holds, reparse counts it as read, parsed or
// failing, and never panics or decodes more than maxRawPageBytes.
func FuzzReparsePage(f *testing.F) {
	a, err := newRawArchive(nil, prometheus.NewRegistry(), testLogger(f))
	if err != nil {
		f.Fatal(err)
	}
	for _, fixture := range []string{"reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt", "details_com.adex77.WhereAmI_en_us.html"} {
		v := a.compress(readPlaystoreFixture(f, fixture))
		kind := pageReviews
		if strings.HasPrefix(fixture, "details") {
			kind = pageDetails
		}
		f.Add([]byte("com.example.app"), kind, "2026-07-01T10:00:00.123456Z", rawEncoding, v)
	}
	f.Add([]byte("com.example.app"), pageDetails, "2026-07-01T10:00:00Z", rawEncoding, a.compress(make([]byte, maxRawPageBytes+1)))
	f.Add([]byte("com.example.app"), pageDetails, "2026-07-01T10:00:00Z", rawEncoding, []byte{0x28, 0xb5, 0x2f, 0xfd, 0xff, 0xff})
	f.Add([]byte(""), pageReviews, "yesterday", "gzip", []byte{})
	rp := &reparser{parser: storeParser{}}
	dec := newTestRawPageDecoder(f)
	f.Fuzz(func(t *testing.T, key []byte, kind, crawledAt, encoding string, value []byte) {
		r := &kgo.Record{Key: key, Value: value, Headers: []kgo.RecordHeader{
			{Key: headerKind, Value: []byte(kind)}, {Key: headerStatus, Value: []byte("200")},
			{Key: headerCrawledAt, Value: []byte(crawledAt)}, {Key: headerEncoding, Value: []byte(encoding)},
		}}
		res, err := rp.page(context.Background(), dec, r)
		if err != nil {
			t.Fatalf("a dry run failed: %v", err)
		}
		if res.unexpected == (res.read == 1) || res.read != res.parsed && res.failing == "" || res.parsed == 1 && res.failing != "" {
			t.Fatalf("result %+v", res)
		}
	})
}

// Pages trimmed from raw-pages after the reparse planned its range are
// reported as such; the reparse ends instead of waiting for them.
func TestReparseEndsWhenItsRangeIsTrimmed(t *testing.T) {
	t.Parallel()
	_, brokers := newTestBroker(t, t.TempDir())
	createRawPagesTopic(t, brokers)
	archive, flush := newTestArchive(t, brokers, prometheus.NewRegistry())
	body := readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	for i := range 6 {
		archive.archive(context.Background(), rawPage{Kind: pageReviews, Package: fmt.Sprintf("com.example.trim%d", i), Lang: "en", Country: "us",
			Status: 200, FetchedAt: time.Now(), Body: body})
	}
	flush()
	sum := reparseRange(t, brokers, &reparser{parser: storeParser{}}, time.Now().Add(-time.Hour), func(rng rawRange) {
		var del kadm.Offsets
		for p, o := range rng {
			del.Add(kadm.Offset{Topic: topicRawPages, Partition: p, At: o[1]})
		}
		withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
			if resps, err := adm.DeleteRecords(ctx, del); err != nil || resps.Error() != nil {
				t.Fatalf("delete records: %v %v", err, resps.Error())
			}
		})
	})
	if sum.Trimmed != 6 || sum.Read != 0 || !strings.Contains(sum.String(), "6 pages of the range were trimmed") {
		t.Errorf("reparse of a trimmed range: %s", sum)
	}
}
