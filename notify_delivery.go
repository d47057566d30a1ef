package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// The delivery workers of the notifier (README "Notifications",
// "Delivery"): they claim due rows of the notifications outbox with FOR
// UPDATE SKIP LOCKED, send each in the transaction that holds its lock and
// mark it sent in that transaction only once the receiver answered 2xx.
// Any number of workers on any number of servers share the outbox; a
// process killed between the receiver's 2xx and the commit leaves the row
// pending, so at most that one message is sent again (with the same
// X-Playwatch-Delivery id, which lets a receiver drop it).

// messageSender is what the workers need of the sender (notify_send*.go).
type messageSender interface {
	Send(ctx context.Context, d destination, deliveryID string, p notifyPayload) sendResult
}

type notifyDeliveryConfig struct {
	Workers int           // concurrent sends of this server
	GiveUp  time.Duration // NOTIFY_GIVE_UP: a message still unsent this long after it was decided (or retried) is failed
	Poll    time.Duration // wait when nothing is due
	Clock   clock
	// Backoff is the wait before the first retry; it doubles with each
	// attempt up to MaxBackoff, with jitter (half to all of it), and is at
	// least what the receiver asked for (Retry-After).
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Grace is how long in-flight sends may finish once shutdown starts;
	// past it they are abandoned and their rows stay pending.
	Grace time.Duration
}

// The workers' fixed parts; NOTIFY_GIVE_UP is the one setting.
const (
	notifyWorkers         = 4
	notifyPoll            = 500 * time.Millisecond
	notifyRetryBackoff    = 5 * time.Second
	notifyRetryMaxBackoff = 10 * time.Minute
	notifyGaugesEvery     = 15 * time.Second
	notifyThrottleNote    = "held back by max_per_hour"
)

func notifyDeliveryConfigOf(cfg Config) notifyDeliveryConfig {
	return notifyDeliveryConfig{Workers: notifyWorkers, GiveUp: cfg.NotifyGiveUp, Poll: notifyPoll, Clock: systemClock{},
		Backoff: notifyRetryBackoff, MaxBackoff: notifyRetryMaxBackoff, Grace: cfg.ShutdownTimeout / 2}
}

type notifyDelivery struct {
	pool    *pgxpool.Pool
	sender  messageSender
	cfg     notifyDeliveryConfig
	metrics *notifyMetrics
	logger  *slog.Logger
}

func newNotifyDelivery(pool *pgxpool.Pool, sender messageSender, cfg notifyDeliveryConfig, reg prometheus.Registerer, logger *slog.Logger) *notifyDelivery {
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	cfg.Workers = max(cfg.Workers, 1)
	return &notifyDelivery{pool: pool, sender: sender, cfg: cfg, metrics: newNotifyMetrics(reg), logger: logger}
}

// Run delivers until ctx ends, then gives the sends in flight Grace to
// finish. Database trouble is logged and retried; it never ends the role.
func (nd *notifyDelivery) Run(ctx context.Context) error {
	nd.logger.Info("notify delivery started", "workers", nd.cfg.Workers, "give_up", nd.cfg.GiveUp)
	// sendCtx outlives ctx by Grace: a send the receiver is answering is
	// finished and marked rather than cut off and repeated after a restart.
	sendCtx, cancelSends := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSends()
	stopGrace := context.AfterFunc(ctx, func() {
		c, stop := nd.cfg.Clock.NewTimer(nd.cfg.Grace)
		defer stop()
		select {
		case <-c:
		case <-sendCtx.Done():
		}
		cancelSends()
	})
	defer stopGrace()
	var wg sync.WaitGroup
	for range nd.cfg.Workers {
		wg.Go(func() { nd.work(ctx, sendCtx) })
	}
	wg.Go(func() { nd.housekeep(ctx) })
	wg.Wait()
	return nil
}

func (nd *notifyDelivery) work(ctx, sendCtx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		did, err := nd.deliverOne(ctx, sendCtx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			delay := retryDelay(failures, 10*time.Second)
			nd.logger.Warn("notify delivery cannot claim or mark a message; retrying", "attempt", failures, "retry_in", delay.Round(time.Millisecond), "err", err)
			_ = sleepOn(ctx, nd.cfg.Clock, delay)
		case !did:
			failures = 0
			_ = sleepOn(ctx, nd.cfg.Clock, nd.cfg.Poll)
		default:
			failures = 0
		}
	}
}

