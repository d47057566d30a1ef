package main

// The end-to-end scenario of the whole pipeline (registry API → crawl of the
// replay Play Store → Kafka → storage consumer → PostgreSQL, plus the pcap
// analyzer), run against each engine playwatch supports:
//
//   - TestEndToEndEmbedded: the appliance's own defaults, managed PostgreSQL
//     and the embedded broker;
//   - TestEndToEndApacheKafka: real Apache Kafka and the tests' PostgreSQL;
//   - TestEndToEndRedpanda: Redpanda and PostgreSQL in containers
//     (testcontainers-go; skipped without a Docker daemon);
//   - TestApacheKafkaSecured (kafka_secured_test.go): Apache Kafka over
//     SASL_SSL with SCRAM-SHA-512.
//
// The helpers here (e2eAppliance, waitDrained, scrapeMetrics) also serve
// the offline demo (demo_test.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/modules/redpanda"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestEndToEndEmbedded(t *testing.T) {
	t.Parallel()
	runEndToEnd(t, map[string]string{
		"PLAYWATCH_DATA_DIR":    filepath.Join(tempDataDir(t), "data"),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
	})
}

func TestEndToEndApacheKafka(t *testing.T) {
	t.Parallel()
	k := apacheKafkaCluster(t, 1)
	clearPlaywatchTopics(t, k.Admin())
	runEndToEnd(t, map[string]string{
		"DATABASE_URL":       newTestDatabase(t),
		"KAFKA_BROKERS":      strings.Join(k.Brokers(), ","),
		"PLAYWATCH_DATA_DIR": t.TempDir(),
		// The cluster outlives this test: a group of its own never starts
		// from offsets an earlier test committed.
		"CONSUMER_GROUP": fmt.Sprintf("playwatch-e2e-%d", time.Now().UnixNano()),
	})
}

func TestEndToEndRedpanda(t *testing.T) {
	t.Parallel()
	defer func() {
		if t.Skipped() {
			t.Log("the Redpanda and PostgreSQL containers of this test need a Docker daemon (DOCKER_HOST or /var/run/docker.sock)")
		}
	}()
	testcontainers.SkipIfProviderIsNotHealthy(t)
	ctx := t.Context()
	rp, err := redpanda.Run(ctx, "docker.redpanda.com/redpandadata/redpanda:v25.2.4")
	testcontainers.CleanupContainer(t, rp)
	if err != nil {
		t.Fatalf("start Redpanda: %v", err)
	}
	seed, err := rp.KafkaSeedBroker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := tcpostgres.Run(ctx, "postgres:15-alpine", tcpostgres.WithDatabase("playwatch"), tcpostgres.BasicWaitStrategies())
	testcontainers.CleanupContainer(t, pg)
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	dsn, err := pg.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	runEndToEnd(t, map[string]string{
		"DATABASE_URL":       dsn,
		"KAFKA_BROKERS":      seed,
		"PLAYWATCH_DATA_DIR": t.TempDir(),
		// One node: the explicit factor does not depend on how the
		// broker's default is configured.
		"KAFKA_TOPIC_REPLICATION": "1",
	})
}

// e2eApp is one app of the scenario: how it is registered and what the
// replay Play Store holds for it.
type e2eApp struct {
	pkg     string
	body    string // POST /api/v1/apps
	replay  replayApp
	title   string // registry display_name once the consumer filled it
	listed  bool   // the store has a listing (else 404)
	reviews int    // review rows: min(REVIEWS_PER_APP, reviews on the store)
	dropped bool   // deleted from the registry before the second cycle
}

const e2eReviewsPerApp = 200

// The apps of the scenario: 8 Play Store requests per cycle.
var e2eApps = []e2eApp{
	// 300 reviews on the store: two pages. The developer replies to some
	// of them before the second cycle.
	{pkg: "org.telegram.messenger", body: `{"package_name":"org.telegram.messenger","display_name":"Telegram","is_messaging_app":true}`,
		replay: replayApp{Replies: -1}, title: "Telegram", listed: true, reviews: e2eReviewsPerApp},
	{pkg: "com.whatsapp", body: `{"package_name":"com.whatsapp","is_messaging_app":true}`,
		replay: replayApp{Title: "WhatsApp Messenger", Reviews: 40}, title: "WhatsApp Messenger", listed: true, reviews: 40, dropped: true},
	{pkg: "ir.divar", body: `{"package_name":"ir.divar","is_iranian_app":true}`,
		replay: replayApp{Title: "دیوار", Reviews: 60, Persian: true}, title: "دیوار", listed: true, reviews: 60},
	{pkg: "com.example.delisted", body: `{"package_name":"com.example.delisted"}`,
		replay: replayApp{DetailsAlways: fault404}, dropped: true},
}

