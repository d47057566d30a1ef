package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// reviewStorer stores reviews through the storage consumer's write path.
type reviewStorer struct {
	store  *consumerStore
	offset atomic.Int64
}

func newReviewStorer(pool *pgxpool.Pool) *reviewStorer {
	return &reviewStorer{store: newConsumerStore(pool, "reviews-test", testLocales)}
}

func (s *reviewStorer) put(t testing.TB, msgs ...reviewMessage) {
	t.Helper()
	var recs []*kgo.Record
	for i := range msgs {
		b, err := msgs[i].encodeJSON()
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: topicReviews, Partition: 0, Offset: s.offset.Add(1), Value: b})
	}
	parts := []partitionBatch{{topicPartition: topicPartition{topicReviews, 0}, records: recs}}
	out, err := s.store.storeBatch(context.Background(), parts, decodeRecords(recs, 1<<20, time.Now()), false, nil)
	if err != nil {
		t.Error(err)
		return
	}
	if len(out.dead) > 0 {
		t.Errorf("dead letters: %+v", out.dead[0].reason)
	}
}

func testReview(pkg, id string, stars int, content string, at time.Time) reviewMessage {
	return reviewMessage{PackageName: pkg, ReviewID: id, UserName: ptr("user " + id), Score: ptr(stars), Content: ptr(content),
		At: at, CrawledAt: testCrawl}
}

// storeNumberedReviews registers org.telegram.messenger and stores n
// reviews of it, r0000 on, of 1 to 5 stars in turn, written in the last
// hours hours.
func storeNumberedReviews(t *testing.T, pool *pgxpool.Pool, n, hours int) (*reviewStorer, []reviewMessage) {
	t.Helper()
	registerApps(t, pool, "org.telegram.messenger")
	s := newReviewStorer(pool)
	var msgs []reviewMessage
	for i := range n {
		msgs = append(msgs, testReview("org.telegram.messenger", fmt.Sprintf("r%04d", i), 1+i%5, fmt.Sprintf("review %d", i),
			testCrawl.Add(-time.Duration(i%hours)*time.Hour)))
	}
	s.put(t, msgs...)
	return s, msgs
}

// reviewsServer serves the registry API with the reviews API on pool.
func reviewsServer(t testing.TB, pool *pgxpool.Pool, token string) (*httptest.Server, *reviewsAPI) {
	t.Helper()
	ra := newReviewsAPI(pool, testLocales, token, testLogger(t))
	ra.now = func() time.Time { return testCrawl }
	api := &registryAPI{store: newRegistryStore(pool, pool), locales: testLocales, logger: testLogger(t), reviews: ra}
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), api, nil, nil, testLogger(t)))
	t.Cleanup(srv.Close)
	return srv, ra
}

func getReviews(t *testing.T, base, query string) (int, reviewsResponse, string) {
	t.Helper()
	code, body, _ := getPage(t, base+"/api/v1/reviews?"+query)
	var out reviewsResponse
	if code == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatalf("%s: %v: %s", query, err, body)
		}
	}
	return code, out, body
}

// reviewsQuery is a query of the reviews API and the IDs of the reviews
// it must list, sorted.
type reviewsQuery struct {
	query string
	want  []string
}

// checkReviewsQueries asks the reviews API each query and checks that it
// lists exactly the reviews the query wants.
func checkReviewsQueries(t *testing.T, base string, queries []reviewsQuery) {
	t.Helper()
	for _, c := range queries {
		code, out, body := getReviews(t, base, c.query)
		if code != http.StatusOK {
			t.Errorf("%s: %d %s", c.query, code, body)
			continue
		}
		if got := reviewIDs(out.Reviews); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.query, got, c.want)
		}
	}
}

// checkBadReviewsParameter checks that the reviews API refuses query with
// a 400 whose error names param.
func checkBadReviewsParameter(t *testing.T, base, query, param string) {
	t.Helper()
	code, _, body := getReviews(t, base, query)
	var e errorResponse
	if code != http.StatusBadRequest || json.Unmarshal([]byte(body), &e) != nil || !strings.HasPrefix(e.Error, param+":") {
		t.Errorf("%s: %d %s, want 400 naming %s", query, code, body, param)
	}
}

