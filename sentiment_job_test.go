package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// insertSentimentReviews stores n unscored reviews of app (registered if
// need be) with prefix in their review_id, as the consumer would: Persian,
// English, digits only or no text, 1 to 5 stars or none.
func insertSentimentReviews(t testing.TB, pool *pgxpool.Pool, prefix string, n int) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO apps_registry_application (package_name) VALUES ('com.example.sentiment') ON CONFLICT DO NOTHING`)
	mustExec(t, pool, `INSERT INTO reviews (application_id, review_id, score, content, at, last_synced_at, first_seen_at)
		SELECT (SELECT id FROM apps_registry_application WHERE package_name = 'com.example.sentiment'), $1 || i,
			CASE WHEN i % 7 = 0 THEN NULL ELSE i % 5 + 1 END,
			CASE i % 4 WHEN 0 THEN 'برنامه عالیه ولی بعد از آپدیت کند شده ' || i WHEN 1 THEN 'Crashes since the last update, please fix ' || i
				WHEN 2 THEN i::text END,
			now() - interval '1 day', now() - interval '2 hours', now() - interval '1 hour'
		FROM generate_series(1, $2::int) AS i`, prefix, n)
}

func newTestSentimentJob(t testing.TB, pool *pgxpool.Pool, batch int) (*sentimentJob, *prometheus.Registry) {
	t.Helper()
	model, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	return newSentimentJob(pool, model, sentimentJobConfig{Interval: 20 * time.Millisecond, Batch: batch}, reg, testLogger(t)), reg
}

// newSentimentJobFixture is a migrated database with n reviews to score
// (insertSentimentReviews, prefix) and a job that scores batch at a time.
func newSentimentJobFixture(t testing.TB, prefix string, n, batch int) (*pgxpool.Pool, *sentimentJob, *prometheus.Registry) {
	t.Helper()
	pool := newTestPool(t)
	insertSentimentReviews(t, pool, prefix, n)
	j, reg := newTestSentimentJob(t, pool, batch)
	return pool, j, reg
}

// scoreAll runs batches until one finds no work and returns their sizes.
func scoreAll(t testing.TB, j *sentimentJob) []int {
	t.Helper()
	var sizes []int
	for {
		n, err := j.scoreBatch(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return sizes
		}
		sizes = append(sizes, n)
	}
}

// scoreBatches runs n batches and returns their sizes.
func scoreBatches(t testing.TB, j *sentimentJob, n int) []int {
	t.Helper()
	sizes := make([]int, n)
	for i := range sizes {
		k, err := j.scoreBatch(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		sizes[i] = k
	}
	return sizes
}

func scoredTotal(t testing.TB, reg *prometheus.Registry) float64 {
	t.Helper()
	var sum float64
	for _, label := range []string{"POSITIVE", "NEUTRAL", "NEGATIVE"} {
		for _, lang := range []string{"fa", "en", "other"} {
			sum += metricValue(t, reg, "playwatch_sentiment_scored_total", map[string]string{"label": label, "lang": lang})
		}
	}
	return sum
}

// sentimentAt is each review's sentiment_at, by review_id.
func sentimentAt(t testing.TB, pool *pgxpool.Pool) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	var id string
	var at time.Time
	eachRow(t, pool, []any{&id, &at}, func() { out[id] = at }, `SELECT review_id, sentiment_at FROM reviews WHERE sentiment_at IS NOT NULL`)
	return out
}

// Every unscored review gets the model's label, its version and the hash of
// what was classified; a batch is one UPDATE (one statement_timestamp for
// all its rows), and the metrics count what was written.
func TestSentimentJobScoresEachBatchWithOneUpdate(t *testing.T) {
	t.Parallel()
	pool, j, reg := newSentimentJobFixture(t, "r", 5000, 2000)
	ctx := context.Background()

	if sizes := scoreBatches(t, j, 1); sizes[0] != 2000 {
		t.Fatalf("first batch: %d, want 2000", sizes[0])
	}
	if err := j.refreshBacklog(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_backlog_reviews", nil); got != 3000 {
		t.Errorf("backlog after one batch of 2000 = %v, want 3000", got)
	}
	if sizes := scoreAll(t, j); len(sizes) != 2 || sizes[0] != 2000 || sizes[1] != 1000 {
		t.Errorf("later batches %v, want [2000 1000]", sizes)
	}
	if err := j.refreshBacklog(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_backlog_reviews", nil); got != 0 {
		t.Errorf("backlog at the end = %v, want 0", got)
	}

	rows, err := pool.Query(ctx, `SELECT coalesce(content, ''), coalesce(score, 0)::int, sentiment, sentiment_model,
		sentiment_text_hash = reviews_sentiment_input(score, content) FROM reviews`)
	if err != nil {
		t.Fatal(err)
	}
	var text, label, model string
	var stars int
	var hashOK bool
	want := map[[2]string]float64{}
	n := 0
	if _, err := pgx.ForEachRow(rows, []any{&text, &stars, &label, &model, &hashOK}, func() error {
		n++
		r := j.model.Classify(text, stars)
		want[[2]string{r.Label, r.Lang}]++
		if label != r.Label || model != j.version || !hashOK {
			t.Errorf("review %q (%d stars): %s by %s, hash matches %v; want %s by %s", text, stars, label, model, hashOK, r.Label, j.version)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 5000 {
		t.Errorf("%d scored reviews, want 5000", n)
	}
	var sizes []int
	rows, err = pool.Query(ctx, `SELECT count(*) FROM reviews GROUP BY sentiment_at ORDER BY min(id)`)
	if err != nil {
		t.Fatal(err)
	}
	if sizes, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 3 || sizes[0] != 2000 || sizes[1] != 2000 || sizes[2] != 1000 {
		t.Errorf("reviews per sentiment_at %v, want [2000 2000 1000]: one UPDATE statement per batch", sizes)
	}
	for k, w := range want {
		if got := metricValue(t, reg, "playwatch_sentiment_scored_total", map[string]string{"label": k[0], "lang": k[1]}); got != w {
			t.Errorf("scored_total{label=%s,lang=%s} = %v, want %v", k[0], k[1], got, w)
		}
	}
	if got := scoredTotal(t, reg); got != 5000 {
		t.Errorf("scored_total sums to %v, want 5000", got)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_batch_write_seconds", nil); got != 3 {
		t.Errorf("batch_write_seconds has %v samples, want 3", got)
	}
	// New reviews, stored an hour ago: every latency is about an hour.
	if got := metricValue(t, reg, "playwatch_sentiment_latency_seconds", nil); got != 5000 {
		t.Errorf("latency_seconds has %v samples, want 5000", got)
	}
	h := gatheredMetric(t, reg, "playwatch_sentiment_latency_seconds", nil).GetHistogram()
	if mean := h.GetSampleSum() / float64(h.GetSampleCount()); mean < 3600 || mean > 3600+600 {
		t.Errorf("mean latency %.0fs, want an hour: from first_seen_at", mean)
	}
}

// The work list is found through the partial index, not by reading every
// scored review.
func TestSentimentClaimUsesTheWorkIndex(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	insertSentimentReviews(t, pool, "s", 20000)
	mustExec(t, pool, `UPDATE reviews SET sentiment = 'NEUTRAL', sentiment_text_hash = reviews_sentiment_input(score, content) WHERE id % 1000 <> 0`)
	mustExec(t, pool, `ANALYZE reviews`)
	planUsesIndex(t, pool, "reviews_sentiment_todo_idx", sentimentClaimSQL, 2000, 0)
	planUsesIndex(t, pool, "reviews_sentiment_todo_idx", `SELECT count(*) FROM reviews WHERE `+sentimentTodo)
}

// planUsesIndex fails the test unless the plan of sql with args reads
// through index, without a sequential scan.
func planUsesIndex(t *testing.T, pool *pgxpool.Pool, index, sql string, args ...any) {
	t.Helper()
	rows, err := pool.Query(context.Background(), "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if plan := strings.Join(lines, "\n"); !strings.Contains(plan, index) || strings.Contains(plan, "Seq Scan") {
		t.Errorf("the plan of %s does not use %s:\n%s", sql, index, plan)
	}
}

// A re-sync with the same text and stars is not scored again; a changed
// text or changed stars are, and their latency runs from the new crawl.
func TestSentimentJobRescoresOnlyChangedReviews(t *testing.T) {
	t.Parallel()
	pool, j, reg := newSentimentJobFixture(t, "c", 12, 100)
	ctx := context.Background()
	scoreAll(t, j)
	before := sentimentAt(t, pool)
	latencies := metricValue(t, reg, "playwatch_sentiment_latency_seconds", nil)

	// The consumer's upsert (contract_reviews.go) with newer crawls: c1
	// the same, c2 with another text, c3 with other stars.
	upsert := `INSERT INTO reviews AS t (application_id, review_id, score, content, at, last_synced_at)
		SELECT application_id, review_id, $2, $3, at, now() FROM reviews WHERE review_id = $1
		ON CONFLICT (review_id) DO UPDATE SET score = EXCLUDED.score, content = EXCLUDED.content, last_synced_at = EXCLUDED.last_synced_at
		WHERE EXCLUDED.last_synced_at > t.last_synced_at`
	for _, u := range []struct {
		id       string
		newText  *string
		newScore *int
	}{{"c1", nil, nil}, {"c2", ptr("Works again after the fix, thanks"), nil}, {"c3", nil, ptr(1)}} {
		var score *int
		var content *string
		if err := pool.QueryRow(ctx, `SELECT score::int, content FROM reviews WHERE review_id = $1`, u.id).Scan(&score, &content); err != nil {
			t.Fatal(err)
		}
		if u.newText != nil {
			content = u.newText
		}
		if u.newScore != nil {
			score = u.newScore
		}
		if tag, err := pool.Exec(ctx, upsert, u.id, score, content); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("re-sync %s: %v, %v", u.id, tag, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo); n != 2 {
		t.Errorf("%d reviews to score after the re-syncs, want 2 (c2, c3)", n)
	}
	if sizes := scoreAll(t, j); len(sizes) != 1 || sizes[0] != 2 {
		t.Errorf("batches after the re-syncs %v, want [2]", sizes)
	}
	after := sentimentAt(t, pool)
	for id, at := range before {
		changed := !after[id].Equal(at)
		if want := id == "c2" || id == "c3"; changed != want {
			t.Errorf("review %s: sentiment_at %s → %s; scored again: %v, want %v", id, at, after[id], changed, want)
		}
	}
	var label, text string
	if err := pool.QueryRow(ctx, `SELECT sentiment, coalesce(content, '') FROM reviews WHERE review_id = 'c3'`).Scan(&label, &text); err != nil {
		t.Fatal(err)
	}
	if want := j.model.Classify(text, 1).Label; label != want {
		t.Errorf("c3, now with one star, is %s, want %s", label, want)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_latency_seconds", nil) - latencies; got != 2 {
		t.Errorf("%v latencies observed for the re-scored reviews, want 2", got)
	}
}

func ptr[T any](v T) *T { return &v }

// Two jobs on one database share the work: while one holds a batch, the
// other skips it and scores the rest; together they score every review
// exactly once.
func TestSentimentJobsShareTheWorkWithoutDoubleScoring(t *testing.T) {
	t.Parallel()
	pool, a, regA := newSentimentJobFixture(t, "d", 1000, 100)
	ctx := context.Background()
	b, regB := newTestSentimentJob(t, pool, 100)

	claimed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a.afterClaim = func(context.Context) {
		once.Do(func() { close(claimed); <-release })
	}
	done := make(chan error, 1)
	go func() {
		n, err := a.scoreBatch(ctx)
		if err == nil && n != 100 {
			err = fmt.Errorf("job a's held batch scored %d reviews, want 100", n)
		}
		done <- err
	}()
	<-claimed
	// With a's 100 reviews locked, b neither waits for them nor takes them.
	bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		n, err := b.scoreBatch(bctx)
		if err != nil {
			close(release)
			t.Fatalf("job b while job a holds a batch: %v", err)
		}
		if n == 0 {
			break
		}
	}
	if got := scoredTotal(t, regB); got != 900 {
		t.Errorf("job b scored %v reviews while a held 100, want 900", got)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Then both loops at once on more reviews.
	insertSentimentReviews(t, pool, "e", 3000)
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, j := range []*sentimentJob{a, b} {
		wg.Go(func() {
			if err := j.Run(rctx); err != nil {
				t.Error(err)
			}
		})
	}
	waitFor(t, 30*time.Second, "both jobs to score every review", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo) == 0
	})
	stop()
	wg.Wait()
	if got := scoredTotal(t, regA) + scoredTotal(t, regB); got != 4000 {
		t.Errorf("the two jobs scored %v times, want each of the 4000 reviews once", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment IS NULL OR sentiment_model IS NULL`); n != 0 {
		t.Errorf("%d reviews unscored", n)
	}
}

