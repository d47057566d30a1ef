package main

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// crawlWorker consumes crawl-jobs in the crawl workers' group and crawls
// each job's app with crawler.crawlApp, at most CRAWL_WORKERS at once. A
// job's offset is committed only once its crawl has ended (both paths
// published and confirmed, or failed closed), and per partition only up to
// the first job still running, so a member that dies leaves every job it
// had not finished to the member that gets its partition. Jobs of a
// partition taken away mid-crawl are abandoned, not committed: the new
// owner crawls them again at the same crawled_at. A partition that a
// cooperative rebalance moves to another member first gets up to
// revokeDrain for its running jobs to end and be committed, so that the
// new owner does not read their apps a second time in the cycle. A member
// that gets a partition after a job of it was planned (its last owner died
// or lost it before committing) first asks app_crawl_outcomes whether the
// job's app was crawled since, and skips the job if it was.
type crawlWorker struct {
	crawler *crawler
	epochs  *leaseEpochs
	workers int
	metrics *crawlWorkerMetrics
	logger  *slog.Logger
	// done, if set, gets each job crawled to its end (crawl --once sums
	// up its cycle).
	done func(crawlJobMessage, appResult)

	runCtx context.Context // cancels every job at shutdown
	mu     sync.Mutex
	parts  map[int32]*partitionJobs
	// assignedAt is when each crawl-jobs partition this member holds came
	// to it: a job planned before then may have been crawled by its last
	// owner.
	assignedAt map[int32]time.Time
	commitMu   sync.Mutex // commits leave in the order they are computed
}

// partitionJobs are the jobs of one assigned partition not yet committed,
// in offset order.
type partitionJobs struct {
	ctx     context.Context
	cancel  context.CancelFunc
	since   time.Time // when the partition came to this member
	pending []*kgo.Record
	done    map[int64]bool
}

// crawledAgainMargin: a job planned less than this after its partition came
// to this member is checked for a crawl since it was planned too, and a crawl
// must have ended this long after the job was planned to count, so that
// clocks a little apart across servers never skip a job nobody crawled.
const crawledAgainMargin = time.Second

func newCrawlWorker(c *crawler, epochs *leaseEpochs, workers int, reg prometheus.Registerer, logger *slog.Logger) *crawlWorker {
	return &crawlWorker{crawler: c, epochs: epochs, workers: workers, metrics: newCrawlWorkerMetrics(reg), logger: logger,
		parts: map[int32]*partitionJobs{}, assignedAt: map[int32]time.Time{}}
}

// clientOptions are the consumer settings of the crawl-jobs client. The
// group's session is SCHEDULER_LEASE, so the jobs of a member that died go
// to another within the time a new leader takes. A new group starts at the
// oldest job: the leader may publish before any worker has joined. A
// rebalance waits until polled jobs are tracked (BlockRebalanceOnPoll), so
// a job is never tracked, crawled and committed for a partition already
// taken away: the revoke that follows cancels it.
func (w *crawlWorker) clientOptions(group string, session time.Duration) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topicCrawlJobs),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(max(session/10, 100*time.Millisecond)),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(w.assigned),
		kgo.OnPartitionsRevoked(w.revoked),
		kgo.OnPartitionsLost(w.abandon),
	}
}

// jobsClient is the part of *kgo.Client the worker uses.
type jobsClient interface {
	PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches
	CommitRecords(ctx context.Context, rs ...*kgo.Record) error
	AllowRebalance()
}

