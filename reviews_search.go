package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Review search (docs/schema.md "reviews", migration 15): the consumer
// stores with each review its text in the sentiment code's normal form
// (normalizeSentimentText and its tokens: ي/ك → ی/ک, no ZWNJ, Persian and
// Arabic digits as ASCII, lower case, می/نمی joined to their verb), as
// words between single spaces with a space at each end, so that a pg_trgm
// LIKE finds a substring ('%term%') and a whole word ('% term %') alike.

// searchTextVersion is the version of searchTextOf. Change it whenever
// searchTextOf's output changes (TestSearchTextVersion holds a digest of its
// output on a fixed text): the backfill then writes every stored review
// again.
const searchTextVersion = 1

// searchTextOf is reviews.search_text of a review's content: NULL for no
// content or no word.
func searchTextOf(content *string) (text *string) {
	if content == nil {
		return nil
	}
	// The consumer calls this while it writes a batch, where a panic is not
	// recovered: one review the normaliser fails on would stop the consumer,
	// and again at every restart. Such a review is stored unsearchable.
	defer func() {
		if recover() != nil {
			text = nil
		}
	}()
	words := searchWords(*content)
	if len(words) == 0 {
		return nil
	}
	s := " " + strings.Join(words, " ") + " "
	return &s
}

// searchWords is the words and emoji of s after the sentiment code's
// normalisation.
func searchWords(s string) []string {
	sc := &sentScratch{}
	sc.norm = normalizeSentimentText(sc.norm[:0], s)
	tokenizeSentiment(sc)
	var words []string
	for _, t := range sc.toks {
		if t.kind != tokBreak && t.e > t.s {
			words = append(words, string(sc.tb[t.s:t.e]))
		}
	}
	return words
}

// minSubstringRunes is the shortest search term matched inside words: a
// trigram index cannot find shorter ones, and they would match almost
// everything; shorter terms match whole words only.
const minSubstringRunes = 3

// searchPatterns are the LIKE patterns of a query's terms, all of which a
// review's search_text must match.
func searchPatterns(q string) []string {
	var out []string
	for _, w := range searchWords(q) {
		w = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(w)
		if len([]rune(w)) < minSubstringRunes {
			out = append(out, "% "+w+" %")
		} else {
			out = append(out, "%"+w+"%")
		}
	}
	return out
}

// searchBackfillBatch is how many reviews one backfill transaction
// normalises: short transactions, so the consumer and the sentiment job
// wait for none for long.
const searchBackfillBatch = 2000

// searchBackfillLockKey keeps one backfill at a time across servers.
const searchBackfillLockKey = 0x706c7773_72636862 // "plwsrchb"

// backfillSearchText writes search_text of every stored review whose
// search_version is not searchTextVersion (stored before migration 15, by
// an older playwatch, or with an older normalisation), up the ids in
// batches, and logs its progress; it also sets first_at of reviews an
// older playwatch stored after the migration. Rows locked by another writer are
// skipped and taken by a later pass; it ends when a pass finds nothing to
// do and returns how many rows it wrote. A second backfill running (another
// server) makes it return at once.
func backfillSearchText(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int64, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("search backfill: %w", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(searchBackfillLockKey)).Scan(&locked); err != nil {
		return 0, fmt.Errorf("search backfill: lock: %w", err)
	}
	if !locked {
		logger.Info("search backfill runs elsewhere; not starting another")
		return 0, nil
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(searchBackfillLockKey)) //nolint:errcheck // the session ends anyway
	var todo int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM reviews WHERE search_version IS DISTINCT FROM $1`, searchTextVersion).Scan(&todo); err != nil {
		return 0, fmt.Errorf("search backfill: count: %w", err)
	}
	if todo == 0 {
		return 0, nil
	}
	logger.Info("search backfill starting", "reviews", todo, "version", searchTextVersion)
	var done int64
	started, lastLog := time.Now(), time.Now()
	for {
		passDone := int64(0)
		for last := int64(0); ; {
			n, next, err := backfillSearchBatch(ctx, conn.Conn(), last)
			if err != nil {
				return done, err
			}
			passDone += n
			done += n
			if next == 0 {
				break
			}
			last = next
			if time.Since(lastLog) >= 5*time.Second {
				logger.Info("search backfill progress", "done", done, "of", todo, "last_id", last)
				lastLog = time.Now()
			}
		}
		if passDone == 0 {
			break
		}
	}
	logger.Info("search backfill finished", "reviews", done, "took", time.Since(started).Round(time.Millisecond))
	return done, nil
}

// backfillSearchBatch normalises the next batch of reviews to do after id
// last, in one transaction; next is the batch's last id, 0 at the end.
func backfillSearchBatch(ctx context.Context, conn *pgx.Conn, last int64) (n, next int64, err error) {
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, content FROM reviews WHERE id > $1 AND search_version IS DISTINCT FROM $2
			ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED`, last, searchTextVersion, searchBackfillBatch)
		if err != nil {
			return err
		}
		var ids []int64
		var texts []*string
		var id int64
		var content *string
		if _, err := pgx.ForEachRow(rows, []any{&id, &content}, func() error {
			ids, texts = append(ids, id), append(texts, searchTextOf(content))
			return nil
		}); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		next = ids[len(ids)-1]
		tag, err := tx.Exec(ctx, `UPDATE reviews r SET search_text = u.t, search_version = $3, first_at = coalesce(r.first_at, r.at)
			FROM unnest($1::bigint[], $2::text[]) AS u(id, t) WHERE r.id = u.id`, ids, texts, searchTextVersion)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("search backfill: %w", err)
	}
	return n, next, nil
}
