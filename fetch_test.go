package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFetchPrintsStatsThenReviews(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("ir.example.chat", replayApp{Title: "چت", Reviews: 40, Persian: true})
	ts := newTestPlayStore(t, rs.URL, nil)
	var out bytes.Buffer
	if err := fetchApp(context.Background(), ts.client, "ir.example.chat", locale{"fa", "ir"}, 25, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 26 {
		t.Fatalf("%d lines, want 1 + 25", len(lines))
	}
	var stats appStatsMessage
	if err := json.Unmarshal([]byte(lines[0]), &stats); err != nil {
		t.Fatal(err)
	}
	if stats.PackageName != "ir.example.chat" || *stats.Title != "چت" || *stats.MinInstalls != 50000000 || stats.CrawledAt.IsZero() ||
		stats.Country != "ir" || stats.Lang != "fa" {
		t.Fatalf("stats %s", lines[0])
	}
	if keys := jsonKeys(t, []byte(lines[0])); !slices.Contains(keys, "app_updated_at") || !slices.Contains(keys, "crawled_at") {
		t.Fatalf("keys %v", keys)
	}
	for i, line := range lines[1:] {
		if keys := jsonKeys(t, []byte(line)); !slices.Equal(keys, []string{"app_version", "at", "content", "country", "crawled_at", "lang", "package_name", "replied_at", "reply_content", "review_id", "score", "thumbs_up_count", "user_name"}) {
			t.Fatalf("review keys %v", keys)
		}
		var m reviewMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m.ReviewID != replayReviewID("ir.example.chat", i) || !m.At.Equal(replayReviewAt(i)) || strings.ContainsRune(*m.Content, 0) ||
			m.Country != "ir" || m.Lang != "fa" {
			t.Fatalf("review %d: %s", i, line)
		}
		var raw map[string]any
		_ = json.Unmarshal([]byte(line), &raw)
		if _, err := time.Parse(time.RFC3339, raw["at"].(string)); err != nil {
			t.Fatalf("at is not RFC 3339: %v", err)
		}
	}
}

func TestFetchErrorsReadAsOneLine(t *testing.T) {
	for _, tc := range []struct {
		name      string
		app       replayApp
		want      []string
		wantLines int // lines printed
	}{
		{"not found", replayApp{DetailsAlways: fault404}, []string{"com.example.app: not found on the Play Store for hl=en gl=us (HTTP 404)"}, 0},
		{"blocked", replayApp{DetailsAlways: faultCaptcha, ReviewsAlways: faultConsent},
			[]string{"details of com.example.app (hl=en gl=us): blocked by a captcha or consent page", "/sorry/index", "gave up after 4 attempts", "consent.google.com", "(0 reviews printed)"}, 0},
		{"rate limited reviews", replayApp{Reviews: 10, ReviewsAlways: fault429},
			[]string{"reviews of com.example.app (hl=en gl=us), page 1: rate limited by the Play Store (HTTP 429), gave up after 4 attempts", "(app stats and 0 reviews printed)"}, 1},
		{"parse error", replayApp{Reviews: 10, DetailsAlways: faultNoDataBlock},
			[]string{"cannot parse Play Store response at ds:5[1][2][0][0]", "(10 reviews printed)"}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := newReplayPlayStore(t)
			rs.setApp("com.example.app", tc.app)
			ts := newTestPlayStore(t, rs.URL, nil)
			var out bytes.Buffer
			err := fetchApp(context.Background(), ts.client, "com.example.app", locale{"en", "us"}, 100, &out)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error spans lines: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			if n := strings.Count(out.String(), "\n"); n != tc.wantLines {
				t.Errorf("%d lines printed, want %d", n, tc.wantLines)
			}
		})
	}
}

