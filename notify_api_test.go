package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// fakeTester answers POST …/test as the sender would, and keeps what it got.
type fakeTester struct {
	status int
	err    error
	got    []destination
}

func (f *fakeTester) Test(_ context.Context, d destination) (int, error) {
	f.got = append(f.got, d)
	return f.status, f.err
}

type notifyFixture struct {
	*registryFixture
	api  *notifyAPI
	logs *syncBuffer
}

const notifyTestToken = "test-registry-token"

func newNotifyFixture(t *testing.T, tester destinationTester) *notifyFixture {
	t.Helper()
	pool := newTestPool(t)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	api := &notifyAPI{pool: pool, reads: pool, token: notifyTestToken, logger: logger}
	if tester != nil {
		api.tester = tester
	}
	reg := newMetricsRegistry("test")
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), nil, nil, nil, logger, api))
	t.Cleanup(srv.Close)
	return &notifyFixture{registryFixture: &registryFixture{srv: srv, pool: pool}, api: api, logs: logs}
}

// call is do with the token.
func (f *notifyFixture) call(t *testing.T, method, path, body string) testResponse {
	t.Helper()
	return f.do(t, method, path, body, "Authorization", "Bearer "+notifyTestToken)
}

// createDestination posts body and returns the new destination's id.
func (f *notifyFixture) createDestination(t *testing.T, body string) int64 {
	t.Helper()
	r := f.call(t, "POST", "/api/v1/destinations", body)
	if r.code != http.StatusCreated {
		t.Fatalf("POST destination %s: %d %s", body, r.code, r.body)
	}
	return decodeJSON[destinationJSON](t, r).ID
}

