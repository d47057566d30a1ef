-- playwatch schema. Each "-- migration N: name" line starts a migration; they
-- run in order, each in its own transaction, and are recorded in
-- storage_consumer_migrations. Never edit an applied migration: add one.
-- The five tables are the contract of docs/schema.md.

-- migration 1: registry, stats, reviews, network metrics, dead letters
CREATE TABLE apps_registry_application (
    id               BIGSERIAL PRIMARY KEY,
    package_name     VARCHAR(255) NOT NULL UNIQUE,
    display_name     VARCHAR(255),
    category         VARCHAR(100),
    is_messaging_app BOOLEAN NOT NULL DEFAULT false,
    is_iranian_app   BOOLEAN NOT NULL DEFAULT false,
    is_active        BOOLEAN NOT NULL DEFAULT true,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- updated_at moves on every update, whoever writes it (API or crawler).
CREATE FUNCTION apps_registry_application_touch() RETURNS trigger AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER apps_registry_application_touch
    BEFORE UPDATE ON apps_registry_application
    FOR EACH ROW EXECUTE FUNCTION apps_registry_application_touch();

CREATE TABLE app_stats (
    id             BIGSERIAL PRIMARY KEY,
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    min_installs   BIGINT,
    score          DOUBLE PRECISION,
    ratings        BIGINT,
    reviews_count  BIGINT,
    version        VARCHAR(50),
    ad_supported   BOOLEAN,
    app_updated_at TIMESTAMPTZ,
    crawled_at     TIMESTAMPTZ NOT NULL,
    UNIQUE (application_id, crawled_at)
);
CREATE INDEX app_stats_crawled_at_idx ON app_stats (crawled_at);

CREATE TABLE reviews (
    id              BIGSERIAL PRIMARY KEY,
    application_id  BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    review_id       VARCHAR(255) NOT NULL UNIQUE,
    user_name       VARCHAR(255),
    thumbs_up_count INTEGER NOT NULL DEFAULT 0,
    score           SMALLINT,
    content         TEXT,
    at              TIMESTAMPTZ NOT NULL,
    sentiment       VARCHAR(20) CHECK (sentiment IN ('POSITIVE', 'NEUTRAL', 'NEGATIVE')),
    first_seen_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_synced_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX reviews_application_id_at_idx ON reviews (application_id, at);
CREATE INDEX reviews_at_idx ON reviews (at);

CREATE TABLE network_metrics (
    id                            BIGSERIAL PRIMARY KEY,
    application_id                BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    analysis_id                   UUID NOT NULL UNIQUE,
    scenario                      VARCHAR(20) NOT NULL CHECK (scenario IN ('UPLOAD', 'DOWNLOAD')),
    rtt_handshake                 DOUBLE PRECISION,
    retransmission_count          INTEGER NOT NULL DEFAULT 0,
    out_of_order_count            INTEGER NOT NULL DEFAULT 0,
    spurious_retransmission_count INTEGER NOT NULL DEFAULT 0,
    zero_window_count             INTEGER NOT NULL DEFAULT 0,
    tcp_reset_count               INTEGER NOT NULL DEFAULT 0,
    bytes_transferred_total       BIGINT NOT NULL,
    bytes_payload_total           BIGINT NOT NULL,
    overhead_ratio                DOUBLE PRECISION NOT NULL,
    source_pcap_filename          VARCHAR(255),
    analyzed_at                   TIMESTAMPTZ NOT NULL
);
CREATE INDEX network_metrics_application_id_analyzed_at_idx ON network_metrics (application_id, analyzed_at);

CREATE TABLE dead_letter_events (
    id           BIGSERIAL PRIMARY KEY,
    topic        VARCHAR(255) NOT NULL,
    "partition"  INTEGER NOT NULL,
    kafka_offset BIGINT NOT NULL,
    kafka_key    TEXT,
    raw_payload  BYTEA,
    error_reason TEXT NOT NULL,
    occurred_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (topic, "partition", kafka_offset)
);
CREATE INDEX dead_letter_events_occurred_at_idx ON dead_letter_events (occurred_at DESC);

-- migration 2: storage consumer offsets
-- The next offset of each partition the storage consumer has stored, written
-- in the same transaction as the rows of the batch: the database, not Kafka,
-- says where a partition resumes, so a crash between the database commit and
-- the Kafka commit neither loses nor repeats rows. Only ever moves forward.
CREATE TABLE consumer_offsets (
    consumer_group VARCHAR(255) NOT NULL,
    topic          VARCHAR(255) NOT NULL,
    "partition"    INTEGER NOT NULL,
    next_offset    BIGINT NOT NULL CHECK (next_offset >= 0),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, "partition")
);

-- migration 3: listing details and developer replies
-- All nullable: a message of an older playwatch, which lacks the fields, stores NULL.
ALTER TABLE app_stats
    ADD COLUMN real_installs  BIGINT,
    ADD COLUMN ratings_1      BIGINT,
    ADD COLUMN ratings_2      BIGINT,
    ADD COLUMN ratings_3      BIGINT,
    ADD COLUMN ratings_4      BIGINT,
    ADD COLUMN ratings_5      BIGINT,
    ADD COLUMN developer      VARCHAR(255),
    ADD COLUMN released_at    TIMESTAMPTZ,
    ADD COLUMN recent_changes TEXT;

ALTER TABLE reviews
    ADD COLUMN reply_content TEXT,
    ADD COLUMN replied_at    TIMESTAMPTZ,
    ADD COLUMN app_version   VARCHAR(50);

-- migration 4: reviews by app, time and sentiment
-- The status page counts an app's reviews per day and sentiment, and the
-- per-app gauges of /metrics all its reviews by sentiment: with sentiment in
-- the index both are index-only scans instead of a heap fetch per review.
CREATE INDEX reviews_application_id_at_sentiment_idx ON reviews (application_id, at) INCLUDE (sentiment);

-- migration 5: sentiment job
-- The sentiment job's own columns (sentiment_job.go, docs/schema.md "reviews"):
-- nothing else writes them. sentiment_text_hash is the hash of what the job
-- classified, reviews_sentiment_input(score, content), so a re-sync with the
-- same text and stars matches it and is not scored again.
ALTER TABLE reviews
    ADD COLUMN sentiment_model     VARCHAR(40),
    ADD COLUMN sentiment_at        TIMESTAMPTZ,
    ADD COLUMN sentiment_text_hash BYTEA;

-- Immutable (the database's encoding never changes), so that the partial
-- index below may use it.
CREATE FUNCTION reviews_sentiment_input(score SMALLINT, content TEXT) RETURNS BYTEA
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT sha256(convert_to(coalesce(score::text, '') || ':' || coalesce(content, ''), 'UTF8')) $$;

-- The job's work list: only the rows to score hold an entry, so finding work
-- is cheap however large the table; the predicate is evaluated on each new
-- row version.
CREATE INDEX reviews_sentiment_todo_idx ON reviews (id)
    WHERE sentiment IS NULL OR sentiment_text_hash IS DISTINCT FROM reviews_sentiment_input(score, content);

-- migration 6: crawl scheduler
-- The lease that makes one instance the scheduler leader: the holder renews
-- expires_at (the database's clock) before it passes; another instance takes
-- the row once it has, with epoch + 1. Planning a cycle checks the holder and
-- epoch in the same transaction, so a leader that lost the lease plans nothing.
CREATE TABLE scheduler_lease (
    name       VARCHAR(64) PRIMARY KEY,
    holder     VARCHAR(255) NOT NULL,
    epoch      BIGINT NOT NULL CHECK (epoch > 0),
    expires_at TIMESTAMPTZ NOT NULL
);

-- One row per crawl cycle planned. A cycle's jobs are published after its
-- row is inserted; job_end_offsets (partition -> end offset of crawl-jobs
-- right after they were) is set once they all are. The cycle is finished
-- when the crawl workers' committed offsets reach them.
CREATE TABLE crawl_cycles (
    id              BIGINT PRIMARY KEY CHECK (id > 0),
    planned_at      TIMESTAMPTZ NOT NULL,
    leader          VARCHAR(255) NOT NULL,
    leader_epoch    BIGINT NOT NULL,
    apps            INTEGER CHECK (apps >= 0),
    job_end_offsets JSONB,
    published_at    TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ
);

-- migration 7: last crawl outcome
-- Each app's last crawl outcome per storefront (country, lang) and path
-- (stats: the listing, reviews: the reviews RPC), written by whichever
-- crawler ran the job, so every server's status page and API can say why an
-- app has no data. One row per key, overwritten by each crawl.
CREATE TABLE app_crawl_outcomes (
    application_id BIGINT NOT NULL REFERENCES apps_registry_application(id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    path           VARCHAR(8) NOT NULL CHECK (path IN ('stats', 'reviews')),
    at             TIMESTAMPTZ NOT NULL,
    outcome        VARCHAR(32) NOT NULL,
    http_status    INTEGER,
    error          TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (application_id, country, lang, path)
);

-- migration 8: review read marks
-- Per app and storefront, the newest review of the app's last reviews read
-- that was complete: it reached the store's end, REVIEWS_PER_APP, or a stored
-- review at or before the mark before it, and every page was published. An
-- incremental read stops only at a stored review at or before the mark, so a
-- read that was cut (an error, a timeout, a cancel) never makes a later one
-- stop short of what it missed.
CREATE TABLE review_read_marks (
    application_id   BIGINT NOT NULL REFERENCES apps_registry_application(id) ON DELETE CASCADE,
    country          VARCHAR(8) NOT NULL,
    lang             VARCHAR(16) NOT NULL,
    newest_at        TIMESTAMPTZ NOT NULL,
    newest_review_id VARCHAR(255) NOT NULL,
    read_at          TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (application_id, country, lang)
);

-- migration 9: scheduler epochs and new-app crawls
-- One row per scheduler lease epoch: when it began and when its lease ends
-- (moved forward by each renewal, set to the resignation; final once the
-- next epoch began). Epochs never overlap on the database's clock. A crawl
-- worker accepts a job whose planned_at lies within its lease_epoch's
-- [began_at, ended_at): jobs planned by a leader whose lease had passed are
-- dropped, the queued jobs of a cycle planned under a valid lease stay valid.
CREATE TABLE scheduler_epochs (
    epoch    BIGINT PRIMARY KEY CHECK (epoch > 0),
    holder   VARCHAR(255) NOT NULL,
    began_at TIMESTAMPTZ NOT NULL,
    ended_at TIMESTAMPTZ NOT NULL
);

-- What the new-app watch published, per cycle, app and storefront: a new
-- leader (or the same server restarted) counts these apps as crawled in the
-- cycle, so none is read twice in it.
CREATE TABLE crawl_new_app_jobs (
    cycle_id       BIGINT NOT NULL REFERENCES crawl_cycles(id),
    application_id BIGINT NOT NULL REFERENCES apps_registry_application(id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    planned_at     TIMESTAMPTZ NOT NULL,
    lease_epoch    BIGINT NOT NULL,
    PRIMARY KEY (cycle_id, application_id, country, lang)
);

-- migration 10: discarded dead letters
-- `playwatch dlq discard` marks a dead letter that can never be stored: kept
-- for audit, skipped by dlq list and replay, the status page and the
-- dashboard unless asked for. discarded_by names who did it (--by, else the
-- OS user).
ALTER TABLE dead_letter_events
    ADD COLUMN discarded_at TIMESTAMPTZ,
    ADD COLUMN discarded_by TEXT,
    ADD CONSTRAINT dead_letter_events_discarded_check CHECK ((discarded_at IS NULL) = (discarded_by IS NULL));

-- migration 11: log generations
-- A partition's log generation counts the times the storage consumer moved
-- its stored offset back because the broker lost the log (data/broker
-- deleted, a new cluster). A dead letter carries the generation of the log
-- it was read from, so a bad record of a new log at the offset of a kept
-- dead letter of the old one gets its own row instead of being dropped.
ALTER TABLE consumer_offsets ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dead_letter_events
    ADD COLUMN generation INTEGER NOT NULL DEFAULT 0,
    DROP CONSTRAINT dead_letter_events_topic_partition_kafka_offset_key,
    ADD CONSTRAINT dead_letter_events_topic_partition_kafka_offset_generation_key UNIQUE (topic, "partition", kafka_offset, generation);

-- migration 12: notifier
-- reviews.text_lang is the sentiment job's: the language it detected in the
-- text (fa, en, other), written with the label. Destinations and rules are
-- the registry API's; a destination's secrets (webhook secret, bot token,
-- SMTP password, the full Slack/Discord URL) sit in a table of their own so
-- that playwatch_reader, which reads every other table, is not granted it.
-- notifications is the notifier's outbox: one row per rule, destination and
-- event key, inserted in the transaction that decides the event and marked
-- sent only after the receiver answered 2xx.
ALTER TABLE reviews ADD COLUMN text_lang VARCHAR(8);

CREATE TABLE notify_destinations (
    id         BIGSERIAL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    type       VARCHAR(20) NOT NULL CHECK (type IN ('webhook', 'slack', 'discord', 'telegram', 'email')),
    config     JSONB NOT NULL DEFAULT '{}',
    status     VARCHAR(10) NOT NULL DEFAULT 'ok' CHECK (status IN ('ok', 'broken')),
    last_error TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE notify_destination_secrets (
    destination_id BIGINT PRIMARY KEY REFERENCES notify_destinations (id) ON DELETE CASCADE,
    secrets        JSONB NOT NULL DEFAULT '{}'
);
-- The managed cluster's default privileges grant playwatch_reader every new
-- table; not this one (setUpAccess revokes it again after its grants).
DO $$ BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'playwatch_reader') THEN
        REVOKE ALL ON notify_destination_secrets FROM playwatch_reader;
    END IF;
END $$;

CREATE TABLE notify_rules (
    id           BIGSERIAL PRIMARY KEY,
    name         VARCHAR(255) NOT NULL,
    event        VARCHAR(20) NOT NULL CHECK (event IN ('review', 'rating_drop', 'negative_spike', 'crawl_failing', 'new_version')),
    apps         TEXT[],
    filter       JSONB NOT NULL DEFAULT '{}',
    max_per_hour INTEGER NOT NULL DEFAULT 20 CHECK (max_per_hour >= 0),
    backfill     INTERVAL NOT NULL DEFAULT '0',
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- RESTRICT: a destination a rule still uses cannot be deleted (the API
-- answers 409 naming the rules).
CREATE TABLE notify_rule_destinations (
    rule_id        BIGINT NOT NULL REFERENCES notify_rules (id) ON DELETE CASCADE,
    destination_id BIGINT NOT NULL REFERENCES notify_destinations (id) ON DELETE RESTRICT,
    PRIMARY KEY (rule_id, destination_id)
);
CREATE INDEX notify_rule_destinations_destination_id_idx ON notify_rule_destinations (destination_id);

-- event_at: when the event was stored (a review's first_seen_at or edit, an
-- alert's start), for playwatch_notify_delivery_seconds; source_at: a
-- review's time on the store, for playwatch_notify_review_age_seconds. A
-- row folded into a digest points at the digest's own row.
CREATE TABLE notifications (
    id              BIGSERIAL PRIMARY KEY,
    rule_id         BIGINT NOT NULL REFERENCES notify_rules (id) ON DELETE CASCADE,
    destination_id  BIGINT NOT NULL REFERENCES notify_destinations (id) ON DELETE CASCADE,
    event           VARCHAR(20) NOT NULL,
    event_key       TEXT NOT NULL,
    payload         JSONB NOT NULL,
    status          VARCHAR(10) NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    event_at        TIMESTAMPTZ NOT NULL,
    source_at       TIMESTAMPTZ,
    digest_id       BIGINT REFERENCES notifications (id) ON DELETE SET NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at         TIMESTAMPTZ,
    UNIQUE (rule_id, destination_id, event_key)
);
CREATE INDEX notifications_due_idx ON notifications (next_attempt_at) WHERE status = 'pending';
CREATE INDEX notifications_rule_destination_sent_at_idx ON notifications (rule_id, destination_id, sent_at) WHERE status = 'sent';

-- The event decider's (notify_events.go). It finds new reviews by
-- first_seen_at and new or changed texts by the sentiment job's
-- sentiment_at, from cursors in notify_cursors (its clock, with a margin
-- for transactions that commit late); a rule without a row in
-- notify_rule_scans, or edited since, has the reviews of its backfill read
-- once. notify_crawl_streaks follows each app's crawl outcomes (the
-- consecutive failures and the last success of PlaywatchAppNotCrawled,
-- which app_crawl_outcomes, one row per path, cannot say); notify_alert_state
-- holds each rule's open alert episodes, so that an alert fires once when
-- it starts (and crawl_failing once more when it ends).
CREATE INDEX reviews_first_seen_at_idx ON reviews (first_seen_at);
CREATE INDEX reviews_sentiment_at_idx ON reviews (sentiment_at);

CREATE TABLE notify_cursors (
    name VARCHAR(40) PRIMARY KEY,
    at   TIMESTAMPTZ NOT NULL
);

CREATE TABLE notify_rule_scans (
    rule_id         BIGINT PRIMARY KEY REFERENCES notify_rules (id) ON DELETE CASCADE,
    rule_updated_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE notify_crawl_streaks (
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    path           VARCHAR(8) NOT NULL,
    outcome_at     TIMESTAMPTZ NOT NULL,
    failures       INTEGER NOT NULL DEFAULT 0,
    last_ok_at     TIMESTAMPTZ,
    failing_since  TIMESTAMPTZ,
    PRIMARY KEY (application_id, country, lang, path)
);

CREATE TABLE notify_alert_state (
    rule_id        BIGINT NOT NULL REFERENCES notify_rules (id) ON DELETE CASCADE,
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    path           VARCHAR(8) NOT NULL DEFAULT '',
    started_at     TIMESTAMPTZ NOT NULL,
    cause          TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (rule_id, application_id, country, lang, path)
);

-- retry_from: when `playwatch notify retry` last put a row back; NOTIFY_GIVE_UP
-- counts from it (from created_at before any retry). A row folded into a
-- digest is not a message of its own: the outbox's partial indexes leave it
-- out, so that what counts messages (the throttle, the status page's card,
-- playwatch_notify_pending) reads the digest once and on the index alone.
ALTER TABLE notifications ADD COLUMN retry_from TIMESTAMPTZ;
DROP INDEX notifications_due_idx;
DROP INDEX notifications_rule_destination_sent_at_idx;
CREATE INDEX notifications_due_idx ON notifications (next_attempt_at) WHERE status = 'pending' AND digest_id IS NULL;
CREATE INDEX notifications_rule_destination_sent_at_idx ON notifications (rule_id, destination_id, sent_at) WHERE status = 'sent' AND digest_id IS NULL;
-- An app's first stored crawl is the earlier of its first app_stats row and
-- its first stored review; this makes the latter a probe.
CREATE INDEX reviews_application_id_first_seen_at_idx ON reviews (application_id, first_seen_at);
-- fired_at: when an episode's start message was decided, once its condition
-- held as long as the for: of its alert in alerts.yml; NULL while it waits.
ALTER TABLE notify_alert_state ADD COLUMN fired_at TIMESTAMPTZ;
-- migration 13: review topics
-- The sentiment job's column: what a review is about (crash, ads, login,
-- …), written in the same pass as the label; the GIN index serves the
-- reviews API's and the status page's topic filters.
ALTER TABLE reviews ADD COLUMN topics TEXT[];
CREATE INDEX reviews_topics_idx ON reviews USING GIN (topics);
-- The sentiment job's topics backfill finds the reviews labelled before
-- topics existed through this; the job writes topics with every label, so
-- it only shrinks.
CREATE INDEX reviews_topics_todo_idx ON reviews (id) WHERE topics IS NULL AND sentiment IS NOT NULL;

-- migration 14: sentiment models
-- Models `playwatch sentiment adapt` trained on the user's own reviews and
-- kept (they beat the embedded model on held-out apps); every sentiment
-- job uses the newest. version is sentimentModelVersion of bytes (a gzip
-- model file, docs/sentiment.md §3.2); figures what adapt measured.
CREATE TABLE sentiment_models (
    version    VARCHAR(40) PRIMARY KEY,
    bytes      BYTEA NOT NULL,
    figures    JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX sentiment_models_created_at_idx ON sentiment_models (created_at DESC);

-- migration 15: review search
-- search_text is the consumer's: the review's text in the sentiment code's
-- normal form (reviews_search.go), written with the review; search_version
-- is the version of that normalisation, so that a change of it is written
-- again by the backfill (playwatch migrate, or the consumer at start), which
-- also fills the rows stored before this migration. pg_trgm's GIN index
-- serves substring and word searches; Debian's postgresql ships it, on
-- another server: CREATE EXTENSION pg_trgm as a superuser first.
-- first_at is the review's `at` when first stored, never changed (an edited
-- review's `at` moves): the reviews API pages by it, so a walk over the
-- pages returns each review once however the reviews are re-synced.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
ALTER TABLE reviews
    ADD COLUMN search_text    TEXT,
    ADD COLUMN search_version SMALLINT,
    ADD COLUMN first_at       TIMESTAMPTZ;
UPDATE reviews SET first_at = at;
CREATE INDEX reviews_search_text_idx ON reviews USING GIN (search_text gin_trgm_ops);
CREATE INDEX reviews_first_at_idx ON reviews (first_at, id);
CREATE INDEX reviews_application_id_first_at_idx ON reviews (application_id, first_at, id);

-- migration 16: storefronts
-- An app's storefronts, (country, lang) pairs in the order the registry
-- was given them (position 0 first). An app without rows is read in its
-- default storefront, from is_iranian_app and the PLAYSTORE_* settings, as
-- every app was before storefronts existed.
CREATE TABLE app_storefronts (
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    position       SMALLINT NOT NULL CHECK (position >= 0 AND position < 20),
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    PRIMARY KEY (application_id, country, lang),
    UNIQUE (application_id, position)
);
-- A listing is read per storefront: app_stats rows gain the storefront they
-- were read in, and the unique key widens to it (an intended change of a
-- seed-schema key). Rows stored before this migration were read in the
-- app's default storefront; the migration assumes the default PLAYSTORE_*
-- values: ir/fa for an app with is_iranian_app, us/en for the others.
ALTER TABLE app_stats ADD COLUMN country VARCHAR(8), ADD COLUMN lang VARCHAR(16);
UPDATE app_stats s
   SET country = CASE WHEN a.is_iranian_app THEN 'ir' ELSE 'us' END,
       lang    = CASE WHEN a.is_iranian_app THEN 'fa' ELSE 'en' END
  FROM apps_registry_application a
 WHERE a.id = s.application_id;
ALTER TABLE app_stats
    ALTER COLUMN country SET NOT NULL,
    ALTER COLUMN lang SET NOT NULL,
    DROP CONSTRAINT app_stats_application_id_crawled_at_key,
    ADD CONSTRAINT app_stats_application_id_country_lang_crawled_at_key UNIQUE (application_id, country, lang, crawled_at);
-- Readers that ignore storefronts (an app's newest listing, a dashboard of
-- one-storefront apps) keep their index.
CREATE INDEX app_stats_application_id_crawled_at_idx ON app_stats (application_id, crawled_at);
-- A review is stored once (unique by its Play Store review_id); this table
-- records every storefront it was seen in, first_seen_at the first time it
-- was stored from that storefront. review_id is reviews.id (the row), not
-- the Play Store's id. Reviews stored before this migration get one row,
-- their app's default storefront (the same assumption as app_stats).
CREATE TABLE review_storefronts (
    review_id      BIGINT NOT NULL REFERENCES reviews (id) ON DELETE CASCADE,
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    first_seen_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (review_id, country, lang)
);
INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
SELECT r.id, r.application_id,
       CASE WHEN a.is_iranian_app THEN 'ir' ELSE 'us' END,
       CASE WHEN a.is_iranian_app THEN 'fa' ELSE 'en' END,
       r.first_seen_at
  FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id;
CREATE INDEX review_storefronts_application_id_idx ON review_storefronts (application_id, country, lang, first_seen_at);

-- migration 17: rollups
-- Counts the status page and the per-app gauges read instead of every
-- review (docs/schema.md §Rollups). Reviews are bucketed by the hour (UTC)
-- of `at`, the time every reader filters on; an edit that moves `at`, and a
-- new score, label, topics or app version, move the review's count from its
-- old bucket to its new one. Rows with country = '' and lang = '' count each
-- review of the app once (from reviews); the others count it in every
-- storefront review_storefronts has seen it in. '' is "none" for app_version
-- and sentiment, 0 for score. A count may fall to 0; the row stays.
CREATE TABLE review_rollup_hourly (
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    hour           TIMESTAMPTZ NOT NULL,
    app_version    VARCHAR(50) NOT NULL,
    score          SMALLINT NOT NULL,
    sentiment      VARCHAR(20) NOT NULL,
    reviews        BIGINT NOT NULL,
    PRIMARY KEY (application_id, country, lang, hour, app_version, score, sentiment)
);
-- One count per topic of reviews.topics (a review with two topics counts in
-- both); reviews without topics (NULL or '{}') have no row.
CREATE TABLE review_topic_rollup_hourly (
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    hour           TIMESTAMPTZ NOT NULL,
    app_version    VARCHAR(50) NOT NULL,
    topic          TEXT NOT NULL,
    sentiment      VARCHAR(20) NOT NULL,
    reviews        BIGINT NOT NULL,
    PRIMARY KEY (application_id, country, lang, hour, app_version, topic, sentiment)
);
-- Every stored review, whatever its time: the gauges' totals.
CREATE TABLE review_rollup_totals (
    application_id BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    country        VARCHAR(8) NOT NULL,
    lang           VARCHAR(16) NOT NULL,
    score          SMALLINT NOT NULL,
    sentiment      VARCHAR(20) NOT NULL,
    reviews        BIGINT NOT NULL,
    PRIMARY KEY (application_id, country, lang, score, sentiment)
);
-- Listings per app, storefront and UTC day: how many, their scores' sum
-- and count (the day's mean), and the day's newest listing.
CREATE TABLE app_stats_rollup_daily (
    application_id     BIGINT NOT NULL REFERENCES apps_registry_application (id) ON DELETE CASCADE,
    country            VARCHAR(8) NOT NULL,
    lang               VARCHAR(16) NOT NULL,
    day                TIMESTAMPTZ NOT NULL,
    listings           BIGINT NOT NULL,
    score_sum          DOUBLE PRECISION NOT NULL,
    score_n            BIGINT NOT NULL,
    last_crawled_at    TIMESTAMPTZ NOT NULL,
    last_score         DOUBLE PRECISION,
    last_ratings       BIGINT,
    last_real_installs BIGINT,
    last_min_installs  BIGINT,
    PRIMARY KEY (application_id, country, lang, day)
);
-- The writers' transactions keep the rollups: statement triggers with
-- transition tables count exactly the rows a statement inserted or changed
-- (a redelivered review that changes nothing, or an insert ON CONFLICT DO
-- NOTHING skipped, counts nothing), whoever writes (the consumer, dlq
-- replay, the sentiment job). Each takes pg_advisory_xact_lock_shared
-- (0x706c726c, app id) per app; rollups_rebuild_app takes it exclusively,
-- so a rebuild of one app waits for that app's writers and they for it.
CREATE TYPE review_rollup_delta AS (
    application_id BIGINT,
    country        VARCHAR(8),
    lang           VARCHAR(16),
    hour           TIMESTAMPTZ,
    app_version    VARCHAR(50),
    score          SMALLINT,
    sentiment      VARCHAR(20),
    topics         TEXT[],
    n              BIGINT
);
CREATE FUNCTION review_rollups_add(d review_rollup_delta[]) RETURNS void AS $$
BEGIN
    IF cardinality(d) = 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1886155372, (a & 2147483647)::int)
       FROM (SELECT DISTINCT application_id AS a FROM unnest(d) ORDER BY 1) l;
    -- Keys in order, so that two writers lock rollup rows in one order.
    WITH x AS MATERIALIZED (SELECT * FROM unnest(d)),
    h AS (
        INSERT INTO review_rollup_hourly AS t (application_id, country, lang, hour, app_version, score, sentiment, reviews)
        SELECT application_id, country, lang, hour, app_version, score, sentiment, sum(n) FROM x
         GROUP BY 1, 2, 3, 4, 5, 6, 7 HAVING sum(n) <> 0 ORDER BY 1, 2, 3, 4, 5, 6, 7
        ON CONFLICT (application_id, country, lang, hour, app_version, score, sentiment)
        DO UPDATE SET reviews = t.reviews + EXCLUDED.reviews),
    tp AS (
        INSERT INTO review_topic_rollup_hourly AS t (application_id, country, lang, hour, app_version, topic, sentiment, reviews)
        SELECT application_id, country, lang, hour, app_version, topic, sentiment, sum(n) FROM x CROSS JOIN unnest(x.topics) AS topic
         GROUP BY 1, 2, 3, 4, 5, 6, 7 HAVING sum(n) <> 0 ORDER BY 1, 2, 3, 4, 5, 6, 7
        ON CONFLICT (application_id, country, lang, hour, app_version, topic, sentiment)
        DO UPDATE SET reviews = t.reviews + EXCLUDED.reviews)
    INSERT INTO review_rollup_totals AS t (application_id, country, lang, score, sentiment, reviews)
    SELECT application_id, country, lang, score, sentiment, sum(n) FROM x
     GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0 ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (application_id, country, lang, score, sentiment)
    DO UPDATE SET reviews = t.reviews + EXCLUDED.reviews;
END
$$ LANGUAGE plpgsql;
-- A new review counts once for its app (country = lang = '').
CREATE FUNCTION reviews_rollup_insert() RETURNS trigger AS $$
BEGIN
    PERFORM review_rollups_add(ARRAY(
        SELECT ROW(application_id, '', '', date_trunc('hour', at, 'UTC'), coalesce(app_version, ''), coalesce(score, 0),
                   coalesce(sentiment, ''), topics, 1)::review_rollup_delta
          FROM new_rows));
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER reviews_rollup_insert AFTER INSERT ON reviews
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION reviews_rollup_insert();
-- A changed hour, app version, score, label or topics moves the review's
-- count, for its app and in each of its storefronts.
CREATE FUNCTION reviews_rollup_update() RETURNS trigger AS $$
BEGIN
    PERFORM review_rollups_add(ARRAY(
        WITH m AS (
            SELECT o.id, o.application_id AS oa, date_trunc('hour', o.at, 'UTC') AS oh, coalesce(o.app_version, '') AS ov,
                   coalesce(o.score, 0) AS os, coalesce(o.sentiment, '') AS ol, o.topics AS ot,
                   n.application_id AS na, date_trunc('hour', n.at, 'UTC') AS nh, coalesce(n.app_version, '') AS nv,
                   coalesce(n.score, 0) AS ns, coalesce(n.sentiment, '') AS nl, n.topics AS nt
              FROM old_rows o JOIN new_rows n ON n.id = o.id),
        c AS (
            SELECT * FROM m WHERE (oa, oh, ov, os, ol, ot) IS DISTINCT FROM (na, nh, nv, ns, nl, nt)),
        f AS (
            SELECT c.*, ''::varchar AS country, ''::varchar AS lang FROM c
            UNION ALL
            SELECT c.*, s.country, s.lang FROM c JOIN review_storefronts s ON s.review_id = c.id)
        SELECT ROW(oa, country, lang, oh, ov, os, ol, ot, -1)::review_rollup_delta FROM f
        UNION ALL
        SELECT ROW(na, country, lang, nh, nv, ns, nl, nt, 1)::review_rollup_delta FROM f));
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER reviews_rollup_update AFTER UPDATE ON reviews
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION reviews_rollup_update();
-- A review seen in a new storefront counts there too.
CREATE FUNCTION review_storefronts_rollup_insert() RETURNS trigger AS $$
BEGIN
    PERFORM review_rollups_add(ARRAY(
        SELECT ROW(s.application_id, s.country, s.lang, date_trunc('hour', r.at, 'UTC'), coalesce(r.app_version, ''),
                   coalesce(r.score, 0), coalesce(r.sentiment, ''), r.topics, 1)::review_rollup_delta
          FROM new_rows s JOIN reviews r ON r.id = s.review_id));
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER review_storefronts_rollup_insert AFTER INSERT ON review_storefronts
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION review_storefronts_rollup_insert();
-- app_stats is append-only: a listing adds to its day.
CREATE FUNCTION app_stats_rollup_insert() RETURNS trigger AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1886155372, (a & 2147483647)::int)
       FROM (SELECT DISTINCT application_id AS a FROM new_rows ORDER BY 1) l;
    INSERT INTO app_stats_rollup_daily AS t (application_id, country, lang, day, listings, score_sum, score_n,
        last_crawled_at, last_score, last_ratings, last_real_installs, last_min_installs)
    SELECT application_id, country, lang, date_trunc('day', crawled_at, 'UTC'), count(*), coalesce(sum(score), 0), count(score),
           max(crawled_at), (array_agg(score ORDER BY crawled_at DESC))[1], (array_agg(ratings ORDER BY crawled_at DESC))[1],
           (array_agg(real_installs ORDER BY crawled_at DESC))[1], (array_agg(min_installs ORDER BY crawled_at DESC))[1]
      FROM new_rows GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
    ON CONFLICT (application_id, country, lang, day) DO UPDATE SET
        listings = t.listings + EXCLUDED.listings, score_sum = t.score_sum + EXCLUDED.score_sum, score_n = t.score_n + EXCLUDED.score_n,
        last_crawled_at = greatest(t.last_crawled_at, EXCLUDED.last_crawled_at),
        last_score = CASE WHEN EXCLUDED.last_crawled_at > t.last_crawled_at THEN EXCLUDED.last_score ELSE t.last_score END,
        last_ratings = CASE WHEN EXCLUDED.last_crawled_at > t.last_crawled_at THEN EXCLUDED.last_ratings ELSE t.last_ratings END,
        last_real_installs = CASE WHEN EXCLUDED.last_crawled_at > t.last_crawled_at THEN EXCLUDED.last_real_installs ELSE t.last_real_installs END,
        last_min_installs = CASE WHEN EXCLUDED.last_crawled_at > t.last_crawled_at THEN EXCLUDED.last_min_installs ELSE t.last_min_installs END;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER app_stats_rollup_insert AFTER INSERT ON app_stats
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION app_stats_rollup_insert();
-- Recomputes one app's rollups from the raw tables (the migration for
-- every app, `playwatch rollup rebuild` app by app, each in its own
-- transaction).
CREATE FUNCTION rollups_rebuild_app(app BIGINT) RETURNS void AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1886155372, (app & 2147483647)::int);
    DELETE FROM review_rollup_hourly WHERE application_id = app;
    DELETE FROM review_topic_rollup_hourly WHERE application_id = app;
    DELETE FROM review_rollup_totals WHERE application_id = app;
    DELETE FROM app_stats_rollup_daily WHERE application_id = app;
    WITH x AS MATERIALIZED (
        SELECT ''::varchar AS country, ''::varchar AS lang, date_trunc('hour', at, 'UTC') AS hour, coalesce(app_version, '') AS app_version,
               coalesce(score, 0) AS score, coalesce(sentiment, '') AS sentiment, topics
          FROM reviews WHERE application_id = app
        UNION ALL
        SELECT s.country, s.lang, date_trunc('hour', r.at, 'UTC'), coalesce(r.app_version, ''), coalesce(r.score, 0),
               coalesce(r.sentiment, ''), r.topics
          FROM review_storefronts s JOIN reviews r ON r.id = s.review_id WHERE s.application_id = app),
    h AS (
        INSERT INTO review_rollup_hourly (application_id, country, lang, hour, app_version, score, sentiment, reviews)
        SELECT app, country, lang, hour, app_version, score, sentiment, count(*) FROM x GROUP BY 2, 3, 4, 5, 6, 7),
    tp AS (
        INSERT INTO review_topic_rollup_hourly (application_id, country, lang, hour, app_version, topic, sentiment, reviews)
        SELECT app, country, lang, hour, app_version, topic, sentiment, count(*)
          FROM x CROSS JOIN unnest(x.topics) AS topic GROUP BY 2, 3, 4, 5, 6, 7)
    INSERT INTO review_rollup_totals (application_id, country, lang, score, sentiment, reviews)
    SELECT app, country, lang, score, sentiment, count(*) FROM x GROUP BY 2, 3, 4, 5;
    INSERT INTO app_stats_rollup_daily (application_id, country, lang, day, listings, score_sum, score_n,
        last_crawled_at, last_score, last_ratings, last_real_installs, last_min_installs)
    SELECT app, country, lang, date_trunc('day', crawled_at, 'UTC'), count(*), coalesce(sum(score), 0), count(score),
           max(crawled_at), (array_agg(score ORDER BY crawled_at DESC))[1], (array_agg(ratings ORDER BY crawled_at DESC))[1],
           (array_agg(real_installs ORDER BY crawled_at DESC))[1], (array_agg(min_installs ORDER BY crawled_at DESC))[1]
      FROM app_stats WHERE application_id = app GROUP BY 2, 3, 4;
END
$$ LANGUAGE plpgsql;
SELECT rollups_rebuild_app(id) FROM apps_registry_application ORDER BY id;

-- migration 18: rollups in time order
-- rollups_rebuild_app wrote an app's rows in the order of its GROUP BY's
-- hash, so a storefront's last week of hourly buckets lay on as many heap
-- pages as the app's whole history: at ten times the history a read of
-- a week touched about five times the pages (226 against 41). Written in key order (app,
-- storefront, hour), a week is a few adjacent pages however long the
-- history. Rows already rebuilt keep their places until the next
-- `playwatch rollup rebuild`.
CREATE OR REPLACE FUNCTION rollups_rebuild_app(app BIGINT) RETURNS void AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1886155372, (app & 2147483647)::int);
    DELETE FROM review_rollup_hourly WHERE application_id = app;
    DELETE FROM review_topic_rollup_hourly WHERE application_id = app;
    DELETE FROM review_rollup_totals WHERE application_id = app;
    DELETE FROM app_stats_rollup_daily WHERE application_id = app;
    WITH x AS MATERIALIZED (
        SELECT ''::varchar AS country, ''::varchar AS lang, date_trunc('hour', at, 'UTC') AS hour, coalesce(app_version, '') AS app_version,
               coalesce(score, 0) AS score, coalesce(sentiment, '') AS sentiment, topics
          FROM reviews WHERE application_id = app
        UNION ALL
        SELECT s.country, s.lang, date_trunc('hour', r.at, 'UTC'), coalesce(r.app_version, ''), coalesce(r.score, 0),
               coalesce(r.sentiment, ''), r.topics
          FROM review_storefronts s JOIN reviews r ON r.id = s.review_id WHERE s.application_id = app),
    h AS (
        INSERT INTO review_rollup_hourly (application_id, country, lang, hour, app_version, score, sentiment, reviews)
        SELECT app, country, lang, hour, app_version, score, sentiment, count(*) FROM x GROUP BY 2, 3, 4, 5, 6, 7 ORDER BY 2, 3, 4, 5, 6, 7),
    tp AS (
        INSERT INTO review_topic_rollup_hourly (application_id, country, lang, hour, app_version, topic, sentiment, reviews)
        SELECT app, country, lang, hour, app_version, topic, sentiment, count(*)
          FROM x CROSS JOIN unnest(x.topics) AS topic GROUP BY 2, 3, 4, 5, 6, 7 ORDER BY 2, 3, 4, 5, 6, 7)
    INSERT INTO review_rollup_totals (application_id, country, lang, score, sentiment, reviews)
    SELECT app, country, lang, score, sentiment, count(*) FROM x GROUP BY 2, 3, 4, 5 ORDER BY 2, 3, 4, 5;
    INSERT INTO app_stats_rollup_daily (application_id, country, lang, day, listings, score_sum, score_n,
        last_crawled_at, last_score, last_ratings, last_real_installs, last_min_installs)
    SELECT app, country, lang, date_trunc('day', crawled_at, 'UTC'), count(*), coalesce(sum(score), 0), count(score),
           max(crawled_at), (array_agg(score ORDER BY crawled_at DESC))[1], (array_agg(ratings ORDER BY crawled_at DESC))[1],
           (array_agg(real_installs ORDER BY crawled_at DESC))[1], (array_agg(min_installs ORDER BY crawled_at DESC))[1]
      FROM app_stats WHERE application_id = app GROUP BY 2, 3, 4 ORDER BY 2, 3, 4;
END
$$ LANGUAGE plpgsql;
