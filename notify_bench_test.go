package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
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

// BenchmarkNotifyReviewLatency measures, on a durable managed PostgreSQL,
// how long a review takes from its storing (first_seen_at, inserted as the
// storage consumer does) to a local webhook receiver's 2xx, with the
// sentiment job, the event decider and the delivery workers running at
// their defaults and a rule that waits for the label (1–2★ and NEGATIVE).
// PLAYWATCH_BENCH_NOTIFY_REVIEWS (default 300) reviews are stored one every
// 50 ms (20 a second). Reported: p50-s and p95-s (the goal: p95 at most
// 5 s). Run it with -benchtime 1x.
func BenchmarkNotifyReviewLatency(b *testing.B) {
	n := benchEnvInt(b, "PLAYWATCH_BENCH_NOTIFY_REVIEWS", 300, 10)
	ctx := context.Background()
	pool := newDurableBenchPool(b)
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p notifyPayload
		if err := json.NewDecoder(r.Body).Decode(&p); err == nil && p.Review != nil {
			mu.Lock()
			if _, seen := arrived[p.Review.ReviewID]; !seen {
				arrived[p.Review.ReviewID] = time.Now()
			}
			mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(recv.Close)
	for _, sql := range []string{
		`INSERT INTO apps_registry_application (package_name, display_name) VALUES ('org.telegram.messenger', 'Telegram')`,
		`INSERT INTO app_stats (application_id, country, lang, crawled_at) VALUES (1, 'us', 'en', now() - interval '1 day')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	dest := seedDestination(b, pool, "webhook", recv.URL)
	if _, err := pool.Exec(ctx, `INSERT INTO notify_rules (name, event, filter, max_per_hour) VALUES ('bad', 'review', '{"max_stars": 2, "sentiment": ["NEGATIVE"]}', 0)`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO notify_rule_destinations VALUES (1, $1)`, dest); err != nil {
		b.Fatal(err)
	}
	cfg := benchConfig(b)
	model, err := loadSentimentModel()
	if err != nil {
		b.Fatal(err)
	}
	var p50, p95 []float64
	round := 0
	for b.Loop() {
		round++
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		reg := prometheus.NewRegistry()
		logger := benchLogger(b)
		wg.Go(func() { _ = newSentimentJob(pool, model, sentimentJobConfigOf(cfg), reg, logger).Run(rctx) })
		wg.Go(func() { _ = newNotifyDecider(pool, notifyDeciderConfigOf(cfg), reg, logger).Run(rctx) })
		wg.Go(func() {
			_ = newNotifyDelivery(pool, newTestSender(b), notifyDeliveryConfigOf(cfg), reg, logger).Run(rctx)
		})
		time.Sleep(2 * time.Second) // the decider's first pass sets its cursors
		tick := time.NewTicker(50 * time.Millisecond)
		for i := range n {
			<-tick.C
			if _, err := pool.Exec(ctx, `INSERT INTO reviews (application_id, review_id, score, content, at, last_synced_at)
VALUES (1, $1, 1, 'Terrible. Crashes at every start and the messages never arrive. Uninstalled.', now(), now())`,
				fmt.Sprintf("bench-%d-%d", round, i)); err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		deadline := time.Now().Add(2 * time.Minute)
		for count(b, pool, `SELECT count(*) FROM notifications WHERE status = 'sent' AND event_key LIKE $1`, fmt.Sprintf("%%bench-%d-%%", round)) < n {
			if time.Now().After(deadline) {
				b.Fatalf("round %d: %d of %d reviews delivered after 2 minutes", round, count(b, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`), n)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		wg.Wait()
		rows, err := pool.Query(ctx, `SELECT review_id, first_seen_at FROM reviews WHERE review_id LIKE $1`, fmt.Sprintf("bench-%d-%%", round))
		if err != nil {
			b.Fatal(err)
		}
		var lat []float64
		mu.Lock()
		for rows.Next() {
			var id string
			var stored time.Time
			if err := rows.Scan(&id, &stored); err != nil {
				b.Fatal(err)
			}
			at, ok := arrived[id]
			if !ok {
				b.Fatalf("review %s: sent, but the receiver never got it", id)
			}
			lat = append(lat, at.Sub(stored).Seconds())
		}
		mu.Unlock()
		rows.Close()
		slices.Sort(lat)
		p50 = append(p50, lat[len(lat)/2])
		p95 = append(p95, lat[len(lat)*95/100])
	}
	b.ReportMetric(median(p50), "p50-s")
	b.ReportMetric(median(p95), "p95-s")
}
