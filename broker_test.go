package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produceSync writes n keyed records to topic and waits for their acks.
func produceSync(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%5)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	produce(t, brokers, recs...)
}

// What the embedded broker acknowledged survives a restart from its DataDir.
func TestEmbeddedBrokerKeepsRecordsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	b1, err := startEmbeddedBroker(embeddedBrokerOptions{Addr: "127.0.0.1:0", DataDir: dir, RetentionCheck: time.Minute}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := b1.Addrs()[0]
	createTestTopics(t, b1.Addrs(), topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	produceSync(t, b1.Addrs(), topicReviews, 100)
	b1.Close()

	b2, err := startEmbeddedBroker(embeddedBrokerOptions{Addr: addr, DataDir: dir, RetentionCheck: time.Minute}, testLogger(t))
	if err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	defer b2.Close()
	// Creating the topics again is a no-op.
	createTestTopics(t, b2.Addrs(), topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	recs := consumeAll(t, b2.Addrs(), topicReviews, 100)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Value)] = true
	}
	if len(recs) != 100 || len(seen) != 100 {
		t.Fatalf("after restart: %d records, %d distinct, want 100", len(recs), len(seen))
	}
}

// Topic retention runs on the embedded broker, so its disk stays bounded.
func TestEmbeddedBrokerAppliesRetention(t *testing.T) {
	b, err := startEmbeddedBroker(embeddedBrokerOptions{Addr: "127.0.0.1:0", DataDir: t.TempDir(), RetentionCheck: 50 * time.Millisecond}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	createTestTopics(t, b.Addrs(), topicSpec{Partitions: 1, Replication: -1, Retention: 100 * time.Millisecond})
	produceSync(t, b.Addrs(), topicAppStats, 10)

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	waitFor(t, 20*time.Second, "retention to move the log start offset to 10", func() bool {
		starts, err := adm.ListStartOffsets(context.Background(), topicAppStats)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := starts.Lookup(topicAppStats, 0)
		return o.Offset == 10
	})
}
