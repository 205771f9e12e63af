"""``ges stats latency`` on Spark beside a single-process pure-Python baseline (issue 6).

    python bench/stats_latency.py [--quick] [--json] [--sizes N,…] [--baseline-max N] [--dir DIR]

For each size N (full run: 10 k, 100 k, 1 M and 10 M records, ~3 min on a quiet machine, most
of it generating records and the baseline; ``--quick``: 10 k and 100 k, under a minute), Spark
generates N delivery records shaped like seed 004's experiment — matching rate 10/50/100 %,
publish rate 1–1,000/s, 30 or 500 bytes, 1–6 hops, 100 clients, latency growing with hops, rate
and matching rate, 0.1 % negative (clock skew) — and writes them twice: as JSON lines (a directory of part files, ~260 bytes a record: 2.6 GB at 10 M) and as
Parquet (~19 bytes a record). Generating is not timed. Then, timed, wall clock, each grouping by
``matching_rate,rate`` (12 groups, seed 004 Figure 7's axes):

- **Spark, JSON lines**: ``ges.stats.latency.latency_stats`` on the JSON lines, exact;
- **Spark, Parquet**: the same on the Parquet copy, exact (two passes), and ``--approx`` (one);
- **Python** (the baseline): ``ges.stats._latency_reference.reference_latency`` on the JSON lines:
  one process parses and validates every line (``ges.records.parse_record``), keeps every
  latency, sorts each group. Skipped above ``--baseline-max`` (default: every size).

Spark runs in local mode on every core (``local[*]``, the defaults of ``ges.stats.spark``);
one warm-up job on 10 k records before the first timed one keeps JVM start-up and code
generation out of the figures. Each Spark result is checked against the baseline's (counts,
min, max and percentiles equal; mean and variance to 1e-9; ``--approx`` percentiles within a
histogram bucket), so the figures are of correct answers. Reported per size and engine: wall
seconds, records/s, the baseline's time over Spark's, and *other* — CPU that processes outside
this one and its JVM used meanwhile (above a quarter of a core: a warning, figures pessimistic).
The summary says from what size Spark is faster than the baseline. Aim (issue 6): 10 M records
in ≤ 60 s on this 2-core machine.

``--json`` prints one JSON object on stdout; the table and progress go to stderr. Exit code 0
when every run completed and agreed with the baseline, 1 otherwise, 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput as tp  # noqa: E402

from ges.stats import spark as sparkjob  # noqa: E402
from ges.stats._latency_reference import reference_latency  # noqa: E402
from ges.stats.group_keys import parse_by  # noqa: E402
from ges.stats.latency import MANTISSA_BITS, latency_stats  # noqa: E402

SIZES = {"full": [10_000, 100_000, 1_000_000, 10_000_000], "quick": [10_000, 100_000]}
BY = "matching_rate,rate"
#: Issue 6's aim for the largest size.
AIM = {"records": 10_000_000, "seconds": 60.0}
#: Above this share of a core used by other processes, a run's figures are flagged.
OTHER_CPU_WARN = 25.0
#: Records per generated part file: the JSON part files stay around 260 MB.
RECORDS_PER_PART = 1_000_000
T0 = 1_700_000_000_000_000_000


# -- inputs ----------------------------------------------------------------------------------------


def generate(spark, n: int, where: Path) -> dict:
    """N records as JSON lines and as Parquet under ``where``; returns both paths and sizes."""
    from pyspark.sql import functions as F

    from ges import records

    parts = max(1, math.ceil(n / RECORDS_PER_PART))
    idx = F.col("id")

    def pick(values, salt: int):
        choice = F.pmod(F.xxhash64(idx, F.lit(salt)), len(values)) + 1
        return F.element_at(F.array(*[F.lit(v) for v in values]), choice.cast("int"))

    matching, rate, size = pick([10, 50, 100], 1), pick([1, 10, 100, 1000], 2), pick([30, 500], 3)
    hops = (F.pmod(F.xxhash64(idx, F.lit(4)), 6) + 1).cast("long")
    # ns: 150 µs a hop, queueing growing with rate × matching, an exponential tail
    latency = (
        F.lit(150_000) * hops
        + matching * rate * F.lit(30.0) * F.rand(5)
        + F.lit(200_000.0) * -F.log(F.lit(1.0) - F.rand(6))
    ).cast("long")
    latency = F.when(F.rand(7) < 0.001, -(latency / 10).cast("long")).otherwise(latency)
    published = F.lit(T0) + idx * 1000
    pubend = F.lit("b22~1")
    frame = spark.range(n, numPartitions=parts).select(
        F.concat(pubend, F.lit(":"), idx.cast("string")).alias("event_id"),
        pubend.alias("pubend"),
        idx.alias("tick"),
        F.lit("b22").alias("publisher_broker"),
        F.concat(F.lit("b"), (F.pmod(idx, 21) + 1).cast("string")).alias("subscriber_broker"),
        F.concat(F.lit("c"), F.pmod(idx, 100).cast("string")).alias("client"),
        published.alias("published_at"),
        (published + latency).alias("received_at"),
        size.cast("long").alias("size"),
        hops.alias("hops"),
        F.create_map(
            F.lit("matching_rate"),
            matching.cast("string"),
            F.lit("rate"),
            rate.cast("string"),
            F.lit("size"),
            size.cast("string"),
        ).alias("tags"),
    )
    assert [f.name for f in frame.schema.fields] == list(records.FIELD_NAMES)
    jsonl, parquet = where / f"r{n}.jsonl", where / f"r{n}.parquet"
    frame.write.mode("overwrite").json(str(jsonl))
    frame.write.mode("overwrite").parquet(str(parquet))
    return {
        "jsonl": jsonl,
        "parquet": parquet,
        "jsonl_bytes": _du(jsonl),
        "parquet_bytes": _du(parquet),
    }


def _du(path: Path) -> int:
    return sum(
        p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")
    )


# -- measuring -------------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (the JVM Spark starts), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def timed(run) -> tuple[object, dict]:
    """Run ``run()``; its result and wall seconds, and the share of a core others used meanwhile."""
    ours = [os.getpid(), *_descendants(os.getpid())]

    def used() -> float:
        return sum(tp.cpu_seconds(p) or 0.0 for p in ours[1:]) + tp.own_cpu_seconds()

    machine, mine, start = tp.machine_busy_seconds(), used(), time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    busy = tp.machine_busy_seconds()
    other = None
    if machine is not None and busy is not None and wall > 0:
        other = round(100 * max(0.0, (busy - machine) - (used() - mine)) / wall, 1)
    return result, {"seconds": round(wall, 3), "other_cpu_percent": other}


def compare(got, want, *, exact: bool) -> list[str]:
    """Differences between a Spark result and the baseline's, as messages (none: they agree)."""
    problems = []
    if [g.keys for g in got.groups] != [g.keys for g in want.groups]:
        return [f"groups differ: {[g.keys for g in got.groups]} vs {[g.keys for g in want.groups]}"]
    for g, w in zip(got.groups, want.groups, strict=True):
        for name in ("count", "min", "max", "negative"):
            if getattr(g, name) != getattr(w, name):
                problems.append(f"group {g.keys}: {name} {getattr(g, name)} != {getattr(w, name)}")
        for name in ("p50", "p95", "p99"):
            a, b = getattr(g, name), getattr(w, name)
            bound = 0 if exact else abs(b) / (2 ** (MANTISSA_BITS - 1) - 1) + 1e-9
            if abs(a - b) > bound:
                problems.append(f"group {g.keys}: {name} {a} != {b}")
        for name in ("mean", "variance"):
            if not math.isclose(getattr(g, name), getattr(w, name), rel_tol=1e-9, abs_tol=1e-9):
                problems.append(f"group {g.keys}: {name} {getattr(g, name)} != {getattr(w, name)}")
    return problems


