package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	dataDir string
	writes  *brokerWrites
}

func startEmbeddedBroker(opts embeddedBrokerOptions, logger *slog.Logger) (*embeddedBroker, error) {
	writes := &brokerWrites{failures: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "playwatch_broker_persist_failures_total",
		Help: "Writes of its files (segments, offsets, state) that the embedded broker failed; a failed produce is not acknowledged.",
	})}
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
		kfake.WithLogger(kfakeLogger{logger, writes}),
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
	return &embeddedBroker{cluster: c, dataDir: opts.DataDir, writes: writes}, nil
}

// Addrs are the seed brokers to give to clients.
func (b *embeddedBroker) Addrs() []string { return b.cluster.ListenAddrs() }

// Close stops the broker and syncs its files.
func (b *embeddedBroker) Close() { b.cluster.Close() }

// Collectors are the broker's metrics, for the /metrics registry.
func (b *embeddedBroker) Collectors() []prometheus.Collector {
	return []prometheus.Collector{b.writes.failures}
}

// CheckWrites is the broker's part of /readyz: an error while it cannot
// write its files. kfake answers a produce it could not write with
// UNKNOWN_SERVER_ERROR and reports the write only in its log, and only when
// something is produced; so a probe file is written in the data directory
// too, which finds a read-only or full disk while nothing is produced.
func (b *embeddedBroker) CheckWrites(context.Context) error {
	probe := filepath.Join(b.dataDir, ".playwatch-write-probe")
	err := os.WriteFile(probe, []byte("playwatch\n"), 0o600)
	if err == nil {
		err = os.Remove(probe)
	}
	if err != nil {
		b.writes.probeFailed()
		return fmt.Errorf("embedded broker cannot write its data directory: %w", err)
	}
	return b.writes.recent()
}

// brokerWriteFailureHold is how long a failed write of the broker's files
// keeps /readyz at 503 when the probe does not see its cause.
const brokerWriteFailureHold = 10 * time.Second

// brokerWrites counts the broker's failed writes and remembers the last.
type brokerWrites struct {
	failures prometheus.Counter

	mu      sync.Mutex
	n       int
	at      time.Time // of the last failed write
	last    string
	probeAt time.Time // the last time the probe could not write either
}

func (w *brokerWrites) failed(msg string) {
	w.failures.Inc()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	w.at, w.last = time.Now(), msg
}

func (w *brokerWrites) probeFailed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.probeAt = time.Now()
}

// recent is the last failed write while it is less than
// brokerWriteFailureHold old, unless a failed probe came after it: then
// the probe saw its cause, and the probe that just succeeded says it is
// gone.
func (w *brokerWrites) recent() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at.IsZero() || !w.at.After(w.probeAt) || time.Since(w.at) >= brokerWriteFailureHold {
		return nil
	}
	return fmt.Errorf("embedded broker failed to write its files %s ago (%d failed writes since start): %s",
		time.Since(w.at).Round(time.Second), w.n, w.last)
}

// kfakePersistFailures are the beginnings of kfake's log messages (their
// format strings) for a write of its files that failed: a segment or its
// index, the groups and producer-id logs, a state file, a compaction.
var kfakePersistFailures = []string{"persist ", "rebuildSegments ", "compact groups.log", "compact pids.log"}

// kfakeLogger forwards kfake's warnings and errors to slog and counts its
// failed writes.
type kfakeLogger struct {
	l      *slog.Logger
	writes *brokerWrites
}

func (k kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	if level != kfake.LogLevelError && level != kfake.LogLevelWarn {
		return
	}
	msg := fmt.Sprintf(format, args...)
	for _, p := range kfakePersistFailures {
		if strings.HasPrefix(format, p) {
			k.writes.failed(msg)
			break
		}
	}
	if level == kfake.LogLevelError {
		k.l.Error("embedded broker: " + msg)
	} else {
		k.l.Warn("embedded broker: " + msg)
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
