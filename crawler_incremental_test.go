package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// incrementalFixture is a crawl fixture with the storage consumer filling
// PostgreSQL, so that each cycle finds what the ones before it stored, and a
// crawler clock the test moves from cycle to cycle.
type incrementalFixture struct {
	*crawlFixture
	clock    *fakeClock
	consumer *testConsumer
}

func newIncrementalFixture(t *testing.T, reviewsPerApp int) *incrementalFixture {
	t.Helper()
	return newIncrementalFixtureTuned(t, reviewsPerApp, nil)
}

// newIncrementalFixtureTuned is newIncrementalFixture with the Play Store
// client's configuration tuned.
func newIncrementalFixtureTuned(t *testing.T, reviewsPerApp int, tune func(*proxyPoolConfig, *playStoreConfig)) *incrementalFixture {
	t.Helper()
	clk := newFakeClock(false)
	cfg := testCrawlerConfig(2, reviewsPerApp)
	cfg.Clock = clk
	f := &incrementalFixture{crawlFixture: newCrawlFixture(t, cfg, tune), clock: clk}
	f.consumer = startTestConsumer(t, f.pool, f.brokers, testConsumerOptions(), consumerHooks{})
	return f
}

// drained waits until the consumer stored everything published so far.
func (f *incrementalFixture) drained(t *testing.T) {
	t.Helper()
	waitDrained(t, f.pool, f.consumer.cl, testConsumerOptions().Group)
}

// incrementalStart is the crawl time the tests that crawl one app by hand
// start at: after the replay's reviews and in the past (the consumer
// refuses times from the future).
var incrementalStart = time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)

// hourJob is pkg's crawl job in the default storefront h hours after
// incrementalStart.
func hourJob(pkg string, h int) crawlJob {
	return crawlJob{App: app{PackageName: pkg, IsActive: true}, CrawledAt: incrementalStart.Add(time.Duration(h) * time.Hour), Locale: testLocales.Default}
}

// crawlStored crawls j in ctx and waits until what it published is stored.
func (f *incrementalFixture) crawlStored(t *testing.T, ctx context.Context, j crawlJob) appResult {
	t.Helper()
	r := f.crawler.crawlApp(ctx, j)
	f.drained(t)
	return r
}

// storeApp puts pkg on the replay store with reviews reviews and registers
// it.
func (f *incrementalFixture) storeApp(t *testing.T, pkg string, reviews int) {
	t.Helper()
	f.replay.setApp(pkg, replayApp{Reviews: reviews})
	f.register(t, pkg, false)
}

// stored counts pkg's stored reviews.
func (f *incrementalFixture) stored(t *testing.T, pkg string) int {
	t.Helper()
	return count(t, f.pool, `SELECT count(*) FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id WHERE a.package_name = $1`, pkg)
}

// storedOfStore counts the stored reviews among the replay store's reviews
// of pkg from to to-1 (replayReviewID's numbering: new ones below 0).
func (f *incrementalFixture) storedOfStore(t *testing.T, pkg string, from, to int) int {
	t.Helper()
	ids := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		ids = append(ids, replayReviewID(pkg, i))
	}
	return count(t, f.pool, `SELECT count(*) FROM reviews WHERE review_id = ANY($1)`, ids)
}

// markedAt says whether pkg's read mark is the replay store's review i, set
// by the read of hourJob(pkg, h).
func (f *incrementalFixture) markedAt(t *testing.T, pkg string, i, h int) bool {
	t.Helper()
	return count(t, f.pool, `SELECT count(*) FROM review_read_marks WHERE newest_review_id = $1 AND newest_at = $2 AND read_at = $3`,
		replayReviewID(pkg, i), replayReviewAt(i), hourJob(pkg, h).CrawledAt) == 1
}

// cycleAt runs a cycle at crawl time at and waits until it is stored.
func (f *incrementalFixture) cycleAt(t *testing.T, at time.Time) cycleSummary {
	t.Helper()
	f.clock.mu.Lock()
	f.clock.now = at
	f.clock.mu.Unlock()
	sum, err := f.crawler.RunCycle(context.Background())
	if err != nil || len(sum.Failures) != 0 {
		t.Fatalf("cycle at %s: %s, %v", at, sum, err)
	}
	f.drained(t)
	return sum
}

