# shellcheck shell=bash
# pcap_netns.sh - helpers sourced by make_pcap_fixtures.sh and make_big_pcap.sh:
# two network namespaces whose TAP devices are joined by impair_bridge.py
# (the link, with its impairments), tcp_traffic.py's kernel TCP between them,
# and a capture taken in one of them (docs/pcap-metrics.md §12).
# Needs root, iproute2, tcpdump, dumpcap and python3. Every process started
# here is recorded and stopped by its PID; the namespaces are deleted on exit.

SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

C=pwpcap_c_$$
S=pwpcap_s_$$
M=pwpcap_m_$$
WORK=$(mktemp -d)

# cleanup stops the background jobs of this shell that still run (a pid of
# one already waited for may belong to another process by now) and removes
# the namespaces.
cleanup() {
	local running
	running=$(jobs -pr)
	if [ -n "$running" ]; then
		# shellcheck disable=SC2086 # one word per pid
		kill $running 2>/dev/null || true
		# shellcheck disable=SC2086
		wait $running 2>/dev/null || true
	fi
	for n in $C $S $M; do ip netns del "$n" 2>/dev/null || true; done
}
trap 'cleanup; rm -rf "$WORK"' EXIT

# wait_for TIMEOUT_S CMD... polls CMD until it succeeds (readiness, not timing).
wait_for() {
	local deadline=$((SECONDS + $1)); shift
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || { echo "timed out waiting for: $*" >&2; return 1; }
		sleep 0.05
	done
}

# netns_up [mirror]: client namespace $C (198.18.0.1, fd00:5eed::1) and server
# namespace $S (198.18.0.2, fd00:5eed::2), each with a TAP device; with
# "mirror", a third namespace $M gets a TAP device for the VLAN mirror port.
netns_up() {
	local n
	cleanup
	for n in $C $S ${1:+$M}; do
		ip netns add "$n"
		ip -n "$n" link set lo up
		ip -n "$n" tuntap add dev tap0 mode tap
	done
	ip -n $C addr add 198.18.0.1/24 dev tap0
	ip -n $C addr add fd00:5eed::1/64 dev tap0 nodad
	ip -n $S addr add 198.18.0.2/24 dev tap0
	ip -n $S addr add fd00:5eed::2/64 dev tap0 nodad
	for n in $C $S ${1:+$M}; do ip -n "$n" link set tap0 up; done
}

# bridge_up TO_SERVER TO_CLIENT [MIRROR_VID]: impair_bridge.py between the two
# TAPs, one impairment spec per direction; with MIRROR_VID, a VLAN-tagged copy
# of the server's link goes to the TAP in $M.
bridge_up() {
	local mirror=()
	[ -z "${3:-}" ] || mirror=(--mirror "$M:tap0:$3")
	rm -f "$WORK/bridge.ready"
	python3 "$SCRIPTS/impair_bridge.py" --client $C:tap0 --server $S:tap0 --to-server "$1" --to-client "$2" \
		"${mirror[@]}" --seed 7 --max-seconds 300 --ready-file "$WORK/bridge.ready" 2>"$WORK/bridge.log" &
	BRIDGE=$!
	wait_for 10 test -s "$WORK/bridge.ready"
}

# capture_start NS FILE TOOL ARGS...: TOOL is tcpdump or dumpcap; returns once
# the capture is listening.
capture_start() {
	local ns=$1 file=$2 tool=$3; shift 3
	: >"$WORK/cap.log"
	if [ "$tool" = tcpdump ]; then
		ip netns exec "$ns" tcpdump -n --immediate-mode -B 32768 -w "$file" "$@" 2>"$WORK/cap.log" &
		CAP=$!
		wait_for 10 grep -q "listening on" "$WORK/cap.log"
	else
		ip netns exec "$ns" dumpcap -q -w "$file" "$@" 2>"$WORK/cap.log" &
		CAP=$!
		wait_for 10 grep -q "Capturing on" "$WORK/cap.log"
	fi
}

# capture_stop TOOL: stops the capture and checks that the kernel dropped
# nothing (unless ALLOW_DROPS=1: a benchmark file only has to be real traffic).
capture_stop() {
	# dumpcap has no immediate mode: give it time to write what it buffered.
	if [ "$1" = dumpcap ]; then sleep 3; else sleep 0.5; fi
	kill -INT "$CAP"
	wait "$CAP" || true
	cat "$WORK/cap.log" >&2
	[ "${ALLOW_DROPS:-0}" = 1 ] && return 0
	if grep -q "dropped by kernel" "$WORK/cap.log" && ! grep -q "^0 packets dropped by kernel" "$WORK/cap.log"; then
		echo "capture dropped packets" >&2
		return 1
	fi
	if grep "Packets received/dropped" "$WORK/cap.log" | grep -vqE "': [0-9]+/0 "; then
		echo "capture dropped packets" >&2
		return 1
	fi
}

bridge_stop() {
	kill "$BRIDGE"
	wait "$BRIDGE" || true
	cat "$WORK/bridge.log" >&2
}

# listening NS PORT: true once a listener is bound to PORT in NS.
listening() {
	ip netns exec "$1" ss -Hltn "sport = :$2" | grep -q .
}

# TRAFFIC runs tcp_traffic.py, bounded by timeout too. It goes straight after
# `ip netns exec NS` (which execs it), so that $! of a background run is the
# process itself and killing it stops the Python process.
TRAFFIC=(timeout 130 python3 "$SCRIPTS/tcp_traffic.py")

# server_start ARGS...: tcp_traffic.py server in $S (pid in SRV), returns once
# it listens on --port.
server_start() {
	local port
	port=$(echo "$@" | sed -n 's/.*--port \([0-9]*\).*/\1/p')
	ip netns exec $S "${TRAFFIC[@]}" server "$@" &
	SRV=$!
	wait_for 10 listening $S "$port"
}

# client ARGS...: tcp_traffic.py client in $C, in the foreground.
client() {
	ip netns exec $C "${TRAFFIC[@]}" client "$@"
}

server_wait() {
	wait "$SRV"
}
