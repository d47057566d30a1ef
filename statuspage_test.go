package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// statusNow is the status tests' clock: every seeded row is placed relative to it.
var statusNow = time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)

const (
	statusTelegram = "org.telegram.messenger"
	statusBale     = "ir.example.bale"
	statusBaleName = "بله پیام‌رسان"
	hostileReview  = `<script>alert("x")</script> & more`
	persianReview  = "برنامه خیلی کند است و پیام‌ها دیر می‌رسند"
)

// seedStatus fills a database with two apps: Telegram with a week of
// listings, reviews of every sentiment (and unscored ones), captures and
// dead letters; a Persian-named app with one listing and nothing else.
func seedStatus(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO apps_registry_application (package_name, display_name, is_messaging_app) VALUES ($1, 'Telegram', true), ($2, $3, false)`,
		statusTelegram, statusBale, statusBaleName)
	at := func(d time.Duration) time.Time { return statusNow.Add(-d) }
	for _, s := range []struct {
		ago   time.Duration
		score float64
	}{{8 * 24 * time.Hour, 4.50}, {2 * 24 * time.Hour, 4.40}, {time.Hour, 4.32}} {
		exec(`INSERT INTO app_stats (application_id, country, lang, min_installs, real_installs, score, ratings, crawled_at,
			ratings_1, ratings_2, ratings_3, ratings_4, ratings_5)
			SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, 1000000000, 1000000123, $2, 1234567, $3, 100, 20, 30, 400, 684017 FROM apps_registry_application WHERE package_name = $1`,
			statusTelegram, s.score, at(s.ago))
	}
	exec(`INSERT INTO app_stats (application_id, country, lang, min_installs, score, ratings, crawled_at)
		SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, 5000000, 3.9, 4321, $2 FROM apps_registry_application WHERE package_name = $1`, statusBale, at(2*time.Hour))
	n := 0
	review := func(ago time.Duration, score int, sentiment *string, content string) {
		n++
		exec(`INSERT INTO reviews (application_id, review_id, user_name, score, content, at, sentiment, last_synced_at)
			SELECT id, $2, 'کاربر', $3, $4, $5, $6, $7 FROM apps_registry_application WHERE package_name = $1`,
			statusTelegram, fmt.Sprintf("r%d", n), score, content, at(ago), sentiment, at(time.Hour))
	}
	pos, neg, neu := "POSITIVE", "NEGATIVE", "NEUTRAL"
	// The last 24 h: 2 positive, 1 negative, 1 neutral, 3 not scored.
	review(2*time.Hour, 5, &pos, "great")
	review(3*time.Hour, 4, &pos, "good")
	review(4*time.Hour, 1, &neg, "crashes on start")
	review(5*time.Hour, 3, &neu, "fine")
	review(6*time.Hour, 1, nil, hostileReview)
	review(7*time.Hour, 2, nil, persianReview)
	review(8*time.Hour, 5, nil, "nice")
	// Older: five days ago, two negative.
	review(5*24*time.Hour, 1, &neg, "old complaint")
	review(5*24*time.Hour+time.Hour, 2, &neg, "older complaint")
	for i, sc := range []string{"UPLOAD", "UPLOAD", "DOWNLOAD"} {
		exec(`INSERT INTO network_metrics (application_id, analysis_id, scenario, rtt_handshake, retransmission_count,
			bytes_transferred_total, bytes_payload_total, overhead_ratio, source_pcap_filename, analyzed_at)
			SELECT id, gen_random_uuid(), $2, $3, 7, 123456789, 120000000, 0.028, 'capture.pcap', $4 FROM apps_registry_application WHERE package_name = $1`,
			statusTelegram, sc, 20.5+float64(i), at(time.Duration(i+1)*time.Hour))
	}
	for i, ago := range []time.Duration{time.Hour, 3 * time.Hour, 30 * time.Hour} {
		exec(`INSERT INTO dead_letter_events (topic, "partition", kafka_offset, error_reason, occurred_at) VALUES ('reviews', 0, $1, 'invalid_json: test', $2)`,
			i, at(ago))
	}
	seedReviewStorefronts(t, pool)
}

// statusServer serves the status page on pool the way `playwatch run` does,
// with the given metrics registry as this process's health.
func statusServer(t *testing.T, pool *pgxpool.Pool, token string, reg *prometheus.Registry) *httptest.Server {
	t.Helper()
	srv, _ := statusPageServer(t, pool, token, reg)
	return srv
}

// statusPageServer is statusServer with its page, whose per-app gauges the
// test refreshes (nothing runs their background loop).
func statusPageServer(t *testing.T, pool *pgxpool.Pool, token string, reg *prometheus.Registry) (*httptest.Server, *statusPage) {
	t.Helper()
	return statusPageOn(t, statusDB{pool}, reg, token, 4)
}

// statusPageOn serves a status page reading db at statusNow with the test
// storefront defaults, at most maxRenders pages drawn at once.
func statusPageOn(t testing.TB, db statusDB, reg *prometheus.Registry, token string, maxRenders int) (*httptest.Server, *statusPage) {
	t.Helper()
	page := newStatusPage(db, reg, token, time.Hour, 30*time.Second, maxRenders, testLogger(t))
	page.locales = testLocales
	page.now = func() time.Time { return statusNow }
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), nil, page, nil, page.logger))
	t.Cleanup(srv.Close)
	return srv, page
}

// poolExec runs a statement on pool, failing the test on an error.
func poolExec(t testing.TB, ctx context.Context, pool *pgxpool.Pool) func(sql string, args ...any) {
	return func(sql string, args ...any) {
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
}

// appPageTable is the <table class="class"> of statusTelegram's app page,
// and the page.
func appPageTable(t *testing.T, base, class string) (table, body string) {
	t.Helper()
	code, body, _ := getPage(t, base+"/apps/"+statusTelegram)
	if code != http.StatusOK {
		t.Fatalf("app page: %d", code)
	}
	i := strings.Index(body, `<table class="`+class+`">`)
	if i < 0 {
		t.Fatalf("no %s table on the app page:\n%s", class, body)
	}
	return body[i : i+strings.Index(body[i:], "</table>")], body
}

func getPage(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	return readAnswer(t, resp, err)
}

// chartPoints is the data-points of the chart data-chart=id, -1 without one.
func chartPoints(body, id string) int {
	m := regexp.MustCompile(`data-chart="` + regexp.QuoteMeta(id) + `" data-points="(\d+)"`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestStatusPageOverview(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedStatus(t, pool)
	reg := newMetricsRegistry("test")
	newConsumerMetrics(reg).lag.WithLabelValues("reviews", "0").Set(42)
	srv := statusServer(t, pool, "", reg)

	code, body, h := getPage(t, srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	if ct := h.Get("Content-Type"); ct != "text/html; charset=utf-8" || !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("Content-Type %q, CSP %q", ct, h.Get("Content-Security-Policy"))
	}
	for _, want := range []string{
		`>Telegram</a>`, "1,000,000,123", "1,234,567", "4.32",
		"▼ 0.18", // 4.50 a week ago, 4.32 now
		`<span class="total">7</span> <span class="chip neg">1 negative</span> <span class="chip neu">1 neutral</span> <span class="chip pos">2 positive</span> <span class="chip none">3 not scored</span>`,
		"listing: 1 h ago", "reviews: 1 h ago",
		`dir="auto">` + statusBaleName + `</a>`,
		"≥ 5,000,000",                 // the Persian app's listing has no exact count
		"42 records",                  // consumer lag, from this process's registry
		"not running in this process", // no crawler registered here
		`<div class="card-title">Dead letters, 24 h</div><div class="card-value">2</div>`,
		`<div class="card-title">Apps failing</div><div class="card-value">0 of 2</div>`,
		`<div class="card unknown"><div class="card-title">Last crawl cycle</div><div class="card-value">none planned yet</div>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	// Telegram's sparkline: three days with a listing in the last 30
	// (8 days, 2 days and 1 hour ago); the other app's: one.
	if got := strings.Count(body, `data-chart="spark" data-points="3"`); got != 1 {
		t.Errorf("%d sparklines of 3 points, want 1", got)
	}
	if got := strings.Count(body, `data-chart="spark" data-points="1"`); got != 1 {
		t.Errorf("%d sparklines of 1 point, want 1", got)
	}
	if strings.Contains(body, "<script") {
		t.Error("the overview has a script element")
	}

	// The last crawl cycle is crawl_cycles' newest row, whichever instance
	// planned it: this process runs no crawler.
	cycle := func(id int, planned time.Duration, finished *time.Duration, apps *int) {
		t.Helper()
		var fin *time.Time
		if finished != nil {
			f := statusNow.Add(-*finished)
			fin = &f
		}
		if _, err := pool.Exec(context.Background(), `INSERT INTO crawl_cycles (id, planned_at, leader, leader_epoch, apps, finished_at)
			VALUES ($1, $2, 'another-host/1/x', 3, $3, $4)`, id, statusNow.Add(-planned), apps, fin); err != nil {
			t.Fatal(err)
		}
	}
	fortyMin, two := 40*time.Minute, 2
	cycle(6, 3*time.Hour, &fortyMin, &two) // older id: not the last
	cycle(7, 50*time.Minute, &fortyMin, &two)
	_, body, _ = getPage(t, srv.URL+"/")
	if want := `<div class="card ok"><div class="card-title">Last crawl cycle</div><div class="card-value">finished 40 min ago</div>` +
		`<div class="card-detail">cycle 7: 2 apps, planned 10 May 11:10 UTC, took 10m0s</div>`; !strings.Contains(body, want) {
		t.Errorf("overview lacks %q", want)
	}
	// A cycle planned 3 h ago (three crawl intervals) still running, its
	// jobs not all published: red.
	cycle(8, 3*time.Hour, nil, nil)
	_, body, _ = getPage(t, srv.URL+"/")
	if want := `<div class="card bad"><div class="card-title">Last crawl cycle</div><div class="card-value">running, started 3 h ago</div>` +
		`<div class="card-detail">cycle 8: its jobs being published, planned 10 May 09:00 UTC</div>`; !strings.Contains(body, want) {
		t.Errorf("overview lacks %q", want)
	}
}

