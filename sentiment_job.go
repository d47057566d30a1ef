package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// The sentiment job (docs/schema.md "reviews", README "Sentiment job"):
// labels stored reviews whose sentiment is NULL or whose text and stars
// changed since they were scored, in batches, one UPDATE per batch. It
// writes only sentiment and its own columns, never the consumer's.

// sentimentClassifier is what the job needs of the model (sentiment.go).
type sentimentClassifier interface {
	Version() string
	Classify(text string, stars int) sentimentResult
}

// sentimentTodo is the work list: it matches the predicate of the partial
// index reviews_sentiment_todo_idx (schema.sql, migration 4), so that the
// planner finds the work through it without reading the scored rows.
const sentimentTodo = `(sentiment IS NULL OR sentiment_text_hash IS DISTINCT FROM reviews_sentiment_input(score, content))`

// sentimentClaimSQL locks a batch of the work after id $2, skipping rows
// another job or a consumer batch holds. Starting after the previous batch
// rather than at the index's start matters: until no transaction can see
// them, the entries of the rows just scored stay in the index, and a scan
// from the start would walk all of them again at every batch. stored_at is when the version to score was stored:
// first_seen_at for a new review, last_synced_at (its crawl) for a changed
// text; NULL for a review only marked by rescore, whose latency would say
// nothing.
const sentimentClaimSQL = `SELECT id, coalesce(content, ''), coalesce(score, 0)::int,
	CASE WHEN sentiment IS NULL THEN first_seen_at WHEN sentiment_text_hash IS NOT NULL THEN last_synced_at END
FROM reviews WHERE id > $2 AND ` + sentimentTodo + `
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`

// sentimentWriteSQL writes a whole batch in one statement. The hash is taken
// from the locked row, which is the version that was classified.
// statement_timestamp() makes every row of one batch share its sentiment_at.
// The model is per row: a review the model failed on gets failedModelPrefix.
// A row's topics come comma-separated (unnest cannot take an array of
// arrays of different lengths); none is '{}'.
const sentimentWriteSQL = `UPDATE reviews AS r SET sentiment = u.label, sentiment_model = u.model, text_lang = u.lang,
	sentiment_at = statement_timestamp(), sentiment_text_hash = reviews_sentiment_input(r.score, r.content),
	topics = string_to_array(u.topics, ',')
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, label, model, lang, topics)
WHERE r.id = u.id`

// failedModelPrefix marks, in sentiment_model, a review whose
// classification panicked: it gets the label of its stars alone and its
// hash, so it leaves the work list instead of failing every batch that
// claims it; a rescore (its model is not the current one) or a new text
// brings it back.
const failedModelPrefix = "failed:"

// sentimentRetryMaxBackoff caps the wait between attempts while the
// database cannot be reached (fixed).
const sentimentRetryMaxBackoff = 10 * time.Second

// sentimentBacklogEvery is how often the backlog gauge is counted while the
// job is busy; an idle job counts it at each poll (a few index entries).
const sentimentBacklogEvery = 10 * time.Second

type sentimentJobConfig struct {
	Interval time.Duration // wait after a batch that was not full
	Batch    int           // reviews per transaction, at most
}

func sentimentJobConfigOf(cfg Config) sentimentJobConfig {
	return sentimentJobConfig{Interval: cfg.SentimentInterval, Batch: cfg.SentimentBatch}
}

type sentimentJob struct {
	pool    *pgxpool.Pool
	model   sentimentClassifier
	version string
	failed  string // sentiment_model of a review the model failed on
	cfg     sentimentJobConfig
	metrics *sentimentMetrics
	topics  *topicClassifier
	// backfill gives topics to reviews labelled before topics existed
	// (sentiment_topics_job.go).
	backfill topicBackfill
	logger   *slog.Logger
	clock    clock

	// afterClaim, for tests, runs with the batch locked, before it is
	// classified.
	afterClaim func(ctx context.Context)

	backlogAt time.Time // when the backlog was last counted
	// watchModels: the job switches to the newest model of sentiment_models
	// (refreshModel, sentiment_models.go), looked for at modelCheckedAt.
	watchModels    bool
	modelCheckedAt time.Time
	// after is the last id of the previous batch when it was full, else 0:
	// a pass over the work list goes up the ids and starts again at the
	// bottom once it finds less than a batch (changed texts of older
	// reviews, rows another job held).
	after int64
}

