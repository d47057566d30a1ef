package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// chatReceiver stands for Slack's incoming webhooks and Telegram's Bot
// API: it answers as they document (Slack: 200 "ok"; Telegram: 200
// {"ok":true,"result":{...}}) and records the review of each message.
type chatReceiver struct {
	srv *httptest.Server

	mu      sync.Mutex
	reviews []string // one per message, "" for a message without a review link
	bodies  []string
}

// replayReviewText finds a replayed review's number in its text ("Review
// -3 of org.telegram.messenger: …").
var replayReviewText = regexp.MustCompile(`Review (-?[0-9]+) of ` + regexp.QuoteMeta(notifyE2EPackage))

func newChatReceiver(t testing.TB, telegram bool) *chatReceiver {
	r := &chatReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		id := ""
		if m := replayReviewText.FindSubmatch(body); m != nil {
			i, _ := strconv.Atoi(string(m[1]))
			id = replayReviewID(notifyE2EPackage, i)
		}
		r.mu.Lock()
		r.reviews = append(r.reviews, id)
		r.bodies = append(r.bodies, req.URL.Path+" "+string(body))
		n := len(r.reviews)
		r.mu.Unlock()
		if telegram {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"ok":true,"result":{"message_id":%d,"chat":{"id":-100123,"type":"supergroup"},"date":%d,"text":"…"}}`, n, time.Now().Unix())
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok")
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *chatReceiver) reviewIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reviews)
}

// notifyE2E is an appliance (registry, consumer, sentiment, notifier; the
// crawls run by `crawl --once` beside it) with Telegram's replayed app, a
// 1–2★ rule to a webhook, a Slack-like and a Telegram-like receiver, a rule
// for another app to a fourth receiver, and a 1–2★ rule to a receiver that
// answers 410.
type notifyE2E struct {
	t                  *testing.T
	a                  *e2eAppliance
	replay             *replayPlayStore
	env                map[string]string
	hook, other, gone  *webhookReceiver
	slack, telegram    *chatReceiver
	hookDest, goneDest int64
	added              int // new reviews added to the store so far
	hookMu             sync.Mutex
	hookDown           bool
}

const notifyE2EPackage = "org.telegram.messenger"

func startNotifyE2E(t *testing.T) *notifyE2E {
	e := &notifyE2E{t: t, replay: newReplayPlayStore(t)}
	e.replay.setApp(notifyE2EPackage, replayApp{Title: "Telegram", Reviews: 30, Replies: -1})
	e.hook, e.other, e.gone = newWebhookReceiver(t), newWebhookReceiver(t), newWebhookReceiver(t)
	e.slack, e.telegram = newChatReceiver(t, false), newChatReceiver(t, true)
	e.hook.setAnswer(func(_ int, _ receivedMessage, w http.ResponseWriter) bool {
		e.hookMu.Lock()
		defer e.hookMu.Unlock()
		if e.hookDown {
			http.Error(w, "receiver restarting", http.StatusServiceUnavailable)
		}
		return e.hookDown
	})
	e.gone.setAnswer(func(_ int, _ receivedMessage, w http.ResponseWriter) bool {
		http.Error(w, `{"error":"webhook deleted"}`, http.StatusGone)
		return true
	})
	e.env = map[string]string{
		"PLAYWATCH_DATA_DIR":  tempDataDir(t),
		"PLAYWATCH_HTTP_ADDR": freeAddr(t),
		// Not the default 9092: another appliance on the machine may hold it.
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
		"PLAYSTORE_URL":         e.replay.URL,
		"RATE_LIMIT_REQUESTS":   "0",
		"EGRESS_MIN_GAP":        "0s",
		"REVIEWS_PER_APP":       "100",
		"CRAWL_INTERVAL":        "1h",
		"NOTIFY_ALLOW_PRIVATE":  "true",
		"TELEGRAM_API_URL":      e.telegram.srv.URL,
	}
	e.a = startE2EAppliance(t, e.env, "--roles", "registry,consumer,sentiment,notifier")
	t.Cleanup(func() {
		if t.Failed() {
			var n int
			var maxAt, minCrawl, ruleAt time.Time
			err := e.a.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM reviews), (SELECT max(at) FROM reviews),
	(SELECT min(crawled_at) FROM app_stats), (SELECT min(created_at) FROM notify_rules)`).Scan(&n, &maxAt, &minCrawl, &ruleAt)
			t.Logf("reviews %d, newest at %s, first crawl %s, rules from %s (%v)", n, maxAt, minCrawl, ruleAt, err)
			for line := range strings.Lines(e.a.logs.String()) {
				if strings.Contains(line, "notif") {
					t.Log(strings.TrimSpace(line))
				}
			}
		}
	})
	if code, body := httpDo(t, http.MethodPost, e.a.base+"/api/v1/apps", `{"package_name":"`+notifyE2EPackage+`","display_name":"Telegram"}`); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	// The store's newest review is now: what the first crawl reads is
	// history (older than the rules and the first crawl), what is added
	// later is news.
	e.replay.shiftTimesTo(time.Now())
	e.hookDest = e.destination("webhook", destinationConfig{URL: e.hook.srv.URL})
	slackDest := e.destination("slack", destinationConfig{URL: e.slack.srv.URL + "/services/T000/B000/XXXX"})
	telegramDest := e.destination("telegram", destinationConfig{BotToken: "123456:ABC-test", ChatID: "-100123"})
	otherDest := e.destination("webhook", destinationConfig{URL: e.other.srv.URL})
	e.goneDest = e.destination("webhook", destinationConfig{URL: e.gone.srv.URL})
	e.rule([]string{notifyE2EPackage}, e.hookDest, slackDest, telegramDest)
	e.rule([]string{"com.example.other"}, otherDest)
	e.rule([]string{notifyE2EPackage}, e.goneDest)
	e.crawl()
	return e
}

