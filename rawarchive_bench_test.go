package main

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The recorded answers the archive benchmarks archive: every details page
// and reviews page of testdata/playstore.
var (
	benchDetailsFixtures = []string{"details_com.adex77.WhereAmI_en_us.html", "details_com.google.android.apps.translate_en_us.html",
		"details_com.mojang.minecraftpe_en_us.html", "details_com.raiseright.edumarketapp_en.html", "details_com.youngkiu.stock_knee_shoulder_ko.html"}
	benchReviewsFixtures = []string{"reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt", "reviews_UsvDTd_com.google.android.apps.translate_en_us_page2.txt"}
)

// archiveBenchCycle archives one full cycle of apps apps (a details page and
// benchResponsesPerApp-1 reviews pages each, from the recorded answers) and
// returns when the broker has them all.
func archiveBenchCycle(b *testing.B, brokers []string, apps int, crawled time.Time) {
	b.Helper()
	details := make([][]byte, len(benchDetailsFixtures))
	for i, f := range benchDetailsFixtures {
		details[i] = readPlaystoreFixture(b, f)
	}
	// Each reviews page of an app its own, as a crawl's are (its first
	// review's id differs): the archive would archive a repeated one as a
	// reference.
	reviews := make([][]byte, benchResponsesPerApp-1)
	for j := range reviews {
		body := readPlaystoreFixture(b, benchReviewsFixtures[j%len(benchReviewsFixtures)])
		first := []byte(`"UsvDTd","[[[\"`)
		if !bytes.Contains(body, first) {
			b.Fatalf("%s does not start with %s", benchReviewsFixtures[j%len(benchReviewsFixtures)], first)
		}
		reviews[j] = bytes.Replace(body, first, fmt.Appendf(slices.Clone(first), "%d", j), 1)
	}
	archive, flush := newTestArchive(b, brokers, prometheus.NewRegistry())
	for i := range apps {
		pkg := benchPackage(i)
		page := rawPage{Kind: pageDetails, Package: pkg, Lang: "en", Country: "us", URL: "https://play.google.com/store/apps/details?id=" + pkg,
			Status: 200, FetchedAt: crawled, CrawledAt: crawled, Body: details[i%len(details)]}
		archive.archive(context.Background(), page)
		for j := range benchResponsesPerApp - 1 {
			page.Kind, page.URL, page.Body = pageReviews, "https://play.google.com/_/PlayStoreUi/data/batchexecute?hl=en&gl=us", reviews[j]
			archive.archive(context.Background(), page)
		}
		if i%20 == 19 {
			flush() // within the archive's bounded buffer
		}
	}
	flush()
	if n := endOffsets(b, brokers, topicRawPages); n != int64(apps*benchResponsesPerApp) {
		b.Fatalf("%d pages archived, want %d", n, apps*benchResponsesPerApp)
	}
}

// BenchmarkReparseCycle: reparse of one full cycle of archived pages of
// PLAYWATCH_BENCH_APPS apps (200: 1,600 pages, 1,400 of them reviews pages
// of 150 reviews), read from an embedded broker in this process, parsed and
// published with the appliance's producer settings. The goal: under 10 s a
// cycle on this machine (s/cycle). cpu-s/cycle is the CPU time of this
// process, broker included: on a machine shared with others it says more
// than the wall time, which follows the load.
//
//	go test -run '^$' -bench ReparseCycle -benchtime 3x .
func BenchmarkReparseCycle(b *testing.B) {
	apps := benchEnvInts(b, "PLAYWATCH_BENCH_APPS", "200")[0]
	_, brokers := newTestBroker(b, b.TempDir())
	createRawPagesTopic(b, brokers)
	archiveBenchCycle(b, brokers, apps, time.Date(2026, 7, 7, 10, 0, 0, 0, time.UTC))
	cfg := benchCrawlConfig(b, 1)
	producer, err := newProducer(cfg, brokers)
	if err != nil {
		b.Fatal(err)
	}
	defer producer.Close()
	rp := &reparser{parser: storeParser{}, pub: newPublisher(producer, cfg.Producer, prometheus.NewRegistry(), testLogger(b))}
	pages := 0
	cpu := -processCPU(b, "self")
	for b.Loop() {
		sum := reparseRange(b, brokers, rp, time.Now().Add(-time.Hour), nil)
		if sum.Read != apps*benchResponsesPerApp || sum.Parsed != sum.Read || sum.Stats != apps {
			b.Fatalf("reparse: %s", sum)
		}
		pages += sum.Read
	}
	cpu += processCPU(b, "self")
	b.ReportMetric(float64(pages)/b.Elapsed().Seconds(), "pages/s")
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/cycle")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/cycle")
}

