package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// newPlayStore builds the Play Store client with its egresses (PROXIES or
// direct), each with its token bucket. maxWait bounds every wait for a
// benched egress or a retry (fetch's --max-wait); 0, for the crawler, bounds
// none. archiver (nil: none) gets every 200 answer.
func newPlayStore(cfg Config, maxWait time.Duration, archiver pageArchiver, reg prometheus.Registerer, logger *slog.Logger) (*playStoreClient, error) {
	pc := defaultProxyPoolConfig()
	pc.Proxies, pc.RateLimitRequests, pc.RateLimitPeriod = cfg.Proxies, cfg.RateLimitRequests, cfg.RateLimitPeriod
	pc.MinGap, pc.MaxInFlight, pc.MaxWait = cfg.EgressMinGap, cfg.EgressMaxInFlight, maxWait
	pool, err := newProxyPool(pc, reg, logger)
	if err != nil {
		return nil, fmt.Errorf("PROXIES: %w", err)
	}
	sc := defaultPlayStoreConfig()
	sc.BaseURL, sc.MaxWait = cfg.PlayStoreURL, maxWait
	client, err := newPlayStoreClient(sc, pool, archiver, reg, logger)
	if err != nil {
		return nil, fmt.Errorf("PLAYSTORE_URL: %w", err)
	}
	return client, nil
}

