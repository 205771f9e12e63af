"""What one publisher's fan-out costs everyone else on its broker.

    python bench/fanout.py [--quick] [--json] [--events N] [--clients C]

One ``ges broker --insecure --mqtt-port P`` (reliable delivery, its default) as its own process.
A *pinger* (bench/backlog.py's: an MQTT client in a process of its own, a PINGREQ every 2 ms,
each round trip timed) measures how long the broker's event loop makes a client wait. Two
phases in one run:

1. ``idle``: the pinger alone — the baseline, measured in the same run;
2. ``fan-out``: C MQTT subscribers (QoS 0, one connection each, in one process of
   bench/_peers_load.py) on ``bench/#`` and one publisher writing N QoS 0 PUBLISHes back to
   back (the same load generator as ``bench/peers.py``'s 1 → 100 row) — each event goes to
   every subscriber, through the pubend's log, while the pinger runs.

The table gives the round trips' p50, p99 and max per phase with each phase's ratio to
``idle``, and the fan-out's deliveries a second; ``--json`` prints the figures as one JSON line
too. The machine's two cores are shared by the broker, the subscribers' process, the
publisher and the pinger, so the pings also wait for a core. Nothing here asserts a timing;
exit code 0 when every subscriber got every event, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from backlog import Pinger, bench_main, figures, ping_table
from throughput import (
    BenchError,
    Children,
    _fmt,
    log,
    start_ges_broker,
    wait_listening,
)

from ges.runtime.ports import free_ports

LOAD = Path(__file__).resolve().parent / "_peers_load.py"
PHASES = ("idle", "fan-out")


def _load(role: str, port: int, *more: str) -> subprocess.Popen:
    cmd = [sys.executable, str(LOAD), role, "--proto", "mqtt", "--port", str(port), *more]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen, want: str) -> None:
    got = proc.stdout.readline().strip()
    if got != want:
        raise BenchError(f"the load generator said {got!r}, not {want!r}")


def run(kids: Children, events: int, clients: int, seconds: float) -> dict:
    mqtt_port = free_ports(1)[0]
    server = start_ges_broker(kids, ("--mqtt-port", str(mqtt_port)))
    wait_listening(server.children[0], mqtt_port)
    pinger = Pinger(mqtt_port)
    time.sleep(0.5)  # (connected)
    log(f"idle: pinging for {seconds:g}s")
    pinger.during("idle", seconds)
    sub = _load("sub", mqtt_port, "--clients", str(clients), "--expect", str(events))
    pub = _load("pub", mqtt_port, "--events", str(events))
    try:
        _line(sub, "ready")
        _line(pub, "ready")
        _line(sub, "probed")
        log(f"fan-out: {events:,} events to {clients} subscribers")
        t0 = time.monotonic()
        pub.stdin.write("go\n")
        pub.stdin.flush()
        pub.communicate(timeout=600)
        out, _ = sub.communicate(timeout=600)
        pinger.spans["fan-out"] = (t0, time.monotonic())
    finally:
        for proc in (pub, sub):
            if proc.poll() is None:
                proc.kill()
    got = json.loads(out.strip().splitlines()[-1])
    conns = got["clients"]
    counts = [c["count"] for c in conns]
    firsts = [c["first_ns"] for c in conns if c["count"]]
    lasts = [c["last_ns"] for c in conns if c["count"]]
    took = (max(lasts) - min(firsts)) / 1e9 if firsts else float("nan")
    rtts = pinger.finish()
    return {
        "events": events,
        "clients": clients,
        "received": sum(counts),
        "complete": min(counts) >= events,
        "deliveries_per_s": sum(counts) / took if took else 0.0,
        "phases": {p: figures(rtts[p]) for p in PHASES},
    }


def render(report: dict, out) -> None:
    if "phases" not in report:
        return
    title = (
        f"One publisher's {report['events']:,} events to {report['clients']} subscribers:"
        " a pinger's round trips at the same broker"
    )
    out.print(ping_table(title, report["phases"], PHASES))
    out.print(
        f"fan-out: {report['received']:,} deliveries at {_fmt(report['deliveries_per_s'])}/s"
        f" (QoS 0, one event per PUBLISH){'' if report['complete'] else '; NOT all received'}."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events (CI-sized)")
    parser.add_argument("--json", action="store_true", help="also print the report as JSON")
    parser.add_argument("--events", type=int, default=0, help="events published")
    parser.add_argument("--clients", type=int, default=100, help="subscribers")
    args = parser.parse_args()
    events = args.events or (20_000 if args.quick else 100_000)
    seconds = 3.0 if args.quick else 6.0

    def body(kids: Children, errors: list[str]) -> dict:
        report = run(kids, events, args.clients, seconds)
        if not report["complete"]:
            errors.append(f"the subscribers got {report['received']:,} deliveries, not all")
        return report

    return bench_main("ges-bench-fanout-", body, render, args.json)


if __name__ == "__main__":
    sys.exit(main())
