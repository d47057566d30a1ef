package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// What reviews of the last 7 days are about (reviews.topics, written by the
// sentiment job): the app page's topics table and the per-app gauge
// playwatch_app_topic_reviews_7d. Both walk reviews (application_id, at)
// over 7 days, so their cost follows the week's reviews, not the history.

// topicCount is one topic of an app's reviews of the last 7 days.
type topicCount struct {
	Topic    string
	Reviews  int64
	Negative int64 // of them, labelled NEGATIVE
}

// appTopicsSQL: $1 the app's id, $2 now.
const appTopicsSQL = `SELECT t, count(*), count(*) FILTER (WHERE r.sentiment = 'NEGATIVE')
FROM reviews AS r CROSS JOIN unnest(r.topics) AS t
WHERE r.application_id = $1 AND r.at > $2::timestamptz - interval '7 days' AND r.at <= $2
GROUP BY t ORDER BY count(*) DESC, t`

func loadAppTopics(ctx context.Context, tx pgx.Tx, appID int64, now time.Time) ([]topicCount, error) {
	rows, err := tx.Query(ctx, appTopicsSQL, appID, now)
	if err != nil {
		return nil, fmt.Errorf("status page: topics of app %d: %w", appID, err)
	}
	var out []topicCount
	var c topicCount
	if _, err := pgx.ForEachRow(rows, []any{&c.Topic, &c.Reviews, &c.Negative}, func() error {
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("status page: topics of app %d: %w", appID, err)
	}
	return out, nil
}

// topicView is one row of the app page's topics table.
type topicView struct {
	Topic, Reviews, Negative, Share string
}

func topicViews(counts []topicCount) []topicView {
	var out []topicView
	for _, c := range counts {
		out = append(out, topicView{Topic: c.Topic, Reviews: groupDigits(c.Reviews), Negative: groupDigits(c.Negative),
			Share: fmt.Sprintf("%.0f %%", 100*float64(c.Negative)/float64(c.Reviews))})
	}
	return out
}
