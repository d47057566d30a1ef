package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// storeReader is what a crawl needs of the Play Store client.
type storeReader interface {
	Details(ctx context.Context, pkg, lang, country string) (appDetails, error)
	Reviews(ctx context.Context, pkg, lang, country string, n int, stop func(page []review) bool) ([]review, error)
}

// crawlState is what a crawl keeps in PostgreSQL besides its messages
// (pgKnownReviews), per app and storefront: the newest reviews stored from
// the storefront and its read mark, where an incremental crawl stops paging,
// and the last outcome of each path (app_crawl_outcomes).
type crawlState interface {
	KnownReviews(ctx context.Context, pkg string, loc locale, limit, countUpTo int) (knownReviews, error)
	SetReadMark(ctx context.Context, pkg string, loc locale, newest review, readAt time.Time) error
	RecordOutcome(ctx context.Context, pkg string, loc locale, path string, o crawlOutcome) error
	CrawledSince(ctx context.Context, pkg string, loc locale, since time.Time) (bool, error)
}

// crawlPublisher sends what a crawl read.
type crawlPublisher interface {
	PublishAppStats(ctx context.Context, m appStatsMessage) error
	PublishReviews(ctx context.Context, pkg string, ms []reviewMessage) error
}

// activeAppLister lists the apps a cycle crawls.
type activeAppLister interface {
	ListActive(ctx context.Context) ([]app, error)
}

// crawlerConfig is the crawl part of Config.
type crawlerConfig struct {
	Interval      time.Duration // CRAWL_INTERVAL
	ReviewsPerApp int           // REVIEWS_PER_APP
	AppTimeout    time.Duration // CRAWL_APP_TIMEOUT: reading one app, both paths
}

// crawlJob is one app's crawl in one cycle.
type crawlJob struct {
	App        app
	CrawledAt  time.Time // the crawl's time: every message of this crawl carries it as crawled_at, the raw archive records it
	FullResync bool      // read REVIEWS_PER_APP reviews even if a known one is reached
	Locale     locale    // the storefront read: a crawl-jobs job carries the leader's choice
}

// fullResyncDue says whether the cycle at at reads the reviews of the job
// key (crawlJobKey: an app in one storefront) in full, the cycle before it
// having been at prev, with a full read due every every (0: always). Each
// app and storefront has its own phase point within every, from a hash of
// the key, so the full reads spread evenly over the cycles instead of
// falling into one, and an app's storefronts do not all resync in the same
// cycle. A cycle reads in full the keys whose phase point fell in
// (max(prev, at−every), at]: consecutive cycles' windows join up, so however
// far apart the cycles are (an overrun, a restart) each key is read in full
// at least once per every, and once per every when cycles are closer than
// that. Pure and deterministic, so that any instance planning a cycle
// decides the same. (Before storefronts the key was the package alone: an
// upgrade moves each app's phase once, so its next full read may come up
// to 2 × every after its last.)
func fullResyncDue(key string, at, prev time.Time, every time.Duration) bool {
	if every <= 0 {
		return true
	}
	h := fnv.New64a()
	_, _ = io.WriteString(h, key)
	phase := int64(h.Sum64() % uint64(every))
	// pos: how long before at the app's last phase point was.
	pos := (at.UnixNano() - phase) % int64(every)
	if pos < 0 {
		pos += int64(every)
	}
	return pos < int64(min(at.Sub(prev), every))
}

// crawler crawls one app per crawl job (crawlApp); the scheduler plans the
// cycles and the crawl worker hands it their jobs. Per app, the stats path
// (details → one app-stats message) and the reviews path (newest reviews →
// one message each) fail independently, and a failing app never stops the
// cycle.
type crawler struct {
	cfg     crawlerConfig
	store   storeReader
	known   crawlState
	pub     crawlPublisher
	metrics *crawlMetrics
	logger  *slog.Logger
}

func newCrawler(cfg crawlerConfig, store storeReader, known crawlState, pub crawlPublisher, reg prometheus.Registerer, logger *slog.Logger) *crawler {
	return &crawler{cfg: cfg, store: store, known: known, pub: pub, metrics: newCrawlMetrics(reg, cfg.Interval), logger: logger}
}

// Crawl paths, as metric labels.
const (
	pathStats   = "stats"
	pathReviews = "reviews"
)

// cycleSummary is the outcome of one cycle (crawl --once: of the jobs this
// process crawled).
type cycleSummary struct {
	Apps      int // crawls: one per app and storefront
	StatsOK   int
	ReviewsOK int
	Reviews   int            // review messages published
	Failures  map[string]int // "path/reason" → apps
	Requests  int            // Play Store requests, both paths, retries included
	Skipped   int            // reviews pages the incremental stop spared (estimated)
	FullReads int            // apps whose reviews were read in full: resync due, nothing stored, or stored reviews unreadable
	Duration  time.Duration
}

