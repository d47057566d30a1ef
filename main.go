// Command playwatch watches Google Play apps: a registry of apps, an hourly
// crawler, a Kafka pipeline into PostgreSQL and a pcap analyzer, in one binary.
//
// main.go is the composition root: the only file that builds real objects
// (database pools, Kafka clients, servers) and hands them to the roles.
package main

import (
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
	"strings"
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
	var uerr usageError
	switch {
	case errors.As(err, &uerr):
		fmt.Fprintln(os.Stderr, "playwatch:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "playwatch:", err)
		os.Exit(1)
	}
}

// usageError is a wrong command line; main exits with status 2 for it.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

const usageText = `playwatch watches Google Play apps: a registry, an hourly crawler, Kafka and PostgreSQL.

Usage:
  playwatch run [--roles registry] [flags]   run the appliance (all roles unless --roles picks some)
  playwatch migrate [flags]                  apply the database migrations and exit
  playwatch dlq list|replay [flags]          list dead letters, or store them again once their cause is fixed
  playwatch version                          print the version and exit

Every command takes the flags listed below; 'playwatch COMMAND --help' shows its own flags too.
`

// run is the whole program; main only adds the process: signals, exit codes.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return usageError{"no command given"}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		return cmdRun(ctx, rest, getenv, stderr)
	case "migrate":
		return cmdMigrate(ctx, rest, getenv, stderr)
	case "dlq":
		return cmdDLQ(ctx, rest, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "playwatch", version)
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		fmt.Fprintln(stdout)
		printSettings(stdout)
		return nil
	default:
		fmt.Fprint(stderr, usageText)
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
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
// errHelp means --help was asked for and printed.
func parseCommandLine(name, synopsis string, args []string, getenv func(string) string, stderr io.Writer, addFlags func(*flag.FlagSet)) (commandLine, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if addFlags != nil {
		addFlags(fs)
	}
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[f.Name] = true })
	cf := bindConfigFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: playwatch %s\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			if own[f.Name] {
				fmt.Fprintf(stderr, "  --%s\t%s (default %q)\n", f.Name, f.Usage, f.DefValue)
			}
		})
		fmt.Fprintln(stderr)
		printSettings(stderr)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return commandLine{}, errHelp
		}
		return commandLine{}, usageError{err.Error()}
	}
	cfg, err := loadConfig(getenv, fs, cf)
	if err != nil {
		return commandLine{}, usageError{err.Error()}
	}
	return commandLine{cfg: cfg, logger: newLogger(cfg, stderr), args: fs.Args()}, nil
}

var errHelp = errors.New("help shown")

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// allRoles are what `run --roles` can pick.
var allRoles = []string{"registry", "consumer"}

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

func cmdRun(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	var rolesFlag string
	cl, err := parseCommandLine("run", "run [--roles LIST] [flags]", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&rolesFlag, "roles", strings.Join(allRoles, ","), "comma-separated roles to run: "+strings.Join(allRoles, ","))
	})
	if errors.Is(err, errHelp) {
		return nil
	}
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
	cfg, logger := cl.cfg, cl.logger
	started := time.Now()
	logger.Info("playwatch starting", "version", version, "roles", roles, "data_dir", cfg.DataDir)

	// Every started resource registers its stop here; they run in reverse
	// order at shutdown: intake first, Postgres last.
	var stops []func(context.Context) error
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i](sctx))
		}
		return errors.Join(errs...)
	}

	pool, stopDB, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	stops = append(stops, stopDB)
	if err := migrate(ctx, pool, logger); err != nil {
		return errors.Join(err, shutdown())
	}
	brokers, stopBroker, err := openBroker(ctx, cfg, logger)
	if err != nil {
		return errors.Join(err, shutdown())
	}
	stops = append(stops, stopBroker)
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return errors.Join(fmt.Errorf("kafka client: %w", err), shutdown())
	}
	stops = append(stops, func(context.Context) error { admin.Close(); return nil })
	spec := topicSpec{Partitions: cfg.TopicPartitions, Replication: cfg.TopicReplication, Retention: cfg.TopicRetention}
	if err := ensureTopics(ctx, kadm.NewClient(admin), spec, allTopics, logger); err != nil {
		return errors.Join(err, shutdown())
	}

	reg := newMetricsRegistry(version)
	var api *registryAPI
	if slices.Contains(roles, "registry") {
		api = &registryAPI{store: newAppStore(pool), token: cfg.RegistryToken, logger: logger}
	}
	checks := []readinessCheck{
		{"database", pool.Ping},
		{"broker", admin.Ping},
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return errors.Join(fmt.Errorf("PLAYWATCH_HTTP_ADDR: %w", err), shutdown())
	}
	srv := newHTTPServer(newHTTPHandler(reg, newHTTPMetrics(reg), api, checks))
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()
	stops = append(stops, func(ctx context.Context) error {
		if err := srv.Shutdown(ctx); err != nil {
			return fmt.Errorf("http shutdown: %w", err)
		}
		return nil
	})
	if slices.Contains(roles, "consumer") {
		stop, err := startStorageConsumer(ctx, cfg, pool, brokers, reg, logger)
		if err != nil {
			return errors.Join(err, shutdown())
		}
		stops = append(stops, stop)
	}

	logger.Info("playwatch ready", "http", "http://"+ln.Addr().String(), "brokers", brokers,
		"took", time.Since(started).Round(time.Millisecond))

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down")
	case err := <-srvErr:
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("http server: %w", err)
		}
	}
	err = errors.Join(runErr, shutdown())
	logger.Info("playwatch stopped", "err", err)
	return err
}

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cl, err := parseCommandLine("migrate", "migrate [flags]", args, getenv, stderr, nil)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("migrate takes no arguments, got %q", cl.args)}
	}
	pool, stop, err := openDatabase(ctx, cl.cfg, cl.logger)
	if err != nil {
		return err
	}
	err = migrate(ctx, pool, cl.logger)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cl.cfg.ShutdownTimeout)
	defer cancel()
	return errors.Join(err, stop(sctx))
}

