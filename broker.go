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
	// RetentionCheck is how often topic retention runs (log.cleaner.backoff.ms).
	RetentionCheck time.Duration
}

// embeddedBroker is franz-go's kfake serving the Kafka protocol on a TCP
// listener. Every role talks to it through a normal franz-go client, exactly
// as to Redpanda.
type embeddedBroker struct {
	cluster *kfake.Cluster
}

func startEmbeddedBroker(opts embeddedBrokerOptions, logger *slog.Logger) (*embeddedBroker, error) {
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, opts.Addr) }),
		kfake.DataDir(opts.DataDir),
		kfake.WithLogger(kfakeLogger{logger}),
		kfake.BrokerConfigs(map[string]string{
			"log.cleaner.backoff.ms": strconv.FormatInt(opts.RetentionCheck.Milliseconds(), 10),
		}),
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
	Retention   time.Duration
}

// ensureTopics creates the topics that do not exist yet, on the embedded
// broker and on real clusters alike; existing topics are left as they are.
func ensureTopics(ctx context.Context, adm *kadm.Client, spec topicSpec, topics []string, logger *slog.Logger) error {
	retention := strconv.FormatInt(spec.Retention.Milliseconds(), 10)
	resps, err := adm.CreateTopics(ctx, int32(spec.Partitions), int16(spec.Replication),
		map[string]*string{"retention.ms": &retention}, topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	for _, t := range topics {
		r, err := resps.On(t, nil)
		switch {
		case err == nil && r.Err == nil:
			logger.Info("created topic", "topic", t, "partitions", spec.Partitions, "retention", spec.Retention)
		case err == nil && errors.Is(r.Err, kerr.TopicAlreadyExists):
		case err == nil:
			return fmt.Errorf("create topic %s: %w (%s)", t, r.Err, r.ErrMessage)
		default:
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}