func (s cycleSummary) String() string {
	keys := make([]string, 0, len(s.Failures))
	for k := range s.Failures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var fails []string
	for _, k := range keys {
		fails = append(fails, fmt.Sprintf("%s=%d", k, s.Failures[k]))
	}
	f := "none"
	if len(fails) > 0 {
		f = strings.Join(fails, " ")
	}
	return fmt.Sprintf("app_stats: %d/%d, reviews: %d/%d (%d review messages), failures: %s, requests: %d, reviews pages skipped: %d, full reviews reads: %d, took %s",
		s.StatsOK, s.Apps, s.ReviewsOK, s.Apps, s.Reviews, f, s.Requests, s.Skipped, s.FullReads, s.Duration.Round(time.Millisecond))
}

// appResult is what crawling one app gave, per path.
type appResult struct {
	pkg        string
	statsErr   error
	reviewsErr error
	reviews    int
	requests   int  // Play Store requests, both paths
	skipped    int  // reviews pages spared by the incremental stop
	fullRead   bool // the reviews path did not stop at known reviews
}

func (s *cycleSummary) add(r appResult) {
	s.Reviews += r.reviews
	s.Requests += r.requests
	s.Skipped += r.skipped
	if r.fullRead {
		s.FullReads++
	}
	if r.statsErr == nil {
		s.StatsOK++
	} else {
		s.Failures[pathStats+"/"+crawlFailureReason(r.statsErr)]++
	}
	if r.reviewsErr == nil {
		s.ReviewsOK++
	} else {
		s.Failures[pathReviews+"/"+crawlFailureReason(r.reviewsErr)]++
	}
}

// crawlFailureReason is the metric and log label of a path's outcome ("ok"
// for nil).
func crawlFailureReason(err error) string {
	var perr *publishError
	switch {
	case errors.As(err, &perr):
		return "publish_failed"
	case errors.Is(err, context.Canceled):
		return "canceled"
	default:
		return errorReason(err)
	}
}

// crawlApp runs both paths of one app. Whatever was fetched is published,
// even when the fetch ended early (a reviews page failing after others).
// AppTimeout bounds the reading, not the publishing of what was read.
// Every message carries the job's CrawledAt, which the raw archive records
// with each page, so that a reparse publishes the same messages again.
func (c *crawler) crawlApp(ctx context.Context, j crawlJob) appResult {
	a := j.App
	ctx = withCrawlTime(ctx, j.CrawledAt)
	loc := j.Locale
	r := appResult{pkg: a.PackageName}
	tally := &requestTally{}
	fetchCtx, cancel := context.WithTimeout(withRequestTally(ctx, tally), c.cfg.AppTimeout)
	defer cancel()

	details, err := c.store.Details(fetchCtx, a.PackageName, loc.Lang, loc.Country)
	if err == nil {
		m := appStatsFromDetails(details, loc)
		m.CrawledAt = j.CrawledAt
		err = c.pub.PublishAppStats(ctx, m)
	}
	r.statsErr = err
	c.observe(a.PackageName, loc, pathStats, err)
	c.recordOutcome(ctx, j, pathStats, err)

	if errors.Is(r.statsErr, errNotFound) {
		// The listing does not exist in this storefront; a reviews request
		// cannot tell that apart from "no reviews", so it is not sent.
		r.reviewsErr = r.statsErr
	} else {
		p := c.reviewsPaging(fetchCtx, j)
		revs, ferr := c.store.Reviews(fetchCtx, a.PackageName, loc.Lang, loc.Country, c.cfg.ReviewsPerApp, p.stop)
		var perr error
		if len(revs) > 0 {
			msgs := make([]reviewMessage, len(revs))
			for i, rv := range revs {
				msgs[i] = reviewMessageFrom(a.PackageName, loc, rv)
				msgs[i].CrawledAt = j.CrawledAt
			}
			if perr = c.pub.PublishReviews(ctx, a.PackageName, msgs); perr == nil {
				r.reviews = len(msgs)
			}
		}
		r.reviewsErr = errors.Join(perr, ferr)
		r.fullRead = p.stop == nil
		if r.reviewsErr == nil && len(revs) > 0 {
			// Complete: the paging ended at the store's end, at
			// REVIEWS_PER_APP or at a review at or before the mark, and
			// all of it is published. A cut read moves no mark, so the
			// next one reads down past what this one published.
			c.setReadMark(ctx, j, revs)
		}
		if p.stopped {
			// What a full read would have asked for: REVIEWS_PER_APP, or
			// as many as are stored if fewer, in pages like the ones read.
			full := min(c.cfg.ReviewsPerApp, max(p.stored, len(revs)))
			r.skipped = max(0, (full+p.pageLen-1)/p.pageLen-p.pages)
			c.metrics.pagesSkipped.Add(float64(r.skipped))
		}
		c.logger.Debug("reviews read", "package", a.PackageName, "country", loc.Country, "lang", loc.Lang, "full", r.fullRead, "reason", p.reason,
			"requests", tally.count("reviews"), "reviews", len(revs), "pages_skipped", r.skipped)
	}
	c.observe(a.PackageName, loc, pathReviews, r.reviewsErr)
	c.recordOutcome(ctx, j, pathReviews, r.reviewsErr)
	stats, reviews := tally.count("details"), tally.count("reviews")
	c.metrics.requests.WithLabelValues(pathStats).Observe(float64(stats))
	c.metrics.requests.WithLabelValues(pathReviews).Observe(float64(reviews))
	r.requests = stats + reviews

	if r.statsErr != nil || r.reviewsErr != nil {
		c.logger.Warn("app crawl failed", "package", a.PackageName, "lang", loc.Lang, "country", loc.Country,
			"stats_err", r.statsErr, "reviews_err", r.reviewsErr, "reviews_published", r.reviews)
	}
	return r
}

