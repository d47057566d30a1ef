package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// consumerStore is the storage consumer's write path into PostgreSQL, shared
// by the consumer and by `dlq replay`. A batch goes in as one transaction:
// each table's rows are COPYed into a temporary staging table and moved with
// one INSERT … SELECT … ON CONFLICT, which measured fastest (see
// consumer_bench_test.go).
type consumerStore struct {
	pool  *pgxpool.Pool
	group string // consumer group whose offsets the consumer stores
	apps  *packageIDs
}

func newConsumerStore(pool *pgxpool.Pool, group string) *consumerStore {
	return &consumerStore{pool: pool, group: group, apps: &packageIDs{ids: map[string]int64{}}}
}

// topicPartition names one partition.
type topicPartition struct {
	topic     string
	partition int32
}

// partitionBatch is the records of one partition in a poll batch, in offset order.
type partitionBatch struct {
	topicPartition
	records []*kgo.Record
	hwm     int64 // high watermark at the fetch, for the lag metric
}

// rowCounts are the rows one transaction inserted or updated, by table.
type rowCounts struct {
	stats, reviews, metrics, registry, deadLetters int64
}

func (c *rowCounts) add(o rowCounts) {
	c.stats += o.stats
	c.reviews += o.reviews
	c.metrics += o.metrics
	c.registry += o.registry
	c.deadLetters += o.deadLetters
}

// storeOutcome is what one committed batch transaction did.
type storeOutcome struct {
	rows rowCounts
	dead []deadLetter // dead letters written, validation and SQL ones
}

// storeBatch writes a poll batch (one writer's share) in one transaction: its
// rows, its dead letters and each partition's next offset. The partitions'
// offset rows are locked first, and records below a partition's stored
// offset, written before by this or another member, are skipped: a batch is
// never stored twice, whatever rebalances or lost acknowledgements did.
//
// narrow makes each table's write find the rows PostgreSQL refuses, one by
// one under savepoints, and dead-letter them with the SQL error; it is used
// after a data error. beforeCommit, when set, runs just before COMMIT.
func (s *consumerStore) storeBatch(ctx context.Context, parts []partitionBatch, b *batchRows, narrow bool, beforeCommit func(context.Context) error) (storeOutcome, error) {
	if err := s.apps.resolve(ctx, s.pool, b); err != nil {
		return storeOutcome{}, err
	}
	var out storeOutcome
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		fence, err := lockOffsets(ctx, tx, s.group, parts)
		if err != nil {
			return err
		}
		b.dropBelow(parts, fence)
		if out.rows, out.dead, err = writeRows(ctx, tx, b, narrow); err != nil {
			return err
		}
		out.dead = slices.Concat(b.dead, out.dead)
		if out.rows.deadLetters, err = insertDeadLetters(ctx, tx, out.dead); err != nil {
			return err
		}
		if err := saveOffsets(ctx, tx, s.group, parts); err != nil {
			return err
		}
		if beforeCommit != nil {
			return beforeCommit(ctx)
		}
		return nil
	})
	return out, err
}

// inTx runs fn in a transaction on a connection that has the staging tables.
func (s *consumerStore) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	if err := ensureStagingTables(ctx, conn.Conn().PgConn()); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, fn)
}

// The staging tables are temporary, per connection, created once and emptied
// by every COMMIT; they have the columns of their target, without indexes.
const stagingDDL = `
CREATE TEMP TABLE IF NOT EXISTS playwatch_stage_app_stats (
    application_id bigint, min_installs bigint, score double precision, ratings bigint,
    reviews_count bigint, version text, ad_supported boolean, app_updated_at timestamptz,
    crawled_at timestamptz) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS playwatch_stage_reviews (
    application_id bigint, review_id text, user_name text, thumbs_up_count integer,
    score smallint, content text, at timestamptz, last_synced_at timestamptz) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS playwatch_stage_network_metrics (
    application_id bigint, analysis_id uuid, scenario text, rtt_handshake double precision,
    retransmission_count integer, out_of_order_count integer, spurious_retransmission_count integer,
    zero_window_count integer, tcp_reset_count integer, bytes_transferred_total bigint,
    bytes_payload_total bigint, overhead_ratio double precision, source_pcap_filename text,
    analyzed_at timestamptz) ON COMMIT DELETE ROWS;`

