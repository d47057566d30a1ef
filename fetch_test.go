package main

import (
	"bytes"
	"context"
	"encoding/json"
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
	if stats.PackageName != "ir.example.chat" || *stats.Title != "چت" || *stats.MinInstalls != 50000000 || stats.CrawledAt.IsZero() {
		t.Fatalf("stats %s", lines[0])
	}
	if keys := jsonKeys(t, []byte(lines[0])); !slices.Contains(keys, "app_updated_at") || !slices.Contains(keys, "crawled_at") {
		t.Fatalf("keys %v", keys)
	}
	for i, line := range lines[1:] {
		if keys := jsonKeys(t, []byte(line)); !slices.Equal(keys, []string{"app_version", "at", "content", "crawled_at", "package_name", "replied_at", "reply_content", "review_id", "score", "thumbs_up_count", "user_name"}) {
			t.Fatalf("review keys %v", keys)
		}
		var m reviewMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m.ReviewID != replayReviewID("ir.example.chat", i) || !m.At.Equal(replayReviewAt(i)) || strings.ContainsRune(*m.Content, 0) {
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