// housekeep gives up messages past GiveUp that no attempt reaches (those of
// a broken destination) and counts the gauges, at start and every
// notifyGaugesEvery.
func (nd *notifyDelivery) housekeep(ctx context.Context) {
	for ctx.Err() == nil {
		if err := nd.giveUpStale(ctx); err != nil && ctx.Err() == nil {
			nd.logger.Warn("notify delivery cannot give up stale messages", "err", err)
		}
		if err := nd.refreshGauges(ctx); err != nil && ctx.Err() == nil {
			nd.logger.Debug("notify delivery cannot count its gauges", "err", err)
		}
		_ = sleepOn(ctx, nd.cfg.Clock, notifyGaugesEvery)
	}
}

// claimedRow is a notifications row a worker claimed.
type claimedRow struct {
	ID, RuleID, DestinationID int64
	Event, EventKey           string
	Payload                   notifyPayload
	Attempts                  int
	LastError                 string
	EventAt                   time.Time
	GiveUpFrom                time.Time // created_at, or the last notify retry
	SourceAt                  *time.Time
	MaxPerHour                int
}

// notifyClaimSQL locks the next due message whose destination is not
// broken (a broken destination's rows wait, unclaimed, until the API sets
// it ok again). A row folded into a digest is sent by its digest.
const notifyClaimSQL = `SELECT n.id, n.rule_id, n.destination_id, n.event, n.event_key, n.payload, n.attempts, coalesce(n.last_error, ''),
	n.event_at, coalesce(n.retry_from, n.created_at), n.source_at, r.max_per_hour
FROM notifications n
JOIN notify_destinations d ON d.id = n.destination_id AND d.status = 'ok'
JOIN notify_rules r ON r.id = n.rule_id
WHERE n.status = 'pending' AND n.next_attempt_at <= $1 AND n.digest_id IS NULL
	AND n.destination_id <> ALL (coalesce($2::bigint[], '{}'))
ORDER BY n.next_attempt_at, n.id
LIMIT 1 FOR UPDATE OF n SKIP LOCKED`

// notifyBusyDestinations bounds how many destinations that other workers
// are sending to one claim passes over before it waits a poll.
const notifyBusyDestinations = 8

// deliverOne claims one due message and sends it (or holds it back, or
// folds what was held back into a digest). did: there was one.
func (nd *notifyDelivery) deliverOne(ctx, sendCtx context.Context) (did bool, err error) {
	var busy []int64
	for len(busy) < notifyBusyDestinations {
		did, other, err := nd.tryDeliver(ctx, sendCtx, busy)
		if other == 0 {
			return did, err
		}
		busy = append(busy, other)
	}
	return false, nil
}