// Run polls jobs while a worker slot is free, until ctx ends; then it
// waits for the running jobs, which ctx cancels.
func (w *crawlWorker) Run(ctx context.Context, cl jobsClient) error {
	w.mu.Lock()
	w.runCtx = ctx
	w.mu.Unlock()
	slots := make(chan struct{}, w.workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	w.logger.Info("crawl worker started", "topic", topicCrawlJobs, "workers", w.workers)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := 1
		for free < w.workers && len(slots) < cap(slots) {
			slots <- struct{}{}
			free++
		}
		fetches := cl.PollRecords(ctx, free)
		if ctx.Err() != nil {
			cl.AllowRebalance() // a poll blocks rebalances, an empty one too
			return nil
		}
		fetches.EachError(func(t string, p int32, err error) {
			w.logger.Warn("crawl worker: fetch failed; the client retries", "topic", t, "partition", p, "err", err)
		})
		recs := fetches.Records()
		for range free - len(recs) {
			<-slots
		}
		parts := make([]*partitionJobs, len(recs))
		for i, r := range recs {
			parts[i] = w.track(r)
		}
		cl.AllowRebalance()
		for i, r := range recs {
			p := parts[i]
			wg.Go(func() {
				defer func() { <-slots }()
				w.runJobRecovering(p.ctx, r, p.since)
				w.complete(ctx, cl, r)
			})
		}
	}
}

// track adds a polled job to its partition's pending list and returns the
// partition, whose ctx and since (set once) the job's crawl reads.
func (w *crawlWorker) track(r *kgo.Record) *partitionJobs {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.parts[r.Partition]
	if p == nil {
		since, ok := w.assignedAt[r.Partition]
		if !ok { // not seen assigned: as if it came now
			since = time.Now()
		}
		ctx, cancel := context.WithCancel(w.runCtx)
		p = &partitionJobs{ctx: ctx, cancel: cancel, since: since, done: map[int64]bool{}}
		w.parts[r.Partition] = p
	}
	p.pending = append(p.pending, r)
	return p
}

// runJobRecovering runs one job; a panic while crawling it (a job or a page
// no code foresaw) is logged and counted as an invalid job, which is then
// committed: redelivered after a crash, it would panic again.
func (w *crawlWorker) runJobRecovering(ctx context.Context, r *kgo.Record, since time.Time) {
	defer func() {
		if v := recover(); v != nil {
			w.metrics.invalid.Inc()
			w.logger.Error("crawl worker: a job panicked; skipping it", "partition", r.Partition, "offset", r.Offset,
				"key", printable(string(r.Key), 100), "err", recoveredPanic(v))
		}
	}()
	w.runJob(ctx, r, since)
}

// runJob crawls the job r of a partition this member has had since since.
func (w *crawlWorker) runJob(ctx context.Context, r *kgo.Record, since time.Time) {
	m, bad := decodeCrawlJob(r.Value, time.Now())
	if bad != nil {
		w.metrics.invalid.Inc()
		w.logger.Warn("crawl worker: skipping a job that breaks its contract", "partition", r.Partition, "offset", r.Offset,
			"key", printable(string(r.Key), 100), "reason", string(bad.code)+": "+bad.detail)
		return
	}
	if m.LeaseEpoch != 0 {
		valid, err := w.epochs.valid(ctx, m.LeaseEpoch, m.PlannedAt, w.logger)
		if err != nil {
			return // cancelled: the job is not committed
		}
		if !valid {
			w.metrics.leasePassed.Inc()
			w.logger.Warn("crawl worker: dropping a job planned when its leader's lease had passed", "package", m.PackageName,
				"cycle", m.CycleID, "lease_epoch", m.LeaseEpoch, "planned_at", m.PlannedAt, "partition", r.Partition, "offset", r.Offset)
			return
		}
	}
	if w.crawledAlready(ctx, m, since) {
		w.metrics.crawledAlready.Inc()
		return
	}
	if ctx.Err() != nil {
		return // cancelled while checking: not crawled, not committed
	}
	res := func() appResult {
		w.crawler.metrics.busy.Inc()
		defer w.crawler.metrics.busy.Dec() // also when the crawl panics
		return w.crawler.crawlApp(ctx, m.crawlJob())
	}()
	if ctx.Err() == nil {
		w.metrics.done.Inc()
		if w.done != nil {
			w.done(m, res)
		}
	}
	w.logger.Debug("crawl job done", "package", m.PackageName, "cycle", m.CycleID, "stats_err", res.statsErr, "reviews_err", res.reviewsErr)
}

