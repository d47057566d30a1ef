// Command playwatch watches Google Play apps: a registry of apps, an hourly
// crawler, a Kafka pipeline into PostgreSQL and a pcap analyzer, in one binary.
//
// main.go is the composition root: the only file that builds real objects
// (database pools, Kafka clients, servers) and hands them to the roles.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "playwatch: %s received, shutting down (send it again to exit at once)\n", s)
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "playwatch: second signal, exiting without finishing the shutdown")
		os.Exit(130)
	}()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	cancel()
	os.Exit(exitStatus(err, os.Stderr))
}

// exitStatus reports what run returned on stderr, the error first, and is
// the exit status for it: 2 for a wrong command line, 1 for another error.
func exitStatus(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "playwatch:", err)
	var herr helpError
	if errors.As(err, &herr) {
		fmt.Fprint(stderr, "\n"+herr.help)
	}
	var uerr usageError
	if errors.As(err, &uerr) {
		return 2
	}
	return 1
}

// usageError is a wrong command line; main exits with status 2 for it.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// helpError is a usage error that main follows with help, after the error.
type helpError struct {
	usageError
	help string
}

func (e helpError) Unwrap() error { return e.usageError }

const usageText = `playwatch watches Google Play apps: a registry, an hourly crawler, Kafka and PostgreSQL.

Usage:
  playwatch run [--roles registry,crawler,consumer,sentiment,notifier] [flags]
                                             run the appliance (all roles unless --roles picks some)
  playwatch crawl [--once] [flags]           the crawler role alone (--once: plan one cycle now, crawl it, print a summary)
  playwatch fetch [--lang L --country C] [--reviews N] [--max-wait D] PACKAGE
                                             read one app from the Play Store and print its messages as JSON lines
  playwatch migrate [flags]                  apply the database migrations and exit
  playwatch pcap --app PKG --scenario UPLOAD|DOWNLOAD [--dry-run] FILE...
                                             analyse captures into network-metrics messages
  playwatch dlq list|replay|discard [flags]  list dead letters, store them again once their cause is fixed, or discard them
  playwatch sentiment run|rescore [flags]    score stored reviews' sentiment alone, or mark them for re-scoring
  playwatch sentiment classify [--lang auto|fa|en] [--json] [--model embedded|db]
                                             label review texts from stdin (no database, no broker, but with --model db)
  playwatch sentiment adapt [--min-per-class N] [--dry-run] [flags]
                                             train on the stored reviews' stars; keep the model only if it is better
  playwatch notify run [flags]               run the notifier role alone (decide and deliver notifications)
  playwatch notify list [--status S] [--rule ID] [--destination ID] [--limit N]
                                             show the notifications of the outbox, newest first
  playwatch notify retry ID...|--failed      send failed (or the given) notifications again
  playwatch reparse [--since 24h] [--until T] [--package P] [--dry-run]
                                             parse the archived raw pages again and publish their messages
  playwatch export reviews|stats [--package P] [--q Q] [--stars S] [--sentiment L] [--since D] [--until T] [--format csv|ndjson|json] [--output FILE]
                                             export reviews or an app's listing history from the database
  playwatch db-url [--reader]                print a URL of the managed PostgreSQL (for psql, dashboards)
  playwatch version                          print the version and exit

Each environment variable ('playwatch --help' lists them) has a flag that overrides it;
'playwatch COMMAND --help' shows a command's own flags and the variables it reads.
`

// run is the whole program; main only adds the process: signals, exit codes.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := runCommand(ctx, args, getenv, stdout, stderr)
	switch {
	case errors.Is(err, errHelp):
		return nil // a command's --help printed its usage
	case err != nil:
		// Whatever an error quotes (a library's error may quote a URL it
		// could not read), no secret of the settings shows.
		if text := commandSecrets(args, getenv).redact(err.Error()); text != err.Error() {
			return redactedError{err, text}
		}
	}
	return err
}

// redactedError is an error whose text had secrets, shown without them.
type redactedError struct {
	err  error
	text string
}