// tryDeliver is one claim, past the destinations busy; busyNow: the claimed
// row's destination is another worker's (the row is left as it was).
func (nd *notifyDelivery) tryDeliver(ctx, sendCtx context.Context, busy []int64) (did bool, busyNow int64, err error) {
	tx, err := nd.pool.Begin(ctx)
	if err != nil {
		return false, 0, fmt.Errorf("begin: %w", err)
	}
	// The transaction ends on sendCtx: once claimed, a message is finished
	// (or abandoned) on its own time, not cut off by the shutdown's start.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	now := nd.cfg.Clock.Now()
	var r claimedRow
	var payload []byte
	err = tx.QueryRow(ctx, notifyClaimSQL, now, busy).Scan(&r.ID, &r.RuleID, &r.DestinationID, &r.Event, &r.EventKey, &payload, &r.Attempts,
		&r.LastError, &r.EventAt, &r.GiveUpFrom, &r.SourceAt, &r.MaxPerHour)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("claim: %w", err)
	}
	// One send at a time per destination, on all servers: a kill between
	// a receiver's 2xx and the mark repeats at most one message per
	// destination, messages go in order, and sends in flight cannot overrun
	// max_per_hour. The lock lasts until the transaction ends. Not waiting
	// for it leaves the row to the holder, which may fold it into a digest.
	var got bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('playwatch notify destination ' || $1::bigint, 0))`,
		r.DestinationID).Scan(&got); err != nil {
		return true, 0, fmt.Errorf("lock destination %d: %w", r.DestinationID, err)
	}
	if !got {
		return false, r.DestinationID, nil
	}
	if err := json.Unmarshal(payload, &r.Payload); err != nil {
		// A payload no sender can read will not get better: give it up.
		return true, 0, nd.finish(sendCtx, tx, r, "failed", now, fmt.Sprintf("payload: %v", err))
	}
	d, err := loadDestination(ctx, tx, r.DestinationID)
	if err != nil {
		return true, 0, err
	}
	if d.Status != "ok" {
		// Broken since the claim read it, by the worker that held its lock
		// then: nothing more is tried for it.
		return true, 0, nil
	}
	if r.MaxPerHour > 0 {
		held, err := nd.throttle(ctx, tx, r, now)
		if err != nil || held {
			return true, 0, err
		}
	}
	res := nd.sender.Send(sendCtx, d, notifyDeliveryID(r.ID), r.Payload)
	if res.Err != nil && sendCtx.Err() != nil {
		// Abandoned at shutdown: the row stays as it was, pending.
		nd.logger.Info("notify delivery abandoned a send at shutdown; it stays pending", "notification", r.ID)
		return true, 0, nil
	}
	return true, 0, nd.record(sendCtx, tx, r, d, res)
}

// notifyDeliveryID is a message's X-Playwatch-Delivery: the same on every
// attempt, since it is the row's.
func notifyDeliveryID(id int64) string { return fmt.Sprintf("pw-%d", id) }

// record writes what an attempt came to and commits.
func (nd *notifyDelivery) record(ctx context.Context, tx pgx.Tx, r claimedRow, d destination, res sendResult) error {
	now := nd.cfg.Clock.Now()
	if res.Err == nil {
		if _, err := tx.Exec(ctx, `UPDATE notifications SET status = 'sent', sent_at = $2, attempts = attempts + 1 WHERE id = $1`, r.ID, now); err != nil {
			return fmt.Errorf("mark %d sent: %w", r.ID, err)
		}
		var folded []claimedRow
		if r.Event == "digest" {
			var err error
			if folded, err = nd.markFolded(ctx, tx, r.ID, "sent", now, ""); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit %d sent: %w", r.ID, err)
		}
		nd.metrics.messages.WithLabelValues("sent").Inc()
		if r.Event == "digest" {
			nd.metrics.messages.WithLabelValues("folded").Add(float64(len(folded)))
			for _, f := range folded {
				nd.metrics.observeDelivered(f, now)
			}
		} else {
			nd.metrics.observeDelivered(r, now)
		}
		return nil
	}
	msg := truncate(res.Err.Error(), notifyErrorBytes-len("…"))
	log := nd.logger.With("notification", r.ID, "destination", d.ID, "type", d.Type, "attempt", r.Attempts+1, "http_status", res.HTTPStatus, "err", msg)
	if res.Permanent {
		// Nothing more is tried for the destination until it is PATCHed or
		// tested successfully: the claim skips a broken destination's rows.
		if _, err := tx.Exec(ctx, `UPDATE notify_destinations SET status = 'broken', last_error = $2, updated_at = now() WHERE id = $1`, d.ID, msg); err != nil {
			return fmt.Errorf("mark destination %d broken: %w", d.ID, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE notifications SET attempts = attempts + 1, last_error = $2 WHERE id = $1`, r.ID, msg); err != nil {
			return fmt.Errorf("record attempt of %d: %w", r.ID, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit destination %d broken: %w", d.ID, err)
		}
		log.Error("notify destination broken: the receiver refused for good; fix it with PATCH or test it")
		nd.metrics.messages.WithLabelValues("broken").Inc()
		// Shown at once, not at the next count.
		if err := nd.refreshGauges(ctx); err != nil {
			nd.logger.Debug("notify delivery cannot count its gauges", "err", err)
		}
		return nil
	}
	if now.Sub(r.GiveUpFrom) >= nd.cfg.GiveUp {
		log.Warn("notification failed: undelivered for NOTIFY_GIVE_UP")
		return nd.finish(ctx, tx, r, "failed", now, msg)
	}
	next := now.Add(nd.backoff(r.Attempts+1, res.RetryAfter))
	if _, err := tx.Exec(ctx, `UPDATE notifications SET attempts = attempts + 1, last_error = $2, next_attempt_at = $3 WHERE id = $1`, r.ID, msg, next); err != nil {
		return fmt.Errorf("record attempt of %d: %w", r.ID, err)
	}
	// The destination's other due messages wait behind this one, so that a
	// receiver that is down is not tried once per message and, back, gets
	// them roughly in order. Rows other workers hold are left to them.
	if _, err := tx.Exec(ctx, `UPDATE notifications SET next_attempt_at = $3 WHERE id IN (
	SELECT id FROM notifications WHERE status = 'pending' AND next_attempt_at < $3 AND destination_id = $1 AND id <> $2 AND digest_id IS NULL
	FOR UPDATE SKIP LOCKED)`, d.ID, r.ID, next); err != nil {
		return fmt.Errorf("postpone destination %d: %w", d.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit attempt of %d: %w", r.ID, err)
	}
	log.Warn("notification not delivered; retrying", "retry_at", next)
	nd.metrics.messages.WithLabelValues("retry").Inc()
	return nil
}