const stagingReadyKey = "playwatch_staging_ready"

func ensureStagingTables(ctx context.Context, pc *pgconn.PgConn) error {
	if pc.CustomData()[stagingReadyKey] == true {
		return nil
	}
	if _, err := pc.Exec(ctx, stagingDDL).ReadAll(); err != nil {
		return fmt.Errorf("create staging tables: %w", err)
	}
	pc.CustomData()[stagingReadyKey] = true
	return nil
}

// lockOffsets locks the offset rows of the batch's partitions, creating the
// missing ones (at 0: never written), and returns their next offsets.
func lockOffsets(ctx context.Context, tx pgx.Tx, group string, parts []partitionBatch) (map[topicPartition]int64, error) {
	topics, partitions := make([]string, len(parts)), make([]int32, len(parts))
	for i, p := range parts {
		topics[i], partitions[i] = p.topic, p.partition
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO consumer_offsets (consumer_group, topic, "partition", next_offset)
		SELECT $1, u.topic, u.p, 0 FROM unnest($2::text[], $3::int[]) AS u(topic, p)
		ON CONFLICT (consumer_group, topic, "partition") DO NOTHING`, group, topics, partitions); err != nil {
		return nil, fmt.Errorf("create offset rows: %w", err)
	}
	rows, err := tx.Query(ctx, `
		SELECT topic, "partition", next_offset FROM consumer_offsets
		WHERE consumer_group = $1 AND (topic, "partition") IN (SELECT * FROM unnest($2::text[], $3::int[]))
		ORDER BY topic, "partition" FOR UPDATE`, group, topics, partitions)
	if err != nil {
		return nil, fmt.Errorf("lock offsets: %w", err)
	}
	fence := map[topicPartition]int64{}
	var tp topicPartition
	var next int64
	_, err = pgx.ForEachRow(rows, []any{&tp.topic, &tp.partition, &next}, func() error {
		fence[tp] = next
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lock offsets: %w", err)
	}
	return fence, nil
}

// saveOffsets moves each partition's stored next offset forward, never back.
func saveOffsets(ctx context.Context, tx pgx.Tx, group string, parts []partitionBatch) error {
	topics, partitions, next := make([]string, len(parts)), make([]int32, len(parts)), make([]int64, len(parts))
	for i, p := range parts {
		topics[i], partitions[i], next[i] = p.topic, p.partition, p.records[len(p.records)-1].Offset+1
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO consumer_offsets (consumer_group, topic, "partition", next_offset)
		SELECT $1, u.topic, u.p, u.next FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(topic, p, next)
		ON CONFLICT (consumer_group, topic, "partition") DO UPDATE
		SET next_offset = EXCLUDED.next_offset, updated_at = now()
		WHERE consumer_offsets.next_offset < EXCLUDED.next_offset`, group, topics, partitions, next)
	if err != nil {
		return fmt.Errorf("save offsets: %w", err)
	}
	return nil
}