// runEndToEnd is the scenario. engine holds what differs per engine
// (DATABASE_URL, KAFKA_BROKERS, ...; none for the appliance's own).
func runEndToEnd(t *testing.T, engine map[string]string) {
	began := time.Now()
	phase := time.Now()
	lap := func(what string) {
		t.Logf("%s took %s", what, time.Since(phase).Round(time.Millisecond))
		phase = time.Now()
	}
	replay := newReplayPlayStore(t)
	stats, reviews := map[string]int{}, 0
	store := map[string]replayApp{} // what the replay store holds, by package
	for _, a := range e2eApps {
		replay.setApp(a.pkg, a.replay)
		store[a.pkg] = a.replay
		if a.listed {
			stats[a.pkg] = 1
		}
		reviews += a.reviews
	}
	env := maps.Clone(engine)
	maps.Copy(env, map[string]string{
		"PLAYWATCH_HTTP_ADDR": freeAddr(t),
		"PLAYSTORE_URL":       replay.URL,
		"RATE_LIMIT_REQUESTS": "0",
		"EGRESS_MIN_GAP":      "0s",
		"REVIEWS_PER_APP":     strconv.Itoa(e2eReviewsPerApp),
		"CRAWL_INTERVAL":      "1h",
		// The second cycle reads every review again: the developer's new
		// replies reach older reviews only through a full read.
		"REVIEWS_FULL_SYNC_INTERVAL": "0s",
	})

	// Day one: the appliance starts on an empty registry, and its cycle at
	// start finds nothing to crawl.
	a := startE2EAppliance(t, env)
	waitFor(t, 30*time.Second, "the first cycle to find no apps", func() bool {
		return strings.Contains(a.logs.String(), "no active apps to crawl")
	})
	for _, app := range e2eApps {
		if code, body := httpDo(t, http.MethodPost, a.base+"/api/v1/apps", app.body); code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", app.pkg, code, body)
		}
	}
	lap("start on an empty registry, register the apps")

	// The cycle at the next start crawls them: a restart rather than
	// `crawl --once`, so that the crawl's and the publisher's metrics are
	// the appliance's own and can be checked against the rows.
	crawled := time.Now()
	a.restart()
	waitFor(t, 60*time.Second, "the crawl cycle at start", func() bool {
		return scrapeMetrics(t, a.base)["playwatch_crawl_cycles_total"] == 1
	})
	a.waitDrained()
	lap("restart, crawl cycle at start, drain")
	if got, want := replay.locale("reviews", "ir.divar")+" "+replay.locale("reviews", "com.whatsapp"), "fa/ir en/us"; got != want {
		t.Errorf("store locales %s, want %s", got, want)
	}
	checkE2ERegistry(t, a)
	checkE2EStats(t, a, stats)
	firstSync := checkE2EReviews(t, a, store)
	for id, s := range firstSync {
		if s.lastSynced.Before(crawled) || s.lastSynced.After(time.Now()) {
			t.Errorf("review %s: last synced %s; the cycle started %s", id, s.lastSynced, crawled)
		}
	}
	a.expectCounts(map[string]int{"app_stats": len(stats), "reviews": reviews, "network_metrics": 0, "dead_letter_events": 0})
	a.expectMetrics(map[string]float64{
		`playwatch_crawl_cycles_total`:                                        1,
		`playwatch_crawl_app_paths_total{outcome="ok",path="stats"}`:          float64(len(stats)),
		`playwatch_crawl_app_paths_total{outcome="not_found",path="stats"}`:   1,
		`playwatch_crawl_app_paths_total{outcome="ok",path="reviews"}`:        float64(len(stats)),
		`playwatch_crawl_app_paths_total{outcome="not_found",path="reviews"}`: 1,
		`playwatch_publish_messages_produced_total{topic="app-stats"}`:        float64(len(stats)),
		`playwatch_publish_messages_produced_total{topic="reviews"}`:          float64(reviews),
		// Every 200 answer was archived too (confirmed asynchronously, so
		// only asked to be there).
		`playwatch_raw_pages_archived_total{kind="details"}`:                -1,
		`playwatch_raw_pages_archived_total{kind="reviews"}`:                -1,
		`playwatch_raw_archive_failures_total`:                              0,
		`playwatch_publish_failed_closed_total{topic="reviews"}`:            0,
		`playwatch_consumer_records_total{topic="app-stats"}`:               float64(len(stats)),
		`playwatch_consumer_records_total{topic="reviews"}`:                 float64(reviews),
		`playwatch_consumer_rows_written_total{table="app_stats"}`:          float64(len(stats)),
		`playwatch_consumer_rows_written_total{table="reviews"}`:            float64(reviews),
		`playwatch_consumer_rows_written_total{table="dead_letter_events"}`: 0,
		// Each listed app had an empty display name or category to fill.
		`playwatch_consumer_rows_written_total{table="apps_registry_application"}`: float64(len(stats)),
	})
	lap("check tables and metrics")

	// Monotonic guard: an older version of a stored review (a stale
	// replay, or reordering across partitions) changes nothing.
	telegram := e2eApps[0].pkg
	id := replayReviewID(telegram, 0)
	before := readReviewRow(t, a.pool, id)
	stale := with(reviewFields(telegram, id, before.lastSynced.Add(-time.Hour)), "content", "an older text", "thumbs_up_count", 999)
	a.produce(rec(topicReviews, telegram, msgJSON(stale)))
	a.waitDrained()
	if after := readReviewRow(t, a.pool, id); after != before {
		t.Errorf("an older version of review %s changed its row:\n%+v\n%+v", id, before, after)
	}
	a.expectCounts(map[string]int{"reviews": reviews, "dead_letter_events": 0})
	lap("stale review")

	checkPcapRoundTrip(t, a, telegram)
	lap("pcap round trip")

	// Two apps leave the registry (a soft delete) and a second cycle runs,
	// by the one-off command beside the running appliance: the remaining
	// apps' reviews are synced again and none is seen for the first time;
	// what was stored of the others stays as it was. Meanwhile Telegram's
	// developer has replied to every fifth review: the newer crawl brings
	// the replies into the rows.
	store[telegram] = replayApp{}
	replay.setApp(telegram, store[telegram])
	active, resynced := 0, 0
	for _, app := range e2eApps {
		if !app.dropped {
			active++
			resynced += app.reviews
			stats[app.pkg]++
			continue
		}
		if code, body := httpDo(t, http.MethodDelete, a.base+"/api/v1/apps/"+app.pkg, ""); code != http.StatusNoContent {
			t.Fatalf("delete %s: %d %s", app.pkg, code, body)
		}
	}
	statRows := 0
	for _, n := range stats {
		statRows += n
	}
	// A one-off cycle is refused while the appliance's scheduler leads,
	// naming it; the appliance runs on without its crawler role for it.
	var refused syncBuffer
	if err := run(context.Background(), []string{"crawl", "--once"}, envFunc(a.env), io.Discard, &refused); err == nil ||
		!strings.Contains(err.Error(), "plans the crawl cycles") || !strings.Contains(err.Error(), fmt.Sprintf("/%d/", os.Getpid())) {
		t.Errorf("crawl --once beside the leading appliance: %v, want a refusal naming the leader", err)
	}
	a.args = []string{"--roles", "registry,consumer,sentiment"}
	a.restart()
	secondStart := time.Now()
	want := fmt.Sprintf("app_stats: %d/%d, reviews: %d/%d (%d review messages), failures: none", active, active, active, active, resynced)
	if out := a.command("crawl", "--once"); !strings.HasPrefix(out, want) {
		t.Errorf("crawl --once printed %q, want %q", out, want)
	}
	a.waitDrained()
	checkE2EStats(t, a, stats)
	for id, second := range checkE2EReviews(t, a, store) {
		first := firstSync[id]
		if first.dropped {
			if second != first {
				t.Errorf("review %s of a deleted app changed: %+v → %+v", id, first, second)
			}
			continue
		}
		if !second.firstSeen.Equal(first.firstSeen) || second.lastSynced.Before(secondStart) {
			t.Errorf("review %s: first_seen_at %s → %s, last_synced_at %s → %s; want first_seen_at kept and last_synced_at of the second cycle",
				id, first.firstSeen, second.firstSeen, first.lastSynced, second.lastSynced)
		}
	}
	a.expectCounts(map[string]int{"app_stats": statRows, "reviews": reviews, "network_metrics": 2, "dead_letter_events": 0})
	// Since the restart: each newer version is a row written.
	a.expectMetrics(map[string]float64{
		`playwatch_consumer_rows_written_total{table="app_stats"}`:          float64(active),
		`playwatch_consumer_rows_written_total{table="reviews"}`:            float64(resynced),
		`playwatch_consumer_rows_written_total{table="network_metrics"}`:    0,
		`playwatch_consumer_rows_written_total{table="dead_letter_events"}`: 0,
	})
	lap("delete two apps, second cycle with crawl --once")

	if err := a.stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, a.logs)
	}
	t.Logf("scenario took %s", time.Since(began).Round(time.Millisecond))
}