ENGINES = {
    "spark_jsonl": "Spark on JSON lines",
    "spark_parquet": "Spark on Parquet",
    "spark_parquet_approx": "Spark on Parquet --approx",
}


def crossover(sizes: list[dict], engine: str) -> dict | None:
    """From what size ``engine`` is faster than the baseline (log-log interpolation)."""
    label = ENGINES[engine]
    points = [
        (s["records"], s["python"]["seconds"], s[engine]["seconds"])
        for s in sizes
        if s.get("python")
    ]
    if not points:
        return None
    if points[0][2] < points[0][1]:
        n = points[0][0]
        return {"records": n, "note": f"{label} is faster than the baseline from {n:,} records on"}
    for (n0, p0, s0), (n1, p1, s1) in zip(points, points[1:], strict=False):
        if s1 < p1:
            # r = log(python / spark) goes from < 0 to > 0: solve r = 0, linear in log n
            r0, r1 = math.log(p0 / s0), math.log(p1 / s1)
            n = math.exp(math.log(n0) + (math.log(n1) - math.log(n0)) * -r0 / (r1 - r0))
            n = round(n, 1 - int(math.log10(n)))  # two significant digits
            return {
                "records": n,
                "between": [n0, n1],
                "note": f"{label} overtakes the baseline between {n0:,} and {n1:,} records "
                f"(≈ {n:,.0f} by log-log interpolation)",
            }
    n = points[-1][0]
    return {"records": None, "note": f"{label}: the baseline stays faster up to {n:,} records"}


