#!/bin/bash
# make_big_pcap.sh [MB] - makes the benchmark capture (default about 300 MB) of
# real kernel TCP between two network namespaces joined by impair_bridge.py
# (0.5 % loss, some reordering), captured at the client with tcpdump,
# in .cache/pcap/big.pcap, and tshark's metrics for it in big.tshark.json
# next to it. Not committed: run it once before `go test -bench Pcap`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/pcap_netns.sh
. "$ROOT/scripts/pcap_netns.sh"
MB=${1:-300}
# Under full load on a small machine tcpdump may drop a few packets; that
# does not matter for a benchmark, which compares with tshark on the same file.
ALLOW_DROPS=1
OUT=$ROOT/.cache/pcap
mkdir -p "$OUT"
CONNS=6
PER_CONN=$((MB * 1000000 / CONNS / 2))
[ $PER_CONN -le $((64 << 20)) ] || { echo "at most $((2 * CONNS * 64)) MB" >&2; exit 2; }

netns_up
bridge_up delay=2,loss=0.5,reorder=0.5,reorderdelay=2 delay=2,loss=0.5
capture_start $C "$WORK/big.pcap" tcpdump -i tap0 tcp
# half uploads, half downloads, in parallel connections
server_start --mode sink --addr 198.18.0.2 --port 5001 --conns $CONNS --max-seconds 110
SINK=$SRV
ip netns exec $S "${TRAFFIC[@]}" server --mode source --addr 198.18.0.2 --port 5002 --bytes $PER_CONN --conns $CONNS --max-seconds 110 &
SOURCE=$!
wait_for 10 listening $S 5002
client --mode upload --addr 198.18.0.2 --port 5001 --bytes $PER_CONN --conns $CONNS --stagger 0.2 --max-seconds 110 &
UP=$!
client --mode download --addr 198.18.0.2 --port 5002 --conns $CONNS --stagger 0.2 --max-seconds 110
wait "$UP"
wait "$SINK" || true
wait "$SOURCE" || true
capture_stop tcpdump
bridge_stop
cleanup
mv "$WORK/big.pcap" "$OUT/big.pcap"
echo "tshark on $(du -h "$OUT/big.pcap" | cut -f1)..." >&2
time "$SCRIPTS/tshark_metrics.sh" "$OUT/big.pcap" >"$OUT/big.tshark.json"
cat "$OUT/big.tshark.json"
