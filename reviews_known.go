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

// knownReviews are what an app's crawl knows of its stored reviews.
type knownReviews struct {
	newest map[string]knownReview // the newest ones, by review id
	stored int                    // how many are stored, counted up to a bound
}

// reached says whether page holds a review stored unchanged: same id, same
// at (to PostgreSQL's microsecond), same text. Everything after it on the
// store is older, hence stored too (docs/design.md "Incremental review
// paging").
func (k knownReviews) reached(page []review) bool {
	for _, r := range page {
		kr, ok := k.newest[r.ReviewID]
		if !ok {
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

// KnownReviews returns the limit newest stored reviews of pkg and how many
// are stored, counted up to countUpTo: one statement, both parts scans of
// reviews_application_id_at_idx (docs/schema.md) that stop at their bound.
func (p *pgKnownReviews) KnownReviews(ctx context.Context, pkg string, limit, countUpTo int) (knownReviews, error) {
	rows, err := p.pool.Query(ctx, `
WITH app AS (SELECT id FROM apps_registry_application WHERE package_name = $1)
SELECT r.review_id, r.at, md5(r.content),
       (SELECT count(*) FROM (SELECT 1 FROM reviews WHERE application_id = (SELECT id FROM app) LIMIT $3) s)
FROM reviews r
WHERE r.application_id = (SELECT id FROM app)
ORDER BY r.at DESC
LIMIT $2`, pkg, limit, countUpTo)
	if err != nil {
		return knownReviews{}, fmt.Errorf("stored reviews of %s: %w", pkg, err)
	}
	defer rows.Close()
	known := knownReviews{newest: make(map[string]knownReview, limit)}
	for rows.Next() {
		var id string
		var kr knownReview
		var sum *string
		if err := rows.Scan(&id, &kr.At, &sum, &known.stored); err != nil {
			return knownReviews{}, fmt.Errorf("stored reviews of %s: %w", pkg, err)
		}
		if sum != nil {
			kr.ContentMD5 = *sum
		}
		known.newest[id] = kr
	}
	if err := rows.Err(); err != nil {
		return knownReviews{}, fmt.Errorf("stored reviews of %s: %w", pkg, err)
	}
	return known, nil
}
