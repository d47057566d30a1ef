package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func cmdCrawl(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var once bool
	cl, err := parseNoArgs("crawl", "crawl [--once] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&once, "once", false, "plan one cycle now, crawl it, print its summary and exit; refused while another playwatch leads "+
			"(default: the crawler role of run: the scheduler and the crawl workers)")
	})
	if err != nil {
		return err
	}
	return cl.attach(ctx, backendOptions{broker: true}, func(be *backends) error {
		cr, err := newCrawlerRole(cl.cfg, be, prometheus.NewRegistry(), cl.logger)
		if err != nil {
			return err
		}
		if !once {
			return cr.run(ctx)
		}
		return crawlOnce(ctx, cr, stdout)
	})
}

// crawlOnce is `crawl --once`: it plans one cycle, crawls it and prints
// its summary.
func crawlOnce(ctx context.Context, cr *crawlerRole, stdout io.Writer) error {
	start := time.Now()
	var mu sync.Mutex
	sums := map[int64]*cycleSummary{}
	cr.worker.done = func(m crawlJobMessage, r appResult) {
		mu.Lock()
		defer mu.Unlock()
		if sums[m.CycleID] == nil {
			sums[m.CycleID] = &cycleSummary{Failures: map[string]int{}}
		}
		sums[m.CycleID].Apps++
		sums[m.CycleID].add(r)
	}
	wctx, stop := context.WithCancel(ctx)
	worked := make(chan error, 1)
	go func() { worked <- cr.worker.Run(wctx, cr.jobs) }()
	c, err := cr.sched.RunOnce(ctx)
	stop()
	err = errors.Join(err, <-worked)
	if err != nil {
		return err
	}
	sum := cycleSummary{Failures: map[string]int{}}
	if c != nil && sums[c.ID] != nil {
		sum = *sums[c.ID]
	}
	sum.Duration = time.Since(start)
	fmt.Fprintln(stdout, sum)
	return nil
}
