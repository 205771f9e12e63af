"""Matching throughput and memory of the profile graph beside the naive evaluator, same run.

    python bench/matching.py [--quick] [--json] [--sizes 1000,10000,100000] [--seed S]

Workload: stock quotes, like seed 000's examples (``stock = nyse : t&p > 19``). Events carry a
symbol (one of 500), an exchange (one of 10), a price in [0, 200) and a volume. Each profile is
its own destination (one subscriber each, the hard case: every match must name every matching
subscriber) and is drawn as

- symbol: ``eq`` one symbol (90 %) or ``in`` three symbols (10 %);
- exchange: ``eq`` one exchange (50 %);
- price: a range ``ge lo and lt hi`` (35 %), ``gt lo`` (20 %), ``le hi`` (20 %), none (25 %);
- volume: ``gt v`` (20 %).

For every profile count N the script builds a ``ProfileGraph`` (timing the N adds), measures
its memory with tracemalloc in a second build, matches a stream of events and times it, and
times the naive evaluator (every profile's ``matches`` on every event) on a prefix of the same
stream. Both must return the same destinations for every event they both see — a mismatch is
an error (exit 1). Throughput is events/s; the ratio is graph / naive.

Aims (issue 3): ≥ 200,000 events/s at 10,000 profiles, ≥ 50× the naive evaluator at 100,000
profiles, 100,000 profiles added in under 5 s.

**Subscribing and removing one large profile** (issue 17), beside the exporter as it was before
it (``_baseline_export``: ``ges/routing/export.py`` of commit 6678d4f, which compared every pair of
conjunctions with ``covers``). One profile of N = 1, 64, 1,024 and 4,096 conjunctions (4,096 only
in the full run), in two shapes:

- ``distinct``: ``sym = S<i> and price > <i>`` for i = 0 … N−1 — each pins its own symbol, so
  none covers another and all N are exported;
- ``covering``: ``price > -1`` first, then the first N−1 of those, which it covers — one
  conjunction is exported, and removing the profile removes a covering conjunction first.

Each measurement runs in a process of its own (``_subscription_run.py``, which says exactly what
it does) with a time limit per phase: 30 s, 5 s with ``--quick`` (``--limit``). A baseline phase
over the limit is stopped and shown as ``> 30 s (stopped, k/N)`` — k conjunctions done — with
its ratio as a lower bound (``> R×``), and the phases after it are not run; the new code over the
limit is a failure (exit 1).

- Exporter, new beside old: the time to ``add`` every conjunction of the profile (subscribe) and
  then to ``remove`` them all in the same order (unsubscribe; what ``step(WORK_SLICE)`` leaves
  pending is drained, and counted, after each phase); GC as usual. Also, in the ``covering``
  shape, the time to remove the covering conjunction *alone* while the N−1 it covered stay (they
  are exported again: a profile change, or another client's wide subscription going) — in a
  whole unsubscribe they are removed before they would be.
- Broker core, new code only (the old core is gone): ``BrokerCore`` b3 of ``topologies/demo.yaml``
  (reliable delivery), ``client_message(Subscribe(1, profile))`` and ``work()`` while
  ``has_work``, then the same for ``Unsubscribe(1)``: the whole request's time, its slices
  (``WORK_SLICE`` work units each), the median and longest slice — once with the garbage
  collector disabled during the request, once with it running as usual, with its longest full
  (generation 2) pass.

Also per measurement: the CPU other processes used meanwhile (a warning names those over a
quarter of a core), and the RSS growth and peak of the measuring process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ges.matching.graph import ProfileGraph
from ges.matching.model import Conjunction, Constraint, Profile

#: Timed passes of the graph over the event stream; the best is reported, the spread shown.
REPEATS = 3
SYMBOLS = [f"S{i:03d}" for i in range(500)]
EXCHANGES = ["NYSE", "NASDAQ", "LSE", "TSE", "HKEX", "EURONEXT", "SSE", "TSX", "BSE", "ASX"]


def make_profile(rng: random.Random, i: int) -> Profile:
    cs = []
    if rng.random() < 0.9:
        cs.append(Constraint("symbol", "eq", rng.choice(SYMBOLS)))
    else:
        cs.append(Constraint("symbol", "in", tuple(rng.sample(SYMBOLS, 3))))
    if rng.random() < 0.5:
        cs.append(Constraint("exchange", "eq", rng.choice(EXCHANGES)))
    r = rng.random()
    lo = round(rng.uniform(0, 150), 2)
    if r < 0.35:
        cs += [Constraint("price", "ge", lo), Constraint("price", "lt", lo + rng.uniform(5, 50))]
    elif r < 0.55:
        cs.append(Constraint("price", "gt", lo))
    elif r < 0.75:
        cs.append(Constraint("price", "le", round(rng.uniform(50, 200), 2)))
    if rng.random() < 0.2:
        cs.append(Constraint("volume", "gt", rng.randrange(100, 10_000)))
    return Profile(f"p{i}", (Conjunction(cs),))


def make_event(rng: random.Random) -> dict:
    return {
        "symbol": rng.choice(SYMBOLS),
        "exchange": rng.choice(EXCHANGES),
        "price": round(rng.uniform(0, 200), 2),
        "volume": rng.randrange(1, 20_000),
    }


def naive_match(profiles, event) -> set:
    return {i for i, p in enumerate(profiles) if p.matches(event)}


def measure(n: int, events: list[dict], naive_events: int, seed: int, progress) -> dict:
    rng = random.Random(seed * 1_000_003 + n)
    profiles = [make_profile(rng, i) for i in range(n)]

    gc.collect()
    graph = ProfileGraph()
    t0 = time.perf_counter()
    for i, p in enumerate(profiles):
        graph.add(p, i)
    add_s = time.perf_counter() - t0
    progress(f"{n:>7} profiles: added in {add_s:.2f}s ({graph.node_count} nodes)")

    # best of REPEATS passes over the stream (like timeit): this machine's speed wanders
    match_runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        results = [graph.match(e) for e in events]
        match_runs.append(time.perf_counter() - t0)
    match_s = min(match_runs)
    matched = sum(map(len, results)) / len(events)
    progress(f"{n:>7} profiles: graph {len(events) / match_s:,.0f} events/s")

    sample = events[:naive_events]
    t0 = time.perf_counter()
    naive = [naive_match(profiles, e) for e in sample]
    naive_s = time.perf_counter() - t0
    progress(f"{n:>7} profiles: naive {len(sample) / naive_s:,.0f} events/s")
    mismatches = sum(a != b for a, b in zip(results, naive, strict=False))

    # memory: a second build under tracemalloc (it slows adds, so it is not the timed one)
    del graph
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    graph = ProfileGraph()
    for i, p in enumerate(profiles):
        graph.add(p, i)
    graph_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del graph
    gc.collect()

    graph_rate = len(events) / match_s
    naive_rate = len(sample) / naive_s
    return {
        "profiles": n,
        "add_seconds": round(add_s, 3),
        "adds_per_second": round(n / add_s),
        "graph_events_per_second": round(graph_rate),
        "graph_events_per_second_worst": round(len(events) / max(match_runs)),
        "naive_events_per_second": round(naive_rate, 1),
        "ratio": round(graph_rate / naive_rate, 1),
        "graph_events": len(events),
        "naive_events": len(sample),
        "mean_matches_per_event": round(matched, 2),
        "graph_memory_mib": round(graph_bytes / 2**20, 1),
        "graph_bytes_per_profile": round(graph_bytes / n),
        "mismatches": mismatches,
    }


def render(report: dict, console: Console) -> None:
    table = Table(title="Profile graph vs naive evaluator (stock-quote workload)")
    for col in ("profiles", "add all", "graph ev/s", "naive ev/s", "ratio", "hits/ev", "memory"):
        table.add_column(col, justify="right")
    for r in report["runs"]:
        table.add_row(
            f"{r['profiles']:,}",
            f"{r['add_seconds']:.2f} s",
            f"{r['graph_events_per_second']:,}",
            f"{r['naive_events_per_second']:,.1f}",
            f"{r['ratio']:,.0f}×",
            f"{r['mean_matches_per_event']}",
            f"{r['graph_memory_mib']} MiB",
        )
    console.print(table)
    console.print(
        f"graph ev/s: best of {REPEATS} passes (worst: "
        + ", ".join(f"{r['graph_events_per_second_worst']:,}" for r in report["runs"])
        + "); hits/ev: destinations matched per event; memory: tracemalloc, graph only",
        highlight=False,
    )
    for line in report["aims"]:
        console.print(line, highlight=False)


def aims(runs: list[dict]) -> list[str]:
    by = {r["profiles"]: r for r in runs}
    out = []
    if 10_000 in by:
        r = by[10_000]["graph_events_per_second"]
        out.append(
            f"aim ≥ 200,000 events/s at 10,000 profiles: {r:,} — {'met' if r >= 200_000 else 'NOT met'}"
        )
    if 100_000 in by:
        r = by[100_000]["ratio"]
        out.append(
            f"aim ≥ 50× naive at 100,000 profiles: {r:,.1f}× — {'met' if r >= 50 else 'NOT met'}"
        )
        s = by[100_000]["add_seconds"]
        out.append(f"aim 100,000 adds < 5 s: {s:.2f} s — {'met' if s < 5 else 'NOT met'}")
    return out


# -- subscribing and removing one large profile (issue 17) ---------------------------------------

HELPER = Path(__file__).resolve().parent / "_subscription_run.py"
SUB_SIZES = (1, 64, 1024, 4096)
SUB_SIZES_QUICK = (1, 64, 1024)
LIMIT = 30.0
LIMIT_QUICK = 5.0
#: Seconds a measuring process may take to start and build its profile.
SETUP_LIMIT = 60.0
#: Other processes using more than this % of a core during a measurement: a warning.
BUSY_NEIGHBOUR = 25.0


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine spent busy so far (Linux /proc/stat)."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def _own_and_children_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _peak_rss_mib(pid: int) -> float | None:
    """Peak resident set size of a live process (Linux /proc ``VmHWM``), MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, IndexError, ValueError):
        pass
    return None


