#!/bin/bash
# tshark_metrics.sh FILE - the nine metrics of a network-metrics message for
# one capture, computed from tshark's own TCP analysis instead of playwatch's,
# printed as a single JSON object with the message's field names. The tests
# and scripts/make_pcap_fixtures.sh use it as the independent reference. Which
# tshark fields each metric comes from: docs/pcap-metrics.md §1 (the metrics)
# and docs/pcap-metrics.md §11 (this script).
#
# tshark reads the file once. It runs with an empty configuration directory,
# so a personal Wireshark profile cannot change the analysis, and with the
# three TCP preferences the analyzer follows pinned on the command line.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 CAPTURE" >&2; exit 2; }
[ -r "$1" ] || { echo "$0: cannot read $1" >&2; exit 1; }

WIRESHARK_CONFIG_DIR=$(mktemp -d)
export WIRESHARK_CONFIG_DIR
trap 'rm -rf "$WIRESHARK_CONFIG_DIR"' EXIT

# One tab-separated line per frame. occurrence=l takes the innermost value
# of a field that appears more than once (the inner header of IP in IP).
frames() {
	tshark -n -r "$1" \
		-o tcp.analyze_sequence_numbers:TRUE \
		-o tcp.relative_sequence_numbers:TRUE \
		-o tcp.fastrt_supersedes_ooo:TRUE \
		-T fields -E separator=/t -E occurrence=l -E quote=n \
		-e frame.len -e frame.protocols -e frame.time_relative \
		-e tcp.stream -e tcp.len -e tcp.srcport \
		-e ip.src -e ipv6.src \
		-e tcp.flags.syn -e tcp.flags.ack -e tcp.flags.reset \
		-e tcp.seq_raw -e tcp.ack_raw \
		-e tcp.analysis.retransmission -e tcp.analysis.spurious_retransmission \
		-e tcp.analysis.out_of_order -e tcp.analysis.zero_window
}

# Column numbers of the fields above, for the aggregation.
summarize() {
	awk -F'\t' '
	BEGIN {
		LEN = 1; PROTOS = 2; TIME = 3; STREAM = 4; TCPLEN = 5; SPORT = 6
		IP4SRC = 7; IP6SRC = 8; SYN = 9; ACK = 10; RST = 11; SEQ = 12; ACKNO = 13
		RETR = 14; SPUR = 15; OOO = 16; ZWIN = 17
	}
	function set(v) { return v == "1" || v == "True" }
	# sender: the (address, port) that sent the frame. The address is that
	# of the last IP header before TCP, as the analyzer keys connections.
	function sender(   n, p, i, v6) {
		n = split($PROTOS, p, ":")
		for (i = 1; i <= n && p[i] != "tcp"; i++) {
			if (p[i] == "ip") v6 = 0
			else if (p[i] == "ipv6") v6 = 1
		}
		return (v6 ? $IP6SRC : $IP4SRC) " " $SPORT
	}
	{ wire += $LEN }
	# Only frames whose TCP header tshark analysed; TCP quoted inside an
	# ICMP error counts in the wire bytes only.
	$STREAM == "" || $PROTOS !~ /(^|:)tcp(:|$)/ || $PROTOS ~ /(^|:)icmp(v6)?(:|$)/ { next }
	{
		payload += $TCPLEN
		if ($SPUR != "") spurious++
		else if ($RETR != "") retrans++
		if ($OOO != "") ooo++
		if ($ZWIN != "") zwin++
		if (set($RST)) resets++

		# Handshake: the first SYN of each stream, then the first SYN-ACK
		# from the other end that acknowledges exactly that SYN.
		s = $STREAM
		if (set($SYN) && !set($ACK)) {
			if (!(s in synTime)) {
				synTime[s] = $TIME; synFrom[s] = sender(); synSeq[s] = $SEQ
			}
		} else if (set($SYN) && set($ACK) && (s in synTime) && !(s in sampled) &&
			sender() != synFrom[s] && $ACKNO == (synSeq[s] + 1) % 4294967296) {
			sampled[s] = 1
			samples++
			rttSum += $TIME - synTime[s]
		}
	}
	END {
		rtt = samples ? sprintf("%.6f", rttSum * 1000 / samples) : "null"
		ratio = NR ? sprintf("%.9f", (wire - payload) / wire) : "null"
		printf "{\"rtt_handshake\": %s, \"retransmission_count\": %.0f, \"out_of_order_count\": %.0f, ", rtt, retrans, ooo
		printf "\"spurious_retransmission_count\": %.0f, \"zero_window_count\": %.0f, \"tcp_reset_count\": %.0f, ", spurious, zwin, resets
		printf "\"bytes_transferred_total\": %.0f, \"bytes_payload_total\": %.0f, \"overhead_ratio\": %s}\n", wire, payload, ratio
	}'
}

# tshark's own complaints are shown only when it fails (it warns on every
# run as root); pipefail turns its failure into this script's, so a file it
# cannot read never prints zeros as if it were an empty capture.
frames "$1" 2>"$WIRESHARK_CONFIG_DIR/stderr" | summarize || {
	grep -v '^Running as user' "$WIRESHARK_CONFIG_DIR/stderr" >&2
	echo "$0: tshark could not analyse $1" >&2
	exit 1
}
