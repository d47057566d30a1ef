package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// appIn registers pkg (no first crawl yet) with its storefronts
// (app_storefronts, in order) as the registry API does.
func (f *decideFixture) appIn(pkg string, locs ...locale) int64 {
	f.t.Helper()
	app := f.app(pkg, false, time.Time{})
	for i, l := range locs {
		f.exec(`INSERT INTO app_storefronts (application_id, position, country, lang) VALUES ($1, $2, $3, $4)`, app, i, l.Country, l.Lang)
	}
	return app
}

// ruleIn creates a rule of event whose filter names storefront loc alone.
func (f *decideFixture) ruleIn(event string, loc locale, created time.Time) int64 {
	f.t.Helper()
	return f.rule(event, fmt.Sprintf(`{"storefronts": [{"country": %q, "lang": %q}]}`, loc.Country, loc.Lang), "0", nil, created)
}

// rulesUSAndIR creates a rule of event for us/en alone, then one for ir/fa
// alone: what a per-storefront test tells apart.
func (f *decideFixture) rulesUSAndIR(event string, created time.Time) (us, ir int64) {
	f.t.Helper()
	return f.ruleIn(event, sfUS, created), f.ruleIn(event, sfIR, created)
}

// statsIn is an app_stats row of storefront loc.
func (f *decideFixture) statsIn(app int64, loc locale, at time.Time, score float64, version string) {
	f.t.Helper()
	f.exec(`INSERT INTO app_stats (application_id, country, lang, score, version, crawled_at) VALUES ($1, $2, $3, $4, $5, $6)`,
		app, loc.Country, loc.Lang, score, version, at)
}

// seenIn records that review reviewID was stored from storefront loc at
// at, as the storage consumer does.
func (f *decideFixture) seenIn(reviewID string, loc locale, at time.Time) {
	f.t.Helper()
	f.exec(`INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		SELECT id, application_id, $2, $3, $4 FROM reviews WHERE review_id = $1`, reviewID, loc.Country, loc.Lang, at)
}

var (
	sfUS = locale{Country: "us", Lang: "en"}
	sfIR = locale{Country: "ir", Lang: "fa"}
	sfDE = locale{Country: "de", Lang: "de"}
)

