package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Config is every setting of playwatch, read once at start and never
// changed afterwards. Each field comes from one environment variable (see
// settings), which a command-line flag of the same name may override.
type Config struct {
	DatabaseURL       string
	KafkaBrokers      []string
	DataDir           string
	HTTPAddr          string
	BrokerAddr        string
	BrokerFsync       bool
	BrokerMaxBytes    int64
	RegistryToken     string
	StatusPageToken   string
	AppGaugesInterval time.Duration
	PGListen          string
	PGWriterFrom      []netip.Prefix // PLAYWATCH_PG_WRITER_FROM
	PGUser            string
	TopicPartitions   int
	TopicReplication  int
	TopicRetention    time.Duration
	ShutdownTimeout   time.Duration
	RawArchive        bool          // RAW_ARCHIVE
	RawRetention      time.Duration // KAFKA_RAW_RETENTION
	LogLevel          slog.Level
	LogFormat         string
	Producer          producerSettings
	Kafka             kafkaSecurity // TLS and SASL (kafka_security.go)

	PlayStoreURL      string
	Proxies           []string
	RateLimitRequests int
	RateLimitPeriod   time.Duration
	EgressMinGap      time.Duration
	EgressMaxInFlight int
	Locales           localeDefaults
	ReviewsPerApp     int
	CrawlInterval     time.Duration
	CrawlWorkers      int
	CrawlAppTimeout   time.Duration
	CrawlNewAppCheck  time.Duration
	// ReviewsFullSyncInterval: how often each app's reviews are read in
	// full rather than up to the first stored one; 0: every cycle.
	ReviewsFullSyncInterval time.Duration
	SchedulerLease          time.Duration
	CrawlJobsGroup          string

	// Storage consumer (consumer.go).
	ConsumerGroup           string
	ConsumerMaxPollRecords  int
	ConsumerLinger          time.Duration
	ConsumerWriters         int
	ConsumerMaxRecordBytes  int
	ConsumerRetryMaxBackoff time.Duration

	// Sentiment job (sentiment_job.go).
	SentimentInterval time.Duration
	SentimentBatch    int

	// Notifier (notify_*.go).
	NotifyAllowPrivate  bool          // NOTIFY_ALLOW_PRIVATE
	NotifyProxy         string        // NOTIFY_PROXY; empty: direct
	TelegramAPIURL      string        // TELEGRAM_API_URL
	NotifySentimentWait time.Duration // NOTIFY_SENTIMENT_WAIT
	NotifyGiveUp        time.Duration // NOTIFY_GIVE_UP
	PublicURL           string        // PUBLIC_URL; empty: messages carry no status page link

	// Status page reads (statuspage.go), on their own connections.
	ReadStatementTimeout time.Duration // READ_STATEMENT_TIMEOUT
	StatusPageMaxRenders int           // STATUS_PAGE_MAX_RENDERS

	// secrets are what redact hides: the values of the secret settings and
	// the passwords in the others (settingSecrets).
	secrets []string
}

// setting binds one environment variable to a Config field. The flag name is
// derived from the variable: PLAYWATCH_HTTP_ADDR -> --http-addr.
type setting struct {
	env   string
	def   string
	help  string
	apply func(c *Config, v string) error
}

