package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// The pcap analyzer turns one capture file into the nine TCP metrics of
// docs/pcap-metrics.md, with the numbers tshark 4.0.17 gives for the same
// file. The file is streamed: memory grows with the connections alive at one
// time, never with the size of the file.

// Sentinel errors, wrapped in *pcapError so callers can tell them apart with
// errors.Is and find the file and record with errors.As.
var (
	errPcapFormat       = errors.New("not a pcap or pcapng file")
	errPcapTruncated    = errors.New("file ends inside a record")
	errPcapCorrupt      = errors.New("corrupt record")
	errPcapLinkType     = errors.New("unsupported link type")
	errPcapIPFragment   = errors.New("TCP in IP fragments is not analysed")
	errPcapTCPHeaderCut = errors.New("snap length cuts the fixed TCP header")
)

// pcapError says where in which file a problem is. Record is the 1-based
// number of the packet record (tshark's frame.number); 0 means the file
// header. Offset is the byte offset in the (decompressed) file at which
// reading that record began.
type pcapError struct {
	File   string
	Record int64
	Offset int64
	Err    error
}

func (e *pcapError) Error() string {
	if e.Record == 0 {
		return fmt.Sprintf("pcap %s: file header (offset %d): %v", e.File, e.Offset, e.Err)
	}
	return fmt.Sprintf("pcap %s: record %d (offset %d): %v", e.File, e.Record, e.Offset, e.Err)
}

func (e *pcapError) Unwrap() error { return e.Err }

// pcapResult is the analysis of one capture file: the nine metrics plus what
// the caller needs to judge them.
type pcapResult struct {
	// RTTHandshakeMs is the mean SYN -> SYN-ACK time in ms, nil without a
	// complete handshake in the file.
	RTTHandshakeMs              *float64
	RetransmissionCount         int64
	OutOfOrderCount             int64
	SpuriousRetransmissionCount int64
	ZeroWindowCount             int64
	TCPResetCount               int64
	BytesTransferredTotal       int64
	BytesPayloadTotal           int64
	// OverheadRatio is nil for a file without records.
	OverheadRatio *float64

	// Records is the number of packet records read.
	Records int64
	// TCPSegments is the number of records analysed as TCP.
	TCPSegments int64
	// PeakConnections is the largest number of connections held at once.
	PeakConnections int
	// Warnings name records that were read but not (fully) analysed, and a
	// damaged end of file after which the metrics cover only what came before.
	Warnings []*pcapError
}

// fillNetworkMetrics copies the nine metrics into a network-metrics message;
// the caller sets the identity fields (analysis_id, package, scenario, file, time).
func (r *pcapResult) fillNetworkMetrics(m *networkMetricsMessage) {
	m.RTTHandshake = r.RTTHandshakeMs
	m.RetransmissionCount = r.RetransmissionCount
	m.OutOfOrderCount = r.OutOfOrderCount
	m.SpuriousRetransmissionCount = r.SpuriousRetransmissionCount
	m.ZeroWindowCount = r.ZeroWindowCount
	m.TCPResetCount = r.TCPResetCount
	m.BytesTransferredTotal = r.BytesTransferredTotal
	m.BytesPayloadTotal = r.BytesPayloadTotal
	m.OverheadRatio = r.OverheadRatio
}

// newUUIDv4 returns a random RFC 9562 version 4 UUID for analysis_id.
func newUUIDv4() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it aborts the program instead)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// analyzePcapFile analyses the capture at path. progress, if not nil, is
// called now and then with the bytes read from the file so far and its size.
// A file that cannot be read up to its first record gives a *pcapError; a
// file damaged later gives the metrics of the records before the damage and
// a warning. Every error names path once.
func analyzePcapFile(ctx context.Context, path string, progress func(bytesRead, size int64)) (pcapResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return pcapResult{}, err // an *fs.PathError: it names path
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return pcapResult{}, err
	}
	if st.IsDir() {
		// Read, a directory would pass for an empty file.
		return pcapResult{}, fmt.Errorf("%s: is a directory, not a capture file: name the captures in it (%s)", path, filepath.Join(path, "*.pcap"))
	}
	return analyzePcap(ctx, f, path, st.Size(), progress)
}

// pcapReadBuffer is the read-ahead buffer: large enough that the per-call
// cost of reading the file vanishes, small enough not to matter in memory.
const pcapReadBuffer = 1 << 18

// How often (in records) the loop looks at the context and reports progress.
const pcapCheckEvery = 4096