// A review rule naming us/en fires for the app's us/en reviews only; a rule
// naming none fires for every storefront's, and the message names the
// storefront the review was seen in. A review seen in a second storefront
// later is news to a rule of that storefront only, once per rule; a
// storefront's first crawl (its whole history) is not news.
func TestNotifyReviewStorefronts(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.appIn("org.telegram.messenger", sfUS, sfIR)
	f.statsIn(app, sfUS, t0.Add(-25*time.Hour), 4.5, "1.0")
	f.statsIn(app, sfIR, t0.Add(-25*time.Hour), 4.1, "1.0")
	us, ir := f.rulesUSAndIR("review", t0.Add(-time.Hour))
	all := f.rule("review", `{}`, "0", nil, t0.Add(-time.Hour))
	f.runOnce() // the rules' backfill scans: nothing yet

	f.clk.Advance(time.Minute)
	f.review(app, notifyTestReview{id: "r-us", stars: 1, text: "crashes on start", at: t0.Add(-10 * time.Minute), firstSeen: f.clk.Now()})
	f.seenIn("r-us", sfUS, f.clk.Now())
	f.review(app, notifyTestReview{id: "r-ir", stars: 1, text: "وصل نمی‌شود", at: t0.Add(-9 * time.Minute), firstSeen: f.clk.Now()})
	f.seenIn("r-ir", sfIR, f.clk.Now())
	f.clk.Advance(time.Minute)
	// past the sentiment wait: no rule waits for a label, but be safe
	if n := f.runAfter(3 * time.Minute); n != 4 {
		t.Fatalf("inserted %d rows, want 4 (us: r-us, ir: r-ir, all: both)", n)
	}
	if got := f.reviewIDs(us); !slices.Equal(got, []string{"r-us"}) {
		t.Errorf("the us/en rule fired for %v, want only r-us (never the ir/fa review)", got)
	}
	if got := f.reviewIDs(ir); !slices.Equal(got, []string{"r-ir"}) {
		t.Errorf("the ir/fa rule fired for %v, want only r-ir", got)
	}
	rows := f.outbox(all)
	if len(rows) != 2 {
		t.Fatalf("the rule of every storefront has %d rows, want 2", len(rows))
	}
	for _, r := range rows {
		want := sfUS
		if r.Payload.Review.ReviewID == "r-ir" {
			want = sfIR
		}
		if r.Payload.App.Country != want.Country || r.Payload.App.Lang != want.Lang || !strings.HasSuffix(r.Payload.Review.URL, "&hl="+want.Lang) {
			t.Errorf("%s: message names %s/%s (%s), want %s/%s", r.Payload.Review.ReviewID, r.Payload.App.Country, r.Payload.App.Lang, r.Payload.Review.URL, want.Country, want.Lang)
		}
	}
	for _, r := range rows {
		want := "(" + r.Payload.App.Country + "/" + r.Payload.App.Lang + ")"
		if title := buildNotifyMessage(r.Payload).Title; !strings.Contains(title, want) {
			t.Errorf("message title %q does not name the storefront %s", title, want)
		}
	}

	// r-us is seen in the Iranian storefront too: news to the ir rule (once),
	// not again to the us rule or the rule of every storefront.
	f.clk.Advance(time.Minute)
	f.seenIn("r-us", sfIR, f.clk.Now())
	if n := f.runAfter(time.Minute); n != 1 {
		t.Fatalf("a review seen in a second storefront inserted %d rows, want 1 (the ir rule)", n)
	}
	if got := f.reviewIDs(ir); !slices.Equal(got, []string{"r-ir", "r-us"}) {
		t.Errorf("the ir/fa rule has %v", got)
	}
	if r := f.outbox(ir)[1]; r.Payload.App.Country != "ir" {
		t.Errorf("r-us seen in ir: message names %s/%s", r.Payload.App.Country, r.Payload.App.Lang)
	}

	// A storefront added later: its first crawl brings old reviews, which
	// are not news; a review written after it is.
	f.exec(`INSERT INTO app_storefronts (application_id, position, country, lang) VALUES ($1, 2, 'de', 'de')`, app)
	f.clk.Advance(time.Minute)
	first := f.clk.Now()
	f.statsIn(app, sfDE, first, 4.3, "1.0")
	f.review(app, notifyTestReview{id: "r-de-old", stars: 1, text: "stürzt ab", at: t0.Add(-5 * time.Minute), firstSeen: first})
	f.seenIn("r-de-old", sfDE, first)
	if n := f.runAfter(time.Minute); n != 0 {
		t.Fatalf("a new storefront's first crawl inserted %d rows, want none (its history is not news)", n)
	}
	f.clk.Advance(time.Minute)
	f.review(app, notifyTestReview{id: "r-de", stars: 2, text: "langsam", at: f.clk.Now().Add(-30 * time.Second), firstSeen: f.clk.Now()})
	f.seenIn("r-de", sfDE, f.clk.Now())
	if n := f.runAfter(time.Minute); n != 1 {
		t.Fatalf("a new review of the new storefront inserted %d rows, want 1 (the rule of every storefront)", n)
	}
	if got := f.reviewIDs(all); !slices.Contains(got, "r-de") || slices.Contains(got, "r-de-old") {
		t.Errorf("the rule of every storefront has %v", got)
	}
}

// A review stored without a storefront (an older playwatch) is in its app's
// first storefront.
func TestNotifyReviewWithoutStorefrontIsInTheFirst(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.appIn("com.example.old", sfIR, sfUS)
	f.statsIn(app, sfIR, t0.Add(-25*time.Hour), 4.5, "1.0")
	us, ir := f.rulesUSAndIR("review", t0.Add(-time.Hour))
	f.runOnce()
	f.clk.Advance(time.Minute)
	f.review(app, notifyTestReview{id: "r-old", stars: 1, text: "bad", at: t0.Add(-10 * time.Minute), firstSeen: f.clk.Now()})
	if n := f.runAfter(time.Minute); n != 1 {
		t.Fatalf("inserted %d rows, want 1", n)
	}
	if len(f.outbox(us)) != 0 || len(f.outbox(ir)) != 1 {
		t.Errorf("us %d rows, ir %d rows; want the review in the first storefront, ir/fa", len(f.outbox(us)), len(f.outbox(ir)))
	}
}

