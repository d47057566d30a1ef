package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The overview's notifications card: without destinations it says how to
// add one; then it counts what was sent in 24 h, what is pending and what
// failed, names the broken destinations, and is red for either.
func TestStatusPageNotificationsCard(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	srv := statusServer(t, pool, "", newMetricsRegistry("test"))
	code, body, _ := getPage(t, srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("overview: %d", code)
	}
	if want := `<div class="card unknown"><div class="card-title">Notifications, 24 h</div><div class="card-value">no destinations</div><div class="card-detail">add one: curl -H &#34;Authorization: Bearer $REGISTRY_TOKEN&#34; -d`; !strings.Contains(body, want) {
		t.Errorf("empty card: want %q in\n%s", want, body)
	}
	if !strings.Contains(body, "/api/v1/destinations") {
		t.Error("the empty card does not name the API")
	}

	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO notify_destinations (id, name, type, config) VALUES (1, 'team chat', 'slack', '{}'), (2, 'ops bot', 'telegram', '{}')`)
	exec(`INSERT INTO notify_rules (id, name, event) VALUES (1, 'bad reviews', 'review')`)
	exec(`INSERT INTO notify_rule_destinations VALUES (1, 1), (1, 2)`)
	at := func(ago time.Duration) time.Time { return statusNow.Add(-ago) }
	for i, row := range []struct {
		status string
		sentAt *time.Time
	}{
		{"sent", ptr(at(time.Hour))}, {"sent", ptr(at(23 * time.Hour))}, {"sent", ptr(at(30 * time.Hour))},
		{"pending", nil}, {"pending", nil}, {"pending", nil}, {"sent", ptr(at(time.Minute))},
	} {
		exec(`INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, status, event_at, sent_at)
			VALUES (1, 1, 'review', $1, '{}', $2, $3, $4)`, "k"+string(rune('a'+i)), row.status, at(48*time.Hour), row.sentAt)
	}
	_, body, _ = getPage(t, srv.URL+"/")
	if want := `<div class="card ok"><div class="card-title">Notifications, 24 h</div><div class="card-value">3 sent</div><div class="card-detail">3 pending, 0 failed; no destination broken</div>`; !strings.Contains(body, want) {
		t.Errorf("want %q in\n%s", want, body)
	}

	exec(`UPDATE notifications SET status = 'failed', last_error = 'HTTP 500' WHERE event_key = 'kd'`)
	exec(`UPDATE notify_destinations SET status = 'broken', last_error = '403 Forbidden' WHERE id = 2`)
	_, body, _ = getPage(t, srv.URL+"/")
	if want := `<div class="card bad"><div class="card-title">Notifications, 24 h</div><div class="card-value">3 sent</div><div class="card-detail">2 pending, 1 failed (playwatch notify list --status failed; notify retry --failed sends them again); 1 broken destinations: ops bot`; !strings.Contains(body, want) {
		t.Errorf("want %q in\n%s", want, body)
	}

	// A digest is one message: the rows folded into it are not counted.
	for _, status := range []string{"sent", "pending"} {
		var digest int64
		if err := pool.QueryRow(ctx, `INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, status, event_at, sent_at)
			VALUES (1, 1, 'digest', $1, '{}', $2::text, $3, CASE WHEN $2::text = 'sent' THEN $3::timestamptz END) RETURNING id`, "digest:"+status, status, at(time.Minute)).Scan(&digest); err != nil {
			t.Fatal(err)
		}
		exec(`INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, status, event_at, sent_at, digest_id)
			SELECT 1, 1, 'review', $1::text || i, '{}', $2::text, $3::timestamptz, CASE WHEN $2::text = 'sent' THEN $3::timestamptz END, $4::bigint FROM generate_series(1, 2) i`, "folded-"+status, status, at(time.Minute), digest)
	}
	_, body, _ = getPage(t, srv.URL+"/")
	if want := `<div class="card-value">4 sent</div><div class="card-detail">3 pending, 1 failed`; !strings.Contains(body, want) {
		t.Errorf("want %q in\n%s", want, body)
	}
}

// The card's counts of sent and pending notifications read the outbox on
// its indexes, so the page's cost does not grow with the outbox's history.
func TestStatusPageNotificationsQueryPlan(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO notify_destinations (name, type) SELECT 'd' || i, 'webhook' FROM generate_series(1, 5) i`,
		`INSERT INTO notify_rules (name, event) SELECT 'r' || i, 'review' FROM generate_series(1, 5) i`,
		`INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, status, event_at, sent_at)
			SELECT 1 + i % 5, 1 + (i / 5) % 5, 'review', 'k' || i, '{}', 'sent', now(), now() - make_interval(mins => i)
			FROM generate_series(1, 20000) i`,
		`ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var plan []byte
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+notifyCountsSQL, time.Now().Add(-24*time.Hour)).Scan(&plan)
	})
	if err != nil {
		t.Fatal(err)
	}
	var doc []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &doc); err != nil {
		t.Fatal(err)
	}
	reads := 0
	doc[0].Plan.walk(func(n planNode) {
		if n.Relation != "notifications" {
			return
		}
		reads++
		if n.Type == "Bitmap Heap Scan" { // the index is its child's
			for _, c := range n.Plans {
				n.Index, n.IndexCond = n.Index+c.Index, n.IndexCond+c.IndexCond
			}
		}
		if !strings.Contains(n.Type, "Index") && n.Type != "Bitmap Heap Scan" {
			t.Errorf("reads notifications by %s (index %q)", n.Type, n.Index)
		}
		switch n.Index {
		case "notifications_due_idx":
		case "notifications_rule_destination_sent_at_idx":
			if !strings.Contains(n.IndexCond, "sent_at") {
				t.Errorf("the sent rows are read without a range on sent_at: %q", n.IndexCond)
			}
		default:
			t.Errorf("reads notifications on %q (cond %q), not the outbox's partial indexes", n.Index, n.IndexCond)
		}
	})
	if reads != 2 {
		t.Errorf("%d reads of notifications, want 2:\n%s", reads, plan)
	}
}