// walkReviews follows the cursors from the first page of query to its last
// and counts how often each review came; between, if not nil, runs after
// every page that has a next one. More than maxReviewsWalk pages is a
// cursor that goes round.
func walkReviews(t *testing.T, base, query string, between func()) map[string]int {
	t.Helper()
	seen := map[string]int{}
	q := query
	for pages := 0; ; pages++ {
		code, out, body := getReviews(t, base, q)
		if code != http.StatusOK || pages > maxReviewsWalk {
			t.Fatalf("%s: %d %s", q, code, body)
		}
		for _, r := range out.Reviews {
			seen[r.ReviewID]++
		}
		if out.NextCursor == nil {
			return seen
		}
		q = query + "&cursor=" + *out.NextCursor
		if between != nil {
			between()
		}
	}
}

const maxReviewsWalk = 100

func reviewIDs(rs []reviewOut) []string {
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.ReviewID)
	}
	slices.Sort(ids)
	return ids
}

// seedReviewsAPI stores a small mixed set: Persian and English, replies,
// versions, labels and topics as the sentiment job writes them.
func seedReviewsAPI(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	registerApps(t, pool, "ir.divar", "org.telegram.messenger")
	if _, err := pool.Exec(context.Background(), `UPDATE apps_registry_application SET is_iranian_app = true WHERE package_name = 'ir.divar'`); err != nil {
		t.Fatal(err)
	}
	day := func(n int) time.Time { return testCrawl.Add(-time.Duration(n) * 24 * time.Hour) }
	s := newReviewStorer(pool)
	fa1 := testReview("ir.divar", "fa1", 1, "كيفيت خيلي بد شده، لاگين نميشه", day(1)) // Arabic ي and ك
	fa1.AppVersion = ptr("12.0")
	fa1.ReplyContent, fa1.RepliedAt = ptr("ممنون از بازخورد شما"), ptr(day(0))
	fa2 := testReview("ir.divar", "fa2", 2, "ورود به حساب نمی‌شه", day(2))
	fa2.AppVersion = ptr("12.0")
	fa3 := testReview("ir.divar", "fa3", 5, "عالیه ۱۰۰ درصد", day(3))
	fa3.AppVersion = ptr("11.9")
	en1 := testReview("org.telegram.messenger", "en1", 1, "Login fails since the update", day(1))
	en2 := testReview("org.telegram.messenger", "en2", 4, "ok then, works", day(5))
	en3 := testReview("org.telegram.messenger", "en3", 3, "okay app", day(40))
	en3.ThumbsUpCount = 99
	s.put(t, fa1, fa2, fa3, en1, en2, en3)
	for _, u := range []struct {
		id, sentiment, lang string
		topics              []string
	}{
		{"fa1", "NEGATIVE", "fa", []string{"login", "quality"}}, {"fa2", "NEGATIVE", "fa", []string{"login"}},
		{"fa3", "POSITIVE", "fa", nil}, {"en1", "NEGATIVE", "en", []string{"login", "update"}}, {"en2", "POSITIVE", "en", nil},
	} {
		if _, err := pool.Exec(context.Background(), `UPDATE reviews SET sentiment = $2, text_lang = $3, topics = $4 WHERE review_id = $1`,
			u.id, u.sentiment, u.lang, u.topics); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReviewsAPIFilters(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	srv, _ := reviewsServer(t, pool, "")
	checkReviewsQueries(t, srv.URL, []reviewsQuery{
		{"", []string{"en1", "en2", "en3", "fa1", "fa2", "fa3"}},
		{"package=ir.divar", []string{"fa1", "fa2", "fa3"}},
		{"package=ir.divar,org.telegram.messenger&stars=1", []string{"en1", "fa1"}},
		{"package=com.unknown.app", nil},
		{"stars=1,2&sentiment=negative&text_lang=fa", []string{"fa1", "fa2"}},
		{"sentiment=POSITIVE,NEUTRAL", []string{"en2", "fa3"}},
		{"topic=login", []string{"en1", "fa1", "fa2"}},
		{"topic=update,quality", []string{"en1", "fa1"}},
		{"version=12.0", []string{"fa1", "fa2"}},
		{"has_reply=true", []string{"fa1"}},
		{"has_reply=false&package=ir.divar", []string{"fa2", "fa3"}},
		{"since=2d", []string{"en1", "fa1", "fa2"}}, // since is inclusive
		{"until=" + url.QueryEscape(testCrawl.Add(-30*24*time.Hour).Format(time.RFC3339)), []string{"en3"}},
		// Persian normalisation: Arabic ي/ك, ZWNJ or none, Persian digits.
		{"q=" + url.QueryEscape("کیفیت"), []string{"fa1"}},
		{"q=" + url.QueryEscape("كيفيت"), []string{"fa1"}},
		{"q=" + url.QueryEscape("نمیشه"), []string{"fa1", "fa2"}},
		{"q=" + url.QueryEscape("می‌شه"), []string{"fa1", "fa2"}},
		{"q=100", []string{"fa3"}},
		{"q=" + url.QueryEscape("لاگین"), []string{"fa1"}},
		// Substrings of 3 or more, whole words below.
		{"q=LOG", []string{"en1"}},
		{"q=ok", []string{"en2"}},
		{"q=oka", []string{"en3"}},
		{"q=" + url.QueryEscape("login update"), []string{"en1"}},
		{"q=" + url.QueryEscape("50%"), nil},
		{"q=" + url.QueryEscape("،!"), nil}, // no word: nothing
		{"since=1d&until=2d", nil},
		// The done-when query: 1–2★ Persian reviews mentioning login since a release.
		{"stars=1,2&text_lang=fa&q=" + url.QueryEscape("لاگین") + "&since=" + url.QueryEscape(testCrawl.Add(-36*time.Hour).Format(time.RFC3339)), []string{"fa1"}},
	})

	// One review with every field, in the documented order.
	_, _, body := getReviews(t, srv.URL, "q="+url.QueryEscape("كيفيت"))
	var raw struct{ Reviews []json.RawMessage }
	if err := json.Unmarshal([]byte(body), &raw); err != nil || len(raw.Reviews) != 1 {
		t.Fatalf("%s: %v", body, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw.Reviews[0]))
	var keys []string
	_, _ = dec.Token()
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var skip json.RawMessage
		_ = dec.Decode(&skip)
	}
	if !slices.Equal(keys, reviewCSVFields) {
		t.Errorf("fields %v, want %v", keys, reviewCSVFields)
	}
	_, out, _ := getReviews(t, srv.URL, "q="+url.QueryEscape("كيفيت"))
	r := out.Reviews[0]
	if r.URL != "https://play.google.com/store/apps/details?id=ir.divar&reviewId=fa1&hl=fa" || r.PackageName != "ir.divar" ||
		*r.Stars != 1 || *r.Text != "كيفيت خيلي بد شده، لاگين نميشه" || *r.ReplyText != "ممنون از بازخورد شما" || r.RepliedAt == nil ||
		*r.Sentiment != "NEGATIVE" || *r.TextLang != "fa" || !slices.Equal(r.Topics, []string{"login", "quality"}) || *r.AppVersion != "12.0" ||
		*r.UserName != "user fa1" || !r.At.Equal(testCrawl.Add(-24*time.Hour)) {
		t.Errorf("review %+v", r)
	}
	_, out, _ = getReviews(t, srv.URL, "package=org.telegram.messenger&sort=thumbs_up&limit=1")
	if len(out.Reviews) != 1 || out.Reviews[0].ReviewID != "en3" || out.Reviews[0].ThumbsUp != 99 || out.NextCursor == nil ||
		!strings.HasSuffix(out.Reviews[0].URL, "&hl=en") {
		t.Errorf("thumbs_up first: %+v", out)
	}
	_, out, _ = getReviews(t, srv.URL, "sort=oldest&limit=2")
	if ids := []string{out.Reviews[0].ReviewID, out.Reviews[1].ReviewID}; !slices.Equal(ids, []string{"en3", "en2"}) {
		t.Errorf("oldest first: %v", ids)
	}
}

func TestReviewsAPIRefusesBadParameters(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	srv, _ := reviewsServer(t, pool, "")
	for query, param := range map[string]string{
		"foo=1":                              "foo",
		"limit=0":                            "limit",
		"limit=501":                          "limit",
		"limit=x":                            "limit",
		"stars=6":                            "stars",
		"stars=1,,2":                         "stars",
		"sentiment=ANGRY":                    "sentiment",
		"has_reply=yes":                      "has_reply",
		"since=yesterday":                    "since",
		"until=-5d":                          "until",
		"sort=best":                          "sort",
		"cursor=abc":                         "cursor",
		"q=":                                 "q",
		"q=" + strings.Repeat("a", 201):      "q",
		"package=not_a_package":              "package",
		"text_lang=FA1":                      "text_lang",
		"topic=Login%20Bug":                  "topic",
		"format=xml":                         "format",
		"stars=1&stars=2":                    "stars",
		"version=" + strings.Repeat("9", 51): "version",
	} {
		checkBadReviewsParameter(t, srv.URL, query, param)
	}
	resp, err := http.Post(srv.URL+"/api/v1/reviews", "application/json", nil)
	if code, _, header := readAnswer(t, resp, err); code != http.StatusMethodNotAllowed || header.Get("Allow") != "GET" {
		t.Errorf("POST: %d %q", code, header.Get("Allow"))
	}
}

func TestReviewsAPIToken(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	srv, _ := reviewsServer(t, pool, "s3cret")
	for _, c := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", func(*http.Request) {}, http.StatusUnauthorized},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, http.StatusUnauthorized},
		{"wrong basic", func(r *http.Request) { r.SetBasicAuth("x", "nope") }, http.StatusUnauthorized},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") }, http.StatusOK},
		{"basic", func(r *http.Request) { r.SetBasicAuth("anyone", "s3cret") }, http.StatusOK},
	} {
		for _, path := range []string{"/api/v1/reviews", "/api/v1/apps/ir.divar/stats"} {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
			c.set(req)
			resp, err := http.DefaultClient.Do(req)
			code, body, header := readAnswer(t, resp, err)
			if code != c.want {
				t.Errorf("%s %s: %d %s", c.name, path, code, body)
			}
			if c.want == http.StatusUnauthorized && (!strings.HasPrefix(header.Get("WWW-Authenticate"), "Basic") || strings.Contains(body, "s3cret")) {
				t.Errorf("%s: WWW-Authenticate %q, body %s", c.name, header.Get("WWW-Authenticate"), body)
			}
		}
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{HTTPAddr: "127.0.0.1:8080", RegistryToken: "r"}, ""},
		{Config{HTTPAddr: "127.0.0.1:8080", StatusPageToken: "s", RegistryToken: "r"}, "s"},
		{Config{HTTPAddr: "0.0.0.0:8080", RegistryToken: "r"}, "r"},
		{Config{HTTPAddr: "0.0.0.0:8080", StatusPageToken: "s", RegistryToken: "r"}, "s"},
	} {
		if got := reviewsToken(c.cfg); got != c.want {
			t.Errorf("%+v: token %q, want %q", c.cfg, got, c.want)
		}
	}
}

