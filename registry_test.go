package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

type registryFixture struct {
	srv  *httptest.Server
	pool *pgxpool.Pool
}

func newRegistryFixture(t *testing.T, token string) *registryFixture {
	t.Helper()
	pool := newTestPool(t)
	reg := newMetricsRegistry("test")
	api := &registryAPI{store: newAppStore(pool), token: token, locales: testLocales, logger: testLogger(t)}
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), api, nil, []readinessCheck{{"database", pool.Ping}}, testLogger(t)))
	t.Cleanup(srv.Close)
	return &registryFixture{srv: srv, pool: pool}
}

type testResponse struct {
	code   int
	header http.Header
	body   string
}

func (f *registryFixture) do(t *testing.T, method, path, body string, header ...string) testResponse {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	code, b, h := readAnswer(t, resp, err)
	return testResponse{code, h, b}
}

// decodeJSON is r's body decoded as a T.
func decodeJSON[T any](t *testing.T, r testResponse) T {
	t.Helper()
	return decodedJSON[T](t, fmt.Sprintf("decode %q", r.body), []byte(r.body), nil)
}

func TestRegistryLifecycle(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	ctx := context.Background()

	// curl -d sends form encoding; the body is JSON all the same.
	r := f.do(t, "POST", "/api/v1/apps", `{"package_name":"org.telegram.messenger","is_messaging_app":true}`,
		"Content-Type", "application/x-www-form-urlencoded")
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	created := decodeJSON[app](t, r)
	if created.PackageName != "org.telegram.messenger" || !created.IsMessagingApp || created.IsIranianApp ||
		!created.IsActive || created.DisplayName != nil || created.ID == 0 || r.header.Get("Location") != "/api/v1/apps/org.telegram.messenger" {
		t.Fatalf("created %+v, location %q", created, r.header.Get("Location"))
	}
	r = f.do(t, "POST", "/api/v1/apps", `{"package_name":"ir.divar","display_name":"دیوار","category":"Shopping","is_iranian_app":true}`)
	if r.code != 201 {
		t.Fatalf("create ir.divar: %d %s", r.code, r.body)
	}
	if a := decodeJSON[app](t, r); a.DisplayName == nil || *a.DisplayName != "دیوار" || !a.IsIranianApp {
		t.Fatalf("created %+v", a)
	}
	var rows int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM apps_registry_application WHERE is_active`).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("%d active rows (%v), want 2", rows, err)
	}

	if r = f.do(t, "POST", "/api/v1/apps", `{"package_name":"ir.divar"}`); r.code != 409 {
		t.Fatalf("duplicate: %d %s", r.code, r.body)
	}
	if r = f.do(t, "GET", "/api/v1/apps/ir.divar", ""); r.code != 200 || decodeJSON[app](t, r).Category == nil {
		t.Fatalf("get: %d %s", r.code, r.body)
	}
	if r = f.do(t, "GET", "/api/v1/apps/com.unknown.app", ""); r.code != 404 || !strings.Contains(r.body, `"error"`) {
		t.Fatalf("get unknown: %d %s", r.code, r.body)
	}

	r = f.do(t, "PATCH", "/api/v1/apps/ir.divar", `{"display_name":null,"category":"Lifestyle","is_messaging_app":true}`)
	if r.code != 200 {
		t.Fatalf("patch: %d %s", r.code, r.body)
	}
	patched := decodeJSON[app](t, r)
	if patched.DisplayName != nil || *patched.Category != "Lifestyle" || !patched.IsMessagingApp || !patched.IsIranianApp ||
		!patched.UpdatedAt.After(patched.CreatedAt) {
		t.Fatalf("patched %+v", patched)
	}

	// Soft delete: the row stays, inactive, and leaves the default listing.
	if r = f.do(t, "DELETE", "/api/v1/apps/ir.divar", ""); r.code != 204 || r.body != "" {
		t.Fatalf("delete: %d %q", r.code, r.body)
	}
	var active bool
	if err := f.pool.QueryRow(ctx, `SELECT is_active FROM apps_registry_application WHERE package_name = 'ir.divar'`).Scan(&active); err != nil || active {
		t.Fatalf("after delete: active=%v err=%v, want a kept, inactive row", active, err)
	}
	if r = f.do(t, "DELETE", "/api/v1/apps/com.unknown.app", ""); r.code != 404 {
		t.Fatalf("delete unknown: %d", r.code)
	}
	r = f.do(t, "POST", "/api/v1/apps", `{"package_name":"ir.divar"}`)
	if r.code != 409 || !strings.Contains(r.body, "is_active") {
		t.Fatalf("re-create inactive: %d %s, want 409 with a PATCH hint", r.code, r.body)
	}
	if r = f.do(t, "PATCH", "/api/v1/apps/ir.divar", `{"is_active":true}`); r.code != 200 || !decodeJSON[app](t, r).IsActive {
		t.Fatalf("reactivate: %d %s", r.code, r.body)
	}
	if r = f.do(t, "PATCH", "/api/v1/apps/com.unknown.app", `{"is_active":true}`); r.code != 404 {
		t.Fatalf("patch unknown: %d", r.code)
	}
}

func listPackages(t *testing.T, f *registryFixture, query string) ([]string, *string) {
	t.Helper()
	r := f.do(t, "GET", "/api/v1/apps"+query, "")
	if r.code != 200 {
		t.Fatalf("list %s: %d %s", query, r.code, r.body)
	}
	var resp listAppsResponse
	if err := json.Unmarshal([]byte(r.body), &resp); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range resp.Apps {
		names = append(names, a.PackageName)
	}
	return names, resp.NextCursor
}

func TestRegistryListFiltersAndPages(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	for _, body := range []string{
		`{"package_name":"a.one","is_messaging_app":true}`,
		`{"package_name":"b.two","is_iranian_app":true}`,
		`{"package_name":"c.three","is_messaging_app":true,"is_iranian_app":true}`,
		`{"package_name":"d.four"}`,
		`{"package_name":"e.five"}`,
	} {
		if r := f.do(t, "POST", "/api/v1/apps", body); r.code != 201 {
			t.Fatalf("%s: %d %s", body, r.code, r.body)
		}
	}
	f.do(t, "DELETE", "/api/v1/apps/e.five", "")

	check := func(query string, want ...string) {
		t.Helper()
		got, _ := listPackages(t, f, query)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("list %s = %v, want %v", query, got, want)
		}
	}
	check("", "a.one", "b.two", "c.three", "d.four")
	check("?active=all", "a.one", "b.two", "c.three", "d.four", "e.five")
	check("?active=false", "e.five")
	check("?messaging=true", "a.one", "c.three")
	check("?iranian=true&messaging=false", "b.two")
	check("?iranian=false&active=all", "a.one", "d.four", "e.five")

	var all []string
	query := "?active=all&limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		names, next := listPackages(t, f, query)
		if len(names) > 2 {
			t.Fatalf("page of %d with limit=2", len(names))
		}
		all = append(all, names...)
		if next == nil {
			break
		}
		query = "?active=all&limit=2&cursor=" + *next
	}
	if strings.Join(all, ",") != "a.one,b.two,c.three,d.four,e.five" {
		t.Fatalf("pages joined = %v", all)
	}
}

// The cursor is the package name to list after, so every string the OpenAPI
// document allows for it (a package name) is accepted, registered or not.
func TestRegistryListCursorIsAPackageName(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	for _, pkg := range []string{"a.one", "b.two", "c.three"} {
		if r := f.do(t, "POST", "/api/v1/apps", `{"package_name":"`+pkg+`"}`); r.code != 201 {
			t.Fatalf("%s: %d %s", pkg, r.code, r.body)
		}
	}
	names, next := listPackages(t, f, "?limit=1")
	if strings.Join(names, ",") != "a.one" || next == nil || *next != "a.one" {
		t.Fatalf("first page %v, next_cursor %v; want [a.one] and a.one", names, next)
	}
	if names, _ := listPackages(t, f, "?cursor=a.one"); strings.Join(names, ",") != "b.two,c.three" {
		t.Fatalf("after a.one: %v", names)
	}
	if names, _ := listPackages(t, f, "?cursor=b.unregistered_z"); strings.Join(names, ",") != "c.three" {
		t.Fatalf("after b.unregistered_z: %v", names)
	}
}

func TestRegistryRequiresTokenForWrites(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "s3cret")
	body := `{"package_name":"com.example.app"}`
	for _, auth := range []string{"", "Bearer wrong", "s3cret", "Basic s3cret", "Bearer s3cret2"} {
		r := f.do(t, "POST", "/api/v1/apps", body, "Authorization", auth)
		if r.code != 401 || r.header.Get("WWW-Authenticate") == "" || !strings.Contains(r.body, `"error"`) {
			t.Errorf("Authorization %q: %d %s, want 401", auth, r.code, r.body)
		}
	}
	if r := f.do(t, "POST", "/api/v1/apps", body, "Authorization", "Bearer s3cret"); r.code != 201 {
		t.Fatalf("with the token: %d %s", r.code, r.body)
	}
	if r := f.do(t, "GET", "/api/v1/apps/com.example.app", ""); r.code != 200 {
		t.Fatalf("reads need no token: %d", r.code)
	}
	if r := f.do(t, "DELETE", "/api/v1/apps/com.example.app", ""); r.code != 401 {
		t.Fatalf("delete without token: %d", r.code)
	}
	if r := f.do(t, "PATCH", "/api/v1/apps/com.example.app", `{"is_active":false}`); r.code != 401 {
		t.Fatalf("patch without token: %d", r.code)
	}
}

// A surrogate pair escape is one character, and an escaped backslash before
// a u is no escape at all: both are stored as sent.
func TestRegistryStoresEscapedText(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	r := f.do(t, "POST", "/api/v1/apps", `{"package_name":"com.example.app","display_name":"ok \ud83d\ude00","category":"a\\ud800"}`)
	if r.code != 201 || !strings.Contains(r.body, `"display_name":"ok 😀"`) || !strings.Contains(r.body, `"category":"a\\ud800"`) {
		t.Fatalf("%d %s", r.code, r.body)
	}
}

// Every bad request gets its 4xx with a JSON error, and changes nothing.
func TestRegistryRejectsBadRequests(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	if r := f.do(t, "POST", "/api/v1/apps", `{"package_name":"com.example.app"}`); r.code != 201 {
		t.Fatal(r.body)
	}
	big := `{"package_name":"com.example.big","display_name":"` + strings.Repeat("x", 70<<10) + `"}`
	cases := []struct {
		name, method, path, body string
		header                   []string
		code                     int
	}{
		{"empty body", "POST", "/api/v1/apps", "", nil, 400},
		{"not json", "POST", "/api/v1/apps", "package_name=com.x.y", nil, 400},
		{"truncated json", "POST", "/api/v1/apps", `{"package_name":"com.x.y"`, nil, 400},
		{"json array", "POST", "/api/v1/apps", `[{"package_name":"com.x.y"}]`, nil, 400},
		{"json string", "POST", "/api/v1/apps", `"com.x.y"`, nil, 400},
		{"two values", "POST", "/api/v1/apps", `{"package_name":"com.x.y"}{"package_name":"com.x.z"}`, nil, 400},
		{"unknown field", "POST", "/api/v1/apps", `{"package_name":"com.x.y","colour":"red"}`, nil, 400},
		{"missing package", "POST", "/api/v1/apps", `{"display_name":"X"}`, nil, 400},
		{"null package", "POST", "/api/v1/apps", `{"package_name":null}`, nil, 400},
		{"package number", "POST", "/api/v1/apps", `{"package_name":42}`, nil, 400},
		{"one segment", "POST", "/api/v1/apps", `{"package_name":"telegram"}`, nil, 400},
		{"segment starts with digit", "POST", "/api/v1/apps", `{"package_name":"com.1app"}`, nil, 400},
		{"empty segment", "POST", "/api/v1/apps", `{"package_name":"com..app"}`, nil, 400},
		{"trailing dot", "POST", "/api/v1/apps", `{"package_name":"com.app."}`, nil, 400},
		{"hyphen", "POST", "/api/v1/apps", `{"package_name":"com.my-app"}`, nil, 400},
		{"space", "POST", "/api/v1/apps", `{"package_name":"com.my app"}`, nil, 400},
		{"non-ascii package", "POST", "/api/v1/apps", `{"package_name":"com.اپ"}`, nil, 400},
		{"package too long", "POST", "/api/v1/apps", `{"package_name":"a.` + strings.Repeat("b", 260) + `"}`, nil, 400},
		{"bool as string", "POST", "/api/v1/apps", `{"package_name":"com.x.y","is_messaging_app":"yes"}`, nil, 400},
		{"display name number", "POST", "/api/v1/apps", `{"package_name":"com.x.y","display_name":7}`, nil, 400},
		{"display name too long", "POST", "/api/v1/apps", `{"package_name":"com.x.y","display_name":"` + strings.Repeat("é", 256) + `"}`, nil, 400},
		{"category too long", "POST", "/api/v1/apps", `{"package_name":"com.x.y","category":"` + strings.Repeat("c", 101) + `"}`, nil, 400},
		{"NUL in name", "POST", "/api/v1/apps", `{"package_name":"com.x.y","display_name":"a\u0000b"}`, nil, 400},
		{"repeated key", "POST", "/api/v1/apps", `{"package_name":"com.x.y","package_name":"com.x.z"}`, nil, 400},
		{"key in another case", "POST", "/api/v1/apps", `{"Package_Name":"com.x.y"}`, nil, 400},
		{"unknown key", "POST", "/api/v1/apps", `{"package_name":"com.x.y","colour":"red"}`, nil, 400},
		{"null boolean", "POST", "/api/v1/apps", `{"package_name":"com.x.y","is_messaging_app":null}`, nil, 400},
		{"null package", "POST", "/api/v1/apps", `{"package_name":null}`, nil, 400},
		{"null body", "POST", "/api/v1/apps", `null`, nil, 400},
		{"two objects", "POST", "/api/v1/apps", `{"package_name":"com.x.y"} {}`, nil, 400},
		{"repeated key in a patch", "PATCH", "/api/v1/apps/com.example.app", `{"display_name":"a","display_name":"b"}`, nil, 400},
		{"key in another case in a patch", "PATCH", "/api/v1/apps/com.example.app", `{"Display_Name":"a"}`, nil, 400},
		{"null boolean in a patch", "PATCH", "/api/v1/apps/com.example.app", `{"is_active":null}`, nil, 400},
		{"invalid UTF-8", "POST", "/api/v1/apps", "{\"package_name\":\"com.x.y\",\"display_name\":\"a\xffb\"}", nil, 400},
		{"lone high surrogate", "POST", "/api/v1/apps", `{"package_name":"com.x.y","display_name":"a\ud83db"}`, nil, 400},
		{"lone low surrogate", "POST", "/api/v1/apps", `{"package_name":"com.x.y","category":"\ude00"}`, nil, 400},
		{"reversed surrogate pair", "POST", "/api/v1/apps", `{"package_name":"com.x.y","category":"\ude00\ud83d"}`, nil, 400},
		{"invalid UTF-8 in a patch", "PATCH", "/api/v1/apps/com.example.app", "{\"display_name\":\"\xc3\"}", nil, 400},
		{"lone surrogate in a patch", "PATCH", "/api/v1/apps/com.example.app", `{"display_name":"\udfff"}`, nil, 400},
		{"body over 64 KiB", "POST", "/api/v1/apps", big, nil, 413},
		{"xml", "POST", "/api/v1/apps", `<app/>`, []string{"Content-Type", "application/xml"}, 415},
		{"text plain", "POST", "/api/v1/apps", `{"package_name":"com.x.y"}`, []string{"Content-Type", "text/plain"}, 415},
		{"multipart", "POST", "/api/v1/apps", `{"package_name":"com.x.y"}`, []string{"Content-Type", "multipart/form-data; boundary=x"}, 415},
		{"garbled content type", "POST", "/api/v1/apps", `{"package_name":"com.x.y"}`, []string{"Content-Type", ";;"}, 415},
		{"put collection", "PUT", "/api/v1/apps", `{"package_name":"com.x.y"}`, nil, 405},
		{"post item", "POST", "/api/v1/apps/com.example.app", `{}`, nil, 405},
		{"unknown route", "GET", "/api/v2/apps", "", nil, 404},
		{"bad package in path", "GET", "/api/v1/apps/not_a_package", "", nil, 400},
		{"list active=maybe", "GET", "/api/v1/apps?active=maybe", "", nil, 400},
		{"list messaging=1x", "GET", "/api/v1/apps?messaging=1x", "", nil, 400},
		{"list limit 0", "GET", "/api/v1/apps?limit=0", "", nil, 400},
		{"list limit 501", "GET", "/api/v1/apps?limit=501", "", nil, 400},
		{"list limit text", "GET", "/api/v1/apps?limit=ten", "", nil, 400},
		{"list bad cursor", "GET", "/api/v1/apps?cursor=%%%", "", nil, 400},
		{"list forged cursor", "GET", "/api/v1/apps?cursor=bm90IGEgcGFja2FnZQ", "", nil, 400},
		{"list unknown param", "GET", "/api/v1/apps?sort=desc", "", nil, 400},
		{"list repeated param", "GET", "/api/v1/apps?limit=1&limit=2", "", nil, 400},
		{"patch empty object", "PATCH", "/api/v1/apps/com.example.app", `{}`, nil, 400},
		{"patch package name", "PATCH", "/api/v1/apps/com.example.app", `{"package_name":"com.other.app"}`, nil, 400},
		{"patch unknown field", "PATCH", "/api/v1/apps/com.example.app", `{"colour":"red"}`, nil, 400},
		{"patch active null", "PATCH", "/api/v1/apps/com.example.app", `{"is_active":null}`, nil, 400},
		{"patch active string", "PATCH", "/api/v1/apps/com.example.app", `{"is_active":"false"}`, nil, 400},
		{"patch category number", "PATCH", "/api/v1/apps/com.example.app", `{"category":5}`, nil, 400},
		{"patch category too long", "PATCH", "/api/v1/apps/com.example.app", `{"category":"` + strings.Repeat("c", 101) + `"}`, nil, 400},
		{"patch array", "PATCH", "/api/v1/apps/com.example.app", `[]`, nil, 400},
		{"patch not json", "PATCH", "/api/v1/apps/com.example.app", `is_active=false`, nil, 400},
		{"patch bad path", "PATCH", "/api/v1/apps/x", `{"is_active":false}`, nil, 400},
		{"delete bad path", "DELETE", "/api/v1/apps/com.", "", nil, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := f.do(t, tc.method, tc.path, tc.body, tc.header...)
			if r.code != tc.code {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, r.code, r.body, tc.code)
			}
			var e errorResponse
			if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error == "" {
				t.Fatalf("body %q is not a JSON error", r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
		})
	}
	var n int
	var name *string
	if err := f.pool.QueryRow(context.Background(),
		`SELECT count(*), max(display_name) FROM apps_registry_application`).Scan(&n, &name); err != nil {
		t.Fatal(err)
	}
	if n != 1 || name != nil {
		t.Fatalf("bad requests changed the table: %d rows, display_name %v", n, name)
	}
}

func TestHealthReadyAndMetrics(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	if r := f.do(t, "GET", "/healthz", ""); r.code != 200 {
		t.Fatalf("healthz: %d", r.code)
	}
	if r := f.do(t, "GET", "/readyz", ""); r.code != 200 || !strings.Contains(r.body, `"database":"ok"`) {
		t.Fatalf("readyz: %d %s", r.code, r.body)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := f.do(t, "POST", p, ""); r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET" {
			t.Errorf("POST %s: %d, Allow %q, want 405 with Allow: GET", p, r.code, r.header.Get("Allow"))
		}
	}
	f.do(t, "POST", "/api/v1/apps", `{"package_name":"com.example.app"}`)
	f.do(t, "POST", "/api/v1/apps", `{"package_name":"com.example.app"}`)
	f.do(t, "GET", "/nowhere", "")
	m := f.do(t, "GET", "/metrics", "").body
	for _, want := range []string{
		`playwatch_http_requests_total{code="201",route="POST /api/v1/apps"} 1`,
		`playwatch_http_requests_total{code="409",route="POST /api/v1/apps"} 1`,
		`playwatch_http_requests_total{code="404",route="/"} 1`,
		`playwatch_http_request_duration_seconds_count{route="POST /api/v1/apps"} 2`,
		`playwatch_build_info{version=`,
		`go_goroutines `,
		`process_resident_memory_bytes `,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	f.pool.Close()
	if r := f.do(t, "GET", "/readyz", ""); r.code != 503 || !strings.Contains(r.body, "not ready") {
		t.Fatalf("readyz with the database gone: %d %s", r.code, r.body)
	}
}

// A refusal names what was wrong: the repeated key, the null boolean.
func TestRegistryRefusalsNameTheField(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	for _, c := range []struct{ method, path, body, want string }{
		{"POST", "/api/v1/apps", `{"package_name":"a.b","package_name":"c.d"}`, "package_name is given twice"},
		{"POST", "/api/v1/apps", `{"package_name":"a.b","is_iranian_app":null}`, "is_iranian_app must be true or false, not null"},
		{"PATCH", "/api/v1/apps/a.b", `{"is_messaging_app":null}`, "is_messaging_app must be true or false, not null"},
		{"PATCH", "/api/v1/apps/a.b", `{"is_active":true,"is_active":false}`, "is_active is given twice"},
	} {
		if r := f.do(t, c.method, c.path, c.body); r.code != 400 || !strings.Contains(r.body, c.want) {
			t.Errorf("%s %s: %d %s, want 400 naming %q", c.method, c.body, r.code, r.body, c.want)
		}
	}
	if n := count(t, f.pool, `SELECT count(*) FROM apps_registry_application`); n != 0 {
		t.Errorf("%d apps registered by refused requests", n)
	}
}

// A body that does not arrive within the server's read timeout is a 408
// with a short message, not a 400 quoting socket addresses.
func TestRegistrySlowBodyIs408(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	reg := newMetricsRegistry("test")
	api := &registryAPI{store: newAppStore(pool), logger: testLogger(t)}
	srv := newHTTPServer(newHTTPHandler(reg, newHTTPMetrics(reg), api, nil, nil, testLogger(t)))
	srv.ReadTimeout = time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers at once, then a third of the promised body and silence.
	fmt.Fprint(conn, "POST /api/v1/apps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n{\"package_name\":")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "the body arrived too slowly") || strings.Contains(string(body), "127.0.0.1") {
		t.Fatalf("%d %s, want 408 without socket addresses", resp.StatusCode, body)
	}
}

// The registry API's GETs, as `run` wires them, read on the read pool: a
// GET against a locked table answers 503 with Retry-After and a JSON error
// in about READ_STATEMENT_TIMEOUT, while a POST, on the appliance's own
// pool, still registers the app (and, when it waits for a lock itself, is
// not cut at READ_STATEMENT_TIMEOUT).
func TestRegistryReadsStatementTimeout(t *testing.T) {
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	env := map[string]string{"PLAYWATCH_DATA_DIR": filepath.Join(t.TempDir(), "data"), "PLAYWATCH_HTTP_ADDR": freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t), "DATABASE_URL": dbURL, "READ_STATEMENT_TIMEOUT": "300ms"}
	base, stop, logs := startRun(t, env, "--roles", "registry")
	post := func(pkg string) testResponse {
		return registryDoWithin(t, "POST", base+"/api/v1/apps", `{"package_name":"`+pkg+`"}`, 20*time.Second)
	}
	if r := post("com.example.first"); r.code != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.code, r.body)
	}
	wantTimeout := func(path string) {
		t.Helper()
		start := time.Now()
		r := registryDoWithin(t, "GET", base+path, "", 10*time.Second)
		var e errorResponse
		if d := time.Since(start); r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "2" || d > 3*time.Second ||
			json.Unmarshal([]byte(r.body), &e) != nil || !strings.Contains(e.Error, "READ_STATEMENT_TIMEOUT") {
			t.Errorf("GET %s with its table locked: %d after %v, Retry-After %q, %s", path, r.code, d, r.header.Get("Retry-After"), r.body)
		}
	}

	// GET /api/v1/apps/{package_name} reads app_crawl_outcomes too.
	release := holdTableLock(t, pool, "app_crawl_outcomes")
	wantTimeout("/api/v1/apps/com.example.first")
	if r := post("com.example.second"); r.code != http.StatusCreated {
		t.Errorf("POST while app_crawl_outcomes is locked: %d %s", r.code, r.body)
	}
	release()

	release = holdTableLock(t, pool, "apps_registry_application")
	wantTimeout("/api/v1/apps")
	wantTimeout("/api/v1/apps/com.example.first")
	posted := make(chan testResponse, 1)
	go func() { posted <- post("com.example.third") }()
	time.Sleep(time.Second) // past READ_STATEMENT_TIMEOUT, waiting for the lock
	release()
	if r := <-posted; r.code != http.StatusCreated {
		t.Errorf("POST that waited for the lock: %d %s", r.code, r.body)
	}

	r := registryDoWithin(t, "GET", base+"/api/v1/apps", "", 10*time.Second)
	var list listAppsResponse
	if err := json.Unmarshal([]byte(r.body), &list); r.code != http.StatusOK || err != nil || len(list.Apps) != 3 {
		t.Errorf("GET /api/v1/apps after the locks: %d %s, want the 3 apps", r.code, r.body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "registry read ran past READ_STATEMENT_TIMEOUT") {
		t.Errorf("the timeouts are not logged:\n%s", logs)
	}
}

// holdTableLock holds table locked against every reader until the returned
// function (or the test's end) releases it.
func holdTableLock(t *testing.T, pool *pgxpool.Pool, table string) func() {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// registryDoWithin is one request that gives up after timeout (code 0).
func registryDoWithin(t *testing.T, method, url, body string, timeout time.Duration) testResponse {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		t.Logf("%s %s: %v", method, url, err)
		return testResponse{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return testResponse{resp.StatusCode, resp.Header, string(b)}
}