func newSentimentJob(pool *pgxpool.Pool, model sentimentClassifier, cfg sentimentJobConfig, reg prometheus.Registerer, logger *slog.Logger) *sentimentJob {
	v := model.Version()
	failed := failedModelPrefix + v
	failed = failed[:min(len(failed), 40)] // sentiment_model is VARCHAR(40)
	return &sentimentJob{pool: pool, model: model, version: v, failed: failed, cfg: cfg,
		metrics: newSentimentMetrics(reg), topics: newTopicClassifier(), backfill: newTopicBackfill(reg), logger: logger, clock: systemClock{}}
}

// Run scores until ctx ends: at once again after a full batch, after
// Interval otherwise. Database trouble is logged and retried with backoff;
// it never ends the role. A batch cut short by ctx is rolled back.
func (j *sentimentJob) Run(ctx context.Context) error {
	j.logger.Info("sentiment job started", "model", j.version, "batch", j.cfg.Batch, "interval", j.cfg.Interval)
	failures := 0
	for ctx.Err() == nil {
		j.refreshModel(ctx)
		n, err := j.scoreBatch(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			failures++
			j.metrics.batchErrors.Inc()
			// The backlog keeps being counted while batches fail (the claim
			// or the write refused, the count itself may still answer), so
			// that its gauge grows instead of freezing at the last success.
			if berr := j.refreshBacklog(ctx, false); berr != nil && ctx.Err() == nil {
				j.logger.Debug("sentiment job cannot count its backlog", "err", berr)
			}
			delay := retryDelay(failures, sentimentRetryMaxBackoff)
			log := j.logger.Warn
			if classifyDBError(err) == dbBlocked {
				log = j.logger.Error // schema or permissions: an operator has to act
			}
			log("sentiment job cannot score a batch; retrying", "attempt", failures, "retry_in", delay.Round(time.Millisecond), "err", err)
			_ = sleepOn(ctx, j.clock, delay)
			continue
		}
		if failures > 0 {
			j.logger.Info("sentiment job scores again", "after_failures", failures)
			failures = 0
		}
		full := n == j.cfg.Batch
		if !full {
			full = j.backfillTopicsBatch(ctx) == j.cfg.Batch
		}
		if err := j.refreshBacklog(ctx, !full); err != nil && ctx.Err() == nil {
			j.logger.Warn("sentiment job cannot count its backlog", "err", err)
		}
		if !full {
			_ = sleepOn(ctx, j.clock, j.cfg.Interval)
		}
	}
	return nil
}

// scoredRow is one review of a batch.
type scoredRow struct {
	id       int64
	text     string
	stars    int
	storedAt *time.Time
	result   sentimentResult
	topics   string // comma-separated
	failed   bool   // the model panicked on it: result is its stars' label
}

