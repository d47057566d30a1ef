package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Helpers shared by the tests of several files: waiting, counting rows,
// producing and reading records, metrics, messages, free ports, HTTP
// answers, JSON.

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// mustExec runs sql with args on pool.
func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// eachRow runs sql with args and calls fn after it scanned each row into
// dest.
func eachRow(t testing.TB, pool *pgxpool.Pool, dest []any, fn func(), sql string, args ...any) {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if _, err := pgx.ForEachRow(rows, dest, func() error { fn(); return nil }); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// untilEOF yields what next returns until it returns io.EOF; another error
// fails the test. For readers of parts: multipart.Reader.NextPart,
// tar.Reader.Next.
func untilEOF[T any](t testing.TB, next func() (T, error)) iter.Seq[T] {
	return func(yield func(T) bool) {
		for {
			v, err := next()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !yield(v) {
				return
			}
		}
	}
}

// produce writes records synchronously; values up to 4 MiB are accepted.
func produce(t testing.TB, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerBatchMaxBytes(4<<20), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func registerApps(t testing.TB, pool *pgxpool.Pool, pkgs ...string) {
	t.Helper()
	for _, p := range pkgs {
		mustExec(t, pool, `INSERT INTO apps_registry_application (package_name) VALUES ($1)`, p)
	}
}

// Message builders: a map is marshalled, so tests can also break the types.
func msgJSON(fields map[string]any) []byte {
	b, err := json.Marshal(fields)
	if err != nil {
		panic(err)
	}
	return b
}

func rec(topic, key string, value []byte) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: value}
}

func with(m map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == deleteField {
			delete(out, kv[i].(string))
			continue
		}
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// metricValue returns the value of a counter or gauge with the given labels, or
// the sample count of a histogram; 0 when it has no such sample yet.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	if m := gatheredMetric(t, reg, name, labels); m != nil {
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	// No sample: 0 for a metric that exists (a vector nobody used yet), but a
	// metric that was never registered is a broken test, not a zero.
	descs := make(chan *prometheus.Desc)
	go func() { reg.Describe(descs); close(descs) }()
	registered := false
	for d := range descs {
		registered = registered || strings.Contains(d.String(), `fqName: "`+name+`"`)
	}
	if !registered {
		t.Fatalf("no metric %s is registered", name)
	}
	return 0
}

// gatheredMetric is the first sample of reg's metric name that has the given
// labels, or nil.
func gatheredMetric(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if metricHasLabels(m, labels) {
				return m
			}
		}
	}
	return nil
}

func metricHasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// metricsText returns the body of /metrics.
func metricsText(t testing.TB, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	code, body, _ := readAnswer(t, resp, err)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	return body
}

// scrapeMetrics reads /metrics into sample → value, the sample written as
// Prometheus prints it: name{label="value",...}, labels in name order.
func scrapeMetrics(t testing.TB, base string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for line := range strings.Lines(metricsText(t, base)) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64)
		if i < 0 || err != nil {
			t.Fatalf("/metrics line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// scrapeMetric reads the sample name{labels} from base's /metrics; labels
// are written as Prometheus prints them (sorted: `outcome="ok",path="stats"`).
// A missing sample is 0.
func scrapeMetric(t testing.TB, base, name, labels string) float64 {
	t.Helper()
	if labels != "" {
		name += "{" + labels + "}"
	}
	return scrapeMetrics(t, base)[name]
}

// withAdmin runs fn with an admin client of brokers and a 30 s context; the
// client is closed when fn returns.
func withAdmin(t testing.TB, brokers []string, fn func(context.Context, *kadm.Client)) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fn(ctx, kadm.NewClient(cl))
}

// endOffsets sums the end offsets of topics: every record the brokers acknowledged.
func endOffsets(t testing.TB, brokers []string, topics ...string) int64 {
	t.Helper()
	var ends kadm.ListedOffsets
	var err error
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) { ends, err = adm.ListEndOffsets(ctx, topics...) })
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	var sum int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		sum += o.Offset
	})
	return sum
}

