package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// decideFixture is a migrated database with one webhook destination, a
// decider on a fake clock and helpers that write rows as the consumer, the
// sentiment job, the crawler and the registry API do.
type decideFixture struct {
	t    *testing.T
	pool *pgxpool.Pool
	clk  *fakeClock
	dest int64
	d    *notifyDecider
	reg  *prometheus.Registry
}

var testNotifyLocales = localeDefaults{Default: locale{Lang: "en", Country: "us"}, Iranian: locale{Lang: "fa", Country: "ir"}}

// newDecideFixture also returns t0, the clock's start to the second: the
// time every test lays its rows out from.
func newDecideFixture(t *testing.T) (f *decideFixture, t0 time.Time) {
	t.Helper()
	f = &decideFixture{t: t, pool: newTestPool(t), clk: newFakeClock(false)}
	t0 = f.clk.Now().Truncate(time.Second)
	f.d, f.reg = f.decider()
	if err := f.pool.QueryRow(context.Background(), `INSERT INTO notify_destinations (name, type, config) VALUES ('hook', 'webhook', '{"url": "https://hooks.example/x"}') RETURNING id`).Scan(&f.dest); err != nil {
		t.Fatal(err)
	}
	return f, t0
}

func (f *decideFixture) decider() (*notifyDecider, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	cfg := notifyDeciderConfig{Interval: 10 * time.Millisecond, SentimentWait: 2 * time.Minute, PublicURL: "https://pw.example/",
		CrawlInterval: time.Hour, Clock: f.clk, Locales: testNotifyLocales}
	return newNotifyDecider(f.pool, cfg, reg, testLogger(f.t)), reg
}

