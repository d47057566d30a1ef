package main

import (
	"fmt"
	"testing"
	"time"

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