// A walk over every page returns each review stored when it began exactly
// once, while other reviews are stored and the walked ones re-synced with
// a new time on the store (an edit), new text and new thumbs.
func TestReviewsPagingIsExact(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	const n = 600
	s, msgs := storeNumberedReviews(t, pool, n, 97)
	srv, _ := reviewsServer(t, pool, "")
	for _, sort := range reviewSorts {
		t.Run(sort, func(t *testing.T) {
			// A round of re-syncs and new reviews between every two pages.
			round := 0
			resync := func() {
				round++
				var batch []reviewMessage
				for i := round % 7; i < n; i += 7 {
					m := msgs[i]
					m.CrawledAt = testCrawl.Add(time.Duration(round) * time.Second)
					m.At = testCrawl.Add(time.Duration(round) * time.Minute) // edited: the newest now
					m.ThumbsUpCount = int64(round * (i % 13))
					m.Content = ptr(fmt.Sprintf("review %d edited %d", i, round))
					batch = append(batch, m)
				}
				for j := range 5 {
					batch = append(batch, testReview("org.telegram.messenger", fmt.Sprintf("new-%s-%d-%d", sort, round, j), 3, "new",
						testCrawl.Add(time.Duration(j-2)*time.Hour)))
				}
				s.put(t, batch...)
			}
			seen := walkReviews(t, srv.URL, "limit=37&sort="+sort, resync)
			if round < 10 {
				t.Fatalf("only %d rounds of writes during the walk", round)
			}
			for _, m := range msgs {
				if c := seen[m.ReviewID]; c != 1 && sort != "thumbs_up" {
					t.Errorf("%s seen %d times", m.ReviewID, c)
				}
			}
			for id, c := range seen {
				if strings.HasPrefix(id, "new-"+sort+"-") || c > 1 && sort != "thumbs_up" {
					t.Errorf("%s seen %d times: stored after the walk began, or twice", id, c)
				}
			}
		})
	}
}

