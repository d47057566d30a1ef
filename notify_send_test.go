package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// receiver is a local HTTP server answering as one real service does; it
// keeps every request it got.
type notifyTestReceiver struct {
	*httptest.Server
	requestLog[notifyReceivedRequest]
}

// requestLog is what a test server was asked, in order; its handlers add
// to it concurrently.
type requestLog[T any] struct {
	mu   sync.Mutex
	seen []T
}

func (l *requestLog[T]) add(v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, v)
}

func (l *requestLog[T]) requests() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.seen...)
}

func (l *requestLog[T]) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = nil
}

type notifyReceivedRequest struct {
	Path   string
	Header http.Header
	Body   []byte
}

func newNotifyTestReceiver(t *testing.T, answer func(w http.ResponseWriter, r notifyReceivedRequest)) *notifyTestReceiver {
	t.Helper()
	rc := &notifyTestReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got := notifyReceivedRequest{Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
		rc.add(got)
		answer(w, got)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *notifyTestReceiver) only(t *testing.T) notifyReceivedRequest {
	t.Helper()
	reqs := rc.requests()
	if len(reqs) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

func newTestNotifySender(t *testing.T, cfg notifySenderConfig) *notifySender {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	s, err := newNotifySender(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testReviewPayload is a Persian 1★ review with a developer reply.
func testReviewPayload() notifyPayload {
	at := time.Date(2026, 11, 30, 9, 15, 0, 0, time.UTC)
	return notifyPayload{
		Event: "review",
		App:   payloadApp{PackageName: "org.telegram.messenger", DisplayName: "Telegram", Country: "ir", Lang: "fa"},
		Review: &payloadReview{
			ReviewID: "gp:AOqpTOE1", UserName: "علی", Stars: 1,
			Text:       "برنامه <بد> & کند است",
			At:         at,
			AppVersion: "11.2.0", Sentiment: "NEGATIVE", TextLang: "fa",
			ReplyText: "ممنون، درست می‌کنیم", RepliedAt: &at,
			// As the decider writes them: the review's URL here, the app's in Links.
			URL: "https://play.google.com/store/apps/details?id=org.telegram.messenger&reviewId=gp:AOqpTOE1&hl=fa",
		},
		Links: payloadLinks{
			Play:       "https://play.google.com/store/apps/details?id=org.telegram.messenger&hl=fa",
			StatusPage: "https://playwatch.example.com/apps/org.telegram.messenger",
		},
	}
}

func TestNotifyWebhookSignedBody(t *testing.T) {
	const secret = "s3cr3t-webhook-key"
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, r notifyReceivedRequest) {
		ts := r.Header.Get("X-Playwatch-Timestamp")
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts + "."))
		mac.Write(r.Body)
		if r.Header.Get("X-Playwatch-Signature") != "sha256="+hex.EncodeToString(mac.Sum(nil)) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	d := destination{ID: 1, Type: "webhook", Config: destinationConfig{URL: rc.URL + "/hook", Secret: secret}}
	p := testReviewPayload()
	r := s.Send(context.Background(), d, "42-7", p)
	if r.Err != nil || r.HTTPStatus != 204 {
		t.Fatalf("send: %+v", r)
	}
	got := rc.only(t)
	if got.Header.Get("X-Playwatch-Delivery") != "42-7" || got.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers: %v", got.Header)
	}
	ts, err := strconv.ParseInt(got.Header.Get("X-Playwatch-Timestamp"), 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
		t.Errorf("timestamp %q", got.Header.Get("X-Playwatch-Timestamp"))
	}
	var body map[string]any
	if err := json.Unmarshal(got.Body, &body); err != nil {
		t.Fatal(err)
	}
	review, _ := body["review"].(map[string]any)
	app, _ := body["app"].(map[string]any)
	links, _ := body["links"].(map[string]any)
	if body["delivery_id"] != "42-7" || body["event"] != "review" || app["package_name"] != "org.telegram.messenger" ||
		review["text"] != p.Review.Text || review["stars"] != 1.0 || review["text_lang"] != "fa" || links["play"] != p.Links.Play {
		t.Errorf("body: %s", got.Body)
	}
	for _, k := range []string{"review_id", "user_name", "at", "app_version", "sentiment", "reply_text", "replied_at", "url"} {
		if _, ok := review[k]; !ok {
			t.Errorf("review has no %q: %s", k, got.Body)
		}
	}

	// The same receiver refuses a wrong secret: a 401 is permanent.
	d.Config.Secret = "another-key"
	r = s.Send(context.Background(), d, "42-8", p)
	if r.Err == nil || !r.Permanent || r.HTTPStatus != 401 || r.Err.Error() != "HTTP 401: bad signature" {
		t.Errorf("wrong secret: %+v", r)
	}
	// Without a secret nothing is signed.
	d.Config.Secret = ""
	s.Send(context.Background(), d, "42-9", p)
	if reqs := rc.requests(); len(reqs) != 3 || reqs[2].Header.Get("X-Playwatch-Signature") != "" || reqs[2].Header.Get("X-Playwatch-Timestamp") != "" {
		t.Errorf("unsigned request: %v", reqs[len(reqs)-1].Header)
	}
}

func TestNotifyPrivateReceiverRefused(t *testing.T) {
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) { w.WriteHeader(200) })
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: false})
	// By name: the check is on the address the name resolved to.
	url := strings.Replace(rc.URL, "127.0.0.1", "localhost", 1)
	for _, u := range []string{rc.URL, url} {
		r := s.Send(context.Background(), destination{Type: "webhook", Config: destinationConfig{URL: u}}, "1", testReviewPayload())
		if r.Err == nil || !r.Permanent || !strings.Contains(r.Err.Error(), "NOTIFY_ALLOW_PRIVATE") || strings.Contains(r.Err.Error(), "http://") {
			t.Errorf("%s: %+v", u, r)
		}
	}
	if n := len(rc.requests()); n != 0 {
		t.Errorf("a refused receiver got %d requests", n)
	}
}

