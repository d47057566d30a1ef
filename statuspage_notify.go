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

// notifyCountsSQL: pending and sent rows are counted on the partial
// indexes of migration 12; failed ones should be few.
const notifyCountsSQL = `SELECT
	(SELECT count(*) FROM notifications WHERE status = 'sent' AND sent_at >= $1),
	(SELECT count(*) FROM notifications WHERE status = 'pending'),
	(SELECT count(*) FROM notifications WHERE status = 'failed'),
	(SELECT count(*) FROM notify_destinations),
	coalesce((SELECT array_agg(name ORDER BY id) FROM notify_destinations WHERE status = 'broken'), '{}')`

func loadNotifyCounts(ctx context.Context, tx pgx.Tx, now time.Time) (notifyCounts, error) {
	var c notifyCounts
	if err := tx.QueryRow(ctx, notifyCountsSQL, now.Add(-24*time.Hour)).Scan(&c.Sent24h, &c.Pending, &c.Failed, &c.Destinations, &c.Broken); err != nil {
		return c, fmt.Errorf("status page: notifications: %w", err)
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
