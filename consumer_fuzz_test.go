package main

import (
	"cmp"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// FuzzConsumerRecord feeds arbitrary bytes as a record of each topic to the
// consumer's validation: it never panics, every record ends up in exactly
// one place (a table's rows or the dead letters), and what it accepts is
// valid UTF-8 within the columns' limits.
func FuzzConsumerRecord(f *testing.F) {
	f.Add(uint8(0), []byte(`{"package_name":"com.example.app","crawled_at":"2026-11-01T00:00:00Z","score":4.5,"min_installs":100}`))
	f.Add(uint8(1), []byte(`{"package_name":"com.example.app","review_id":"r1","score":5,"thumbs_up_count":2,"content":"ok","at":"2026-11-01T00:00:00Z","crawled_at":"2026-11-02T00:00:00Z"}`))
	f.Add(uint8(0), []byte(`{"package_name":"com.example.app","crawled_at":"2026-11-01T00:00:00Z","real_installs":195,"histogram":[1,2,3,4,5],"developer":"Dev","released_at":"2025-07-01T10:25:42.032Z","recent_changes":"fixes"}`))
	f.Add(uint8(1), []byte(`{"package_name":"com.example.app","review_id":"r2","at":"2026-11-01T00:00:00Z","crawled_at":"2026-11-02T00:00:00Z","reply_content":"thanks","replied_at":"2026-11-01T12:00:00Z","app_version":"1.2.3"}`))
	f.Add(uint8(2), []byte(`{"analysis_id":"00000000-0000-4000-8000-000000000001","package_name":"com.example.app","scenario":"UPLOAD","bytes_transferred_total":10,"bytes_payload_total":5,"overhead_ratio":0.5,"analyzed_at":"2026-11-01T00:00:00Z"}`))
	f.Add(uint8(1), []byte(`{"review_id":"\ud800","at":"2026-13-01T00:00:00Z"}`))
	f.Add(uint8(0), []byte(`{"package_name":"com.example.app","crawled_at":"2026-11-01T00:00:00Z","country":"ir","lang":"fa"}`))
	f.Add(uint8(1), []byte(`{"package_name":"com.example.app","review_id":"r3","at":"2026-11-01T00:00:00Z","crawled_at":"2026-11-02T00:00:00Z","country":"us","lang":"pt-BR"}`))
	f.Add(uint8(3), []byte(`null`))
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, topic uint8, value []byte) {
		topics := append(slices.Clone(allTopics), "elsewhere")
		r := &kgo.Record{Topic: topics[int(topic)%len(topics)], Key: []byte("k"), Value: value}
		b := decodeRecords([]*kgo.Record{r}, 1<<20, now)
		stats, reviews, metrics := rowsIn[appStatsMessage](b), rowsIn[reviewMessage](b), rowsIn[networkMetricsMessage](b)
		if n := len(stats) + len(reviews) + len(metrics) + len(b.dead); n != 1 {
			t.Fatalf("the record landed in %d places", n)
		}
		for _, d := range b.dead {
			if !slices.Contains(allReasonCodes, d.code) || d.reason == "" {
				t.Fatalf("dead letter with reason %q (%s)", d.code, d.reason)
			}
		}
		for _, s := range stats {
			checkText(t, s.msg.PackageName, 255)
			if s.msg.Version != nil {
				checkText(t, *s.msg.Version, maxVersion)
			}
			if s.msg.Developer != nil {
				checkText(t, *s.msg.Developer, 255)
			}
			checkStorefront(t, s.msg.Country, s.msg.Lang)
			if h := s.msg.Histogram; h != nil && (len(h) != 5 || slices.ContainsFunc(h, func(n *int64) bool { return n == nil || *n < 0 })) {
				t.Fatalf("histogram %v accepted", h)
			}
		}
		for _, rv := range reviews {
			checkText(t, rv.msg.ReviewID, 255)
			if rv.msg.Content != nil {
				checkText(t, *rv.msg.Content, 1<<20)
			}
			if rv.msg.AppVersion != nil {
				checkText(t, *rv.msg.AppVersion, maxVersion)
			}
			checkStorefront(t, rv.msg.Country, rv.msg.Lang)
			if rv.msg.Score != nil && (*rv.msg.Score < 1 || *rv.msg.Score > 5) {
				t.Fatalf("score %d accepted", *rv.msg.Score)
			}
		}
		for _, m := range metrics {
			if m.msg.Scenario != "UPLOAD" && m.msg.Scenario != "DOWNLOAD" {
				t.Fatalf("scenario %q accepted", m.msg.Scenario)
			}
		}
	})
}

// checkStorefront fails on an accepted storefront that is neither absent
// nor two codes that fit their columns (VARCHAR(8), VARCHAR(16)).
func checkStorefront(t *testing.T, country, lang string) {
	t.Helper()
	if (country == "") != (lang == "") || parseLocaleCode(cmp.Or(country, "us")) != nil || parseLocaleCode(cmp.Or(lang, "en")) != nil ||
		len(country) > 8 || len(lang) > 16 {
		t.Fatalf("accepted the storefront %q/%q", country, lang)
	}
}

func checkText(t *testing.T, s string, maxRunes int) {
	t.Helper()
	if !utf8.ValidString(s) || utf8.RuneCountInString(s) > maxRunes {
		t.Fatalf("accepted text %q", s)
	}
	for _, r := range s {
		if r == 0 {
			t.Fatalf("accepted a NUL in %q", s)
		}
	}
}
