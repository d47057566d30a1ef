package main

import (
	"time"
)

// appStatsFromDetails maps a details result to its app-stats message
// (docs/playstore-protocol.md §5.1).
func appStatsFromDetails(d appDetails) appStatsMessage {
	m := appStatsMessage{
		PackageName:  d.PackageName,
		Title:        cleanTextPtr(&d.Title),
		Genre:        cleanTextPtr(d.Genre),
		MinInstalls:  d.MinInstalls,
		Ratings:      d.Ratings,
		ReviewsCount: d.ReviewsCount,
		Version:      cleanTextPtr(d.Version),
		AdSupported:  &d.AdSupported,
		AppUpdatedAt: d.UpdatedAt,
		CrawledAt:    messageTime(d.FetchedAt),
	}
	// An average below one star only appears on unrated listings ("0.0"
	// over 0 ratings): that zero is not data.
	if d.Score != nil && *d.Score >= 1 {
		m.Score = d.Score
	}
	return m
}

// reviewMessageFrom maps one review of pkg to its reviews message
// (docs/playstore-protocol.md §5.2).
func reviewMessageFrom(pkg string, r review) reviewMessage {
	m := reviewMessage{
		PackageName: pkg,
		ReviewID:    r.ReviewID,
		UserName:    cleanTextPtr(r.UserName),
		Score:       r.Score,
		Content:     cleanTextPtr(r.Content),
		At:          r.At,
		CrawledAt:   messageTime(r.FetchedAt),
	}
	if r.ThumbsUpCount != nil {
		m.ThumbsUpCount = *r.ThumbsUpCount
	}
	return m
}

// messageTime is t in UTC at the microsecond precision PostgreSQL keeps, so
// that a message and the row stored from it carry the same instant.
func messageTime(t time.Time) time.Time {
	return t.UTC().Truncate(time.Microsecond)
}