func TestStatusPageApp(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedStatus(t, pool)
	// A capture older than the 90 days of the charts stays out of them
	// (and is counted in the table).
	if _, err := pool.Exec(context.Background(), `INSERT INTO network_metrics (application_id, analysis_id, scenario, rtt_handshake,
		bytes_transferred_total, bytes_payload_total, overhead_ratio, analyzed_at)
		SELECT id, gen_random_uuid(), 'UPLOAD', 99, 1, 1, 0, $2 FROM apps_registry_application WHERE package_name = $1`,
		statusTelegram, statusNow.Add(-100*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	srv := statusServer(t, pool, "", newMetricsRegistry("test"))

	code, body, _ := getPage(t, srv.URL+"/apps/"+statusTelegram)
	if code != http.StatusOK {
		t.Fatalf("GET app: %d\n%s", code, body)
	}
	for id, want := range map[string]int{
		"rating": 3, "installs": 3,
		// Per day and sentiment: today 1 neg, 1 neu, 2 pos, 3 none (4
		// segments; 6 h ago and later is the same UTC day as 12:00), five
		// days ago 2 neg (1 segment).
		"reviews":   5,
		"histogram": 5,
		"rtt":       3,
	} {
		if got := chartPoints(body, id); got != want {
			t.Errorf("chart %s: %d data points, want %d", id, got, want)
		}
	}
	// The hostile review is text, not markup; the Persian one keeps its
	// direction.
	if strings.Contains(body, `<script>alert`) || !strings.Contains(body, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; more`) {
		t.Error("the hostile review text is not escaped")
	}
	if !strings.Contains(body, `<p dir="auto">`+persianReview+`</p>`) || !strings.Contains(body, `<bdi class="user">کاربر</bdi>`) {
		t.Error("the Persian review or user name is not in a dir=auto or bdi element")
	}
	// Newest negative first: two unscored low-star reviews, then the labelled ones.
	neg := strings.Index(body, `id="negative"`)
	if neg < 0 || strings.Count(body[neg:], "<li>") != 5 {
		t.Errorf("want 5 negative reviews listed")
	}
	for _, want := range []string{"684,017", "1,000,000,123", "UPLOAD", "DOWNLOAD", "20.50 ms", "2.8 %", "123,456,789", "not scored yet: 1–2 stars", "(stars, 1–5",
		`<td data-label="Captures" class="num">3</td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("app page lacks %q", want)
		}
	}

	// The Persian-named app: its name dir=auto, and each empty chart says so.
	code, body, _ = getPage(t, srv.URL+"/apps/"+statusBale)
	if code != http.StatusOK || !strings.Contains(body, `<h1 dir="auto">`+statusBaleName+`</h1>`) {
		t.Fatalf("GET %s: %d, name not dir=auto\n%s", statusBale, code, body)
	}
	for _, id := range []string{"reviews", "histogram"} {
		if !strings.Contains(body, `<p class="nodata" data-chart="`+id+`">No data`) {
			t.Errorf("the empty chart %s does not say so", id)
		}
	}
	if strings.Contains(body, `id="network"`) {
		t.Error("network section on an app that is neither messaging nor captured")
	}
	// A score of 0 (no ratings yet) lowers the rating axis to 0.
	if _, err := pool.Exec(context.Background(), `INSERT INTO app_stats (application_id, country, lang, min_installs, score, ratings, crawled_at)
		SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, 5000000, 0, 0, $2 FROM apps_registry_application WHERE package_name = $1`, statusBale, statusNow.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	_, body, _ = getPage(t, srv.URL+"/apps/"+statusBale)
	if !strings.Contains(body, "(stars, 0–5") || chartPoints(body, "rating") != 2 {
		t.Errorf("a rating of 0: axis not from 0, or %d points, want 2", chartPoints(body, "rating"))
	}

	if code, _, _ := getPage(t, srv.URL+"/apps/com.example.unknown"); code != http.StatusNotFound {
		t.Errorf("unknown app: %d, want 404", code)
	}
	if code, _, _ := getPage(t, srv.URL+"/apps/not..valid"); code != http.StatusNotFound {
		t.Errorf("invalid package name: %d, want 404", code)
	}
	if code, _ := httpDo(t, http.MethodPost, srv.URL+"/", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405", code)
	}
}

func TestStatusPageEmptyDatabase(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	srv := statusServer(t, pool, "", newMetricsRegistry("test"))
	code, body, _ := getPage(t, srv.URL+"/")
	if code != http.StatusOK || !strings.Contains(body, "No data: no active app is registered") {
		t.Fatalf("empty overview: %d\n%s", code, body)
	}
	registerApps(t, pool, "com.example.fresh")
	code, body, _ = getPage(t, srv.URL+"/apps/com.example.fresh")
	if code != http.StatusOK {
		t.Fatalf("empty app page: %d", code)
	}
	for _, id := range []string{"rating", "installs", "reviews", "histogram"} {
		if !strings.Contains(body, `<p class="nodata" data-chart="`+id+`">No data`) {
			t.Errorf("chart %s of an app without data does not say so", id)
		}
	}
	if strings.Contains(body, "<svg") {
		t.Error("an app without data has an svg chart")
	}
}

func TestStatusPageToken(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	srv := statusServer(t, pool, "s3cret", newMetricsRegistry("test"))
	for _, tc := range []struct {
		name, pass string
		auth       bool
		want       int
	}{{"no auth", "", false, 401}, {"wrong", "nope", true, 401}, {"right", "s3cret", true, 200}} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		if tc.auth {
			req.SetBasicAuth("anyone", tc.pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
		if tc.want == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("%s: WWW-Authenticate %q", tc.name, resp.Header.Get("WWW-Authenticate"))
		}
	}
	// /metrics and the probes stay open.
	if code, _, _ := getPage(t, srv.URL+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics with a status token: %d", code)
	}
}

// The page's transaction is read-only: it cannot write, whatever a query did.
func TestStatusPageReadsOnly(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	err := statusDB{pool}.read(context.Background(), func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), `DELETE FROM dead_letter_events`)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("a write in the status page's transaction: %v, want a read-only refusal", err)
	}
}

