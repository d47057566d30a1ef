package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The overview's notifications card: what the notifier sent in 24 hours,
// what waits, what failed for good, and which destinations refuse.

// notifyCounts is what the card shows.
type notifyCounts struct {
	Sent24h, Pending, Failed int64
	Destinations             int64
	Broken                   []string // names of the broken destinations, by id
}

// notifyCountsSQL reads the outbox on its indexes, whatever its history:
// the sent rows of each rule and destination from the throttle's index (a
// probe per pair: both tables are small), the pending ones from the
// workers' queue. Failed rows have no index of their own: notifyFailedSQL
// reads the table, and there should be few. A digest is one message: the
// rows folded into it (digest_id set) are not counted.
const notifyCountsSQL = `SELECT
	(SELECT coalesce(sum(x.n), 0)::bigint FROM notify_rules r CROSS JOIN notify_destinations d,
		LATERAL (SELECT count(*) AS n FROM notifications
			WHERE rule_id = r.id AND destination_id = d.id AND status = 'sent' AND digest_id IS NULL AND sent_at >= $1) x),
	(SELECT count(*) FROM notifications WHERE status = 'pending' AND digest_id IS NULL),
	(SELECT count(*) FROM notify_destinations),
	coalesce((SELECT array_agg(name ORDER BY id) FROM notify_destinations WHERE status = 'broken'), '{}')`

const notifyFailedSQL = `SELECT count(*) FROM notifications WHERE status = 'failed' AND digest_id IS NULL`

func loadNotifyCounts(ctx context.Context, tx pgx.Tx, now time.Time) (notifyCounts, error) {
	var c notifyCounts
	if err := tx.QueryRow(ctx, notifyCountsSQL, now.Add(-24*time.Hour)).Scan(&c.Sent24h, &c.Pending, &c.Destinations, &c.Broken); err != nil {
		return c, fmt.Errorf("status page: notifications: %w", err)
	}
	if err := tx.QueryRow(ctx, notifyFailedSQL).Scan(&c.Failed); err != nil {
		return c, fmt.Errorf("status page: failed notifications: %w", err)
	}
	return c, nil
}

// notifyCard is red while a notification failed for good or a destination
// is broken; without destinations it says how to add one (host: where the
// page was asked for, the API's address too).
func notifyCard(c notifyCounts, host string) healthCard {
	card := healthCard{Title: "Notifications, 24 h", Value: groupDigits(c.Sent24h) + " sent", Class: "ok"}
	if c.Destinations == 0 {
		card.Value, card.Class = "no destinations", "unknown"
		card.Detail = `add one: curl -H "Authorization: Bearer $REGISTRY_TOKEN" -d '{"name": "team chat", "type": "slack", "url": "https://hooks.slack.com/services/…"}' http://` +
			host + `/api/v1/destinations, then a rule with POST /api/v1/rules`
		return card
	}
	card.Detail = fmt.Sprintf("%s pending, %s failed", groupDigits(c.Pending), groupDigits(c.Failed))
	if c.Failed > 0 {
		card.Class = "bad"
		card.Detail += " (playwatch notify list --status failed; notify retry --failed sends them again)"
	}
	if len(c.Broken) > 0 {
		card.Class = "bad"
		card.Detail += fmt.Sprintf("; %d broken destinations: %s (PATCH or test them once fixed)", len(c.Broken), strings.Join(shortList(c.Broken, 5), ", "))
	} else {
		card.Detail += "; no destination broken"
	}
	return card
}
