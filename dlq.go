package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The dlq tools. `dlq list` shows dead letters; `dlq replay` stores them
// after their cause is fixed (typically: the package got registered);
// `dlq discard` marks those that can never be stored, kept for audit, which
// list, replay, the status page and the dashboard then skip.
//
// Replay runs each dead letter's raw payload through the consumer's own
// validation and write path, straight into the tables, in one transaction
// per chunk that also deletes the rows it stored and updates the reason of
// those that still fail. It does not produce to the topics again: a
// re-produced record would get a new Kafka identity, so a record that failed
// again would become a second dead letter, and producing and deleting the
// old row cannot be one transaction. Writing directly is atomic, idempotent
// (a second replay finds nothing to do; the upserts are idempotent anyway)
// and tells the operator at once what was stored and what still fails.

const (
	dlqListSynopsis    = "dlq list [--topic T] [--reason CODE] [--since 24h|RFC3339] [--limit N] [--json] [flags]"
	dlqReplaySynopsis  = "dlq replay [--topic T] [--reason CODE] [--discarded] [flags] (--all | ID...)"
	dlqDiscardSynopsis = "dlq discard [--topic T] [--before 24h|RFC3339] [--by NAME] [flags] (--reason CODE | ID...)"
)

var dlqUsage = usageOf(dlqListSynopsis, dlqReplaySynopsis, dlqDiscardSynopsis)

// dlqSubcommands are the subcommands of `playwatch dlq`.
var dlqSubcommands = []string{"list", "replay", "discard"}

func dlqSynopsis(sub string) string {
	switch sub {
	case "list":
		return dlqListSynopsis
	case "discard":
		return dlqDiscardSynopsis
	}
	return dlqReplaySynopsis
}

// dlqFlags are the flags of the dlq subcommands.
type dlqFlags struct {
	topic, reason, since string
	limit                int
	json, all            bool
	discarded            bool   // list, replay: discarded dead letters too
	before, by           string // discard
}

func (f *dlqFlags) register(sub string) func(*flag.FlagSet) {
	return func(fs *flag.FlagSet) {
		fs.StringVar(&f.topic, "topic", "", "only dead letters of this topic")
		fs.StringVar(&f.reason, "reason", "", "only dead letters with this reason code, e.g. unregistered_package")
		if sub == "discard" {
			fs.StringVar(&f.before, "before", "", "only dead letters that occurred before this time (RFC 3339) or this long ago (24h)")
			fs.StringVar(&f.by, "by", "", "who discards them, kept with them (default: the OS user)")
			return
		}
		fs.BoolVar(&f.discarded, "discarded", false, "discarded dead letters too (dlq discard)")
		if sub == "list" {
			fs.StringVar(&f.since, "since", "", "only dead letters that occurred within this duration (24h, 7d) or after this time (RFC 3339)")
			fs.IntVar(&f.limit, "limit", 100, "list at most this many, newest first (0: all)")
			fs.BoolVar(&f.json, "json", false, "print JSON instead of a table")
		} else {
			fs.BoolVar(&f.all, "all", false, "replay every dead letter (that matches --topic and --reason)")
		}
	}
}

// deadLetterFilter selects dead letters; zero fields do not filter, except
// that discarded ones are skipped unless Discarded.
type deadLetterFilter struct {
	Topic     string
	Reason    string // reason code
	Since     time.Time
	Before    time.Time
	Limit     int
	Discarded bool
}

func (f *dlqFlags) filter(now time.Time) (deadLetterFilter, error) {
	out := deadLetterFilter{Topic: f.topic, Reason: f.reason, Limit: f.limit, Discarded: f.discarded}
	// A topic that holds no dead letters would list nothing, silently.
	if f.topic != "" && !slices.Contains(allTopics, f.topic) {
		return out, usageError{fmt.Sprintf("--topic %q: not a topic with dead letters (%s)", f.topic, strings.Join(allTopics, ", "))}
	}
	if f.reason != "" && !isReasonCode(f.reason) {
		return out, usageError{fmt.Sprintf("--reason %q: not a reason code (%s)", f.reason, reasonCodeList())}
	}
	if f.limit < 0 {
		return out, usageError{"--limit must not be negative"}
	}
	if f.since != "" {
		var err error
		if out.Since, err = timeFlag("--since", f.since, now); err != nil {
			return out, err
		}
	}
	return out, nil
}