// Every query of the page and the gauges reads reviews and app_stats
// through an index on application_id, on a database with enough rows that
// the statistics are realistic; the gauges alone also read the reviews of
// their windows' partial hours, every app's, by time (reviews_at_idx), once:
// in their CTE, not per storefront.
// Sequential scans are disabled so that a plan still holding one has no
// index to use.
func TestStatusPageQueryPlans(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	seedStatus(t, pool)
	seedStatusVolume(t, pool, 40, 500, 200, statusNow, 90*24*time.Hour)
	var id int64
	if err := pool.QueryRow(ctx, `SELECT id FROM apps_registry_application WHERE package_name = $1`, statusTelegram).Scan(&id); err != nil {
		t.Fatal(err)
	}
	since := statusNow.Add(-90 * 24 * time.Hour)
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"overview":        {overviewSQL, append([]any{statusNow}, storefrontArgs(testLocales)...)},
		"storefronts":     {appStorefrontRowsSQL, append([]any{id}, storefrontArgs(testLocales)...)},
		"compare":         {appCompareSQL, []any{id, []string{"us", "ir"}, []string{"en", "fa"}}},
		"app gauges":      {appGaugesSQL, append([]any{statusNow}, storefrontArgs(testLocales)...)},
		"last cycle":      {lastCrawlCycleSQL, nil},
		"dead letters":    {deadLettersSQL, []any{statusNow}},
		"app":             {appRowSQL, []any{statusTelegram}},
		"latest listing":  {appLatestStatsSQL, []any{id, "us", "en"}},
		"listings":        {appStatsSQL, []any{id, "us", "en", since, statusNow}},
		"reviews per day": {appReviewDaysSQL, []any{id, "us", "en", since, statusNow}},
		"newest review":   {appNewestReviewSQL, []any{id, "us", "en"}},
		"negative":        {appNegativeSQL, []any{id, "us", "en", since, negativeLimit}},
		"network":         {appNetworkSQL, []any{id}},
		"topics":          {appTopicsSQL, []any{id, "us", "en", statusNow}},
		"releases":        {appReleasesSQL, []any{id, statusNow, releasesShown + 1, "us", "en"}},
	} {
		var plan []byte
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+q.sql, q.args...).Scan(&plan)
		})
		if err != nil {
			t.Fatalf("EXPLAIN %s: %v", name, err)
		}
		var doc []struct{ Plan planNode }
		if err := json.Unmarshal(plan, &doc); err != nil {
			t.Fatal(err)
		}
		// The subtree of the gauges' CTE of the partial hours, read once.
		var edge []planNode
		doc[0].Plan.walk(func(n planNode) {
			if n.Subplan == "CTE edge" {
				n.walk(func(c planNode) { edge = append(edge, c) })
			}
		})
		doc[0].Plan.walk(func(n planNode) {
			if !slices.Contains(statusPlanTables, n.Relation) {
				return
			}
			cond, indexes := n.IndexCond, []string{n.Index}
			if n.Type == "Bitmap Heap Scan" { // the indexes are its children's (under a BitmapOr or not)
				for _, c := range n.Plans {
					c.walk(func(c planNode) { cond, indexes = cond+c.IndexCond, append(indexes, c.Index) })
				}
			}
			// review_storefronts is also probed by its key (review_id, country, lang) from a review,
			// and a review by its key from a storefront's row.
			byApp := strings.Contains(cond, "application_id") || n.Relation == "review_storefronts" && strings.Contains(cond, "review_id") ||
				n.Relation == "reviews" && n.Index == "reviews_pkey" ||
				name == "app gauges" && n.Relation == "reviews" && slices.ContainsFunc(edge, func(e planNode) bool { return e.Alias == n.Alias }) &&
					slices.Contains(indexes, "reviews_at_idx") &&
					!slices.ContainsFunc(indexes, func(i string) bool { return i != "" && i != "reviews_at_idx" })
			if !strings.Contains(n.Type, "Index") && n.Type != "Bitmap Heap Scan" ||
				n.Relation != "dead_letter_events" && !byApp {
				t.Errorf("%s: reads %s (%s) by %s, index %q, cond %q", name, n.Relation, n.Alias, n.Type, n.Index, cond)
			}
		})
	}
}