def run_size(spark, n: int, root: Path, baseline_max: int, errors: list[str]) -> dict:
    by = parse_by([BY])
    tp.log(f"{n:,} records: generating JSON lines and Parquet")
    files = generate(spark, n, root)
    row: dict = {
        "records": n,
        "jsonl_bytes": files["jsonl_bytes"],
        "parquet_bytes": files["parquet_bytes"],
    }
    results = {}
    for name, path, exact in (
        ("spark_jsonl", files["jsonl"], True),
        ("spark_parquet", files["parquet"], True),
        ("spark_parquet_approx", files["parquet"], False),
    ):
        tp.log(f"{n:,} records: {name}")
        results[name], row[name] = timed(
            lambda p=path, e=exact: latency_stats(spark, [p], by=by, exact=e)
        )
        row[name]["records_per_s"] = round(n / row[name]["seconds"])
    if n <= baseline_max:
        tp.log(f"{n:,} records: Python baseline")
        want, row["python"] = timed(lambda: reference_latency([files["jsonl"]], by=BY.split(",")))
        row["python"]["records_per_s"] = round(n / row["python"]["seconds"])
        for name, result in results.items():
            problems = compare(result, want, exact=name != "spark_parquet_approx")
            row[name]["agrees_with_baseline"] = not problems
            errors += [f"{n:,} records, {name}: {p}" for p in problems[:3]]
            row[name]["python_over_spark"] = round(
                row["python"]["seconds"] / row[name]["seconds"], 2
            )
    else:
        row["python"] = None
    shutil.rmtree(files["jsonl"], ignore_errors=True)
    shutil.rmtree(files["parquet"], ignore_errors=True)
    return row


# -- report ----------------------------------------------------------------------------------------


