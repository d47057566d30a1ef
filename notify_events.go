package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// The event decider (README "Rules and events"): finds which events
// happened (new or edited reviews, rating drops, negative spikes, failing
// crawls, new versions) and, in the transaction that decides them, puts one
// outbox row per rule, destination and event key into notifications. Any
// number of servers may run it: the unique key (rule_id, destination_id,
// event_key) makes a repeated decision a no-op, and an advisory lock keeps
// two passes from doing the same work at once.

// notifyDecideLock is the pg_try_advisory_xact_lock key of a pass.
const notifyDecideLock = 0x706c61796e6f7469 // "playnoti"

// notifyCursorMargin is how far back a pass reads again behind its cursor:
// a transaction that started before the cursor and committed after the
// previous pass (a consumer batch, a sentiment batch) is not missed, and
// the two clocks (this server's, the database's) may differ this much.
const notifyCursorMargin = time.Minute

// notifyAlertsEvery spaces the alert evaluations (each reads every active
// app's stats, outcomes and a week of negative reviews): the alerts change
// with crawls, minutes apart.
const notifyAlertsEvery = 10 * time.Second

// notifyMaxBackoff caps the wait between failed passes.
const notifyMaxBackoff = 30 * time.Second

type notifyDeciderConfig struct {
	Interval      time.Duration // between passes
	SentimentWait time.Duration // NOTIFY_SENTIMENT_WAIT: how long a rule on sentiment or text_lang waits for the label
	PublicURL     string        // PUBLIC_URL: links.status_page; empty: none
	CrawlInterval time.Duration // CRAWL_INTERVAL: crawl_failing's "2 intervals"
	Clock         clock
	Locales       localeDefaults // PLAYSTORE_*: an app's storefront, as the scheduler picks it
}

func notifyDeciderConfigOf(cfg Config) notifyDeciderConfig {
	return notifyDeciderConfig{Interval: time.Second, SentimentWait: cfg.NotifySentimentWait, PublicURL: cfg.PublicURL,
		CrawlInterval: cfg.CrawlInterval, Clock: systemClock{}, Locales: cfg.Locales}
}

type notifyDecider struct {
	pool    *pgxpool.Pool
	cfg     notifyDeciderConfig
	logger  *slog.Logger
	events  *prometheus.CounterVec
	pass    prometheus.Histogram
	errors  prometheus.Counter
	alertAt time.Time // the last alert evaluation
	// badRules are the errors of the rules that could not be read, logged
	// once each.
	badRules map[string]bool
}

func newNotifyDecider(pool *pgxpool.Pool, cfg notifyDeciderConfig, reg prometheus.Registerer, logger *slog.Logger) *notifyDecider {
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	mk := metricMaker{reg}
	d := &notifyDecider{pool: pool, cfg: cfg, logger: logger, badRules: map[string]bool{},
		events: mk.counterVec("playwatch_notify_events_total", "Outbox rows the event decider inserted (one per rule, destination and event), by event.", "event"),
		pass:   mk.histogram("playwatch_notify_decide_seconds", "Time of one pass of the event decider (read, decide, insert, commit).", prometheus.ExponentialBuckets(0.001, 2, 15)),
		errors: mk.counter("playwatch_notify_decide_errors_total", "Passes of the event decider that failed (rolled back and retried with backoff)."),
	}
	for _, e := range []string{"review", "rating_drop", "negative_spike", "crawl_failing", "new_version"} {
		d.events.WithLabelValues(e)
	}
	return d
}