// scoreBatch claims, classifies and writes one batch in one transaction and
// returns how many reviews it scored.
func (j *sentimentJob) scoreBatch(ctx context.Context) (int, error) {
	tx, err := j.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	from := j.after
	j.after = 0 // until this batch is known to be full
	rows, err := tx.Query(ctx, sentimentClaimSQL, j.cfg.Batch, from)
	if err != nil {
		return 0, fmt.Errorf("claim reviews: %w", err)
	}
	batch := make([]scoredRow, 0, j.cfg.Batch)
	var r scoredRow
	if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.text, &r.stars, &r.storedAt}, func() error {
		batch = append(batch, r)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("claim reviews: %w", err)
	}
	if len(batch) == 0 {
		return 0, tx.Commit(ctx)
	}
	if j.afterClaim != nil {
		j.afterClaim(ctx)
	}
	j.classify(batch)
	ids := make([]int64, len(batch))
	labels := make([]string, len(batch))
	models := make([]string, len(batch))
	langs := make([]string, len(batch))
	topics := make([]string, len(batch))
	for i, s := range batch {
		ids[i], labels[i], models[i], langs[i], topics[i] = s.id, s.result.Label, j.version, s.result.Lang, s.topics
		if s.failed {
			models[i] = j.failed
		}
	}
	start := j.clock.Now()
	tag, err := tx.Exec(ctx, sentimentWriteSQL, ids, labels, models, langs, topics)
	if err != nil {
		return 0, fmt.Errorf("write sentiment: %w", err)
	}
	if tag.RowsAffected() != int64(len(batch)) {
		return 0, fmt.Errorf("write sentiment: %d of %d locked reviews updated", tag.RowsAffected(), len(batch))
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit sentiment: %w", err)
	}
	if len(batch) == j.cfg.Batch {
		j.after = batch[len(batch)-1].id
	}
	now := j.clock.Now()
	j.metrics.batchWrite.Observe(now.Sub(start).Seconds())
	for _, s := range batch {
		if s.failed {
			j.metrics.reviewErrors.Inc()
			continue
		}
		j.metrics.scored.WithLabelValues(s.result.Label, s.result.Lang).Inc()
		if s.storedAt != nil {
			j.metrics.latency.Observe(max(now.Sub(*s.storedAt).Seconds(), 0))
		}
	}
	return len(batch), nil
}

// classify labels the batch on every core: the model is safe for
// concurrent use, and classifying is the job's only CPU work.
func (j *sentimentJob) classify(batch []scoredRow) {
	workers := min(runtime.GOMAXPROCS(0), (len(batch)+255)/256)
	chunk := (len(batch) + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < len(batch); lo += chunk {
		part := batch[lo:min(lo+chunk, len(batch))]
		wg.Go(func() {
			for i := range part {
				j.classifyOne(&part[i])
			}
		})
	}
	wg.Wait()
}

// classifyOne labels one review. A panic of the model is that review's
// failure alone: not recovered, it would end the process, and the batch,
// claimed again after a restart, would end it again.
func (j *sentimentJob) classifyOne(s *scoredRow) {
	defer func() {
		if v := recover(); v != nil {
			s.failed = true
			s.result = fuseSentiment([sentClasses]float64{0, 1, 0}, s.stars, "other")
			j.logger.Error("sentiment model failed on a review; it keeps the label of its stars until a rescore",
				"id", s.id, "model", j.version, "label", s.result.Label, "err", recoveredPanic(v))
		}
	}()
	s.topics = strings.Join(j.topicsRecovering(s.id, s.text), ",")
	s.result = j.model.Classify(s.text, s.stars)
}

// refreshBacklog counts the reviews waiting to be scored, when now is true
// or sentimentBacklogEvery has passed since the last count.
func (j *sentimentJob) refreshBacklog(ctx context.Context, now bool) error {
	if t := j.clock.Now(); now || t.Sub(j.backlogAt) >= sentimentBacklogEvery {
		n, err := sentimentBacklog(ctx, j.pool)
		if err != nil {
			return err
		}
		j.metrics.backlog.Set(float64(n))
		j.backlogAt = t
	}
	return nil
}

// sentimentBacklog is the number of reviews to score: never scored, text
// changed, or marked by rescore.
func sentimentBacklog(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM reviews WHERE `+sentimentTodo).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the sentiment backlog: %w", err)
	}
	return n, nil
}

// sentimentRescoreBatch is how many reviews rescore marks per transaction:
// one UPDATE of the whole table would hold every scored row locked until
// its commit, and the consumer's upserts of those reviews would wait.
const sentimentRescoreBatch = 10000

// rescoreSentiment marks scored reviews for the job to score again: all of
// them, or those another model version scored. Their label stays until
// then. It marks them up the ids, batch reviews per transaction, calls
// progress after each batch with the reviews marked so far and the count
// found at the start, and returns how many it marked.
func rescoreSentiment(ctx context.Context, pool *pgxpool.Pool, all bool, version string, batch int, progress func(marked, total int64)) (int64, error) {
	// $1 is the version whose reviews stay as they are; NULL (--all) keeps none.
	const cond = `r.sentiment_text_hash IS NOT NULL AND ($1::text IS NULL OR r.sentiment_model IS DISTINCT FROM $1)`
	var keep *string
	if !all {
		keep = &version
	}
	var total int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM reviews AS r WHERE `+cond, keep).Scan(&total); err != nil {
		return 0, fmt.Errorf("count the reviews to mark for re-scoring: %w", err)
	}
	// A batch is the next rows to mark above the previous one, found in the
	// primary key. The UPDATE checks the condition again on the row it
	// locks, which the job may have scored in between; the pass goes on
	// from the batch's last id even when none of it was left to mark.
	const mark = `WITH b AS (SELECT id FROM reviews AS r WHERE r.id > $2 AND ` + cond + ` ORDER BY r.id LIMIT $3),
	u AS (UPDATE reviews AS r SET sentiment_text_hash = NULL FROM b WHERE r.id = b.id AND ` + cond + ` RETURNING 1)
SELECT (SELECT count(*) FROM u), (SELECT coalesce(max(id), 0) FROM b)`
	var marked, after int64
	for {
		var n, last int64
		if err := pool.QueryRow(ctx, mark, keep, after, batch).Scan(&n, &last); err != nil {
			return marked, fmt.Errorf("mark reviews for re-scoring after id %d: %w", after, err)
		}
		if last == 0 {
			return marked, nil
		}
		marked += n
		after = last
		progress(marked, total)
	}
}