// silentListener accepts connections until the test ends and never says a
// word on them.
func silentListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return ln
}

// A receiver that accepts the connection and never answers: an error after
// the timeout, not a hang, and transient.
func TestNotifyStalledReceiver(t *testing.T) {
	ln := silentListener(t)
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, Timeout: 700 * time.Millisecond})
	start := time.Now()
	r := s.Send(context.Background(), destination{Type: "slack", Config: destinationConfig{URL: "http://" + ln.Addr().String() + "/services/T0/B0/XYZSECRET"}}, "1", testReviewPayload())
	if r.Err == nil || r.Permanent || !strings.Contains(r.Err.Error(), "timeout") || strings.Contains(r.Err.Error(), "XYZSECRET") {
		t.Errorf("stalled: %+v", r)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("stalled receiver took %s", took)
	}
	// A refused connection is transient too.
	ln.Close()
	r = s.Send(context.Background(), destination{Type: "webhook", Config: destinationConfig{URL: "http://" + ln.Addr().String() + "/"}}, "1", testReviewPayload())
	if r.Err == nil || r.Permanent || errors.Is(r.Err, errPrivateReceiver) {
		t.Errorf("refused: %+v", r)
	}
}

func TestNotifySlackAnswers(t *testing.T) {
	answer := func(w http.ResponseWriter, _ notifyReceivedRequest) { io.WriteString(w, "ok") }
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, r notifyReceivedRequest) { answer(w, r) })
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	d := destination{Type: "slack", Config: destinationConfig{URL: rc.URL + "/services/T000/B000/XXXXSECRET"}}
	p := testReviewPayload()
	p.App.DisplayName = "Tele<gram> & co"
	if r := s.Send(context.Background(), d, "1", p); r.Err != nil || r.HTTPStatus != 200 {
		t.Fatalf("send: %+v", r)
	}
	var body struct {
		Text   string `json:"text"`
		Blocks []struct {
			Type string `json:"type"`
			Text struct {
				Type, Text string
			} `json:"text"`
			Elements []struct{ Type, Text string } `json:"elements"`
		} `json:"blocks"`
	}
	got := rc.only(t)
	if err := json.Unmarshal(got.Body, &body); err != nil {
		t.Fatal(err)
	}
	if got.Path != "/services/T000/B000/XXXXSECRET" || len(body.Blocks) != 4 {
		t.Fatalf("path %s, body %s", got.Path, got.Body)
	}
	head, text, reply, links := body.Blocks[0], body.Blocks[1], body.Blocks[2], body.Blocks[3]
	if !strings.Contains(body.Text, "New 1★ review of Tele&lt;gram&gt; &amp; co (ir/fa)") || head.Text.Type != "mrkdwn" ||
		!strings.Contains(head.Text.Text, "*New 1★ review of Tele&lt;gram&gt; &amp; co (ir/fa)*") ||
		!strings.Contains(head.Text.Text, "Sentiment: negative · language: fa") || !strings.Contains(head.Text.Text, "App version: 11.2.0") ||
		!strings.Contains(head.Text.Text, "By "+fsi+"علی"+pdi) {
		t.Errorf("head: %q / %q", body.Text, head.Text.Text)
	}
	// The review's own words, as written, in an RTL isolate.
	if text.Text.Type != "plain_text" || text.Text.Text != rlm+rli+p.Review.Text+pdi {
		t.Errorf("text block: %+v", text.Text)
	}
	if reply.Text.Text != "Developer reply:\n"+rlm+rli+p.Review.ReplyText+pdi {
		t.Errorf("reply block: %q", reply.Text.Text)
	}
	if links.Type != "context" || links.Elements[0].Text != "<"+strings.ReplaceAll(p.Review.URL, "&", "&amp;")+"|Google Play> · <"+p.Links.StatusPage+"|Status page>" {
		t.Errorf("links: %+v", links)
	}

	// A long review is cut to the block's 3000.
	p.Review.Text = strings.Repeat("خیلی بد ", 600)
	rc.reset()
	s.Send(context.Background(), d, "2", p)
	json.Unmarshal(rc.only(t).Body, &body)
	if tb := body.Blocks[1].Text.Text; utf16Len(tb) > slackBlockLimit || utf16Len(tb) < slackBlockLimit-10 || !strings.HasSuffix(tb, "…"+pdi) {
		t.Errorf("cut text block: %d units, ends %q", utf16Len(tb), tb[len(tb)-10:])
	}

	// Slack's documented errors (api.slack.com/messaging/webhooks#handling_errors).
	for _, c := range []struct {
		code       int
		body       string
		retryAfter string
		permanent  bool
		wantRetry  time.Duration
	}{
		{404, "no_service", "", true, 0},
		{403, "invalid_token", "", true, 0},
		{400, "invalid_payload", "", true, 0},
		{410, "channel_is_archived", "", true, 0},
		{429, "rate_limited", "30", false, 30 * time.Second},
		{500, "rollup_error", "", false, 0},
		{408, "", "", false, 0},
	} {
		answer = func(w http.ResponseWriter, _ notifyReceivedRequest) {
			if c.retryAfter != "" {
				w.Header().Set("Retry-After", c.retryAfter)
			}
			w.WriteHeader(c.code)
			io.WriteString(w, c.body)
		}
		r := s.Send(context.Background(), d, "3", p)
		want := "HTTP " + strconv.Itoa(c.code) + ": " + c.body
		if c.body == "" {
			want += http.StatusText(c.code)
		}
		if r.HTTPStatus != c.code || r.Permanent != c.permanent || r.RetryAfter != c.wantRetry || r.Err == nil || r.Err.Error() != want {
			t.Errorf("%d %s: %+v", c.code, c.body, r)
		}
	}
	// An error never quotes the webhook's path, even one the receiver echoes.
	answer = func(w http.ResponseWriter, r notifyReceivedRequest) { http.Error(w, "unknown hook "+r.Path, 404) }
	if r := s.Send(context.Background(), d, "4", p); r.Err == nil || strings.Contains(r.Err.Error(), "XXXXSECRET") {
		t.Errorf("echoed path: %v", r.Err)
	}
	// A Retry-After as an HTTP date.
	answer = func(w http.ResponseWriter, _ notifyReceivedRequest) {
		w.Header().Set("Retry-After", time.Now().Add(90*time.Second).UTC().Format(http.TimeFormat))
		w.WriteHeader(429)
	}
	if r := s.Send(context.Background(), d, "5", p); r.RetryAfter < 80*time.Second || r.RetryAfter > 91*time.Second || r.Permanent {
		t.Errorf("Retry-After date: %+v", r)
	}
}

