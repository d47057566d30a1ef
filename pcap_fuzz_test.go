package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Fuzzing: go test -run '^$' -fuzz=FuzzPcapFile .   (and FuzzTCPAnalysis).
// Interesting inputs found are kept in testdata/fuzz/<name>/.

// fuzzSeedPrefix is how much of each real capture seeds the file fuzzer: the
// header and a few dozen records; whole captures only slow the mutator.
const fuzzSeedPrefix = 4096

// FuzzPcapFile feeds arbitrary bytes to the reader, the decoders and the
// analysis: any input gives a result or a *pcapError, never a panic, and
// the result is consistent.
func FuzzPcapFile(f *testing.F) {
	files, err := filepath.Glob("testdata/pcap/*.pcap*")
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), fuzzSeedPrefix)])
	}
	for _, lt := range []uint32{0, 12, 101, 108, 113, 228, 276} {
		f.Add(classicPcap(binary.BigEndian, true, lt, scriptedRecords(v4Conn, func(ip []byte) []byte {
			if lt == 0 || lt == 108 {
				return append([]byte{0, 0, 0, 2}, ip...)
			}
			if lt == 113 {
				return append(append(make([]byte, 14), 8, 0), ip...)
			}
			if lt == 276 {
				return append(append([]byte{8, 0}, make([]byte, 18)...), ip...)
			}
			return ip
		})))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := analyzePcap(context.Background(), bytes.NewReader(data), "fuzz.pcap", int64(len(data)), nil)
		if err != nil {
			var pe *pcapError
			if !errors.As(err, &pe) || pe.File != "fuzz.pcap" || pe.Record < 0 || pe.Offset < 0 || pe.Offset > int64(len(data)) && !isGzip(data) {
				t.Fatalf("error %v is not a well-formed *pcapError", err)
			}
			return
		}
		if res.Records < 0 || res.TCPSegments > res.Records || res.BytesTransferredTotal < 0 || res.BytesPayloadTotal < 0 {
			t.Fatalf("inconsistent result %+v", res)
		}
		if (res.OverheadRatio == nil) != (res.Records == 0) {
			t.Fatalf("overhead_ratio %v for %d records", res.OverheadRatio, res.Records)
		}
		flagged := res.RetransmissionCount + res.OutOfOrderCount + res.SpuriousRetransmissionCount
		if flagged > res.TCPSegments || res.ZeroWindowCount > res.TCPSegments || res.TCPResetCount > res.TCPSegments {
			t.Fatalf("more flags than segments: %+v", res)
		}
		for _, w := range res.Warnings {
			if w.File != "fuzz.pcap" || w.Record < 1 || w.Record > res.Records+1 {
				t.Fatalf("warning %v out of range (%d records)", w, res.Records)
			}
		}
	})
}

func isGzip(b []byte) bool { return len(b) >= 2 && b[0] == 0x1f && b[1] == 0x8b }

// fuzzSegmentSize is the encoding of one segment for FuzzTCPAnalysis:
// direction+flags (1), seq (4), ack (4), seglen (2), window (2), time step in µs (2).
const fuzzSegmentSize = 15

// segmentsOf encodes the first TCP packets of a real capture for FuzzTCPAnalysis.
func segmentsOf(tb testing.TB, path string, limit int) []byte {
	var out []byte
	var prev int64
	a := newPcapAnalyzer()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	src, err := openPacketSource(&countingReader{r: f}, path)
	if err != nil {
		tb.Fatal(err)
	}
	var first *connKey
	for n := 0; n < limit; {
		data, ci, err := src.read()
		if err != nil {
			break
		}
		if src.ng {
			continue
		}
		a.layers.tcp.cut = false
		if err := a.decoderFor(src.linkType).first.DecodeLayers(data, &a.layers.decoded); err != nil || len(a.layers.decoded) < 3 {
			continue
		}
		tcp := &a.layers.tcp
		key := connKey{aPort: min(tcp.srcPort, tcp.dstPort), bPort: max(tcp.srcPort, tcp.dstPort)}
		if first == nil {
			first = &key
		} else if key != *first {
			continue
		}
		now := ci.Timestamp.UnixNano()
		step := min((now-prev)/1000, 0xffff)
		if prev == 0 {
			step = 1
		}
		prev = now
		dir := byte(0)
		if tcp.srcPort > tcp.dstPort {
			dir = 0x80
		}
		seglen := int(a.layers.ip4.Length) - int(a.layers.ip4.IHL)*4 - int(tcp.dataOffset)*4
		b := []byte{dir | tcp.flags&0x17}
		b = binary.BigEndian.AppendUint32(b, tcp.seq)
		b = binary.BigEndian.AppendUint32(b, tcp.ack)
		b = binary.BigEndian.AppendUint16(b, uint16(max(seglen, 0)))
		b = binary.BigEndian.AppendUint16(b, tcp.window)
		b = binary.BigEndian.AppendUint16(b, uint16(step))
		out = append(out, b...)
		n++
	}
	return out
}