def run_child(args: list[str], limit: float) -> dict:
    """Run ``_subscription_run.py ARGS``; each phase may last ``limit`` seconds from its start
    line, after which the process is killed and the phase reported as stopped."""
    result: dict = {"args": args, "phases": {}, "error": None}
    machine, own, wall = machine_busy_seconds(), _own_and_children_cpu(), time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    stderr: list[str] = []

    def read_stdout() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def read_stderr() -> None:
        stderr.append(proc.stderr.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + SETUP_LIMIT
    phase, done, killed, start = None, 0, False, {}
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            result["end"] = {"max_rss_mib": _peak_rss_mib(proc.pid)}
            proc.kill()
            killed = True
            if phase is None:
                result["error"] = f"no phase started within {SETUP_LIMIT:.0f} s"
            else:
                result["phases"][phase] = {
                    "stopped": True,
                    "limit": limit,
                    "done": done,
                    "unit": start.get("unit"),
                    "of": start.get("of"),
                }
            break
        if line is None:
            break
        record = json.loads(line)
        if "start" in record:
            phase, done, start = record["start"], 0, record
            deadline = time.monotonic() + limit
        elif "progress" in record:
            done = record["done"]
        elif "phase" in record:
            result["phases"][record.pop("phase")] = record
            phase = None
            deadline = time.monotonic() + SETUP_LIMIT
        elif "end" in record:
            result["end"] = record
        elif "error" in record:
            result["error"] = record["error"]
    rc = proc.wait()
    for t in readers:
        t.join(timeout=5)
    if not killed and rc != 0 and result["error"] is None:
        result["error"] = f"exit {rc}: " + "".join(stderr).strip()[-500:]
    wall = time.perf_counter() - wall
    busy = machine_busy_seconds()
    if machine is not None and busy is not None and wall > 0:
        other = max(0.0, (busy - machine) - (_own_and_children_cpu() - own))
        result["other_cpu_percent"] = round(100 * other / wall, 1)
    result["wall_seconds"] = round(wall, 2)
    return result


def _phase(run: dict, name: str) -> dict | None:
    """A phase's figures; ``{"stopped": …}`` if it ran over its limit; None if it did not run."""
    return run["phases"].get(name)


def _ratio(old: dict | None, new: dict | None) -> tuple[float | None, bool]:
    """old ÷ new and whether it is a lower bound (the old phase was stopped)."""
    if old is None or new is None or new.get("stopped") or not new["seconds"]:
        return None, False
    if old.get("stopped"):
        return old["limit"] / new["seconds"], True
    return old["seconds"] / new["seconds"], False


def subscriptions(sizes: list[int], limit: float, progress) -> tuple[dict, list[str]]:
    """Both levels of the issue-17 measurement; the report and the errors."""
    errors: list[str] = []
    runs: list[dict] = []

    def child(args: list[str], *, baseline: bool = False) -> dict:
        run = run_child(args, limit)
        runs.append(run)
        what = " ".join(args)
        if run["error"]:
            errors.append(f"{what}: {run['error']}")
        for name, ph in run["phases"].items():
            if ph.get("stopped") and not baseline:
                errors.append(f"{what}: {name} over the {limit:g} s limit")
        shown = ", ".join(
            f"{name} " + ("stopped" if ph.get("stopped") else _fmt_s(ph["seconds"]))
            for name, ph in run["phases"].items()
        )
        progress(f"{what}: {shown or run['error']}")
        return run

    exporter = []
    for shape in ("distinct", "covering", "alone"):
        for n in sizes:
            new = child(["exporter", "new", shape, str(n)])
            old = child(["exporter", "old", shape, str(n)], baseline=True)
            row: dict = {"shape": shape, "conjunctions": n}
            for name in ("subscribe", "unsubscribe", "remove_wide"):
                a, b = _phase(new, name), _phase(old, name)
                if a is None and b is None:
                    continue
                ratio, bound = _ratio(b, a)
                row[name] = {
                    "new": a,
                    "old": b,
                    "ratio": None if ratio is None else round(ratio, 2 if ratio < 10 else 1),
                    "ratio_is_lower_bound": bound,
                }
            row["other_cpu_percent"] = max(r.get("other_cpu_percent") or 0.0 for r in (new, old))
            row["peak_rss_mib"] = {
                "new": new.get("end", {}).get("max_rss_mib"),
                "old": old.get("end", {}).get("max_rss_mib"),
            }
            exporter.append(row)
    core = []
    for shape in ("distinct", "covering"):
        for n in sizes:
            off = child(["core", shape, str(n), "nogc"])
            on = child(["core", shape, str(n), "gc"])
            frozen = child(["core", shape, str(n), "freeze"])
            for name in ("subscribe", "unsubscribe"):
                core.append(
                    {
                        "shape": shape,
                        "conjunctions": n,
                        "request": name,
                        "gc_off": _phase(off, name),
                        "gc_on": _phase(on, name),
                        "gc_frozen": _phase(frozen, name),
                        "other_cpu_percent": max(
                            r.get("other_cpu_percent") or 0.0 for r in (off, on, frozen)
                        ),
                        "peak_rss_mib": on.get("end", {}).get("max_rss_mib"),
                    }
                )
    busy = [
        " ".join(r["args"]) for r in runs if (r.get("other_cpu_percent") or 0.0) > BUSY_NEIGHBOUR
    ]
    others = [r["other_cpu_percent"] for r in runs if r.get("other_cpu_percent") is not None]
    report = {
        "sizes": sizes,
        "limit_seconds": limit,
        "work_slice": _work_slice(),
        "exporter": exporter,
        "core": core,
        "other_cpu_percent_max": max(others, default=None),
        "other_cpu_percent_mean": round(statistics.mean(others), 1) if others else None,
        "busy_runs": busy,
        "measurements": len(runs),
    }
    return report, errors


def _work_slice() -> int:
    from ges.core.work import WORK_SLICE

    return WORK_SLICE


def _fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.1f} s"


