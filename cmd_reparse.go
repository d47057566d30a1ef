package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// cmdReparse is `playwatch reparse` (reparse.go): it reads raw-pages of the
// broker it attaches to, directly (no consumer group), and publishes
// through the crawl's publisher.
func cmdReparse(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	var f reparseFlags
	cl, err := parseCommandLine("reparse", reparseSynopsis, args, getenv, stdout, stderr, f.register)
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("reparse takes no arguments, got %q", cl.args)}
	}
	w, err := f.window(time.Now())
	if err != nil {
		return err
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{broker: true, attach: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout)) }()
	rng, err := planRawRange(ctx, kadm.NewClient(be.kafka), w)
	if err != nil {
		return err
	}
	reader, err := kgo.NewClient(append(kafkaClientOptions(cl.cfg.Kafka, be.brokers), kgo.ConsumePartitions(rng.offsets()))...)
	if err != nil {
		return fmt.Errorf("kafka consumer of %s: %w", topicRawPages, err)
	}
	defer reader.Close()
	rp := &reparser{parser: storeParser{}, pkg: f.pkg, progress: stderr, logStarts: rawLogStarts(kadm.NewClient(be.kafka)),
		fetch: rawRecordFetcher(kafkaClientOptions(cl.cfg.Kafka, be.brokers))}
	if !f.dryRun {
		producer, err := newProducer(cl.cfg, be.brokers)
		if err != nil {
			return err
		}
		be.onClose(flushAndClose(producer))
		pub := newPublisher(producer, cl.cfg.Producer, prometheus.NewRegistry(), cl.logger)
		pub.gate = be.publishGate()
		rp.pub = pub
	}
	sum, err := rp.run(ctx, reader, rng)
	fmt.Fprintln(stdout, sum)
	return err
}
