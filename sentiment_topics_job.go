package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// The topics backfill (docs/sentiment.md §8): reviews the sentiment job
// labelled before reviews.topics existed get their topics, without their
// sentiment being scored again. The job runs a batch whenever the labels are
// caught up (a scoring batch that was not full), so new reviews never wait
// behind it. Its work list is the partial index reviews_topics_todo_idx
// (migration 13); the scoring pass writes topics with every label, so the
// list only shrinks.

const topicsTodo = `topics IS NULL AND sentiment IS NOT NULL`

// topicsClaimSQL locks the next batch after id $2, skipping rows another
// job holds, as sentimentClaimSQL does.
const topicsClaimSQL = `SELECT id, coalesce(content, '') FROM reviews WHERE id > $2 AND ` + topicsTodo + `
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`

const topicsWriteSQL = `UPDATE reviews AS r SET topics = string_to_array(u.topics, ',')
FROM unnest($1::bigint[], $2::text[]) AS u(id, topics) WHERE r.id = u.id`

// topicsProgressEvery is how often a running backfill logs its progress.
const topicsProgressEvery = 10 * time.Second

type topicBackfill struct {
	after     int64 // the last id of the previous full batch, else 0
	running   bool  // between a batch that found work and one that found none
	done      int64 // reviews given topics since running
	remaining int64 // counted when the backfill starts, then counted down
	loggedAt  time.Time
	filled    prometheus.Counter
	backlog   prometheus.Gauge
}

func newTopicBackfill(reg prometheus.Registerer) topicBackfill {
	mk := metricMaker{reg}
	b := topicBackfill{
		filled:  mk.counter("playwatch_sentiment_topics_backfilled_total", "Reviews labelled before topics existed that the sentiment job gave their topics (without scoring them again)."),
		backlog: mk.gauge("playwatch_sentiment_topics_backlog_reviews", "Labelled reviews still without topics: counted when the backfill starts, counted down by its batches, 0 once it is done."),
	}
	return b
}

// backfillTopicsBatch runs one batch and returns its size; trouble is
// logged (the next idle poll tries again) and is a batch of 0.
func (j *sentimentJob) backfillTopicsBatch(ctx context.Context) int {
	n, err := j.backfillTopics(ctx)
	if err != nil && ctx.Err() == nil {
		j.logger.Warn("sentiment job cannot backfill topics; retrying at its next poll", "err", err)
	}
	return n
}

func (j *sentimentJob) backfillTopics(ctx context.Context) (int, error) {
	b := &j.backfill
	tx, err := j.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("topics backfill: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	from := b.after
	b.after = 0
	rows, err := tx.Query(ctx, topicsClaimSQL, j.cfg.Batch, from)
	if err != nil {
		return 0, fmt.Errorf("topics backfill: claim reviews: %w", err)
	}
	var ids []int64
	var texts []string
	var id int64
	var text string
	if _, err := pgx.ForEachRow(rows, []any{&id, &text}, func() error {
		ids, texts = append(ids, id), append(texts, text)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("topics backfill: claim reviews: %w", err)
	}
	if len(ids) == 0 {
		if from != 0 {
			return 0, tx.Commit(ctx) // the pass starts again at the bottom next time
		}
		if b.running {
			b.running = false
			b.backlog.Set(0)
			j.logger.Info("topics backfill finished", "reviews", b.done)
		}
		return 0, tx.Commit(ctx)
	}
	if !b.running {
		// How much is left, once per backfill: an index-only count of the
		// partial index (this transaction's own batch included).
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM reviews WHERE `+topicsTodo).Scan(&b.remaining); err != nil {
			return 0, fmt.Errorf("topics backfill: count: %w", err)
		}
		b.running, b.done, b.loggedAt = true, 0, j.clock.Now()
		j.logger.Info("topics backfill started: reviews labelled before topics existed get them", "reviews", b.remaining)
	}
	topics := make([]string, len(ids))
	for i, t := range texts {
		topics[i] = strings.Join(j.topicsRecovering(ids[i], t), ",")
	}
	if _, err := tx.Exec(ctx, topicsWriteSQL, ids, topics); err != nil {
		return 0, fmt.Errorf("topics backfill: write: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("topics backfill: commit: %w", err)
	}
	if len(ids) == j.cfg.Batch {
		b.after = ids[len(ids)-1]
	}
	b.done += int64(len(ids))
	b.remaining = max(b.remaining-int64(len(ids)), 0)
	b.filled.Add(float64(len(ids)))
	b.backlog.Set(float64(b.remaining))
	if now := j.clock.Now(); now.Sub(b.loggedAt) >= topicsProgressEvery {
		b.loggedAt = now
		j.logger.Info("topics backfill progress", "done", b.done, "remaining", b.remaining)
	}
	return len(ids), nil
}

// topicsRecovering classifies one review's topics. A panic is that review's
// failure alone (it gets none, logged): not recovered, it would end the
// sentiment role, and the same batch, claimed again, would end it again.
func (j *sentimentJob) topicsRecovering(id int64, text string) (topics []string) {
	defer func() {
		if v := recover(); v != nil {
			topics = []string{}
			j.metrics.reviewErrors.Inc()
			j.logger.Error("topic classifier failed on a review; it gets no topics", "id", id, "err", recoveredPanic(v))
		}
	}()
	return j.topics.Classify(text)
}