// settings is the single list of configuration knobs: --help prints it,
// loadConfig applies it.
var settings = []setting{
	{"DATABASE_URL", "", "PostgreSQL URL; empty: run a private cluster in $PLAYWATCH_DATA_DIR/postgres",
		func(c *Config, v string) (err error) { c.DatabaseURL, err = parseDatabaseURL(v); return }},
	{"KAFKA_BROKERS", "", "comma-separated Kafka/Redpanda seed brokers (host:port); empty: run an embedded broker",
		func(c *Config, v string) (err error) { c.KafkaBrokers, err = parseHostPorts(v); return }},
	{"PLAYWATCH_DATA_DIR", "./data", "directory for the managed PostgreSQL cluster and the embedded broker",
		func(c *Config, v string) (err error) { c.DataDir, err = parseDir(v); return }},
	{"PLAYWATCH_HTTP_ADDR", "127.0.0.1:8080", "listen address of the registry API, /healthz, /readyz and /metrics",
		func(c *Config, v string) (err error) { c.HTTPAddr, err = parseHostPort(v); return }},
	{"PLAYWATCH_BROKER_ADDR", "127.0.0.1:9092", "listen address of the embedded broker (a loopback address)",
		func(c *Config, v string) (err error) { c.BrokerAddr, err = parseLoopbackHostPort(v); return }},
	{"PLAYWATCH_BROKER_FSYNC", "false", "fsync every batch the embedded broker writes (survives power loss, slower)",
		func(c *Config, v string) (err error) { c.BrokerFsync, err = strconv.ParseBool(v); return }},
	{"PLAYWATCH_BROKER_MAX_BYTES", "256MiB", "most bytes the embedded broker's topics keep (KiB, MiB, GiB or plain bytes; at least 1MiB)",
		func(c *Config, v string) (err error) { c.BrokerMaxBytes, err = parseByteSize(v, 1<<20, 1<<40); return }},
	{"REGISTRY_TOKEN", "", "bearer token required for registry writes; required when PLAYWATCH_HTTP_ADDR is not loopback",
		func(c *Config, v string) error { c.RegistryToken = v; return nil }},
	{"STATUS_PAGE_TOKEN", "", "password (HTTP basic auth, any user name) the status page at / asks for; empty: the page is open, as the registry's GETs are",
		func(c *Config, v string) error { c.StatusPageToken = v; return nil }},
	{"APP_GAUGES_INTERVAL", "30s", "how often the per-app gauges of /metrics are read from PostgreSQL (1s to 1h); a scrape serves the last read",
		func(c *Config, v string) (err error) {
			c.AppGaugesInterval, err = parseDurationBetween(v, time.Second, time.Hour)
			return
		}},
	{"READ_STATEMENT_TIMEOUT", "5s", "longest a statement of the status page's and the registry API's reads may run (on their own PostgreSQL connections, apart from the lease, consumer and crawler); 100ms to 10m",
		func(c *Config, v string) (err error) {
			c.ReadStatementTimeout, err = parseDurationBetween(v, 100*time.Millisecond, 10*time.Minute)
			return
		}},
	{"STATUS_PAGE_MAX_RENDERS", "4", "status pages drawn at once (1 to 64); past it a page request answers 503 with Retry-After. The reads have this + 1 connections, at most 16",
		func(c *Config, v string) (err error) { c.StatusPageMaxRenders, err = parseInt(v, 1, 64); return }},
	{"PLAYWATCH_PG_LISTEN", "", "host:port where the managed PostgreSQL also listens on TCP, with passwords and TLS, which clients beyond loopback must use (playwatch db-url prints a URL); empty: unix socket only",
		func(c *Config, v string) (err error) {
			if v != "" {
				c.PGListen, err = parseHostPort(v)
			}
			if err == nil && strings.HasSuffix(c.PGListen, ":0") {
				err = errors.New("needs a fixed port: PostgreSQL cannot pick one, and its socket is named after it")
			}
			return
		}},
	{"PLAYWATCH_PG_WRITER_FROM", "", "comma-separated networks (CIDRs, e.g. 192.0.2.0/24) from which the writer role playwatch may connect over a non-loopback PLAYWATCH_PG_LISTEN; empty: other hosts get playwatch_reader only; ignored, with a warning, without such a listener or with DATABASE_URL",
		func(c *Config, v string) (err error) { c.PGWriterFrom, err = parseCIDRs(v); return }},
	{"PLAYWATCH_PG_USER", "postgres", "OS user that runs the managed PostgreSQL when playwatch runs as root",
		func(c *Config, v string) error { c.PGUser = v; return nonEmpty(v) }},
	{"KAFKA_TOPIC_PARTITIONS", "3", "partitions of each topic playwatch creates",
		func(c *Config, v string) (err error) { c.TopicPartitions, err = parseInt(v, 1, 10000); return }},
	{"KAFKA_TOPIC_REPLICATION", "-1", "replication factor of each topic playwatch creates; -1: the broker's default",
		func(c *Config, v string) (err error) { c.TopicReplication, err = parseReplication(v); return }},
	{"KAFKA_TOPIC_RETENTION", "", "how long topics keep messages (a duration such as 72h or 7d); empty: 168h on KAFKA_BROKERS, 24h on the embedded broker",
		func(c *Config, v string) (err error) {
			if v != "" {
				c.TopicRetention, err = parsePositiveDuration(v)
			}
			return
		}},
	{"RAW_ARCHIVE", "true", "publish every Play Store answer, compressed, to the raw-pages topic, for playwatch reparse",
		func(c *Config, v string) (err error) { c.RawArchive, err = strconv.ParseBool(v); return }},
	{"KAFKA_RAW_RETENTION", "72h", "retention.ms of the raw-pages topic on KAFKA_BROKERS (the embedded broker keeps it within its budget share)",
		func(c *Config, v string) (err error) { c.RawRetention, err = parsePositiveDuration(v); return }},
	{"PLAYWATCH_SHUTDOWN_TIMEOUT", "30s", "how long a graceful shutdown may take before it is cut short",
		func(c *Config, v string) (err error) { c.ShutdownTimeout, err = parsePositiveDuration(v); return }},
	{"KAFKA_ACKS", "all", "acknowledgements a produce waits for: all, leader or none",
		func(c *Config, v string) error { c.Producer.Acks = v; return oneOf(v, "all", "leader", "none") }},
	{"KAFKA_IDEMPOTENT", "true", "idempotent producer (no duplicates from the client's own retries; needs KAFKA_ACKS=all)",
		func(c *Config, v string) (err error) { c.Producer.Idempotent, err = strconv.ParseBool(v); return }},
	{"KAFKA_PRODUCE_RETRIES", "5", "retries of a record inside the Kafka client",
		func(c *Config, v string) (err error) { c.Producer.Retries, err = parseInt(v, 0, 1000); return }},
	{"KAFKA_RETRY_BACKOFF", "500ms", "wait between those retries (at least 10ms)",
		func(c *Config, v string) (err error) {
			c.Producer.RetryBackoff, err = parsePositiveDuration(v)
			if err == nil && c.Producer.RetryBackoff < 10*time.Millisecond {
				err = errors.New("must be at least 10ms")
			}
			return
		}},
	{"KAFKA_REQUEST_TIMEOUT", "5s", "how long the broker may take to answer a produce request",
		func(c *Config, v string) (err error) {
			c.Producer.RequestTimeout, err = parsePositiveDuration(v)
			return
		}},
	{"KAFKA_DELIVERY_TIMEOUT", "15s", "how long the client tries to deliver a record before it gives up on it",
		func(c *Config, v string) (err error) {
			c.Producer.DeliveryTimeout, err = parsePositiveDuration(v)
			return
		}},
	{"PUBLISH_RETRY_DELAYS", "5s,10s,20s", "waits before each resend of the records the client gave up on; none: fail at once",
		func(c *Config, v string) (err error) { c.Producer.AppRetryDelays, err = parseDurations(v); return }},
	{"KAFKA_TLS", "off", "on: connect to KAFKA_BROKERS with TLS (off, on)",
		func(c *Config, v string) (err error) { c.Kafka.TLS, err = parseOnOff(v); return }},
	{"KAFKA_TLS_CA_FILE", "", "PEM file of the CA certificates that sign the brokers' certificates; empty: the system's",
		func(c *Config, v string) error { c.Kafka.CAFile = v; return nil }},
	{"KAFKA_TLS_CERT_FILE", "", "PEM client certificate for mTLS (with KAFKA_TLS_KEY_FILE); empty: none",
		func(c *Config, v string) error { c.Kafka.CertFile = v; return nil }},
	{"KAFKA_TLS_KEY_FILE", "", "PEM private key of KAFKA_TLS_CERT_FILE",
		func(c *Config, v string) error { c.Kafka.KeyFile = v; return nil }},
	{"KAFKA_TLS_SERVER_NAME", "", "name the brokers' certificates must hold; empty: the host of each broker address",
		func(c *Config, v string) error { c.Kafka.ServerName = v; return nil }},
	{"KAFKA_SASL_MECHANISM", "", "SASL authentication to the brokers: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: none",
		func(c *Config, v string) error {
			c.Kafka.SASLMechanism = strings.ToUpper(v)
			if v == "" {
				return nil
			}
			return oneOf(c.Kafka.SASLMechanism, saslMechanisms...)
		}},
	{"KAFKA_SASL_USERNAME", "", "SASL user name",
		func(c *Config, v string) error { c.Kafka.SASLUsername = v; return nil }},
	{"KAFKA_SASL_USERNAME_FILE", "", "file holding the SASL user name, instead of KAFKA_SASL_USERNAME",
		func(c *Config, v string) error { c.Kafka.UsernameFile = v; return nil }},
	{"KAFKA_SASL_PASSWORD", "", "SASL password (never logged; KAFKA_SASL_PASSWORD_FILE keeps it out of the environment)",
		func(c *Config, v string) error { c.Kafka.SASLPassword = v; return nil }},
	{"KAFKA_SASL_PASSWORD_FILE", "", "file holding the SASL password, instead of KAFKA_SASL_PASSWORD",
		func(c *Config, v string) error { c.Kafka.PasswordFile = v; return nil }},
	{"PLAYSTORE_URL", "https://play.google.com", "base URL of the Play Store (a local replay server in tests and demos)",
		func(c *Config, v string) (err error) { c.PlayStoreURL, err = parseHTTPURL(v); return }},
	{"PROXIES", "", "comma-separated proxy URLs (http, https, socks5) for Play Store requests; empty: direct",
		func(c *Config, v string) (err error) { c.Proxies, err = parseProxies(v); return }},
	{"RATE_LIMIT_REQUESTS", "10", "Play Store requests per RATE_LIMIT_PERIOD, per egress (each proxy, or direct); 0: unlimited",
		func(c *Config, v string) (err error) { c.RateLimitRequests, err = parseInt(v, 0, 1000000); return }},
	{"RATE_LIMIT_PERIOD", "60s", "the period of RATE_LIMIT_REQUESTS",
		func(c *Config, v string) (err error) { c.RateLimitPeriod, err = parsePositiveDuration(v); return }},
	{"EGRESS_MIN_GAP", "1s", "least time between the starts of two requests on one egress; 0s: none",
		func(c *Config, v string) (err error) { c.EgressMinGap, err = parseDurationUpTo(v, time.Hour); return }},
	{"EGRESS_MAX_IN_FLIGHT", "2", "requests in flight at once on one egress",
		func(c *Config, v string) (err error) { c.EgressMaxInFlight, err = parseInt(v, 1, 1000); return }},
	{"PLAYSTORE_LANG", "en", "language (hl) the store is read in",
		func(c *Config, v string) error { c.Locales.Default.Lang = v; return parseLocaleCode(v) }},
	{"PLAYSTORE_COUNTRY", "us", "storefront country (gl) the store is read in",
		func(c *Config, v string) error { c.Locales.Default.Country = v; return parseLocaleCode(v) }},
	{"PLAYSTORE_IRAN_LANG", "fa", "language for apps registered with is_iranian_app",
		func(c *Config, v string) error { c.Locales.Iranian.Lang = v; return parseLocaleCode(v) }},
	{"PLAYSTORE_IRAN_COUNTRY", "ir", "storefront country for apps registered with is_iranian_app",
		func(c *Config, v string) error { c.Locales.Iranian.Country = v; return parseLocaleCode(v) }},
	{"REVIEWS_PER_APP", "1000", "newest reviews read per app and cycle",
		func(c *Config, v string) (err error) { c.ReviewsPerApp, err = parseInt(v, 1, 100000); return }},
	{"CRAWL_INTERVAL", "1h", "time between the starts of two crawl cycles",
		func(c *Config, v string) (err error) { c.CrawlInterval, err = parsePositiveDuration(v); return }},
	{"CRAWL_WORKERS", "auto", "apps crawled at the same time (1 to 1000); auto: enough to keep every egress busy, the larger of 5 and egresses × the requests each may have in flight at its pace (EGRESS_MAX_IN_FLIGHT, EGRESS_MIN_GAP, RATE_LIMIT_*) over 0.5 s",
		func(c *Config, v string) (err error) {
			if v == "auto" {
				c.CrawlWorkers = 0 // autoCrawlWorkers, once the egress settings are read
				return nil
			}
			c.CrawlWorkers, err = parseInt(v, 1, 1000)
			return
		}},
	{"CRAWL_APP_TIMEOUT", "15m", "longest time spent reading one app's listing and reviews",
		func(c *Config, v string) (err error) { c.CrawlAppTimeout, err = parsePositiveDuration(v); return }},
	{"REVIEWS_FULL_SYNC_INTERVAL", "24h", "how often each app's REVIEWS_PER_APP reviews are read in full (spread over the apps); in between a cycle stops after the first page with a review stored unchanged at or before the read mark of the last complete read; 0s: every cycle; else at least CRAWL_INTERVAL",
		func(c *Config, v string) (err error) {
			c.ReviewsFullSyncInterval, err = parseDurationUpTo(v, 365*24*time.Hour)
			return
		}},
	{"CRAWL_NEW_APP_CHECK", "30s", "how often the scheduler leader looks for apps registered or reactivated since its cycle was planned, and crawls them at once; with no active apps, for the first one, which starts a cycle",
		func(c *Config, v string) (err error) { c.CrawlNewAppCheck, err = parsePositiveDuration(v); return }},
	{"SCHEDULER_LEASE", "30s", "how soon another instance takes over planning the crawl cycles when the leader dies or loses the database (6s to 10m)",
		func(c *Config, v string) (err error) {
			// It is also the crawl-jobs group's session timeout, which
			// Kafka and Redpanda refuse below 6s by default.
			c.SchedulerLease, err = parseDurationBetween(v, 6*time.Second, 10*time.Minute)
			return
		}},
	{"CRAWL_JOBS_GROUP", "playwatch-crawl", "Kafka consumer group in which the crawlers of every instance share the crawl-jobs topic",
		func(c *Config, v string) (err error) { c.CrawlJobsGroup, err = parseGroupName(v); return }},
	{"LOG_LEVEL", "info", "debug, info, warn or error",
		func(c *Config, v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
	{"LOG_FORMAT", "text", "text or json",
		func(c *Config, v string) error {
			c.LogFormat = v
			return oneOf(v, "text", "json")
		}},

	// Storage consumer (consumer.go).
	{"CONSUMER_GROUP", "playwatch-storage", "Kafka consumer group of the storage consumer; its offsets are kept in the database under this name",
		func(c *Config, v string) (err error) { c.ConsumerGroup, err = parseGroupName(v); return }},
	{"CONSUMER_MAX_POLL_RECORDS", "5000", "records per storage batch (one database transaction), at most",
		func(c *Config, v string) (err error) { c.ConsumerMaxPollRecords, err = parseInt(v, 1, 100000); return }},
	{"CONSUMER_LINGER", "50ms", "how long a storage batch waits to fill up once it has records (0s: not at all)",
		func(c *Config, v string) (err error) {
			c.ConsumerLinger, err = parseDurationUpTo(v, time.Minute)
			return
		}},
	{"CONSUMER_WRITERS", "1", "storage batch transactions in flight at once, each on its own partitions and connection",
		func(c *Config, v string) (err error) { c.ConsumerWriters, err = parseInt(v, 1, 64); return }},
	{"CONSUMER_MAX_RECORD_BYTES", "1048576", "larger Kafka record values are dead letters",
		func(c *Config, v string) (err error) {
			c.ConsumerMaxRecordBytes, err = parseInt(v, 1024, 64<<20)
			return
		}},
	{"CONSUMER_RETRY_MAX_BACKOFF", "10s", "longest wait between retries of a batch the database cannot take (it is retried until it can)",
		func(c *Config, v string) (err error) {
			c.ConsumerRetryMaxBackoff, err = parsePositiveDuration(v)
			return
		}},

	// Sentiment job (sentiment_job.go).
	{"SENTIMENT_INTERVAL", "2s", "how long the sentiment job waits before looking for new work after a batch that was not full (10ms to 1h)",
		func(c *Config, v string) (err error) {
			c.SentimentInterval, err = parseDurationBetween(v, 10*time.Millisecond, time.Hour)
			return
		}},
	{"SENTIMENT_BATCH", "2000", "reviews the sentiment job scores per transaction (one UPDATE), at most",
		func(c *Config, v string) (err error) { c.SentimentBatch, err = parseInt(v, 1, 50000); return }},

	// Notifier (notify_*.go).
	{"NOTIFY_ALLOW_PRIVATE", "false", "let destinations send to loopback, private, link-local and unique-local addresses (checked when each message is sent)",
		func(c *Config, v string) (err error) { c.NotifyAllowPrivate, err = strconv.ParseBool(v); return }},
	{"NOTIFY_PROXY", "", "http, https or socks5 proxy URL for every message the notifier sends (Telegram and Slack are filtered in some countries); empty: direct",
		func(c *Config, v string) (err error) {
			if v == "" {
				return nil
			}
			_, err = parseProxyURL(v)
			c.NotifyProxy = v
			return
		}},
	{"TELEGRAM_API_URL", "https://api.telegram.org", "base URL of the Telegram Bot API",
		func(c *Config, v string) (err error) { c.TelegramAPIURL, err = parseHTTPURL(v); return }},
	{"NOTIFY_SENTIMENT_WAIT", "2m", "longest a review message of a rule that filters on sentiment waits for the sentiment label before it goes out with the label of its stars",
		func(c *Config, v string) (err error) {
			c.NotifySentimentWait, err = time.ParseDuration(v)
			if err == nil && (c.NotifySentimentWait < 0 || c.NotifySentimentWait > time.Hour) {
				err = errors.New("must be between 0s and 1h")
			}
			return
		}},
	{"NOTIFY_GIVE_UP", "24h", "after this long undelivered, a message is failed (`playwatch notify retry` sends it again)",
		func(c *Config, v string) (err error) { c.NotifyGiveUp, err = parsePositiveDuration(v); return }},
	{"PUBLIC_URL", "", "the URL people reach this playwatch at (e.g. https://playwatch.example.com); messages link to the app's status page when set",
		func(c *Config, v string) (err error) {
			if v == "" {
				return nil
			}
			c.PublicURL, err = parseHTTPURL(v)
			return
		}},
}

func (s setting) flagName() string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.env, "PLAYWATCH_")), "_", "-")
}

