package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func loadTestConfig(env map[string]string, args ...string) (Config, error) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cf := bindConfigFlags(fs)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	return loadConfig(func(k string) string { return env[k] }, fs, cf)
}

func TestConfigDefaults(t *testing.T) {
	c, err := loadTestConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "127.0.0.1:8080" || c.BrokerAddr != "127.0.0.1:9092" || c.DatabaseURL != "" ||
		c.KafkaBrokers != nil || !strings.HasSuffix(c.DataDir, "/data") || c.TopicPartitions != 3 ||
		c.ShutdownTimeout != 30*time.Second || c.PGUser != "postgres" || c.BrokerMaxBytes != 256<<20 ||
		c.SentimentInterval != 2*time.Second || c.SentimentBatch != 2000 {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.topicRetention(false) != 7*24*time.Hour || c.topicRetention(true) != 24*time.Hour {
		t.Errorf("retention defaults: %s on a user's cluster, %s on the embedded broker; want 168h, 24h",
			c.topicRetention(false), c.topicRetention(true))
	}
	c, err = loadTestConfig(map[string]string{"KAFKA_TOPIC_RETENTION": "2h"})
	if err != nil || c.topicRetention(false) != 2*time.Hour || c.topicRetention(true) != 2*time.Hour {
		t.Errorf("KAFKA_TOPIC_RETENTION=2h: %v, %s and %s", err, c.topicRetention(false), c.topicRetention(true))
	}
	if !c.RawArchive || c.RawRetention != 72*time.Hour {
		t.Errorf("raw archive defaults: RAW_ARCHIVE %v, KAFKA_RAW_RETENTION %s; want true, 72h", c.RawArchive, c.RawRetention)
	}
}

func TestConfigBrokerMaxBytes(t *testing.T) {
	for v, want := range map[string]int64{"256MiB": 256 << 20, "1GiB": 1 << 30, "1024KiB": 1 << 20, "10485760": 10 << 20} {
		c, err := loadTestConfig(map[string]string{"PLAYWATCH_BROKER_MAX_BYTES": v})
		if err != nil || c.BrokerMaxBytes != want {
			t.Errorf("%s: %d, %v; want %d", v, c.BrokerMaxBytes, err, want)
		}
	}
}

// The status page's read bounds: 5s and 4 pages by default, validated.
func TestConfigStatusPageReads(t *testing.T) {
	c, err := loadTestConfig(nil)
	if err != nil || c.ReadStatementTimeout != 5*time.Second || c.StatusPageMaxRenders != 4 {
		t.Fatalf("defaults: READ_STATEMENT_TIMEOUT %s, STATUS_PAGE_MAX_RENDERS %d, %v; want 5s, 4", c.ReadStatementTimeout, c.StatusPageMaxRenders, err)
	}
	for _, tc := range []struct{ name, value string }{
		{"READ_STATEMENT_TIMEOUT", "10ms"}, {"READ_STATEMENT_TIMEOUT", "1h"}, {"READ_STATEMENT_TIMEOUT", "soon"},
		{"STATUS_PAGE_MAX_RENDERS", "0"}, {"STATUS_PAGE_MAX_RENDERS", "65"}, {"STATUS_PAGE_MAX_RENDERS", "many"},
	} {
		if _, err := loadTestConfig(map[string]string{tc.name: tc.value}); err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: %v, want an error naming it", tc.name, tc.value, err)
		}
	}
}

func TestConfigFlagOverridesEnvironment(t *testing.T) {
	c, err := loadTestConfig(map[string]string{"PLAYWATCH_HTTP_ADDR": "127.0.0.1:1", "KAFKA_BROKERS": "a:1, b:2"},
		"--http-addr", "127.0.0.1:2")
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "127.0.0.1:2" {
		t.Errorf("HTTPAddr = %q, want the flag's value", c.HTTPAddr)
	}
	if len(c.KafkaBrokers) != 2 || c.KafkaBrokers[1] != "b:2" {
		t.Errorf("KafkaBrokers = %q", c.KafkaBrokers)
	}
}

