package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// reviewsPageServer serves the status page with /reviews and the reviews
// API on pool.
func reviewsPageServer(t *testing.T, pool *pgxpool.Pool, token string) *httptest.Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	page := newStatusPage(statusDB{pool}, reg, "", time.Hour, 30*time.Second, 4, testLogger(t))
	page.locales = testLocales
	page.now = func() time.Time { return testCrawl }
	page.reviews = &reviewsSource{pager: reviewsDB{pool: pool, locales: testLocales}, token: token}
	ra := newReviewsAPI(pool, testLocales, token, testLogger(t))
	ra.now = page.now
	api := &registryAPI{store: newRegistryStore(pool, pool), locales: testLocales, logger: testLogger(t), reviews: ra}
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), api, page, nil, page.logger))
	t.Cleanup(srv.Close)
	return srv
}

func TestReviewsPage(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	srv := reviewsPageServer(t, pool, "")

	// The form as a browser sends it: a value per checked box, empty fields.
	q := "package=ir.divar&q=" + url.QueryEscape("لاگین") + "&stars=1&stars=2&sentiment=NEGATIVE&text_lang=&topic=&version=&has_reply=&since=7d&until=&sort=newest"
	code, body, h := getPage(t, srv.URL+"/reviews?"+q)
	if code != http.StatusOK || !strings.Contains(h.Get("Content-Security-Policy"), "form-action 'self'") {
		t.Fatalf("%d %s\n%s", code, h, body)
	}
	for _, want := range []string{
		`<p dir="auto">كيفيت خيلي بد شده، لاگين نميشه</p>`,
		`<div class="reply"><div class="review-head">Developer's reply · 1 Mar 2026 12:00 UTC</div><p dir="auto">ممنون از بازخورد شما</p></div>`,
		`href="https://play.google.com/store/apps/details?id=ir.divar&amp;reviewId=fa1&amp;hl=fa"`,
		`<span class="badge">login</span>`, `★☆☆☆☆`, `<span class="chip neg">negative</span>`, `👍 0`,
		`<input type="checkbox" name="stars" value="1" checked>`, `<input type="checkbox" name="stars" value="3">`,
		`<option value="ir.divar" selected>`, `Download CSV`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(body, "fa2") || strings.Contains(body, "en1") {
		t.Error("a review that does not match is shown")
	}
	// Download CSV: the same filters, as CSV with a BOM.
	i := strings.Index(body, `<a href="/api/v1/reviews?`)
	link := body[i+len(`<a href="`):]
	link = strings.ReplaceAll(link[:strings.Index(link, `"`)], "&amp;", "&")
	resp, err := http.Get(srv.URL + link)
	if err != nil {
		t.Fatal(err)
	}
	csvBody := new(bytes.Buffer)
	_, _ = csvBody.ReadFrom(resp.Body)
	resp.Body.Close()
	if lines := strings.Split(strings.TrimSpace(csvBody.String()), "\n"); resp.StatusCode != 200 || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "\uFEFFpackage_name,") || !strings.Contains(lines[1], "fa1") {
		t.Errorf("Download CSV %s: %d %q", link, resp.StatusCode, csvBody)
	}

	// Pagination: next page, first page.
	_, body, _ = getPage(t, srv.URL+"/reviews?limit=4")
	if !strings.Contains(body, `rel="next"`) || strings.Count(body, `<li><div class="review-head">`) != 4 {
		t.Fatalf("first page of 4:\n%s", body)
	}
	i = strings.Index(body, `<a href="/reviews?`)
	next := body[i+len(`<a href="`):]
	next = strings.ReplaceAll(next[:strings.Index(next, `"`)], "&amp;", "&")
	_, body, _ = getPage(t, srv.URL+next)
	if strings.Count(body, `<li><div class="review-head">`) != 2 || strings.Contains(body, `rel="next"`) || !strings.Contains(body, "first page") {
		t.Errorf("second page %s:\n%s", next, body)
	}

	// A bad filter: 400, the form kept, the parameter named.
	code, body, _ = getPage(t, srv.URL+"/reviews?stars=9&q=abc")
	if code != http.StatusBadRequest || !strings.Contains(body, "stars: ") || !strings.Contains(body, `value="abc"`) {
		t.Errorf("bad stars: %d\n%s", code, body)
	}

	// The app page links to its reviews and shows replies.
	if _, err := pool.Exec(t.Context(), `INSERT INTO app_stats (application_id, country, lang, version, crawled_at) SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, '12.0', $1 FROM apps_registry_application WHERE package_name = 'ir.divar'`, testCrawl); err != nil {
		t.Fatal(err)
	}
	_, body, _ = getPage(t, srv.URL+"/apps/ir.divar")
	for _, want := range []string{`<a href="/reviews?package=ir.divar">all</a>`, `<a href="/reviews?package=ir.divar&amp;sentiment=NEGATIVE">negative</a>`,
		`<a href="/reviews?package=ir.divar&amp;version=12.0">this version</a>`, `<p dir="auto">ممنون از بازخورد شما</p>`} {
		if !strings.Contains(body, want) {
			t.Errorf("the app page lacks %s", want)
		}
	}
}

