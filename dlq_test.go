package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// runCLI runs a playwatch command line in-process against the database at
// dsn and returns its output.
func runCLI(t *testing.T, dsn string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := map[string]string{"DATABASE_URL": dsn, "PLAYWATCH_DATA_DIR": t.TempDir(), "LOG_LEVEL": "warn"}
	err := run(context.Background(), args, envFunc(env), &out, &errOut)
	return out.String(), err
}

// Dead letters of an unregistered package are listed, filtered and, once
// the package is registered, replayed into the tables and removed; a second
// replay does nothing; what still fails keeps its row with the new reason.
func TestDLQListAndReplay(t *testing.T) {
	t.Parallel()
	dsn := newTestDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	brokers := newConsumerTestBroker(t)
	const late = "com.example.late"
	registerApps(t, pool, "org.telegram.messenger")
	produce(t, brokers,
		rec(topicReviews, late, msgJSON(reviewFields(late, "l1", testCrawl))),
		rec(topicReviews, late, msgJSON(reviewFields(late, "l2", testCrawl))),
		rec(topicReviews, late, msgJSON(with(reviewFields(late, "l2", testCrawl.Add(time.Hour)), "content", "edited"))),
		rec(topicAppStats, late, msgJSON(statFields(late, testCrawl))),
		rec(topicNetworkMetrics, late, msgJSON(networkFields(late, "5d1b3c6e-8f7a-4b2c-9d0e-1f2a3b4c5d6e"))),
		rec(topicReviews, "org.telegram.messenger", []byte(`{"package_name": "org.telegram.messenger", "review_id": 7`)),
		rec(topicReviews, "org.telegram.messenger", msgJSON(reviewFields("org.telegram.messenger", "ok", testCrawl))),
	)
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "six dead letters", func() bool { return count(t, pool, `SELECT count(*) FROM dead_letter_events`) == 6 })
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}

	out, err := runCLI(t, dsn, "dlq", "list")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "ID  ") || !strings.Contains(out, "unregistered_package: package com.example.late is not registered") ||
		!strings.Contains(out, "invalid_json") || !strings.HasSuffix(out, "6 dead letters\n") {
		t.Errorf("dlq list:\n%s", out)
	}
	listed := func(args ...string) []deadLetterJSON {
		t.Helper()
		out, err := runCLI(t, dsn, append([]string{"dlq", "list", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("dlq list %v: %v", args, err)
		}
		var rows []deadLetterJSON
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, out)
		}
		return rows
	}
	if rows := listed("--topic", "reviews"); len(rows) != 4 || rows[0].Payload == nil || !strings.Contains(*rows[0].Payload, `"package_name"`) {
		t.Errorf("--topic reviews: %+v", rows)
	}
	if rows := listed("--reason", "unregistered_package"); len(rows) != 5 {
		t.Errorf("--reason unregistered_package: %d rows, want 5", len(rows))
	}
	if rows := listed("--since", "1h"); len(rows) != 6 {
		t.Errorf("--since 1h: %d rows, want 6", len(rows))
	}
	if rows := listed("--since", time.Now().Add(time.Hour).Format(time.RFC3339)); len(rows) != 0 {
		t.Errorf("--since in an hour: %d rows, want 0", len(rows))
	}
	if rows := listed("--limit", "2"); len(rows) != 2 {
		t.Errorf("--limit 2: %d rows", len(rows))
	}
	var badJSON int64
	if err := pool.QueryRow(context.Background(), `SELECT id FROM dead_letter_events WHERE error_reason LIKE 'invalid_json%'`).Scan(&badJSON); err != nil {
		t.Fatal(err)
	}

	// Replay before the cause is fixed: nothing stored, reasons kept.
	if out, err := runCLI(t, dsn, "dlq", "replay", "--all"); err != nil || !strings.HasPrefix(out, "stored 0, still dead 6") {
		t.Errorf("replay before registering: %v\n%s", err, out)
	}

	registerApps(t, pool, late)
	out, err = runCLI(t, dsn, "dlq", "replay", "--all")
	if err != nil || !strings.HasPrefix(out, "stored 5, still dead 1") || !strings.Contains(out, fmt.Sprintf("  %d reviews/", badJSON)) {
		t.Errorf("replay after registering: %v\n%s", err, out)
	}
	counts := func() string {
		return fmt.Sprint(count(t, pool, `SELECT count(*) FROM reviews`), count(t, pool, `SELECT count(*) FROM app_stats`),
			count(t, pool, `SELECT count(*) FROM network_metrics`), count(t, pool, `SELECT count(*) FROM dead_letter_events`))
	}
	if got := counts(); got != "3 1 1 1" {
		t.Errorf("reviews, stats, metrics, dead letters = %s, want 3 1 1 1", got)
	}
	if c := readReviewRow(t, pool, "l2").content; c != "edited" {
		t.Errorf("the replay kept %q of l2, want the newer version", c)
	}

	// Replaying again is a no-op; a replayed id is reported as gone.
	if out, err := runCLI(t, dsn, "dlq", "replay", "--all"); err != nil || !strings.HasPrefix(out, "stored 0, still dead 1") {
		t.Errorf("second replay: %v\n%s", err, out)
	}
	if out, err := runCLI(t, dsn, "dlq", "replay", fmt.Sprint(badJSON), "999999"); err != nil ||
		!strings.HasPrefix(out, "stored 0, still dead 1, not found 1") {
		t.Errorf("replay by id: %v\n%s", err, out)
	}
	if got := counts(); got != "3 1 1 1" {
		t.Errorf("after the second replay: %s, want 3 1 1 1", got)
	}

	var uerr usageError
	for _, args := range [][]string{{"dlq"}, {"dlq", "frob"}, {"dlq", "replay"}, {"dlq", "replay", "--all", "5"},
		{"dlq", "replay", "x"}, {"dlq", "list", "--reason", "nope"}, {"dlq", "list", "--topic", "nosuch"}, {"dlq", "replay", "--all", "--topic", "nosuch"}, {"dlq", "list", "--since", "yesterday"}, {"dlq", "list", "extra"}} {
		if _, err := runCLI(t, dsn, args...); !errors.As(err, &uerr) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

// The consumer role of `playwatch run`: a message produced to the embedded
// broker ends up as a row, visible in /metrics, and the role stops cleanly.
func TestRunConsumerRole(t *testing.T) {
	t.Parallel()
	dsn := newTestDatabase(t)
	env := applianceEnv(t, filepath.Join(t.TempDir(), "data"), map[string]string{"DATABASE_URL": dsn, "CONSUMER_LINGER": "0s"})
	base, stop, logs := startRun(t, env, "--roles", "registry,consumer")
	const pkg = "org.telegram.messenger"
	registerOverHTTP(t, base, pkg)
	cl, err := kgo.NewClient(kgo.SeedBrokers(env["PLAYWATCH_BROKER_ADDR"]))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), rec(topicReviews, pkg, msgJSON(reviewFields(pkg, "from-run", testCrawl)))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	waitFor(t, 30*time.Second, "the review row", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE review_id = 'from-run'`) == 1
	})
	if code, body := httpDo(t, http.MethodGet, base+"/metrics", ""); code != 200 ||
		!strings.Contains(body, `playwatch_consumer_rows_written_total{table="reviews"} 1`) {
		t.Errorf("/metrics lacks the stored review:\n%s", body)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, logs)
	}
	if !strings.Contains(logs.String(), "storage consumer stopped") {
		t.Errorf("logs lack the consumer's stop:\n%s", logs)
	}
	if n := count(t, pool, `SELECT next_offset FROM consumer_offsets WHERE topic = 'reviews' AND next_offset > 0`); n != 1 {
		t.Errorf("stored next offset %d, want 1", n)
	}
}

// Two replays never run at once: while one holds the replay lock, another
// stops with an error saying so; once it is released the replay runs.
func TestDLQReplayLock(t *testing.T) {
	t.Parallel()
	dsn := newTestDatabase(t)
	pool := newTestPoolFor(t, dsn)
	unlock, err := lockDLQReplay(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, dsn, "dlq", "replay", "--all"); err == nil || !strings.Contains(err.Error(), "another `playwatch dlq replay` is running") {
		t.Fatalf("a second replay: %v (%s)", err, out)
	}
	unlock()
	if out, err := runCLI(t, dsn, "dlq", "replay", "--all"); err != nil || !strings.HasPrefix(out, "stored 0, still dead 0") {
		t.Fatalf("replay after the lock was released: %v (%s)", err, out)
	}
}

// dashboardDeadLetters is what the dashboard's dead-letter SQL panels show
// over the last year: the sum of their value column, per panel title.
func dashboardDeadLetters(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	titles, targets := loadGrafanaDashboard(t).targets()
	out := map[string]int64{}
	for i, tg := range targets {
		if !strings.Contains(tg.RawSQL, "dead_letter_events") {
			continue
		}
		rows, err := pool.Query(context.Background(), expandGrafanaSQL(t, tg.RawSQL, time.Now().AddDate(-1, 0, 0), time.Now().Add(time.Hour), nil))
		if err != nil {
			t.Fatalf("panel %q: %v", titles[i], err)
		}
		maps, err := pgx.CollectRows(rows, pgx.RowToMap)
		if err != nil {
			t.Fatalf("panel %q: %v", titles[i], err)
		}
		for _, m := range maps {
			out[titles[i]] += m["value"].(int64)
		}
	}
	if len(out) != 2 {
		t.Fatalf("dead-letter panels %v, want the stat and the per-day chart", out)
	}
	return out
}

// dlq discard marks dead letters that can never be stored, by id or by
// reason (and --before, --topic), with the time and who did it; list,
// replay, the status page's card and the dashboard skip them unless asked
// with --discarded. An unknown --topic is refused, naming the known ones.
func TestDLQDiscard(t *testing.T) {
	t.Parallel()
	dsn := newTestDatabase(t)
	pool := newTestPoolFor(t, dsn)
	ctx := context.Background()
	const late = "com.example.late"
	var ids []int64
	for _, d := range []struct {
		payload []byte
		reason  string
		age     time.Duration
	}{
		{[]byte(`{"package_name": "x", "review_id": 7`), "invalid_json: unexpected end of JSON input", 48 * time.Hour},
		{[]byte(`{"package_name": "x", "review_id": 8`), "invalid_json: unexpected end of JSON input", 50 * time.Hour},
		{[]byte(`{"package_name": "x", "review_id": 9`), "invalid_json: unexpected end of JSON input", time.Hour},
		{msgJSON(reviewFields(late, "l1", testCrawl)), "unregistered_package: package " + late + " is not registered", time.Hour},
	} {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO dead_letter_events (topic, "partition", kafka_offset, kafka_key, raw_payload, error_reason, occurred_at)
			VALUES ('reviews', 0, $1, 'x', $2, $3, now() - $4::interval) RETURNING id`, len(ids), d.payload, d.reason, d.age).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	cardCount := func() int64 {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		n, err := countDeadLetters(ctx, tx, time.Now().Add(-24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n, panels := cardCount(), dashboardDeadLetters(t, pool); n != 2 || panels["Dead letters (24 h)"] != 2 || panels["Dead letters per day by reason"] != 4 {
		t.Fatalf("before discarding: card %d, panels %v", n, panels)
	}

	var uerr usageError
	for _, args := range [][]string{{"dlq", "list", "--topic", "nosuch"}, {"dlq", "replay", "--all", "--topic", "nosuch"},
		{"dlq", "discard"}, {"dlq", "discard", "--topic", "reviews"}, {"dlq", "discard", "x"}, {"dlq", "discard", "--reason", "nope"},
		{"dlq", "discard", "--reason", "invalid_json", "--before", "soon"}, {"dlq", "discard", "--reason", "invalid_json", "--topic", "nosuch"}} {
		if _, err := runCLI(t, dsn, args...); !errors.As(err, &uerr) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		} else if slices.Contains(args, "nosuch") && !strings.Contains(err.Error(), "app-stats, reviews, network-metrics") {
			t.Errorf("%q: %v; want the known topics named", args, err)
		}
	}

	out, err := runCLI(t, dsn, "dlq", "discard", "--reason", "invalid_json", "--before", "24h", "--by", "alice")
	if err != nil || out != "discarded 2 dead letters (by alice)\n" {
		t.Fatalf("discard --reason --before: %v %q", err, out)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, dsn, "dlq", "discard", fmt.Sprint(ids[2]), fmt.Sprint(ids[0]), "999999")
	if err != nil || !strings.HasPrefix(out, fmt.Sprintf("discarded 1 dead letters (by %s), not found 2", me.Username)) ||
		!strings.Contains(out, fmt.Sprintf("[%d 999999]", ids[0])) {
		t.Fatalf("discard by id: %v %q", err, out)
	}
	var at time.Time
	var by string
	if err := pool.QueryRow(ctx, `SELECT discarded_at, discarded_by FROM dead_letter_events WHERE id = $1`, ids[0]).Scan(&at, &by); err != nil ||
		by != "alice" || time.Since(at) > time.Minute {
		t.Errorf("dead letter %d: discarded at %s by %q (%v); want just now by alice, kept by the second discard", ids[0], at, by, err)
	}
	if n, panels := cardCount(), dashboardDeadLetters(t, pool); n != 1 || panels["Dead letters (24 h)"] != 1 || panels["Dead letters per day by reason"] != 1 {
		t.Errorf("after discarding: card %d, panels %v; want the one left", n, panels)
	}

	listed := func(args ...string) []deadLetterJSON {
		t.Helper()
		out, err := runCLI(t, dsn, append([]string{"dlq", "list", "--json"}, args...)...)
		var rows []deadLetterJSON
		if err != nil || json.Unmarshal([]byte(out), &rows) != nil {
			t.Fatalf("dlq list %v: %v\n%s", args, err, out)
		}
		return rows
	}
	if rows := listed(); len(rows) != 1 || rows[0].ID != ids[3] || rows[0].DiscardedAt != nil {
		t.Errorf("dlq list: %+v, want only %d", rows, ids[3])
	}
	if rows := listed("--discarded", "--reason", "invalid_json"); len(rows) != 3 || rows[2].DiscardedBy == nil || *rows[2].DiscardedBy != "alice" {
		t.Errorf("dlq list --discarded --reason invalid_json: %+v", rows)
	}
	if out, err := runCLI(t, dsn, "dlq", "list", "--discarded"); err != nil || !strings.Contains(out, "DISCARDED") || !strings.Contains(out, " by alice ") ||
		!strings.HasSuffix(out, "4 dead letters\n") {
		t.Errorf("dlq list --discarded: %v\n%s", err, out)
	}
	if out, err := runCLI(t, dsn, "dlq", "list"); err != nil || strings.Contains(out, "DISCARDED") {
		t.Errorf("dlq list: %v\n%s", err, out)
	}

	// Replay leaves the discarded ones alone unless asked.
	registerApps(t, pool, late)
	if out, err := runCLI(t, dsn, "dlq", "replay", "--all"); err != nil || !strings.HasPrefix(out, "stored 1, still dead 0\n") {
		t.Errorf("replay --all: %v\n%s", err, out)
	}
	if out, err := runCLI(t, dsn, "dlq", "replay", fmt.Sprint(ids[0])); err != nil || !strings.Contains(out, "not found 1 (replayed before, or discarded: --discarded") {
		t.Errorf("replay of a discarded id: %v\n%s", err, out)
	}
	if out, err := runCLI(t, dsn, "dlq", "replay", "--all", "--discarded"); err != nil || !strings.HasPrefix(out, "stored 0, still dead 3") {
		t.Errorf("replay --all --discarded: %v\n%s", err, out)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events WHERE discarded_at IS NOT NULL`); n != 3 {
		t.Errorf("%d discarded dead letters kept, want 3", n)
	}
}

// A discard that commits while `dlq replay --all` waits for the locks of a
// chunk's rows takes those rows out of the chunk (FOR UPDATE rechecks
// discarded_at); the replay still goes on to every row after them.
func TestDLQReplayAllGoesOnPastRowsDiscardedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTestPool(t)
	const rest = 100
	if _, err := pool.Exec(ctx, `INSERT INTO dead_letter_events (topic, "partition", kafka_offset, raw_payload, error_reason)
		SELECT 'reviews', 0, g, 'not JSON', 'invalid_json: not JSON' FROM generate_series(1, $1) g`, replayChunk+rest); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE dead_letter_events SET discarded_at = now(), discarded_by = 'test'
		WHERE id IN (SELECT id FROM dead_letter_events ORDER BY id LIMIT $1)`, replayChunk); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res replayResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := newConsumerStore(pool, testConsumerOptions().Group, testLocales).replayDeadLetters(ctx, nil, deadLetterFilter{}, 1<<20)
		done <- result{res, err}
	}()
	waitFor(t, 10*time.Second, "the replay waiting for the discard's locks", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.res.Stored) != 0 || len(r.res.StillDead) != rest {
		t.Errorf("replay stored %d, still dead %d; want 0 and the %d rows after the discarded ones", len(r.res.Stored), len(r.res.StillDead), rest)
	}
}