// analyzePcap analyses a capture read from r; name is the file name used in
// errors and size (may be 0) is passed to progress.
func analyzePcap(ctx context.Context, r io.Reader, name string, size int64, progress func(bytesRead, size int64)) (pcapResult, error) {
	return newPcapAnalyzer().run(ctx, r, name, size, progress)
}

// run reads every record of the capture in r through the analyzer.
func (a *pcapAnalyzer) run(ctx context.Context, r io.Reader, name string, size int64, progress func(bytesRead, size int64)) (pcapResult, error) {
	in := &countingReader{r: r}
	src, err := openPacketSource(in, name)
	if err != nil {
		return pcapResult{}, err
	}
	var rec int64
	var readErr *pcapError
	for {
		if rec%pcapCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return pcapResult{}, fmt.Errorf("analyze pcap %s: %w", name, err)
			}
			if progress != nil {
				progress(in.n, size)
			}
		}
		off := src.offset()
		data, ci, err := src.read()
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = &pcapError{File: name, Record: rec + 1, Offset: off, Err: classifyReadError(err)}
			if rec == 0 {
				return pcapResult{}, readErr
			}
			break
		}
		rec++
		lt := src.linkType
		if src.ng {
			lt = ci.AncillaryData[0].(layers.LinkType)
		}
		a.frame(rec, off, data, ci.Length, ci.Timestamp.UnixNano(), lt)
	}
	if progress != nil {
		progress(in.n, size)
	}
	res := a.result(name)
	if readErr != nil {
		res.Warnings = append(res.Warnings, readErr)
	}
	return res, nil
}

// classifyReadError maps a reader error to one of the sentinels, keeping the
// reader's own message.
func classifyReadError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %w", errPcapTruncated, err)
	}
	return fmt.Errorf("%w: %w", errPcapCorrupt, err)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// packetSource reads records from a classic pcap or a pcapng file and knows
// the offset at which the next record starts.
type packetSource struct {
	pcap     *pcapgo.Reader
	pcapng   *pcapgo.NgReader
	ng       bool
	linkType layers.LinkType // classic pcap only; pcapng has one per interface
	stream   *countingReader // the (decompressed) bytes below buf
	buf      *bufio.Reader   // shared with the pcapgo reader, see openPacketSource
}

// offset is the position in the (decompressed) file of the next unread byte.
func (s *packetSource) offset() int64 { return s.stream.n - int64(s.buf.Buffered()) }

func (s *packetSource) read() ([]byte, gopacket.CaptureInfo, error) {
	if s.ng {
		return s.pcapng.ZeroCopyReadPacketData()
	}
	return s.pcap.ZeroCopyReadPacketData()
}

// Magic numbers of the formats, as the first four bytes read big-endian.
const (
	magicPcapMicroBE = 0xa1b2c3d4
	magicPcapMicroLE = 0xd4c3b2a1
	magicPcapNanoBE  = 0xa1b23c4d
	magicPcapNanoLE  = 0x4d3cb2a1
	magicPcapng      = 0x0a0d0d0a
)

func openPacketSource(in *countingReader, name string) (*packetSource, error) {
	headerErr := func(err error) error { return &pcapError{File: name, Record: 0, Offset: 0, Err: err} }
	br := bufio.NewReaderSize(in, pcapReadBuffer)
	stream := in
	// gzip is undone here rather than in pcapgo so that offsets are those of
	// the uncompressed file, as tshark reports them.
	if m, err := br.Peek(2); err == nil && m[0] == 0x1f && m[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, headerErr(fmt.Errorf("%w: gzip: %w", errPcapFormat, err))
		}
		stream = &countingReader{r: zr}
		br = bufio.NewReaderSize(stream, pcapReadBuffer)
	}
	m, err := br.Peek(4)
	if err != nil {
		if len(m) == 0 {
			return nil, headerErr(fmt.Errorf("%w: file is empty", errPcapFormat))
		}
		return nil, headerErr(fmt.Errorf("%w: %w", errPcapTruncated, err))
	}
	// pcapgo wraps its io.Reader in a bufio.Reader unless it already is one
	// of at least the default size: it reads straight from br, so br's
	// Buffered count gives the exact offset of each record.
	s := &packetSource{stream: stream, buf: br}
	switch binary.BigEndian.Uint32(m) {
	case magicPcapng:
		s.ng = true
		s.pcapng, err = pcapgo.NewNgReader(br, pcapgo.NgReaderOptions{WantMixedLinkType: true, SkipUnknownVersion: true})
	case magicPcapMicroBE, magicPcapMicroLE, magicPcapNanoBE, magicPcapNanoLE:
		s.pcap, err = pcapgo.NewReader(br)
	default:
		return nil, headerErr(fmt.Errorf("%w: magic %08x", errPcapFormat, binary.BigEndian.Uint32(m)))
	}
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, headerErr(fmt.Errorf("%w: %w", errPcapTruncated, err))
		}
		return nil, headerErr(fmt.Errorf("%w: %w", errPcapFormat, err))
	}
	if !s.ng {
		// The upper bits of the header's link-type field may carry FCS
		// information; pcapgo keeps only the low 16 bits, the link type.
		s.linkType = s.pcap.LinkType()
		if !supportedLinkType(s.linkType) {
			return nil, &pcapError{File: name, Record: 0, Offset: 20, Err: fmt.Errorf("%w: %d (%v)", errPcapLinkType, int(s.linkType), s.linkType)}
		}
	}
	return s, nil
}