// backoff is the wait before attempt+1: Backoff doubled per attempt up to
// MaxBackoff, half to all of it (jitter), and at least retryAfter.
func (nd *notifyDelivery) backoff(attempt int, retryAfter time.Duration) time.Duration {
	d := nd.cfg.MaxBackoff
	if attempt < 30 {
		d = min(nd.cfg.Backoff<<(attempt-1), nd.cfg.MaxBackoff)
	}
	d = d/2 + rand.N(d/2+1)
	return max(d, retryAfter)
}

// finish ends a message for good (failed) with its error, and commits.
func (nd *notifyDelivery) finish(ctx context.Context, tx pgx.Tx, r claimedRow, status string, now time.Time, msg string) error {
	if _, err := tx.Exec(ctx, `UPDATE notifications SET status = $2, attempts = attempts + 1, last_error = $3 WHERE id = $1`, r.ID, status, msg); err != nil {
		return fmt.Errorf("mark %d %s: %w", r.ID, status, err)
	}
	folded, err := nd.markFolded(ctx, tx, r.ID, status, now, msg)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit %d %s: %w", r.ID, status, err)
	}
	nd.metrics.messages.WithLabelValues(status).Add(float64(1 + len(folded)))
	return nil
}

// markFolded gives the rows folded into digest its fate, and returns them.
func (nd *notifyDelivery) markFolded(ctx context.Context, tx pgx.Tx, digest int64, status string, now time.Time, msg string) ([]claimedRow, error) {
	rows, err := tx.Query(ctx, `UPDATE notifications SET status = $2::text,
	sent_at = CASE WHEN $2::text = 'sent' THEN $3::timestamptz END, last_error = coalesce(nullif($4::text, ''), last_error)
WHERE digest_id = $1 AND status = 'pending' RETURNING id, event, event_at, source_at`, digest, status, now, msg)
	if err != nil {
		return nil, fmt.Errorf("mark the messages of digest %d %s: %w", digest, status, err)
	}
	folded, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimedRow, error) {
		var f claimedRow
		return f, row.Scan(&f.ID, &f.Event, &f.EventAt, &f.SourceAt)
	})
	if err != nil {
		return nil, fmt.Errorf("mark the messages of digest %d %s: %w", digest, status, err)
	}
	return folded, nil
}

