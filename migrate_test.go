package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrate is migrateSchema for the tests that only need the schema.
func migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	_, err := migrateSchema(ctx, pool, logger)
	return err
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t) // already migrated once
	ctx := context.Background()
	if err := migrate(ctx, pool, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	ms, err := parseMigrations(schemaSQL)
	if err != nil {
		t.Fatal(err)
	}
	var n, max int
	if err := pool.QueryRow(ctx, "SELECT count(*), max(version) FROM storage_consumer_migrations").Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != len(ms) || max != len(ms) {
		t.Fatalf("bookkeeping has %d rows up to %d, want %d", n, max, len(ms))
	}
}

func TestParseMigrationsRejectsGaps(t *testing.T) {
	if _, err := parseMigrations("-- migration 1: a\nSELECT 1;\n-- migration 3: c\nSELECT 3;\n"); err == nil {
		t.Fatal("a gap in the numbering was accepted")
	}
	if _, err := parseMigrations("SELECT 1;"); err == nil {
		t.Fatal("a file without migrations was accepted")
	}
}

// The schema has every column type, default and nullability of docs/schema.md.
func TestSchemaColumnsMatchContract(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	want := map[string]string{
		"apps_registry_application.id":                  "bigint NOT NULL nextval",
		"apps_registry_application.package_name":        "character varying(255) NOT NULL",
		"apps_registry_application.display_name":        "character varying(255) NULL",
		"apps_registry_application.category":            "character varying(100) NULL",
		"apps_registry_application.is_messaging_app":    "boolean NOT NULL false",
		"apps_registry_application.is_iranian_app":      "boolean NOT NULL false",
		"apps_registry_application.is_active":           "boolean NOT NULL true",
		"apps_registry_application.created_at":          "timestamp with time zone NOT NULL now",
		"apps_registry_application.updated_at":          "timestamp with time zone NOT NULL now",
		"app_stats.id":                                  "bigint NOT NULL nextval",
		"app_stats.application_id":                      "bigint NOT NULL",
		"app_stats.min_installs":                        "bigint NULL",
		"app_stats.score":                               "double precision NULL",
		"app_stats.ratings":                             "bigint NULL",
		"app_stats.reviews_count":                       "bigint NULL",
		"app_stats.version":                             "character varying(50) NULL",
		"app_stats.ad_supported":                        "boolean NULL",
		"app_stats.app_updated_at":                      "timestamp with time zone NULL",
		"app_stats.crawled_at":                          "timestamp with time zone NOT NULL",
		"app_stats.real_installs":                       "bigint NULL",
		"app_stats.ratings_1":                           "bigint NULL",
		"app_stats.ratings_2":                           "bigint NULL",
		"app_stats.ratings_3":                           "bigint NULL",
		"app_stats.ratings_4":                           "bigint NULL",
		"app_stats.ratings_5":                           "bigint NULL",
		"app_stats.developer":                           "character varying(255) NULL",
		"app_stats.released_at":                         "timestamp with time zone NULL",
		"app_stats.recent_changes":                      "text NULL",
		"app_stats.country":                             "character varying(8) NOT NULL",
		"app_stats.lang":                                "character varying(16) NOT NULL",
		"app_storefronts.application_id":                "bigint NOT NULL",
		"app_storefronts.position":                      "smallint NOT NULL",
		"app_storefronts.country":                       "character varying(8) NOT NULL",
		"app_storefronts.lang":                          "character varying(16) NOT NULL",
		"review_storefronts.review_id":                  "bigint NOT NULL",
		"review_storefronts.application_id":             "bigint NOT NULL",
		"review_storefronts.country":                    "character varying(8) NOT NULL",
		"review_storefronts.lang":                       "character varying(16) NOT NULL",
		"review_storefronts.first_seen_at":              "timestamp with time zone NOT NULL",
		"review_rollup_hourly.application_id":           "bigint NOT NULL",
		"review_rollup_hourly.country":                  "character varying(8) NOT NULL",
		"review_rollup_hourly.lang":                     "character varying(16) NOT NULL",
		"review_rollup_hourly.hour":                     "timestamp with time zone NOT NULL",
		"review_rollup_hourly.app_version":              "character varying(50) NOT NULL",
		"review_rollup_hourly.score":                    "smallint NOT NULL",
		"review_rollup_hourly.sentiment":                "character varying(20) NOT NULL",
		"review_rollup_hourly.reviews":                  "bigint NOT NULL",
		"review_topic_rollup_hourly.application_id":     "bigint NOT NULL",
		"review_topic_rollup_hourly.country":            "character varying(8) NOT NULL",
		"review_topic_rollup_hourly.lang":               "character varying(16) NOT NULL",
		"review_topic_rollup_hourly.hour":               "timestamp with time zone NOT NULL",
		"review_topic_rollup_hourly.app_version":        "character varying(50) NOT NULL",
		"review_topic_rollup_hourly.topic":              "text NOT NULL",
		"review_topic_rollup_hourly.sentiment":          "character varying(20) NOT NULL",
		"review_topic_rollup_hourly.reviews":            "bigint NOT NULL",
		"review_rollup_totals.application_id":           "bigint NOT NULL",
		"review_rollup_totals.country":                  "character varying(8) NOT NULL",
		"review_rollup_totals.lang":                     "character varying(16) NOT NULL",
		"review_rollup_totals.score":                    "smallint NOT NULL",
		"review_rollup_totals.sentiment":                "character varying(20) NOT NULL",
		"review_rollup_totals.reviews":                  "bigint NOT NULL",
		"app_stats_rollup_daily.application_id":         "bigint NOT NULL",
		"app_stats_rollup_daily.country":                "character varying(8) NOT NULL",
		"app_stats_rollup_daily.lang":                   "character varying(16) NOT NULL",
		"app_stats_rollup_daily.day":                    "timestamp with time zone NOT NULL",
		"app_stats_rollup_daily.listings":               "bigint NOT NULL",
		"app_stats_rollup_daily.score_sum":              "double precision NOT NULL",
		"app_stats_rollup_daily.score_n":                "bigint NOT NULL",
		"app_stats_rollup_daily.last_crawled_at":        "timestamp with time zone NOT NULL",
		"app_stats_rollup_daily.last_score":             "double precision NULL",
		"app_stats_rollup_daily.last_ratings":           "bigint NULL",
		"app_stats_rollup_daily.last_real_installs":     "bigint NULL",
		"app_stats_rollup_daily.last_min_installs":      "bigint NULL",
		"reviews.id":                                    "bigint NOT NULL nextval",
		"reviews.application_id":                        "bigint NOT NULL",
		"reviews.review_id":                             "character varying(255) NOT NULL",
		"reviews.user_name":                             "character varying(255) NULL",
		"reviews.thumbs_up_count":                       "integer NOT NULL 0",
		"reviews.score":                                 "smallint NULL",
		"reviews.content":                               "text NULL",
		"reviews.at":                                    "timestamp with time zone NOT NULL",
		"reviews.sentiment":                             "character varying(20) NULL",
		"reviews.first_seen_at":                         "timestamp with time zone NOT NULL now",
		"reviews.last_synced_at":                        "timestamp with time zone NOT NULL",
		"reviews.reply_content":                         "text NULL",
		"reviews.replied_at":                            "timestamp with time zone NULL",
		"reviews.app_version":                           "character varying(50) NULL",
		"reviews.sentiment_model":                       "character varying(40) NULL",
		"reviews.sentiment_at":                          "timestamp with time zone NULL",
		"reviews.sentiment_text_hash":                   "bytea NULL",
		"reviews.text_lang":                             "character varying(8) NULL",
		"reviews.topics":                                "text[] NULL",
		"reviews.search_text":                           "text NULL",
		"reviews.search_version":                        "smallint NULL",
		"reviews.first_at":                              "timestamp with time zone NULL",
		"network_metrics.id":                            "bigint NOT NULL nextval",
		"network_metrics.application_id":                "bigint NOT NULL",
		"network_metrics.analysis_id":                   "uuid NOT NULL",
		"network_metrics.scenario":                      "character varying(20) NOT NULL",
		"network_metrics.rtt_handshake":                 "double precision NULL",
		"network_metrics.retransmission_count":          "integer NOT NULL 0",
		"network_metrics.out_of_order_count":            "integer NOT NULL 0",
		"network_metrics.spurious_retransmission_count": "integer NOT NULL 0",
		"network_metrics.zero_window_count":             "integer NOT NULL 0",
		"network_metrics.tcp_reset_count":               "integer NOT NULL 0",
		"network_metrics.bytes_transferred_total":       "bigint NOT NULL",
		"network_metrics.bytes_payload_total":           "bigint NOT NULL",
		"network_metrics.overhead_ratio":                "double precision NOT NULL",
		"network_metrics.source_pcap_filename":          "character varying(255) NULL",
		"network_metrics.analyzed_at":                   "timestamp with time zone NOT NULL",
		"dead_letter_events.id":                         "bigint NOT NULL nextval",
		"dead_letter_events.topic":                      "character varying(255) NOT NULL",
		"dead_letter_events.partition":                  "integer NOT NULL",
		"dead_letter_events.kafka_offset":               "bigint NOT NULL",
		"dead_letter_events.kafka_key":                  "text NULL",
		"dead_letter_events.raw_payload":                "bytea NULL",
		"dead_letter_events.error_reason":               "text NOT NULL",
		"dead_letter_events.occurred_at":                "timestamp with time zone NOT NULL now",
		"dead_letter_events.discarded_at":               "timestamp with time zone NULL",
		"dead_letter_events.discarded_by":               "text NULL",
		"dead_letter_events.generation":                 "integer NOT NULL 0",
		"notify_destinations.id":                        "bigint NOT NULL nextval",
		"notify_destinations.name":                      "character varying(255) NOT NULL",
		"notify_destinations.type":                      "character varying(20) NOT NULL",
		"notify_destinations.config":                    "jsonb NOT NULL '{}'::jsonb",
		"notify_destinations.status":                    "character varying(10) NOT NULL 'ok'::character varying",
		"notify_destinations.last_error":                "text NULL",
		"notify_destinations.created_at":                "timestamp with time zone NOT NULL now",
		"notify_destinations.updated_at":                "timestamp with time zone NOT NULL now",
		"notify_destination_secrets.destination_id":     "bigint NOT NULL",
		"notify_destination_secrets.secrets":            "jsonb NOT NULL '{}'::jsonb",
		"notify_rules.id":                               "bigint NOT NULL nextval",
		"notify_rules.name":                             "character varying(255) NOT NULL",
		"notify_rules.event":                            "character varying(20) NOT NULL",
		"notify_rules.apps":                             "text[] NULL",
		"notify_rules.filter":                           "jsonb NOT NULL '{}'::jsonb",
		"notify_rules.max_per_hour":                     "integer NOT NULL 20",
		"notify_rules.backfill":                         "interval NOT NULL '00:00:00'::interval",
		"notify_rules.created_at":                       "timestamp with time zone NOT NULL now",
		"notify_rules.updated_at":                       "timestamp with time zone NOT NULL now",
		"notify_rule_destinations.rule_id":              "bigint NOT NULL",
		"notify_rule_destinations.destination_id":       "bigint NOT NULL",
		"notifications.id":                              "bigint NOT NULL nextval",
		"notifications.rule_id":                         "bigint NOT NULL",
		"notifications.destination_id":                  "bigint NOT NULL",
		"notifications.event":                           "character varying(20) NOT NULL",
		"notifications.event_key":                       "text NOT NULL",
		"notifications.payload":                         "jsonb NOT NULL",
		"notifications.status":                          "character varying(10) NOT NULL 'pending'::character varying",
		"notifications.attempts":                        "integer NOT NULL 0",
		"notifications.last_error":                      "text NULL",
		"notifications.next_attempt_at":                 "timestamp with time zone NOT NULL now",
		"notifications.event_at":                        "timestamp with time zone NOT NULL",
		"notifications.source_at":                       "timestamp with time zone NULL",
		"notifications.digest_id":                       "bigint NULL",
		"notifications.created_at":                      "timestamp with time zone NOT NULL now",
		"notifications.sent_at":                         "timestamp with time zone NULL",
		"notifications.retry_from":                      "timestamp with time zone NULL",
		"sentiment_models.version":                      "character varying(40) NOT NULL",
		"sentiment_models.bytes":                        "bytea NOT NULL",
		"sentiment_models.figures":                      "jsonb NOT NULL",
		"sentiment_models.created_at":                   "timestamp with time zone NOT NULL now",
	}
	rows, err := pool.Query(context.Background(), `
		SELECT c.relname || '.' || a.attname,
		       format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE ' NULL' END ||
		       coalesce(' ' || split_part(pg_get_expr(d.adbin, d.adrelid), '(', 1), '')
		FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE c.relname IN ('apps_registry_application','app_stats','reviews','network_metrics','dead_letter_events',
		                    'notify_destinations','notify_destination_secrets','notify_rules','notify_rule_destinations','notifications',
		                    'sentiment_models','app_storefronts','review_storefronts',
		                    'review_rollup_hourly','review_topic_rollup_hourly','review_rollup_totals','app_stats_rollup_daily')
		  AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var col, def string
		if err := rows.Scan(&col, &def); err != nil {
			t.Fatal(err)
		}
		got[col] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for col, w := range want {
		if got[col] != w {
			t.Errorf("%s: got %q, want %q", col, got[col], w)
		}
	}
	if len(got) != len(want) {
		for col := range got {
			if _, ok := want[col]; !ok {
				t.Errorf("column %s is not in docs/schema.md", col)
			}
		}
	}
}

func TestSchemaIndexes(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	want := []string{
		"app_stats USING btree (application_id, country, lang, crawled_at)", // UNIQUE (migration 16)
		"app_stats USING btree (application_id, crawled_at)",
		"app_storefronts USING btree (application_id, country, lang)",
		"app_storefronts USING btree (application_id, \"position\")",
		"review_storefronts USING btree (review_id, country, lang)",
		"review_storefronts USING btree (application_id, country, lang, first_seen_at)",
		"review_rollup_hourly USING btree (application_id, country, lang, hour, app_version, score, sentiment)", // PK (migration 17)
		"review_topic_rollup_hourly USING btree (application_id, country, lang, hour, app_version, topic, sentiment)",
		"review_rollup_totals USING btree (application_id, country, lang, score, sentiment)",
		"app_stats_rollup_daily USING btree (application_id, country, lang, day)",
		"app_stats USING btree (crawled_at)",
		"reviews USING btree (application_id, at)",
		"reviews USING btree (at)",
		"reviews USING btree (review_id)",
		"reviews USING btree (id) WHERE ((sentiment IS NULL) OR (sentiment_text_hash IS DISTINCT FROM reviews_sentiment_input(score, content)))",
		"reviews USING gin (topics)",
		"reviews USING btree (id) WHERE ((topics IS NULL) AND (sentiment IS NOT NULL))",
		"reviews USING gin (search_text gin_trgm_ops)",
		"reviews USING btree (first_at, id)",
		"reviews USING btree (application_id, first_at, id)",
		"network_metrics USING btree (analysis_id)",
		"network_metrics USING btree (application_id, analyzed_at)",
		"dead_letter_events USING btree (topic, partition, kafka_offset, generation)",
		"dead_letter_events USING btree (occurred_at DESC)",
		"apps_registry_application USING btree (package_name)",
		"notify_rule_destinations USING btree (rule_id, destination_id)",
		"notify_rule_destinations USING btree (destination_id)",
		"notifications USING btree (rule_id, destination_id, event_key)",
		"notifications USING btree (next_attempt_at) WHERE (((status)::text = 'pending'::text) AND (digest_id IS NULL))",
		"notifications USING btree (rule_id, destination_id, sent_at) WHERE (((status)::text = 'sent'::text) AND (digest_id IS NULL))",
		"reviews USING btree (first_seen_at)", // the event decider's (migration 12)
		"reviews USING btree (sentiment_at)",
		"reviews USING btree (application_id, first_seen_at)", // an app's first stored review (migration 12)
		"notify_cursors USING btree (name)",
		"notify_rule_scans USING btree (rule_id)",
		"notify_crawl_streaks USING btree (application_id, country, lang, path)",
		"notify_alert_state USING btree (rule_id, application_id, country, lang, path)",
		"sentiment_models USING btree (created_at DESC)",
	}
	all := strings.Join(storedRows(t, pool, `SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'`), "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("no index %q among:\n%s", w, all)
		}
	}
}