func (f *notifyFixture) storedSecrets(t *testing.T, id int64) destinationSecrets {
	t.Helper()
	var s destinationSecrets
	if err := f.pool.QueryRow(context.Background(), `SELECT secrets FROM notify_destination_secrets WHERE destination_id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *notifyFixture) storedConfig(t *testing.T, id int64) map[string]any {
	t.Helper()
	var c map[string]any
	if err := f.pool.QueryRow(context.Background(), `SELECT config FROM notify_destinations WHERE id = $1`, id).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

const (
	slackURL      = "https://hooks.slack.com/services/T0001/B0001/slacksecretpath123"
	botToken      = "123456789:AAE_telegramSecretToken-xyz"
	webhookSecret = "webhook-hmac-secret-42"
	smtpPassword  = "smtp-password-7"
)

var testSecrets = []string{"slacksecretpath123", botToken, webhookSecret, smtpPassword}

func assertNoSecret(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range testSecrets {
		if strings.Contains(text, s) {
			t.Errorf("%s shows the secret %q: %s", what, s, text)
		}
	}
}

// Destinations of every type are created, read, changed and deleted; a
// GET never shows a secret, only its mask; a PATCH that sends the mask back
// keeps the stored secret, and resets a broken destination; secrets are
// stored apart from the public fields; no log line shows one.
func TestNotifyDestinationsLifecycle(t *testing.T) {
	t.Parallel()
	f := newNotifyFixture(t, nil)

	slack := f.createDestination(t, `{"name": "team chat", "type": "slack", "url": "`+slackURL+`"}`)
	tg := f.createDestination(t, `{"name": "tg", "type": "telegram", "bot_token": "`+botToken+`", "chat_id": -1001234567890}`)
	hook := f.createDestination(t, `{"name": "hook", "type": "webhook", "url": "https://example.com/hook?x=1", "secret": "`+webhookSecret+`"}`)
	mailID := f.createDestination(t, `{"name": "mail", "type": "email", "smtp_host": "smtp.example.com", "username": "u", "password": "`+smtpPassword+`",
		"from": "Playwatch <alerts@example.com>", "to": ["a@example.com", "b@example.com"]}`)

	r := f.call(t, "GET", "/api/v1/destinations", "")
	if r.code != 200 {
		t.Fatalf("GET list: %d %s", r.code, r.body)
	}
	assertNoSecret(t, "GET /api/v1/destinations", r.body)
	list := decodeJSON[listDestinationsResponse](t, r)
	if len(list.Destinations) != 4 {
		t.Fatalf("listed %d destinations, want 4: %s", len(list.Destinations), r.body)
	}
	byID := map[int64]destinationJSON{}
	for _, d := range list.Destinations {
		byID[d.ID] = d
		if d.Status != "ok" || d.LastError != nil || d.CreatedAt.IsZero() || d.UpdatedAt.IsZero() {
			t.Errorf("destination %d: status %q, last_error %v, created %v", d.ID, d.Status, d.LastError, d.CreatedAt)
		}
	}
	if got := byID[slack]; got.URL != "https://hooks.slack.com/****" || got.Type != "slack" || got.Name != "team chat" {
		t.Errorf("slack destination shown as %+v", got)
	}
	if got := byID[tg]; got.BotToken != maskedSecret || got.ChatID != "-1001234567890" {
		t.Errorf("telegram destination shown as %+v", got)
	}
	if got := byID[hook]; got.URL != "https://example.com/hook?x=1" || got.Secret != maskedSecret {
		t.Errorf("webhook destination shown as %+v", got)
	}
	if got := byID[mailID]; got.Password != maskedSecret || got.SMTPPort != 587 || got.TLS != "starttls" || !slices.Equal(got.To, []string{"a@example.com", "b@example.com"}) {
		t.Errorf("email destination shown as %+v", got)
	}
	// The object has the type's own fields only.
	var raw map[string]any
	_ = json.Unmarshal([]byte(f.call(t, "GET", fmt.Sprintf("/api/v1/destinations/%d", tg), "").body), &raw)
	for _, k := range []string{"url", "secret", "smtp_host", "to"} {
		if _, ok := raw[k]; ok {
			t.Errorf("the telegram destination shows %s: %v", k, raw)
		}
	}
	if _, ok := raw["last_error"]; !ok {
		t.Errorf("no last_error in %v", raw)
	}

	// Stored apart: the public config has no secret, the secrets table has them.
	if c := f.storedConfig(t, slack); c["url"] != nil {
		t.Errorf("the slack URL is in notify_destinations.config: %v", c)
	}
	if s := f.storedSecrets(t, slack); s.URL != slackURL {
		t.Errorf("stored slack secrets %+v", s)
	}
	if c := f.storedConfig(t, hook); c["url"] != "https://example.com/hook?x=1" || c["secret"] != nil {
		t.Errorf("stored webhook config %v", c)
	}
	if s := f.storedSecrets(t, tg); s.BotToken != botToken {
		t.Errorf("stored telegram secrets %+v", s)
	}

	// A PATCH with the masks sent back keeps the secrets and mends a broken destination.
	mustExec(t, f.pool, `UPDATE notify_destinations SET status = 'broken', last_error = '403 Forbidden: bot was blocked by the user'`)
	r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/destinations/%d", tg), `{"bot_token": "********", "chat_id": "@playwatch_alerts", "name": "tg2"}`)
	if r.code != 200 {
		t.Fatalf("PATCH telegram: %d %s", r.code, r.body)
	}
	assertNoSecret(t, "PATCH answer", r.body)
	if got := decodeJSON[destinationJSON](t, r); got.Status != "ok" || got.LastError != nil || got.ChatID != "@playwatch_alerts" || got.Name != "tg2" || !got.UpdatedAt.After(got.CreatedAt) {
		t.Errorf("after PATCH: %+v", got)
	}
	if s := f.storedSecrets(t, tg); s.BotToken != botToken {
		t.Errorf("the masked bot_token replaced the stored one: %+v", s)
	}
	r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/destinations/%d", slack), `{"url": "https://hooks.slack.com/****"}`)
	if r.code != 200 || f.storedSecrets(t, slack).URL != slackURL {
		t.Errorf("PATCH slack with its masked URL: %d %s, stored %+v", r.code, r.body, f.storedSecrets(t, slack))
	}
	newURL := "https://hooks.slack.com/services/T0001/B0002/othersecret"
	if r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/destinations/%d", slack), `{"url": "`+newURL+`"}`); r.code != 200 || f.storedSecrets(t, slack).URL != newURL {
		t.Errorf("PATCH slack with a new URL: %d %s", r.code, r.body)
	}
	// null clears an optional secret.
	if r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/destinations/%d", hook), `{"secret": null}`); r.code != 200 || f.storedSecrets(t, hook).Secret != "" {
		t.Errorf("PATCH webhook secret null: %d %s", r.code, r.body)
	}
	if r = f.call(t, "GET", fmt.Sprintf("/api/v1/destinations/%d", hook), ""); strings.Contains(r.body, `"secret"`) {
		t.Errorf("a cleared secret still shows: %s", r.body)
	}
	// The GET's body sent back, changed, is a PATCH: its read-only fields are ignored.
	r = f.call(t, "GET", fmt.Sprintf("/api/v1/destinations/%d", hook), "")
	var back map[string]any
	if err := json.Unmarshal([]byte(r.body), &back); err != nil {
		t.Fatal(err)
	}
	back["name"] = "hook2"
	body, _ := json.Marshal(back)
	if r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/destinations/%d", hook), string(body)); r.code != 200 || decodeJSON[destinationJSON](t, r).Name != "hook2" {
		t.Errorf("PATCH with the GET's body: %d %s", r.code, r.body)
	}
	if r = f.call(t, "POST", "/api/v1/destinations", `{"name": "x", "type": "webhook", "url": "https://example.com/h", "status": "ok"}`); r.code != 400 || !strings.Contains(r.body, "status") {
		t.Errorf("POST with status: %d %s", r.code, r.body)
	}
	if r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/destinations/%d", hook), `{"type": "slack"}`); r.code != 400 || !strings.Contains(r.body, "type") {
		t.Errorf("PATCH type: %d %s", r.code, r.body)
	}

	for _, path := range []string{"/api/v1/destinations/999", "/api/v1/destinations/999/test"} {
		method := "GET"
		if strings.HasSuffix(path, "test") {
			method = "POST"
		}
		if r = f.call(t, method, path, ""); r.code != 404 {
			t.Errorf("%s %s: %d %s", method, path, r.code, r.body)
		}
	}
	if r = f.call(t, "GET", "/api/v1/destinations/abc", ""); r.code != 400 || !strings.Contains(r.body, "id") {
		t.Errorf("GET a bad id: %d %s", r.code, r.body)
	}
	if r = f.call(t, "DELETE", fmt.Sprintf("/api/v1/destinations/%d", mailID), ""); r.code != 204 {
		t.Errorf("DELETE: %d %s", r.code, r.body)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_destination_secrets WHERE destination_id = $1`, mailID); n != 0 {
		t.Errorf("the deleted destination's secrets are left")
	}
	if r = f.call(t, "DELETE", fmt.Sprintf("/api/v1/destinations/%d", mailID), ""); r.code != 404 {
		t.Errorf("DELETE again: %d %s", r.code, r.body)
	}
	if r = f.call(t, "PUT", "/api/v1/destinations", "{}"); r.code != 405 {
		t.Errorf("PUT: %d", r.code)
	}
	assertNoSecret(t, "the log", f.logs.String())
	if !strings.Contains(f.logs.String(), "destination created") {
		t.Errorf("nothing logged: %s", f.logs.String())
	}
}

