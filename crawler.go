package main

import (
	"context"
	"errors"
	"fmt"
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
	Reviews(ctx context.Context, pkg, lang, country string, n int) ([]review, error)
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

// crawlJob is one app's crawl in one cycle.
type crawlJob struct {
	App        app
	CrawledAt  time.Time // the crawl's time: every message of this crawl carries it as crawled_at, the raw archive records it
	FullResync bool      // read REVIEWS_PER_APP reviews even if a known one is reached
}

// crawlerConfig is the crawl part of Config.
type crawlerConfig struct {
	Interval      time.Duration // CRAWL_INTERVAL
	Workers       int           // CRAWL_WORKERS
	ReviewsPerApp int           // REVIEWS_PER_APP
	AppTimeout    time.Duration // CRAWL_APP_TIMEOUT: reading one app, both paths
	NewAppCheck   time.Duration // CRAWL_NEW_APP_CHECK: between looks for apps new since the cycle began
	Locales       localeDefaults
}

// crawler runs cycles: each reads the active apps and crawls them in a
// bounded worker pool. Per app, the stats path (details → one app-stats
// message) and the reviews path (newest reviews → one message each) fail
// independently, and a failing app never stops the cycle.
type crawler struct {
	cfg     crawlerConfig
	apps    activeAppLister
	store   storeReader
	pub     crawlPublisher
	metrics *crawlMetrics
	logger  *slog.Logger

	// crawled are the apps of the current cycle, and those crawled early
	// since it began; nil until the first cycle has listed its apps. early
	// is the app the new-app watch is crawling: a cycle that begins
	// meanwhile counts that crawl as its own.
	crawledMu sync.Mutex
	crawled   map[string]bool
	early     string
}

func newCrawler(cfg crawlerConfig, apps activeAppLister, store storeReader, pub crawlPublisher, reg prometheus.Registerer, logger *slog.Logger) *crawler {
	return &crawler{cfg: cfg, apps: apps, store: store, pub: pub, metrics: newCrawlMetrics(reg), logger: logger}
}

// Crawl paths, as metric labels.
const (
	pathStats   = "stats"
	pathReviews = "reviews"
)

// cycleSummary is the outcome of one cycle.
type cycleSummary struct {
	Apps      int
	StatsOK   int
	ReviewsOK int
	Reviews   int            // review messages published
	Failures  map[string]int // "path/reason" → apps
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
	return fmt.Sprintf("app_stats: %d/%d, reviews: %d/%d (%d review messages), failures: %s, took %s",
		s.StatsOK, s.Apps, s.ReviewsOK, s.Apps, s.Reviews, f, s.Duration.Round(time.Millisecond))
}

// Run runs a cycle now and then one every Interval until ctx ends. Cycles
// never overlap: one that outlasts the interval is followed at once by the
// next, and the overrun is logged and counted.
//
// Between the cycles' starts, every NewAppCheck it crawls the apps that
// became active since the cycle began (registered or reactivated), so that
// a new app has data within a minute, not within the hour; the next cycle
// crawls it with all the others.
func (c *crawler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for sleepOn(ctx, systemClock{}, c.cfg.NewAppCheck) == nil {
			if err := c.crawlNewApps(ctx); err != nil && ctx.Err() == nil {
				c.logger.Warn("cannot look for newly registered apps", "err", err)
			}
		}
	})
	return runEvery(ctx, c.cfg.Interval, func(ctx context.Context) {
		if _, err := c.RunCycle(ctx); err != nil && ctx.Err() == nil {
			c.logger.Error("crawl cycle failed", "err", err)
		}
	}, c.metrics.overruns, c.logger)
}

