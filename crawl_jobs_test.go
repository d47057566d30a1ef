package main

import (
	"strings"
	"testing"
	"time"
)

// A job survives its own encoding; what breaks the contract is refused
// with a reason, never a panic.
func FuzzDecodeCrawlJob(f *testing.F) {
	now := time.Date(2026, 7, 7, 10, 0, 0, 0, time.UTC)
	good, err := crawlJobMessage{CycleID: 3, PlannedAt: now, PackageName: "org.telegram.messenger", Lang: "en", Country: "us"}.encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	for _, s := range []string{
		``, `null`, `[]`, `{}`, `{"cycle_id":-1}`, `{"cycle_id":"1"}`, `{"planned_at":"yesterday"}`,
		`{"cycle_id":1,"planned_at":"2026-07-07T10:00:00Z","package_name":"a.b","lang":"e n","country":"us"}`,
		`{"cycle_id":1,"planned_at":"2126-07-07T10:00:00Z","package_name":"a.b","lang":"en","country":"us"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		m, bad := decodeCrawlJob(v, now)
		if bad != nil {
			if bad.code == "" || bad.detail == "" {
				t.Fatalf("a refusal without a reason: %+v", bad)
			}
			return
		}
		b, err := m.encode()
		if err != nil {
			t.Fatal(err)
		}
		again, bad := decodeCrawlJob(b, now)
		if bad != nil || again != m {
			t.Fatalf("%s: decoded %+v, again %+v (%v)", v, m, again, bad)
		}
		if j := m.crawlJob(); j.App.PackageName != m.PackageName || !j.CrawledAt.Equal(messageTime(m.PlannedAt)) ||
			j.Locale != (locale{m.Lang, m.Country}) {
			t.Fatalf("job %+v of %+v", j, m)
		}
	})
}

func TestDecodeCrawlJobReasons(t *testing.T) {
	now := time.Now()
	for v, want := range map[string]reasonCode{
		`{"cycle_id":1,"package_name":"a.b","lang":"en","country":"us"}`:                                      reasonMissing,
		`{"cycle_id":-2,"planned_at":"2026-07-07T10:00:00Z","package_name":"a.b","lang":"en","country":"us"}`: reasonOutOfRange,
		`{"planned_at":"2026-07-07T10:00:00Z","package_name":"nodots","lang":"en","country":"us"}`:            reasonBadValue,
		`{"planned_at":"2026-07-07T10:00:00Z","package_name":"a.b","lang":"en","country":"u s"}`:              reasonBadValue,
		`{"planned_at":12,"package_name":"a.b"}`:                                                              reasonWrongType,
		strings.Repeat(" ", maxCrawlJobBytes+1):                                                               reasonTooLarge,
	} {
		if _, bad := decodeCrawlJob([]byte(v), now); bad == nil || bad.code != want {
			t.Errorf("%.80s: %+v, want %s", v, bad, want)
		}
	}
}
