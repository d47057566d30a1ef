package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produceReviewsTo writes n reviews of pkg, named prefix-i, to partitions in turn.
func produceReviewsTo(t *testing.T, brokers []string, pkg, prefix string, partitions []int32, n int) {
	t.Helper()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topicReviews, Key: []byte(pkg), Partition: partitions[i%len(partitions)],
			Value: msgJSON(reviewFields(pkg, fmt.Sprintf("%s-%d", prefix, i), testCrawl))})
	}
	produceToPartitions(t, brokers, recs...)
}

// storedOffsetsOf are the consumer's stored next offsets of topic by partition.
func storedOffsetsOf(t *testing.T, store *consumerStore, topic string) map[int32]int64 {
	t.Helper()
	all, err := store.loadOffsets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	for tp, next := range all {
		if tp.topic == topic {
			out[tp.partition] = next
		}
	}
	return out
}

// wipeableBroker is an embedded broker whose data a test deletes.
type wipeableBroker struct {
	dir string
	b   *embeddedBroker
}

// newWipeableBroker starts a wipeableBroker and returns it with its seeds.
func newWipeableBroker(t *testing.T) (w *wipeableBroker, brokers []string) {
	w = &wipeableBroker{dir: t.TempDir()}
	w.b, brokers = newTestBroker(t, w.dir)
	return w, brokers
}

// wipe stops the broker, deletes its data (data/broker) and starts it empty
// in the same place; it returns the seeds of the new broker.
func (w *wipeableBroker) wipe(t *testing.T) (brokers []string) {
	t.Helper()
	w.b.Close()
	if err := os.RemoveAll(w.dir); err != nil {
		t.Fatal(err)
	}
	w.b, brokers = newTestBroker(t, w.dir)
	return brokers
}

// The embedded broker's data is deleted while PostgreSQL keeps its rows:
// the new logs start at 0 again, below the stored offsets. The consumer
// stores every new record (none below the old offsets is skipped), moves
// the stored offsets back, and says so in its log, in
// playwatch_consumer_offset_resets_total and on /readyz, which stays 200.
// A partition that got no new record keeps its offset until one comes.
// Without the group's commits on the broker (a wiped one), a new log that
// has grown past the old offset before the consumer starts is stored whole
// too; with them (a cluster that kept its commits but lost the log), the
// client's OFFSET_OUT_OF_RANGE tells.
func TestConsumerStoresANewLogAfterTheBrokerDataWasDeleted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		commits bool            // the new broker has the group's commits
		newRecs map[int32]int64 // new records by partition
	}{
		{"wiped broker", false, map[int32]int64{0: 6, 1: 40}},
		{"broker that kept the commits", true, map[int32]int64{0: 6, 1: 6}},
	} {
		t.Run(c.name, func(t *testing.T) { checkNewLogAfterBrokerDataDeleted(t, c.commits, c.newRecs) })
	}
}

