package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// The publisher's encoder of reviews messages writes exactly what
// json.Marshal writes, escapes and nulls included, and fails where it fails.
func TestPublishReviewJSONIsEncodingJSON(t *testing.T) {
	at := time.Date(2026, 11, 1, 8, 30, 0, 77_000_000, time.UTC)
	str := func(s string) *string { return &s }
	score := 4
	replied := at.Add(90 * time.Minute).In(time.FixedZone("IRST", 3*3600+1800))
	var cases []reviewMessage
	for _, m := range []reviewMessage{
		{PackageName: "com.example.app", ReviewID: "gp:1", At: at, CrawledAt: at},
		{PackageName: "com.example.app", ReviewID: "1234abcd-0000-4012-8000-000000000012", UserName: str("User 12"),
			ThumbsUpCount: 17, Score: &score, Content: str("works fine"), At: at, CrawledAt: at.Add(time.Hour + 1234*time.Microsecond)},
		{PackageName: "ir.example.app", ReviewID: "x", UserName: str("کاربر ۱"), Score: &score,
			Content: str("نظر: برنامه خیلی خوبیه 👍🏽🇮🇷\nممنون"), At: at, CrawledAt: at},
		{PackageName: "com.example.app", ReviewID: `"quoted"\id`, UserName: str(""), ThumbsUpCount: -1,
			Content: str(`<b>"great"</b> & 'fine' \ done`), At: at, CrawledAt: at},
		{PackageName: "com.example.app", ReviewID: "ctl", Content: str("tab\tnl\ncr\rbs\bff\fbell\x07nul\x00del\x7f"), At: at, CrawledAt: at},
		{PackageName: "com.example.app", ReviewID: "utf8", UserName: str("bad \xff\xfe bytes"),
			Content: str("line\u2028sep\u2029para, literal \ufffd, cut \xe2\x82"), At: at, CrawledAt: at},
		{PackageName: "com.example.app", ReviewID: "zones", At: at.In(time.FixedZone("IRST", 3*3600+1800)), CrawledAt: time.Time{}},
		{PackageName: "com.example.app", ReviewID: "replied", Content: str("slow"), At: at, CrawledAt: at,
			ReplyContent: str("Hi Ana. We'd like to <help> & \"fix\" it.\nThanks"), RepliedAt: &replied, AppVersion: str("10.24.48.939568180.6-release")},
		{PackageName: "com.example.app", ReviewID: "version only", At: at, CrawledAt: at, AppVersion: str("1.0")},
		{PackageName: "ir.example.app", ReviewID: "storefront", At: at, CrawledAt: at, Country: "ir", Lang: "fa"},
		{PackageName: "com.example.app", ReviewID: "odd storefront", At: at, CrawledAt: at, Country: `"<us>"`, Lang: "pt-BR\n"},
	} {
		cases = append(cases, m)
	}
	// Each character with a say in the escaping, alone in a string.
	for _, c := range []string{`"`, `\`, "<", ">", "&", "\x00", "\n", "\x1f", "\x7f", "\xff", "\ufffd", "\u2028", "\u2029", "é"} {
		cases = append(cases, reviewMessage{PackageName: "p", ReviewID: "a" + c + "b", At: at, CrawledAt: at})
	}
	for _, m := range cases {
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := m.encodeJSON()
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("encodeJSON:\n got %s (%v)\nwant %s", got, err, want)
		}
	}

	bad := reviewMessage{PackageName: "com.example.app", ReviewID: "y", At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), CrawledAt: at}
	if _, err := json.Marshal(bad); err == nil {
		t.Fatal("json.Marshal encoded the year 10000")
	}
	if got, err := bad.encodeJSON(); err == nil {
		t.Errorf("encodeJSON encoded the year 10000: %s", got)
	}
	badReply := time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)
	bad = reviewMessage{PackageName: "com.example.app", ReviewID: "y", At: at, CrawledAt: at, RepliedAt: &badReply}
	if got, err := bad.encodeJSON(); err == nil {
		t.Errorf("encodeJSON encoded a reply of the year -1: %s", got)
	}
}

// FuzzPublishReviewJSON: for any text, the encoder writes json.Marshal's bytes.
func FuzzPublishReviewJSON(f *testing.F) {
	f.Add("com.example.app", "gp:1", "User", "<b>\"quoted\"</b> & \\ \n\t\x00\x7f \u2028 \xff 👍🏽", "Thanks & <b>bye</b>", int64(3), int64(1783000000))
	f.Fuzz(func(t *testing.T, pkg, id, name, content, reply string, n, sec int64) {
		score := int(n % 7)
		replied := time.Unix(sec%300_000_000_000+n, 0).UTC()
		m := reviewMessage{PackageName: pkg, ReviewID: id, UserName: &name, ThumbsUpCount: n, Score: &score,
			Content: &content, At: time.Unix(sec%300_000_000_000, n).UTC(), CrawledAt: time.Unix(sec%1e10, 0),
			ReplyContent: &reply, RepliedAt: &replied, AppVersion: &name, Country: id, Lang: content}
		if n%2 == 0 {
			m.UserName, m.Score, m.ReplyContent, m.RepliedAt = nil, nil, nil, nil
		}
		want, werr := json.Marshal(m)
		got, err := m.encodeJSON()
		if (werr == nil) != (err == nil) || !bytes.Equal(got, want) {
			t.Fatalf("encodeJSON:\n got %s (%v)\nwant %s (%v)", got, err, want, werr)
		}
	})
}
