package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// newTestSender is the notifier's sender, allowed to reach the tests'
// receivers on loopback.
func newTestSender(t testing.TB) *notifySender {
	t.Helper()
	cfg := notifySenderConfig{AllowPrivate: true, Timeout: 10 * time.Second}
	s, err := newNotifySender(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// webhookReceiver records what it got; answer decides each reply (nil: 200).
type webhookReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	got      []receivedMessage
	answer   func(n int, m receivedMessage, w http.ResponseWriter) bool // true: it answered
	answered int
}

type receivedMessage struct {
	DeliveryID string
	Payload    notifyPayload
}

func newWebhookReceiver(t testing.TB) *webhookReceiver {
	r := &webhookReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var m receivedMessage
		m.DeliveryID = req.Header.Get("X-Playwatch-Delivery")
		if err := json.NewDecoder(req.Body).Decode(&m.Payload); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		n := len(r.got)
		r.got = append(r.got, m)
		answer := r.answer
		r.mu.Unlock()
		if answer != nil && answer(n, m, w) {
			return
		}
		r.mu.Lock()
		r.answered++
		r.mu.Unlock()
		w.Write([]byte("ok"))
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *webhookReceiver) setAnswer(fn func(n int, m receivedMessage, w http.ResponseWriter) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answer = fn
}

func (r *webhookReceiver) messages() []receivedMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedMessage(nil), r.got...)
}

// okCount is how many requests got a 200.
func (r *webhookReceiver) okCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.answered
}

// byDelivery counts the 200s-or-not requests per delivery id.
func byDelivery(ms []receivedMessage) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		out[m.DeliveryID]++
	}
	return out
}

// seedDestination inserts a destination of type typ at url.
func seedDestination(t testing.TB, pool *pgxpool.Pool, typ, url string) int64 {
	t.Helper()
	var id int64
	cfg, _ := json.Marshal(destinationConfig{URL: url})
	if err := pool.QueryRow(context.Background(), `INSERT INTO notify_destinations (name, type, config) VALUES ($1, $2, $3) RETURNING id`,
		"test "+typ, typ, cfg).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// seedRule inserts a review rule with max_per_hour to the destinations.
func seedRule(t testing.TB, pool *pgxpool.Pool, maxPerHour int, dests ...int64) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO notify_rules (name, event, filter, max_per_hour) VALUES ('bad reviews', 'review', '{"max_stars": 2}', $1) RETURNING id`,
		maxPerHour).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for _, d := range dests {
		mustExec(t, pool, `INSERT INTO notify_rule_destinations VALUES ($1, $2)`, id, d)
	}
	return id
}

// seedWebhookReviews seeds n review messages of a rule (maxPerHour) whose one
// destination is the webhook at url.
func seedWebhookReviews(t testing.TB, pool *pgxpool.Pool, url string, maxPerHour, n int) (rule, dest int64) {
	t.Helper()
	dest = seedDestination(t, pool, "webhook", url)
	rule = seedRule(t, pool, maxPerHour, dest)
	seedReviewMessages(t, pool, rule, dest, n)
	return rule, dest
}

// seedReviewMessages puts n review messages of rule to dest in the outbox,
// as the decider does; their event_at and source_at are a second ago.
func seedReviewMessages(t testing.TB, pool *pgxpool.Pool, rule, dest int64, n int) {
	t.Helper()
	var keys []string
	var payloads [][]byte
	for i := range n {
		p := notifyPayload{Event: "review", App: payloadApp{PackageName: "org.telegram.messenger", DisplayName: "Telegram", Country: "us", Lang: "en"},
			Review: &payloadReview{ReviewID: fmt.Sprintf("gp:%d", i), Stars: 1, Text: fmt.Sprintf("review %d", i), Sentiment: "NEGATIVE"},
			Links:  payloadLinks{Play: "https://play.google.com/store/apps/details?id=org.telegram.messenger"}}
		b, _ := json.Marshal(p)
		keys = append(keys, fmt.Sprintf("review:gp:%d:h", i))
		payloads = append(payloads, b)
	}
	mustExec(t, pool, `INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, event_at, source_at)
