package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// rejectingParser is today's parser, except that it rejects the reviews
// page of call number rejectAt (counted from 1 over the parser's life).
type rejectingParser struct {
	storeParser
	calls, rejectAt atomic.Int64
}

func (p *rejectingParser) reviews(b []byte) (reviewsPage, error) {
	if p.calls.Add(1) == p.rejectAt.Load() {
		return reviewsPage{}, &parseError{Path: "reviews[0]", Detail: "layout not understood (test)"}
	}
	return p.storeParser.reviews(b)
}

// cuttingReader is the Play Store client, with a hook that runs after each
// reviews page it has shown the paging's stop rule: a test's way to cut a
// read between two pages.
type cuttingReader struct {
	storeReader
	afterPage func(page int)
}

func (r *cuttingReader) Reviews(ctx context.Context, pkg, lang, country string, n int, stop func([]review) bool) ([]review, error) {
	pages := 0
	return r.storeReader.Reviews(ctx, pkg, lang, country, n, func(page []review) bool {
		pages++
		r.afterPage(pages)
		return stop != nil && stop(page)
	})
}

// setReviewsFaults makes pkg's next reviews requests answer faults, in order.
func setReviewsFaults(s *replayPlayStore, pkg string, faults ...replayFault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.apps[pkg].ReviewsFaults = faults
	delete(s.faultsUsed, "reviews "+pkg)
}

// A read cut after its first page (1000 reviews stored, 300 new on the
// store, the cut read published the newest 150) leaves no hole: the next
// healthy read does not stop at the 150 it meets first, which are after the
// read mark, but pages on to the reviews a complete read stored, and every
// one of the 1300 reviews on the store is stored. A quiet hour after it
// reads one page again: the healthy read moved the mark. Each way a read is
// cut: an HTTP 500 on page 2, the job canceled (shutdown, or the worker's
// partition taken away), CRAWL_APP_TIMEOUT, a page the parser rejects.
func TestCrawlIncrementalReadCutLeavesNoHole(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.holes"
	for _, tc := range []struct {
		name string
		// cut arranges the next read's cut; it returns the job's context.
		cut     func(f *incrementalFixture, parser *rejectingParser) (context.Context, context.CancelFunc)
		outcome string // of the cut read's reviews path in app_crawl_outcomes
	}{
		{"page 2 answers HTTP 500", func(f *incrementalFixture, _ *rejectingParser) (context.Context, context.CancelFunc) {
			setReviewsFaults(f.replay, pkg, faultNone, fault500, fault500, fault500, fault500)
			return context.WithCancel(context.Background())
		}, crawlHTTPError},
		{"canceled after page 1", func(f *incrementalFixture, _ *rejectingParser) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			f.crawler.store = &cuttingReader{storeReader: f.store.client, afterPage: func(page int) {
				if page == 1 {
					cancel()
				}
			}}
			return ctx, cancel
		}, crawlCanceled},
		{"partition taken away after page 1", func(f *incrementalFixture, _ *rejectingParser) (context.Context, context.CancelFunc) {
			// The crawl worker cancels the jobs of a revoked partition.
			w := newCrawlWorker(f.crawler.crawler, newLeaseEpochs(f.pool), 1, prometheus.NewRegistry(), testLogger(t))
			w.runCtx = context.Background()
			jctx := w.track(&kgo.Record{Partition: 2}).ctx
			f.crawler.store = &cuttingReader{storeReader: f.store.client, afterPage: func(page int) {
				if page == 1 {
					w.abandon(context.Background(), nil, map[string][]int32{topicCrawlJobs: {2}})
				}
			}}
			return jctx, func() {}
		}, crawlCanceled},
		{"CRAWL_APP_TIMEOUT on page 2", func(f *incrementalFixture, _ *rejectingParser) (context.Context, context.CancelFunc) {
			setReviewsFaults(f.replay, pkg, faultNone, faultSlow)
			f.crawler.cfg.AppTimeout = time.Second
			return context.WithCancel(context.Background())
		}, crawlTimeout},
		{"page 2 rejected by the parser", func(f *incrementalFixture, parser *rejectingParser) (context.Context, context.CancelFunc) {
			parser.rejectAt.Store(parser.calls.Load() + 2)
			return context.WithCancel(context.Background())
		}, crawlParseError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parser := &rejectingParser{}
			f := newIncrementalFixtureTuned(t, 1000, func(_ *proxyPoolConfig, c *playStoreConfig) { c.Parser = parser })
			f.storeApp(t, pkg, 1000)
			crawl := func(ctx context.Context, h int) appResult {
				t.Helper()
				return f.crawlStored(t, ctx, hourJob(pkg, h))
			}
			seen := map[string]int{}

			if r := crawl(context.Background(), 0); r.reviewsErr != nil || r.reviews != 1000 || !r.fullRead {
				t.Fatalf("first crawl: %+v", r)
			}
			reviewRequests(f, seen, pkg)
			f.replay.addReviews(pkg, 300)
			ctx, cancel := tc.cut(f, parser)
			r := crawl(ctx, 1)
			cancel()
			if r.reviewsErr == nil || r.reviews != 150 {
				t.Fatalf("cut crawl: %d reviews published, err %v; want page 1's 150 and an error", r.reviews, r.reviewsErr)
			}
			if got := count(t, f.pool, `SELECT count(*) FROM app_crawl_outcomes WHERE path = 'reviews' AND outcome = $1`, tc.outcome); got != 1 {
				t.Errorf("the cut read's outcome is not %s", tc.outcome)
			}
			if n := f.stored(t, pkg); n != 1150 {
				t.Fatalf("%d reviews stored after the cut read, want 1150", n)
			}

			// The healthy read: the 150 new ones stored by the cut read,
			// the 150 it missed, then page 3 with the complete read's.
			f.crawler.store, f.crawler.cfg.AppTimeout = f.store.client, time.Minute
			reviewRequests(f, seen, pkg)
			if r := crawl(context.Background(), 2); r.reviewsErr != nil || r.fullRead {
				t.Fatalf("healthy crawl: %+v", r)
			}
			if n := reviewRequests(f, seen, pkg); n != 3 {
				t.Errorf("healthy crawl: %d reviews requests, want 3", n)
			}
			if n, all := f.storedOfStore(t, pkg, -300, 1000), f.stored(t, pkg); n != 1300 || all != 1300 {
				t.Fatalf("%d of the store's 1300 reviews stored (%d in all)", n, all)
			}
			if !f.markedAt(t, pkg, -300, 2) {
				t.Error("the healthy read did not move the read mark to its newest review")
			}

			// A quiet hour: one page reaches the reviews of the healthy read.
			f.replay.addReviews(pkg, 3)
			if r := crawl(context.Background(), 3); r.reviewsErr != nil || r.reviews != 150 {
				t.Fatalf("quiet crawl: %+v", r)
			}
			if n, all := reviewRequests(f, seen, pkg), f.stored(t, pkg); n != 1 || all != 1303 {
				t.Errorf("quiet crawl: %d reviews requests (want 1), %d stored (want 1303)", n, all)
			}
		})
	}
}