// loadOffsets returns the stored next offset of every partition of the group.
func (s *consumerStore) loadOffsets(ctx context.Context) (map[topicPartition]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT topic, "partition", next_offset FROM consumer_offsets WHERE consumer_group = $1`, s.group)
	if err != nil {
		return nil, fmt.Errorf("load offsets: %w", err)
	}
	out := map[topicPartition]int64{}
	var tp topicPartition
	var next int64
	_, err = pgx.ForEachRow(rows, []any{&tp.topic, &tp.partition, &next}, func() error {
		out[tp] = next
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load offsets: %w", err)
	}
	return out, nil
}

// tableRow is what the write path needs of a row of any of the three tables.
type tableRow[T any] interface {
	*T
	record() *kgo.Record
	packageName() string
	setApp(id int64)
}

func (r *statRow) record() *kgo.Record    { return r.src }
func (r *statRow) packageName() string    { return r.msg.PackageName }
func (r *statRow) setApp(id int64)        { r.appID = id }
func (r *reviewRow) record() *kgo.Record  { return r.src }
func (r *reviewRow) packageName() string  { return r.msg.PackageName }
func (r *reviewRow) setApp(id int64)      { r.appID = id }
func (r *networkRow) record() *kgo.Record { return r.src }
func (r *networkRow) packageName() string { return r.msg.PackageName }
func (r *networkRow) setApp(id int64)     { r.appID = id }

// dropBelow removes, in place, the rows and dead letters of records below
// their partition's stored offset. It is a no-op in the usual case, where
// every partition's batch starts at or after its stored offset.
func (b *batchRows) dropBelow(parts []partitionBatch, fence map[topicPartition]int64) {
	stale := false
	for _, p := range parts {
		if p.records[0].Offset < fence[p.topicPartition] {
			stale = true
		}
	}
	if !stale {
		return
	}
	keep := func(r *kgo.Record) bool {
		return r.Offset >= fence[topicPartition{r.Topic, r.Partition}]
	}
	b.stats = keepRows(b.stats, keep)
	b.reviews = keepRows(b.reviews, keep)
	b.metrics = keepRows(b.metrics, keep)
	b.dead = slices.DeleteFunc(b.dead, func(d deadLetter) bool { return !keep(d.src) })
}

func keepRows[T any, P tableRow[T]](rows []T, keep func(*kgo.Record) bool) []T {
	return slices.DeleteFunc(rows, func(r T) bool { return !keep(P(&r).record()) })
}

// keepNewestReviews keeps one version of each review of a batch: the one
// with the latest crawled_at (the first of equal ones, as the upsert's
// guard would). ON CONFLICT cannot update one row twice in a statement.
func keepNewestReviews(rows []reviewRow) []reviewRow {
	seen := make(map[string]int, len(rows))
	out := rows[:0]
	for _, r := range rows {
		if i, ok := seen[r.msg.ReviewID]; ok {
			if r.msg.CrawledAt.After(out[i].msg.CrawledAt) {
				out[i] = r
			}
			continue
		}
		seen[r.msg.ReviewID] = len(out)
		out = append(out, r)
	}
	return out
}

// writeRows writes the batch's rows of the three tables. In narrow mode it
// also returns the rows PostgreSQL refused, as dead letters.
func writeRows(ctx context.Context, tx pgx.Tx, b *batchRows, narrow bool) (rowCounts, []deadLetter, error) {
	b.reviews = keepNewestReviews(b.reviews)
	var total rowCounts
	var dead []deadLetter
	add := func(c rowCounts, d []deadLetter, err error) error {
		total.add(c)
		dead = append(dead, d...)
		return err
	}
	if err := add(writeTable(ctx, tx, b.stats, narrow, writeStats)); err != nil {
		return rowCounts{}, nil, err
	}
	if err := add(writeTable(ctx, tx, b.reviews, narrow, writeReviews)); err != nil {
		return rowCounts{}, nil, err
	}
	if err := add(writeTable(ctx, tx, b.metrics, narrow, writeNetworkMetrics)); err != nil {
		return rowCounts{}, nil, err
	}
	return total, dead, nil
}

type tableWriter[T any] func(ctx context.Context, tx pgx.Tx, rows []T, clearStaging bool) (rowCounts, error)

// writeTable writes rows in one go or, in narrow mode, halves them under
// savepoints until the rows PostgreSQL refuses are single ones, which become
// dead letters; errors that are not about data end the transaction.
func writeTable[T any, P tableRow[T]](ctx context.Context, tx pgx.Tx, rows []T, narrow bool, write tableWriter[T]) (rowCounts, []deadLetter, error) {
	if len(rows) == 0 {
		return rowCounts{}, nil, nil
	}
	if !narrow {
		c, err := write(ctx, tx, rows, false)
		return c, nil, err
	}
	var total rowCounts
	var dead []deadLetter
	var try func(part []T) error
	try = func(part []T) error {
		if _, err := tx.Exec(ctx, "SAVEPOINT narrow"); err != nil {
			return err
		}
		c, err := write(ctx, tx, part, true)
		if err == nil {
			total.add(c)
			_, err = tx.Exec(ctx, "RELEASE SAVEPOINT narrow")
			return err
		}
		if classifyDBError(err) != dbData {
			return err
		}
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT narrow; RELEASE SAVEPOINT narrow"); rerr != nil {
			return rerr
		}
		if len(part) == 1 {
			dead = append(dead, newDeadLetter(P(&part[0]).record(), reasonSQLError, describeSQLError(err)))
			return nil
		}
		mid := len(part) / 2
		if err := try(part[:mid]); err != nil {
			return err
		}
		return try(part[mid:])
	}
	return total, dead, try(rows)
}

func clearStaging(ctx context.Context, tx pgx.Tx, table string, clear bool) error {
	if !clear {
		return nil
	}
	_, err := tx.Exec(ctx, "DELETE FROM "+table)
	return err
}

func writeStats(ctx context.Context, tx pgx.Tx, rows []statRow, clear bool) (rowCounts, error) {
	if err := clearStaging(ctx, tx, "playwatch_stage_app_stats", clear); err != nil {
		return rowCounts{}, err
	}
	vals := make([]any, 9)
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"playwatch_stage_app_stats"},
		[]string{"application_id", "min_installs", "score", "ratings", "reviews_count", "version", "ad_supported", "app_updated_at", "crawled_at"},
		pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
			r := &rows[i]
			vals[0], vals[1], vals[2], vals[3], vals[4] = r.appID, r.msg.MinInstalls, r.msg.Score, r.msg.Ratings, r.msg.ReviewsCount
			vals[5], vals[6], vals[7], vals[8] = r.msg.Version, r.msg.AdSupported, r.msg.AppUpdatedAt, r.msg.CrawledAt
			return vals, nil
		}))
	if err != nil {
		return rowCounts{}, fmt.Errorf("copy app_stats: %w", err)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO app_stats (application_id, min_installs, score, ratings, reviews_count, version, ad_supported, app_updated_at, crawled_at)
		SELECT application_id, min_installs, score, ratings, reviews_count, version, ad_supported, app_updated_at, crawled_at
		FROM playwatch_stage_app_stats
		ON CONFLICT (application_id, crawled_at) DO NOTHING`)
	if err != nil {
		return rowCounts{}, fmt.Errorf("insert app_stats: %w", err)
	}
	filled, err := fillRegistry(ctx, tx, rows)
	if err != nil {
		return rowCounts{}, err
	}
	return rowCounts{stats: tag.RowsAffected(), registry: filled}, nil
}