SELECT $1, $2, 'review', k, p, now() - interval '1 second', now() - interval '1 second' FROM unnest($3::text[], $4::jsonb[]) AS u(k, p)`,
		rule, dest, keys, payloads)
}

// testDeliveryConfig: fast polls and backoffs, a day to give up.
func testDeliveryConfig() notifyDeliveryConfig {
	return notifyDeliveryConfig{Workers: 4, GiveUp: 24 * time.Hour, Poll: 20 * time.Millisecond, Clock: systemClock{},
		Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Grace: 5 * time.Second}
}

// runDelivery runs a delivery until the test ends (or stop is called); stop
// waits for Run to return.
func runDelivery(t testing.TB, pool *pgxpool.Pool, sender messageSender, cfg notifyDeliveryConfig, reg prometheus.Registerer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	nd := newNotifyDelivery(pool, sender, cfg, reg, testLogger(t))
	go func() { done <- nd.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("delivery Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

type notificationState struct {
	Status    string
	Attempts  int
	LastError string
	Sent      bool
	DigestID  *int64
}

func notificationStates(t testing.TB, pool *pgxpool.Pool) map[int64]notificationState {
	t.Helper()
	out := map[int64]notificationState{}
	var id int64
	var s notificationState
	eachRow(t, pool, []any{&id, &s.Status, &s.Attempts, &s.LastError, &s.Sent, &s.DigestID}, func() { out[id] = s },
		`SELECT id, status, attempts, coalesce(last_error, ''), sent_at IS NOT NULL, digest_id FROM notifications ORDER BY id`)
	return out
}

// Two delivery instances (two pools, as two servers) on one outbox send
// every message once; the rows say sent after one attempt, and the counters
// and histograms of both add up to the messages.
func TestNotifyDeliveryTwoServersSendEachOnce(t *testing.T) {
	t.Parallel()
	url := newTestDatabase(t)
	pool := newTestPoolFor(t, url)
	recv := newWebhookReceiver(t)
	dest := seedDestination(t, pool, "webhook", recv.srv.URL)
	rule := seedRule(t, pool, 0, dest)
	const n = 300
	seedReviewMessages(t, pool, rule, dest, n)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	runDelivery(t, pool, newTestSender(t), testDeliveryConfig(), regA)
	runDelivery(t, newTestPoolFor(t, url), newTestSender(t), testDeliveryConfig(), regB)
	waitFor(t, 30*time.Second, "every message sent", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == n
	})
	time.Sleep(100 * time.Millisecond) // a duplicate send would arrive now
	got := byDelivery(recv.messages())
	if len(got) != n || len(recv.messages()) != n {
		t.Fatalf("receiver got %d requests for %d delivery ids, want %d each once", len(recv.messages()), len(got), n)
	}
	for id, c := range got {
		if !strings.HasPrefix(id, "pw-") || c != 1 {
			t.Fatalf("delivery %q received %d times", id, c)
		}
	}
	for id, s := range notificationStates(t, pool) {
		if s.Status != "sent" || s.Attempts != 1 || !s.Sent {
			t.Fatalf("notification %d: %+v, want sent after 1 attempt", id, s)
		}
	}
	sent := metricValue(t, regA, "playwatch_notify_messages_total", map[string]string{"status": "sent"}) +
		metricValue(t, regB, "playwatch_notify_messages_total", map[string]string{"status": "sent"})
	observed := metricValue(t, regA, "playwatch_notify_delivery_seconds", nil) + metricValue(t, regB, "playwatch_notify_delivery_seconds", nil)
	ages := metricValue(t, regA, "playwatch_notify_review_age_seconds", nil) + metricValue(t, regB, "playwatch_notify_review_age_seconds", nil)
	if sent != n || observed != n || ages != n {
		t.Fatalf("messages_total{sent} %v, delivery_seconds count %v, review_age_seconds count %v; want %d each", sent, observed, ages, n)
	}
	if a, b := metricValue(t, regA, "playwatch_notify_messages_total", map[string]string{"status": "sent"}), sent; a == 0 || a == b {
		t.Logf("one server sent everything (%v of %v): the other found nothing free", a, b)
	}
}

// 503 and 429 Retry-After are retried with the same delivery id; the row
// keeps the attempts and the receiver's last error; the wait after the 429
// is at least its Retry-After.
func TestNotifyDeliveryRetriesWithBackoffAndRetryAfter(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	recv := newWebhookReceiver(t)
	var times []time.Time
	recv.setAnswer(func(n int, _ receivedMessage, w http.ResponseWriter) bool {
		times = append(times, time.Now())
		switch n {
		case 0, 1:
			http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "rate limited", http.StatusTooManyRequests)
		default:
			return false
		}
		return true
	})
	seedWebhookReviews(t, pool, recv.srv.URL, 0, 1)
	reg := prometheus.NewRegistry()
	runDelivery(t, pool, newTestSender(t), testDeliveryConfig(), reg)
	waitFor(t, 10*time.Second, "the message sent", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == 1
	})
	ms := recv.messages()
	if len(ms) != 4 || len(byDelivery(ms)) != 1 {
		t.Fatalf("receiver got %d requests with delivery ids %v, want 4 of one id", len(ms), byDelivery(ms))
	}
	if gap := times[3].Sub(times[2]); gap < time.Second {
		t.Fatalf("retried %v after a 429 with Retry-After: 1", gap)
	}
	for _, s := range notificationStates(t, pool) {
		if s.Attempts != 4 || !strings.Contains(s.LastError, "HTTP 429: rate limited") {
			t.Fatalf("row %+v, want 4 attempts and the 429's error", s)
		}
	}
	if got := metricValue(t, reg, "playwatch_notify_messages_total", map[string]string{"status": "retry"}); got != 3 {
		t.Fatalf("messages_total{retry} = %v, want 3", got)
	}
}

// A 410 breaks the destination with the receiver's error; its messages
// wait, untried, counted in the gauge, until the destination is ok again
// (what the API does on PATCH or a successful test); then each goes once.
func TestNotifyDeliveryBrokenDestination(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	recv := newWebhookReceiver(t)
	gone := true
	var mu sync.Mutex
	recv.setAnswer(func(_ int, _ receivedMessage, w http.ResponseWriter) bool {
		mu.Lock()
		defer mu.Unlock()
		if gone {
			http.Error(w, strings.Repeat("webhook deleted ", 30), http.StatusGone)
		}
		return gone
	})
	_, dest := seedWebhookReviews(t, pool, recv.srv.URL, 0, 5)
	reg := prometheus.NewRegistry()
	cfg := testDeliveryConfig()
	cfg.Workers = 1
	stop := runDelivery(t, pool, newTestSender(t), cfg, reg)
	waitFor(t, 10*time.Second, "the destination broken", func() bool {
		return count(t, pool, `SELECT count(*) FROM notify_destinations WHERE status = 'broken'`) == 1
	})
	time.Sleep(300 * time.Millisecond) // further attempts would arrive now
	if n := len(recv.messages()); n != 1 {
		t.Fatalf("receiver got %d requests, want 1: nothing more is tried once broken", n)
	}
	var lastError string
	if err := pool.QueryRow(context.Background(), `SELECT last_error FROM notify_destinations WHERE id = $1`, dest).Scan(&lastError); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(lastError, "HTTP 410: webhook deleted") || len(lastError) > 200 {
		t.Fatalf("destination last_error %q (%d bytes), want the receiver's answer cut to 200 bytes", lastError, len(lastError))
	}
	if n := count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'pending'`); n != 5 {
		t.Fatalf("%d pending, want all 5 waiting", n)
	}
	if got := metricValue(t, reg, "playwatch_notify_messages_total", map[string]string{"status": "broken"}); got != 1 {
		t.Fatalf("messages_total{broken} = %v, want 1", got)
	}
	stop()
	// A restart counts the gauges at once.
	reg = prometheus.NewRegistry()
	stop = runDelivery(t, pool, newTestSender(t), cfg, reg)
	waitFor(t, 5*time.Second, "the gauges", func() bool {
		return metricValue(t, reg, "playwatch_notify_destinations_broken", nil) == 1 && metricValue(t, reg, "playwatch_notify_pending", nil) == 5
	})
	mu.Lock()
	gone = false
	mu.Unlock()
	mustExec(t, pool, `UPDATE notify_destinations SET status = 'ok', last_error = NULL WHERE id = $1`, dest)
	waitFor(t, 10*time.Second, "all sent", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == 5
	})
	stop()
	if got := byDelivery(recv.messages()); len(got) != 5 || recv.okCount() != 5 {
		t.Fatalf("receiver: %v, %d answered 200; want 5 ids, each taken once", got, recv.okCount())
	}
}

