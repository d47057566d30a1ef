package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The storefront of the app-stats and reviews messages: the country and
// language the listing or review was read in (docs/design.md "Message
// contracts").

// storefront checks a message's country and lang: both given, each a code
// as crawl-jobs carry them, or neither (a message of an older playwatch,
// stored in its app's first storefront).
func (c *checks) storefront(country, lang string) {
	if country == "" && lang == "" {
		return
	}
	for _, f := range []struct{ name, v, other string }{{"country", country, "lang"}, {"lang", lang, "country"}} {
		if f.v == "" {
			c.fail(reasonMissing, "%s is required with %s", f.name, f.other)
		} else if err := parseLocaleCode(f.v); err != nil {
			c.fail(reasonBadValue, "%s %q: %v", f.name, truncateForReason(f.v), err)
		}
	}
}

// storefrontCode is a storefront code as a column value: never the empty
// string, which NOT NULL would let through.
func storefrontCode(v string) any {
	if v == "" {
		return nil
	}
	return v
}

// storefrontMessage is a message that names the storefront it was read in.
type storefrontMessage interface {
	storefront() locale
	setStorefront(locale)
}

func (t *contractRows[M, P]) withoutStorefront(note func(appID int64)) {
	for i := range t.rows {
		if m, ok := any(P(&t.rows[i].msg)).(storefrontMessage); ok && m.storefront() == (locale{}) {
			note(t.rows[i].appID)
		}
	}
}

func (t *contractRows[M, P]) setStorefronts(first map[int64]locale) {
	for i := range t.rows {
		m, ok := any(P(&t.rows[i].msg)).(storefrontMessage)
		if !ok || m.storefront() != (locale{}) {
			continue
		}
		if l, ok := first[t.rows[i].appID]; ok {
			m.setStorefront(l)
		}
	}
}

// resolve sets the app id of every row (packageIDs.resolve) and the
// storefront of the rows whose message names none.
func (s *consumerStore) resolve(ctx context.Context, q querier, b *batchRows) error {
	if err := s.apps.resolve(ctx, q, b); err != nil {
		return err
	}
	return s.fillStorefronts(ctx, q, b)
}

// fillStorefronts gives the rows whose message names no storefront (an
// older playwatch's) their app's first storefront: position 0 of
// app_storefronts, else its default one from is_iranian_app and the
// PLAYSTORE_* settings (localeDefaults.storefronts). It is read when it is
// needed, never cached: a PATCH of the app's storefronts applies at once.
func (s *consumerStore) fillStorefronts(ctx context.Context, q querier, b *batchRows) error {
	var ids []int64
	seen := map[int64]bool{}
	for _, t := range b.tables {
		t.withoutStorefront(func(id int64) {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		})
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, `
		SELECT a.id, a.is_iranian_app, f.country, f.lang
		  FROM apps_registry_application a
		  LEFT JOIN app_storefronts f ON f.application_id = a.id AND f.position = 0
		 WHERE a.id = ANY($1)`, ids)
	if err != nil {
		return fmt.Errorf("read the first storefronts: %w", err)
	}
	first := map[int64]locale{}
	var id int64
	var a app
	var country, lang *string
	_, err = pgx.ForEachRow(rows, []any{&id, &a.IsIranianApp, &country, &lang}, func() error {
		a.Storefronts = nil
		if country != nil && lang != nil {
			a.Storefronts = []locale{{Lang: *lang, Country: *country}}
		}
		first[id] = s.locales.storefronts(a)[0]
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the first storefronts: %w", err)
	}
	for _, t := range b.tables {
		t.setStorefronts(first)
	}
	return nil
}

// tableReviewStorefronts records the storefronts each review was seen in.
const tableReviewStorefronts = "review_storefronts"

// recordReviewStorefronts records, for every row of a reviews write, that
// its review was seen in the row's storefront: one review_storefronts row
// per review and storefront, first_seen_at the time of the transaction
// that first stored it from there (a new review's equals its
// reviews.first_seen_at). It runs in the batch's transaction, after the
// upsert, on all the rows of the write (the versions keepNewestReviews left
// out name storefronts too), and inserts what is not there yet, so a
// redelivery, a dlq replay or a narrowed retry adds nothing twice. The
// rollups count each row it inserts, by their trigger (migration 17).
func recordReviewStorefronts(ctx context.Context, tx pgx.Tx, rows []reviewRow) (rowCounts, error) {
	type seenIn struct{ reviewID, country, lang string }
	seen := make(map[seenIn]bool, len(rows))
	ids, countries, langs := make([]string, 0, len(rows)), make([]string, 0, len(rows)), make([]string, 0, len(rows))
	for i := range rows {
		m := &rows[i].msg
		k := seenIn{m.ReviewID, m.Country, m.Lang}
		// A row whose storefront could not be settled records none:
		// ('', '') is the rollups' whole-app key.
		if seen[k] || m.Country == "" || m.Lang == "" {
			continue
		}
		seen[k] = true
		ids, countries, langs = append(ids, k.reviewID), append(countries, k.country), append(langs, k.lang)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		SELECT r.id, r.application_id, u.country, u.lang, now()
		  FROM unnest($1::text[], $2::text[], $3::text[]) AS u(review_id, country, lang)
		  JOIN reviews r ON r.review_id = u.review_id
		 ORDER BY r.id, u.country, u.lang
		ON CONFLICT (review_id, country, lang) DO NOTHING`, ids, countries, langs)
	if err != nil {
		return nil, fmt.Errorf("record review storefronts: %w", err)
	}
	return rowCounts{tableReviewStorefronts: tag.RowsAffected()}, nil
}
