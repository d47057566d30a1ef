package main

// Shared by the fault tests (fault_*_test.go): what the broker holds is
// compared with what PostgreSQL holds, record by record.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// requireFaultSuite skips a slow fault test outside `make test-faults`.
func requireFaultSuite(t *testing.T) {
	t.Helper()
	if os.Getenv("PLAYWATCH_FAULT_TESTS") != "1" {
		t.Skip("fault test: set PLAYWATCH_FAULT_TESTS=1 (make test-faults)")
	}
}

// registerReplayApps registers n apps, com.example.<prefix>00 on, with the
// appliance at base, each with reviews reviews on the replay store.
func registerReplayApps(t *testing.T, replay *replayPlayStore, base, prefix string, n, reviews int) {
	t.Helper()
	for i := range n {
		pkg := fmt.Sprintf("com.example.%s%02d", prefix, i)
		replay.setApp(pkg, replayApp{Reviews: reviews})
		registerOverHTTP(t, base, pkg)
	}
}

// attachedTestConfig is the config a one-off command on the appliance's
// data directory runs with: its managed PostgreSQL and embedded broker.
func attachedTestConfig(t *testing.T, dataDir string) Config {
	t.Helper()
	cfg, err := loadTestConfig(map[string]string{"PLAYWATCH_DATA_DIR": dataDir})
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _, err = attachedConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// newRealTimePlayStore is a client of the replay server on the system
// clock, so that every crawl stamps its own crawled_at.
func newRealTimePlayStore(t testing.TB, baseURL string) *testPlayStore {
	return newTestPlayStore(t, baseURL, func(p *proxyPoolConfig, c *playStoreConfig) {
		p.Clock, c.Clock = systemClock{}, systemClock{}
	})
}

// topicTally is what the crawl topics hold: each app-stats record by
// package, storefront and crawl time, each review record by review id,
// storefront and crawl time.
type topicTally struct {
	records int                  // on both topics
	stats   map[string]int       // "package country/lang crawled_at" -> records
	reviews map[string]int       // "review_id country/lang crawled_at" -> records
	newest  map[string]time.Time // review_id -> latest crawled_at
	byApp   map[string]int       // package -> distinct review ids
	seenIn  map[string]bool      // "review_id country/lang": the storefronts a review was read in

	statsOf, reviewsOf map[string]int // package -> records, every crawl
}

func statsKey(pkg, country, lang string, at time.Time) string {
	return pkg + " " + country + "/" + lang + " " + at.UTC().Format(time.RFC3339Nano)
}
func reviewKey(id, country, lang string, at time.Time) string {
	return id + " " + country + "/" + lang + " " + at.UTC().Format(time.RFC3339Nano)
}
func (tt topicTally) distinctReviews() int { return len(tt.newest) }
func (tt topicTally) duplicates() (dups []string) {
	return append(duplicatedKeys(tt.stats), duplicatedKeys(tt.reviews)...)
}

func duplicatedKeys(m map[string]int) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] > 1 {
			out = append(out, fmt.Sprintf("%s ×%d", k, m[k]))
		}
	}
	return out
}

// tallyTopics reads app-stats and reviews from the start to their end offsets.
func tallyTopics(t *testing.T, brokers []string) topicTally {
	t.Helper()
	tt := topicTally{stats: map[string]int{}, reviews: map[string]int{}, newest: map[string]time.Time{}, byApp: map[string]int{},
		seenIn: map[string]bool{}, statsOf: map[string]int{}, reviewsOf: map[string]int{}}
	for _, r := range consumeAll(t, brokers, topicAppStats, int(endOffsets(t, brokers, topicAppStats))) {
		var m appStatsMessage
		if err := jsonUnmarshalStrict(r.Value, &m); err != nil {
			t.Fatalf("app-stats record %s: %v", r.Value, err)
		}
		tt.stats[statsKey(m.PackageName, m.Country, m.Lang, m.CrawledAt)]++
		tt.statsOf[m.PackageName]++
		tt.records++
	}
	for _, r := range consumeAll(t, brokers, topicReviews, int(endOffsets(t, brokers, topicReviews))) {
		var m reviewMessage
		if err := jsonUnmarshalStrict(r.Value, &m); err != nil {
			t.Fatalf("reviews record %s: %v", r.Value, err)
		}
		tt.reviews[reviewKey(m.ReviewID, m.Country, m.Lang, m.CrawledAt)]++
		tt.seenIn[m.ReviewID+" "+m.Country+"/"+m.Lang] = true
		tt.reviewsOf[m.PackageName]++
		if prev, ok := tt.newest[m.ReviewID]; !ok {
			tt.byApp[m.PackageName]++
			tt.newest[m.ReviewID] = m.CrawledAt
		} else if m.CrawledAt.After(prev) {
			tt.newest[m.ReviewID] = m.CrawledAt
		}
		tt.records++
	}
	return tt
}