// Link types the analyzer decodes. RAW has the value 101 in files, but 12
// and 14 in some old ones (the platform's DLT_RAW written as is).
const (
	linkTypeRawOpenBSD = 12
	linkTypeRawBSDOS   = 14
)

func supportedLinkType(lt layers.LinkType) bool {
	switch lt {
	case layers.LinkTypeEthernet, layers.LinkTypeLinuxSLL, layers.LinkTypeLinuxSLL2,
		layers.LinkTypeNull, layers.LinkTypeLoop, layers.LinkTypeRaw,
		linkTypeRawOpenBSD, linkTypeRawBSDOS, layers.LinkTypeIPv4, layers.LinkTypeIPv6:
		return true
	}
	return false
}

// tcpFixedHeader is a gopacket DecodingLayer for the fixed 20 bytes of the
// TCP header. The analysis needs nothing from the options, and a frame whose
// snap length cuts into the options still has every field it needs, where
// layers.TCP would reject it.
type tcpFixedHeader struct {
	header     []byte // from the first TCP byte to the end of the captured frame
	srcPort    uint16
	dstPort    uint16
	seq        uint32
	ack        uint32
	dataOffset uint8 // header length in 32-bit words
	flags      uint8
	window     uint16
	// cut says the frame ends inside the fixed header; reset before each frame.
	cut bool
}

// TCP flag bits in the header's flags byte.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

func (t *tcpFixedHeader) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < 20 {
		t.cut = true
		df.SetTruncated()
		return errPcapTCPHeaderCut
	}
	t.header = data
	t.srcPort = binary.BigEndian.Uint16(data[0:2])
	t.dstPort = binary.BigEndian.Uint16(data[2:4])
	t.seq = binary.BigEndian.Uint32(data[4:8])
	t.ack = binary.BigEndian.Uint32(data[8:12])
	t.dataOffset = data[12] >> 4
	t.flags = data[13]
	t.window = binary.BigEndian.Uint16(data[14:16])
	return nil
}

func (t *tcpFixedHeader) CanDecode() gopacket.LayerClass    { return layers.LayerTypeTCP }
func (t *tcpFixedHeader) NextLayerType() gopacket.LayerType { return gopacket.LayerTypeZero }
func (t *tcpFixedHeader) LayerPayload() []byte              { return nil }

// frameLayers holds one decoder of each layer, shared by every parser: a
// frame is decoded into them without allocating.
type frameLayers struct {
	eth      layers.Ethernet
	dot1q    layers.Dot1Q
	sll      layers.LinuxSLL
	sll2     layers.LinuxSLL2
	loopback layers.Loopback
	ip4      layers.IPv4
	ip6      layers.IPv6
	ip6ext   layers.IPv6ExtensionSkipper
	ip6frag  layers.IPv6Fragment
	tcp      tcpFixedHeader
	decoded  []gopacket.LayerType
}

// linkDecoder decodes the frames of one link type. RAW frames start with IPv4
// or IPv6, told apart by the version nibble, so they need a second parser.
type linkDecoder struct {
	linkType layers.LinkType
	first    *gopacket.DecodingLayerParser
	ipv6     *gopacket.DecodingLayerParser // RAW only
}

