package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
)

// embeddedBrokerOptions configures the in-process Kafka-protocol broker.
type embeddedBrokerOptions struct {
	Addr    string // listen address, e.g. 127.0.0.1:9092
	DataDir string // segment files and state survive restarts here
	Fsync   bool   // fsync every batch instead of relying on the page cache
	// RetentionCheck is how often the broker's own topic retention runs
	// (log.cleaner.backoff.ms; 0: hourly), for topics created with a
	// Retention; playwatch creates its topics there without one.
	RetentionCheck time.Duration
	// SegmentBytes is the size at which a partition starts a new segment
	// file (log.segment.bytes); 0: kfake's 100 MiB. A trim frees disk only
	// by whole segments, and a start reads a segment whole.
	SegmentBytes int64
}

// embeddedBroker is franz-go's kfake serving the Kafka protocol on a TCP
// listener. Every role talks to it through a normal franz-go client, exactly
// as to Redpanda.
type embeddedBroker struct {
	cluster *kfake.Cluster
}

func startEmbeddedBroker(opts embeddedBrokerOptions, logger *slog.Logger) (*embeddedBroker, error) {
	bcfgs := map[string]string{}
	if opts.RetentionCheck > 0 {
		bcfgs["log.cleaner.backoff.ms"] = strconv.FormatInt(opts.RetentionCheck.Milliseconds(), 10)
	}
	if opts.SegmentBytes > 0 {
		bcfgs["log.segment.bytes"] = strconv.FormatInt(opts.SegmentBytes, 10)
	}
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, opts.Addr) }),
		kfake.DataDir(opts.DataDir),
		kfake.WithLogger(kfakeLogger{logger}),
		kfake.BrokerConfigs(bcfgs),
	}
	if opts.Fsync {
		kopts = append(kopts, kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("start embedded broker on %s (data in %s): %w", opts.Addr, opts.DataDir, err)
	}
	logger.Info("embedded broker listening", "addr", c.ListenAddrs()[0], "data_dir", opts.DataDir)
	return &embeddedBroker{cluster: c}, nil
}

// Addrs are the seed brokers to give to clients.
func (b *embeddedBroker) Addrs() []string { return b.cluster.ListenAddrs() }

// Close stops the broker and syncs its files.
func (b *embeddedBroker) Close() { b.cluster.Close() }

// kfakeLogger forwards kfake's warnings and errors to slog.
type kfakeLogger struct{ l *slog.Logger }

func (k kfakeLogger) Logf(level kfake.LogLevel, msg string, args ...any) {
	switch level {
	case kfake.LogLevelError:
		k.l.Error("embedded broker: " + fmt.Sprintf(msg, args...))
	case kfake.LogLevelWarn:
		k.l.Warn("embedded broker: " + fmt.Sprintf(msg, args...))
	}
}

// topicSpec is how playwatch's topics are created.
type topicSpec struct {
	Partitions  int
	Replication int // -1: the broker's default
	// Retention is the topics' retention.ms. 0: the broker deletes nothing
	// by itself (retention.ms and retention.bytes -1); the embedded broker's
	// topics are trimmed by playwatch (broker_budget.go), which knows what
	// the storage consumer has stored.
	Retention time.Duration
}

func (s topicSpec) configs() map[string]*string {
	if s.Retention == 0 {
		return map[string]*string{"retention.ms": kadm.StringPtr("-1"), "retention.bytes": kadm.StringPtr("-1")}
	}
	return map[string]*string{"retention.ms": kadm.StringPtr(strconv.FormatInt(s.Retention.Milliseconds(), 10))}
}

// ensureTopics creates the topics that do not exist yet, on the embedded
// broker and on real clusters alike; existing topics are left as they are,
// except that on the embedded broker (Retention 0) the broker's own
// retention is switched off on topics an older playwatch created with one.
func ensureTopics(ctx context.Context, adm *kadm.Client, spec topicSpec, topics []string, logger *slog.Logger) error {
	resps, err := adm.CreateTopics(ctx, int32(spec.Partitions), int16(spec.Replication), spec.configs(), topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	var existing []string
	for _, t := range topics {
		r, err := resps.On(t, nil)
		switch {
		case err == nil && r.Err == nil:
			retention := any(spec.Retention)
			if spec.Retention == 0 {
				retention = "none: playwatch trims it"
			}
			logger.Info("created topic", "topic", t, "partitions", spec.Partitions, "retention", retention)
		case err == nil && errors.Is(r.Err, kerr.TopicAlreadyExists):
			existing = append(existing, t)
		case err == nil:
			return fmt.Errorf("create topic %s: %w (%s)", t, r.Err, r.ErrMessage)
		default:
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	if spec.Retention != 0 || len(existing) == 0 {
		return nil
	}
	var alter []kadm.AlterConfig
	for k, v := range spec.configs() {
		alter = append(alter, kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: v})
	}
	aresps, err := adm.AlterTopicConfigs(ctx, alter, existing...)
	if err == nil {
		for _, r := range aresps {
			if r.Err != nil {
				err = fmt.Errorf("%s: %w (%s)", r.Name, r.Err, r.ErrMessage)
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("switch off the broker's own retention of topics %v: %w", existing, err)
	}
	return nil
}