func TestNotifyDiscordAnswers(t *testing.T) {
	answer := func(w http.ResponseWriter, _ notifyReceivedRequest) { w.WriteHeader(204) }
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, r notifyReceivedRequest) { answer(w, r) })
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	d := destination{Type: "discord", Config: destinationConfig{URL: rc.URL + "/api/webhooks/123/TOKENPART"}}
	p := testReviewPayload()
	p.Review.Text = "*bold* @everyone\n# big - not a list\n> quote\n" + strings.Repeat("کند ", 1000)
	if r := s.Send(context.Background(), d, "1", p); r.Err != nil || r.HTTPStatus != 204 {
		t.Fatalf("send: %+v", r)
	}
	var body struct {
		Content string `json:"content"`
		Embeds  []struct {
			Title, URL, Description string
			Color                   int
		} `json:"embeds"`
		AllowedMentions struct {
			Parse []string `json:"parse"`
		} `json:"allowed_mentions"`
	}
	if err := json.Unmarshal(rc.only(t).Body, &body); err != nil {
		t.Fatal(err)
	}
	if n := utf16Len(body.Content); n > discordContentLimit || n < discordContentLimit-20 {
		t.Errorf("content is %d units", n)
	}
	if !strings.HasPrefix(body.Content, "**New 1★ review of Telegram (ir/fa)**\n★☆☆☆☆ · ") ||
		!strings.Contains(body.Content, "\\*bold\\* @everyone\n\\# big - not a list\n\\> quote\n"+rlm+rli+"کند کند") || !strings.Contains(body.Content, "*Developer reply:*\n"+rlm+rli+p.Review.ReplyText+pdi) {
		t.Errorf("content: %q", body.Content)
	}
	if body.AllowedMentions.Parse == nil || len(body.AllowedMentions.Parse) != 0 || len(body.Embeds) != 1 ||
		body.Embeds[0].URL != p.Review.URL || body.Embeds[0].Color != 0xE01E5A || !strings.Contains(body.Embeds[0].Description, "[Status page]("+p.Links.StatusPage+")") {
		t.Errorf("mentions/embeds: %+v", body)
	}

	// Discord's 429 (discord.com/developers/docs/topics/rate-limits): the
	// JSON retry_after wins over the header's rounded seconds.
	answer = func(w http.ResponseWriter, _ notifyReceivedRequest) {
		w.Header().Set("Retry-After", "2")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		io.WriteString(w, `{"message": "You are being rate limited.", "retry_after": 1.5, "global": false}`)
	}
	if r := s.Send(context.Background(), d, "2", p); r.Permanent || r.RetryAfter != 1500*time.Millisecond || r.HTTPStatus != 429 ||
		!strings.Contains(r.Err.Error(), "You are being rate limited.") {
		t.Errorf("429: %+v", r)
	}
	answer = func(w http.ResponseWriter, _ notifyReceivedRequest) {
		w.WriteHeader(404)
		io.WriteString(w, `{"message": "Unknown Webhook", "code": 10015}`)
	}
	if r := s.Send(context.Background(), d, "3", p); !r.Permanent || r.Err.Error() != `HTTP 404: {"message": "Unknown Webhook", "code": 10015}` {
		t.Errorf("404: %+v", r)
	}
	answer = func(w http.ResponseWriter, _ notifyReceivedRequest) { w.WriteHeader(502) }
	if r := s.Send(context.Background(), d, "4", p); r.Permanent || r.Err == nil {
		t.Errorf("502: %+v", r)
	}
}

