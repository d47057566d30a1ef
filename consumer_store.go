package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	pool    *pgxpool.Pool
	group   string // consumer group whose offsets the consumer stores
	apps    *packageIDs
	locales localeDefaults // PLAYSTORE_*: the storefront of a message without one
}

func newConsumerStore(pool *pgxpool.Pool, group string, locales localeDefaults) *consumerStore {
	return &consumerStore{pool: pool, group: group, apps: &packageIDs{ids: map[string]int64{}}, locales: locales}
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
	// rewind is set when the client went back below the partition's
	// position in this batch (storageConsumer.collect): the broker's log
	// no longer reached it, and the client went on from the log start.
	rewind *partitionRewind
}

// partitionRewind is where the client went on with a partition, below its
// position, after the broker answered OFFSET_OUT_OF_RANGE (its data
// was wiped, or KAFKA_BROKERS is a new cluster) or the log was truncated.
type partitionRewind struct {
	at int64 // the first record after going back: the log start
}

// offsetReset is a partition whose stored offset a batch moved back.
type offsetReset struct {
	topicPartition
	stored int64 // the stored next offset, of a log the broker no longer has
	logEnd int64 // the broker's log end at the fetch
	from   int64 // where the partition is stored from again
}

// storeOutcome is what one committed batch transaction did.
type storeOutcome struct {
	rows   rowCounts
	dead   []deadLetter  // dead letters written, validation and SQL ones
	resets []offsetReset // partitions whose stored offset went back
}