func isReasonCode(s string) bool {
	for _, r := range allReasonCodes {
		if string(r) == s {
			return true
		}
	}
	return false
}

func reasonCodeList() string {
	var s []string
	for _, r := range allReasonCodes {
		s = append(s, string(r))
	}
	return strings.Join(s, ", ")
}

// deadLetterRow is one row of dead_letter_events.
type deadLetterRow struct {
	ID          int64
	Topic       string
	Partition   int32
	Offset      int64
	Key         *string
	Payload     []byte
	Reason      string
	OccurredAt  time.Time
	DiscardedAt *time.Time
	DiscardedBy *string
}

const deadLetterColumns = `id, topic, "partition", kafka_offset, kafka_key, raw_payload, error_reason, occurred_at, discarded_at, discarded_by`

func scanDeadLetter(row pgx.CollectableRow) (deadLetterRow, error) {
	var d deadLetterRow
	err := row.Scan(&d.ID, &d.Topic, &d.Partition, &d.Offset, &d.Key, &d.Payload, &d.Reason, &d.OccurredAt, &d.DiscardedAt, &d.DiscardedBy)
	return d, err
}

// where builds the WHERE clause of f, numbering its arguments after args.
func (f deadLetterFilter) where(args []any) (string, []any) {
	conds := []string{"true"}
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if f.Topic != "" {
		add("topic = $%d", f.Topic)
	}
	if f.Reason != "" {
		add("starts_with(error_reason, $%d)", f.Reason+":")
	}
	if !f.Since.IsZero() {
		add("occurred_at >= $%d", f.Since)
	}
	if !f.Before.IsZero() {
		add("occurred_at < $%d", f.Before)
	}
	if !f.Discarded {
		conds = append(conds, "discarded_at IS NULL")
	}
	return strings.Join(conds, " AND "), args
}

// listDeadLetters returns the dead letters f selects, newest first.
func listDeadLetters(ctx context.Context, q querier, f deadLetterFilter) ([]deadLetterRow, error) {
	where, args := f.where(nil)
	sql := `SELECT ` + deadLetterColumns + ` FROM dead_letter_events WHERE ` + where + ` ORDER BY occurred_at DESC, id DESC`
	if f.Limit > 0 {
		args = append(args, f.Limit)
		sql += fmt.Sprintf(" LIMIT $%d", len(args))
	}
	return queryAll(ctx, q, "list dead letters", scanDeadLetter, sql, args...)
}