// throttle applies the rule's max_per_hour to the claimed message r: it
// counts the rule's messages sent to the destination over the last hour
// (a digest is one, like any message; the messages it stands for are not
// counted). Past the limit r and the pair's other due messages wait until
// the oldest of them leaves the hour. Within it, everything of the pair that
// was held back, of every app, goes out as one digest, itself counted when
// it is sent; held: r is not to be sent now (it waits or was folded), and
// tx is committed. The caller holds the destination's lock: no other send
// to it is in flight.
func (nd *notifyDelivery) throttle(ctx context.Context, tx pgx.Tx, r claimedRow, now time.Time) (held bool, err error) {
	var sent int
	var oldest *time.Time
	if err := tx.QueryRow(ctx, `SELECT count(*), min(sent_at) FROM notifications
WHERE rule_id = $1 AND destination_id = $2 AND status = 'sent' AND sent_at > $3 AND digest_id IS NULL`,
		r.RuleID, r.DestinationID, now.Add(-time.Hour)).Scan(&sent, &oldest); err != nil {
		return false, fmt.Errorf("count the hour of rule %d: %w", r.RuleID, err)
	}
	if sent >= r.MaxPerHour {
		// Every message of the pair that is due before then waits with r.
		until := oldest.Add(time.Hour)
		if _, err := tx.Exec(ctx, `UPDATE notifications SET next_attempt_at = $4, last_error = $5 WHERE id = $3 OR id IN (
	SELECT id FROM notifications WHERE status = 'pending' AND next_attempt_at < $4 AND rule_id = $1 AND destination_id = $2 AND digest_id IS NULL
	FOR UPDATE SKIP LOCKED)`, r.RuleID, r.DestinationID, r.ID, until, notifyThrottleNote); err != nil {
			return true, fmt.Errorf("hold back rule %d: %w", r.RuleID, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return true, fmt.Errorf("commit hold back of rule %d: %w", r.RuleID, err)
		}
		nd.metrics.messages.WithLabelValues("throttled").Inc()
		return true, nil
	}
	if r.LastError != notifyThrottleNote || r.Event == "digest" {
		return false, nil // nothing was held back before r, or r is a digest (held itself)
	}
	// The hour allows one more: every held-back message of the pair that is
	// due goes out as one digest. A lone one goes as it is. It waits for
	// rows other workers hold: only for the moment it takes them to find the
	// pair's lock taken and let go.
	rows, err := tx.Query(ctx, `SELECT id, event_at, coalesce(payload->'app', '{}') FROM notifications
WHERE status = 'pending' AND next_attempt_at <= $3 AND rule_id = $1 AND destination_id = $2 AND digest_id IS NULL AND id <> $4
	AND last_error = $5 AND event <> 'digest'
ORDER BY id FOR UPDATE`, r.RuleID, r.DestinationID, now, r.ID, notifyThrottleNote)
	if err != nil {
		return false, fmt.Errorf("collect the digest of rule %d: %w", r.RuleID, err)
	}
	type heldRow struct {
		id  int64
		at  time.Time
		app payloadApp
	}
	others, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (heldRow, error) {
		var h heldRow
		return h, row.Scan(&h.id, &h.at, &h.app)
	})
	if err != nil {
		return false, fmt.Errorf("collect the digest of rule %d: %w", r.RuleID, err)
	}
	if len(others) == 0 {
		return false, nil
	}
	ids := []int64{r.ID}
	first, eventAt := r.ID, r.EventAt
	apps := []payloadDigestApp{{PackageName: r.Payload.App.PackageName, DisplayName: r.Payload.App.DisplayName, Count: 1}}
	for _, h := range others {
		ids = append(ids, h.id)
		first = min(first, h.id)
		if h.at.Before(eventAt) {
			eventAt = h.at
		}
		if i := slices.IndexFunc(apps, func(a payloadDigestApp) bool { return a.PackageName == h.app.PackageName }); i >= 0 {
			apps[i].Count++
		} else {
			apps = append(apps, payloadDigestApp{PackageName: h.app.PackageName, DisplayName: h.app.DisplayName, Count: 1})
		}
	}
	p := notifyPayload{Event: "digest", Digest: &payloadDigest{Count: len(ids), Of: r.Event, Apps: apps}}
	if len(apps) == 1 {
		p.App = r.Payload.App
		p.Links = payloadLinks{Play: playURL(r.Payload.App.PackageName, r.Payload.App.Lang, ""), StatusPage: r.Payload.Links.StatusPage}
	} else if base, _, ok := strings.Cut(r.Payload.Links.StatusPage, "/apps/"); ok {
		p.Links.StatusPage = base + "/" // the overview: several apps
	}
	body, err := json.Marshal(p)
	if err != nil {
		return false, fmt.Errorf("digest payload: %w", err)
	}
	// The key is the first folded row's: a row is folded once, so the
	// digest is unique, and the API shows what it stands for.
	var digest int64
	if err := tx.QueryRow(ctx, `INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, next_attempt_at, event_at)
VALUES ($1, $2, 'digest', $3, $4, $5, $6) RETURNING id`, r.RuleID, r.DestinationID, fmt.Sprintf("digest:%d", first), body, now, eventAt).Scan(&digest); err != nil {
		return false, fmt.Errorf("insert the digest of rule %d: %w", r.RuleID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE notifications SET digest_id = $1 WHERE id = ANY($2)`, digest, ids); err != nil {
		return false, fmt.Errorf("fold into digest %d: %w", digest, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit digest %d: %w", digest, err)
	}
	nd.logger.Info("notify digest made of messages held back by max_per_hour", "rule", r.RuleID, "destination", r.DestinationID, "digest", digest, "count", len(ids), "apps", len(apps))
	return true, nil
}

// giveUpStale fails the messages that waited GiveUp without an attempt
// ending them (a broken destination's); a digest's rows go with their digest.
func (nd *notifyDelivery) giveUpStale(ctx context.Context) error {
	var n int64
	err := nd.pool.QueryRow(ctx, `WITH gone AS (
	UPDATE notifications SET status = 'failed', last_error = coalesce(last_error, 'not delivered within NOTIFY_GIVE_UP')
	WHERE id IN (SELECT id FROM notifications WHERE status = 'pending' AND coalesce(retry_from, created_at) <= $1 AND digest_id IS NULL FOR UPDATE SKIP LOCKED)
	RETURNING id), folded AS (
	UPDATE notifications SET status = 'failed', last_error = coalesce(last_error, 'not delivered within NOTIFY_GIVE_UP')
	WHERE status = 'pending' AND digest_id IN (SELECT id FROM gone) RETURNING id)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM folded)`, nd.cfg.Clock.Now().Add(-nd.cfg.GiveUp)).Scan(&n)
	if err != nil {
		return fmt.Errorf("give up stale messages: %w", err)
	}
	if n > 0 {
		nd.metrics.messages.WithLabelValues("failed").Add(float64(n))
		nd.logger.Warn("notifications failed: undelivered for NOTIFY_GIVE_UP", "count", n)
	}
	return nil
}

// refreshGauges counts pending (the due index) and failed messages and the
// broken destinations; a digest is one message, the rows folded into it none.
func (nd *notifyDelivery) refreshGauges(ctx context.Context) error {
	var pending, failed, broken int64
	if err := nd.pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM notifications WHERE status = 'pending' AND digest_id IS NULL),
	(SELECT count(*) FROM notifications WHERE status = 'failed' AND digest_id IS NULL),
	(SELECT count(*) FROM notify_destinations WHERE status = 'broken')`).Scan(&pending, &failed, &broken); err != nil {
		return fmt.Errorf("count notifications: %w", err)
	}
	nd.metrics.pending.Set(float64(pending))
	nd.metrics.failed.Set(float64(failed))
	nd.metrics.broken.Set(float64(broken))
	return nil
}

