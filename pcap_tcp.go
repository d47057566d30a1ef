package main

// The per-connection TCP analysis: the state machine of tshark 4.0.17's
// tcp_analyze_sequence_number(), step by step (docs/pcap-metrics.md §6), and
// the handshake RTT (docs/pcap-metrics.md §8).

// tcpAnalysisFlags are the analysis flags a packet gets (docs/pcap-metrics.md §6).
type tcpAnalysisFlags uint16

const (
	flagZeroWindowProbe tcpAnalysisFlags = 1 << iota
	flagZeroWindow
	flagLostSegment
	flagKeepAlive
	flagKeepAliveAck
	flagZeroWindowProbeAck
	flagDupAck
	flagSpuriousRetransmission
	flagFastRetransmission
	flagOutOfOrder
	flagRetransmission
)

// Fixed thresholds of tshark's analysis, in ns.
const (
	tcpFastRetransmissionWindow = 20_000_000 // since the second duplicate ACK
	tcpOutOfOrderDefaultWindow  = 3_000_000  // when the connection has no iRTT yet
	tcpMaxUnacked               = 10000      // ranges kept per direction
)

// Sequence-number comparisons modulo 2^32.
func seqLT(a, b uint32) bool { return int32(a-b) < 0 }
func seqGT(a, b uint32) bool { return int32(a-b) > 0 }
func seqLE(a, b uint32) bool { return int32(a-b) <= 0 }

// tcpDirection is the state of one direction of a connection: what its
// sender has sent so far.
type tcpDirection struct {
	nextSeq         uint32
	maxSeqToBeAcked uint32
	lastAck         uint32
	window          uint32 // raw window of the last packet; 0xFFFFFFFF = none yet
	nextSeqTime     uint64
	lastAckTime     uint64
	dupAckNum       int32
	lastFlags       tcpAnalysisFlags
	finSeen         bool
	unacked         unackedEnds
}

// tcpConn is one connection: two directions, the iRTT bookkeeping of
// docs/pcap-metrics.md §6 step 7 and the handshake sample of
// docs/pcap-metrics.md §8. dir[0] is sent by the lower endpoint.
type tcpConn struct {
	dir      [2]tcpDirection
	tsMRUSyn uint64
	irtt     uint64
	lastSeen int64
	rstSeen  bool

	synSeen bool
	rttDone bool
	synDir  int
	synSeq  uint32
	synTime int64
}

func newTCPConn() *tcpConn {
	c := &tcpConn{}
	c.dir[0].window = 0xFFFFFFFF
	c.dir[1].window = 0xFFFFFFFF
	return c
}

// closed says no more data is expected: both FINs or a RST were seen.
func (c *tcpConn) closed() bool {
	return c.rstSeen || c.dir[0].finSeen && c.dir[1].finSeen
}

// analyze runs steps 1-7 of docs/pcap-metrics.md §6 for one packet sent in
// direction dir at time now (ns) and returns its flags. Once per packet, a
// measured hot loop (pcap_bench_test.go): one function over 100 lines, in the
// order of the document's steps.
func (c *tcpConn) analyze(dir int, s *tcpSegment, now uint64) tcpAnalysisFlags {
	fwd, rev := &c.dir[dir], &c.dir[1-dir]
	syn := s.flags&tcpSYN != 0
	fin := s.flags&tcpFIN != 0
	rst := s.flags&tcpRST != 0
	ackFlag := s.flags&tcpACK != 0
	synFinRst := syn || fin || rst
	seq, ack, seglen, window := s.seq, s.ack, s.seglen, uint32(s.window)
	var flags tcpAnalysisFlags

	// 1. zero-window probe; a probe skips steps 2 and 3.
	if seglen == 1 && seq == fwd.nextSeq && rev.window == 0 {
		flags |= flagZeroWindowProbe
	} else {
		// 2.
		if window == 0 && !synFinRst {
			flags |= flagZeroWindow
		}
		if fwd.nextSeq != 0 && seqGT(seq, fwd.nextSeq) && !rst {
			flags |= flagLostSegment
		}
		if seglen <= 1 && seq == fwd.nextSeq-1 && !synFinRst {
			flags |= flagKeepAlive
		}
		// 3.
		same := seglen == 0 && window == fwd.window && seq == fwd.nextSeq && ack == fwd.lastAck && !synFinRst
		switch {
		case same && window != 0 && rev.lastFlags&flagKeepAlive != 0:
			flags |= flagKeepAliveAck
		case same && window == 0 && rev.lastFlags&flagZeroWindowProbe != 0:
			flags |= flagZeroWindowProbeAck
		case same && window != 0:
			if fwd.dupAckNum == -1 {
				fwd.dupAckNum = 1
			} else {
				fwd.dupAckNum++
			}
			flags |= flagDupAck
		}
	}

	// 4.
	if ack != fwd.lastAck {
		fwd.dupAckNum = 0
	}
	if rev.maxSeqToBeAcked != 0 && seqGT(ack, rev.maxSeqToBeAcked) && ackFlag {
		if seqLT(rev.maxSeqToBeAcked, rev.nextSeq) {
			rev.maxSeqToBeAcked = rev.nextSeq
		} else {
			rev.dupAckNum = -1
		}
	}

	// 5. The four are exclusive; spurious is tested first.
	if (seglen > 0 || syn || fin) && flags&flagKeepAlive == 0 {
		notAdvanced := fwd.nextSeq != 0 && seqLT(seq, fwd.nextSeq)
		if seglen > 1 && seq == fwd.nextSeq-1 {
			notAdvanced = false
		}
		var synFin uint32
		if syn || fin {
			synFin = 1
		}
		oooWindow := c.irtt
		if oooWindow == 0 {
			oooWindow = tcpOutOfOrderDefaultWindow
		}
		switch {
		case seglen > 0 && rev.lastAck != 0 && seqLE(seq+seglen, rev.lastAck):
			flags |= flagSpuriousRetransmission
		case notAdvanced && rev.dupAckNum >= 2 && rev.lastAck == seq && now-rev.lastAckTime < tcpFastRetransmissionWindow:
			flags |= flagFastRetransmission
		case notAdvanced && now-fwd.nextSeqTime < oooWindow && fwd.nextSeq != seq+seglen+synFin:
			flags |= flagOutOfOrder
		case notAdvanced:
			flags |= flagRetransmission
		}
	}

	// 6.
	end := seq + seglen
	if (seglen > 0 || syn || fin) && fwd.unacked.len() < tcpMaxUnacked {
		if syn || fin {
			end++
		}
		fwd.unacked.push(end)
	}
	if (seqGT(end, fwd.nextSeq) || fwd.nextSeq == 0) && flags&flagZeroWindowProbe == 0 {
		fwd.nextSeq = end
		fwd.nextSeqTime = now
	}
	if (seq == fwd.maxSeqToBeAcked || fwd.maxSeqToBeAcked == 0) && flags&flagZeroWindowProbe == 0 {
		fwd.maxSeqToBeAcked = fwd.nextSeq
	}
	fwd.window = window
	fwd.lastAck = ack
	fwd.lastAckTime = now
	fwd.lastFlags = flags
	rev.unacked.ack(ack)

	// 7.
	if syn && !ackFlag {
		c.tsMRUSyn = now
	}
	if ackFlag && !syn && c.tsMRUSyn != 0 && c.irtt == 0 {
		c.irtt = now - c.tsMRUSyn
	}

	if fin {
		fwd.finSeen = true
	}
	if rst {
		c.rstSeen = true
	}
	return flags
}

