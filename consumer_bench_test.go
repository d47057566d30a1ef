package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkReviewIngest measures reviews per second from the broker into
// PostgreSQL, with PostgreSQL's durable defaults (fsync, synchronous_commit)
// on a dedicated cluster, for a stream in which 20% of the messages are new
// versions of earlier reviews: the storage consumer against, in the same run,
//   - per-message: one INSERT … ON CONFLICT per message, each its own
//     transaction (what a simple consumer does);
//   - plain-copy: COPY straight into reviews, one transaction per batch (the
//     physical limit; it cannot upsert, so review ids are made unique);
//   - staging: the consumer's write strategy alone (COPY into a temporary
//     table, one INSERT … SELECT … ON CONFLICT), without its offsets, fence
//     and Kafka commits;
//   - unnest: the alternative strategy, INSERT … SELECT FROM unnest(arrays);
//
// with one connection and, for the consumer and plain-copy, with two
// (CONSUMER_WRITERS=2) writing disjoint partitions. Every variant polls the
// same records from the broker in batches of CONSUMER_MAX_POLL_RECORDS, and
// decodes and validates them the same way while the previous batch is
// written. CONSUMER_* settings come from the environment. A rate counts from
// the first committed batch to the last, so that start-up (clients, group
// join, first fetch) is left out of every variant alike.
//
// The variants run interleaved, PLAYWATCH_BENCH_ROUNDS times (default 3), and
// the medians are reported, as <variant>-rows/s, and for the consumer and
// unnest also as % of plain-copy with as many connections and as multiples
// of per-message. PLAYWATCH_BENCH_REVIEWS sets the dataset size (default
// 60000); per-message runs on a tenth of it.
func BenchmarkReviewIngest(b *testing.B) {
	n := benchEnvInt(b, "PLAYWATCH_BENCH_REVIEWS", 60000, 1000)
	rounds := benchEnvInt(b, "PLAYWATCH_BENCH_ROUNDS", 3, 1)
	cfg := benchConfig(b)
	batch := cfg.ConsumerMaxPollRecords
	env := newIngestBenchEnv(b, n, cfg)
	upserts := func(n, conns, batch int, write batchWriter) func(b *testing.B) float64 {
		return func(b *testing.B) float64 {
			rate, distinct := env.directIngest(b, n, conns, batch, write)
			env.expectReviews(b, distinct)
			return rate
		}
	}
	copies := func(conns int) func(b *testing.B) float64 {
		return func(b *testing.B) float64 {
			rate, _ := env.directIngest(b, n, conns, batch, copyPlain)
			env.expectReviews(b, n)
			return rate
		}
	}
	consumer := func(writers int) func(b *testing.B) float64 {
		return func(b *testing.B) float64 { return env.consumerIngest(b, n, writers) }
	}
	variants := []struct {
		name     string
		baseline string // plain-copy with as many connections
		run      func(b *testing.B) float64
	}{
		{"per-message", "", upserts(n/10, 1, n/60, insertPerMessage)}, // polled in six parts
		{"plain-copy", "", copies(1)},
		{"staging", "plain-copy", upserts(n, 1, batch, upsertStaging)},
		{"unnest", "plain-copy", upserts(n, 1, batch, upsertUnnest)},
		{"consumer", "plain-copy", consumer(1)},
		{"plain-copy-2conn", "", copies(2)},
		{"consumer-2conn", "plain-copy-2conn", consumer(2)},
	}
	b.Logf("%d reviews, %d rounds; batches of %d records, linger %s", n, rounds, batch, cfg.ConsumerLinger)
	rates := map[string][]float64{}
	for range b.N {
		for range rounds {
			for _, v := range variants {
				env.reset(b)
				rates[v.name] = append(rates[v.name], v.run(b))
			}
		}
	}
	perMessage := median(rates["per-message"])
	for _, v := range variants {
		rs := rates[v.name]
		m := median(rs)
		b.ReportMetric(m, v.name+"-rows/s")
		b.Logf("%-17s median %6.0f rows/s, min %6.0f, max %6.0f", v.name, m, slices.Min(rs), slices.Max(rs))
		if v.baseline != "" {
			b.ReportMetric(100*m/median(rates[v.baseline]), v.name+"-%-of-"+v.baseline)
			b.ReportMetric(m/perMessage, v.name+"-x-per-message")
		}
	}
}