// Every verb, reads included, needs the token.
func TestNotifyAPINeedsToken(t *testing.T) {
	t.Parallel()
	f := newNotifyFixture(t, nil)
	id := f.createDestination(t, `{"name": "hook", "type": "webhook", "url": "https://example.com/h"}`)
	for _, c := range []struct{ method, path string }{
		{"GET", "/api/v1/destinations"}, {"POST", "/api/v1/destinations"},
		{"GET", fmt.Sprintf("/api/v1/destinations/%d", id)}, {"PATCH", fmt.Sprintf("/api/v1/destinations/%d", id)},
		{"DELETE", fmt.Sprintf("/api/v1/destinations/%d", id)}, {"POST", fmt.Sprintf("/api/v1/destinations/%d/test", id)},
		{"GET", "/api/v1/rules"}, {"POST", "/api/v1/rules"}, {"GET", "/api/v1/rules/1"}, {"PATCH", "/api/v1/rules/1"},
		{"DELETE", "/api/v1/rules/1"}, {"GET", "/api/v1/notifications"},
	} {
		for _, auth := range []string{"", "Bearer wrong"} {
			r := f.do(t, c.method, c.path, `{"name": "x"}`, "Authorization", auth)
			if r.code != 401 || r.header.Get("WWW-Authenticate") == "" || !strings.Contains(r.body, "REGISTRY_TOKEN") {
				t.Errorf("%s %s with %q: %d %s", c.method, c.path, auth, r.code, r.body)
			}
		}
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_destinations`); n != 1 {
		t.Errorf("%d destinations after the refused requests, want 1", n)
	}
}

// Bad destinations are refused with 400 naming the field.
func TestNotifyDestinationValidation(t *testing.T) {
	t.Parallel()
	f := newNotifyFixture(t, nil)
	for _, c := range []struct{ body, field string }{
		{`{"type": "slack", "url": "https://hooks.slack.com/x"}`, "name"},
		{`{"name": "a", "url": "https://x.example/"}`, "type"},
		{`{"name": "a", "type": "pager"}`, "type"},
		{`{"name": "", "type": "slack", "url": "https://hooks.slack.com/x"}`, "name"},
		{`{"name": "a", "type": "slack"}`, "url"},
		{`{"name": "a", "type": "slack", "url": "ftp://hooks.slack.com/x"}`, "url"},
		{`{"name": "a", "type": "slack", "url": "https://user:pw@hooks.slack.com/x"}`, "url"},
		{`{"name": "a", "type": "slack", "url": "https:///x"}`, "url"},
		{`{"name": "a", "type": "webhook", "url": "http://127.0.0.1:8080/x"}`, "NOTIFY_ALLOW_PRIVATE"},
		{`{"name": "a", "type": "webhook", "url": "http://[::1]/x"}`, "NOTIFY_ALLOW_PRIVATE"},
		{`{"name": "a", "type": "webhook", "url": "http://10.1.2.3/x"}`, "NOTIFY_ALLOW_PRIVATE"},
		{`{"name": "a", "type": "webhook", "url": "http://169.254.169.254/latest"}`, "NOTIFY_ALLOW_PRIVATE"},
		{`{"name": "a", "type": "webhook", "url": "http://[fd00::1]/x"}`, "NOTIFY_ALLOW_PRIVATE"},
		{`{"name": "a", "type": "webhook", "url": 5}`, "url"},
		{`{"name": "a", "type": "webhook", "url": "https://x.example/", "secret": "********"}`, "secret"},
		{`{"name": "a", "type": "webhook", "url": "https://x.example/", "colour": "red"}`, "colour"},
		{`{"name": "a", "type": "slack", "url": "https://x.example/", "bot_token": "1:a"}`, "bot_token"},
		{`{"name": "a", "type": "telegram", "chat_id": "1"}`, "bot_token"},
		{`{"name": "a", "type": "telegram", "bot_token": "no token", "chat_id": "1"}`, "bot_token"},
		{`{"name": "a", "type": "telegram", "bot_token": "1:abc"}`, "chat_id"},
		{`{"name": "a", "type": "telegram", "bot_token": "1:abc", "chat_id": "x y"}`, "chat_id"},
		{`{"name": "a", "type": "email", "from": "a@example.com", "to": ["b@example.com"]}`, "smtp_host"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp://x", "from": "a@example.com", "to": ["b@example.com"]}`, "smtp_host"},
		{`{"name": "a", "type": "email", "smtp_host": "192.168.1.1", "from": "a@example.com", "to": ["b@example.com"]}`, "smtp_host"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "tls": "none", "from": "a@example.com", "to": ["b@example.com"]}`, "tls"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "tls": "ssl", "from": "a@example.com", "to": ["b@example.com"]}`, "tls"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "smtp_port": 70000, "from": "a@example.com", "to": ["b@example.com"]}`, "smtp_port"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "from": "nobody", "to": ["b@example.com"]}`, "from"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "from": "a@example.com", "to": []}`, "to"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "from": "a@example.com", "to": ["not an address"]}`, "to"},
		{`{"name": "a", "type": "slack", "url": "https://hooks.slack.com/x", "status": "broken"}`, "status"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "username": "u", "password": "", "from": "a@example.com", "to": ["b@example.com"]}`, "password"},
		{`{"name": "a", "type": "email", "smtp_host": "smtp.example.com", "smtp_port": 25.5, "from": "a@example.com", "to": ["b@example.com"]}`, "smtp_port"},
	} {
		r := f.call(t, "POST", "/api/v1/destinations", c.body)
		if r.code != 400 || !strings.Contains(r.body, c.field) {
			t.Errorf("POST %s: %d %s, want 400 naming %s", c.body, r.code, r.body, c.field)
		}
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_destinations`); n != 0 {
		t.Errorf("%d destinations stored from bad bodies", n)
	}
	// A secret never comes back in an error either.
	r := f.call(t, "POST", "/api/v1/destinations", `{"name": "a", "type": "slack", "url": "ftp://hooks.slack.com/slacksecretpath123"}`)
	assertNoSecret(t, "a 400", r.body)

	// NOTIFY_ALLOW_PRIVATE lets a receiver on loopback in; the e-mail
	// server on loopback may then go without TLS.
	f.api.allowPrivate = true
	f.createDestination(t, `{"name": "local", "type": "webhook", "url": "http://127.0.0.1:8080/x"}`)
	f.createDestination(t, `{"name": "mail", "type": "email", "smtp_host": "smtp.example.com", "smtp_port": 18537.0, "from": "a@example.com", "to": ["b@example.com"]}`)
	id := f.createDestination(t, `{"name": "local mail", "type": "email", "smtp_host": "127.0.0.1", "tls": "none", "from": "a@example.com", "to": ["b@example.com"]}`)
	if got := decodeJSON[destinationJSON](t, f.call(t, "GET", fmt.Sprintf("/api/v1/destinations/%d", id), "")); got.SMTPPort != 25 || got.TLS != "none" {
		t.Errorf("local mail: %+v", got)
	}
}

