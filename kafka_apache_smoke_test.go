package main

// Tests that prove the Apache Kafka test engine of kafka_apache_test.go: a
// produce/consume round trip on one node, and a leader crash under load on
// three nodes (only with PLAYWATCH_FAULT_TESTS=1, i.e. make test-faults).

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestApacheKafkaSingleNodeRoundTrip(t *testing.T) {
	t.Parallel()
	k := apacheKafkaCluster(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	const (
		records    = 1000
		partitions = 3
		retention  = "3600000"
	)
	// Phase times show where a slow run spends its time.
	phase := time.Now()
	lap := func(what string) {
		t.Logf("%s took %s", what, time.Since(phase).Round(time.Millisecond))
		phase = time.Now()
	}

	topic := k.TopicName(t)
	if err := k.CreateTopic(ctx, topic, partitions, 1, map[string]*string{"retention.ms": kadm.StringPtr(retention)}); err != nil {
		t.Fatal(err)
	}
	configs, err := k.Admin().DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatalf("describe topic configs: %v", err)
	}
	rc, err := configs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		t.Fatalf("topic configs: %v", err)
	}
	if got := topicConfigValue(rc, "retention.ms"); got != retention {
		t.Fatalf("retention.ms = %q, want %q", got, retention)
	}

	lap("create topic and check its config")

	producer := k.Client(t,
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence is on by default and needs acks=all
		kgo.DefaultProduceTopic(topic),
	)
	batch := make([]*kgo.Record, records)
	for i := range batch {
		batch[i] = &kgo.Record{Key: fmt.Appendf(nil, "key-%04d", i), Value: fmt.Appendf(nil, "value-%04d", i)}
	}
	if err := producer.ProduceSync(ctx, batch...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	lap("produce")
	partitionOfKey := map[string]int32{}
	for _, r := range batch {
		partitionOfKey[string(r.Key)] = r.Partition
	}

	group := topic + "-group"
	consumer := k.Client(t,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	seen := map[string]string{}
	for len(seen) < records {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(seen), records, err)
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			t.Fatalf("fetch %s/%d: %v", topic, partition, err)
		})
		fetches.EachRecord(func(r *kgo.Record) {
			key := string(r.Key)
			if prev, dup := seen[key]; dup {
				t.Fatalf("key %s consumed twice (%q, then %q)", key, prev, r.Value)
			}
			if want := partitionOfKey[key]; r.Partition != want {
				t.Errorf("key %s read from partition %d, produced to %d", key, r.Partition, want)
			}
			seen[key] = string(r.Value)
		})
	}
	for i := range records {
		key, want := fmt.Sprintf("key-%04d", i), fmt.Sprintf("value-%04d", i)
		if got := seen[key]; got != want {
			t.Errorf("record %s = %q, want %q", key, got, want)
		}
	}

	lap("consume in a group")
	// The group coordinator must have stored the commit at the log end.
	if err := consumer.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	committed, err := k.Admin().FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch committed offsets: %v", err)
	}
	ends, err := k.Admin().ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	var total int64
	ends.Each(func(end kadm.ListedOffset) {
		total += end.Offset
		c, ok := committed.Lookup(topic, end.Partition)
		if !ok || c.Err != nil || c.At != end.Offset {
			t.Errorf("partition %d: committed %+v, log end %d", end.Partition, c, end.Offset)
		}
	})
	if total != records {
		t.Errorf("log end offsets add up to %d, want %d", total, records)
	}
	lap("commit and check offsets")
}

// topicConfigValue returns the value of one config key, or "" when absent.
func topicConfigValue(rc kadm.ResourceConfig, key string) string {
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}

// produceRetryCounter counts what the producer had to retry: dials that
// failed and produce requests that failed on the connection (via hooks), and
// batches a broker refused with a partition error (via the client's log, the
// only place kgo reports them).
type produceRetryCounter struct {
	dialErrors      atomic.Int64
	requests        atomic.Int64
	requestErrors   atomic.Int64
	partitionErrors atomic.Int64
	mu              sync.Mutex
	errorKinds      map[string]int
}

func (c *produceRetryCounter) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		c.dialErrors.Add(1)
		c.note(err.Error())
	}
}

func (c *produceRetryCounter) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	const produceKey = 0
	if key != produceKey {
		return
	}
	c.requests.Add(1)
	if err := e2e.Err(); err != nil {
		c.requestErrors.Add(1)
		c.note(err.Error())
	}
}

func (c *produceRetryCounter) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (c *produceRetryCounter) Log(_ kgo.LogLevel, msg string, keyvals ...any) {
	if msg != "batch in a produce request failed" {
		return
	}
	c.partitionErrors.Add(1)
	for i := 0; i+1 < len(keyvals); i += 2 {
		if keyvals[i] == "err" {
			c.note(fmt.Sprint(keyvals[i+1]))
		}
	}
}

// loopbackAddr matches the ephemeral addresses inside network errors, which
// would make every error distinct.
var loopbackAddr = regexp.MustCompile(`127\.0\.0\.1:\d+`)

func (c *produceRetryCounter) note(err string) {
	kind := loopbackAddr.ReplaceAllString(err, "127.0.0.1:*")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.errorKinds == nil {
		c.errorKinds = map[string]int{}
	}
	c.errorKinds[kind]++
}

func (c *produceRetryCounter) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%d produce requests, %d failed on the connection, %d batches refused by a broker, %d failed dials; errors %v",
		c.requests.Load(), c.requestErrors.Load(), c.partitionErrors.Load(), c.dialErrors.Load(), c.errorKinds)
}