def render(report: dict, console: Console) -> None:
    table = Table(
        title=f"ges stats latency --by {BY} (exact unless noted) · local[*] on "
        f"{os.cpu_count()} cores · s = wall seconds, rec/s, × = Python time ÷ Spark time",
        title_justify="left",
    )
    for col in (
        "records",
        "JSON lines",
        "Parquet",
        "Spark JSONL",
        "Spark Parquet",
        "Parquet --approx",
        "Python JSONL",
        "other CPU",
    ):
        table.add_column(col, justify="right")

    def cell(run: dict | None) -> str:
        if not run:
            return "—"
        rate = run["records_per_s"]
        rate_text = f"{rate / 1e6:.2f} M/s" if rate >= 1e6 else f"{rate / 1e3:.0f} k/s"
        text = f"{run['seconds']:.2f} s · {rate_text}"
        if "python_over_spark" in run:
            text += f" · {run['python_over_spark']:.2g}×"
        return text

    for s in report["sizes"]:
        runs = [
            s.get(k) for k in ("spark_jsonl", "spark_parquet", "spark_parquet_approx", "python")
        ]
        others = [r["other_cpu_percent"] for r in runs if r and r["other_cpu_percent"] is not None]
        table.add_row(
            f"{s['records']:,}",
            f"{s['jsonl_bytes'] / 1e6:,.1f} MB",
            f"{s['parquet_bytes'] / 1e6:,.1f} MB",
            cell(s["spark_jsonl"]),
            cell(s["spark_parquet"]),
            cell(s["spark_parquet_approx"]),
            cell(s["python"]),
            f"{max(others):.0f} %" if others else "—",
        )
    console.print(table)
    for found in report["crossover"].values():
        if found:
            console.print(found["note"])
    for line in report["aim"]:
        console.print(line)
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 k and 100 k records only")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--sizes", help="comma list of record counts (overrides the plan)")
    parser.add_argument(
        "--baseline-max", type=int, default=None, help="largest size for the Python baseline"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write the inputs (default: a temp dir)"
    )
    args = parser.parse_args()
    try:
        sizes = (
            [int(s.replace("_", "")) for s in args.sizes.split(",")]
            if args.sizes
            else SIZES["quick" if args.quick else "full"]
        )
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected a comma list of integers")
    if any(n < 1 for n in sizes):
        parser.error("--sizes: every size must be at least 1")
    baseline_max = args.baseline_max if args.baseline_max is not None else max(sizes)
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="ges-bench-latency-", dir=args.dir))
    errors: list[str] = []
    report: dict = {"bench": "stats_latency", "mode": "quick" if args.quick else "full", "by": BY}
    try:
        tp.log("starting Spark (local[*])")
        spark = sparkjob.session("local[*]")
        warm = generate(spark, 10_000, root / "warm")
        latency_stats(spark, [warm["jsonl"]], by=parse_by([BY]))
        latency_stats(spark, [warm["parquet"]], by=parse_by([BY]))
        report["sizes"] = []
        for n in sorted(sizes):
            report["sizes"].append(run_size(spark, n, root, baseline_max, errors))
    except KeyboardInterrupt:
        tp.console.print("[bold red]interrupted[/bold red]")
        return 130
    except Exception as exc:  # noqa: BLE001 - a failed run is an error line and exit 1
        errors.append(f"{type(exc).__name__}: {exc}")
        report.setdefault("sizes", [])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report["crossover"] = {e: crossover(report["sizes"], e) for e in ENGINES}
    report["aim"] = []
    for s in report["sizes"]:
        if s["records"] == AIM["records"]:
            for name in ("spark_parquet", "spark_jsonl"):
                took = s[name]["seconds"]
                verdict = "met" if took <= AIM["seconds"] else "not met"
                report["aim"].append(
                    f"aim {AIM['records']:,} records in ≤ {AIM['seconds']:.0f} s, {name}: {took:.1f} s — {verdict}"
                )
    report["warnings"] = []
    for s in report["sizes"]:
        others = [
            s[name]["other_cpu_percent"]
            for name in (*ENGINES, "python")
            if s.get(name) and s[name]["other_cpu_percent"] is not None
        ]
        if others and max(others) > OTHER_CPU_WARN:
            report["warnings"].append(
                f"{s['records']:,} records: other processes used up to {max(others):.0f} % of a "
                "core meanwhile; these figures are pessimistic"
            )
    report["errors"] = errors
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    return tp.finish(report, errors, render, args.json)


if __name__ == "__main__":
    sys.exit(main())
