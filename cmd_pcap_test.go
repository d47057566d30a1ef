package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// checkAgainstGolden compares the metrics of a message with tshark's values
// kept beside the capture testdata/pcap/<name>.pcap.
func checkAgainstGolden(t *testing.T, m networkMetricsMessage, name string) {
	t.Helper()
	assertMetricsEqual(t, m, loadGolden(t, filepath.Join("testdata", "pcap", name+".pcap")))
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// --dry-run prints one message per file, metrics at top level, and needs
// neither the database nor a broker.
func TestPcapCommandDryRun(t *testing.T) {
	var out, errOut bytes.Buffer
	env := map[string]string{"PLAYWATCH_DATA_DIR": "/nonexistent/never/used", "DATABASE_URL": "postgres://nobody@127.0.0.1:1/x"}
	files := []string{"testdata/pcap/clean_upload.pcap", "testdata/pcap/midstream.pcap", "testdata/pcap/sll2_any.pcap"}
	err := run(context.Background(), append([]string{"pcap", "--app", "org.telegram.messenger", "--scenario", "UPLOAD", "--dry-run"}, files...),
		envFunc(env), &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(files) {
		t.Fatalf("%d lines for %d files:\n%s", len(lines), len(files), out.String())
	}
	ids := map[string]bool{}
	for i, line := range lines {
		var raw map[string]any
		if err := json.Unmarshal([]byte(line), &raw); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"analysis_id", "package_name", "scenario", "rtt_handshake", "retransmission_count", "out_of_order_count",
			"spurious_retransmission_count", "zero_window_count", "tcp_reset_count", "bytes_transferred_total",
			"bytes_payload_total", "overhead_ratio", "source_pcap_filename", "analyzed_at"} {
			if _, ok := raw[k]; !ok {
				t.Errorf("line %d lacks %s", i, k)
			}
		}
		var m networkMetricsMessage
		if err := jsonUnmarshalStrict([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(files[i]), ".pcap")
		checkAgainstGolden(t, m, name)
		if m.PackageName != "org.telegram.messenger" || m.Scenario != "UPLOAD" || m.SourcePcapFilename != filepath.Base(files[i]) ||
			!uuidPattern.MatchString(m.AnalysisID) || ids[m.AnalysisID] || m.AnalyzedAt.IsZero() {
			t.Errorf("line %d: %+v", i, m)
		}
		ids[m.AnalysisID] = true
	}
	if !strings.Contains(lines[1], `"rtt_handshake":null`) {
		t.Errorf("a capture without handshake must give rtt_handshake null: %s", lines[1])
	}
}

func TestPcapCommandBadInput(t *testing.T) {
	var uerr usageError
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pcap")
	garbage := filepath.Join(dir, "garbage.pcap")
	os.WriteFile(empty, nil, 0o644)
	os.WriteFile(garbage, []byte("this is not a capture file at all"), 0o644)
	for _, args := range [][]string{
		{"pcap", "--scenario", "UPLOAD", "--dry-run", "x.pcap"},
		{"pcap", "--app", "telegram", "--scenario", "UPLOAD", "--dry-run", "x.pcap"},
		{"pcap", "--app", "org.telegram.messenger", "--scenario", "sideways", "--dry-run", "x.pcap"},
		{"pcap", "--app", "org.telegram.messenger", "--scenario", "UPLOAD", "--dry-run"},
	} {
		if err := run(context.Background(), args, envFunc(nil), io.Discard, io.Discard); !errors.As(err, &uerr) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"pcap", "--app", "org.telegram.messenger", "--scenario", "DOWNLOAD", "--dry-run",
		filepath.Join(dir, "missing.pcap"), garbage, "testdata/pcap/resets.pcap", empty, dir}, envFunc(nil), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "4 of 5 captures failed") {
		t.Fatalf("err = %v", err)
	}
	if n := strings.Count(strings.TrimSpace(out.String()), "\n") + 1; n != 1 {
		t.Errorf("%d messages printed, want the one good file's", n)
	}
	for _, want := range []string{"missing.pcap", "garbage.pcap", "empty.pcap: file header (offset 0): not a pcap or pcapng file: file is empty", dir + ": is a directory, not a capture file"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut.String())
		}
	}
	for _, f := range []string{filepath.Join(dir, "missing.pcap"), garbage, empty} {
		for line := range strings.Lines(errOut.String()) {
			if n := strings.Count(line, f); n > 1 {
				t.Errorf("this line names %s %d times: %s", f, n, line)
			}
		}
	}
}

