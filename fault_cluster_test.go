package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// freshPlaywatchTopics gives the shared cluster new playwatch topics,
// created the way playwatch creates them, replicated to every node, and
// removes them when the test ends.
func freshPlaywatchTopics(t *testing.T, ctx context.Context, k *apacheKafka, spec topicSpec) {
	t.Helper()
	deleteTopics := func(ctx context.Context) error {
		resps, err := k.Admin().DeleteTopics(ctx, allTopics...)
		if err != nil {
			return err
		}
		for _, r := range resps {
			if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
				return fmt.Errorf("delete %s: %w", r.Topic, r.Err)
			}
		}
		return nil
	}
	if err := deleteTopics(ctx); err != nil {
		t.Fatalf("delete topics left by an earlier test: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := deleteTopics(ctx); err != nil {
			t.Errorf("delete the test's topics: %v", err)
		}
	})
	if err := ensureTopics(ctx, k.Admin(), spec, allTopics, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	for _, id := range k.liveNodes() {
		for _, topic := range allTopics {
			if err := k.waitTopicOnNode(ctx, id, topic, int32(spec.Partitions)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// batchRetryCounter adds to produceRetryCounter what the client logs only at
// debug level: each batch it resends itself, and the partition errors that
// made it (REQUEST_TIMED_OUT while the ISR still holds a dead node, say).
type batchRetryCounter struct {
	*produceRetryCounter
	resends    atomic.Int64
	mu         sync.Mutex
	retryCodes map[string]int
}

// retryCode finds the error code of a retried batch in the client's
// "produced" line, e.g. reviews[1{retrying@600,300(REQUEST_TIMED_OUT: ...)}].
var retryCode = regexp.MustCompile(`retrying@[0-9,]+\(([A-Z_]+)`)

func (c *batchRetryCounter) Level() kgo.LogLevel { return kgo.LogLevelDebug }

func (c *batchRetryCounter) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch msg {
	case "rewinding produce sequence to resend pending batches":
		c.resends.Add(1)
	case "produced":
		for i := 0; i+1 < len(keyvals); i += 2 {
			if keyvals[i] != "to" {
				continue
			}
			for _, m := range retryCode.FindAllStringSubmatch(fmt.Sprint(keyvals[i+1]), -1) {
				c.mu.Lock()
				c.retryCodes[m[1]]++
				c.mu.Unlock()
			}
		}
	}
	c.produceRetryCounter.Log(level, msg, keyvals...)
}

func (c *batchRetryCounter) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%s; %d batches resent by the client, retried partition errors %v",
		c.produceRetryCounter.summary(), c.resends.Load(), c.retryCodes)
}

// A three-node Apache Kafka cluster (KRaft) loses the leader of a reviews
// partition in the middle of a crawl cycle. Topics have replication factor 3
// and min.insync.replicas=2, the producer runs with the production settings.
// The cycle completes, every message is on its topic exactly once (the
// idempotent producer resends what the dead leader never answered with its
// original sequence numbers), and the storage consumer, running throughout,
// stores every row exactly once.
func TestFaultThreeNodeLeaderKillMidCycle(t *testing.T) {
	requireFaultSuite(t)
	const apps, reviewsPerApp, workers = 24, 300, 3
	k := apacheKafkaCluster(t, 3)
	began := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	logger := testLogger(t)
	brokers := k.Brokers()
	freshPlaywatchTopics(t, ctx, k, topicSpec{Partitions: 3, Replication: 3, Retention: time.Hour})
	configs, err := k.Admin().DescribeTopicConfigs(ctx, topicReviews)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := configs.On(topicReviews, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := topicConfigValue(rc, "min.insync.replicas"); v != "2" {
		t.Fatalf("reviews has min.insync.replicas %q, want 2", v)
	}
	for p := range int32(3) {
		pd, err := k.partitionDetail(ctx, topicReviews, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(pd.Replicas) != 3 || len(pd.ISR) != 3 {
			t.Fatalf("reviews/%d: replicas %v, ISR %v; want all three nodes", p, pd.Replicas, pd.ISR)
		}
	}

	pool := newTestPool(t)
	registry := newAppStore(pool)
	replay := newReplayPlayStore(t)
	for i := range apps {
		pkg := fmt.Sprintf("com.example.cluster%02d", i)
		replay.setApp(pkg, replayApp{Reviews: reviewsPerApp})
		if _, err := registry.Create(ctx, newApp{PackageName: pkg}); err != nil {
			t.Fatal(err)
		}
	}
	// Eight Play Store requests a second (three per app) spread the cycle
	// over about ten seconds, so that the kill lands in its middle.
	store := newTestPlayStore(t, replay.URL, func(p *proxyPoolConfig, c *playStoreConfig) {
		p.Clock, c.Clock = systemClock{}, systemClock{}
		p.RateLimitRequests, p.RateLimitPeriod = 8, time.Second
	})

	cfg, err := loadTestConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	counter := &batchRetryCounter{produceRetryCounter: &produceRetryCounter{}, retryCodes: map[string]int{}}
	producer, err := kgo.NewClient(append(producerOptions(cfg.Producer), kgo.SeedBrokers(brokers...),
		kgo.WithHooks(counter), kgo.WithLogger(counter))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	pub := newPublisher(producer, cfg.Producer, prometheus.NewRegistry(), logger)
	// Every cycle reads every review: the checks count them per cycle.
	ccfg := testCrawlerConfig(workers, reviewsPerApp)
	ccfg.FullSyncInterval = 0
	cr := newCycleCrawler(ccfg, registry, store.client, newPGKnownReviews(pool), pub, prometheus.NewRegistry(), logger)

	opts := testConsumerOptions()
	opts.Group = k.TopicName(t) // the cluster outlives this test's database
	tc := startTestConsumer(t, pool, brokers, opts, consumerHooks{})

	// Once a third of the reviews are confirmed, the leader of reviews/0 is
	// killed (SIGKILL) and the test waits for the cluster to elect another.
	type kill struct {
		node, newLeader int32
		at              time.Time
		producedBefore  float64
		leaderChange    time.Duration
		err             error
	}
	produced := func(topic string) float64 { return testutil.ToFloat64(pub.metrics.produced.WithLabelValues(topic)) }
	killed := make(chan kill, 1)
	go func() {
		var kl kill
		defer func() { killed <- kl }()
		for produced(topicReviews) < apps*reviewsPerApp/3 {
			if ctx.Err() != nil {
				kl.err = ctx.Err()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		if kl.node, kl.err = k.PartitionLeader(ctx, topicReviews, 0); kl.err != nil {
			return
		}
		kl.producedBefore, kl.at = produced(topicReviews), time.Now()
		if kl.err = k.KillNode(ctx, kl.node); kl.err != nil {
			return
		}
		kl.newLeader, kl.err = k.WaitForLeader(ctx, topicReviews, 0, kl.node)
		kl.leaderChange = time.Since(kl.at)
	}()

	cycleStart := time.Now()
	sum, err := cr.RunCycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cycleEnd := time.Now()
	kl := <-killed
	if kl.err != nil {
		t.Fatalf("killing the leader: %v", kl.err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apacheKafkaStartTimeout)
		defer cancel()
		restartAt := time.Now()
		if err := k.StartNode(ctx, kl.node); err != nil {
			t.Errorf("restart node %d: %v", kl.node, err)
			return
		}
		if err := k.WaitForISR(ctx, topicReviews, 0, kl.node); err != nil {
			t.Error(err)
			return
		}
		t.Logf("node %d restarted and back in the ISR of reviews/0 after %s", kl.node, time.Since(restartAt).Round(time.Millisecond))
	})
	t.Logf("cycle: %s", sum)
	t.Logf("killed node %d, leader of reviews/0, %s into the cycle with %v of %d reviews confirmed; new leader %d in the metadata after %s",
		kl.node, kl.at.Sub(cycleStart).Round(time.Millisecond), kl.producedBefore, apps*reviewsPerApp, kl.newLeader, kl.leaderChange.Round(time.Millisecond))
	t.Logf("producer: %s", counter.summary())
	t.Logf("publisher: records the client gave up on: app-stats %v, reviews %v; residual resends: app-stats %v, reviews %v",
		testutil.ToFloat64(pub.metrics.failed.WithLabelValues(topicAppStats)), testutil.ToFloat64(pub.metrics.failed.WithLabelValues(topicReviews)),
		testutil.ToFloat64(pub.metrics.residualRetries.WithLabelValues(topicAppStats)), testutil.ToFloat64(pub.metrics.residualRetries.WithLabelValues(topicReviews)))
	if kl.producedBefore >= apps*reviewsPerApp || !kl.at.Before(cycleEnd) {
		t.Fatalf("the kill came after the cycle's publishing (%v reviews confirmed before it)", kl.producedBefore)
	}
	if sum.StatsOK != apps || sum.ReviewsOK != apps || sum.Reviews != apps*reviewsPerApp || len(sum.Failures) != 0 {
		t.Fatalf("cycle: %s; want every app on both paths", sum)
	}

	tt := tallyTopics(t, brokers)
	if want := apps * (1 + reviewsPerApp); tt.records != want {
		t.Errorf("the topics hold %d records, want %d", tt.records, want)
	}
	if tt.distinctReviews() != apps*reviewsPerApp || len(tt.stats) != apps {
		t.Errorf("%d distinct reviews and %d app-stats on the topics, want %d and %d", tt.distinctReviews(), len(tt.stats), apps*reviewsPerApp, apps)
	}
	waitStored(t, 2*time.Minute, brokers, pool, opts.Group)
	checkTopicsMatchDatabase(t, tt, pool)
	if n := count(t, pool, `SELECT count(*) FROM app_stats`); n != apps {
		t.Errorf("%d app_stats rows, want %d", n, apps)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews`); n != apps*reviewsPerApp {
		t.Errorf("%d reviews rows, want %d", n, apps*reviewsPerApp)
	}
	if err := tc.stop(); err != nil {
		t.Errorf("consumer: %v", err)
	}
	t.Logf("took %s (cycle %s)", time.Since(began).Round(time.Millisecond), cycleEnd.Sub(cycleStart).Round(time.Millisecond))
}
