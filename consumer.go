package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// consumerOptions are the storage consumer's settings (CONSUMER_* in config.go).
type consumerOptions struct {
	Group           string
	MaxPollRecords  int           // records per batch transaction, at most
	Linger          time.Duration // how long a batch waits to fill up once it has records
	Writers         int           // batch transactions in flight at once, on disjoint partitions
	MaxRecordBytes  int           // larger values are dead letters
	RetryMaxBackoff time.Duration // cap of the wait between retries of a batch
	Clock           clock         // retry waits, pause lengths, validation of timestamps
	// Locales (PLAYSTORE_*) give the default storefront of an app without
	// registered ones, where a message without one is stored.
	Locales localeDefaults
}

func consumerOptionsFrom(cfg Config) consumerOptions {
	return consumerOptions{
		Group:           cfg.ConsumerGroup,
		MaxPollRecords:  cfg.ConsumerMaxPollRecords,
		Linger:          cfg.ConsumerLinger,
		Writers:         cfg.ConsumerWriters,
		MaxRecordBytes:  cfg.ConsumerMaxRecordBytes,
		RetryMaxBackoff: cfg.ConsumerRetryMaxBackoff,
		Clock:           systemClock{},
		Locales:         cfg.Locales,
	}
}

// storageConsumer reads app-stats, reviews and network-metrics as a consumer
// group and stores them exactly once: every batch is one transaction that
// also moves the partitions' offsets in consumer_offsets, the position a
// partition resumes from. Kafka's committed offsets follow after each
// batch, for lag tools only.
type storageConsumer struct {
	store   *consumerStore
	opts    consumerOptions
	metrics *consumerMetrics
	logger  *slog.Logger
	hooks   consumerHooks

	// catchUp are the stored offsets of newly assigned partitions, for the
	// poll loop to commit to Kafka: after a crash between the database and
	// the Kafka commit, a partition with nothing new to consume would go
	// on showing a lag it does not have.
	catchUpMu sync.Mutex
	catchUp   []*kgo.Record

	// rebalanceWaiting is set when a rebalance waits for the poll loop to
	// hand back the records it holds (BlockRebalanceOnPoll).
	rebalanceWaiting atomic.Bool

	// positions are where the next records of each partition start: the
	// stored offset at assignment, then past the last record polled.
	// Records below it mean the client went back: the broker answered
	// OFFSET_OUT_OF_RANGE, its log no longer reaching that far, and the
	// client went on from the log start (ConsumeResetOffset).
	positionsMu sync.Mutex
	positions   map[topicPartition]int64

	// resets are the partitions whose stored offset was moved back since
	// start, for /readyz.
	resetsMu sync.Mutex
	resets   map[topicPartition]offsetResetSeen

	pause dbPause

	// admin reads the group's commits on the broker (resumeFromDatabase);
	// Run sets it from its client and closes adminSet.
	admin    *kadm.Client
	adminSet chan struct{}
}

// offsetResetSeen is an offset reset and when it was stored.
type offsetResetSeen struct {
	offsetReset
	at time.Time
}

// consumerHooks let tests stop the consumer at the two points where a crash
// matters; nil in production. An error they return stops Run with it.
type consumerHooks struct {
	beforeCommit func(ctx context.Context) error                         // inside the batch transaction
	afterCommit  func(ctx context.Context, parts []partitionBatch) error // after COMMIT, before the Kafka commit
}

var errStoppedByHook = errors.New("storage consumer stopped by a hook")

func newStorageConsumer(pool *pgxpool.Pool, opts consumerOptions, reg prometheus.Registerer, logger *slog.Logger) *storageConsumer {
	return &storageConsumer{
		store:     newConsumerStore(pool, opts.Group, opts.Locales),
		opts:      opts,
		metrics:   newConsumerMetrics(reg),
		logger:    logger.With("role", "consumer"),
		positions: map[topicPartition]int64{},
		resets:    map[topicPartition]offsetResetSeen{},
		adminSet:  make(chan struct{}),
	}
}

// clientOptions are the franz-go options of the consumer's group client; the
// caller adds the seed brokers. Rebalances wait while a batch is in flight
// (BlockRebalanceOnPoll), only offsets of stored records are committed to
// Kafka (AutoCommitMarks), and assigned partitions start at the offsets in
// the database.
func (c *storageConsumer) clientOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(c.opts.Group),
		kgo.ConsumeTopics(allTopics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.BlockRebalanceOnPoll(),
		kgo.AutoCommitMarks(),
		kgo.AdjustFetchOffsetsFn(c.resumeFromDatabase),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { c.rebalanceWaiting.Store(true) }),
	}
}

