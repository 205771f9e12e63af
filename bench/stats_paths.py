"""``ges stats paths`` on Spark beside a single-process pure-Python BFS, by network size (issue 6).

    python bench/stats_paths.py [--quick] [--json] [--sizes 256,1024,4096] [--joint]

Per size, one topology made by ``ges.topology.generate(levels=3, members=SHAPE, seed=0)`` — the
generator's defaults otherwise (ring plus a quarter chords per unit, 2 links per linked unit pair
over 2 gatekeepers), connected by construction — with SHAPE (top-level units, super-clusters per
unit, clusters per super-cluster, brokers per cluster):

    256 = 4·4·4·4   1,024 = 4·4·8·8   2,048 = 4·8·8·8   4,096 = 8·8·8·8

and on it, in this process, alternately:

1. **Spark**: ``ges.stats.paths.path_stats`` — exact figures (every broker a BFS source, as
   DataFrame joins: average path length, diameter, hop distribution, gateway-level shares,
   clustering coefficient) on ``local[*]`` (every core), the session ``ges stats`` uses. The
   JVM starts once, first (its start is reported apart), and a warm-up run on
   ``topologies/demo.yaml`` precedes the measured ones, so each size is timed on a warm JVM.
2. **Baseline**: ``ges.stats._paths_reference.bfs_counts`` and ``clustering`` — one layered BFS
   per source over plain dicts, the same figures, one core.

Both must agree on every count (hop distribution, each level's must/may/top/common counts) and
on the clustering coefficient; a difference is an error (exit 1). The ratio is Spark's wall time
÷ the baseline's (below 1: Spark is faster). ``--joint`` adds one Spark run over all sizes at
once (``path_stats_many``, what ``ges stats paths A.yaml B.yaml …`` does), beside the sum of the
separate runs. Also reported per run: CPU of the JVM and of this process, and *other* — what the
rest of the machine used meanwhile (over a quarter of a core: a warning, those figures are
pessimistic).

Prints a table (to stderr with ``--json``, which prints one JSON object on stdout). Nothing here
asserts a timing. Exit code 0 when every run completed and agreed, 1 otherwise, 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput as tp  # noqa: E402

from ges.stats import spark as sparkjob  # noqa: E402
from ges.stats._paths_reference import bfs_counts, clustering  # noqa: E402
from ges.stats.paths import path_stats, path_stats_many  # noqa: E402
from ges.topology import Topology  # noqa: E402
from ges.topology.generate import generate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: brokers → members per level, top first (levels = 3)
SHAPES = {
    256: (4, 4, 4, 4),
    1024: (4, 4, 8, 8),
    2048: (4, 8, 8, 8),
    4096: (8, 8, 8, 8),
}
PLANS = {"quick": (256, 1024), "full": (256, 1024, 2048, 4096)}
MASTER = "local[*]"
#: above this share of a core used by processes outside a run, its figures are pessimistic
BUSY_NEIGHBOUR = 25.0


def topology_of(size: int) -> Topology:
    return generate(levels=3, members=SHAPES[size], seed=0)


def counts_of(stats) -> dict:
    return {
        "pairs": stats.pairs,
        "hops": stats.hops,
        "must_cross": [lv.must_cross for lv in stats.levels],
        "may_cross": [lv.may_cross for lv in stats.levels],
        "top_level": [lv.top_level for lv in stats.levels],
        "common_unit": [lv.common_unit for lv in stats.levels],
    }


def _ratio(a, b, digits: int = 3) -> float | None:
    return None if a is None or not b else round(a / b, digits)


def run_size(spark, jvm_pid: int | None, size: int, errors: list[str]) -> dict:
    topology = topology_of(size)
    n = len(topology.brokers)
    tp.log(f"{size}: Spark, {n:,} brokers, {len(topology.links):,} links …")
    window = tp.CpuWindow({"jvm": [jvm_pid]} if jvm_pid else {})
    started = time.perf_counter()
    stats = path_stats(spark, topology)
    spark_wall = time.perf_counter() - started
    spark_cpu = _roles(window.finish())
    tp.log(f"{size}: Spark {spark_wall:.1f} s; pure-Python baseline …")
    window = tp.CpuWindow({"jvm": [jvm_pid]} if jvm_pid else {})
    started = time.perf_counter()
    ref = bfs_counts(topology)
    ref_clustering = clustering(topology)
    python_wall = time.perf_counter() - started
    python_cpu = _roles(window.finish())
    tp.log(f"{size}: baseline {python_wall:.1f} s")
    agree = {k: ref[k] == v for k, v in counts_of(stats).items()}
    agree["clustering_coefficient"] = math.isclose(
        stats.clustering_coefficient, ref_clustering, abs_tol=1e-9
    )
    for what, same in agree.items():
        if not same:
            errors.append(f"{size}: Spark and the baseline differ on {what}")
    pairs = stats.pairs
    return {
        "brokers": n,
        "links": len(topology.links),
        "generate": {"levels": 3, "members": list(SHAPES[size]), "seed": 0},
        "avg_path_length": round(stats.avg_path_length, 4),
        "diameter": stats.diameter,
        "clustering_coefficient": round(stats.clustering_coefficient, 4),
        "pairs": pairs,
        "bfs_steps": stats.diameter + 1,
        "spark": {
            "wall_seconds": round(spark_wall, 2),
            "pairs_per_s": round(pairs / spark_wall),
            "cpu_percent": spark_cpu,
        },
        "baseline": {
            "wall_seconds": round(python_wall, 2),
            "pairs_per_s": round(pairs / python_wall),
            "cpu_percent": python_cpu,
        },
        "spark_over_baseline": _ratio(spark_wall, python_wall),
        "agree": all(agree.values()),
    }


def _roles(cpu: dict) -> dict:
    """throughput.CpuWindow names this process "publisher"; here it is the driver/baseline."""
    out = dict(cpu)
    if "publisher" in out:
        out["this_process"] = out.pop("publisher")
    return out


def run_joint(spark, sizes: list[int], separate: dict) -> dict:
    tp.log(f"joint run over {', '.join(f'{s:,}' for s in sizes)} …")
    started = time.perf_counter()
    results = path_stats_many(spark, [topology_of(s) for s in sizes])
    wall = time.perf_counter() - started
    total = sum(separate[str(s)]["spark"]["wall_seconds"] for s in sizes)
    return {
        "sizes": sizes,
        "wall_seconds": round(wall, 2),
        "separate_runs_seconds": round(total, 2),
        "joint_over_separate": _ratio(wall, total),
        "bfs_steps": max(r.diameter for r in results) + 1,
    }


def warnings(report: dict) -> list[str]:
    out = []
    for size, row in report["sizes"].items():
        for side in ("spark", "baseline"):
            other = row[side]["cpu_percent"].get("other")
            if other is not None and other > BUSY_NEIGHBOUR:
                out.append(
                    f"{size} {side}: other processes used {other:.0f} % of a core meanwhile;"
                    " that figure is pessimistic"
                )
    return out


def render(report: dict, console: Console) -> None:
    t = Table(
        title="ges stats paths: exact path statistics, Spark (local[*]) beside one pure-Python"
        " process",
        caption=f"{report['config']['cpus']} cores. Spark: warm JVM (start "
        f"{report.get('spark_session_start_seconds')} s and warm-up {report.get('warmup_seconds')} s not "
        "included). ratio = Spark ÷ baseline wall time (< 1: Spark faster). pairs/s = ordered "
        "(source, broker) pairs per second. other = CPU the rest of the machine used meanwhile, "
        "% of one core.",
        caption_justify="left",
    )
    for col in (
        "brokers",
        "links",
        "avg path",
        "diameter",
        "clustering",
        "Spark",
        "baseline",
        "ratio",
        "Spark pairs/s",
        "baseline pairs/s",
        "JVM CPU",
        "other (Spark · baseline)",
        "agree",
    ):
        t.add_column(col, justify="right")
    for row in report["sizes"].values():
        sp, py = row["spark"], row["baseline"]
        t.add_row(
            f"{row['brokers']:,}",
            f"{row['links']:,}",
            f"{row['avg_path_length']:.2f}",
            str(row["diameter"]),
            f"{row['clustering_coefficient']:.3f}",
            f"{sp['wall_seconds']:.1f} s",
            f"{py['wall_seconds']:.1f} s",
            f"{row['spark_over_baseline']:.2f}×",
            f"{sp['pairs_per_s']:,}",
            f"{py['pairs_per_s']:,}",
            _pct(sp["cpu_percent"].get("jvm")),
            f"{_pct(sp['cpu_percent'].get('other'))} · {_pct(py['cpu_percent'].get('other'))}",
            "yes" if row["agree"] else "NO",
        )
    console.print(t)
    joint = report.get("joint")
    if joint:
        console.print(
            f"joint run of {', '.join(f'{s:,}' for s in joint['sizes'])}: "
            f"{joint['wall_seconds']} s ({joint['bfs_steps']} BFS steps) beside "
            f"{joint['separate_runs_seconds']} s for the separate runs "
            f"({joint['joint_over_separate']}×)"
        )
    if report.get("crossover"):
        console.print(report["crossover"], soft_wrap=True)
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)
    for e in report["errors"]:
        console.print(f"[bold red]error:[/bold red] {e}", soft_wrap=True)


def _pct(value) -> str:
    return "—" if value is None else f"{value:.0f} %"


def crossover(report: dict) -> str:
    rows = list(report["sizes"].values())
    faster = [r["brokers"] for r in rows if r["spark_over_baseline"] < 1]
    if not faster:
        return (
            f"Spark did not overtake the pure-Python baseline at any size measured (up to "
            f"{max(r['brokers'] for r in rows):,} brokers) on {report['config']['cpus']} cores."
        )
    return f"Spark is faster than the baseline from {min(faster):,} brokers on."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 256 and 1,024 only")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--sizes", help=f"comma list out of {', '.join(map(str, SHAPES))}")
    parser.add_argument("--joint", action="store_true", help="add one Spark run of all sizes")
    args = parser.parse_args()
    sizes = list(PLANS["quick" if args.quick else "full"])
    if args.sizes:
        try:
            sizes = [int(s) for s in args.sizes.split(",")]
        except ValueError:
            parser.error(f"--sizes: numbers, got {args.sizes!r}")
        bad = [s for s in sizes if s not in SHAPES]
        if bad:
            parser.error(f"--sizes: {bad[0]} is not one of {', '.join(map(str, SHAPES))}")
    started = time.perf_counter()
    errors: list[str] = []
    report: dict = {"bench": "stats_paths", "mode": "quick" if args.quick else "full"}
    try:
        tp.log(f"starting Spark ({MASTER}) …")
        t0 = time.perf_counter()
        spark = sparkjob.session(MASTER)
        report["spark_session_start_seconds"] = round(time.perf_counter() - t0, 1)
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        jvm_pid = proc.pid if proc is not None else None
        t0 = time.perf_counter()
        path_stats(spark, Topology.from_yaml(ROOT / "topologies/demo.yaml"))
        report["warmup_seconds"] = round(time.perf_counter() - t0, 1)
        report["sizes"] = {str(s): run_size(spark, jvm_pid, s, errors) for s in sizes}
        if args.joint and len(sizes) > 1:
            report["joint"] = run_joint(spark, sizes, report["sizes"])
    except KeyboardInterrupt:
        tp.console.print("[bold red]interrupted[/bold red]")
        return 130
    except Exception as exc:  # noqa: BLE001 - a failed run: one line and exit 1
        errors.append(f"{type(exc).__name__}: {sparkjob.failure_reason(exc)}")
        report.setdefault("sizes", {})
    report["config"] = {
        "master": MASTER,
        "spark_defaults": sparkjob.DEFAULTS,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_at_end": list(os.getloadavg()),
    }
    report["crossover"] = crossover(report) if report["sizes"] else None
    report["warnings"] = warnings(report)
    report["errors"] = errors
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    return tp.finish(report, errors, render, args.json, show_errors=False)  # render shows them


if __name__ == "__main__":
    sys.exit(main())