// storeBatch writes a poll batch (one writer's share) in one transaction: its
// rows, its dead letters and each partition's next offset. The partitions'
// offset rows are locked first, and records below a partition's stored
// offset, written before by this or another member, are skipped: a batch is
// never stored twice, whatever rebalances or lost acknowledgements did.
// The one exception is a partition the client went back in
// (partitionBatch.rewind) below its stored offset: that offset is of a log
// the broker no longer has, so the batch keeps all its records and moves
// the offset back to just past them (rewindOffsets).
//
// narrow makes each table's write find the rows PostgreSQL refuses, one by
// one under savepoints, and dead-letter them with the SQL error; it is used
// after a data error. beforeCommit, when set, runs just before COMMIT.
func (s *consumerStore) storeBatch(ctx context.Context, parts []partitionBatch, b *batchRows, narrow bool, beforeCommit func(context.Context) error) (storeOutcome, error) {
	if err := s.resolve(ctx, s.pool, b); err != nil {
		return storeOutcome{}, err
	}
	var out storeOutcome
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		fence, gens, err := lockOffsets(ctx, tx, s.group, parts)
		if err != nil {
			return err
		}
		out.resets = rewoundFences(parts, fence)
		if err := rewindOffsets(ctx, tx, s.group, out.resets, gens); err != nil {
			return err
		}
		b.dropBelow(parts, fence)
		if out.rows, out.dead, err = writeRows(ctx, tx, b, narrow); err != nil {
			return err
		}
		out.dead = slices.Concat(b.dead, out.dead)
		if out.rows[tableDeadLetters], err = insertDeadLetters(ctx, tx, out.dead, gens); err != nil {
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

// lockOffsets locks the offset rows of the batch's partitions, creating the
// missing ones (at 0: never written), and returns their next offsets and
// log generations.
func lockOffsets(ctx context.Context, tx pgx.Tx, group string, parts []partitionBatch) (map[topicPartition]int64, map[topicPartition]int32, error) {
	topics, partitions := make([]string, len(parts)), make([]int32, len(parts))
	for i, p := range parts {
		topics[i], partitions[i] = p.topic, p.partition
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO consumer_offsets (consumer_group, topic, "partition", next_offset)
		SELECT $1, u.topic, u.p, 0 FROM unnest($2::text[], $3::int[]) AS u(topic, p)
		ON CONFLICT (consumer_group, topic, "partition") DO NOTHING`, group, topics, partitions); err != nil {
		return nil, nil, fmt.Errorf("create offset rows: %w", err)
	}
	rows, err := tx.Query(ctx, `
		SELECT topic, "partition", next_offset, generation FROM consumer_offsets
		WHERE consumer_group = $1 AND (topic, "partition") IN (SELECT * FROM unnest($2::text[], $3::int[]))
		ORDER BY topic, "partition" FOR UPDATE`, group, topics, partitions)
	if err != nil {
		return nil, nil, fmt.Errorf("lock offsets: %w", err)
	}
	fence, gens := map[topicPartition]int64{}, map[topicPartition]int32{}
	var tp topicPartition
	var next int64
	var gen int32
	_, err = pgx.ForEachRow(rows, []any{&tp.topic, &tp.partition, &next, &gen}, func() error {
		fence[tp], gens[tp] = next, gen
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("lock offsets: %w", err)
	}
	return fence, gens, nil
}

// rewoundFences finds the partitions of the batch that the client went back
// in below their stored offset, and lowers their fence so that none of
// their records is dropped: the stored offset counts records of a log the
// broker no longer has. A partition whose stored offset is at or below the
// offset the client went back to was moved back already (by another member).
func rewoundFences(parts []partitionBatch, fence map[topicPartition]int64) []offsetReset {
	var resets []offsetReset
	for _, p := range parts {
		if p.rewind == nil || fence[p.topicPartition] <= p.rewind.at {
			continue
		}
		resets = append(resets, offsetReset{topicPartition: p.topicPartition, stored: fence[p.topicPartition], logEnd: p.hwm, from: p.rewind.at})
		lowest := p.records[0].Offset
		for _, r := range p.records {
			lowest = min(lowest, r.Offset)
		}
		fence[p.topicPartition] = lowest
	}
	return resets
}

// rewindOffsets moves the stored offsets of reset partitions back to where
// they are stored from again, and counts up their log generation (the new
// log's dead letters are told from the old one's by it), setting gens to
// the new generations for the batch's dead letters; saveOffsets then moves
// them forward past the batch. It is the only write that moves
// consumer_offsets back.
func rewindOffsets(ctx context.Context, tx pgx.Tx, group string, resets []offsetReset, gens map[topicPartition]int32) error {
	if len(resets) == 0 {
		return nil
	}
	topics, partitions, from := make([]string, len(resets)), make([]int32, len(resets)), make([]int64, len(resets))
	for i, r := range resets {
		topics[i], partitions[i], from[i] = r.topic, r.partition, r.from
	}
	rows, err := tx.Query(ctx, `
		UPDATE consumer_offsets o SET next_offset = u.next, generation = o.generation + 1, updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(topic, p, next)
		WHERE o.consumer_group = $1 AND o.topic = u.topic AND o."partition" = u.p
		RETURNING o.topic, o."partition", o.generation`, group, topics, partitions, from)
	if err != nil {
		return fmt.Errorf("move reset offsets back: %w", err)
	}
	var tp topicPartition
	var gen int32
	if _, err := pgx.ForEachRow(rows, []any{&tp.topic, &tp.partition, &gen}, func() error { gens[tp] = gen; return nil }); err != nil {
		return fmt.Errorf("move reset offsets back: %w", err)
	}
	return nil
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
	for _, t := range b.tables {
		t.keep(keep)
	}
	b.dead = slices.DeleteFunc(b.dead, func(d deadLetter) bool { return !keep(d.src) })
}

// writeRows writes the batch's rows of every table. In narrow mode it
// also returns the rows PostgreSQL refused, as dead letters.
func writeRows(ctx context.Context, tx pgx.Tx, b *batchRows, narrow bool) (rowCounts, []deadLetter, error) {
	total := rowCounts{}
	var dead []deadLetter
	for _, t := range b.tables {
		c, d, err := t.write(ctx, tx, narrow)
		if err != nil {
			return nil, nil, err
		}
		total.add(c)
		dead = append(dead, d...)
	}
	return total, dead, nil
}

// tableWriter writes rows of one table; clearStaging empties its staging
// table first.
type tableWriter[M any] func(ctx context.Context, tx pgx.Tx, rows []row[M], clearStaging bool) (rowCounts, error)

// writeTable writes rows in one go or, in narrow mode, halves them under
// savepoints until the rows PostgreSQL refuses are single ones, which become
// dead letters; errors that are not about data end the transaction.
func writeTable[M any](ctx context.Context, tx pgx.Tx, rows []row[M], narrow bool, write tableWriter[M]) (rowCounts, []deadLetter, error) {
	if len(rows) == 0 {
		return nil, nil, nil
	}
	if !narrow {
		c, err := write(ctx, tx, rows, false)
		return c, nil, err
	}
	total := rowCounts{}
	var dead []deadLetter
	var try func(part []row[M]) error
	try = func(part []row[M]) error {
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
			dead = append(dead, newDeadLetter(part[0].src, reasonSQLError, describeSQLError(err)))
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

// tableDeadLetters is where dead letters go.
const tableDeadLetters = "dead_letter_events"

// insertDeadLetters writes dead letters with the log generation of their
// partition (gens); a record dead-lettered before (read again by a new
// member or group) keeps its first row, while a record of a new log at the
// offset of a kept dead letter of the old one gets its own.
func insertDeadLetters(ctx context.Context, tx pgx.Tx, dead []deadLetter, gens map[topicPartition]int32) (int64, error) {
	if len(dead) == 0 {
		return 0, nil
	}
	n := len(dead)
	topics, partitions, offsets, generations := make([]string, n), make([]int32, n), make([]int64, n), make([]int32, n)
	keys, payloads, reasons := make([]*string, n), make([][]byte, n), make([]string, n)
	for i, d := range dead {
		topics[i], partitions[i], offsets[i] = d.src.Topic, d.src.Partition, d.src.Offset
		generations[i] = gens[topicPartition{d.src.Topic, d.src.Partition}]
		keys[i], payloads[i], reasons[i] = deadLetterKey(d.src.Key), d.src.Value, d.reason
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO dead_letter_events (topic, "partition", kafka_offset, generation, kafka_key, raw_payload, error_reason)
		SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::int[], $5::text[], $6::bytea[], $7::text[])
		ON CONFLICT (topic, "partition", kafka_offset, generation) DO NOTHING`,
		topics, partitions, offsets, generations, keys, payloads, reasons)
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
	for _, t := range b.tables {
		t.packageNames(note)
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

	for _, t := range b.tables {
		t.resolve(ids, &b.dead)
	}
	return nil
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