// Each invalid value stops the program with a message naming its variable.
func TestConfigInvalidValuesNameTheVariable(t *testing.T) {
	cases := []struct{ name, value string }{
		{"DATABASE_URL", "mysql://x"},
		{"DATABASE_URL", "postgres://%zz"},
		{"KAFKA_BROKERS", "localhost"},
		{"KAFKA_BROKERS", "a:1,b:notaport"},
		{"PLAYWATCH_HTTP_ADDR", "8080"},
		{"PLAYWATCH_HTTP_ADDR", "127.0.0.1:99999"},
		{"PLAYWATCH_BROKER_ADDR", "0.0.0.0:9092"},
		{"PLAYWATCH_BROKER_FSYNC", "maybe"},
		{"PLAYWATCH_BROKER_MAX_BYTES", "256MB"},
		{"PLAYWATCH_BROKER_MAX_BYTES", "512KiB"},
		{"PLAYWATCH_BROKER_MAX_BYTES", "-1"},
		{"PLAYWATCH_BROKER_MAX_BYTES", "9999999GiB"},
		{"PLAYWATCH_PG_LISTEN", "5432"},
		{"PLAYWATCH_PG_LISTEN", "127.0.0.1:0"},
		{"PLAYWATCH_PG_WRITER_FROM", "192.0.2.7"},
		{"PLAYWATCH_PG_WRITER_FROM", "192.0.2.7/24"},
		{"PLAYWATCH_PG_WRITER_FROM", "192.0.2.0/24,,10.0.0.0/8"},
		{"PLAYWATCH_PG_WRITER_FROM", "db.example.com/32"},
		{"KAFKA_TOPIC_PARTITIONS", "-1"},
		{"KAFKA_TOPIC_PARTITIONS", "three"},
		{"KAFKA_TOPIC_REPLICATION", "0"},
		{"KAFKA_TOPIC_RETENTION", "7 days"},
		{"KAFKA_TOPIC_RETENTION", "-1h"},
		{"RAW_ARCHIVE", "sometimes"},
		{"KAFKA_RAW_RETENTION", "3dd"},
		{"KAFKA_RAW_RETENTION", "0s"},
		{"PLAYWATCH_SHUTDOWN_TIMEOUT", "0s"},
		{"KAFKA_ACKS", "some"},
		{"KAFKA_IDEMPOTENT", "yes please"},
		{"KAFKA_PRODUCE_RETRIES", "-1"},
		{"KAFKA_RETRY_BACKOFF", "1ms"},
		{"KAFKA_REQUEST_TIMEOUT", "soon"},
		{"KAFKA_DELIVERY_TIMEOUT", "0"},
		{"PUBLISH_RETRY_DELAYS", "5s,,20s"},
		{"PUBLISH_RETRY_DELAYS", "5s,-10s"},
		{"PLAYSTORE_URL", "play.google.com"},
		{"PLAYSTORE_URL", "ftp://play.google.com"},
		{"PROXIES", "http://ok:3128,proxy.example:3128"},
		{"PROXIES", "gopher://x:1"},
		{"RATE_LIMIT_REQUESTS", "-1"},
		{"RATE_LIMIT_PERIOD", "a minute"},
		{"EGRESS_MIN_GAP", "-1s"},
		{"EGRESS_MAX_IN_FLIGHT", "0"},
		{"PLAYSTORE_LANG", "english!"},
		{"PLAYSTORE_IRAN_COUNTRY", "i"},
		{"REVIEWS_PER_APP", "0"},
		{"CRAWL_INTERVAL", "hourly"},
		{"CRAWL_INTERVAL", "-1h"},
		{"CRAWL_WORKERS", "-1"},
		{"CRAWL_WORKERS", "0"},
		{"CRAWL_APP_TIMEOUT", "0s"},
		{"REVIEWS_FULL_SYNC_INTERVAL", "daily"},
		{"REVIEWS_FULL_SYNC_INTERVAL", "-24h"},
		{"REVIEWS_FULL_SYNC_INTERVAL", "30m"}, // shorter than CRAWL_INTERVAL
		{"LOG_LEVEL", "verbose"},
		{"LOG_FORMAT", "xml"},
		{"SENTIMENT_INTERVAL", "5ms"},
		{"SENTIMENT_INTERVAL", "2h"},
		{"SENTIMENT_INTERVAL", "soon"},
		{"SENTIMENT_BATCH", "0"},
		{"SENTIMENT_BATCH", "100000"},
	}
	for _, tc := range cases {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			_, err := loadTestConfig(map[string]string{tc.name: tc.value})
			if err == nil {
				t.Fatalf("%s=%q accepted", tc.name, tc.value)
			}
			if !strings.Contains(err.Error(), tc.name) {
				t.Fatalf("error %q does not name %s", err, tc.name)
			}
		})
	}
}