// configFlags holds the values of the config flags given on a command line.
type configFlags map[string]*string

// bindConfigFlags registers one string flag per setting on fs.
func bindConfigFlags(fs *flag.FlagSet) configFlags {
	cf := configFlags{}
	for _, s := range settings {
		cf[s.env] = fs.String(s.flagName(), "", "overrides $"+s.env)
	}
	return cf
}

// loadConfig builds the Config from defaults, the environment and the flags
// that were set, in that order of precedence, and validates it. Every error
// names the variable that is wrong.
func loadConfig(getenv func(string) string, fs *flag.FlagSet, cf configFlags) (_ Config, err error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var c Config
	values, from := make([]string, len(settings)), make([]string, len(settings))
	for i, s := range settings {
		values[i], from[i] = s.def, "default"
		if e := getenv(s.env); e != "" {
			values[i], from[i] = e, "environment"
		}
		if set[s.flagName()] {
			values[i], from[i] = *cf[s.env], "--"+s.flagName()
		}
		c.secrets = append(c.secrets, settingSecrets(s.env, values[i])...)
	}
	// A parser's error may quote the value (url.Parse does): none shows a
	// secret.
	secrets := redactable(c.secrets)
	defer func() {
		if err != nil {
			err = errors.New(Config{secrets: secrets}.redact(err.Error()))
		}
	}()
	for i, s := range settings {
		if err := s.apply(&c, values[i]); err != nil {
			shown := strconv.Quote(maskPasswords(values[i]))
			if isSecretSetting(s.env) {
				shown = "(not shown)"
			}
			return Config{}, fmt.Errorf("invalid %s=%s (from %s): %w", s.env, shown, from[i], err)
		}
	}
	if err := c.Kafka.finish(); err != nil {
		return Config{}, err
	}
	// Read from KAFKA_SASL_PASSWORD_FILE, perhaps.
	c.secrets = redactable(append(c.secrets, settingSecrets("KAFKA_SASL_PASSWORD", c.Kafka.SASLPassword)...))
	if c.CrawlWorkers == 0 {
		c.CrawlWorkers = c.autoCrawlWorkers()
	}
	if c.ReviewsFullSyncInterval != 0 && c.ReviewsFullSyncInterval < c.CrawlInterval {
		return Config{}, fmt.Errorf("REVIEWS_FULL_SYNC_INTERVAL=%s is shorter than CRAWL_INTERVAL=%s: set it to 0s to read every app's reviews in full every cycle, or to at least %s",
			c.ReviewsFullSyncInterval, c.CrawlInterval, c.CrawlInterval)
	}
	if c.Producer.Idempotent && c.Producer.Acks != "all" {
		return Config{}, fmt.Errorf("KAFKA_IDEMPOTENT=true needs KAFKA_ACKS=all (got %q): set KAFKA_IDEMPOTENT=false to use it", c.Producer.Acks)
	}
	return c, nil
}

