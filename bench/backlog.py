"""What a persistent session's backlog costs everyone else on its broker.

    python bench/backlog.py [--quick] [--json] [--events N]

One ``ges broker --insecure --delivery reliable --mqtt-port P`` (a one-broker topology whose
broker is its cluster's replicator) as its own process. A *pinger* (an MQTT 3.1.1 client of
its own, in a process of its own) sends a PINGREQ every 2 ms and times each PINGRESP: the
round trip is how long the broker's event loop made a client wait. Three phases, in one run:

1. ``idle``: the pinger alone — the baseline, measured in the same run;
2. ``held``: a persistent subscriber (clean session 0, QoS 1, ``bench/#``) connected,
   subscribed and went away; then N events (100-byte payloads, QoS 1, at most 1,000
   unacknowledged) were published and acknowledged, so its session holds N events. Two
   seconds later (the broker done with the publishing), the pinger runs as long again while
   nothing else happens (the replicator's once-a-second retention pass
   runs meanwhile);
3. ``resume``: the subscriber connects again with its client id, while the pinger runs: the
   time to its CONNACK (the session opened at the replicator), then until it has all N events
   (each acknowledged as it comes), and the pinger's round trips meanwhile.

The table gives the round trips' p50, p99 and max per phase with each phase's ratio to
``idle``; ``--json`` prints the figures as one JSON line too. Nothing here asserts a timing;
exit code 0 when the subscriber got every event, 1 otherwise.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import _peers_proto as proto
from rich.table import Table
from throughput import (
    BenchError,
    Children,
    _fmt,
    finish,
    log,
    start_ges_broker,
    wait_listening,
)

from ges.runtime.ports import free_ports

PING_EVERY = 0.002
#: Seconds between the last publish acknowledged and the ``held`` phase.
SETTLE = 2.0
WINDOW = 1_000
PHASES = ("idle", "held", "resume")


def _ping(port: int, stop, out) -> None:
    """The pinger process: PINGREQ, wait for the PINGRESP, sleep PING_EVERY, until ``stop``;
    then (when each was sent, its round trip) for every ping, or an error, into ``out``."""
    pings: list[tuple[float, float]] = []
    try:
        sock, _ = proto.handshake_mqtt("127.0.0.1", port, "bench-pinger")
        with sock:
            while not stop.is_set():
                t0 = time.monotonic()
                sock.sendall(b"\xc0\x00")
                got = b""
                while len(got) < 2:
                    data = sock.recv(2 - len(got))
                    if not data:
                        raise OSError("the broker closed the pinger's connection")
                    got += data
                if got != b"\xd0\x00":
                    raise OSError(f"not a PINGRESP: {got!r}")
                pings.append((t0, time.monotonic() - t0))
                time.sleep(PING_EVERY)
    except (OSError, proto.ProtocolFailure) as exc:
        out.send(f"pinger: {exc}")
        return
    out.send(pings)


class Pinger:
    """The pinger in a process of its own (in a thread of this one, the GIL this process's
    subscriber holds while it reads would be in its round trips); phases are spans of
    ``time.monotonic()``, the same clock in both processes."""

    def __init__(self, port: int) -> None:
        context = multiprocessing.get_context("fork")
        self._stop = context.Event()
        self._out, child_out = context.Pipe(duplex=False)
        self._proc = context.Process(target=_ping, args=(port, self._stop, child_out))
        self._proc.start()
        self.spans: dict[str, tuple[float, float]] = {}

    def during(self, phase: str, seconds: float) -> None:
        t0 = time.monotonic()
        time.sleep(seconds)
        self.spans[phase] = (t0, time.monotonic())

    def finish(self) -> dict[str, list[float]]:
        """Each phase's round trips (seconds)."""
        self._stop.set()
        if not self._out.poll(10):
            self._proc.kill()
            raise BenchError("the pinger did not report")
        got = self._out.recv()
        self._proc.join(5)
        if isinstance(got, str):
            raise BenchError(got)
        return {
            phase: [rtt for t, rtt in got if lo <= t < hi] for phase, (lo, hi) in self.spans.items()
        }


def publish(port: int, events: int) -> None:
    """``events`` QoS 1 PUBLISHes, at most WINDOW unacknowledged; returns once all are."""
    sock, parser = proto.handshake_mqtt("127.0.0.1", port, "bench-publisher")
    sent = 0
    with sock:
        while parser.acks < events:
            batch = []
            while sent < events and sent - parser.acks < WINDOW and len(batch) < 256:
                batch.append(proto.mqtt_frame(1, sent, 1, sent % 65535 + 1))  # (0: a probe)
                sent += 1
            if batch:
                sock.sendall(b"".join(batch))
            data = sock.recv(1 << 16)
            if not data:
                raise BenchError("the broker closed the publisher's connection")
            parser.feed(data, 0)
            if parser.error:
                raise BenchError(parser.error)