// Run decides every Interval until ctx ends. A failed pass is logged and
// retried with backoff; it never ends the role.
func (d *notifyDecider) Run(ctx context.Context) error {
	d.logger.Info("notify event decider started", "interval", d.cfg.Interval, "sentiment_wait", d.cfg.SentimentWait)
	failures := 0
	for ctx.Err() == nil {
		wait := d.cfg.Interval
		if _, err := d.RunOnce(ctx); err != nil && ctx.Err() == nil {
			failures++
			wait = min(d.cfg.Interval<<min(failures, 8), notifyMaxBackoff)
			d.logger.Error("notify event decider pass failed", "err", err, "retry_in", wait)
		} else {
			failures = 0
		}
		if err := sleepOn(ctx, d.cfg.Clock, wait); err != nil {
			break
		}
	}
	return nil
}

// outboxRow is one notifications row to insert.
type outboxRow struct {
	Rule, Destination int64
	Event, Key        string
	Payload           notifyPayload
	EventAt           time.Time
	SourceAt          *time.Time
}

// RunOnce is one pass in one transaction: it returns how many outbox rows
// it inserted; 0 without work when another server holds the pass.
func (d *notifyDecider) RunOnce(ctx context.Context) (int, error) {
	start := time.Now()
	n, err := d.runOnce(ctx)
	d.pass.Observe(time.Since(start).Seconds())
	if err != nil && ctx.Err() == nil {
		d.errors.Inc()
	}
	return n, err
}

func (d *notifyDecider) runOnce(ctx context.Context) (int, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("notify decide: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(notifyDecideLock)).Scan(&locked); err != nil {
		return 0, fmt.Errorf("notify decide: lock: %w", err)
	}
	if !locked {
		return 0, nil
	}
	rules, err := loadRules(ctx, tx, "", d.skipBadRule)
	if err != nil {
		return 0, err
	}
	now := d.cfg.Clock.Now()
	byEvent := map[string][]notifyRule{}
	for _, r := range rules {
		if len(r.Destinations) > 0 {
			byEvent[r.Event] = append(byEvent[r.Event], r)
		}
	}
	var out []outboxRow
	rows, err := d.decideReviews(ctx, tx, byEvent["review"], now)
	if err != nil {
		return 0, err
	}
	out = append(out, rows...)
	alerts := d.alertAt.IsZero() || now.Sub(d.alertAt) >= notifyAlertsEvery || now.Before(d.alertAt)
	if alerts {
		rows, err := d.decideAlerts(ctx, tx, byEvent, now)
		if err != nil {
			return 0, err
		}
		out = append(out, rows...)
	}
	counts, err := insertOutbox(ctx, tx, out)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("notify decide: commit: %w", err)
	}
	if alerts {
		d.alertAt = now
	}
	total := 0
	for e, n := range counts {
		d.events.WithLabelValues(e).Add(float64(n))
		total += n
	}
	return total, nil
}

// skipBadRule logs a rule that cannot be read, once, not every second.
func (d *notifyDecider) skipBadRule(err error) {
	if !d.badRules[err.Error()] {
		d.badRules[err.Error()] = true
		d.logger.Error("notify rule skipped: it cannot be read", "err", err)
	}
}

// insertOutbox inserts the rows not there yet (NOT EXISTS first, so that a
// row decided again does not use up an id) and counts them by event.
func insertOutbox(ctx context.Context, tx pgx.Tx, out []outboxRow) (map[string]int, error) {
	if len(out) == 0 {
		return nil, nil
	}
	rules := make([]int64, len(out))
	dests := make([]int64, len(out))
	events := make([]string, len(out))
	keys := make([]string, len(out))
	payloads := make([]string, len(out))
	eventAt := make([]time.Time, len(out))
	sourceAt := make([]*time.Time, len(out))
	for i, r := range out {
		b, err := json.Marshal(r.Payload)
		if err != nil {
			return nil, fmt.Errorf("notify decide: payload: %w", err)
		}
		rules[i], dests[i], events[i], keys[i], payloads[i] = r.Rule, r.Destination, r.Event, r.Key, string(b)
		eventAt[i], sourceAt[i] = r.EventAt, r.SourceAt
	}
	rows, err := tx.Query(ctx, `
INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, event_at, source_at)
SELECT u.rule_id, u.destination_id, u.event, u.event_key, u.payload::jsonb, u.event_at, u.source_at
FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::timestamptz[])
	AS u(rule_id, destination_id, event, event_key, payload, event_at, source_at)
WHERE EXISTS (SELECT 1 FROM notify_destinations d WHERE d.id = u.destination_id)
  AND NOT EXISTS (SELECT 1 FROM notifications n WHERE n.rule_id = u.rule_id AND n.destination_id = u.destination_id AND n.event_key = u.event_key)
ON CONFLICT (rule_id, destination_id, event_key) DO NOTHING
RETURNING event`, rules, dests, events, keys, payloads, eventAt, sourceAt)
	if err != nil {
		return nil, fmt.Errorf("notify decide: insert: %w", err)
	}
	counts := map[string]int{}
	var e string
	if _, err := pgx.ForEachRow(rows, []any{&e}, func() error { counts[e]++; return nil }); err != nil {
		return nil, fmt.Errorf("notify decide: insert: %w", err)
	}
	return counts, nil
}

