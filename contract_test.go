package main

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// recordedDetailsPages are the recorded details pages, by package.
var recordedDetailsPages = map[string]string{
	"com.mojang.minecraftpe":            "details_com.mojang.minecraftpe_en_us.html",
	"com.google.android.apps.translate": "details_com.google.android.apps.translate_en_us.html",
	"com.adex77.WhereAmI":               "details_com.adex77.WhereAmI_en_us.html",
	"com.raiseright.edumarketapp":       "details_com.raiseright.edumarketapp_en.html",
	"com.youngkiu.stock_knee_shoulder":  "details_com.youngkiu.stock_knee_shoulder_ko.html",
}

// The fields added to the contracts go from the recorded pages to the
// columns: a crawl of a replay Play Store serving the five recorded details
// pages and the two recorded reviews pages, through the broker and the
// storage consumer, fills the new app_stats and reviews columns with the
// values of expected_values.json (NULL where a page lacks them).
func TestConsumerStoresNewFieldsOfRecordedPages(t *testing.T) {
	t.Parallel()
	const translate = "com.google.android.apps.translate"
	replay := newReplayPlayStore(t)
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	for pkg, page := range recordedDetailsPages {
		replay.setApp(pkg, replayApp{DetailsPage: readPlaystoreFixture(t, page), Reviews: -1})
		registerApps(t, pool, pkg)
	}
	replay.useFixtureReviews(translate)
	_, brokers := newTestBroker(t, t.TempDir())
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir(),
		"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "1000", "LOG_LEVEL": "warn"}
	var errOut bytes.Buffer
	if err := run(context.Background(), []string{"crawl", "--once"}, envFunc(env), &bytes.Buffer{}, &errOut); err != nil {
		t.Fatalf("playwatch crawl --once: %v\n%s", err, errOut.String())
	}
	startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 30*time.Second, "the crawl's rows", func() bool {
		return count(t, pool, `SELECT count(*) FROM app_stats`) == len(recordedDetailsPages) && count(t, pool, `SELECT count(*) FROM reviews`) == 300
	})

	exp := expectedValues(t)
	for pkg, page := range recordedDetailsPages {
		e := exp[page]
		var real *int64
		var hist [5]*int64
		var developer, changes *string
		var released *time.Time
		if err := pool.QueryRow(context.Background(), `SELECT s.real_installs, s.ratings_1, s.ratings_2, s.ratings_3, s.ratings_4, s.ratings_5,
			s.developer, s.released_at, s.recent_changes
			FROM app_stats s JOIN apps_registry_application a ON a.id = s.application_id WHERE a.package_name = $1`, pkg).Scan(
			&real, &hist[0], &hist[1], &hist[2], &hist[3], &hist[4], &developer, &released, &changes); err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		var wantHist [5]*int64
		if h, ok := e["histogram"].([]any); ok {
			for i, n := range h {
				v := int64(n.(float64))
				wantHist[i] = &v
			}
		}
		var wantReleased *time.Time
		if r, ok := e["releasedAt"].([]any); ok {
			at := time.Unix(int64(r[0].(float64)), int64(r[1].(float64)))
			wantReleased = &at
		}
		html, ok := e["recentChanges"].(string)
		if !ok {
			t.Fatalf("%s: expected_values.json has no recentChanges text", pkg)
		}
		switch {
		case real == nil || float64(*real) != e["realInstalls"]:
			t.Errorf("%s: real_installs %v, want %v", pkg, deref(real), e["realInstalls"])
		case !reflect.DeepEqual(hist, wantHist):
			t.Errorf("%s: ratings_1..5 %v, want %v", pkg, derefAll(hist[:]), e["histogram"])
		case developer == nil || *developer != e["developer"]:
			t.Errorf("%s: developer %v, want %v", pkg, deref(developer), e["developer"])
		case (released == nil) != (wantReleased == nil) || released != nil && !released.Equal(*wantReleased):
			t.Errorf("%s: released_at %v, want %v", pkg, deref(released), deref(wantReleased))
		case changes == nil || *changes != *recentChangesText(&html) || strings.Count(*changes, "\n") != strings.Count(html, "<br>"):
			t.Errorf("%s: recent_changes %v, from the page's %q", pkg, deref(changes), html)
		}
	}

	// The reviews: each page's count of replies and of reviews without an
	// app version, and its first replied review field by field.
	wantReplied, wantNoVersion := 0, 0
	for _, p := range []string{"page1", "page2"} {
		e := exp["reviews_UsvDTd_com.google.android.apps.translate_en_us_"+p+".txt"]
		wantReplied += int(e["with_reply"].(float64))
		wantNoVersion += int(e["with_null_version"].(float64))
		for _, r := range []map[string]any{e["first"].(map[string]any), e["first_with_reply"].(map[string]any)} {
			var reply, version *string
			var replied *time.Time
			if err := pool.QueryRow(context.Background(), `SELECT reply_content, replied_at, app_version FROM reviews WHERE review_id = $1`,
				r["reviewId"]).Scan(&reply, &replied, &version); err != nil {
				t.Fatalf("review %v: %v", r["reviewId"], err)
			}
			var wantReplied any
			if at, ok := r["repliedAt"].([]any); ok {
				wantReplied = time.Unix(int64(at[0].(float64)), int64(at[1].(float64))).UTC().Format(time.RFC3339Nano)
			}
			got := map[string]any{"replyContent": deref(reply), "repliedAt": nil, "reviewCreatedVersion": deref(version)}
			if replied != nil {
				got["repliedAt"] = replied.UTC().Format(time.RFC3339Nano)
			}
			want := map[string]any{"replyContent": r["replyContent"], "repliedAt": wantReplied, "reviewCreatedVersion": r["reviewCreatedVersion"]}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("review %v:\n got %v\nwant %v", r["reviewId"], got, want)
			}
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE reply_content IS NOT NULL AND replied_at IS NOT NULL`); n != wantReplied {
		t.Errorf("%d reviews with a reply, want %d", n, wantReplied)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE app_version IS NULL`); n != wantNoVersion {
		t.Errorf("%d reviews without an app version, want %d", n, wantNoVersion)
	}
}