def resume(port: int, events: int, timeout: float) -> tuple[float, float]:
    """The persistent subscriber back: seconds to its CONNACK, then to its last event (each
    acknowledged as it comes); nothing for ``timeout`` seconds ends it."""
    t0 = time.perf_counter()
    sock, parser = proto.handshake_mqtt("127.0.0.1", port, "bench-held", clean=False)
    t1 = time.perf_counter()
    if parser.connack != 0:
        raise BenchError(f"the subscriber's CONNACK said {parser.connack}")
    sock.settimeout(timeout)  # (a broker silent that long: TimeoutError)
    with sock:
        proto.read_until(sock, parser, lambda: parser.events >= events)  # PUBACKs on the way
        sock.sendall(b"\xe0\x00")  # DISCONNECT
    if parser.disorder:
        raise BenchError(f"the subscriber got {parser.disorder:,} events out of order")
    return t1 - t0, time.perf_counter() - t1


def figures(rtts: list[float]) -> dict:
    if not rtts:
        return {"pings": 0}
    rtts = sorted(rtts)
    return {
        "pings": len(rtts),
        "p50_us": rtts[len(rtts) // 2] * 1e6,
        "p99_us": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] * 1e6,
        "max_us": rtts[-1] * 1e6,
    }


def run(kids: Children, events: int, seconds: float) -> dict:
    mqtt_port = free_ports(1)[0]
    server = start_ges_broker(kids, ("--delivery", "reliable", "--mqtt-port", str(mqtt_port)))
    wait_listening(server.children[0], mqtt_port)
    pinger = Pinger(mqtt_port)
    time.sleep(0.5)  # (connected)
    log(f"idle: pinging for {seconds:g}s")
    pinger.during("idle", seconds)
    sock, parser = proto.handshake_mqtt("127.0.0.1", mqtt_port, "bench-held", clean=False)
    proto.subscribe_mqtt(sock, parser, 1)
    sock.sendall(b"\xe0\x00")
    sock.close()
    log(f"held: publishing {events:,} events for the session away")
    t0 = time.perf_counter()
    publish(mqtt_port, events)
    published = time.perf_counter() - t0
    log(f"held: {events:,} published in {published:.1f}s; pinging for {seconds:g}s")
    time.sleep(SETTLE)  # the tail of the publishing: the last groups committed, released
    pinger.during("held", seconds)
    log("resume: the subscriber connects again")
    t0 = time.monotonic()
    try:
        connack, drained = resume(mqtt_port, events, timeout=60.0)
    except (OSError, proto.ProtocolFailure) as exc:
        raise BenchError(f"the returning subscriber: {exc or type(exc).__name__}") from None
    pinger.spans["resume"] = (t0, time.monotonic())
    rtts = pinger.finish()
    return {
        "events": events,
        "publish_events_per_s": events / published,
        "connack_ms": connack * 1e3,
        "drain_s": drained,
        "drain_events_per_s": events / drained,
        "phases": {p: figures(rtts[p]) for p in PHASES},
    }


def ping_table(title: str, phases: dict, order: tuple[str, ...]) -> Table:
    """The pinger's round trips per phase, each phase's beside ``idle``'s (the first)."""
    table = Table(title=title)
    table.add_column("phase")
    for head in ("pings", "p50", "p99", "max", "p99/idle", "max/idle"):
        table.add_column(head, justify="right")
    idle = phases["idle"]
    for phase in order:
        f = phases[phase]
        if not f["pings"]:
            table.add_row(phase, "0", "—", "—", "—", "—", "—")
            continue
        table.add_row(
            phase,
            f"{f['pings']:,}",
            f"{_fmt(f['p50_us'])} µs",
            f"{_fmt(f['p99_us'])} µs",
            f"{_fmt(f['max_us'])} µs",
            f"{f['p99_us'] / idle['p99_us']:.2f}×",
            f"{f['max_us'] / idle['max_us']:.2f}×",
        )
    return table


def bench_main(prefix: str, run, render, as_json: bool) -> int:
    """Run ``run(kids)`` with the bench's processes in a temporary directory, stop them, and
    finish: the table, each error as a line, the exit code."""
    errors: list[str] = []
    report: dict = {}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        kids = Children(Path(tmp))
        try:
            report = run(kids, errors)
        except BenchError as exc:
            errors.append(str(exc))
        finally:
            kids.stop_all()
    return finish(report, errors, render, as_json)


def render(report: dict, out) -> None:
    if "phases" not in report:
        return
    title = (
        f"A persistent session holding {report['events']:,} events: a pinger's round"
        " trips at the same broker"
    )
    out.print(ping_table(title, report["phases"], PHASES))
    out.print(
        f"idle: nothing held. held: the session away, {report['events']:,} events held for it"
        f" (published at {_fmt(report['publish_events_per_s'])}/s, QoS 1). resume: its"
        f" CONNACK after {report['connack_ms']:.1f} ms, then all {report['events']:,} in"
        f" {report['drain_s']:.1f}s ({_fmt(report['drain_events_per_s'])}/s)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="50,000 events, 3 s per phase")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout too")
    parser.add_argument("--events", type=int, help="events held (default 200,000)")
    args = parser.parse_args()
    events = args.events or (50_000 if args.quick else 200_000)
    seconds = 3.0 if args.quick else 6.0
    return bench_main(
        "ges-bench-backlog-", lambda kids, _: run(kids, events, seconds), render, args.json
    )


if __name__ == "__main__":
    sys.exit(main())