// consumeAll reads every record of topic from the start until n arrived.
func consumeAll(t testing.TB, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	return consumeAllWith(t, []kgo.Opt{kgo.SeedBrokers(brokers...)}, topic, n)
}

// consumeAllWith is consumeAll with a client of opts (seed brokers, TLS, SASL).
func consumeAllWith(t testing.TB, opts []kgo.Opt, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(out), n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// freeAddr is a free loopback address for a server the test starts later.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := freeLoopbackPort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// firstEphemeralPort is the first port of the kernel's range for port 0
// and outgoing connections.
var firstEphemeralPort = sync.OnceValue(func() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768 // Linux's default
})

// givenPorts are the ports freeLoopbackPort handed out in this test binary.
var givenPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// freeLoopbackPort is a free loopback port, never the same twice in a test
// binary, from below the kernel's ephemeral range: a port the kernel picks
// for a listen on port 0 comes from the range its outgoing connections take
// their local ports from, so between the pick and the server's bind a
// connection of a parallel test could take it ("address already in use");
// below the range only another process picking the same port at random can.
func freeLoopbackPort() (int, error) {
	const lowest = 10000
	high := firstEphemeralPort()
	givenPorts.Lock()
	defer givenPorts.Unlock()
	for range 1000 {
		port := 0 // the kernel's pick, where the range leaves no room below it
		if high-lowest >= 1000 {
			port = lowest + rand.IntN(high-lowest)
		}
		if givenPorts.m[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		givenPorts.m[port] = true
		return port, nil
	}
	return 0, errors.New("no free loopback port in 1000 tries")
}

func envFunc(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// httpDo sends body to url with method and is the status and whole body of
// the answer.
func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	code, b, _ := readAnswer(t, resp, err)
	return code, b
}

// readAnswer is the status, whole body and header of the answer to a
// request that had to be sent (err is the client's).
func readAnswer(t testing.TB, resp *http.Response, err error) (int, string, http.Header) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// tempDataDir is a temp dir the postgres OS user can enter when tests run
// as root.
func tempDataDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pwpg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func jsonUnmarshalStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// jsonRoundTrip is v marshalled to JSON and read back as a T.
func jsonRoundTrip[T any](t testing.TB, v any) T {
	t.Helper()
	b, err := json.Marshal(v)
	return decodedJSON[T](t, fmt.Sprintf("%T as JSON", v), b, err)
}

// readJSONFile is the JSON file at path read as a T.
func readJSONFile[T any](t testing.TB, path string) T {
	t.Helper()
	b, err := os.ReadFile(path)
	return decodedJSON[T](t, path, b, err)
}

// decodedJSON is b, the JSON named name, decoded as a T; err, the error of
// producing b, fails the test first.
func decodedJSON[T any](t testing.TB, name string, b []byte, err error) T {
	t.Helper()
	var v T
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// checkStringFunc checks that f, called name in the errors, maps each
// key of cases to its value.
func checkStringFunc(t *testing.T, name string, f func(string) string, cases map[string]string) {
	t.Helper()
	for in, want := range cases {
		if got := f(in); got != want {
			t.Errorf("%s(%q) = %q, want %q", name, in, got, want)
		}
	}
}

// fixedRandom is a "random" source that always answers v.
func fixedRandom(v float64) func() float64 { return func() float64 { return v } }

// skipOrFailUnderCI skips a test that lacks a tool or a resource of the
// host, except under CI=true: .ci/run provides everything the tests use, so
// there the same lack is a failure, not a test that silently did not run.
func skipOrFailUnderCI(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+" (required under CI=true)", args...)
	}
	t.Skipf(format, args...)
}

// firstOnPath is the path of the first of names found on PATH, or "".
func firstOnPath(names ...string) string {
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// storedRows lists a query's rows as "a b c" strings, sorted.
func storedRows(t *testing.T, pool *pgxpool.Pool, sql string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		vals, err := r.Values()
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = fmt.Sprint(v)
		}
		return strings.Join(parts, " "), err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}