// FuzzTCPAnalysis drives one connection's state machine with arbitrary
// segments: no panic, exclusive step-5 flags, at most 10000 unACKed ranges,
// and the fast unackedEnds queue always agrees with a plain list.
func FuzzTCPAnalysis(f *testing.F) {
	for _, name := range []string{"loss_sender.pcap", "reorder_receiver.pcap", "zero_window.pcap", "dup_receiver.pcap"} {
		f.Add(segmentsOf(f, filepath.Join("testdata", "pcap", name), 300))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newTCPConn()
		var ref [2]referenceUnacked
		now := uint64(1_700_000_000_000_000_000)
		for len(data) >= fuzzSegmentSize {
			b := data[:fuzzSegmentSize]
			data = data[fuzzSegmentSize:]
			dir := int(b[0] >> 7)
			s := tcpSegment{
				flags:  b[0] & 0x17,
				seq:    binary.BigEndian.Uint32(b[1:]),
				ack:    binary.BigEndian.Uint32(b[5:]),
				seglen: uint32(binary.BigEndian.Uint16(b[9:])),
				window: binary.BigEndian.Uint16(b[11:]),
			}
			now += uint64(binary.BigEndian.Uint16(b[13:])) * 1000
			before := c.dir[dir].unacked.len()
			flags := c.analyze(dir, &s, now)
			exclusive := flags & (flagRetransmission | flagFastRetransmission | flagSpuriousRetransmission | flagOutOfOrder)
			if exclusive&(exclusive-1) != 0 {
				t.Fatalf("flags %b: more than one of step 5", flags)
			}
			if flags&flagZeroWindowProbe != 0 && flags&flagZeroWindow != 0 {
				t.Fatal("a zero-window probe is never also a zero window")
			}
			if s.seglen > 0 || s.flags&(tcpSYN|tcpFIN) != 0 {
				if before < 10000 {
					ref[dir].push(c.dir[dir].unacked.s[len(c.dir[dir].unacked.s)-1])
				}
			}
			ref[1-dir].ack(s.ack)
			for d := range 2 {
				if got, want := c.dir[d].unacked.len(), len(ref[d]); got != want || got > 10000 {
					t.Fatalf("direction %d: %d unACKed ranges, reference %d", d, got, want)
				}
			}
		}
	})
}

// referenceUnacked is the list of docs/pcap-metrics.md §6 step 6, done the
// obvious way.
type referenceUnacked []uint32

func (r *referenceUnacked) push(end uint32) { *r = append(*r, end) }

func (r *referenceUnacked) ack(ack uint32) {
	kept := (*r)[:0]
	for _, e := range *r {
		if seqGT(e, ack) {
			kept = append(kept, e)
		}
	}
	*r = kept
}

// TestUnackedEndsMatchesReference replays orderly and wrapping sequences
// through both implementations; the fuzzer covers arbitrary ones.
func TestUnackedEndsMatchesReference(t *testing.T) {
	var u unackedEnds
	var ref referenceUnacked
	seq := uint32(0xffff0000) // wraps past 2^32
	step := func(end, ack uint32) {
		u.push(end)
		ref.push(end)
		u.ack(ack)
		ref.ack(ack)
		if u.len() != len(ref) {
			t.Fatalf("after end %d ack %d: %d ranges, reference %d", end, ack, u.len(), len(ref))
		}
	}
	for i := range 50000 {
		seq += 1448
		ack := seq - 20*1448
		switch i % 97 {
		case 13:
			step(seq-30*1448, ack) // a retransmission of older data
		case 50:
			step(seq, seq+1<<31) // an ACK from far away
		default:
			step(seq, ack)
		}
	}
}