// REVIEWS_FULL_SYNC_INTERVAL: a day by default, 0s for a full read every
// cycle, else no shorter than CRAWL_INTERVAL.
func TestConfigReviewsFullSyncInterval(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want time.Duration
	}{
		{nil, 24 * time.Hour},
		{map[string]string{"REVIEWS_FULL_SYNC_INTERVAL": "0s"}, 0},
		{map[string]string{"REVIEWS_FULL_SYNC_INTERVAL": "1h"}, time.Hour},
		{map[string]string{"REVIEWS_FULL_SYNC_INTERVAL": "30m", "CRAWL_INTERVAL": "10m"}, 30 * time.Minute},
	} {
		c, err := loadTestConfig(tc.env)
		if err != nil || c.ReviewsFullSyncInterval != tc.want || schedulerConfigOf(c).FullResyncEvery != tc.want {
			t.Errorf("%v: %s, %v; want %s", tc.env, c.ReviewsFullSyncInterval, err, tc.want)
		}
	}
	_, err := loadTestConfig(map[string]string{"REVIEWS_FULL_SYNC_INTERVAL": "2h", "CRAWL_INTERVAL": "3h"})
	if err == nil || !strings.Contains(err.Error(), "REVIEWS_FULL_SYNC_INTERVAL") || !strings.Contains(err.Error(), "CRAWL_INTERVAL") {
		t.Errorf("a full sync interval shorter than the crawl interval: %v", err)
	}
}

// CRAWL_WORKERS=auto (the default) scales with the egresses and the pace
// each may keep; a number is taken as it is.
func TestConfigCrawlWorkers(t *testing.T) {
	proxies := func(n int) string {
		urls := make([]string, n)
		for i := range urls {
			urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 10000+i)
		}
		return strings.Join(urls, ",")
	}
	fleet := map[string]string{"PROXIES": proxies(167), "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "1.75s", "EGRESS_MAX_IN_FLIGHT": "1"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want int
	}{
		{"direct, the defaults", nil, 5},
		{"30 proxies, the default rate limit", map[string]string{"PROXIES": proxies(30)}, 5},
		{"600 proxies, the default rate limit", map[string]string{"PROXIES": proxies(600)}, 50},
		{"the fleet benchmark's servers", fleet, 48},
		{"no pacing at all", map[string]string{"PROXIES": proxies(600), "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s"}, 1000},
		{"a number", map[string]string{"PROXIES": proxies(600), "CRAWL_WORKERS": "7"}, 7},
	} {
		c, err := loadTestConfig(tc.env)
		if err != nil || c.CrawlWorkers != tc.want {
			t.Errorf("%s: CRAWL_WORKERS %d, %v; want %d", tc.name, c.CrawlWorkers, err, tc.want)
		}
	}
}

// PLAYWATCH_PG_WRITER_FROM: empty by default (other hosts get the reader
// only), else the networks it names, IPv4 and IPv6.
func TestConfigPGWriterFrom(t *testing.T) {
	c, err := loadTestConfig(nil)
	if err != nil || c.PGWriterFrom != nil {
		t.Fatalf("default: %v, %v; want none", c.PGWriterFrom, err)
	}
	c, err = loadTestConfig(map[string]string{"PLAYWATCH_PG_WRITER_FROM": "192.0.2.0/24, 2001:db8::/32,198.51.100.7/32"})
	if err != nil || fmt.Sprint(c.PGWriterFrom) != "[192.0.2.0/24 2001:db8::/32 198.51.100.7/32]" {
		t.Fatalf("got %v, %v", c.PGWriterFrom, err)
	}
}

func TestConfigProducerSettings(t *testing.T) {
	c, err := loadTestConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := producerSettings{Acks: "all", Idempotent: true, Retries: 5, RetryBackoff: 500 * time.Millisecond,
		RequestTimeout: 5 * time.Second, DeliveryTimeout: 15 * time.Second,
		AppRetryDelays: []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second}}
	if fmt.Sprint(c.Producer) != fmt.Sprint(want) {
		t.Fatalf("producer defaults %+v, want %+v", c.Producer, want)
	}
	_, err = loadTestConfig(map[string]string{"KAFKA_ACKS": "leader"})
	if err == nil || !strings.Contains(err.Error(), "KAFKA_IDEMPOTENT") {
		t.Fatalf("acks=leader with idempotence: %v", err)
	}
	c, err = loadTestConfig(map[string]string{"KAFKA_ACKS": "leader", "KAFKA_IDEMPOTENT": "false", "PUBLISH_RETRY_DELAYS": "none"})
	if err != nil || c.Producer.AppRetryDelays != nil {
		t.Fatalf("acks=leader without idempotence: %+v %v", c.Producer, err)
	}
}