// fillRegistry sets an app's display_name and category from the newest
// store title and genre of the batch where they are NULL or empty; a value
// somebody set is never overwritten.
func fillRegistry(ctx context.Context, tx pgx.Tx, rows []statRow) (int64, error) {
	newest := map[int64]*statRow{}
	for i := range rows {
		r := &rows[i]
		if r.msg.Title == nil && r.msg.Genre == nil {
			continue
		}
		if n, ok := newest[r.appID]; !ok || r.msg.CrawledAt.After(n.msg.CrawledAt) {
			newest[r.appID] = r
		}
	}
	if len(newest) == 0 {
		return 0, nil
	}
	ids := make([]int64, 0, len(newest))
	for id := range newest {
		ids = append(ids, id)
	}
	slices.Sort(ids) // one lock order for all writers
	titles, genres := make([]*string, len(ids)), make([]*string, len(ids))
	for i, id := range ids {
		titles[i], genres[i] = newest[id].msg.Title, newest[id].msg.Genre
	}
	tag, err := tx.Exec(ctx, `
		UPDATE apps_registry_application a SET
			display_name = CASE WHEN coalesce(a.display_name, '') = '' AND f.title <> '' THEN f.title ELSE a.display_name END,
			category     = CASE WHEN coalesce(a.category, '') = '' AND f.genre <> '' THEN f.genre ELSE a.category END
		FROM unnest($1::bigint[], $2::text[], $3::text[]) AS f(id, title, genre)
		WHERE a.id = f.id
		  AND ((coalesce(a.display_name, '') = '' AND f.title <> '') OR (coalesce(a.category, '') = '' AND f.genre <> ''))`,
		ids, titles, genres)
	if err != nil {
		return 0, fmt.Errorf("fill registry names: %w", err)
	}
	return tag.RowsAffected(), nil
}