func (e redactedError) Error() string { return e.text }
func (e redactedError) Unwrap() error { return e.err }

func runCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return helpError{usageError{"no command given"}, usageText}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		return cmdRun(ctx, rest, getenv, stdout, stderr)
	case "migrate":
		return cmdMigrate(ctx, rest, getenv, stdout, stderr)
	case "pcap":
		return cmdPcap(ctx, rest, getenv, stdout, stderr)
	case "crawl":
		return cmdCrawl(ctx, rest, getenv, stdout, stderr)
	case "fetch":
		return cmdFetch(ctx, rest, getenv, stdout, stderr)
	case "dlq":
		return cmdDLQ(ctx, rest, getenv, stdout, stderr)
	case "reparse":
		return cmdReparse(ctx, rest, getenv, stdout, stderr)
	case "export":
		return cmdExport(ctx, rest, getenv, stdout, stderr)
	case "db-url":
		return cmdDBURL(rest, getenv, stdout, stderr)
	case "sentiment":
		return cmdSentiment(ctx, rest, getenv, os.Stdin, stdout, stderr)
	case "notify":
		return cmdNotify(ctx, rest, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "playwatch", version)
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, "Environment variables (a flag of the same name overrides each, e.g. --http-addr):")
		printSettings(stdout, settings)
		return nil
	default:
		return helpError{usageError{fmt.Sprintf("unknown command %q", cmd)}, usageText}
	}
}

// commandLine is a parsed command line: its config, its logger and the
// arguments after the flags.
type commandLine struct {
	cfg    Config
	logger *slog.Logger
	args   []string
}

// parseCommandLine parses a command's flags (its own, registered by
// addFlags, plus one per config variable) and loads the config.
// errHelp means --help was asked for and its usage printed on stdout; a
// wrong flag prints the usage on stderr.
func parseCommandLine(name, synopsis string, args []string, getenv func(string) string, stdout, stderr io.Writer, addFlags func(*flag.FlagSet)) (commandLine, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if addFlags != nil {
		addFlags(fs)
	}
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[f.Name] = true })
	cf := bindConfigFlags(fs)
	var usage bytes.Buffer
	fs.Usage = func() {
		fmt.Fprintf(&usage, "Usage: playwatch %s\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			if own[f.Name] {
				fmt.Fprintf(&usage, "  --%s\t%s%s\n", f.Name, f.Usage, flagDefault(f))
			}
		})
		fmt.Fprintln(&usage)
		fmt.Fprintln(&usage, "Environment variables it reads (a flag of the same name overrides each; 'playwatch --help' lists all):")
		printSettings(&usage, commandSettingList(name))
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = usage.WriteTo(stdout)
			return commandLine{}, errHelp
		}
		_, _ = usage.WriteTo(stderr)
		return commandLine{}, usageError{err.Error()}
	}
	cfg, err := loadConfig(getenv, fs, cf)
	if err != nil {
		return commandLine{}, usageError{err.Error()}
	}
	return commandLine{cfg: cfg, logger: newLogger(cfg, stderr), args: fs.Args()}, nil
}

var errHelp = errors.New("help shown")

// flagDefault is the " (default …)" of a flag's usage line: nothing for a
// zero default, a string quoted, a boolean or a number as it is.
func flagDefault(f *flag.Flag) string {
	switch v := f.DefValue; {
	case v == "" || v == "0" || v == "false":
		return ""
	case isBoolFlag(f.Value):
		return " (default " + v + ")"
	default:
		if _, err := strconv.ParseFloat(v, 64); err == nil {
			return " (default " + v + ")"
		}
		return fmt.Sprintf(" (default %q)", v)
	}
}

func isBoolFlag(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(redactingHandler{h, cfg})
}

// allRoles are what `run --roles` can pick.
var allRoles = []string{"registry", "crawler", "consumer", "sentiment", "notifier"}

func parseRoles(s string) ([]string, error) {
	var roles []string
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if !slices.Contains(allRoles, r) {
			return nil, usageError{fmt.Sprintf("--roles: unknown role %q (known: %s)", r, strings.Join(allRoles, ","))}
		}
		if !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}
	return roles, nil
}