func (f *decideFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// app registers pkg; firstCrawl, when not zero, is its first app_stats row.
func (f *decideFixture) app(pkg string, iranian bool, firstCrawl time.Time) int64 {
	f.t.Helper()
	var id int64
	if err := f.pool.QueryRow(context.Background(), `INSERT INTO apps_registry_application (package_name, display_name, is_iranian_app)
		VALUES ($1::text, 'App ' || $1::text, $2) RETURNING id`, pkg, iranian).Scan(&id); err != nil {
		f.t.Fatal(err)
	}
	if !firstCrawl.IsZero() {
		f.stats(id, firstCrawl, 4.5, "1.0")
	}
	return id
}

func (f *decideFixture) stats(app int64, at time.Time, score float64, version string) {
	f.t.Helper()
	f.exec(`INSERT INTO app_stats (application_id, country, lang, score, version, crawled_at) VALUES ($1, 'us', 'en', $2, $3, $4)`, app, score, version, at)
}

type notifyTestReview struct {
	id        string
	stars     int
	text      string
	at        time.Time
	firstSeen time.Time // zero: at + 1 min
}

func (f *decideFixture) review(app int64, r notifyTestReview) {
	f.t.Helper()
	if r.firstSeen.IsZero() {
		r.firstSeen = r.at.Add(time.Minute)
	}
	f.exec(`INSERT INTO reviews (application_id, review_id, user_name, score, content, at, app_version, reply_content, replied_at, first_seen_at, last_synced_at)
		VALUES ($1, $2, 'Sara', $3, $4, $5::timestamptz, '2.1.0', 'Thanks, fixed in 2.2', $5::timestamptz + interval '1 hour', $6, $6)`,
		app, r.id, r.stars, r.text, r.at, r.firstSeen)
}

// score labels a review as the sentiment job does.
func (f *decideFixture) score(reviewID, label, lang string, at time.Time) {
	f.t.Helper()
	f.exec(`UPDATE reviews SET sentiment = $2, text_lang = $3, sentiment_model = 'test', sentiment_at = $4,
		sentiment_text_hash = reviews_sentiment_input(score, content) WHERE review_id = $1`, reviewID, label, lang, at)
}

// crawlOutcome records the outcome of app's last crawl of path in storefront
// loc, as the crawler does; status nil is no HTTP status.
func (f *decideFixture) crawlOutcome(app int64, loc locale, path string, at time.Time, outcome string, status any, errText string) {
	f.t.Helper()
	f.exec(`INSERT INTO app_crawl_outcomes (application_id, country, lang, path, at, outcome, http_status, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (application_id, country, lang, path) DO UPDATE SET at = EXCLUDED.at, outcome = EXCLUDED.outcome, http_status = EXCLUDED.http_status, error = EXCLUDED.error`,
		app, loc.Country, loc.Lang, path, at, outcome, status, errText)
}

// rule creates a rule with the fixture's destination, created at created.
func (f *decideFixture) rule(event, filter string, backfill string, apps []string, created time.Time) int64 {
	f.t.Helper()
	var id int64
	if err := f.pool.QueryRow(context.Background(), `INSERT INTO notify_rules (name, event, apps, filter, backfill, created_at, updated_at)
		VALUES ($1::text, $1::text, $2, $3, $4::interval, $5, $5) RETURNING id`, event, apps, filter, backfill, created).Scan(&id); err != nil {
		f.t.Fatal(err)
	}
	f.exec(`INSERT INTO notify_rule_destinations (rule_id, destination_id) VALUES ($1, $2)`, id, f.dest)
	return id
}

func (f *decideFixture) runOnce() int {
	f.t.Helper()
	n, err := f.d.RunOnce(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// runAfter moves the clock on by d and decides once.
func (f *decideFixture) runAfter(d time.Duration) int {
	f.t.Helper()
	f.clk.Advance(d)
	return f.runOnce()
}

type testOutboxRow struct {
	Key      string
	Event    string
	Payload  notifyPayload
	EventAt  time.Time
	SourceAt *time.Time
}

// outbox is the rule's rows in insert order.
func (f *decideFixture) outbox(rule int64) []testOutboxRow {
	f.t.Helper()
	var out []testOutboxRow
	var r testOutboxRow
	var payload []byte
	eachRow(f.t, f.pool, []any{&r.Key, &r.Event, &payload, &r.EventAt, &r.SourceAt}, func() {
		r.Payload = notifyPayload{}
		if err := json.Unmarshal(payload, &r.Payload); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, r)
	}, `SELECT event_key, event, payload, event_at, source_at FROM notifications
		WHERE rule_id = $1 AND destination_id = $2 AND status = 'pending' ORDER BY id`, rule, f.dest)
	return out
}

// reviewIDs is the review ids of the rule's outbox rows.
func (f *decideFixture) reviewIDs(rule int64) []string {
	f.t.Helper()
	var ids []string
	for _, r := range f.outbox(rule) {
		if r.Payload.Review == nil {
			f.t.Fatalf("row %s has no review", r.Key)
		}
		ids = append(ids, r.Payload.Review.ReviewID)
	}
	return ids
}

func (f *decideFixture) textHash(reviewID string) string {
	f.t.Helper()
	var h string
	if err := f.pool.QueryRow(context.Background(), `SELECT encode(reviews_sentiment_input(score, content), 'hex') FROM reviews WHERE review_id = $1`, reviewID).Scan(&h); err != nil {
		f.t.Fatal(err)
	}
	return h
}

// New reviews after the rule and the app's first crawl fire once, with the
// whole payload; the first crawl's history and reviews before the rule do
// not, unless the rule has a backfill; an edited text fires again, a
// re-sync without change does not.
func TestNotifyReviewEventsNoFloodAndEdits(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.shop", false, t0.Add(-2*time.Hour))
	f.review(app, notifyTestReview{id: "hist", stars: 1, text: "old and bad", at: t0.Add(-3 * time.Hour), firstSeen: t0.Add(-2 * time.Hour)})
	f.review(app, notifyTestReview{id: "pre", stars: 1, text: "bad before the rule", at: t0.Add(-30 * time.Minute)})
	rule := f.rule("review", `{"max_stars": 2}`, "0", nil, t0.Add(-10*time.Minute))
	backfill := f.rule("review", `{"max_stars": 2}`, "24h", []string{"com.example.shop"}, t0.Add(-10*time.Minute))
	other := f.rule("review", `{}`, "24h", []string{"com.example.other"}, t0.Add(-10*time.Minute))
	f.review(app, notifyTestReview{id: "new", stars: 1, text: "Crashes at start", at: t0.Add(-time.Minute), firstSeen: t0})
	f.review(app, notifyTestReview{id: "happy", stars: 5, text: "Great app", at: t0.Add(-time.Minute), firstSeen: t0})

	if n := f.runOnce(); n != 3 {
		t.Fatalf("first pass inserted %d rows, want 3 (new for two rules, pre for the backfill)", n)
	}
	if got := f.reviewIDs(rule); !slices.Equal(got, []string{"new"}) {
		t.Errorf("rule without backfill got %v, want [new]", got)
	}
	if got := f.reviewIDs(backfill); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"new", "pre"}) {
		t.Errorf("rule with a 24h backfill got %v, want new and pre (never the first crawl's hist)", got)
	}
	if got := f.reviewIDs(other); len(got) != 0 {
		t.Errorf("rule of another app got %v", got)
	}
	rows := f.outbox(rule)
	r := rows[0]
	if want := "review:new:" + f.textHash("new"); r.Key != want || r.Event != "review" {
		t.Errorf("key %q event %q, want %q review", r.Key, r.Event, want)
	}
	if !r.EventAt.Equal(t0) || r.SourceAt == nil || !r.SourceAt.Equal(t0.Add(-time.Minute)) {
		t.Errorf("event_at %v source_at %v, want first_seen_at %v and at", r.EventAt, r.SourceAt, t0)
	}
	p := r.Payload
	wantApp := payloadApp{PackageName: "com.example.shop", DisplayName: "App com.example.shop", Country: "us", Lang: "en"}
	if p.Event != "review" || p.App != wantApp || p.Alert != nil {
		t.Errorf("payload %+v", p)
	}
	if p.Links.Play != "https://play.google.com/store/apps/details?id=com.example.shop&hl=en" ||
		p.Links.StatusPage != "https://pw.example/apps/com.example.shop" {
		t.Errorf("links %+v", p.Links)
	}
	rv := p.Review
	if rv.ReviewID != "new" || rv.UserName != "Sara" || rv.Stars != 1 || rv.Text != "Crashes at start" || !rv.At.Equal(t0.Add(-time.Minute)) ||
		rv.AppVersion != "2.1.0" || rv.ReplyText != "Thanks, fixed in 2.2" || rv.RepliedAt == nil || !rv.RepliedAt.Equal(t0.Add(59*time.Minute)) ||
		rv.URL != "https://play.google.com/store/apps/details?id=com.example.shop&reviewId=new&hl=en" {
		t.Errorf("review %+v", rv)
	}
	// Not scored yet and the rule does not filter on sentiment: the stars' label, said so.
	if rv.Sentiment != "NEGATIVE" || !rv.SentimentFromStars || rv.TextLang != "en" {
		t.Errorf("sentiment %q from stars %v lang %q, want NEGATIVE from the stars, en", rv.Sentiment, rv.SentimentFromStars, rv.TextLang)
	}

	if n := f.runAfter(time.Second); n != 0 {
		t.Fatalf("a second pass inserted %d rows", n)
	}
	// A re-sync without change (a later crawl) decides nothing new.
	f.exec(`UPDATE reviews SET last_synced_at = $1 WHERE review_id = 'new'`, t0.Add(time.Minute))
	if n := f.runAfter(time.Second); n != 0 {
		t.Fatalf("a re-sync without change inserted %d rows", n)
	}
	// The author edits the text of a recent review: a new at, new content.
	f.exec(`UPDATE reviews SET content = 'Still crashes after 2.2', at = $1, last_synced_at = $2 WHERE review_id = 'new'`, t0.Add(90*time.Second), t0.Add(2*time.Minute))
	if n := f.runAfter(time.Second); n != 2 {
		t.Fatalf("an edited text inserted %d rows, want 2 (one per rule)", n)
	}
	rows = f.outbox(rule)
	if len(rows) != 2 || rows[1].Key != "review:new:"+f.textHash("new") || rows[1].Key == rows[0].Key ||
		rows[1].Payload.Review.Text != "Still crashes after 2.2" || !rows[1].EventAt.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("after the edit: %+v", rows)
	}
	// An old review (seen long before the cursors) edited: found once the sentiment job scored the new text.
	f.runAfter(10 * time.Minute)
	f.exec(`UPDATE reviews SET content = 'Worse now', at = $1, last_synced_at = $1 WHERE review_id = 'pre'`, f.clk.Now().Add(-time.Minute))
	if n := f.runAfter(time.Second); n != 0 {
		t.Fatalf("an unscored edit of an old review inserted %d rows before it was scored", n)
	}
	f.score("pre", "NEGATIVE", "en", f.clk.Now())
	if n := f.runAfter(time.Second); n != 2 {
		t.Fatalf("the scored edit of an old review inserted %d rows, want 2", n)
	}
	last := f.outbox(backfill)
	if rv := last[len(last)-1].Payload.Review; rv.ReviewID != "pre" || rv.Text != "Worse now" || rv.Sentiment != "NEGATIVE" || rv.SentimentFromStars {
		t.Errorf("edited old review: %+v", rv)
	}
	if got := metricValue(t, f.reg, "playwatch_notify_events_total", map[string]string{"event": "review"}); got != 7 {
		t.Errorf("playwatch_notify_events_total{event=review} = %v, want 7", got)
	}
}