func writeReviews(ctx context.Context, tx pgx.Tx, rows []reviewRow, clear bool) (rowCounts, error) {
	if err := clearStaging(ctx, tx, "playwatch_stage_reviews", clear); err != nil {
		return rowCounts{}, err
	}
	vals := make([]any, 8)
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"playwatch_stage_reviews"},
		[]string{"application_id", "review_id", "user_name", "thumbs_up_count", "score", "content", "at", "last_synced_at"},
		pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
			r := &rows[i]
			vals[0], vals[1], vals[2], vals[3] = r.appID, r.msg.ReviewID, r.msg.UserName, r.msg.ThumbsUpCount
			vals[4], vals[5], vals[6], vals[7] = r.msg.Score, r.msg.Content, r.msg.At, r.msg.CrawledAt
			return vals, nil
		}))
	if err != nil {
		return rowCounts{}, fmt.Errorf("copy reviews: %w", err)
	}
	tag, err := tx.Exec(ctx, upsertReviewsFromStaging)
	if err != nil {
		return rowCounts{}, fmt.Errorf("upsert reviews: %w", err)
	}
	return rowCounts{reviews: tag.RowsAffected()}, nil
}

// upsertReviewsFromStaging never sets sentiment (the sentiment job's) nor
// first_seen_at, and only a strictly newer crawl replaces a stored version.
const upsertReviewsFromStaging = `
	INSERT INTO reviews AS r (application_id, review_id, user_name, thumbs_up_count, score, content, at, last_synced_at)
	SELECT application_id, review_id, user_name, thumbs_up_count, score, content, at, last_synced_at
	FROM playwatch_stage_reviews
	ON CONFLICT (review_id) DO UPDATE SET
		user_name = EXCLUDED.user_name, thumbs_up_count = EXCLUDED.thumbs_up_count, score = EXCLUDED.score,
		content = EXCLUDED.content, at = EXCLUDED.at, last_synced_at = EXCLUDED.last_synced_at
	WHERE EXCLUDED.last_synced_at > r.last_synced_at`