def _fmt_phase(ph: dict | None) -> str:
    if ph is None:
        return "not run"
    if ph.get("stopped"):
        done = f"{ph['done']:,}/{ph['of']:,}" if ph.get("of") else f"{ph['done']:,} {ph['unit']}"
        return f"> {ph['limit']:g} s (stopped, {done})"
    return _fmt_s(ph["seconds"])


def _fmt_ratio(cell: dict) -> str:
    ratio = cell["ratio"]
    if ratio is None:
        return "–"
    shown = f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.2g}"
    return f"{'> ' if cell['ratio_is_lower_bound'] else ''}{shown}×"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def render_subscriptions(report: dict, console: Console) -> None:
    limit = report["limit_seconds"]
    table = Table(
        title="One profile subscribed and removed: exporter with covering index (new) vs "
        "all-pairs exporter of 6678d4f (old)"
    )
    for col in (
        "profile",
        "conjunctions",
        "subscribe new",
        "subscribe old",
        "ratio",
        "unsubscribe new",
        "unsubscribe old",
        "ratio",
        "exported new · old",
    ):
        table.add_column(col, justify="right")
    for r in report["exporter"]:
        if "subscribe" not in r or "unsubscribe" not in r:
            continue
        n, sub, unsub = r["conjunctions"], r["subscribe"], r["unsubscribe"]
        exported = " · ".join(
            "–" if (p is None or p.get("stopped")) else f"{p['exported']:,}"
            for p in (sub["new"], sub["old"])
        )
        table.add_row(
            r["shape"],
            f"{n:,}",
            _fmt_phase(sub["new"]),
            _fmt_phase(sub["old"]),
            _fmt_ratio(sub),
            _fmt_phase(unsub["new"]),
            _fmt_phase(unsub["old"]),
            _fmt_ratio(unsub),
            exported,
        )
    console.print(table)
    table = Table(
        title="Covering profile: the covering conjunction removed alone (the N−1 it covered "
        "stay, exported again)"
    )
    for col in ("conjunctions", "new", "old", "ratio", "changes sent", "steps (new)"):
        table.add_column(col, justify="right")
    for r in report["exporter"]:
        cell = r.get("remove_wide")
        if cell is None:
            continue
        n, new = r["conjunctions"], cell["new"]
        table.add_row(
            f"{n:,}",
            _fmt_phase(new),
            _fmt_phase(cell["old"]),
            _fmt_ratio(cell),
            "–" if new is None or new.get("stopped") else f"{new['ops']:,}",
            "–" if new is None or new.get("stopped") else f"{new['steps']:,}",
        )
    console.print(table)
    console.print(
        f"old: bench/_baseline_export.py; a phase over {limit:g} s was stopped (k/N: "
        "conjunctions done by then) and its ratio is a lower bound; the phases after it were "
        "not run. Each measurement in a fresh process, GC as usual.",
        highlight=False,
    )
    table = Table(
        title=f"Broker core b3 (demo.yaml, reliable), new code: whole request and its slices "
        f"({report['work_slice']} work units each)"
    )
    for col in (
        "profile",
        "conjunctions",
        "request",
        "time",
        "slices",
        "median slice",
        "longest slice",
        "time, GC on",
        "longest, GC on",
        "full GC pass",
        "longest, frozen",
        "RSS growth",
    ):
        table.add_column(col, justify="right")
    for r in report["core"]:
        off, on, n = r["gc_off"], r["gc_on"], r["conjunctions"]
        frozen = r["gc_frozen"]
        ok_off = off is not None and not off.get("stopped")
        ok_on = on is not None and not on.get("stopped")
        ok_frozen = frozen is not None and not frozen.get("stopped")
        table.add_row(
            r["shape"],
            f"{n:,}",
            r["request"],
            _fmt_phase(off),
            f"{off['slices']:,}" if ok_off else "–",
            _ms(off["slice_median_ms"]) if ok_off else "–",
            _ms(off["slice_max_ms"]) if ok_off else "–",
            _fmt_phase(on),
            _ms(on["slice_max_ms"]) if ok_on else "–",
            _ms(on["gc_full_max_ms"]) if ok_on and on["gc_full_passes"] else "none",
            _ms(frozen["slice_max_ms"]) if ok_frozen else "–",
            f"{off['rss_growth_mib']} MiB"
            if ok_off and r["request"] == "subscribe" and off["rss_growth_mib"] is not None
            else "",
        )
    console.print(table)
    console.print(
        "time, slices, median and longest slice: the collector disabled during the request "
        "(after gc.collect()); GC on: as a broker runs it — a slice that holds a full "
        "(generation 2) pass takes that pass longer (full GC pass: the longest); frozen: GC on, "
        "and after each slice what is alive is frozen (gc.freeze), as the trio runtime does. "
        "The first slice runs inside client_message. RSS growth: the measuring process's "
        "resident memory after the subscribe (b3 keeps c1 and SC-1: three profile graphs).",
        highlight=False,
    )
    if report["other_cpu_percent_max"] is not None:
        console.print(
            f"other processes' CPU during the measurements: mean "
            f"{report['other_cpu_percent_mean']:.0f} %, max {report['other_cpu_percent_max']:.0f}"
            " % of a core",
            highlight=False,
        )
    busy = report["busy_runs"]
    if busy:
        which = (
            ", ".join(busy)
            if len(busy) <= 4
            else f"{len(busy)} of the {report['measurements']} measurements"
        )
        console.print(
            f"warning: other processes used more than {BUSY_NEIGHBOUR:.0f} % of a core during "
            f"{which}: those figures are pessimistic",
            highlight=False,
        )