// POST …/test sends through the sender: success mends the destination,
// a failure records the receiver's answer, cut and without the secret.
func TestNotifyDestinationTest(t *testing.T) {
	t.Parallel()
	tester := &fakeTester{status: 200}
	f := newNotifyFixture(t, tester)
	id := f.createDestination(t, `{"name": "tg", "type": "telegram", "bot_token": "`+botToken+`", "chat_id": "42"}`)
	mustExec(t, f.pool, `UPDATE notify_destinations SET status = 'broken', last_error = 'old'`)
	path := fmt.Sprintf("/api/v1/destinations/%d/test", id)
	r := f.call(t, "POST", path, "")
	if r.code != 200 || r.body != `{"ok":true,"http_status":200}`+"\n" {
		t.Errorf("test: %d %s", r.code, r.body)
	}
	if len(tester.got) != 1 || tester.got[0].Config.BotToken != botToken || tester.got[0].Config.ChatID != "42" {
		t.Errorf("the sender got %+v", tester.got)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_destinations WHERE status = 'ok' AND last_error IS NULL AND updated_at > created_at`); n != 1 {
		t.Error("a successful test did not mend the destination (and move its updated_at)")
	}

	tester.status = 403
	tester.err = errors.New(`Post "https://api.telegram.org/bot` + botToken + `/sendMessage": 403 {"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}` + strings.Repeat("ش", 200))
	r = f.call(t, "POST", path, "")
	if r.code != 502 {
		t.Fatalf("failed test: %d %s", r.code, r.body)
	}
	got := decodeJSON[destinationTestResponse](t, r)
	if got.OK || got.HTTPStatus != 403 || !strings.Contains(got.Error, "bot was blocked") || len(got.Error) > 200 || !strings.Contains(r.body, `"ok":false`) {
		t.Errorf("failed test answered %+v", got)
	}
	assertNoSecret(t, "the failed test's answer", r.body)
	var lastErr string
	if err := f.pool.QueryRow(context.Background(), `SELECT last_error FROM notify_destinations WHERE id = $1`, id).Scan(&lastErr); err != nil || lastErr != got.Error {
		t.Errorf("last_error %q (%v), want %q", lastErr, err, got.Error)
	}
	assertNoSecret(t, "the log", f.logs.String())

	// A client error quotes a Slack URL, whose path is the secret.
	slackID := f.createDestination(t, `{"name": "team chat", "type": "slack", "url": "`+slackURL+`"}`)
	tester.status, tester.err = 0, errors.New(`Post "`+slackURL+`": dial tcp: lookup hooks.slack.com: no such host`)
	r = f.call(t, "POST", fmt.Sprintf("/api/v1/destinations/%d/test", slackID), "")
	if r.code != 502 || !strings.Contains(r.body, "https://hooks.slack.com/****") {
		t.Errorf("failed slack test: %d %s", r.code, r.body)
	}
	assertNoSecret(t, "the failed slack test's answer", r.body)
	if n := count(t, f.pool, `SELECT count(*) FROM notify_destinations WHERE last_error LIKE '%slacksecretpath123%'`); n != 0 {
		t.Error("last_error holds the Slack URL's path")
	}

	f.api.tester = nil
	if r = f.call(t, "POST", path, ""); r.code != 503 {
		t.Errorf("test without a sender: %d %s", r.code, r.body)
	}
}

func insertApp(t *testing.T, pool *pgxpool.Pool, pkg string) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO apps_registry_application (package_name) VALUES ($1)`, pkg)
}

// Rules are created with their defaults, read, changed and deleted; what
// they refer to must exist; a destination a rule uses cannot be deleted.
func TestNotifyRulesLifecycle(t *testing.T) {
	t.Parallel()
	f := newNotifyFixture(t, nil)
	insertApp(t, f.pool, "org.telegram.messenger")
	d1 := f.createDestination(t, `{"name": "a", "type": "slack", "url": "https://hooks.slack.com/services/a"}`)
	d2 := f.createDestination(t, `{"name": "b", "type": "webhook", "url": "https://example.com/b"}`)

	r := f.call(t, "POST", "/api/v1/rules", fmt.Sprintf(`{"name": "bad reviews", "event": "review", "destinations": [%d],
		"filter": {"max_stars": 2, "sentiment": ["NEGATIVE"], "keywords": ["کند", "slow"]}}`, d1))
	if r.code != 201 || r.header.Get("Location") == "" {
		t.Fatalf("POST rule: %d %s", r.code, r.body)
	}
	rule := decodeJSON[ruleJSON](t, r)
	if rule.MaxPerHour != 20 || rule.Backfill != "0s" || rule.Apps != nil || !slices.Equal(rule.Destinations, []int64{d1}) ||
		*rule.Filter.MaxStars != 2 || !slices.Equal(rule.Filter.Keywords, []string{"کند", "slow"}) {
		t.Errorf("created rule %+v", rule)
	}
	if !strings.Contains(r.body, `"apps":null`) {
		t.Errorf("apps not null: %s", r.body)
	}
	rules, err := loadRules(context.Background(), f.pool, "review", nil)
	if err != nil || len(rules) != 1 || rules[0].Backfill != 0 || rules[0].MaxPerHour != 20 || rules[0].Filter.Sentiment[0] != "NEGATIVE" {
		t.Fatalf("stored rules %+v (%v)", rules, err)
	}

	r = f.call(t, "POST", "/api/v1/rules", fmt.Sprintf(`{"name": "drops", "event": "rating_drop", "destinations": [%d, %d, %d],
		"apps": ["org.telegram.messenger"], "filter": {"min_drop": 0.1, "window": "7d"}, "max_per_hour": 0, "backfill": "24h"}`, d1, d2, d2))
	if r.code != 201 {
		t.Fatalf("POST rating_drop rule: %d %s", r.code, r.body)
	}
	drop := decodeJSON[ruleJSON](t, r)
	if drop.Backfill != "24h" || drop.MaxPerHour != 0 || !slices.Equal(drop.Apps, []string{"org.telegram.messenger"}) || !slices.Equal(drop.Destinations, []int64{d1, d2}) || drop.Filter.Window != "7d" {
		t.Errorf("rating_drop rule %+v", drop)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_rules WHERE id = $1 AND backfill = interval '24 hours'`, drop.ID); n != 1 {
		t.Error("backfill not stored as 24 hours")
	}

	// A destination in use: 409 naming the rules.
	r = f.call(t, "DELETE", fmt.Sprintf("/api/v1/destinations/%d", d1), "")
	if r.code != 409 || !strings.Contains(r.body, "bad reviews") || !strings.Contains(r.body, "drops") {
		t.Errorf("DELETE a destination in use: %d %s", r.code, r.body)
	}
	inUse := decodeJSON[destinationInUseResponse](t, r)
	if len(inUse.Rules) != 2 || inUse.Rules[0].ID != rule.ID || inUse.Rules[1].ID != drop.ID {
		t.Errorf("409 names rules %+v", inUse.Rules)
	}

	// PATCH: destinations replaced, the rest kept.
	r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/rules/%d", rule.ID), fmt.Sprintf(`{"destinations": [%d], "max_per_hour": 5}`, d2))
	if r.code != 200 {
		t.Fatalf("PATCH rule: %d %s", r.code, r.body)
	}
	if got := decodeJSON[ruleJSON](t, r); !slices.Equal(got.Destinations, []int64{d2}) || got.MaxPerHour != 5 || got.Name != "bad reviews" || *got.Filter.MaxStars != 2 {
		t.Errorf("after PATCH %+v", got)
	}
	if r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/rules/%d", rule.ID), `{"event": "new_version"}`); r.code != 400 || !strings.Contains(r.body, "filter.") {
		t.Errorf("PATCH event with a review filter left: %d %s", r.code, r.body)
	}
	if r = f.call(t, "PATCH", fmt.Sprintf("/api/v1/rules/%d", rule.ID), `{"event": "new_version", "filter": {}}`); r.code != 200 {
		t.Errorf("PATCH event and filter: %d %s", r.code, r.body)
	}

	r = f.call(t, "GET", "/api/v1/rules", "")
	if list := decodeJSON[listRulesResponse](t, r); r.code != 200 || len(list.Rules) != 2 {
		t.Errorf("GET rules: %d %s", r.code, r.body)
	}
	if r = f.call(t, "GET", "/api/v1/rules?event=rating_drop", ""); len(decodeJSON[listRulesResponse](t, r).Rules) != 1 {
		t.Errorf("GET rules of rating_drop: %s", r.body)
	}
	if r = f.call(t, "GET", fmt.Sprintf("/api/v1/rules/%d", drop.ID), ""); r.code != 200 || decodeJSON[ruleJSON](t, r).Backfill != "24h" {
		t.Errorf("GET rule: %d %s", r.code, r.body)
	}
	if r = f.call(t, "DELETE", fmt.Sprintf("/api/v1/rules/%d", drop.ID), ""); r.code != 204 {
		t.Errorf("DELETE rule: %d %s", r.code, r.body)
	}
	if r = f.call(t, "GET", fmt.Sprintf("/api/v1/rules/%d", drop.ID), ""); r.code != 404 {
		t.Errorf("GET a deleted rule: %d", r.code)
	}
	if r = f.call(t, "DELETE", fmt.Sprintf("/api/v1/destinations/%d", d1), ""); r.code != 204 {
		t.Errorf("DELETE a destination no rule uses: %d %s", r.code, r.body)
	}
}

