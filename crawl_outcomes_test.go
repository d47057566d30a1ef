package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// After a crawl, app_crawl_outcomes holds each path's outcome per app and
// storefront, and GET /api/v1/apps/{package_name} shows it as last_crawl,
// valid against the OpenAPI document: a package that is not on the store
// (404 on both paths), an app whose reviews fail (HTTP 500), a healthy one,
// and one never crawled (null paths).
func TestCrawlOutcomesRecordedAndServed(t *testing.T) {
	t.Parallel()
	const (
		missing = "com.example.mistyped"
		broken  = "com.example.brokenreviews"
		healthy = "ir.example.healthy"
		never   = "com.example.never"
	)
	f := newCrawlFixture(t, testCrawlerConfig(2, 200), nil)
	f.replay.setApp(missing, replayApp{DetailsAlways: fault404})
	f.replay.setApp(broken, replayApp{ReviewsAlways: fault500})
	f.replay.setApp(healthy, replayApp{Persian: true})
	for _, pkg := range []string{missing, broken, never} {
		f.register(t, pkg, false)
	}
	f.register(t, healthy, true)
	before := time.Now().UTC().Truncate(time.Second)
	for _, pkg := range []string{missing, broken, healthy} {
		a, err := f.apps.Get(context.Background(), pkg)
		if err != nil {
			t.Fatal(err)
		}
		f.crawler.crawlApp(context.Background(), crawlJob{App: a, CrawledAt: messageTime(time.Now()), Locale: testLocales.forApp(a.IsIranianApp)})
	}

	type row struct {
		pkg, country, lang, path, outcome string
		status                            *int
		err                               string
	}
	rows, err := f.pool.Query(context.Background(), `
SELECT a.package_name, o.country, o.lang, o.path, o.outcome, o.http_status, o.error
FROM app_crawl_outcomes o JOIN apps_registry_application a ON a.id = o.application_id
WHERE o.at >= $1 ORDER BY 1, 4`, before)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.pkg, &r.country, &r.lang, &r.path, &r.outcome, &r.status, &r.err); err != nil {
			t.Fatal(err)
		}
		status := "null"
		if r.status != nil {
			status = fmt.Sprint(*r.status)
		}
		got = append(got, fmt.Sprintf("%s %s/%s %s %s %s", r.pkg, r.lang, r.country, r.path, r.outcome, status))
		if (r.outcome == "ok") != (r.err == "") || strings.ContainsAny(r.err, "\r\n") {
			t.Errorf("%s %s: error text %q with outcome %s", r.pkg, r.path, r.err, r.outcome)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"com.example.brokenreviews en/us reviews http_error 500",
		"com.example.brokenreviews en/us stats ok null",
		"com.example.mistyped en/us reviews not_found 404",
		"com.example.mistyped en/us stats not_found 404",
		"ir.example.healthy fa/ir reviews ok null",
		"ir.example.healthy fa/ir stats ok null",
	}
	if !slices.Equal(got, want) {
		t.Errorf("app_crawl_outcomes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	api := &registryAPI{store: f.apps, locales: testLocales, logger: testLogger(t)}
	reg := newMetricsRegistry("test")
	fx := &registryFixture{pool: f.pool}
	fx.srv = httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), api, nil, nil, testLogger(t)))
	t.Cleanup(fx.srv.Close)
	for pkg, want := range map[string][2]string{
		missing: {`"not_found" 404`, `"not_found" 404`},
		broken:  {`"ok" null`, `"http_error" 500`},
		healthy: {`"ok" null`, `"ok" null`},
		never:   {"null", "null"},
	} {
		resp := fx.do(t, "GET", "/api/v1/apps/"+pkg, "")
		if resp.code != 200 {
			t.Fatalf("GET %s: %d %s", pkg, resp.code, resp.body)
		}
		checkOpenAPISchema(t, "AppWithLastCrawl", resp.body)
		var body struct {
			PackageName string `json:"package_name"`
			LastCrawl   map[string]*struct {
				At         time.Time       `json:"at"`
				Outcome    string          `json:"outcome"`
				HTTPStatus json.RawMessage `json:"http_status"`
				Error      string          `json:"error"`
			} `json:"last_crawl"`
		}
		if err := json.Unmarshal([]byte(resp.body), &body); err != nil {
			t.Fatal(err)
		}
		for i, path := range []string{"stats", "reviews"} {
			o, ok := body.LastCrawl[path]
			if !ok {
				t.Fatalf("%s: no last_crawl.%s in %s", pkg, path, resp.body)
			}
			desc := "null"
			if o != nil {
				desc = fmt.Sprintf("%q %s", o.Outcome, o.HTTPStatus)
				if o.At.Before(before) || o.At.After(time.Now()) {
					t.Errorf("%s %s: at %s", pkg, path, o.At)
				}
				if (o.Outcome == "ok") != (o.Error == "") {
					t.Errorf("%s %s: error %q", pkg, path, o.Error)
				}
			}
			if desc != want[i] {
				t.Errorf("%s: last_crawl.%s is %s, want %s (%s)", pkg, path, desc, want[i], resp.body)
			}
		}
	}
	// The check itself refuses what the document does not allow.
	schemas := openAPISchemas[map[string]any](t)
	for _, bad := range []string{
		`{"at":"2026-12-01T00:00:00Z","outcome":"fine","http_status":null,"error":""}`,
		`{"at":"2026-12-01T00:00:00Z","outcome":"ok","http_status":"404","error":""}`,
		`{"at":"2026-12-01T00:00:00Z","outcome":"ok","http_status":null}`,
	} {
		var v any
		if err := json.Unmarshal([]byte(bad), &v); err != nil {
			t.Fatal(err)
		}
		if matchSchema(schemas, schemas["CrawlOutcome"], v, "$") == nil {
			t.Errorf("the schema check accepts %s", bad)
		}
	}
	if !strings.Contains(fx.do(t, "GET", "/api/v1/apps/"+missing, "").body, `"error":"details of com.example.mistyped (hl=en gl=us): app not found on the Play Store (HTTP 404)"`) {
		t.Error("the 404's error text is not the client's")
	}
}