// crawlNewApps crawls, one after the other, the active apps that neither
// the current cycle nor an earlier look has crawled.
func (c *crawler) crawlNewApps(ctx context.Context) error {
	apps, err := c.apps.ListActive(ctx)
	if err != nil {
		return fmt.Errorf("list active apps: %w", err)
	}
	for _, a := range apps {
		c.crawledMu.Lock()
		fresh := c.crawled != nil && !c.crawled[a.PackageName]
		if fresh {
			c.crawled[a.PackageName], c.early = true, a.PackageName
		}
		c.crawledMu.Unlock()
		if !fresh {
			continue
		}
		c.logger.Info("crawling a newly active app now; the next cycle crawls it with the others", "package", a.PackageName)
		c.metrics.newApps.Inc()
		c.crawlApp(ctx, crawlJob{App: a, CrawledAt: messageTime(time.Now())})
		c.crawledMu.Lock()
		c.early = ""
		c.crawledMu.Unlock()
	}
	return nil
}

// runEvery calls cycle at once, then every interval, one call at a time.
func runEvery(ctx context.Context, interval time.Duration, cycle func(context.Context), overruns prometheus.Counter, logger *slog.Logger) error {
	for {
		start := time.Now()
		cycle(ctx)
		if ctx.Err() != nil {
			return nil
		}
		elapsed := time.Since(start)
		if elapsed >= interval {
			overruns.Inc()
			logger.Warn("crawl cycle took longer than CRAWL_INTERVAL; starting the next one now",
				"took", elapsed.Round(time.Millisecond), "interval", interval)
			continue
		}
		t := time.NewTimer(interval - elapsed)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// RunCycle crawls every active app once.
func (c *crawler) RunCycle(ctx context.Context) (cycleSummary, error) {
	start := time.Now()
	crawledAt := messageTime(start)
	sum := cycleSummary{Failures: map[string]int{}}
	apps, err := c.apps.ListActive(ctx)
	if err != nil {
		return sum, fmt.Errorf("list active apps: %w", err)
	}
	crawled := make(map[string]bool, len(apps))
	c.crawledMu.Lock()
	apps = slices.DeleteFunc(apps, func(a app) bool { return a.PackageName == c.early })
	for _, a := range apps {
		crawled[a.PackageName] = true
	}
	if c.early != "" {
		crawled[c.early] = true
	}
	c.crawled = crawled
	c.crawledMu.Unlock()
	sum.Apps = len(apps)
	if len(apps) == 0 {
		c.logger.Info("no active apps to crawl; register some with POST /api/v1/apps")
		return sum, nil
	}
	c.logger.Info("crawl cycle started", "apps", len(apps), "workers", c.cfg.Workers)
	c.metrics.queueDepth.Set(float64(len(apps)))

	var mu sync.Mutex
	queue := make(chan app, c.cfg.Workers)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range queue {
				c.metrics.queueDepth.Dec()
				c.metrics.busy.Inc()
				r := c.crawlApp(ctx, crawlJob{App: a, CrawledAt: crawledAt})
				c.metrics.busy.Dec()
				mu.Lock()
				sum.add(r)
				mu.Unlock()
			}
		}()
	}
feed:
	for _, a := range apps {
		select {
		case queue <- a:
		case <-ctx.Done():
			break feed
		}
	}
	close(queue)
	wg.Wait()
	c.metrics.queueDepth.Set(0)

	sum.Duration = time.Since(start)
	c.metrics.cycleDuration.Observe(sum.Duration.Seconds())
	if ctx.Err() != nil {
		c.logger.Warn("crawl cycle cut short by shutdown", "summary", sum.String())
		return sum, ctx.Err()
	}
	c.metrics.cycles.Inc()
	c.metrics.lastCycle.SetToCurrentTime()
	c.logger.Info("crawl cycle finished", "summary", sum.String())
	return sum, nil
}

// appResult is what crawling one app gave, per path.
type appResult struct {
	pkg        string
	statsErr   error
	reviewsErr error
	reviews    int
}