func checkNewLogAfterBrokerDataDeleted(t *testing.T, commits bool, newRecs map[int32]int64) {
	pool := newTestPool(t)
	broker, brokers := newWipeableBroker(t)
	const pkg = "org.telegram.messenger"
	group := testConsumerOptions().Group
	registerApps(t, pool, pkg)
	reviews := func() int { return count(t, pool, `SELECT count(*) FROM reviews`) }

	produceReviewsTo(t, brokers, pkg, "old", []int32{0, 1, 2}, 90)
	first := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "the first 90 reviews", func() bool { return reviews() == 90 })
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	brokers = broker.wipe(t)
	if commits {
		withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
			var offs kadm.Offsets
			for p := range int32(3) {
				offs.Add(kadm.Offset{Topic: topicReviews, Partition: p, At: 30, LeaderEpoch: -1})
			}
			if err := adm.CommitAllOffsets(ctx, group, offs); err != nil {
				t.Fatal(err)
			}
		})
	}
	want := 90
	for p, n := range newRecs {
		produceReviewsTo(t, brokers, pkg, fmt.Sprintf("new%d", p), []int32{p}, int(n))
		want += int(n)
	}
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), &slog.HandlerOptions{Level: slog.LevelInfo}))
	second := startLoggedTestConsumer(t, logger, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "the new reviews", func() bool { return reviews() == want })
	store := newConsumerStore(pool, group, testLocales)
	if got := storedOffsetsOf(t, store, topicReviews); got[0] != newRecs[0] || got[1] != newRecs[1] || got[2] != 30 {
		t.Errorf("stored offsets %v, want 0:%d 1:%d (moved back to the new logs) 2:30 (no new record yet)", got, newRecs[0], newRecs[1])
	}
	resets := func(want map[string]float64) {
		t.Helper()
		for p, want := range want {
			if got := metricValue(t, second.reg, "playwatch_consumer_offset_resets_total", map[string]string{"topic": topicReviews, "partition": p}); got != want {
				t.Errorf("offset resets of reviews/%s = %v, want %v", p, got, want)
			}
		}
	}
	resets(map[string]float64{"0": 1, "1": 1, "2": 0})
	for p, n := range newRecs {
		want := fmt.Sprintf("topic=reviews partition=%d stored_offset=30 log_end=%d from_offset=0", p, n)
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "partition reset: its stored offset is beyond the broker's log end") {
		t.Errorf("the log does not say that the stored offset is beyond the broker's log end")
	}

	// /readyz answers 200 with a line naming each reset partition.
	srv := httptest.NewServer(newHTTPHandler(prometheus.NewRegistry(), newHTTPMetrics(prometheus.NewRegistry()), nil, nil,
		[]readinessCheck{{"database", pool.Ping}, {"consumer", second.sc.readiness}}, testLogger(t)))
	defer srv.Close()
	code, body := httpDo(t, "GET", srv.URL+"/readyz", "")
	var ready struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	line := ready.Checks["consumer"]
	if code != 200 || ready.Status != "ready" || !strings.HasPrefix(line, "ok; partitions reset") ||
		!strings.Contains(line, "reviews/0 at ") || !strings.Contains(line, "(stored offset 30, broker log end 6, stored again from offset 0)") ||
		!strings.Contains(line, "reviews/1 at ") || strings.Contains(line, "reviews/2") {
		t.Errorf("/readyz: %d %s; want 200, ready, a line for reviews/0 and reviews/1", code, body)
	}

	// The partitions go on from there, with no further reset; the one
	// without new records is reset by its first.
	produceReviewsTo(t, brokers, pkg, "newer", []int32{0, 2}, 10)
	waitFor(t, 20*time.Second, "the 10 newer reviews", func() bool { return reviews() == want+10 })
	wantOffsets := map[int32]int64{0: newRecs[0] + 5, 1: newRecs[1], 2: 5}
	if got := storedOffsetsOf(t, store, topicReviews); !maps.Equal(got, wantOffsets) {
		t.Errorf("stored offsets %v, want %v", got, wantOffsets)
	}
	resets(map[string]float64{"0": 1, "1": 1, "2": 1})
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	// Kafka's commits, for lag tools, follow the new logs.
	var offs kadm.OffsetResponses
	var err error
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		offs, err = adm.FetchOffsets(ctx, group)
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range wantOffsets {
		if o, ok := offs.Lookup(topicReviews, p); !ok || o.At != want {
			t.Errorf("Kafka's committed offset of reviews/%d: %v, want %d", p, o.At, want)
		}
	}
}

