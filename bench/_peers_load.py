"""The load generator of bench/peers.py: one publisher or one subscriber process, any protocol.

    python bench/_peers_load.py pub --proto ges|mqtt|nats --port P [--events N] [--batch B]
                                    [--rate R] [--reliable] [--window W] [--topology NAME]
    python bench/_peers_load.py sub --proto ges|mqtt|nats --port P [--clients N] [--expect E]
                                    [--latency] [--reliable] [--window W] [--topology NAME]

The same structure for every protocol (the codecs are in ``_peers_proto.py``), on blocking
sockets with TCP_NODELAY:

**pub** connects, encodes every publish frame of the run beforehand (one event per frame;
``--batch B``: B events per GES Publish), prints ``ready``, then sends *probes* (events stamped
0) every 20 ms until a ``go`` line on stdin — the harness sends it once the subscriber has a
probe. Then it writes the frames back to back in writes of about 64 KiB (many frames per
write), at most ``--window`` frames unacknowledged where the broker acknowledges them: GES
always (its PubAck is its publishers' flow control; ``--window 0``: none), MQTT (PUBACK) and
JetStream with ``--reliable``; MQTT QoS 0 and core NATS have no acknowledgement and no window.
A reader thread reads the acknowledgements and answers PINGs. With ``--rate
R`` single events are sent paced at R per second instead, each encoded when it is sent with
``time.monotonic_ns()`` in its payload. At the end it waits for the last acknowledgement (core
NATS: a PING's PONG; MQTT QoS 0: nothing to wait for) and prints one JSON object: seconds to
write, seconds until acknowledged, CPU seconds (``os.times``, from ``go`` on).

**sub** connects ``--clients`` connections, subscribes each (waiting for the broker's answer;
``--reliable``: MQTT QoS 1 on a persistent session, a JetStream push consumer), prints
``ready``, and reads them all with ``selectors``. It prints ``probed`` once every connection has
a probe, then counts events until each has ``--expect`` (or nothing came for ``--idle``
seconds, or ``--timeout`` passed) and prints one JSON object: per connection the count, the
first and last receive times (``time.monotonic_ns``) and the events in the first read; with
``--latency`` every event's receive time minus its send stamp, in arrival order. MQTT QoS 1
deliveries get their PUBACKs, JetStream's the ack of the last event of each read (``ack_policy:
all``), a GES connection a Heartbeat every 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import socket
import sys
import threading
import time

import _peers_proto as p

from ges.wire import encode
from ges.wire import messages as m

CHUNK_BYTES = 64 * 1024
PROBE_EVERY = 0.02
ACK_TIMEOUT = 120.0
GES_HEARTBEAT = 5.0


def cpu_now() -> float:
    t = os.times()
    return t.user + t.system


def emit(result: dict) -> None:
    sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
    sys.stdout.flush()


# -- publisher -------------------------------------------------------------------------------


class Publisher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        proto, reliable = args.proto, args.reliable
        client_id = f"peers-pub-{os.getpid()}"
        if proto == "ges":
            self.sock, self.parser = p.handshake_ges(args.host, args.port, args.topology, client_id)
        elif proto == "mqtt":
            self.sock, self.parser = p.handshake_mqtt(args.host, args.port, client_id)
        else:
            self.sock, self.parser = p.handshake_nats(
                args.host, args.port, p.NatsParser(ack_sid=b"2")
            )
            if reliable:
                p.nats_flush(self.sock, self.parser, f"SUB {p.PUB_INBOX} 2\r\n".encode())
        self.sock.settimeout(None)
        #: does the broker acknowledge each publish frame?
        self.acked_frames = proto == "ges" or reliable
        self.lock = threading.Lock()  # one writer at a time on the socket
        self.cond = threading.Condition()
        self.acked = 0
        self.pongs = self.parser.pongs if proto == "nats" else 0
        self.error: str | None = None
        self.closed = False
        self.go = threading.Event()

    # frames ----------------------------------------------------------------------------------

    def frame(self, i: int, stamp: int) -> bytes:
        """Frame ``i`` of the run (events ``i * batch`` onwards)."""
        args = self.args
        if args.proto == "ges":
            first = i * args.batch
            count = min(args.batch, args.events - first)
            return p.ges_frame(i + 1, first, count, stamp)
        if args.proto == "mqtt":
            return p.mqtt_frame(stamp, i, 1 if args.reliable else 0, i % 65535 + 1)
        return p.nats_frame(stamp, i, p.PUB_INBOX if args.reliable else "")

    def probe(self, j: int) -> bytes:
        args = self.args
        if args.proto == "ges":
            return p.ges_frame(1_000_000_000 + j, 0, 1, 0)
        if args.proto == "mqtt":
            return p.mqtt_frame(0, 0, 1 if args.reliable else 0, j % 65535 + 1)
        return p.nats_frame(0)  # no reply subject: JetStream stores it but sends no ack

    def probe_acked(self) -> bool:
        return self.args.proto == "ges" or (self.args.proto == "mqtt" and self.args.reliable)

    # threads ---------------------------------------------------------------------------------

    def reader(self) -> None:
        parser, sock = self.parser, self.sock
        try:
            while True:
                data = sock.recv(p.READ_SIZE)
                if not data:
                    break
                parser.feed(data, 0)
                if parser.replies:
                    out = b"".join(parser.replies)
                    parser.replies.clear()
                    with self.lock:
                        sock.sendall(out)
                with self.cond:
                    self.acked = parser.acks
                    self.pongs = getattr(parser, "pongs", 0)
                    if parser.error and not self.error:
                        self.error = parser.error
                    self.cond.notify_all()
        except OSError as exc:
            with self.cond:
                self.error = self.error or f"publisher connection: {exc}"
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def stdin_reader(self) -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                self.go.set()
                return
        self.go.set()  # the harness went away: finish quickly

    def send(self, data) -> None:
        with self.lock:
            self.sock.sendall(data)

    def wait_for(self, predicate, timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                if self.error or self.closed:
                    self.error = self.error or f"connection closed while waiting for {what}"
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    self.error = f"no {what} within {timeout:g}s"
                    return False
                self.cond.wait(min(left, 1.0))
        return True

    # the run ---------------------------------------------------------------------------------

    def run(self) -> dict:
        args = self.args
        frames = -(-args.events // args.batch)
        blob = offsets = None
        if not args.rate:  # everything encoded before the run
            stamp = time.monotonic_ns()
            parts = [self.frame(i, stamp) for i in range(frames)]
            offsets = [0]
            for part in parts:
                offsets.append(offsets[-1] + len(part))
            blob = memoryview(b"".join(parts))
            del parts
        threading.Thread(target=self.reader, daemon=True).start()
        threading.Thread(target=self.stdin_reader, daemon=True).start()
        print("ready", flush=True)
        probes = 0
        while not self.go.wait(PROBE_EVERY):
            self.send(self.probe(probes))
            probes += 1
            if self.error:
                break
        base = 0
        if self.probe_acked() and not self.wait_for(
            lambda: self.acked >= probes, ACK_TIMEOUT, "acknowledgement of the probes"
        ):
            return self.result(frames, probes, None, None, 0.0)
        with self.cond:
            base = self.acked
        cpu0 = cpu_now()
        t0 = time.perf_counter()
        if args.rate:
            self.paced(frames, t0)
        else:
            self.pipelined(frames, blob, offsets, base)
        written = time.perf_counter() - t0
        done = None
        if self.acked_frames:
            ok = self.wait_for(lambda: self.acked - base >= frames, ACK_TIMEOUT, "last ack")
        elif args.proto == "nats":
            with self.cond:
                pongs = self.pongs
            self.send(b"PING\r\n")
            ok = self.wait_for(lambda: self.pongs > pongs, ACK_TIMEOUT, "PONG after the run")
        else:
            ok = True
        if ok:
            done = time.perf_counter() - t0
        return self.result(frames, probes, written, done, cpu_now() - cpu0, base)

    def pipelined(self, frames: int, blob: memoryview, offsets: list[int], base: int) -> None:
        # GES acknowledges every publish, and its publishers keep a window (ges.client: 16
        # frames); MQTT QoS 0 and core NATS acknowledge nothing: back to back, no window
        window = self.args.window if self.acked_frames else 0
        per_write = max(1, CHUNK_BYTES // max(1, offsets[1] - offsets[0]))
        sent = 0
        while sent < frames:
            limit = frames
            if window:
                with self.cond:
                    while self.acked - base + window <= sent:
                        if self.error or self.closed:
                            return
                        self.cond.wait(1.0)
                    limit = self.acked - base + window
            stop = min(limit, sent + per_write, frames)
            self.send(blob[offsets[sent] : offsets[stop]])
            sent = stop
            if self.error:
                return

    def paced(self, frames: int, t0: float) -> None:
        rate, frame, send = self.args.rate, self.frame, self.send
        for i in range(frames):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            send(frame(i, time.monotonic_ns()))
            if self.error:
                return

    def result(self, frames, probes, written, done, cpu, base=0) -> dict:
        with self.cond:
            acked = self.acked - base
        return {
            "proto": self.args.proto,
            "events": self.args.events,
            "frames": frames,
            "probes": probes,
            "acked_frames": acked if self.acked_frames else None,
            "write_seconds": written,
            "done_seconds": done,
            "cpu_seconds": cpu,
            "error": self.error,
        }


# -- subscriber ------------------------------------------------------------------------------


class Conn:
    def __init__(self, sock: socket.socket, parser) -> None:
        self.sock = sock
        self.parser = parser
        self.count = 0
        self.first_ns: int | None = None
        self.first_n = 0
        self.last_ns: int | None = None
        self.error: str | None = None
        self.probed = False
        self.done = False
        #: socket reads (with the count: events per read, how much the broker's writes batch)
        self.reads = 0

    def as_json(self, latency: bool) -> dict:
        out = {
            "count": self.count,
            "first_ns": self.first_ns,
            "first_n": self.first_n,
            "last_ns": self.last_ns,
            "probes": self.parser.probes,
            "disorder": self.parser.disorder,
            "reads": self.reads,
            "error": self.error,
        }
        if latency:
            out["latencies_ns"] = self.parser.latencies
        return out


def open_subscriber(args: argparse.Namespace, i: int) -> Conn:
    client_id = f"peers-sub-{os.getpid()}-{i}"
    if args.proto == "ges":
        sock, parser = p.handshake_ges(args.host, args.port, args.topology, client_id)
        p.subscribe_ges(sock, parser)
    elif args.proto == "mqtt":
        sock, parser = p.handshake_mqtt(args.host, args.port, client_id, clean=not args.reliable)
        p.subscribe_mqtt(sock, parser, 1 if args.reliable else 0)
    else:
        sock, parser = p.handshake_nats(args.host, args.port, p.NatsParser(js_ack=args.reliable))
        p.subscribe_nats(
            sock, parser, jetstream=args.reliable, window=args.window, tag=f"{os.getpid()}.{i}"
        )
    parser.latency = args.latency
    sock.settimeout(None)
    return Conn(sock, parser)


def subscribe_run(args: argparse.Namespace) -> dict:
    conns = [open_subscriber(args, i) for i in range(args.clients)]
    selector = selectors.DefaultSelector()
    for c in conns:
        selector.register(c.sock, selectors.EVENT_READ, c)
    print("ready", flush=True)
    expect, idle = args.expect, args.idle
    open_count = finished = probed = 0
    open_count = len(conns)
    started = last_activity = time.monotonic()
    next_heartbeat = started + GES_HEARTBEAT
    heartbeat = encode(m.Heartbeat())
    cpu0 = None
    clock = time.monotonic_ns
    while finished < len(conns) and open_count:
        for key, _mask in selector.select(timeout=0.1):
            c = key.data
            try:
                data = c.sock.recv(p.READ_SIZE)
            except OSError as exc:
                data, c.error = b"", f"connection: {exc}"
            now = clock()
            if not data:
                c.error = c.error or "closed by the broker"
                selector.unregister(c.sock)
                open_count -= 1
                continue
            c.reads += 1
            parser = c.parser
            n = parser.feed(data, now)
            if parser.replies:
                c.sock.sendall(b"".join(parser.replies))
                parser.replies.clear()
            if parser.error and not c.error:
                c.error = parser.error
            if n:
                if c.first_ns is None:
                    c.first_ns, c.first_n = now, n
                c.last_ns = now
                c.count += n
                last_activity = time.monotonic()
                if c.count >= expect and not c.done:
                    c.done = True
                    finished += 1
            if not c.probed and parser.probes:
                c.probed = True
                probed += 1
                if probed == len(conns):
                    print("probed", flush=True)
                    cpu0 = cpu_now()
                    last_activity = time.monotonic()
        mono = time.monotonic()
        if args.proto == "ges" and mono >= next_heartbeat:
            for c in conns:
                with contextlib.suppress(OSError):
                    c.sock.sendall(heartbeat)
            next_heartbeat = mono + GES_HEARTBEAT
        if cpu0 is not None and mono - last_activity > idle:
            break
        if mono - started > args.timeout:
            break
    cpu = cpu_now() - cpu0 if cpu0 is not None else 0.0
    for c in conns:
        c.sock.close()
    return {
        "proto": args.proto,
        "cpu_seconds": cpu,
        "probed": probed == len(conns),
        "clients": [c.as_json(args.latency) for c in conns],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("pub", "sub"))
    parser.add_argument("--proto", choices=("ges", "mqtt", "nats"), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--topology", default="", help="GES: the topology's name (Hello)")
    parser.add_argument("--events", type=int, default=0, help="pub: events to publish")
    parser.add_argument("--batch", type=int, default=1, help="pub: events per GES Publish")
    parser.add_argument("--rate", type=float, default=0.0, help="pub: events/s, paced (latency)")
    parser.add_argument("--reliable", action="store_true", help="QoS 1 / JetStream / PubAcks")
    parser.add_argument(
        "--window", type=int, default=1000, help="unacknowledged frames at most (0: no limit)"
    )
    parser.add_argument("--clients", type=int, default=1, help="sub: connections")
    parser.add_argument("--expect", type=int, default=0, help="sub: events per connection")
    parser.add_argument("--latency", action="store_true", help="sub: report every latency")
    parser.add_argument("--idle", type=float, default=10.0, help="sub: give up after S idle")
    parser.add_argument("--timeout", type=float, default=600.0, help="sub: give up after S")
    args = parser.parse_args()
    if args.batch > 1 and args.proto != "ges":
        parser.error("--batch: only GES carries more than one event per frame")
    try:
        result = Publisher(args).run() if args.role == "pub" else subscribe_run(args)
    except (OSError, p.ProtocolFailure) as exc:
        sys.exit(f"{args.role} ({args.proto}): {exc}")
    except KeyboardInterrupt:
        sys.exit(130)
    emit(result)


if __name__ == "__main__":
    main()