// rescore marks every scored review, or those of other model versions; the
// job scores them again and keeps their labels meanwhile.
func TestSentimentRescore(t *testing.T) {
	t.Parallel()
	url := newTestDatabase(t)
	pool := newTestPoolFor(t, url)
	ctx := context.Background()
	insertSentimentReviews(t, pool, "m", 30)
	j, reg := newTestSentimentJob(t, pool, 100)
	scoreAll(t, j)
	mustExec(t, pool, `UPDATE reviews SET sentiment_model = 'lr1-000000000000' WHERE id % 3 = 0`)
	var rescoreErr bytes.Buffer
	rescore := func(args ...string) (string, error) {
		var out bytes.Buffer
		rescoreErr.Reset()
		err := run(ctx, append([]string{"sentiment", "rescore"}, args...),
			envFunc(map[string]string{"DATABASE_URL": url, "PLAYWATCH_DATA_DIR": t.TempDir(), "LOG_LEVEL": "warn"}), &out, &rescoreErr)
		return out.String(), err
	}
	out, err := rescore("--model-older")
	if err != nil || !strings.HasPrefix(out, "10 reviews marked for re-scoring") || !strings.Contains(out, "backlog now 10") {
		t.Fatalf("rescore --model-older: %q, %v", out, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment IS NULL`); n != 0 {
		t.Errorf("%d labels cleared by rescore; they stay until scored again", n)
	}
	if sizes := scoreAll(t, j); len(sizes) != 1 || sizes[0] != 10 {
		t.Errorf("batches after rescore --model-older %v, want [10]", sizes)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment_model = $1`, j.version); n != 30 {
		t.Errorf("%d reviews by %s, want 30", n, j.version)
	}
	if out, err := rescore("--model-older"); err != nil || !strings.HasPrefix(out, "0 reviews marked") {
		t.Errorf("rescore --model-older again: %q, %v", out, err)
	}
	// Reviews marked by rescore have no latency worth observing.
	if got := metricValue(t, reg, "playwatch_sentiment_latency_seconds", nil); got != 30 {
		t.Errorf("latency_seconds has %v samples, want the 30 first scorings only", got)
	}
	// Marking goes up the ids a batch per transaction (a row's xmin is the
	// transaction that last wrote it) and reports its progress.
	var progress [][2]int64
	n, err := rescoreSentiment(ctx, pool, true, j.version, 7, func(marked, total int64) {
		progress = append(progress, [2]int64{marked, total})
	})
	if want := [][2]int64{{7, 30}, {14, 30}, {21, 30}, {28, 30}, {30, 30}}; err != nil || n != 30 || !slices.Equal(progress, want) {
		t.Errorf("rescore in batches of 7: %d, %v, progress %v; want 30 and %v", n, err, progress, want)
	}
	if n := count(t, pool, `SELECT count(DISTINCT xmin::text) FROM reviews`); n != 5 {
		t.Errorf("rescore in batches of 7 wrote the 30 reviews in %d transactions, want 5", n)
	}
	if sizes := scoreAll(t, j); len(sizes) != 1 || sizes[0] != 30 {
		t.Errorf("batches after rescore of all %v, want [30]", sizes)
	}
	if out, err := rescore("--all"); err != nil || !strings.HasPrefix(out, "30 reviews marked") || !strings.Contains(rescoreErr.String(), "marked 30 of 30 reviews") {
		t.Errorf("rescore --all: %q, %v; stderr %q", out, err, rescoreErr.String())
	}
	// `sentiment run` scores them, and ends without an error at a signal.
	before := sentimentAt(t, pool)
	rctx, stop := context.WithCancel(ctx)
	ended := make(chan error, 1)
	var errOut syncBuffer
	go func() {
		ended <- run(rctx, []string{"sentiment", "run"}, envFunc(map[string]string{"DATABASE_URL": url, "PLAYWATCH_DATA_DIR": t.TempDir(),
			"SENTIMENT_INTERVAL": "50ms"}), io.Discard, &errOut)
	}()
	waitFor(t, 20*time.Second, "sentiment run to score the reviews rescore --all marked", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo) == 0
	})
	stop()
	if err := <-ended; err != nil {
		t.Errorf("sentiment run: %v\n%s", err, errOut.String())
	}
	for id, at := range sentimentAt(t, pool) {
		if !at.After(before[id]) {
			t.Errorf("review %s not scored again after rescore --all (sentiment_at %s)", id, at)
		}
	}
	for _, args := range [][]string{nil, {"--all", "--model-older"}, {"--all", "extra"}} {
		var uerr usageError
		if _, err := rescore(args...); !errors.As(err, &uerr) {
			t.Errorf("rescore %q: %v, want a usage error", args, err)
		}
	}
}

