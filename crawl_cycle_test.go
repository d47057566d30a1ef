package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// RunCycle crawls every active app once in the test process, CRAWL_WORKERS
// at a time, at the crawler clock's time: the tests of crawlApp over many
// apps, without a scheduler, crawl-jobs and workers around it. The product
// plans its cycles in one place only, the scheduler (scheduler.go); this
// decides each app's full read the way a cycle planned one interval after
// the last would.
func (c *crawler) RunCycle(ctx context.Context) (cycleSummary, error) {
	start := time.Now()
	crawledAt := messageTime(c.cfg.Clock.Now())
	sum := cycleSummary{Failures: map[string]int{}}
	apps, err := c.apps.ListActive(ctx)
	if err != nil {
		return sum, fmt.Errorf("list active apps: %w", err)
	}
	active := make(map[string]bool, len(apps))
	for _, a := range apps {
		active[a.PackageName] = true
	}
	c.metrics.forgetInactive(active)
	sum.Apps = len(apps)
	var mu sync.Mutex
	queue := make(chan crawlJob)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
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
	for _, a := range apps {
		j := crawlJob{App: a, CrawledAt: crawledAt, FullResync: fullResyncDue(a.PackageName, crawledAt, crawledAt.Add(-c.cfg.Interval), c.cfg.FullSyncInterval),
			Locale: c.cfg.Locales.forApp(a.IsIranianApp)}
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