// printDeadLetterTable writes one line per dead letter for people.
func printDeadLetterTable(w io.Writer, rows []deadLetterRow, limit int) error {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	// The DISCARDED column only when a listed row is (--discarded).
	withDiscarded := slices.ContainsFunc(rows, func(d deadLetterRow) bool { return d.DiscardedAt != nil })
	discardedHeader := ""
	if withDiscarded {
		discardedHeader = "\tDISCARDED"
	}
	fmt.Fprintln(tw, "ID\tOCCURRED\tTOPIC\tPARTITION\tOFFSET\tKEY\tBYTES"+discardedHeader+"\tREASON")
	for _, d := range rows {
		key := "-"
		if d.Key != nil {
			key = printable(*d.Key, 40)
		}
		size := "null"
		if d.Payload != nil {
			size = strconv.Itoa(len(d.Payload))
		}
		discarded := ""
		switch {
		case d.DiscardedAt != nil:
			discarded = fmt.Sprintf("\t%s by %s", d.DiscardedAt.UTC().Format(time.RFC3339), printable(*d.DiscardedBy, 40))
		case withDiscarded:
			discarded = "\t-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s%s\t%s\n", d.ID, d.OccurredAt.UTC().Format(time.RFC3339),
			d.Topic, d.Partition, d.Offset, key, size, discarded, printable(d.Reason, 160))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if limit > 0 && len(rows) == limit {
		more = fmt.Sprintf(", the newest %d (--limit 0 lists all)", limit)
	}
	_, err := fmt.Fprintf(w, "%d dead letters%s\n", len(rows), more)
	return err
}

// deadLetterJSON is the --json form; a payload that is not UTF-8 comes as
// payload_base64 instead of payload.
type deadLetterJSON struct {
	ID            int64     `json:"id"`
	Topic         string    `json:"topic"`
	Partition     int32     `json:"partition"`
	Offset        int64     `json:"offset"`
	Key           *string   `json:"key"`
	Reason        string    `json:"reason"`
	OccurredAt    time.Time `json:"occurred_at"`
	Payload       *string   `json:"payload,omitempty"`
	PayloadBase64 []byte    `json:"payload_base64,omitempty"`
	// Only on a discarded one (--discarded).
	DiscardedAt *time.Time `json:"discarded_at,omitempty"`
	DiscardedBy *string    `json:"discarded_by,omitempty"`
}

func printDeadLetterJSON(w io.Writer, rows []deadLetterRow) error {
	out := make([]deadLetterJSON, len(rows))
	for i, d := range rows {
		out[i] = deadLetterJSON{ID: d.ID, Topic: d.Topic, Partition: d.Partition, Offset: d.Offset,
			Key: d.Key, Reason: d.Reason, OccurredAt: d.OccurredAt, DiscardedAt: d.DiscardedAt, DiscardedBy: d.DiscardedBy}
		if utf8.Valid(d.Payload) && d.Payload != nil {
			s := string(d.Payload)
			out[i].Payload = &s
		} else {
			out[i].PayloadBase64 = d.Payload
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// replayResult is what a replay did.
type replayResult struct {
	Stored    []int64         // stored and deleted from dead_letter_events
	StillDead []deadLetterRow // kept, with the new reason
	NotFound  []int64         // asked for by id but not there (replayed before? discarded without --discarded?)
}

const replayChunk = 500

// replayDeadLetters replays the dead letters with the given ids, or every
// one f selects when ids is empty, in chunks of one transaction each.
func (s *consumerStore) replayDeadLetters(ctx context.Context, ids []int64, f deadLetterFilter, maxRecordBytes int) (replayResult, error) {
	var res replayResult
	if len(ids) > 0 {
		found := map[int64]bool{}
		for start := 0; start < len(ids); start += replayChunk {
			chunk := ids[start:min(start+replayChunk, len(ids))]
			where, args := f.where([]any{chunk})
			sel := `SELECT ` + deadLetterColumns + ` FROM dead_letter_events WHERE id = ANY($1) AND ` + where + ` ORDER BY id FOR UPDATE`
			rows, err := s.replayChunk(ctx, sel, args, maxRecordBytes, &res)
			if err != nil {
				return res, err
			}
			for _, d := range rows {
				found[d.ID] = true
			}
		}
		for _, id := range ids {
			if !found[id] {
				res.NotFound = append(res.NotFound, id)
			}
		}
		return res, nil
	}
	for after := int64(0); ; {
		where, args := f.where([]any{after})
		sel := `SELECT ` + deadLetterColumns + ` FROM dead_letter_events WHERE id > $1 AND ` + where +
			fmt.Sprintf(` ORDER BY id LIMIT %d FOR UPDATE`, replayChunk)
		// Only an empty chunk is the end: a short one may have lost rows
		// that a concurrent discard took out under FOR UPDATE's recheck.
		rows, err := s.replayChunk(ctx, sel, args, maxRecordBytes, &res)
		if err != nil || len(rows) == 0 {
			return res, err
		}
		after = rows[len(rows)-1].ID
	}
}

// replayChunk locks the dead letters sel selects and replays them in one
// transaction; a data error PostgreSQL raises makes it retry in narrow mode.
func (s *consumerStore) replayChunk(ctx context.Context, sel string, args []any, maxRecordBytes int, res *replayResult) ([]deadLetterRow, error) {
	for narrow := false; ; narrow = true {
		var picked []deadLetterRow
		var stored []int64
		var still []deadLetterRow
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, sel, args...)
			if err != nil {
				return fmt.Errorf("select dead letters: %w", err)
			}
			if picked, err = pgx.CollectRows(rows, scanDeadLetter); err != nil || len(picked) == 0 {
				return err
			}
			stored, still, err = s.replayLocked(ctx, tx, picked, maxRecordBytes, narrow)
			return err
		})
		if err != nil && !narrow && classifyDBError(err) == dbData {
			s.apps.forget()
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("replay dead letters: %w", err)
		}
		res.Stored = append(res.Stored, stored...)
		res.StillDead = append(res.StillDead, still...)
		return picked, nil
	}
}

func (s *consumerStore) replayLocked(ctx context.Context, tx pgx.Tx, picked []deadLetterRow, maxRecordBytes int, narrow bool) ([]int64, []deadLetterRow, error) {
	recs := make([]*kgo.Record, len(picked))
	byRecord := make(map[*kgo.Record]int, len(picked))
	for i, d := range picked {
		recs[i] = &kgo.Record{Topic: d.Topic, Partition: d.Partition, Offset: d.Offset, Value: d.Payload}
		byRecord[recs[i]] = i
	}
	b := decodeRecords(recs, maxRecordBytes, time.Now())
	if err := s.resolve(ctx, tx, b); err != nil {
		return nil, nil, err
	}
	_, sqlDead, err := writeRows(ctx, tx, b, narrow)
	if err != nil {
		return nil, nil, err
	}
	dead := append(b.dead, sqlDead...)
	isDead := make([]bool, len(picked))
	deadIDs, reasons := make([]int64, len(dead)), make([]string, len(dead))
	var still []deadLetterRow
	for i, d := range dead {
		j := byRecord[d.src]
		isDead[j] = true
		deadIDs[i], reasons[i] = picked[j].ID, d.reason
		row := picked[j]
		row.Reason = d.reason
		still = append(still, row)
	}
	var stored []int64
	for i, d := range picked {
		if !isDead[i] {
			stored = append(stored, d.ID)
		}
	}
	if _, err := tx.Exec(ctx, `
		UPDATE dead_letter_events d SET error_reason = u.reason
		FROM unnest($1::bigint[], $2::text[]) AS u(id, reason) WHERE d.id = u.id`, deadIDs, reasons); err != nil {
		return nil, nil, fmt.Errorf("update reasons: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM dead_letter_events WHERE id = ANY($1)`, stored); err != nil {
		return nil, nil, fmt.Errorf("delete replayed dead letters: %w", err)
	}
	return stored, still, nil
}

// runDLQList is `playwatch dlq list`.
func runDLQList(ctx context.Context, q querier, f *dlqFlags, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return usageError{fmt.Sprintf("dlq list takes no arguments, got %q", args)}
	}
	filter, err := f.filter(time.Now())
	if err != nil {
		return err
	}
	rows, err := listDeadLetters(ctx, q, filter)
	if err != nil {
		return err
	}
	if f.json {
		return printDeadLetterJSON(stdout, rows)
	}
	return printDeadLetterTable(stdout, rows, filter.Limit)
}

// dlqReplayLockKey is the advisory lock one replay at a time holds
// (migrate.go's key is another).
const dlqReplayLockKey = 0x706c7764_6c717270 // "plwdlqrp"

// lockDLQReplay takes the replay lock on a connection of its own for the
// replay's whole run, so that two replays (on one server or two) never run
// at once; a second one stops at once rather than wait.
func lockDLQReplay(ctx context.Context, pool *pgxpool.Pool) (func(), error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("dlq replay lock: %w", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(dlqReplayLockKey)).Scan(&ok); err != nil {
		conn.Release()
		return nil, fmt.Errorf("dlq replay lock: %w", err)
	}
	if !ok {
		conn.Release()
		return nil, errors.New("another `playwatch dlq replay` is running on this database; run this one again once it has finished")
	}
	return func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(dlqReplayLockKey))
		conn.Release()
	}, nil
}

