package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// testProducerSettings are the design's guarantees with test-sized waits.
var testProducerSettings = producerSettings{
	Acks: "all", Idempotent: true, Retries: 5, RetryBackoff: 10 * time.Millisecond,
	RequestTimeout: 2 * time.Second, DeliveryTimeout: 5 * time.Second,
	AppRetryDelays: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond},
}

func newTestPublisher(t testing.TB, brokers []string, s producerSettings) *publisher {
	t.Helper()
	cl, err := kgo.NewClient(append(producerOptions(s), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return newPublisher(cl, s, prometheus.NewRegistry(), testLogger(t))
}

func testReviews(pkg string, n int) []reviewMessage {
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	ms := make([]reviewMessage, n)
	for i := range ms {
		content := fmt.Sprintf("review %d", i)
		score := i%5 + 1
		ms[i] = reviewMessage{PackageName: pkg, ReviewID: fmt.Sprintf("gp:%s:%d", pkg, i), Score: &score,
			Content: &content, At: at.Add(-time.Duration(i) * time.Minute), CrawledAt: at}
	}
	return ms
}

// reviewIDsOnTopic reads n records and counts each review id.
func reviewIDsOnTopic(t *testing.T, brokers []string, n int) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, r := range consumeAll(t, brokers, topicReviews, n) {
		var m reviewMessage
		if err := jsonUnmarshalStrict(r.Value, &m); err != nil {
			t.Fatalf("record %s: %v", r.Value, err)
		}
		if string(r.Key) != m.PackageName {
			t.Fatalf("key %q for package %q", r.Key, m.PackageName)
		}
		ids[m.ReviewID]++
	}
	return ids
}

// A partition that rejects produce requests for longer than the client's
// retries fails the first attempt; the residual resend delivers the records,
// and the topic holds every review exactly once.
func TestPublishResidualRetryDeliversExactlyOnce(t *testing.T) {
	b, brokers := newTestBroker(t, t.TempDir())
	p := newTestPublisher(t, brokers, testProducerSettings)
	h := b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topicReviews,
		Err: kerr.NotEnoughReplicas, Count: -1})
	// The partition recovers while the publisher waits to resend.
	p.clock = onEveryWait(func(time.Duration) { h.Remove() })

	if err := p.PublishReviews(context.Background(), "com.example.app", testReviews("com.example.app", 300)); err != nil {
		t.Fatalf("publish: %v", err)
	}
	ids := reviewIDsOnTopic(t, brokers, 300)
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s is on the topic %d times", id, n)
		}
	}
	if len(ids) != 300 {
		t.Fatalf("%d distinct reviews on the topic, want 300", len(ids))
	}
	if got := testutil.ToFloat64(p.metrics.residualRetries.WithLabelValues(topicReviews)); got != 1 {
		t.Errorf("residual retries = %v, want 1", got)
	}
	if got := testutil.ToFloat64(p.metrics.failed.WithLabelValues(topicReviews)); got != 300 {
		t.Errorf("failed first attempts = %v, want 300", got)
	}
	if got := testutil.ToFloat64(p.metrics.produced.WithLabelValues(topicReviews)); got != 300 {
		t.Errorf("produced = %v, want 300", got)
	}
	if got := testutil.ToFloat64(p.metrics.failedClosed.WithLabelValues(topicReviews)); got != 0 {
		t.Errorf("failed closed = %v, want 0: the resend delivered everything", got)
	}
	start := time.Now()
	if err := p.PublishReviews(context.Background(), "com.example.app", nil); err != nil || time.Since(start) > time.Second {
		t.Errorf("an empty send: %v after %v, want nil at once", err, time.Since(start))
	}
}

// When the retries are spent the send fails closed with the residual count,
// and the next send goes through once the fault is gone.
func TestPublishFailsClosedAfterRetries(t *testing.T) {
	t.Parallel()
	b, brokers := newTestBroker(t, t.TempDir())
	p := newTestPublisher(t, brokers, testProducerSettings)
	h := b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topicAppStats, Err: kerr.NotEnoughReplicas, Count: -1})

	now := time.Now().UTC()
	err := p.PublishAppStats(context.Background(), appStatsMessage{PackageName: "com.example.app", CrawledAt: now})
	var perr *publishError
	if !errors.As(err, &perr) || perr.Failed != 1 || perr.Attempts != 4 {
		t.Fatalf("err = %v (%#v), want a publishError after 4 attempts", err, err)
	}
	if got := testutil.ToFloat64(p.metrics.failedClosed.WithLabelValues(topicAppStats)); got != 1 {
		t.Errorf("failed closed = %v, want 1", got)
	}
	h.Remove()
	if err := p.PublishAppStats(context.Background(), appStatsMessage{PackageName: "com.example.other", CrawledAt: now}); err != nil {
		t.Fatalf("after the fault: %v", err)
	}
	recs := consumeAll(t, brokers, topicAppStats, 1)
	if len(recs) != 1 || !strings.Contains(string(recs[0].Value), `"package_name":"com.example.other"`) {
		t.Fatalf("topic holds %d records: %s", len(recs), recs[0].Value)
	}
}

