package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The scheduler plans crawl cycles for the whole fleet (docs/design.md
// "Several servers"). Every instance with the crawler role runs one; the one
// holding the lease row in scheduler_lease is the leader. A lease row rather
// than an advisory lock: its deadline runs on the database's clock, so a
// leader whose host vanished without closing its connection (which
// PostgreSQL notices only after TCP keepalives, hours by default) is
// replaced within SCHEDULER_LEASE all the same, and the planning
// transaction can check the lease it plans under.
//
// The leader inserts a crawl_cycles row, publishes one job per active app
// and storefront to crawl-jobs, records the topic's end offsets in the row, and calls the
// cycle finished once the crawl workers' committed offsets reach them. The
// next cycle is planned when CRAWL_INTERVAL has passed since the planned
// time and the previous cycle has finished. A new leader reads the last row
// and carries on where the old one stopped: it republishes the jobs of a
// cycle whose end offsets are missing, waits for an unfinished one, and
// never plans a cycle that a row already holds.

// schedulerConfig is the scheduling part of Config.
type schedulerConfig struct {
	Interval        time.Duration // CRAWL_INTERVAL
	Lease           time.Duration // SCHEDULER_LEASE
	NewAppCheck     time.Duration // CRAWL_NEW_APP_CHECK
	FullResyncEvery time.Duration // how often an app's reviews are read in full (fullResyncDue)
	JobsGroup       string        // CRAWL_JOBS_GROUP: the crawl workers' consumer group
	Locales         localeDefaults
}

// The lease's timing, as parts of SCHEDULER_LEASE: the row is valid for
// leaseTTL and renewed every leaseRenew, and a follower looks at most every
// leaseTick, so a dead leader is replaced within leaseTTL + leaseTick <
// SCHEDULER_LEASE of its last renewal. The leader produces to crawl-jobs
// only until leaseMargin before its deadline: the deadline is counted from
// when the renewal was sent, before the database stamped it, and the margin
// leaves room for a produce request in flight and for clocks that run at
// slightly different rates.
const (
	leaseTTL    = 0.8
	leaseRenew  = 0.25
	leaseTick   = 0.1
	leaseMargin = 0.1
)

// jobProducer is what the scheduler needs of the Kafka producer.
type jobProducer interface {
	ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults
}

// jobOffsetsAdmin reads crawl-jobs' offsets and the workers' commits.
type jobOffsetsAdmin interface {
	ListStartOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	ListEndOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	FetchOffsets(ctx context.Context, group string) (kadm.OffsetResponses, error)
}

type scheduler struct {
	cfg      schedulerConfig
	pool     *pgxpool.Pool
	apps     activeAppLister
	producer jobProducer
	adm      jobOffsetsAdmin
	holder   string // this process in scheduler_lease and crawl_cycles
	crawl    *crawlMetrics
	metrics  *schedulerMetrics
	logger   *slog.Logger

	// The lease, kept by its own loop so that a slow broker never delays a
	// renewal: epoch is the lease's epoch while this instance leads, else 0.
	leaseMu   sync.Mutex
	epoch     int64
	renewedAt time.Time // when the last successful renewal was sent

	// What the planning loop keeps of its leadership: the epoch it led
	// under, the apps it has seen.
	ledEpoch int64
	// known are the apps and storefronts of the current cycle and the new
	// ones published since; nil until this leader has planned or taken over
	// a cycle.
	known        map[newAppKey]bool
	nextNewCheck time.Time
	idleUntil    time.Time // no active apps: when to look again
}

func newScheduler(cfg schedulerConfig, pool *pgxpool.Pool, apps activeAppLister, producer jobProducer, adm jobOffsetsAdmin,
	crawl *crawlMetrics, reg prometheus.Registerer, logger *slog.Logger) *scheduler {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &scheduler{cfg: cfg, pool: pool, apps: apps, producer: producer, adm: adm,
		holder: fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		crawl:  crawl, metrics: newSchedulerMetrics(reg), logger: logger}
}

func (s *scheduler) part(f float64) time.Duration { return time.Duration(float64(s.cfg.Lease) * f) }

// Run takes part in the election until ctx ends, leading when it holds the
// lease; at the end it gives the lease up, so that another instance takes
// over at once.
func (s *scheduler) Run(ctx context.Context) error {
	done := s.keepingLease(ctx)
	defer func() { <-done; s.resign() }()
	for {
		s.step(ctx)
		if sleepOn(ctx, systemClock{}, s.tick()) != nil {
			return nil
		}
	}
}

func (s *scheduler) tick() time.Duration { return min(s.part(leaseTick), time.Second) }

// keepingLease takes and renews the lease every tick until ctx ends; the
// channel is closed once it has stopped.
func (s *scheduler) keepingLease(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			s.keepLease(ctx)
			if sleepOn(ctx, systemClock{}, s.tick()) != nil {
				return
			}
		}
	}()
	return done
}