// reviewsPaging is how one crawl pages an app's reviews: stop is nil for a
// full read, else it ends the paging at the first page that reaches a
// stored review at or before the read mark (docs/design.md "Incremental
// review paging").
type reviewsPaging struct {
	stop    func(page []review) bool
	reason  string // why the read is full or incremental, for the log
	stopped bool   // stop ended the paging
	pages   int    // pages stop saw
	pageLen int    // reviews on the longest of them
	stored  int    // the app's stored reviews, up to REVIEWS_PER_APP
}

// reviewsPaging decides between a full and an incremental read: full when a
// resync is due, when nothing of the app is stored, when no read of its
// storefront was complete yet, or when what is stored cannot be read (which
// never fails the crawl).
func (c *crawler) reviewsPaging(ctx context.Context, j crawlJob) *reviewsPaging {
	p := &reviewsPaging{}
	if j.FullResync {
		p.reason = "resync_due"
		c.metrics.fullResyncs.Inc()
		return p
	}
	known, err := c.known.KnownReviews(ctx, j.App.PackageName, j.Locale, knownReviewsLimit, c.cfg.ReviewsPerApp)
	if err != nil {
		p.reason = "stored_unreadable"
		c.metrics.knownFailures.Inc()
		c.logger.Warn("cannot read the stored reviews; reading the app's reviews in full", "package", j.App.PackageName,
			"country", j.Locale.Country, "lang", j.Locale.Lang, "err", err)
		return p
	}
	if len(known.newest) == 0 {
		p.reason = "nothing_stored"
		return p
	}
	if known.mark.IsZero() {
		// Stored reviews, but none known to come from a complete read
		// (only cut ones so far, or stored before read marks existed).
		p.reason = "no_complete_read"
		return p
	}
	p.reason, p.stored = "incremental", known.stored
	p.stop = func(page []review) bool {
		p.pages++
		p.pageLen = max(p.pageLen, len(page))
		p.stopped = known.reached(page)
		return p.stopped
	}
	return p
}

// setReadMark records the newest of revs, a complete read's reviews, as
// the storefront's read mark, leaving out those dated more than
// readMarkMargin after the crawl time: a review with a bad future at would
// pin the mark ahead of the reviews written after it, and a cut read's
// reviews below it would end later reads. A failure only makes the next
// read longer.
func (c *crawler) setReadMark(ctx context.Context, j crawlJob, revs []review) {
	newest, ok := readMarkOf(revs, j.CrawledAt)
	if !ok {
		c.logger.Warn("every review read is dated after the crawl time; the read mark stays", "package", j.App.PackageName,
			"crawled_at", j.CrawledAt, "newest_at", slices.MaxFunc(revs, func(a, b review) int { return a.At.Compare(b.At) }).At)
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), crawlStateWriteTimeout)
	defer cancel()
	if err := c.known.SetReadMark(wctx, j.App.PackageName, j.Locale, newest, j.CrawledAt); err != nil {
		c.metrics.stateWriteFailures.WithLabelValues("read_mark").Inc()
		c.logger.Warn("cannot record the read mark; the next read of the app's reviews goes deeper", "package", j.App.PackageName,
			"country", j.Locale.Country, "lang", j.Locale.Lang, "err", err)
	}
}

