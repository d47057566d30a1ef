package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
)

// The embedded broker (kfake) keeps only an index in memory while it runs,
// but at a start it reads every retained segment file whole: one segment per
// partition at a time after a clean stop, every partition entire after a
// crash. So what it retains on disk is what a restart costs in memory, and
// PLAYWATCH_BROKER_MAX_BYTES bounds it: each topic gets a share, split evenly
// over its partitions, and the keeper below deletes (DeleteRecords) the
// oldest records of a partition beyond its share or older than the topic
// retention. kfake's own retention.bytes and retention.ms would do that
// without regard to the storage consumer, so they are off on these topics.

// topicShare is how the byte budget treats one topic.
type topicShare struct {
	weight  int64 // its part of the budget, relative to the other topics'
	drained bool  // the storage consumer reads it: a record it has not stored is never deleted
	// jobs: the crawl workers' group reads it: a job it has not committed
	// is never deleted, and one it has goes at the next trim.
	jobs bool
}

// topicShares has a row for every topic playwatch puts on the embedded
// broker; planBrokerBudget refuses a topic without one. Reviews are most of
// the volume: every cycle publishes each app's newest reviews again.
//
// A topic added later gets its row here. One that nobody has to drain (a
// raw-pages archive) is drained: false and is trimmed freely within its
// share; crawl-jobs has the crawl workers' committed offsets as its floor,
// as drained topics have the storage consumer's.
var topicShares = map[string]topicShare{
	topicReviews:        {weight: 8, drained: true},
	topicAppStats:       {weight: 1, drained: true},
	topicNetworkMetrics: {weight: 1, drained: true},
	// Nobody drains the archive: its oldest pages go first, whatever the
	// crawl's pace (README, "Raw page archive").
	topicRawPages: {weight: 6, drained: false},
	// A cycle's jobs are a few hundred bytes per app and useless once done:
	// no share, only what the workers have not committed stays.
	topicCrawlJobs: {weight: 0, jobs: true},
}

// brokerBudget is PLAYWATCH_BROKER_MAX_BYTES split over the topics, and the
// time retention of the embedded broker.
type brokerBudget struct {
	total     int64
	retention time.Duration
	shares    map[string]int64 // bytes of each topic's share
}

func planBrokerBudget(total int64, retention time.Duration, topics []string) (brokerBudget, error) {
	var weights int64
	for _, t := range topics {
		s, ok := topicShares[t]
		if !ok {
			return brokerBudget{}, fmt.Errorf("topic %s has no share of PLAYWATCH_BROKER_MAX_BYTES: add it to topicShares", t)
		}
		weights += s.weight
	}
	b := brokerBudget{total: total, retention: retention, shares: map[string]int64{}}
	for _, t := range topics {
		b.shares[t] = total / weights * topicShares[t].weight
	}
	return b, nil
}

// segmentBytes is the embedded broker's segment size: small against the
// budget, because a trim frees disk a whole segment at a time and a start
// reads a segment whole; 1 MiB at the default 256 MiB.
func (b brokerBudget) segmentBytes() int64 { return min(max(b.total/256, 64<<10), 8<<20) }

// partitionUsage is what one partition holds against its share.
type partitionUsage struct {
	topic      string
	partition  int32
	start, end int64 // log start and end offsets
	bytes      int64 // what the broker retains of the partition
	floor      int64 // the first record that must stay: the storage consumer's next offset, or end; start while that offset may be of another log (measure)
	limit      int64 // the partition's share of the budget
}

// unstored estimates the bytes of the records the storage consumer has not
// stored yet, from the partition's average record size.
func (u partitionUsage) unstored() int64 {
	if u.end <= u.start {
		return 0
	}
	return int64(float64(u.bytes) * float64(u.end-u.floor) / float64(u.end-u.start))
}

// brokerBudgetKeeper keeps the embedded broker's topics within their shares
// and tells publishers when records the storage consumer has not stored
// fill a share. It talks to the broker over the Kafka protocol, so a one-off
// command attached to a running appliance can ask it too.
type brokerBudgetKeeper struct {
	budget brokerBudget
	adm    *kadm.Client
	// stored has the storage consumer's next offsets (consumer_offsets)
	// and its group.
	stored *consumerStore
	// jobsGroup is the crawl workers' consumer group, whose committed
	// offsets are crawl-jobs' floor.
	jobsGroup string
	logger    *slog.Logger
	metrics   *brokerBudgetMetrics
}

