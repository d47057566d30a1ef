package main

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// storedTopics is each review's topics by review_id; a NULL is nil.
func storedTopics(t testing.TB, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	var id string
	var topics []string
	eachRow(t, pool, []any{&id, &topics}, func() { out[id] = topics }, `SELECT review_id, topics FROM reviews`)
	return out
}

// The scoring pass writes topics in the same UPDATE as the label: the
// classifier's topics, '{}' for a review without one, never NULL.
func TestSentimentJobWritesTopicsWithTheLabel(t *testing.T) {
	t.Parallel()
	pool, j, _ := newSentimentJobFixture(t, "t", 40, 1000)
	ctx := context.Background()
	scoreAll(t, j)
	c := newTopicClassifier()
	rows, err := pool.Query(ctx, `SELECT coalesce(content, ''), topics, sentiment IS NOT NULL FROM reviews`)
	if err != nil {
		t.Fatal(err)
	}
	var text string
	var topics []string
	var scored bool
	kinds := map[string]int{}
	if _, err := pgx.ForEachRow(rows, []any{&text, &topics, &scored}, func() error {
		want := c.Classify(text)
		if topics == nil || !slices.Equal(topics, want) || !scored {
			t.Errorf("review %q: topics %#v (scored %v), want %#v", text, topics, scored, want)
		}
		kinds[strings.Join(topics, ",")]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The fixture's texts: a Persian update-and-slow one, an English
	// crash-and-update one, digits and none.
	if kinds["performance,update"] != 10 || kinds["crash,update"] != 10 || kinds[""] != 20 {
		t.Errorf("topics written %v, want 10 performance,update, 10 crash,update, 20 none", kinds)
	}
}

// Reviews labelled before topics existed get them from the running job,
// in batches, with their label, model and sentiment_at untouched (no
// rescoring); the backfill is logged and counted, and new reviews are
// still scored (topics included) while it runs.
func TestSentimentJobBackfillsTopicsWithoutRescoring(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	insertSentimentReviews(t, pool, "b", 2500)
	model, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	first := newSentimentJob(pool, model, sentimentJobConfig{Interval: 20 * time.Millisecond, Batch: 1000}, prometheus.NewRegistry(), testLogger(t))
	scoreAll(t, first)
	// As a database migrated to 13 holds them: labelled, topics NULL.
	mustExec(t, pool, `UPDATE reviews SET topics = NULL, sentiment_model = 'lr1-before'`)
	before := sentimentAt(t, pool)
	insertSentimentReviews(t, pool, "new", 5) // not labelled yet

	var logs syncBuffer
	reg := prometheus.NewRegistry()
	j := newSentimentJob(pool, model, sentimentJobConfig{Interval: 20 * time.Millisecond, Batch: 1000}, reg,
		slog.New(slog.NewTextHandler(&logs, nil)))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = j.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for count(t, pool, `SELECT count(*) FROM reviews WHERE topics IS NULL`) > 0 || !strings.Contains(logs.String(), "topics backfill finished") {
		if time.Now().After(deadline) {
			stop()
			<-done
			t.Fatalf("topics still NULL on %d reviews; logs:\n%s", count(t, pool, `SELECT count(*) FROM reviews WHERE topics IS NULL`), logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done

	after := sentimentAt(t, pool)
	for id, at := range before {
		if !after[id].Equal(at) {
			t.Errorf("review %s: sentiment_at %v, was %v: rescored", id, after[id], at)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE review_id LIKE 'b%' AND sentiment_model <> 'lr1-before'`); n != 0 {
		t.Errorf("%d old reviews got a new sentiment_model: rescored", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE review_id LIKE 'new%' AND sentiment IS NOT NULL AND topics IS NOT NULL`); n != 5 {
		t.Errorf("%d of the 5 new reviews labelled with topics", n)
	}
	c := newTopicClassifier()
	for id, topics := range storedTopics(t, pool) {
		if topics == nil {
			t.Errorf("review %s: topics NULL", id)
		}
	}
	var text string
	var topics []string
	if err := pool.QueryRow(ctx, `SELECT content, topics FROM reviews WHERE review_id = 'b1'`).Scan(&text, &topics); err != nil {
		t.Fatal(err)
	}
	if want := c.Classify(text); !slices.Equal(topics, want) || len(want) == 0 {
		t.Errorf("b1 %q: topics %v, want %v", text, topics, want)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_topics_backfilled_total", nil); got != 2500 {
		t.Errorf("topics_backfilled_total = %v, want 2500", got)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_topics_backlog_reviews", nil); got != 0 {
		t.Errorf("topics_backlog_reviews = %v, want 0", got)
	}
	if got := scoredTotal(t, reg); got != 5 {
		t.Errorf("scored_total = %v, want 5: only the new reviews are scored", got)
	}
	l := logs.String()
	if !strings.Contains(l, "topics backfill started") || !strings.Contains(l, "reviews=2500") {
		t.Errorf("no start of the backfill with its 2500 reviews in the logs:\n%s", l)
	}
	if !strings.Contains(l, "topics backfill finished") {
		t.Errorf("no end of the backfill in the logs:\n%s", l)
	}
}

// The backfill's work list is found through its partial index.
func TestTopicsBackfillUsesItsIndex(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	insertSentimentReviews(t, pool, "i", 20000)
	mustExec(t, pool, `UPDATE reviews SET sentiment = 'NEUTRAL', topics = '{}' WHERE id % 1000 <> 0`)
	mustExec(t, pool, `UPDATE reviews SET sentiment = 'NEUTRAL' WHERE id % 1000 = 0`)
	mustExec(t, pool, `ANALYZE reviews`)
	planUsesIndex(t, pool, "reviews_topics_todo_idx", topicsClaimSQL, 2000, 0)
}