// groupClient is what the consumer needs of a franz-go group client.
type groupClient interface {
	PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches
	AllowRebalance()
	PauseFetchTopics(topics ...string) []string
	ResumeFetchTopics(topics ...string)
	MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset)
	CommitMarkedOffsets(ctx context.Context) error
	CommitRecords(ctx context.Context, rs ...*kgo.Record) error
}

// idlePollWait bounds a poll that finds nothing, so that the loop gets to
// its housekeeping (Kafka catch-up commits) on an idle topic too.
const idlePollWait = time.Second

// Run consumes until ctx is cancelled or the client is closed. It polls and
// decodes the next batch while the previous one is being stored, so the
// database does not wait for Kafka or JSON. A rebalance waits until the batch
// in flight is stored (BlockRebalanceOnPoll), then goes through.
//
// A batch in flight at cancellation is abandoned (its transaction rolls
// back) and read again at the next start; the offsets of stored batches are
// committed to Kafka before Run returns. Database trouble is retried, never
// returned.
func (c *storageConsumer) Run(ctx context.Context, cl groupClient) error {
	c.logger.Info("storage consumer started", "group", c.opts.Group, "topics", allTopics,
		"max_poll_records", c.opts.MaxPollRecords, "linger", c.opts.Linger, "writers", c.opts.Writers)
	if kc, ok := cl.(*kgo.Client); ok && c.admin == nil {
		c.admin = kadm.NewClient(kc)
		close(c.adminSet)
	}
	var inflight chan error // the result of the batch being stored; nil when none is
	finish := func() error {
		if inflight == nil {
			return nil
		}
		err := <-inflight
		inflight = nil
		return err
	}
	var err error
	for ctx.Err() == nil {
		if c.rebalanceWaiting.Swap(false) {
			if err = finish(); err != nil {
				break
			}
			cl.AllowRebalance()
		}
		var parts []partitionBatch
		if parts, err = c.poll(ctx, cl); err != nil {
			break
		}
		if len(parts) == 0 { // idle: store what is in flight, let a rebalance through
			if err = finish(); err != nil {
				break
			}
			c.commitCatchUp(ctx, cl)
			cl.AllowRebalance()
			continue
		}
		batch := c.prepare(parts)
		if err = finish(); err != nil {
			break
		}
		// Nothing is in flight here, and the catch-up of a new assignment
		// was queued before its first records were fetched: committing it
		// now can never rewind a newer commit.
		c.commitCatchUp(ctx, cl)
		done := make(chan error, 1)
		go func() { done <- c.process(ctx, cl, batch) }()
		inflight = done
	}
	if ferr := finish(); err == nil {
		err = ferr
	}
	cl.AllowRebalance()
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		err = nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if cerr := cl.CommitMarkedOffsets(cctx); cerr != nil {
		c.logger.Warn("final Kafka offset commit failed; the database has the offsets", "err", cerr)
	}
	c.logger.Info("storage consumer stopped", "err", err)
	return err
}

// poll returns up to MaxPollRecords records grouped by partition, waiting up
// to Linger for more once the first have arrived.
func (c *storageConsumer) poll(ctx context.Context, cl groupClient) ([]partitionBatch, error) {
	var parts []partitionBatch
	index := map[topicPartition]int{}
	pctx, cancel := context.WithTimeout(ctx, idlePollWait)
	n, err := c.collect(cl.PollRecords(pctx, c.opts.MaxPollRecords), &parts, index)
	cancel()
	if err != nil || n == 0 || n >= c.opts.MaxPollRecords || c.opts.Linger <= 0 {
		return parts, err
	}
	lctx, cancel := context.WithTimeout(ctx, c.opts.Linger)
	defer cancel()
	for n < c.opts.MaxPollRecords && lctx.Err() == nil {
		k, err := c.collect(cl.PollRecords(lctx, c.opts.MaxPollRecords-n), &parts, index)
		if err != nil {
			return parts, err
		}
		n += k
	}
	return parts, nil
}