// crawledAlready says whether m's app was crawled in both paths since m was
// planned, by another member that had m's partition then; a job planned
// while this member had the partition was not. A failed check crawls.
func (w *crawlWorker) crawledAlready(ctx context.Context, m crawlJobMessage, since time.Time) bool {
	if !m.PlannedAt.Before(since.Add(crawledAgainMargin)) {
		return false
	}
	j := m.crawlJob()
	crawled, err := w.crawler.known.CrawledSince(ctx, m.PackageName, j.Locale, m.PlannedAt.Add(crawledAgainMargin))
	if err != nil && ctx.Err() == nil {
		w.logger.Warn("crawl worker: cannot tell whether the job's app was crawled since it was planned; crawling it", "package", m.PackageName,
			"cycle", m.CycleID, "err", err)
		return false
	}
	if crawled {
		w.logger.Debug("crawl worker: skipping a job whose app was crawled since it was planned", "package", m.PackageName,
			"country", j.Locale.Country, "lang", j.Locale.Lang, "cycle", m.CycleID, "planned_at", m.PlannedAt)
	}
	return crawled
}

// complete marks r done and commits its partition up to the first job
// still running. A job whose partition was taken away meanwhile is not
// committed.
func (w *crawlWorker) complete(ctx context.Context, cl jobsClient, r *kgo.Record) {
	w.commitMu.Lock()
	defer w.commitMu.Unlock()
	w.mu.Lock()
	p := w.parts[r.Partition]
	if p == nil || !slices.Contains(p.pending, r) || p.ctx.Err() != nil {
		w.mu.Unlock()
		return
	}
	p.done[r.Offset] = true
	var upTo *kgo.Record
	for len(p.pending) > 0 && p.done[p.pending[0].Offset] {
		upTo = p.pending[0]
		delete(p.done, upTo.Offset)
		p.pending = p.pending[1:]
	}
	w.mu.Unlock()
	if upTo == nil {
		return
	}
	if err := cl.CommitRecords(context.WithoutCancel(ctx), upTo); err != nil {
		w.logger.Warn("crawl worker: commit failed; the jobs up to it may be crawled again", "partition", upTo.Partition,
			"offset", upTo.Offset, "err", err)
	}
}

// assigned notes when partitions came to this member. A cooperative
// rebalance names only the partitions new to it, so one it keeps keeps its
// time.
func (w *crawlWorker) assigned(_ context.Context, _ *kgo.Client, got map[string][]int32) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range got[topicCrawlJobs] {
		w.assignedAt[p] = now
	}
}

// revokeDrain bounds how long a rebalance waits for the running jobs of
// the partitions this member gives up: about one app's crawl through a
// slow proxy. Meanwhile this member polls no new job (BlockRebalanceOnPoll
// holds its polls while franz-go revokes), so a drain costs its free slots
// up to that long; crawling an app twice costs its proxies more.
const revokeDrain = 10 * time.Second

// revoked drains, then abandons, the partitions a rebalance moves away.
// The member still owns them while this runs, so the jobs that end in
// time are committed (complete) and the new owner starts after them; the
// wait is revokeDrain plus a commit under way (abandon). At shutdown the
// jobs are cancelled and the drain ends at once.
func (w *crawlWorker) revoked(ctx context.Context, cl *kgo.Client, moving map[string][]int32) {
	w.drain(moving[topicCrawlJobs], revokeDrain)
	w.abandon(ctx, cl, moving)
}

