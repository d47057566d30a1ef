package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// testConsumer is a storage consumer running against a test broker.
type testConsumer struct {
	sc     *storageConsumer
	reg    *prometheus.Registry
	cl     *kgo.Client
	exited chan struct{} // closed when Run has returned runErr
	runErr error
	stop   func() error // cancels Run, waits for it and closes the client
}

func testConsumerOptions() consumerOptions {
	return consumerOptions{Group: "playwatch-storage", MaxPollRecords: 500, Linger: 20 * time.Millisecond,
		Writers: 1, MaxRecordBytes: 1 << 20, RetryMaxBackoff: 200 * time.Millisecond, Clock: systemClock{}, Locales: testLocales}
}

func startTestConsumer(t testing.TB, pool *pgxpool.Pool, brokers []string, opts consumerOptions, hooks consumerHooks) *testConsumer {
	t.Helper()
	return startLoggedTestConsumer(t, testLogger(t), pool, brokers, opts, hooks)
}

func startLoggedTestConsumer(t testing.TB, logger *slog.Logger, pool *pgxpool.Pool, brokers []string, opts consumerOptions, hooks consumerHooks) *testConsumer {
	t.Helper()
	reg := prometheus.NewRegistry()
	sc := newStorageConsumer(pool, opts, reg, logger)
	sc.hooks = hooks
	// Newly assigned partitions join the next fetch; short fetch waits keep
	// the tests that move partitions between members quick.
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100 * time.Millisecond)}, sc.clientOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testConsumer{sc: sc, reg: reg, cl: cl, exited: make(chan struct{})}
	go func() {
		tc.runErr = sc.Run(ctx, cl)
		close(tc.exited)
	}()
	tc.stop = func() error {
		cancel()
		select {
		case <-tc.exited:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("Run did not return 30s after cancel")
		}
		cl.Close()
		return tc.runErr
	}
	t.Cleanup(func() { tc.stop() })
	return tc
}

// newConsumerTestBroker is a test broker whose KIP-848 group heartbeats
// come every 100ms instead of 5s, so partitions move quickly between members.
func newConsumerTestBroker(t testing.TB) []string {
	t.Helper()
	_, brokers := newTestBroker(t, t.TempDir())
	v := "100"
	var err error
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		err = alterConfigsErr(adm.AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "group.consumer.heartbeat.interval.ms", Value: &v}}))
	})
	if err != nil {
		t.Fatalf("lower the group heartbeat interval: %v", err)
	}
	return brokers
}

// newConsumerTestBed is a test database with pkgs registered and a test
// broker for a storage consumer to run between.
func newConsumerTestBed(t testing.TB, pkgs ...string) (*pgxpool.Pool, []string) {
	t.Helper()
	pool := newTestPool(t)
	brokers := newConsumerTestBroker(t)
	registerApps(t, pool, pkgs...)
	return pool, brokers
}

// allowLargeRecords raises max.message.bytes of the topics to 4 MiB.
func allowLargeRecords(t testing.TB, brokers []string) {
	t.Helper()
	v := fmt.Sprint(4 << 20)
	var err error
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		err = alterConfigsErr(adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, allTopics...))
	})
	if err != nil {
		t.Fatalf("alter max.message.bytes: %v", err)
	}
}

// alterConfigsErr is the error of a request to alter configs, else the
// last one a resource answered.
func alterConfigsErr(resps kadm.AlterConfigsResponses, err error) error {
	if err != nil {
		return err
	}
	for _, r := range resps {
		if r.Err != nil {
			err = r.Err
		}
	}
	return err
}

var testCrawl = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func reviewFields(pkg, id string, crawled time.Time) map[string]any {
	return map[string]any{"package_name": pkg, "review_id": id, "user_name": "Ana", "thumbs_up_count": 3,
		"score": 4, "content": "works well", "at": testCrawl.Add(-48 * time.Hour).Format(time.RFC3339), "crawled_at": crawled.Format(time.RFC3339Nano)}
}