func TestReviewsExportCSVAndNDJSON(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	srv, _ := reviewsServer(t, pool, "")
	// limit=2: three pages, streamed.
	code, body, header := getPage(t, srv.URL+"/api/v1/reviews?format=csv&bom=1&limit=2&package=ir.divar,org.telegram.messenger")
	if code != http.StatusOK || !strings.HasPrefix(header.Get("Content-Type"), "text/csv; charset=utf-8") {
		t.Fatalf("%d %s", code, header)
	}
	if !strings.HasPrefix(body, "\uFEFF") {
		t.Fatalf("no BOM: %q", body[:10])
	}
	recs, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(body, "\uFEFF"))).ReadAll()
	if err != nil {
		t.Fatalf("not RFC 4180: %v\n%s", err, body)
	}
	if !slices.Equal(recs[0], reviewCSVFields) || len(recs) != 7 {
		t.Fatalf("header %v, %d records", recs[0], len(recs))
	}
	byID := map[string][]string{}
	for _, r := range recs[1:] {
		byID[r[1]] = r
	}
	fa1 := byID["fa1"]
	if fa1[4] != "كيفيت خيلي بد شده، لاگين نميشه" || fa1[10] != "login;quality" || fa1[3] != "1" || fa1[11] != "ممنون از بازخورد شما" ||
		fa1[13] != "https://play.google.com/store/apps/details?id=ir.divar&reviewId=fa1&hl=fa" || fa1[5] != testCrawl.Add(-24*time.Hour).Format(time.RFC3339Nano) {
		t.Errorf("fa1 in CSV: %q", fa1)
	}
	if byID["fa3"][10] != "" || byID["fa3"][12] != "" {
		t.Errorf("empty topics and reply: %q", byID["fa3"])
	}

	code, body, header = getPage(t, srv.URL+"/api/v1/reviews?format=ndjson&limit=1&stars=1,2")
	if code != http.StatusOK || header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %s", code, header)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	var ids []string
	for sc.Scan() {
		var r reviewOut
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.ReviewID == "" {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		ids = append(ids, r.ReviewID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"en1", "fa1", "fa2"}) {
		t.Errorf("ndjson reviews %v", ids)
	}
}

