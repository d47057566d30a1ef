package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkNotifyDelivery measures how many messages the delivery workers
// (their defaults: notifyWorkers, notifyPoll) deliver per minute to a local
// webhook receiver through the sender, with no throttle, from an outbox of
// PLAYWATCH_BENCH_NOTIFY_MESSAGES (default 5000) in a managed PostgreSQL
// with its durable defaults (fsync, synchronous_commit): every message is a
// transaction that locks, sends and marks its row. Reported:
// deliveries/min (the goal: at least 2000). Run it with -benchtime 1x.
func BenchmarkNotifyDelivery(b *testing.B) {
	n := benchEnvInt(b, "PLAYWATCH_BENCH_NOTIFY_MESSAGES", 5000, 100)
	ctx := context.Background()
	pool := newDurableBenchPool(b)
	var got atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(recv.Close)
	dest := seedDestination(b, pool, "webhook", recv.URL)
	rule := seedRule(b, pool, 0, dest)
	cfg := notifyDeliveryConfigOf(benchConfig(b))
	var perMinute []float64
	for b.Loop() {
		b.StopTimer()
		if _, err := pool.Exec(ctx, `TRUNCATE notifications`); err != nil {
			b.Fatal(err)
		}
		seedReviewMessages(b, pool, rule, dest, n)
		got.Store(0)
		b.StartTimer()
		started := time.Now()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- newNotifyDelivery(pool, newTestSender(b), cfg, prometheus.NewRegistry(), benchLogger(b)).Run(rctx)
		}()
		for count(b, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`) < n {
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(started)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if got.Load() != int64(n) {
			b.Fatalf("receiver got %d requests for %d messages", got.Load(), n)
		}
		perMinute = append(perMinute, float64(n)/took.Minutes())
	}
	b.ReportMetric(median(perMinute), "deliveries/min")
}

func benchLogger(b *testing.B) *slog.Logger {
	return slog.New(slog.NewTextHandler(b.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}