func (l *frameLayers) newParser(first gopacket.LayerType) *gopacket.DecodingLayerParser {
	// The sparse container finds each layer's decoder by indexing a slice:
	// no map lookup while decoding.
	p := gopacket.NewDecodingLayerParser(first)
	p.SetDecodingLayerContainer(gopacket.DecodingLayerSparse(nil))
	// The skipper claims every IPv6 extension header type; IPv6Fragment is
	// added after it to take the fragment header back.
	for _, d := range []gopacket.DecodingLayer{&l.eth, &l.dot1q, &l.sll, &l.sll2, &l.loopback,
		&l.ip4, &l.ip6, &l.ip6ext, &l.ip6frag, &l.tcp} {
		p.AddDecodingLayer(d)
	}
	p.IgnoreUnsupported = true
	return p
}

func (l *frameLayers) newLinkDecoder(lt layers.LinkType) *linkDecoder {
	d := &linkDecoder{linkType: lt}
	switch lt {
	case layers.LinkTypeEthernet:
		d.first = l.newParser(layers.LayerTypeEthernet)
	case layers.LinkTypeLinuxSLL:
		d.first = l.newParser(layers.LayerTypeLinuxSLL)
	case layers.LinkTypeLinuxSLL2:
		d.first = l.newParser(layers.LayerTypeLinuxSLL2)
	case layers.LinkTypeNull, layers.LinkTypeLoop:
		d.first = l.newParser(layers.LayerTypeLoopback)
	case layers.LinkTypeIPv4:
		d.first = l.newParser(layers.LayerTypeIPv4)
	case layers.LinkTypeIPv6:
		d.first = l.newParser(layers.LayerTypeIPv6)
	case layers.LinkTypeRaw, linkTypeRawOpenBSD, linkTypeRawBSDOS:
		d.first = l.newParser(layers.LayerTypeIPv4)
		d.ipv6 = l.newParser(layers.LayerTypeIPv6)
	default:
		return nil
	}
	return d
}

// tcpSegment is what the analysis reads from one TCP packet.
type tcpSegment struct {
	seq, ack uint32
	seglen   uint32
	window   uint16
	flags    uint8
}

// connKey is a connection: the unordered pair of (address, port) endpoints,
// the lower endpoint first. IPv4 addresses are stored IPv4-mapped.
type connKey struct {
	aHi, aLo, bHi, bLo uint64
	aPort, bPort       uint16
}

// same is k == o, field by field: inlined, where == on the struct calls memequal.
func (k *connKey) same(o *connKey) bool {
	return k.aLo == o.aLo && k.bLo == o.bLo && k.aPort == o.aPort && k.bPort == o.bPort && k.aHi == o.aHi && k.bHi == o.bHi
}

// Release of connection state, in capture time. State dropped too early
// would change how late packets are classified (a fresh state flags
// nothing), so the limits are set past what TCP itself still retransmits.
const (
	// pcapClosedQuiet is how long a connection that saw both FINs or a RST
	// must be silent before its state is dropped (covers TCP_RTO_MAX twice).
	pcapClosedQuiet = int64(4 * time.Minute)
	// pcapIdleTimeout drops any connection silent this long; longer than
	// Linux's full retransmission backoff (tcp_retries2=15, about 924 s).
	pcapIdleTimeout = int64(30 * time.Minute)
	// pcapSweepEvery is the capture time between two sweeps of the table.
	pcapSweepEvery = int64(10 * time.Second)
)

// pcapAnalyzer holds the state of one file's analysis.
type pcapAnalyzer struct {
	layers   frameLayers
	decoders []*linkDecoder
	lastDec  *linkDecoder

	conns     map[connKey]*tcpConn
	lastKey   connKey
	lastConn  *tcpConn
	peakConns int
	tablePeak int // most connections since conns was last built
	lastSweep int64

	counts tcpCounts
	res    pcapResult

	rttSumNs   int64
	rttSamples int64

	// Frames read but not analysed, for the warnings: count and first record.
	fragments, headerCuts, badLink pcapSkipped
	badLinkType                    layers.LinkType

	// onSegment, if set, sees every analysed TCP packet's analysis flags
	// (tests use it to compare frame by frame with tshark).
	onSegment func(record int64, flags tcpAnalysisFlags)
}

type pcapSkipped struct {
	n, firstRecord, firstOffset int64
}

func (s *pcapSkipped) add(record, offset int64) {
	if s.n == 0 {
		s.firstRecord, s.firstOffset = record, offset
	}
	s.n++
}

func newPcapAnalyzer() *pcapAnalyzer {
	a := &pcapAnalyzer{conns: make(map[connKey]*tcpConn)}
	a.layers.decoded = make([]gopacket.LayerType, 0, 16)
	return a
}

