package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// crawlerRole is the crawler role of run and of crawl: the scheduler, which
// plans the cycles into crawl-jobs while it holds the lease, and the crawl
// worker, which crawls the jobs it is given. One path with any broker, the
// embedded one included (scheduler.go).
type crawlerRole struct {
	sched  *scheduler
	worker *crawlWorker
	jobs   *kgo.Client // the worker's crawl-jobs consumer
}

func newCrawlerRole(cfg Config, be *backends, reg prometheus.Registerer, logger *slog.Logger) (*crawlerRole, error) {
	archiver, err := be.newArchiver(cfg, reg, logger)
	if err != nil {
		return nil, err
	}
	store, err := newPlayStore(cfg, 0, archiver, reg, logger)
	if err != nil {
		return nil, err
	}
	producer, err := newProducer(cfg, be.brokers)
	if err != nil {
		return nil, err
	}
	be.onClose(flushAndClose(producer))
	pub := newPublisher(producer, cfg.Producer, reg, logger)
	pub.gate = be.publishGate()
	cr := newCrawler(crawlerConfigOf(cfg), store, newPGKnownReviews(be.pool), pub, reg, logger)
	r := &crawlerRole{
		sched:  newScheduler(schedulerConfigOf(cfg), be.pool, newAppStore(be.pool), producer, kadm.NewClient(be.kafka), cr.metrics, reg, logger),
		worker: newCrawlWorker(cr, newLeaseEpochs(be.pool), cfg.CrawlWorkers, reg, logger),
	}
	r.jobs, err = kgo.NewClient(append(kafkaClientOptions(cfg.Kafka, be.brokers), r.worker.clientOptions(cfg.CrawlJobsGroup, cfg.SchedulerLease)...)...)
	if err != nil {
		return nil, fmt.Errorf("crawl-jobs kafka client: %w", err)
	}
	be.onClose(func(context.Context) error { r.jobs.Close(); return nil })
	return r, nil
}

// run takes part in the election and crawls jobs until ctx ends.
func (r *crawlerRole) run(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- r.sched.Run(ctx) }()
	return errors.Join(r.worker.Run(ctx, r.jobs), <-done)
}