// openDatabase connects to DATABASE_URL, or starts the managed cluster
// when it is empty. stop closes the pool and stops a managed server.
func openDatabase(ctx context.Context, cfg Config, logger *slog.Logger) (*pgxpool.Pool, func(context.Context) error, error) {
	dsn := cfg.DatabaseURL
	var pg *managedPostgres
	if dsn == "" {
		var err error
		pg, err = startManagedPostgres(ctx, managedPostgresOptions{
			DataDir:  filepath.Join(cfg.DataDir, "postgres"),
			Database: "playwatch",
			OSUser:   cfg.PGUser,
			Listen:   cfg.PGListen,
		}, logger)
		if err != nil {
			return nil, nil, fmt.Errorf("managed postgres: %w", err)
		}
		dsn = pg.DSN()
	}
	stopPG := func(ctx context.Context) error {
		if pg == nil {
			return nil
		}
		return pg.Stop(ctx)
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("DATABASE_URL: %w", err), stopPG(ctx))
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("connect to postgres: %w", err), stopPG(ctx))
	}
	return pool, func(ctx context.Context) error {
		pool.Close()
		return stopPG(ctx)
	}, nil
}

// openBroker returns the seed brokers of KAFKA_BROKERS, or starts the
// embedded broker when it is empty.
func openBroker(_ context.Context, cfg Config, logger *slog.Logger) ([]string, func(context.Context) error, error) {
	if len(cfg.KafkaBrokers) > 0 {
		return cfg.KafkaBrokers, func(context.Context) error { return nil }, nil
	}
	b, err := startEmbeddedBroker(embeddedBrokerOptions{
		Addr:           cfg.BrokerAddr,
		DataDir:        filepath.Join(cfg.DataDir, "broker"),
		Fsync:          cfg.BrokerFsync,
		RetentionCheck: 5 * time.Minute,
	}, logger)
	if err != nil {
		return nil, nil, fmt.Errorf("PLAYWATCH_BROKER_ADDR: %w", err)
	}
	return b.Addrs(), func(context.Context) error { b.Close(); return nil }, nil
}

// startStorageConsumer runs the storage consumer in a goroutine. Its stop
// ends the consumer (the batch in flight commits fully or not at all, the
// Kafka offsets are committed) and closes its client; it is registered after
// the broker and the database, so it runs before they stop.
func startStorageConsumer(ctx context.Context, cfg Config, pool *pgxpool.Pool, brokers []string, reg prometheus.Registerer, logger *slog.Logger) (func(context.Context) error, error) {
	sc := newStorageConsumer(pool, consumerOptionsFrom(cfg), reg, logger)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, sc.clientOptions()...)...)
	if err != nil {
		return nil, fmt.Errorf("storage consumer kafka client: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sc.Run(rctx, cl) }()
	return func(sctx context.Context) error {
		cancel()
		var err error
		select {
		case err = <-done:
		case <-sctx.Done():
			err = fmt.Errorf("storage consumer did not stop in time: %w", sctx.Err())
		}
		cl.Close()
		return err
	}, nil
}

// cmdDLQ is `playwatch dlq list|replay` (dlq.go).
func cmdDLQ(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "replay") {
		fmt.Fprint(stderr, dlqUsage)
		return usageError{"dlq needs a subcommand: list or replay"}
	}
	sub := args[0]
	var f dlqFlags
	cl, err := parseCommandLine("dlq "+sub, dlqSynopsis(sub), args[1:], getenv, stderr, f.register(sub))
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	pool, stop, err := openToolDatabase(ctx, cl.cfg, cl.logger)
	if err != nil {
		return err
	}
	if sub == "list" {
		err = runDLQList(ctx, pool, &f, cl.args, stdout)
	} else {
		err = runDLQReplay(ctx, newConsumerStore(pool, cl.cfg.ConsumerGroup), &f, cl.args, cl.cfg.ConsumerMaxRecordBytes, stdout)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cl.cfg.ShutdownTimeout)
	defer cancel()
	return errors.Join(err, stop(sctx))
}

// openToolDatabase is openDatabase for commands that run beside `playwatch
// run`: it connects to the managed server a running appliance started
// instead of taking that server's data directory over.
func openToolDatabase(ctx context.Context, cfg Config, logger *slog.Logger) (*pgxpool.Pool, func(context.Context) error, error) {
	if cfg.DatabaseURL == "" {
		if dsn, ok := runningManagedPostgresDSN(filepath.Join(cfg.DataDir, "postgres")); ok {
			pool, err := pgxpool.New(ctx, dsn)
			if err == nil {
				err = pool.Ping(ctx)
			}
			if err != nil {
				return nil, nil, fmt.Errorf("connect to the managed postgres of the running playwatch: %w", err)
			}
			return pool, func(context.Context) error { pool.Close(); return nil }, nil
		}
	}
	return openDatabase(ctx, cfg, logger)
}
