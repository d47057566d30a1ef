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

// knownReviews are an app's newest stored reviews by review id.
type knownReviews map[string]knownReview

// reached says whether page holds a review stored unchanged: same id, same
// at (to PostgreSQL's microsecond), same text. Everything after it on the
// store is older, hence stored too (docs/design.md "Incremental review
// paging").
func (k knownReviews) reached(page []review) bool {
	for _, r := range page {
		kr, ok := k[r.ReviewID]
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

// KnownReviews returns the limit newest stored reviews of pkg: one backward
// scan of reviews_application_id_at_idx (docs/schema.md).
func (p *pgKnownReviews) KnownReviews(ctx context.Context, pkg string, limit int) (knownReviews, error) {
	rows, err := p.pool.Query(ctx, `
SELECT r.review_id, r.at, md5(r.content)
FROM reviews r
WHERE r.application_id = (SELECT id FROM apps_registry_application WHERE package_name = $1)
ORDER BY r.at DESC
LIMIT $2`, pkg, limit)
	if err != nil {
		return nil, fmt.Errorf("stored reviews of %s: %w", pkg, err)
	}
	defer rows.Close()
	known := make(knownReviews, limit)
	for rows.Next() {
		var id string
		var kr knownReview
		var sum *string
		if err := rows.Scan(&id, &kr.At, &sum); err != nil {
			return nil, fmt.Errorf("stored reviews of %s: %w", pkg, err)
		}
		if sum != nil {
			kr.ContentMD5 = *sum
		}
		known[id] = kr
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stored reviews of %s: %w", pkg, err)
	}
	return known, nil
}
