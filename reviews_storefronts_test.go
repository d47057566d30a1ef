package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// seeReviewIn records that the stored review reviewID was seen in the
// storefronts, the first first, as the storage consumer does. Rows the
// consumer wrote already are replaced, so that a test says exactly where
// each review was seen.
func seeReviewIn(t testing.TB, pool *pgxpool.Pool, reviewID string, locs ...locale) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `DELETE FROM review_storefronts WHERE review_id = (SELECT id FROM reviews WHERE review_id = $1)`, reviewID); err != nil {
		t.Fatal(err)
	}
	for i, l := range locs {
		if _, err := pool.Exec(ctx, `INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
			SELECT id, application_id, $2, $3, first_seen_at + $4 * interval '1 second' FROM reviews WHERE review_id = $1`,
			reviewID, l.Country, l.Lang, i); err != nil {
			t.Fatal(err)
		}
	}
}

// country and lang filter the reviews API by the storefronts a review was
// seen in (both given: one storefront of that country and language), each
// review lists its storefronts, the CSV has them as a column, and bad codes
// are 400s naming the parameter.
func TestReviewsAPIStorefronts(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	gb := locale{Country: "gb", Lang: "en"}
	for id, locs := range map[string][]locale{
		"fa1": {sfIR}, "fa2": {sfIR}, "fa3": {sfIR, sfUS},
		"en1": {sfUS}, "en2": {gb}, "en3": {sfUS, sfDE},
	} {
		seeReviewIn(t, pool, id, locs...)
	}
	srv, _ := reviewsServer(t, pool, "")
	checkReviewsQueries(t, srv.URL, []reviewsQuery{
		{"country=ir", []string{"fa1", "fa2", "fa3"}},
		{"country=us", []string{"en1", "en3", "fa3"}},
		{"lang=en", []string{"en1", "en2", "en3", "fa3"}},
		{"country=us&lang=en", []string{"en1", "en3", "fa3"}},
		{"country=de,gb", []string{"en2", "en3"}},
		{"country=us&lang=de", nil}, // en3 is in us/en and de/de, never us/de
		{"country=ir&package=org.telegram.messenger", nil},
		{"country=us&stars=1", []string{"en1"}},
		{"lang=fa&q=" + url.QueryEscape("عالیه"), []string{"fa3"}},
		{"country=br", nil},
	})
	_, out, _ := getReviews(t, srv.URL, "country=de")
	if len(out.Reviews) != 1 || !slices.Equal(out.Reviews[0].Storefronts, []locale{sfUS, sfDE}) ||
		out.Reviews[0].URL != "https://play.google.com/store/apps/details?id=org.telegram.messenger&reviewId=en3&hl=en" {
		t.Errorf("en3 %+v, want its storefronts us/en then de/de", out.Reviews)
	}
	for _, q := range []string{"country=US", "country=usa", "country=", "country=us,,ir", "lang=farsi", "lang=pt-br", "lang=e1", "country=us&country=ir"} {
		checkBadReviewsParameter(t, srv.URL, q, strings.SplitN(q, "=", 2)[0])
	}
	_, body, _ := getPage(t, srv.URL+"/api/v1/reviews?format=csv&lang=fa&sort=oldest")
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	col := slices.Index(reviewCSVFields, "storefronts")
	if err != nil || len(recs) != 4 || col < 0 || recs[0][col] != "storefronts" || recs[1][1] != "fa3" || recs[1][col] != "ir/fa;us/en" || recs[3][col] != "ir/fa" {
		t.Errorf("csv: %v %q", err, recs)
	}
}