func statFields(pkg string, crawled time.Time) map[string]any {
	return map[string]any{"package_name": pkg, "title": "Telegram", "genre": "Communication", "min_installs": 1000000000,
		"score": 4.3, "ratings": 12345678, "reviews_count": 345678, "version": "11.2.3", "ad_supported": false,
		"app_updated_at": testCrawl.Add(-240 * time.Hour).Format(time.RFC3339), "crawled_at": crawled.Format(time.RFC3339Nano)}
}

func networkFields(pkg, id string) map[string]any {
	return map[string]any{"analysis_id": id, "package_name": pkg, "scenario": "UPLOAD", "rtt_handshake": 12.5,
		"retransmission_count": 3, "out_of_order_count": 1, "spurious_retransmission_count": 0, "zero_window_count": 0,
		"tcp_reset_count": 1, "bytes_transferred_total": 150000, "bytes_payload_total": 140000, "overhead_ratio": 0.0667,
		"source_pcap_filename": "upload.pcap", "analyzed_at": testCrawl.Format(time.RFC3339)}
}

// deleteField as a value in with() removes the field.
var deleteField = &struct{}{}

func TestConsumerStoresAllThreeTopics(t *testing.T) {
	pkg := "org.telegram.messenger"
	pool, brokers := newConsumerTestBed(t, pkg)
	produce(t, brokers,
		rec(topicAppStats, pkg, msgJSON(statFields(pkg, testCrawl))),
		rec(topicReviews, pkg, msgJSON(reviewFields(pkg, "r1", testCrawl))),
		rec(topicNetworkMetrics, pkg, msgJSON(networkFields(pkg, "6f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a5b"))),
	)
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 30*time.Second, "three rows", func() bool {
		return count(t, pool, `SELECT (SELECT count(*) FROM app_stats) + (SELECT count(*) FROM reviews) + (SELECT count(*) FROM network_metrics)`) == 3
	})
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM apps_registry_application WHERE display_name = 'Telegram' AND category = 'Communication'`); n != 1 {
		t.Errorf("registry names not filled from the store title and genre")
	}
	if got := metricValue(t, tc.reg, "playwatch_consumer_rows_written_total", map[string]string{"table": "reviews"}); got != 1 {
		t.Errorf("rows written (reviews) = %v, want 1", got)
	}
	if age := metricValue(t, tc.reg, "playwatch_consumer_data_freshness_seconds", map[string]string{"topic": "reviews"}); age < time.Since(testCrawl).Seconds()-60 {
		t.Errorf("freshness of reviews = %v, want the age of the newest crawled_at", age)
	}
}

type reviewState struct {
	thumbs      int
	content     string
	sentiment   string // empty for NULL
	firstSeen   time.Time
	lastSynced  time.Time
	application int64
}

func readReviewRow(t testing.TB, pool *pgxpool.Pool, id string) reviewState {
	t.Helper()
	var s reviewState
	err := pool.QueryRow(context.Background(), `SELECT thumbs_up_count, content, coalesce(sentiment, ''), first_seen_at, last_synced_at, application_id
		FROM reviews WHERE review_id = $1`, id).Scan(&s.thumbs, &s.content, &s.sentiment, &s.firstSeen, &s.lastSynced, &s.application)
	if err != nil {
		t.Fatalf("review %s: %v", id, err)
	}
	return s
}

// A newer crawl updates a review; a stale replay of an older crawl never
// overwrites it; sentiment and the sentiment job's own columns, and
// first_seen_at, survive every re-sync.
func TestConsumerReviewUpsertRules(t *testing.T) {
	t.Parallel()
	const pkg = "org.telegram.messenger"
	pool, brokers := newConsumerTestBed(t, pkg)
	ctx := context.Background()
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})

	t1, t2 := testCrawl, testCrawl.Add(time.Hour)
	produce(t, brokers, rec(topicReviews, pkg, msgJSON(with(reviewFields(pkg, "r1", t1), "thumbs_up_count", 1, "content", "v1"))))
	waitFor(t, 20*time.Second, "the first version", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) == 1 })
	if _, err := pool.Exec(ctx, `UPDATE reviews SET sentiment = 'POSITIVE', sentiment_model = 'm1', sentiment_at = '2026-01-01Z', sentiment_text_hash = '\x01' WHERE review_id = 'r1'`); err != nil {
		t.Fatal(err)
	}
	jobColumnsKept := func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE review_id = 'r1' AND sentiment_model = 'm1' AND sentiment_at = '2026-01-01Z' AND sentiment_text_hash = '\x01'`) == 1
	}
	first := readReviewRow(t, pool, "r1")

	produce(t, brokers,
		rec(topicReviews, pkg, msgJSON(with(reviewFields(pkg, "r1", t2), "thumbs_up_count", 10, "content", "v2"))),
		rec(topicReviews, pkg, msgJSON(with(reviewFields(pkg, "marker", t2)))),
	)
	waitFor(t, 20*time.Second, "v2", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) == 2 })
	// The stale version comes in a later batch, so the upsert's guard, not
	// the in-batch dedupe, has to keep v2.
	produce(t, brokers,
		rec(topicReviews, pkg, msgJSON(with(reviewFields(pkg, "r1", t1.Add(-time.Hour)), "thumbs_up_count", 0, "content", "stale"))),
		rec(topicReviews, pkg, msgJSON(with(reviewFields(pkg, "marker2", t2)))),
	)
	waitFor(t, 20*time.Second, "the stale replay", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) == 3 })
	got := readReviewRow(t, pool, "r1")
	if got.thumbs != 10 || got.content != "v2" || !got.lastSynced.Equal(t2) {
		t.Errorf("after v2 and a stale replay: thumbs %d content %q last_synced_at %s, want 10, v2, %s", got.thumbs, got.content, got.lastSynced, t2)
	}
	if got.sentiment != "POSITIVE" || !jobColumnsKept() {
		t.Errorf("sentiment = %q after a re-sync, or the sentiment job's columns changed; want them kept", got.sentiment)
	}
	if !got.firstSeen.Equal(first.firstSeen) {
		t.Errorf("first_seen_at moved from %s to %s", first.firstSeen, got.firstSeen)
	}

	// Replaying the whole topic from the start changes nothing.
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM consumer_offsets`); err != nil {
		t.Fatal(err)
	}
	startTestConsumer(t, pool, brokers, withGroup(testConsumerOptions(), "replay"), consumerHooks{})
	waitFor(t, 20*time.Second, "the replay to store every record", func() bool {
		return count(t, pool, `SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE consumer_group = 'replay' AND topic = 'reviews'`) == 5
	})
	if again := readReviewRow(t, pool, "r1"); again.thumbs != got.thumbs || again.content != got.content ||
		!again.lastSynced.Equal(got.lastSynced) || !again.firstSeen.Equal(got.firstSeen) || again.sentiment != "POSITIVE" || !jobColumnsKept() {
		t.Errorf("a replay from the start changed the review: %+v, was %+v", again, got)
	}
}

// withGroup is the options with another consumer group.
func withGroup(o consumerOptions, group string) consumerOptions {
	o.Group = group
	return o
}

// Two versions of one review in one batch: the newer is stored, whatever
// their order (ON CONFLICT cannot touch a row twice in one statement).
func TestStoreBatchKeepsNewestVersionInBatch(t *testing.T) {
	pool := newTestPool(t)
	const pkg = "org.telegram.messenger"
	registerApps(t, pool, pkg)
	store := newConsumerStore(pool, "g", testLocales)
	t1, t2 := testCrawl, testCrawl.Add(time.Minute)
	mk := func(off int64, id string, crawled time.Time, content string) *kgo.Record {
		return &kgo.Record{Topic: topicReviews, Partition: 0, Offset: off,
			Value: msgJSON(with(reviewFields(pkg, id, crawled), "content", content))}
	}
	recs := []*kgo.Record{
		mk(0, "a", t1, "a-old"), mk(1, "a", t2, "a-new"), // newer last
		mk(2, "b", t2, "b-new"), mk(3, "b", t1, "b-old"), // newer first
		mk(4, "c", t1, "c-first"), mk(5, "c", t1, "c-same-crawl"), // equal: the first, as the guard would
	}
	parts := []partitionBatch{{topicPartition: topicPartition{topicReviews, 0}, records: recs}}
	out, err := store.storeBatch(context.Background(), parts, decodeRecords(recs, 1<<20, time.Now()), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.rows["reviews"] != 3 {
		t.Errorf("%d review rows written, want 3", out.rows["reviews"])
	}
	for id, want := range map[string]string{"a": "a-new", "b": "b-new", "c": "c-first"} {
		if got := readReviewRow(t, pool, id).content; got != want {
			t.Errorf("review %s: %q, want %q", id, got, want)
		}
	}
	if n := count(t, pool, `SELECT next_offset FROM consumer_offsets WHERE consumer_group = 'g' AND topic = 'reviews' AND "partition" = 0`); n != 6 {
		t.Errorf("stored next offset %d, want 6", n)
	}

	// An older batch again (a zombie member, a replay): below the stored
	// offset nothing is written, even rows that are gone meanwhile, and the
	// offset does not move back.
	if _, err := pool.Exec(context.Background(), `DELETE FROM reviews`); err != nil {
		t.Fatal(err)
	}
	old := []partitionBatch{{topicPartition: topicPartition{topicReviews, 0}, records: recs[:2]}}
	out, err = store.storeBatch(context.Background(), old, decodeRecords(recs[:2], 1<<20, time.Now()), false, nil)
	written := int64(0)
	for _, n := range out.rows {
		written += n
	}
	if err != nil || written != 0 || count(t, pool, `SELECT count(*) FROM reviews`) != 0 {
		t.Fatalf("second store of an older batch: %+v, %v; want nothing written", out.rows, err)
	}
	if n := count(t, pool, `SELECT next_offset FROM consumer_offsets WHERE consumer_group = 'g' AND topic = 'reviews' AND "partition" = 0`); n != 6 {
		t.Errorf("stored next offset %d after an older batch, want it to stay 6", n)
	}
}

// The app-stats title and genre fill an empty display_name/category and
// never overwrite what a user set.
func TestConsumerFillsEmptyRegistryNames(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	brokers := newConsumerTestBroker(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO apps_registry_application (package_name, display_name, category) VALUES
		('com.example.empty', NULL, ''), ('com.example.named', 'My Name', 'My Category'), ('com.example.half', '', 'Tools')`); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for _, pkg := range []string{"com.example.empty", "com.example.named", "com.example.half"} {
		recs = append(recs,
			rec(topicAppStats, pkg, msgJSON(with(statFields(pkg, testCrawl), "title", "Old Title", "genre", "Old Genre"))),
			rec(topicAppStats, pkg, msgJSON(with(statFields(pkg, testCrawl.Add(time.Hour)), "title", "Store Title", "genre", "Store Genre"))))
	}
	produce(t, brokers, recs...)
	startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "six stats", func() bool { return count(t, pool, `SELECT count(*) FROM app_stats`) == 6 })
	want := map[string][2]string{
		"com.example.empty": {"Store Title", "Store Genre"},
		"com.example.named": {"My Name", "My Category"},
		"com.example.half":  {"Store Title", "Tools"},
	}
	for pkg, w := range want {
		var name, cat string
		if err := pool.QueryRow(ctx, `SELECT display_name, category FROM apps_registry_application WHERE package_name = $1`, pkg).Scan(&name, &cat); err != nil {
			t.Fatal(err)
		}
		if name != w[0] || cat != w[1] {
			t.Errorf("%s: %q/%q, want %q/%q", pkg, name, cat, w[0], w[1])
		}
	}
}