// statusPlanTables are the tables whose every read by the pages must walk
// an index led by application_id (dead_letter_events: by time).
var statusPlanTables = []string{"reviews", "app_stats", "dead_letter_events", "review_storefronts",
	"app_storefronts", "review_rollup_hourly", "review_topic_rollup_hourly", "app_stats_rollup_daily"}

type planNode struct {
	Type      string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Alias     string     `json:"Alias"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Subplan   string     `json:"Subplan Name"`
	Plans     []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// seedStatusVolume adds apps with reviewsPerApp reviews spread over the
// span before now (a quarter of them unscored) and statsPerApp hourly
// listings each, then vacuums so that index-only scans see a visibility map
// as production does.
func seedStatusVolume(t testing.TB, pool *pgxpool.Pool, apps, reviewsPerApp, statsPerApp int, now time.Time, span time.Duration) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO apps_registry_application (package_name, display_name)
			SELECT 'com.example.bulk' || i, 'Bulk app ' || i FROM generate_series(1, $1::int) i`, []any{apps}},
		{`INSERT INTO app_stats (application_id, country, lang, min_installs, real_installs, score, ratings, crawled_at, ratings_1, ratings_2, ratings_3, ratings_4, ratings_5)
			SELECT a.id, CASE WHEN a.is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN a.is_iranian_app THEN 'fa' ELSE 'en' END, 1000000, 1000000 + h * 17, 3.5 + (h % 100) / 100.0, 50000 + h, $2::timestamptz - make_interval(hours => h),
				1000, 2000, 3000, 4000, 5000
			FROM apps_registry_application a, generate_series(1, $1::int) h WHERE a.package_name LIKE 'com.example.bulk%'`, []any{statsPerApp, now}},
		{`INSERT INTO reviews (application_id, review_id, user_name, score, content, at, sentiment, last_synced_at)
			SELECT a.id, 'bulk-' || a.id || '-' || g, 'user ' || g, 1 + g % 5, repeat('review text ', 8),
				$2::timestamptz - make_interval(secs => (g * $3::float8 / $1::int)),
				(ARRAY['POSITIVE', 'NEUTRAL', 'NEGATIVE', NULL])[1 + g % 4], $2::timestamptz - interval '1 hour'
			FROM apps_registry_application a, generate_series(1, $1::int) g WHERE a.package_name LIKE 'com.example.bulk%'`, []any{reviewsPerApp, now, span.Seconds()}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	seedReviewStorefronts(t, pool)
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		t.Fatal(err)
	}
}