func (a *pcapAnalyzer) decoderFor(lt layers.LinkType) *linkDecoder {
	if a.lastDec != nil && a.lastDec.linkType == lt {
		return a.lastDec
	}
	for _, d := range a.decoders {
		if d.linkType == lt {
			a.lastDec = d
			return d
		}
	}
	d := a.layers.newLinkDecoder(lt)
	if d == nil {
		return nil
	}
	a.decoders = append(a.decoders, d)
	a.lastDec = d
	return d
}

// frame accounts for one record: wireLen is its original length, now its
// capture time in ns. It runs once per packet, a measured hot loop
// (pcap_bench_test.go), so it stays one function over 100 lines: calls per
// layer cost more than they make clear.
func (a *pcapAnalyzer) frame(record, offset int64, data []byte, wireLen int, now int64, lt layers.LinkType) {
	a.res.Records++
	a.res.BytesTransferredTotal += int64(wireLen)
	d := a.decoderFor(lt)
	if d == nil {
		if a.badLink.n == 0 {
			a.badLinkType = lt
		}
		a.badLink.add(record, offset)
		return
	}
	p := d.first
	if d.ipv6 != nil && len(data) > 0 && data[0]>>4 == 6 {
		p = d.ipv6
	}
	l := &a.layers
	l.tcp.cut = false
	// Errors only say where decoding stopped; the decoded list says what is there.
	_ = p.DecodeLayers(data, &l.decoded)

	// The IP header that carries TCP is the last one decoded: DecodeLayers
	// overwrites a layer decoded twice (IP in IP), as tshark analyses the
	// innermost TCP. ICMP is not decoded, so TCP quoted in an ICMP error is
	// never reached (docs/pcap-metrics.md §4).
	var ipLayer, last gopacket.LayerType
	tcp := false
	for _, t := range l.decoded {
		switch t {
		case layers.LayerTypeIPv4, layers.LayerTypeIPv6:
			ipLayer = t
		case layers.LayerTypeTCP:
			tcp = true
		}
		last = t
	}
	if !tcp {
		switch {
		case last == layers.LayerTypeIPv4 && (l.ip4.Flags&layers.IPv4MoreFragments != 0 || l.ip4.FragOffset != 0) &&
			l.ip4.Protocol == layers.IPProtocolTCP,
			last == layers.LayerTypeIPv6Fragment && l.ip6frag.NextHeader == layers.IPProtocolTCP:
			a.fragments.add(record, offset)
		case l.tcp.cut:
			a.headerCuts.add(record, offset)
		}
		return
	}
	t := &l.tcp
	if t.dataOffset < 5 {
		return // tshark: bogus header length, no analysis
	}
	// seglen comes from the IP and TCP length fields, so it is exact for
	// frames cut by a snap length and ignores Ethernet padding. The distance
	// from the IP header to the TCP header (IPv6 extension headers included)
	// is taken from the two slices, which share the frame's backing array.
	var seglen int
	if ipLayer == layers.LayerTypeIPv4 {
		seglen = int(l.ip4.Length) - (cap(l.ip4.Contents) - cap(t.header)) - int(t.dataOffset)*4
	} else {
		seglen = 40 + int(l.ip6.Length) - (cap(l.ip6.Contents) - cap(t.header)) - int(t.dataOffset)*4
	}
	if seglen < 0 {
		return // tshark: bogus header length, no analysis
	}

	var key connKey
	var src, dst [2]uint64
	if ipLayer == layers.LayerTypeIPv4 {
		src = [2]uint64{0, 0xffff<<32 | uint64(binary.BigEndian.Uint32(l.ip4.SrcIP))}
		dst = [2]uint64{0, 0xffff<<32 | uint64(binary.BigEndian.Uint32(l.ip4.DstIP))}
	} else {
		src = [2]uint64{binary.BigEndian.Uint64(l.ip6.SrcIP[0:8]), binary.BigEndian.Uint64(l.ip6.SrcIP[8:16])}
		dst = [2]uint64{binary.BigEndian.Uint64(l.ip6.DstIP[0:8]), binary.BigEndian.Uint64(l.ip6.DstIP[8:16])}
	}
	fromA := src[0] < dst[0] || src[0] == dst[0] && (src[1] < dst[1] || src[1] == dst[1] && t.srcPort <= t.dstPort)
	if fromA {
		key = connKey{src[0], src[1], dst[0], dst[1], t.srcPort, t.dstPort}
	} else {
		key = connKey{dst[0], dst[1], src[0], src[1], t.dstPort, t.srcPort}
	}
	c := a.lastConn
	if c == nil || !key.same(&a.lastKey) {
		c = a.conns[key]
		if c == nil {
			c = newTCPConn()
			a.conns[key] = c
			a.peakConns = max(a.peakConns, len(a.conns))
			a.tablePeak = max(a.tablePeak, len(a.conns))
		}
		a.lastKey, a.lastConn = key, c
	}

	seg := tcpSegment{seq: t.seq, ack: t.ack, seglen: uint32(seglen), window: t.window, flags: t.flags}
	dir := 0
	if !fromA {
		dir = 1
	}
	flags := c.analyze(dir, &seg, uint64(now))
	c.handshake(dir, &seg, now, &a.rttSumNs, &a.rttSamples)
	c.lastSeen = now
	a.counts.add(flags, &seg)
	a.res.TCPSegments++
	a.res.BytesPayloadTotal += int64(seglen)
	if a.onSegment != nil {
		a.onSegment(record, flags)
	}
	if now-a.lastSweep >= pcapSweepEvery || now < a.lastSweep {
		a.sweep(now)
	}
}