// A rating drop in one storefront fires for that storefront only; two
// storefronts are never compared with each other.
func TestNotifyRatingDropPerStorefront(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.appIn("org.telegram.messenger", sfUS, sfIR)
	// us rated far below ir: compared across storefronts, every ir crawl
	// after a us one would look like a rise and every us one like a drop.
	f.statsIn(app, sfUS, t0.Add(-25*time.Hour), 3.9, "1.0")
	f.statsIn(app, sfIR, t0.Add(-25*time.Hour+time.Second), 4.6, "1.0")
	all := f.rule("rating_drop", `{}`, "0", nil, t0.Add(-time.Hour))
	us, ir := f.rulesUSAndIR("rating_drop", t0.Add(-time.Hour))
	f.statsIn(app, sfIR, t0.Add(-10*time.Minute), 4.4, "1.0") // ir: 4.6 → 4.4
	f.statsIn(app, sfUS, t0.Add(-9*time.Minute), 3.95, "1.0") // us: 3.9 → 3.95, newest of the app
	if n := f.runAfter(6 * time.Minute); n != 2 {
		t.Fatalf("inserted %d rows, want 2 (the ir drop, for the rule of every storefront and the ir rule)", n)
	}
	if rows := f.outbox(us); len(rows) != 0 {
		t.Errorf("the us/en rule fired: %+v", rows)
	}
	want := "rating_drop:org.telegram.messenger:ir:fa:" + unixKey(t0.Add(-10*time.Minute))
	for _, rule := range []int64{all, ir} {
		rows := f.outbox(rule)
		if len(rows) != 1 || rows[0].Key != want || rows[0].Payload.App.Country != "ir" || rows[0].Payload.Alert.Value != "4.40" || rows[0].Payload.Alert.Previous != "4.60" {
			t.Errorf("rule %d: rows %+v, want one %s from 4.60 to 4.40", rule, rows, want)
		}
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_alert_state WHERE rule_id = $1 AND country = 'ir' AND lang = 'fa'`, all); n != 1 {
		t.Errorf("%d ir/fa alert states of the rule of every storefront, want 1", n)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_alert_state WHERE country = 'us'`); n != 0 {
		t.Errorf("%d us alert states, want none", n)
	}
}

// crawl_failing is per storefront: the store answering 404 in one
// storefront fires for that one only.
func TestNotifyCrawlFailingPerStorefront(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.appIn("com.example.local", sfUS, sfIR)
	all := f.rule("crawl_failing", `{}`, "0", nil, t0.Add(-time.Hour))
	us, ir := f.rulesUSAndIR("crawl_failing", t0.Add(-time.Hour))
	outcome := func(loc locale, o string, status any) {
		f.crawlOutcome(app, loc, "stats", t0.Add(-time.Minute), o, status, "")
	}
	outcome(sfUS, "ok", nil)
	outcome(sfIR, "not_found", 404)
	if n := f.runOnce(); n != 2 {
		t.Fatalf("inserted %d rows, want 2 (ir not found: the rule of every storefront and the ir rule)", n)
	}
	if len(f.outbox(us)) != 0 {
		t.Errorf("the us/en rule fired for the ir storefront")
	}
	want := "crawl_failing:com.example.local:ir:fa:stats:" + unixKey(t0.Add(-time.Minute))
	for _, rule := range []int64{all, ir} {
		if rows := f.outbox(rule); len(rows) != 1 || rows[0].Key != want || rows[0].Payload.App.Country != "ir" {
			t.Errorf("rule %d: rows %+v, want %s", rule, rows, want)
		}
	}
}

// negative_spike counts per storefront: five negative reviews in ir/fa are
// a spike there, not in us/en.
func TestNotifyNegativeSpikePerStorefront(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.appIn("com.example.spiky", sfUS, sfIR)
	f.statsIn(app, sfUS, t0.Add(-8*24*time.Hour), 4.5, "1.0")
	all := f.rule("negative_spike", `{}`, "0", nil, t0.Add(-2*time.Hour))
	us := f.ruleIn("negative_spike", sfUS, t0.Add(-2*time.Hour))
	for i := range 5 {
		id := fmt.Sprintf("neg-%d", i)
		f.review(app, notifyTestReview{id: id, stars: 1, text: "bad", at: t0.Add(-time.Duration(50-i) * time.Minute)})
		f.score(id, "NEGATIVE", "fa", t0.Add(-time.Minute))
		f.seenIn(id, sfIR, t0.Add(-time.Duration(49-i)*time.Minute))
	}
	// Three in us/en: eight in the app, three in that storefront.
	for i := range 3 {
		id := fmt.Sprintf("neg-us-%d", i)
		f.review(app, notifyTestReview{id: id, stars: 1, text: "bad", at: t0.Add(-time.Duration(40-i) * time.Minute)})
		f.score(id, "NEGATIVE", "en", t0.Add(-time.Minute))
		f.seenIn(id, sfUS, t0.Add(-time.Duration(39-i)*time.Minute))
	}
	if n := f.runOnce(); n != 1 {
		t.Fatalf("inserted %d rows, want 1 (the ir spike, for the rule of every storefront)", n)
	}
	if len(f.outbox(us)) != 0 {
		t.Errorf("the us/en rule fired with 3 negative reviews in us/en")
	}
	if rows := f.outbox(all); len(rows) != 1 || rows[0].Payload.App.Country != "ir" || rows[0].Payload.Alert.Value != "5" {
		t.Errorf("rows %+v, want the ir/fa spike of 5", rows)
	}
}