// commitClock times a run from its first committed batch to its last.
type commitClock struct {
	mu                    sync.Mutex
	first, last           time.Time
	firstRecords, records int
}

func (c *commitClock) committed(records int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.first.IsZero() {
		c.first, c.firstRecords = now, records
	}
	c.last = now
	c.records += records
}

// rate is the records committed after the first batch per second.
func (c *commitClock) rate(b *testing.B) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.last.After(c.first) {
		b.Fatal("one batch only: make PLAYWATCH_BENCH_REVIEWS larger than CONSUMER_MAX_POLL_RECORDS")
	}
	return float64(c.records-c.firstRecords) / c.last.Sub(c.first).Seconds()
}

type ingestBenchEnv struct {
	logger  *slog.Logger
	cfg     Config
	pool    *pgxpool.Pool
	brokers []string
	group   int // a fresh consumer group per consumer run
}

const benchApps = 40

func newIngestBenchEnv(b *testing.B, n int, cfg Config) *ingestBenchEnv {
	logger := benchLogger(b)
	pool := newDurableBenchPool(b)
	for i := range benchApps {
		registerApps(b, pool, fmt.Sprintf("com.bench.app%02d", i))
	}
	// Four partitions, so that two writers get even shares.
	broker, err := startEmbeddedBroker(embeddedBrokerOptions{Addr: "127.0.0.1:0", DataDir: b.TempDir(), RetentionCheck: time.Hour}, logger)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(broker.Close)
	brokers := broker.Addrs()
	withAdmin(b, brokers, func(ctx context.Context, adm *kadm.Client) {
		if err := ensureTopics(ctx, adm, topicSpec{Partitions: 4, Replication: -1, Retention: 24 * time.Hour}, allTopics, logger); err != nil {
			b.Fatal(err)
		}
	})
	produce(b, brokers, benchReviews(n)...)
	return &ingestBenchEnv{logger: logger, cfg: cfg, pool: pool, brokers: brokers}
}

// benchReviews is n review messages, one in five a newer version of an
// earlier review of the same app (so in the same partition).
func benchReviews(n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	text := "Works well on my phone, but the last update made notifications late. Please fix it, otherwise five stars. " +
		"Stickers and channels are great, calls sometimes drop on mobile data."
	for i := range n {
		id := i
		if i%5 == 4 {
			id = int(uint64(i) * 2654435761 % uint64(i)) // an earlier message, scattered
			for id%5 == 4 {
				id--
			}
		}
		pkg := fmt.Sprintf("com.bench.app%02d", id%benchApps)
		f := map[string]any{"package_name": pkg, "review_id": fmt.Sprintf("gp:AOqpTOH%012d", id), "user_name": fmt.Sprintf("User %d", id),
			"thumbs_up_count": i % 97, "score": 1 + i%5, "content": text, "country": "us", "lang": "en",
			"at":         testCrawl.Add(-time.Duration(id) * time.Second).Format(time.RFC3339),
			"crawled_at": testCrawl.Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano)}
		recs[i] = rec(topicReviews, pkg, msgJSON(f))
	}
	return recs
}

func (e *ingestBenchEnv) reset(b *testing.B) {
	b.StopTimer()
	defer b.StartTimer()
	if _, err := e.pool.Exec(context.Background(), `TRUNCATE reviews, app_stats, consumer_offsets, dead_letter_events; CHECKPOINT`); err != nil {
		b.Fatal(err)
	}
}