func cmdRun(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var rolesFlag string
	cl, err := parseCommandLine("run", "run [--roles LIST] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&rolesFlag, "roles", strings.Join(allRoles, ","), "comma-separated roles to run: "+strings.Join(allRoles, ","))
	})
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("run takes no arguments, got %q", cl.args)}
	}
	roles, err := parseRoles(rolesFlag)
	if err != nil {
		return err
	}
	if slices.Contains(roles, "registry") {
		if err := cl.cfg.checkRegistryExposure(); err != nil {
			return usageError{err.Error()}
		}
	}
	cfg, logger := cl.cfg, cl.logger
	started := time.Now()
	logger.Info("playwatch starting", "version", version, "roles", roles, "data_dir", cfg.DataDir)

	reg := newMetricsRegistry(version)
	be, err := openBackends(ctx, cfg, logger, backendOptions{broker: true, metrics: reg})
	if err != nil {
		return err
	}
	// Every started part registers its stop with the backends; they run in
	// reverse order at shutdown: intake first, the backends last.
	// What it published for the one-off commands goes first: they must not
	// attach to services that are stopping.
	unpublish := func() {}
	shutdown := func() error { unpublish(); return be.shutdown(ctx, cfg.ShutdownTimeout) }

	// A role that ends on its own (it failed) ends the appliance.
	roleDone := make(chan error, len(allRoles)+1)
	startRole := func(name string, fn func(context.Context) error) {
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() {
			err := fn(rctx)
			if err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			done <- err
			if rctx.Err() == nil {
				roleDone <- err
			}
		}()
		be.onClose(func(sctx context.Context) error {
			cancel()
			select {
			case err := <-done:
				return err
			case <-sctx.Done():
				return fmt.Errorf("%s did not stop within PLAYWATCH_SHUTDOWN_TIMEOUT", name)
			}
		})
	}

	// Started in the reverse order of the shutdown: the consumer stops after
	// the producer flushed, and commits what it stored; intake stops first,
	// the sentiment job last.
	if slices.Contains(roles, "sentiment") {
		model, err := loadSentimentModel()
		if err != nil {
			return errors.Join(fmt.Errorf("sentiment model: %w", err), shutdown())
		}
		job := newSentimentJob(be.pool, model, sentimentJobConfigOf(cfg), reg, logger)
		job.watchModels = true // the newest model sentiment adapt kept, if any
		startRole("sentiment", job.Run)
	}
	// The notifier stops before the sentiment job: its sends in flight get
	// half of PLAYWATCH_SHUTDOWN_TIMEOUT to finish and be marked.
	if slices.Contains(roles, "notifier") {
		notifier, err := newNotifierRole(be.pool, cfg, reg, logger)
		if err != nil {
			return errors.Join(err, shutdown())
		}
		startRole("notifier", notifier)
	}
	checks := []readinessCheck{
		{"database", be.pool.Ping},
		{"broker", be.brokerReady},
	}
	if slices.Contains(roles, "consumer") {
		sc := newStorageConsumer(be.pool, consumerOptionsFrom(cfg), reg, logger)
		// Its offset resets, shown without failing readiness.
		checks = append(checks, readinessCheck{"consumer", sc.readiness})
		cl, err := kgo.NewClient(append(kafkaClientOptions(cfg.Kafka, be.brokers), sc.clientOptions()...)...)
		if err != nil {
			return errors.Join(fmt.Errorf("storage consumer kafka client: %w", err), shutdown())
		}
		be.onClose(func(context.Context) error { cl.Close(); return nil })
		startRole("consumer", func(ctx context.Context) error { return sc.Run(ctx, cl) })
		// Reviews stored before migration 15 or with an older search
		// normalisation get their search text in the background; a
		// failure is logged, and the next start tries again.
		startRole("search backfill", func(ctx context.Context) error {
			if _, err := backfillSearchText(ctx, be.pool, logger); err != nil && ctx.Err() == nil {
				logger.Error("search backfill failed; searches miss the reviews it did not reach until the next start", "err", err)
			}
			<-ctx.Done()
			return nil
		})
	}
	if slices.Contains(roles, "crawler") {
		cr, err := newCrawlerRole(cfg, be, reg, logger)
		if err != nil {
			return errors.Join(err, shutdown())
		}
		startRole("crawler", cr.run)
	}

	var api *registryAPI
	var status *statusPage
	var more []apiRoutes
	if slices.Contains(roles, "registry") {
		// The page, the gauges and the registry API's GETs read on their
		// own connections: the lease, the consumer and the crawler never
		// wait behind them. The API's writes stay on the appliance's pool.
		reads, err := openReadPool(ctx, be.databaseURL, cfg.ReadStatementTimeout, cfg.StatusPageMaxRenders)
		if err != nil {
			return errors.Join(err, shutdown())
		}
		be.onClose(func(context.Context) error { reads.Close(); return nil })
		api = &registryAPI{store: newRegistryStore(be.pool, reads), token: cfg.RegistryToken, locales: cfg.Locales, logger: logger,
			reviews: newReviewsAPI(reads, cfg.Locales, reviewsToken(cfg), logger)}
		// POST /api/v1/destinations/{id}/test sends through the sender the
		// notifier uses, with the same egress rules (NOTIFY_ALLOW_PRIVATE, NOTIFY_PROXY).
		sender, err := newNotifySender(notifySenderConfigOf(cfg), logger)
		if err != nil {
			return errors.Join(err, shutdown())
		}
		more = append(more, &notifyAPI{pool: be.pool, reads: reads, token: cfg.RegistryToken, allowPrivate: cfg.NotifyAllowPrivate,
			tester: sender, logger: logger})
		status = newStatusPage(statusDB{reads}, reg, cfg.StatusPageToken, cfg.CrawlInterval, cfg.AppGaugesInterval, cfg.StatusPageMaxRenders, logger)
		status.reviews = &reviewsSource{pager: reviewsDB{pool: reads, locales: cfg.Locales}, token: reviewsToken(cfg)}
		startRole("app gauges", status.appGauges.run)
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return errors.Join(fmt.Errorf("PLAYWATCH_HTTP_ADDR: %w", err), shutdown())
	}
	if be.ownsDataDir {
		up, err := publishRunning(cfg.DataDir, runningPlaywatch{PID: os.Getpid(), Version: version, StartedAt: started,
			DatabaseURL: be.databaseURL, Brokers: be.brokers, PGListen: managedPGListen(cfg), ManagedPostgres: cfg.DatabaseURL == "",
			EmbeddedBroker: be.embedded != nil, BrokerMaxBytes: cfg.BrokerMaxBytes, TopicRetention: cfg.topicRetention(true), ConsumerGroup: cfg.ConsumerGroup,
			KafkaTLS: cfg.Kafka.TLS, KafkaSASLMechanism: cfg.Kafka.SASLMechanism,
			RawArchive: cfg.RawArchive, PGWriterFrom: len(cfg.PGWriterFrom) > 0 && cfg.pgWriterFromIgnored() == ""})
		if err != nil {
			ln.Close()
			return errors.Join(err, shutdown())
		}
		unpublish = up
	}
	redactChecks(cfg, checks)
	srv := newHTTPServer(newHTTPHandler(reg, newHTTPMetrics(reg), api, status, checks, logger, more...))
	startRole("http", func(ctx context.Context) error {
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})

	logger.Info("playwatch ready", "http", "http://"+ln.Addr().String(), "brokers", be.brokers,
		"took", time.Since(started).Round(time.Millisecond))

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down")
	case runErr = <-roleDone:
		logger.Error("a role stopped; shutting down", "err", runErr)
	}
	err = errors.Join(runErr, shutdown())
	logger.Info("playwatch stopped", "err", err)
	return err
}

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

