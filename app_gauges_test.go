package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// gaugeKey is a per-app sample as scrapeMetrics keys it: labels in name
// order (country, lang, package, then review_topic or sentiment).
func gaugeKey(name, pkg, country, lang string, extra ...string) string {
	labels := []string{`country="` + country + `"`, `lang="` + lang + `"`, `package="` + pkg + `"`}
	for i := 0; i+1 < len(extra); i += 2 {
		labels = append(labels, extra[i]+`="`+extra[i+1]+`"`)
	}
	return name + "{" + strings.Join(labels, ",") + "}"
}

// gaugeServer serves the status page's /metrics on pool with the test
// storefront defaults (us/en, Iranian apps ir/fa).
func gaugeServer(t *testing.T, pool *pgxpool.Pool) (string, *statusPage) {
	t.Helper()
	srv, page := statusPageServer(t, pool, "", newMetricsRegistry("test"))
	return srv.URL, page
}

// wantGauges compares a scrape with want and wants none of absent.
func wantGauges(t *testing.T, m map[string]float64, want map[string]float64, absent ...string) {
	t.Helper()
	for k, w := range want {
		if got, ok := m[k]; !ok || got != w {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, w)
		}
	}
	for _, k := range absent {
		if v, ok := m[k]; ok {
			t.Errorf("%s = %v, want no such series", k, v)
		}
	}
}

