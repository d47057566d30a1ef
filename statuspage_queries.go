package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
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

// overviewApp is one row of the overview table: an app and its
// storefronts, the first storefront first.
type overviewApp struct {
	Package, Name string
	Messaging     bool
	Storefronts   []overviewStorefront
}

// overviewStorefront is what the overview shows of one storefront of an app.
type overviewStorefront struct {
	Front           locale
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
	// The app_crawl_outcomes row of each path in this storefront; nil
	// before the first crawl that recorded one.
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

// overviewSQL is one row per active app and storefront (sf, see
// appStorefrontsSQL), the app's first storefront first. Every lateral reads
// one storefront through an index led by (application_id, country, lang):
// app_stats' unique key, the rollups (migration 17: the last 24 hours'
// reviews, the daily mean scores), review_storefronts and the key of
// app_crawl_outcomes.
const overviewSQL = `
SELECT a.package_name, coalesce(nullif(a.display_name, ''), a.package_name), a.is_messaging_app, sf.country, sf.lang,
	s.score, s.ratings, s.real_installs, s.min_installs, s.crawled_at,
	b.score, b.crawled_at,
	r.pos, r.neu, r.neg, r.none,
	greatest(sy.synced, sq.synced), sp.days, sp.scores,
	os.at, os.outcome, os.http_status, os.error, orv.at, orv.outcome, orv.http_status, orv.error
FROM apps_registry_application a
` + appStorefrontsSQL + `
LEFT JOIN LATERAL (
	SELECT score, ratings, real_installs, min_installs, crawled_at FROM app_stats
	WHERE application_id = a.id AND country = sf.country AND lang = sf.lang ORDER BY crawled_at DESC LIMIT 1) s ON true
-- The score of a week ago: the newest at or before it, else the oldest
-- since (an app younger than a week).
LEFT JOIN LATERAL (
	SELECT score, crawled_at FROM (
		(SELECT score, crawled_at, 0 AS o FROM app_stats
		 WHERE application_id = a.id AND country = sf.country AND lang = sf.lang
		   AND crawled_at <= $1::timestamptz - interval '7 days' AND score IS NOT NULL
		 ORDER BY crawled_at DESC LIMIT 1)
		UNION ALL
		(SELECT score, crawled_at, 1 FROM app_stats
		 WHERE application_id = a.id AND country = sf.country AND lang = sf.lang
		   AND crawled_at > $1::timestamptz - interval '7 days' AND score IS NOT NULL
		 ORDER BY crawled_at LIMIT 1)) w
	ORDER BY o LIMIT 1) b ON true
CROSS JOIN LATERAL (
	SELECT ` + rollupSentimentSQL + `
	FROM ` + rollupLast24hSQL + `) r
-- Every reviews crawl rewrites the storefront's newest reviews, so their
-- newest last_synced_at is the last reviews crawl that was stored: the 20
-- newest of the last 7 days (a walk of a week's reviews at most), and the
-- 20 first seen last for a storefront quiet for longer.
CROSS JOIN LATERAL (
	SELECT max(last_synced_at) AS synced FROM (
		SELECT r.last_synced_at FROM reviews r
		WHERE r.application_id = a.id AND r.at > $1::timestamptz - interval '7 days'
		  AND EXISTS (SELECT 1 FROM review_storefronts f WHERE f.review_id = r.id AND f.country = sf.country AND f.lang = sf.lang)
		ORDER BY r.at DESC LIMIT 20) n) sy
CROSS JOIN LATERAL (
	SELECT max(r.last_synced_at) AS synced FROM (
		SELECT review_id FROM review_storefronts
		WHERE application_id = a.id AND country = sf.country AND lang = sf.lang ORDER BY first_seen_at DESC LIMIT 20) n
	JOIN reviews r ON r.id = n.review_id) sq
-- The sparkline: each day's mean score, from the daily listings rollup.
CROSS JOIN LATERAL (
	SELECT array_agg(day ORDER BY day) AS days, array_agg(score_sum / score_n ORDER BY day) AS scores FROM app_stats_rollup_daily
	WHERE application_id = a.id AND country = sf.country AND lang = sf.lang
	  AND day > date_trunc('day', $1::timestamptz - interval '30 days', 'UTC') AND day <= $1 AND score_n > 0) sp
LEFT JOIN LATERAL (
	SELECT at, outcome, http_status, error FROM app_crawl_outcomes
	WHERE application_id = a.id AND country = sf.country AND lang = sf.lang AND path = 'stats') os ON true
LEFT JOIN LATERAL (
	SELECT at, outcome, http_status, error FROM app_crawl_outcomes
	WHERE application_id = a.id AND country = sf.country AND lang = sf.lang AND path = 'reviews') orv ON true
WHERE a.is_active
ORDER BY lower(coalesce(nullif(a.display_name, ''), a.package_name)), a.package_name, sf.position`

// loadOverview is the active apps, each with its storefronts in order.
func loadOverview(ctx context.Context, tx pgx.Tx, now time.Time, locales localeDefaults) ([]overviewApp, error) {
	type appFront struct {
		app   overviewApp
		front overviewStorefront
	}
	rows, err := queryRows(ctx, tx, "overview", func(row pgx.CollectableRow, r *appFront) error {
		a, f := &r.app, &r.front
		var days []time.Time
		var scores []float64
		var so, ro nullableOutcome
		if err := row.Scan(&a.Package, &a.Name, &a.Messaging, &f.Front.Country, &f.Front.Lang,
			&f.Score, &f.Ratings, &f.RealInstalls, &f.MinInstalls, &f.StatsAt,
			&f.BaseScore, &f.BaseAt, &f.Reviews24h.Positive, &f.Reviews24h.Neutral, &f.Reviews24h.Negative, &f.Reviews24h.None,
			&f.ReviewsSyncedAt, &days, &scores,
			&so.at, &so.outcome, &so.httpStatus, &so.errorText, &ro.at, &ro.outcome, &ro.httpStatus, &ro.errorText); err != nil {
			return err
		}
		f.StatsOutcome, f.ReviewsOutcome = so.get("stats"), ro.get("reviews")
		for i := range days {
			f.Spark = append(f.Spark, timeValue{days[i], scores[i]})
		}
		return nil
	}, overviewSQL, append([]any{now}, storefrontArgs(locales)...)...)
	if err != nil {
		return nil, err
	}
	var apps []overviewApp
	for _, r := range rows {
		if n := len(apps); n > 0 && apps[n-1].Package == r.app.Package {
			apps[n-1].Storefronts = append(apps[n-1].Storefronts, r.front)
			continue
		}
		r.app.Storefronts = []overviewStorefront{r.front}
		apps = append(apps, r.app)
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
	Storefronts        []locale            // the app's, the first the default of the page
	Front              locale              // the storefront the page shows
	Compare            []storefrontCompare // the newest listing of each storefront, with two or more
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

// The app page's queries; $1 is the app's id, $2 and $3 the country and
// lang of the storefront shown.
const (
	appRowSQL = `SELECT id, package_name, coalesce(nullif(display_name, ''), package_name), category,
		is_messaging_app, is_iranian_app, is_active FROM apps_registry_application WHERE package_name = $1`
	appLatestStatsSQL = `SELECT crawled_at, score, ratings, real_installs, min_installs, version,
		ratings_1, ratings_2, ratings_3, ratings_4, ratings_5, developer FROM app_stats
		WHERE application_id = $1 AND country = $2 AND lang = $3 ORDER BY crawled_at DESC LIMIT 1`
	appStatsSQL = `SELECT crawled_at, score, real_installs, min_installs FROM app_stats
		WHERE application_id = $1 AND country = $2 AND lang = $3 AND crawled_at > $4 AND crawled_at <= $5 ORDER BY crawled_at`
	// The newest review's hour and the reviews per day read the hourly
	// rollup (statuspage_rollups.go): the 90 days' buckets, not every review.
	appNewestReviewSQL = `SELECT max(hour) + interval '1 hour' FROM review_rollup_hourly
		WHERE application_id = $1 AND country = $2 AND lang = $3 AND reviews > 0`
	appReviewDaysSQL = `SELECT date_trunc('day', hour, 'UTC') AS d, ` + rollupSentimentSQL + `
		FROM review_rollup_hourly WHERE application_id = $1 AND country = $2 AND lang = $3 AND hour > $4 AND hour <= $5
		GROUP BY 1 ORDER BY 1`
	// Negative: what the sentiment job labelled so, and until it has scored
	// a review, one or two stars; of the reviews seen in the storefront
	// (review_storefronts' key) in the 90 days of the reviews chart ($4),
	// so that a storefront without one walks 90 days, not the history.
	appNegativeSQL = `SELECT r.at, r.score, r.user_name, r.content, r.sentiment, r.app_version, r.reply_content, r.replied_at
		FROM reviews r WHERE r.application_id = $1 AND r.at > $4 AND (r.sentiment = 'NEGATIVE' OR (r.sentiment IS NULL AND r.score <= 2))
		AND EXISTS (SELECT 1 FROM review_storefronts f WHERE f.review_id = r.id AND f.country = $2 AND f.lang = $3)
		ORDER BY r.at DESC LIMIT $5`
	appNetworkSQL = `SELECT scenario, analyzed_at, rtt_handshake, retransmission_count, out_of_order_count,
		zero_window_count, tcp_reset_count, bytes_transferred_total, overhead_ratio, source_pcap_filename
		FROM network_metrics WHERE application_id = $1 ORDER BY analyzed_at DESC LIMIT 200`
	appOutcomesSQL = `SELECT path, country, lang, at, outcome, http_status, error FROM app_crawl_outcomes
		WHERE application_id = $1 ORDER BY path = 'reviews', country, lang`
)

// storefrontError is an app page asked for a storefront it cannot show:
// 400 for a value that is not COUNTRY-LANG, 404 for one the app does not
// have. Its page names the app's storefronts.
type storefrontError struct {
	Code    int
	Message string
}

func (e *storefrontError) Error() string { return e.Message }

// pickStorefront is the storefront ?storefront= names, or the first.
func pickStorefront(fronts []locale, param string, given bool) (locale, error) {
	if !given {
		return fronts[0], nil
	}
	have := "this app has " + storefrontNames(fronts) + " (?storefront=" + storefrontParam(fronts[0]) + ")"
	l, ok := parseStorefrontParam(param)
	if !ok {
		return locale{}, &storefrontError{http.StatusBadRequest, "storefront must be COUNTRY-LANG, such as us-en; " + have + "."}
	}
	if !slices.Contains(fronts, l) {
		return locale{}, &storefrontError{http.StatusNotFound, "No storefront " + storefrontLabel(l) + ": " + have + "."}
	}
	return l, nil
}

// loadAppDetail reads the app page of pkg in the storefront the
// ?storefront= value names (given false: the first); a *storefrontError
// when it names none of the app's.
func loadAppDetail(ctx context.Context, tx pgx.Tx, pkg string, now time.Time, locales localeDefaults, storefront string, given bool) (appDetail, error) {
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
	if d.Storefronts, err = loadAppStorefronts(ctx, tx, d.ID, locales); err != nil {
		return d, err
	}
	if d.Front, err = pickStorefront(d.Storefronts, storefront, given); err != nil {
		return d, err
	}
	if len(d.Storefronts) > 1 {
		if d.Compare, err = loadStorefrontCompare(ctx, tx, d.ID, d.Storefronts); err != nil {
			return d, err
		}
	}
	country, lang := d.Front.Country, d.Front.Lang

	var latest statsSample
	err = tx.QueryRow(ctx, appLatestStatsSQL, d.ID, country, lang).Scan(&latest.At, &latest.Score, &latest.Ratings, &latest.RealInstalls,
		&latest.MinInstalls, &latest.Version, &latest.Histogram[0], &latest.Histogram[1], &latest.Histogram[2],
		&latest.Histogram[3], &latest.Histogram[4], &latest.Developer)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return d, fmt.Errorf("status page: latest stats of %s: %w", pkg, err)
	default:
		d.Latest = &latest
	}

	if d.Stats, err = queryRows(ctx, tx, "stats of "+pkg, func(rows pgx.CollectableRow, s *statsPoint) error {
		return rows.Scan(&s.At, &s.Score, &s.RealInstalls, &s.MinInstalls)
	}, appStatsSQL, d.ID, country, lang, since, now); err != nil {
		return d, err
	}

	// An app whose reviews all predate the 90 days (the store stopped
	// showing new ones, or a replayed recording) shows its last 90 days of
	// reviews rather than an empty chart; the page names the end date.
	var newest *time.Time
	if err := tx.QueryRow(ctx, appNewestReviewSQL, d.ID, country, lang).Scan(&newest); err != nil {
		return d, fmt.Errorf("status page: newest review of %s: %w", pkg, err)
	}
	d.ReviewsUntil = now
	if newest != nil && newest.Before(since) {
		d.ReviewsUntil = *newest
	}
	if d.ReviewDays, err = queryRows(ctx, tx, "reviews per day of "+pkg, func(rows pgx.CollectableRow, s *sentimentDay) error {
		return rows.Scan(&s.Day, &s.Counts.Positive, &s.Counts.Neutral, &s.Counts.Negative, &s.Counts.None)
	}, appReviewDaysSQL, d.ID, country, lang, d.ReviewsUntil.Add(-90*24*time.Hour), d.ReviewsUntil); err != nil {
		return d, err
	}

	if d.Negative, err = queryRows(ctx, tx, "negative reviews of "+pkg, func(rows pgx.CollectableRow, r *negativeReview) error {
		return rows.Scan(&r.At, &r.Score, &r.UserName, &r.Content, &r.Sentiment, &r.Version, &r.Reply, &r.RepliedAt)
	}, appNegativeSQL, d.ID, country, lang, d.ReviewsUntil.Add(-90*24*time.Hour), negativeLimit); err != nil {
		return d, err
	}

	if d.Topics, err = loadAppTopics(ctx, tx, d.ID, d.Front, now); err != nil {
		return d, err
	}
	if d.Releases, err = loadAppReleases(ctx, tx, d.ID, d.Front, now); err != nil {
		return d, err
	}

	if d.Network, err = queryRows(ctx, tx, "network metrics of "+pkg, func(rows pgx.CollectableRow, n *networkSample) error {
		return rows.Scan(&n.Scenario, &n.At, &n.RTT, &n.Retransmissions, &n.OutOfOrder, &n.ZeroWindows, &n.Resets,
			&n.BytesTotal, &n.Overhead, &n.File)
	}, appNetworkSQL, d.ID); err != nil {
		return d, err
	}

	if d.Outcomes, err = queryRows(ctx, tx, "crawl outcomes of "+pkg, func(rows pgx.CollectableRow, o *outcomeRow) error {
		return rows.Scan(&o.Path, &o.Country, &o.Lang, &o.At, &o.Outcome, &o.HTTPStatus, &o.Error)
	}, appOutcomesSQL, d.ID); err != nil {
		return d, err
	}
	return d, nil
}
