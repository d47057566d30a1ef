package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// appGaugeCollector exports what is stored per app and storefront
// (docs/design.md §Status page) as gauges: what PostgreSQL holds is the
// truth, also for rows written by dlq replay or another server's consumer,
// so nothing has to be kept in step. One series per active app, storefront
// (country, lang) and sentiment: the cardinality the README discusses.
//
// The listing gauges are the storefront's newest app_stats row, the review
// gauges read the rollups (migration 17) and at most the two hours of raw
// reviews at the ends of their windows: the read's cost follows the apps and
// the hour's reviews, not the history. It still runs in the background
// every refreshEvery and a scrape serves its last answer: a slow database
// delays the numbers, never the scrape.
type appGaugeCollector struct {
	db           statusDB
	now          func() time.Time
	refreshEvery time.Duration
	logger       *slog.Logger
	// locales are the PLAYSTORE_* storefronts of an app registered
	// without storefronts (localeDefaults.storefronts): the page's.
	locales func() localeDefaults

	mu        sync.Mutex
	rows      []appGaugeRow
	ok        bool      // the last refresh succeeded
	refreshed time.Time // the last successful refresh; zero before one

	score, ratings, installs, reviews, neg1h, neg7d, newest, up, age *prometheus.Desc
	topics7d                                                         *prometheus.Desc
}

// newAppGaugeCollector reads the gauges every refreshEvery
// (APP_GAUGES_INTERVAL, 30s: well under the 5 minutes of the alert rules'
// windows, and two queries a minute per server).
func newAppGaugeCollector(db statusDB, now func() time.Time, locales func() localeDefaults, refreshEvery time.Duration, logger *slog.Logger) *appGaugeCollector {
	app := []string{"package", "country", "lang"}
	return &appGaugeCollector{db: db, now: now, locales: locales, refreshEvery: refreshEvery, logger: logger,
		score:    prometheus.NewDesc("playwatch_app_score", "Average rating of the newest stored listing of the app in the storefront (0 to 5).", app, nil),
		ratings:  prometheus.NewDesc("playwatch_app_ratings", "Number of ratings on the newest stored listing of the app in the storefront.", app, nil),
		installs: prometheus.NewDesc("playwatch_app_installs", "Exact installs of the newest stored listing in the storefront (the store's lower bound where it shows no exact count).", app, nil),
		reviews: prometheus.NewDesc("playwatch_app_reviews", "Reviews of the app stored in PostgreSQL that were seen in the storefront, by sentiment (none: not scored yet).",
			[]string{"package", "country", "lang", "sentiment"}, nil),
		neg1h:  prometheus.NewDesc("playwatch_app_negative_reviews_1h", "Stored reviews of the app seen in the storefront, scored NEGATIVE, whose time on the store is within the last hour.", app, nil),
		neg7d:  prometheus.NewDesc("playwatch_app_negative_reviews_7d", "Stored reviews of the app seen in the storefront, scored NEGATIVE, whose time on the store is within the last 7 days.", app, nil),
		newest: prometheus.NewDesc("playwatch_app_newest_review_timestamp_seconds", "Unix time of the newest stored review of the app seen in the storefront (its time on the store).", app, nil),
		topics7d: prometheus.NewDesc("playwatch_app_topic_reviews_7d",
			"Stored reviews of the app seen in the storefront whose time on the store is within the last 7 days, by the topic the sentiment job found (one series per topic, 0 included).",
			[]string{"package", "country", "lang", "review_topic"}, nil),
		up: prometheus.NewDesc("playwatch_app_gauges_up", "1 if the last background read of the per-app gauges from PostgreSQL succeeded, else 0.", nil, nil),
		age: prometheus.NewDesc("playwatch_app_gauges_age_seconds",
			"Seconds since the per-app gauges were last read from PostgreSQL; absent before the first read.", nil, nil),
	}
}

// run refreshes the gauges at once and then every refreshEvery until ctx ends.
func (c *appGaugeCollector) run(ctx context.Context) error {
	c.refresh(ctx)
	everyTick(ctx, c.refreshEvery, func(time.Time) { c.refresh(ctx) })
	return nil
}

// refresh reads the gauges once. A failed read keeps the last values while
// they are younger than three refreshes (one slow answer loses no series),
// then drops them: older numbers would pass for current ones.
func (c *appGaugeCollector) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.refreshEvery)
	defer cancel()
	now := c.now()
	var rows []appGaugeRow
	err := c.db.read(ctx, func(tx pgx.Tx) (err error) {
		// One statement for every app and storefront: it gets its refresh
		// interval rather than the pages' READ_STATEMENT_TIMEOUT of its
		// connection.
		if _, err = tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, strconv.FormatInt(c.refreshEvery.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("app gauges: %w", err)
		}
		rows, err = loadAppGauges(ctx, tx, now, c.locales())
		return err
	})
	if errors.Is(context.Cause(ctx), context.Canceled) {
		return // stopping
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.logger.Warn("cannot read the per-app gauges", "err", err)
		c.ok = false
		if now.Sub(c.refreshed) > 3*c.refreshEvery {
			c.rows = nil
		}
		return
	}
	c.rows, c.ok, c.refreshed = rows, true, now
}

func (c *appGaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.score, c.ratings, c.installs, c.reviews, c.neg1h, c.neg7d, c.newest, c.up, c.age, c.topics7d} {
		ch <- d
	}
}

// Collect serves the last refresh and never touches the database: a
// database that cannot answer sets playwatch_app_gauges_up to 0, while every
// other metric of the process is still served.
func (c *appGaugeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	rows, ok, refreshed := c.rows, c.ok, c.refreshed
	c.mu.Unlock()
	up := 0.0
	if ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	if !refreshed.IsZero() {
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, c.now().Sub(refreshed).Seconds())
	}
	for _, r := range rows {
		app := []string{r.Package, r.Country, r.Lang}
		if r.Score != nil {
			ch <- prometheus.MustNewConstMetric(c.score, prometheus.GaugeValue, *r.Score, app...)
		}
		if r.Ratings != nil {
			ch <- prometheus.MustNewConstMetric(c.ratings, prometheus.GaugeValue, float64(*r.Ratings), app...)
		}
		if r.Installs != nil {
			ch <- prometheus.MustNewConstMetric(c.installs, prometheus.GaugeValue, float64(*r.Installs), app...)
		}
		for _, s := range []struct {
			label string
			n     int64
		}{{"POSITIVE", r.Reviews.Positive}, {"NEUTRAL", r.Reviews.Neutral}, {"NEGATIVE", r.Reviews.Negative}, {"none", r.Reviews.None}} {
			ch <- prometheus.MustNewConstMetric(c.reviews, prometheus.GaugeValue, float64(s.n), r.Package, r.Country, r.Lang, s.label)
		}
		ch <- prometheus.MustNewConstMetric(c.neg1h, prometheus.GaugeValue, float64(r.Negative1h), app...)
		ch <- prometheus.MustNewConstMetric(c.neg7d, prometheus.GaugeValue, float64(r.Negative7d), app...)
		for _, t := range reviewTopics {
			ch <- prometheus.MustNewConstMetric(c.topics7d, prometheus.GaugeValue, float64(r.Topics7d[t]), r.Package, r.Country, r.Lang, t)
		}
		if r.NewestReviewAt != nil {
			ch <- prometheus.MustNewConstMetric(c.newest, prometheus.GaugeValue, float64(r.NewestReviewAt.UnixMilli())/1000, app...)
		}
	}
}