// A kill at either crash point loses nothing and stores nothing twice: the
// restarted consumer resumes from the offsets stored with the rows.
func TestConsumerCrashConsistency(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"inside the transaction", "between the database and the Kafka commit"} {
		t.Run(point, func(t *testing.T) {
			const pkg, n = "org.telegram.messenger", 600
			pool, brokers := newConsumerTestBed(t, pkg)
			var recs []*kgo.Record
			for i := range n {
				recs = append(recs, &kgo.Record{Topic: topicReviews, Key: []byte(pkg), Partition: int32(i % 3),
					Value: msgJSON(reviewFields(pkg, fmt.Sprintf("r%d", i), testCrawl))})
			}
			produceToPartitions(t, brokers, recs...)

			opts := testConsumerOptions()
			opts.MaxPollRecords = 50
			crash := fmt.Errorf("simulated crash")
			var hooks consumerHooks
			batches := 0
			if point == "inside the transaction" {
				hooks.beforeCommit = func(context.Context) error {
					if batches++; batches == 4 {
						return crash
					}
					return nil
				}
			} else {
				hooks.afterCommit = func(context.Context, []partitionBatch) error {
					if batches++; batches == 4 {
						return crash
					}
					return nil
				}
			}
			first := startTestConsumer(t, pool, brokers, opts, hooks)
			select {
			case <-first.exited:
				if !errors.Is(first.runErr, crash) {
					t.Fatalf("Run returned %v, want the simulated crash", first.runErr)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the crash point was not reached")
			}
			first.cl.Close()
			storedAtCrash := count(t, pool, `SELECT count(*) FROM reviews`)
			offsetsAtCrash := count(t, pool, `SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets`)
			wantStored := 150 // three committed batches of 50
			if point != "inside the transaction" {
				wantStored = 200 // the fourth was committed, its Kafka commit was not
			}
			if storedAtCrash != wantStored || offsetsAtCrash != wantStored {
				t.Fatalf("at the crash: %d rows, stored offsets sum to %d; want %d", storedAtCrash, offsetsAtCrash, wantStored)
			}
			if committed := kafkaCommitted(t, brokers, opts.Group); committed >= offsetsAtCrash && point != "inside the transaction" {
				t.Fatalf("Kafka has %d records committed, the database %d: the crash did not fall between the commits", committed, offsetsAtCrash)
			}

			second := startTestConsumer(t, pool, brokers, opts, consumerHooks{})
			waitFor(t, 30*time.Second, "all reviews", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) >= n })
			if err := second.stop(); err != nil {
				t.Fatal(err)
			}
			if got := count(t, pool, `SELECT count(*) FROM reviews`); got != n {
				t.Errorf("%d reviews, want %d", got, n)
			}
			if got := count(t, pool, `SELECT count(*) FROM dead_letter_events`); got != 0 {
				t.Errorf("%d dead letters, want 0", got)
			}
			// The restarted consumer read only what was not stored yet.
			if got := metricValue(t, second.reg, "playwatch_consumer_records_total", map[string]string{"topic": topicReviews}); got != float64(n-storedAtCrash) {
				t.Errorf("the restarted consumer read %v records, want %d", got, n-storedAtCrash)
			}
			if got := kafkaCommitted(t, brokers, opts.Group); got != n {
				t.Errorf("Kafka has %d records committed after the restart, want %d", got, n)
			}
		})
	}
}