func cmdCrawl(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	var once bool
	cl, err := parseCommandLine("crawl", "crawl [--once] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&once, "once", false, "plan one cycle now, crawl it, print its summary and exit; refused while another playwatch leads "+
			"(default: the crawler role of run: the scheduler and the crawl workers)")
	})
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("crawl takes no arguments, got %q", cl.args)}
	}
	cfg, logger := cl.cfg, cl.logger
	be, err := openBackends(ctx, cfg, logger, backendOptions{broker: true, attach: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, be.shutdown(ctx, cfg.ShutdownTimeout)) }()
	cr, err := newCrawlerRole(cfg, be, prometheus.NewRegistry(), logger)
	if err != nil {
		return err
	}
	if !once {
		return cr.run(ctx)
	}
	start := time.Now()
	var mu sync.Mutex
	sums := map[int64]*cycleSummary{}
	cr.worker.done = func(m crawlJobMessage, r appResult) {
		mu.Lock()
		defer mu.Unlock()
		if sums[m.CycleID] == nil {
			sums[m.CycleID] = &cycleSummary{Failures: map[string]int{}}
		}
		sums[m.CycleID].Apps++
		sums[m.CycleID].add(r)
	}
	wctx, stop := context.WithCancel(ctx)
	worked := make(chan error, 1)
	go func() { worked <- cr.worker.Run(wctx, cr.jobs) }()
	c, err := cr.sched.RunOnce(ctx)
	stop()
	err = errors.Join(err, <-worked)
	if err != nil {
		return err
	}
	sum := cycleSummary{Failures: map[string]int{}}
	if c != nil && sums[c.ID] != nil {
		sum = *sums[c.ID]
	}
	sum.Duration = time.Since(start)
	fmt.Fprintln(stdout, sum)
	return nil
}

