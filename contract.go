package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A topic contract is the whole definition of one topic, in its own file
// (contract_app_stats.go, contract_reviews.go, contract_network_metrics.go):
// the message and its JSON encoding, the consumer's validation, the row, the
// staging table and its COPY columns, the statement that moves a batch into
// the table, and the time the freshness metric follows. This file holds what
// they share and the list the consumer, `dlq replay` and the consumer's
// metrics go through.

// contracts lists every topic contract, in the order a batch writes its
// tables.
var contracts = []topicContract{appStatsContract, reviewsContract, networkMetricsContract}

// allTopics lists every topic playwatch creates and consumes.
var allTopics = contractTopics()

func contractTopics() []string {
	topics := make([]string, len(contracts))
	for i, c := range contracts {
		topics[i] = c.topicName()
	}
	return topics
}

// topicContract is what the consumer, dlq replay and the metrics use of a
// contract.
type topicContract interface {
	topicName() string
	tableName() string
	stagingDDL() string
	newRows() topicRows
}

// topicRows is one contract's rows of a batch.
type topicRows interface {
	// add decodes and validates a record of the contract's topic and keeps
	// its row, or says why it is a dead letter.
	add(src *kgo.Record, now time.Time) *invalidRecord
	packageNames(note func(pkg string))
	// resolve sets each row's app id from ids and moves the rows of
	// unregistered packages to dead.
	resolve(ids map[string]int64, dead *[]deadLetter)
	// withoutStorefront notes the app of each row whose message names no
	// storefront; setStorefronts gives those rows their app's first
	// storefront (consumer_storefronts.go).
	withoutStorefront(note func(appID int64))
	setStorefronts(first map[int64]locale)
	keep(keep func(*kgo.Record) bool)
	// write stores the rows; in narrow mode it also returns the rows
	// PostgreSQL refused, as dead letters.
	write(ctx context.Context, tx pgx.Tx, narrow bool) (rowCounts, []deadLetter, error)
	newest() time.Time
}

// contractMessage is what a topic's message type provides, through its
// pointer.
type contractMessage[M any] interface {
	*M
	validate(now time.Time) *invalidRecord
	packageName() string
	// newestTime is the time the freshness metric follows.
	newestTime() time.Time
}

// row is one row of a contract's table: the message, its app's id, and the
// record it came from (for its Kafka position and for dead-lettering it if
// PostgreSQL refuses it).
type row[M any] struct {
	src   *kgo.Record
	appID int64
	msg   M
}

// column is one column of a contract's staging table, COPYed from the
// message and moved into the table under the same name.
type column[M any] struct {
	name    string
	sqlType string
	value   func(*M) any
}

// tableContract is a topic contract whose messages become rows of one table.
type tableContract[M any, P contractMessage[M]] struct {
	topic string
	table string
	// columns follow application_id, which every table has.
	columns []column[M]
	// conflict ends the INSERT … SELECT from the staging table into the
	// table, which is aliased t.
	conflict string
	// prepare, when set, picks the rows that are written into the table
	// (of the rows of a write, which it leaves as they are).
	prepare func([]row[M]) []row[M]
	// afterWrite, when set, runs after the rows are in the table, on all
	// the rows of the write, those prepare left out included.
	afterWrite func(ctx context.Context, tx pgx.Tx, rows []row[M]) (rowCounts, error)

	staging     string
	copyColumns []string
	moveSQL     string
}

// newTableContract completes c with its staging table and statements.
func newTableContract[M any, P contractMessage[M]](c tableContract[M, P]) *tableContract[M, P] {
	c.staging = "playwatch_stage_" + c.table
	c.copyColumns = []string{"application_id"}
	for _, col := range c.columns {
		c.copyColumns = append(c.copyColumns, col.name)
	}
	list := strings.Join(c.copyColumns, ", ")
	c.moveSQL = fmt.Sprintf("INSERT INTO %s AS t (%s)\nSELECT %s FROM %s\n%s", c.table, list, list, c.staging, c.conflict)
	return &c
}

func (c *tableContract[M, P]) topicName() string { return c.topic }
func (c *tableContract[M, P]) tableName() string { return c.table }
func (c *tableContract[M, P]) newRows() topicRows {
	return &contractRows[M, P]{c: c}
}

// stagingDDL creates the contract's staging table: temporary, per
// connection, emptied by every COMMIT, with the columns of its target and no
// indexes.
func (c *tableContract[M, P]) stagingDDL() string {
	defs := []string{"application_id bigint"}
	for _, col := range c.columns {
		defs = append(defs, col.name+" "+col.sqlType)
	}
	return fmt.Sprintf("CREATE TEMP TABLE IF NOT EXISTS %s (%s) ON COMMIT DELETE ROWS;", c.staging, strings.Join(defs, ", "))
}

