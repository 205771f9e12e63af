"""Content routing beside flooding on seed 004's 22-broker network (seed 004 §5).

    python bench/routing.py [--quick] [--json] [--records PATH]

Runs ``ges up topologies/ges-paper.yaml --processes --no-live`` (on free ports) twice in one run:
with ``--routing flood`` (every event over every link: the baseline) and with ``--routing
content`` (events go only where profiles match). Each time the layout is the paper's: the
publisher at broker 22 and the measuring subscriber at broker 10, both in this process (one
clock), and 100 more subscribing clients, 5 at each of the 20 other brokers, in a child process
(``bench/_routing_crowd.py``) so their CPU does not disturb the measurements.

Every event carries ``n`` (a sequence number) and ``bucket`` (0..99, each value once in every
100 consecutive events, in a fixed shuffled order in which every 10 consecutive events hold one
bucket below 10 and every 2 one below 50), and every subscriber subscribes with ``bucket < R``
for the matching rates R = 100, 50, 10 %. For each matching rate and each cell of event sizes
(payload bytes) × publish rates, the publisher publishes single events at the given rate
(``published_at = time.time_ns()`` in the event); then the run waits until the measuring
subscriber and every crowd client have received exactly the matching events, and until the
brokers' counters stop moving. Per cell it reports the broker-to-broker Events frames per
published event (the sum over all 22 brokers of the change in ``Stats.event_frames``) and the
latency at the measuring subscriber (``received_at − published_at``, in ms): mean, variance,
p50, p99. The summary compares content routing with flooding per matching rate; the aim is
content routing at ≤ 20 % of flooding's frames at 10 % matching.

The measuring subscriber writes one delivery record per event (README "Delivery records", the
same writer as ``ges subscribe --record``) to ``--records`` (overwritten; default a new file in
the system temp directory), tagged with routing, matching_rate, size and rate.

Exit code 0 when every cell delivered exactly the matching events once to every subscriber,
1 otherwise (also when a process died or a wait timed out), 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import trio
from rich.console import Console
from rich.table import Table
from throughput import (
    GES,
    PAPER_PUBLISHER,
    PAPER_SUBSCRIBER,
    STARTUP_TIMEOUT,
    UP_READY_TIMEOUT,
    BenchError,
    Children,
    CpuWindow,
    _width,
    console,
    log,
    paced,
    paper_on_free_ports,
    percentile,
)

from ges.client import connect
from ges.errors import OperationError
from ges.matching import parse_where
from ges.records import RecordWriter
from ges.topology import broker_order_key
from ges.wire import messages as m

BENCH = Path(__file__).resolve().parent
ROUTINGS = ("flood", "content")
MATCHING_RATES = (100, 50, 10)
CROWD_PER_BROKER = 5
SEED = 4
SIZES = {
    "quick": {
        "sizes": (30, 500),
        "rates": (100, 1000),
        "events": {100: 100, 1000: 500},
    },
    "full": {
        "sizes": (30, 500),
        "rates": (1, 10, 100, 1000),
        "events": {1: 10, 10: 50, 100: 500, 1000: 3000},
    },
}
WARMUP_EVENTS, WARMUP_RATE = 100, 100.0
#: The issue's aim: at 10 % matching, content routing sends at most this share of flooding's
#: broker-to-broker frames.
AIM_FRAMES_RATIO_AT_10 = 0.20
#: Seconds without a delivery (after publishing ended) before a cell counts as incomplete.
IDLE_TIMEOUT = 5.0
#: The brokers' counters count as settled when unchanged over this many seconds.
SETTLE_SECONDS = 0.25
SETTLE_TIMEOUT = 10.0


# -- the event stream ----------------------------------------------------------------------------


def bucket_order(seed: int = SEED) -> list[int]:
    """Buckets 0..99, each once, shuffled so every 10 consecutive positions (cyclically) hold
    one bucket below 10 and five below 50, and every 2 consecutive one below 50: so any window
    of a multiple of 10 events matches 10 %, 50 % and 100 % exactly."""
    rng = random.Random(seed)
    lows, highs = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]
    rng.shuffle(lows)
    rng.shuffle(highs)
    deciles = [d for pair in zip(lows, highs, strict=True) for d in pair]
    offsets = []
    for _ in range(10):
        o = list(range(10))
        rng.shuffle(o)
        offsets.append(o)
    return [10 * deciles[p % 10] + offsets[deciles[p % 10]][p // 10] for p in range(100)]


BUCKETS = bucket_order()


def bucket(n: int) -> int:
    return BUCKETS[n % 100]


# -- processes -----------------------------------------------------------------------------------


class Network:
    """``ges up ges-paper.yaml --processes --routing R`` on free ports."""

    def __init__(self, kids: Children, routing: str) -> None:
        self.routing = routing
        self.path, self.topology = paper_on_free_ports(kids)
        data = kids.tmp / f"data-{routing}"
        self.child = kids.spawn(
            f"ges up {routing}",
            [*GES, "up", self.path, "--no-live", "--processes", "--routing", routing]
            + ["--data-dir", data, "--log-level", "warning"]
            + ["--ready-timeout", str(UP_READY_TIMEOUT), "--insecure"],
        )
        self.child.wait_line(
            lambda line: line.startswith("ready:"), UP_READY_TIMEOUT + 10, "ready line"
        )
        run = json.loads((data / "run.json").read_text())
        self.pids = [b["pid"] for b in run["brokers"]]


class Crowd:
    """The 100 subscribing clients of ``_routing_crowd.py``, driven over its stdin/stdout."""

    def __init__(self, kids: Children, net: Network) -> None:
        cmd = [sys.executable, BENCH / "_routing_crowd.py", "--topology", net.path]
        cmd += ["--per-broker", CROWD_PER_BROKER]
        cmd += ["--exclude", f"{PAPER_PUBLISHER},{PAPER_SUBSCRIBER}"]
        self.child = kids.spawn("crowd", cmd, stdin_pipe=True)
        line = self.child.wait_line(lambda s: s.startswith("ready"), STARTUP_TIMEOUT, "ready")
        self.clients = int(line.split()[1])

    def ask(self, command: str, timeout: float = STARTUP_TIMEOUT) -> str:
        proc = self.child.proc
        try:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            proc.wait()
            raise self.child.fail(f"exited with code {proc.returncode}") from None
        line = self.child.wait_line(lambda s: True, timeout, f"answer to {command!r}").strip()
        if line.startswith("error"):
            raise self.child.fail(line)
        return line

    async def aask(self, command: str, timeout: float = STARTUP_TIMEOUT) -> str:
        return await trio.to_thread.run_sync(self.ask, command, timeout)


# -- measuring -----------------------------------------------------------------------------------


class Cell:
    """What the measuring subscriber received during one cell."""

    def __init__(self, lo: int, hi: int, matching: int, *, record: bool = True) -> None:
        self.lo, self.hi, self.matching = lo, hi, matching
        self.record = record
        self.expected = {n for n in range(lo, hi) if bucket(n) < matching}
        self.counts: Counter = Counter()
        self.latencies: list[int] = []
        self.hops: Counter = Counter()
        self.unexpected = 0
        self.wrong = 0
        self.last_activity = time.monotonic()

    def take(self, batch) -> None:
        self.last_activity = time.monotonic()
        for d in batch:
            attrs = d.event.attributes
            n = attrs.get("n")
            if not isinstance(n, int) or not self.lo <= n < self.hi:
                self.unexpected += 1
                continue
            self.counts[n] += 1
            if attrs.get("bucket", self.matching) >= self.matching:
                self.wrong += 1
            if self.counts[n] == 1:
                self.latencies.append(d.received_at - d.event.published_at)
                self.hops[d.hops] += 1

    @property
    def complete(self) -> bool:
        return len(self.counts) >= len(self.expected)

    def problems(self) -> list[str]:
        out = []
        missing = len(self.expected - set(self.counts))
        extra = len(set(self.counts) - self.expected)
        dups = sum(c - 1 for c in self.counts.values() if c > 1)
        if missing:
            out.append(f"measuring subscriber missed {missing} of {len(self.expected)} events")
        if extra or self.wrong:
            out.append(f"measuring subscriber got {extra + self.wrong} non-matching events")
        if dups:
            out.append(f"measuring subscriber got {dups} duplicate deliveries")
        if self.unexpected:
            out.append(f"measuring subscriber got {self.unexpected} events of another cell")
        return out


class Meter:
    """The publisher at 22, the measuring subscriber at 10 and a stats connection per broker."""

    def __init__(self, net: Network, crowd: Crowd, writer: RecordWriter | None) -> None:
        self.net = net
        self.crowd = crowd
        self.writer = writer
        self.cell: Cell | None = None
        self.strays = 0
        self.next_n = 0
        self.pub = self.sub_client = self.sub = None
        self.stats_clients: dict[str, object] = {}
        #: the last settled stats: the next cell's "before" (nothing sends Events between cells)
        self.last_stats: dict[str, m.Stats] | None = None

    async def run(self, plan: dict) -> list[dict]:
        topo = self.net.topology
        brokers = topo.brokers
        results = []
        async with trio.open_nursery() as nursery:
            for bid in sorted(brokers, key=broker_order_key):
                spec = brokers[bid]
                self.stats_clients[bid] = await nursery.start(
                    self._hold, spec.host, spec.port, f"bench-stats-{bid}"
                )
            pub_spec, sub_spec = brokers[PAPER_PUBLISHER], brokers[PAPER_SUBSCRIBER]
            self.pub = await nursery.start(
                self._hold, pub_spec.host, pub_spec.port, "bench-routing-publisher"
            )
            self.sub_client = await nursery.start(
                self._hold, sub_spec.host, sub_spec.port, "bench-routing-measuring"
            )
            if self.writer is not None:
                self.writer.client = "bench-routing-measuring"
            for matching in MATCHING_RATES:
                await self.resubscribe(matching, nursery)
                if matching == MATCHING_RATES[0]:
                    await self.warmup(matching)
                for size in plan["sizes"]:
                    for rate in plan["rates"]:
                        count = plan["events"][rate]
                        results.append(await self.run_cell(matching, size, rate, count))
            nursery.cancel_scope.cancel()
        return results

    async def _hold(self, host, port, client_id, task_status=trio.TASK_STATUS_IGNORED):
        async with connect(host, port, topology=self.net.topology.name, client_id=client_id) as c:
            task_status.started(c)
            await trio.sleep_forever()

    async def resubscribe(self, matching: int, nursery: trio.Nursery) -> None:
        started = time.perf_counter()
        # the client library has no "replace this subscription's profile" call: unsubscribe,
        # then subscribe (subscribe returns once the routing keepers have the profile)
        if self.sub is not None:
            old, self.sub = self.sub, None
            await self.sub_client.unsubscribe(old)
        async with trio.open_nursery() as both:
            both.start_soon(self.crowd.aask, f"subscribe {matching}")
            both.start_soon(self._subscribe_measuring, matching, nursery)
        log(
            f"{self.net.routing}: {1 + self.crowd.clients} subscribers on bucket < {matching}"
            f" in {time.perf_counter() - started:.2f} s"
        )

    async def _subscribe_measuring(self, matching: int, nursery: trio.Nursery) -> None:
        self.sub = await self.sub_client.subscribe([parse_where(f"bucket < {matching}")])
        nursery.start_soon(self._consume, self.sub)

    async def _consume(self, sub) -> None:
        async for batch in sub.batches():
            cell = self.cell
            if cell is None:
                self.strays += len(batch)
                continue
            if cell.record and self.writer is not None:
                self.writer.write(batch)
            cell.take(batch)

    async def frames(self) -> dict[str, m.Stats]:
        out: dict[str, m.Stats] = {}

        async def one(bid, client):
            out[bid] = await client.stats()

        async with trio.open_nursery() as nursery:
            for bid, client in self.stats_clients.items():
                nursery.start_soon(one, bid, client)
        return out

    async def settled_stats(self) -> dict[str, m.Stats]:
        """Stats of every broker once no broker's Events counters move any more."""
        deadline = trio.current_time() + SETTLE_TIMEOUT
        last = await self.frames()
        while True:
            await trio.sleep(SETTLE_SECONDS)
            now = await self.frames()
            if _moving(last, now) == 0 or trio.current_time() > deadline:
                return now
            last = now

    async def warmup(self, matching: int) -> None:
        """A few events before the first cell (not reported): connections and caches warm."""
        cell = Cell(self.next_n, self.next_n + WARMUP_EVENTS, matching, record=False)
        await self.crowd.aask(f"cell {cell.lo} {cell.hi} {matching}")
        self.cell = cell
        await self.publish(cell, 30, WARMUP_RATE)
        cell.last_activity = time.monotonic()
        await self.wait_measuring(cell)
        self.cell = None
        self.last_stats = await self.settled_stats()
        log(f"{self.net.routing}: warm-up {len(cell.counts)}/{len(cell.expected)} received")

    async def publish(self, cell: Cell, size: int, rate: float) -> float:
        payload = b"x" * size
        pub, event = self.pub, m.Event
        lo = cell.lo

        async def send_one(i: int) -> None:
            n = lo + i
            await pub.publish_nowait(
                [event({"bucket": bucket(n), "n": n}, payload, time.time_ns())]
            )

        elapsed = await paced(send_one, rate, cell.hi - cell.lo)
        await pub.flush()
        self.next_n = cell.hi
        return elapsed

    async def wait_measuring(self, cell: Cell) -> None:
        while not cell.complete:
            await trio.sleep(0.01)
            if time.monotonic() - cell.last_activity > IDLE_TIMEOUT:
                return

    async def wait_crowd(self, expect: int, published: float) -> dict:
        """The crowd's counts once every client has ``expect`` events, or nothing arrived for
        IDLE_TIMEOUT seconds (and publishing ended at least that long ago)."""
        while True:
            counts = json.loads(await self.crowd.aask("counts"))
            clients = counts["clients"]
            if all(c["unique"] >= expect or c["error"] for c in clients):
                return counts
            waited = time.monotonic() - published
            if counts["idle_s"] > IDLE_TIMEOUT and waited > IDLE_TIMEOUT:
                return counts
            await trio.sleep(0.05)

    async def run_cell(self, matching: int, size: int, rate: int, count: int) -> dict:
        routing = self.net.routing
        label = f"{routing} {matching:>3} % {size:>3} B {rate:>4}/s"
        cell = Cell(self.next_n, self.next_n + count, matching)
        expect = len(cell.expected)
        await self.crowd.aask(f"cell {cell.lo} {cell.hi} {matching}")
        if self.writer is not None:
            self.writer.tags = {
                "routing": routing,
                "matching_rate": matching,
                "size": size,
                "rate": rate,
            }
        before = self.last_stats or await self.settled_stats()
        cpu = CpuWindow(
            {
                "broker": self.net.pids,
                "supervisor": [self.net.child.pid],
                "crowd": [self.crowd.child.pid],
            }
        )
        self.cell = cell
        strays = self.strays
        elapsed = await self.publish(cell, size, rate)
        published = time.monotonic()
        cell.last_activity = max(cell.last_activity, published)
        await self.wait_measuring(cell)
        await self.wait_crowd(expect, published)
        after = self.last_stats = await self.settled_stats()
        crowd = json.loads(await self.crowd.aask("counts"))  # late duplicates count too
        self.cell = None
        cpu_percent = cpu.finish()
        problems = cell.problems()
        if self.strays > strays:
            problems.append(f"{self.strays - strays} deliveries arrived between cells")
        problems += _crowd_problems(crowd["clients"], expect)
        problems += _restarted(before, after)
        frames = sum(after[b].event_frames - before[b].event_frames for b in after)
        fig = {
            "routing": routing,
            "matching_rate": matching,
            "size": size,
            "rate": rate,
            "published": count,
            # events after the first over the time from the first send to the last
            "publish_rate_per_s": round((count - 1) / elapsed, 1) if elapsed > 0 else None,
            "matching_events": expect,
            "received": len(cell.counts),
            "crowd_clients": len(crowd["clients"]),
            "crowd_received_min": min((c["unique"] for c in crowd["clients"]), default=0),
            "crowd_received_total": sum(c["unique"] for c in crowd["clients"]),
            "event_frames": frames,
            "frames_per_event": round(frames / count, 3),
            "frames_by_broker": {b: after[b].event_frames - before[b].event_frames for b in after},
            # for diagnosis: profile entries each broker keeps, and link ends up after the cell
            # (fewer than expected: a link was suspected, e.g. under overload)
            "profile_entries_by_broker": {b: after[b].profile_entries for b in after},
            "link_ends_up": sum(len(s.links_up) for s in after.values()),
            "link_ends_expected": sum(s.links_expected for s in after.values()),
            "hops": {str(k): v for k, v in sorted(cell.hops.items())},
            "latency_ms": latency_figures(cell.latencies),
            "cpu_percent": cpu_percent,
            "errors": problems,
        }
        lat = fig["latency_ms"]
        log(
            f"{label}: {fig['received']}/{expect} received, {fig['frames_per_event']:.2f}"
            f" frames/event, p50 {_ms(lat.get('p50'))} ms, p99 {_ms(lat.get('p99'))} ms"
            + (f" [red]{'; '.join(problems)}[/red]" if problems else "")
        )
        return fig