// Reviews stored before read marks existed (or by reads that were all cut)
// are no stop: the first read of such an app is a full one, and it sets
// the mark.
func TestCrawlIncrementalWithoutMarkReadsInFull(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.nomark"
	f := newIncrementalFixture(t, 600)
	f.storeApp(t, pkg, 1000)
	if r := f.crawlStored(t, context.Background(), hourJob(pkg, 0)); r.reviewsErr != nil || !r.fullRead {
		t.Fatalf("first crawl: %+v", r)
	}
	mustExec(t, f.pool, `DELETE FROM review_read_marks`)
	before := f.replay.requests("reviews", pkg)
	if r := f.crawler.crawlApp(context.Background(), hourJob(pkg, 1)); r.reviewsErr != nil || !r.fullRead || r.reviews != 600 {
		t.Fatalf("crawl without a mark: %+v; want a full read of 600", r)
	}
	if n := f.replay.requests("reviews", pkg) - before; n != 4 {
		t.Errorf("%d reviews requests, want 4", n)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM review_read_marks`); n != 1 {
		t.Errorf("%d read marks after a complete read, want 1", n)
	}
}

// The consumer stores what a read published later than the next read looks
// at the stored reviews: the next read finds fewer stop points and reads
// further, and nothing is missed. Here the consumer is stopped across a cut
// read and two more, one of them after the mark moved past reviews not yet
// stored; once it runs again, every review of the store is stored.
func TestCrawlIncrementalConsumerLagOnlyLengthensReads(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.lag"
	f := newIncrementalFixture(t, 1000)
	f.storeApp(t, pkg, 1000)
	crawl := func(h int) appResult { return f.crawler.crawlApp(context.Background(), hourJob(pkg, h)) }
	seen := map[string]int{}
	if r := crawl(0); r.reviewsErr != nil {
		t.Fatal(r.reviewsErr)
	}
	f.drained(t)
	reviewRequests(f, seen, pkg)
	if err := f.consumer.stop(); err != nil {
		t.Fatal(err)
	}

	f.replay.addReviews(pkg, 300)
	setReviewsFaults(f.replay, pkg, faultNone, fault500, fault500, fault500, fault500)
	if r := crawl(1); r.reviewsErr == nil || r.reviews != 150 {
		t.Fatalf("cut read: %+v", r)
	}
	reviewRequests(f, seen, pkg)
	// Nothing of the cut read is stored: the read pages to the reviews
	// of the first one, and moves the mark to reviews not yet stored.
	if r := crawl(2); r.reviewsErr != nil || r.reviews != 450 {
		t.Fatalf("read behind the consumer: %+v", r)
	}
	if n := reviewRequests(f, seen, pkg); n != 3 {
		t.Errorf("read behind the consumer: %d reviews requests, want 3", n)
	}
	// The mark is past every stored review's time, but the stored ones are
	// at or before it: the read still ends at the first read's reviews.
	f.replay.addReviews(pkg, 3)
	if r := crawl(3); r.reviewsErr != nil || r.reviews != 450 {
		t.Fatalf("second read behind the consumer: %+v", r)
	}
	if n := reviewRequests(f, seen, pkg); n != 3 {
		t.Errorf("second read behind the consumer: %d reviews requests, want 3", n)
	}
	f.consumer = startTestConsumer(t, f.pool, f.brokers, testConsumerOptions(), consumerHooks{})
	f.drained(t)
	if n := f.storedOfStore(t, pkg, -303, 1000); n != 1303 {
		t.Fatalf("%d of the store's 1303 reviews stored", n)
	}
}

// A reviews page with a next-page token whose records all lack a review id
// ends the read cut, not complete: with 1000 reviews stored and 300 new,
// page 1's 150 are published, page 2 is a parse error, the read mark stays
// where the complete read put it, and the outcome is parse_error. Had the
// mark moved to the 150, the next read would stop at them and never store
// the 150 below; the healthy read after it stores all 1300.
func TestCrawlIncrementalPageWithoutIDsMovesNoMark(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.noids"
	f := newIncrementalFixture(t, 1000)
	f.storeApp(t, pkg, 1000)
	crawl := func(h int) appResult {
		t.Helper()
		return f.crawlStored(t, context.Background(), hourJob(pkg, h))
	}
	if r := crawl(0); r.reviewsErr != nil || r.reviews != 1000 {
		t.Fatalf("first crawl: %+v", r)
	}

	f.replay.addReviews(pkg, 300)
	setReviewsFaults(f.replay, pkg, faultNone, faultNoReviewIDs)
	r := crawl(1)
	var perr *parseError
	if !errors.As(r.reviewsErr, &perr) || r.reviews != 150 {
		t.Fatalf("crawl with page 2 without ids: %d reviews published, err %v; want page 1's 150 and a parse error", r.reviews, r.reviewsErr)
	}
	if got := count(t, f.pool, `SELECT count(*) FROM app_crawl_outcomes WHERE path = 'reviews' AND outcome = 'parse_error'`); got != 1 {
		t.Error("the reviews outcome is not parse_error")
	}
	if !f.markedAt(t, pkg, 0, 0) {
		t.Error("the read mark moved after a read whose page 2 had no ids")
	}
	if got := metricValue(t, f.store.reg, "playwatch_parse_failures_total", map[string]string{"path": pathReviews, "reason": "no record with a review id and a time"}); got != 1 {
		t.Errorf("parse failures counted: %v, want 1", got)
	}

	if r := crawl(2); r.reviewsErr != nil || r.reviews != 450 {
		t.Fatalf("healthy crawl: %+v; want the 300 new and page 3's 150", r)
	}
	if n, all := f.storedOfStore(t, pkg, -300, 1000), f.stored(t, pkg); n != 1300 || all != 1300 {
		t.Fatalf("%d of the store's 1300 reviews stored (%d in all)", n, all)
	}
	if !f.markedAt(t, pkg, -300, 2) {
		t.Error("the healthy read did not move the read mark to its newest review")
	}
}