// write COPYs rows into the staging table and moves them into the table
// with one statement. clear empties the staging table first: in narrow mode
// it still holds the rows of the part written before.
func (c *tableContract[M, P]) write(ctx context.Context, tx pgx.Tx, rows []row[M], clear bool) (rowCounts, error) {
	if clear {
		if _, err := tx.Exec(ctx, "DELETE FROM "+c.staging); err != nil {
			return nil, err
		}
	}
	written := rows
	if c.prepare != nil {
		written = c.prepare(rows)
	}
	vals := make([]any, len(c.copyColumns))
	_, err := tx.CopyFrom(ctx, pgx.Identifier{c.staging}, c.copyColumns,
		pgx.CopyFromSlice(len(written), func(i int) ([]any, error) {
			r := &written[i]
			vals[0] = r.appID
			for j := range c.columns {
				vals[j+1] = c.columns[j].value(&r.msg)
			}
			return vals, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", c.table, err)
	}
	tag, err := tx.Exec(ctx, c.moveSQL)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", c.table, err)
	}
	counts := rowCounts{c.table: tag.RowsAffected()}
	if c.afterWrite != nil {
		more, err := c.afterWrite(ctx, tx, rows)
		if err != nil {
			return nil, err
		}
		counts.add(more)
	}
	return counts, nil
}

// contractRows holds the rows of one contract in a batch.
type contractRows[M any, P contractMessage[M]] struct {
	c    *tableContract[M, P]
	rows []row[M]
}

func (t *contractRows[M, P]) add(src *kgo.Record, now time.Time) *invalidRecord {
	r := row[M]{src: src}
	if bad := decodeStrict(src.Value, &r.msg); bad != nil {
		return bad
	}
	if bad := P(&r.msg).validate(now); bad != nil {
		return bad
	}
	t.rows = append(t.rows, r)
	return nil
}

func (t *contractRows[M, P]) packageNames(note func(string)) {
	for i := range t.rows {
		note(P(&t.rows[i].msg).packageName())
	}
}

func (t *contractRows[M, P]) resolve(ids map[string]int64, dead *[]deadLetter) {
	out := t.rows[:0]
	for _, r := range t.rows {
		pkg := P(&r.msg).packageName()
		id, ok := ids[pkg]
		if !ok {
			*dead = append(*dead, newDeadLetter(r.src, reasonUnregistered, fmt.Sprintf(
				"package %s is not registered; register it (POST /api/v1/apps) and run playwatch dlq replay", pkg)))
			continue
		}
		r.appID = id
		out = append(out, r)
	}
	t.rows = out
}

func (t *contractRows[M, P]) keep(keep func(*kgo.Record) bool) {
	out := t.rows[:0]
	for _, r := range t.rows {
		if keep(r.src) {
			out = append(out, r)
		}
	}
	t.rows = out
}

func (t *contractRows[M, P]) write(ctx context.Context, tx pgx.Tx, narrow bool) (rowCounts, []deadLetter, error) {
	return writeTable(ctx, tx, t.rows, narrow, t.c.write)
}

func (t *contractRows[M, P]) newest() time.Time {
	var newest time.Time
	for i := range t.rows {
		if n := P(&t.rows[i].msg).newestTime(); n.After(newest) {
			newest = n
		}
	}
	return newest
}

// rowCounts are the rows one transaction inserted or updated, by table.
type rowCounts map[string]int64

func (c rowCounts) add(o rowCounts) {
	for table, n := range o {
		c[table] += n
	}
}

// batchRows is a batch of records sorted into what goes to which table.
type batchRows struct {
	tables []topicRows // one per contract, in the order of contracts
	dead   []deadLetter
}

// decodeRecords validates each record against its topic's contract.
func decodeRecords(recs []*kgo.Record, maxBytes int, now time.Time) *batchRows {
	b := &batchRows{tables: make([]topicRows, len(contracts))}
	for i, c := range contracts {
		b.tables[i] = c.newRows()
	}
	for _, r := range recs {
		b.add(r, maxBytes, now)
	}
	return b
}

// add validates one record and appends it to its table, or to the dead letters.
func (b *batchRows) add(r *kgo.Record, maxBytes int, now time.Time) {
	bad := checkEnvelope(r.Value, maxBytes)
	if bad == nil {
		bad = &invalidRecord{reasonUnknownTopic, fmt.Sprintf("topic %q has no message contract", r.Topic)}
		for i, c := range contracts {
			if c.topicName() == r.Topic {
				bad = addRecovering(b.tables[i], r, now)
				break
			}
		}
	}
	if bad != nil {
		b.dead = append(b.dead, newDeadLetter(r, bad.code, bad.detail))
	}
}

// addRecovering is rows.add, with a panic of the decoding or the checks
// made a dead letter of that record: one record no check foresaw never
// stops the consumer, which would meet it again after a restart.
func addRecovering(rows topicRows, r *kgo.Record, now time.Time) (bad *invalidRecord) {
	defer func() {
		if v := recover(); v != nil {
			bad = &invalidRecord{reasonPanic, fmt.Sprintf("checking the record panicked (a bug of playwatch; replay it once fixed): %v", recoveredPanic(v))}
		}
	}()
	return rows.add(r, now)
}

// newestTimes is the newest time of each topic's rows, for the freshness
// metric.
func (b *batchRows) newestTimes() map[string]time.Time {
	out := map[string]time.Time{}
	for i, c := range contracts {
		if t := b.tables[i].newest(); !t.IsZero() {
			out[c.topicName()] = t
		}
	}
	return out
}

const stagingReadyKey = "playwatch_staging_ready"

// ensureStagingTables creates the contracts' staging tables on a connection
// that does not have them yet.
func ensureStagingTables(ctx context.Context, pc *pgconn.PgConn) error {
	if pc.CustomData()[stagingReadyKey] == true {
		return nil
	}
	ddl := make([]string, len(contracts))
	for i, c := range contracts {
		ddl[i] = c.stagingDDL()
	}
	if _, err := pc.Exec(ctx, strings.Join(ddl, "\n")).ReadAll(); err != nil {
		return fmt.Errorf("create staging tables: %w", err)
	}
	pc.CustomData()[stagingReadyKey] = true
	return nil
}

// messageTime is t in UTC at the microsecond precision PostgreSQL keeps, so
// that a message and the row stored from it carry the same instant.
func messageTime(t time.Time) time.Time {
	return t.UTC().Truncate(time.Microsecond)
}
