package main

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// knownReviewsLimit is how many of an app's newest stored reviews an
// incremental crawl compares its pages with: two reviews pages. The paging
// stops at the first of them it meets; more only help when the newest stored
// ones were deleted on the store or the consumer lags behind the last cycle.
const knownReviewsLimit = 300

// knownReview is what the incremental stop compares of a stored review.
type knownReview struct {
	At         time.Time
	ContentMD5 string // hex md5 of the stored content; "" for NULL
}

// knownReviews are what a crawl of an app in one storefront knows of its
// stored reviews.
type knownReviews struct {
	newest map[string]knownReview // the newest ones, by review id
	stored int                    // how many are stored, counted up to a bound
	// mark is the newest review's at of the storefront's last complete
	// read (review_read_marks); zero when it has none.
	mark time.Time
}

// reached says whether page holds a review stored unchanged (same id, same
// at to PostgreSQL's microsecond, same text) that is at or before the mark.
// Everything after it on the store is older, hence read by a complete read
// (docs/design.md "Incremental review paging"). A stored review after the
// mark may come from a read that was cut, with a gap below it, so it ends
// nothing.
func (k knownReviews) reached(page []review) bool {
	for _, r := range page {
		kr, ok := k.newest[r.ReviewID]
		if !ok || kr.At.After(k.mark) {
			continue
		}
		if d := r.At.Sub(kr.At); d <= -time.Microsecond || d >= time.Microsecond {
			continue
		}
		if contentMD5(r.Content) == kr.ContentMD5 {
			return true
		}
	}
	return false
}

// contentMD5 is what PostgreSQL's md5(content) gives for the content a
// review is published with (cleaned, contract_reviews.go); "" for none.
func contentMD5(content *string) string {
	c := cleanTextPtr(content)
	if c == nil {
		return ""
	}
	h := md5.Sum([]byte(*c))
	return hex.EncodeToString(h[:])
}

// pgKnownReviews reads the known reviews from the reviews table.
type pgKnownReviews struct{ pool *pgxpool.Pool }

func newPGKnownReviews(pool *pgxpool.Pool) *pgKnownReviews { return &pgKnownReviews{pool: pool} }

// KnownReviews returns the limit newest stored reviews of pkg seen in the
// storefront loc (review_storefronts), how many of those are stored,
// counted up to countUpTo, and the storefront's read mark: one statement.
// A review stored from another storefront only is not this storefront's:
// its list may not hold it, and a complete read of this storefront never
// read past it. The reviews part walks reviews_application_id_at_idx
// (docs/schema.md) newest first, each row checked on review_storefronts'
// key, and stops at its bound; the count is a bounded scan of
// review_storefronts_application_id_idx.
func (p *pgKnownReviews) KnownReviews(ctx context.Context, pkg string, loc locale, limit, countUpTo int) (knownReviews, error) {
	rows, err := p.pool.Query(ctx, `
WITH app AS (SELECT id FROM apps_registry_application WHERE package_name = $1)
SELECT r.review_id, r.at, md5(r.content),
       (SELECT count(*) FROM (SELECT 1 FROM review_storefronts
          WHERE application_id = (SELECT id FROM app) AND country = $4 AND lang = $5 LIMIT $3) s),
       (SELECT newest_at FROM review_read_marks WHERE application_id = (SELECT id FROM app) AND country = $4 AND lang = $5)
FROM reviews r
WHERE r.application_id = (SELECT id FROM app)
  AND EXISTS (SELECT 1 FROM review_storefronts f WHERE f.review_id = r.id AND f.country = $4 AND f.lang = $5)
ORDER BY r.at DESC
LIMIT $2`, pkg, limit, countUpTo, loc.Country, loc.Lang)
	if err != nil {
		return knownReviews{}, fmt.Errorf("stored reviews of %s: %w", pkg, err)
	}
	defer rows.Close()
	known := knownReviews{newest: make(map[string]knownReview, limit)}
	for rows.Next() {
		var id string
		var kr knownReview
		var sum *string
		var mark *time.Time
		if err := rows.Scan(&id, &kr.At, &sum, &known.stored, &mark); err != nil {
			return knownReviews{}, fmt.Errorf("stored reviews of %s: %w", pkg, err)
		}
		if sum != nil {
			kr.ContentMD5 = *sum
		}
		if mark != nil {
			known.mark = *mark
		}
		known.newest[id] = kr
	}
	if err := rows.Err(); err != nil {
		return knownReviews{}, fmt.Errorf("stored reviews of %s: %w", pkg, err)
	}
	return known, nil
}

// readMarkMargin is how far after its crawl time a review may be dated and
// still be a read mark: the crawl time is when the job was planned, and the
// read runs up to a cycle after it. A later review's at is wrong (a clock or
// a parser), and a mark ahead of the store would pin it there.
const readMarkMargin = time.Hour

// SetReadMark records that a read of pkg's reviews in the storefront loc,
// at crawl time readAt, was complete and its newest review was newest. A
// mark only moves forward: one set by a crawl that finished later but read
// earlier (a job crawled twice after a rebalance) would only make reads
// longer, but there is no reason to. A stored mark more than
// readMarkMargin after readAt (set from a bad future at before the cap)
// is replaced all the same, else it would stay pinned ahead of every
// later review.
func (p *pgKnownReviews) SetReadMark(ctx context.Context, pkg string, loc locale, newest review, readAt time.Time) error {
	if newest.At.After(readAt.Add(readMarkMargin)) {
		return fmt.Errorf("read mark of %s (hl=%s gl=%s): review %s is dated %s, after the crawl time %s and its margin",
			pkg, loc.Lang, loc.Country, newest.ReviewID, newest.At.UTC().Format(time.RFC3339), readAt.UTC().Format(time.RFC3339))
	}
	_, err := p.pool.Exec(ctx, `
INSERT INTO review_read_marks (application_id, country, lang, newest_at, newest_review_id, read_at)
SELECT id, $2, $3, $4, $5, $6 FROM apps_registry_application WHERE package_name = $1
ON CONFLICT (application_id, country, lang) DO UPDATE
SET newest_at = EXCLUDED.newest_at, newest_review_id = EXCLUDED.newest_review_id, read_at = EXCLUDED.read_at
WHERE review_read_marks.newest_at <= EXCLUDED.newest_at
   OR review_read_marks.newest_at > EXCLUDED.read_at + $7 * interval '1 microsecond'`,
		pkg, loc.Country, loc.Lang, newest.At, newest.ReviewID, readAt, readMarkMargin.Microseconds())
	if err != nil {
		return fmt.Errorf("read mark of %s (hl=%s gl=%s): %w", pkg, loc.Lang, loc.Country, err)
	}
	return nil
}