// errLeaseHeld: another instance leads.
var errLeaseHeld = errors.New("another playwatch holds the scheduler lease")

// RunOnce is `playwatch crawl --once`: it takes the lease (refusing, with
// the leader's name, when another instance holds it), finishes what the
// last cycle left, plans one cycle now through planCycle and returns it
// once the crawl workers (this process's, run beside) have done its jobs;
// nil when there are no active apps. It gives the lease up at the end.
func (s *scheduler) RunOnce(ctx context.Context) (*crawlCycle, error) {
	if err := s.acquire(ctx); err != nil {
		return nil, err
	}
	epoch := s.currentEpoch()
	if epoch == 0 {
		var holder string
		var held int64
		var until time.Time
		if err := s.pool.QueryRow(ctx, `SELECT holder, epoch, expires_at FROM scheduler_lease WHERE name = 'crawl'`).Scan(&holder, &held, &until); err != nil {
			return nil, fmt.Errorf("read the scheduler lease: %w", err)
		}
		return nil, fmt.Errorf("%w: %s (epoch %d, renewed until %s) plans the crawl cycles; its crawl workers do the jobs, so crawl --once plans none beside it",
			errLeaseHeld, holder, held, until.Format(time.RFC3339))
	}
	lctx, stop := context.WithCancel(ctx)
	kept := s.keepingLease(lctx)
	defer func() { stop(); <-kept; s.resign() }()
	s.ledEpoch = epoch
	var planned *crawlCycle
	for {
		if s.currentEpoch() != epoch {
			return nil, errors.New("the scheduler lease was lost before the cycle finished")
		}
		last, _, err := s.lastCycle(ctx)
		switch {
		case err != nil:
		case last != nil && last.EndOffsets == nil:
			err = s.publishCycle(ctx, *last)
		case last != nil && last.FinishedAt == nil:
			var offs jobOffsets
			if offs, err = s.jobOffsets(ctx); err == nil && s.cycleDone(offs, *last) {
				if last, err = s.finishCycle(ctx, *last); err == nil && planned != nil && last.ID == planned.ID {
					return last, nil
				}
			}
		case planned == nil:
			if planned, err = s.planCycle(ctx, last); err == nil && planned == nil {
				return nil, nil // no active apps
			}
		default:
			return last, nil
		}
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("scheduler: crawl --once: trying again", "err", err)
		}
		if sleepOn(ctx, systemClock{}, min(s.part(leaseTick), time.Second)) != nil {
			return nil, ctx.Err()
		}
	}
}

// currentEpoch is the lease's epoch while this instance leads, else 0.
func (s *scheduler) currentEpoch() int64 {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.epoch
}

// keepLease takes the lease when it is free, renews it when due, and
// gives up leading once the last renewal is too old.
func (s *scheduler) keepLease(ctx context.Context) {
	s.leaseMu.Lock()
	epoch, renewed := s.epoch, s.renewedAt
	s.leaseMu.Unlock()
	switch {
	case epoch != 0 && time.Since(renewed) >= s.part(leaseTTL):
		s.demote(epoch, "the lease ran out before it could be renewed")
	case epoch == 0:
		if err := s.acquire(ctx); err != nil && ctx.Err() == nil {
			s.logger.Debug("scheduler: cannot try for the lease", "err", err)
		}
	case time.Since(renewed) >= s.part(leaseRenew):
		if err := s.renew(ctx, epoch); err != nil && ctx.Err() == nil {
			s.logger.Warn("scheduler: cannot renew the lease; trying again", "err", err)
		}
	}
}

func (s *scheduler) step(ctx context.Context) {
	offs, err := s.jobOffsets(ctx)
	if err == nil {
		s.metrics.lag.Set(float64(offs.lag()))
	} else if ctx.Err() == nil {
		s.logger.Debug("scheduler: cannot read the offsets of "+topicCrawlJobs, "err", err)
	}
	epoch := s.currentEpoch()
	if epoch != s.ledEpoch {
		// Leading afresh, or no more: what the last leadership saw is void.
		s.ledEpoch, s.known, s.nextNewCheck, s.idleUntil = epoch, nil, time.Time{}, time.Time{}
	}
	if epoch == 0 || ctx.Err() != nil {
		return
	}
	if err := s.lead(ctx, offs, err); err != nil && ctx.Err() == nil {
		s.logger.Warn("scheduler: planning failed; trying again", "err", err)
	}
}

