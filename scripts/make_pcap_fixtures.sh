#!/bin/bash
# make_pcap_fixtures.sh [NAME...] - remakes the real-TCP captures in
# testdata/pcap/ (all of them, or only the NAMEs given) and, for each, the
# golden file NAME.tshark.json that scripts/tshark_metrics.sh prints for it.
# PCAP_FIXTURES_DIR writes them elsewhere (to try a change without touching
# the committed files).
# Runs as root: kernel TCP between two network namespaces joined by
# impair_bridge.py (scripts/pcap_netns.sh, docs/pcap-metrics.md §12). Kernel
# timing differs between runs, so a remade capture has new numbers; its
# golden file is remade with it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/pcap_netns.sh
. "$ROOT/scripts/pcap_netns.sh"
OUT=${PCAP_FIXTURES_DIR:-$ROOT/testdata/pcap}
mkdir -p "$OUT"

V4=198.18.0.2
V6=fd00:5eed::2

upload() { # BYTES [ADDR]
	server_start --mode sink --addr "${2:-$V4}" --port 5001 --max-seconds 60
	client --mode upload --addr "${2:-$V4}" --port 5001 --bytes "$1" --max-seconds 60
	server_wait
}

download() { # BYTES [CONNS]
	server_start --mode source --addr $V4 --port 5002 --bytes "$1" --conns "${2:-1}" --max-seconds 60
	client --mode download --addr $V4 --port 5002 --conns "${2:-1}" --stagger 0.05 --max-seconds 60
	server_wait
}

# fixture NAME TO_SERVER TO_CLIENT CAPTURE_NS TOOL CAPTURE_ARGS -- COMMAND...
fixture() {
	local name=$1 to_server=$2 to_client=$3 ns=$4 tool=$5; shift 5
	local capargs=()
	while [ "$1" != -- ]; do capargs+=("$1"); shift; done
	shift
	local ext=pcap mirror=""
	[ "$tool" = dumpcap ] && ext=pcapng
	[ "$ns" = "$M" ] && mirror=100
	echo "== $name" >&2
	netns_up ${mirror:+mirror}
	bridge_up "$to_server" "$to_client" $mirror
	capture_start "$ns" "$WORK/$name.$ext" "$tool" "${capargs[@]}"
	"$@"
	capture_stop "$tool"
	bridge_stop
	cleanup
	cp "$WORK/$name.$ext" "$OUT/$name.$ext"
	"$SCRIPTS/tshark_metrics.sh" "$OUT/$name.$ext" >"$OUT/$name.tshark.json"
	cat "$OUT/$name.tshark.json" >&2
}

resets() {
	# a SYN answered by RST/ACK
	client --mode refused --addr $V4 --port 5999 --max-seconds 10
	# the server closes with unread data queued: the kernel sends RST
	server_start --mode rstunread --addr $V4 --port 5003 --chunk 2000 --sleep 0.2 --max-seconds 20
	client --mode upload --addr $V4 --port 5003 --bytes 60000 --max-seconds 20
	server_wait
	# abortive close through SO_LINGER 0 by the client
	server_start --mode sink --addr $V4 --port 5004 --max-seconds 20
	client --mode linger0 --addr $V4 --port 5004 --bytes 20000 --sleep 0.2 --max-seconds 20
	server_wait
}

slow_reader() {
	server_start --mode slowsink --addr $V4 --port 5005 --rcvbuf 8192 --chunk 2048 --sleep 0.2 --max-seconds 60
	client --mode upload --addr $V4 --port 5005 --bytes 60000 --max-seconds 60
	server_wait
}

# midstream NAME: the capture starts once the connection is up, so the file
# has no handshake (and the analysis no iRTT).
midstream() {
	server_start --mode sink --addr $V4 --port 5006 --max-seconds 60
	ip netns exec $C "${TRAFFIC[@]}" client --mode upload --addr $V4 --port 5006 --bytes 200000 --max-seconds 60 &
	local cli=$!
	wait_for 10 sh -c "ip netns exec $C ss -Htn state established '( dport = :5006 )' | grep -q ."
	capture_start $C "$WORK/$1.pcap" tcpdump -i tap0 tcp
	wait "$cli" || true
	server_wait
}