type notifyMetrics struct {
	delivery  prometheus.Histogram
	reviewAge prometheus.Histogram
	messages  *prometheus.CounterVec
	pending   prometheus.Gauge
	failed    prometheus.Gauge
	broken    prometheus.Gauge
}

// notifyMessageStatuses are the values of playwatch_notify_messages_total's
// status label (README "Delivery").
var notifyMessageStatuses = []string{"sent", "retry", "broken", "failed", "throttled", "folded"}

func newNotifyMetrics(reg prometheus.Registerer) *notifyMetrics {
	mk := metricMaker{reg}
	m := &notifyMetrics{
		delivery:  mk.histogram("playwatch_notify_delivery_seconds", "From an event's storing (notifications.event_at) to the receiver's 2xx, per message (each message a digest stands for counts).", prometheus.ExponentialBuckets(0.05, 2, 18)),
		reviewAge: mk.histogram("playwatch_notify_review_age_seconds", "From a review's time on the store to the receiver's 2xx, per review message.", prometheus.ExponentialBuckets(1, 2, 20)),
		messages:  mk.counterVec("playwatch_notify_messages_total", "Notification outcomes: sent (a receiver's 2xx; a digest is one), retry (an attempt failed, retried later), broken (refused for good: the destination is broken), failed (given up after NOTIFY_GIVE_UP), throttled (held back by max_per_hour), folded (sent inside a digest).", "status"),
		pending:   mk.gauge("playwatch_notify_pending", "Notifications not yet delivered (counted every 15s)."),
		failed:    mk.gauge("playwatch_notify_failed", "Notifications given up (status failed; counted every 15s)."),
		broken:    mk.gauge("playwatch_notify_destinations_broken", "Destinations whose receiver refused for good, not tried until PATCHed or tested (counted every 15s)."),
	}
	for _, s := range notifyMessageStatuses {
		m.messages.WithLabelValues(s)
	}
	return m
}

func (m *notifyMetrics) observeDelivered(r claimedRow, at time.Time) {
	m.delivery.Observe(max(at.Sub(r.EventAt).Seconds(), 0))
	if r.Event == "review" && r.SourceAt != nil {
		m.reviewAge.Observe(max(at.Sub(*r.SourceAt).Seconds(), 0))
	}
}
