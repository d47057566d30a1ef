package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// defaultFetchMaxWait is fetch's --max-wait. The crawler sits out a bench (1,
// 2, 4 … minutes); a one-off command rather says at once that the Play Store
// is turning it away, and until when.
const defaultFetchMaxWait = 30 * time.Second

// fetchApp is the body of `playwatch fetch`: it prints the app's app-stats
// message, then one reviews message per review, as JSON lines. Stats and
// reviews are independent paths: reviews are fetched even when the details
// page fails, unless the app does not exist. The returned error is one line.
func fetchApp(ctx context.Context, client *playStoreClient, pkg string, loc locale, n int, stdout io.Writer) error {
	out := json.NewEncoder(stdout)
	out.SetEscapeHTML(false)
	// One crawl, one crawled_at, as in the crawler: when it began, not
	// when each answer arrived.
	crawledAt := messageTime(client.cfg.Clock.Now())

	details, detailsErr := client.Details(ctx, pkg, loc.Lang, loc.Country)
	if errors.Is(detailsErr, errNotFound) {
		return fmt.Errorf("%s: not found on the Play Store for hl=%s gl=%s (HTTP 404)", pkg, loc.Lang, loc.Country)
	}
	if detailsErr == nil {
		m := appStatsFromDetails(details, loc)
		m.CrawledAt = crawledAt
		if err := out.Encode(m); err != nil {
			return fmt.Errorf("writing app stats: %w", err)
		}
	}
	reviews, reviewsErr := client.Reviews(ctx, pkg, loc.Lang, loc.Country, n, nil)
	for _, r := range reviews {
		m := reviewMessageFrom(pkg, loc, r)
		m.CrawledAt = crawledAt
		if err := out.Encode(m); err != nil {
			return fmt.Errorf("writing reviews: %w", err)
		}
	}
	switch {
	case detailsErr != nil && reviewsErr != nil:
		return fmt.Errorf("%w; %w (%d reviews printed)", detailsErr, reviewsErr, len(reviews))
	case detailsErr != nil:
		return fmt.Errorf("%w (%d reviews printed)", detailsErr, len(reviews))
	case reviewsErr != nil:
		return fmt.Errorf("%w (app stats and %d reviews printed)", reviewsErr, len(reviews))
	}
	return nil
}