// crawlerRole is the crawler role of run and of crawl: the scheduler, which
// plans the cycles into crawl-jobs while it holds the lease, and the crawl
// worker, which crawls the jobs it is given. One path with any broker, the
// embedded one included (scheduler.go).
type crawlerRole struct {
	sched  *scheduler
	worker *crawlWorker
	jobs   *kgo.Client // the worker's crawl-jobs consumer
}

func newCrawlerRole(cfg Config, be *backends, reg prometheus.Registerer, logger *slog.Logger) (*crawlerRole, error) {
	archiver, err := be.newArchiver(cfg, reg, logger)
	if err != nil {
		return nil, err
	}
	store, err := newPlayStore(cfg, 0, archiver, reg, logger)
	if err != nil {
		return nil, err
	}
	producer, err := newProducer(cfg, be.brokers)
	if err != nil {
		return nil, err
	}
	be.onClose(flushAndClose(producer))
	pub := newPublisher(producer, cfg.Producer, reg, logger)
	pub.gate = be.publishGate()
	cr := newCrawler(crawlerConfigOf(cfg), store, newPGKnownReviews(be.pool), pub, reg, logger)
	r := &crawlerRole{
		sched:  newScheduler(schedulerConfigOf(cfg), be.pool, newAppStore(be.pool), producer, kadm.NewClient(be.kafka), cr.metrics, reg, logger),
		worker: newCrawlWorker(cr, newLeaseEpochs(be.pool), cfg.CrawlWorkers, reg, logger),
	}
	r.jobs, err = kgo.NewClient(append(kafkaClientOptions(cfg.Kafka, be.brokers), r.worker.clientOptions(cfg.CrawlJobsGroup, cfg.SchedulerLease)...)...)
	if err != nil {
		return nil, fmt.Errorf("crawl-jobs kafka client: %w", err)
	}
	be.onClose(func(context.Context) error { r.jobs.Close(); return nil })
	return r, nil
}

// run takes part in the election and crawls jobs until ctx ends.
func (r *crawlerRole) run(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- r.sched.Run(ctx) }()
	return errors.Join(r.worker.Run(ctx, r.jobs), <-done)
}