// Each filter alone, and keywords on the normalised text: Arabic ي and ك,
// a space or ZWNJ in نمی‌شه, case; whole words only.
func TestNotifyReviewFilters(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("ir.example.bank", true, t0.Add(-time.Hour))
	created := t0.Add(-30 * time.Minute)
	rules := map[string]int64{
		"max_stars":  f.rule("review", `{"max_stars": 2}`, "0", nil, created),
		"sentiment":  f.rule("review", `{"sentiment": ["NEGATIVE", "NEUTRAL"]}`, "0", nil, created),
		"text_lang":  f.rule("review", `{"text_lang": ["fa"]}`, "0", nil, created),
		"keywords":   f.rule("review", `{"keywords": ["باز نمی‌شه", "کارت", "LOGIN"]}`, "0", nil, created),
		"min_length": f.rule("review", `{"min_length": 20}`, "0", nil, created),
		"all":        f.rule("review", `{"max_stars": 3, "sentiment": ["NEGATIVE"], "text_lang": ["fa"], "keywords": ["کارت"], "min_length": 10}`, "0", nil, created),
	}
	type rv struct {
		id, text, label, lang string
		stars                 int
	}
	for _, r := range []rv{
		{"fa-space", "اصلا باز نمي شه برنامه", "NEGATIVE", "fa", 1},         // Arabic ي and a space for the ZWNJ
		{"fa-card", "كارت به كارت خطا میده همیشه", "NEGATIVE", "fa", 3},     // Arabic ك
		{"en-login", "Cannot Login since yesterday!!", "NEGATIVE", "en", 2}, // case
		{"en-bad", "bad ad everywhere", "NEUTRAL", "en", 4},                 // "ad" is not "login", and no keyword inside "bad"
		{"en-good", "Lovely", "POSITIVE", "en", 5},
		{"fa-cards", "کارتها کار نمیکنه", "NEGATIVE", "fa", 4}, // کارت+ها is one word, not کارت
		{"fa-zwnj", "دیگه باز نمی‌شه", "POSITIVE", "fa", 5},    // the keyword's ZWNJ in the text too
	} {
		f.review(app, notifyTestReview{id: r.id, stars: r.stars, text: r.text, at: t0.Add(-time.Minute), firstSeen: t0})
		f.score(r.id, r.label, r.lang, t0)
	}
	f.runOnce()
	want := map[string][]string{
		"max_stars":  {"en-login", "fa-space"},
		"sentiment":  {"en-bad", "en-login", "fa-card", "fa-cards", "fa-space"},
		"text_lang":  {"fa-card", "fa-cards", "fa-space", "fa-zwnj"},
		"keywords":   {"en-login", "fa-card", "fa-space", "fa-zwnj"},
		"min_length": {"en-login", "fa-card", "fa-space"},
		"all":        {"fa-card"},
	}
	for name, rule := range rules {
		got := slices.Sorted(slices.Values(f.reviewIDs(rule)))
		if !slices.Equal(got, want[name]) {
			t.Errorf("%s: got %v, want %v", name, got, want[name])
		}
	}
	// An Iranian app's storefront and links.
	p := f.outbox(rules["all"])[0].Payload
	if p.App.Country != "ir" || p.App.Lang != "fa" || p.Review.URL != "https://play.google.com/store/apps/details?id=ir.example.bank&reviewId=fa-card&hl=fa" ||
		p.Review.Sentiment != "NEGATIVE" || p.Review.SentimentFromStars || p.Review.TextLang != "fa" {
		t.Errorf("payload %+v review %+v", p.App, p.Review)
	}
}

