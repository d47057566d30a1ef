package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

const day = 24 * time.Hour

// parseDuration reads what time.ParseDuration reads, and days besides.
func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{"0s", 0},
		{"250ms", 250 * time.Millisecond},
		{"90s", 90 * time.Second},
		{"1h30m", 90 * time.Minute},
		{"1.5h", 90 * time.Minute},
		{"-5m", -5 * time.Minute},
		{"+5m", 5 * time.Minute},
		{"1us", time.Microsecond},
		{"1µs", time.Microsecond},
		{"2562047h47m16.854775807s", time.Duration(1<<63 - 1)},
		{"-2562047h47m16.854775808s", time.Duration(-1 << 63)},
		{"1d", day},
		{"7d", 7 * day},
		{"1d12h", day + 12*time.Hour},
		{"12h1d", day + 12*time.Hour},
		{"1.5d", 36 * time.Hour},
		{".5d", 12 * time.Hour},
		{"2d3h4m5s6ms", 2*day + 3*time.Hour + 4*time.Minute + 5*time.Second + 6*time.Millisecond},
		{"-1d", -day},
		{"0d", 0},
		{"106751d", 106751 * day},
	} {
		got, err := parseDuration(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseDuration(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
		// Everything Go's parser reads, it reads the same.
		if d, err := time.ParseDuration(tc.in); err == nil && d != got {
			t.Errorf("parseDuration(%q) = %s, time.ParseDuration: %s", tc.in, got, d)
		}
	}
	for _, in := range []string{"", "d", "-", "+", "7", "7 d", "7days", "7D", "1w", "d7", "1d-2h", "1..5d", ".d", "1dd",
		"hourly", "1d 2h", "106752d", "99999999999999999999d", "1d2562047h"} {
		if d, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q) = %s, want an error", in, d)
		}
	}
}

// Settings, flags and the --since/--until flags take days; a wrong value's
// error names its variable or flag.
func TestDurationsTakeDays(t *testing.T) {
	c, err := loadTestConfig(map[string]string{"KAFKA_TOPIC_RETENTION": "7d", "REVIEWS_FULL_SYNC_INTERVAL": "1d12h", "CRAWL_INTERVAL": "0.5d"})
	if err != nil || c.TopicRetention != 7*day || c.ReviewsFullSyncInterval != 36*time.Hour || c.CrawlInterval != 12*time.Hour {
		t.Errorf("settings in days: %v, %s, %s, %s", err, c.TopicRetention, c.ReviewsFullSyncInterval, c.CrawlInterval)
	}
	if _, err := loadTestConfig(nil, "--kafka-raw-retention", "3d"); err != nil {
		t.Errorf("--kafka-raw-retention 3d: %v", err)
	}
	for env, v := range map[string]string{"CRAWL_INTERVAL": "1 day", "EGRESS_MIN_GAP": "2d", "CONSUMER_LINGER": "1w", "PUBLISH_RETRY_DELAYS": "5s,1x"} {
		if _, err := loadTestConfig(map[string]string{env: v}); err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%s: %v, want an error naming it", env, v, err)
		}
	}

	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	dlq := dlqFlags{since: "7d"}
	if f, err := dlq.filter(now); err != nil || !f.Since.Equal(now.Add(-7*day)) {
		t.Errorf("dlq list --since 7d: %v, %s", err, f.Since)
	}
	rp := reparseFlags{since: "1d12h", until: "12h"}
	if w, err := rp.window(now); err != nil || !w.Since.Equal(now.Add(-36*time.Hour)) || !w.Until.Equal(now.Add(-12*time.Hour)) {
		t.Errorf("reparse --since 1d12h --until 12h: %v, %+v", err, w)
	}
	rp = reparseFlags{since: "2026-03-01T00:00:00Z"}
	if w, err := rp.window(now); err != nil || !w.Since.Equal(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("reparse --since RFC 3339: %v, %+v", err, w)
	}
	if _, err := (&reparseFlags{since: "24h", until: "-1d"}).window(now); err == nil {
		t.Error("reparse --until -1d accepted: a duration before now is positive")
	}
	if _, err := (&dlqFlags{since: "7x"}).filter(now); err == nil || !strings.Contains(err.Error(), "--since") {
		t.Errorf("dlq list --since 7x: %v, want an error naming --since", err)
	}
	if _, err := (&reparseFlags{since: "24h", until: "yesterday"}).window(now); err == nil || !strings.Contains(err.Error(), "--until") {
		t.Errorf("reparse --until yesterday: %v, want an error naming --until", err)
	}

	fs := flag.NewFlagSet("fetch", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var maxWait time.Duration
	durationVar(fs, &maxWait, "max-wait", 30*time.Second, "")
	if maxWait != 30*time.Second || fs.Lookup("max-wait").DefValue != "30s" {
		t.Errorf("default %s, shown as %q", maxWait, fs.Lookup("max-wait").DefValue)
	}
	if err := fs.Parse([]string{"--max-wait", "1d"}); err != nil || maxWait != day {
		t.Errorf("--max-wait 1d: %v, %s", err, maxWait)
	}
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{"fetch", "--max-wait", "soon", "com.example.app"}, envFunc(nil), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "max-wait") {
		t.Errorf("fetch --max-wait soon: %v, want an error naming --max-wait", err)
	}
}