// produceToPartitions produces records to the partitions they name.
func produceToPartitions(t testing.TB, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// kafkaCommitted is the sum of the group's committed offsets in Kafka.
func kafkaCommitted(t testing.TB, brokers []string, group string) int {
	t.Helper()
	var offs kadm.OffsetResponses
	var err error
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) { offs, err = adm.FetchOffsets(ctx, group) })
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	offs.Each(func(o kadm.OffsetResponse) { sum += int(o.At) })
	return sum
}

// PostgreSQL refusing some rows for a reason validation does not know (a
// constraint added by a DBA): the batch is narrowed down, those rows become
// dead letters with the SQL error, the rest is stored.
func TestConsumerNarrowsUnexpectedDataErrors(t *testing.T) {
	t.Parallel()
	const pkg = "org.telegram.messenger"
	pool, brokers := newConsumerTestBed(t, pkg)
	if _, err := pool.Exec(context.Background(), `ALTER TABLE reviews ADD CONSTRAINT no_forbidden_words CHECK (content NOT LIKE '%forbidden%')`); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 40 {
		content := "fine"
		if i == 7 || i == 31 {
			content = "a forbidden word"
		}
		recs = append(recs, rec(topicReviews, pkg, msgJSON(with(reviewFields(pkg, fmt.Sprintf("r%d", i), testCrawl), "content", content))))
	}
	produce(t, brokers, recs...)
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "38 reviews and 2 dead letters", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews`) == 38 && count(t, pool, `SELECT count(*) FROM dead_letter_events`) == 2
	})
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events WHERE error_reason LIKE 'sql_error: %no_forbidden_words%' AND convert_from(raw_payload, 'UTF8') LIKE '%forbidden word%'`); n != 2 {
		t.Errorf("%d dead letters name the constraint and hold the payload, want 2", n)
	}
	if v := metricValue(t, tc.reg, "playwatch_consumer_db_errors_total", map[string]string{"kind": "data"}); v < 1 {
		t.Errorf("data errors metric = %v, want at least 1", v)
	}
}