// collect appends the records of a poll to parts and returns their number.
// Only a closed client is an error; fetch errors are the client's to retry.
func (c *storageConsumer) collect(fs kgo.Fetches, parts *[]partitionBatch, index map[topicPartition]int) (int, error) {
	var closed error
	fs.EachError(func(topic string, p int32, err error) {
		switch {
		case errors.Is(err, kgo.ErrClientClosed):
			closed = err
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		default:
			c.logger.Warn("fetch error", "topic", topic, "partition", p, "err", err)
		}
	})
	n := 0
	c.positionsMu.Lock()
	defer c.positionsMu.Unlock()
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		n += len(p.Records)
		c.metrics.records.WithLabelValues(p.Topic).Add(float64(len(p.Records)))
		tp := topicPartition{p.Topic, p.Partition}
		var rewind *partitionRewind
		if pos, ok := c.positions[tp]; ok && p.Records[0].Offset < pos {
			rewind = &partitionRewind{at: p.Records[0].Offset}
		}
		c.positions[tp] = p.Records[len(p.Records)-1].Offset + 1
		if i, ok := index[tp]; ok {
			(*parts)[i].records = append((*parts)[i].records, p.Records...)
			(*parts)[i].hwm = p.HighWatermark
			if rewind != nil {
				(*parts)[i].rewind = rewind
			}
			return
		}
		index[tp] = len(*parts)
		*parts = append(*parts, partitionBatch{topicPartition: tp, records: p.Records, hwm: p.HighWatermark, rewind: rewind})
	})
	return n, closed
}

// writerShare is the part of a poll batch that one writer stores in one
// transaction, decoded.
type writerShare struct {
	parts   []partitionBatch
	records int
	rows    *batchRows
}

// preparedBatch is a poll batch split between the writers and decoded.
type preparedBatch struct {
	parts  []partitionBatch
	shares []writerShare
}

func (c *storageConsumer) prepare(parts []partitionBatch) preparedBatch {
	now := c.opts.Clock.Now()
	batch := preparedBatch{parts: parts}
	for _, share := range assignWriters(parts, c.opts.Writers) {
		recs := share[0].records
		if len(share) > 1 {
			recs = nil
			for _, p := range share {
				recs = append(recs, p.records...)
			}
		}
		batch.shares = append(batch.shares, writerShare{parts: share, records: len(recs), rows: decodeRecords(recs, c.opts.MaxRecordBytes, now)})
	}
	return batch
}