// insertOutcome writes an app's last crawl of a path in us/en, as the
// crawler does (app_crawl_outcomes, docs/schema.md).
func insertOutcome(t *testing.T, pool *pgxpool.Pool, pkg, path string, ago time.Duration, outcome string, httpStatus *int, errText string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO app_crawl_outcomes (application_id, country, lang, path, at, outcome, http_status, error)
		SELECT id, 'us', 'en', $2, $3, $4, $5, $6 FROM apps_registry_application WHERE package_name = $1
		ON CONFLICT (application_id, country, lang, path) DO UPDATE
		SET at = EXCLUDED.at, outcome = EXCLUDED.outcome, http_status = EXCLUDED.http_status, error = EXCLUDED.error`,
		pkg, path, statusNow.Add(-ago), outcome, httpStatus, errText); err != nil {
		t.Fatal(err)
	}
}

// A failing app says why: the overview's row and the failing card give the
// last crawl's cause, the app page every path's last crawl. A package that
// is not on the store, with nothing but its not_found outcomes, says so.
func TestStatusPageCrawlOutcomes(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedStatus(t, pool)
	const missing, quiet, broken = "com.example.nosuch", "com.example.quiet", "com.example.broken"
	registerApps(t, pool, missing, quiet, broken)
	insertOutcome(t, pool, missing, "stats", 2*time.Minute, "not_found", ptr(404), "GET /store/apps/details: 404")
	insertOutcome(t, pool, missing, "reviews", 2*time.Minute, "not_found", ptr(404), "")
	// An app whose store shows no review: its reviews read ended ok and
	// stored nothing; its listing is fresh.
	if _, err := pool.Exec(context.Background(), `INSERT INTO app_stats (application_id, country, lang, min_installs, score, ratings, crawled_at)
		SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, 100, 0, 0, $2 FROM apps_registry_application WHERE package_name = $1`, quiet, statusNow.Add(-10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	insertOutcome(t, pool, quiet, "stats", 10*time.Minute, "ok", ptr(200), "")
	insertOutcome(t, pool, quiet, "reviews", 10*time.Minute, "ok", ptr(200), "")
	// Listing and reviews failing differently.
	insertOutcome(t, pool, broken, "stats", 5*time.Minute, "parse_error", ptr(200), "details page: no AF_initDataCallback ds:5")
	insertOutcome(t, pool, broken, "reviews", 4*time.Minute, "benched", nil, "egress direct benched until 14:05 UTC")
	// Telegram is fresh, but its last reviews crawl hit a DNS failure.
	insertOutcome(t, pool, statusTelegram, "reviews", time.Minute, "dns", nil, "lookup play.google.com: no such host")
	srv := statusServer(t, pool, "", newMetricsRegistry("test"))

	code, body, _ := getPage(t, srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	for _, want := range []string{
		`<div class="cause" title="10 May 11:58 UTC: not_found: GET /store/apps/details: 404">listing and reviews: not found on Google Play (404), 2 min ago</div>`,
		`<div class="cause" title="10 May 11:55 UTC: parse_error: details page: no AF_initDataCallback ds:5">listing: page layout not understood, 5 min ago</div>`,
		`<div class="cause" title="10 May 11:56 UTC: benched: egress direct benched until 14:05 UTC">reviews: egress direct benched until 14:05 UTC, 4 min ago</div>`,
		`reviews: DNS lookup failed, 1 min ago</div>`,
		`<div class="fresh ok" title="10 May 11:50 UTC">reviews: no reviews on the store</div>`,
		`<div class="card-title">Apps failing</div><div class="card-value">2 of 5</div>`,
		`com.example.broken: page layout not understood; com.example.nosuch: not found on Google Play (404) — no stored crawl within 2 × CRAWL_INTERVAL`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if !strings.Contains(body, "reviews: no crawl stored") {
		t.Error("the apps without a reviews crawl no longer say so") // nosuch and broken
	}

	code, body, _ = getPage(t, srv.URL+"/apps/"+missing)
	if code != http.StatusOK {
		t.Fatalf("GET app: %d\n%s", code, body)
	}
	for _, want := range []string{
		`<p class="nodata">No listing stored yet: not found on Google Play (404) (last crawl 2 min ago).</p>`,
		`<td data-label="Path">listing</td><td data-label="Storefront">us/en</td><td data-label="Time">10 May 2026 11:58 UTC (2 min ago)</td>` +
			`<td data-label="Outcome"><span class="fresh bad">not_found</span><div class="cause">not found on Google Play (404)</div></td>` +
			`<td data-label="HTTP status" class="num">404</td><td data-label="Error" dir="auto">GET /store/apps/details: 404</td>`,
		`<td data-label="Path">reviews</td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("app page lacks %q", want)
		}
	}
	_, body, _ = getPage(t, srv.URL+"/apps/"+quiet)
	if !strings.Contains(body, `<span class="fresh ok">ok</span></td><td data-label="HTTP status" class="num">200</td>`) {
		t.Error("the app page lacks the ok outcome")
	}
	_, body, _ = getPage(t, srv.URL+"/apps/"+statusBale)
	if !strings.Contains(body, "No data: no crawl of this app is recorded yet.") {
		t.Error("an app without a recorded crawl does not say so")
	}
}