// Each error a crawl path can end with maps to its outcome, with the
// store's HTTP status when it answered. The errors come from the real
// client against the replay store, a name that does not resolve, a closed
// port, a bench, a deadline and a cancel.
func TestCrawlOutcomeOfErrors(t *testing.T) {
	t.Parallel()
	replay := newReplayPlayStore(t)
	replay.setApp("com.example.throttled", replayApp{DetailsAlways: fault429})
	replay.setApp("com.example.captcha", replayApp{DetailsAlways: faultCaptcha})
	replay.setApp("com.example.layout", replayApp{DetailsAlways: faultNoDataBlock})
	replay.setApp("com.example.rpc", replayApp{ReviewsAlways: faultRPCError})
	replay.setApp("com.example.slow", replayApp{DetailsAlways: faultSlow})
	replay.setApp("com.example.gone", replayApp{DetailsAlways: fault404})
	replay.setApp("com.example.backend", replayApp{DetailsAlways: fault500})
	client := newTestPlayStore(t, replay.URL, nil).client
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String()
	closed.Close()
	ctx := context.Background()
	details := func(c *playStoreClient, ctx context.Context, pkg string) error {
		_, err := c.Details(ctx, pkg, "en", "us")
		return err
	}
	// A pool whose direct egress is benched for ten minutes after two 429s.
	benchStore := newTestPlayStore(t, replay.URL, func(p *proxyPoolConfig, c *playStoreConfig) {
		p.Clock, p.BaseCooldown, p.MaxCooldown, c.Retries = systemClock{}, 10*time.Minute, time.Hour, 1
	})
	if err := details(benchStore.client, ctx, "com.example.throttled"); !errors.Is(err, errRateLimited) {
		t.Fatalf("benching the egress: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	publishErr := &publishError{Topic: topicReviews, Failed: 3, Total: 3, LastError: errors.New("broker down")}
	for _, tc := range []struct {
		name    string
		ctx     context.Context // the job's
		err     error
		outcome string
		status  int // 0: NULL
		text    string
	}{
		{"ok", ctx, nil, "ok", 0, "^$"},
		{"not found", ctx, details(client, ctx, "com.example.gone"), "not_found", 404, `\(HTTP 404\)$`},
		{"throttled", ctx, details(client, ctx, "com.example.throttled"), "throttled", 429, "gave up after 4 attempts"},
		{"captcha", ctx, details(client, ctx, "com.example.captcha"), "throttled", 0, "captcha"},
		{"backend", ctx, details(client, ctx, "com.example.backend"), "http_error", 500, `\(HTTP 500\)`},
		{"parse", ctx, details(client, ctx, "com.example.layout"), "parse_error", 200, "cannot parse"},
		{"rpc entry", ctx, func() error {
			_, err := client.Reviews(ctx, "com.example.rpc", "en", "us", 10, nil)
			return err
		}(), "error", 200, "error entry"},
		{"dns", ctx, details(newTestPlayStore(t, "http://playwatch-test.invalid", nil).client, ctx, "com.example.app"), "dns", 0, "playwatch-test.invalid"},
		{"network", ctx, details(newTestPlayStore(t, closedURL, nil).client, ctx, "com.example.app"), "network", 0, "refused"},
		{"timeout", ctx, details(client, short(), "com.example.slow"), "timeout", 0, "deadline exceeded"},
		{"benched", ctx, details(benchStore.client, short(), "com.example.app"), "benched", 0, `^egress direct benched until [0-2][0-9]:[0-5][0-9] UTC$`},
		{"canceled", canceled, details(client, canceled, "com.example.app"), "canceled", 0, "canceled"},
		{"publish failed", ctx, publishErr, "error", 0, "broker down"},
		{"proxy password", ctx, fmt.Errorf("%w via http://user:S3cret@proxy:3128: dial failed\nagain", errNetwork), "network", 0, `^network error talking to the Play Store via http://user:xxxxx@proxy:3128: dial failed again$`},
	} {
		o := crawlOutcomeOf(tc.ctx, tc.err)
		status := 0
		if o.HTTPStatus != nil {
			status = *o.HTTPStatus
		}
		if o.Outcome != tc.outcome || status != tc.status || !regexp.MustCompile(tc.text).MatchString(o.Error) {
			t.Errorf("%s: %s %d %q; want %s %d, text matching %s (error %v)", tc.name, o.Outcome, status, o.Error, tc.outcome, tc.status, tc.text, tc.err)
		}
	}
}

// A failure to write an outcome or a read mark is logged and counted, and
// the crawl goes on.
func TestCrawlStateWriteFailuresCounted(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(1, 150), nil)
	f.register(t, "com.example.app", false)
	broken := newTestPool(t)
	broken.Close()
	f.crawler.known = newPGKnownReviews(broken)
	r := f.crawler.crawlApp(context.Background(), crawlJob{App: app{PackageName: "com.example.app", IsActive: true},
		CrawledAt: messageTime(time.Now()), Locale: testLocales.Default})
	if r.statsErr != nil || r.reviewsErr != nil || r.reviews != 150 {
		t.Fatalf("%+v", r)
	}
	for what, want := range map[string]float64{"outcome": 2, "read_mark": 1} {
		if got := metricValue(t, f.reg, "playwatch_crawl_state_write_failures_total", map[string]string{"what": what}); got != want {
			t.Errorf("write failures of %s: %v, want %v", what, got, want)
		}
	}
}

// checkOpenAPISchema checks body against the component schema name of
// api/openapi.json, for the keywords the document uses: $ref, type,
// required, properties, additionalProperties false, items, anyOf, enum,
// minimum, maximum, minLength, maxLength, pattern, format date-time.
func checkOpenAPISchema(t *testing.T, name, body string) {
	t.Helper()
	schemas := openAPISchemas[map[string]any](t)
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	schema, ok := schemas[name]
	if !ok {
		t.Fatalf("no schema %s", name)
	}
	if err := matchSchema(schemas, schema, v, "$"); err != nil {
		t.Errorf("the body does not match %s: %v\n%s", name, err, body)
	}
}

// jsonUnicodeEscape is a \uXXXX of an ECMA-262 pattern, which Go's regexp
// spells \x{XXXX}.
var jsonUnicodeEscape = regexp.MustCompile(`\\u([0-9A-Fa-f]{4})`)

func matchSchema(defs map[string]map[string]any, s map[string]any, v any, at string) error {
	if ref, ok := s["$ref"].(string); ok {
		def, ok := defs[strings.TrimPrefix(ref, "#/components/schemas/")]
		if !ok {
			return fmt.Errorf("%s: unknown $ref %s", at, ref)
		}
		return matchSchema(defs, def, v, at)
	}
	if anyOf, ok := s["anyOf"].([]any); ok {
		var errs []error
		for _, alt := range anyOf {
			err := matchSchema(defs, alt.(map[string]any), v, at)
			if err == nil {
				return nil
			}
			errs = append(errs, err)
		}
		return fmt.Errorf("%s: no alternative of anyOf matches: %w", at, errors.Join(errs...))
	}
	if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
		return fmt.Errorf("%s: %v not in %v", at, v, enum)
	}
	// type is a name or a list of names.
	var types []any
	switch ty := s["type"].(type) {
	case string:
		types = []any{ty}
	case []any:
		types = ty
	}
	typ := fmt.Sprint(types...)
	is := func(name string) bool { return slices.Contains(types, any(name)) }
	switch x := v.(type) {
	case nil:
		if !is("null") {
			return fmt.Errorf("%s: null, want %s", at, typ)
		}
	case bool:
		if !is("boolean") {
			return fmt.Errorf("%s: boolean, want %s", at, typ)
		}
	case float64:
		if !is("number") && (!is("integer") || x != float64(int64(x))) {
			return fmt.Errorf("%s: %v, want %s", at, x, typ)
		}
		if m, ok := s["minimum"].(float64); ok && x < m {
			return fmt.Errorf("%s: %v below %v", at, x, m)
		}
		if m, ok := s["maximum"].(float64); ok && x > m {
			return fmt.Errorf("%s: %v above %v", at, x, m)
		}
	case string:
		if !is("string") {
			return fmt.Errorf("%s: string, want %s", at, typ)
		}
		if m, ok := s["minLength"].(float64); ok && float64(len([]rune(x))) < m {
			return fmt.Errorf("%s: shorter than %v", at, m)
		}
		if m, ok := s["maxLength"].(float64); ok && float64(len([]rune(x))) > m {
			return fmt.Errorf("%s: longer than %v", at, m)
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(jsonUnicodeEscape.ReplaceAllString(p, `\x{$1}`)).MatchString(x) {
			return fmt.Errorf("%s: %q does not match %s", at, x, p)
		}
		if s["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, x); err != nil {
				return fmt.Errorf("%s: %q is not a date-time", at, x)
			}
		}
	case []any:
		if !is("array") {
			return fmt.Errorf("%s: array, want %s", at, typ)
		}
		items, _ := s["items"].(map[string]any)
		for i, e := range x {
			if err := matchSchema(defs, items, e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case map[string]any:
		if !is("object") {
			return fmt.Errorf("%s: object, want %s", at, typ)
		}
		props, _ := s["properties"].(map[string]any)
		required, _ := s["required"].([]any)
		for _, r := range required {
			if _, ok := x[r.(string)]; !ok {
				return fmt.Errorf("%s: %s is required", at, r)
			}
		}
		for k, e := range x {
			p, ok := props[k].(map[string]any)
			if !ok {
				if s["additionalProperties"] == false {
					return fmt.Errorf("%s: %s is not in the schema", at, k)
				}
				continue
			}
			if err := matchSchema(defs, p, e, at+"."+k); err != nil {
				return err
			}
		}
	}
	return nil
}
