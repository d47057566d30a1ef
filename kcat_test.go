package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// kcatContract is every field of each topic's message contract (docs/design.md)
// with its JSON kind; "time" is an RFC 3339 string with a zone, "counts" an
// array of five numbers.
var kcatContract = map[string]map[string]string{
	topicAppStats: {"package_name": "string", "title": "string", "genre": "string", "min_installs": "number", "score": "number",
		"ratings": "number", "reviews_count": "number", "version": "string", "ad_supported": "bool", "app_updated_at": "time",
		"crawled_at": "time", "real_installs": "number", "histogram": "counts", "developer": "string", "released_at": "time",
		"recent_changes": "string", "country": "string", "lang": "string"},
	topicReviews: {"package_name": "string", "review_id": "string", "user_name": "string", "thumbs_up_count": "number",
		"score": "number", "content": "string", "at": "time", "crawled_at": "time", "reply_content": "string",
		"replied_at": "time", "app_version": "string", "country": "string", "lang": "string"},
	topicNetworkMetrics: {"analysis_id": "string", "package_name": "string", "scenario": "string", "rtt_handshake": "number",
		"retransmission_count": "number", "out_of_order_count": "number", "spurious_retransmission_count": "number",
		"zero_window_count": "number", "tcp_reset_count": "number", "bytes_transferred_total": "number",
		"bytes_payload_total": "number", "overhead_ratio": "number", "source_pcap_filename": "string", "analyzed_at": "time"},
}

// The messages playwatch writes are readable by clients other than
// franz-go: kcat (librdkafka) reads every topic (raw-pages too) from the embedded broker
// (franz-go's record batches, snappy-compressed where that saves space) and
// finds every field of the contract in the JSON, of its kind, with the
// package name as the key. A nullable field may be null in a message (a
// review without a reply), but each field has a value in some message.
func TestKcatReadsPlaywatchTopics(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kcat is required under CI=true (.ci/run installs Debian's kcat)")
		}
		t.Skip("kcat is not on PATH (Debian: apt-get install kcat): the librdkafka interop check needs it")
	}
	t.Parallel()
	// One Iranian app: a Persian title and reviews with emoji put
	// multi-byte text through librdkafka and kcat's JSON envelope.
	const pkg = "ir.divar"
	replay := newReplayPlayStore(t)
	replay.setApp(pkg, replayApp{Title: "دیوار", Reviews: 5, Persian: true})
	dbURL := newTestDatabase(t)
	if _, err := newAppStore(newTestPoolFor(t, dbURL)).Create(context.Background(), newApp{PackageName: pkg, IsIranianApp: true}); err != nil {
		t.Fatal(err)
	}
	_, brokers := newTestBroker(t, t.TempDir())
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir(),
		"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "5", "LOG_LEVEL": "warn"}
	for _, args := range [][]string{
		{"crawl", "--once"},
		{"pcap", "--app", pkg, "--scenario", "UPLOAD", "testdata/pcap/clean_upload.pcap"},
	} {
		var errOut bytes.Buffer
		if err := run(context.Background(), args, envFunc(env), &bytes.Buffer{}, &errOut); err != nil {
			t.Fatalf("playwatch %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
	}

	published := map[string][]json.RawMessage{} // what franz-go reads, for comparison
	for topic, n := range map[string]int{topicAppStats: 1, topicReviews: 5, topicNetworkMetrics: 1} {
		for _, r := range consumeAll(t, brokers, topic, n) {
			published[topic] = append(published[topic], r.Value)
		}
	}
	for topic, fields := range kcatContract {
		valued := map[string]bool{}
		msgs := kcatConsume(t, kcat, brokers[0], topic)
		if len(msgs) != len(published[topic]) {
			t.Fatalf("kcat read %d messages from %s, franz-go %d", len(msgs), topic, len(published[topic]))
		}
		for i, m := range msgs {
			if m.Topic != topic || m.Key == nil || *m.Key != pkg || m.TSType != "create" || time.Since(time.UnixMilli(m.TS)) > time.Minute {
				t.Errorf("%s message %d: topic %s, key %v, timestamp %s %d", topic, i, m.Topic, m.Key, m.TSType, m.TS)
			}
			var payload map[string]any
			if err := json.Unmarshal([]byte(m.Payload), &payload); err != nil {
				t.Fatalf("%s message %d is not JSON: %v\n%s", topic, i, err, m.Payload)
			}
			if got, want := slices.Sorted(maps.Keys(payload)), slices.Sorted(maps.Keys(fields)); !slices.Equal(got, want) {
				t.Errorf("%s message %d has the fields\n%v, the contract\n%v", topic, i, got, want)
			}
			for name, kind := range fields {
				if payload[name] == nil {
					continue
				}
				valued[name] = true
				if !jsonKindIs(payload[name], kind) {
					t.Errorf("%s message %d: %s = %#v, want a %s", topic, i, name, payload[name], kind)
				}
			}
			if payload["package_name"] != pkg {
				t.Errorf("%s message %d: package_name %v, key %s", topic, i, payload["package_name"], pkg)
			}
			if !slices.ContainsFunc(published[topic], func(v json.RawMessage) bool { return string(v) == m.Payload }) {
				t.Errorf("%s message %d as kcat read it is not a message franz-go reads:\n%s", topic, i, m.Payload)
			}
		}
		for name := range fields {
			if !valued[name] {
				t.Errorf("%s: %s is null in every message", topic, name)
			}
		}
		if topic == topicReviews && !strings.Contains(msgs[0].Payload, "👍🏽🇮🇷") {
			t.Errorf("the Persian review text did not survive: %s", msgs[0].Payload)
		}
	}
	// The crawl archived its two answers (the listing, one reviews page).
	checkKcatReadsRawPages(t, kcat, brokers[0], brokers, pkg, 2)
}

// kcatMessage is one line of `kcat -J`.
type kcatMessage struct {
	Topic   string  `json:"topic"`
	Key     *string `json:"key"`
	Payload string  `json:"payload"`
	TSType  string  `json:"tstype"`
	TS      int64   `json:"ts"`
}

// kcatConsume reads topic from the beginning to its end with kcat.
func kcatConsume(t *testing.T, kcat, broker, topic string) []kcatMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, kcat, "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-J", "-q")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat -C -t %s: %v\n%s", topic, err, stderr.String())
	}
	var msgs []kcatMessage
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		var m kcatMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("kcat printed %q: %v", line, err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// jsonKindIs says whether v, decoded by encoding/json, is of kind.
func jsonKindIs(v any, kind string) bool {
	switch kind {
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "bool":
		_, ok := v.(bool)
		return ok
	case "counts":
		a, ok := v.([]any)
		return ok && len(a) == 5 && !slices.ContainsFunc(a, func(n any) bool { return !jsonKindIs(n, "number") })
	case "time":
		s, ok := v.(string)
		if !ok {
			return false
		}
		_, err := time.Parse(time.RFC3339Nano, s)
		return err == nil
	}
	return false
}
