package main

// The status page's reads of the review rollups (migration 17, docs/schema.md
// §Rollups): hourly buckets per app and storefront, so that a page's count
// of reviews reads the buckets of its window, never every review.

// rollupSentimentSQL sums a rollup's reviews by the sentiment job's label,
// in the order of sentimentCounts' fields scanned by the page (” is not
// labelled yet).
const rollupSentimentSQL = `coalesce(sum(reviews) FILTER (WHERE sentiment = 'POSITIVE'), 0)::bigint AS pos,
		coalesce(sum(reviews) FILTER (WHERE sentiment = 'NEUTRAL'), 0)::bigint AS neu,
		coalesce(sum(reviews) FILTER (WHERE sentiment = 'NEGATIVE'), 0)::bigint AS neg,
		coalesce(sum(reviews) FILTER (WHERE sentiment = ''), 0)::bigint AS none`

// rollupLast24hSQL is the hourly buckets of the storefront sf of the app a
// in the last 24 hours before $1, to the hour.
const rollupLast24hSQL = `review_rollup_hourly
	WHERE application_id = a.id AND country = sf.country AND lang = sf.lang
	  AND hour > $1::timestamptz - interval '24 hours' AND hour <= $1`
