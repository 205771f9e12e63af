"""What a SUBSCRIBE to '#' on many retained topics costs everyone else on its broker.

    python bench/retained.py [--quick] [--json] [--topics N] [--subscribers K]

One ``ges broker --insecure --mqtt-port P`` as its own process; it is its own replicator, so
it keeps every retained message. N retained messages are published first (QoS 1, N topics
``site/<i % 100>/dev/<i>``, 10-byte payloads), then a *pinger* (bench/backlog.py's: an MQTT
client in a process of its own, a PINGREQ every 2 ms, each round trip timed) measures how long
the broker's event loop makes a client wait, in two phases of one run:

1. ``idle``: the pinger alone — the baseline, measured in the same run;
2. ``subscribe '#'``: K clients, one after another, each SUBSCRIBE to ``#`` (QoS 0) and read
   what is retained (an answer holds at most 1 MiB of messages: ges.durable.retained's
   MAX_ANSWER_BYTES): the replicator walks its index for it and the client's session turns
   the answer into PUBLISHes (ges.core.retaining, ges.mqtt.filtering: both in slices).

The table gives the round trips' p50, p99 and max per phase with each phase's ratio to
``idle``, and the retained messages each subscriber got; then the broker's own longest loop
stretch (``ges monitor --once --json``'s ``loop_longest_us``: the longest run of its event loop
without a wait in the last 10 s) after each phase — the idle phase lasts 11 s so that the
filling is out of that window. The pings wait for a core too (the broker, the subscriber and
the pinger share two), so the broker's figure is the cleaner one. Nothing here asserts a
timing; exit code 0 when every subscriber got an answer, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

from backlog import Pinger, bench_main, figures, ping_table
from throughput import GES, BenchError, Children, log, start_ges_broker, wait_listening

from ges.mqtt import packets as p
from ges.mqtt.frames import PacketReader
from ges.runtime.ports import free_ports

PHASES = ("idle", "subscribe '#'")
#: QoS 1 retained PUBLISHes the filler keeps unacknowledged at most
WINDOW = 1000


def _connect(port: int, client_id: str) -> tuple[socket.socket, PacketReader]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(p.encode(p.Connect(client_id, keepalive=60)))
    reader = PacketReader()
    while True:
        data = sock.recv(1 << 16)
        if not data:
            raise BenchError(f"{client_id}: the broker closed the connection")
        reader.feed(data)
        got = [p.decode(x) for x in reader.packets()]
        if got:
            if type(got[0]) is not p.ConnAck or got[0].code:
                raise BenchError(f"{client_id}: {got[0]!r}")
            return sock, reader


def fill(port: int, topics: int) -> None:
    """``topics`` retained messages, one a topic, QoS 1; returns once all are acknowledged."""
    sock, reader = _connect(port, "bench-filler")
    sent = acked = 0
    with sock:
        while acked < topics:
            batch = []
            while sent < topics and sent - acked < WINDOW and len(batch) < 256:
                topic = f"site/{sent % 100}/dev/{sent}"
                pkt = p.Publish(topic, b"x" * 10, qos=1, retain=True, packet_id=sent % 65535 + 1)
                batch.append(p.encode(pkt))
                sent += 1
            if batch:
                sock.sendall(b"".join(batch))
            data = sock.recv(1 << 16)
            if not data:
                raise BenchError("the broker closed the filler's connection")
            reader.feed(data)
            acked += sum(1 for x in reader.packets() if type(p.decode(x)) is p.PubAck)


def subscribe_all(port: int, name: str, idle: float = 1.0) -> int:
    """SUBSCRIBE to '#' and read what is retained until nothing comes for ``idle`` seconds;
    the PUBLISHes got."""
    sock, reader = _connect(port, name)
    got = 0
    with sock:
        sock.sendall(p.encode(p.Subscribe(1, (("#", 0),))))
        sock.settimeout(idle)
        while True:
            try:
                data = sock.recv(1 << 18)
            except TimeoutError:
                break
            if not data:
                raise BenchError(f"{name}: the broker closed the connection")
            reader.feed(data)
            got += sum(1 for x in reader.packets() if type(p.decode(x)) is p.Publish)
        sock.sendall(p.encode(p.Disconnect()))
    return got


def longest_loop_us(kids: Children) -> float:
    """The broker's longest event-loop stretch of the last 10 s, as ``ges monitor`` says."""
    got = subprocess.run(
        [*map(str, GES), "monitor", str(kids.tmp / "one-broker.yaml"), "--insecure"]
        + ["--once", "--json", "--interval", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if got.returncode:
        raise BenchError(f"ges monitor: {got.stderr.strip()}")
    units = [json.loads(got.stdout)["network"]]
    brokers = []
    while units:  # the unit tree down to its one broker
        unit = units.pop()
        brokers += unit.get("brokers", [])
        units += unit.get("units", [])
    (broker,) = brokers
    return float(broker["loop_longest_us"])


def run(kids: Children, topics: int, subscribers: int, seconds: float) -> dict:
    mqtt_port = free_ports(1)[0]
    server = start_ges_broker(kids, ("--mqtt-port", str(mqtt_port)))
    wait_listening(server.children[0], mqtt_port)
    log(f"retaining {topics:,} topics")
    fill(mqtt_port, topics)
    time.sleep(1.0)  # (the replicator has the last of them)
    pinger = Pinger(mqtt_port)
    time.sleep(0.5)  # (connected)
    log(f"idle: pinging for {seconds:g}s")
    pinger.during("idle", seconds)
    idle_longest = longest_loop_us(kids)
    log(f"subscribe '#': {subscribers} subscribers, one after another")
    t0 = time.monotonic()
    got = [subscribe_all(mqtt_port, f"bench-all-{i}") for i in range(subscribers)]
    pinger.spans["subscribe '#'"] = (t0, time.monotonic())
    rtts = pinger.finish()
    busy_longest = longest_loop_us(kids)
    return {
        "topics": topics,
        "subscribers": subscribers,
        "retained_per_subscriber": got,
        "complete": min(got) > 0,
        "phases": {ph: figures(rtts[ph]) for ph in PHASES},
        "loop_longest_us": dict(zip(PHASES, (idle_longest, busy_longest), strict=True)),
    }


def render(report: dict, out) -> None:
    if "phases" not in report:
        return
    title = (
        f"{report['subscribers']} SUBSCRIBEs to '#' on {report['topics']:,} retained topics:"
        " a pinger's round trips at the same broker"
    )
    out.print(ping_table(title, report["phases"], PHASES))
    got = report["retained_per_subscriber"]
    out.print(
        f"retained messages each subscriber got: {min(got):,}–{max(got):,} (an answer holds at"
        " most 1 MiB of them)."
    )
    loops = report["loop_longest_us"]
    out.print(
        "the broker's longest event-loop stretch (last 10 s): "
        + ", ".join(f"{ph} {loops[ph]:,.0f} µs" for ph in PHASES)
        + f" ({loops[PHASES[1]] / max(loops[PHASES[0]], 1):.1f}× idle)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer topics (CI-sized)")
    parser.add_argument("--json", action="store_true", help="also print the report as JSON")
    parser.add_argument("--topics", type=int, default=0, help="retained topics")
    parser.add_argument("--subscribers", type=int, default=6, help="SUBSCRIBEs to '#'")
    args = parser.parse_args()
    topics = args.topics or (20_000 if args.quick else 100_000)
    seconds = 11.0  # (the filling is out of the broker's 10 s window then)

    def body(kids: Children, errors: list[str]) -> dict:
        report = run(kids, topics, args.subscribers, seconds)
        if not report["complete"]:
            errors.append("a subscriber got nothing retained")
        return report

    return bench_main("ges-bench-retained-", body, render, args.json)


if __name__ == "__main__":
    sys.exit(main())