def _width(stream) -> int | None:
    """Rich's own width on a terminal; wide enough for the tables when piped to a file."""
    return None if stream.isatty() else 160


def _positive_ints(parser, flag: str, text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",")]
        if any(v < 1 for v in values):
            raise ValueError
    except ValueError:
        parser.error(f"{flag} {text!r}: expected positive integers separated by commas")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events (under a minute)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--sizes", default="1000,10000,100000", help="profile counts, comma-separated"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only",
        choices=("matching", "subscriptions"),
        help="one part: the profile graph, or subscribing and removing one large profile",
    )
    parser.add_argument(
        "--conjunctions",
        help="profile sizes of the subscriptions part, comma-separated "
        f"(default {','.join(map(str, SUB_SIZES))}; --quick {','.join(map(str, SUB_SIZES_QUICK))})",
    )
    parser.add_argument(
        "--limit",
        type=float,
        help=f"seconds a phase of a subscriptions measurement may last (default {LIMIT:.0f}; "
        f"--quick {LIMIT_QUICK:.0f})",
    )
    args = parser.parse_args()
    sizes = _positive_ints(parser, "--sizes", args.sizes)
    default_conj = SUB_SIZES_QUICK if args.quick else SUB_SIZES
    conj_sizes = (
        _positive_ints(parser, "--conjunctions", args.conjunctions)
        if args.conjunctions
        else list(default_conj)
    )
    limit = args.limit if args.limit is not None else (LIMIT_QUICK if args.quick else LIMIT)
    if limit <= 0:
        parser.error(f"--limit {args.limit}: expected a positive number of seconds")
    err = Console(stderr=True, highlight=False, width=_width(sys.stderr))
    runs = []
    if args.only != "subscriptions":
        rng = random.Random(args.seed)
        n_events = 20_000 if args.quick else 200_000
        events = [make_event(rng) for _ in range(n_events)]
        for n in sizes:
            # the naive evaluator costs O(profiles) per event: give it about the same work per
            # size
            naive_events = max(20, min(n_events, (2_000_000 if not args.quick else 300_000) // n))
            runs.append(measure(n, events, naive_events, args.seed, err.print))
        del events
    sub_report, sub_errors = None, []
    if args.only != "matching":
        sub_report, sub_errors = subscriptions(conj_sizes, limit, err.print)
    report = {
        "bench": "matching",
        "python": sys.version.split()[0],
        "seed": args.seed,
        "quick": args.quick,
        "runs": runs,
        "aims": aims(runs),
        "subscriptions": sub_report,
    }
    out = err if args.json else Console(highlight=False, width=_width(sys.stdout))
    if runs:
        render(report, out)
    if sub_report is not None:
        render_subscriptions(sub_report, out)
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    bad = [r for r in runs if r["mismatches"]]
    for r in bad:
        err.print(
            f"error: {r['mismatches']} events matched differently at {r['profiles']} profiles"
        )
    for e in sub_errors:
        err.print(f"error: {e}")
    return 1 if bad or sub_errors else 0


if __name__ == "__main__":
    sys.exit(main())
