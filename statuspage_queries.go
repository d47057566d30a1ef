package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The status page's and the per-app gauges' SQL (docs/schema.md §Who writes
// and who reads). Every query walks an index by application: the UNIQUE
// (application_id, crawled_at) of app_stats, reviews (application_id, at)
// and (application_id, at) INCLUDE (sentiment), network_metrics (application_id,
// analyzed_at); statuspage_test.go checks their plans.

// statusDB runs the page's reads, each page in one read-only transaction:
// one snapshot for the whole page, and a page that cannot write. In `run`
// its pool is openReadPool's.
type statusDB struct{ pool *pgxpool.Pool }

// maxReadPoolConns bounds the read pool, whatever STATUS_PAGE_MAX_RENDERS
// says: the connections of a server stay within the budget of
// docs/design.md §Status page (past 15 pages drawn at once, the others wait
// for a connection).
const maxReadPoolConns = 16

// readPoolConns is the size of openReadPool's pool: one connection per page
// drawn at once and one for the gauges' background read, at most
// maxReadPoolConns.
func readPoolConns(maxRenders int) int { return min(maxRenders+1, maxReadPoolConns) }

// openReadPool opens the status page's own connections (docs/design.md
// §Status page): the pages, the per-app gauges and the registry API's GETs
// read on them, never on the pool of the scheduler lease, the consumer and
// the crawler, so that a page reloaded by many clients makes none of those
// wait. Every statement on them ends after statementTimeout
// (READ_STATEMENT_TIMEOUT).
func openReadPool(ctx context.Context, dsn string, statementTimeout time.Duration, maxRenders int) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("status page connections: %w", err)
	}
	pcfg.MaxConns = int32(readPoolConns(maxRenders))
	pcfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(statementTimeout.Milliseconds(), 10)
	// The reads are many small index lookups whose plans cost enough to be
	// compiled: JIT took about 1 s of the per-app gauges' 1.2 s read at
	// 500 apps, for nothing the lookups gain.
	pcfg.ConnConfig.RuntimeParams["jit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("status page connections: %w", err)
	}
	return pool, nil
}

// isStatementTimeout reports whether PostgreSQL ended a statement at
// statement_timeout (query_canceled; the page's own cancels, when its client
// leaves, are told apart by the request's context).
func isStatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