// pausingPager lets the first page through and holds the next until
// release is closed.
type pausingPager struct {
	next    reviewPager
	calls   atomic.Int32
	waiting chan struct{}
	release chan struct{}
}

func (p *pausingPager) page(ctx context.Context, q reviewQuery) (reviewPage, error) {
	if q.Format != "json" && p.calls.Add(1) > 1 {
		select {
		case <-p.release:
		default:
			p.waiting <- struct{}{}
			<-p.release
		}
	}
	return p.next.page(ctx, q)
}

func TestReviewsExportsAtMostTwoAtOnce(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	srv, ra := reviewsServer(t, pool, "")
	pp := &pausingPager{next: ra.reviews, waiting: make(chan struct{}, 4), release: make(chan struct{})}
	ra.reviews = pp
	var wg sync.WaitGroup
	bodies := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(srv.URL + "/api/v1/reviews?format=ndjson&limit=1")
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			bodies[i] = string(b)
		}()
	}
	<-pp.waiting
	<-pp.waiting
	code, body, header := getPage(t, srv.URL+"/api/v1/reviews?format=csv")
	if code != http.StatusServiceUnavailable || header.Get("Retry-After") == "" || !strings.Contains(body, "exports") {
		t.Errorf("third export: %d %q %s", code, header.Get("Retry-After"), body)
	}
	// JSON pages are no export.
	if code, _, _ := getReviews(t, srv.URL, "limit=1"); code != http.StatusOK {
		t.Errorf("a JSON page while two exports run: %d", code)
	}
	close(pp.release)
	wg.Wait()
	for _, b := range bodies {
		if strings.Count(b, "\n") != 6 {
			t.Errorf("an export held back: %q", b)
		}
	}
}

// lockingPager reads the first page, then has the table locked so that the
// next page's statement runs into PostgreSQL's statement timeout.
type lockingPager struct {
	first, rest reviewPager
	lock        func()
	calls       int
}

func (p *lockingPager) page(ctx context.Context, q reviewQuery) (reviewPage, error) {
	p.calls++
	if p.calls == 1 {
		return p.first.page(ctx, q)
	}
	if p.calls == 2 {
		p.lock()
	}
	return p.rest.page(ctx, q)
}