// acquire takes the lease if it is free or has expired, and records the
// new epoch's interval in scheduler_epochs in the same statement.
func (s *scheduler) acquire(ctx context.Context) error {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.part(leaseRenew))
	defer cancel()
	var epoch int64
	// The epoch taken over ends where its lease row said, whoever last
	// wrote that row: renewals and resignations move both together.
	err := s.pool.QueryRow(ctx, `
		WITH old AS (SELECT epoch, expires_at FROM scheduler_lease WHERE name = 'crawl'),
		l AS (
			INSERT INTO scheduler_lease AS l (name, holder, epoch, expires_at)
			VALUES ('crawl', $1, (SELECT coalesce(max(epoch), 0) + 1 FROM scheduler_epochs), now() + make_interval(secs => $2))
			ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
			WHERE l.expires_at <= now()
			RETURNING epoch, holder, expires_at),
		prev AS (UPDATE scheduler_epochs e SET ended_at = least(e.ended_at, old.expires_at) FROM old, l WHERE e.epoch = old.epoch)
		INSERT INTO scheduler_epochs AS e (epoch, holder, began_at, ended_at) SELECT epoch, holder, now(), expires_at FROM l
		ON CONFLICT (epoch) DO UPDATE SET holder = EXCLUDED.holder, began_at = EXCLUDED.began_at, ended_at = EXCLUDED.ended_at
		RETURNING epoch`, s.holder, s.part(leaseTTL).Seconds()).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("take the scheduler lease: %w", err)
	}
	s.leaseMu.Lock()
	s.epoch, s.renewedAt = epoch, sent
	s.leaseMu.Unlock()
	s.metrics.leader.Set(1)
	s.metrics.takeovers.Inc()
	s.logger.Info("scheduler: this instance is the leader; it plans the crawl cycles", "holder", s.holder, "epoch", epoch)
	return nil
}

func (s *scheduler) renew(ctx context.Context, epoch int64) error {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.part(leaseRenew))
	defer cancel()
	tag, err := s.pool.Exec(ctx, `WITH l AS (
			UPDATE scheduler_lease SET expires_at = now() + make_interval(secs => $3)
			WHERE name = 'crawl' AND holder = $1 AND epoch = $2 RETURNING epoch, holder, expires_at)
		INSERT INTO scheduler_epochs (epoch, holder, began_at, ended_at) SELECT epoch, holder, now(), expires_at FROM l
		ON CONFLICT (epoch) DO UPDATE SET ended_at = EXCLUDED.ended_at`, s.holder, epoch, s.part(leaseTTL).Seconds())
	if err != nil {
		return fmt.Errorf("renew the scheduler lease: %w", err)
	}
	if tag.RowsAffected() == 0 {
		s.demote(epoch, "another instance holds the lease")
		return nil
	}
	s.leaseMu.Lock()
	if s.epoch == epoch {
		s.renewedAt = sent
	}
	s.leaseMu.Unlock()
	return nil
}

// demote ends the leadership of epoch, if it is still this instance's.
func (s *scheduler) demote(epoch int64, why string) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	if s.epoch != epoch || epoch == 0 {
		return
	}
	s.logger.Warn("scheduler: this instance is no longer the leader", "reason", why, "epoch", epoch)
	s.epoch = 0
	s.metrics.leader.Set(0)
}

// errLeaseDeadline: the lease's deadline is too near to produce under it.
var errLeaseDeadline = errors.New("the scheduler lease is no longer this instance's, or its deadline is too near to publish jobs under it")