// autoCrawlWorkers is CRAWL_WORKERS=auto: about as many workers as requests
// the egresses can have in flight at the pace they are allowed, so that a
// large proxy pool is not left idle behind the five workers a single
// egress needs. A worker holds a request for about 0.5 s (the fleet
// benchmark's relayed answers: p50 218 ms, p95 461 ms; README, Fleet
// benchmark), and waits for its egress's next slot in between, which
// takes no extra worker when there are more egresses than workers. 167
// proxies at EGRESS_MIN_GAP=1.75s and no rate limit give the 48 that
// benchmark ran with; one direct egress at the defaults gives 5.
func (c Config) autoCrawlWorkers() int {
	const requestHold, least, most = 0.5, 5, 1000
	perEgress := float64(c.EgressMaxInFlight) // requests in flight on one egress, at most
	if c.EgressMinGap > 0 {
		perEgress = min(perEgress, requestHold/c.EgressMinGap.Seconds())
	}
	if c.RateLimitRequests > 0 {
		perEgress = min(perEgress, requestHold*float64(c.RateLimitRequests)/c.RateLimitPeriod.Seconds())
	}
	egresses := max(1, len(c.Proxies))
	return min(most, max(least, int(math.Ceil(float64(egresses)*perEgress))))
}

// checkRegistryExposure refuses to serve registry writes to the network
// without a token; only `run` with the registry role serves them.
func (c Config) checkRegistryExposure() error {
	if !isLoopback(c.HTTPAddr) && c.RegistryToken == "" {
		return fmt.Errorf("PLAYWATCH_HTTP_ADDR=%q is not a loopback address and REGISTRY_TOKEN is empty: set REGISTRY_TOKEN so nobody else can change the registry", c.HTTPAddr)
	}
	return nil
}

