package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// tsharkMetricsScript is scripts/tshark_metrics.sh, which writes tshark's
// nine metrics of a capture as the fields of a network-metrics message;
// PLAYWATCH_TSHARK_METRICS points at another one.
func tsharkMetricsScript() string {
	if p := os.Getenv("PLAYWATCH_TSHARK_METRICS"); p != "" {
		return p
	}
	return filepath.Join("scripts", "tshark_metrics.sh")
}

// skipOrFailWithoutTshark skips the test with msg, except under CI=true,
// where .ci/run installs tshark and the checkout has the script, so what is
// missing is a failure.
func skipOrFailWithoutTshark(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (required under CI=true)")
	}
	t.Skip(msg)
}

// requireTshark stops a test that needs tshark when it is not installed.
func requireTshark(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("tshark"); err != nil {
		skipOrFailWithoutTshark(t, "tshark not installed (Debian: apt-get install tshark)")
	}
}

// requireTsharkMetrics is requireTshark plus the script; it returns the script.
func requireTsharkMetrics(t testing.TB) string {
	t.Helper()
	requireTshark(t)
	script := tsharkMetricsScript()
	if _, err := os.Stat(script); err != nil {
		skipOrFailWithoutTshark(t, fmt.Sprintf("tshark metrics script: %v (set PLAYWATCH_TSHARK_METRICS)", err))
	}
	return script
}

// runTsharkMetrics runs the tshark metrics script on path.
func runTsharkMetrics(t testing.TB, path string) networkMetricsMessage {
	t.Helper()
	script := requireTsharkMetrics(t)
	out, err := exec.Command(script, path).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %s: %v\n%s", script, path, err, stderr)
	}
	var m networkMetricsMessage
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("tshark metrics %q: %v", out, err)
	}
	return m
}

// compareWithTshark checks res against tshark's metrics for path in a
// subtest "tshark", so that without tshark only the comparison is skipped.
func compareWithTshark(t *testing.T, res pcapResult, path string) {
	t.Helper()
	t.Run("tshark", func(t *testing.T) {
		assertMatchesTshark(t, res, runTsharkMetrics(t, path))
	})
}

// assertMatchesTshark compares a result with tshark's numbers.
func assertMatchesTshark(t testing.TB, res pcapResult, want networkMetricsMessage) {
	t.Helper()
	var got networkMetricsMessage
	res.fillNetworkMetrics(&got)
	assertMetricsEqual(t, got, want)
}

// assertMetricsEqual compares the nine metrics of two messages: exact counts
// and bytes, rtt_handshake within 0.001 ms (tshark's files have 4 decimals),
// overhead_ratio within 1e-6 (6 decimals).
func assertMetricsEqual(t testing.TB, got, want networkMetricsMessage) {
	t.Helper()
	ints := []struct {
		name      string
		got, want int64
	}{
		{"retransmission_count", got.RetransmissionCount, want.RetransmissionCount},
		{"out_of_order_count", got.OutOfOrderCount, want.OutOfOrderCount},
		{"spurious_retransmission_count", got.SpuriousRetransmissionCount, want.SpuriousRetransmissionCount},
		{"zero_window_count", got.ZeroWindowCount, want.ZeroWindowCount},
		{"tcp_reset_count", got.TCPResetCount, want.TCPResetCount},
		{"bytes_transferred_total", got.BytesTransferredTotal, want.BytesTransferredTotal},
		{"bytes_payload_total", got.BytesPayloadTotal, want.BytesPayloadTotal},
	}
	for _, c := range ints {
		if c.got != c.want {
			t.Errorf("%s = %d, tshark %d", c.name, c.got, c.want)
		}
	}
	assertFloatNear(t, "rtt_handshake", got.RTTHandshake, want.RTTHandshake, 0.001)
	assertFloatNear(t, "overhead_ratio", got.OverheadRatio, want.OverheadRatio, 1e-6)
}