// BenchmarkBrokerBytesPerRawPage archives, per iteration, one app's full
// cycle of recorded answers (a details page, seven reviews pages) and
// reports how much the embedded broker's files grew per page of each kind
// and per app and cycle: the figures behind the README's hours of pages per
// PLAYWATCH_BROKER_MAX_BYTES.
//
//	go test -run '^$' -bench BrokerBytesPerRawPage -benchtime 20x .
func BenchmarkBrokerBytesPerRawPage(b *testing.B) {
	dir := b.TempDir()
	_, brokers := newTestBroker(b, dir)
	createRawPagesTopic(b, brokers)
	before := dirBytes(b, dir)
	crawled := time.Date(2026, 7, 7, 10, 0, 0, 0, time.UTC)
	archiveBenchCycle(b, brokers, b.N, crawled)
	grew := float64(dirBytes(b, dir) - before)
	// The value bytes of each kind, to split the growth by kind.
	details, reviews := 0.0, 0.0
	for _, r := range consumeAll(b, brokers, topicRawPages, b.N*benchResponsesPerApp) {
		if recordHeader(r, headerKind) == pageDetails {
			details += float64(len(r.Value))
		} else {
			reviews += float64(len(r.Value))
		}
	}
	overhead := (grew - details - reviews) / float64(b.N*benchResponsesPerApp)
	b.ReportMetric(details/float64(b.N)+overhead, "bytes/details-page")
	b.ReportMetric(reviews/float64(b.N*(benchResponsesPerApp-1))+overhead, "bytes/reviews-page")
	b.ReportMetric(grew/float64(b.N), "bytes/app-cycle")
}

// switchArchiver lets the crawl benchmark turn the archive on and off
// between cycles of one client: the replay Play Store caches its answers per
// client.
type switchArchiver struct{ to atomic.Pointer[rawArchive] }

func (s *switchArchiver) archive(ctx context.Context, p rawPage) {
	if a := s.to.Load(); a != nil {
		a.archive(ctx, p)
	}
}

// runArchiveOverhead is BenchmarkCrawlCycle's archive=compare: each
// iteration runs a cycle without the archive, then one with it, on the same
// crawler, producer and embedded broker (in this process, as in the
// appliance), and reports the CPU time per response of each and their
// ratio (archive-cpu-ratio; the goal: at most 1.3). Before them, after a
// cycle that warms the crawler up, one cycle with the archive, as after a
// start, archives every page in full (archive-first-cpu-ratio, against the
// cycles without); the measured ones
// find the replay store's pages unchanged, as a running crawl finds most,
// and archive references (rawarchive_ref.go).
func (cb *crawlBench) runArchiveOverhead(b *testing.B, workers int) {
	_, brokers := newTestBroker(b, b.TempDir())
	createRawPagesTopic(b, brokers)
	reg := prometheus.NewRegistry()
	archive, flush := newTestArchive(b, brokers, reg)
	cr := cb.newPublishingCrawler(b, workers, brokers, reg)
	responses := cb.apps * benchResponsesPerApp
	var off, on time.Duration
	cycle := func(a *rawArchive) time.Duration {
		cb.archive.to.Store(a)
		defer cb.archive.to.Store(nil)
		runtime.GC()
		start := processCPU(b, "self")
		sum, err := cr.RunCycle(context.Background())
		if a != nil {
			flush() // the archive's sends are its cost too
		}
		if err != nil || sum.StatsOK != cb.apps || sum.ReviewsOK != cb.apps {
			b.Fatalf("cycle: %s, %v", sum, err)
		}
		return processCPU(b, "self") - start
	}
	cycle(nil) // the first cycle of a crawler and producer costs more
	first := cycle(archive)
	for b.Loop() {
		off += cycle(nil)
		on += cycle(archive)
	}
	pages := func(name string) float64 {
		return metricValue(b, reg, name, map[string]string{"kind": pageDetails}) + metricValue(b, reg, name, map[string]string{"kind": pageReviews})
	}
	if archived, want := pages("playwatch_raw_pages_archived_total"), float64((b.N+1)*responses); archived != want {
		b.Fatalf("%v pages archived, want %v (%v failures)", archived, want, metricValue(b, reg, "playwatch_raw_archive_failures_total", nil))
	}
	if unchanged, want := pages("playwatch_raw_pages_unchanged_total"), float64(b.N*responses); unchanged != want {
		b.Fatalf("%v pages archived as unchanged, want %v", unchanged, want)
	}
	perResponse := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N*responses) }
	b.ReportMetric(perResponse(off), "cpu-ms/response")
	b.ReportMetric(perResponse(on), "archive-cpu-ms/response")
	b.ReportMetric(float64(on)/float64(off), "archive-cpu-ratio")
	b.ReportMetric(float64(first)*float64(b.N)/float64(off), "archive-first-cpu-ratio")
}