// drain waits until parts have no job left uncommitted, their jobs are
// cancelled, or timeout has passed. No job joins them meanwhile: polls
// are held while franz-go revokes.
func (w *crawlWorker) drain(parts []int32, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for w.running(parts) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// running reports whether any of parts has a job not yet committed whose
// partition is not cancelled.
func (w *crawlWorker) running(parts []int32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range parts {
		if pj := w.parts[p]; pj != nil && len(pj.pending) > 0 && pj.ctx.Err() == nil {
			return true
		}
	}
	return false
}

// abandon cancels the jobs of partitions taken away from this member; they
// are never committed here. It waits for a commit under way, so none leaves
// once the partition may have a new owner.
func (w *crawlWorker) abandon(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	w.commitMu.Lock()
	defer w.commitMu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range lost[topicCrawlJobs] {
		delete(w.assignedAt, p)
		if pj := w.parts[p]; pj != nil {
			if len(pj.pending) > 0 {
				w.logger.Info("crawl worker: partition taken away; its running jobs are left to its new owner", "partition", p, "jobs", len(pj.pending))
			}
			pj.cancel()
			delete(w.parts, p)
		}
	}
}

type crawlWorkerMetrics struct {
	done           prometheus.Counter
	invalid        prometheus.Counter
	leasePassed    prometheus.Counter
	crawledAlready prometheus.Counter
}

func newCrawlWorkerMetrics(reg prometheus.Registerer) *crawlWorkerMetrics {
	mk := metricMaker{reg}
	m := &crawlWorkerMetrics{
		done:        mk.counter("playwatch_crawl_jobs_done_total", "Crawl jobs this instance crawled to the end (both paths published or failed closed)."),
		invalid:     mk.counter("playwatch_crawl_jobs_invalid_total", "Crawl jobs skipped because they break the crawl-jobs contract (logged with partition and offset)."),
		leasePassed: mk.counter("playwatch_crawl_jobs_lease_passed_total", "Crawl jobs dropped because their planned_at is outside their lease epoch: published by a leader whose lease had passed (logged)."),
		crawledAlready: mk.counter("playwatch_crawl_jobs_crawled_already_total",
			"Crawl jobs skipped because their app was crawled in both paths since they were planned, by the member that had their partition before this one (it died or lost the partition before committing)."),
	}
	return m
}

// leaseEpochs judges a job by its lease epoch (docs/design.md "Several
// servers"): it is valid when its planned_at lies within the epoch's
// [began_at, ended_at) in scheduler_epochs. Epochs never overlap, so a job
// planned by a leader whose lease had passed is outside its epoch, while the
// jobs of a cycle planned under a valid lease stay valid after any takeover.
// ended_at only moves forward and began_at never, so a job inside a known
// interval needs no query.
type leaseEpochs struct {
	pool  *pgxpool.Pool
	mu    sync.Mutex
	known map[int64][2]time.Time
}

func newLeaseEpochs(pool *pgxpool.Pool) *leaseEpochs {
	return &leaseEpochs{pool: pool, known: map[int64][2]time.Time{}}
}

// valid says whether at lies within epoch; an epoch the database never had
// is not valid. It retries a failing query until ctx ends (its error then):
// a job is neither crawled nor dropped on a guess.
func (e *leaseEpochs) valid(ctx context.Context, epoch int64, at time.Time, logger *slog.Logger) (bool, error) {
	within := func(iv [2]time.Time) bool { return !at.Before(iv[0]) && at.Before(iv[1]) }
	e.mu.Lock()
	iv, ok := e.known[epoch]
	e.mu.Unlock()
	if ok && (within(iv) || at.Before(iv[0])) {
		return within(iv), nil
	}
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 10*time.Second) {
		err := e.pool.QueryRow(ctx, `SELECT began_at, ended_at FROM scheduler_epochs WHERE epoch = $1`, epoch).Scan(&iv[0], &iv[1])
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err == nil {
			e.mu.Lock()
			e.known[epoch] = iv
			e.mu.Unlock()
			return within(iv), nil
		}
		if ctx.Err() == nil {
			logger.Warn("crawl worker: cannot read the lease epoch of a job; trying again", "lease_epoch", epoch, "err", err)
		}
		if err := sleepOn(ctx, systemClock{}, delay); err != nil {
			return false, err
		}
	}
}