// A walk through one storefront's reviews pages exactly: every review of
// it once, none of another.
func TestReviewsAPIStorefrontPaging(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	_, msgs := storeNumberedReviews(t, pool, 150, 41)
	want := map[string]bool{}
	for i, m := range msgs {
		id := m.ReviewID
		switch i % 3 {
		case 0:
			seeReviewIn(t, pool, id, sfIR)
			want[id] = true
		case 1:
			seeReviewIn(t, pool, id, sfUS)
		default:
			seeReviewIn(t, pool, id, sfUS, sfIR)
			want[id] = true
		}
	}
	srv, _ := reviewsServer(t, pool, "")
	for _, sort := range reviewSorts {
		seen := walkReviews(t, srv.URL, "limit=9&country=ir&lang=fa&sort="+sort, nil)
		if len(seen) != len(want) {
			t.Errorf("sort %s: %d reviews, want %d", sort, len(seen), len(want))
		}
		for id, k := range seen {
			if k != 1 || !want[id] {
				t.Errorf("sort %s: %s came %d times (in ir/fa: %v)", sort, id, k, want[id])
			}
		}
	}
}

// The stats export gives every storefront's listings with their country
// and lang, filters by them, and pages exactly when two storefronts were
// crawled at the same time.
func TestAppStatsExportStorefronts(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	registerApps(t, pool, "org.telegram.messenger")
	const times = 700 // × 3 storefronts: a page boundary (statsPageSize) falls within one crawl time
	if _, err := pool.Exec(context.Background(), `INSERT INTO app_stats (application_id, country, lang, score, crawled_at)
		SELECT a.id, sf.country, sf.lang, 4.0, $1::timestamptz - g * interval '1 minute'
		FROM apps_registry_application a, generate_series(1, $2::int) g, (VALUES ('ir', 'fa'), ('us', 'en'), ('de', 'de')) sf(country, lang)`,
		testCrawl, times); err != nil {
		t.Fatal(err)
	}
	srv, _ := reviewsServer(t, pool, "")
	get := func(q string) (int, []statsOut, string) {
		code, body, _ := getPage(t, srv.URL+"/api/v1/apps/org.telegram.messenger/stats?"+q)
		var out struct{ Stats []statsOut }
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &out); err != nil {
				t.Fatal(err)
			}
		}
		return code, out.Stats, body
	}
	_, all, _ := get("")
	if len(all) != 3*times {
		t.Fatalf("%d listings, want %d (every storefront's, across pages)", len(all), 3*times)
	}
	seen := map[string]bool{}
	for _, s := range all {
		seen[s.Country+"/"+s.Lang+"@"+s.CrawledAt.String()] = true
	}
	if len(seen) != 3*times || all[0].Country != "de" || all[1].Country != "ir" || all[2].Country != "us" {
		t.Errorf("%d distinct listings, first %+v %+v %+v", len(seen), all[0], all[1], all[2])
	}
	code, ir, body := get("country=ir&lang=fa")
	if code != http.StatusOK || len(ir) != times || slices.ContainsFunc(ir, func(s statsOut) bool { return s.Country != "ir" || s.Lang != "fa" }) {
		t.Errorf("country=ir&lang=fa: %d, %d listings %s", code, len(ir), body[:min(len(body), 200)])
	}
	if _, two, _ := get("country=ir,us&since=" + url.QueryEscape(testCrawl.Add(-10*time.Minute).Format(time.RFC3339))); len(two) != 20 {
		t.Errorf("two storefronts since 10 min: %d listings, want 20", len(two))
	}
	for _, q := range []string{"country=IR", "lang=persian", "country=ir,"} {
		param := strings.SplitN(q, "=", 2)[0]
		if code, _, body := get(q); code != http.StatusBadRequest || !strings.Contains(body, param) {
			t.Errorf("%s: %d %s, want 400 naming %s", q, code, body, param)
		}
	}
}

