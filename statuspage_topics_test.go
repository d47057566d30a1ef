package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

// insertTopicReviews adds Telegram reviews with topics, as the sentiment
// job writes them: in the last 7 days 4 crash (3 negative), 2 ads (1
// negative), 1 update (negative), 1 without a topic; outside them a crash 8
// days ago and one after now. Bale gets none.
func insertTopicReviews(t *testing.T, ctx context.Context, exec func(string, ...any)) {
	t.Helper()
	for i, r := range []struct {
		ago       time.Duration
		sentiment string
		topics    []string
	}{
		{time.Hour, "NEGATIVE", []string{"crash"}},
		{2 * 24 * time.Hour, "NEGATIVE", []string{"crash"}},
		{3 * 24 * time.Hour, "NEUTRAL", []string{"crash"}},
		{4 * time.Hour, "NEGATIVE", []string{"ads"}},
		{5 * time.Hour, "POSITIVE", []string{"ads"}},
		{6 * 24 * time.Hour, "NEGATIVE", []string{"crash", "update"}},
		{7 * time.Hour, "POSITIVE", []string{}},
		{8 * 24 * time.Hour, "NEGATIVE", []string{"crash"}}, // older than 7 days
		{-time.Hour, "NEGATIVE", []string{"crash"}},         // after now
	} {
		exec(`INSERT INTO reviews (application_id, review_id, score, content, at, sentiment, topics, last_synced_at)
			SELECT id, $2, 1, 'x', $3, $4, $5, $3 FROM apps_registry_application WHERE package_name = $1`,
			statusTelegram, fmt.Sprintf("topic%d", i), statusNow.Add(-r.ago), r.sentiment, r.topics)
	}
}

// topicsStatusServer is a status page over seedStatus and insertTopicReviews.
func topicsStatusServer(t *testing.T) (*httptest.Server, *statusPage) {
	t.Helper()
	pool := newTestPool(t)
	seedStatus(t, pool)
	ctx := context.Background()
	insertTopicReviews(t, ctx, poolExec(t, ctx, pool))
	seedReviewStorefronts(t, pool)
	return statusPageServer(t, pool, "", newMetricsRegistry("test"))
}

// The app page lists the topics of the last 7 days with their counts and
// share negative, most reviews first; an app without any says so.
func TestStatusPageAppTopics(t *testing.T) {
	srv, _ := topicsStatusServer(t)
	table, _ := appPageTable(t, srv.URL, "topics")
	row := regexp.MustCompile(`<td data-label="Topic">([^<]*)</td><td data-label="Reviews" class="num">([^<]*)</td><td data-label="Negative" class="num">([^<]*)</td><td data-label="Share negative" class="num">([^<]*)</td>`)
	var got []string
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		got = append(got, strings.Join(m[1:], " "))
	}
	want := []string{"crash 4 3 75 %", "ads 2 1 50 %", "update 1 1 100 %"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("topics rows %q, want %q", got, want)
	}

	code, body, _ := getPage(t, srv.URL+"/apps/"+statusBale)
	if code != http.StatusOK || strings.Contains(body, `<table class="topics">`) ||
		!strings.Contains(body, "No data: no review of the last 7 days has a topic") {
		t.Errorf("app without topics: %d, want the empty state:\n%s", code, body)
	}
}