// printSettings writes the table of the environment variables in list,
// for --help.
func printSettings(w io.Writer, list []setting) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	for _, s := range list {
		def := s.def
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.env, def, s.help)
	}
	tw.Flush()
}

// topicRetention is KAFKA_TOPIC_RETENTION, or its default: a week on a
// cluster of the user's, a day on the embedded broker, whose log only serves
// replay and inspection (its consumer drains it in seconds).
func (c Config) topicRetention(embedded bool) time.Duration {
	switch {
	case c.TopicRetention > 0:
		return c.TopicRetention
	case embedded:
		return 24 * time.Hour
	default:
		return 7 * 24 * time.Hour
	}
}

// settingGroups are the settings each part of playwatch reads. Every
// setting is in one group; a command's --help lists those it reads
// (commandSettings), `playwatch --help` them all.
var settingGroups = map[string][]string{
	"logging":  {"LOG_LEVEL", "LOG_FORMAT"},
	"services": {"PLAYWATCH_DATA_DIR", "DATABASE_URL", "PLAYWATCH_SHUTDOWN_TIMEOUT"},
	// What `run` reads to run the managed services and to serve HTTP.
	"managed postgres": {"PLAYWATCH_PG_LISTEN", "PLAYWATCH_PG_WRITER_FROM", "PLAYWATCH_PG_USER"},
	"embedded broker":  {"PLAYWATCH_BROKER_ADDR", "PLAYWATCH_BROKER_FSYNC", "PLAYWATCH_BROKER_MAX_BYTES"},
	"http": {"PLAYWATCH_HTTP_ADDR", "REGISTRY_TOKEN", "STATUS_PAGE_TOKEN", "APP_GAUGES_INTERVAL", "READ_STATEMENT_TIMEOUT",
		"STATUS_PAGE_MAX_RENDERS"},
	"kafka": {"KAFKA_BROKERS", "KAFKA_TOPIC_PARTITIONS", "KAFKA_TOPIC_REPLICATION", "KAFKA_TOPIC_RETENTION", "RAW_ARCHIVE", "KAFKA_RAW_RETENTION",
		"KAFKA_TLS", "KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE", "KAFKA_TLS_SERVER_NAME",
		"KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_USERNAME_FILE", "KAFKA_SASL_PASSWORD", "KAFKA_SASL_PASSWORD_FILE"},
	"producer": {"KAFKA_ACKS", "KAFKA_IDEMPOTENT", "KAFKA_PRODUCE_RETRIES", "KAFKA_RETRY_BACKOFF", "KAFKA_REQUEST_TIMEOUT", "KAFKA_DELIVERY_TIMEOUT", "PUBLISH_RETRY_DELAYS"},
	// What fetch reads of the crawler's settings: one app, one locale.
	"play store": {"PLAYSTORE_URL", "PROXIES", "RATE_LIMIT_REQUESTS", "RATE_LIMIT_PERIOD", "EGRESS_MIN_GAP", "EGRESS_MAX_IN_FLIGHT",
		"PLAYSTORE_LANG", "PLAYSTORE_COUNTRY", "REVIEWS_PER_APP", "CRAWL_APP_TIMEOUT"},
	"crawl": {"PLAYSTORE_IRAN_LANG", "PLAYSTORE_IRAN_COUNTRY", "CRAWL_INTERVAL", "CRAWL_WORKERS", "REVIEWS_FULL_SYNC_INTERVAL", "CRAWL_NEW_APP_CHECK",
		"SCHEDULER_LEASE", "CRAWL_JOBS_GROUP"},
	"consumer": {"CONSUMER_GROUP", "CONSUMER_MAX_POLL_RECORDS", "CONSUMER_LINGER", "CONSUMER_WRITERS", "CONSUMER_MAX_RECORD_BYTES",
		"CONSUMER_RETRY_MAX_BACKOFF"},
	"sentiment": {"SENTIMENT_INTERVAL", "SENTIMENT_BATCH"},
	"notifier":  {"NOTIFY_ALLOW_PRIVATE", "NOTIFY_PROXY", "TELEGRAM_API_URL", "NOTIFY_SENTIMENT_WAIT", "NOTIFY_GIVE_UP", "PUBLIC_URL"},
}