// readMarkOf is the newest of revs dated at most readMarkMargin after the
// crawl time readAt; false when there is none.
func readMarkOf(revs []review, readAt time.Time) (review, bool) {
	limit := readAt.Add(readMarkMargin)
	var newest review
	ok := false
	for _, rv := range revs {
		if !rv.At.After(limit) && (!ok || rv.At.After(newest.At)) {
			newest, ok = rv, true
		}
	}
	return newest, ok
}

// recordOutcome writes path's outcome to app_crawl_outcomes, also for a
// canceled crawl (the context's end does not stop the write). A failure is
// logged and counted, never the crawl's.
func (c *crawler) recordOutcome(ctx context.Context, j crawlJob, path string, err error) {
	o := crawlOutcomeOf(ctx, err)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), crawlStateWriteTimeout)
	defer cancel()
	if werr := c.known.RecordOutcome(wctx, j.App.PackageName, j.Locale, path, o); werr != nil {
		c.metrics.stateWriteFailures.WithLabelValues("outcome").Inc()
		c.logger.Warn("cannot record the crawl outcome", "package", j.App.PackageName, "country", j.Locale.Country, "lang", j.Locale.Lang, "path", path, "outcome", o.Outcome, "err", werr)
	}
}

func (c *crawler) observe(pkg string, loc locale, path string, err error) {
	outcome := crawlFailureReason(err)
	c.metrics.apps.WithLabelValues(path, outcome).Inc()
	m := c.metrics
	m.knownMu.Lock()
	defer m.knownMu.Unlock()
	switch outcome {
	case "ok":
		m.lastSuccess.WithLabelValues(pkg, loc.Country, loc.Lang, path).SetToCurrentTime()
		m.failures.WithLabelValues(pkg, loc.Country, loc.Lang, path).Set(0)
	case "canceled":
		// A crawl cut short by shutdown says nothing about the app.
		return
	default:
		m.failures.WithLabelValues(pkg, loc.Country, loc.Lang, path).Inc()
	}
	m.known[appStorefront{pkg, loc}] = time.Now()
}

// appStorefront is an app (by package) in one storefront: what a per-app
// series is of.
type appStorefront struct {
	pkg string
	loc locale
}

// forget drops the per-app series of k; the caller holds knownMu.
func (m *crawlMetrics) forget(k appStorefront) {
	l := prometheus.Labels{"package": k.pkg, "country": k.loc.Country, "lang": k.loc.Lang}
	m.lastSuccess.DeletePartialMatch(l)
	m.failures.DeletePartialMatch(l)
	delete(m.known, k)
}

// forgetInactive drops the per-app series of apps and storefronts no longer
// active, so a deleted app, or a storefront taken off an app, neither
// alerts as stale nor stays on the dashboards.
func (m *crawlMetrics) forgetInactive(active map[appStorefront]bool) {
	m.knownMu.Lock()
	defer m.knownMu.Unlock()
	for k := range m.known {
		if !active[k] {
			m.forget(k)
		}
	}
}

// forgetStale drops the per-app series of apps and storefronts this process
// has not crawled for 2 × CRAWL_INTERVAL: their crawl-jobs partition went
// to another instance (or the app was deleted, which only the leader sees).
// The fleet's alert takes the newest success and the shortest streak over
// the instances, so a stale series would hide an app failing elsewhere.
func (m *crawlMetrics) forgetStale(now time.Time) {
	m.knownMu.Lock()
	defer m.knownMu.Unlock()
	for k, at := range m.known {
		if now.Sub(at) >= m.forgetAfter {
			m.forget(k)
		}
	}
}

// appSeriesCollector serves the per-app series, forgetting the stale ones
// first: at each scrape, so also on an instance that gets no jobs at all.
type appSeriesCollector struct{ m *crawlMetrics }

func (c appSeriesCollector) Describe(ch chan<- *prometheus.Desc) {
	c.m.lastSuccess.Describe(ch)
	c.m.failures.Describe(ch)
}

func (c appSeriesCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.forgetStale(time.Now())
	c.m.lastSuccess.Collect(ch)
	c.m.failures.Collect(ch)
}