// Every outcome the crawler records reads as a short cause.
func TestOutcomeCause(t *testing.T) {
	for _, tc := range []struct {
		outcome string
		status  *int32
		err     string
		want    string
	}{
		{"ok", ptr(int32(200)), "", ""},
		{"not_found", ptr(int32(404)), "", "not found on Google Play (404)"},
		{"throttled", ptr(int32(429)), "", "throttled by Google Play (429)"},
		{"throttled", nil, "", "throttled by Google Play (429)"},
		{"benched", nil, "egress socks5://p1 benched until 14:05 UTC", "egress socks5://p1 benched until 14:05 UTC"},
		{"dns", nil, "lookup play.google.com: no such host", "DNS lookup failed"},
		{"network", nil, "connection refused", "network error on the way to Google Play"},
		{"timeout", nil, "", "crawl took longer than CRAWL_APP_TIMEOUT"},
		{"parse_error", ptr(int32(200)), "", "page layout not understood"},
		{"canceled", nil, "", "crawl cut short (shutdown, or its job moved to another worker)"},
		{"http_error", ptr(int32(500)), "", "Google Play answered an HTTP error (500)"},
		{"error", nil, "publish: broker down", "crawl failed: publish: broker down"},
		{"error", nil, "", "crawl failed (error)"},
	} {
		if got := outcomeCause(&outcomeRow{Outcome: tc.outcome, HTTPStatus: tc.status, Error: tc.err}); got != tc.want {
			t.Errorf("%s %v %q: %q, want %q", tc.outcome, tc.status, tc.err, got, tc.want)
		}
	}
}