// A message undelivered for GiveUp is failed: at its next failed attempt,
// or by the sweep when its destination is broken; the counter and gauge say so.
func TestNotifyDeliveryGivesUp(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	down := newWebhookReceiver(t)
	down.setAnswer(func(_ int, _ receivedMessage, w http.ResponseWriter) bool {
		http.Error(w, "down", http.StatusBadGateway)
		return true
	})
	dest := seedDestination(t, pool, "webhook", down.srv.URL)
	broken := seedDestination(t, pool, "webhook", "http://127.0.0.1:1/never")
	rule := seedRule(t, pool, 0, dest, broken)
	seedReviewMessages(t, pool, rule, dest, 2)
	seedReviewMessages(t, pool, rule, broken, 1)
	mustExec(t, pool, `UPDATE notify_destinations SET status = 'broken', last_error = 'gone' WHERE id = $1`, broken)
	// The broken destination's message is past NOTIFY_GIVE_UP (the sweep
	// fails it); the others reach it half a second in, between attempts.
	mustExec(t, pool, `UPDATE notifications SET created_at = CASE WHEN destination_id = $1
	THEN now() - interval '2 hours' ELSE now() - interval '1 hour' + interval '500 milliseconds' END`, broken)
	reg := prometheus.NewRegistry()
	cfg := testDeliveryConfig()
	cfg.GiveUp = time.Hour
	runDelivery(t, pool, newTestSender(t), cfg, reg)
	waitFor(t, 10*time.Second, "all failed", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'failed'`) == 3
	})
	// The destination's messages go one at a time, the second behind the
	// first: the first is retried until it gives up; the second, due behind
	// it, gets one attempt at most before it gives up too.
	if n := count(t, pool, `SELECT count(*) FROM notifications WHERE destination_id = $1 AND last_error LIKE 'HTTP 502: down%' AND attempts > 1
		AND id = (SELECT min(id) FROM notifications WHERE destination_id = $1)`, dest); n != 1 {
		t.Fatalf("the down receiver's first row did not fail after attempts with its error")
	}
	if n := count(t, pool, `SELECT count(*) FROM notifications WHERE destination_id = $1 AND last_error = 'not delivered within NOTIFY_GIVE_UP' AND attempts = 0`, broken); n != 1 {
		t.Fatalf("the broken destination's message: %d failed by the sweep, want 1", n)
	}
	if got := metricValue(t, reg, "playwatch_notify_messages_total", map[string]string{"status": "failed"}); got != 3 {
		t.Fatalf("messages_total{failed} = %v, want 3", got)
	}
	if n := len(byDelivery(down.messages())); n < 1 || n > 2 {
		t.Fatalf("down receiver got %d delivery ids, want 1 or 2", n)
	}
}

// A shutdown that abandons a send (the receiver stalls past Grace) leaves
// the row pending and untouched; the next run sends it once. A send that
// the receiver answers within Grace is marked: the restart repeats nothing.
func TestNotifyDeliveryShutdownMidSend(t *testing.T) {
	pool := newTestPool(t)
	recv := newWebhookReceiver(t)
	entered := make(chan struct{}, 10)
	release := make(chan struct{})
	recv.setAnswer(func(n int, _ receivedMessage, w http.ResponseWriter) bool {
		entered <- struct{}{}
		if n == 0 {
			<-release // stalled until the test ends it
			return true
		}
		if n == 1 {
			time.Sleep(300 * time.Millisecond) // answered during the shutdown's grace
		}
		return false
	})
	t.Cleanup(func() { close(release) })
	seedWebhookReviews(t, pool, recv.srv.URL, 0, 1)
	cfg := testDeliveryConfig()
	cfg.Workers = 1
	cfg.Grace = 200 * time.Millisecond
	waitEntered := func() {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("no send reached the receiver")
		}
	}
	stop := runDelivery(t, pool, newTestSender(t), cfg, prometheus.NewRegistry())
	waitEntered()
	stop()
	s := notificationStates(t, pool)
	for _, st := range s {
		if st.Status != "pending" || st.Attempts != 0 || st.LastError != "" {
			t.Fatalf("after an abandoned send: %+v, want pending and untouched", st)
		}
	}
	// Second run: the receiver answers 300 ms in, the shutdown starts at
	// once with a second of grace: the send finishes and is marked.
	cfg.Grace = 2 * time.Second
	stop = runDelivery(t, pool, newTestSender(t), cfg, prometheus.NewRegistry())
	waitEntered()
	stop()
	if n := count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent' AND attempts = 1`); n != 1 {
		t.Fatalf("%d sent, want the message marked sent within the grace", n)
	}
	stop = runDelivery(t, pool, newTestSender(t), cfg, prometheus.NewRegistry())
	time.Sleep(300 * time.Millisecond)
	stop()
	if ms := recv.messages(); len(ms) != 2 || recv.okCount() != 1 {
		t.Fatalf("receiver got %d requests, answered %d with 200; want the abandoned one and one delivery", len(ms), recv.okCount())
	}
}