type crawlMetrics struct {
	busy          prometheus.Gauge
	apps          *prometheus.CounterVec
	cycleDuration prometheus.Histogram
	cycles        prometheus.Counter
	overruns      prometheus.Counter
	lastCycle     prometheus.Gauge
	lastSuccess   *prometheus.GaugeVec
	failures      *prometheus.GaugeVec
	interval      prometheus.Gauge
	newApps       prometheus.Counter
	requests      *prometheus.HistogramVec
	pagesSkipped  prometheus.Counter
	fullResyncs   prometheus.Counter
	knownFailures prometheus.Counter
	// stateWriteFailures: writes of read marks and outcomes that failed.
	stateWriteFailures *prometheus.CounterVec

	// known are the apps and storefronts with per-app series, with the
	// time of their last crawl; the lock also keeps a forget from racing an
	// observe of the same app.
	knownMu     sync.Mutex
	known       map[appStorefront]time.Time
	forgetAfter time.Duration // 2 × CRAWL_INTERVAL
}

// newCrawlMetrics registers the crawl metrics. The interval and the per-app
// failure streak let an alert find an app that has not succeeded for two
// intervals, also one that never succeeded (docs/design.md "Failure rules").
func newCrawlMetrics(reg prometheus.Registerer, interval time.Duration) *crawlMetrics {
	mk := metricMaker{reg}
	perApp := metricMaker{} // registered through appSeriesCollector, which forgets stale series first
	m := &crawlMetrics{
		known:       map[appStorefront]time.Time{},
		forgetAfter: 2 * interval,
		busy:        mk.gauge("playwatch_crawl_workers_busy", "Workers crawling an app right now (at most CRAWL_WORKERS)."),
		apps: mk.counterVec("playwatch_crawl_app_paths_total",
			"Crawled app paths (stats, reviews) by outcome (ok, not_found, rate_limited, parse_error, error, publish_failed, canceled).", "path", "outcome"),
		cycleDuration: mk.histogram("playwatch_crawl_cycle_duration_seconds", "Duration of crawl cycles.", prometheus.ExponentialBuckets(1, 2, 14)),
		cycles:        mk.counter("playwatch_crawl_cycles_total", "Crawl cycles completed."),
		overruns:      mk.counter("playwatch_crawl_overruns_total", "Cycles that took longer than CRAWL_INTERVAL."),
		lastCycle:     mk.gauge("playwatch_crawl_last_cycle_timestamp_seconds", "Unix time at which the last complete cycle ended."),
		lastSuccess: perApp.gaugeVec("playwatch_crawl_last_success_timestamp_seconds",
			"Unix time of the last successful crawl of an app's path in a storefront (country, lang): data freshness per app and storefront.",
			"package", "country", "lang", "path"),
		failures: perApp.gaugeVec("playwatch_crawl_consecutive_failures",
			"Crawls of an app's path in a storefront (country, lang) in a row that failed (0 after a success); present from the first crawl, so an app that never succeeded shows too.",
			"package", "country", "lang", "path"),
		interval: mk.gauge("playwatch_crawl_interval_seconds", "CRAWL_INTERVAL: time between the starts of two crawl cycles."),
		newApps: mk.counter("playwatch_crawl_new_apps_total",
			"App storefronts crawled between cycles because they became active (a new app, or a storefront added to an app) after their cycle began."),
		requests: mk.histogramVec("playwatch_crawl_requests_per_app", "Play Store requests (retries included) of one app's crawl, by path (stats, reviews).",
			[]float64{0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 15, 20, 30}, "path"),
		pagesSkipped: mk.counter("playwatch_crawl_review_pages_skipped_total",
			"Reviews pages not requested because the paging reached stored reviews: the rest of REVIEWS_PER_APP, estimated from the pages read."),
		fullResyncs: mk.counter("playwatch_crawl_full_resyncs_total",
			"App crawls that read REVIEWS_PER_APP reviews because a full resync was due (REVIEWS_FULL_SYNC_INTERVAL, or a new or reactivated app)."),
		knownFailures: mk.counter("playwatch_crawl_known_reviews_failures_total",
			"App crawls whose stored reviews could not be read from PostgreSQL, read in full instead."),
		stateWriteFailures: mk.counterVec("playwatch_crawl_state_write_failures_total",
			"Writes to PostgreSQL after a crawl that failed, by what: read_mark (review_read_marks; the next read goes deeper), outcome (app_crawl_outcomes).", "what"),
	}
	reg.MustRegister(appSeriesCollector{m})
	m.interval.Set(interval.Seconds())
	// Every outcome exists from the start: increase() sees the first parse
	// error of a counter that is already there, not one born at 1.
	for _, path := range []string{pathStats, pathReviews} {
		for _, outcome := range []string{"ok", "not_found", "rate_limited", "parse_error", "error", "publish_failed", "canceled"} {
			m.apps.WithLabelValues(path, outcome)
		}
	}
	for _, what := range []string{"read_mark", "outcome"} {
		m.stateWriteFailures.WithLabelValues(what)
	}
	return m
}