func (e *notifyE2E) destination(typ string, c destinationConfig) int64 {
	e.t.Helper()
	public, secrets := secretsOf(typ, c)
	pj, _ := json.Marshal(public)
	sj, _ := json.Marshal(secrets)
	var id int64
	ctx := context.Background()
	if err := e.a.pool.QueryRow(ctx, `INSERT INTO notify_destinations (name, type, config) VALUES ($1, $2, $3) RETURNING id`, typ+" receiver", typ, pj).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.a.pool.Exec(ctx, `INSERT INTO notify_destination_secrets VALUES ($1, $2)`, id, sj); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// rule is a review rule for 1–2★ reviews of apps, with no throttle.
func (e *notifyE2E) rule(apps []string, dests ...int64) {
	e.t.Helper()
	ctx := context.Background()
	var id int64
	if err := e.a.pool.QueryRow(ctx, `INSERT INTO notify_rules (name, event, apps, filter, max_per_hour) VALUES ('1-2 stars', 'review', $1, '{"max_stars": 2}', 0) RETURNING id`,
		apps).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	for _, d := range dests {
		if _, err := e.a.pool.Exec(ctx, `INSERT INTO notify_rule_destinations VALUES ($1, $2)`, id, d); err != nil {
			e.t.Fatal(err)
		}
	}
}

// crawl runs one cycle beside the appliance and waits until it is stored
// and scored.
func (e *notifyE2E) crawl() {
	e.t.Helper()
	e.a.command("crawl", "--once")
	e.a.waitDrained()
}

// addReviews puts n new reviews at the head of the store and returns the
// ids of those with 1 or 2 stars (new review k has k%5+1 stars).
func (e *notifyE2E) addReviews(n int) []string {
	var low []string
	for k := e.added + 1; k <= e.added+n; k++ {
		if k%5+1 <= 2 {
			low = append(low, replayReviewID(notifyE2EPackage, -k))
		}
	}
	e.added += n
	e.replay.addReviews(notifyE2EPackage, n)
	return low
}

func (e *notifyE2E) setHookDown(down bool) {
	e.hookMu.Lock()
	defer e.hookMu.Unlock()
	e.hookDown = down
}

// waitDelivered waits until each of the three destinations of the 1–2★
// rule got want, then checks that none got anything twice or anything
// else, and that the rows say sent.
func (e *notifyE2E) waitDelivered(want []string) {
	e.t.Helper()
	sorted := slices.Sorted(slices.Values(want))
	okIDs := func(ms []receivedMessage) []string { // one per delivery id
		var ids []string
		seen := map[string]bool{}
		for _, m := range ms {
			if m.Payload.Review != nil && !seen[m.DeliveryID] {
				ids = append(ids, m.Payload.Review.ReviewID)
			}
			seen[m.DeliveryID] = true
		}
		return ids
	}
	waitFor(e.t, 60*time.Second, "the 1–2★ reviews at every destination", func() bool {
		return len(e.slack.reviewIDs()) >= len(want) && len(e.telegram.reviewIDs()) >= len(want) &&
			e.hook.okCount() >= len(want) && count(e.t, e.a.pool, `SELECT count(*) FROM notifications WHERE status = 'pending' AND destination_id <> $1`, e.goneDest) == 0
	})
	time.Sleep(time.Second) // a repeat would arrive now
	for name, got := range map[string][]string{
		"webhook":  okIDs(e.hook.messages()),
		"slack":    e.slack.reviewIDs(),
		"telegram": e.telegram.reviewIDs(),
	} {
		if g := slices.Sorted(slices.Values(got)); !slices.Equal(g, sorted) {
			e.slack.mu.Lock()
			e.t.Logf("slack's first message: %.600s", e.slack.bodies[0])
			e.slack.mu.Unlock()
			e.t.Fatalf("%s got reviews %v, want each of %v once", name, g, sorted)
		}
	}
	if e.hook.okCount() != len(want) {
		e.t.Fatalf("webhook took %d messages with a 2xx, want %d: one per review", e.hook.okCount(), len(want))
	}
	if n := len(e.other.messages()); n != 0 {
		e.t.Fatalf("the other app's receiver got %d messages", n)
	}
	if n := count(e.t, e.a.pool, `SELECT count(*) FROM notifications WHERE status = 'sent' AND destination_id <> $1`, e.goneDest); n != 3*len(want) {
		e.t.Fatalf("%d rows sent, want %d", n, 3*len(want))
	}
}

// Reviews crawled → stored → scored → one message per new 1–2★ review at
// the webhook, Slack and Telegram; none of the history the first crawl
// read, none for the other app's rule; the receiver that answers 410 is a
// broken destination. The smoke version of TestFaultNotifyEndToEndRestart.
func TestNotifyEndToEnd(t *testing.T) {
	t.Parallel()
	e := startNotifyE2E(t)
	want := notifyE2EFirstRound(t, e)
	m := scrapeMetrics(t, e.a.base)
	for sample, v := range map[string]float64{
		`playwatch_notify_messages_total{status="sent"}`:   float64(3 * len(want)),
		`playwatch_notify_messages_total{status="broken"}`: 1,
		`playwatch_notify_messages_total{status="failed"}`: 0,
		`playwatch_notify_delivery_seconds_count`:          float64(3 * len(want)),
		`playwatch_notify_review_age_seconds_count`:        float64(3 * len(want)),
	} {
		if m[sample] != v {
			t.Errorf("%s = %v, want %v", sample, m[sample], v)
		}
	}
	if err := e.a.stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, e.a.logs)
	}
}