func TestNotifyTelegramAnswers(t *testing.T) {
	const token = "123456:AAHsecretTokenPart"
	answer := func(w http.ResponseWriter, _ notifyReceivedRequest) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true,"result":{"message_id":1,"from":{"id":123456,"is_bot":true,"first_name":"playwatch"},"chat":{"id":-100777,"type":"supergroup"},"date":1764650000,"text":"..."}}`)
	}
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, r notifyReceivedRequest) { answer(w, r) })
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, TelegramAPIURL: rc.URL + "/"})
	d := destination{Type: "telegram", Config: destinationConfig{BotToken: token, ChatID: "-100777"}}
	p := testReviewPayload()
	if r := s.Send(context.Background(), d, "1", p); r.Err != nil || r.HTTPStatus != 200 {
		t.Fatalf("send: %+v", r)
	}
	got := rc.only(t)
	var body struct {
		ChatID    string `json:"chat_id"`
		Text      string `json:"text"`
		ParseMode string `json:"parse_mode"`
	}
	if err := json.Unmarshal(got.Body, &body); err != nil {
		t.Fatal(err)
	}
	if got.Path != "/bot"+token+"/sendMessage" || body.ChatID != "-100777" || body.ParseMode != "HTML" {
		t.Errorf("request: %s %s", got.Path, got.Body)
	}
	want := "<b>New 1★ review of Telegram (ir/fa)</b>\n" +
		"★☆☆☆☆ · Sentiment: negative · language: fa\nApp version: 11.2.0\nBy " + fsi + "علی" + pdi + " · 2026-11-30 09:15 UTC\n\n" +
		rlm + rli + "برنامه &lt;بد&gt; &amp; کند است" + pdi + "\n\n" +
		"<i>Developer reply:</i>\n" + rlm + rli + p.Review.ReplyText + pdi + "\n\n" +
		`<a href="https://play.google.com/store/apps/details?id=org.telegram.messenger&amp;reviewId=gp:AOqpTOE1&amp;hl=fa">Google Play</a> · ` +
		`<a href="https://playwatch.example.com/apps/org.telegram.messenger">Status page</a>`
	if body.Text != want {
		t.Errorf("text:\n%q\nwant\n%q", body.Text, want)
	}

	// Cut to 4096 though escaping makes the text longer.
	p.Review.Text = strings.Repeat("<&> ", 2000)
	p.Review.SentimentFromStars = true
	rc.reset()
	s.Send(context.Background(), d, "2", p)
	json.Unmarshal(rc.only(t).Body, &body)
	if n := utf16Len(body.Text); n > telegramTextLimit || n < telegramTextLimit-20 || !strings.Contains(body.Text, "Sentiment: negative (from stars)") ||
		!regexp.MustCompile(`(&lt;|&amp;|&gt;| )…\n\n<i>Developer reply:</i>`).MatchString(body.Text) || !strings.HasSuffix(body.Text, "Status page</a>") {
		t.Errorf("cut text: %d units %q", n, body.Text[:200])
	}

	// The Bot API's errors (core.telegram.org/bots/api#making-requests).
	for _, c := range []struct {
		code      int
		body      string
		permanent bool
		retry     time.Duration
		err       string
	}{
		{429, `{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}`, false, 3 * time.Second, "HTTP 429: Too Many Requests: retry after 3"},
		{403, `{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}`, true, 0, "HTTP 403: Forbidden: bot was blocked by the user"},
		{400, `{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}`, true, 0, "HTTP 400: Bad Request: chat not found"},
		{401, `{"ok":false,"error_code":401,"description":"Unauthorized"}`, true, 0, "HTTP 401: Unauthorized"},
		{502, `<html>Bad Gateway</html>`, false, 0, "HTTP 502: <html>Bad Gateway</html>"},
		{404, `{"ok":false,"error_code":404,"description":"Not Found: /bot` + token + `/sendMessage"}`, true, 0, "HTTP 404: Not Found: /bot********/sendMessage"},
	} {
		answer = func(w http.ResponseWriter, _ notifyReceivedRequest) {
			w.WriteHeader(c.code)
			io.WriteString(w, c.body)
		}
		r := s.Send(context.Background(), d, "3", p)
		if r.HTTPStatus != c.code || r.Permanent != c.permanent || r.RetryAfter != c.retry || r.Err == nil || r.Err.Error() != c.err {
			t.Errorf("%d: %+v", c.code, r)
		}
	}
	// The token is in the URL: a network error must not show it.
	rc.Close()
	r := s.Send(context.Background(), d, "4", p)
	if r.Err == nil || r.Permanent || strings.Contains(r.Err.Error(), "AAHsecret") || strings.Contains(r.Err.Error(), "/bot") {
		t.Errorf("network error: %+v", r)
	}
}

// Test sends the "test" event and reports the receiver's status and answer.
func TestNotifyTestMessage(t *testing.T) {
	answer := func(w http.ResponseWriter, _ notifyReceivedRequest) { w.WriteHeader(200) }
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, r notifyReceivedRequest) { answer(w, r) })
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	d := destination{Type: "webhook", Config: destinationConfig{URL: rc.URL}}
	if code, err := s.Test(context.Background(), d); code != 200 || err != nil {
		t.Fatalf("test: %d %v", code, err)
	}
	var body map[string]any
	json.Unmarshal(rc.only(t).Body, &body)
	if body["event"] != "test" {
		t.Errorf("test body: %v", body)
	}
	answer = func(w http.ResponseWriter, _ notifyReceivedRequest) {
		http.Error(w, strings.Repeat("x", 500), http.StatusGone)
	}
	if code, err := s.Test(context.Background(), d); code != 410 || err == nil || len(err.Error()) != 200 {
		t.Errorf("gone: %d %v", code, err)
	}
}

// Redirects are never followed: the redirect target gets nothing.
func TestNotifyNoRedirect(t *testing.T) {
	target := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) { w.WriteHeader(200) })
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) {
		w.Header().Set("Location", target.URL)
		w.WriteHeader(http.StatusTemporaryRedirect)
	})
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	r := s.Send(context.Background(), destination{Type: "webhook", Config: destinationConfig{URL: rc.URL}}, "1", testReviewPayload())
	if r.Err == nil || !r.Permanent || r.HTTPStatus != 307 || len(target.requests()) != 0 {
		t.Errorf("redirect: %+v, target got %d", r, len(target.requests()))
	}
}

// notifyTestProxy is an HTTP proxy: absolute-URI requests are forwarded, CONNECT
// is tunnelled. It records what it was asked for.
type notifyTestProxy struct {
	*httptest.Server
	requestLog[string]
}

func newNotifyTestProxy(t *testing.T) *notifyTestProxy {
	px := &notifyTestProxy{}
	px.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		px.add(r.Method + " " + r.RequestURI)
		if r.Method == http.MethodConnect {
			up, err := net.Dial("tcp", r.Host)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			w.WriteHeader(200)
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				up.Close()
				return
			}
			go func() { io.Copy(up, buf); up.Close() }()
			io.Copy(conn, up)
			conn.Close()
			return
		}
		out, err := relayedRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		relayAnswer(w, resp)
	}))
	t.Cleanup(px.Close)
	return px
}

// NOTIFY_PROXY: a plain-HTTP receiver through a forwarding proxy, an HTTPS
// one (the Telegram case) through CONNECT; a literal private target is
// refused before the proxy is asked, though the proxy itself is local.
func TestNotifyThroughProxy(t *testing.T) {
	px := newNotifyTestProxy(t)
	plain := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) { io.WriteString(w, "ok") })
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, Proxy: px.URL})
	if r := s.Send(context.Background(), destination{Type: "slack", Config: destinationConfig{URL: plain.URL + "/services/A/B/C"}}, "1", testReviewPayload()); r.Err != nil {
		t.Fatalf("through proxy: %+v", r)
	}
	if seen := px.requests(); len(seen) != 1 || seen[0] != "POST "+plain.URL+"/services/A/B/C" || len(plain.requests()) != 1 {
		t.Errorf("proxy saw %v, receiver got %d", seen, len(plain.requests()))
	}

	tg := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"ok":true,"result":{"message_id":1}}`)
	}))
	t.Cleanup(tg.Close)
	roots := tg.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	s = newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, Proxy: px.URL, TelegramAPIURL: tg.URL, RootCAs: roots})
	if r := s.Send(context.Background(), destination{Type: "telegram", Config: destinationConfig{BotToken: "1:tok", ChatID: "5"}}, "2", testReviewPayload()); r.Err != nil {
		t.Fatalf("telegram through CONNECT: %+v", r)
	}
	if seen := px.requests(); len(seen) != 2 || seen[1] != "CONNECT "+strings.TrimPrefix(tg.URL, "https://") {
		t.Errorf("proxy saw %v", seen)
	}

	s = newTestNotifySender(t, notifySenderConfig{AllowPrivate: false, Proxy: px.URL})
	for _, u := range []string{plain.URL, strings.Replace(plain.URL, "127.0.0.1", "localhost", 1), "http://[::1]:9/", "http://10.1.2.3/"} {
		r := s.Send(context.Background(), destination{Type: "webhook", Config: destinationConfig{URL: u}}, "3", testReviewPayload())
		if r.Err == nil || !r.Permanent || !strings.Contains(r.Err.Error(), "NOTIFY_ALLOW_PRIVATE") {
			t.Errorf("%s through proxy: %+v", u, r)
		}
	}
	if seen := px.requests(); len(seen) != 2 {
		t.Errorf("the proxy was asked for a private target: %v", seen)
	}
}

