package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// seedDigest puts a digest of rule to dest in the outbox in status, its
// last_error lastError ("" for none), and returns its id; the rows it
// stands for are the test's to point at it.
func seedDigest(t testing.TB, pool *pgxpool.Pool, rule, dest int64, status, lastError string) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, status, event_at, last_error)
VALUES ($1, $2, 'digest', 'digest:1', '{"event": "digest"}', $3, now(), NULLIF($4, '')) RETURNING id`, rule, dest, status, lastError).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