func TestApacheKafkaThreeNodeLeaderKill(t *testing.T) {
	requireFaultSuite(t)
	k := apacheKafkaCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	topic := k.TopicName(t)
	if err := k.CreateTopic(ctx, topic, 3, 3, map[string]*string{"min.insync.replicas": kadm.StringPtr("2")}); err != nil {
		t.Fatal(err)
	}
	leader, err := k.WaitForLeader(ctx, topic, 0, -1)
	if err != nil {
		t.Fatal(err)
	}

	counter := &produceRetryCounter{}
	producer := k.Client(t,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.DefaultProduceTopic(topic),
		kgo.WithHooks(counter),
		kgo.WithLogger(counter),
	)

	// The producer runs until stop is closed, at a steady pace so that the
	// kill lands in the middle of the stream.
	var (
		acked, failed  atomic.Int64
		ackedOnP0      atomic.Int64
		lastP0Ack      atomic.Int64 // unix nanos
		maxP0Gap       atomic.Int64 // nanos between two acks on partition 0
		errMu          sync.Mutex
		firstErr       error
		produced       atomic.Int64
		stop           = make(chan struct{})
		producerDone   = make(chan struct{})
		recordsPerTick = 10
	)
	lastP0Ack.Store(time.Now().UnixNano())
	onAck := func(r *kgo.Record, err error) {
		if err != nil {
			failed.Add(1)
			errMu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			errMu.Unlock()
			return
		}
		acked.Add(1)
		if r.Partition == 0 {
			ackedOnP0.Add(1)
			now := time.Now().UnixNano()
			if gap := now - lastP0Ack.Swap(now); gap > maxP0Gap.Load() {
				maxP0Gap.Store(gap)
			}
		}
	}
	go func() {
		defer close(producerDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for range recordsPerTick {
				i := produced.Add(1) - 1
				producer.Produce(ctx, &kgo.Record{Key: fmt.Appendf(nil, "key-%06d", i), Value: fmt.Appendf(nil, "value-%06d", i)}, onAck)
			}
		}
	}()
	stopProducer := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-producerDone
	}
	defer stopProducer()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v (%s)", what, ctx.Err(), counter.summary())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	waitFor("300 acks before the kill", func() bool { return acked.Load() >= 300 })

	killAt := time.Now()
	if err := k.KillNode(ctx, leader); err != nil {
		t.Fatal(err)
	}
	newLeader, err := k.WaitForLeader(ctx, topic, 0, leader)
	if err != nil {
		t.Fatal(err)
	}
	leaderChange := time.Since(killAt)
	p0AtNewLeader := ackedOnP0.Load()
	waitFor("100 more acks on partition 0 after the leader change", func() bool { return ackedOnP0.Load() >= p0AtNewLeader+100 })
	stopProducer()
	if err := producer.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if n := failed.Load(); n > 0 {
		errMu.Lock()
		defer errMu.Unlock()
		t.Fatalf("%d records failed, first: %v", n, firstErr)
	}
	total := produced.Load()
	if acked.Load() != total {
		t.Fatalf("acked %d of %d records", acked.Load(), total)
	}
	t.Logf("killed leader %d of %s/0 after %d acks; new leader %d seen in metadata after %s; longest gap between acks on partition 0: %s",
		leader, topic, 300, newLeader, leaderChange.Round(time.Millisecond), time.Duration(maxP0Gap.Load()).Round(time.Millisecond))
	t.Logf("producer: %d records acked; %s", total, counter.summary())

	// Every acked record must be on the topic exactly once: idempotence keeps
	// retries from duplicating, acks=all with min ISR 2 keeps the kill from
	// losing any.
	consumer := k.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ends, err := k.Admin().ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	var onLog int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of partition %d: %v", o.Partition, o.Err)
		}
		onLog += o.Offset
	})
	if onLog != total {
		t.Errorf("the log holds %d records, %d were produced", onLog, total)
	}
	seen := make(map[string]int, total)
	var read int64
	for read < onLog {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", read, onLog, err)
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			t.Fatalf("fetch %s/%d: %v", topic, partition, err)
		})
		fetches.EachRecord(func(r *kgo.Record) {
			read++
			seen[string(r.Key)]++
			if want := "value-" + strings.TrimPrefix(string(r.Key), "key-"); string(r.Value) != want {
				t.Errorf("record %s has value %q", r.Key, r.Value)
			}
		})
	}
	var missing, duplicated []string
	for i := range total {
		key := fmt.Sprintf("key-%06d", i)
		switch n := seen[key]; {
		case n == 0:
			missing = append(missing, key)
		case n > 1:
			duplicated = append(duplicated, fmt.Sprintf("%s×%d", key, n))
		}
	}
	if len(missing) > 0 || len(duplicated) > 0 {
		t.Errorf("not exactly once: %d of %d records missing %v, %d duplicated %v",
			len(missing), total, firstN(missing, 10), len(duplicated), firstN(duplicated, 10))
	}

	// Bring the node back and watch it catch up, so that the next fault test
	// starts from a whole cluster.
	restartAt := time.Now()
	if err := k.StartNode(ctx, leader); err != nil {
		t.Fatalf("restart node %d: %v", leader, err)
	}
	if err := k.WaitForISR(ctx, topic, 0, leader); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d restarted and back in the ISR of %s/0 after %s", leader, topic, time.Since(restartAt).Round(time.Millisecond))
}

// firstN keeps failure messages short when many records are wrong.
func firstN(s []string, n int) []string {
	return s[:min(n, len(s))]
}
