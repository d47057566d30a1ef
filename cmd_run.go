package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

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
		status.locales = cfg.Locales
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