// sentimentMetrics are the job's Prometheus metrics (names agreed with the
// alert rules).
type sentimentMetrics struct {
	scored     *prometheus.CounterVec
	backlog    prometheus.Gauge
	latency    prometheus.Histogram
	batchWrite prometheus.Histogram
	// batchErrors counts batches that failed (rolled back, retried); the
	// backlog gauge alone cannot tell a failing job from a busy one.
	batchErrors prometheus.Counter
	// reviewErrors counts reviews the model failed on (written with
	// failedModelPrefix).
	reviewErrors prometheus.Counter
}

func newSentimentMetrics(reg prometheus.Registerer) *sentimentMetrics {
	mk := metricMaker{reg}
	m := &sentimentMetrics{
		scored:       mk.counterVec("playwatch_sentiment_scored_total", "Reviews the sentiment job scored (first time or again), by label and language.", "label", "lang"),
		backlog:      mk.gauge("playwatch_sentiment_backlog_reviews", "Reviews waiting to be scored: never scored, text or stars changed, or marked by rescore; counted at each idle poll and every 10s while busy or failing."),
		latency:      mk.histogram("playwatch_sentiment_latency_seconds", "From a review's storing (first_seen_at; last_synced_at for a changed text) to its score's commit; reviews marked by rescore are not observed.", prometheus.ExponentialBuckets(0.1, 2, 16)),
		batchWrite:   mk.histogram("playwatch_sentiment_batch_write_seconds", "Time of a batch's UPDATE and COMMIT.", prometheus.ExponentialBuckets(0.001, 2, 15)),
		batchErrors:  mk.counter("playwatch_sentiment_batch_errors_total", "Batches the sentiment job could not claim, write or commit (rolled back and retried with backoff)."),
		reviewErrors: mk.counter("playwatch_sentiment_review_errors_total", "Reviews the sentiment model failed on (a panic): stored with the label of their stars and sentiment_model failed:<version>, not retried until a rescore or a new text."),
	}
	for _, label := range []string{"POSITIVE", "NEUTRAL", "NEGATIVE"} {
		for _, lang := range []string{"fa", "en", "other"} {
			m.scored.WithLabelValues(label, lang)
		}
	}
	return m
}