func cmdFetch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var lang, country string
	var n int
	var maxWait time.Duration
	cl, err := parseCommandLine("fetch", "fetch [--lang L --country C] [--reviews N] [--max-wait D] PACKAGE", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&lang, "lang", "", "language (hl); default PLAYSTORE_LANG")
		fs.StringVar(&country, "country", "", "storefront country (gl); default PLAYSTORE_COUNTRY")
		fs.IntVar(&n, "reviews", 0, "newest reviews to read; default REVIEWS_PER_APP")
		durationVar(fs, &maxWait, "max-wait", defaultFetchMaxWait, "give up rather than wait longer than this for a benched egress or a retry; 0: wait as long as it takes")
	})
	if err != nil {
		return err
	}
	if len(cl.args) != 1 {
		return usageError{fmt.Sprintf("fetch takes one package name, got %q", cl.args)}
	}
	pkg := cl.args[0]
	if err := validatePackageName(pkg); err != nil {
		return usageError{err.Error()}
	}
	loc := cl.cfg.Locales.Default
	for _, o := range []struct {
		name, v string
		dst     *string
	}{{"--lang", lang, &loc.Lang}, {"--country", country, &loc.Country}} {
		if o.v == "" {
			continue
		}
		if err := parseLocaleCode(o.v); err != nil {
			return usageError{fmt.Sprintf("%s %q: %v", o.name, o.v, err)}
		}
		*o.dst = o.v
	}
	if n == 0 {
		n = cl.cfg.ReviewsPerApp
	}
	if n < 0 {
		return usageError{"--reviews must be positive"}
	}
	if maxWait < 0 {
		return usageError{"--max-wait must not be negative"}
	}
	store, err := newPlayStore(cl.cfg, maxWait, nil, prometheus.NewRegistry(), cl.logger)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cl.cfg.CrawlAppTimeout)
	defer cancel()
	return fetchApp(ctx, store, pkg, loc, n, stdout)
}

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseCommandLine("migrate", "migrate [flags]", args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("migrate takes no arguments, got %q", cl.args)}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, be.schema)
	// The search text of the reviews stored before migration 15 (or with
	// an older normalisation), with its progress in the log.
	_, err = backfillSearchText(ctx, be.pool, cl.logger)
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}