// produceContext bounds a produce to crawl-jobs by the lease: it fails
// once the renewal deadline minus leaseMargin has passed (counted from when
// the last successful renewal was sent, which precedes the database's
// stamp), and it ends at that moment, so that no record still buffered is
// sent later. A produce request already in flight may still land: that is
// what the workers' epoch rule is for (crawl_worker.go, leaseEpochs).
func (s *scheduler) produceContext(ctx context.Context, epoch int64) (context.Context, context.CancelFunc, error) {
	s.leaseMu.Lock()
	cur, renewed := s.epoch, s.renewedAt
	s.leaseMu.Unlock()
	deadline := renewed.Add(s.part(leaseTTL - leaseMargin))
	if cur == 0 || cur != epoch || !time.Now().Before(deadline) {
		return nil, nil, errLeaseDeadline
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	return pctx, cancel, nil
}

// resign gives the lease up at shutdown.
func (s *scheduler) resign() {
	epoch := s.currentEpoch()
	if epoch == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.part(leaseRenew))
	defer cancel()
	if _, err := s.pool.Exec(ctx, `WITH l AS (
			UPDATE scheduler_lease SET expires_at = now() WHERE name = 'crawl' AND holder = $1 AND epoch = $2 RETURNING epoch, expires_at)
		UPDATE scheduler_epochs e SET ended_at = l.expires_at FROM l WHERE e.epoch = l.epoch`,
		s.holder, epoch); err != nil {
		s.logger.Warn("scheduler: cannot give the lease up; another instance takes over once it expires", "err", err)
	}
	s.leaseMu.Lock()
	s.epoch = 0
	s.leaseMu.Unlock()
	s.metrics.leader.Set(0)
}

// crawlCycle is a crawl_cycles row.
type crawlCycle struct {
	ID         int64
	PlannedAt  time.Time
	Prev       time.Time // the planned time of the cycle before; zero for the first
	Epoch      int64     // leader_epoch: the lease epoch it was planned under
	Apps       *int
	EndOffsets map[int32]int64 // nil until the jobs are published
	FinishedAt *time.Time
}

// lead does what is due: finish publishing, finish the cycle, plan the
// next one, publish jobs for new apps.
func (s *scheduler) lead(ctx context.Context, offs jobOffsets, offsErr error) error {
	last, now, err := s.lastCycle(ctx)
	if err != nil {
		return err
	}
	if last != nil && last.EndOffsets == nil {
		// Planned, but its leader stopped before all jobs were out.
		return s.publishCycle(ctx, *last)
	}
	if last != nil && last.FinishedAt == nil {
		if offsErr != nil {
			return offsErr
		}
		if !s.cycleDone(offs, *last) {
			return s.watchNewApps(ctx, last, now)
		}
		if last, err = s.finishCycle(ctx, *last); err != nil {
			return err
		}
	}
	due := now
	if last != nil {
		due = last.PlannedAt.Add(s.cfg.Interval)
		if last.FinishedAt.After(due) {
			due = *last.FinishedAt
		}
	}
	if time.Now().Before(s.idleUntil) {
		return nil
	}
	if now.Before(due) {
		return s.watchNewApps(ctx, last, now)
	}
	_, err = s.planCycle(ctx, last)
	return err
}

func (s *scheduler) lastCycle(ctx context.Context) (*crawlCycle, time.Time, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, now, fmt.Errorf("read the database's clock: %w", err)
	}
	var c crawlCycle
	var ends []byte
	var prev *time.Time
	err := s.pool.QueryRow(ctx, `SELECT id, planned_at, leader_epoch, apps, job_end_offsets, finished_at,
			(SELECT p.planned_at FROM crawl_cycles p WHERE p.id < c.id ORDER BY p.id DESC LIMIT 1)
		FROM crawl_cycles c ORDER BY id DESC LIMIT 1`).
		Scan(&c.ID, &c.PlannedAt, &c.Epoch, &c.Apps, &ends, &c.FinishedAt, &prev)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, now, nil
	}
	if err != nil {
		return nil, now, fmt.Errorf("read the last crawl cycle: %w", err)
	}
	if prev != nil {
		c.Prev = *prev
	}
	if ends != nil {
		if err := json.Unmarshal(ends, &c.EndOffsets); err != nil {
			return nil, now, fmt.Errorf("crawl cycle %d: job_end_offsets: %w", c.ID, err)
		}
	}
	return &c, now, nil
}

// inLease runs fn in a transaction that holds this instance's lease row,
// or fails when the lease is no longer this instance's: a leader that lost
// the lease writes nothing.
func (s *scheduler) inLease(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var ok bool
		epoch := s.ledEpoch
		err := tx.QueryRow(ctx, `SELECT true FROM scheduler_lease WHERE name = 'crawl' AND holder = $1 AND epoch = $2 AND expires_at > now() FOR UPDATE`,
			s.holder, epoch).Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) {
			s.demote(epoch, "the lease passed to another instance")
			return errors.New("the scheduler lease is no longer this instance's")
		}
		if err != nil {
			return err
		}
		return fn(tx)
	})
}