// The budget keeper never trims records of a log the consumer has not
// stored because its stored offset is of an older, wiped log: while the
// stored offset is beyond the log end, or the consumer has committed no
// offset to this broker (the new log may have grown past the old offset),
// the partition's floor is its start. Once the consumer has stored the new
// log and moved the offsets back, stored records go as usual.
func TestBrokerBudgetKeepsANewLogBelowTheStoredOffset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logger := testLogger(t)
	brokers, adm := startTopicsBroker(t, topicSpec{Partitions: 1, Replication: -1})
	pool := newTestPool(t)
	const pkg = "com.example.wiped"
	registerApps(t, pool, pkg)
	group := testConsumerOptions().Group
	// What the consumer stored of the logs before the broker's data went:
	// more app-stats than the new log has, fewer network metrics.
	if _, err := pool.Exec(ctx, `INSERT INTO consumer_offsets (consumer_group, topic, "partition", next_offset) VALUES ($1, $2, 0, 50), ($1, $3, 0, 5)`,
		group, topicAppStats, topicNetworkMetrics); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 10 {
		recs = append(recs, rec(topicAppStats, pkg, msgJSON(statFields(pkg, time.Now().Add(time.Duration(i)*time.Millisecond)))),
			rec(topicNetworkMetrics, pkg, msgJSON(networkFields(pkg, fmt.Sprintf("00000000-0000-4000-8000-%012d", i)))))
	}
	produce(t, brokers, recs...)
	starts := func() map[string]int64 {
		l, err := adm.ListStartOffsets(ctx, topicAppStats, topicNetworkMetrics)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		l.Each(func(o kadm.ListedOffset) { out[o.Topic] = o.Offset })
		return out
	}
	budget, err := planBrokerBudget(256<<20, 200*time.Millisecond, allTopics)
	if err != nil {
		t.Fatal(err)
	}
	keeper := newBrokerBudgetKeeper(budget, adm, newConsumerStore(pool, group, testLocales), prometheus.NewRegistry(), logger)
	time.Sleep(300 * time.Millisecond) // older than the retention
	if err := keeper.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if s := starts(); s[topicAppStats] != 0 || s[topicNetworkMetrics] != 0 {
		t.Fatalf("log starts %v: records nobody stored were trimmed, below a stored offset of a log the broker no longer has", s)
	}

	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "the new log's records", func() bool {
		return count(t, pool, `SELECT count(*) FROM app_stats`) == 10 && count(t, pool, `SELECT count(*) FROM network_metrics`) == 10
	})
	waitFor(t, 10*time.Second, "the Kafka commits", func() bool { return kafkaCommitted(t, brokers, group) == 20 })
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	store := newConsumerStore(pool, group, testLocales)
	if a, n := storedOffsetsOf(t, store, topicAppStats), storedOffsetsOf(t, store, topicNetworkMetrics); a[0] != 10 || n[0] != 10 {
		t.Errorf("stored offsets app-stats %v, network-metrics %v; want 10 each", a, n)
	}
	if err := keeper.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if s := starts(); s[topicAppStats] != 10 || s[topicNetworkMetrics] != 10 {
		t.Errorf("log starts %v after the consumer stored the new logs, want 10 each", s)
	}
}

// After a reset, a bad record of the new log at the offset of a dead letter
// of the old log that is still kept gets its own dead-letter row: the rows
// carry the log generation, which the reset counted up.
func TestConsumerDeadLettersOfANewLogAtAnOldDeadLettersOffset(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	broker, brokers := newWipeableBroker(t)
	const pkg = "org.telegram.messenger"
	group := testConsumerOptions().Group
	registerApps(t, pool, pkg)
	// produceWithBadAt writes n records to reviews/0, the one at offset bad not JSON.
	produceWithBadAt := func(brokers []string, prefix string, n, bad int) {
		var recs []*kgo.Record
		for i := range n {
			v := msgJSON(reviewFields(pkg, fmt.Sprintf("%s-%d", prefix, i), testCrawl))
			if i == bad {
				v = []byte("not JSON of " + prefix)
			}
			recs = append(recs, &kgo.Record{Topic: topicReviews, Key: []byte(pkg), Partition: 0, Value: v})
		}
		produceToPartitions(t, brokers, recs...)
	}
	deadLetters := func() int { return count(t, pool, `SELECT count(*) FROM dead_letter_events`) }

	produceWithBadAt(brokers, "old", 6, 2)
	first := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "the old log stored", func() bool { return deadLetters() == 1 && storedOffsetsOf(t, first.sc.store, topicReviews)[0] == 6 })
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	brokers = broker.wipe(t)
	produceWithBadAt(brokers, "new", 4, 2)
	second := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	waitFor(t, 20*time.Second, "the new log stored", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) == 5+3 })
	waitFor(t, 10*time.Second, "the new log's dead letter", func() bool { return deadLetters() == 2 })
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	got := storedRows(t, pool, `SELECT kafka_offset || '/' || generation, convert_from(raw_payload, 'UTF8') FROM dead_letter_events`)
	if want := []string{"2/0 not JSON of old", "2/1 not JSON of new"}; !slices.Equal(got, want) {
		t.Errorf("dead letters (offset/generation payload) %q, want %q", got, want)
	}
	var gen int32
	if err := pool.QueryRow(context.Background(), `SELECT generation FROM consumer_offsets WHERE consumer_group = $1 AND topic = $2 AND "partition" = 0`, group, topicReviews).Scan(&gen); err != nil || gen != 1 {
		t.Errorf("generation of reviews/0: %d (%v), want 1", gen, err)
	}
}