// The reviews page filters by storefront as the API does, keeps the codes
// in its form and links, shows where each review was seen, and answers a
// bad code with 400 and the form.
func TestReviewsPageStorefronts(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	for id, locs := range map[string][]locale{
		"fa1": {sfIR}, "fa2": {sfIR}, "fa3": {sfIR, sfUS}, "en1": {sfUS}, "en2": {sfUS}, "en3": {sfDE},
	} {
		seeReviewIn(t, pool, id, locs...)
	}
	srv := reviewsPageServer(t, pool, "")
	code, body, _ := getPage(t, srv.URL+"/reviews?country=us&lang=&q=&limit=1")
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	for _, want := range []string{`name="country" value="us"`, `<span class="storefronts" title="the storefronts it was seen in">(us/en)</span>`,
		`href="/reviews?country=us&amp;cursor=`, `href="/api/v1/reviews?bom=1&amp;country=us&amp;format=csv"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	// Every page of the walk: us reviews only.
	var ids []string
	next := "/reviews?country=us&limit=1"
	for range 10 {
		_, body, _ := getPage(t, srv.URL+next)
		for _, id := range []string{"fa1", "fa2", "fa3", "en1", "en2", "en3"} {
			if strings.Contains(body, "reviewId="+id+"&") {
				ids = append(ids, id)
			}
		}
		i := strings.Index(body, `rel="next"`)
		if i < 0 {
			break
		}
		j := strings.LastIndex(body[:i], `href="`)
		next = strings.ReplaceAll(body[j+len(`href="`):i-2], "&amp;", "&")
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"en1", "en2", "fa3"}) {
		t.Errorf("the us pages showed %v", ids)
	}
	if _, body, _ := getPage(t, srv.URL+"/reviews?country=ir&country=us"); !strings.Contains(body, "(ir/fa, us/en)") || strings.Contains(body, "reviewId=en3&") {
		t.Errorf("country=ir,us: %s", body)
	}
	code, body, _ = getPage(t, srv.URL+"/reviews?lang=Persian")
	if code != http.StatusBadRequest || !strings.Contains(body, "lang: ") || !strings.Contains(body, `name="lang" value="Persian"`) {
		t.Errorf("bad lang: %d %s", code, body)
	}
}

// `playwatch export` takes --country and --lang as the API's parameters:
// reviews and listings of those storefronts only, a bad code a usage error.
func TestExportCommandStorefronts(t *testing.T) {
	t.Parallel()
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	seedReviewsAPI(t, pool)
	for id, locs := range map[string][]locale{"fa1": {sfIR}, "fa2": {sfIR, sfUS}, "fa3": {sfIR}, "en1": {sfUS}, "en2": {sfUS}, "en3": {sfDE}} {
		seeReviewIn(t, pool, id, locs...)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO app_stats (application_id, country, lang, score, crawled_at)
		SELECT id, sf.country, sf.lang, 4.5, $1 FROM apps_registry_application, (VALUES ('ir', 'fa'), ('us', 'en')) sf(country, lang)
		WHERE package_name = 'ir.divar'`, testCrawl); err != nil {
		t.Fatal(err)
	}
	env := envFunc(map[string]string{"DATABASE_URL": dbURL, "PLAYWATCH_DATA_DIR": t.TempDir(), "LOG_LEVEL": "warn"})
	export := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"export"}, args...), env, &out, &errOut)
		return out.String(), err
	}
	out, err := export("reviews", "--country", "us", "--format", "ndjson")
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r reviewOut
		if json.Unmarshal([]byte(line), &r) == nil {
			ids = append(ids, r.ReviewID)
		}
	}
	slices.Sort(ids)
	if err != nil || !slices.Equal(ids, []string{"en1", "en2", "fa2"}) {
		t.Errorf("export reviews --country us: %v %v", err, ids)
	}
	out, err = export("stats", "--package", "ir.divar", "--lang", "en")
	recs, _ := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) != 2 || recs[1][1] != "us" || recs[1][2] != "en" {
		t.Errorf("export stats --lang en: %v %q", err, recs)
	}
	for _, bad := range [][]string{{"reviews", "--country", "USA"}, {"stats", "--package", "ir.divar", "--lang", "farsi"}} {
		if _, err := export(bad...); err == nil || !errorsAsUsage(err) || !strings.Contains(err.Error(), "--"+strings.TrimPrefix(bad[len(bad)-2], "--")) {
			t.Errorf("export %q: %v, want a usage error naming the flag", bad, err)
		}
	}
}