// planCycle inserts the cycle after last (nil: the first) and publishes its
// jobs; it returns the cycle, nil when there are no active apps.
func (s *scheduler) planCycle(ctx context.Context, last *crawlCycle) (*crawlCycle, error) {
	apps, err := s.apps.ListActive(ctx)
	if err != nil {
		return nil, fmt.Errorf("list active apps: %w", err)
	}
	if len(apps) == 0 {
		// Not a cycle: nothing to record. The leader looks again every
		// CRAWL_NEW_APP_CHECK (at most CRAWL_INTERVAL), and the first app
		// registered starts a cycle at once, so that it is crawled, and
		// shown, as one.
		if s.idleUntil.IsZero() {
			s.logger.Info("no active apps to crawl; register some with POST /api/v1/apps")
		}
		s.idleUntil, s.known = time.Now().Add(min(s.cfg.NewAppCheck, s.cfg.Interval)), map[newAppKey]bool{}
		s.crawl.forgetInactive(nil)
		s.crawl.lastCycle.SetToCurrentTime() // an empty cycle is not an overrun
		return nil, nil
	}
	s.idleUntil = time.Time{}
	c := crawlCycle{Epoch: s.ledEpoch}
	if last != nil {
		c.Prev = last.PlannedAt
	}
	err = s.inLease(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `INSERT INTO crawl_cycles (id, planned_at, leader, leader_epoch)
			SELECT coalesce(max(id), 0) + 1, now(), $1, $2 FROM crawl_cycles
			RETURNING id, planned_at`, s.holder, s.ledEpoch).Scan(&c.ID, &c.PlannedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("plan a crawl cycle: %w", err)
	}
	// The apps again, now that the cycle's row is in: one registered since
	// the first look has created_at before planned_at, so a leader that
	// takes over counts it as this cycle's and its watch skips it.
	if apps, err = s.apps.ListActive(ctx); err != nil {
		return &c, fmt.Errorf("list active apps: %w", err)
	}
	s.logger.Info("crawl cycle planned", "cycle", c.ID, "planned_at", c.PlannedAt, "apps", len(apps))
	return &c, s.publish(ctx, c, apps)
}

// publishCycle publishes the jobs of a cycle planned by a leader that
// stopped before they were all out. Jobs it did publish are there twice;
// their crawls carry the same crawled_at, so the tables take them once.
func (s *scheduler) publishCycle(ctx context.Context, c crawlCycle) error {
	apps, err := s.apps.ListActive(ctx)
	if err != nil {
		return fmt.Errorf("list active apps: %w", err)
	}
	s.logger.Warn("crawl cycle planned but its jobs not all published; publishing them again", "cycle", c.ID, "apps", len(apps))
	// A cycle an older playwatch planned has an epoch scheduler_epochs
	// does not know, which the workers would take for a passed lease: its
	// jobs go out without one, as that playwatch's did.
	var known bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM scheduler_epochs WHERE epoch = $1)`, c.Epoch).Scan(&known); err != nil {
		return fmt.Errorf("read the lease epoch of crawl cycle %d: %w", c.ID, err)
	}
	if !known {
		c.Epoch = 0
	}
	return s.publish(ctx, c, apps)
}

func (s *scheduler) publish(ctx context.Context, c crawlCycle, apps []app) error {
	recs := make([]*kgo.Record, 0, len(apps))
	known := make(map[newAppKey]bool, len(apps))
	series := make(map[appStorefront]bool, len(apps))
	for _, a := range apps {
		for _, loc := range s.cfg.Locales.storefronts(a) {
			r, err := s.jobRecord(c, a, loc)
			if err != nil {
				return err
			}
			recs = append(recs, r)
			known[newAppKey{a.ID, loc}] = true
			series[appStorefront{a.PackageName, loc}] = true
		}
	}
	// The per-app series of this process's crawls: an app or storefront no
	// longer active would otherwise look like one that stopped succeeding.
	s.crawl.forgetInactive(series)
	pctx, cancel, err := s.produceContext(ctx, s.ledEpoch)
	if err != nil {
		return fmt.Errorf("publish the jobs of crawl cycle %d: %w", c.ID, err)
	}
	defer cancel()
	if err := s.producer.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("publish the jobs of crawl cycle %d: %w", c.ID, err)
	}
	s.metrics.published.Add(float64(len(recs)))
	// The jobs are out: recording their end offsets is retried on its own
	// for a lease's time rather than publishing them all again. The row's
	// apps counts apps, not jobs (one per app and storefront): the status
	// page says how many apps a cycle crawled.
	for deadline := time.Now().Add(s.cfg.Lease); ; {
		var ends map[int32]int64
		if ends, err = s.jobEnds(ctx); err == nil {
			err = s.inLease(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE crawl_cycles SET apps = $2, job_end_offsets = $3, published_at = now() WHERE id = $1`, c.ID, len(apps), ends)
				return err
			})
		}
		if err == nil || s.currentEpoch() == 0 || time.Now().After(deadline) || sleepOn(ctx, systemClock{}, s.part(leaseTick)) != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("record the jobs of crawl cycle %d: %w", c.ID, err)
	}
	s.known, s.nextNewCheck = known, time.Now().Add(s.cfg.NewAppCheck)
	s.logger.Info("crawl cycle started", "cycle", c.ID, "apps", len(apps), "jobs", len(recs), "planned_at", c.PlannedAt)
	return nil
}