// commandSettings says what each command (by its name in
// parseCommandLine) reads: groups of settingGroups, or single settings.
var commandSettings = map[string][]string{
	"run": {"logging", "services", "managed postgres", "embedded broker", "http", "kafka", "producer", "play store", "crawl",
		"consumer", "sentiment", "notifier"},
	"crawl":              {"logging", "services", "kafka", "producer", "play store", "crawl"},
	"fetch":              {"logging", "play store"},
	"migrate":            {"logging", "services"},
	"pcap":               {"logging", "services", "kafka", "producer"},
	"dlq list":           {"logging", "services"},
	"dlq replay":         {"logging", "services", "CONSUMER_GROUP", "CONSUMER_MAX_RECORD_BYTES", "PLAYSTORE_LANG", "PLAYSTORE_COUNTRY", "PLAYSTORE_IRAN_LANG", "PLAYSTORE_IRAN_COUNTRY"},
	"dlq discard":        {"logging", "services"},
	"sentiment run":      {"logging", "services", "sentiment"},
	"sentiment rescore":  {"logging", "services"},
	"sentiment adapt":    {"logging", "services"},
	"sentiment classify": {"logging", "services"},
	"reparse":            {"logging", "services", "kafka", "producer"},
	"notify run":         {"logging", "services", "notifier"},
	"notify list":        {"logging", "services"},
	"notify retry":       {"logging", "services"},
	"rollup rebuild":     {"logging", "services"},
	"rollup check":       {"logging", "services"},
	"db-url":             {"PLAYWATCH_DATA_DIR", "DATABASE_URL"},
	// The storefront languages: a review's Google Play link, a listing's country and lang.
	"export reviews": {"logging", "services", "PLAYSTORE_LANG", "PLAYSTORE_COUNTRY", "PLAYSTORE_IRAN_LANG", "PLAYSTORE_IRAN_COUNTRY"},
	"export stats":   {"logging", "services", "PLAYSTORE_LANG", "PLAYSTORE_COUNTRY", "PLAYSTORE_IRAN_LANG", "PLAYSTORE_IRAN_COUNTRY"},
}

// commandSettingList is what a command reads, in the order of settings;
// every setting for a command commandSettings does not know.
func commandSettingList(command string) []setting {
	reads, ok := commandSettings[command]
	if !ok {
		return settings
	}
	want := map[string]bool{}
	for _, r := range reads {
		if g, ok := settingGroups[r]; ok {
			for _, env := range g {
				want[env] = true
			}
		} else {
			want[r] = true
		}
	}
	var out []setting
	for _, s := range settings {
		if want[s.env] {
			out = append(out, s)
		}
	}
	return out
}

// isSecretSetting: the value of the variable never appears in a message.
func isSecretSetting(env string) bool {
	return strings.HasSuffix(env, "_PASSWORD") || strings.HasSuffix(env, "_TOKEN")
}

// passwordMask stands for a password in what playwatch shows.
const passwordMask = "xxxxx"

// minRedactedLen: a known secret shorter than this is not replaced
// wherever it occurs (it would garble every message); maskPasswords still
// masks it where it stands as a password.
const minRedactedLen = 4

// settingSecrets are the secrets of a setting's value: all of it for a
// secret setting, else the passwords of the URLs (or key=value connection
// strings) it holds.
func settingSecrets(env, v string) []string {
	if v == "" {
		return nil
	}
	if isSecretSetting(env) {
		return []string{v}
	}
	return urlPasswords(v)
}

var passwordParam = regexp.MustCompile(`(?i)(^|[?&\s])(?:ssl)?password=('[^']*'|[^&\s#]*)`)