// deref is *p, or nil.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func derefAll[T any](ps []*T) []any {
	out := make([]any, len(ps))
	for i, p := range ps {
		out[i] = deref(p)
	}
	return out
}

// Messages exactly as a playwatch from before the new fields wrote them
// (its encoders, for the recorded Minecraft page crawled at
// 2026-07-07T10:00:00.123456Z and the first replied review of the recorded
// Translate page): they lack real_installs … recent_changes and
// reply_content, replied_at, app_version.
const (
	olderAppStatsMessage = `{"package_name":"com.mojang.minecraftpe","title":"Minecraft: Dream it, Build it!","genre":"Arcade",` +
		`"min_installs":50000000,"score":4.315863,"ratings":5715302,"reviews_count":633450,"version":"1.26.32.2","ad_supported":false,` +
		`"app_updated_at":"2026-06-24T22:04:44Z","crawled_at":"2026-07-07T10:00:00.123456Z"}`
	olderReviewMessage = `{"package_name":"com.google.android.apps.translate","review_id":"5219798f-004e-4171-8477-de05baae134d",` +
		`"user_name":"Baran Akbar","thumbs_up_count":0,"score":1,` +
		`"content":"what is wrong with this update? I can no longer manually select lines in the scanning tool",` +
		`"at":"2026-07-06T07:02:46.957Z","crawled_at":"2026-07-07T10:00:00Z"}`
)

