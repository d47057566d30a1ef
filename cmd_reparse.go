package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// cmdReparse is `playwatch reparse` (reparse.go): it reads raw-pages of the
// broker it attaches to, directly (no consumer group), and publishes
// through the crawl's publisher.
func cmdReparse(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var f reparseFlags
	cl, err := parseNoArgs("reparse", reparseSynopsis, args, getenv, stdout, stderr, f.register)
	if err != nil {
		return err
	}
	w, err := f.window(time.Now())
	if err != nil {
		return err
	}
	return cl.attach(ctx, backendOptions{broker: true}, func(be *backends) error {
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
			pub, err := cl.publisher(be)
			if err != nil {
				return err
			}
			rp.pub = pub
		}
		sum, err := rp.run(ctx, reader, rng)
		fmt.Fprintln(stdout, sum)
		return err
	})
}
