package main

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// insertReleases gives Telegram three versions: 1.0 (listing 30 days ago,
// 20 reviews: mean 3.90 stars, 4 of 20 negative, topics ads×3, crash), 2.0
// (listing 10 days ago, first review 11 days ago, 20 reviews: mean 2.10,
// 12 of 20 negative, crash×8, login×5, update×2, ads) and 3.0 (a listing
// 30 minutes ago, no review yet); and a 2.0 review older than 180 days.
func insertReleases(t *testing.T, exec func(string, ...any)) {
	t.Helper()
	for _, s := range []struct {
		ago     time.Duration
		version string
		score   float64
	}{{30 * 24 * time.Hour, "1.0", 4.6}, {10 * 24 * time.Hour, "2.0", 4.5}, {30 * time.Minute, "3.0", 4.3}} {
		exec(`INSERT INTO app_stats (application_id, country, lang, score, ratings, crawled_at, version)
			SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, $2, 1000, $3, $4 FROM apps_registry_application WHERE package_name = $1`,
			statusTelegram, s.score, statusNow.Add(-s.ago), s.version)
	}
	n := 0
	review := func(version string, ago time.Duration, stars int, negative bool, topics []string) {
		n++
		sentiment := "POSITIVE"
		if negative {
			sentiment = "NEGATIVE"
		}
		exec(`INSERT INTO reviews (application_id, review_id, score, content, at, sentiment, topics, app_version, last_synced_at)
			SELECT id, $2, $3, 'x', $4, $5, $6, $7, $4 FROM apps_registry_application WHERE package_name = $1`,
			statusTelegram, fmt.Sprintf("rel%d", n), stars, statusNow.Add(-ago), sentiment, topics, version)
	}
	day := 24 * time.Hour
	// 1.0: 18 × 4★, a 5★ and a 1★ (mean 3.90); 4 negative.
	for i := range 20 {
		stars, topics := 4, []string{}
		switch i {
		case 0:
			stars = 5
		case 1:
			stars = 1
		}
		if i < 3 {
			topics = []string{"ads"}
		} else if i == 3 {
			topics = []string{"crash"}
		}
		review("1.0", 20*day+time.Duration(i)*time.Hour, stars, i < 4, topics)
	}
	// 2.0: 12 × 1★, 4 × 3★, 2 × 4★, 2 × 5★ (mean 2.10); 12 negative.
	for i := range 20 {
		stars := 1
		switch {
		case i >= 18:
			stars = 5
		case i >= 16:
			stars = 4
		case i >= 12:
			stars = 3
		}
		var topics []string
		switch {
		case i < 8:
			topics = []string{"crash"}
		case i < 13:
			topics = []string{"login"}
		case i < 15:
			topics = []string{"update"}
		case i == 15:
			topics = []string{"ads"}
		}
		review("2.0", 11*day-time.Duration(i)*time.Hour, stars, i < 12, topics)
	}
	review("2.0", 200*day, 5, false, nil) // outside the 180 days
}

