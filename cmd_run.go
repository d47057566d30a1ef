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
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

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
	cl, err := parseNoArgs("run", "run [--roles LIST] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&rolesFlag, "roles", strings.Join(allRoles, ","), "comma-separated roles to run: "+strings.Join(allRoles, ","))
	})
	if err != nil {
		return err
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
	a := &runner{ctx: ctx, cfg: cfg, be: be, reg: reg, logger: logger, roleDone: make(chan error, len(allRoles)+1),
		unpublish: func() {}}
	if err := a.startRoles(roles); err != nil {
		return errors.Join(err, a.shutdown())
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return errors.Join(fmt.Errorf("PLAYWATCH_HTTP_ADDR: %w", err), a.shutdown())
	}
	if err := a.publishRunning(started); err != nil {
		ln.Close()
		return errors.Join(err, a.shutdown())
	}
	a.serveHTTP(ln)
	logger.Info("playwatch ready", "http", "http://"+ln.Addr().String(), "brokers", be.brokers,
		"took", time.Since(started).Round(time.Millisecond))

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down")
	case runErr = <-a.roleDone:
		logger.Error("a role stopped; shutting down", "err", runErr)
	}
	err = errors.Join(runErr, a.shutdown())
	logger.Info("playwatch stopped", "err", err)
	return err
}

// runner is what `run` started: the backends, the roles and the HTTP
// server. Every started part registers its stop with the backends; they run
// in reverse order at shutdown: intake first, the backends last.
type runner struct {
	ctx    context.Context
	cfg    Config
	be     *backends
	reg    *prometheus.Registry
	logger *slog.Logger
	// roleDone gets the error of a role that ended on its own (it failed),
	// which ends the appliance.
	roleDone chan error
	// unpublish withdraws what publishRunning published for the one-off
	// commands; it runs first at shutdown: they must not attach to
	// services that are stopping.
	unpublish func()

	checks []readinessCheck
	api    *registryAPI
	status *statusPage
	more   []apiRoutes
}

func (a *runner) shutdown() error {
	a.unpublish()
	return a.be.shutdown(a.ctx, a.cfg.ShutdownTimeout)
}

// startRole runs fn until shutdown, which cancels it and waits for it up to
// PLAYWATCH_SHUTDOWN_TIMEOUT.
func (a *runner) startRole(name string, fn func(context.Context) error) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(a.ctx))
	done := make(chan error, 1)
	go func() {
		err := fn(rctx)
		if err != nil {
			err = fmt.Errorf("%s: %w", name, err)
		}
		done <- err
		if rctx.Err() == nil {
			a.roleDone <- err
		}
	}()
	a.be.onClose(func(sctx context.Context) error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-sctx.Done():
			return fmt.Errorf("%s did not stop within PLAYWATCH_SHUTDOWN_TIMEOUT", name)
		}
	})
}

// startRoles starts the roles picked in the reverse order of the shutdown:
// the consumer stops after the producer flushed, and commits what it
// stored; intake stops first, the sentiment job last.
func (a *runner) startRoles(roles []string) error {
	cfg, be, reg, logger := a.cfg, a.be, a.reg, a.logger
	if slices.Contains(roles, "sentiment") {
		model, err := loadSentimentModel()
		if err != nil {
			return fmt.Errorf("sentiment model: %w", err)
		}
		job := newSentimentJob(be.pool, model, sentimentJobConfigOf(cfg), reg, logger)
		job.watchModels = true // the newest model sentiment adapt kept, if any
		a.startRole("sentiment", job.Run)
	}
	// The notifier stops before the sentiment job: its sends in flight get
	// half of PLAYWATCH_SHUTDOWN_TIMEOUT to finish and be marked.
	if slices.Contains(roles, "notifier") {
		notifier, err := newNotifierRole(be.pool, cfg, reg, logger)
		if err != nil {
			return err
		}
		a.startRole("notifier", notifier)
	}
	a.checks = []readinessCheck{
		{"database", be.pool.Ping},
		{"broker", be.brokerReady},
	}
	if slices.Contains(roles, "consumer") {
		if err := a.startConsumer(); err != nil {
			return err
		}
	}
	if slices.Contains(roles, "crawler") {
		cr, err := newCrawlerRole(cfg, be, reg, logger)
		if err != nil {
			return err
		}
		a.startRole("crawler", cr.run)
	}
	if slices.Contains(roles, "registry") {
		return a.startRegistry()
	}
	return nil
}