// A rule on sentiment waits for the job's label, at most
// NOTIFY_SENTIMENT_WAIT after the review was stored, then goes with the
// stars' label and says so; a rule without one does not wait.
func TestNotifyReviewSentimentWait(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.wait", false, t0.Add(-time.Hour))
	onSentiment := f.rule("review", `{"sentiment": ["NEGATIVE"]}`, "0", nil, t0.Add(-time.Minute))
	onStars := f.rule("review", `{"max_stars": 2}`, "0", nil, t0.Add(-time.Minute))
	f.review(app, notifyTestReview{id: "late", stars: 1, text: "Terrible", at: t0.Add(-10 * time.Second), firstSeen: t0})
	f.review(app, notifyTestReview{id: "scored", stars: 2, text: "Awful update", at: t0.Add(-10 * time.Second), firstSeen: t0})

	if n := f.runOnce(); n != 2 {
		t.Fatalf("first pass inserted %d rows, want the 2 of the rule on stars", n)
	}
	if got := f.reviewIDs(onSentiment); len(got) != 0 {
		t.Fatalf("the rule on sentiment did not wait: %v", got)
	}
	f.clk.Advance(time.Minute)
	f.score("scored", "NEGATIVE", "en", f.clk.Now())
	if n := f.runOnce(); n != 1 {
		t.Fatalf("after one review was scored: %d rows, want 1", n)
	}
	if got := f.reviewIDs(onSentiment); !slices.Equal(got, []string{"scored"}) {
		t.Fatalf("rule on sentiment: %v, want [scored]", got)
	}
	if rv := f.outbox(onSentiment)[0].Payload.Review; rv.Sentiment != "NEGATIVE" || rv.SentimentFromStars {
		t.Errorf("scored review: %+v", rv)
	}
	// 1m59s after it was stored
	if n := f.runAfter(59 * time.Second); n != 0 {
		t.Fatalf("before the wait is over: %d rows", n)
	}
	if n := f.runAfter(2 * time.Second); n != 1 {
		t.Fatalf("after the wait: %d rows, want 1", n)
	}
	rows := f.outbox(onSentiment)
	if rv := rows[1].Payload.Review; rv.ReviewID != "late" || rv.Sentiment != "NEGATIVE" || !rv.SentimentFromStars || rv.TextLang != "en" {
		t.Errorf("review past the wait: %+v", rv)
	}
	// The job's label arriving later changes nothing: same text, same key.
	f.score("late", "NEGATIVE", "en", f.clk.Now())
	if n := f.runAfter(time.Second); n != 0 {
		t.Fatalf("a late label inserted %d rows", n)
	}
	if n := len(f.outbox(onStars)); n != 2 {
		t.Errorf("rule on stars has %d rows, want 2", n)
	}
}

