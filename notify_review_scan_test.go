package main

import (
	"context"
	"slices"
	"testing"
	"time"
)

// An app whose listing was never stored (no app_stats row) still has a
// first crawl, its first stored review: what came after it notifies, its
// history does not, even with a backfill.
func TestNotifyReviewsOfAnAppWithoutStats(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.nostats", false, time.Time{})
	f.review(app, notifyTestReview{id: "hist", stars: 1, text: "old and bad", at: t0.Add(-3 * time.Hour), firstSeen: t0.Add(-2 * time.Hour)})
	rule := f.rule("review", `{"max_stars": 2}`, "24h", nil, t0.Add(-10*time.Minute))
	f.review(app, notifyTestReview{id: "new", stars: 1, text: "Crashes at start", at: t0.Add(-time.Minute), firstSeen: t0})
	f.runOnce()
	if got := f.reviewIDs(rule); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("rule got %v, want [new] (never the first crawl's hist)", got)
	}
}

// Editing a rule reads again only the reviews since the edit less its
// backfill: a destination added to a months-old rule gets the last day,
// not months of reviews.
func TestNotifyRuleEditRescansFromTheEdit(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	ctx := context.Background()
	app := f.app("com.example.shop", false, t0.Add(-90*24*time.Hour))
	rule := f.rule("review", `{"max_stars": 2}`, "24h", nil, t0.Add(-60*24*time.Hour))
	f.review(app, notifyTestReview{id: "old", stars: 1, text: "bad a month ago", at: t0.Add(-30 * 24 * time.Hour)})
	f.review(app, notifyTestReview{id: "recent", stars: 1, text: "bad this morning", at: t0.Add(-2 * time.Hour)})
	f.runOnce()
	if got := f.reviewIDs(rule); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"old", "recent"}) {
		t.Fatalf("new rule got %v, want old and recent", got)
	}
	// The edit: a second destination, and a new name (updated_at moves).
	f.clk.Advance(time.Minute)
	var dest2 int64
	if err := f.pool.QueryRow(ctx, `INSERT INTO notify_destinations (name, type, config) VALUES ('hook2', 'webhook', '{"url": "https://hooks.example/y"}') RETURNING id`).Scan(&dest2); err != nil {
		t.Fatal(err)
	}
	f.exec(`INSERT INTO notify_rule_destinations (rule_id, destination_id) VALUES ($1, $2)`, rule, dest2)
	f.exec(`UPDATE notify_rules SET name = 'renamed', updated_at = $2 WHERE id = $1`, rule, f.clk.Now())
	f.runOnce()
	var got []string
	var id string
	eachRow(t, f.pool, []any{&id}, func() { got = append(got, id) },
		`SELECT payload->'review'->>'review_id' FROM notifications WHERE rule_id = $1 AND destination_id = $2 ORDER BY id`, rule, dest2)
	if !slices.Equal(got, []string{"recent"}) {
		t.Fatalf("the added destination got %v, want [recent] (the day before the edit only)", got)
	}
	if n := len(f.reviewIDs(rule)); n != 2 {
		t.Fatalf("the first destination has %d rows, want the 2 it had", n)
	}
}

// A crawl failure that is over within PlaywatchAppNotCrawled's 10 min sends
// nothing, neither its start nor its end: Prometheus would not have fired.
func TestNotifyCrawlFailingShorterThanItsForSendsNothing(t *testing.T) {
	t.Parallel()
	f, t0 := newDecideFixture(t)
	app := f.app("com.example.blip", false, time.Time{})
	rule := f.rule("crawl_failing", `{}`, "0", nil, t0.Add(-time.Hour))
	outcome := func(at time.Time, o string) {
		f.crawlOutcome(app, testNotifyLocales.Default, "reviews", at, o, nil, "")
	}
	outcome(t0, "timeout")
	f.runOnce()
	f.clk.Advance(time.Minute)
	outcome(t0.Add(time.Minute), "timeout") // failing from here
	f.runOnce()
	f.clk.Advance(5 * time.Minute)
	outcome(t0.Add(6*time.Minute), "ok")
	f.runOnce()
	f.runAfter(20 * time.Minute)
	if rows := f.outbox(rule); len(rows) != 0 {
		t.Fatalf("a failure of 5 min decided %d messages, want none: %+v", len(rows), rows)
	}
}
