package main

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const statusSignal = "org.thoughtcrime.securesms"

// newStorefrontsTestPool is a test pool with seedStatus's apps and Signal,
// registered with two storefronts (ir/fa first, us/en), whose listings and
// reviews differ per storefront: ir/fa 4.10 with 2,000 ratings, 2 negative
// and 1 positive review in the last 24 h; us/en 3.80 with 9,000 ratings, 1
// negative and 3 positive, and one review seen in both storefronts
// (counted in each). Every review is in a storefront.
func newStorefrontsTestPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := newTestPool(t)
	seedStatus(t, pool)
	ctx := context.Background()
	exec := poolExec(t, ctx, pool)
	exec(`INSERT INTO apps_registry_application (package_name, display_name) VALUES ($1, 'Signal')`, statusSignal)
	exec(`INSERT INTO app_storefronts (application_id, position, country, lang)
		SELECT id, p, c, l FROM apps_registry_application, (VALUES (0, 'ir', 'fa'), (1, 'us', 'en')) v(p, c, l) WHERE package_name = $1`, statusSignal)
	listing := func(country, lang string, ago time.Duration, score float64, ratings int64, hist [5]int64, version string) {
		exec(`INSERT INTO app_stats (application_id, country, lang, min_installs, real_installs, score, ratings, crawled_at,
			ratings_1, ratings_2, ratings_3, ratings_4, ratings_5, version)
			SELECT id, $2, $3, 100000, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 FROM apps_registry_application WHERE package_name = $1`,
			statusSignal, country, lang, ratings*10, score, ratings, statusNow.Add(-ago), hist[0], hist[1], hist[2], hist[3], hist[4], version)
	}
	listing("ir", "fa", 9*24*time.Hour, 4.30, 1900, [5]int64{100, 100, 100, 600, 1000}, "7.1")
	listing("ir", "fa", time.Hour, 4.10, 2000, [5]int64{200, 100, 100, 600, 1000}, "7.2")
	listing("us", "en", 9*24*time.Hour, 3.60, 8800, [5]int64{2000, 800, 1000, 2000, 3000}, "7.1")
	listing("us", "en", 2*time.Hour, 3.80, 9000, [5]int64{1800, 900, 1300, 2000, 3000}, "7.2")
	n := 0
	review := func(fronts []string, ago time.Duration, score int, sentiment, content string) {
		n++
		exec(`INSERT INTO reviews (application_id, review_id, user_name, score, content, at, sentiment, topics, app_version, last_synced_at)
			SELECT id, $2, 'user', $3, $4, $5, $6, ARRAY['crash'], '7.2', $7 FROM apps_registry_application WHERE package_name = $1`,
			statusSignal, fmt.Sprintf("sig%d", n), score, content, statusNow.Add(-ago), sentiment, statusNow.Add(-time.Hour))
		for _, f := range fronts {
			country, lang, _ := strings.Cut(f, "/")
			exec(`INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
				SELECT r.id, r.application_id, $2, $3, $4 FROM reviews r WHERE r.review_id = $1`,
				fmt.Sprintf("sig%d", n), country, lang, statusNow.Add(-time.Hour))
		}
	}
	review([]string{"ir/fa"}, 2*time.Hour, 1, "NEGATIVE", "برنامه کار نمی‌کند")
	review([]string{"ir/fa"}, 3*time.Hour, 2, "NEGATIVE", "پیام‌ها نمی‌رسند")
	review([]string{"ir/fa"}, 4*time.Hour, 5, "POSITIVE", "عالی")
	review([]string{"us/en"}, 2*time.Hour, 1, "NEGATIVE", "calls drop in the US")
	review([]string{"us/en"}, 5*time.Hour, 5, "POSITIVE", "great")
	review([]string{"us/en"}, 6*time.Hour, 4, "POSITIVE", "good")
	review([]string{"ir/fa", "us/en"}, 7*time.Hour, 5, "POSITIVE", "seen in both")
	// Older than 24 h: only in the app page's charts.
	review([]string{"us/en"}, 3*24*time.Hour, 1, "NEGATIVE", "old US complaint")
	seedReviewStorefronts(t, pool)
	return pool
}

