package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// What reviews of the last 7 days are about (reviews.topics, written by the
// sentiment job): the app page's topics table, per storefront from the
// hourly topic rollup (migration 17), and the per-app gauge
// playwatch_app_topic_reviews_7d (app_gauges_read.go). Both read 7 days, so their cost follows
// the week's reviews, not the history.

// topicCount is one topic of an app's reviews of the last 7 days.
type topicCount struct {
	Topic    string
	Reviews  int64
	Negative int64 // of them, labelled NEGATIVE
}

// appTopicsSQL: $1 the app's id, $2 and $3 the storefront's country and
// lang, $4 now; the 7 days' hourly buckets.
const appTopicsSQL = `SELECT topic, sum(reviews)::bigint AS n, coalesce(sum(reviews) FILTER (WHERE sentiment = 'NEGATIVE'), 0)::bigint
FROM review_topic_rollup_hourly
WHERE application_id = $1 AND country = $2 AND lang = $3 AND hour > $4::timestamptz - interval '7 days' AND hour <= $4
GROUP BY topic HAVING sum(reviews) > 0 ORDER BY n DESC, topic`

func loadAppTopics(ctx context.Context, tx pgx.Tx, appID int64, front locale, now time.Time) ([]topicCount, error) {
	return queryRows(ctx, tx, fmt.Sprintf("topics of app %d", appID), func(row pgx.CollectableRow, c *topicCount) error {
		return row.Scan(&c.Topic, &c.Reviews, &c.Negative)
	}, appTopicsSQL, appID, front.Country, front.Lang, now)
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