func writeNetworkMetrics(ctx context.Context, tx pgx.Tx, rows []networkRow, clear bool) (rowCounts, error) {
	if err := clearStaging(ctx, tx, "playwatch_stage_network_metrics", clear); err != nil {
		return rowCounts{}, err
	}
	vals := make([]any, 14)
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"playwatch_stage_network_metrics"},
		[]string{"application_id", "analysis_id", "scenario", "rtt_handshake", "retransmission_count", "out_of_order_count",
			"spurious_retransmission_count", "zero_window_count", "tcp_reset_count", "bytes_transferred_total",
			"bytes_payload_total", "overhead_ratio", "source_pcap_filename", "analyzed_at"},
		pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
			r := &rows[i]
			var file *string
			if r.msg.SourcePcapFilename != "" {
				file = &r.msg.SourcePcapFilename
			}
			vals[0], vals[1], vals[2], vals[3] = r.appID, r.analysisID, r.msg.Scenario, r.msg.RTTHandshake
			vals[4], vals[5], vals[6] = r.msg.RetransmissionCount, r.msg.OutOfOrderCount, r.msg.SpuriousRetransmissionCount
			vals[7], vals[8], vals[9] = r.msg.ZeroWindowCount, r.msg.TCPResetCount, r.msg.BytesTransferredTotal
			vals[10], vals[11], vals[12], vals[13] = r.msg.BytesPayloadTotal, r.msg.OverheadRatio, file, r.msg.AnalyzedAt
			return vals, nil
		}))
	if err != nil {
		return rowCounts{}, fmt.Errorf("copy network_metrics: %w", err)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO network_metrics (application_id, analysis_id, scenario, rtt_handshake, retransmission_count,
			out_of_order_count, spurious_retransmission_count, zero_window_count, tcp_reset_count,
			bytes_transferred_total, bytes_payload_total, overhead_ratio, source_pcap_filename, analyzed_at)
		SELECT application_id, analysis_id, scenario, rtt_handshake, retransmission_count,
			out_of_order_count, spurious_retransmission_count, zero_window_count, tcp_reset_count,
			bytes_transferred_total, bytes_payload_total, overhead_ratio, source_pcap_filename, analyzed_at
		FROM playwatch_stage_network_metrics
		ON CONFLICT (analysis_id) DO NOTHING`)
	if err != nil {
		return rowCounts{}, fmt.Errorf("insert network_metrics: %w", err)
	}
	return rowCounts{metrics: tag.RowsAffected()}, nil
}

// insertDeadLetters writes dead letters; a record dead-lettered before (an
// offset reset, a replay of the topic) keeps its first row.
func insertDeadLetters(ctx context.Context, tx pgx.Tx, dead []deadLetter) (int64, error) {
	if len(dead) == 0 {
		return 0, nil
	}
	n := len(dead)
	topics, partitions, offsets := make([]string, n), make([]int32, n), make([]int64, n)
	keys, payloads, reasons := make([]*string, n), make([][]byte, n), make([]string, n)
	for i, d := range dead {
		topics[i], partitions[i], offsets[i] = d.src.Topic, d.src.Partition, d.src.Offset
		keys[i], payloads[i], reasons[i] = deadLetterKey(d.src.Key), d.src.Value, d.reason
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO dead_letter_events (topic, "partition", kafka_offset, kafka_key, raw_payload, error_reason)
		SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::bytea[], $6::text[])
		ON CONFLICT (topic, "partition", kafka_offset) DO NOTHING`,
		topics, partitions, offsets, keys, payloads, reasons)
	if err != nil {
		return 0, fmt.Errorf("insert dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}

// deadLetterKey is the Kafka key as text: as it is when it is UTF-8 without
// NUL, else hex-encoded with a \x prefix (bytea's text form).
func deadLetterKey(k []byte) *string {
	if k == nil {
		return nil
	}
	s := string(k)
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		s = `\x` + hex.EncodeToString(k)
	}
	return &s
}

// packageIDs caches package_name → apps_registry_application.id. Only
// registered names are cached, so an app registered later is found at once;
// forget drops everything after a foreign-key error (an app was deleted).
type packageIDs struct {
	mu  sync.RWMutex
	ids map[string]int64
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (p *packageIDs) forget() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.ids)
}

// resolve sets the app id of every row whose package is registered and
// moves the other rows to the dead letters. It works on its own copy of the
// ids it needs, so a forget by another writer meanwhile changes nothing.
func (p *packageIDs) resolve(ctx context.Context, q querier, b *batchRows) error {
	ids := map[string]int64{}
	var unknown []string
	seen := map[string]bool{}
	p.mu.RLock()
	note := func(pkg string) {
		if seen[pkg] {
			return
		}
		seen[pkg] = true
		if id, ok := p.ids[pkg]; ok {
			ids[pkg] = id
		} else {
			unknown = append(unknown, pkg)
		}
	}
	for i := range b.stats {
		note(b.stats[i].msg.PackageName)
	}
	for i := range b.reviews {
		note(b.reviews[i].msg.PackageName)
	}
	for i := range b.metrics {
		note(b.metrics[i].msg.PackageName)
	}
	p.mu.RUnlock()

	if len(unknown) > 0 {
		rows, err := q.Query(ctx, `SELECT package_name, id FROM apps_registry_application WHERE package_name = ANY($1)`, unknown)
		if err != nil {
			return fmt.Errorf("look up package names: %w", err)
		}
		var name string
		var id int64
		if _, err := pgx.ForEachRow(rows, []any{&name, &id}, func() error { ids[name] = id; return nil }); err != nil {
			return fmt.Errorf("look up package names: %w", err)
		}
		p.mu.Lock()
		for _, name := range unknown {
			if id, ok := ids[name]; ok {
				p.ids[name] = id
			}
		}
		p.mu.Unlock()
	}

	b.stats = resolveRows(b.stats, ids, &b.dead)
	b.reviews = resolveRows(b.reviews, ids, &b.dead)
	b.metrics = resolveRows(b.metrics, ids, &b.dead)
	return nil
}

