package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// poisonRecord is a record that breaks its contract, and the reason code
// its dead letter must carry.
type poisonRecord struct {
	name  string
	topic string
	value []byte
	code  reasonCode
}

func poisonCorpus() []poisonRecord {
	const pkg = "org.telegram.messenger"
	review := reviewFields(pkg, "poison", testCrawl)
	stat := statFields(pkg, testCrawl)
	metric := networkFields(pkg, "0b7e4c1a-2d3f-4a5b-8c6d-7e8f9a0b1c2d")
	future := time.Now().Add(48 * time.Hour).Format(time.RFC3339)
	long := func(n int) string { return strings.Repeat("é", n) }
	r := func(name string, code reasonCode, kv ...any) poisonRecord {
		return poisonRecord{name, topicReviews, msgJSON(with(review, kv...)), code}
	}
	s := func(name string, code reasonCode, kv ...any) poisonRecord {
		return poisonRecord{name, topicAppStats, msgJSON(with(stat, kv...)), code}
	}
	m := func(name string, code reasonCode, kv ...any) poisonRecord {
		return poisonRecord{name, topicNetworkMetrics, msgJSON(with(metric, kv...)), code}
	}
	huge := append(append([]byte(`{"package_name":"org.telegram.messenger","content":"`), bytes.Repeat([]byte("a"), 1<<20)...), `"}`...)
	return []poisonRecord{
		{"truncated JSON", topicReviews, []byte(`{"package_name": "org.telegram.messenger", "review_id": `), reasonInvalidJSON},
		{"JSON array", topicReviews, []byte(`[1, 2, 3]`), reasonInvalidJSON},
		{"JSON null", topicAppStats, []byte(`null`), reasonInvalidJSON},
		{"JSON string", topicNetworkMetrics, []byte(`"hello"`), reasonInvalidJSON},
		{"garbage after the object", topicReviews, append(msgJSON(review), " trailing"...), reasonInvalidJSON},
		{"invalid UTF-8", topicReviews, bytes.Replace(msgJSON(with(review, "content", "MARK")), []byte("MARK"), []byte{0xff, 0xfe}, 1), reasonInvalidUTF8},
		{"empty value", topicReviews, []byte{}, reasonEmpty},
		{"tombstone", topicAppStats, nil, reasonTombstone},
		{"value over 1 MiB", topicReviews, huge, reasonTooLarge},
		r("missing package_name", reasonMissing, "package_name", deleteField),
		r("missing review_id", reasonMissing, "review_id", deleteField),
		r("null review_id", reasonMissing, "review_id", nil),
		r("missing at", reasonMissing, "at", deleteField),
		r("missing crawled_at", reasonMissing, "crawled_at", deleteField),
		r("score 6", reasonOutOfRange, "score", 6),
		r("score 0", reasonOutOfRange, "score", 0),
		r("score as a string", reasonWrongType, "score", "5"),
		r("score 4.5", reasonWrongType, "score", 4.5),
		r("negative thumbs up", reasonOutOfRange, "thumbs_up_count", -1),
		r("thumbs up over int32", reasonOutOfRange, "thumbs_up_count", int64(1)<<31),
		r("thumbs up as a string", reasonWrongType, "thumbs_up_count", "many"),
		r("review_id as a number", reasonWrongType, "review_id", 12345),
		r("at is prose", reasonBadTimestamp, "at", "yesterday"),
		r("crawled_at without a zone", reasonBadTimestamp, "crawled_at", "2026-03-01T12:00:00"),
		r("at as a number", reasonWrongType, "at", 1767225600),
		r("a 10 KB timestamp", reasonBadTimestamp, "at", strings.Repeat("9", 10000)),
		r("crawled_at in the future", reasonOutOfRange, "crawled_at", future),
		r("at before 2000", reasonOutOfRange, "at", "1970-01-01T00:00:00Z"),
		r("NUL in content", reasonNUL, "content", "bad\x00byte"),
		r("user_name over 255 characters", reasonTooLong, "user_name", long(256)),
		r("review_id over 255 characters", reasonTooLong, "review_id", long(300)),
		r("unregistered package", reasonUnregistered, "package_name", "com.example.unknown"),
		r("malformed package name", reasonBadValue, "package_name", "not a package"),
		r("NUL in reply_content", reasonNUL, "reply_content", "thanks\x00"),
		r("reply_content as a number", reasonWrongType, "reply_content", 1),
		r("replied_at in the future", reasonOutOfRange, "replied_at", future),
		r("replied_at without a zone", reasonBadTimestamp, "replied_at", "2026-03-01T12:00:00"),
		r("app_version over 50 characters", reasonTooLong, "app_version", long(51)),
		r("country without lang", reasonMissing, "country", "ir"),
		r("lang not a code", reasonBadValue, "country", "ir", "lang", "f a"),
		r("country as a number", reasonWrongType, "country", 98, "lang", "fa"),
		s("stat without crawled_at", reasonMissing, "crawled_at", deleteField),
		s("version over 50 characters", reasonTooLong, "version", long(51)),
		s("negative min_installs", reasonOutOfRange, "min_installs", -5),
		s("store score 7.5", reasonOutOfRange, "score", 7.5),
		s("ad_supported as a string", reasonWrongType, "ad_supported", "yes"),
		s("genre over 100 characters", reasonTooLong, "genre", long(101)),
		s("NUL in title", reasonNUL, "title", "Tele\x00gram"),
		s("stat of an unregistered package", reasonUnregistered, "package_name", "com.example.unknown"),
		s("negative real_installs", reasonOutOfRange, "real_installs", -1),
		s("histogram of four counts", reasonBadValue, "histogram", []int{1, 2, 3, 4}),
		s("histogram of six counts", reasonBadValue, "histogram", []int{1, 2, 3, 4, 5, 6}),
		s("empty histogram", reasonBadValue, "histogram", []int{}),
		s("negative count in the histogram", reasonOutOfRange, "histogram", []int{1, 2, -3, 4, 5}),
		s("fractional count in the histogram", reasonWrongType, "histogram", []any{1, 2, 3.5, 4, 5}),
		s("histogram as an object", reasonWrongType, "histogram", map[string]int{"1": 5}),
		s("developer over 255 characters", reasonTooLong, "developer", long(256)),
		s("released_at before 2000", reasonOutOfRange, "released_at", "1999-12-31T23:59:59Z"),
		s("released_at in year 1", reasonOutOfRange, "released_at", "0001-01-01T00:00:00Z"),
		s("app_updated_at in year 1", reasonOutOfRange, "app_updated_at", "0001-01-01T00:00:00Z"),
		s("null count in the histogram", reasonWrongType, "histogram", []any{1, nil, 3, 4, 5}),
		s("NUL in recent_changes", reasonNUL, "recent_changes", "fixes\x00"),
		s("lang without country", reasonMissing, "lang", "en"),
		s("country not a code", reasonBadValue, "country", "iran!", "lang", "fa"),
		m("analysis_id not a UUID", reasonBadValue, "analysis_id", "not-a-uuid"),
		m("missing analysis_id", reasonMissing, "analysis_id", deleteField),
		m("unknown scenario", reasonBadValue, "scenario", "SIDEWAYS"),
		m("lower-case scenario", reasonBadValue, "scenario", "upload"),
		m("missing analyzed_at", reasonMissing, "analyzed_at", deleteField),
		m("retransmissions over int32", reasonOutOfRange, "retransmission_count", int64(3)<<31),
		m("null overhead_ratio", reasonMissing, "overhead_ratio", nil),
		m("negative bytes", reasonOutOfRange, "bytes_transferred_total", -1),
		m("source_pcap_filename over 255", reasonTooLong, "source_pcap_filename", long(256)+".pcap"),
	}
}