// The registry refuses to take writes from the network without a token;
// commands that serve no registry do not care where it would listen.
func TestConfigRefusesOpenRegistryWithoutToken(t *testing.T) {
	open := map[string]string{"PLAYWATCH_HTTP_ADDR": "0.0.0.0:8080"}
	err := run(context.Background(), []string{"run"}, envFunc(open), io.Discard, io.Discard)
	var uerr usageError
	if !errors.As(err, &uerr) || !strings.Contains(err.Error(), "REGISTRY_TOKEN") || !strings.Contains(err.Error(), "PLAYWATCH_HTTP_ADDR") {
		t.Fatalf("err = %v, want a refusal naming PLAYWATCH_HTTP_ADDR and REGISTRY_TOKEN", err)
	}
	for _, tc := range []struct {
		addr, token string
		allowed     bool
	}{{"0.0.0.0:8080", "s3cret", true}, {"[::1]:8080", "", true}, {"127.0.0.1:8080", "", true}, {"0.0.0.0:8080", "", false}} {
		c, err := loadTestConfig(map[string]string{"PLAYWATCH_HTTP_ADDR": tc.addr, "REGISTRY_TOKEN": tc.token})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.checkRegistryExposure() == nil; got != tc.allowed {
			t.Errorf("%s with token %q: allowed = %v, want %v", tc.addr, tc.token, got, tc.allowed)
		}
	}
	if err := run(context.Background(), []string{"pcap", "--app", "a.b", "--scenario", "UPLOAD", "--dry-run", "testdata/pcap/resets.pcap"},
		envFunc(open), io.Discard, io.Discard); err != nil {
		t.Fatalf("pcap --dry-run with an open PLAYWATCH_HTTP_ADDR: %v", err)
	}
}

// PLAYWATCH_PG_WRITER_FROM only opens a non-loopback listener of the
// managed cluster: anywhere else it is ignored, which a start warns about.
func TestPGWriterFromIgnored(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		ignored string // a word of the reason; "" for not ignored
	}{
		{map[string]string{}, ""},
		{map[string]string{"PLAYWATCH_PG_LISTEN": "192.0.2.1:5432"}, ""},
		{map[string]string{"PLAYWATCH_PG_WRITER_FROM": "192.0.2.0/24", "PLAYWATCH_PG_LISTEN": "192.0.2.1:5432"}, ""},
		{map[string]string{"PLAYWATCH_PG_WRITER_FROM": "192.0.2.0/24", "PLAYWATCH_PG_LISTEN": "0.0.0.0:5432"}, ""},
		{map[string]string{"PLAYWATCH_PG_WRITER_FROM": "192.0.2.0/24"}, "PLAYWATCH_PG_LISTEN is empty"},
		{map[string]string{"PLAYWATCH_PG_WRITER_FROM": "192.0.2.0/24", "PLAYWATCH_PG_LISTEN": "127.0.0.1:5432"}, "loopback"},
		{map[string]string{"PLAYWATCH_PG_WRITER_FROM": "192.0.2.0/24", "PLAYWATCH_PG_LISTEN": "localhost:5432"}, "loopback"},
		{map[string]string{"PLAYWATCH_PG_WRITER_FROM": "192.0.2.0/24", "PLAYWATCH_PG_LISTEN": "192.0.2.1:5432",
			"DATABASE_URL": "postgres://db.example.com/playwatch"}, "DATABASE_URL is set"},
	} {
		c, err := loadTestConfig(tc.env)
		if err != nil {
			t.Fatal(err)
		}
		got := c.pgWriterFromIgnored()
		if (tc.ignored == "") != (got == "") || !strings.Contains(got, tc.ignored) {
			t.Errorf("%v: ignored %q, want one naming %q", tc.env, got, tc.ignored)
		}
	}
}