// reviewRequests counts pkg's reviews requests since the last call.
func reviewRequests(f *incrementalFixture, seen map[string]int, pkg string) int {
	n := f.replay.requests("reviews", pkg)
	d := n - seen[pkg]
	seen[pkg] = n
	return d
}

// firstResyncHour is the first hour from start at which pkg's full resync
// in the default storefront is due with hourly cycles and a daily resync.
func firstResyncHour(t *testing.T, pkg string, start time.Time) int {
	for h := range 24 {
		at := start.Add(time.Duration(h) * time.Hour)
		if fullResyncDue(crawlJobKey(pkg, testLocales.Default), at, at.Add(-time.Hour), 24*time.Hour) {
			return h
		}
	}
	t.Fatalf("%s has no resync hour in a day", pkg)
	return 0
}

// The incremental stop on a replay chain of 150-review pages: a new app is
// read in full; an hour with a few new reviews reads one page (they and the
// stored ones after them share it); 150 new reviews fill page 1, so page 2,
// all stored, is read too and ends the paging; the daily resync reads
// REVIEWS_PER_APP again. Everything read is published, and PostgreSQL ends
// with every review the store has.
func TestCrawlIncrementalPaging(t *testing.T) {
	t.Parallel()
	const pkg, late = "com.example.incremental", "com.example.late"
	f := newIncrementalFixture(t, 1000)
	f.storeApp(t, pkg, 1000)
	// Crawl times from the hour after the app's resync window.
	start := incrementalStart.Add(time.Duration(firstResyncHour(t, pkg, incrementalStart)+1) * time.Hour)
	hour := func(h int) time.Time { return start.Add(time.Duration(h) * time.Hour) }
	if fullResyncDue(crawlJobKey(late, testLocales.Default), hour(2), hour(1), 24*time.Hour) {
		t.Fatalf("%s resyncs in hour 2: the checks below want it read incrementally then", late)
	}
	seen := map[string]int{}

	// Nothing stored: a full read, seven pages.
	sum := f.cycleAt(t, hour(0))
	if n := reviewRequests(f, seen, pkg); n != 7 || sum.Reviews != 1000 || sum.FullReads != 1 || sum.Skipped != 0 {
		t.Fatalf("first cycle: %d reviews requests, %s; want 7, 1000 reviews, a full read", n, sum)
	}

	// Three new reviews, and a new app: page 1 reaches stored reviews, the
	// new app is read in full.
	f.replay.addReviews(pkg, 3)
	f.storeApp(t, late, 300)
	sum = f.cycleAt(t, hour(1))
	if n, m := reviewRequests(f, seen, pkg), reviewRequests(f, seen, late); n != 1 || m != 2 {
		t.Errorf("second cycle: %d reviews requests of the known app (want 1), %d of the new one (want 2)", n, m)
	}
	if sum.Reviews != 150+300 || sum.FullReads != 1 || sum.Skipped != 6 || sum.Requests != 2+1+2 {
		t.Errorf("second cycle: %s; want 450 reviews published, 1 full read, 6 pages skipped, 5 requests", sum)
	}
	if n := f.stored(t, pkg); n != 1003 {
		t.Errorf("%d reviews stored, want 1003", n)
	}
	for i := -3; i < 0; i++ {
		if n := count(t, f.pool, `SELECT count(*) FROM reviews WHERE review_id = $1 AND at = $2 AND last_synced_at = $3`,
			replayReviewID(pkg, i), replayReviewAt(i), hour(1)); n != 1 {
			t.Errorf("new review %d is not stored with its time and the cycle's crawled_at", i)
		}
	}

	// 150 new reviews: page 1 holds no stored one, page 2 nothing new.
	f.replay.addReviews(pkg, 150)
	sum = f.cycleAt(t, hour(2))
	if n := reviewRequests(f, seen, pkg); n != 2 || sum.Skipped != 5+1 {
		t.Errorf("third cycle: %d reviews requests, want 2; %s, want 6 pages skipped: 5 of the first app, 1 of the second", n, sum)
	}
	if n := f.stored(t, pkg); n != 1153 {
		t.Errorf("%d reviews stored, want 1153", n)
	}
	if got := testutilHistogramSum(t, f.reg, "playwatch_crawl_requests_per_app", pathReviews); got != 7+1+2+2+reviewRequests(f, seen, late) {
		t.Errorf("playwatch_crawl_requests_per_app{path=reviews} sums to %v", got)
	}

	// A day after its last window the resync reads REVIEWS_PER_APP again.
	before := metricValue(t, f.reg, "playwatch_crawl_full_resyncs_total", nil)
	sum = f.cycleAt(t, hour(23))
	if n := reviewRequests(f, seen, pkg); n != 7 {
		t.Errorf("resync cycle: %d reviews requests, want 7 (%s)", n, sum)
	}
	if got := metricValue(t, f.reg, "playwatch_crawl_full_resyncs_total", nil) - before; got < 1 {
		t.Errorf("full resyncs counted: %v", got)
	}
	if got := metricValue(t, f.reg, "playwatch_crawl_review_pages_skipped_total", nil); got != float64(6+6+sum.Skipped) {
		t.Errorf("pages skipped: %v, want %d", got, 6+6+sum.Skipped)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM reviews WHERE last_synced_at = $1`, hour(23)); n < 1000 {
		t.Errorf("the resync refreshed %d reviews, want 1000", n)
	}
}

// A review whose time or text changed is not a stored one: the paging goes
// on past it. An absent text matches only a NULL one. A stored review after
// the read mark (from a read that was cut) ends nothing, nor does any
// without a mark.
func TestKnownReviewsReached(t *testing.T) {
	at := time.Date(2026, 5, 1, 10, 0, 0, 123456789, time.UTC)
	text, other := "fine\x00", "fine, edited"
	// As PostgreSQL holds them: at to the microsecond, the md5 of the
	// cleaned text ("fine"), or none.
	known := knownReviews{newest: map[string]knownReview{
		"a": {At: at.Truncate(time.Microsecond), ContentMD5: "fff25994ee3941b225ba898fd17d186f"},
		"b": {At: at.Round(time.Microsecond), ContentMD5: ""},
		"d": {At: at.Add(time.Second).Truncate(time.Microsecond), ContentMD5: "fff25994ee3941b225ba898fd17d186f"},
	}, mark: at.Round(time.Microsecond)}
	for _, tc := range []struct {
		name string
		r    review
		want bool
	}{
		{"same", review{ReviewID: "a", At: at, Content: &text}, true},
		{"edited text", review{ReviewID: "a", At: at, Content: &other}, false},
		{"text removed", review{ReviewID: "a", At: at}, false},
		{"new time", review{ReviewID: "a", At: at.Add(time.Second), Content: &text}, false},
		{"no text either", review{ReviewID: "b", At: at}, true},
		{"text added", review{ReviewID: "b", At: at, Content: &text}, false},
		{"unknown", review{ReviewID: "c", At: at}, false},
		{"stored after the mark", review{ReviewID: "d", At: at.Add(time.Second), Content: &text}, false},
	} {
		if got := known.reached([]review{{ReviewID: "x", At: at}, tc.r}); got != tc.want {
			t.Errorf("%s: reached = %v, want %v", tc.name, got, tc.want)
		}
	}
	unmarked := known
	unmarked.mark = time.Time{}
	if unmarked.reached([]review{{ReviewID: "a", At: at, Content: &text}}) {
		t.Error("reached without a read mark")
	}
}

// Stored reviews that cannot be read never fail the crawl: it reads in
// full, logs and counts.
func TestCrawlReadsInFullWhenStoredReviewsAreUnreadable(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(1, 300), nil)
	// An app whose full resync is not due in this hour: a due one would
	// not look at the stored reviews at all.
	pkg, now := "com.example.app", time.Now()
	for i := 0; fullResyncDue(crawlJobKey(pkg, testLocales.Default), now, now.Add(-time.Hour), 24*time.Hour); i++ {
		pkg = fmt.Sprintf("com.example.app%d", i)
	}
	f.register(t, pkg, false)
	broken := newTestPool(t)
	broken.Close()
	f.crawler.known = newPGKnownReviews(broken)
	sum, err := f.crawler.RunCycle(context.Background())
	if err != nil || sum.ReviewsOK != 1 || sum.Reviews != 300 || sum.FullReads != 1 {
		t.Fatalf("%s, %v", sum, err)
	}
	if n := metricValue(t, f.reg, "playwatch_crawl_known_reviews_failures_total", nil); n != 1 {
		t.Errorf("failures to read stored reviews: %v, want 1", n)
	}
}

// Over a day of hourly cycles every app's resync is due exactly once, the
// apps spread over the hours, and every instance decides the same. Cycles
// that overrun (90 minutes apart, or a long pause) still read every app in
// full once a day: no app's window falls between two cycles.
func TestFullResyncDueSpreadsOverTheDay(t *testing.T) {
	const apps = 2400
	start := time.Date(2026, 6, 1, 7, 13, 0, 0, time.UTC) // cycles need not start on the hour
	// resyncs counts pkg's full reads in cycles at times ats, spaced as
	// their first two.
	resyncs := func(pkg string, ats []time.Time, perCycle []int) int {
		due := 0
		prev := ats[0].Add(-ats[1].Sub(ats[0]))
		for i, at := range ats {
			if fullResyncDue(pkg, at, prev, 24*time.Hour) {
				due++
				if perCycle != nil {
					perCycle[i]++
				}
			}
			prev = at
		}
		return due
	}
	every := func(step time.Duration, n int) []time.Time {
		ats := make([]time.Time, n)
		for i := range ats {
			ats[i] = start.Add(time.Duration(i) * step)
		}
		return ats
	}
	hourly, overrun := every(time.Hour, 24), every(90*time.Minute, 16)
	paused := start.Add(30 * time.Hour) // the cycle after start, late by 29 hours
	perHour := make([]int, len(hourly))
	for i := range apps {
		pkg := fmt.Sprintf("com.example.app%d", i)
		if due := resyncs(pkg, hourly, perHour); due != 1 {
			t.Fatalf("%s: %d resyncs in 24 hourly cycles, want 1", pkg, due)
		}
		if due := resyncs(pkg, overrun, nil); due != 1 {
			t.Fatalf("%s: %d resyncs in 16 cycles 90 minutes apart (a day), want 1", pkg, due)
		}
		if !fullResyncDue(pkg, paused, start, 24*time.Hour) {
			t.Fatalf("%s: the first cycle after a 30-hour pause does not read it in full", pkg)
		}
	}
	for h, n := range perHour {
		// 100 expected per hour; a binomial spread of ±4σ is about ±40.
		if n < 60 || n > 140 {
			t.Errorf("hour %d: %d of %d apps resync, want about %d", h, n, apps, apps/24)
		}
	}
	// An app's storefronts have phases of their own: its two storefronts
	// resync in the same hourly cycle for about 1 app in 24, not for all.
	together := 0
	for i := range apps {
		pkg := fmt.Sprintf("com.example.app%d", i)
		ir, us := make([]int, len(hourly)), make([]int, len(hourly))
		resyncs(crawlJobKey(pkg, locale{Lang: "fa", Country: "ir"}), hourly, ir)
		resyncs(crawlJobKey(pkg, locale{Lang: "en", Country: "us"}), hourly, us)
		for h := range hourly {
			if ir[h] == 1 && us[h] == 1 {
				together++
			}
		}
	}
	if together < 60 || together > 140 {
		t.Errorf("%d of %d apps resync both storefronts in the same cycle, want about %d", together, apps, apps/24)
	}
	if fullResyncDue("com.example.app", start, start, 24*time.Hour) {
		t.Error("a cycle at the time of the one before read an app in full")
	}
	if !fullResyncDue("com.example.app", start, start.Add(-time.Hour), 0) || !fullResyncDue("com.example.app", start, start.Add(-time.Hour), time.Hour) {
		t.Error("REVIEWS_FULL_SYNC_INTERVAL=0s, or equal to CRAWL_INTERVAL, must read in full every cycle")
	}
}

func testutilHistogramSum(t *testing.T, reg *prometheus.Registry, name, path string) int {
	t.Helper()
	m := gatheredMetric(t, reg, name, map[string]string{"path": path})
	if m == nil {
		t.Fatalf("no %s{path=%q}", name, path)
	}
	return int(m.GetHistogram().GetSampleSum())
}