// The app page's releases table lists each version newest first with its
// first seen (the earlier of its first listing and first review), reviews,
// mean stars, share negative and top topics; 2.0, clearly worse than 1.0,
// is highlighted with why; the rating chart marks when each version
// appeared and the releases chart has a bar per version with stars.
func TestStatusPageAppReleases(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedStatus(t, pool)
	ctx := context.Background()
	insertReleases(t, poolExec(t, ctx, pool))
	seedReviewStorefronts(t, pool)
	srv, _ := statusPageServer(t, pool, "", newMetricsRegistry("test"))
	table, body := appPageTable(t, srv.URL, "releases")
	row := regexp.MustCompile(`<tr( class="worse")?><td data-label="Version"><bdi>([^<]*)</bdi>(?:<div class="cause">([^<]*)</div>)?</td><td data-label="First seen">([^<]*)</td><td data-label="Reviews" class="num">([^<]*)</td><td data-label="Mean stars" class="num">([^<]*)</td><td data-label="Share negative" class="num">([^<]*)</td><td data-label="Top topics">([^<]*)</td></tr>`)
	var got []string
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		got = append(got, strings.Join(m[1:], " | "))
	}
	want := []string{
		" | 3.0 |  | 10 May 2026 11:30 | 0 | — | — | ",
		` class="worse" | 2.0 | worse than 1.0: mean stars 2.1 vs 3.9, negative 60% vs 20% | 29 Apr 2026 12:00 | 20 | 2.10 | 60 % | crash, login, update`,
		" | 1.0 |  | 10 Apr 2026 12:00 | 20 | 3.90 | 20 % | ads, crash",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("releases rows\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	rating := body[strings.Index(body, `id="chart-rating"`):]
	rating = rating[:strings.Index(rating, "</figure>")]
	marks := regexp.MustCompile(`<g class="release-mark"><title>version ([^ ]+) first seen [^<]*</title><line x1="([\d.]+)" x2="([\d.]+)"`).FindAllStringSubmatch(rating, -1)
	var seen []string
	var xs []float64
	for _, m := range marks {
		seen = append(seen, m[1])
		if m[2] != m[3] {
			t.Errorf("mark of %s is not vertical: x1 %s x2 %s", m[1], m[2], m[3])
		}
		x, _ := strconv.ParseFloat(m[2], 64)
		xs = append(xs, x)
	}
	if strings.Join(seen, ",") != "3.0,2.0,1.0" {
		t.Errorf("rating chart marks %q, want 3.0,2.0,1.0:\n%s", seen, rating)
	}
	if len(xs) == 3 && !(xs[0] > xs[1] && xs[1] > xs[2]) {
		t.Errorf("marks x %v: a newer version should be further right", xs)
	}
	if chartPoints(body, "releases") != 2 || strings.Count(body, `class="bar rel worse"`) != 1 || strings.Count(body, `class="bar rel"`) != 1 {
		t.Errorf("releases chart: %d bars, want 2 (one worse)", chartPoints(body, "releases"))
	}

	code, body, _ := getPage(t, srv.URL+"/apps/"+statusBale)
	if code != http.StatusOK || strings.Contains(body, `<table class="releases">`) || strings.Contains(body, `class="release-mark"`) ||
		!strings.Contains(body, "No data: no version is seen in the last 180 days") {
		t.Errorf("app without versions: %d, want the empty state:\n%s", code, body)
	}
}

// A version is worse than the previous one only with enough reviews in
// each, by its mean stars or its share negative.
func TestAppPageReleaseWorse(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	prev := releaseStat{Version: "1", Reviews: 40, MeanStars: f(4.0), Labelled: 40, Negative: 8}
	for name, c := range map[string]struct {
		cur  releaseStat
		want string
	}{
		"stars fell 0.5": {releaseStat{Reviews: 20, MeanStars: f(3.5), Labelled: 20, Negative: 4},
			"worse than 1: mean stars 3.5 vs 4.0, negative 20% vs 20%"},
		"stars fell 0.4": {releaseStat{Reviews: 20, MeanStars: f(3.6), Labelled: 20, Negative: 4}, ""},
		"negative rose 15 points": {releaseStat{Reviews: 20, MeanStars: f(4.0), Labelled: 20, Negative: 7},
			"worse than 1: mean stars 4.0 vs 4.0, negative 35% vs 20%"},
		"negative rose 10 points": {releaseStat{Reviews: 20, MeanStars: f(4.0), Labelled: 20, Negative: 6}, ""},
		"too few reviews":         {releaseStat{Reviews: 19, MeanStars: f(1.0), Labelled: 19, Negative: 19}, ""},
		"not labelled, stars fell": {releaseStat{Reviews: 30, MeanStars: f(2.0)},
			"worse than 1: mean stars 2.0 vs 4.0"},
	} {
		if got := worseThan(c.cur, prev); got != c.want {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}
}