// The consumer role runs from the start; its lag has no series until its
// first fetch of records. The card says 0 then, not "not running".
func TestStatusPageConsumerLagBeforeFirstRecord(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	reg := newMetricsRegistry("test")
	newConsumerMetrics(reg)
	srv := statusServer(t, pool, "", reg)
	_, body, _ := getPage(t, srv.URL+"/")
	if want := `<div class="card ok"><div class="card-title">Consumer lag</div><div class="card-value">0 records</div><div class="card-detail">no record fetched yet</div>`; !strings.Contains(body, want) {
		t.Errorf("overview lacks %q", want)
	}
}

// getPageWithin is getPage that gives up after timeout (a page that waits
// for a lock would otherwise hang the test): code 0 then.
func getPageWithin(t *testing.T, url string, timeout time.Duration) (int, string, http.Header) {
	t.Helper()
	resp, err := (&http.Client{Timeout: timeout}).Get(url)
	if err != nil {
		t.Logf("GET %s: %v", url, err)
		return 0, "", nil
	}
	return readAnswer(t, resp, nil)
}

// Past STATUS_PAGE_MAX_RENDERS pages being drawn, a request is answered at
// once with 503 and Retry-After instead of queueing for the database.
func TestStatusPageMaxRenders(t *testing.T) {
	pool := newTestPool(t)
	seedStatus(t, pool)
	srv, page := statusPageOn(t, statusDB{pool}, newMetricsRegistry("test"), "", 1)

	release := holdTableLock(t, pool, "app_stats")
	first := make(chan int, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	waitFor(t, 10*time.Second, "the first page to wait for the lock", func() bool { return len(page.renders) == 1 })
	start := time.Now()
	for _, path := range []string{"/", "/apps/" + statusTelegram} {
		code, body, h := getPageWithin(t, srv.URL+path, 5*time.Second)
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "2" || !strings.Contains(body, "STATUS_PAGE_MAX_RENDERS") {
			t.Errorf("GET %s past the bound: %d, Retry-After %q\n%s", path, code, h.Get("Retry-After"), body)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the 503s took %v: they queued", d)
	}
	release()
	if code := <-first; code != http.StatusOK {
		t.Errorf("the page being drawn: %d, want 200", code)
	}
	// Its handler gives the slot back just after its answer is sent.
	waitFor(t, 10*time.Second, "the page's slot to be free", func() bool { return len(page.renders) == 0 })
	if code, _, _ := getPage(t, srv.URL+"/"); code != http.StatusOK {
		t.Errorf("after the page was drawn: %d, want 200", code)
	}
}

// newTestReadPool is a pool of a new test database and a read pool of it
// as `run` opens one (openReadPool): its statements end at timeout, and it
// has connections for maxRenders pages.
func newTestReadPool(t *testing.T, timeout time.Duration, maxRenders int) (pool, reads *pgxpool.Pool) {
	t.Helper()
	url := newTestDatabase(t)
	pool = newTestPoolFor(t, url)
	reads, err := openReadPool(t.Context(), url, timeout, maxRenders)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reads.Close)
	return pool, reads
}

// The page's connections (openReadPool, as `run` opens them) end a read at
// READ_STATEMENT_TIMEOUT: the page answers 503 in about that time, however
// long the database would take, and the next page is drawn normally.
func TestStatusPageStatementTimeout(t *testing.T) {
	pool, reads := newTestReadPool(t, 300*time.Millisecond, 4)
	seedStatus(t, pool)
	if n := reads.Config().MaxConns; n != 5 {
		t.Errorf("read pool of %d connections, want 5 (4 pages and the gauges)", n)
	}
	srv, page := statusPageOn(t, statusDB{reads}, newMetricsRegistry("test"), "", 4)

	release := holdTableLock(t, pool, "app_stats")
	start := time.Now()
	code, body, h := getPageWithin(t, srv.URL+"/", 5*time.Second)
	if d := time.Since(start); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || d > 3*time.Second ||
		!strings.Contains(body, "READ_STATEMENT_TIMEOUT") {
		t.Errorf("GET / with app_stats locked: %d after %v, Retry-After %q\n%s", code, d, h.Get("Retry-After"), body)
	}
	// The timeout is the connection's own, set by openReadPool.
	var timeout string
	if err := page.db.read(t.Context(), func(tx pgx.Tx) error {
		return tx.QueryRow(t.Context(), `SHOW statement_timeout`).Scan(&timeout)
	}); err != nil || timeout != "300ms" {
		t.Errorf("statement_timeout of a page read: %q, %v", timeout, err)
	}
	release()
	if code, _, _ := getPage(t, srv.URL+"/"); code != http.StatusOK {
		t.Errorf("after the lock: %d, want 200", code)
	}
}

// A panic in a page's handler answers 500 and is logged with its stack;
// the server goes on serving (net/http alone would drop the connection).
func TestHTTPHandlerPanic(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	reg := newMetricsRegistry("test")
	var logs syncBuffer
	page := newStatusPage(statusDB{pool}, reg, "", time.Hour, 30*time.Second, 1, slog.New(slog.NewTextHandler(&logs, nil)))
	page.locales = testLocales
	page.now = func() time.Time { panic("a bad input") }
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), nil, page, nil, page.logger))
	t.Cleanup(srv.Close)

	for range 2 { // the render slot was given back: still 500, not 503
		code, body, _ := getPage(t, srv.URL+"/")
		if code != http.StatusInternalServerError || !strings.Contains(body, `"error"`) {
			t.Errorf("GET / that panics: %d %s", code, body)
		}
	}
	if !strings.Contains(logs.String(), "HTTP handler panicked") || !strings.Contains(logs.String(), "a bad input") ||
		!strings.Contains(logs.String(), "serveOverview") {
		t.Errorf("the panic is not logged with its stack:\n%s", logs.String())
	}
	if code, _, _ := getPage(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the panic: %d", code)
	}
	if got := scrapeMetric(t, srv.URL, "playwatch_http_requests_total", `code="500",route="GET /{$}"`); got != 2 {
		t.Errorf("playwatch_http_requests_total of the 500s: %v, want 2", got)
	}
	if got := scrapeMetric(t, srv.URL, "playwatch_http_request_duration_seconds_count", `route="GET /{$}"`); got != 2 {
		t.Errorf("playwatch_http_request_duration_seconds of the 500s: %v observations, want 2", got)
	}
}