// The rules API takes filter.storefronts for every event, checks its codes
// as the registry does (400 naming the field) and gives it back.
func TestNotifyRuleStorefrontsAPI(t *testing.T) {
	t.Parallel()
	f := newNotifyFixture(t, nil)
	d := f.createDestination(t, `{"name": "a", "type": "webhook", "url": "https://example.com/a"}`)
	ok := fmt.Sprintf(`"name": "r", "destinations": [%d]`, d)
	for _, c := range []struct{ filter, field string }{
		{`{"storefronts": [{"country": "US", "lang": "en"}]}`, "filter.storefronts[0].country"},
		{`{"storefronts": [{"country": "usa", "lang": "en"}]}`, "filter.storefronts[0].country"},
		{`{"storefronts": [{"country": "us", "lang": "en"}, {"country": "ir", "lang": "farsi"}]}`, "filter.storefronts[1].lang"},
		{`{"storefronts": [{"country": "ir", "lang": "pt-br"}]}`, "filter.storefronts[0].lang"},
		{`{"storefronts": [{"country": "ir"}]}`, "filter.storefronts[0].lang"},
		{`{"storefronts": [{"country": "ir", "lang": "fa", "city": "x"}]}`, "filter.storefronts[0].city"},
		{`{"storefronts": ["us"]}`, "filter.storefronts[0]"},
		{`{"storefronts": {"country": "us"}}`, "filter.storefronts"},
	} {
		body := `{` + ok + `, "event": "rating_drop", "filter": ` + c.filter + `}`
		if r := f.call(t, "POST", "/api/v1/rules", body); r.code != 400 || !strings.Contains(r.body, c.field) {
			t.Errorf("POST %s: %d %s, want 400 naming %s", body, r.code, r.body, c.field)
		}
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_rules`); n != 0 {
		t.Errorf("%d rules stored from bad bodies", n)
	}
	for _, event := range notifyEvents {
		body := `{` + ok + `, "event": "` + event + `", "filter": {"storefronts": [{"country": "ir", "lang": "fa"}, {"country": "br", "lang": "pt-BR"}, {"country": "ir", "lang": "fa"}]}}`
		r := f.call(t, "POST", "/api/v1/rules", body)
		if r.code != 201 || !strings.Contains(r.body, `"storefronts":[{"lang":"fa","country":"ir"},{"lang":"pt-BR","country":"br"}]`) {
			t.Errorf("POST %s: %d %s, want 201 with both storefronts once", body, r.code, r.body)
		}
	}
	var stored []byte
	if err := f.pool.QueryRow(context.Background(), `SELECT filter->'storefronts' FROM notify_rules WHERE event = 'crawl_failing'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(stored), `"country": "br"`) {
		t.Errorf("stored storefronts %s", stored)
	}
	// An empty list is every storefront, as no list.
	if r := f.call(t, "POST", "/api/v1/rules", `{`+ok+`, "event": "review", "filter": {"storefronts": []}}`); r.code != 201 || strings.Contains(r.body, "storefronts") {
		t.Errorf("empty storefronts: %d %s", r.code, r.body)
	}
}

// Negative reviews stored without a storefront (an older playwatch) count
// with those seen in the app's first storefront.
func TestNotifyNegativeSpikeWithoutStorefronts(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.appIn("com.example.mixed", sfIR, sfUS)
	f.statsIn(app, sfIR, t0.Add(-8*24*time.Hour), 4.5, "1.0")
	rule := f.ruleIn("negative_spike", sfIR, t0.Add(-2*time.Hour))
	for i := range 5 {
		id := fmt.Sprintf("neg-%d", i)
		f.review(app, notifyTestReview{id: id, stars: 1, text: "bad", at: t0.Add(-time.Duration(50-i) * time.Minute)})
		f.score(id, "NEGATIVE", "fa", t0.Add(-time.Minute))
		if i%2 == 0 {
			f.seenIn(id, sfIR, t0.Add(-time.Duration(49-i)*time.Minute))
		}
	}
	if n := f.runOnce(); n != 1 {
		t.Fatalf("inserted %d rows, want 1 (3 seen in ir/fa and 2 without a storefront: 5 in the first storefront)", n)
	}
	if rows := f.outbox(rule); len(rows) != 1 || rows[0].Payload.Alert.Value != "5" || rows[0].Payload.App.Country != "ir" {
		t.Errorf("rows %+v", rows)
	}
}