// fanOut is one outbox row per destination of r.
func fanOut(r notifyRule, key string, p notifyPayload, eventAt time.Time, sourceAt *time.Time) []outboxRow {
	out := make([]outboxRow, 0, len(r.Destinations))
	for _, dst := range r.Destinations {
		out = append(out, outboxRow{Rule: r.ID, Destination: dst, Event: r.Event, Key: key, Payload: p, EventAt: eventAt, SourceAt: sourceAt})
	}
	return out
}

// ruleStart is the earliest time of an event the rule fires for.
func ruleStart(r notifyRule) time.Time { return r.CreatedAt.Add(-r.Backfill) }

// notifyApp is what an event says of its app.
type notifyApp struct {
	ID          int64
	PackageName string
	DisplayName string
	Loc         locale
}

func (d *notifyDecider) payloadOf(event string, a notifyApp) notifyPayload {
	p := notifyPayload{Event: event,
		App:   payloadApp{PackageName: a.PackageName, DisplayName: a.DisplayName, Country: a.Loc.Country, Lang: a.Loc.Lang},
		Links: payloadLinks{Play: playURL(a.PackageName, a.Loc.Lang, "")}}
	if d.cfg.PublicURL != "" {
		p.Links.StatusPage = strings.TrimRight(d.cfg.PublicURL, "/") + "/apps/" + url.PathEscape(a.PackageName)
	}
	return p
}

// playURL is the app's (or with reviewID, the review's) page on Google Play.
func playURL(pkg, lang, reviewID string) string {
	// id first, as Google Play writes it (url.Values would sort the keys).
	s := "https://play.google.com/store/apps/details?id=" + url.QueryEscape(pkg)
	if reviewID != "" {
		s += "&reviewId=" + url.QueryEscape(reviewID)
	}
	if lang != "" {
		s += "&hl=" + url.QueryEscape(lang)
	}
	return s
}

// storefrontKey is the part of an event key that names app and storefront.
func storefrontKey(a notifyApp) string {
	return a.PackageName + ":" + a.Loc.Country + ":" + a.Loc.Lang
}

var errNoCursor = errors.New("no cursor")

// readCursor is the named cursor, or errNoCursor.
func readCursor(ctx context.Context, tx pgx.Tx, name string) (time.Time, error) {
	var at time.Time
	err := tx.QueryRow(ctx, `SELECT at FROM notify_cursors WHERE name = $1`, name).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, errNoCursor
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("notify decide: cursor %s: %w", name, err)
	}
	return at, nil
}

func writeCursor(ctx context.Context, tx pgx.Tx, name string, at time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO notify_cursors (name, at) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET at = greatest(notify_cursors.at, EXCLUDED.at)`, name, at)
	if err != nil {
		return fmt.Errorf("notify decide: cursor %s: %w", name, err)
	}
	return nil
}