// Every record that breaks its contract becomes a dead letter with its
// reason and its bytes; every good record around it is stored; the
// consumer goes on after all of them.
func TestConsumerPoisonCorpus(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	brokers := newConsumerTestBroker(t)
	allowLargeRecords(t, brokers)
	const pkg = "org.telegram.messenger"
	registerApps(t, pool, pkg)

	corpus := poisonCorpus()
	if len(corpus) < 30 {
		t.Fatalf("the corpus has %d kinds of bad record, want at least 30", len(corpus))
	}
	var recs []*kgo.Record
	want := map[*kgo.Record]poisonRecord{}
	goodReviews, goodStats, goodMetrics := 0, 0, 0
	for i, p := range corpus {
		bad := &kgo.Record{Topic: p.topic, Key: []byte(fmt.Sprintf("key-%d", i)), Value: p.value}
		if i == 1 {
			bad.Key = []byte{0xff, 0x00, 'k'} // not text: stored hex-encoded
		}
		want[bad] = p
		recs = append(recs, bad)
		// A good record of each topic between the bad ones.
		switch i % 3 {
		case 0:
			f := with(reviewFields(pkg, fmt.Sprintf("good-%d", i), testCrawl), "score", nil, "user_name", nil,
				"content", "نرم‌افزار خوبی است 👍", "field_from_the_future", map[string]any{"x": 1})
			recs = append(recs, rec(topicReviews, pkg, msgJSON(f)))
			goodReviews++
		case 1:
			recs = append(recs, rec(topicAppStats, pkg, msgJSON(statFields(pkg, testCrawl.Add(time.Duration(i)*time.Hour)))))
			goodStats++
		case 2:
			id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			recs = append(recs, rec(topicNetworkMetrics, pkg, msgJSON(with(networkFields(pkg, id), "rtt_handshake", nil))))
			goodMetrics++
		}
	}
	// Limits count characters, not bytes: 255 two-byte characters fit.
	recs = append(recs, rec(topicReviews, pkg, msgJSON(with(reviewFields(pkg, "long-name", testCrawl), "user_name", strings.Repeat("é", 255)))))
	goodReviews++
	produce(t, brokers, recs...)

	opts := testConsumerOptions()
	opts.MaxPollRecords = 7 // many batches, each mixing good and bad records
	opts.Writers = 2        // and each split between two transactions
	tc := startTestConsumer(t, pool, brokers, opts, consumerHooks{})
	waitFor(t, 30*time.Second, "all records stored or dead-lettered", func() bool {
		return count(t, pool, `SELECT (SELECT count(*) FROM app_stats) + (SELECT count(*) FROM reviews) +
			(SELECT count(*) FROM network_metrics) + (SELECT count(*) FROM dead_letter_events)`) == len(recs)
	})

	rows, err := pool.Query(context.Background(), `SELECT topic, "partition", kafka_offset, kafka_key, raw_payload, error_reason FROM dead_letter_events`)
	if err != nil {
		t.Fatal(err)
	}
	type dlq struct {
		key     *string
		payload []byte
		reason  string
	}
	got := map[string]dlq{}
	for rows.Next() {
		var topic string
		var part int32
		var off int64
		var d dlq
		if err := rows.Scan(&topic, &part, &off, &d.key, &d.payload, &d.reason); err != nil {
			t.Fatal(err)
		}
		got[fmt.Sprintf("%s/%d/%d", topic, part, off)] = d
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for r, p := range want {
		d, ok := got[fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)]
		if !ok {
			t.Errorf("%s: no dead letter", p.name)
			continue
		}
		if !strings.HasPrefix(d.reason, string(p.code)+": ") {
			t.Errorf("%s: reason %q, want code %s", p.name, truncate(d.reason, 200), p.code)
		}
		if !bytes.Equal(d.payload, p.value) || (d.payload == nil) != (p.value == nil) {
			t.Errorf("%s: raw payload differs from the record's value", p.name)
		}
		wantKey := string(r.Key)
		if !utf8.Valid(r.Key) {
			wantKey = `\xff006b`
		}
		if d.key == nil || *d.key != wantKey {
			t.Errorf("%s: key %v, want %q", p.name, d.key, r.Key)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d dead letters, want %d", len(got), len(want))
	}
	for table, n := range map[string]int{"reviews": goodReviews, "app_stats": goodStats, "network_metrics": goodMetrics} {
		if c := count(t, pool, "SELECT count(*) FROM "+table); c != n {
			t.Errorf("%s has %d rows, want %d", table, c, n)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews WHERE content = 'نرم‌افزار خوبی است 👍' AND score IS NULL AND user_name IS NULL`); n != goodReviews-1 {
		t.Errorf("%d reviews kept their text and NULLs, want %d", n, goodReviews-1)
	}

	// The dead-letter metric counts each reason code.
	byCode := map[reasonCode]int{}
	for _, p := range corpus {
		byCode[p.code]++
	}
	for code, n := range byCode {
		if v := metricValue(t, tc.reg, "playwatch_consumer_dead_letters_total", map[string]string{"reason": string(code)}); v != float64(n) {
			t.Errorf("dead letters metric for %s = %v, want %d", code, v, n)
		}
	}

	// The partitions moved on: a good record after the poison is stored.
	produce(t, brokers, rec(topicReviews, pkg, msgJSON(reviewFields(pkg, "after-the-poison", testCrawl))))
	waitFor(t, 20*time.Second, "the record after the poison", func() bool {
		return count(t, pool, `SELECT count(*) FROM reviews WHERE review_id = 'after-the-poison'`) == 1
	})
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
}

// Validation without a broker: the reason's detail says what to fix.
func TestValidationReasonsNameTheField(t *testing.T) {
	now := time.Now()
	for _, p := range poisonCorpus() {
		b := decodeRecords([]*kgo.Record{{Topic: p.topic, Value: p.value}}, 1<<20, now)
		if p.code == reasonUnregistered {
			if len(b.dead) != 0 {
				t.Errorf("%s: dead before the registry lookup: %s", p.name, b.dead[0].reason)
			}
			continue
		}
		if len(b.dead) != 1 || b.dead[0].code != p.code {
			t.Errorf("%s: got %+v, want one dead letter with code %s", p.name, b.dead, p.code)
			continue
		}
		if strings.ContainsRune(b.dead[0].reason, 0) || len(b.dead[0].reason) > 1000 {
			t.Errorf("%s: reason unfit for a TEXT column: %q", p.name, truncate(b.dead[0].reason, 100))
		}
	}
	b := decodeRecords([]*kgo.Record{{Topic: topicReviews, Value: msgJSON(with(reviewFields("a.b", "r", testCrawl), "score", 9, "thumbs_up_count", -2))}}, 1<<20, now)
	if r := b.dead[0].reason; !strings.Contains(r, "score is 9") || !strings.Contains(r, "thumbs_up_count is -2") {
		t.Errorf("reason %q does not name both bad fields", r)
	}
}

// panickingRows is a contract's rows whose checks panic on every record.
type panickingRows struct{ topicRows }

func (panickingRows) add(*kgo.Record, time.Time) *invalidRecord { panic("a record no check foresaw") }

type panickingContract struct{ topicContract }

func (panickingContract) topicName() string  { return "panics" }
func (panickingContract) newRows() topicRows { return panickingRows{} }

// A record whose checks panic is that record's dead letter, with the
// panic's site; the records beside it are decoded as usual.
func TestDecodeRecordsPanicIsADeadLetter(t *testing.T) {
	saved := contracts
	contracts = append(slices.Clip(contracts), panickingContract{})
	defer func() { contracts = saved }()
	good := rec(topicNetworkMetrics, "x", []byte(`{}`))
	b := decodeRecords([]*kgo.Record{rec("panics", "k", []byte(`{"a":1}`)), good}, 1<<20, time.Now())
	if len(b.dead) != 2 {
		t.Fatalf("%d dead letters, want 2 (the panic, and the empty network-metrics message)", len(b.dead))
	}
	if d := b.dead[0]; d.code != reasonPanic || !strings.Contains(d.reason, "a record no check foresaw") || !strings.Contains(d.reason, "consumer_poison_test.go") {
		t.Errorf("dead letter %s %q, want %s naming the panic and its site", d.code, d.reason, reasonPanic)
	}
	if b.dead[1].code == reasonPanic {
		t.Errorf("the record beside it: %s", b.dead[1].reason)
	}
}