// jobRecord is the job of a in the storefront loc in cycle c (ID 0: the
// new-app watch's, a full read: a new app or storefront has nothing stored,
// a reactivated one missed its resyncs), planned under the lease epoch
// c.Epoch, keyed by crawlJobKey.
func (s *scheduler) jobRecord(c crawlCycle, a app, loc locale) (*kgo.Record, error) {
	prev := c.Prev
	if prev.IsZero() {
		prev = c.PlannedAt.Add(-s.cfg.Interval)
	}
	key := crawlJobKey(a.PackageName, loc)
	b, err := crawlJobMessage{CycleID: c.ID, PlannedAt: messageTime(c.PlannedAt), PackageName: a.PackageName, IsIranianApp: a.IsIranianApp,
		Lang: loc.Lang, Country: loc.Country, FullResync: c.ID == 0 || fullResyncDue(key, c.PlannedAt, prev, s.cfg.FullResyncEvery),
		LeaseEpoch: c.Epoch}.encode()
	if err != nil {
		return nil, err
	}
	return &kgo.Record{Topic: topicCrawlJobs, Key: []byte(key), Value: b}, nil
}

// finishCycle records that every job of c is done.
func (s *scheduler) finishCycle(ctx context.Context, c crawlCycle) (*crawlCycle, error) {
	var finished time.Time
	err := s.inLease(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `UPDATE crawl_cycles SET finished_at = coalesce(finished_at, now()) WHERE id = $1 RETURNING finished_at`, c.ID).Scan(&finished)
	})
	if err != nil {
		return nil, fmt.Errorf("finish crawl cycle %d: %w", c.ID, err)
	}
	c.FinishedAt = &finished
	took := finished.Sub(c.PlannedAt)
	s.crawl.cycles.Inc()
	s.crawl.lastCycle.SetToCurrentTime()
	s.crawl.cycleDuration.Observe(took.Seconds())
	apps := 0
	if c.Apps != nil {
		apps = *c.Apps
	}
	s.logger.Info("crawl cycle finished", "cycle", c.ID, "apps", apps, "took", took.Round(time.Millisecond))
	if took >= s.cfg.Interval {
		s.crawl.overruns.Inc()
		s.logger.Warn("crawl cycle took longer than CRAWL_INTERVAL; starting the next one now",
			"cycle", c.ID, "took", took.Round(time.Millisecond), "interval", s.cfg.Interval)
	}
	return &c, nil
}

// watchNewApps publishes, every NewAppCheck, a job for each active app and
// storefront that neither the current cycle cur nor an earlier look has
// seen, crawled at now, the database's time; the next cycle crawls it with
// the others. That covers a new app, an app reactivated, and a storefront
// added to an app (PATCH): each gets its first crawl within
// CRAWL_NEW_APP_CHECK. Only the leader looks, and each job it publishes is
// recorded in crawl_new_app_jobs, so no app and storefront is crawled early
// twice in a cycle, also across a restart or a takeover.
func (s *scheduler) watchNewApps(ctx context.Context, cur *crawlCycle, now time.Time) error {
	if cur == nil || time.Now().Before(s.nextNewCheck) {
		return nil
	}
	s.nextNewCheck = time.Now().Add(s.cfg.NewAppCheck)
	apps, err := s.apps.ListActive(ctx)
	if err != nil {
		return fmt.Errorf("list active apps: %w", err)
	}
	if s.known == nil {
		// Started or taken over after the cycle was planned: its jobs hold
		// the apps registered before it, in every storefront they had, and
		// crawl_new_app_jobs those the watch crawled since. One registered
		// later and not crawled yet gets a job now. created_at, not
		// updated_at: the crawl's own name fill and any edit move
		// updated_at, and such an app would be crawled twice in the cycle;
		// an app reactivated meanwhile, or a storefront added to an older
		// app, and not crawled yet waits for the next cycle instead
		// (app_storefronts keeps no time of its own).
		crawled, err := s.newAppJobs(ctx, cur.ID)
		if err != nil {
			return err
		}
		s.known = make(map[newAppKey]bool, len(apps))
		for _, a := range apps {
			for _, loc := range s.cfg.Locales.storefronts(a) {
				if k := (newAppKey{a.ID, loc}); !a.CreatedAt.After(cur.PlannedAt) || crawled[k] {
					s.known[k] = true
				}
			}
		}
	}
	for _, a := range apps {
		for _, loc := range s.cfg.Locales.storefronts(a) {
			k := newAppKey{a.ID, loc}
			if s.known[k] {
				continue
			}
			if err := s.publishNewApp(ctx, cur.ID, a, loc, now); err != nil {
				return err
			}
			s.known[k] = true
			s.metrics.published.Inc()
			s.crawl.newApps.Inc()
			s.logger.Info("crawling a newly active app or storefront now; the next cycle crawls it with the others",
				"package", a.PackageName, "country", loc.Country, "lang", loc.Lang, "cycle", cur.ID)
		}
	}
	return nil
}

