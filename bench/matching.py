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
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events (under a minute)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--sizes", default="1000,10000,100000", help="profile counts, comma-separated"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        if any(s < 1 for s in sizes):
            raise ValueError
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected positive integers separated by commas")
    err = Console(stderr=True, highlight=False)
    rng = random.Random(args.seed)
    n_events = 20_000 if args.quick else 200_000
    events = [make_event(rng) for _ in range(n_events)]
    runs = []
    for n in sizes:
        # the naive evaluator costs O(profiles) per event: give it about the same work per size
        naive_events = max(20, min(n_events, (2_000_000 if not args.quick else 300_000) // n))
        runs.append(measure(n, events, naive_events, args.seed, err.print))
    report = {
        "bench": "matching",
        "python": sys.version.split()[0],
        "seed": args.seed,
        "quick": args.quick,
        "runs": runs,
        "aims": aims(runs),
    }
    render(report, err if args.json else Console(highlight=False))
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    bad = [r for r in runs if r["mismatches"]]
    for r in bad:
        err.print(
            f"error: {r['mismatches']} events matched differently at {r['profiles']} profiles"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