// The retry waits of a batch the database refuses run on the consumer's
// clock: a fake one sees every wait, each within the backoff cap, and the
// blocked seconds are the time that clock spent waiting.
func TestConsumerRetryWaitsOnItsClock(t *testing.T) {
	ctx := context.Background()
	const pkg = "org.telegram.messenger"
	pool, brokers := newConsumerTestBed(t, pkg)
	if _, err := pool.Exec(ctx, `ALTER TABLE reviews RENAME TO reviews_away`); err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, rec(topicReviews, pkg, msgJSON(reviewFields(pkg, "r1", testCrawl))))
	clk := newFakeClock(true)
	opts := testConsumerOptions()
	opts.Clock = clk
	tc := startTestConsumer(t, pool, brokers, opts, consumerHooks{})
	waitFor(t, 20*time.Second, "five retry waits", func() bool { return len(clk.allWaits()) >= 5 })
	if _, err := pool.Exec(ctx, `ALTER TABLE reviews_away RENAME TO reviews`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the review", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) == 1 })
	waitFor(t, 10*time.Second, "the consumer to resume", func() bool {
		return metricValue(t, tc.reg, "playwatch_consumer_paused", nil) == 0
	})
	var waited time.Duration
	for _, d := range clk.allWaits() {
		if d <= 0 || d > opts.RetryMaxBackoff {
			t.Errorf("retry wait %v, want within (0, %v]", d, opts.RetryMaxBackoff)
		}
		waited += d
	}
	if got := metricValue(t, tc.reg, "playwatch_consumer_db_blocked_seconds_total", nil); math.Abs(got-waited.Seconds()) > 1e-6 {
		t.Errorf("blocked seconds = %v, want the %v the clock waited", got, waited)
	}
}