// Without --dry-run the message goes to the network-metrics topic, keyed by
// the package, and only for a registered package.
func TestPcapCommandPublishes(t *testing.T) {
	t.Parallel()
	dbURL := newTestDatabase(t)
	_, brokers := newTestBroker(t, t.TempDir())
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(brokers, ","), "PLAYWATCH_DATA_DIR": t.TempDir()}
	args := []string{"pcap", "--app", "org.telegram.messenger", "--scenario", "DOWNLOAD", "testdata/pcap/delay_download.pcap"}

	err := run(context.Background(), args, envFunc(env), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("unregistered package: %v", err)
	}
	pool := newTestPoolFor(t, dbURL)
	if _, err := newAppStore(pool).Create(context.Background(), newApp{PackageName: "org.telegram.messenger", IsMessagingApp: true}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), args, envFunc(env), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "delay_download.pcap: published analysis ") {
		t.Fatalf("summary: %q", out.String())
	}
	recs := consumeAll(t, brokers, topicNetworkMetrics, 1)
	var m networkMetricsMessage
	if err := jsonUnmarshalStrict(recs[0].Value, &m); err != nil {
		t.Fatal(err)
	}
	if string(recs[0].Key) != "org.telegram.messenger" || m.Scenario != "DOWNLOAD" || !strings.Contains(out.String(), m.AnalysisID) {
		t.Fatalf("record %s = %s", recs[0].Key, recs[0].Value)
	}
	checkAgainstGolden(t, m, "delay_download")
}

// --scenario is read in any case and stored as UPLOAD or DOWNLOAD.
func TestPcapScenarioAnyCase(t *testing.T) {
	for given, want := range map[string]string{"upload": "UPLOAD", "Download": "DOWNLOAD", "UPLOAD": "UPLOAD"} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"pcap", "--app", "org.telegram.messenger", "--scenario", given, "--dry-run", "testdata/pcap/clean_upload.pcap"},
			envFunc(nil), &out, &errOut)
		var m networkMetricsMessage
		if err != nil || jsonUnmarshalStrict(bytes.TrimSpace(out.Bytes()), &m) != nil || m.Scenario != want {
			t.Errorf("--scenario %s: %v, scenario %q, want %s\n%s", given, err, m.Scenario, want, errOut.String())
		}
	}
}

// A file the analyzer panics on is an error for that file, naming it; the
// other files are analysed and printed.
func TestPcapAnalyzerPanicFailsThatFileOnly(t *testing.T) {
	files := []string{"testdata/pcap/clean_upload.pcap", "testdata/pcap/resets.pcap", "testdata/pcap/midstream.pcap"}
	analyze := func(ctx context.Context, path string, progress func(int64, int64)) (pcapResult, error) {
		if path == files[1] {
			var frames map[string]int
			//lint:ignore SA5000 the analyzer must hit a runtime panic here
			frames["x"]++ // assignment to entry in nil map
		}
		return analyzePcapFile(ctx, path, progress)
	}
	var out, errOut bytes.Buffer
	err := analyzeCapturesWith(context.Background(), analyze, files, pcapJob{Package: "org.telegram.messenger", Scenario: "UPLOAD"}, nil, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "1 of 3 captures failed") || !strings.Contains(err.Error(), files[1]) {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(errOut.String(), files[1]+": the analyzer failed on this capture") || !strings.Contains(errOut.String(), "nil map") {
		t.Errorf("stderr does not name the file and the panic:\n%s", errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"clean_upload.pcap"`) || !strings.Contains(lines[1], `"midstream.pcap"`) {
		t.Errorf("want the messages of the two other files, got:\n%s", out.String())
	}
}