// Two deciders at once (two servers) insert each event once.
func TestNotifyDecidersInParallel(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.busy", false, t0.Add(-time.Hour))
	rule := f.rule("review", `{"max_stars": 2}`, "0", nil, t0.Add(-time.Minute))
	f.exec(`INSERT INTO reviews (application_id, review_id, score, content, at, first_seen_at, last_synced_at)
		SELECT $1, 'r' || i, i % 5 + 1, 'text ' || i, $2, $3, $3 FROM generate_series(1, 500) AS i`, app, t0.Add(-30*time.Second), t0)
	other, _ := f.decider()
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for _, d := range []*notifyDecider{f.d, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				n, err := d.RunOnce(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				total += n
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if got := count(t, f.pool, `SELECT count(*) FROM notifications WHERE rule_id = $1`, rule); got != 200 || total != 200 {
		t.Fatalf("%d rows, %d reported inserted, want 200 (1 and 2 stars of 500)", got, total)
	}
	if got := count(t, f.pool, `SELECT count(DISTINCT event_key) FROM notifications`); got != 200 {
		t.Fatalf("%d distinct keys", got)
	}
}

// rating_drop: once per episode that starts after the rule; again after it
// ended and the rating drops anew.
func TestNotifyRatingDrop(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.rating", false, t0.Add(-25*time.Hour))
	rule := f.rule("rating_drop", `{}`, "0", nil, t0.Add(-time.Hour))
	late := f.rule("rating_drop", `{}`, "0", nil, t0.Add(-5*time.Minute)) // created after the drop began
	strict := f.rule("rating_drop", `{"min_drop": 0.2, "window": "1d"}`, "0", nil, t0.Add(-time.Hour))
	f.stats(app, t0.Add(-10*time.Minute), 4.4, "1.0")
	if n := f.runOnce(); n != 0 {
		t.Fatalf("a drop of 10 min inserted %d rows, want none before it held 15 min (PlaywatchRatingDrop's for)", n)
	}
	if n := f.runAfter(5 * time.Minute); n != 1 {
		t.Fatalf("inserted %d rows, want 1", n)
	}
	rows := f.outbox(rule)
	want := "rating_drop:com.example.rating:us:en:" + unixKey(t0.Add(-10*time.Minute))
	if len(rows) != 1 || rows[0].Key != want {
		t.Fatalf("rows %+v, want key %s", rows, want)
	}
	a := rows[0].Payload.Alert
	if a == nil || a.Kind != "rating_drop" || a.Value != "4.40" || a.Previous != "4.50" || !a.StartedAt.Equal(t0.Add(-10*time.Minute)) ||
		a.EndedAt != nil || a.Summary != "com.example.rating: rating down 0.10 in 24h" || rows[0].SourceAt != nil {
		t.Errorf("alert %+v", a)
	}
	if len(f.outbox(late)) != 0 || len(f.outbox(strict)) != 0 {
		t.Errorf("the rule created during the drop or with min_drop 0.2 fired")
	}
	// Still down at the next crawl: the same episode.
	f.clk.Advance(time.Minute)
	f.stats(app, t0.Add(time.Minute), 4.38, "1.0")
	if n := f.runOnce(); n != 0 {
		t.Fatalf("the same episode inserted %d rows", n)
	}
	// Recovered, then down again: a new episode.
	f.clk.Advance(time.Minute)
	f.stats(app, t0.Add(2*time.Minute), 4.5, "1.0")
	f.runOnce()
	f.clk.Advance(time.Minute)
	f.stats(app, t0.Add(3*time.Minute), 4.2, "1.0")
	if n := f.runOnce(); n != 0 {
		t.Fatalf("a new drop inserted %d rows at once, want none for 15 min", n)
	}
	// 15 min since the crawl that showed it
	if n := f.runAfter(10 * time.Minute); n != 3 {
		t.Fatalf("a new drop inserted %d rows, want 3 (every rule: it started after each)", n)
	}
	if rows := f.outbox(rule); len(rows) != 2 || rows[1].Key != "rating_drop:com.example.rating:us:en:"+unixKey(t0.Add(3*time.Minute)) {
		t.Errorf("rows %+v", rows)
	}
}

// negative_spike: ≥ 5 negative reviews in the hour and ≥ 3 × the hourly
// average of the week; once per episode, keyed by its hour.
func TestNotifyNegativeSpike(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.spike", false, t0.Add(-8*24*time.Hour))
	rule := f.rule("negative_spike", `{}`, "0", nil, t0.Add(-2*time.Hour))
	many := f.rule("negative_spike", `{"min_count": 10}`, "0", nil, t0.Add(-2*time.Hour))
	// A week of one negative review a day: an hourly average of 1/24.
	for i := range 7 {
		id := "week" + string(rune('a'+i))
		f.review(app, notifyTestReview{id: id, stars: 1, text: "meh", at: t0.Add(-time.Duration(i+1) * 23 * time.Hour)})
		f.score(id, "NEGATIVE", "en", t0)
	}
	for i := range 4 {
		id := "hour" + string(rune('a'+i))
		f.review(app, notifyTestReview{id: id, stars: 1, text: "broken", at: t0.Add(-time.Duration(50-i*10) * time.Minute)})
		f.score(id, "NEGATIVE", "en", t0)
	}
	if n := f.runOnce(); n != 0 {
		t.Fatalf("4 negative reviews in the hour inserted %d rows", n)
	}
	fifth := t0.Add(-5 * time.Minute)
	f.review(app, notifyTestReview{id: "houre", stars: 1, text: "broken", at: fifth})
	f.score("houre", "NEGATIVE", "en", t0)
	if n := f.runAfter(11 * time.Second); n != 1 {
		t.Fatalf("the fifth inserted %d rows, want 1", n)
	}
	rows := f.outbox(rule)
	if want := "negative_spike:com.example.spike:us:en:" + unixKey(fifth.Truncate(time.Hour)); rows[0].Key != want {
		t.Errorf("key %s, want %s", rows[0].Key, want)
	}
	if a := rows[0].Payload.Alert; a.Value != "5" || a.Previous != "0.1" || !a.StartedAt.Equal(fifth) ||
		a.Summary != "com.example.spike: 5 negative reviews in the last hour" {
		t.Errorf("alert %+v", a)
	}
	if len(f.outbox(many)) != 0 {
		t.Error("the rule with min_count 10 fired")
	}
	f.review(app, notifyTestReview{id: "hourf", stars: 1, text: "broken", at: t0.Add(-time.Minute)})
	f.score("hourf", "NEGATIVE", "en", t0)
	if n := f.runAfter(11 * time.Second); n != 0 {
		t.Fatalf("a sixth during the spike inserted %d rows", n)
	}
}

// crawl_failing: two failures in a row start it with the last outcome as
// its cause, a success ends it (a second message); a 404 starts at once;
// no success for two crawl intervals starts it too.
func TestNotifyCrawlFailing(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.flaky", false, time.Time{})
	gone := f.app("com.example.gone", false, time.Time{})
	stale := f.app("com.example.stale", false, time.Time{})
	rule := f.rule("crawl_failing", `{}`, "0", nil, t0.Add(-time.Hour))
	outcome := func(app int64, path string, at time.Time, o string, status any, errText string) {
		f.crawlOutcome(app, testNotifyLocales.Default, path, at, o, status, errText)
	}
	next := func() int { return f.runAfter(11 * time.Second) }

	outcome(app, "reviews", t0.Add(-2*time.Minute), "throttled", 429, "rate limited")
	outcome(gone, "stats", t0.Add(-time.Minute), "not_found", 404, "")
	outcome(stale, "stats", t0.Add(-30*time.Minute), "ok", nil, "")
	if n := f.runOnce(); n != 1 {
		t.Fatalf("first pass inserted %d rows, want 1 (not_found)", n)
	}
	rows := f.outbox(rule)
	if rows[0].Key != "crawl_failing:com.example.gone:us:en:stats:"+unixKey(t0.Add(-time.Minute)) || rows[0].Payload.Alert.Value != "not_found" {
		t.Errorf("not_found row %+v", rows[0])
	}
	outcome(app, "reviews", t0, "throttled", 429, "rate limited")
	if n := next(); n != 0 {
		t.Fatalf("the second failure inserted %d rows at once, want none for 10 min (PlaywatchAppNotCrawled's for)", n)
	}
	if n := f.runAfter(10 * time.Minute); n != 1 {
		t.Fatalf("the second failure, 10 min on, inserted %d rows, want 1", n)
	}
	rows = f.outbox(rule)
	start := rows[1]
	a := start.Payload.Alert
	if start.Key != "crawl_failing:com.example.flaky:us:en:reviews:"+unixKey(t0) || a.Kind != "crawl_failing" || a.Value != "throttled" ||
		!strings.Contains(a.Summary, "throttled (HTTP 429): rate limited") || a.EndedAt != nil || !a.StartedAt.Equal(t0) {
		t.Errorf("start row %s %+v", start.Key, a)
	}
	outcome(app, "reviews", t0.Add(time.Minute), "timeout", nil, "deadline")
	if n := next(); n != 0 {
		t.Fatalf("a third failure inserted %d rows", n)
	}
	outcome(app, "reviews", t0.Add(2*time.Minute), "ok", nil, "")
	if n := next(); n != 1 {
		t.Fatalf("the success inserted %d rows, want 1", n)
	}
	rows = f.outbox(rule)
	end := rows[2]
	a = end.Payload.Alert
	if end.Key != start.Key+":end" || a.EndedAt == nil || !a.EndedAt.Equal(t0.Add(2*time.Minute)) || !a.StartedAt.Equal(t0) ||
		a.Value != "ok" || !strings.HasPrefix(a.Previous, "timeout") || !end.EventAt.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("end row %s %+v", end.Key, a)
	}
	if n := next(); n != 0 {
		t.Fatalf("nothing changed, %d rows", n)
	}
	// The stale app's last success was 30 min before t0: 2 intervals (2 h) later it fails.
	if n := f.runAfter(time.Hour + 31*time.Minute); n != 1 {
		t.Fatalf("no success for 2 intervals inserted %d rows, want 1", n)
	}
	rows = f.outbox(rule)
	if want := "crawl_failing:com.example.stale:us:en:stats:" + unixKey(t0.Add(90*time.Minute)); rows[3].Key != want {
		t.Errorf("stale key %s, want %s", rows[3].Key, want)
	}
}

// new_version: the rating before and after, once per change after the rule.
func TestNotifyNewVersion(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.release", false, t0.Add(-3*time.Hour))
	rule := f.rule("new_version", `{}`, "0", nil, t0.Add(-2*time.Hour))
	f.stats(app, t0.Add(-time.Hour), 4.3, "1.0")
	if n := f.runOnce(); n != 0 {
		t.Fatalf("no version change, %d rows", n)
	}
	f.stats(app, t0.Add(-time.Minute), 4.1, "2.0")
	if n := f.runAfter(11 * time.Second); n != 1 {
		t.Fatalf("a new version inserted %d rows, want 1", n)
	}
	r := f.outbox(rule)[0]
	a := r.Payload.Alert
	if r.Key != "new_version:com.example.release:us:en:2.0:"+unixKey(t0.Add(-time.Minute)) || a.Value != "4.10" || a.Previous != "4.30" ||
		a.Summary != "com.example.release: version 1.0 → 2.0 (rating 4.30 → 4.10)" {
		t.Errorf("row %s %+v", r.Key, a)
	}
	f.stats(app, t0.Add(time.Minute), 4.2, "2.0")
	if n := f.runAfter(11 * time.Second); n != 0 {
		t.Fatalf("the same version again inserted %d rows", n)
	}
}

// Run decides until its context ends; a rule whose filter cannot be read
// is skipped, the others still fire.
func TestNotifyDeciderRunSkipsABadRule(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.run", false, t0.Add(-time.Hour))
	f.rule("review", `{"max_stars": "two"}`, "0", nil, t0.Add(-time.Minute))
	good := f.rule("review", `{"max_stars": 2}`, "0", nil, t0.Add(-time.Minute))
	f.review(app, notifyTestReview{id: "r1", stars: 1, text: "Crashes", at: t0.Add(-10 * time.Second), firstSeen: t0})
	f.d.cfg.Clock = newFakeClock(true) // its waits pass at once
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.d.Run(ctx) }()
	waitFor(t, 10*time.Second, "the good rule's row", func() bool {
		return count(t, f.pool, `SELECT count(*) FROM notifications WHERE rule_id = $1`, good) == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notifications`); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	if v := metricValue(t, f.reg, "playwatch_notify_decide_errors_total", nil); v != 0 {
		t.Errorf("%v failed passes", v)
	}
}