// An app deleted while its id is cached: the foreign-key error drops the
// cache, and its records become unregistered_package dead letters.
func TestConsumerForgetsDeletedApps(t *testing.T) {
	t.Parallel()
	pool, brokers := newConsumerTestBed(t, "com.example.kept", "com.example.gone")
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	produce(t, brokers, rec(topicReviews, "k", msgJSON(reviewFields("com.example.kept", "k1", testCrawl))),
		rec(topicReviews, "g", msgJSON(reviewFields("com.example.gone", "g1", testCrawl))))
	waitFor(t, 20*time.Second, "two reviews", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) == 2 })
	if _, err := pool.Exec(context.Background(), `DELETE FROM apps_registry_application WHERE package_name = 'com.example.gone'`); err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, rec(topicReviews, "k", msgJSON(reviewFields("com.example.kept", "k2", testCrawl))),
		rec(topicReviews, "g", msgJSON(reviewFields("com.example.gone", "g2", testCrawl))))
	waitFor(t, 20*time.Second, "k2 stored and g2 dead", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE review_id = 'k2'`) == 1 &&
			count(t, pool, `SELECT count(*) FROM dead_letter_events WHERE error_reason LIKE 'unregistered_package: package com.example.gone %'`) == 1
	})
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestClassifyDBError(t *testing.T) {
	cases := map[string]dbErrorKind{
		"08006": dbTransient, "40001": dbTransient, "40P01": dbTransient, "57P01": dbTransient, "57P03": dbTransient,
		"53300": dbTransient, "23505": dbData, "23514": dbData, "22001": dbData, "54000": dbData, "P0001": dbData,
		"42P01": dbBlocked, "42501": dbBlocked, "53100": dbBlocked,
	}
	for code, want := range cases {
		if got := classifyDBError(fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})); got != want {
			t.Errorf("SQLSTATE %s: %s, want %s", code, got, want)
		}
	}
	if got := classifyDBError(fmt.Errorf("dial: %w", errors.New("connection refused"))); got != dbTransient {
		t.Errorf("a network error is %s, want transient", got)
	}
}

func TestAssignWritersKeepsPartitionsWhole(t *testing.T) {
	mk := func(p int32, n int) partitionBatch {
		return partitionBatch{topicPartition: topicPartition{topicReviews, p}, records: make([]*kgo.Record, n)}
	}
	shares := assignWriters([]partitionBatch{mk(0, 10), mk(1, 300), mk(2, 200), mk(3, 90)}, 2)
	if len(shares) != 2 {
		t.Fatalf("%d shares, want 2", len(shares))
	}
	load := func(s []partitionBatch) (n int) {
		for _, p := range s {
			n += len(p.records)
		}
		return n
	}
	if a, b := load(shares[0]), load(shares[1]); a+b != 600 || a != 300 || b != 300 {
		t.Errorf("loads %d and %d, want 300 and 300", a, b)
	}
	if one := assignWriters([]partitionBatch{mk(0, 5)}, 4); len(one) != 1 {
		t.Errorf("one partition makes %d shares", len(one))
	}
}

func TestConfigConsumerSettings(t *testing.T) {
	c, err := loadTestConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ConsumerGroup != "playwatch-storage" || c.ConsumerMaxPollRecords != 5000 || c.ConsumerLinger != 50*time.Millisecond ||
		c.ConsumerWriters != 1 || c.ConsumerMaxRecordBytes != 1<<20 || c.ConsumerRetryMaxBackoff != 10*time.Second {
		t.Errorf("consumer defaults: %+v", c)
	}
	for name, value := range map[string]string{"CONSUMER_GROUP": "", "CONSUMER_MAX_POLL_RECORDS": "0", "CONSUMER_LINGER": "-1s",
		"CONSUMER_WRITERS": "100", "CONSUMER_MAX_RECORD_BYTES": "10", "CONSUMER_RETRY_MAX_BACKOFF": "0s"} {
		env := map[string]string{name: value}
		if value == "" {
			_, err = loadTestConfig(nil, "--consumer-group", "")
		} else {
			_, err = loadTestConfig(env)
		}
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: err = %v, want an error naming it", name, value, err)
		}
	}
}

// Partitions move between members while records flow: a second member
// joins, then the first leaves. Every record is stored exactly once and the
// stored and committed offsets end at the end of every partition.
func TestConsumerRebalanceBetweenMembers(t *testing.T) {
	t.Parallel()
	const pkg = "org.telegram.messenger"
	pool, brokers := newConsumerTestBed(t, pkg)
	opts := testConsumerOptions()
	opts.MaxPollRecords = 50
	round := func(r, n int) {
		var recs []*kgo.Record
		for i := range n {
			recs = append(recs, &kgo.Record{Topic: topicReviews, Partition: int32(i % 3),
				Value: msgJSON(reviewFields(pkg, fmt.Sprintf("r%d-%d", r, i), testCrawl))})
		}
		produceToPartitions(t, brokers, recs...)
	}
	stored := func() int { return count(t, pool, `SELECT count(*) FROM reviews`) }

	round(1, 900)
	a := startTestConsumer(t, pool, brokers, opts, consumerHooks{})
	waitFor(t, 20*time.Second, "the first member to store some", func() bool { return stored() > 0 })
	twoWriters := opts
	twoWriters.Writers = 2
	b := startTestConsumer(t, pool, brokers, twoWriters, consumerHooks{})
	round(2, 900)
	waitFor(t, 20*time.Second, "more reviews", func() bool { return stored() >= 1200 })
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	round(3, 900)
	waitFor(t, 30*time.Second, "every review, the last ones by the second member", func() bool { return stored() >= 2700 })
	waitFor(t, 10*time.Second, "the Kafka commits", func() bool { return kafkaCommitted(t, brokers, opts.Group) == 2700 })
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if n := stored(); n != 2700 {
		t.Errorf("%d reviews, want 2700", n)
	}
	if n := count(t, pool, `SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE topic = 'reviews'`); n != 2700 {
		t.Errorf("stored offsets sum to %d, want 2700", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// forgettingQuerier empties the id cache as its query starts, as another
// writer's data error does.
type forgettingQuerier struct {
	querier
	ids *packageIDs
}

func (f forgettingQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	f.ids.forget()
	return f.querier.Query(ctx, sql, args...)
}

// A cache cleared by another writer in the middle of resolving a batch does
// not turn the batch's registered packages into dead letters.
func TestConsumerPackageIDsSurviveConcurrentForget(t *testing.T) {
	pool := newTestPool(t)
	registerApps(t, pool, "com.example.cached", "com.example.fresh")
	ids := &packageIDs{ids: map[string]int64{}}
	warm := batchWith([]reviewRow{{src: &kgo.Record{}, msg: reviewMessage{PackageName: "com.example.cached"}}})
	if err := ids.resolve(context.Background(), pool, warm); err != nil || len(rowsIn[reviewMessage](warm)) != 1 {
		t.Fatalf("warm the cache: %v, %d rows", err, len(rowsIn[reviewMessage](warm)))
	}
	b := batchWith([]reviewRow{
		{src: &kgo.Record{}, msg: reviewMessage{PackageName: "com.example.cached"}},
		{src: &kgo.Record{}, msg: reviewMessage{PackageName: "com.example.fresh"}},
	})
	if err := ids.resolve(context.Background(), forgettingQuerier{pool, ids}, b); err != nil {
		t.Fatal(err)
	}
	if rows := rowsIn[reviewMessage](b); len(rows) != 2 || len(b.dead) != 0 || rows[0].appID == 0 || rows[1].appID == 0 {
		t.Fatalf("%d rows resolved, %d dead letters: %+v", len(rows), len(b.dead), b.dead)
	}
}

// Two writers count one pause: a writer that read the clock before the
// other counted adds nothing, and the total is the time that passed.
func TestDBPauseCountsEachMomentOnce(t *testing.T) {
	var p dbPause
	t0 := time.Now()
	p.begin(t0)
	if d := p.count(t0.Add(2 * time.Second)); d != 2*time.Second {
		t.Fatalf("first count %v", d)
	}
	if d := p.count(t0.Add(time.Second)); d != 0 {
		t.Fatalf("an earlier reading counted %v, want 0", d)
	}
	length, rest, ok := p.end(t0.Add(3 * time.Second))
	if !ok || length != 3*time.Second || rest != time.Second {
		t.Fatalf("end: %v %v %v", length, rest, ok)
	}
	if _, _, ok := p.end(t0.Add(4 * time.Second)); ok {
		t.Fatal("a second end found a pause")
	}
}