// Cancelling the caller stops the waits between attempts, not records the
// client already holds.
func TestPublishCancelStopsRetryWait(t *testing.T) {
	t.Parallel()
	b, brokers := newTestBroker(t, t.TempDir())
	s := testProducerSettings
	s.AppRetryDelays = []time.Duration{time.Hour}
	p := newTestPublisher(t, brokers, s)
	b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topicAppStats, Err: kerr.NotEnoughReplicas, Count: -1})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := p.PublishAppStats(ctx, appStatsMessage{PackageName: "com.example.app", CrawledAt: time.Now()})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 10*time.Second {
		t.Fatalf("err = %v after %v, want context.Canceled well before the hour", err, time.Since(start))
	}
}

// flakyProducer confirms every record except the ones fail picks, and
// records what it was asked to send, per attempt (the test's sleep hook
// starts the next attempt).
type flakyProducer struct {
	mu   sync.Mutex
	sent [][]string
	fail func(attempt int, value string) bool
}

func (f *flakyProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	f.mu.Lock()
	if len(f.sent) == 0 {
		f.sent = append(f.sent, nil)
	}
	attempt := len(f.sent) - 1
	f.sent[attempt] = append(f.sent[attempt], string(r.Value))
	f.mu.Unlock()
	var err error
	if f.fail(attempt, string(r.Value)) {
		err = kerr.NotEnoughReplicas
	}
	go promise(r, err)
}

// Only the records that were not confirmed are resent, and each attempt
// waits for the delays of the design.
func TestPublishResendsOnlyTheResidual(t *testing.T) {
	fp := &flakyProducer{fail: func(attempt int, v string) bool {
		return (attempt == 0 && strings.Contains(v, "7")) || (attempt == 1 && strings.Contains(v, "17"))
	}}
	s := testProducerSettings
	s.AppRetryDelays = []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second}
	p := newPublisher(fp, s, prometheus.NewRegistry(), testLogger(t))
	var waits []time.Duration
	p.clock = onEveryWait(func(d time.Duration) {
		waits = append(waits, d)
		fp.mu.Lock()
		fp.sent = append(fp.sent, nil)
		fp.mu.Unlock()
	})
	recs := make([]*kgo.Record, 100)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topicReviews, Value: []byte(fmt.Sprint(i))}
	}
	if err := p.send(context.Background(), topicReviews, recs); err != nil {
		t.Fatal(err)
	}
	if len(fp.sent) != 3 || len(fp.sent[0]) != 100 || len(fp.sent[1]) != 19 || len(fp.sent[2]) != 1 {
		t.Fatalf("attempt sizes %d/%d/%d, want 100/19/1", len(fp.sent[0]), len(fp.sent[1]), len(fp.sent[2]))
	}
	if fmt.Sprint(waits) != "[5s 10s]" {
		t.Fatalf("waits %v, want [5s 10s]", waits)
	}
}

// silentProducer takes records and never calls their promises: the broker
// got them and went away before answering.
type silentProducer struct{ taken atomic.Int32 }

func (s *silentProducer) Produce(context.Context, *kgo.Record, func(*kgo.Record, error)) {
	s.taken.Add(1)
}

// Records the client keeps without an answer are unconfirmed: the send
// fails closed once the delivery and request timeouts have passed, and
// resends none of them (the client may still deliver them).
func TestPublishUnconfirmedFailsClosedWithoutResend(t *testing.T) {
	sp := &silentProducer{}
	s := testProducerSettings
	s.DeliveryTimeout, s.RequestTimeout = 100*time.Millisecond, 50*time.Millisecond
	p := newPublisher(sp, s, prometheus.NewRegistry(), testLogger(t))
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- p.PublishReviews(context.Background(), "com.example.app", testReviews("com.example.app", 20))
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the send still waits for the client 10s later")
	}
	took := time.Since(start)
	var perr *publishError
	if !errors.As(err, &perr) || !errors.Is(err, errUnconfirmed) || perr.Failed != 20 || perr.Attempts != 1 {
		t.Fatalf("err = %v, want 20 records unconfirmed after 1 attempt", err)
	}
	if took < 150*time.Millisecond {
		t.Errorf("failed closed after %s, want after the 150ms of the two timeouts", took)
	}
	if n := sp.taken.Load(); n != 20 {
		t.Errorf("%d records handed to the client, want 20: none resent", n)
	}
	if got := testutil.ToFloat64(p.metrics.failedClosed.WithLabelValues(topicReviews)); got != 1 {
		t.Errorf("failed closed = %v, want 1", got)
	}
}
