package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// appGaugeCollector exports what is stored per app (docs/design.md §Status
// page) as gauges, read on each scrape by one query: what PostgreSQL holds
// is the truth, also for rows written by dlq replay or another server's
// consumer, so nothing has to be kept in step. One series per active app
// (and sentiment): the cardinality the README discusses.
type appGaugeCollector struct {
	db      statusDB
	timeout time.Duration
	logger  *slog.Logger

	score, ratings, installs, reviews, newest, up *prometheus.Desc
}

func newAppGaugeCollector(db statusDB, logger *slog.Logger) *appGaugeCollector {
	pkg := []string{"package"}
	return &appGaugeCollector{db: db, timeout: 5 * time.Second, logger: logger,
		score:    prometheus.NewDesc("playwatch_app_score", "Average rating of the app's newest stored listing (0 to 5).", pkg, nil),
		ratings:  prometheus.NewDesc("playwatch_app_ratings", "Number of ratings on the app's newest stored listing.", pkg, nil),
		installs: prometheus.NewDesc("playwatch_app_installs", "Exact installs of the newest stored listing (the store's lower bound where it shows no exact count).", pkg, nil),
		reviews: prometheus.NewDesc("playwatch_app_reviews", "Reviews of the app stored in PostgreSQL, by sentiment (none: not scored yet).",
			[]string{"package", "sentiment"}, nil),
		newest: prometheus.NewDesc("playwatch_app_newest_review_timestamp_seconds", "Unix time of the newest stored review of the app (its time on the store).", pkg, nil),
		up:     prometheus.NewDesc("playwatch_app_gauges_up", "1 if the per-app gauges could be read from PostgreSQL at this scrape, else 0.", nil, nil),
	}
}

func (c *appGaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.score, c.ratings, c.installs, c.reviews, c.newest, c.up} {
		ch <- d
	}
}

// Collect never fails the scrape: a database that cannot answer drops the
// per-app series and sets playwatch_app_gauges_up to 0, while every other
// metric of the process is still served.
func (c *appGaugeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var rows []appGaugeRow
	err := c.db.read(ctx, func(tx pgx.Tx) (err error) { rows, err = loadAppGauges(ctx, tx); return })
	if err != nil {
		c.logger.Warn("cannot read the per-app gauges", "err", err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, r := range rows {
		if r.Score != nil {
			ch <- prometheus.MustNewConstMetric(c.score, prometheus.GaugeValue, *r.Score, r.Package)
		}
		if r.Ratings != nil {
			ch <- prometheus.MustNewConstMetric(c.ratings, prometheus.GaugeValue, float64(*r.Ratings), r.Package)
		}
		if r.Installs != nil {
			ch <- prometheus.MustNewConstMetric(c.installs, prometheus.GaugeValue, float64(*r.Installs), r.Package)
		}
		for _, s := range []struct {
			label string
			n     int64
		}{{"POSITIVE", r.Reviews.Positive}, {"NEUTRAL", r.Reviews.Neutral}, {"NEGATIVE", r.Reviews.Negative}, {"none", r.Reviews.None}} {
			ch <- prometheus.MustNewConstMetric(c.reviews, prometheus.GaugeValue, float64(s.n), r.Package, s.label)
		}
		if r.NewestReviewAt != nil {
			ch <- prometheus.MustNewConstMetric(c.newest, prometheus.GaugeValue, float64(r.NewestReviewAt.UnixMilli())/1000, r.Package)
		}
	}
}
