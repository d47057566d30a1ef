package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Every topic playwatch creates has its share of the broker budget, and the
// topics the storage consumer reads are the ones trimmed only behind it.
func TestBrokerBudgetCoversEveryTopic(t *testing.T) {
	b, err := planBrokerBudget(256<<20, 24*time.Hour, allTopics)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, topic := range allTopics {
		if b.shares[topic] <= 0 || !topicShares[topic].drained {
			t.Errorf("%s: share %d, drained %v; the storage consumer reads it", topic, b.shares[topic], topicShares[topic].drained)
		}
		sum += b.shares[topic]
	}
	if sum > b.total || sum < b.total*99/100 {
		t.Errorf("the shares add up to %d of %d bytes", sum, b.total)
	}
	if b.segmentBytes() != 1<<20 {
		t.Errorf("segment %d bytes at 256 MiB, want 1 MiB", b.segmentBytes())
	}
	if _, err := planBrokerBudget(256<<20, time.Hour, append(allTopics, "unplanned-topic")); err == nil || !strings.Contains(err.Error(), "unplanned-topic") {
		t.Errorf("a topic without a share: %v, want an error naming it", err)
	}
	// The archive has a share that nothing must drain.
	withRaw, err := planBrokerBudget(256<<20, time.Hour, append(allTopics, topicRawPages))
	if err != nil || withRaw.shares[topicRawPages] <= 0 || topicShares[topicRawPages].drained {
		t.Errorf("%s: share %d, drained %v, %v", topicRawPages, withRaw.shares[topicRawPages], topicShares[topicRawPages].drained, err)
	}
}

// brokerShares reads each partition's retained bytes and offsets.
func brokerShares(t *testing.T, adm *kadm.Client, topic string) (bytes map[int32]int64, starts, ends kadm.ListedOffsets) {
	t.Helper()
	ctx := context.Background()
	dirs, err := adm.DescribeAllLogDirs(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	bytes = map[int32]int64{}
	dirs.Each(func(d kadm.DescribedLogDir) {
		for p, dp := range d.Topics[topic] {
			bytes[p] += dp.Size
		}
	})
	if starts, err = adm.ListStartOffsets(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if ends, err = adm.ListEndOffsets(ctx, topic); err != nil {
		t.Fatal(err)
	}
	return bytes, starts, ends
}

// On the embedded broker the topics keep everything as far as the broker is
// concerned (it would delete records nobody stored), also those an older
// playwatch created with a retention; playwatch's trim deletes the records
// older than the retention once they are stored, and not before.
func TestBrokerBudgetTrimsOldRecordsOnceStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logger := testLogger(t)
	// An older playwatch created the topics with the broker's retention.
	brokers, adm := startTopicsBroker(t, topicSpec{Partitions: 1, Replication: -1, Retention: 7 * 24 * time.Hour})
	if err := ensureTopics(ctx, adm, topicSpec{Partitions: 1, Replication: -1}, allTopics, logger); err != nil {
		t.Fatal(err)
	}
	configs, err := adm.DescribeTopicConfigs(ctx, topicAppStats)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"retention.ms", "retention.bytes"} {
		if c, err := configs.On(topicAppStats, nil); err != nil || !slices.ContainsFunc(c.Configs, func(c kadm.Config) bool {
			return c.Key == name && c.MaybeValue() == "-1"
		}) {
			t.Errorf("app-stats has no %s=-1 on the embedded broker: %v %v", name, c, err)
		}
	}

	pool := newTestPool(t)
	const pkg = "com.example.aged"
	registerApps(t, pool, pkg)
	produceStats := func(n int) {
		var recs []*kgo.Record
		for range n {
			recs = append(recs, rec(topicAppStats, pkg, msgJSON(statFields(pkg, time.Now().Add(time.Duration(len(recs))*time.Millisecond)))))
		}
		produce(t, brokers, recs...)
	}
	start := func() int64 {
		starts, err := adm.ListStartOffsets(ctx, topicAppStats)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := starts.Lookup(topicAppStats, 0)
		return o.Offset
	}
	budget, err := planBrokerBudget(256<<20, 200*time.Millisecond, allTopics)
	if err != nil {
		t.Fatal(err)
	}
	keeper := newBrokerBudgetKeeper(budget, adm, newConsumerStore(pool, testConsumerOptions().Group, testLocales), prometheus.NewRegistry(), logger)

	produceStats(10)
	time.Sleep(300 * time.Millisecond)
	if err := keeper.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if s := start(); s != 0 {
		t.Fatalf("app-stats starts at %d: old records nobody stored were trimmed", s)
	}
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitStored(t, 30*time.Second, brokers, pool, testConsumerOptions().Group)
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	produceStats(5) // new, and not stored
	if err := keeper.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if s := start(); s != 10 {
		t.Errorf("app-stats starts at %d after the trim, want 10: the stored old records go, the new ones stay", s)
	}
	if n := count(t, pool, `SELECT count(*) FROM app_stats`); n != 10 {
		t.Errorf("%d app_stats rows, want 10", n)
	}
}

// startTopicsBroker starts an embedded broker of the test's own with every
// topic of playwatch created as spec says, and returns its addresses and an
// admin client of it.
func startTopicsBroker(t *testing.T, spec topicSpec) ([]string, *kadm.Client) {
	t.Helper()
	b, err := startEmbeddedBroker(embeddedBrokerOptions{Addr: "127.0.0.1:0", DataDir: t.TempDir()}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	if err := ensureTopics(context.Background(), adm, spec, allTopics, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	return b.Addrs(), adm
}
