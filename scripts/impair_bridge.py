#!/usr/bin/env python3
"""impair_bridge.py - a two-port Ethernet bridge that impairs what it forwards.

The capture scripts need lossy, slow and reordering links between two network
namespaces, and tc netem is missing from some kernels (the one the committed
captures were made on among them). So the two namespaces each get a
TAP device, and this process is the wire between them: it carries each frame
across to the other TAP, subject to the impairments of its direction.

  impair_bridge.py --client NS:TAP --server NS:TAP
                   [--to-server SPEC] [--to-client SPEC] [--mirror NS:TAP:VLAN]
                   [--seed N] [--max-seconds S] [--ready-file PATH]

SPEC is comma-separated KEY=VALUE pairs (times in ms, shares in percent):

  delay=MS              every frame arrives MS later
  loss=PCT              PCT of the data segments are dropped
  reorder=PCT           PCT of the data segments are held back a further
  reorderdelay=MS       MS, so the frames behind them overtake them
  dup=PCT               PCT of the data segments are delivered twice, the
  dupdelay=MS           copy MS after the original
  rate=MBIT             the link carries MBIT Mbit/s; frames wait in a FIFO
  qlimit=MS             a data segment that would wait more than MS is dropped

A data segment is a TCP segment with payload and none of SYN, FIN or RST:
handshakes, closes and pure ACKs are only delayed (and queued), never lost,
so every connection has a clean handshake to time.

--mirror copies every frame that crosses the server's TAP, in either
direction, with an 802.1Q tag, to a third TAP: a switch's mirror port.

Random choices come from --seed, one stream per direction, and every data
segment draws all three of its numbers whether or not the impairment is on,
so one direction's traffic or one setting does not shift the others' choices.
Kernel timing still differs from run to run.

The process writes its PID to --ready-file once the TAPs are attached, and
stops after --max-seconds or on SIGINT/SIGTERM, printing per-direction counts
on stderr. It touches no device other than the TAPs named on its command line.
"""
import argparse
import ctypes
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000

SPEC_KEYS = ("delay", "loss", "reorder", "reorderdelay", "dup", "dupdelay", "rate", "qlimit")


def setns(fd):
    """Moves this thread into the network namespace open as fd."""
    if hasattr(os, "setns"):  # Python 3.12
        os.setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "setns: " + os.strerror(err))


def attach_tap(where):
    """Opens the existing TAP device NS:TAP from inside its namespace.

    The file descriptor keeps working after the thread returns to its own
    namespace, so one process can serve devices in several.
    """
    ns, dev = where.split(":")
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(os.path.join("/run/netns", ns), os.O_RDONLY)
    try:
        setns(target)
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR)
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TAP | IFF_NO_PI))
        finally:
            setns(home)
    finally:
        os.close(target)
        os.close(home)
    os.set_blocking(fd, False)
    return fd


def parse_spec(text):
    spec = dict.fromkeys(SPEC_KEYS, 0.0)
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in spec:
            raise ValueError("bad impairment %r (known: %s)" % (item, ", ".join(SPEC_KEYS)))
        spec[key] = float(value)
    return spec


def is_data_segment(frame):
    """True for an untagged Ethernet frame carrying TCP payload without SYN/FIN/RST."""
    if len(frame) < 14:
        return False
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype == 0x0800 and len(frame) >= 34:
        ip_len = int.from_bytes(frame[16:18], "big")
        ihl = (frame[14] & 0x0F) * 4
        tcp, proto, ip_payload = 14 + ihl, frame[23], ip_len - ihl
    elif ethertype == 0x86DD and len(frame) >= 54:
        tcp, proto, ip_payload = 54, frame[20], int.from_bytes(frame[18:20], "big")
    else:
        return False
    if proto != 6 or len(frame) < tcp + 14:
        return False
    header = (frame[tcp + 12] >> 4) * 4
    flags = frame[tcp + 13]
    return ip_payload > header and not flags & 0x07