func TestReviewsPageToken(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	srv := reviewsPageServer(t, pool, "pw")
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/reviews", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), `realm="playwatch status"`) {
		t.Errorf("no auth: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	req.SetBasicAuth("me", "pw")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("basic auth: %d", resp.StatusCode)
	}
}

// The reviews page in a real browser: the form submits (the CSP allows
// it), nothing is loaded from elsewhere, no console error, and a Persian
// review and its reply are laid out right to left.
func TestReviewsPageInBrowser(t *testing.T) {
	t.Parallel()
	chromium := firstOnPath("chromium", "chromium-browser")
	if chromium == "" {
		skipOrFailUnderCI(t, "chromium is not on PATH (Debian: apt-get install chromium)")
	}
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	srv := reviewsPageServer(t, pool, "")
	b := startBrowser(t, chromium)
	shots := filepath.Join(".cache", "status-page")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"reviews":       "/reviews?stars=1&stars=2&text_lang=fa&q=" + url.QueryEscape("لاگین"),
		"reviews-phone": "/reviews",
	} {
		width := 1280
		if strings.HasSuffix(name, "phone") {
			width = 390
		}
		v := b.visit(t, srv.URL+path, width, false)
		_ = os.WriteFile(filepath.Join(shots, name+".png"), v.screenshot, 0o644)
		for _, e := range v.errors {
			t.Errorf("%s: console: %s", name, e)
		}
		for _, u := range v.requests {
			if pu, err := url.Parse(u); err != nil || (pu.Hostname() != "127.0.0.1" && pu.Scheme != "data") {
				t.Errorf("%s: the page requested %s, off loopback", name, u)
			}
		}
		for _, s := range []string{"Download CSV", "Developer's reply", "ممنون از بازخورد شما", "on Google Play"} {
			if !strings.Contains(v.text, s) {
				t.Errorf("%s: the page does not show %q", name, s)
			}
		}
	}
	dirs := b.evaluate(t, srv.URL+"/reviews?q="+url.QueryEscape("كيفيت"),
		`[...document.querySelectorAll('.reviews p[dir=auto]')].map(p => getComputedStyle(p).direction).join(',')`)
	if dirs != "rtl,rtl" {
		t.Errorf("the Persian review and its reply are laid out %q, want rtl,rtl", dirs)
	}
	dirs = b.evaluate(t, srv.URL+"/reviews?q=login", `[...document.querySelectorAll('.reviews p[dir=auto]')].map(p => getComputedStyle(p).direction).join(',')`)
	if dirs != "ltr" {
		t.Errorf("the English review is laid out %q, want ltr", dirs)
	}
}

// evaluate loads pageURL in a new tab and returns what expression, a
// string, evaluates to there.
func (b *browser) evaluate(t *testing.T, pageURL, expression string) string {
	t.Helper()
	s, closeTab := b.newTab(t)
	defer closeTab()
	b.call(t, s, "Page.enable", nil, nil)
	b.navigate(t, s, pageURL)
	var eval struct {
		Result struct{ Value string }
	}
	b.call(t, s, "Runtime.evaluate", map[string]any{"returnByValue": true, "expression": expression}, &eval)
	return eval.Result.Value
}