// consumerIngest runs the storage consumer over the n reviews and returns
// its rate. It joins the group with the reviews paused and stores one
// app-stats record first, so that it is assigned and fetching.
func (e *ingestBenchEnv) consumerIngest(b *testing.B, n, writers int) float64 {
	e.group++
	opts := consumerOptionsFrom(e.cfg)
	opts.Group = fmt.Sprintf("bench-%d", e.group)
	opts.Writers = writers
	opts.MaxPollRecords *= writers
	var mu sync.Mutex
	var clock commitClock
	warmedUp, stored, done := false, 0, make(chan struct{})
	tc := startLoggedTestConsumer(b, e.logger, e.pool, e.brokers, opts, consumerHooks{afterCommit: func(_ context.Context, parts []partitionBatch) error {
		mu.Lock()
		defer mu.Unlock()
		reviews := 0
		for _, p := range parts {
			if p.topic == topicAppStats {
				warmedUp = true
			} else {
				reviews += len(p.records)
			}
		}
		if reviews > 0 {
			clock.committed(reviews)
			if stored += reviews; stored == n {
				close(done)
			}
		}
		return nil
	}})
	tc.cl.PauseFetchTopics(topicReviews)
	const warm = "com.bench.app00"
	produce(b, e.brokers, rec(topicAppStats, warm, msgJSON(statFields(warm, testCrawl.Add(time.Duration(e.group)*time.Second)))))
	waitFor(b, 30*time.Second, "the warm-up record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return warmedUp
	})
	tc.cl.ResumeFetchTopics(topicReviews)
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatal("the consumer did not store every review")
	}
	if err := tc.stop(); err != nil {
		b.Fatal(err)
	}
	e.expectReviews(b, n-n/5)
	return clock.rate(b)
}

func (e *ingestBenchEnv) expectReviews(b *testing.B, want int) {
	if got := count(b, e.pool, `SELECT count(*) FROM reviews`); got != want {
		b.Fatalf("%d reviews stored, want %d", got, want)
	}
}

// batchWriter writes one batch of decoded reviews on one connection.
type batchWriter func(ctx context.Context, conn *pgxpool.Conn, rows []reviewRow) error

// directIngest polls n records without a group and writes each batch with
// write on conns connections in parallel (partitions split between them).
// Like the consumer, it polls and decodes the next batch while the previous
// one is written. It returns its rate and the distinct reviews it saw.
func (e *ingestBenchEnv) directIngest(b *testing.B, n, conns, batch int, write batchWriter) (float64, int) {
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topicReviews),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	apps := &packageIDs{ids: map[string]int64{}}
	distinct := map[string]bool{}
	var inflight chan error
	finish := func() {
		if inflight != nil {
			if err := <-inflight; err != nil {
				b.Fatal(err)
			}
			inflight = nil
		}
	}
	var clock commitClock
	for got := 0; got < n; {
		var parts []partitionBatch
		cl.PollRecords(ctx, min(batch*conns, n-got)).EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				parts = append(parts, partitionBatch{topicPartition: topicPartition{p.Topic, p.Partition}, records: p.Records})
			}
		})
		var shares []*batchRows
		records := 0
		for _, share := range assignWriters(parts, conns) {
			var recs []*kgo.Record
			for _, p := range share {
				recs = append(recs, p.records...)
			}
			got += len(recs)
			records += len(recs)
			rows := decodeRecords(recs, 1<<20, time.Now())
			if err := apps.resolve(ctx, e.pool, rows); err != nil || len(rows.dead) > 0 {
				b.Fatalf("decode: %v, %d dead letters", err, len(rows.dead))
			}
			for _, r := range rowsIn[reviewMessage](rows) {
				distinct[r.msg.ReviewID] = true
			}
			shares = append(shares, rows)
		}
		finish()
		done := make(chan error, 1)
		go func() {
			errs := make([]error, len(shares))
			var wg sync.WaitGroup
			for i, rows := range shares {
				wg.Go(func() {
					conn, err := e.pool.Acquire(ctx)
					if err != nil {
						errs[i] = err
						return
					}
					defer conn.Release()
					errs[i] = write(ctx, conn, rowsIn[reviewMessage](rows))
				})
			}
			wg.Wait()
			clock.committed(records)
			done <- errors.Join(errs...)
		}()
		inflight = done
	}
	finish()
	return clock.rate(b), len(distinct)
}