func TestAppGaugesInMetrics(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedStatus(t, pool)
	seedReviewStorefronts(t, pool)
	base, page := gaugeServer(t, pool)
	score := gaugeKey("playwatch_app_score", statusTelegram, "us", "en")
	// A scrape serves the last background read, never a query of its own:
	// before the first one there is none.
	m := scrapeMetrics(t, base)
	if _, ok := m[score]; ok || m["playwatch_app_gauges_up"] != 0 {
		t.Errorf("gauges before the first refresh: up %v", m["playwatch_app_gauges_up"])
	}
	page.appGauges.refresh(t.Context())
	page.now = func() time.Time { return statusNow.Add(45 * time.Second) }
	m = scrapeMetrics(t, base)
	tg := func(name string, extra ...string) string { return gaugeKey(name, statusTelegram, "us", "en", extra...) }
	bale := func(name string, extra ...string) string { return gaugeKey(name, statusBale, "us", "en", extra...) }
	wantGauges(t, m, map[string]float64{
		score:                          4.32,
		tg("playwatch_app_ratings"):    1234567,
		tg("playwatch_app_installs"):   1000000123,
		bale("playwatch_app_installs"): 5000000, // min_installs: no exact count
		tg("playwatch_app_reviews", "sentiment", "POSITIVE"): 2,
		tg("playwatch_app_reviews", "sentiment", "NEGATIVE"): 3,
		tg("playwatch_app_reviews", "sentiment", "NEUTRAL"):  1,
		tg("playwatch_app_reviews", "sentiment", "none"):     3,
		bale("playwatch_app_reviews", "sentiment", "none"):   0,
		tg("playwatch_app_newest_review_timestamp_seconds"):  float64(statusNow.Add(-2 * time.Hour).Unix()),
		bale("playwatch_app_negative_reviews_1h"):            0,
		bale("playwatch_app_negative_reviews_7d"):            0,
		`playwatch_app_gauges_up`:                            1,
		`playwatch_app_gauges_age_seconds`:                   45,
	}, bale("playwatch_app_newest_review_timestamp_seconds"))
	// A soft-deleted app leaves the gauges at the next background read,
	// which the loop makes on its own.
	if _, err := pool.Exec(context.Background(), `UPDATE apps_registry_application SET is_active = false WHERE package_name = $1`, statusBale); err != nil {
		t.Fatal(err)
	}
	if _, ok := scrapeMetrics(t, base)[bale("playwatch_app_score")]; !ok {
		t.Error("a scrape read the database: the inactive app left before a refresh")
	}
	page.appGauges.refreshEvery = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- page.appGauges.run(ctx) }()
	waitFor(t, 10*time.Second, "the refresh loop to drop the inactive app", func() bool {
		_, ok := scrapeMetrics(t, base)[bale("playwatch_app_score")]
		return !ok
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

// The negative-review spike alert's gauges: NEGATIVE reviews whose time on
// the store is within the last hour and 7 days, to the minute although the
// rollup counts whole hours.
func TestAppGaugesNegativeReviews(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedStatus(t, pool) // NEGATIVE 4 h, 5 days and 5 days 1 h ago
	for i, r := range []struct {
		ago       time.Duration
		sentiment *string
	}{
		{30 * time.Minute, ptr("NEGATIVE")},
		{59 * time.Minute, ptr("NEGATIVE")},
		{61 * time.Minute, ptr("NEGATIVE")}, // the hour before: 7 days only
		{10 * time.Minute, nil},             // 1 star, not scored: not counted
		{20 * time.Minute, ptr("POSITIVE")}, // not negative
		{8 * 24 * time.Hour, ptr("NEGATIVE")},
		{7*24*time.Hour + time.Minute, ptr("NEGATIVE")}, // older than 7 days, in the window's first hour
		{-10 * time.Minute, ptr("NEGATIVE")},            // after now (a skewed clock)
		{7*24*time.Hour - time.Minute, ptr("NEGATIVE")},
	} {
		if _, err := pool.Exec(context.Background(), `INSERT INTO reviews (application_id, review_id, score, content, at, sentiment, last_synced_at)
			SELECT id, $2, 1, 'bad', $3, $4, $3 FROM apps_registry_application WHERE package_name = $1`,
			statusTelegram, fmt.Sprintf("neg%d", i), statusNow.Add(-r.ago), r.sentiment); err != nil {
			t.Fatal(err)
		}
	}
	seedReviewStorefronts(t, pool)
	base, page := gaugeServer(t, pool)
	// On the hour and 20 minutes past it: the windows' ends fall inside a
	// bucket, or on its edge.
	for _, now := range []time.Time{statusNow, statusNow.Add(20 * time.Minute)} {
		page.now = func() time.Time { return now }
		page.appGauges.refresh(t.Context())
		m := scrapeMetrics(t, base)
		// 30, 59 min; 3 seeded + 30, 59, 61 min and 7 days less a minute.
		// 20 minutes on, 30 min and the one 10 minutes ahead; the 7 days
		// gain that one and lose the one a minute short of 7 days.
		want1h, want7d := 2.0, 7.0
		wantGauges(t, m, map[string]float64{
			gaugeKey("playwatch_app_negative_reviews_1h", statusTelegram, "us", "en"): want1h,
			gaugeKey("playwatch_app_negative_reviews_7d", statusTelegram, "us", "en"): want7d,
			gaugeKey("playwatch_app_negative_reviews_1h", statusBale, "us", "en"):     0,
		})
	}
}

// One app in three storefronts: each has its own listing, its own reviews
// (a review seen in two storefronts counts in both), windows and topics; a
// storefront with nothing stored yet has zeros and no listing; an app
// registered without storefronts is shown in its default one only. The
// sentiment job's label moves a review's count, and `rollup rebuild` gives
// the same numbers as the rollups kept by the writers.
func TestAppGaugesPerStorefront(t *testing.T) {
	pool := newTestPool(t)
	ctx := context.Background()
	const multi, iranian = "com.example.fronts", "com.example.iranian"
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO apps_registry_application (package_name, is_iranian_app) VALUES ($1, false), ($2, true)`, multi, iranian)
	exec(`INSERT INTO app_storefronts (application_id, position, country, lang)
		SELECT id, p, c, l FROM apps_registry_application, (VALUES (0, 'ir', 'fa'), (1, 'us', 'en'), (2, 'de', 'de')) v(p, c, l)
		WHERE package_name = $1`, multi)
	now := statusNow.Add(17 * time.Minute)
	listing := func(pkg, country, lang string, ago time.Duration, score float64, ratings int64, real, min *int64) {
		exec(`INSERT INTO app_stats (application_id, country, lang, score, ratings, real_installs, min_installs, crawled_at)
			SELECT id, $2, $3, $4, $5, $6, $7, $8 FROM apps_registry_application WHERE package_name = $1`,
			pkg, country, lang, score, ratings, real, min, now.Add(-ago))
	}
	listing(multi, "ir", "fa", 26*time.Hour, 4.3, 90, ptr[int64](4000), ptr[int64](1000))
	listing(multi, "ir", "fa", 2*time.Hour, 4.1, 100, ptr[int64](5000), ptr[int64](1000))
	listing(multi, "us", "en", 30*time.Minute, 3.8, 200, nil, ptr[int64](1000000))
	listing(iranian, "ir", "fa", time.Hour, 4.9, 7, nil, ptr[int64](100))
	listing(iranian, "us", "en", time.Hour, 1.0, 1, nil, ptr[int64](1)) // not one of its storefronts
	n := 0
	review := func(pkg string, ago time.Duration, sentiment *string, topics []string, fronts ...string) {
		t.Helper()
		n++
		id := fmt.Sprintf("r%d", n)
		exec(`INSERT INTO reviews (application_id, review_id, score, content, at, sentiment, topics, last_synced_at)
			SELECT id, $2, 3, 'text', $3, $4, $5, $3 FROM apps_registry_application WHERE package_name = $1`,
			pkg, id, now.Add(-ago), sentiment, topics)
		for _, f := range fronts {
			country, lang, _ := strings.Cut(f, "/")
			exec(`INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
				SELECT id, application_id, $2, $3, $4 FROM reviews WHERE review_id = $1`, id, country, lang, now)
		}
	}
	neg, pos, neu := ptr("NEGATIVE"), ptr("POSITIVE"), ptr("NEUTRAL")
	review(multi, 10*time.Minute, neg, []string{"crash"}, "ir/fa", "us/en")
	review(multi, 50*time.Minute, neg, []string{"crash", "login"}, "ir/fa")
	review(multi, 70*time.Minute, neg, nil, "ir/fa")
	review(multi, 3*24*time.Hour, neg, []string{"ads"}, "us/en")
	review(multi, 7*24*time.Hour-10*time.Minute, neg, []string{"login"}, "ir/fa") // in the window's first, partial hour
	review(multi, 7*24*time.Hour+10*time.Minute, neg, []string{"login"}, "ir/fa") // that hour, before the window
	review(multi, 2*24*time.Hour, pos, []string{"ui"}, "ir/fa", "us/en")
	review(multi, 30*24*time.Hour, neu, []string{}, "us/en")
	review(multi, 5*time.Minute, nil, nil, "us/en")
	review(iranian, 3*time.Hour, pos, nil, "ir/fa")

	base, page := gaugeServer(t, pool)
	page.now = func() time.Time { return now }
	key := func(name, front string, extra ...string) string {
		pkg := multi
		if strings.HasPrefix(front, "iranian ") {
			pkg, front = iranian, strings.TrimPrefix(front, "iranian ")
		}
		country, lang, _ := strings.Cut(front, "/")
		return gaugeKey(name, pkg, country, lang, extra...)
	}
	want := map[string]float64{
		key("playwatch_app_score", "ir/fa"):                                     4.1,
		key("playwatch_app_ratings", "ir/fa"):                                   100,
		key("playwatch_app_installs", "ir/fa"):                                  5000,
		key("playwatch_app_score", "us/en"):                                     3.8,
		key("playwatch_app_ratings", "us/en"):                                   200,
		key("playwatch_app_installs", "us/en"):                                  1000000,
		key("playwatch_app_reviews", "ir/fa", "sentiment", "POSITIVE"):          1,
		key("playwatch_app_reviews", "ir/fa", "sentiment", "NEUTRAL"):           0,
		key("playwatch_app_reviews", "ir/fa", "sentiment", "NEGATIVE"):          5,
		key("playwatch_app_reviews", "ir/fa", "sentiment", "none"):              0,
		key("playwatch_app_reviews", "us/en", "sentiment", "POSITIVE"):          1,
		key("playwatch_app_reviews", "us/en", "sentiment", "NEUTRAL"):           1,
		key("playwatch_app_reviews", "us/en", "sentiment", "NEGATIVE"):          2,
		key("playwatch_app_reviews", "us/en", "sentiment", "none"):              1,
		key("playwatch_app_reviews", "de/de", "sentiment", "NEGATIVE"):          0,
		key("playwatch_app_reviews", "de/de", "sentiment", "none"):              0,
		key("playwatch_app_negative_reviews_1h", "ir/fa"):                       2,
		key("playwatch_app_negative_reviews_7d", "ir/fa"):                       4,
		key("playwatch_app_negative_reviews_1h", "us/en"):                       1,
		key("playwatch_app_negative_reviews_7d", "us/en"):                       2,
		key("playwatch_app_negative_reviews_1h", "de/de"):                       0,
		key("playwatch_app_negative_reviews_7d", "de/de"):                       0,
		key("playwatch_app_topic_reviews_7d", "ir/fa", "review_topic", "crash"): 2,
		key("playwatch_app_topic_reviews_7d", "ir/fa", "review_topic", "login"): 2,
		key("playwatch_app_topic_reviews_7d", "ir/fa", "review_topic", "ui"):    1,
		key("playwatch_app_topic_reviews_7d", "ir/fa", "review_topic", "ads"):   0,
		key("playwatch_app_topic_reviews_7d", "us/en", "review_topic", "crash"): 1,
		key("playwatch_app_topic_reviews_7d", "us/en", "review_topic", "ads"):   1,
		key("playwatch_app_topic_reviews_7d", "us/en", "review_topic", "login"): 0,
		key("playwatch_app_topic_reviews_7d", "de/de", "review_topic", "crash"): 0,
		key("playwatch_app_newest_review_timestamp_seconds", "ir/fa"):           float64(now.Add(-10 * time.Minute).Unix()),
		key("playwatch_app_newest_review_timestamp_seconds", "us/en"):           float64(now.Add(-5 * time.Minute).Unix()),
		key("playwatch_app_score", "iranian ir/fa"):                             4.9,
		key("playwatch_app_reviews", "iranian ir/fa", "sentiment", "POSITIVE"):  1,
	}
	absent := []string{
		key("playwatch_app_score", "de/de"), key("playwatch_app_newest_review_timestamp_seconds", "de/de"),
		key("playwatch_app_score", "iranian us/en"), key("playwatch_app_reviews", "iranian us/en", "sentiment", "none"),
	}
	page.appGauges.refresh(ctx)
	m := scrapeMetrics(t, base)
	wantGauges(t, m, want, absent...)
	if t.Failed() {
		t.Fatalf("the per-storefront gauges:\n%s", gaugeLines(m))
	}

	// The sentiment job labels the unscored us/en review NEGATIVE: it moves
	// from none to NEGATIVE there, and into us/en's last hour.
	exec(`UPDATE reviews SET sentiment = 'NEGATIVE', topics = '{crash}' WHERE review_id = 'r9'`)
	want[key("playwatch_app_reviews", "us/en", "sentiment", "none")] = 0
	want[key("playwatch_app_reviews", "us/en", "sentiment", "NEGATIVE")] = 3
	want[key("playwatch_app_negative_reviews_1h", "us/en")] = 2
	want[key("playwatch_app_negative_reviews_7d", "us/en")] = 3
	want[key("playwatch_app_topic_reviews_7d", "us/en", "review_topic", "crash")] = 2
	page.appGauges.refresh(ctx)
	wantGauges(t, scrapeMetrics(t, base), want, absent...)

	// Rebuilt from the raw tables, the rollups give the same numbers.
	exec(`DELETE FROM review_rollup_hourly; DELETE FROM review_topic_rollup_hourly; DELETE FROM review_rollup_totals`)
	page.appGauges.refresh(ctx)
	if got := scrapeMetrics(t, base)[key("playwatch_app_negative_reviews_7d", "ir/fa")]; got == 4 {
		t.Fatal("the 7-day gauge did not read the rollup: it has its count with the rollup emptied")
	}
	if _, err := rebuildRollups(ctx, pool, "", nil); err != nil {
		t.Fatal(err)
	}
	page.appGauges.refresh(ctx)
	wantGauges(t, scrapeMetrics(t, base), want, absent...)
}

// playwatch_app_topic_reviews_7d counts each active app's reviews of the
// last 7 days per topic in its storefront, every topic present (0
// included).
func TestAppGaugesTopics(t *testing.T) {
	pool := newTestPool(t)
	seedStatus(t, pool)
	ctx := context.Background()
	insertTopicReviews(t, ctx, poolExec(t, ctx, pool))
	seedReviewStorefronts(t, pool)
	base, page := gaugeServer(t, pool)
	page.appGauges.refresh(t.Context())
	m := scrapeMetrics(t, base)
	topic := func(pkg, topic string) string {
		return gaugeKey("playwatch_app_topic_reviews_7d", pkg, "us", "en", "review_topic", topic)
	}
	wantGauges(t, m, map[string]float64{
		topic(statusTelegram, "crash"):   4,
		topic(statusTelegram, "ads"):     2,
		topic(statusTelegram, "update"):  1,
		topic(statusTelegram, "battery"): 0,
		topic(statusBale, "crash"):       0,
	})
	n := 0
	for k := range m {
		if strings.HasPrefix(k, "playwatch_app_topic_reviews_7d{") {
			n++
		}
	}
	if n != 2*len(reviewTopics) {
		t.Errorf("%d topic series, want %d: every topic of both apps", n, 2*len(reviewTopics))
	}
}

// gaugeLines are the per-app samples of a scrape, for a failure message.
func gaugeLines(m map[string]float64) string {
	var b strings.Builder
	for k, v := range m {
		if strings.HasPrefix(k, "playwatch_app_") {
			fmt.Fprintf(&b, "%s %v\n", k, v)
		}
	}
	return b.String()
}

// The gauges' database going away fails no scrape: up drops to 0, the last
// values stay for three refresh intervals, then go.
func TestAppGaugesDatabaseDown(t *testing.T) {
	pool := newTestPool(t)
	seedStatus(t, pool)
	base, page := gaugeServer(t, pool)
	page.appGauges.refresh(t.Context())
	pool.Close()
	score := gaugeKey("playwatch_app_score", statusTelegram, "us", "en")
	for _, tc := range []struct {
		after time.Duration
		kept  bool
	}{{time.Minute, true}, {2 * time.Minute, false}} {
		page.now = func() time.Time { return statusNow.Add(tc.after) }
		page.appGauges.refresh(t.Context())
		m := scrapeMetrics(t, base)
		if m["playwatch_app_gauges_up"] != 0 || m["playwatch_build_info{version=\"test\"}"] != 1 {
			t.Fatalf("up %v, build_info %v", m["playwatch_app_gauges_up"], m["playwatch_build_info{version=\"test\"}"])
		}
		if _, ok := m[score]; ok != tc.kept || m["playwatch_app_gauges_age_seconds"] != tc.after.Seconds() {
			t.Errorf("%v after the last read: score present %v, want %v; age %v", tc.after, ok, tc.kept, m["playwatch_app_gauges_age_seconds"])
		}
	}
}