// A batch cut short by shutdown is rolled back, and Run ends without an
// error; a database that refuses the job's statements is retried until it
// takes them, without ending the role.
func TestSentimentJobShutdownAndDatabaseTrouble(t *testing.T) {
	t.Parallel()
	pool, j, reg := newSentimentJobFixture(t, "x", 50, 20)
	ctx := context.Background()
	rctx, stop := context.WithCancel(ctx)
	j.afterClaim = func(context.Context) { stop() }
	if err := j.Run(rctx); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment IS NULL`); n != 50 {
		t.Errorf("%d of 50 reviews unscored after a shutdown mid-batch, want all (rolled back)", n)
	}

	j.afterClaim = nil
	mustExec(t, pool, `ALTER TABLE reviews RENAME TO reviews_away`)
	var logs syncBuffer
	j.logger = newLogger(Config{LogFormat: "text"}, &logs)
	rctx, stop = context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	go func() { ended <- j.Run(rctx) }()
	waitFor(t, 10*time.Second, "the job to report its failures", func() bool {
		return strings.Count(logs.String(), "cannot score a batch") >= 2
	})
	mustExec(t, pool, `ALTER TABLE reviews_away RENAME TO reviews`)
	waitFor(t, 20*time.Second, "the job to score after the table came back", func() bool {
		return scoredTotal(t, reg) == 50
	})
	stop()
	if err := <-ended; err != nil {
		t.Errorf("Run: %v", err)
	}
	if !strings.Contains(logs.String(), "sentiment job scores again") {
		t.Errorf("no recovery logged:\n%s", logs.String())
	}
}

// A job whose writes fail counts every failed batch, and its backlog gauge
// keeps following the work list (the database still answers the count)
// rather than staying at what the last successful batch left.
func TestSentimentJobFailingBatchesAreCountedWithTheBacklog(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	insertSentimentReviews(t, pool, "f", 40)
	mustExec(t, pool, `CREATE FUNCTION refuse_sentiment() RETURNS trigger LANGUAGE plpgsql AS
		$$BEGIN RAISE EXCEPTION 'sentiment writes refused'; END$$;
		CREATE TRIGGER refuse_sentiment BEFORE UPDATE OF sentiment ON reviews FOR EACH ROW EXECUTE FUNCTION refuse_sentiment()`)
	j, reg := newTestSentimentJob(t, pool, 100)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	go func() { ended <- j.Run(rctx) }()
	waitFor(t, 10*time.Second, "two failed batches and the backlog counted", func() bool {
		return metricValue(t, reg, "playwatch_sentiment_batch_errors_total", nil) >= 2 &&
			metricValue(t, reg, "playwatch_sentiment_backlog_reviews", nil) == 40
	})
	if got := scoredTotal(t, reg); got != 0 {
		t.Errorf("%v reviews counted as scored while every write failed", got)
	}
	mustExec(t, pool, `DROP TRIGGER refuse_sentiment ON reviews`)
	waitFor(t, 20*time.Second, "the job to score once writes are taken", func() bool {
		return scoredTotal(t, reg) == 40 && metricValue(t, reg, "playwatch_sentiment_backlog_reviews", nil) == 0
	})
	errs := metricValue(t, reg, "playwatch_sentiment_batch_errors_total", nil)
	time.Sleep(100 * time.Millisecond) // a few idle polls
	if got := metricValue(t, reg, "playwatch_sentiment_batch_errors_total", nil); got != errs {
		t.Errorf("batch errors went from %v to %v while the job scored", errs, got)
	}
	stop()
	if err := <-ended; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// The sentiment role, on by default in `run`, scores the reviews the
// crawler stored; a second crawl that finds the same texts re-syncs them
// without putting them back on the job's work list.
func TestSentimentRoleScoresWhatTheCrawlerStored(t *testing.T) {
	t.Parallel()
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	replay := newReplayPlayStore(t)
	replay.setApp("ir.divar", replayApp{Reviews: 30, Persian: true})
	replay.setApp("com.example.notes", replayApp{Reviews: 20})
	registerApps(t, pool, "ir.divar", "com.example.notes")
	env := map[string]string{
		"DATABASE_URL":          dbURL,
		"PLAYWATCH_DATA_DIR":    filepath.Join(t.TempDir(), "data"),
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
		"PLAYSTORE_URL":         replay.URL,
		"RATE_LIMIT_REQUESTS":   "0",
		"EGRESS_MIN_GAP":        "0s",
		"CONSUMER_LINGER":       "0s",
		"SENTIMENT_INTERVAL":    "200ms",
		"LOG_LEVEL":             "warn",
	}
	// No crawler role: the crawls are one-off cycles, which plan only while
	// no scheduler leads.
	base, stop, logs := startRun(t, env, "--roles", "registry,consumer,sentiment")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("playwatch run:\n%s", logs)
		}
	})
	if err := run(context.Background(), []string{"crawl", "--once"}, envFunc(env), io.Discard, io.Discard); err != nil {
		t.Fatalf("crawl --once: %v", err)
	}
	scored := func() float64 {
		var sum float64
		for k, v := range scrapeMetrics(t, base) {
			if strings.HasPrefix(k, "playwatch_sentiment_scored_total{") {
				sum += v
			}
		}
		return sum
	}
	waitFor(t, 60*time.Second, "the crawled reviews to be stored and scored", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment IS NOT NULL`) == 50
	})
	model, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment_model = $1 AND sentiment_text_hash = reviews_sentiment_input(score, content)`, model.Version()); n != 50 {
		t.Errorf("%d of 50 reviews carry the model version and the hash of what was scored", n)
	}
	waitFor(t, 10*time.Second, "the metrics to show the scores and an empty backlog", func() bool {
		return scored() == 50 && scrapeMetric(t, base, "playwatch_sentiment_backlog_reviews", "") == 0
	})
	if n := scrapeMetric(t, base, "playwatch_sentiment_latency_seconds_count", ""); n != 50 {
		t.Errorf("latency_seconds_count = %v, want 50", n)
	}
	var persian float64
	for _, label := range []string{"POSITIVE", "NEUTRAL", "NEGATIVE"} {
		persian += scrapeMetric(t, base, "playwatch_sentiment_scored_total", `label="`+label+`",lang="fa"`)
	}
	if persian != 30 {
		t.Errorf("%v reviews counted as Persian, want ir.divar's 30", persian)
	}

	before := sentimentAt(t, pool)
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"crawl", "--once"}, envFunc(env), &out, &errOut); err != nil {
		t.Fatalf("crawl --once: %v\n%s", err, errOut.String())
	}
	waitFor(t, 30*time.Second, "the second crawl to re-sync every review after it was scored", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE last_synced_at > $1`, maxTime(before)) == 50
	})
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo); n != 0 {
		t.Errorf("%d re-synced reviews with unchanged texts are on the work list", n)
	}
	if after := sentimentAt(t, pool); len(after) != len(before) {
		t.Errorf("%d scored reviews, then %d", len(before), len(after))
	} else {
		for id, at := range before {
			if !after[id].Equal(at) {
				t.Errorf("review %s re-synced with the same text was scored again: %s → %s", id, at, after[id])
			}
		}
	}
	if n := scored(); n != 50 {
		t.Errorf("scored_total sums to %v after the re-sync, want 50", n)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

func maxTime(ts map[string]time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}

// A pass goes up the ids batch by batch; a review below the last batch
// whose text changed meanwhile is found once the pass starts again.
func TestSentimentJobPassStartsAgainAtTheBottom(t *testing.T) {
	t.Parallel()
	pool, j, _ := newSentimentJobFixture(t, "w", 30, 10)
	if sizes := scoreBatches(t, j, 1); sizes[0] != 10 {
		t.Fatalf("first batch: %d, want 10", sizes[0])
	}
	mustExec(t, pool, `UPDATE reviews SET content = 'changed', last_synced_at = now() WHERE review_id = 'w1'`)
	// 11-20, 21-30, nothing above 30, then w1 from the bottom.
	if sizes, want := scoreBatches(t, j, 4), []int{10, 10, 0, 1}; !slices.Equal(sizes, want) {
		t.Errorf("batches %v, want %v", sizes, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo); n != 0 {
		t.Errorf("%d reviews left to score", n)
	}
}

// panickyClassifier is the model, except that it panics on a text holding
// poison: a bug of the model that one review's text sets off.
type panickyClassifier struct {
	sentimentClassifier
	poison string
}

func (c panickyClassifier) Classify(text string, stars int) sentimentResult {
	if strings.Contains(text, c.poison) {
		panic("index out of range [7] with length 7")
	}
	return c.sentimentClassifier.Classify(text, stars)
}

// A review the model panics on is that review's failure alone: it is logged
// with its id, counted, stored with the label of its stars and
// sentiment_model failed:<version>, so it leaves the work list; every other
// review of the batch is scored. A rescore brings it back (and it fails
// again, without a loop).
func TestSentimentJobSurvivesAPanicOfTheModel(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	insertSentimentReviews(t, pool, "p", 600)
	const poison = "poison pill"
	mustExec(t, pool, `UPDATE reviews SET content = $1, score = 1 WHERE review_id = 'p301'`, poison)
	model, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var logs syncBuffer
	j := newSentimentJob(pool, panickyClassifier{model, poison}, sentimentJobConfig{Interval: 20 * time.Millisecond, Batch: 1000}, reg,
		slog.New(slog.NewTextHandler(&logs, nil)))
	if sizes := scoreAll(t, j); !slices.Equal(sizes, []int{600}) {
		t.Fatalf("batches %v, want [600]", sizes)
	}
	var id int64
	var label, modelOf string
	if err := pool.QueryRow(ctx, `SELECT id, sentiment, sentiment_model FROM reviews WHERE review_id = 'p301'`).Scan(&id, &label, &modelOf); err != nil {
		t.Fatal(err)
	}
	if label != "NEGATIVE" || modelOf != "failed:"+model.Version() {
		t.Errorf("the poisoned review: %s by %s, want NEGATIVE (1 star) by failed:%s", label, modelOf, model.Version())
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE sentiment_model = $1 AND sentiment IS NOT NULL`, model.Version()); n != 599 {
		t.Errorf("%d reviews scored by the model, want the other 599", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo); n != 0 {
		t.Errorf("%d reviews still on the work list", n)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_review_errors_total", nil); got != 1 {
		t.Errorf("review errors %v, want 1", got)
	}
	if got := scoredTotal(t, reg); got != 599 {
		t.Errorf("scored_total %v, want 599", got)
	}
	if !strings.Contains(logs.String(), fmt.Sprintf("id=%d", id)) || !strings.Contains(logs.String(), "index out of range") ||
		!strings.Contains(logs.String(), "sentiment_job_test.go") {
		t.Errorf("the log does not name review %d and the panic:\n%s", id, logs.String())
	}
	if sizes := scoreAll(t, j); len(sizes) != 0 {
		t.Errorf("batches after the failure %v: the failed review is retried", sizes)
	}
	// rescore --model-older marks it again (its model is not the current one).
	if n, err := rescoreSentiment(ctx, pool, false, j.version, 100, func(int64, int64) {}); err != nil || n != 1 {
		t.Fatalf("rescore --model-older: %d, %v; want the failed review", n, err)
	}
	if sizes := scoreAll(t, j); !slices.Equal(sizes, []int{1}) {
		t.Errorf("batches after the rescore %v, want [1]", sizes)
	}
	if got := metricValue(t, reg, "playwatch_sentiment_review_errors_total", nil); got != 2 {
		t.Errorf("review errors after the rescore %v, want 2", got)
	}
}