// urlPasswords are the passwords in v, a URL, a list of URLs or a
// key=value connection string, as written and unescaped. For a URL that
// does not parse every reading of its user info counts: the part before the
// first '/' or '@', and the part before the last '@'.
func urlPasswords(v string) []string {
	var out []string
	add := func(pw string) {
		if pw == "" {
			return
		}
		out = append(out, pw)
		for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
			if u, err := unescape(pw); err == nil && u != pw {
				out = append(out, u)
			}
		}
	}
	for _, part := range append(strings.Split(v, ","), v) {
		p := part
		if i := strings.Index(p, "://"); i >= 0 {
			p = p[i+3:]
		}
		if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
			_, pw, _ := strings.Cut(p[:i], ":")
			add(pw)
		}
		q, _, _ := strings.Cut(p, "?")
		if i := strings.LastIndex(q, "@"); i >= 0 {
			_, pw, _ := strings.Cut(q[:i], ":")
			add(pw)
		}
	}
	for _, m := range passwordParam.FindAllStringSubmatch(v, -1) {
		add(strings.Trim(m[2], "'"))
	}
	return out
}

var (
	// userInfoPassword is the password of user info in a URL, or of a
	// user:password@host of a URL without its scheme.
	userInfoPassword = regexp.MustCompile("(^|[\\s\"'`(=,;<]|//)([^\\s:@/\"'`,;<>]*):([^\\s@\"'`,;<>/][^\\s@\"'`,;<>]*)@")
	// passwordValue is a password parameter of a URL or connection string.
	passwordValue = regexp.MustCompile(`(?i)\b((?:ssl)?password)=('[^']*'|[^\s&#'"` + "`" + `]+)`)
)

// maskPasswords masks what stands as a password in s: the user info of a
// URL (user:xxxxx@) and password= and sslpassword= parameters.
func maskPasswords(s string) string {
	// Every log attribute comes here: the regexps run only on text that
	// can hold what they match.
	if strings.IndexByte(s, '@') >= 0 {
		s = userInfoPassword.ReplaceAllString(s, "${1}${2}:"+passwordMask+"@")
	}
	if containsFold(s, "password=") {
		s = passwordValue.ReplaceAllString(s, "${1}="+passwordMask)
	}
	return s
}

// containsFold: s holds sub in any case (sub is ASCII), without allocating.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// redactable are the secrets redact replaces: those long enough, each
// once, the longest first (a secret may hold another).
func redactable(secrets []string) []string {
	secrets = slices.DeleteFunc(slices.Clone(secrets), func(s string) bool { return len(s) < minRedactedLen })
	slices.SortFunc(secrets, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	return slices.Compact(secrets)
}

// redact is s without c's secrets, and with whatever stands as a password
// masked: for every message, log line and /readyz body.
func (c Config) redact(s string) string {
	for _, sec := range c.secrets {
		s = strings.ReplaceAll(s, sec, passwordMask)
	}
	return maskPasswords(s)
}

// redactingHandler is a log handler whose lines are redacted (Config.redact).
type redactingHandler struct {
	slog.Handler
	cfg Config
}

func (h redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.cfg.redact(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.redactAttr(a))
		return true
	})
	return h.Handler.Handle(ctx, out)
}

func (h redactingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = h.redactAttr(a)
	}
	return redactingHandler{h.Handler.WithAttrs(red), h.cfg}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{h.Handler.WithGroup(name), h.cfg}
}

func (h redactingHandler) redactAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.cfg.redact(v.String()))
	case slog.KindGroup:
		attrs := v.Group()
		red := make([]slog.Attr, len(attrs))
		for i, ga := range attrs {
			red[i] = h.redactAttr(ga)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(red...)}
	case slog.KindAny:
		// An error, a list of addresses…: kept as it is unless its text
		// holds a secret.
		text := fmt.Sprint(v.Any())
		if red := h.cfg.redact(text); red != text {
			return slog.String(a.Key, red)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// redactChecks makes the /readyz body of each check's error redacted.
func redactChecks(cfg Config, checks []readinessCheck) {
	for i, c := range checks {
		check := c.check
		checks[i].check = func(ctx context.Context) error {
			err := check(ctx)
			var note readinessNote
			if errors.As(err, &note) {
				// A note keeps its type: /readyz shows it and stays 200.
				return readinessNote(cfg.redact(string(note)))
			}
			if err != nil {
				return errors.New(cfg.redact(err.Error()))
			}
			return nil
		}
	}
}

// commandSecrets are the secrets of a command line and its environment,
// found before (and whether or not) its config loads: run redacts the
// error it returns with them.
func commandSecrets(args []string, getenv func(string) string) Config {
	var c Config
	byFlag := map[string]string{}
	passwordFiles := []string{getenv("KAFKA_SASL_PASSWORD_FILE")}
	for _, s := range settings {
		byFlag[s.flagName()] = s.env
		c.secrets = append(c.secrets, settingSecrets(s.env, getenv(s.env))...)
	}
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			c.secrets = append(c.secrets, urlPasswords(a)...)
			continue
		}
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		env, ok := byFlag[name]
		if !ok {
			continue
		}
		if !hasValue && i+1 < len(args) {
			v = args[i+1]
		}
		c.secrets = append(c.secrets, settingSecrets(env, v)...)
		if env == "KAFKA_SASL_PASSWORD_FILE" {
			passwordFiles = append(passwordFiles, v)
		}
	}
	// The password a file holds, read as the SASL set-up reads it, when it
	// is a file that can be read (one that cannot holds no password to show).
	for _, f := range passwordFiles {
		if fi, err := os.Stat(f); f == "" || err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if v, _, err := valueOrFile("KAFKA_SASL_PASSWORD", "", f); err == nil {
			c.secrets = append(c.secrets, v)
		}
	}
	c.secrets = redactable(c.secrets)
	return c
}

// parseOnOff reads a switch: on or off (true and false too).
func parseOnOff(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "on", "true":
		return true, nil
	case "off", "false":
		return false, nil
	}
	return false, errors.New("must be on or off")
}

