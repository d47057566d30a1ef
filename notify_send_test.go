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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// receiver is a local HTTP server answering as one real service does; it
// keeps every request it got.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []receivedRequest
}

type receivedRequest struct {
	Path   string
	Header http.Header
	Body   []byte
}

func newReceiver(t *testing.T, answer func(w http.ResponseWriter, r receivedRequest)) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got := receivedRequest{Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, got)
		rc.mu.Unlock()
		answer(w, got)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []receivedRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]receivedRequest(nil), rc.reqs...)
}

func (rc *receiver) only(t *testing.T) receivedRequest {
	t.Helper()
	reqs := rc.requests()
	if len(reqs) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

func testSender(t *testing.T, cfg notifySenderConfig) *notifySender {
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
			AppVersion: "11.2.0", Sentiment: "negative", TextLang: "fa",
			ReplyText: "ممنون، درست می‌کنیم", RepliedAt: &at,
		},
		Links: payloadLinks{
			Play:       "https://play.google.com/store/apps/details?id=org.telegram.messenger&reviewId=gp:AOqpTOE1&hl=fa",
			StatusPage: "https://playwatch.example.com/apps/org.telegram.messenger",
		},
	}
}

func TestNotifyWebhookSignedBody(t *testing.T) {
	const secret = "s3cr3t-webhook-key"
	rc := newReceiver(t, func(w http.ResponseWriter, r receivedRequest) {
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
	s := testSender(t, notifySenderConfig{AllowPrivate: true})
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
	rc := newReceiver(t, func(w http.ResponseWriter, _ receivedRequest) { w.WriteHeader(200) })
	s := testSender(t, notifySenderConfig{AllowPrivate: false})
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

// A receiver that accepts the connection and never answers: an error after
// the timeout, not a hang, and transient.
func TestNotifyStalledReceiver(t *testing.T) {
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
	s := testSender(t, notifySenderConfig{AllowPrivate: true, Timeout: 700 * time.Millisecond})
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
