package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// `notify retry` restarts NOTIFY_GIVE_UP: a message failed a day after it
// was decided, retried, survives a failed attempt and is delivered at the
// next. Its last_error is cleared, and a row of a digest retried without
// its digest goes alone.
func TestNotifyRetryThenDeliver(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	recv := newWebhookReceiver(t)
	recv.setAnswer(func(n int, _ receivedMessage, w http.ResponseWriter) bool {
		if n == 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	rule, dest := seedWebhookReviews(t, pool, recv.srv.URL, 0, 1)
	var id int64
	if err := pool.QueryRow(ctx, `UPDATE notifications SET status = 'failed', attempts = 9, last_error = 'HTTP 502: down',
	created_at = now() - interval '2 hours' RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	digest := seedDigest(t, pool, rule, dest, "failed", "HTTP 502: down")
	mustExec(t, pool, `UPDATE notifications SET digest_id = $1 WHERE id = $2`, digest, id)
	var out bytes.Buffer
	if err := runNotifyRetry(ctx, pool, []int64{id}, &out); err != nil || out.String() != "1 notifications pending again\n" {
		t.Fatalf("retry: %q %v", out.String(), err)
	}
	if n := count(t, pool, `SELECT count(*) FROM notifications WHERE id = $1 AND status = 'pending' AND attempts = 0 AND last_error IS NULL
	AND digest_id IS NULL AND retry_from > now() - interval '1 minute'`, id); n != 1 {
		t.Fatalf("the retried row: %+v", notificationStates(t, pool)[id])
	}
	cfg := testDeliveryConfig()
	cfg.GiveUp = time.Hour
	runDelivery(t, pool, newTestSender(t), cfg, prometheus.NewRegistry())
	waitFor(t, 10*time.Second, "the retried message delivered", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE id = $1 AND status <> 'pending'`, id) == 1
	})
	if s := notificationStates(t, pool)[id]; s.Status != "sent" || s.Attempts != 2 {
		t.Fatalf("after the retry: %+v, want sent at the second attempt", s)
	}
	if ms := recv.messages(); len(ms) != 2 || ms[1].Payload.Event != "review" || ms[1].DeliveryID != notifyDeliveryID(id) {
		t.Fatalf("receiver got %+v, want the review twice (503, then 200)", ms)
	}
	if s := notificationStates(t, pool)[digest]; s.Status != "failed" {
		t.Fatalf("the digest not retried: %+v", s)
	}
}

// A digest retried goes again with the rows it stands for, as one message.
func TestNotifyRetryDigestWithItsRows(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	rule, dest := seedWebhookReviews(t, pool, "http://127.0.0.1:1/never", 0, 2)
	digest := seedDigest(t, pool, rule, dest, "failed", "")
	mustExec(t, pool, `UPDATE notifications SET digest_id = $1, status = 'failed' WHERE event = 'review'`, digest)
	var out bytes.Buffer
	if err := runNotifyRetry(ctx, pool, nil, &out); err != nil || out.String() != "3 notifications pending again\n" {
		t.Fatalf("retry --failed: %q %v", out.String(), err)
	}
	if n := count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'pending' AND digest_id = $1`, digest); n != 2 {
		t.Fatalf("%d rows pending in their digest, want 2", n)
	}
}

// playwatch_notify_pending counts a digest once, not the rows folded into it.
func TestNotifyPendingGaugeCountsDigestOnce(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	rule, dest := seedWebhookReviews(t, pool, "http://127.0.0.1:1/never", 0, 3)
	mustExec(t, pool, `UPDATE notify_destinations SET status = 'broken'`)
	digest := seedDigest(t, pool, rule, dest, "pending", "")
	mustExec(t, pool, `UPDATE notifications SET digest_id = $1 WHERE event = 'review' AND event_key <> 'review:gp:0:h'`, digest)
	reg := prometheus.NewRegistry()
	runDelivery(t, pool, newTestSender(t), testDeliveryConfig(), reg)
	waitFor(t, 5*time.Second, "the gauges counted", func() bool {
		return metricValue(t, reg, "playwatch_notify_destinations_broken", nil) == 1
	})
	if got := metricValue(t, reg, "playwatch_notify_pending", nil); got != 2 {
		t.Fatalf("playwatch_notify_pending = %v, want 2 (a message and a digest)", got)
	}
}