// checkE2ERegistry: the consumer filled the empty names and categories from
// the store, the registry API shows them, and what was given is kept.
func checkE2ERegistry(t *testing.T, a *e2eAppliance) {
	t.Helper()
	var list struct{ Apps []app }
	a.getJSON("/api/v1/apps", &list)
	if len(list.Apps) != len(e2eApps) {
		t.Errorf("the registry lists %d apps, want %d", len(list.Apps), len(e2eApps))
	}
	for _, e := range e2eApps {
		var got app
		a.getJSON("/api/v1/apps/"+e.pkg, &got)
		name, category := "", ""
		if got.DisplayName != nil {
			name = *got.DisplayName
		}
		if got.Category != nil {
			category = *got.Category
		}
		wantCategory := "Arcade" // the genre of the replay's template page
		if !e.listed {
			wantCategory = ""
		}
		if name != e.title || category != wantCategory ||
			got.IsMessagingApp != strings.Contains(e.body, `"is_messaging_app":true`) || got.IsIranianApp != strings.HasPrefix(e.pkg, "ir.") {
			t.Errorf("%s in the registry: %q, %q, messaging %v, iranian %v", e.pkg, name, category, got.IsMessagingApp, got.IsIranianApp)
		}
	}
}

// checkE2EStats checks the number of app_stats rows of each app and that
// they carry the values of the replay's page (the Minecraft fixture's).
func checkE2EStats(t *testing.T, a *e2eAppliance, want map[string]int) {
	t.Helper()
	rows, err := a.pool.Query(context.Background(), `SELECT a.package_name, count(*), count(DISTINCT s.crawled_at),
		bool_and(s.min_installs = 50000000 AND s.score = 4.315863 AND s.ratings = 5715302 AND s.reviews_count = 633450
			AND s.version = '1.26.32.2' AND NOT s.ad_supported AND s.app_updated_at = to_timestamp(1782338684)
			AND s.real_installs = 91130079
			AND (s.ratings_1, s.ratings_2, s.ratings_3, s.ratings_4, s.ratings_5) = (594092, 170943, 264728, 491363, 4194160)
			AND s.developer = 'Mojang' AND s.released_at = to_timestamp(1313475441) + interval '825 milliseconds'
			AND s.recent_changes = 'What''s new in 26.32: Various bug fixes!')
		FROM app_stats s JOIN apps_registry_application a ON a.id = s.application_id GROUP BY a.package_name`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var pkg string
		var n, crawls int
		var values bool
		if err := rows.Scan(&pkg, &n, &crawls, &values); err != nil {
			t.Fatal(err)
		}
		got[pkg] = n
		if !values || crawls != n {
			t.Errorf("app_stats of %s: values as on the page %v, %d rows of %d crawls", pkg, values, n, crawls)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("app_stats rows per app %v, want %v", got, want)
	}
}

// e2eSync is when a review row was first seen and last synced.
type e2eSync struct {
	firstSeen, lastSynced time.Time
	dropped               bool // its app is deleted before the second cycle
}

// checkE2EReviews compares every review row with what the replay store
// serves (store: each app's configuration when it was last crawled; newest
// first, so review i of an app is its i-th newest) and returns the rows'
// sync times.
func checkE2EReviews(t *testing.T, a *e2eAppliance, store map[string]replayApp) map[string]e2eSync {
	t.Helper()
	type review struct {
		pkg, user, content string
		thumbs, score      int
		at                 time.Time
		reply, version     *string
		repliedAt          *time.Time
		dropped            bool
	}
	want := map[string]review{}
	for _, app := range e2eApps {
		for i := range app.reviews {
			r := review{pkg: app.pkg, user: fmt.Sprintf("User %d", i), content: fmt.Sprintf("Review %d of %s: works fine", i, app.pkg),
				thumbs: i % 13, score: i%5 + 1, at: replayReviewAt(i).Truncate(time.Microsecond), dropped: app.dropped}
			if replied, ok := replayReviewReply(store[app.pkg], i); ok {
				text := replayReplyText
				r.reply, r.repliedAt = &text, &replied
			}
			if v, ok := replayReviewVersion(i); ok {
				r.version = &v
			}
			if app.replay.Persian {
				// The NUL the store sends is dropped on the way.
				r.user, r.content = fmt.Sprintf("کاربر %d", i), fmt.Sprintf("نظر %d: برنامه خیلی خوبیه 👍🏽🇮🇷\nممنون", i)
			}
			want[replayReviewID(app.pkg, i)] = r
		}
	}
	rows, err := a.pool.Query(context.Background(), `SELECT r.review_id, a.package_name, r.user_name, r.content, r.thumbs_up_count,
		r.score, r.at, r.reply_content, r.replied_at, r.app_version,
		r.sentiment IS NOT NULL AND r.sentiment_model = $1 AND r.sentiment_text_hash = reviews_sentiment_input(r.score, r.content),
		r.first_seen_at, r.last_synced_at
		FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id`, a.sentimentModel())
	if err != nil {
		t.Fatal(err)
	}
	syncs := map[string]e2eSync{}
	for rows.Next() {
		var id string
		var got review
		var scored bool
		var s e2eSync
		if err := rows.Scan(&id, &got.pkg, &got.user, &got.content, &got.thumbs, &got.score, &got.at,
			&got.reply, &got.repliedAt, &got.version, &scored, &s.firstSeen, &s.lastSynced); err != nil {
			t.Fatal(err)
		}
		w, ok := want[id]
		got.dropped, s.dropped = w.dropped, w.dropped
		syncs[id] = s
		switch {
		case !ok:
			t.Errorf("review %s of %s is not on the store", id, got.pkg)
		case got.pkg != w.pkg || got.user != w.user || got.content != w.content || got.thumbs != w.thumbs || got.score != w.score || !got.at.Equal(w.at) ||
			!equalPtr(got.reply, w.reply) || !equalPtr(got.version, w.version) || (got.repliedAt == nil) != (w.repliedAt == nil) ||
			got.repliedAt != nil && !got.repliedAt.Equal(*w.repliedAt):
			t.Errorf("review %s:\n got %+v\nwant %+v", id, got, w)
		case !scored:
			t.Errorf("review %s has no sentiment of the sentiment job's model with the hash of its text and stars", id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(syncs) != len(want) {
		t.Errorf("%d review rows, want %d", len(syncs), len(want))
	}
	return syncs
}

// equalPtr says whether a and b are both nil or point to equal values.
func equalPtr[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// checkPcapRoundTrip is the pcap path end to end: `pcap` without --dry-run
// → broker → storage consumer → one network_metrics row with tshark's
// values; a re-delivery of the same message adds no row, a second real
// analysis of the same file does.
func checkPcapRoundTrip(t *testing.T, a *e2eAppliance, pkg string) {
	t.Helper()
	const capture = "clean_upload"
	args := []string{"pcap", "--app", pkg, "--scenario", "UPLOAD", filepath.Join("testdata", "pcap", capture+".pcap")}
	firstID := publishedAnalysis(t, a.command(args...))
	a.waitDrained()
	got := readNetworkMetrics(t, a.pool)
	if len(got) != 1 || got[0].AnalysisID != firstID || got[0].PackageName != pkg || got[0].Scenario != "UPLOAD" ||
		got[0].SourcePcapFilename != capture+".pcap" || time.Since(got[0].AnalyzedAt) > time.Minute {
		t.Fatalf("network_metrics after one analysis (%s): %+v", firstID, got)
	}
	checkAgainstGolden(t, got[0], capture)

	recs := consumeAllWith(t, a.kafka, topicNetworkMetrics, 1)
	a.produce(rec(topicNetworkMetrics, string(recs[0].Key), recs[0].Value))
	a.waitDrained()
	if again := readNetworkMetrics(t, a.pool); len(again) != 1 || !reflect.DeepEqual(again[0], got[0]) {
		t.Fatalf("network_metrics after a re-delivery: %+v, want the one row %+v", again, got[0])
	}

	secondID := publishedAnalysis(t, a.command(args...))
	a.waitDrained()
	got = readNetworkMetrics(t, a.pool)
	if len(got) != 2 || got[1].AnalysisID != secondID || secondID == firstID {
		t.Fatalf("network_metrics after a second analysis (%s): %+v", secondID, got)
	}
	checkAgainstGolden(t, got[1], capture)
	a.expectCounts(map[string]int{"dead_letter_events": 0})
}

var publishedAnalysisPattern = regexp.MustCompile(`: published analysis ([0-9a-f-]{36}) `)

// publishedAnalysis returns the analysis id that `pcap` printed.
func publishedAnalysis(t *testing.T, out string) string {
	t.Helper()
	m := publishedAnalysisPattern.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("pcap printed %q", out)
	}
	return m[1]
}

// readNetworkMetrics returns the network_metrics rows as messages, oldest
// first.
func readNetworkMetrics(t *testing.T, pool *pgxpool.Pool) []networkMetricsMessage {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT m.analysis_id::text, a.package_name, m.scenario, m.rtt_handshake,
		m.retransmission_count, m.out_of_order_count, m.spurious_retransmission_count, m.zero_window_count, m.tcp_reset_count,
		m.bytes_transferred_total, m.bytes_payload_total, m.overhead_ratio, m.source_pcap_filename, m.analyzed_at
		FROM network_metrics m JOIN apps_registry_application a ON a.id = m.application_id ORDER BY m.id`)
	if err != nil {
		t.Fatal(err)
	}
	var out []networkMetricsMessage
	for rows.Next() {
		var m networkMetricsMessage
		if err := rows.Scan(&m.AnalysisID, &m.PackageName, &m.Scenario, &m.RTTHandshake, &m.RetransmissionCount, &m.OutOfOrderCount,
			&m.SpuriousRetransmissionCount, &m.ZeroWindowCount, &m.TCPResetCount, &m.BytesTransferredTotal, &m.BytesPayloadTotal,
			&m.OverheadRatio, &m.SourcePcapFilename, &m.AnalyzedAt); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// e2eAppliance is `playwatch run` in-process, with direct access to its
// database and broker for the checks, and its one-off commands.
type e2eAppliance struct {
	t       *testing.T
	env     map[string]string
	args    []string // of run: its roles
	base    string   // http://addr of the registry API and /metrics
	stopRun func() error
	logs    *syncBuffer
	group   string
	brokers []string
	kafka   []kgo.Opt   // how the appliance's clients reach the brokers
	client  *kgo.Client // produces and reads end offsets
	pool    *pgxpool.Pool
}

// startE2EAppliance starts `playwatch run args...` on env: every role
// unless args pick some.
func startE2EAppliance(t *testing.T, env map[string]string, args ...string) *e2eAppliance {
	t.Helper()
	a := &e2eAppliance{t: t, env: env, args: args}
	a.start()
	// The checks reach the database and broker the way a one-off command
	// does: the appliance's own unless env names others.
	cl, err := parseCommandLine("run", "run", nil, envFunc(env), io.Discard, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := cl.cfg
	if cfg.DatabaseURL == "" || len(cfg.KafkaBrokers) == 0 {
		if cfg, _, err = attachedConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	a.group, a.brokers, a.kafka = cfg.ConsumerGroup, cfg.KafkaBrokers, kafkaClientOptions(cfg.Kafka, cfg.KafkaBrokers)
	if a.client, err = kgo.NewClient(append(a.kafka, kgo.ProducerLinger(0))...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.client.Close)
	if a.pool, err = pgxpool.New(context.Background(), cfg.DatabaseURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.pool.Close)
	return a
}

func (a *e2eAppliance) start() {
	a.t.Helper()
	a.base, a.stopRun, a.logs = startRun(a.t, a.env, a.args...)
}

// stop stops the appliance and returns what run returned.
func (a *e2eAppliance) stop() error {
	// The pool's connections would outlive a managed server.
	a.pool.Reset()
	return a.stopRun()
}

// restart stops the appliance and starts it again on the same data.
func (a *e2eAppliance) restart() {
	a.t.Helper()
	if err := a.stop(); err != nil {
		a.t.Fatalf("stop: %v\n%s", err, a.logs)
	}
	a.start()
}

// command runs a one-off command (crawl, pcap, ...) beside the running
// appliance with its settings and returns what it printed.
func (a *e2eAppliance) command(args ...string) string {
	a.t.Helper()
	var out, errOut syncBuffer
	if err := run(context.Background(), args, envFunc(a.env), &out, &errOut); err != nil {
		a.t.Fatalf("playwatch %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

func (a *e2eAppliance) getJSON(path string, v any) {
	a.t.Helper()
	code, body := httpDo(a.t, http.MethodGet, a.base+path, "")
	if code != http.StatusOK {
		a.t.Fatalf("GET %s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		a.t.Fatalf("GET %s: %v", path, err)
	}
}

// produce writes records to the broker, as another producer would.
func (a *e2eAppliance) produce(recs ...*kgo.Record) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.client.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		a.t.Fatalf("produce: %v", err)
	}
}

// waitDrained waits until the storage consumer has stored every record now
// on the playwatch topics, and the sentiment job has scored what it stored.
func (a *e2eAppliance) waitDrained() {
	a.t.Helper()
	waitDrained(a.t, a.pool, a.client, a.group)
	waitFor(a.t, 30*time.Second, "the sentiment job to score every stored review", func() bool {
		return count(a.t, a.pool, `SELECT count(*) FROM reviews WHERE `+sentimentTodo) == 0
	})
}

// sentimentModel is the version of the model the appliance scores with.
func (a *e2eAppliance) sentimentModel() string {
	a.t.Helper()
	m, err := loadSentimentModel()
	if err != nil {
		a.t.Fatal(err)
	}
	return m.Version()
}

// waitDrained waits until the offsets that the storage consumer group
// stored in consumer_offsets reach the end of every partition of the
// playwatch topics, i.e. every record produced so far is in the tables or
// in dead_letter_events.
func waitDrained(t testing.TB, pool *pgxpool.Pool, cl *kgo.Client, group string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, allTopics...)
	cancel()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	store := newConsumerStore(pool, group, testLocales)
	waitFor(t, 60*time.Second, "the storage consumer to store every record", func() bool {
		stored, err := store.loadOffsets(context.Background())
		if err != nil {
			t.Fatalf("read consumer_offsets: %v", err)
		}
		done := true
		ends.Each(func(o kadm.ListedOffset) { done = done && stored[topicPartition{o.Topic, o.Partition}] >= o.Offset })
		return done
	})
}

// expectCounts compares the row counts of tables.
func (a *e2eAppliance) expectCounts(want map[string]int) {
	a.t.Helper()
	for table, n := range want {
		if got := count(a.t, a.pool, "SELECT count(*) FROM "+table); got != n {
			a.t.Errorf("%s has %d rows, want %d", table, got, n)
		}
	}
}

// expectMetrics compares samples of /metrics; a want of -1 only asks for a
// positive value.
func (a *e2eAppliance) expectMetrics(want map[string]float64) {
	a.t.Helper()
	got := scrapeMetrics(a.t, a.base)
	for sample, w := range want {
		v, ok := got[sample]
		switch {
		case !ok:
			a.t.Errorf("/metrics has no sample %s", sample)
		case w == -1 && v <= 0, w != -1 && v != w:
			a.t.Errorf("%s = %v, want %v", sample, v, w)
		}
	}
}

// clearPlaywatchTopics deletes the playwatch topics from a cluster that
// outlives one test, so that the scenario starts on empty topics even after
// an earlier run of it in the same test binary (-count=2).
func clearPlaywatchTopics(t *testing.T, adm *kadm.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resps, err := adm.DeleteTopics(ctx, createdTopics...)
	if err != nil {
		t.Fatalf("delete topics: %v", err)
	}
	for _, r := range resps {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			t.Fatalf("delete topic %s: %v", r.Topic, r.Err)
		}
	}
	waitFor(t, 30*time.Second, "the deleted topics to leave the metadata", func() bool {
		topics, err := adm.ListTopics(ctx, createdTopics...)
		return err == nil && len(topics.TopicsSet()) == 0
	})
}