class Direction:
    """One way through the bridge: its impairments, queue state and counts."""

    def __init__(self, name, spec, seed):
        self.name = name
        self.delay = spec["delay"] / 1e3
        self.loss = spec["loss"] / 100
        self.reorder = spec["reorder"] / 100
        self.reorder_delay = spec["reorderdelay"] / 1e3
        self.dup = spec["dup"] / 100
        self.dup_delay = spec["dupdelay"] / 1e3
        self.bytes_per_s = spec["rate"] * 1e6 / 8
        self.qlimit = spec["qlimit"] / 1e3
        self.link_free = 0.0  # when the rate-limited link has sent its queue
        self.rng = random.Random("%d/%s" % (seed, name))
        self.counts = dict.fromkeys(("frames", "data", "lost", "taildropped", "reordered", "duplicated"), 0)

    def arrivals(self, frame, now):
        """The times at which the far side gets copies of frame (none: dropped)."""
        self.counts["frames"] += 1
        data = is_data_segment(frame)
        if data:
            self.counts["data"] += 1
            lose, hold, double = self.rng.random(), self.rng.random(), self.rng.random()
            if lose < self.loss:
                self.counts["lost"] += 1
                return ()
        sent = now
        if self.bytes_per_s:
            start = max(now, self.link_free)
            if data and self.qlimit and start - now > self.qlimit:
                self.counts["taildropped"] += 1
                return ()
            self.link_free = start + len(frame) / self.bytes_per_s
            sent = self.link_free
        due = sent + self.delay
        if not data:
            return (due,)
        if hold < self.reorder:
            self.counts["reordered"] += 1
            due += self.reorder_delay
        if double < self.dup:
            self.counts["duplicated"] += 1
            return due, due + self.dup_delay
        return (due,)


class Stop(Exception):
    pass


def on_signal(signum, frame):
    raise Stop()


def vlan_tagged(frame, vid):
    return frame[:12] + struct.pack("!HH", 0x8100, vid) + frame[12:]


def main():
    ap = argparse.ArgumentParser(description="Ethernet bridge between two TAP devices that impairs what it forwards.")
    ap.add_argument("--client", required=True, metavar="NS:TAP", help="the client namespace's TAP device")
    ap.add_argument("--server", required=True, metavar="NS:TAP", help="the server namespace's TAP device")
    ap.add_argument("--to-server", default="", metavar="SPEC", help="impairments client -> server")
    ap.add_argument("--to-client", default="", metavar="SPEC", help="impairments server -> client")
    ap.add_argument("--mirror", default="", metavar="NS:TAP:VLAN", help="VLAN-tagged copy of the server link")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--ready-file", default="")
    args = ap.parse_args()
    if not 0 < args.max_seconds <= 3600:
        ap.error("--max-seconds must be in (0, 3600]")
    try:
        to_server = Direction("to-server", parse_spec(args.to_server), args.seed)
        to_client = Direction("to-client", parse_spec(args.to_client), args.seed)
    except ValueError as e:
        ap.error(str(e))

    client, server = attach_tap(args.client), attach_tap(args.server)
    mirror, vid = None, 0
    if args.mirror:
        ns, dev, vlan = args.mirror.split(":")
        mirror, vid = attach_tap(ns + ":" + dev), int(vlan) & 0x0FFF
    route = {client: (to_server, server), server: (to_client, client)}

    def put(fd, frame):
        try:
            os.write(fd, frame)
        except OSError:  # a full or downed TAP: the frame is lost, like on a wire
            pass

    def deliver(fd, frame):
        put(fd, frame)
        if mirror is not None and fd == server:
            put(mirror, vlan_tagged(frame, vid))

    pending = []  # heap of (due, sequence number, out fd, frame)
    seq = 0
    deadline = time.monotonic() + args.max_seconds
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        if args.ready_file:
            tmp = args.ready_file + ".tmp"
            with open(tmp, "w") as f:
                f.write("%d\n" % os.getpid())
            os.replace(tmp, args.ready_file)
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            wait = deadline - now
            if pending:
                wait = min(wait, max(0.0, pending[0][0] - now))
            # select, not poll or epoll: its timeout has µs resolution, and
            # the delays here are a few ms.
            readable, _, _ = select.select([client, server], [], [], wait)
            now = time.monotonic()
            for fd in readable:
                direction, out = route[fd]
                for _ in range(256):  # then let the other side and the timers run
                    try:
                        frame = os.read(fd, 65536)
                    except (BlockingIOError, InterruptedError):
                        break
                    if mirror is not None and fd == server:
                        put(mirror, vlan_tagged(frame, vid))
                    for due in direction.arrivals(frame, now):
                        seq += 1
                        heapq.heappush(pending, (due, seq, out, frame))
            now = time.monotonic()
            while pending and pending[0][0] <= now:
                _, _, out, frame = heapq.heappop(pending)
                deliver(out, frame)
    except Stop:
        pass
    for d in (to_server, to_client):
        counts = " ".join("%s=%d" % kv for kv in d.counts.items())
        sys.stderr.write("impair_bridge %s: %s\n" % (d.name, counts))
    if pending:
        sys.stderr.write("impair_bridge: %d frames still in flight at exit were not delivered\n" % len(pending))


if __name__ == "__main__":
    main()