// A member handed only partitions the group never committed to this broker
// (cooperative-sticky adds partitions one assignment at a time) is not
// facing a wiped broker when other partitions of the topic are committed:
// the Kafka commit of a stored batch was lost (a kill between the database
// commit and Kafka's) or expired. With the log end at or beyond the stored
// offset, the partition resumes at its stored offset: nothing stored is
// read again, no reset is counted, the stored offsets stay. A topic of
// which the broker has no commit at all still starts at the log start.
func TestConsumerTrustsTheStoredOffsetOfAPartitionWithoutItsKafkaCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTestPool(t)
	_, brokers := newTestBroker(t, t.TempDir())
	const pkg = "org.telegram.messenger"
	group := testConsumerOptions().Group
	registerApps(t, pool, pkg)
	// The log as stored before the kill: 30 reviews per partition, all
	// stored, Kafka commits for partitions 1 and 2 only; 5 reviews of
	// app-stats' partition 0 stored, none of app-stats committed.
	produceReviewsTo(t, brokers, pkg, "stored", []int32{0, 1, 2}, 90)
	var stats []*kgo.Record
	for i := range 5 {
		stats = append(stats, &kgo.Record{Topic: topicAppStats, Key: []byte(pkg), Partition: 0,
			Value: msgJSON(statFields(pkg, testCrawl.Add(time.Duration(i)*time.Second)))})
	}
	produceToPartitions(t, brokers, stats...)
	if _, err := pool.Exec(ctx, `INSERT INTO consumer_offsets (consumer_group, topic, "partition", next_offset)
		VALUES ($1, $2, 0, 30), ($1, $2, 1, 30), ($1, $2, 2, 30), ($1, $3, 0, 5)`, group, topicReviews, topicAppStats); err != nil {
		t.Fatal(err)
	}
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		var offs kadm.Offsets
		offs.Add(kadm.Offset{Topic: topicReviews, Partition: 1, At: 30, LeaderEpoch: -1})
		offs.Add(kadm.Offset{Topic: topicReviews, Partition: 2, At: 30, LeaderEpoch: -1})
		if err := adm.CommitAllOffsets(ctx, group, offs); err != nil {
			t.Fatal(err)
		}
	})

	// The assignment that adds reviews/0 alone, as the client hands it to
	// AdjustFetchOffsetsFn: no commit, so the reset offset (the log start).
	sc := newStorageConsumer(pool, testConsumerOptions(), prometheus.NewRegistry(), testLogger(t))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sc.admin = kadm.NewClient(cl)
	close(sc.adminSet)
	for _, c := range []struct {
		topic string
		want  kgo.EpochOffset
	}{
		{topicReviews, kgo.EpochOffset{Epoch: -1, Offset: 30}},
		{topicAppStats, kgo.NewOffset().AtStart().EpochOffset()},
	} {
		got, err := sc.resumeFromDatabase(ctx, map[string]map[int32]kgo.Offset{c.topic: {0: kgo.NewOffset().AtStart()}})
		if err != nil {
			t.Fatal(err)
		}
		if o := got[c.topic][0].EpochOffset(); o != c.want {
			t.Errorf("%s/0 starts at %+v, want %+v", c.topic, o, c.want)
		}
	}

	// The whole consumer: reviews/0 goes on from its stored offset, and only
	// the new reviews are stored.
	tc := startTestConsumer(t, pool, brokers, testConsumerOptions(), consumerHooks{})
	produceReviewsTo(t, brokers, pkg, "new", []int32{0}, 10)
	waitFor(t, 20*time.Second, "the 10 new reviews", func() bool { return count(t, pool, `SELECT count(*) FROM reviews`) >= 10 })
	waitFor(t, 10*time.Second, "the Kafka commits", func() bool { return kafkaCommitted(t, brokers, group) >= 40+30+30 })
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews`); n != 10 {
		t.Errorf("%d reviews stored, want the 10 new ones: the stored ones were read again", n)
	}
	if got, want := storedOffsetsOf(t, sc.store, topicReviews), map[int32]int64{0: 40, 1: 30, 2: 30}; !maps.Equal(got, want) {
		t.Errorf("stored offsets %v, want %v", got, want)
	}
	for p := range 3 {
		if got := metricValue(t, tc.reg, "playwatch_consumer_offset_resets_total", map[string]string{"topic": topicReviews, "partition": strconv.Itoa(p)}); got != 0 {
			t.Errorf("offset resets of reviews/%d = %v, want 0", p, got)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM consumer_offsets WHERE generation <> 0 AND topic = 'reviews'`); n != 0 {
		t.Errorf("%d partitions' log generation counted up", n)
	}
}