// runDLQReplay is `playwatch dlq replay`.
func runDLQReplay(ctx context.Context, s *consumerStore, f *dlqFlags, args []string, maxRecordBytes int, stdout io.Writer) error {
	ids, err := parseIDs("dlq replay", "dead letter", args)
	if err != nil {
		return err
	}
	if f.all == (len(ids) > 0) {
		return usageError{"dlq replay needs either --all or dead letter ids"}
	}
	filter, err := f.filter(time.Now())
	if err != nil {
		return err
	}
	unlock, err := lockDLQReplay(ctx, s.pool)
	if err != nil {
		return err
	}
	defer unlock()
	res, err := s.replayDeadLetters(ctx, ids, filter, maxRecordBytes)
	fmt.Fprintf(stdout, "stored %d, still dead %d", len(res.Stored), len(res.StillDead))
	if len(res.NotFound) > 0 {
		hint := "replayed before?"
		if !filter.Discarded {
			hint = "replayed before, or discarded: --discarded replays those too"
		}
		fmt.Fprintf(stdout, ", not found %d (%s): %v", len(res.NotFound), hint, res.NotFound)
	}
	fmt.Fprintln(stdout)
	for _, d := range res.StillDead {
		fmt.Fprintf(stdout, "  %d %s/%d@%d: %s\n", d.ID, d.Topic, d.Partition, d.Offset, printable(d.Reason, 200))
	}
	if err != nil {
		return errors.Join(err, errors.New("replay stopped; what was stored above is committed, run it again to go on"))
	}
	return nil
}

