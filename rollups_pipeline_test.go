package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Reviews and listings through the real pipeline (kfake, the storage
// consumer, the sentiment job, dlq replay) keep every rollup equal to the
// same count of the raw tables: redeliveries, a review seen in two
// storefronts, a batch narrowed around a row PostgreSQL refuses (its
// rolled-back parts count nothing), the refused row replayed later, an edit
// that moves a review to another hour with new stars and a new label. The
// rollup check and rebuild commands agree.
func TestRollupsMatchThePipeline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := newTestDatabase(t)
	pool := newTestPoolFor(t, dsn)
	brokers := newConsumerTestBroker(t)
	const a, b = "org.telegram.messenger", "com.example.other"
	registerApps(t, pool, a, b)
	// A rule validation does not know: the consumer narrows the batch.
	mustExec(t, pool, `ALTER TABLE reviews ADD CONSTRAINT no_forbidden_words CHECK (content NOT LIKE '%forbidden%')`)

	texts := []string{"the app crashes after the update", "too many ads, annoying", "cannot login since yesterday",
		"great app, works well", "payment failed twice", "ok"}
	review := func(pkg string, i int) map[string]any {
		return with(reviewFields(pkg, fmt.Sprintf("%s-%d", pkg, i), testCrawl), "country", "us", "lang", "en", "score", 1+i%5,
			"content", texts[i%len(texts)], "app_version", fmt.Sprintf("1.%d", i%3),
			"at", testCrawl.Add(-time.Duration(i)*47*time.Minute).Format(time.RFC3339))
	}
	var recs []*kgo.Record
	for i := range 30 {
		f := review(a, i)
		if i == 17 {
			f = with(f, "content", "a forbidden word")
		}
		recs = append(recs, rec(topicReviews, a, msgJSON(f)))
		if i < 10 { // the same review read in a second storefront
			recs = append(recs, rec(topicReviews, a, msgJSON(with(f, "country", "gb"))))
		}
	}
	for i := range 8 { // an older playwatch's messages: the app's first storefront
		recs = append(recs, rec(topicReviews, b, msgJSON(with(review(b, i), "country", deleteField, "lang", deleteField))))
	}
	for _, c := range []string{"us", "gb"} {
		for h := range 3 {
			recs = append(recs, rec(topicAppStats, a, msgJSON(with(statFields(a, testCrawl.Add(time.Duration(h)*time.Hour)),
				"country", c, "lang", "en", "score", 4.0+float64(h)/10))))
		}
	}
	// kgo keeps a produced record's context: a redelivery is new records.
	again := func(rs []*kgo.Record) []*kgo.Record {
		var out []*kgo.Record
		for _, r := range rs {
			out = append(out, rec(r.Topic, string(r.Key), r.Value))
		}
		return out
	}
	produce(t, brokers, again(recs)...)
	produce(t, brokers, again(recs[:20])...) // redelivered
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	stored := func(what string) {
		t.Helper()
		end := endOffsets(t, brokers, topicReviews, topicAppStats)
		waitFor(t, 30*time.Second, what, func() bool {
			return int64(count(t, pool, `SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE topic IN ('reviews', 'app-stats')`)) == end
		})
	}
	stored("the first records stored")
	if n := count(t, pool, `SELECT count(*) FROM reviews`); n != 37 {
		t.Fatalf("%d reviews stored, want 37 (one refused)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	job, _ := newTestSentimentJob(t, pool, 7)
	scoreAll(t, job)
	rollupsMustMatch(t, ctx, pool, "stored and labelled")

	// The refused review replayed; an edit (a later crawl: a new hour, new
	// stars and text, so a new label); a review seen in a third storefront;
	// everything redelivered once more.
	mustExec(t, pool, `ALTER TABLE reviews DROP CONSTRAINT no_forbidden_words`)
	if out, err := runCLI(t, dsn, "dlq", "replay", "--all"); err != nil || !strings.HasPrefix(out, "stored 1,") {
		t.Fatalf("dlq replay: %v\n%s", err, out)
	}
	edited := with(review(a, 3), "crawled_at", testCrawl.Add(time.Hour).Format(time.RFC3339Nano), "score", 5,
		"content", "great now, works well", "at", testCrawl.Add(30*time.Minute).Format(time.RFC3339))
	produce(t, brokers, again(recs)...)
	produce(t, brokers, rec(topicReviews, a, msgJSON(edited)), rec(topicReviews, a, msgJSON(with(edited, "country", "de", "lang", "de"))),
		rec(topicReviews, a, msgJSON(with(review(a, 20), "country", "de", "lang", "de"))))
	stored("the second records stored")
	scoreAll(t, job)
	rollupsMustMatch(t, ctx, pool, "edited, replayed and redelivered")

	// Beyond the check's own aggregate: the rollups' sums are the rows.
	sums := func(where string) int {
		return count(t, pool, `SELECT coalesce(sum(reviews), 0) FROM review_rollup_totals WHERE `+where)
	}
	if got, want := sums(`country = ''`), count(t, pool, `SELECT count(*) FROM reviews`); got != want || want != 38 {
		t.Errorf("app-wide totals sum to %d, want %d reviews (38)", got, want)
	}
	if got, want := sums(`country <> ''`), count(t, pool, `SELECT count(*) FROM review_storefronts`); got != want || want != 38+10+2 {
		t.Errorf("storefront totals sum to %d, want %d review storefronts (50)", got, want)
	}
	if n := count(t, pool, `SELECT coalesce(sum(reviews), 0) FROM review_rollup_hourly h JOIN apps_registry_application p ON p.id = h.application_id
		WHERE p.package_name = $1 AND lang = 'de' AND hour = $2 AND score = 5 AND app_version = '1.0'`, a, testCrawl); n != 1 {
		t.Errorf("the edited review in de at 12:00 with 5 stars: %d, want 1", n)
	}
	if n := count(t, pool, `SELECT coalesce(sum(reviews), 0) FROM review_rollup_hourly h JOIN apps_registry_application p ON p.id = h.application_id
		WHERE p.package_name = $1 AND score = 4 AND app_version = '1.0'
		AND hour = date_trunc('hour', $2::timestamptz - interval '141 minutes', 'UTC')`, a, testCrawl); n != 0 {
		t.Errorf("the edited review's old bucket still counts %d", n)
	}
	if n := count(t, pool, `SELECT coalesce(sum(listings), 0) FROM app_stats_rollup_daily`); n != 6 {
		t.Errorf("%d listings in the daily rollup, want 6", n)
	}

	tc.stop()
	if out, err := runCLI(t, dsn, "rollup", "check"); err != nil || !strings.Contains(out, "the rollups match") {
		t.Fatalf("rollup check: %v\n%s", err, out)
	}
	mustExec(t, pool, `UPDATE review_topic_rollup_hourly SET reviews = reviews + 1 WHERE country = 'gb'`)
	mustExec(t, pool, `DELETE FROM review_rollup_hourly WHERE country = 'de'`)
	out, err := runCLI(t, dsn, "rollup", "check")
	if err == nil || !strings.Contains(out, "review_topic_rollup_hourly") || !strings.Contains(out, "review_rollup_hourly") {
		t.Fatalf("rollup check of damaged rollups: %v\n%s", err, out)
	}
	if out, err := runCLI(t, dsn, "rollup", "rebuild"); err != nil || !strings.HasPrefix(out, "rebuilt the rollups of 2 apps") {
		t.Fatalf("rollup rebuild: %v\n%s", err, out)
	}
	rollupsMustMatch(t, ctx, pool, "rebuilt")
}

// The consumer, two sentiment jobs and rollup rebuilds at the same time,
// on the same apps and hours: no count is lost or doubled (a deadlock
// between them, which PostgreSQL breaks, is retried by its writer).
func TestRollupsUnderConcurrentWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTestPool(t)
	brokers := newConsumerTestBroker(t)
	pkgs := []string{"com.example.a", "com.example.b", "com.example.c", "com.example.d"}
	registerApps(t, pool, pkgs...)
	texts := []string{"the app crashes after the update", "too many ads", "great app", "cannot login", "ok"}
	var recs []*kgo.Record
	for i := range 2000 {
		pkg := pkgs[i%len(pkgs)]
		f := with(reviewFields(pkg, fmt.Sprintf("c%d", i), testCrawl), "country", []string{"us", "gb"}[i%2], "lang", "en",
			"score", 1+i%5, "content", texts[i%len(texts)], "at", testCrawl.Add(-time.Duration(i%7)*time.Hour).Format(time.RFC3339))
		recs = append(recs, rec(topicReviews, pkg, msgJSON(f)))
		if i%3 == 0 { // seen in the other storefront too, and edited there later
			recs = append(recs, rec(topicReviews, pkg, msgJSON(with(f, "country", "de", "lang", "de", "score", 5,
				"crawled_at", testCrawl.Add(time.Minute).Format(time.RFC3339Nano), "content", "works well now"))))
		}
	}
	produce(t, brokers, recs...)
	opts := testConsumerOptions()
	opts.MaxPollRecords = 100
	startTestConsumer(t, pool, brokers, opts, consumerHooks{})
	jctx, stop := context.WithCancel(ctx)
	defer stop()
	jobs := make(chan error, 3)
	for range 2 {
		job, _ := newTestSentimentJob(t, pool, 50)
		go func() { jobs <- job.Run(jctx) }()
	}
	go func() {
		for jctx.Err() == nil {
			if _, err := rebuildRollups(jctx, pool, "", nil); err != nil && jctx.Err() == nil {
				jobs <- err
				return
			}
		}
		jobs <- nil
	}()
	waitFor(t, 60*time.Second, "every review stored and labelled", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment IS NOT NULL AND content = 'works well now'`) == 667 &&
			count(t, pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo) == 0 && count(t, pool, `SELECT count(*) FROM reviews`) == 2000
	})
	stop()
	for range 3 {
		if err := <-jobs; err != nil {
			t.Fatal(err)
		}
	}
	rollupsMustMatch(t, ctx, pool, "after concurrent writers")
}