// notifyE2EFirstRound: ten new reviews delivered once each, and nothing of
// the first crawl's history; the 410 receiver is broken. It returns
// the review ids delivered.
func notifyE2EFirstRound(t *testing.T, e *notifyE2E) []string {
	t.Helper()
	// Nothing for the history: waitDelivered checks that each destination
	// got the new reviews and nothing else.
	want := e.addReviews(10)
	e.crawl()
	e.waitDelivered(want)
	var status, lastError string
	if err := e.a.pool.QueryRow(context.Background(), `SELECT status, last_error FROM notify_destinations WHERE id = $1`, e.goneDest).Scan(&status, &lastError); err != nil {
		t.Fatal(err)
	}
	if status != "broken" || !strings.Contains(lastError, "410") || !strings.Contains(lastError, "webhook deleted") {
		t.Fatalf("the 410 destination: status %q, last_error %q", status, lastError)
	}
	if n := len(e.gone.messages()); n != 1 {
		t.Fatalf("the 410 receiver got %d requests, want 1: nothing more once broken", n)
	}
	return want
}

// TestNotifyEndToEnd, and then: the broken destination on /metrics (its
// gauge is counted every 15 s), and a graceful restart while messages go
// out repeats none.
func TestFaultNotifyEndToEndRestart(t *testing.T) {
	requireFaultSuite(t)
	e := startNotifyE2E(t)
	time.Sleep(2 * time.Second) // what the decider would make of the history
	if n := count(t, e.a.pool, `SELECT count(*) FROM notifications`); n != 0 {
		t.Fatalf("%d messages decided for the first crawl's reviews (history), want none", n)
	}
	want := notifyE2EFirstRound(t, e)
	waitFor(t, 20*time.Second, "the broken destination on /metrics", func() bool {
		return scrapeMetric(t, e.a.base, "playwatch_notify_destinations_broken", "") == 1
	})
	// A graceful restart as soon as the next messages start going out.
	want = append(want, e.addReviews(10)...)
	before := e.hook.okCount()
	e.crawl()
	waitFor(t, 30*time.Second, "the next messages going out", func() bool { return e.hook.okCount() > before })
	e.a.restart()
	e.waitDelivered(want)
	if err := e.a.stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, e.a.logs)
	}
}