// max_per_hour 3: three messages go, the other seven wait (throttled);
// once the hour allows, the seven go out as one digest and every row is
// sent, none lost, none twice.
func TestNotifyDeliveryThrottleDigest(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	recv := newWebhookReceiver(t)
	seedWebhookReviews(t, pool, recv.srv.URL, 3, 10)
	reg := prometheus.NewRegistry()
	runDelivery(t, pool, newTestSender(t), testDeliveryConfig(), reg)
	waitFor(t, 10*time.Second, "three sent, seven held back", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == 3 &&
			count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'pending' AND last_error = $1 AND next_attempt_at > now() + interval '50 minutes'`, notifyThrottleNote) == 7
	})
	time.Sleep(200 * time.Millisecond)
	if n := len(recv.messages()); n != 3 {
		t.Fatalf("receiver got %d, want 3 within the hour", n)
	}
	// An hour passes: the sent ones leave the window, the held ones are due.
	ctx := context.Background()
	mustExec(t, pool, `UPDATE notifications SET sent_at = sent_at - interval '1 hour' WHERE status = 'sent'`)
	mustExec(t, pool, `UPDATE notifications SET next_attempt_at = now() WHERE status = 'pending'`)
	waitFor(t, 10*time.Second, "the digest sent", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == 11
	})
	ms := recv.messages()
	if len(ms) != 4 {
		t.Fatalf("receiver got %d messages, want 3 and a digest", len(ms))
	}
	d := ms[3].Payload
	if d.Event != "digest" || d.Digest == nil || d.Digest.Count != 7 || d.Digest.Of != "review" || d.App.DisplayName != "Telegram" ||
		d.Links.Play != "https://play.google.com/store/apps/details?id=org.telegram.messenger&hl=en" {
		t.Fatalf("digest payload %+v %+v", d, d.Digest)
	}
	var digest int64
	var key string
	if err := pool.QueryRow(ctx, `SELECT id, event_key FROM notifications WHERE event = 'digest'`).Scan(&digest, &key); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM notifications WHERE digest_id = $1 AND status = 'sent' AND sent_at IS NOT NULL`, digest); n != 7 {
		t.Fatalf("%d rows folded into digest %d and sent, want 7", n, digest)
	}
	if !strings.HasPrefix(key, "digest:") {
		t.Fatalf("digest event_key %q", key)
	}
	for status, want := range map[string]float64{"sent": 4, "folded": 7} {
		if got := metricValue(t, reg, "playwatch_notify_messages_total", map[string]string{"status": status}); got != want {
			t.Fatalf("messages_total{%s} = %v, want %v", status, got, want)
		}
	}
	if got := metricValue(t, reg, "playwatch_notify_delivery_seconds", nil); got != 10 {
		t.Fatalf("delivery_seconds count %v, want every one of the 10 messages", got)
	}
}