// Alerts, their end, digests and a Persian app name, as a Telegram
// receiver gets them.
func TestNotifyAlertAndDigestMessages(t *testing.T) {
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) {
		io.WriteString(w, `{"ok":true,"result":{"message_id":2}}`)
	})
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, TelegramAPIURL: rc.URL})
	d := destination{Type: "telegram", Config: destinationConfig{BotToken: "1:t", ChatID: "9"}}
	start, end := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	app := payloadApp{PackageName: "ir.divar", DisplayName: "دیوار", Country: "ir", Lang: "fa"}
	links := payloadLinks{Play: "https://play.google.com/store/apps/details?id=ir.divar", StatusPage: "https://pw.example.com/apps/ir.divar"}
	for _, c := range []struct {
		p    notifyPayload
		want []string
	}{
		{notifyPayload{Event: "rating_drop", App: app, Links: links, Alert: &payloadAlert{Kind: "rating_drop", Summary: "rating down 0.12 in 24 h", Value: "4.21", Previous: "4.33", StartedAt: start}},
			[]string{"<b>Rating drop: " + fsi + "دیوار" + pdi + " (ir/fa)</b>\nValue: 4.21 (before: 4.33)\nStarted: 2026-12-01T08:00:00Z\n\nrating down 0.12 in 24 h\n\n<a href=\"https://pw.example.com/apps/ir.divar\">Status page</a> · <a href"}},
		{notifyPayload{Event: "crawl_failing", App: app, Links: links, Alert: &payloadAlert{Kind: "crawl_failing", Summary: "cause not_found", StartedAt: start, EndedAt: &end}},
			[]string{"<b>Crawl recovered: ", "Ended: 2026-12-01T09:30:00Z"}},
		{notifyPayload{Event: "new_version", App: app, Links: links, Alert: &payloadAlert{Kind: "new_version", Summary: "version 12.1 (was 12.0)", Value: "4.3", Previous: "4.4", StartedAt: start}},
			[]string{"<b>New version: ", "Value: 4.3 (before: 4.4)"}},
		{notifyPayload{Event: "digest", App: app, Links: links, Digest: &payloadDigest{Count: 37, Of: "review"}},
			[]string{"<b>and 37 more reviews of " + fsi + "دیوار" + pdi + " (ir/fa) in the last hour</b>", `<a href="https://pw.example.com/apps/ir.divar">Status page</a>`}},
		{notifyPayload{Event: "digest", App: app, Links: links, Digest: &payloadDigest{Count: 1, Of: "negative_spike"}},
			[]string{"and 1 more negative review spike of "}},
	} {
		rc.reset()
		if r := s.Send(context.Background(), d, "1", c.p); r.Err != nil {
			t.Fatalf("%s: %+v", c.p.Event, r)
		}
		var body struct{ Text string }
		json.Unmarshal(rc.only(t).Body, &body)
		for _, w := range c.want {
			if !strings.Contains(body.Text, w) {
				t.Errorf("%s: %q lacks %q", c.p.Event, body.Text, w)
			}
		}
	}
}