// A captcha benches the egress for a minute. fetch does not sit the bench
// out: the next request is refused at once, with the egress, the end of its
// cool-down and its cause, and nothing waits longer than the limit.
func TestFetchGivesUpOnABenchedEgress(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.app", replayApp{DetailsAlways: faultCaptcha, ReviewsAlways: faultCaptcha})
	const maxWait = 30 * time.Second
	ts := newTestPlayStore(t, rs.URL, func(p *proxyPoolConfig, c *playStoreConfig) { p.MaxWait, c.MaxWait = maxWait, maxWait })
	var out bytes.Buffer
	err := fetchApp(context.Background(), ts.client, "com.example.app", locale{"en", "us"}, 100, &out)
	var werr *benchWaitError
	if !errors.As(err, &werr) || len(werr.Benched) != 1 || werr.Benched[0].Name != "direct" || werr.Benched[0].Until.Sub(werr.At) <= maxWait {
		t.Fatalf("error %v, want the pool refusing to wait for the benched direct egress", err)
	}
	until := werr.Benched[0].Until.Format(time.TimeOnly)
	for _, w := range []string{"details of com.example.app", "reviews of com.example.app", "longer than the longest wait allowed (30s)", "direct benched until " + until + " (in 1m0s) after: blocked by a captcha", "(0 reviews printed)"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	for _, w := range append(ts.clock.allWaits(), ts.poolClock.allWaits()...) {
		if w > maxWait {
			t.Errorf("waited %v, longer than %v", w, maxWait)
		}
	}
	// The second captcha benched the egress; nothing was sent after it.
	if d, r := rs.requests("details", "com.example.app"), rs.requests("reviews", "com.example.app"); d != 2 || r != 0 {
		t.Errorf("%d details and %d reviews requests, want 2 and 0", d, r)
	}
}

// The command line: --max-wait bounds the retry waits too, so with a second
// to spare fetch gives up at the first captcha of each path, within that
// second, and says which egress is benched until when.
func TestFetchMaxWaitFlag(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.app", replayApp{DetailsAlways: faultCaptcha, ReviewsAlways: faultCaptcha})
	env := map[string]string{"PLAYSTORE_URL": rs.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s"}
	var out, stderr bytes.Buffer
	start := time.Now()
	err := run(context.Background(), []string{"fetch", "--max-wait", "1s", "com.example.app"}, envFunc(env), &out, &stderr)
	// Well within the minute-long bench it would wait out without the flag;
	// loose, for a loaded machine.
	if took := time.Since(start); took >= 20*time.Second {
		t.Errorf("fetch took %v: it waited for the benched egress", took)
	}
	if err == nil || out.Len() > 0 {
		t.Fatalf("fetch: %v, printed %q", err, out.String())
	}
	for _, w := range []string{"would be a longer wait than allowed (1s)", "direct benched until ", "(in 1m0s) after: blocked by a captcha", "(0 reviews printed)"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	// The bench is logged the moment it starts, with its end.
	if log := stderr.String(); !strings.Contains(log, `msg="egress benched" proxy=direct`) || !strings.Contains(log, " until=") {
		t.Errorf("stderr does not tell of the bench:\n%s", log)
	}
	if err := run(context.Background(), []string{"fetch", "--max-wait", "-1s", "com.example.app"}, envFunc(env), io.Discard, io.Discard); !errors.As(err, new(usageError)) {
		t.Errorf("a negative --max-wait: %v, want a usage error", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"fetch", "--help"}, envFunc(nil), &out, io.Discard); err != nil || !strings.Contains(out.String(), "--max-wait\tgive up rather than wait longer than this") {
		t.Errorf("fetch --help: %v\n%s", err, out.String())
	}
}

// The app-stats line and every review of one fetch carry one crawled_at,
// the fetch's start, however long apart their answers arrived (here a
// retry's backoff between the listing and the reviews).
func TestFetchStampsOneCrawledAt(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.app", replayApp{Reviews: 200, ReviewsFaults: []replayFault{fault500}})
	ts := newTestPlayStore(t, rs.URL, nil)
	began := messageTime(ts.clock.Now())
	var out bytes.Buffer
	if err := fetchApp(context.Background(), ts.client, "com.example.app", locale{"en", "us"}, 200, &out); err != nil {
		t.Fatal(err)
	}
	if !ts.clock.Now().After(began) {
		t.Fatal("the retry's backoff did not move the clock: the test shows nothing")
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 201 {
		t.Fatalf("%d lines, want 1 + 200", len(lines))
	}
	for i, line := range lines {
		var m struct {
			CrawledAt time.Time `json:"crawled_at"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if !m.CrawledAt.Equal(began) {
			t.Fatalf("line %d: crawled_at %s, want the fetch's start %s", i+1, m.CrawledAt, began)
		}
	}
}