// A receiver that answers 503 for a while gets every message once it is
// back; a second server running the notifier alone (`notify run`) beside
// the appliance sends nothing twice.
func TestFaultNotifyReceiverDownAndSecondServer(t *testing.T) {
	requireFaultSuite(t)
	e := startNotifyE2E(t)
	e.setHookDown(true)
	want := e.addReviews(10)
	e.crawl()
	waitFor(t, 30*time.Second, "the webhook's messages to be retried", func() bool {
		return count(t, e.a.pool, `SELECT count(*) FROM notifications WHERE destination_id = $1 AND status = 'pending' AND attempts > 0`, e.hookDest) > 0
	})
	time.Sleep(10 * time.Second) // down for a while: several attempts
	e.setHookDown(false)
	e.waitDelivered(want)
	if n := count(t, e.a.pool, `SELECT count(*) FROM notifications WHERE destination_id = $1 AND last_error LIKE '%503%'`, e.hookDest); n == 0 {
		t.Fatalf("no webhook row records the 503")
	}

	// A second notifier on the same database.
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	var logs syncBuffer
	go func() { second <- run(ctx, []string{"notify", "run"}, envFunc(e.env), io.Discard, &logs) }()
	t.Cleanup(func() {
		cancel()
		if err := <-second; err != nil {
			t.Errorf("notify run: %v\n%s", err, logs.String())
		}
	})
	waitFor(t, 30*time.Second, "the second notifier", func() bool { return strings.Contains(logs.String(), "notify delivery started") })
	for range 3 {
		want = append(want, e.addReviews(10)...)
		e.crawl()
	}
	e.waitDelivered(want)
	t.Logf("second server: %s", strconv.Quote(logs.String()[:min(len(logs.String()), 400)]))
}