// The overview shows a storefronts app once, its storefronts' numbers side
// by side; an app of one storefront looks as before (no storefront label).
func TestStatusPageOverviewStorefronts(t *testing.T) {
	t.Parallel()
	pool := newStorefrontsTestPool(t)
	insertOutcome(t, pool, statusSignal, "stats", 5*time.Minute, "not_found", ptr(404), "GET /store/apps/details: 404")
	srv := statusServer(t, pool, "", newMetricsRegistry("test"))
	code, body, _ := getPage(t, srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	// The rollups the writers' triggers kept are those a rebuild from the
	// raw rows computes: the page does not change.
	if _, err := rebuildRollups(context.Background(), pool, "", nil); err != nil {
		t.Fatal(err)
	}
	if _, again, _ := getPage(t, srv.URL+"/"); again != body {
		t.Error("the overview changed after rollup rebuild")
	}
	if got := strings.Count(body, `<a href="/apps/`+statusSignal+`"`); got != 1 {
		t.Errorf("Signal is listed %d times, want once", got)
	}
	i := strings.Index(body, `<a href="/apps/`+statusSignal+`"`)
	row := body[strings.LastIndex(body[:i], "<tr"):]
	row = row[:strings.Index(row, "</tr>")]
	if !strings.HasPrefix(row, `<tr class="multi">`) {
		t.Errorf("Signal's row is not marked multi: %.40s", row)
	}
	sf := func(label string) string { return `<span class="sf">` + label + `</span> ` }
	for _, want := range []string{
		sf("ir/fa") + `4.10<span class="unit"> ★</span>`, sf("us/en") + `3.80<span class="unit"> ★</span>`,
		sf("ir/fa") + "▼ 0.20", sf("us/en") + "▲ 0.20",
		sf("ir/fa") + "2,000", sf("us/en") + "9,000",
		sf("ir/fa") + `<span class="total">4</span> <span class="chip neg">2 negative</span> <span class="chip pos">2 positive</span> <span class="share">50 % negative</span>`,
		sf("us/en") + `<span class="total">4</span> <span class="chip neg">1 negative</span> <span class="chip pos">3 positive</span> <span class="share">25 % negative</span>`,
		// The last crawl's outcome per storefront: us/en (insertOutcome's) was not found.
		`listing: 2 h ago</div><div class="fresh ok" title="10 May 11:00 UTC">reviews: 1 h ago</div><div class="cause" title="10 May 11:55 UTC: not_found: GET /store/apps/details: 404">listing: not found on Google Play (404), 5 min ago</div>`,
	} {
		if !strings.Contains(row, want) {
			t.Errorf("Signal's row lacks %q", want)
		}
	}
	if strings.Index(row, sf("ir/fa")) > strings.Index(row, sf("us/en")) {
		t.Error("the first storefront is not first")
	}
	if got := strings.Count(row, `data-chart="spark"`); got != 2 {
		t.Errorf("%d sparklines in Signal's row, want one per storefront", got)
	}
	// Telegram (one storefront, us/en by default) as before.
	i = strings.Index(body, `<a href="/apps/`+statusTelegram+`"`)
	tg := body[strings.LastIndex(body[:i], "<tr"):]
	tg = tg[:strings.Index(tg, "</tr>")]
	if !strings.HasPrefix(tg, "<tr>") || strings.Contains(tg, `class="sf"`) || strings.Contains(tg, "% negative") {
		t.Errorf("a one-storefront app shows storefronts: %s", tg)
	}
	if !strings.Contains(tg, `<span class="total">7</span> <span class="chip neg">1 negative</span>`) {
		t.Errorf("Telegram's last 24 h from the rollup: %s", tg)
	}
}

// The app page shows one storefront (the first by default, another with
// ?storefront=), a switch between them and the storefronts compared; an
// unknown storefront is a 404 and a malformed one a 400 that name those
// the app has.
func TestStatusPageAppStorefronts(t *testing.T) {
	t.Parallel()
	pool := newStorefrontsTestPool(t)
	srv := statusServer(t, pool, "", newMetricsRegistry("test"))
	base := srv.URL + "/apps/" + statusSignal

	page := func(query string) string {
		t.Helper()
		code, body, _ := getPage(t, base+query)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", query, code, body)
		}
		return body
	}
	fact := func(body, label string) string {
		m := regexp.MustCompile(`<dt>` + label + `</dt><dd dir="auto">([^<]*)</dd>`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return m[1]
	}
	negatives := func(body string) []string {
		sec := body[strings.Index(body, `id="negative"`):]
		sec = sec[:strings.Index(sec, "</section>")]
		var out []string
		for _, m := range regexp.MustCompile(`<p dir="auto">([^<]*)</p>`).FindAllStringSubmatch(sec, -1) {
			out = append(out, m[1])
		}
		return out
	}
	for _, tc := range []struct {
		query, front, score, ratings string
		negative                     []string
		reviewBars, histogram        int
	}{
		{"", "ir/fa", "4.10", "2,000", []string{"برنامه کار نمی‌کند", "پیام‌ها نمی‌رسند"}, 2, 5},
		{"?storefront=ir-fa", "ir/fa", "4.10", "2,000", []string{"برنامه کار نمی‌کند", "پیام‌ها نمی‌رسند"}, 2, 5},
		// Per day and sentiment: ir/fa today 2 negative, 2 positive (2
		// segments); us/en today 1 negative, 3 positive, 3 days ago 1 negative.
		{"?storefront=us-en", "us/en", "3.80", "9,000", []string{"calls drop in the US", "old US complaint"}, 3, 5},
	} {
		body := page(tc.query)
		if got := fact(body, "Score"); got != tc.score {
			t.Errorf("%q: score %q, want %q", tc.query, got, tc.score)
		}
		if got := fact(body, "Ratings"); got != tc.ratings {
			t.Errorf("%q: ratings %q, want %q", tc.query, got, tc.ratings)
		}
		if got := negatives(body); strings.Join(got, "|") != strings.Join(tc.negative, "|") {
			t.Errorf("%q: negative reviews %q, want %q", tc.query, got, tc.negative)
		}
		if got := chartPoints(body, "reviews"); got != tc.reviewBars {
			t.Errorf("%q: reviews chart %d points, want %d", tc.query, got, tc.reviewBars)
		}
		if got := chartPoints(body, "histogram"); got != tc.histogram {
			t.Errorf("%q: histogram %d points, want %d", tc.query, got, tc.histogram)
		}
		if got := chartPoints(body, "rating"); got != 2 {
			t.Errorf("%q: rating chart %d points, want the storefront's 2", tc.query, got)
		}
		if !strings.Contains(body, `class="sf-link current" aria-current="page">`+tc.front+`</a>`) {
			t.Errorf("%q: the switch does not mark %s", tc.query, tc.front)
		}
		for _, l := range []string{"ir-fa", "us-en"} {
			if !strings.Contains(body, `href="/apps/`+statusSignal+`?storefront=`+l+`"`) {
				t.Errorf("%q: no switch link to %s", tc.query, l)
			}
		}
		// The comparison block: both storefronts' newest score and ratings,
		// and the share of 5 stars in each histogram (1,000 of 2,000; 3,000 of 9,000).
		cmp := body[strings.Index(body, `<table class="compare">`):]
		cmp = cmp[:strings.Index(cmp, "</table>")]
		for _, want := range []string{">4.10</td>", ">3.80</td>", ">2,000</td>", ">9,000</td>", `title="5 ★: 1,000 (50 %)"`, `title="5 ★: 3,000 (33 %)"`} {
			if !strings.Contains(cmp, want) {
				t.Errorf("%q: the comparison lacks %q", tc.query, want)
			}
		}
		topics, _ := tableIn(t, body, "topics")
		if tc.front == "ir/fa" && !strings.Contains(topics, `<td data-label="Topic">crash</td><td data-label="Reviews" class="num">4</td><td data-label="Negative" class="num">2</td>`) ||
			tc.front == "us/en" && !strings.Contains(topics, `<td data-label="Topic">crash</td><td data-label="Reviews" class="num">5</td><td data-label="Negative" class="num">2</td>`) {
			t.Errorf("%q: topics of the storefront: %s", tc.query, topics)
		}
	}

	for _, tc := range []struct {
		query string
		code  int
	}{{"?storefront=de-de", http.StatusNotFound}, {"?storefront=usen", http.StatusBadRequest}, {"?storefront=us-%3Cb%3E", http.StatusBadRequest}} {
		code, body, _ := getPage(t, base+tc.query)
		if code != tc.code || !strings.Contains(body, "this app has ir/fa, us/en") || strings.Contains(body, "<b>") {
			t.Errorf("%s: %d, want %d naming the storefronts:\n%s", tc.query, code, tc.code, body)
		}
	}

	// Its links to the reviews page name the storefront shown.
	_, body, _ := getPage(t, reviewsPageServer(t, pool, "").URL+"/apps/"+statusSignal+"?storefront=us-en")
	if want := `<a href="/reviews?package=` + statusSignal + `&amp;sentiment=NEGATIVE&amp;country=us&amp;lang=en">negative</a>`; !strings.Contains(body, want) {
		t.Errorf("the app page lacks %s", want)
	}

	// An app of one storefront: no switch, no comparison; its default
	// storefront (us/en) is the one ?storefront= may name.
	_, body, _ = getPage(t, srv.URL+"/apps/"+statusTelegram)
	if strings.Contains(body, `class="storefronts"`) || strings.Contains(body, `class="compare"`) {
		t.Error("a one-storefront app has a storefront switch or comparison")
	}
	if code, _, _ := getPage(t, srv.URL+"/apps/"+statusTelegram+"?storefront=us-en"); code != http.StatusOK {
		t.Errorf("Telegram in its default storefront: %d", code)
	}
	if code, body, _ := getPage(t, srv.URL+"/apps/"+statusTelegram+"?storefront=ir-fa"); code != http.StatusNotFound || !strings.Contains(body, "this app has us/en") {
		t.Errorf("Telegram in ir/fa: %d\n%s", code, body)
	}
}

// tableIn is the <table class="class"> of a page, "" if it has none.
func tableIn(t *testing.T, body, class string) (string, bool) {
	t.Helper()
	i := strings.Index(body, `<table class="`+class+`">`)
	if i < 0 {
		return "", false
	}
	return body[i : i+strings.Index(body[i:], "</table>")], true
}

// seedReviewStorefronts records every review a test inserted without a
// storefront in its app's first storefront (registered, else its default,
// as migration 16 does); the rollups' triggers count it there.
func seedReviewStorefronts(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	poolExec(t, ctx, pool)(`INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		SELECT r.id, r.application_id, coalesce(f.country, CASE WHEN a.is_iranian_app THEN 'ir' ELSE 'us' END),
			coalesce(f.lang, CASE WHEN a.is_iranian_app THEN 'fa' ELSE 'en' END), r.first_seen_at
		FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id
		LEFT JOIN app_storefronts f ON f.application_id = a.id AND f.position = 0
		WHERE NOT EXISTS (SELECT 1 FROM review_storefronts s WHERE s.review_id = r.id)`)
}
