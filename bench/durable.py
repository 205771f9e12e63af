"""Durable sessions: catch-up beside live, roam hand-over, delegation, and what storing once
saves.

    python bench/durable.py [--quick] [--json]

Four brokers (two clusters, a replicator in each: a and c) run in this process on trio with
their SQLite stores and pubend logs in a temporary directory, plain TCP; the clients share the
process (one core for everything — the figures are for comparing, not absolute). Events carry
100-byte payloads and are published in batches of 256 (a batched figure, never a per-message
rate).

1. ``live``: events/s a connected durable session at d (replicator c, one hop away) receives
   while a publishes — beside a plain subscription at d receiving the same events in the same
   run (ratio durable/plain);
2. ``catch-up``: events/s replayed to that session when it resumes at b after missing
   100,000 (20,000 with --quick) — beside its live rate (ratio catch-up/live);
3. ``hand-over``: an operator moves the session (``SessionControl("roam")`` at its replicator,
   what ``ges roam`` sends) while a publishes 1,000 events/s; milliseconds from the request to
   the first event the client gets at its new broker, p50 and p99 over the moves (the CLI's
   own start-up, about a second, is not counted);
4. ``delegation``: the client moves between the two clusters every 3 s while a publishes 1,000
   events/s, and 1 s after each move (the topology's ``sessions: {handover_after: 1}``) its
   session is handed over to the replicator of its new cluster (ges.core.handover): the stall
   the client sees (its last delivery from the old replicator to its first from the new),
   p50 and max, beside the median gap between deliveries at that rate;
5. ``storage``: bytes per event and µs per event to store 10,000 events (2,000 with --quick)
   that 100 sessions all want — once with the sessions it is for (seed 001 §4.2's persistent
   filtering subsystem, what GES does) against a copy per session (the same SQLite store, one
   session per event copy), both committed in groups of 256. Seed 001 §5.1.2 measured the
   former 5× faster with 25× less data.

Exit code 0 when every run delivered every event exactly once, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ges.client import DurableSession, connect  # noqa: E402
from ges.errors import OperationError  # noqa: E402
from ges.runtime import BrokerServer  # noqa: E402
from ges.runtime.ports import on_free_ports  # noqa: E402
from ges.runtime.session_store import SqliteSessionStore  # noqa: E402
from ges.runtime.up import wait_ready  # noqa: E402
from ges.topology import Topology  # noqa: E402
from ges.wire import messages as m  # noqa: E402

NET = {
    "name": "durable-bench",
    "brokers": {
        "a": {"unit": "S/c1", "port": 1},
        "b": {"unit": "S/c1", "port": 2},
        "c": {"unit": "S/c2", "port": 3},
        "d": {"unit": "S/c2", "port": 4},
    },
    "links": [["a", "b"], ["a", "c"], ["b", "d"], ["c", "d"]],
    "replicators": [{"unit": "S/c1", "broker": "a"}, {"unit": "S/c2", "broker": "c"}],
}
SIZES = {
    "quick": {
        "live": 20_000,
        "missed": 20_000,
        "moves": 10,
        "stored": 2_000,
        "sessions": 100,
        "delegations": 2,
    },
    "full": {
        "live": 100_000,
        "missed": 100_000,
        "moves": 40,
        "stored": 10_000,
        "sessions": 100,
        "delegations": 8,
    },
}
PAYLOAD = b"x" * 100
BATCH = 256
EVERYTHING = [m.SessionSub(1, "all", [[m.Constraint("n", "exists")]])]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def publish(topology: Topology, broker: str, first: int, n: int, rate: float = 0) -> None:
    spec = topology.brokers[broker]
    async with connect(spec.host, spec.port, topology=topology) as c:
        if rate:
            for i in range(first, first + n):
                await c.publish_nowait([m.Event({"n": i}, PAYLOAD)])
                await trio.sleep(1 / rate)
        else:
            for lo in range(first, first + n, BATCH):
                hi = min(lo + BATCH, first + n)
                await c.publish_nowait([m.Event({"n": i}, PAYLOAD) for i in range(lo, hi)])
        await c.flush()


async def receive(session: DurableSession, n: int, got: list, started: trio.Event | None = None):
    async with session.running():
        if started is not None:
            started.set()
        async for batch in session.batches():
            got += [d.event.attributes["n"] for d in batch]
            if len(got) >= n:
                return


async def sessions_run(tmp: Path, sizes: dict) -> dict:
    topology = Topology.from_dict(on_free_ports(NET), source="<bench>")
    out: dict = {}
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp / bid).run)
        await wait_ready(topology, timeout=20)
        n = sizes["live"]
        # 1. live: a durable session at d beside a plain subscription at d
        spec = topology.brokers["d"]
        session = DurableSession(topology, "bench", "d", EVERYTHING)
        got: list = []
        plain: list = []
        ready = trio.Event()
        async with connect(spec.host, spec.port, topology=topology) as sub_client:
            sub = await sub_client.subscribe([m.Constraint("n", "exists")])
            times = {}

            async def plain_receive():
                async for batch in sub.batches():
                    plain.extend(d.event.attributes["n"] for d in batch)
                    if len(plain) >= n:
                        times["plain"] = time.perf_counter()
                        return

            async def durable_receive():
                await receive(session, n, got, ready)
                times["durable"] = time.perf_counter()

            async with trio.open_nursery() as inner:
                inner.start_soon(plain_receive)
                inner.start_soon(durable_receive)
                await ready.wait()
                while not session.moves:
                    await trio.sleep(0.01)
                start = time.perf_counter()
                await publish(topology, "a", 0, n)
        out["live"] = {
            "events": n,
            "durable_per_s": n / (times["durable"] - start),
            "plain_per_s": n / (times["plain"] - start),
            "exact": got == list(range(n)) and plain == list(range(n)),
        }
        log(f"live: {out['live']['durable_per_s']:,.0f}/s durable, "
            f"{out['live']['plain_per_s']:,.0f}/s plain")  # fmt: skip
        # 2. catch-up: it misses `missed` events, then resumes at b
        missed = sizes["missed"]
        await publish(topology, "a", n, missed)
        again = DurableSession(topology, "bench", "b", None, token=session.token)
        caught: list = []
        start = time.perf_counter()
        await receive(again, missed, caught)
        took = time.perf_counter() - start
        out["catch_up"] = {
            "events": missed,
            "per_s": missed / took,
            "replayed": again.moves[0].replayed,
            "exact": caught == list(range(n, n + missed)),
        }
        log(f"catch-up: {out['catch_up']['per_s']:,.0f}/s for {missed:,} missed")
        # 3. hand-over: moved by an operator while a publishes 1,000/s
        mover = DurableSession(topology, "bench", "d", None, token=again.token)
        handovers: list[float] = []
        seen: list = []
        first = n + missed
        asked: list[float] = []

        async def consume():
            async with mover.running():
                count = len(mover.moves)
                async for batch in mover.batches():
                    seen.extend(d.event.attributes["n"] for d in batch)
                    if len(mover.moves) > count and asked:
                        handovers.append((time.perf_counter() - asked[-1]) * 1000)
                        count = len(mover.moves)

        rep = topology.brokers["c"]
        async with trio.open_nursery() as inner:
            inner.start_soon(consume)
            while not mover.moves:
                await trio.sleep(0.01)
            total = int(sizes["moves"] * 0.5 * 1000) + 1000
            inner.start_soon(publish, topology, "a", first, total, 1000.0)
            brokers = ["b", "d", "a", "c"]
            async with connect(rep.host, rep.port, topology=topology) as ctl:
                for i in range(sizes["moves"]):
                    await trio.sleep(0.5)
                    asked.append(time.perf_counter())
                    await ctl.sessions("roam", "bench", brokers[i % 4])
            with trio.move_on_after(30):
                while len(seen) < total:
                    await trio.sleep(0.05)
            inner.cancel_scope.cancel()
        out["hand_over"] = {
            "moves": len(handovers),
            "p50_ms": statistics.median(handovers) if handovers else None,
            "p99_ms": max(handovers) if handovers else None,
            "exact": sorted(seen) == list(range(first, first + total))
            and len(set(seen)) == len(seen),
        }
        log(f"hand-over: p50 {out['hand_over']['p50_ms']} ms over {len(handovers)} moves")
        nursery.cancel_scope.cancel()
    return out


async def delegation_run(tmp: Path, sizes: dict) -> dict:
    """5. delegation: the session's client moves between b and d (an operator's roam) every 3 s
    while a publishes 1,000 events/s; 1 s after each move the session is handed over to the
    replicator of the client's new unit. Per hand-over: milliseconds from the library's last
    delivery from the old replicator to its first from the new one (what the client sees of
    it), beside the median gap between deliveries at this rate."""
    net = {**NET, "sessions": {"handover_after": 1}}
    topology = Topology.from_dict(on_free_ports(net), source="<bench>")
    moves = sizes["delegations"]
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp / bid).run)
        await wait_ready(topology, timeout=20)
        arrivals: list[tuple[float, int]] = []  # (when, n) per delivery batch
        handed: list[float] = []
        session = DurableSession(
            topology,
            "deleg",
            "d",
            EVERYTHING,
            on_move=lambda mv: handed.append(time.perf_counter()) if mv.frm == mv.to else None,
        )
        seen: list = []

        async def consume():
            async with session.running():
                async for batch in session.batches():
                    arrivals.append((time.perf_counter(), len(batch)))
                    seen.extend(d.event.attributes["n"] for d in batch)

        total = int(moves * 3 * 1000) + 2000
        async with trio.open_nursery() as inner:
            inner.start_soon(consume)
            while not session.moves:
                await trio.sleep(0.01)
            inner.start_soon(publish, topology, "a", 0, total, 1000.0)
            for i in range(moves):
                await trio.sleep(3.0)
                rep = topology.brokers[session.token.replicator or "c"]
                async with connect(rep.host, rep.port, topology=topology) as ctl:
                    try:
                        await ctl.sessions("roam", "deleg", "bd"[i % 2])
                    except OperationError as exc:  # between replicators just then: a miss
                        log(f"delegation: roam {i} not made: {exc}")
            with trio.move_on_after(30):
                while len(seen) < total:
                    await trio.sleep(0.05)
            inner.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    stalls = []
    for when in handed:  # the gap in deliveries around each reopening at the new replicator
        before = [t for t, _ in arrivals if t <= when]
        after = [t for t, _ in arrivals if t > when]
        if before and after:
            stalls.append((after[0] - before[-1]) * 1000)
    gaps = [(b[0] - a[0]) * 1000 for a, b in zip(arrivals, arrivals[1:], strict=False)]
    out = {
        "handovers": len(handed),
        "stall_p50_ms": statistics.median(stalls) if stalls else None,
        "stall_max_ms": max(stalls) if stalls else None,
        "gap_p50_ms": statistics.median(gaps) if gaps else None,
        "exact": sorted(seen) == list(range(total)) and len(set(seen)) == len(seen),
    }
    log(f"delegation: {len(handed)} hand-overs, stall p50 {out['stall_p50_ms']} ms")
    return out


def storage(tmp: Path, sizes: dict) -> dict:
    """Bytes and time per event: stored once for 100 sessions, against a copy per session."""
    n, k = sizes["stored"], sizes["sessions"]
    item = m.EventItem(0, 0, 1, m.Event({"n": 0, "sym": "IBM"}, PAYLOAD))
    out = {}
    for layout in ("once", "per_session"):
        path = tmp / f"{layout}.db"
        store = SqliteSessionStore(path)
        started = time.perf_counter()
        for lo in range(0, n, BATCH):
            for tick in range(lo + 1, min(lo + BATCH, n) + 1):
                it = m.EventItem(tick, 0, 1, item.event)
                if layout == "once":
                    store.append("p~1", it, [(key, [1]) for key in range(1, k + 1)])
                else:
                    for key in range(1, k + 1):
                        store.append("p~1", it, [(key, [1])])
            group = store.take_group()
            store.committed_to(store.write_group(group))
        took = time.perf_counter() - started
        store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store.close()
        size = path.stat().st_size
        out[layout] = {"bytes_per_event": size / n, "us_per_event": took / n * 1e6}
        log(f"storage {layout}: {size / n:,.0f} B and {took / n * 1e6:,.0f} µs per event")
    out["bytes_ratio"] = out["per_session"]["bytes_per_event"] / out["once"]["bytes_per_event"]
    out["speed_ratio"] = out["per_session"]["us_per_event"] / out["once"]["us_per_event"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and moves")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    sizes = SIZES["quick" if args.quick else "full"]
    tmp = Path(tempfile.mkdtemp(prefix="ges-durable-bench-"))
    runs = trio.run(sessions_run, tmp / "net", sizes)
    deleg = trio.run(delegation_run, tmp / "deleg", sizes)
    stored = storage(tmp, sizes)
    live, catch, hand = runs["live"], runs["catch_up"], runs["hand_over"]
    table = [
        ("live events/s, durable (batch 256)", live["durable_per_s"], live["plain_per_s"],
         "plain subscription, same run"),
        ("catch-up events/s after missing " + f"{catch['events']:,}", catch["per_s"],
         live["durable_per_s"], "its live rate"),
        ("roam hand-over ms, p50", hand["p50_ms"], None, f"{hand['moves']} moves at 1,000 ev/s"),
        ("roam hand-over ms, p99 (max)", hand["p99_ms"], None, ""),
        ("delegation: delivery stall ms, p50", deleg["stall_p50_ms"], deleg["gap_p50_ms"],
         f"median gap, {deleg['handovers']} hand-overs at 1,000 ev/s"),
        ("delegation: delivery stall ms, max", deleg["stall_max_ms"], deleg["gap_p50_ms"],
         "median gap"),
        (f"bytes/event stored, {sizes['sessions']} sessions want it",
         stored["once"]["bytes_per_event"], stored["per_session"]["bytes_per_event"],
         "a copy per session"),
        ("µs/event to store", stored["once"]["us_per_event"], stored["per_session"]["us_per_event"],
         "a copy per session"),
    ]  # fmt: skip
    exact = live["exact"] and catch["exact"] and hand["exact"] and deleg["exact"]
    report = sys.stderr if args.json else sys.stdout
    print(f"{'figure':<48} {'GES':>12} {'baseline':>12} {'ratio':>7}  baseline", file=report)
    rows = []
    for label, value, base, what in table:
        ratio = value / base if value and base else None
        rows.append({"figure": label, "value": value, "baseline": base, "ratio": ratio, "of": what})
        print(
            f"{label:<48} {value if value is not None else float('nan'):>12,.1f} "
            f"{base if base is not None else float('nan'):>12,.1f} "
            f"{ratio if ratio is not None else float('nan'):>7.2f}  {what}",
            file=report,
        )
    print(
        f"storing once: {stored['bytes_ratio']:.1f}x less data, {stored['speed_ratio']:.1f}x "
        f"faster than a copy per session (seed 001 §5.1.2: 25x, 5x); every run exact: {exact}",
        file=report,
    )
    if args.json:
        print(json.dumps({"bench": "durable", "sizes": sizes, "table": rows, "storage": stored,
                          "exact": exact}))  # fmt: skip
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