func newBrokerBudgetKeeper(budget brokerBudget, adm *kadm.Client, stored *consumerStore,
	reg prometheus.Registerer, logger *slog.Logger) *brokerBudgetKeeper {
	k := &brokerBudgetKeeper{budget: budget, adm: adm, stored: stored, logger: logger, metrics: newBrokerBudgetMetrics(reg)}
	for t, share := range budget.shares {
		k.metrics.share.WithLabelValues(t).Set(float64(share))
		k.metrics.trimmed.WithLabelValues(t)
	}
	return k
}

// measure reads every partition's offsets and size from the broker and the
// storage consumer's offsets from the database.
//
// A drained partition's floor is the stored offset only where the storage
// consumer has committed an offset to this broker and the stored offset is
// not beyond the log's end: otherwise it may be of a log the broker no
// longer has (data/broker deleted), and the floor is the log start until
// the consumer has stored the new log (it moves the offset back). So the
// group's commits are read first, then the stored offsets (the database
// commits before Kafka), then the broker's offsets (a stored offset read
// before can then not pass the end).
func (k *brokerBudgetKeeper) measure(ctx context.Context) ([]partitionUsage, error) {
	topics := slices.Sorted(maps.Keys(k.budget.shares))
	storedCommits, err := fetchGroupOffsets(ctx, k.adm, k.stored.group)
	if err != nil {
		return nil, err
	}
	stored, err := k.stored.loadOffsets(ctx)
	if err != nil {
		return nil, fmt.Errorf("stored offsets: %w", err)
	}
	starts, err := k.adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list start offsets: %w", err)
	}
	ends, err := k.adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	dirs, err := k.adm.DescribeAllLogDirs(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("describe log dirs: %w", err)
	}
	var commits kadm.OffsetResponses
	if _, ok := k.budget.shares[topicCrawlJobs]; ok {
		if commits, err = fetchGroupOffsets(ctx, k.adm, k.jobsGroup); err != nil {
			return nil, err
		}
	}
	partitions := map[string]int64{}
	ends.Each(func(o kadm.ListedOffset) { partitions[o.Topic]++ })
	var out []partitionUsage
	if err := eachOffsetPair(ends, starts, func(o, s kadm.ListedOffset) {
		u := partitionUsage{topic: o.Topic, partition: o.Partition, start: s.Offset, end: o.Offset, floor: o.Offset,
			limit: k.budget.shares[o.Topic] / partitions[o.Topic]}
		dirs.Each(func(d kadm.DescribedLogDir) {
			if p, ok := d.Topics.Lookup(o.Topic, o.Partition); ok {
				u.bytes += p.Size
			}
		})
		if topicShares[o.Topic].drained {
			// No row yet: the consumer has stored nothing of the partition.
			next := stored[topicPartition{o.Topic, o.Partition}]
			u.floor = min(max(next, u.start), u.end)
			if c, ok := storedCommits.Lookup(o.Topic, o.Partition); next > u.end || !ok || c.At < 0 {
				u.floor = u.start
			}
		}
		if topicShares[o.Topic].jobs {
			u.floor = u.start // no commit yet: nothing is done
			if c, ok := commits.Lookup(o.Topic, o.Partition); ok && c.At >= 0 {
				u.floor = min(max(c.At, u.start), u.end)
			}
		}
		out = append(out, u)
	}); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b partitionUsage) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	return out, nil
}