// handshake keeps the connection's SYN -> SYN-ACK sample
// (docs/pcap-metrics.md §8): the first SYN, then the first SYN-ACK from its
// destination that ACKs it. Each sample is added once to *sum (ns) and *n.
func (c *tcpConn) handshake(dir int, s *tcpSegment, now int64, sum, n *int64) {
	syn := s.flags&tcpSYN != 0
	ack := s.flags&tcpACK != 0
	switch {
	case syn && !ack && !c.synSeen:
		c.synSeen, c.synDir, c.synSeq, c.synTime = true, dir, s.seq, now
	case syn && ack && c.synSeen && !c.rttDone && dir != c.synDir && s.ack == c.synSeq+1:
		c.rttDone = true
		*sum += now - c.synTime
		*n++
	}
}

// unackedEnds is the list of [start, end) ranges of docs/pcap-metrics.md §6
// step 6, reduced to what the metrics depend on: how many there are. An ACK
// drops every range whose end is not after it, whatever its start, so only
// the ends are kept, as a queue s[head:].
//
// The ends usually arrive in order. While they do (sorted) and lie within
// 2^30 of the first, the ends an ACK removes are a run at the front or the
// back of the queue, so an ACK costs what it removes; otherwise the whole
// queue is filtered, which also finds out whether it is sorted again.
type unackedEnds struct {
	s      []uint32
	head   int
	sorted bool // s[head:] is non-decreasing (mod 2^32) and spans < 2^30
}

const unackedSortedSpan = 1 << 30

func (u *unackedEnds) len() int { return len(u.s) - u.head }

func (u *unackedEnds) push(end uint32) {
	if u.len() == 0 {
		u.s, u.head, u.sorted = u.s[:0], 0, true
	} else if u.sorted {
		last := u.s[len(u.s)-1]
		u.sorted = seqLE(last, end) && end-u.s[u.head] < unackedSortedSpan
	}
	if len(u.s) == cap(u.s) && u.head > 0 {
		n := copy(u.s, u.s[u.head:])
		u.s, u.head = u.s[:n], 0
	}
	u.s = append(u.s, end)
}

// ack removes the ends that are not after ack.
func (u *unackedEnds) ack(ack uint32) {
	if u.len() == 0 {
		return
	}
	if u.sorted {
		for u.head < len(u.s) && !seqGT(u.s[u.head], ack) {
			u.head++
		}
		for len(u.s) > u.head && !seqGT(u.s[len(u.s)-1], ack) {
			u.s = u.s[:len(u.s)-1]
		}
		return
	}
	kept := u.s[:0]
	sorted := true
	for _, e := range u.s[u.head:] {
		if seqGT(e, ack) {
			if len(kept) > 0 && sorted {
				sorted = seqLE(kept[len(kept)-1], e) && e-kept[0] < unackedSortedSpan
			}
			kept = append(kept, e)
		}
	}
	u.s, u.head, u.sorted = kept, 0, sorted
}