func (s *cycleSummary) add(r appResult) {
	s.Reviews += r.reviews
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
func (c *crawler) crawlApp(ctx context.Context, j crawlJob) appResult {
	a := j.App
	loc := c.cfg.Locales.forApp(a.IsIranianApp)
	r := appResult{pkg: a.PackageName}
	fetchCtx, cancel := context.WithTimeout(ctx, c.cfg.AppTimeout)
	defer cancel()

	details, err := c.store.Details(fetchCtx, a.PackageName, loc.Lang, loc.Country)
	if err == nil {
		m := appStatsFromDetails(details)
		m.CrawledAt = messageTime(j.CrawledAt)
		err = c.pub.PublishAppStats(ctx, m)
	}
	r.statsErr = err
	c.observe(a.PackageName, pathStats, err)

	if errors.Is(r.statsErr, errNotFound) {
		// The listing does not exist in this storefront; a reviews request
		// cannot tell that apart from "no reviews", so it is not sent.
		r.reviewsErr = r.statsErr
	} else {
		revs, ferr := c.store.Reviews(fetchCtx, a.PackageName, loc.Lang, loc.Country, c.cfg.ReviewsPerApp)
		var perr error
		if len(revs) > 0 {
			msgs := make([]reviewMessage, len(revs))
			for i, rv := range revs {
				msgs[i] = reviewMessageFrom(a.PackageName, rv)
				msgs[i].CrawledAt = messageTime(j.CrawledAt)
			}
			if perr = c.pub.PublishReviews(ctx, a.PackageName, msgs); perr == nil {
				r.reviews = len(msgs)
			}
		}
		r.reviewsErr = errors.Join(perr, ferr)
	}
	c.observe(a.PackageName, pathReviews, r.reviewsErr)

	if r.statsErr != nil || r.reviewsErr != nil {
		c.logger.Warn("app crawl failed", "package", a.PackageName, "lang", loc.Lang, "country", loc.Country,
			"stats_err", r.statsErr, "reviews_err", r.reviewsErr, "reviews_published", r.reviews)
	}
	return r
}

func (c *crawler) observe(pkg, path string, err error) {
	c.metrics.apps.WithLabelValues(path, crawlFailureReason(err)).Inc()
	if err == nil {
		c.metrics.lastSuccess.WithLabelValues(pkg, path).SetToCurrentTime()
	}
}

type crawlMetrics struct {
	queueDepth    prometheus.Gauge
	busy          prometheus.Gauge
	apps          *prometheus.CounterVec
	cycleDuration prometheus.Histogram
	cycles        prometheus.Counter
	overruns      prometheus.Counter
	lastCycle     prometheus.Gauge
	lastSuccess   *prometheus.GaugeVec
	newApps       prometheus.Counter
}

func newCrawlMetrics(reg prometheus.Registerer) *crawlMetrics {
	m := &crawlMetrics{
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "playwatch_crawl_queue_depth",
			Help: "Apps of the running cycle not yet taken by a worker.",
		}),
		busy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "playwatch_crawl_workers_busy",
			Help: "Workers crawling an app right now (at most CRAWL_WORKERS).",
		}),
		apps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "playwatch_crawl_app_paths_total",
			Help: "Crawled app paths (stats, reviews) by outcome (ok, not_found, rate_limited, parse_error, error, publish_failed, canceled).",
		}, []string{"path", "outcome"}),
		cycleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "playwatch_crawl_cycle_duration_seconds",
			Help:    "Duration of crawl cycles.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		cycles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "playwatch_crawl_cycles_total",
			Help: "Crawl cycles completed.",
		}),
		overruns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "playwatch_crawl_overruns_total",
			Help: "Cycles that took longer than CRAWL_INTERVAL.",
		}),
		lastCycle: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "playwatch_crawl_last_cycle_timestamp_seconds",
			Help: "Unix time at which the last complete cycle ended.",
		}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "playwatch_crawl_last_success_timestamp_seconds",
			Help: "Unix time of the last successful crawl of an app's path: data freshness per app.",
		}, []string{"package", "path"}),
		newApps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "playwatch_crawl_new_apps_total",
			Help: "Apps crawled between cycles because they became active after their cycle began.",
		}),
	}
	reg.MustRegister(m.queueDepth, m.busy, m.apps, m.cycleDuration, m.cycles, m.overruns, m.lastCycle, m.lastSuccess, m.newApps)
	return m
}