func assertFloatNear(t testing.TB, name string, got, want *float64, tol float64) {
	t.Helper()
	switch {
	case got == nil && want == nil:
	case got == nil || want == nil:
		t.Errorf("%s = %s, want %s", name, fmtFloatPtr(got), fmtFloatPtr(want))
	case math.Abs(*got-*want) > tol:
		t.Errorf("%s = %.7f, want %.7f (±%g)", name, *got, *want, tol)
	}
}

func fmtFloatPtr(f *float64) string {
	if f == nil {
		return "null"
	}
	return strconv.FormatFloat(*f, 'f', 7, 64)
}

// pcapFixtures lists the captures in testdata/pcap with a golden file, and
// what each one is meant to cover (checked, so a remade capture that lost
// its point fails).
var pcapFixtures = map[string]struct {
	linkTypes []layers.LinkType
	nano      bool // timestamps with ns resolution
}{
	"clean_upload.pcap":        {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"loss_sender.pcap":         {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"loss_receiver.pcap":       {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"delay_download.pcap":      {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"reorder_receiver.pcap":    {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"dup_receiver.pcap":        {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"zero_window.pcap":         {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"resets.pcap":              {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"multi_conns.pcap":         {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"ipv6_loss.pcap":           {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"sll2_any.pcap":            {linkTypes: []layers.LinkType{layers.LinkTypeLinuxSLL2}},
	"sll1_any.pcap":            {linkTypes: []layers.LinkType{layers.LinkTypeLinuxSLL}},
	"vlan_mirror.pcap":         {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"pcapng_dumpcap.pcapng":    {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}, nano: true},
	"pcapng_mixed.pcapng":      {linkTypes: []layers.LinkType{layers.LinkTypeEthernet, layers.LinkTypeLinuxSLL2}, nano: true},
	"nano_download.pcap":       {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}, nano: true},
	"snaplen96.pcap":           {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"midstream.pcap":           {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"midstream_loss.pcap":      {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
	"loss_receiver_rtt30.pcap": {linkTypes: []layers.LinkType{layers.LinkTypeEthernet}},
}

func loadGolden(t testing.TB, capture string) networkMetricsMessage {
	t.Helper()
	golden := strings.TrimSuffix(strings.TrimSuffix(capture, ".pcapng"), ".pcap") + ".tshark.json"
	return readJSONFile[networkMetricsMessage](t, golden)
}

func TestPcapFixturesMatchTshark(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/pcap/*.pcap*")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	var want []string
	for n := range pcapFixtures {
		want = append(want, n)
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("testdata/pcap holds %v, the table lists %v", names, want)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", "pcap", name)
			res, err := analyzePcapFile(context.Background(), path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range res.Warnings {
				t.Errorf("warning: %v", w)
			}
			golden := loadGolden(t, path)
			assertMatchesTshark(t, res, golden)
			// make_pcap_fixtures.sh writes the golden file with the script.
			t.Run("tshark", func(t *testing.T) { assertMetricsEqual(t, runTsharkMetrics(t, path), golden) })
			lts, nano := captureFormat(t, path)
			if !slices.Equal(lts, pcapFixtures[name].linkTypes) || nano != pcapFixtures[name].nano {
				t.Errorf("capture has link types %v, ns=%v; want %v, ns=%v", lts, nano, pcapFixtures[name].linkTypes, pcapFixtures[name].nano)
			}
		})
	}
}

// captureFormat reads the link types and timestamp resolution of a capture
// straight from pcapgo, independently of the analyzer.
func captureFormat(t *testing.T, path string) ([]layers.LinkType, bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if strings.HasSuffix(path, ".pcapng") {
		r, err := pcapgo.NewNgReader(f, pcapgo.NgReaderOptions{WantMixedLinkType: true})
		if err != nil {
			t.Fatal(err)
		}
		var lts []layers.LinkType
		nano := true
		for {
			_, ci, err := r.ReadPacketData()
			if err != nil {
				break
			}
			lt := ci.AncillaryData[0].(layers.LinkType)
			if !slices.Contains(lts, lt) {
				lts = append(lts, lt)
			}
			iface, err := r.Interface(ci.InterfaceIndex)
			if err != nil {
				t.Fatal(err)
			}
			nano = nano && iface.TimestampResolution == 9
		}
		return lts, nano
	}
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	return []layers.LinkType{r.LinkType()}, r.Resolution() == gopacket.TimestampResolutionNanosecond
}

// tsharkFlag is one frame tshark flags, as docs/pcap-metrics.md §11 lists them.
type tsharkFlag struct {
	frame int64
	kind  string
}

func (f tsharkFlag) String() string { return fmt.Sprintf("frame %d %s", f.frame, f.kind) }

// TestPcapFramesMatchTshark compares, frame by frame, which packets the
// analyzer flags with what tshark flags (docs/pcap-metrics.md §11), so a
// disagreement names its first frame. It needs tshark; the golden-file test
// covers the totals without it.
func TestPcapFramesMatchTshark(t *testing.T) {
	t.Parallel()
	requireTshark(t)
	files, err := filepath.Glob("testdata/pcap/*.pcap*")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			want := tsharkFrameFlags(t, path)
			got := analyzerFrameFlags(t, path)
			if !slices.Equal(got, want) {
				t.Errorf("first difference: %s", firstDifference(got, want))
			}
		})
	}
}

func tsharkFrameFlags(t *testing.T, path string) []tsharkFlag {
	t.Helper()
	cmd := exec.Command("tshark", "-n", "-r", path,
		"-o", "tcp.analyze_sequence_numbers:TRUE", "-o", "tcp.relative_sequence_numbers:TRUE",
		"-o", "tcp.fastrt_supersedes_ooo:TRUE",
		"-Y", "tcp.analysis.retransmission || tcp.analysis.out_of_order || tcp.analysis.zero_window",
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=f",
		"-e", "frame.number", "-e", "tcp.analysis.fast_retransmission",
		"-e", "tcp.analysis.spurious_retransmission", "-e", "tcp.analysis.out_of_order",
		"-e", "tcp.analysis.zero_window")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	var flags []tsharkFlag
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			t.Fatalf("tshark line %q", sc.Text())
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case f[1] != "":
			flags = append(flags, tsharkFlag{n, "fast_retransmission"})
		case f[2] != "":
			flags = append(flags, tsharkFlag{n, "spurious_retransmission"})
		case f[3] != "":
			flags = append(flags, tsharkFlag{n, "out_of_order"})
		case f[4] == "":
			flags = append(flags, tsharkFlag{n, "retransmission"})
		}
		if f[4] != "" {
			flags = append(flags, tsharkFlag{n, "zero_window"})
		}
	}
	return flags
}

func analyzerFrameFlags(t *testing.T, path string) []tsharkFlag {
	t.Helper()
	var flags []tsharkFlag
	analyzeWithHook(t, path, func(record int64, f tcpAnalysisFlags) {
		switch {
		case f&flagFastRetransmission != 0:
			flags = append(flags, tsharkFlag{record, "fast_retransmission"})
		case f&flagSpuriousRetransmission != 0:
			flags = append(flags, tsharkFlag{record, "spurious_retransmission"})
		case f&flagOutOfOrder != 0:
			flags = append(flags, tsharkFlag{record, "out_of_order"})
		case f&flagRetransmission != 0:
			flags = append(flags, tsharkFlag{record, "retransmission"})
		}
		if f&flagZeroWindow != 0 {
			flags = append(flags, tsharkFlag{record, "zero_window"})
		}
	})
	return flags
}

// analyzeWithHook analyses a file with a per-segment hook.
func analyzeWithHook(t *testing.T, path string, hook func(int64, tcpAnalysisFlags)) pcapResult {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := newPcapAnalyzer()
	a.onSegment = hook
	res, err := a.run(context.Background(), f, path, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func firstDifference(got, want []tsharkFlag) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("analyzer %v, tshark %v", got[i], want[i])
		}
	}
	if len(got) > len(want) {
		return fmt.Sprintf("analyzer also has %v", got[len(want)])
	}
	if len(want) > len(got) {
		return fmt.Sprintf("tshark also has %v", want[len(got)])
	}
	return "none"
}

// TestPcapGzip: tshark reads gzip-compressed captures transparently; so does the analyzer.
func TestPcapGzip(t *testing.T) {
	raw, err := os.ReadFile("testdata/pcap/loss_receiver.pcap")
	if err != nil {
		t.Fatal(err)
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := analyzePcap(context.Background(), &z, "loss_receiver.pcap.gz", int64(z.Len()), nil)
	if err != nil {
		t.Fatal(err)
	}
	assertMatchesTshark(t, res, loadGolden(t, "testdata/pcap/loss_receiver.pcap"))
}

func TestPcapProgressAndCancel(t *testing.T) {
	path := "testdata/pcap/loss_sender.pcap"
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	var last, lastSize int64
	if _, err := analyzePcapFile(context.Background(), path, func(n, size int64) {
		calls++
		if n < last {
			t.Errorf("progress went back from %d to %d", last, n)
		}
		last, lastSize = n, size
	}); err != nil {
		t.Fatal(err)
	}
	if calls < 2 || last != st.Size() || lastSize != st.Size() {
		t.Errorf("progress: %d calls, last (%d, %d), file size %d", calls, last, lastSize, st.Size())
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := analyzePcapFile(ctx, path, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: err = %v", err)
	}
}

func TestPcapFillNetworkMetrics(t *testing.T) {
	res, err := analyzePcapFile(context.Background(), "testdata/pcap/zero_window.pcap", nil)
	if err != nil {
		t.Fatal(err)
	}
	var m networkMetricsMessage
	res.fillNetworkMetrics(&m)
	got := jsonRoundTrip[networkMetricsMessage](t, m)
	want := loadGolden(t, "testdata/pcap/zero_window.pcap")
	if got.ZeroWindowCount != want.ZeroWindowCount || got.BytesTransferredTotal != want.BytesTransferredTotal ||
		got.RTTHandshake == nil || got.OverheadRatio == nil {
		t.Errorf("message %+v, tshark %+v", got, want)
	}
	if m.RTTHandshake != res.RTTHandshakeMs || m.OverheadRatio != res.OverheadRatio {
		t.Error("nullable metrics not carried over")
	}

	var empty pcapResult
	empty.fillNetworkMetrics(&m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"rtt_handshake":null`)) || !bytes.Contains(b, []byte(`"overhead_ratio":null`)) {
		t.Errorf("empty result: %s", b)
	}
}

func TestPcapNewUUIDv4(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100 {
		u := newUUIDv4()
		if !re.MatchString(u) {
			t.Fatalf("%q is not a version 4 UUID", u)
		}
		if seen[u] {
			t.Fatalf("%q repeated", u)
		}
		seen[u] = true
	}
}

// TestPcapNoAllocationPerPacket: the record loop must not allocate per
// packet; what it allocates is per file and per connection. The file is
// analysed whole and cut in half: the second half must cost no allocations.
func TestPcapNoAllocationPerPacket(t *testing.T) {
	data, err := os.ReadFile("testdata/pcap/loss_sender.pcap")
	if err != nil {
		t.Fatal(err)
	}
	allocs := func(data []byte) (float64, int64) {
		var records int64
		n := testing.AllocsPerRun(5, func() {
			res, err := analyzePcap(context.Background(), bytes.NewReader(data), "x", 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			records = res.Records
		})
		return n, records
	}
	whole, records := allocs(data)
	half, halfRecords := allocs(data[:len(data)/2])
	if extra := (whole - half) / float64(records-halfRecords); extra > 0.02 {
		t.Errorf("%.0f allocations for %d records, %.0f for %d: %.3f per extra record", whole, records, half, halfRecords, extra)
	}
}

// unixNano is a test capture's clock: seconds since an arbitrary nonzero
// epoch, rounded to the µs so that µs captures hold it exactly.
func unixNano(sec float64) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(math.Round(sec*1e6)) * time.Microsecond)
}
