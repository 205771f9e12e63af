"""TLS against plain TCP, measured in the same run: what encryption and identities cost GES.

    python bench/tls.py [--quick] [--json]

One ``ges broker`` of a one-broker topology (own process, on a free port) is started twice —
plain, and with ``--certs`` (a CA and certificates made for the run with ``ges certs init``) —
alternating, three rounds (one with ``--quick``). In this process, a subscriber client and a
publisher client connect to it (over TLS with the broker's certificate checked, for the TLS
variant) and measure, with 100-byte payloads:

1. ``batched``: events/s counted at the subscriber, publishing batches of 256 events per Publish
   (``publish_nowait``, then ``flush``) — a batched figure, not a per-message rate;
2. ``single``: the same with one event per Publish, pipelined up to the client's window;
3. ``latency``: single events at 1,000/s, p50 and p99 of ``received_at - published_at``;
4. ``connect``: milliseconds to open a connection (TCP, TLS handshake, Hello/Welcome), median of
   50;
5. ``record``: microseconds per 150-byte message sent and received over trio's in-memory stream
   pair, plain and through ``trio.SSLStream`` — what one TLS record costs in this process, with
   no broker, socket or GES code involved.

The table shows each figure for plain TCP and TLS and the ratio TLS/plain. The issue's aim: TLS
costs at most 15 % of throughput and 50 µs of p50 latency per hop. The subscriber and the
publisher share this process (one core), the broker has its own: the same for both variants.
Exit code 0 when every run delivered every event, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli._common import client_auth, init_certs  # noqa: E402
from ges.client import connect  # noqa: E402
from ges.runtime.ports import on_free_ports  # noqa: E402
from ges.runtime.up import wait_ready  # noqa: E402
from ges.security.certs import CertDir, Identity  # noqa: E402
from ges.security.tls import context  # noqa: E402
from ges.topology import Topology  # noqa: E402
from ges.transport.tls import TLSStream  # noqa: E402
from ges.wire import messages as m  # noqa: E402

GES = [sys.executable, "-m", "cli.main"]
ONE = {"name": "tls-bench", "brokers": {"b1": {"unit": "S/c1", "port": 1}}, "links": []}
SIZES = {
    "quick": {"rounds": 1, "batched": 100_000, "single": 20_000, "latency_s": 2.0},
    "full": {"rounds": 3, "batched": 400_000, "single": 60_000, "latency_s": 5.0},
}
PAYLOAD = b"x" * 100


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


async def throughput(spec, topology, tls, n: int, batch: int) -> dict:
    events = [m.Event({"n": i}, PAYLOAD) for i in range(batch)]
    async with (
        connect(spec.host, spec.port, topology=topology, tls=tls) as sub_client,
        connect(spec.host, spec.port, topology=topology, tls=tls) as pub_client,
    ):
        sub = await sub_client.subscribe([m.Constraint("n", ">=", 0)])
        got = 0
        first = last = 0.0

        async def receive():
            nonlocal got, first, last
            async for _ in sub:
                if got == 0:
                    first = time.perf_counter()
                got += 1
                if got == n:
                    last = time.perf_counter()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            for lo in range(0, n, batch):
                await pub_client.publish_nowait(events[: min(batch, n - lo)])
            await pub_client.flush()
            with trio.move_on_after(60):
                while got < n:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    rate = (n - 1) / (last - first) if last > first else 0.0
    return {"events": n, "delivered": got, "events_per_s": round(rate, 1)}


async def latency(spec, topology, tls, seconds: float) -> dict:
    lat: list[float] = []
    async with (
        connect(spec.host, spec.port, topology=topology, tls=tls) as sub_client,
        connect(spec.host, spec.port, topology=topology, tls=tls) as pub_client,
    ):
        sub = await sub_client.subscribe([m.Constraint("n", ">=", 0)])
        total = int(seconds * 1000)

        async def receive():
            async for d in sub:
                lat.append((d.received_at - d.event.published_at) / 1000)
                if len(lat) == total:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            start = trio.current_time()
            for i in range(total):
                await trio.sleep_until(start + i / 1000)
                await pub_client.publish([m.Event({"n": i}, PAYLOAD, time.time_ns())])
            with trio.move_on_after(10):
                while len(lat) < total:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    kept = sorted(lat[len(lat) // 5 :])  # the first fifth is warm-up
    return {
        "samples": len(kept),
        "delivered": len(lat),
        "events": total,
        "p50_us": round(statistics.median(kept), 1) if kept else None,
        "p99_us": round(kept[int(0.99 * (len(kept) - 1))], 1) if kept else None,
    }


async def connects(spec, topology, tls, n: int = 50) -> dict:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        async with connect(spec.host, spec.port, topology=topology, tls=tls):
            times.append((time.perf_counter() - t) * 1000)
    return {"median_ms": round(statistics.median(times), 3)}


async def record_cost(certs: Path | None, n: int = 20_000) -> dict:
    """µs per 150-byte send_all + receive over an in-memory stream pair (with TLS: the
    TLSStream the broker and clients use)."""
    import trio.testing

    a, b = trio.testing.memory_stream_pair()
    if certs is not None:
        where = CertDir(certs)
        a = TLSStream(a, context(where, Identity("broker", "b1"), server=True), server_side=True)
        b = TLSStream(b, context(where, None, server=False), server_side=False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.do_handshake)
            nursery.start_soon(b.do_handshake)
    msg = b"x" * 150
    started = time.perf_counter()
    for _ in range(n):
        await b.send_all(msg)
        got = 0
        while got < len(msg):
            got += len(await a.receive_some(65536))
    return {"us_per_message": round((time.perf_counter() - started) / n * 1e6, 2)}


async def one_variant(topology: Topology, path: Path, certs: Path | None, sizes: dict) -> dict:
    extra = ["--certs", str(certs)] if certs else ["--insecure"]
    tmp = Path(tempfile.mkdtemp(prefix="ges-tls-"))
    proc = subprocess.Popen(
        [*GES, "broker", str(path), "--id", "b1", "--data-dir", str(tmp), "--log-level",
         "error", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # a secure broker admits only clients that prove who they are: the operator's certificate
    tls = client_auth(CertDir(certs)).tls if certs else None
    try:
        await wait_ready(topology, timeout=30, tls=tls)
        spec = topology.brokers["b1"]
        return {
            "batched": await throughput(spec, topology, tls, sizes["batched"], 256),
            "single": await throughput(spec, topology, tls, sizes["single"], 1),
            "latency": await latency(spec, topology, tls, sizes["latency_s"]),
            "connect": await connects(spec, topology, tls),
            "record": await record_cost(certs),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round, fewer events")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    sizes = SIZES["quick" if args.quick else "full"]
    tmp = Path(tempfile.mkdtemp(prefix="ges-tls-bench-"))
    path = tmp / "one.yaml"
    path.write_text(yaml.safe_dump(on_free_ports(ONE)))
    topology = Topology.from_yaml(path)
    certs = tmp / "certs"
    init_certs(topology, certs)  # as ges up makes them: the CA, b1, the operator admin
    runs: dict[str, list[dict]] = {"plain": [], "tls": []}
    for r in range(sizes["rounds"]):
        for name, where in (("plain", None), ("tls", certs)):
            log(f"round {r + 1}/{sizes['rounds']}: {name} …")
            runs[name].append(trio.run(one_variant, topology, path, where, sizes))

    def med(name: str, figure: str, key: str) -> float:
        return statistics.median(run[figure][key] for run in runs[name])

    rows = [
        ("batched events/s (batch 256)", "batched", "events_per_s"),
        ("single events/s (one per Publish)", "single", "events_per_s"),
        ("latency p50 µs (1,000/s)", "latency", "p50_us"),
        ("latency p99 µs", "latency", "p99_us"),
        ("connect ms (median of 50)", "connect", "median_ms"),
        ("µs per 150-byte message, in memory", "record", "us_per_message"),
    ]
    table = []
    for label, figure, key in rows:
        plain, tls = med("plain", figure, key), med("tls", figure, key)
        ratio = round(tls / plain, 3) if plain else None
        table.append({"figure": label, "plain": plain, "tls": tls, "ratio": ratio})
    lost = [
        (name, figure)
        for name, rs in runs.items()
        for run in rs
        for figure in ("batched", "single", "latency")
        if run[figure]["delivered"] < run[figure]["events"]
    ]
    width = max(len(r["figure"]) for r in table)
    out = sys.stderr if args.json else sys.stdout
    print(f"{'figure':<{width}}  {'plain TCP':>12}  {'TLS':>12}  {'TLS/plain':>9}", file=out)
    for r in table:
        print(
            f"{r['figure']:<{width}}  {r['plain']:>12,.1f}  {r['tls']:>12,.1f}  "
            f"{r['ratio'] if r['ratio'] is not None else '-':>9}",
            file=out,
        )
    print(
        f"median of {sizes['rounds']} round(s), plain and TLS alternating; 100-byte payloads; "
        "subscriber and publisher in one process, the broker in another",
        file=out,
    )
    if lost:
        print(f"LOST EVENTS in {lost}", file=out)
    if args.json:
        print(json.dumps({"bench": "tls", "sizes": sizes, "table": table, "runs": runs}))
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