// process stores a poll batch, each writer's share in its own transaction,
// then marks and commits the offsets in Kafka.
func (c *storageConsumer) process(ctx context.Context, cl groupClient, batch preparedBatch) error {
	errs := make([]error, len(batch.shares))
	var wg sync.WaitGroup
	for i, share := range batch.shares {
		wg.Go(func() { errs[i] = c.storeShare(ctx, cl, share) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if length, rest, ok := c.pause.end(c.opts.Clock.Now()); ok {
		c.metrics.blocked(rest)
		c.metrics.paused.Set(0)
		cl.ResumeFetchTopics(allTopics...)
		c.logger.Info("database takes batches again; fetching resumed", "paused_for", length.Round(time.Millisecond))
	}
	marks := map[string]map[int32]kgo.EpochOffset{}
	for _, p := range batch.parts {
		last := p.records[len(p.records)-1]
		if marks[p.topic] == nil {
			marks[p.topic] = map[int32]kgo.EpochOffset{}
		}
		marks[p.topic][p.partition] = kgo.EpochOffset{Epoch: last.LeaderEpoch, Offset: last.Offset + 1}
		c.metrics.setLag(p.topicPartition, p.hwm-last.Offset-1)
	}
	if c.hooks.afterCommit != nil {
		if err := c.hooks.afterCommit(ctx, batch.parts); err != nil {
			return fmt.Errorf("%w: %w", errStoppedByHook, err)
		}
	}
	cl.MarkCommitOffsets(marks)
	if err := cl.CommitMarkedOffsets(ctx); err != nil && ctx.Err() == nil {
		c.logger.Warn("Kafka offset commit failed; the database has the offsets, the next commit catches up", "err", err)
	}
	return nil
}

// assignWriters splits a poll batch into at most writers shares of whole
// partitions, each as large as can be. Every poll batch is finished before
// the next is polled, so a partition's batches are stored in order whichever
// writer takes them.
func assignWriters(parts []partitionBatch, writers int) [][]partitionBatch {
	if writers <= 1 || len(parts) <= 1 {
		return [][]partitionBatch{parts}
	}
	bySize := slices.Clone(parts)
	slices.SortFunc(bySize, func(a, b partitionBatch) int { return cmp.Compare(len(b.records), len(a.records)) })
	shares := make([][]partitionBatch, min(writers, len(parts)))
	loads := make([]int, len(shares))
	for _, p := range bySize {
		i := 0
		for j := range loads {
			if loads[j] < loads[i] {
				i = j
			}
		}
		shares[i] = append(shares[i], p)
		loads[i] += len(p.records)
	}
	return shares
}

// storeShare stores a writer's share of a batch, retrying until it
// is stored or ctx ends. Transient and blocked errors pause fetching and
// wait with capped exponential backoff; a data error is retried at once in
// narrow mode, which dead-letters the rows PostgreSQL refuses.
func (c *storageConsumer) storeShare(ctx context.Context, cl groupClient, share writerShare) error {
	var beforeCommit func(context.Context) error
	if h := c.hooks.beforeCommit; h != nil {
		beforeCommit = func(ctx context.Context) error {
			if err := h(ctx); err != nil {
				return fmt.Errorf("%w: %w", errStoppedByHook, err)
			}
			return nil
		}
	}
	b := share.rows
	narrow := false
	for attempt := 1; ; attempt++ {
		start := c.opts.Clock.Now()
		out, err := c.store.storeBatch(ctx, share.parts, b, narrow, beforeCommit)
		if err == nil {
			c.metrics.writeSeconds.Observe(c.opts.Clock.Now().Sub(start).Seconds())
			c.metrics.batchRecords.Observe(float64(share.records))
			c.metrics.stored(out, b.newestTimes())
			if len(out.dead) > 0 {
				c.logger.Warn("dead letters written", "count", len(out.dead), "first_reason", out.dead[0].reason)
			}
			for _, r := range out.resets {
				c.noteReset(r)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errStoppedByHook) {
			return err
		}
		kind := classifyDBError(err)
		if kind == dbData && narrow {
			kind = dbBlocked // not about one row: waiting is all that is left
		}
		c.metrics.dbErrors.WithLabelValues(kind.String()).Inc()
		if kind == dbData {
			c.logger.Warn("PostgreSQL refused data in a batch; retrying it row by row to dead-letter the refused rows", "err", err)
			c.store.apps.forget()
			narrow = true
			continue
		}
		if c.pause.begin(c.opts.Clock.Now()) {
			c.metrics.paused.Set(1)
			cl.PauseFetchTopics(allTopics...)
		}
		delay := retryDelay(attempt, c.opts.RetryMaxBackoff)
		log := c.logger.Warn
		if kind == dbBlocked {
			log = c.logger.Error
		}
		log("cannot store batch; fetching paused, retrying", "kind", kind.String(), "attempt", attempt,
			"retry_in", delay.Round(time.Millisecond), "records", share.records, "err", err)
		if err := sleepOn(ctx, c.opts.Clock, delay); err != nil {
			return err
		}
		c.metrics.blocked(c.pause.count(c.opts.Clock.Now()))
	}
}

// dbPause is the consumer's wait for the database: fetching is paused from
// the first failed attempt at a batch until a batch is stored again. Its
// time is counted as it passes, so that blocked seconds grow during a long
// outage rather than at its end.
type dbPause struct {
	mu      sync.Mutex
	since   time.Time // zero while fetching runs
	counted time.Time // the pause has been counted up to here
}

// begin starts a pause at now; false when one is already under way.
func (p *dbPause) begin(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.since.IsZero() {
		return false
	}
	p.since, p.counted = now, now
	return true
}

// count returns the time of the pause not counted yet. Writers read the
// clock before they take the lock, so a now older than the last count
// counts nothing (a counter cannot go down).
func (p *dbPause) count(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.since.IsZero() || !now.After(p.counted) {
		return 0
	}
	d := now.Sub(p.counted)
	p.counted = now
	return d
}

// end ends the pause under way: its whole length and the time not counted
// yet; ok is false when there was none.
func (p *dbPause) end(now time.Time) (length, uncounted time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.since.IsZero() {
		return 0, 0, false
	}
	length, uncounted = now.Sub(p.since), max(now.Sub(p.counted), 0)
	p.since, p.counted = time.Time{}, time.Time{}
	return length, uncounted, true
}

// retryDelay is the wait before retry attempt n: 100ms doubling up to max,
// with jitter so that several consumers do not retry in step.
func retryDelay(attempt int, maxDelay time.Duration) time.Duration {
	d := maxDelay
	if attempt < 20 {
		d = min(100*time.Millisecond<<(attempt-1), maxDelay)
	}
	return d/2 + rand.N(d/2+1)
}

// resumeFromDatabase makes newly assigned partitions start at the next
// offset stored in consumer_offsets, where there is one; partitions without
// a row keep Kafka's committed offset (or start at the beginning). It waits
// for the database rather than start from a possibly older Kafka offset.
//
// A partition starts at its log start instead, its stored offset suspected
// to be of a log the broker no longer has, only when the broker has no
// committed offset of the group for it nor for any other partition of its
// topic: the broker does not know the group's work on the topic, its data
// was deleted, or KAFKA_BROKERS is a new cluster (or every commit expired,
// after a week unused on Apache Kafka, or the topic's first batch was
// stored just before a crash). A new log that has grown past the old stored
// offset could not be told from the old one by its offsets, and its first
// records would be skipped; the other cases read again what is stored,
// without effect (every table's write is idempotent), and the batch moves
// the stored offset back (rewoundFences). A partition whose own commit is
// missing while others of its topic have one (a crash between the database
// commit and the Kafka commit, a commit expired) resumes at its stored
// offset: should the broker's log end be below it, the client's
// OFFSET_OUT_OF_RANGE tells (collect).
func (c *storageConsumer) resumeFromDatabase(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var stored map[topicPartition]int64
	for attempt := 1; ; attempt++ {
		var err error
		if stored, err = c.store.loadOffsets(ctx); err == nil {
			break
		}
		delay := retryDelay(attempt, c.opts.RetryMaxBackoff)
		c.logger.Warn("cannot read the stored offsets of assigned partitions; retrying", "retry_in", delay.Round(time.Millisecond), "err", err)
		if err := sleepOn(ctx, c.opts.Clock, delay); err != nil {
			return nil, err
		}
	}
	// The topics with a commit of the group: those of the partitions
	// assigned here tell most; the broker is asked only when a stored
	// partition without a commit is of a topic none of them tells of.
	committed := map[string]bool{}
	for topic, parts := range offsets {
		for _, o := range parts {
			if o.EpochOffset().Offset >= 0 {
				committed[topic] = true
			}
		}
	}
	ask := false
	for topic, parts := range offsets {
		for p, o := range parts {
			if _, ok := stored[topicPartition{topic, p}]; ok && o.EpochOffset().Offset < 0 && !committed[topic] {
				ask = true
			}
		}
	}
	if ask {
		var err error
		if committed, err = c.committedTopics(ctx); err != nil {
			return nil, err
		}
	}
	var catchUp []*kgo.Record
	var fromStart map[string][]int32
	c.positionsMu.Lock()
	defer c.positionsMu.Unlock()
	for topic, parts := range offsets {
		for p, o := range parts {
			next, ok := stored[topicPartition{topic, p}]
			if !ok {
				continue
			}
			c.positions[topicPartition{topic, p}] = next
			if o.EpochOffset().Offset < 0 && !committed[topic] {
				parts[p] = kgo.NewOffset().AtStart()
				if fromStart == nil {
					fromStart = map[string][]int32{}
				}
				fromStart[topic] = append(fromStart[topic], p)
				continue
			}
			parts[p] = kgo.NewOffset().At(next).WithEpoch(-1)
			catchUp = append(catchUp, &kgo.Record{Topic: topic, Partition: p, Offset: next - 1, LeaderEpoch: -1})
			c.logger.Debug("partition resumes at its stored offset", "topic", topic, "partition", p, "offset", next)
		}
	}
	if len(fromStart) > 0 {
		c.logger.Warn("the broker has no committed offset of the group for any partition of these topics although the database has stored offsets: "+
			"its data was deleted, or KAFKA_BROKERS is a new cluster (or its commits expired); reading these partitions from their log start",
			"group", c.opts.Group, "partitions", fromStart)
	}
	c.catchUpMu.Lock()
	c.catchUp = append(c.catchUp, catchUp...)
	c.catchUpMu.Unlock()
	return offsets, nil
}

// committedTopics are the topics of which the group has a committed offset
// of some partition on the broker. It waits for Run's client and retries
// until the broker answers or ctx ends.
func (c *storageConsumer) committedTopics(ctx context.Context) (map[string]bool, error) {
	select {
	case <-c.adminSet:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for attempt := 1; ; attempt++ {
		commits, err := fetchGroupOffsets(ctx, c.admin, c.opts.Group)
		if err == nil {
			out := map[string]bool{}
			commits.Each(func(o kadm.OffsetResponse) {
				if o.Err == nil && o.At >= 0 {
					out[o.Topic] = true
				}
			})
			return out, nil
		}
		delay := retryDelay(attempt, c.opts.RetryMaxBackoff)
		c.logger.Warn("cannot read the group's committed offsets for newly assigned partitions; retrying", "retry_in", delay.Round(time.Millisecond), "err", err)
		if err := sleepOn(ctx, c.opts.Clock, delay); err != nil {
			return nil, err
		}
	}
}

// commitCatchUp commits the stored offsets of newly assigned partitions to
// Kafka (CommitRecords commits each record's offset + 1).
func (c *storageConsumer) commitCatchUp(ctx context.Context, cl groupClient) {
	c.catchUpMu.Lock()
	recs := c.catchUp
	c.catchUp = nil
	c.catchUpMu.Unlock()
	if len(recs) == 0 {
		return
	}
	if err := cl.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
		c.logger.Warn("committing the stored offsets of assigned partitions to Kafka failed; lag tools may show a stale lag until new records arrive", "err", err)
	}
}

// onRevoked commits the Kafka offsets of what was stored; with
// BlockRebalanceOnPoll it runs between batches, never during one.
func (c *storageConsumer) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.logger.Warn("Kafka offset commit at revocation failed; the database has the offsets", "err", err)
	}
	c.forgetPositions(revoked)
	c.metrics.forgetPartitions(revoked)
}

func (c *storageConsumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(lost) == 0 { // called on every failed attempt to rejoin, e.g. while the broker is down
		return
	}
	c.logger.Warn("partitions lost to the group; another member resumes them from the stored offsets", "partitions", lost)
	c.forgetPositions(lost)
	c.metrics.forgetPartitions(lost)
}

// forgetPositions drops the positions of partitions the member no longer
// has; a new assignment sets them again.
func (c *storageConsumer) forgetPositions(ps map[string][]int32) {
	c.positionsMu.Lock()
	defer c.positionsMu.Unlock()
	for topic, parts := range ps {
		for _, p := range parts {
			delete(c.positions, topicPartition{topic, p})
		}
	}
}

// noteReset tells of a partition whose stored offset a batch moved back:
// in the log, in playwatch_consumer_offset_resets_total and on /readyz.
func (c *storageConsumer) noteReset(r offsetReset) {
	why := "its stored offset is beyond the broker's log end"
	if r.logEnd >= r.stored {
		why = "the broker had no committed offset of the group for any partition of the topic"
	}
	c.logger.Warn("partition reset: "+why+" (the broker's data was deleted, or KAFKA_BROKERS is a new cluster); "+
		"the partition is stored from the broker's log start and its stored offset moved back",
		"topic", r.topic, "partition", r.partition, "stored_offset", r.stored, "log_end", r.logEnd, "from_offset", r.from)
	c.metrics.offsetResets.WithLabelValues(r.topic, strconv.Itoa(int(r.partition))).Inc()
	c.resetsMu.Lock()
	defer c.resetsMu.Unlock()
	c.resets[r.topicPartition] = offsetResetSeen{r, c.opts.Clock.Now()}
}

// readiness is the consumer's line on /readyz. A reset does not make the
// process unready: the consumer stores what the broker has, and nothing a
// restart would change is wrong. The line stays until the process ends.
func (c *storageConsumer) readiness(context.Context) error {
	c.resetsMu.Lock()
	defer c.resetsMu.Unlock()
	if len(c.resets) == 0 {
		return nil
	}
	var lines []string
	for _, tp := range slices.SortedFunc(maps.Keys(c.resets), func(a, b topicPartition) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	}) {
		r := c.resets[tp]
		lines = append(lines, fmt.Sprintf("%s/%d at %s (stored offset %d, broker log end %d, stored again from offset %d)",
			tp.topic, tp.partition, r.at.UTC().Format(time.RFC3339), r.stored, r.logEnd, r.from))
	}
	return readinessNote("ok; partitions reset, their stored offset being of a log the broker no longer has (its data deleted, or a new cluster): " +
		strings.Join(lines, "; "))
}
