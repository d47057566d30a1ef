package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// cycleConfig is a crawler's settings and what the tests' in-process cycle
// reads besides, which the product's scheduler and crawl workers hold.
type cycleConfig struct {
	crawlerConfig
	Workers          int            // CRAWL_WORKERS
	FullSyncInterval time.Duration  // REVIEWS_FULL_SYNC_INTERVAL; 0: always
	Locales          localeDefaults // each app's storefront
	Clock            clock          // the cycle's crawl time
}

func cycleConfigOf(cfg Config) cycleConfig {
	return cycleConfig{crawlerConfig: crawlerConfigOf(cfg), Workers: cfg.CrawlWorkers, FullSyncInterval: cfg.ReviewsFullSyncInterval,
		Locales: cfg.Locales, Clock: systemClock{}}
}

// cycleCrawler is a crawler with the tests' in-process cycle (RunCycle)
// over the active apps of apps.
type cycleCrawler struct {
	*crawler
	cycle cycleConfig // its crawlerConfig is the crawler's cfg, which tests may change
	apps  activeAppLister
}

func newCycleCrawler(cfg cycleConfig, apps activeAppLister, store storeReader, known crawlState, pub crawlPublisher, reg prometheus.Registerer, logger *slog.Logger) *cycleCrawler {
	return &cycleCrawler{crawler: newCrawler(cfg.crawlerConfig, store, known, pub, reg, logger), cycle: cfg, apps: apps}
}

// RunCycle crawls every active app once per storefront in the test process, CRAWL_WORKERS
// at a time, at the crawler clock's time: the tests of crawlApp over many
// apps, without a scheduler, crawl-jobs and workers around it. The product
// plans its cycles in one place only, the scheduler (scheduler.go); this
// decides each app's full read the way a cycle planned one interval after
// the last would.
func (c *cycleCrawler) RunCycle(ctx context.Context) (cycleSummary, error) {
	start := time.Now()
	crawledAt := messageTime(c.cycle.Clock.Now())
	sum := cycleSummary{Failures: map[string]int{}}
	apps, err := c.apps.ListActive(ctx)
	if err != nil {
		return sum, fmt.Errorf("list active apps: %w", err)
	}
	var jobs []crawlJob
	active := make(map[appStorefront]bool, len(apps))
	for _, a := range apps {
		for _, loc := range c.cycle.Locales.storefronts(a) {
			active[appStorefront{a.PackageName, loc}] = true
			jobs = append(jobs, crawlJob{App: a, CrawledAt: crawledAt, Locale: loc,
				FullResync: fullResyncDue(crawlJobKey(a.PackageName, loc), crawledAt, crawledAt.Add(-c.cfg.Interval), c.cycle.FullSyncInterval)})
		}
	}
	c.metrics.forgetInactive(active)
	sum.Apps = len(jobs)
	var mu sync.Mutex
	queue := make(chan crawlJob)
	var wg sync.WaitGroup
	for range c.cycle.Workers {
		wg.Go(func() {
			for j := range queue {
				r := c.crawlApp(ctx, j)
				mu.Lock()
				sum.add(r)
				mu.Unlock()
			}
		})
	}
feed:
	for _, j := range jobs {
		select {
		case queue <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(queue)
	wg.Wait()
	sum.Duration = time.Since(start)
	if ctx.Err() != nil {
		return sum, ctx.Err()
	}
	c.metrics.cycles.Inc()
	return sum, nil
}