func TestNotifyBadURLIsPermanent(t *testing.T) {
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	for _, u := range []string{"", "ftp://example.com/x", "http:///nohost", "https://hooks.slack.com/services/%zz/SECRETPATH"} {
		r := s.Send(context.Background(), destination{Type: "slack", Config: destinationConfig{URL: u}}, "1", testReviewPayload())
		if r.Err == nil || !r.Permanent || strings.Contains(r.Err.Error(), "SECRETPATH") {
			t.Errorf("%q: %+v", u, r)
		}
	}
}

// startTestSOCKS5 is a minimal SOCKS5 proxy (RFC 1928: no authentication,
// CONNECT); it records the address each client asked for.
func startTestSOCKS5(t *testing.T) (addr string, asked func() []string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var asks requestLog[string]
	serve := func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 262)
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return
		}
		if _, err := io.ReadFull(c, buf[:buf[1]]); err != nil {
			return
		}
		c.Write([]byte{5, 0})
		if _, err := io.ReadFull(c, buf[:4]); err != nil || buf[1] != 1 {
			return
		}
		var host string
		switch buf[3] {
		case 1:
			io.ReadFull(c, buf[:4])
			host = net.IP(buf[:4]).String()
		case 4:
			io.ReadFull(c, buf[:16])
			host = net.IP(buf[:16]).String()
		case 3:
			io.ReadFull(c, buf[:1])
			n := int(buf[0])
			io.ReadFull(c, buf[:n])
			host = string(buf[:n])
		}
		io.ReadFull(c, buf[:2])
		target := net.JoinHostPort(host, strconv.Itoa(int(buf[0])<<8|int(buf[1])))
		asks.add(target)
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
			return
		}
		defer up.Close()
		c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
		go io.Copy(up, c)
		io.Copy(c, up)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln.Addr().String(), asks.requests
}

// Through a socks5 NOTIFY_PROXY the receiver's name goes to the proxy,
// which resolves it (not the local resolver, which a filtered network
// makes lie).
func TestNotifyThroughSOCKS5(t *testing.T) {
	addr, asked := startTestSOCKS5(t)
	rc := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) { w.WriteHeader(204) })
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, Proxy: "socks5://" + addr})
	target := strings.Replace(rc.URL, "127.0.0.1", "localhost", 1)
	if r := s.Send(context.Background(), destination{Type: "discord", Config: destinationConfig{URL: target + "/api/webhooks/1/x"}}, "1", testReviewPayload()); r.Err != nil {
		t.Fatalf("through socks5: %+v", r)
	}
	if got := asked(); len(got) != 1 || got[0] != strings.TrimPrefix(target, "http://") || len(rc.requests()) != 1 {
		t.Errorf("socks5 proxy was asked for %v; receiver got %d", got, len(rc.requests()))
	}
}