// parseGroupName reads the name of a Kafka consumer group.
func parseGroupName(v string) (string, error) {
	if len(v) > 255 {
		return "", errors.New("must be at most 255 characters")
	}
	return v, nonEmpty(v)
}

func nonEmpty(v string) error {
	if v == "" {
		return errors.New("must not be empty")
	}
	return nil
}

func oneOf(v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("must be one of %s", strings.Join(allowed, ", "))
}

func parseInt(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("not an integer")
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("must be between %d and %d", lo, hi)
	}
	return n, nil
}

// parseByteSize reads a size such as 256MiB, 1GiB, 512KiB or 1048576.
func parseByteSize(v string, lo, hi int64) (int64, error) {
	num, unit := v, int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(v, u.suffix) {
			num, unit = strings.TrimSuffix(v, u.suffix), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("not a size such as 256MiB, 1GiB, 512KiB or a number of bytes")
	}
	if n > hi/unit || n*unit < lo || n*unit > hi {
		return 0, fmt.Errorf("must be between %s and %s", formatBytes(lo), formatBytes(hi))
	}
	return n * unit, nil
}

// formatBytes writes n in the largest binary unit that divides it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

func parseReplication(v string) (int, error) {
	n, err := parseInt(v, -1, 100)
	if err == nil && n == 0 {
		err = errors.New("must be -1 (broker default) or at least 1")
	}
	return n, err
}

func parsePositiveDuration(v string) (time.Duration, error) {
	d, err := parseDuration(v)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, errors.New("must be positive")
	}
	return d, nil
}

// parseDurations reads a comma-separated list of positive durations.
func parseDurations(v string) ([]time.Duration, error) {
	if v == "none" {
		return nil, nil
	}
	var out []time.Duration
	for _, part := range strings.Split(v, ",") {
		d, err := parsePositiveDuration(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%q: %w (or the word none)", part, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// parseDurationBetween reads a positive duration from lo to hi.
func parseDurationBetween(v string, lo, hi time.Duration) (time.Duration, error) {
	d, err := parsePositiveDuration(v)
	if err == nil && (d < lo || d > hi) {
		return 0, fmt.Errorf("must be between %s and %s", formatDuration(lo), formatDuration(hi))
	}
	return d, err
}

func parseDurationUpTo(v string, limit time.Duration) (time.Duration, error) {
	d, err := parseDuration(v)
	if err != nil {
		return 0, err
	}
	if d < 0 || d > limit {
		return 0, fmt.Errorf("must be between 0s and %s", limit)
	}
	return d, nil
}

func parseDir(v string) (string, error) {
	if v == "" {
		return "", errors.New("must not be empty")
	}
	return filepath.Abs(v)
}

func parseDatabaseURL(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	u, err := url.Parse(v)
	if err != nil {
		return "", errors.New("not a URL")
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", errors.New("must start with postgres:// or postgresql://")
	}
	return v, nil
}

func parseHTTPURL(v string) (string, error) {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", errors.New("not an http:// or https:// URL")
	}
	return strings.TrimRight(v, "/"), nil
}

func parseProxies(v string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if _, err := parseProxyURL(p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// parseLocaleCode accepts language and country codes such as en, fa, pt-BR.
func parseLocaleCode(v string) error {
	if len(v) < 2 || len(v) > 8 || strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-") != "" {
		return errors.New("not a language or country code such as en, fa, us, ir")
	}
	return nil
}

func parseHostPort(v string) (string, error) {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return "", errors.New("not host:port")
	}
	if strings.ContainsAny(host, " /") {
		return "", errors.New("not a host name or IP address")
	}
	if _, err := parseInt(port, 0, 65535); err != nil {
		return "", fmt.Errorf("port %q: %w", port, err)
	}
	return v, nil
}

func parseLoopbackHostPort(v string) (string, error) {
	if _, err := parseHostPort(v); err != nil {
		return "", err
	}
	if !isLoopback(v) {
		return "", errors.New("must be a loopback address such as 127.0.0.1:9092")
	}
	return v, nil
}

func parseHostPorts(v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, hp := range strings.Split(v, ",") {
		hp = strings.TrimSpace(hp)
		if _, err := parseHostPort(hp); err != nil {
			return nil, fmt.Errorf("%q: %w", hp, err)
		}
		out = append(out, hp)
	}
	return out, nil
}

// parseCIDRs parses comma-separated networks such as 192.0.2.0/24 or
// 2001:db8::/32; an address with host bits set is refused rather than
// guessed at (a single host is 192.0.2.7/32).
func parseCIDRs(v string) ([]netip.Prefix, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a network in CIDR notation such as 192.0.2.0/24 (one host: 192.0.2.7/32)", s)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("%q has host bits set: the network is %s, one host is %s/%d", s, p.Masked(), p.Addr(), p.Addr().BitLen())
		}
		out = append(out, p)
	}
	return out, nil
}

// pgWriterFromIgnored says why PLAYWATCH_PG_WRITER_FROM, when set, has no
// effect ("" when it has, or is empty): it only opens a non-loopback
// listener of the managed cluster. A warning at start, not a refusal: the
// same environment may serve a host whose listener is loopback or which
// uses an external database, and nothing is opened wider than it says.
func (c Config) pgWriterFromIgnored() string {
	switch {
	case len(c.PGWriterFrom) == 0:
		return ""
	case c.DatabaseURL != "":
		return "DATABASE_URL is set, so playwatch runs no managed PostgreSQL"
	case c.PGListen == "":
		return "PLAYWATCH_PG_LISTEN is empty, so the managed PostgreSQL has no TCP listener"
	case isLoopback(c.PGListen):
		return "PLAYWATCH_PG_LISTEN is a loopback address, where both roles may connect anyway"
	}
	return ""
}

// isLoopback reports whether a host:port only accepts local connections.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