// newAppKey is an app in one storefront.
type newAppKey struct {
	app int64
	loc locale
}

// newAppJobs are the apps and storefronts the new-app watch published a job
// for in cycle.
func (s *scheduler) newAppJobs(ctx context.Context, cycle int64) (map[newAppKey]bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT application_id, country, lang FROM crawl_new_app_jobs WHERE cycle_id = $1`, cycle)
	if err != nil {
		return nil, fmt.Errorf("read the new-app jobs of crawl cycle %d: %w", cycle, err)
	}
	out := map[newAppKey]bool{}
	var k newAppKey
	_, err = pgx.ForEachRow(rows, []any{&k.app, &k.loc.Country, &k.loc.Lang}, func() error { out[k] = true; return nil })
	if err != nil {
		return nil, fmt.Errorf("read the new-app jobs of crawl cycle %d: %w", cycle, err)
	}
	return out, nil
}

// publishNewApp publishes the new-app watch's job for a in the storefront
// loc, then records it. Published first: a leader that dies in between
// leaves an app crawled twice, never one not crawled.
func (s *scheduler) publishNewApp(ctx context.Context, cycle int64, a app, loc locale, now time.Time) error {
	r, err := s.jobRecord(crawlCycle{PlannedAt: now, Epoch: s.ledEpoch}, a, loc)
	if err != nil {
		return err
	}
	pctx, cancel, err := s.produceContext(ctx, s.ledEpoch)
	if err != nil {
		return fmt.Errorf("publish a job for new app %s (%s/%s): %w", a.PackageName, loc.Country, loc.Lang, err)
	}
	defer cancel()
	if err := s.producer.ProduceSync(pctx, r).FirstErr(); err != nil {
		return fmt.Errorf("publish a job for new app %s (%s/%s): %w", a.PackageName, loc.Country, loc.Lang, err)
	}
	err = s.inLease(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO crawl_new_app_jobs (cycle_id, application_id, country, lang, planned_at, lease_epoch)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`, cycle, a.ID, loc.Country, loc.Lang, messageTime(now), s.ledEpoch)
		return err
	})
	if err != nil {
		return fmt.Errorf("record the job for new app %s (%s/%s): %w", a.PackageName, loc.Country, loc.Lang, err)
	}
	return nil
}

// jobOffsets are crawl-jobs' end offsets and the workers' next offsets
// (their commits, or the log start where they committed none), by
// partition.
type jobOffsets struct {
	end, next map[int32]int64
}

func (o jobOffsets) lag() int64 {
	var n int64
	for p, e := range o.end {
		n += max(e-o.next[p], 0)
	}
	return n
}

// reached: the workers have committed every job below ends.
func (o jobOffsets) reached(ends map[int32]int64) bool {
	for p, e := range ends {
		if o.next[p] < e {
			return false
		}
	}
	return true
}

// cycleDone: the workers have committed every job of c, or the broker lost
// them (its data deleted, a new cluster): then no worker will ever commit
// past them, so the cycle ends here and the next can be planned.
func (s *scheduler) cycleDone(offs jobOffsets, c crawlCycle) bool {
	if lost := offs.lost(c.EndOffsets); lost != nil {
		s.logger.Warn("crawl-jobs ends below the recorded end of the cycle's jobs: the broker lost them; finishing the cycle",
			"cycle", c.ID, "partitions", lost)
		return true
	}
	return offs.reached(c.EndOffsets)
}