// discardDeadLetters marks the dead letters with the given ids, or every
// one f selects when ids is empty, as discarded by by, in one statement; it
// returns the ids it marked. One already discarded is left as it was.
func discardDeadLetters(ctx context.Context, q querier, ids []int64, f deadLetterFilter, by string) ([]int64, error) {
	f.Discarded = false // "discarded_at IS NULL": a discarded one keeps its first time and name
	f.Limit = 0
	where, args := f.where([]any{by})
	sql := `UPDATE dead_letter_events SET discarded_at = now(), discarded_by = $1 WHERE ` + where
	if len(ids) > 0 {
		args = append(args, ids)
		sql += fmt.Sprintf(" AND id = ANY($%d)", len(args))
	}
	return queryAll(ctx, q, "discard dead letters", pgx.RowTo[int64], sql+" RETURNING id", args...)
}

// discardedBy is who discards: --by, else the OS user.
func discardedBy(by string) (string, error) {
	if by == "" {
		u, err := user.Current()
		if err != nil || u.Username == "" {
			return "", usageError{fmt.Sprintf("dlq discard: cannot tell the OS user (%v): name yourself with --by", err)}
		}
		by = u.Username
	}
	if len(by) > 255 || !utf8.ValidString(by) || strings.ContainsFunc(by, unicode.IsControl) {
		return "", usageError{"--by: a name of at most 255 bytes of text, without control characters"}
	}
	return by, nil
}

// runDLQDiscard is `playwatch dlq discard`.
func runDLQDiscard(ctx context.Context, q querier, f *dlqFlags, args []string, stdout io.Writer) error {
	ids, err := parseIDs("dlq discard", "dead letter", args)
	if err != nil {
		return err
	}
	if len(ids) == 0 && f.reason == "" {
		return usageError{"dlq discard needs dead letter ids or --reason (with --topic and --before to narrow it)"}
	}
	now := time.Now()
	filter, err := f.filter(now)
	if err != nil {
		return err
	}
	if f.before != "" {
		if filter.Before, err = timeFlag("--before", f.before, now); err != nil {
			return err
		}
	}
	by, err := discardedBy(f.by)
	if err != nil {
		return err
	}
	marked, err := discardDeadLetters(ctx, q, ids, filter, by)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "discarded %d dead letters (by %s)", len(marked), by)
	if len(ids) > 0 {
		var missing []int64
		for _, id := range ids {
			if !slices.Contains(marked, id) {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			fmt.Fprintf(stdout, ", not found %d (replayed, discarded before, or not matching --topic/--reason/--before): %v", len(missing), missing)
		}
	}
	_, err = fmt.Fprintln(stdout)
	return err
}