all() {
	fixture clean_upload     delay=1                                 delay=1        $C tcpdump -i tap0 tcp -- upload 150000
	fixture loss_sender      delay=5,loss=4                          delay=5        $C tcpdump -i tap0 tcp -- upload 200000
	fixture loss_receiver    delay=5,loss=4                          delay=5        $S tcpdump -i tap0 tcp -- upload 200000
	fixture delay_download   delay=15                                delay=15       $C tcpdump -i tap0 tcp -- download 150000
	fixture reorder_receiver delay=3,reorder=6,reorderdelay=4        delay=3        $S tcpdump -i tap0 tcp -- upload 200000
	fixture dup_receiver     delay=3,dup=4,dupdelay=2                delay=3        $S tcpdump -i tap0 tcp -- upload 150000
	fixture zero_window      delay=1                                 delay=1        $C tcpdump -i tap0 tcp -- slow_reader
	fixture resets           delay=1                                 delay=1        $C tcpdump -i tap0 tcp -- resets
	fixture multi_conns      delay=4                                 delay=4,loss=3 $C tcpdump -i tap0 tcp -- download 50000 4
	fixture ipv6_loss        delay=3,loss=3                          delay=3        $C tcpdump -i tap0 tcp -- upload 150000 $V6
	fixture sll2_any         delay=2,loss=3                          delay=2        $C tcpdump -i any tcp -- upload 150000
	fixture sll1_any         delay=2                                 delay=2,loss=3 $S tcpdump -i any -y LINUX_SLL tcp -- download 150000
	fixture vlan_mirror      delay=2,loss=3,reorder=3,reorderdelay=3 delay=2        $M tcpdump -i tap0 -- upload 150000
	fixture pcapng_dumpcap   delay=2,loss=3,reorder=3,reorderdelay=3 delay=2        $C dumpcap -i tap0 -f tcp -- upload 150000
	fixture pcapng_mixed     delay=2,loss=3                          delay=2        $S dumpcap -i tap0 -f tcp -i any -y LINUX_SLL2 -f tcp -- upload 80000
	fixture nano_download    delay=2                                 delay=2,loss=3 $S tcpdump -i tap0 --time-stamp-precision=nano tcp -- download 150000
	fixture snaplen96        delay=2,loss=3                          delay=2        $C tcpdump -i tap0 -s 96 tcp -- upload 400000
	# 30 ms RTT at the receiver: fast retransmissions arrive later than 20 ms
	# after the duplicate ACKs, within the iRTT, so they count as out-of-order.
	fixture loss_receiver_rtt30 delay=15,loss=4                      delay=15       $S tcpdump -i tap0 tcp -- upload 200000
	midstream_fixture midstream      rate=4,qlimit=50,delay=2 delay=2
	# no iRTT: out-of-order uses the fixed 3 ms window
	midstream_fixture midstream_loss rate=4,qlimit=30,delay=1,loss=5 delay=1
}

# midstream_fixture NAME TO_SERVER TO_CLIENT
midstream_fixture() {
	echo "== $1" >&2
	netns_up
	bridge_up "$2" "$3"
	midstream "$1"
	capture_stop tcpdump
	bridge_stop
	cleanup
	cp "$WORK/$1.pcap" "$OUT/$1.pcap"
	"$SCRIPTS/tshark_metrics.sh" "$OUT/$1.pcap" >"$OUT/$1.tshark.json"
	cat "$OUT/$1.tshark.json" >&2
}

if [ $# -eq 0 ]; then
	all
else
	# run only the named fixtures: pick their lines out of all()
	for n in "$@"; do
		line=$(declare -f all | grep -E "^\s*(midstream_)?fixture $n " | sed 's/;$//') || { echo "unknown fixture $n" >&2; exit 2; }
		eval "$line"
	done
fi
ls -l "$OUT" >&2