// newProducer is a Kafka client with the producer guarantees of cfg.
func newProducer(cfg Config, brokers []string) (*kgo.Client, error) {
	cl, err := kgo.NewClient(append(producerOptions(cfg.Producer), kafkaClientOptions(cfg.Kafka, brokers)...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	return cl, nil
}

// newArchiver is the raw page archive (rawarchive.go) on its own Kafka
// client, stopped by be's shutdown; nil with RAW_ARCHIVE=false (on the
// embedded broker: that of the playwatch that runs it).
func (be *backends) newArchiver(cfg Config, reg prometheus.Registerer, logger *slog.Logger) (pageArchiver, error) {
	if !be.rawArchive {
		return nil, nil
	}
	cl, err := kgo.NewClient(append(rawProducerOptions(cfg.Producer), kafkaClientOptions(cfg.Kafka, be.brokers)...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka producer of %s: %w", topicRawPages, err)
	}
	be.onClose(flushAndClose(cl))
	a, err := newRawArchive(cl, reg, logger)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// flushAndClose delivers what the producer still holds, then closes it.
func flushAndClose(cl *kgo.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		err := cl.Flush(ctx)
		cl.Close()
		if err != nil {
			return fmt.Errorf("flush producer: %w", err)
		}
		return nil
	}
}

func crawlerConfigOf(cfg Config) crawlerConfig {
	return crawlerConfig{Interval: cfg.CrawlInterval, ReviewsPerApp: cfg.ReviewsPerApp, AppTimeout: cfg.CrawlAppTimeout}
}

func schedulerConfigOf(cfg Config) schedulerConfig {
	return schedulerConfig{Interval: cfg.CrawlInterval, Lease: cfg.SchedulerLease, NewAppCheck: cfg.CrawlNewAppCheck,
		JobsGroup: cfg.CrawlJobsGroup, Locales: cfg.Locales, FullResyncEvery: cfg.ReviewsFullSyncInterval}
}

// backends are the services a command works with: PostgreSQL (migrated) and,
// when asked for, a Kafka-protocol broker with the playwatch topics. Each is
// external (DATABASE_URL, KAFKA_BROKERS), run by playwatch in its data
// directory, or, for a one-off command, those of the playwatch that runs on
// the data directory.
type backends struct {
	pool        *pgxpool.Pool
	databaseURL string // what pool connects to
	brokers     []string
	kafka       *kgo.Client // a plain client for admin requests and readiness
	// ownsDataDir: it holds the data directory's lock, to run a managed service.
	ownsDataDir bool
	// embedded is the broker this process runs, if any; budget keeps the
	// embedded broker's topics within PLAYWATCH_BROKER_MAX_BYTES, whether
	// this process runs it or attached to the playwatch that does.
	embedded *embeddedBroker
	budget   *brokerBudgetKeeper
	// rawArchive: the crawl archives its pages on raw-pages (RAW_ARCHIVE,
	// on the embedded broker that of the playwatch that runs it, whose
	// budget holds the topic).
	rawArchive bool
	schema     schemaState // what opening migrated
	stops      []func(context.Context) error
}

// backendOptions say what a command needs.
type backendOptions struct {
	broker bool // a broker too, not only the database
	// attach: a one-off command, which never runs a managed service: what
	// DATABASE_URL and KAFKA_BROKERS leave empty comes from the playwatch
	// that runs on the data directory, and without one the command fails.
	attach bool
	// metrics is where the backends' metrics go; nil: nowhere.
	metrics prometheus.Registerer
}

// brokerTrimInterval is how often the embedded broker's topics are trimmed
// to their budget and retention.
const brokerTrimInterval = 10 * time.Second

func openBackends(ctx context.Context, cfg Config, logger *slog.Logger, opts backendOptions) (_ *backends, err error) {
	be := &backends{}
	defer func() {
		if err != nil {
			err = errors.Join(err, be.shutdown(ctx, cfg.ShutdownTimeout))
		}
	}()
	if opts.metrics == nil {
		opts.metrics = prometheus.NewRegistry()
	}
	if why := cfg.pgWriterFromIgnored(); why != "" && !opts.attach {
		logger.Warn("PLAYWATCH_PG_WRITER_FROM is ignored", "reason", why)
	}
	// Without KAFKA_BROKERS the broker is the embedded one, this process's
	// or that of the playwatch it attaches to.
	embedded := len(cfg.KafkaBrokers) == 0
	var missing []string
	if cfg.DatabaseURL == "" {
		missing = append(missing, "DATABASE_URL")
	}
	if opts.broker && len(cfg.KafkaBrokers) == 0 {
		missing = append(missing, "KAFKA_BROKERS")
	}
	if len(missing) > 0 {
		if cfg, embedded, err = be.useDataDir(cfg, opts, embedded, missing, logger); err != nil {
			return nil, err
		}
	}
	if opts.broker && embedded {
		if err := cfg.Kafka.checkEmbeddedBroker(); err != nil {
			return nil, err
		}
	}
	if be.pool, err = openDatabase(ctx, cfg, logger, be); err != nil {
		return nil, err
	}
	if be.schema, err = migrateSchema(ctx, be.pool, logger); err != nil {
		return nil, err
	}
	if !opts.broker {
		return be, nil
	}
	if err := be.openKafka(ctx, cfg, opts, embedded, logger); err != nil {
		return nil, err
	}
	return be, nil
}

// useDataDir settles what openBackends does without DATABASE_URL (and
// KAFKA_BROKERS, for a command that needs a broker): a one-off command
// attaches to the services of the playwatch running on the data directory;
// run takes the data directory for its managed PostgreSQL (and embedded
// broker), locked until shutdown.
func (be *backends) useDataDir(cfg Config, opts backendOptions, embedded bool, missing []string, logger *slog.Logger) (Config, bool, error) {
	if !opts.attach {
		release, err := lockDataDir(cfg.DataDir)
		if err != nil {
			return cfg, embedded, err
		}
		be.ownsDataDir = true
		be.onClose(func(context.Context) error { release(); return nil })
		return cfg, embedded, nil
	}
	cfg, r, err := attachedConfig(cfg)
	if errors.Is(err, errNotRunning) {
		return cfg, embedded, fmt.Errorf("%w: start `playwatch run` on it, point PLAYWATCH_DATA_DIR at the data directory of a running playwatch, or set %s",
			err, strings.Join(missing, " and "))
	}
	if err != nil {
		return cfg, embedded, err
	}
	if opts.broker && embedded && !r.EmbeddedBroker {
		// Its brokers, reached with this command's own credentials.
		if err := cfg.Kafka.checkAttached(r); err != nil {
			return cfg, embedded, err
		}
	}
	if r.Version != version {
		logger.Warn("the playwatch that runs on the data directory is another version", "its_version", r.Version, "version", version)
	}
	logger.Info("using the services of the playwatch that runs on the data directory", "data_dir", cfg.DataDir, "pid", r.PID,
		"database", maskPasswords(cfg.DatabaseURL), "brokers", cfg.KafkaBrokers)
	return cfg, embedded && r.EmbeddedBroker, nil
}

// openKafka starts the embedded broker (or reaches KAFKA_BROKERS), creates
// the topics and, on the embedded broker, starts its disk budget keeper.
func (be *backends) openKafka(ctx context.Context, cfg Config, opts backendOptions, embedded bool, logger *slog.Logger) (err error) {
	be.rawArchive = cfg.RawArchive
	topics := createdTopics
	if cfg.RawArchive {
		topics = append(slices.Clone(createdTopics), topicRawPages)
	}
	var budget brokerBudget
	if embedded {
		if budget, err = planBrokerBudget(cfg.BrokerMaxBytes, cfg.topicRetention(true), topics); err != nil {
			return err
		}
	}
	if be.brokers, err = openBroker(cfg, budget.segmentBytes(), logger, be); err != nil {
		return err
	}
	if be.embedded != nil {
		opts.metrics.MustRegister(be.embedded.Collectors()...)
	}
	be.kafka, err = kgo.NewClient(kafkaClientOptions(cfg.Kafka, be.brokers)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	be.onClose(func(context.Context) error { be.kafka.Close(); return nil })
	spec := topicSpec{Partitions: cfg.TopicPartitions, Replication: cfg.TopicReplication, Retention: cfg.topicRetention(false)}
	if embedded {
		spec.Retention = 0 // trimmed by the budget keeper instead
	}
	if err := ensureTopics(ctx, kadm.NewClient(be.kafka), spec, createdTopics, logger); err != nil {
		// The first requests to the brokers: where TLS and SASL fail.
		return cfg.Kafka.explainKafkaError(err)
	}
	if cfg.RawArchive {
		if spec.Retention != 0 {
			spec.Retention = cfg.RawRetention
		}
		if err := ensureTopics(ctx, kadm.NewClient(be.kafka), spec, []string{topicRawPages}, logger); err != nil {
			return err
		}
	}
	if embedded {
		be.budget = newBrokerBudgetKeeper(budget, kadm.NewClient(be.kafka),
			newConsumerStore(be.pool, cfg.ConsumerGroup, cfg.Locales), opts.metrics, logger)
		be.budget.jobsGroup = cfg.CrawlJobsGroup
	}
	if be.embedded != nil {
		be.keepBrokerTrimmed(ctx, logger)
	}
	return nil
}

// keepBrokerTrimmed trims the embedded broker now, before anything is
// published, and then every brokerTrimInterval until shutdown.
func (be *backends) keepBrokerTrimmed(ctx context.Context, logger *slog.Logger) {
	if err := be.budget.trim(ctx); err != nil {
		logger.Warn("embedded broker: trimming its topics to PLAYWATCH_BROKER_MAX_BYTES failed; it is tried again", "err", err)
	}
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		be.budget.keepTrimmed(tctx, brokerTrimInterval)
	}()
	be.onClose(func(context.Context) error { cancel(); <-done; return nil })
}

// brokerReady is the broker's readiness: it answers, and the embedded
// broker this process runs can write its files.
func (be *backends) brokerReady(ctx context.Context) error {
	if err := be.kafka.Ping(ctx); err != nil {
		return err
	}
	if be.embedded != nil {
		return be.embedded.CheckWrites(ctx)
	}
	return nil
}

// publishGate holds sends back while the embedded broker's budget is full
// of records the storage consumer has not stored; nil on a user's cluster.
func (be *backends) publishGate() publishGate {
	if be.budget == nil {
		return nil
	}
	return be.budget
}

// attachedConfig points what cfg leaves empty of DATABASE_URL and
// KAFKA_BROKERS at the services of the playwatch that runs on cfg.DataDir
// (errNotRunning if none does), and returns what that playwatch published.
func attachedConfig(cfg Config) (Config, runningPlaywatch, error) {
	r, err := findRunning(cfg.DataDir)
	if err != nil {
		return cfg, r, err
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = r.DatabaseURL
	}
	if len(cfg.KafkaBrokers) == 0 {
		cfg.KafkaBrokers = r.Brokers
		if r.EmbeddedBroker {
			cfg.BrokerMaxBytes, cfg.TopicRetention, cfg.ConsumerGroup = r.BrokerMaxBytes, r.TopicRetention, r.ConsumerGroup
			cfg.RawArchive = r.RawArchive
		}
	}
	return cfg, r, nil
}

// onClose registers stop to run at shutdown, before everything registered
// earlier: what a command starts on top of the backends stops first.
func (be *backends) onClose(stop func(context.Context) error) { be.stops = append(be.stops, stop) }

// shutdown stops what openBackends started and what was registered with
// onClose, in reverse order, within timeout from now (also when ctx has
// ended).
func (be *backends) shutdown(ctx context.Context, timeout time.Duration) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	var errs []error
	for i := len(be.stops) - 1; i >= 0; i-- {
		errs = append(errs, be.stops[i](sctx))
	}
	be.stops = nil
	return errors.Join(errs...)
}

// openDatabase connects to DATABASE_URL, or starts the managed cluster
// when it is empty; what it starts is stopped by be's shutdown.
func openDatabase(ctx context.Context, cfg Config, logger *slog.Logger, be *backends) (*pgxpool.Pool, error) {
	dsn := cfg.DatabaseURL
	if dsn == "" {
		pg, err := startManagedPostgres(ctx, managedPostgresOptions{
			DataDir:    filepath.Join(cfg.DataDir, "postgres"),
			Database:   managedDatabase,
			OSUser:     cfg.PGUser,
			Listen:     cfg.PGListen,
			WriterFrom: cfg.PGWriterFrom,
			// Room for this server's pools, however many pages are drawn.
			MaxConnections: managedMaxConnections(controlPoolConns(), readPoolConns(cfg.StatusPageMaxRenders)),
		}, logger)
		if err != nil {
			return nil, fmt.Errorf("managed postgres: %w", err)
		}
		be.onClose(pg.Stop)
		dsn = pg.DSN()
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// Its text may quote the URL, password and all: only the redacted
		// text is kept.
		return nil, fmt.Errorf("DATABASE_URL: %s", cfg.redact(err.Error()))
	}
	be.databaseURL = dsn
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	be.onClose(func(context.Context) error { pool.Close(); return nil })
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	return pool, nil
}

// openBroker returns the seed brokers of KAFKA_BROKERS, or starts the
// embedded broker when it is empty; it is stopped by be's shutdown.
func openBroker(cfg Config, segmentBytes int64, logger *slog.Logger, be *backends) ([]string, error) {
	if len(cfg.KafkaBrokers) > 0 {
		return cfg.KafkaBrokers, nil
	}
	b, err := startEmbeddedBroker(embeddedBrokerOptions{
		Addr:           cfg.BrokerAddr,
		DataDir:        filepath.Join(cfg.DataDir, "broker"),
		Fsync:          cfg.BrokerFsync,
		RetentionCheck: 5 * time.Minute,
		SegmentBytes:   segmentBytes,
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("PLAYWATCH_BROKER_ADDR: %w", err)
	}
	be.embedded = b
	be.onClose(func(context.Context) error { b.Close(); return nil })
	return b.Addrs(), nil
}
