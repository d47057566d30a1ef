#!/usr/bin/env python3
"""tcp_traffic.py - bounded TCP conversations for test captures.

One end of a conversation per process: run the server in one network
namespace and the client in the other, and capture what the kernel sends.

  tcp_traffic.py server --mode MODE --addr ADDR --port PORT [options]
  tcp_traffic.py client --mode MODE --addr ADDR --port PORT [options]

server modes (each accepted connection; the server exits after --conns):
  sink       read until the client closes
  source     send --bytes, close the sending side, read until the client closes
  slowsink   read --chunk bytes every --sleep seconds: with a small --rcvbuf
             the receive window fills and the server advertises zero windows
  rstunread  read --chunk bytes, wait --sleep, close with data still unread:
             the kernel answers with a RST
  linger0    read --chunk bytes, wait --sleep, close with SO_LINGER 0 (RST)

client modes (--conns connections in parallel, started --stagger apart):
  upload     send --bytes, close the sending side, read until the server closes
  download   read until the server closes
  refused    connect to a port nobody listens on: the SYN is answered by a
             RST; --conns attempts one after the other
  linger0    send --bytes, wait --sleep, close with SO_LINGER 0 (RST)

Everything is bounded: --bytes is at most 64 MiB, --conns at most 64, and
no process outlives --max-seconds. A connection reset is an outcome the
modes above provoke and is only reported; any other failure (a timeout, a
refused connection outside refused mode) makes the exit status 1. The
process talks to ADDR only.
"""
import argparse
import random
import socket
import struct
import sys
import threading
import time

MAX_BYTES = 64 << 20
MAX_CONNS = 64
BLOCK = random.Random(0).randbytes(1 << 16)  # the payload, repeated

SERVER_MODES = ("sink", "source", "slowsink", "rstunread", "linger0")
CLIENT_MODES = ("upload", "download", "refused", "linger0")


class Run:
    """The options plus the run's deadline and its failures."""

    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.max_seconds
        self.failures = []
        self.lock = threading.Lock()

    def left(self):
        return max(0.01, self.deadline - time.monotonic())

    def fail(self, what, err):
        with self.lock:
            self.failures.append("%s: %s" % (what, err))

    def new_socket(self):
        s = socket.socket(socket.AF_INET6 if ":" in self.args.addr else socket.AF_INET, socket.SOCK_STREAM)
        if self.args.congestion:
            # Fixed per socket: captures should not depend on the host's default.
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, self.args.congestion.encode())
        return s


def send_bytes(run, sock, n):
    sock.settimeout(run.left())
    while n > 0:
        part = BLOCK[: min(n, len(BLOCK))]
        sock.sendall(part)
        n -= len(part)


def read_to_end(run, sock, chunk=1 << 16, pause=0.0):
    """Reads until EOF; with pause, one recv of chunk bytes per pause seconds."""
    got = 0
    while True:
        sock.settimeout(run.left())
        data = sock.recv(chunk)
        if not data:
            return got
        got += len(data)
        if pause:
            time.sleep(min(pause, run.left()))