func (a *runner) startConsumer() error {
	cfg, be, logger := a.cfg, a.be, a.logger
	sc := newStorageConsumer(be.pool, consumerOptionsFrom(cfg), a.reg, logger)
	// Its offset resets, shown without failing readiness.
	a.checks = append(a.checks, readinessCheck{"consumer", sc.readiness})
	cl, err := kgo.NewClient(append(kafkaClientOptions(cfg.Kafka, be.brokers), sc.clientOptions()...)...)
	if err != nil {
		return fmt.Errorf("storage consumer kafka client: %w", err)
	}
	be.onClose(func(context.Context) error { cl.Close(); return nil })
	a.startRole("consumer", func(ctx context.Context) error { return sc.Run(ctx, cl) })
	// Reviews stored before migration 15 or with an older search
	// normalisation get their search text in the background; a failure is
	// logged, and the next start tries again.
	a.startRole("search backfill", func(ctx context.Context) error {
		if _, err := backfillSearchText(ctx, be.pool, logger); err != nil && ctx.Err() == nil {
			logger.Error("search backfill failed; searches miss the reviews it did not reach until the next start", "err", err)
		}
		<-ctx.Done()
		return nil
	})
	return nil
}

// startRegistry builds the registry, reviews and notifier APIs and the
// status page. They read on their own connections: the lease, the consumer
// and the crawler never wait behind them. The APIs' writes stay on the
// appliance's pool.
func (a *runner) startRegistry() error {
	cfg, be, logger := a.cfg, a.be, a.logger
	reads, err := openReadPool(a.ctx, be.databaseURL, cfg.ReadStatementTimeout, cfg.StatusPageMaxRenders)
	if err != nil {
		return err
	}
	be.onClose(func(context.Context) error { reads.Close(); return nil })
	a.api = &registryAPI{store: newRegistryStore(be.pool, reads), token: cfg.RegistryToken, locales: cfg.Locales, logger: logger,
		reviews: newReviewsAPI(reads, cfg.Locales, reviewsToken(cfg), logger)}
	// POST /api/v1/destinations/{id}/test sends through the sender the
	// notifier uses, with the same egress rules (NOTIFY_ALLOW_PRIVATE, NOTIFY_PROXY).
	sender, err := newNotifySender(notifySenderConfigOf(cfg), logger)
	if err != nil {
		return err
	}
	a.more = append(a.more, &notifyAPI{pool: be.pool, reads: reads, token: cfg.RegistryToken, allowPrivate: cfg.NotifyAllowPrivate,
		tester: sender, logger: logger})
	a.status = newStatusPage(statusDB{reads}, a.reg, cfg.StatusPageToken, cfg.CrawlInterval, cfg.AppGaugesInterval, cfg.StatusPageMaxRenders, logger)
	a.status.locales = cfg.Locales
	a.status.reviews = &reviewsSource{pager: reviewsDB{pool: reads, locales: cfg.Locales}, token: reviewsToken(cfg)}
	a.startRole("app gauges", a.status.appGauges.run)
	return nil
}

// publishRunning tells the one-off commands (dlq, db-url, …) run on the same
// data directory where this appliance's services are.
func (a *runner) publishRunning(started time.Time) error {
	cfg, be := a.cfg, a.be
	if !be.ownsDataDir {
		return nil
	}
	up, err := publishRunning(cfg.DataDir, runningPlaywatch{PID: os.Getpid(), Version: version, StartedAt: started,
		DatabaseURL: be.databaseURL, Brokers: be.brokers, PGListen: managedPGListen(cfg), ManagedPostgres: cfg.DatabaseURL == "",
		EmbeddedBroker: be.embedded != nil, BrokerMaxBytes: cfg.BrokerMaxBytes, TopicRetention: cfg.topicRetention(true), ConsumerGroup: cfg.ConsumerGroup,
		KafkaTLS: cfg.Kafka.TLS, KafkaSASLMechanism: cfg.Kafka.SASLMechanism,
		RawArchive: cfg.RawArchive, PGWriterFrom: len(cfg.PGWriterFrom) > 0 && cfg.pgWriterFromIgnored() == ""})
	if err != nil {
		return err
	}
	a.unpublish = up
	return nil
}

// serveHTTP serves /healthz, /readyz, /metrics, the APIs and the status page
// on ln until shutdown.
func (a *runner) serveHTTP(ln net.Listener) {
	redactChecks(a.cfg, a.checks)
	srv := newHTTPServer(newHTTPHandler(a.reg, newHTTPMetrics(a.reg), a.api, a.status, a.checks, a.logger, a.more...))
	a.startRole("http", func(ctx context.Context) error {
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}