func (db statusDB) read(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("status page: begin read-only transaction: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only: nothing to keep
	return fn(tx)
}

// sentimentCounts are reviews by the sentiment job's label; None are those
// it has not scored (sentiment IS NULL).
type sentimentCounts struct{ Positive, Neutral, Negative, None int64 }

func (s sentimentCounts) Total() int64 { return s.Positive + s.Neutral + s.Negative + s.None }

// overviewApp is one row of the overview table.
type overviewApp struct {
	Package, Name   string
	Messaging       bool
	Score           *float64
	Ratings         *int64
	RealInstalls    *int64
	MinInstalls     *int64
	StatsAt         *time.Time // the newest stored listing: the stats path's last success
	BaseScore       *float64   // the score 7 days ago (or the oldest since, see BaseAt)
	BaseAt          *time.Time
	Reviews24h      sentimentCounts
	ReviewsSyncedAt *time.Time // the reviews path's last stored crawl
	Spark           []timeValue
	// The newest app_crawl_outcomes row of each path, of any storefront;
	// nil before the first crawl that recorded one.
	StatsOutcome, ReviewsOutcome *outcomeRow
}

// outcomeRow is a row of app_crawl_outcomes (docs/schema.md): how the last
// crawl of one path of an app in one storefront ended, whoever crawled it.
type outcomeRow struct {
	Path, Country, Lang string
	At                  time.Time
	Outcome             string
	HTTPStatus          *int32
	Error               string
}

// nullableOutcome scans the columns of a LEFT JOIN of app_crawl_outcomes.
type nullableOutcome struct {
	at                 *time.Time
	outcome, errorText *string
	httpStatus         *int32
}

func (n nullableOutcome) get(path string) *outcomeRow {
	if n.at == nil {
		return nil
	}
	o := &outcomeRow{Path: path, At: *n.at, Outcome: *n.outcome, HTTPStatus: n.httpStatus}
	if n.errorText != nil {
		o.Error = *n.errorText
	}
	return o
}

// sentimentCountsSQL counts reviews by the sentiment job's label, in the
// order of sentimentCounts' fields.
const sentimentCountsSQL = `count(*) FILTER (WHERE sentiment = 'POSITIVE') AS pos, count(*) FILTER (WHERE sentiment = 'NEUTRAL') AS neu,
		count(*) FILTER (WHERE sentiment = 'NEGATIVE') AS neg, count(*) FILTER (WHERE sentiment IS NULL) AS none`

const overviewSQL = `
SELECT a.package_name, coalesce(nullif(a.display_name, ''), a.package_name), a.is_messaging_app,
	s.score, s.ratings, s.real_installs, s.min_installs, s.crawled_at,
	b.score, b.crawled_at,
	r.pos, r.neu, r.neg, r.none,
	sy.synced, sp.days, sp.scores,
	os.at, os.outcome, os.http_status, os.error, orv.at, orv.outcome, orv.http_status, orv.error
FROM apps_registry_application a
LEFT JOIN LATERAL (
	SELECT score, ratings, real_installs, min_installs, crawled_at FROM app_stats
	WHERE application_id = a.id ORDER BY crawled_at DESC LIMIT 1) s ON true
-- The score of a week ago: the newest at or before it, else the oldest
-- since (an app younger than a week).
LEFT JOIN LATERAL (
	SELECT score, crawled_at FROM (
		(SELECT score, crawled_at, 0 AS o FROM app_stats
		 WHERE application_id = a.id AND crawled_at <= $1::timestamptz - interval '7 days' AND score IS NOT NULL
		 ORDER BY crawled_at DESC LIMIT 1)
		UNION ALL
		(SELECT score, crawled_at, 1 FROM app_stats
		 WHERE application_id = a.id AND crawled_at > $1::timestamptz - interval '7 days' AND score IS NOT NULL
		 ORDER BY crawled_at LIMIT 1)) w
	ORDER BY o LIMIT 1) b ON true
CROSS JOIN LATERAL (
	SELECT ` + sentimentCountsSQL + `
	FROM reviews WHERE application_id = a.id AND at > $1::timestamptz - interval '24 hours' AND at <= $1) r
-- Every reviews crawl rewrites the app's newest reviews, so their newest
-- last_synced_at is the last reviews crawl that was stored.
CROSS JOIN LATERAL (
	SELECT max(last_synced_at) AS synced FROM (
		SELECT last_synced_at FROM reviews WHERE application_id = a.id ORDER BY at DESC LIMIT 20) n) sy
CROSS JOIN LATERAL (
	SELECT array_agg(d ORDER BY d) AS days, array_agg(sc ORDER BY d) AS scores FROM (
		SELECT date_trunc('day', crawled_at, 'UTC') AS d, avg(score) AS sc FROM app_stats
		WHERE application_id = a.id AND crawled_at > $1::timestamptz - interval '30 days' AND score IS NOT NULL
		GROUP BY 1) q) sp
LEFT JOIN LATERAL (
	SELECT at, outcome, http_status, error FROM app_crawl_outcomes
	WHERE application_id = a.id AND path = 'stats' ORDER BY at DESC LIMIT 1) os ON true
LEFT JOIN LATERAL (
	SELECT at, outcome, http_status, error FROM app_crawl_outcomes
	WHERE application_id = a.id AND path = 'reviews' ORDER BY at DESC LIMIT 1) orv ON true
WHERE a.is_active
ORDER BY lower(coalesce(nullif(a.display_name, ''), a.package_name)), a.package_name`

func loadOverview(ctx context.Context, tx pgx.Tx, now time.Time) ([]overviewApp, error) {
	rows, err := tx.Query(ctx, overviewSQL, now)
	if err != nil {
		return nil, fmt.Errorf("status page: overview: %w", err)
	}
	defer rows.Close()
	var apps []overviewApp
	for rows.Next() {
		var a overviewApp
		var days []time.Time
		var scores []float64
		var so, ro nullableOutcome
		if err := rows.Scan(&a.Package, &a.Name, &a.Messaging, &a.Score, &a.Ratings, &a.RealInstalls, &a.MinInstalls, &a.StatsAt,
			&a.BaseScore, &a.BaseAt, &a.Reviews24h.Positive, &a.Reviews24h.Neutral, &a.Reviews24h.Negative, &a.Reviews24h.None,
			&a.ReviewsSyncedAt, &days, &scores,
			&so.at, &so.outcome, &so.httpStatus, &so.errorText, &ro.at, &ro.outcome, &ro.httpStatus, &ro.errorText); err != nil {
			return nil, fmt.Errorf("status page: overview: %w", err)
		}
		a.StatsOutcome, a.ReviewsOutcome = so.get("stats"), ro.get("reviews")
		for i := range days {
			a.Spark = append(a.Spark, timeValue{days[i], scores[i]})
		}
		apps = append(apps, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("status page: overview: %w", err)
	}
	return apps, nil
}

const deadLettersSQL = `SELECT count(*) FROM dead_letter_events WHERE occurred_at >= $1 AND discarded_at IS NULL`

func countDeadLetters(ctx context.Context, tx pgx.Tx, since time.Time) (int64, error) {
	var n int64
	if err := tx.QueryRow(ctx, deadLettersSQL, since).Scan(&n); err != nil {
		return 0, fmt.Errorf("status page: dead letters: %w", err)
	}
	return n, nil
}

// lastCrawlCycle is the newest crawl_cycles row (docs/schema.md): the leader
// writes it, so every instance's page shows the fleet's last cycle.
type lastCrawlCycle struct {
	ID         int64
	PlannedAt  time.Time
	FinishedAt *time.Time
	Apps       *int32 // NULL until all its jobs are published
}

const lastCrawlCycleSQL = `SELECT id, planned_at, finished_at, apps FROM crawl_cycles ORDER BY id DESC LIMIT 1`

// loadLastCrawlCycle is nil before the first cycle is planned.
func loadLastCrawlCycle(ctx context.Context, tx pgx.Tx) (*lastCrawlCycle, error) {
	var c lastCrawlCycle
	err := tx.QueryRow(ctx, lastCrawlCycleSQL).Scan(&c.ID, &c.PlannedAt, &c.FinishedAt, &c.Apps)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("status page: last crawl cycle: %w", err)
	}
	return &c, nil
}

// appDetail is everything the page of one app shows.
type appDetail struct {
	ID                 int64
	Package, Name      string
	Category           *string
	Messaging, Iranian bool
	Active             bool
	Latest             *statsSample
	Stats              []statsPoint // the last 90 days, oldest first
	ReviewDays         []sentimentDay
	ReviewsUntil       time.Time // the end of ReviewDays' 90 days: now, or the newest review's time if older
	Negative           []negativeReview
	Topics             []topicCount    // the last 7 days', most reviews first
	Releases           []releaseStat   // the last 180 days' versions, newest first
	Network            []networkSample // newest first
	Outcomes           []outcomeRow    // the last crawl of each path and storefront: stats first
}

// statsSample is the newest listing: the app page's facts and histogram.
type statsSample struct {
	At           time.Time
	Score        *float64
	Ratings      *int64
	RealInstalls *int64
	MinInstalls  *int64
	Version      *string
	Histogram    [5]*int64 // ratings_1 … ratings_5
	Developer    *string
}

// statsPoint is one listing of the rating and installs charts.
type statsPoint struct {
	At           time.Time
	Score        *float64
	RealInstalls *int64
	MinInstalls  *int64
}

type sentimentDay struct {
	Day    time.Time
	Counts sentimentCounts
}

type negativeReview struct {
	At        time.Time
	Score     *int16
	UserName  *string
	Content   *string
	Sentiment *string
	Version   *string
	Reply     *string
	RepliedAt *time.Time
}

type networkSample struct {
	Scenario        string
	At              time.Time
	RTT             *float64
	Retransmissions int32
	OutOfOrder      int32
	ZeroWindows     int32
	Resets          int32
	BytesTotal      int64
	Overhead        float64
	File            *string
}

var errStatusAppNotFound = errors.New("no such app")

// negativeLimit is how many of the newest negative reviews the app page lists.
const negativeLimit = 10

// The app page's queries; $1 is the app's id.
const (
	appRowSQL = `SELECT id, package_name, coalesce(nullif(display_name, ''), package_name), category,
		is_messaging_app, is_iranian_app, is_active FROM apps_registry_application WHERE package_name = $1`
	appLatestStatsSQL = `SELECT crawled_at, score, ratings, real_installs, min_installs, version,
		ratings_1, ratings_2, ratings_3, ratings_4, ratings_5, developer FROM app_stats WHERE application_id = $1
		ORDER BY crawled_at DESC LIMIT 1`
	appStatsSQL = `SELECT crawled_at, score, real_installs, min_installs FROM app_stats WHERE application_id = $1
		AND crawled_at > $2 AND crawled_at <= $3 ORDER BY crawled_at`
	appNewestReviewSQL = `SELECT max(at) FROM reviews WHERE application_id = $1`
	appReviewDaysSQL   = `SELECT date_trunc('day', at, 'UTC') AS d, ` + sentimentCountsSQL + `
		FROM reviews WHERE application_id = $1 AND at > $2 AND at <= $3 GROUP BY 1 ORDER BY 1`
	// Negative: what the sentiment job labelled so, and until it has scored
	// a review, one or two stars.
	appNegativeSQL = `SELECT at, score, user_name, content, sentiment, app_version, reply_content, replied_at FROM reviews
		WHERE application_id = $1 AND (sentiment = 'NEGATIVE' OR (sentiment IS NULL AND score <= 2))
		ORDER BY at DESC LIMIT $2`
	appNetworkSQL = `SELECT scenario, analyzed_at, rtt_handshake, retransmission_count, out_of_order_count,
		zero_window_count, tcp_reset_count, bytes_transferred_total, overhead_ratio, source_pcap_filename
		FROM network_metrics WHERE application_id = $1 ORDER BY analyzed_at DESC LIMIT 200`
	appOutcomesSQL = `SELECT path, country, lang, at, outcome, http_status, error FROM app_crawl_outcomes
		WHERE application_id = $1 ORDER BY path = 'reviews', country, lang`
)

func loadAppDetail(ctx context.Context, tx pgx.Tx, pkg string, now time.Time) (appDetail, error) {
	var d appDetail
	err := tx.QueryRow(ctx, appRowSQL, pkg).
		Scan(&d.ID, &d.Package, &d.Name, &d.Category, &d.Messaging, &d.Iranian, &d.Active)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, errStatusAppNotFound
	}
	if err != nil {
		return d, fmt.Errorf("status page: app %s: %w", pkg, err)
	}
	since := now.Add(-90 * 24 * time.Hour)

	var latest statsSample
	err = tx.QueryRow(ctx, appLatestStatsSQL, d.ID).Scan(&latest.At, &latest.Score, &latest.Ratings, &latest.RealInstalls,
		&latest.MinInstalls, &latest.Version, &latest.Histogram[0], &latest.Histogram[1], &latest.Histogram[2],
		&latest.Histogram[3], &latest.Histogram[4], &latest.Developer)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return d, fmt.Errorf("status page: latest stats of %s: %w", pkg, err)
	default:
		d.Latest = &latest
	}

	rows, err := tx.Query(ctx, appStatsSQL, d.ID, since, now)
	if err != nil {
		return d, fmt.Errorf("status page: stats of %s: %w", pkg, err)
	}
	for rows.Next() {
		var s statsPoint
		if err := rows.Scan(&s.At, &s.Score, &s.RealInstalls, &s.MinInstalls); err != nil {
			rows.Close()
			return d, fmt.Errorf("status page: stats of %s: %w", pkg, err)
		}
		d.Stats = append(d.Stats, s)
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("status page: stats of %s: %w", pkg, err)
	}

	// An app whose reviews all predate the 90 days (the store stopped
	// showing new ones, or a replayed recording) shows its last 90 days of
	// reviews rather than an empty chart; the page names the end date.
	var newest *time.Time
	if err := tx.QueryRow(ctx, appNewestReviewSQL, d.ID).Scan(&newest); err != nil {
		return d, fmt.Errorf("status page: newest review of %s: %w", pkg, err)
	}
	d.ReviewsUntil = now
	if newest != nil && newest.Before(since) {
		d.ReviewsUntil = *newest
	}
	rows, err = tx.Query(ctx, appReviewDaysSQL, d.ID, d.ReviewsUntil.Add(-90*24*time.Hour), d.ReviewsUntil)
	if err != nil {
		return d, fmt.Errorf("status page: reviews per day of %s: %w", pkg, err)
	}
	for rows.Next() {
		var s sentimentDay
		if err := rows.Scan(&s.Day, &s.Counts.Positive, &s.Counts.Neutral, &s.Counts.Negative, &s.Counts.None); err != nil {
			rows.Close()
			return d, fmt.Errorf("status page: reviews per day of %s: %w", pkg, err)
		}
		d.ReviewDays = append(d.ReviewDays, s)
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("status page: reviews per day of %s: %w", pkg, err)
	}

	rows, err = tx.Query(ctx, appNegativeSQL, d.ID, negativeLimit)
	if err != nil {
		return d, fmt.Errorf("status page: negative reviews of %s: %w", pkg, err)
	}
	for rows.Next() {
		var r negativeReview
		if err := rows.Scan(&r.At, &r.Score, &r.UserName, &r.Content, &r.Sentiment, &r.Version, &r.Reply, &r.RepliedAt); err != nil {
			rows.Close()
			return d, fmt.Errorf("status page: negative reviews of %s: %w", pkg, err)
		}
		d.Negative = append(d.Negative, r)
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("status page: negative reviews of %s: %w", pkg, err)
	}

	if d.Topics, err = loadAppTopics(ctx, tx, d.ID, now); err != nil {
		return d, err
	}
	if d.Releases, err = loadAppReleases(ctx, tx, d.ID, now); err != nil {
		return d, err
	}

	rows, err = tx.Query(ctx, appNetworkSQL, d.ID)
	if err != nil {
		return d, fmt.Errorf("status page: network metrics of %s: %w", pkg, err)
	}
	for rows.Next() {
		var n networkSample
		if err := rows.Scan(&n.Scenario, &n.At, &n.RTT, &n.Retransmissions, &n.OutOfOrder, &n.ZeroWindows, &n.Resets,
			&n.BytesTotal, &n.Overhead, &n.File); err != nil {
			rows.Close()
			return d, fmt.Errorf("status page: network metrics of %s: %w", pkg, err)
		}
		d.Network = append(d.Network, n)
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("status page: network metrics of %s: %w", pkg, err)
	}

	rows, err = tx.Query(ctx, appOutcomesSQL, d.ID)
	if err != nil {
		return d, fmt.Errorf("status page: crawl outcomes of %s: %w", pkg, err)
	}
	for rows.Next() {
		var o outcomeRow
		if err := rows.Scan(&o.Path, &o.Country, &o.Lang, &o.At, &o.Outcome, &o.HTTPStatus, &o.Error); err != nil {
			rows.Close()
			return d, fmt.Errorf("status page: crawl outcomes of %s: %w", pkg, err)
		}
		d.Outcomes = append(d.Outcomes, o)
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("status page: crawl outcomes of %s: %w", pkg, err)
	}
	return d, nil
}