def abort(sock):
    """Closes with SO_LINGER 0: the kernel discards what is queued and sends RST."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def serve_one(run, conn, peer):
    a = run.args
    try:
        if a.mode == "sink":
            read_to_end(run, conn)
        elif a.mode == "source":
            send_bytes(run, conn, a.bytes)
            conn.shutdown(socket.SHUT_WR)
            read_to_end(run, conn)
        elif a.mode == "slowsink":
            read_to_end(run, conn, a.chunk, a.sleep)
        elif a.mode in ("rstunread", "linger0"):
            conn.settimeout(run.left())
            conn.recv(a.chunk)
            time.sleep(min(a.sleep, run.left()))
            if a.mode == "linger0":
                abort(conn)
    except ConnectionResetError as e:
        sys.stderr.write("server %s: %s\n" % (peer, e))
    except OSError as e:
        run.fail("server %s" % (peer,), e)
    finally:
        conn.close()


def server(run):
    a = run.args
    ls = run.new_socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if a.rcvbuf:
        # Set on the listener so that accepted sockets inherit it before the
        # handshake, where the window scale is chosen.
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, a.rcvbuf)
    ls.bind((a.addr, a.port))
    ls.listen(MAX_CONNS)
    workers = []
    while len(workers) < a.conns and time.monotonic() < run.deadline:
        ls.settimeout(min(0.5, run.left()))
        try:
            conn, peer = ls.accept()
        except socket.timeout:
            continue
        w = threading.Thread(target=serve_one, args=(run, conn, peer[:2]), daemon=True)
        w.start()
        workers.append(w)
    ls.close()
    if len(workers) < a.conns:
        run.fail("server", "%d of %d connections accepted before --max-seconds" % (len(workers), a.conns))
    return workers


def client_one(run, i):
    a = run.args
    s = run.new_socket()
    try:
        s.settimeout(run.left())
        s.connect((a.addr, a.port))
        if a.mode == "refused":
            run.fail("client %d" % i, "connected, but a refusal was expected")
        elif a.mode == "upload":
            send_bytes(run, s, a.bytes)
            s.shutdown(socket.SHUT_WR)
            read_to_end(run, s)
        elif a.mode == "download":
            read_to_end(run, s)
        elif a.mode == "linger0":
            send_bytes(run, s, a.bytes)
            time.sleep(min(a.sleep, run.left()))
            abort(s)
    except ConnectionRefusedError as e:
        if a.mode != "refused":
            run.fail("client %d" % i, e)
    except (ConnectionResetError, BrokenPipeError) as e:
        sys.stderr.write("client %d: %s\n" % (i, e))
    except OSError as e:
        run.fail("client %d" % i, e)
    finally:
        s.close()


def client(run):
    a = run.args
    if a.mode == "refused":
        for i in range(a.conns):
            client_one(run, i)
        return []
    workers = []
    for i in range(a.conns):
        if i and a.stagger:
            time.sleep(min(a.stagger, run.left()))
        w = threading.Thread(target=client_one, args=(run, i), daemon=True)
        w.start()
        workers.append(w)
    return workers


def main():
    ap = argparse.ArgumentParser(description="Bounded TCP server or client for test captures.")
    ap.add_argument("role", choices=("server", "client"))
    ap.add_argument("--mode", required=True)
    ap.add_argument("--addr", required=True, help="the server's address (IPv4 or IPv6)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, default=0, help="bytes to send per connection")
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=4096, help="bytes per read in slowsink, rstunread, linger0")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds to wait, see the modes")
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between client connections")
    ap.add_argument("--rcvbuf", type=int, default=0, help="server SO_RCVBUF (0: the kernel's default)")
    ap.add_argument("--congestion", default="cubic", help="TCP congestion control ('': the namespace's default)")
    ap.add_argument("--max-seconds", type=float, default=30.0)
    a = ap.parse_args()
    modes = SERVER_MODES if a.role == "server" else CLIENT_MODES
    if a.mode not in modes:
        ap.error("%s modes: %s" % (a.role, ", ".join(modes)))
    if not 0 <= a.bytes <= MAX_BYTES:
        ap.error("--bytes must be in [0, %d]" % MAX_BYTES)
    if not 1 <= a.conns <= MAX_CONNS:
        ap.error("--conns must be in [1, %d]" % MAX_CONNS)
    if not 0 < a.max_seconds <= 600:
        ap.error("--max-seconds must be in (0, 600]")

    run = Run(a)
    try:
        workers = (server if a.role == "server" else client)(run)
    except OSError as e:
        run.fail(a.role, e)
        workers = []
    for w in workers:
        w.join(run.left())
        if w.is_alive():
            run.fail(a.role, "a connection was still open at --max-seconds")
    for f in run.failures:
        sys.stderr.write("tcp_traffic %s\n" % f)
    sys.exit(1 if run.failures else 0)


if __name__ == "__main__":
    main()
