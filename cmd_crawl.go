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

func cmdCrawl(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	var once bool
	cl, err := parseCommandLine("crawl", "crawl [--once] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&once, "once", false, "plan one cycle now, crawl it, print its summary and exit; refused while another playwatch leads "+
			"(default: the crawler role of run: the scheduler and the crawl workers)")
	})
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("crawl takes no arguments, got %q", cl.args)}
	}
	cfg, logger := cl.cfg, cl.logger
	be, err := openBackends(ctx, cfg, logger, backendOptions{broker: true, attach: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, be.shutdown(ctx, cfg.ShutdownTimeout)) }()
	cr, err := newCrawlerRole(cfg, be, prometheus.NewRegistry(), logger)
	if err != nil {
		return err
	}
	if !once {
		return cr.run(ctx)
	}
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