// The contracts are backward compatible: a consumer of this version reads
// the topics an older playwatch wrote, stores those messages with NULL in
// the new columns, and a later crawl by this version fills them; the
// review's reply arrives with the newer crawl, through the monotonic guard.
func TestConsumerReadsMessagesOfAnOlderPlaywatch(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	brokers := newConsumerTestBroker(t)
	const minecraft, translate = "com.mojang.minecraftpe", "com.google.android.apps.translate"
	registerApps(t, pool, minecraft, translate)
	produce(t, brokers, rec(topicAppStats, minecraft, []byte(olderAppStatsMessage)), rec(topicReviews, translate, []byte(olderReviewMessage)))
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 30*time.Second, "the older messages", func() bool {
		return count(t, pool, `SELECT (SELECT count(*) FROM app_stats) + (SELECT count(*) FROM reviews)`) == 2
	})
	if n := count(t, pool, `SELECT count(*) FROM app_stats WHERE min_installs = 50000000 AND ratings = 5715302 AND version = '1.26.32.2'
		AND crawled_at = '2026-07-07T10:00:00.123456Z' AND num_nulls(real_installs, ratings_1, ratings_2, ratings_3, ratings_4, ratings_5,
		developer, released_at, recent_changes) = 9`); n != 1 {
		t.Errorf("the older app-stats message is not stored with NULL in the new columns")
	}
	const reviewID = "5219798f-004e-4171-8477-de05baae134d"
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE review_id = $1 AND user_name = 'Baran Akbar' AND score = 1
		AND num_nulls(reply_content, replied_at, app_version) = 3`, reviewID); n != 1 {
		t.Errorf("the older review message is not stored with NULL in the new columns")
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters", n)
	}

	// The same app and review crawled a day later by this version.
	d, err := parseDetailsPage(readPlaystoreFixture(t, recordedDetailsPages[minecraft]))
	if err != nil {
		t.Fatal(err)
	}
	later := time.Date(2026, 7, 8, 10, 0, 0, 0, time.UTC)
	d.PackageName, d.FetchedAt = minecraft, later
	page, err := parseReviewsAnswer(readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt"), "UsvDTd")
	if err != nil {
		t.Fatal(err)
	}
	var newer reviewMessage
	for _, r := range page.Reviews {
		if r.ReviewID == reviewID {
			r.FetchedAt = later
			newer = reviewMessageFrom(translate, testLocales.Default, r)
		}
	}
	value, err := newer.encodeJSON()
	if err != nil {
		t.Fatal(err)
	}
	stats, err := json.Marshal(appStatsFromDetails(d, testLocales.Default))
	if err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, rec(topicAppStats, minecraft, stats), rec(topicReviews, translate, value))
	waitFor(t, 30*time.Second, "the newer crawl", func() bool {
		return count(t, pool, `SELECT count(*) FROM app_stats`) == 2 &&
			count(t, pool, `SELECT count(*) FROM reviews WHERE last_synced_at = $1`, later) == 1
	})
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM app_stats WHERE crawled_at = $1 AND real_installs = 91130079 AND ratings_5 = 4194160
		AND developer = 'Mojang' AND released_at IS NOT NULL AND recent_changes IS NOT NULL`, later); n != 1 {
		t.Errorf("the newer app-stats message did not fill the new columns")
	}
	checkStoredReply(t, pool, reviewID, *newer.ReplyContent, *newer.RepliedAt, *newer.AppVersion)
}

// checkStoredReply checks a review row's reply and app version.
func checkStoredReply(t *testing.T, pool *pgxpool.Pool, id, reply string, repliedAt time.Time, version string) {
	t.Helper()
	var gotReply, gotVersion *string
	var gotAt *time.Time
	if err := pool.QueryRow(context.Background(), `SELECT reply_content, replied_at, app_version FROM reviews WHERE review_id = $1`, id).Scan(
		&gotReply, &gotAt, &gotVersion); err != nil {
		t.Fatal(err)
	}
	if deref(gotReply) != reply || gotAt == nil || !gotAt.Equal(repliedAt) || deref(gotVersion) != version {
		t.Errorf("review %s: reply %v at %v, version %v; want %q at %s, %q", id, deref(gotReply), deref(gotAt), deref(gotVersion), reply, repliedAt, version)
	}
}

// Each topic's contract covers its table: every column of the table that
// the consumer owns is a column of the contract's staging table, and every
// staging column is one of the table's. A column added to schema.sql
// without its contract, or the reverse, fails here.
func TestContractsCoverTheirTables(t *testing.T) {
	pool := newTestPool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := ensureStagingTables(ctx, conn.Conn().PgConn()); err != nil {
		t.Fatal(err)
	}
	columns := func(table string) []string {
		rows, err := conn.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attname`, table)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	// Columns the database or another job writes.
	notConsumers := map[string]bool{"id": true, "reviews.sentiment": true, "reviews.first_seen_at": true,
		"reviews.sentiment_model": true, "reviews.sentiment_at": true, "reviews.sentiment_text_hash": true}
	notConsumers["reviews.topics"] = true    // the sentiment job's (migration 13)
	notConsumers["reviews.text_lang"] = true // the sentiment job's (migration 12)
	topics := map[string]bool{}
	for _, c := range contracts {
		topics[c.topicName()] = true
		var owned []string
		for _, col := range columns(c.tableName()) {
			if !notConsumers[col] && !notConsumers[c.tableName()+"."+col] {
				owned = append(owned, col)
			}
		}
		if staged := columns("playwatch_stage_" + c.tableName()); !slices.Equal(staged, owned) {
			t.Errorf("%s: the contract stages\n%v\nthe table has\n%v", c.topicName(), staged, owned)
		}
	}
	if len(topics) != 3 || !topics[topicAppStats] || !topics[topicReviews] || !topics[topicNetworkMetrics] || len(allTopics) != 3 {
		t.Errorf("contracts for %v, topics %v", topics, allTopics)
	}
}