func cmdPcap(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	var job pcapJob
	var dryRun bool
	cl, err := parseCommandLine("pcap", "pcap --app PACKAGE --scenario UPLOAD|DOWNLOAD [--dry-run] FILE...", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&job.Package, "app", "", "package name of the app the captures belong to (must be registered unless --dry-run)")
		fs.StringVar(&job.Scenario, "scenario", "", "UPLOAD or DOWNLOAD")
		fs.BoolVar(&dryRun, "dry-run", false, "print the messages as JSON lines instead of publishing them")
	})
	if err != nil {
		return err
	}
	if err := validatePackageName(job.Package); err != nil {
		return usageError{"--app: " + err.Error()}
	}
	scenario, ok := pcapScenario(job.Scenario)
	if !ok {
		return usageError{fmt.Sprintf("--scenario must be UPLOAD or DOWNLOAD, not %q", job.Scenario)}
	}
	job.Scenario = scenario
	if len(cl.args) == 0 {
		return usageError{"pcap needs at least one capture file"}
	}
	if dryRun {
		return analyzeCaptures(ctx, cl.args, job, nil, stdout, stderr)
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{broker: true, attach: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout)) }()
	if _, err := newAppStore(be.pool).Get(ctx, job.Package); errors.Is(err, errAppNotFound) {
		return fmt.Errorf("%s is not registered: register it first (POST /api/v1/apps) or use --dry-run", job.Package)
	} else if err != nil {
		return err
	}
	producer, err := newProducer(cl.cfg, be.brokers)
	if err != nil {
		return err
	}
	be.onClose(flushAndClose(producer))
	pub := newPublisher(producer, cl.cfg.Producer, prometheus.NewRegistry(), cl.logger)
	pub.gate = be.publishGate()
	return analyzeCaptures(ctx, cl.args, job, pub, stdout, stderr)
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
	switch {
	case len(missing) == 0:
	case opts.attach:
		var r runningPlaywatch
		cfg, r, err = attachedConfig(cfg)
		if errors.Is(err, errNotRunning) {
			return nil, fmt.Errorf("%w: start `playwatch run` on it, point PLAYWATCH_DATA_DIR at the data directory of a running playwatch, or set %s",
				err, strings.Join(missing, " and "))
		}
		if err != nil {
			return nil, err
		}
		if opts.broker && embedded && !r.EmbeddedBroker {
			// Its brokers, reached with this command's own credentials.
			if err := cfg.Kafka.checkAttached(r); err != nil {
				return nil, err
			}
		}
		embedded = embedded && r.EmbeddedBroker
		if r.Version != version {
			logger.Warn("the playwatch that runs on the data directory is another version", "its_version", r.Version, "version", version)
		}
		logger.Info("using the services of the playwatch that runs on the data directory", "data_dir", cfg.DataDir, "pid", r.PID,
			"database", maskPasswords(cfg.DatabaseURL), "brokers", cfg.KafkaBrokers)
	default:
		release, err := lockDataDir(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		be.ownsDataDir = true
		be.onClose(func(context.Context) error { release(); return nil })
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
	be.rawArchive = cfg.RawArchive
	topics := createdTopics
	if cfg.RawArchive {
		topics = append(slices.Clone(createdTopics), topicRawPages)
	}
	var budget brokerBudget
	if embedded {
		if budget, err = planBrokerBudget(cfg.BrokerMaxBytes, cfg.topicRetention(true), topics); err != nil {
			return nil, err
		}
	}
	if be.brokers, err = openBroker(cfg, budget.segmentBytes(), logger, be); err != nil {
		return nil, err
	}
	if be.embedded != nil {
		opts.metrics.MustRegister(be.embedded.Collectors()...)
	}
	be.kafka, err = kgo.NewClient(kafkaClientOptions(cfg.Kafka, be.brokers)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	be.onClose(func(context.Context) error { be.kafka.Close(); return nil })
	spec := topicSpec{Partitions: cfg.TopicPartitions, Replication: cfg.TopicReplication, Retention: cfg.topicRetention(false)}
	if embedded {
		spec.Retention = 0 // trimmed by the budget keeper instead
	}
	if err := ensureTopics(ctx, kadm.NewClient(be.kafka), spec, createdTopics, logger); err != nil {
		// The first requests to the brokers: where TLS and SASL fail.
		return nil, cfg.Kafka.explainKafkaError(err)
	}
	if cfg.RawArchive {
		if spec.Retention != 0 {
			spec.Retention = cfg.RawRetention
		}
		if err := ensureTopics(ctx, kadm.NewClient(be.kafka), spec, []string{topicRawPages}, logger); err != nil {
			return nil, err
		}
	}
	if embedded {
		be.budget = newBrokerBudgetKeeper(budget, kadm.NewClient(be.kafka),
			newConsumerStore(be.pool, cfg.ConsumerGroup), opts.metrics, logger)
		be.budget.jobsGroup = cfg.CrawlJobsGroup
	}
	if be.embedded != nil {
		be.keepBrokerTrimmed(ctx, logger)
	}
	return be, nil
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

// cmdDLQ is `playwatch dlq list|replay|discard` (dlq.go).
func cmdDLQ(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && slices.Contains([]string{"help", "-h", "-help", "--help"}, args[0]) {
		fmt.Fprint(stdout, dlqUsage)
		return nil
	}
	if len(args) == 0 || !slices.Contains(dlqSubcommands, args[0]) {
		fmt.Fprint(stderr, dlqUsage)
		return usageError{"dlq needs a subcommand: list, replay or discard"}
	}
	sub := args[0]
	var f dlqFlags
	cl, err := parseCommandLine("dlq "+sub, dlqSynopsis(sub), args[1:], getenv, stdout, stderr, f.register(sub))
	if err != nil {
		return err
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		err = runDLQList(ctx, be.pool, &f, cl.args, stdout)
	case "discard":
		err = runDLQDiscard(ctx, be.pool, &f, cl.args, stdout)
	default:
		err = runDLQReplay(ctx, newConsumerStore(be.pool, cl.cfg.ConsumerGroup), &f, cl.args, cl.cfg.ConsumerMaxRecordBytes, stdout)
	}
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}

// cmdReparse is `playwatch reparse` (reparse.go): it reads raw-pages of the
// broker it attaches to, directly (no consumer group), and publishes
// through the crawl's publisher.
func cmdReparse(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	var f reparseFlags
	cl, err := parseCommandLine("reparse", reparseSynopsis, args, getenv, stdout, stderr, f.register)
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("reparse takes no arguments, got %q", cl.args)}
	}
	w, err := f.window(time.Now())
	if err != nil {
		return err
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{broker: true, attach: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout)) }()
	rng, err := planRawRange(ctx, kadm.NewClient(be.kafka), w)
	if err != nil {
		return err
	}
	reader, err := kgo.NewClient(append(kafkaClientOptions(cl.cfg.Kafka, be.brokers), kgo.ConsumePartitions(rng.offsets()))...)
	if err != nil {
		return fmt.Errorf("kafka consumer of %s: %w", topicRawPages, err)
	}
	defer reader.Close()
	rp := &reparser{parser: storeParser{}, pkg: f.pkg, progress: stderr, logStarts: rawLogStarts(kadm.NewClient(be.kafka)),
		fetch: rawRecordFetcher(kafkaClientOptions(cl.cfg.Kafka, be.brokers))}
	if !f.dryRun {
		producer, err := newProducer(cl.cfg, be.brokers)
		if err != nil {
			return err
		}
		be.onClose(flushAndClose(producer))
		pub := newPublisher(producer, cl.cfg.Producer, prometheus.NewRegistry(), cl.logger)
		pub.gate = be.publishGate()
		rp.pub = pub
	}
	sum, err := rp.run(ctx, reader, rng)
	fmt.Fprintln(stdout, sum)
	return err
}