// Bad rules are refused with 400 naming the field.
func TestNotifyRuleValidation(t *testing.T) {
	t.Parallel()
	f := newNotifyFixture(t, nil)
	insertApp(t, f.pool, "org.telegram.messenger")
	d := f.createDestination(t, `{"name": "a", "type": "webhook", "url": "https://example.com/a"}`)
	ok := fmt.Sprintf(`"name": "r", "destinations": [%d]`, d)
	for _, c := range []struct{ body, field string }{
		{fmt.Sprintf(`{"event": "review", "destinations": [%d]}`, d), "name"},
		{`{"name": "r", "event": "review"}`, "destinations"},
		{`{` + ok + `}`, "event"},
		{`{` + ok + `, "event": "reviews"}`, "event"},
		{`{"name": "r", "event": "review", "destinations": []}`, "destinations"},
		{`{"name": "r", "event": "review", "destinations": [999]}`, "destinations"},
		{`{"name": "r", "event": "review", "destinations": ["a"]}`, "destinations"},
		{`{` + ok + `, "event": "review", "apps": ["com.example.unknown"]}`, "apps"},
		{`{` + ok + `, "event": "review", "apps": ["not a package"]}`, "apps"},
		{`{` + ok + `, "event": "review", "apps": []}`, "apps"},
		{`{` + ok + `, "event": "review", "filter": {"max_stars": 6}}`, "filter.max_stars"},
		{`{` + ok + `, "event": "review", "filter": {"max_stars": 1.5}}`, "filter.max_stars"},
		{`{` + ok + `, "event": "review", "filter": {"sentiment": ["ANGRY"]}}`, "filter.sentiment"},
		{`{` + ok + `, "event": "review", "filter": {"text_lang": ["de"]}}`, "filter.text_lang"},
		{`{` + ok + `, "event": "review", "filter": {"keywords": [""]}}`, "filter.keywords"},
		{`{` + ok + `, "event": "review", "filter": {"keywords": ["` + strings.Repeat("k", 101) + `"]}}`, "filter.keywords"},
		{`{` + ok + `, "event": "review", "filter": {"min_length": -1}}`, "filter.min_length"},
		{`{` + ok + `, "event": "review", "filter": {"window": "24h"}}`, "filter.window"},
		{`{` + ok + `, "event": "review", "filter": {"colour": 1}}`, "filter.colour"},
		{`{` + ok + `, "event": "review", "filter": [1]}`, "filter"},
		{`{` + ok + `, "event": "rating_drop", "filter": {"min_drop": 0}}`, "filter.min_drop"},
		{`{` + ok + `, "event": "rating_drop", "filter": {"window": "yesterday"}}`, "filter.window"},
		{`{` + ok + `, "event": "rating_drop", "filter": {"max_stars": 1}}`, "filter.max_stars"},
		{`{` + ok + `, "event": "negative_spike", "filter": {"min_count": 0}}`, "filter.min_count"},
		{`{` + ok + `, "event": "negative_spike", "filter": {"factor": -3}}`, "filter.factor"},
		{`{` + ok + `, "event": "crawl_failing", "filter": {"min_count": 1}}`, "filter.min_count"},
		{`{` + ok + `, "event": "review", "max_per_hour": -1}`, "max_per_hour"},
		{`{` + ok + `, "event": "review", "max_per_hour": 10001}`, "max_per_hour"},
		{`{` + ok + `, "event": "review", "backfill": "31d"}`, "backfill"},
		{`{` + ok + `, "event": "review", "backfill": "-1h"}`, "backfill"},
		{`{` + ok + `, "event": "review", "backfill": 5}`, "backfill"},
		{`{` + ok + `, "event": "review", "backfill": ""}`, "backfill"},
		{`{` + ok + `, "event": "review", "priority": 1}`, "priority"},
	} {
		r := f.call(t, "POST", "/api/v1/rules", c.body)
		if r.code != 400 || !strings.Contains(r.body, c.field) {
			t.Errorf("POST %s: %d %s, want 400 naming %s", c.body, r.code, r.body, c.field)
		}
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notify_rules`); n != 0 {
		t.Errorf("%d rules stored from bad bodies", n)
	}
	for _, body := range []string{
		`{` + ok + `, "event": "review", "filter": {"text_lang": ["fa", "en"], "min_length": 0, "sentiment": null}, "backfill": "30d"}`,
		`{` + ok + `, "event": "negative_spike", "filter": {"min_count": 5, "factor": 3}}`,
		`{` + ok + `, "event": "crawl_failing", "filter": null, "apps": null}`,
		`{` + ok + `, "event": "new_version", "max_per_hour": 10000}`,
		// JSON Schema counts 5.0 as an integer.
		`{` + ok + `, "event": "review", "max_per_hour": 5.0, "filter": {"max_stars": 2.0}, "backfill": null}`,
	} {
		if r := f.call(t, "POST", "/api/v1/rules", body); r.code != 201 {
			t.Errorf("POST %s: %d %s", body, r.code, r.body)
		}
	}
}

// insertNotification puts an outbox row as the event decider would.
func insertNotification(t *testing.T, pool *pgxpool.Pool, rule, dest int64, key, status string) int64 {
	t.Helper()
	var id int64
	err := pool.QueryRow(context.Background(), `INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, status, attempts, last_error, event_at, sent_at)
VALUES ($1, $2, 'review', $3, '{}', $4::text, CASE WHEN $4::text = 'pending' THEN 0 ELSE 3 END, CASE WHEN $4 = 'failed' THEN 'HTTP 500: oops' END, now(),
	CASE WHEN $4 = 'sent' THEN now() END) RETURNING id`, rule, dest, key, status).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// outboxFixture has a rule with two destinations and rows of each status.
func outboxFixture(t *testing.T) (f *notifyFixture, rule, d1, d2 int64, ids map[string][]int64) {
	f = newNotifyFixture(t, nil)
	d1 = f.createDestination(t, `{"name": "a", "type": "webhook", "url": "https://example.com/a"}`)
	d2 = f.createDestination(t, `{"name": "b", "type": "webhook", "url": "https://example.com/b"}`)
	r := f.call(t, "POST", "/api/v1/rules", fmt.Sprintf(`{"name": "r", "event": "review", "destinations": [%d, %d]}`, d1, d2))
	rule = decodeJSON[ruleJSON](t, r).ID
	ids = map[string][]int64{}
	for i := range 7 {
		status := []string{"pending", "sent", "failed"}[i%3]
		dest := []int64{d1, d2}[i%2]
		ids[status] = append(ids[status], insertNotification(t, f.pool, rule, dest, fmt.Sprintf("review:%d", i), status))
	}
	return f, rule, d1, d2, ids
}

// The outbox is listed newest first, filtered and paged by its cursor.
func TestNotifyNotificationsList(t *testing.T) {
	t.Parallel()
	f, rule, d1, _, ids := outboxFixture(t)
	r := f.call(t, "GET", "/api/v1/notifications", "")
	if r.code != 200 {
		t.Fatalf("GET: %d %s", r.code, r.body)
	}
	all := decodeJSON[listNotificationsResponse](t, r)
	if len(all.Notifications) != 7 || all.NextCursor != nil || !strings.Contains(r.body, `"next_cursor":null`) {
		t.Fatalf("listed %s", r.body)
	}
	for i, n := range all.Notifications {
		if i > 0 && n.ID >= all.Notifications[i-1].ID {
			t.Errorf("not newest first: %s", r.body)
		}
	}
	first := all.Notifications[len(all.Notifications)-1]
	if first.RuleID != rule || first.DestinationID != d1 || first.Event != "review" || first.EventKey != "review:0" || first.Status != "pending" || first.SentAt != nil || first.LastError != nil {
		t.Errorf("oldest row %+v", first)
	}
	failed := decodeJSON[listNotificationsResponse](t, f.call(t, "GET", "/api/v1/notifications?status=failed", "")).Notifications
	if len(failed) != len(ids["failed"]) || failed[0].LastError == nil || *failed[0].LastError != "HTTP 500: oops" || failed[0].Attempts != 3 {
		t.Errorf("failed rows %+v", failed)
	}
	if got := decodeJSON[listNotificationsResponse](t, f.call(t, "GET", fmt.Sprintf("/api/v1/notifications?destination=%d&rule=%d", d1, rule), "")).Notifications; len(got) != 4 {
		t.Errorf("%d rows to destination %d, want 4", len(got), d1)
	}
	// Pages of 3: 3, 3, 1.
	var seen []int64
	cursor := ""
	for page := 0; ; page++ {
		path := "/api/v1/notifications?limit=3"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		l := decodeJSON[listNotificationsResponse](t, f.call(t, "GET", path, ""))
		for _, n := range l.Notifications {
			seen = append(seen, n.ID)
		}
		if l.NextCursor == nil {
			break
		}
		cursor = *l.NextCursor
		if page > 3 {
			t.Fatal("paging does not end")
		}
	}
	if len(seen) != 7 || seen[0] != all.Notifications[0].ID || seen[6] != first.ID {
		t.Errorf("pages gave %v", seen)
	}
	if r := f.call(t, "GET", "/api/v1/notifications?status=pending&rule=1&destination=9223372036854775806&cursor=1", ""); r.code != 200 {
		t.Errorf("GET with a large destination id: %d %s", r.code, r.body)
	}
	for _, q := range []string{"status=done", "rule=x", "destination=0", "limit=0", "limit=501", "cursor=-1", "page=2", "status=sent&status=failed"} {
		name, _, _ := strings.Cut(q, "=")
		if r := f.call(t, "GET", "/api/v1/notifications?"+q, ""); r.code != 400 || !strings.Contains(r.body, name) {
			t.Errorf("GET ?%s: %d %s", q, r.code, r.body)
		}
	}
}

// `notify list` shows the outbox as a table; `notify retry` puts failed
// rows back, due now with their attempts reset, and says how many.
func TestNotifyListAndRetryCommands(t *testing.T) {
	t.Parallel()
	f, _, _, _, ids := outboxFixture(t)
	dsn := f.pool.Config().ConnString()
	out, err := runCLI(t, dsn, "notify", "list", "--status", "failed")
	if err != nil {
		t.Fatalf("notify list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1+len(ids["failed"]) || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(out, "HTTP 500: oops") || strings.Contains(out, "pending") {
		t.Errorf("notify list --status failed:\n%s", out)
	}
	if out, err := runCLI(t, dsn, "notify", "list", "--status", "gone"); err == nil {
		t.Errorf("notify list --status gone: %s", out)
	}
	mustExec(t, f.pool, `UPDATE notifications SET next_attempt_at = now() + interval '1 day' WHERE status = 'failed'`)
	out, err = runCLI(t, dsn, "notify", "retry", "--failed")
	if err != nil || !strings.Contains(out, fmt.Sprintf("%d notifications pending again", len(ids["failed"]))) {
		t.Errorf("notify retry --failed: %q %v", out, err)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notifications WHERE id = ANY($1) AND status = 'pending' AND attempts = 0 AND next_attempt_at <= now()`, ids["failed"]); n != len(ids["failed"]) {
		t.Errorf("%d of %d failed rows pending again", n, len(ids["failed"]))
	}
	// By id: a sent one stays sent.
	out, err = runCLI(t, dsn, "notify", "retry", fmt.Sprint(ids["sent"][0]), fmt.Sprint(ids["pending"][0]))
	if err != nil || !strings.Contains(out, "1 notifications pending again") {
		t.Errorf("notify retry IDs: %q %v", out, err)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`); n != len(ids["sent"]) {
		t.Errorf("a sent row was put back")
	}
	for _, args := range [][]string{{"notify", "retry"}, {"notify", "retry", "--failed", "3"}, {"notify", "retry", "x"}, {"notify"}, {"notify", "send"}} {
		var uerr usageError
		if _, err := runCLI(t, dsn, args...); !errors.As(err, &uerr) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