// sweep drops the connections that are closed and quiet, or idle.
func (a *pcapAnalyzer) sweep(now int64) {
	a.lastSweep = now
	for k, c := range a.conns {
		quiet := now - c.lastSeen
		if quiet >= pcapIdleTimeout || c.closed() && quiet >= pcapClosedQuiet {
			delete(a.conns, k)
			if c == a.lastConn {
				a.lastConn = nil
			}
		}
	}
	// Go maps keep their buckets after deletes: rebuild a table that has
	// shrunk a lot so memory follows the live connections down again.
	if a.tablePeak >= 1024 && len(a.conns) < a.tablePeak/8 {
		m := make(map[connKey]*tcpConn, len(a.conns))
		for k, c := range a.conns {
			m[k] = c
		}
		a.conns = m
		a.tablePeak = len(a.conns)
	}
}

// result builds the file's result; name is the file name for the warnings.
func (a *pcapAnalyzer) result(name string) pcapResult {
	r := a.res
	a.counts.fill(&r)
	r.PeakConnections = a.peakConns
	if a.rttSamples > 0 {
		ms := float64(a.rttSumNs) / float64(a.rttSamples) / 1e6
		r.RTTHandshakeMs = &ms
	}
	if r.Records > 0 {
		ratio := float64(r.BytesTransferredTotal-r.BytesPayloadTotal) / float64(r.BytesTransferredTotal)
		r.OverheadRatio = &ratio
	}
	warn := func(s pcapSkipped, err error) {
		if s.n > 0 {
			r.Warnings = append(r.Warnings, &pcapError{File: name, Record: s.firstRecord, Offset: s.firstOffset,
				Err: fmt.Errorf("%d records from here on: %w", s.n, err)})
		}
	}
	warn(a.badLink, fmt.Errorf("%w %d (%v), counted in bytes_transferred_total only", errPcapLinkType, int(a.badLinkType), a.badLinkType))
	warn(a.fragments, errPcapIPFragment)
	warn(a.headerCuts, errPcapTCPHeaderCut)
	return r
}

// tcpCounts are the per-flag counters of docs/pcap-metrics.md §7.
type tcpCounts struct {
	retrans, fastRetrans, spurious, outOfOrder, zeroWindow, resets int64
}

func (c *tcpCounts) add(f tcpAnalysisFlags, s *tcpSegment) {
	// Step 5 gives at most one of these four; most packets get none.
	if f&(flagRetransmission|flagFastRetransmission|flagSpuriousRetransmission|flagOutOfOrder) != 0 {
		switch {
		case f&flagRetransmission != 0:
			c.retrans++
		case f&flagFastRetransmission != 0:
			c.fastRetrans++
		case f&flagSpuriousRetransmission != 0:
			c.spurious++
		default:
			c.outOfOrder++
		}
	}
	if f&flagZeroWindow != 0 {
		c.zeroWindow++
	}
	if s.flags&tcpRST != 0 {
		c.resets++
	}
}

func (c *tcpCounts) fill(r *pcapResult) {
	r.RetransmissionCount = c.retrans + c.fastRetrans
	r.SpuriousRetransmissionCount = c.spurious
	r.OutOfOrderCount = c.outOfOrder
	r.ZeroWindowCount = c.zeroWindow
	r.TCPResetCount = c.resets
}