// Each constraint of the contract rejects what it should.
func TestSchemaConstraintsReject(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	mustExec(t, pool, `INSERT INTO apps_registry_application (id, package_name) VALUES (1, 'com.example.app')`)
	mustExec(t, pool, `INSERT INTO app_stats (application_id, country, lang, crawled_at) VALUES (1, 'us', 'en', '2026-01-01T00:00:00Z')`)
	mustExec(t, pool, `INSERT INTO reviews (application_id, review_id, at, last_synced_at) VALUES (1, 'r1', now(), now())`)
	mustExec(t, pool, `INSERT INTO network_metrics (application_id, analysis_id, scenario, bytes_transferred_total, bytes_payload_total, overhead_ratio, analyzed_at)
		VALUES (1, '00000000-0000-4000-8000-000000000001', 'UPLOAD', 10, 5, 0.5, now())`)
	mustExec(t, pool, `INSERT INTO dead_letter_events (topic, "partition", kafka_offset, error_reason) VALUES ('reviews', 0, 7, 'bad')`)

	cases := []struct {
		name, sql, code string
	}{
		{"duplicate package", `INSERT INTO apps_registry_application (package_name) VALUES ('com.example.app')`, "23505"},
		{"package null", `INSERT INTO apps_registry_application (package_name) VALUES (NULL)`, "23502"},
		{"duplicate stat", `INSERT INTO app_stats (application_id, country, lang, crawled_at) VALUES (1, 'us', 'en', '2026-01-01T00:00:00Z')`, "23505"},
		{"stat unknown app", `INSERT INTO app_stats (application_id, country, lang, crawled_at) VALUES (99, 'us', 'en', now())`, "23503"},
		{"duplicate review", `INSERT INTO reviews (application_id, review_id, at, last_synced_at) VALUES (1, 'r1', now(), now())`, "23505"},
		{"bad sentiment", `INSERT INTO reviews (application_id, review_id, at, last_synced_at, sentiment) VALUES (1, 'r2', now(), now(), 'HAPPY')`, "23514"},
		{"review without at", `INSERT INTO reviews (application_id, review_id, last_synced_at) VALUES (1, 'r3', now())`, "23502"},
		{"bad scenario", `INSERT INTO network_metrics (application_id, analysis_id, scenario, bytes_transferred_total, bytes_payload_total, overhead_ratio, analyzed_at)
			VALUES (1, '00000000-0000-4000-8000-000000000002', 'SIDEWAYS', 1, 1, 0, now())`, "23514"},
		{"duplicate analysis", `INSERT INTO network_metrics (application_id, analysis_id, scenario, bytes_transferred_total, bytes_payload_total, overhead_ratio, analyzed_at)
			VALUES (1, '00000000-0000-4000-8000-000000000001', 'DOWNLOAD', 1, 1, 0, now())`, "23505"},
		{"bad uuid", `INSERT INTO network_metrics (application_id, analysis_id, scenario, bytes_transferred_total, bytes_payload_total, overhead_ratio, analyzed_at)
			VALUES (1, 'not-a-uuid', 'UPLOAD', 1, 1, 0, now())`, "22P02"},
		{"duplicate dead letter", `INSERT INTO dead_letter_events (topic, "partition", kafka_offset, error_reason) VALUES ('reviews', 0, 7, 'again')`, "23505"},
		{"dead letter without reason", `INSERT INTO dead_letter_events (topic, "partition", kafka_offset) VALUES ('reviews', 0, 8)`, "23502"},
		{"name too long", `INSERT INTO apps_registry_application (package_name, category) VALUES ('a.b', repeat('x', 101))`, "22001"},
	}
	for _, tc := range cases {
		_, err := pool.Exec(ctx, tc.sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
			t.Errorf("%s: err = %v, want SQLSTATE %s", tc.name, err, tc.code)
		}
	}

	// Soft delete keeps history; a hard delete cascades.
	mustExec(t, pool, `DELETE FROM apps_registry_application WHERE id = 1`)
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM app_stats) + (SELECT count(*) FROM reviews) + (SELECT count(*) FROM network_metrics)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows survived ON DELETE CASCADE", n)
	}
}

func TestSchemaUpdatedAtMovesOnUpdate(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	var created, updated1, updated2 string
	if err := pool.QueryRow(ctx, `INSERT INTO apps_registry_application (package_name, created_at, updated_at)
		VALUES ('com.example.app', '2020-01-01Z', '2020-01-01Z') RETURNING created_at::text, updated_at::text`).Scan(&created, &updated1); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `UPDATE apps_registry_application SET category = 'Tools' RETURNING updated_at::text`).Scan(&updated2); err != nil {
		t.Fatal(err)
	}
	if updated2 == updated1 || updated2 <= "2020-01-02" {
		t.Fatalf("updated_at stayed %s after an update", updated2)
	}
}