def _moving(a: dict[str, m.Stats], b: dict[str, m.Stats]) -> int:
    return sum(
        (b[k].event_frames - a[k].event_frames) + (b[k].delivered - a[k].delivered) for k in b
    )


def _restarted(before: dict[str, m.Stats], after: dict[str, m.Stats]) -> list[str]:
    return [
        f"broker {b} restarted during the cell (its counters began again)"
        for b in after
        if after[b].incarnation != before[b].incarnation
    ]


def _crowd_problems(clients: list[dict], expect: int) -> list[str]:
    out = []
    short = [c for c in clients if c["unique"] < expect]
    if short:
        got = min(c["unique"] for c in short)
        out.append(f"{len(short)} crowd clients missed events (worst: {got} of {expect})")
    for field, what in (
        ("duplicates", "duplicate deliveries"),
        ("wrong", "non-matching events"),
        ("unexpected", "events of another cell"),
    ):
        total = sum(c[field] for c in clients)
        if total:
            out.append(f"crowd clients got {total} {what}")
    errors = sorted({c["error"] for c in clients if c["error"]})
    out += [f"crowd client: {e}" for e in errors]
    return out


def latency_figures(latencies_ns: list[int]) -> dict:
    """Mean, variance (ms²), p50, p99, min, max of one cell's latencies (in arrival order), in
    ms; and the p50 of the first and the last tenth, so a queue that keeps growing shows."""
    if not latencies_ns:
        return {"samples": 0}
    s = sorted(latencies_ns)
    ms = [v / 1e6 for v in s]
    tenth = max(1, len(latencies_ns) // 10)
    return {
        "p50_first_10pct": round(percentile(sorted(latencies_ns[:tenth]), 50) / 1e6, 4),
        "p50_last_10pct": round(percentile(sorted(latencies_ns[-tenth:]), 50) / 1e6, 4),
        "samples": len(s),
        "mean": round(statistics.fmean(ms), 4),
        "variance": round(statistics.variance(ms), 5) if len(ms) > 1 else 0.0,
        "p50": round(percentile(s, 50) / 1e6, 4),
        "p99": round(percentile(s, 99) / 1e6, 4),
        "min": round(s[0] / 1e6, 4),
        "max": round(s[-1] / 1e6, 4),
    }


# -- running -------------------------------------------------------------------------------------


def run_routing(
    kids: Children, routing: str, plan: dict, writer: RecordWriter | None
) -> list[dict]:
    log(f"{routing}: starting ges up --processes --routing {routing} on ges-paper.yaml …")
    net = Network(kids, routing)
    crowd = None
    try:
        crowd = Crowd(kids, net)
        log(
            f"{routing}: {crowd.clients} crowd clients connected; publisher at {PAPER_PUBLISHER},"
            f" measuring subscriber at {PAPER_SUBSCRIBER}"
        )
        meter = Meter(net, crowd, writer)
        try:
            return trio.run(meter.run, plan)
        except (OperationError, BenchError, trio.TooSlowError) as exc:
            raise BenchError(f"{routing}: {exc}") from None
        except BaseExceptionGroup as group:
            leaves = _leaves(group)
            if any(isinstance(e, KeyboardInterrupt) for e in leaves):
                raise KeyboardInterrupt from None
            known = [e for e in leaves if isinstance(e, OperationError | BenchError)]
            if not known:
                raise
            raise BenchError(f"{routing}: {'; '.join(map(str, known))}") from None
    finally:
        if crowd is not None:
            kids.stop(crowd.child)
        kids.stop(net.child)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def summarise(cells: list[dict]) -> list[dict]:
    out = []
    for matching in MATCHING_RATES:
        row: dict = {"matching_rate": matching}
        for routing in ROUTINGS:
            mine = [c for c in cells if c["routing"] == routing and c["matching_rate"] == matching]
            if not mine:
                continue
            published = sum(c["published"] for c in mine)
            frames = sum(c["event_frames"] for c in mine)
            p50s = [c["latency_ms"]["p50"] for c in mine if c["latency_ms"].get("samples")]
            means = [c["latency_ms"]["mean"] for c in mine if c["latency_ms"].get("samples")]
            row[routing] = {
                "published": published,
                "frames_per_event": round(frames / published, 3) if published else None,
                # per-cell figures averaged over the cells, so every size × rate weighs alike
                "latency_p50_ms_cell_mean": round(statistics.fmean(p50s), 4) if p50s else None,
                "latency_mean_ms_cell_mean": round(statistics.fmean(means), 4) if means else None,
            }
        if "flood" in row and "content" in row:
            f, c = row["flood"], row["content"]
            row["frames_ratio"] = _ratio(c["frames_per_event"], f["frames_per_event"])
            row["latency_p50_ratio"] = _ratio(
                c["latency_p50_ms_cell_mean"], f["latency_p50_ms_cell_mean"]
            )
            row["latency_mean_ratio"] = _ratio(
                c["latency_mean_ms_cell_mean"], f["latency_mean_ms_cell_mean"]
            )
            if matching == 10 and row["frames_ratio"] is not None:
                row["meets_frames_aim"] = row["frames_ratio"] <= AIM_FRAMES_RATIO_AT_10
        out.append(row)
    return out


def _ratio(a, b) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 4)