// waitStored waits until the consumer group's offsets in the database reach
// the end of every topic: all that the brokers hold has been stored.
func waitStored(t *testing.T, timeout time.Duration, brokers []string, pool *pgxpool.Pool, group string) {
	t.Helper()
	want := endOffsets(t, brokers, allTopics...)
	waitFor(t, timeout, fmt.Sprintf("the consumer to store all %d records", want), func() bool {
		var got int64
		err := pool.QueryRow(context.Background(),
			`SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE consumer_group = $1`, group).Scan(&got)
		return err == nil && got == want
	})
}

// checkTopicsMatchDatabase asserts that the topics hold no record twice and
// that the database holds exactly what they hold: one app_stats row per
// app-stats record (app, storefront, crawl), one reviews row per review id
// carrying its latest crawl, a review_storefronts row for every storefront
// a review was read in, and no dead letters.
func checkTopicsMatchDatabase(t *testing.T, tt topicTally, pool *pgxpool.Pool) {
	t.Helper()
	if dups := tt.duplicates(); len(dups) > 0 {
		t.Errorf("%d records are on the topics more than once: %v", len(dups), firstN(dups, 10))
	}
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT a.package_name, s.country, s.lang, s.crawled_at FROM app_stats s JOIN apps_registry_application a ON a.id = s.application_id`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	var pkg, country, lang string
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&pkg, &country, &lang, &at}, func() error { stored[statsKey(pkg, country, lang, at)] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	var missing, extra []string
	for k := range tt.stats {
		if !stored[k] {
			missing = append(missing, k)
		}
	}
	for k := range stored {
		if tt.stats[k] == 0 {
			extra = append(extra, k)
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("app_stats: %d rows for %d records on the topic; missing %d %v, not on the topic %d %v",
			len(stored), len(tt.stats), len(missing), firstN(missing, 5), len(extra), firstN(extra, 5))
	}

	rows, err = pool.Query(ctx, `SELECT review_id, last_synced_at FROM reviews`)
	if err != nil {
		t.Fatal(err)
	}
	synced := map[string]time.Time{}
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { synced[id] = at; return nil }); err != nil {
		t.Fatal(err)
	}
	var wrong []string
	for id, newest := range tt.newest {
		if got, ok := synced[id]; !ok || !got.Equal(newest) {
			wrong = append(wrong, fmt.Sprintf("%s: stored %v, newest on the topic %v", id, got, newest))
		}
	}
	if len(wrong) > 0 || len(synced) != len(tt.newest) {
		t.Errorf("reviews: %d rows for %d review ids on the topic; %d wrong or missing: %v",
			len(synced), len(tt.newest), len(wrong), firstN(wrong, 5))
	}
	rows, err = pool.Query(ctx, `SELECT r.review_id || ' ' || f.country || '/' || f.lang FROM review_storefronts f JOIN reviews r ON r.id = f.review_id`)
	if err != nil {
		t.Fatal(err)
	}
	recorded := 0
	var in string
	if _, err := pgx.ForEachRow(rows, []any{&in}, func() error {
		if tt.seenIn[in] {
			recorded++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if recorded != len(tt.seenIn) {
		t.Errorf("review_storefronts: %d of the %d (review, storefront) pairs on the topic recorded", recorded, len(tt.seenIn))
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}
