package main

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPlayCleanText(t *testing.T) {
	checkStringFunc(t, "cleanText", cleanText, map[string]string{
		"plain":                        "plain",
		"a\x00b":                       "ab",
		"keep\nnew\r\nlines\tand tabs": "keep\nnew\r\nlines\tand tabs",
		"bell\x07 esc\x1b del\x7f":     "bell esc del",
		"c1\u0085\u009f end":           "c1 end",
		"bad \xff byte":                "bad \uFFFD byte",
		"برنامه خوبیه 👍🏽🇮🇷":  "برنامه خوبیه 👍🏽🇮🇷",
		"rtl\u200fmark kept": "rtl\u200fmark kept",
	})
}

// jsonKeys returns the sorted keys of a JSON object.
func jsonKeys(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func TestPlayAppStatsMessageFromFixtures(t *testing.T) {
	exp := expectedValues(t)
	fetched := time.Date(2026, 7, 7, 10, 0, 0, 123456789, time.UTC)
	for _, name := range []string{
		"details_com.mojang.minecraftpe_en_us.html",
		"details_com.google.android.apps.translate_en_us.html",
		"details_com.adex77.WhereAmI_en_us.html",
		"details_com.raiseright.edumarketapp_en.html",
		"details_com.youngkiu.stock_knee_shoulder_ko.html",
	} {
		t.Run(name, func(t *testing.T) {
			d, err := parseDetailsPage(readPlaystoreFixture(t, name))
			if err != nil {
				t.Fatal(err)
			}
			d.PackageName, d.FetchedAt = "pkg", fetched
			raw, err := json.Marshal(appStatsFromDetails(d, locale{Lang: "en", Country: "us"}))
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"ad_supported", "app_updated_at", "crawled_at", "developer", "genre", "histogram", "min_installs", "package_name",
				"ratings", "real_installs", "recent_changes", "released_at", "reviews_count", "score", "title", "version"}
			want = append(want, "country", "lang")
			slices.Sort(want)
			if keys := jsonKeys(t, raw); !slices.Equal(keys, want) {
				t.Fatalf("keys %v", keys)
			}
			var m map[string]any
			_ = json.Unmarshal(raw, &m)
			e := exp[name]
			if m["title"] != e["title"] || m["genre"] != e["genre"] || m["min_installs"] != e["minInstalls"] ||
				m["ratings"] != e["ratings"] || m["reviews_count"] != e["reviews"] || m["version"] != e["version"] ||
				m["ad_supported"] != e["adSupported"] {
				t.Errorf("message %s\nexpected %v", raw, e)
			}
			// A "0.0" average over 0 ratings is not a score.
			if wantScore := e["score"]; wantScore == 0.0 || wantScore == nil {
				if m["score"] != nil {
					t.Errorf("score %v, want null", m["score"])
				}
			} else if m["score"] != wantScore {
				t.Errorf("score %v, want %v", m["score"], wantScore)
			}
			updated := time.Unix(int64(e["updated"].(float64)), 0).UTC().Format(time.RFC3339)
			if m["app_updated_at"] != updated || m["crawled_at"] != "2026-07-07T10:00:00.123456Z" {
				t.Errorf("app_updated_at %v (want %s), crawled_at %v", m["app_updated_at"], updated, m["crawled_at"])
			}
			if m["real_installs"] != e["realInstalls"] || m["developer"] != e["developer"] || !reflect.DeepEqual(m["histogram"], e["histogram"]) {
				t.Errorf("real_installs %v, developer %v, histogram %v; expected %v, %v, %v",
					m["real_installs"], m["developer"], m["histogram"], e["realInstalls"], e["developer"], e["histogram"])
			}
			var released any
			if r, ok := e["releasedAt"].([]any); ok {
				released = time.Unix(int64(r[0].(float64)), int64(r[1].(float64))).UTC().Format(time.RFC3339Nano)
			}
			if m["released_at"] != released {
				t.Errorf("released_at %v, want %v", m["released_at"], released)
			}
			// The "what's new" HTML becomes text: each <br> a newline, no
			// entity left.
			page, text := e["recentChanges"].(string), m["recent_changes"].(string)
			if strings.Count(text, "\n") != strings.Count(page, "<br>") || strings.ContainsAny(text, "<>") ||
				strings.Contains(text, "&amp;") || strings.Contains(text, "&#39;") {
				t.Errorf("recent_changes %q from the page's %q", text, page)
			}
			if want, ok := map[string]string{
				"details_com.mojang.minecraftpe_en_us.html":   "What's new in 26.32: Various bug fixes!",
				"details_com.raiseright.edumarketapp_en.html": "Enhancements in User Experience\n\n\nWelcome in Edu Market!!!",
			}[name]; ok && text != want {
				t.Errorf("recent_changes %q, want %q", text, want)
			}
		})
	}
}

func TestPlayReviewMessage(t *testing.T) {
	body := readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	page, err := parseReviewsAnswer(body, "UsvDTd")
	if err != nil {
		t.Fatal(err)
	}
	reviews := page.Reviews
	for _, c := range []struct {
		i    int
		want string
	}{
		{0, `{"package_name":"com.google.android.apps.translate","review_id":"017452fc-0d4b-471d-b406-bcf0f52387a7",` +
			`"user_name":"Formann Ali","thumbs_up_count":0,"score":5,"content":"niec","at":"2026-07-06T13:55:24.077Z","crawled_at":"2026-07-07T10:00:00Z",` +
			`"reply_content":null,"replied_at":null,"app_version":null,"country":"us","lang":"en"}`},
		// The first with a developer reply (expected_values.json "first_with_reply").
		{slices.IndexFunc(reviews, func(r review) bool { return r.ReplyContent != nil }),
			`{"package_name":"com.google.android.apps.translate","review_id":"5219798f-004e-4171-8477-de05baae134d",` +
				`"user_name":"Baran Akbar","thumbs_up_count":0,"score":1,"content":"what is wrong with this update? I can no longer manually select lines in the scanning tool",` +
				`"at":"2026-07-06T07:02:46.957Z","crawled_at":"2026-07-07T10:00:00Z",` +
				`"reply_content":"Hi Baran. We'd like our users to have the best possible experience with the Google Translate app. We'll share your feedback with our product team. Thanks.",` +
				`"replied_at":"2026-07-07T01:20:13.174Z","app_version":"10.24.48.939568180.6-release","country":"us","lang":"en"}`},
	} {
		r := reviews[c.i]
		r.FetchedAt = time.Date(2026, 7, 7, 10, 0, 0, 0, time.UTC)
		raw, err := json.Marshal(reviewMessageFrom("com.google.android.apps.translate", locale{Lang: "en", Country: "us"}, r))
		if err != nil {
			t.Fatal(err)
		}
		if string(raw) != c.want {
			t.Errorf("message %d\n%s\nwant\n%s", c.i, raw, c.want)
		}
	}
}