def build_report(cells, plan, args, records, started, errors) -> dict:
    problems = list(errors)
    for c in cells:
        tag = f"{c['routing']} {c['matching_rate']} % {c['size']} B {c['rate']}/s"
        problems += [f"{tag}: {e}" for e in c["errors"]]
    return {
        "bench": "routing",
        "mode": "quick" if args.quick else "full",
        "config": {
            "topology": "topologies/ges-paper.yaml",
            "routings": list(ROUTINGS),
            "baseline": "flood",
            "matching_rates_percent": list(MATCHING_RATES),
            "sizes_bytes": list(plan["sizes"]),
            "rates_per_s": list(plan["rates"]),
            "events_per_cell_by_rate": {str(k): v for k, v in plan["events"].items()},
            "publisher_broker": PAPER_PUBLISHER,
            "measuring_broker": PAPER_SUBSCRIBER,
            "crowd_clients_per_broker": CROWD_PER_BROKER,
            "latency_unit": "ms (variance ms²)",
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "cells": cells,
        "summary": summarise(cells),
        "aims": {"content_frames_ratio_at_10pct_max": AIM_FRAMES_RATIO_AT_10},
        "records": str(records) if records else None,
        "warnings": _warnings(cells),
        "errors": problems,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _warnings(cells: list[dict], limit: float = 25.0) -> list[str]:
    """Cells during which processes outside the bench used more than ``limit`` % of a core, and
    cells after which some links were down."""
    out = []
    for c in cells:
        if c["link_ends_up"] < c["link_ends_expected"]:
            out.append(
                f"{c['routing']} {c['matching_rate']} % {c['size']} B {c['rate']}/s: only"
                f" {c['link_ends_up']} of {c['link_ends_expected']} link ends up after the cell"
            )
        other = c["cpu_percent"].get("other")
        if other is not None and other > limit:
            out.append(
                f"{c['routing']} {c['matching_rate']} % {c['size']} B {c['rate']}/s: other"
                f" processes used {other:.0f} % of a core during the cell; its figures are"
                " pessimistic"
            )
    return out


# -- report --------------------------------------------------------------------------------------


def _ms(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _x(value) -> str:
    return "—" if value is None else f"{100 * value:.0f} %"


def render(report: dict, out: Console) -> None:
    cells = report["cells"]
    if not cells:
        return
    by_key = {(c["routing"], c["matching_rate"], c["size"], c["rate"]): c for c in cells}
    table = Table(
        title=(
            f"GES content routing vs flooding on ges-paper.yaml ({report['mode']} run,"
            f" {report['seconds']:.0f} s)"
        ),
        caption=(
            "publisher at 22, measuring subscriber at 10, 100 more subscribers (5 at each other"
            " broker), all on bucket < matching rate.\nframes/ev = broker-to-broker Events frames"
            " (all 22 brokers) per published event; latency = received_at − published_at at the"
            " measuring subscriber, in ms (var in ms²).\nc/f = content routing over flooding"
            " (the baseline, measured in this run). pub/s = publish rate achieved (the publisher"
            " waits while 16 publishes are unacknowledged)."
        ),
        caption_justify="left",
    )
    for name, justify in (
        ("match", "right"),
        ("size B", "right"),
        ("rate/s", "right"),
        ("routing", "left"),
        ("pub", "right"),
        ("pub/s", "right"),
        ("recv", "right"),
        ("crowd min", "right"),
        ("frames/ev", "right"),
        ("c/f", "right"),
        ("mean", "right"),
        ("var", "right"),
        ("p50", "right"),
        ("p99", "right"),
        ("p50 c/f", "right"),
        ("other CPU %", "right"),
    ):
        table.add_column(name, justify=justify)
    keys = sorted(
        {(c["matching_rate"], c["size"], c["rate"]) for c in cells},
        key=lambda k: (-k[0], k[1], k[2]),
    )
    for i, (matching, size, rate) in enumerate(keys):
        last_of_group = i + 1 == len(keys) or keys[i + 1][0] != matching
        flood = by_key.get(("flood", matching, size, rate))
        for routing in ROUTINGS:
            c = by_key.get((routing, matching, size, rate))
            if c is None:
                continue
            lat = c["latency_ms"]
            frames_ratio = p50_ratio = ""
            if routing == "content" and flood is not None:
                frames_ratio = _x(_ratio(c["frames_per_event"], flood["frames_per_event"]))
                p50_ratio = _x(_ratio(lat.get("p50"), flood["latency_ms"].get("p50")))
            bad = bool(c["errors"])
            table.add_row(
                f"{matching} %",
                str(size),
                f"{rate:,}",
                routing,
                f"{c['published']:,}",
                _ms(c["publish_rate_per_s"]),
                ("[red]" if bad else "") + f"{c['received']:,}/{c['matching_events']:,}",
                f"{c['crowd_received_min']:,}",
                f"{c['frames_per_event']:.2f}",
                frames_ratio,
                _ms(lat.get("mean")),
                _ms(lat.get("variance")),
                _ms(lat.get("p50")),
                _ms(lat.get("p99")),
                p50_ratio,
                _ms(c["cpu_percent"].get("other")),
                end_section=routing == "content" and last_of_group,
            )
    out.print(table)

    summary = Table(
        title="Summary per matching rate (content routing / flooding)",
        caption=(
            "frames/ev over every cell of that matching rate; latency = mean over the cells of"
            " each cell's p50 (or mean), in ms, so every size × rate weighs alike.\n"
            f"aim: at 10 % matching, content routing ≤ {100 * AIM_FRAMES_RATIO_AT_10:.0f} % of"
            " flooding's frames."
        ),
        caption_justify="left",
    )
    for name in (
        "matching",
        "flood frames/ev",
        "content frames/ev",
        "frames c/f",
        "flood p50 · mean",
        "content p50 · mean",
        "p50 c/f",
        "mean c/f",
    ):
        summary.add_column(name, justify="right")
    for row in report["summary"]:
        f, c = row.get("flood", {}), row.get("content", {})
        ok = row.get("meets_frames_aim")
        mark = "" if ok is None else (" [green]✓[/green]" if ok else " [red]✗[/red]")
        summary.add_row(
            f"{row['matching_rate']} %",
            _ms(f.get("frames_per_event")),
            _ms(c.get("frames_per_event")),
            _x(row.get("frames_ratio")) + mark,
            f"{_ms(f.get('latency_p50_ms_cell_mean'))} · {_ms(f.get('latency_mean_ms_cell_mean'))}",
            f"{_ms(c.get('latency_p50_ms_cell_mean'))} · {_ms(c.get('latency_mean_ms_cell_mean'))}",
            _x(row.get("latency_p50_ratio")),
            _x(row.get("latency_mean_ratio")),
        )
    out.print(summary)
    hops = Counter()
    for c in cells:
        hops.update({(c["routing"], int(k)): v for k, v in c["hops"].items()})
    for routing in ROUTINGS:
        mine = {k[1]: v for k, v in sorted(hops.items()) if k[0] == routing}
        if mine:
            out.print(f"{routing}: 22→10 deliveries by hop count: {mine}")
    if report["records"]:
        out.print(f"delivery records: {report['records']}", soft_wrap=True)
    for warning in report["warnings"]:
        out.print(f"[yellow]warning:[/yellow] {warning}", soft_wrap=True)


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description="GES content routing beside flooding on seed 004's 22-broker network."
    )
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--records",
        type=Path,
        default=None,
        help="delivery records of the measuring subscriber (JSON lines; overwritten)"
        " [default: a new file in the system temp directory]",
    )
    args = parser.parse_args()
    plan = SIZES["quick" if args.quick else "full"]
    records = args.records or Path(tempfile.gettempdir()) / (
        f"ges-bench-routing-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"
    )
    try:
        record_file = open(records, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        parser.error(f"--records {records}: cannot open: {exc.strerror}")
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="ges-bench-routing-"))
    kids = Children(tmp)
    # SIGTERM becomes a SIGINT: trio (or Python, outside trio.run) turns it into a clean
    # KeyboardInterrupt, so every child is stopped the same way as on Ctrl-C
    terminated = []

    def on_sigterm(*_):
        terminated.append(True)
        signal.raise_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, on_sigterm)
    writer = RecordWriter(record_file, subscriber_broker=PAPER_SUBSCRIBER, client="")
    cells: list[dict] = []
    errors: list[str] = []
    try:
        for routing in ROUTINGS:
            cells += run_routing(kids, routing, plan, writer)
    except BenchError as exc:
        errors.append(str(exc))
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/bold red]")
        return 143 if terminated else 130
    finally:
        kids.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
        record_file.close()
    report = build_report(cells, plan, args, records, started, errors)
    render(report, console if args.json else Console(highlight=False, width=_width(sys.stdout)))
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    for problem in report["errors"]:
        console.print(f"[bold red]error:[/bold red] {problem}", soft_wrap=True)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
