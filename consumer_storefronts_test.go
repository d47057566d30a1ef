package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// storefrontLocales are PLAYSTORE_* settings other than the defaults, so
// that an app's default storefront shows it comes from them.
var storefrontLocales = localeDefaults{Default: locale{Lang: "en", Country: "gb"}, Iranian: locale{Lang: "fa", Country: "ir"}}

// registerStorefrontApps registers three apps: Telegram with the
// storefronts ir/fa then us/en, Divar (is_iranian_app) and an example app,
// both without storefronts.
func registerStorefrontApps(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, sql := range []string{
		`INSERT INTO apps_registry_application (package_name) VALUES ('org.telegram.messenger'), ('com.example.app')`,
		`INSERT INTO apps_registry_application (package_name, is_iranian_app) VALUES ('ir.divar', true)`,
		`INSERT INTO app_storefronts (application_id, position, country, lang)
		 SELECT id, p, c, l FROM apps_registry_application, (VALUES (0, 'ir', 'fa'), (1, 'us', 'en')) AS f(p, c, l)
		  WHERE package_name = 'org.telegram.messenger'`,
	} {
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
}

// inStorefront is a message's fields with a storefront.
func inStorefront(fields map[string]any, country, lang string) map[string]any {
	return with(fields, "country", country, "lang", lang)
}

const (
	storedStats            = `SELECT a.package_name, s.country, s.lang, s.score FROM app_stats s JOIN apps_registry_application a ON a.id = s.application_id`
	storedReviews          = `SELECT r.review_id, r.content FROM reviews r`
	storedReviewStorefront = `SELECT r.review_id, a.package_name, f.country, f.lang FROM review_storefronts f
		JOIN reviews r ON r.id = f.review_id JOIN apps_registry_application a ON a.id = f.application_id`
)

// Through the broker and the consumer: a listing crawled in two storefronts
// is two app_stats rows of the same crawl; a review seen in two storefronts
// is one reviews row (the newest version) and two review_storefronts rows;
// a message without a storefront (an older playwatch's) is stored in its
// app's first storefront, the registered one at position 0, else the
// default one from is_iranian_app and PLAYSTORE_*. Everything produced
// again (a producer retry, a replayed topic) adds no row, and first_seen_at
// stays the first time.
func TestConsumerStoresStorefronts(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	brokers := newConsumerTestBroker(t)
	registerStorefrontApps(t, pool)
	const telegram, divar, example = "org.telegram.messenger", "ir.divar", "com.example.app"
	later := testCrawl.Add(time.Hour)
	var msgs, again []*kgo.Record // again: each once more, as new records
	for _, r := range []*kgo.Record{
		rec(topicAppStats, telegram, msgJSON(inStorefront(with(statFields(telegram, testCrawl), "score", 4.1), "ir", "fa"))),
		rec(topicAppStats, telegram, msgJSON(inStorefront(with(statFields(telegram, testCrawl), "score", 4.6), "us", "en"))),
		rec(topicReviews, telegram, msgJSON(inStorefront(with(reviewFields(telegram, "r1", testCrawl), "content", "older"), "ir", "fa"))),
		rec(topicReviews, telegram, msgJSON(inStorefront(with(reviewFields(telegram, "r1", later), "content", "newer"), "us", "en"))),
		// Of an older playwatch: no storefront.
		rec(topicAppStats, telegram, msgJSON(with(statFields(telegram, testCrawl.Add(-time.Hour)), "score", 4.0))),
		rec(topicReviews, telegram, msgJSON(with(reviewFields(telegram, "r2", testCrawl), "content", "old"))),
		rec(topicAppStats, divar, msgJSON(with(statFields(divar, testCrawl), "score", 3.5))),
		rec(topicReviews, divar, msgJSON(with(reviewFields(divar, "d1", testCrawl), "content", "old"))),
		rec(topicAppStats, example, msgJSON(with(statFields(example, testCrawl), "score", 2.5))),
		rec(topicReviews, example, msgJSON(with(reviewFields(example, "e1", testCrawl), "content", "old"))),
	} {
		msgs, again = append(msgs, r), append(again, rec(r.Topic, string(r.Key), r.Value))
	}
	produce(t, brokers, msgs...)
	opts := testConsumerOptions()
	opts.Locales = storefrontLocales
	tc := startTestConsumer(t, pool, brokers, opts, consumerHooks{})
	stored := func() int {
		return count(t, pool, `SELECT (SELECT count(*) FROM app_stats) + (SELECT count(*) FROM reviews) + (SELECT count(*) FROM review_storefronts)`)
	}
	waitFor(t, 30*time.Second, "the messages", func() bool { return stored() == 5+4+5 })

	wantStats := []string{"com.example.app gb en 2.5", "ir.divar ir fa 3.5",
		"org.telegram.messenger ir fa 4", "org.telegram.messenger ir fa 4.1", "org.telegram.messenger us en 4.6"}
	wantReviews := []string{"d1 old", "e1 old", "r1 newer", "r2 old"}
	wantSeen := []string{"d1 ir.divar ir fa", "e1 com.example.app gb en",
		"r1 org.telegram.messenger ir fa", "r1 org.telegram.messenger us en", "r2 org.telegram.messenger ir fa"}
	check := func(when string) {
		t.Helper()
		if got := storedRows(t, pool, storedStats); !slices.Equal(got, wantStats) {
			t.Errorf("%s: app_stats\n%q\nwant\n%q", when, got, wantStats)
		}
		if got := storedRows(t, pool, storedReviews); !slices.Equal(got, wantReviews) {
			t.Errorf("%s: reviews\n%q\nwant\n%q", when, got, wantReviews)
		}
		if got := storedRows(t, pool, storedReviewStorefront); !slices.Equal(got, wantSeen) {
			t.Errorf("%s: review_storefronts\n%q\nwant\n%q", when, got, wantSeen)
		}
	}
	check("first delivery")
	// A review's first storefront was seen when the review was first stored.
	if n := count(t, pool, `SELECT count(*) FROM review_storefronts f JOIN reviews r ON r.id = f.review_id
		WHERE f.first_seen_at <> r.first_seen_at`); n != 0 {
		t.Errorf("%d review_storefronts rows of these first deliveries have another first_seen_at than their review", n)
	}
	firstSeen := storedRows(t, pool, `SELECT review_id, country, first_seen_at FROM review_storefronts`)

	// Everything again: nothing new, and no first_seen_at moves.
	produce(t, brokers, again...)
	waitFor(t, 30*time.Second, "the repeated messages", func() bool {
		return count(t, pool, `SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE consumer_group = $1`, opts.Group) == 2*len(msgs)
	})
	check("second delivery")
	if got := storedRows(t, pool, `SELECT review_id, country, first_seen_at FROM review_storefronts`); !slices.Equal(got, firstSeen) {
		t.Errorf("first_seen_at moved:\n%q\nwas\n%q", got, firstSeen)
	}

	// The registry moves Telegram's US storefront first: an older message
	// is stored there from now on (the first storefront is not cached).
	if _, err := pool.Exec(context.Background(), `
		UPDATE app_storefronts SET position = 11 - position
		 WHERE application_id = (SELECT id FROM apps_registry_application WHERE package_name = 'org.telegram.messenger');
		UPDATE app_storefronts SET position = position - 10 WHERE position >= 10`); err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, rec(topicReviews, telegram, msgJSON(reviewFields(telegram, "r2", later))))
	waitFor(t, 30*time.Second, "r2 seen in the US", func() bool {
		return count(t, pool, `SELECT count(*) FROM review_storefronts WHERE country = 'us' AND lang = 'en'`) == 2
	})
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// One batch written by storeBatch: the versions of a review that the upsert
// leaves out still record their storefronts; in narrow mode a review
// PostgreSQL refuses records no storefront, and `dlq replay` of it, once
// the cause is fixed, stores it with its storefront, once.
func TestStoreBatchRecordsReviewStorefronts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTestPool(t)
	registerStorefrontApps(t, pool)
	const telegram = "org.telegram.messenger"
	store := newConsumerStore(pool, "g", storefrontLocales)
	review := func(off int64, id, country, lang string, crawled time.Time, content string) *kgo.Record {
		f := with(reviewFields(telegram, id, crawled), "content", content)
		if country != "" {
			f = inStorefront(f, country, lang)
		}
		return &kgo.Record{Topic: topicReviews, Partition: 0, Offset: off, Value: msgJSON(f)}
	}
	t1, t2 := testCrawl, testCrawl.Add(time.Minute)
	storeAll := func(recs []*kgo.Record, narrow bool) storeOutcome {
		t.Helper()
		parts := []partitionBatch{{topicPartition: topicPartition{topicReviews, 0}, records: recs}}
		out, err := store.storeBatch(ctx, parts, decodeRecords(recs, 1<<20, time.Now()), narrow, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	out := storeAll([]*kgo.Record{
		review(0, "a", "us", "en", t2, "a-new"), review(1, "a", "ir", "fa", t1, "a-old"), // the older version from another storefront
		review(2, "b", "de", "de", t1, "b"), review(3, "b", "de", "de", t1, "b"), // twice from one storefront
		review(4, "c", "", "", t1, "c"), // no storefront: Telegram's first, ir/fa
	}, false)
	if out.rows["reviews"] != 3 || out.rows[tableReviewStorefronts] != 4 {
		t.Errorf("rows written %v, want 3 reviews and 4 review_storefronts", out.rows)
	}
	want := []string{"a org.telegram.messenger ir fa", "a org.telegram.messenger us en", "b org.telegram.messenger de de", "c org.telegram.messenger ir fa"}
	if got := storedRows(t, pool, storedReviewStorefront); !slices.Equal(got, want) {
		t.Errorf("review_storefronts\n%q\nwant\n%q", got, want)
	}
	if got := readReviewRow(t, pool, "a").content; got != "a-new" {
		t.Errorf("review a: %q, want the newer version", got)
	}

	// Narrow mode: d is refused, e is stored with its storefront.
	if _, err := pool.Exec(ctx, `ALTER TABLE reviews ADD CONSTRAINT no_forbidden_words CHECK (content NOT LIKE '%forbidden%')`); err != nil {
		t.Fatal(err)
	}
	out = storeAll([]*kgo.Record{
		review(5, "d", "us", "en", t1, "a forbidden word"), review(6, "e", "us", "en", t1, "e"), review(7, "a", "tr", "tr", t1, "a-older"),
	}, true)
	if len(out.dead) != 1 || !strings.HasPrefix(out.dead[0].reason, string(reasonSQLError)) {
		t.Fatalf("dead letters %v, want d's sql_error", out.dead)
	}
	want = append(want, "a org.telegram.messenger tr tr", "e org.telegram.messenger us en")
	slices.Sort(want)
	if got := storedRows(t, pool, storedReviewStorefront); !slices.Equal(got, want) {
		t.Errorf("review_storefronts after the narrowed batch\n%q\nwant\n%q", got, want)
	}

	// Fixed, replayed: d is stored and seen in the US; a second replay finds nothing.
	if _, err := pool.Exec(ctx, `ALTER TABLE reviews DROP CONSTRAINT no_forbidden_words`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := store.replayDeadLetters(ctx, nil, deadLetterFilter{}, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	want = append(want, "d org.telegram.messenger us en")
	slices.Sort(want)
	if got := storedRows(t, pool, storedReviewStorefront); !slices.Equal(got, want) {
		t.Errorf("review_storefronts after dlq replay\n%q\nwant\n%q", got, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters left after the replay", n)
	}
}