// trim deletes, in each partition, the records older than the retention and
// the oldest ones beyond its share, never one at or after its floor. A trim
// frees whole batches, so it measures again until nothing more goes.
func (k *brokerBudgetKeeper) trim(ctx context.Context) error {
	for range 8 {
		us, err := k.measure(ctx)
		if err != nil {
			return err
		}
		retained := map[string]int64{}
		for _, u := range us {
			retained[u.topic] += u.bytes
		}
		for t, n := range retained {
			k.metrics.retained.WithLabelValues(t).Set(float64(n))
		}
		aged, err := k.adm.ListOffsetsAfterMilli(ctx, time.Now().Add(-k.budget.retention).UnixMilli(), slices.Sorted(maps.Keys(k.budget.shares))...)
		if err != nil {
			return fmt.Errorf("list offsets by time: %w", err)
		}
		var del kadm.Offsets
		for _, u := range us {
			to := u.start
			if a, ok := aged.Lookup(u.topic, u.partition); ok && a.Err == nil && a.Offset >= 0 {
				to = max(to, a.Offset)
			}
			if u.bytes > u.limit {
				keep := int64(float64(u.end-u.start) * float64(u.limit) / float64(u.bytes))
				to = max(to, u.end-keep)
			}
			if to = min(to, u.floor); to > u.start {
				del.Add(kadm.Offset{Topic: u.topic, Partition: u.partition, At: to})
			}
		}
		if len(del) == 0 {
			return nil
		}
		resps, err := k.adm.DeleteRecords(ctx, del)
		if err == nil {
			err = resps.Error()
		}
		if err != nil {
			return fmt.Errorf("delete records: %w", err)
		}
		for _, u := range us {
			if o, ok := del.Lookup(u.topic, u.partition); ok {
				k.metrics.trimmed.WithLabelValues(u.topic).Add(float64(o.At - u.start))
				k.logger.Debug("embedded broker: trimmed", "topic", u.topic, "partition", u.partition, "records", o.At-u.start,
					"bytes", u.bytes, "share", u.limit)
			}
		}
	}
	return nil
}

// keepTrimmed trims every interval until ctx ends.
func (k *brokerBudgetKeeper) keepTrimmed(ctx context.Context, interval time.Duration) {
	everyTick(ctx, interval, func(time.Time) {
		err := k.trim(ctx)
		if err == nil {
			k.metrics.passes.Inc()
		}
		if err != nil && ctx.Err() == nil {
			k.logger.Warn("embedded broker: trimming its topics to PLAYWATCH_BROKER_MAX_BYTES failed; next try in "+interval.String(), "err", err)
		}
	})
}

// full says why topic has no room now, or "" when it has: records the
// storage consumer has not stored fill a partition's share, and nothing
// there can be trimmed without losing them. The crawl waits on it
// (publisher.waitForRoom) rather than let the broker grow past the budget.
// It measures afresh each time (a few milliseconds; a send is one app's
// reviews): a crawl can publish a whole budget within a second.
func (k *brokerBudgetKeeper) full(ctx context.Context, topic string) (string, error) {
	if !topicShares[topic].drained {
		return "", nil
	}
	us, err := k.measure(ctx)
	if err != nil {
		return "", err
	}
	for _, u := range us {
		if u.topic == topic && u.unstored() >= u.limit {
			return fmt.Sprintf("partition %d of %s holds %s that the storage consumer has not stored (%d records), its whole share of PLAYWATCH_BROKER_MAX_BYTES (%s)",
				u.partition, topic, formatBytes(u.unstored()), u.end-u.floor, formatBytes(u.limit)), nil
		}
	}
	return "", nil
}

type brokerBudgetMetrics struct {
	share    *prometheus.GaugeVec
	retained *prometheus.GaugeVec
	trimmed  *prometheus.CounterVec
	passes   prometheus.Counter
}

func newBrokerBudgetMetrics(reg prometheus.Registerer) *brokerBudgetMetrics {
	mk := metricMaker{reg}
	m := &brokerBudgetMetrics{
		share:    mk.gaugeVec("playwatch_broker_budget_bytes", "Each topic's share of PLAYWATCH_BROKER_MAX_BYTES on the embedded broker.", "topic"),
		retained: mk.gaugeVec("playwatch_broker_retained_bytes", "Bytes the embedded broker retains of each topic, as of the last trim.", "topic"),
		trimmed:  mk.counterVec("playwatch_broker_trimmed_records_total", "Records deleted from the embedded broker for its byte budget or its retention, by topic.", "topic"),
		passes:   mk.counter("playwatch_broker_trim_passes_total", "Periodic passes over the embedded broker's topics that trimmed them to the budget (or found nothing to trim)."),
	}
	return m
}