// lost names the partitions whose log ends below ends: the broker no
// longer has the jobs a cycle published there.
func (o jobOffsets) lost(ends map[int32]int64) map[int32]string {
	var out map[int32]string
	for p, e := range ends {
		if end, ok := o.end[p]; !ok || end < e { // a partition gone: a new, smaller topic
			if out == nil {
				out = map[int32]string{}
			}
			out[p] = fmt.Sprintf("log end %d, cycle's jobs end %d", o.end[p], e)
		}
	}
	return out
}

// jobEnds are crawl-jobs' end offsets by partition.
func (s *scheduler) jobEnds(ctx context.Context) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ends, err := listTopicOffsets(ctx, s.adm.ListEndOffsets, topicCrawlJobs)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topicCrawlJobs, err)
	}
	return offsetsByPartition(ends), nil
}

func (s *scheduler) jobOffsets(ctx context.Context) (jobOffsets, error) {
	o := jobOffsets{next: map[int32]int64{}}
	var err error
	if o.end, err = s.jobEnds(ctx); err != nil {
		return o, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	starts, err := listTopicOffsets(ctx, s.adm.ListStartOffsets, topicCrawlJobs)
	if err != nil {
		return o, fmt.Errorf("start offsets of %s: %w", topicCrawlJobs, err)
	}
	commits, err := fetchGroupOffsets(ctx, s.adm, s.cfg.JobsGroup)
	if err != nil {
		return o, err
	}
	for p := range o.end {
		next := int64(0)
		if st, ok := starts.Lookup(topicCrawlJobs, p); ok {
			next = st.Offset
		}
		if c, ok := commits.Lookup(topicCrawlJobs, p); ok && c.At >= 0 {
			next = c.At
		}
		o.next[p] = next
	}
	return o, nil
}

// listTopicOffsets lists topic's offsets with list (an admin's
// ListStartOffsets or ListEndOffsets); a partition's error fails them all.
func listTopicOffsets(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error), topic string) (kadm.ListedOffsets, error) {
	offsets, err := list(ctx, topic)
	if err == nil {
		err = offsets.Error()
	}
	return offsets, err
}

// offsetsByPartition are one topic's listed offsets by partition.
func offsetsByPartition(offsets kadm.ListedOffsets) map[int32]int64 {
	out := map[int32]int64{}
	offsets.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// eachOffsetPair calls fn with each of first's offsets and the same
// partition's in second. A partition that failed in either, or that second
// lacks, is an error instead; they are all joined.
func eachOffsetPair(first, second kadm.ListedOffsets, fn func(a, b kadm.ListedOffset)) error {
	var errs []error
	first.Each(func(a kadm.ListedOffset) {
		b, ok := second.Lookup(a.Topic, a.Partition)
		if a.Err != nil || !ok || b.Err != nil {
			errs = append(errs, fmt.Errorf("offsets of %s/%d: %w", a.Topic, a.Partition, errors.Join(a.Err, b.Err)))
			return
		}
		fn(a, b)
	})
	return errors.Join(errs...)
}

// fetchGroupOffsets are group's committed offsets; none for a group that
// does not exist yet (some brokers say GROUP_ID_NOT_FOUND).
func fetchGroupOffsets(ctx context.Context, adm interface {
	FetchOffsets(context.Context, string) (kadm.OffsetResponses, error)
}, group string) (kadm.OffsetResponses, error) {
	commits, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = commits.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return kadm.OffsetResponses{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	return commits, nil
}

type schedulerMetrics struct {
	leader    prometheus.Gauge
	lag       prometheus.Gauge
	takeovers prometheus.Counter
	published prometheus.Counter
}

func newSchedulerMetrics(reg prometheus.Registerer) *schedulerMetrics {
	mk := metricMaker{reg}
	m := &schedulerMetrics{
		leader:    mk.gauge("playwatch_scheduler_leader", "1 while this instance holds the scheduler lease and plans the crawl cycles, else 0."),
		lag:       mk.gauge("playwatch_crawl_jobs_lag_records", "Crawl jobs published but not yet done by any instance: the fleet's crawl queue depth."),
		takeovers: mk.counter("playwatch_scheduler_leaderships_total", "Times this instance took the scheduler lease."),
		published: mk.counter("playwatch_crawl_jobs_published_total", "Crawl jobs this instance published to crawl-jobs as the leader."),
	}
	return m
}