func resolveRows[T any, P tableRow[T]](rows []T, ids map[string]int64, dead *[]deadLetter) []T {
	out := rows[:0]
	for i := range rows {
		row := P(&rows[i])
		id, ok := ids[row.packageName()]
		if !ok {
			*dead = append(*dead, newDeadLetter(row.record(), reasonUnregistered, fmt.Sprintf(
				"package %s is not registered; register it (POST /api/v1/apps) and run playwatch dlq replay", row.packageName())))
			continue
		}
		row.setApp(id)
		out = append(out, rows[i])
	}
	return out
}

// dbErrorKind is what the consumer does about a failed batch transaction.
type dbErrorKind int

const (
	// dbTransient: the connection or the server, not the data (connection
	// lost, server restarting, deadlock, serialization failure): retry.
	dbTransient dbErrorKind = iota
	// dbData: PostgreSQL refused some row's data: find it and dead-letter it.
	dbData
	// dbBlocked: anything else (schema, permissions, disk full): retry,
	// an operator has to act; dead-lettering good records would hide it.
	dbBlocked
)

func (k dbErrorKind) String() string {
	return [...]string{"transient", "data", "blocked"}[k]
}

func classifyDBError(err error) dbErrorKind {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return dbTransient // network, connect, closed connection
	}
	code := pgErr.Code
	switch {
	case strings.HasPrefix(code, "08"), // connection exception
		strings.HasPrefix(code, "40"),  // serialization failure, deadlock
		strings.HasPrefix(code, "57P"), // admin/crash shutdown, cannot connect now
		code == "57014",                // query canceled (statement_timeout)
		code == "53300",                // too many connections
		code == "55P03":                // lock not available
		return dbTransient
	case strings.HasPrefix(code, "22"), // data exception
		strings.HasPrefix(code, "23"), // integrity constraint violation
		strings.HasPrefix(code, "54"), // program limit exceeded (e.g. row too big)
		code == "P0001":               // raised by a trigger
		return dbData
	}
	return dbBlocked
}

// describeSQLError is the reason of a row PostgreSQL refused.
func describeSQLError(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return truncate(err.Error(), 300)
	}
	s := fmt.Sprintf("PostgreSQL refused the row: %s (SQLSTATE %s", pgErr.Message, pgErr.Code)
	if pgErr.ConstraintName != "" {
		s += ", constraint " + pgErr.ConstraintName
	}
	s += ")"
	if pgErr.Detail != "" {
		s += ": " + truncate(pgErr.Detail, 300)
	}
	return strings.ToValidUTF8(s, "?")
}

// newestTimes is the newest crawled_at/analyzed_at per topic among rows.
func (b *batchRows) newestTimes() map[string]time.Time {
	out := map[string]time.Time{}
	for i := range b.stats {
		if t := b.stats[i].msg.CrawledAt; t.After(out[topicAppStats]) {
			out[topicAppStats] = t
		}
	}
	for i := range b.reviews {
		if t := b.reviews[i].msg.CrawledAt; t.After(out[topicReviews]) {
			out[topicReviews] = t
		}
	}
	for i := range b.metrics {
		if t := b.metrics[i].msg.AnalyzedAt; t.After(out[topicNetworkMetrics]) {
			out[topicNetworkMetrics] = t
		}
	}
	return out
}