// managedPGListen is PLAYWATCH_PG_LISTEN when playwatch runs the cluster.
func managedPGListen(cfg Config) string {
	if cfg.DatabaseURL != "" {
		return ""
	}
	return cfg.PGListen
}

// cmdDBURL is `playwatch db-url`: the writer's URL, or the reader's, of the
// managed cluster, with its generated password (postgres_access.go).
func cmdDBURL(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var reader bool
	cl, err := parseCommandLine("db-url", "db-url [--reader] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&reader, "reader", false, "the URL of the read-only role "+pgReaderRole+" (dashboards) instead of the writer "+pgWriterRole)
	})
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("db-url takes no arguments, got %q", cl.args)}
	}
	role := pgWriterRole
	if reader {
		role = pgReaderRole
	}
	if cl.cfg.DatabaseURL != "" {
		return errors.New("DATABASE_URL is set: playwatch uses that database, not a managed cluster")
	}
	// Like every command that attaches: the URL of a cluster that runs, at
	// the address it listens on, or none.
	r, err := findRunning(cl.cfg.DataDir)
	if errors.Is(err, errNotRunning) {
		return fmt.Errorf("%w: start `playwatch run` on it, or point PLAYWATCH_DATA_DIR at the data directory of a running playwatch", err)
	}
	if err != nil {
		return err
	}
	if !r.ManagedPostgres {
		return fmt.Errorf("the playwatch that runs on %s uses its DATABASE_URL, not a managed cluster", cl.cfg.DataDir)
	}
	cl.cfg.PGListen = r.PGListen
	u, err := managedClusterURL(cl.cfg, role)
	if err != nil {
		return err
	}
	if cl.cfg.PGListen == "" {
		fmt.Fprintln(stderr, "playwatch: PLAYWATCH_PG_LISTEN is empty, so this is the unix socket's URL: only root and the OS user that runs the server can use it")
	} else if !reader && !isLoopback(cl.cfg.PGListen) && !r.PGWriterFrom {
		fmt.Fprintln(stderr, "playwatch: beyond loopback the cluster admits "+pgWriterRole+" only from the networks of PLAYWATCH_PG_WRITER_FROM; other hosts get "+pgReaderRole+" (db-url --reader)")
	}
	fmt.Fprintln(stdout, u)
	return nil
}