func insertPerMessage(ctx context.Context, conn *pgxpool.Conn, rows []reviewRow) error {
	for i := range rows {
		r := &rows[i]
		if _, err := conn.Exec(ctx, `
			INSERT INTO reviews AS r (application_id, review_id, user_name, thumbs_up_count, score, content, at, last_synced_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (review_id) DO UPDATE SET
				user_name = EXCLUDED.user_name, thumbs_up_count = EXCLUDED.thumbs_up_count, score = EXCLUDED.score,
				content = EXCLUDED.content, at = EXCLUDED.at, last_synced_at = EXCLUDED.last_synced_at
			WHERE EXCLUDED.last_synced_at > r.last_synced_at`,
			r.appID, r.msg.ReviewID, r.msg.UserName, r.msg.ThumbsUpCount, r.msg.Score, r.msg.Content, r.msg.At, r.msg.CrawledAt); err != nil {
			return err
		}
	}
	return nil
}

// copyPlain copies the batch straight into reviews; review ids get the
// record's offset appended, as COPY cannot update.
func copyPlain(ctx context.Context, conn *pgxpool.Conn, rows []reviewRow) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"reviews"},
			[]string{"application_id", "review_id", "user_name", "thumbs_up_count", "score", "content", "at", "last_synced_at"},
			pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
				r := &rows[i]
				id := r.msg.ReviewID + "#" + strconv.FormatInt(r.src.Offset, 10)
				return []any{r.appID, id, r.msg.UserName, r.msg.ThumbsUpCount, r.msg.Score, r.msg.Content, r.msg.At, r.msg.CrawledAt}, nil
			}))
		return err
	})
}

// upsertUnnest is the alternative to the staging table: the batch as arrays.
func upsertUnnest(ctx context.Context, conn *pgxpool.Conn, rows []reviewRow) error {
	rows = keepNewestReviews(rows)
	n := len(rows)
	apps, ids, users, thumbs := make([]int64, n), make([]string, n), make([]*string, n), make([]int64, n)
	scores, contents, ats, synced := make([]*int, n), make([]*string, n), make([]time.Time, n), make([]time.Time, n)
	for i := range rows {
		r := &rows[i]
		apps[i], ids[i], users[i], thumbs[i] = r.appID, r.msg.ReviewID, r.msg.UserName, r.msg.ThumbsUpCount
		scores[i], contents[i], ats[i], synced[i] = r.msg.Score, r.msg.Content, r.msg.At, r.msg.CrawledAt
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			INSERT INTO reviews AS r (application_id, review_id, user_name, thumbs_up_count, score, content, at, last_synced_at)
			SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::smallint[], $6::text[], $7::timestamptz[], $8::timestamptz[])
			ON CONFLICT (review_id) DO UPDATE SET
				user_name = EXCLUDED.user_name, thumbs_up_count = EXCLUDED.thumbs_up_count, score = EXCLUDED.score,
				content = EXCLUDED.content, at = EXCLUDED.at, last_synced_at = EXCLUDED.last_synced_at
			WHERE EXCLUDED.last_synced_at > r.last_synced_at`, apps, ids, users, thumbs, scores, contents, ats, synced)
		return err
	})
}

// upsertStaging is the consumer's write path for reviews (the upsert and
// review_storefronts), alone.
func upsertStaging(ctx context.Context, conn *pgxpool.Conn, rows []reviewRow) error {
	if err := ensureStagingTables(ctx, conn.Conn().PgConn()); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := reviewsContract.write(ctx, tx, rows, false)
		return err
	})
}