func TestReviewsExportFailingMidwaySaysSo(t *testing.T) {
	t.Parallel()
	pool, timed := newTestReadPool(t, 300*time.Millisecond, 2)
	seedReviewsAPI(t, pool)
	srv, ra := reviewsServer(t, pool, "")
	for _, format := range []string{"csv", "ndjson"} {
		var locker pgx.Tx
		lp := &lockingPager{first: ra.reviews, rest: reviewsDB{pool: timed, locales: testLocales}, lock: func() {
			var err error
			locker, err = pool.Begin(context.Background())
			if err == nil {
				_, err = locker.Exec(context.Background(), `LOCK TABLE reviews IN ACCESS EXCLUSIVE MODE`)
			}
			if err != nil {
				t.Error(err)
			}
		}}
		ra.reviews = lp
		_, body, _ := getPage(t, srv.URL+"/api/v1/reviews?limit=2&format="+format)
		_ = locker.Rollback(context.Background())
		ra.reviews = lp.first
		lines := strings.Split(strings.TrimRight(body, "\r\n"), "\n")
		last := strings.TrimRight(lines[len(lines)-1], "\r")
		switch format {
		case "csv":
			if len(lines) != 4 || !strings.HasPrefix(last, "# error: the export stopped: the database took longer than READ_STATEMENT_TIMEOUT") {
				t.Errorf("csv: %q", body)
			}
		case "ndjson":
			var e errorResponse
			if len(lines) != 3 || json.Unmarshal([]byte(last), &e) != nil || !strings.Contains(e.Error, "READ_STATEMENT_TIMEOUT") {
				t.Errorf("ndjson: %q", body)
			}
		}
	}
}

func TestAppStatsExport(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	for i := range 5 {
		mustExec(t, pool, `INSERT INTO app_stats (application_id, country, lang, score, ratings, min_installs, real_installs, reviews_count, version,
			ratings_1, ratings_2, ratings_3, ratings_4, ratings_5, crawled_at)
			SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, 4.25, 1000 + $1, 1000000, 1234567, 50, '12.' || $1, 1, 2, 3, 4, 5 + $1, $2 FROM apps_registry_application WHERE package_name = 'ir.divar'`,
			i, testCrawl.Add(-time.Duration(i)*24*time.Hour))
	}
	srv, _ := reviewsServer(t, pool, "")
	get := func(q string) (int, string) {
		code, body, _ := getPage(t, srv.URL+"/api/v1/apps/ir.divar/stats"+q)
		return code, body
	}
	code, body := get("?since=3d")
	var out struct{ Stats []statsOut }
	if code != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil || len(out.Stats) != 4 { // since is inclusive
		t.Fatalf("%d %s", code, body)
	}
	s := out.Stats[3]
	if s.Country != "ir" || s.Lang != "fa" || *s.Score != 4.25 || *s.Installs != 1000000 || *s.RealInstalls != 1234567 ||
		*s.Version != "12.0" || *s.Ratings5 != 5 || *s.ReviewsCount != 50 || !s.CrawledAt.Equal(testCrawl) {
		t.Errorf("newest listing %+v", s)
	}
	var keys map[string]json.RawMessage
	var raw struct{ Stats []json.RawMessage }
	_ = json.Unmarshal([]byte(body), &raw)
	_ = json.Unmarshal(raw.Stats[0], &keys)
	for _, f := range statsFields {
		if _, ok := keys[f]; !ok || len(keys) != len(statsFields) {
			t.Errorf("field %s missing in %s", f, raw.Stats[0])
		}
	}
	code, body = get("?format=csv&until=" + url.QueryEscape(testCrawl.Format(time.RFC3339)))
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if code != http.StatusOK || err != nil || len(recs) != 5 || !slices.Equal(recs[0], statsFields) || recs[4][8] != "12.1" {
		t.Errorf("csv: %d %v %q", code, err, recs)
	}
	if code, body := get("?format=xml"); code != http.StatusBadRequest || !strings.Contains(body, "format") {
		t.Errorf("bad format: %d %s", code, body)
	}
	if code, body := get("?colour=ir"); code != http.StatusBadRequest || !strings.Contains(body, "colour") {
		t.Errorf("unknown param: %d %s", code, body)
	}
	if code, _, _ := getPage(t, srv.URL+"/api/v1/apps/com.not.registered/stats?format=csv"); code != http.StatusNotFound {
		t.Errorf("unregistered: %d", code)
	}
}
