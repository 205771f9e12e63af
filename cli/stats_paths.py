"""``ges stats paths``: path lengths of broker networks on Spark, beside seed 004 §3's curves."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer
from rich import box
from rich.table import Table

from cli._common import (
    SPARK_CONF,
    SPARK_MASTER,
    err,
    load_topology,
    one_line_errors,
    out,
    parse_spark_conf,
)
from ges.errors import GesError, OperationError, UserInputError
from ges.stats.path_results import PathStats, random_reference, regular_reference
from ges.stats.paths import BFS_SQL_CONF, DEFAULT_SAMPLE, EXACT_UP_TO, path_stats_many

#: Reference curves are drawn this far beyond the smallest and largest topology (factor on n).
PLOT_MARGIN = 2.0
#: Most rows of the hop distribution table; longer distributions show ranges of hops per row.
HOP_ROWS = 24


@one_line_errors
def paths(
    topology_files: list[Path] = typer.Argument(
        ...,
        help="Topology YAML files; several (e.g. generated ones of growing size) show how path "
        "length grows with the number of brokers.",
        metavar="TOPOLOGY",
    ),
    master: str = SPARK_MASTER,
    conf: list[str] = SPARK_CONF,
    exact_up_to: int = typer.Option(
        EXACT_UP_TO,
        "--exact-up-to",
        metavar="N",
        help="Exact figures (every broker a BFS source) up to N brokers; sampled sources beyond.",
    ),
    sample: int = typer.Option(
        DEFAULT_SAMPLE,
        "--sample",
        metavar="N",
        help="Sources drawn at random for a topology over --exact-up-to brokers.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds the draw of sampled sources."),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        metavar="FILE.png",
        help="Write a PNG of average path length (and diameter) against brokers, with the "
        "regular (n/2k) and random (log n / log k) reference curves.",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print one JSON object: brokers, avg_path_length, diameter, clustering_coefficient, "
        "… (at top level for one topology) and topologies, a list with one such entry each.",
    ),
) -> None:
    """Path lengths of broker networks, computed on Apache Spark (seed 004 §3).

    For each topology: the average shortest-path length and the diameter (hops over the
    undirected links, ordered pairs of brokers), the hop distribution, per gateway level the
    share of pairs whose every / some shortest path crosses a link of that level, the level
    shortest paths must climb to beside the level of the pair's lowest common unit, and the
    average clustering coefficient (brokers with fewer than two neighbours count as 0).

    Exact (a breadth-first search from every broker, as DataFrame joins) up to --exact-up-to
    brokers; beyond, from --sample sources drawn at random, which the output says (the diameter
    is then a lower bound). Next to each topology: a regular graph's path length n/2k and a
    random graph's log n / log k, for its n brokers and k links per broker.
    """
    from ges.stats import spark as sparkjob

    sparkjob.require("pyspark")  # before any input is read
    if exact_up_to < 0:
        raise UserInputError(f"--exact-up-to: must not be negative, not {exact_up_to}")
    if sample < 1:
        raise UserInputError(f"--sample: must be at least 1, not {sample}")
    if plot is not None and not plot.parent.is_dir():
        raise UserInputError(f"--plot {plot}: no directory {plot.parent}")
    if plot is not None:
        sparkjob.require("matplotlib", "--plot")
    settings = parse_spark_conf(conf)
    topologies = [(path, load_topology(path, show_warnings=not as_json)) for path in topology_files]
    spark = sparkjob.session(master, settings)
    with sparkjob.progress(spark, err, "paths") as status:
        try:
            results = path_stats_many(
                spark,
                [topology for _, topology in topologies],
                exact_up_to=exact_up_to,
                sample=sample,
                seed=seed,
                sql_conf={k: v for k, v in BFS_SQL_CONF.items() if k not in settings},
                on_step=lambda text: status.describe(f"paths: {text}"),
                files=[str(path) for path, _ in topologies],
            )
        except GesError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed Spark job: one line, exit 1
            if not _from_spark(exc):
                raise
            raise OperationError(f"Spark job failed: {sparkjob.failure_reason(exc)}") from None
    if plot is not None:
        write_plot(results, plot)
    if as_json:
        report: dict = {}
        entries = [r.to_dict() for r in results]
        if len(entries) == 1:
            report.update(entries[0])
        report["topologies"] = entries
        report["master"] = master
        report["wall_seconds"] = round(results[0].wall_seconds, 3) if results else None
        report["plot"] = str(plot) if plot is not None else None
        sys.stdout.write(json.dumps(report) + "\n")
        return
    _render(results)
    if plot is not None:
        err.print(f"plot: {plot}", markup=False, soft_wrap=True)


def _from_spark(exc: BaseException) -> bool:
    """A Py4J or PySpark error: the job failed in Spark, not in our code."""
    kinds = []
    try:
        from py4j.protocol import Py4JError

        kinds.append(Py4JError)
    except ImportError:  # pragma: no cover - py4j ships with pyspark
        pass
    try:
        from pyspark.errors import PySparkException

        kinds.append(PySparkException)
    except ImportError:  # pragma: no cover - older pyspark
        pass
    return isinstance(exc, tuple(kinds))


# -- the terminal ---------------------------------------------------------------------------------


def _f(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _render(results: list[PathStats]) -> None:
    table = Table(
        title="Path lengths (seed 004 §3)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    # on a narrow terminal cells fold onto a second line rather than lose digits to an ellipsis
    table.add_column("topology", overflow="fold", min_width=10)
    for col in ("brokers", "k", "avg path", "diameter", "clustering", "n/2k", "log n/log k"):
        table.add_column(col, justify="right", overflow="fold")
    for r in results:
        table.add_row(
            r.topology,
            f"{r.brokers:,}",
            _f(r.mean_degree),
            _f(r.avg_path_length, 3) + ("" if r.exact else "*"),
            ("—" if r.diameter is None else f"{'≥ ' if not r.exact else ''}{r.diameter}"),
            _f(r.clustering_coefficient, 3),
            _f(r.regular_path_length),
            _f(r.random_path_length),
        )
    table.caption = (
        "Hops over undirected links, ordered pairs (s, t), exact: every broker a source (* "
        "sampled sources, see below). k = links per broker. n/2k: a regular graph's path "
        "length, log n/log k: a random graph's (seed 004 §3). Clustering: mean share of a "
        "broker's neighbour pairs that are linked (0 below two neighbours)."
    )
    table.caption_justify = "left"
    out.print(table)
    if results:
        out.print(
            f"one Spark run for {len(results)} topolog{'y' if len(results) == 1 else 'ies'}:"
            f" {results[0].wall_seconds:.1f} s"
        )
    for r in results:
        if not r.exact:
            out.print(
                f"* {r.topology}: {r.sources:,} of {r.brokers:,} brokers sampled as sources (seed"
                f" {r.seed}); average and hop shares are estimates, the diameter a lower bound",
                markup=False,
                soft_wrap=True,
            )
        if r.unreachable_pairs:
            out.print(
                f"[yellow]note:[/yellow] {r.topology}: {r.unreachable_pairs:,} ordered pairs "
                "have no path and are left out",
                soft_wrap=True,
            )

    hops = Table(
        title="Hop distribution (share of ordered pairs)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    hops.add_column("hops", justify="right", overflow="fold")
    for r in results:
        hops.add_column(r.topology, justify="right", overflow="fold")
    longest = max((r.diameter or 0 for r in results), default=0)
    width = max(1, math.ceil(longest / HOP_ROWS))  # hops per row: long tails in ranges
    for low in range(1, longest + 1, width):
        high = min(low + width - 1, longest)
        label = str(low) if low == high else f"{low}–{high}"
        cells = []
        for r in results:
            counts = [r.hops[d] for d in range(low, high + 1) if d in r.hops]
            cells.append(_pct(r.share(sum(counts))) if counts else "")
        hops.add_row(label, *cells)
    out.print(hops)

    levels = Table(
        title="Gateway levels crossed by shortest paths",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in (
        "topology",
        "level",
        "links",
        "must cross",
        "may cross",
        "top level",
        "common unit",
    ):
        levels.add_column(col, justify="left" if col == "topology" else "right")
    for r in results:
        for i, lv in enumerate(r.levels):
            levels.add_row(
                r.topology if i == 0 else "",
                str(lv.level),
                f"{lv.links:,}",
                _pct(r.share(lv.must_cross)),
                _pct(r.share(lv.may_cross)),
                _pct(r.share(lv.top_level)),
                _pct(r.share(lv.common_unit)),
                end_section=i == len(r.levels) - 1,
            )
    levels.caption = (
        "Shares of ordered pairs. A level-ℓ link joins units whose lowest common unit is level "
        "ℓ+1 (0: inside a cluster; ℓ ≥ 1: gateways). must / may cross: every / some shortest path uses a level-ℓ "
        "link. top level: the highest link level is ℓ on the shortest path that climbs least. "
        "common unit: the pair's lowest common unit is level ℓ+1 (the hierarchy's lower bound "
        "on top level; above it, shortest paths detour)."
    )
    levels.caption_justify = "left"
    out.print(levels)


# -- the plot -------------------------------------------------------------------------------------


def write_plot(results: list[PathStats], path: Path) -> None:
    """A PNG: measured average path length and diameter against brokers, with the references.

    The reference curves use k, the mean over the topologies of their links per broker, and run
    from half the smallest to twice the largest broker count; both axes are logarithmic, so a
    regular graph's n/2k is a straight line and a random graph's log n / log k bends flat.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = sorted((r for r in results if r.avg_path_length is not None), key=lambda r: r.brokers)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    try:
        if done:
            k = sum(r.mean_degree for r in done) / len(done)
            low = max(2.0, min(r.brokers for r in done) / PLOT_MARGIN)
            high = max(r.brokers for r in done) * PLOT_MARGIN
            steps = 64
            ns = [low * (high / low) ** (i / steps) for i in range(steps + 1)]
            regular = [(n, regular_reference(n, k)) for n in ns]
            rand = [(n, random_reference(n, k)) for n in ns]
            ax.plot(
                *zip(*regular, strict=True),
                "--",
                color="tab:gray",
                label=f"regular n/2k (k={k:.2f})",
            )
            rand = [(n, v) for n, v in rand if v is not None]
            if rand:
                ax.plot(
                    *zip(*rand, strict=True),
                    ":",
                    color="tab:green",
                    label=f"random log n / log k (k={k:.2f})",
                )
            xs = [r.brokers for r in done]
            ax.plot(
                xs,
                [r.avg_path_length for r in done],
                "o-",
                color="tab:blue",
                label="average path length",
            )
            ax.plot(
                xs, [r.diameter for r in done], "s", mfc="none", color="tab:red", label="diameter"
            )
            for r in done:
                note = r.topology if r.exact else f"{r.topology} (sampled {r.sources})"
                ax.annotate(
                    note,
                    (r.brokers, r.avg_path_length),
                    textcoords="offset points",
                    xytext=(0, -14),
                    ha="center",
                    fontsize=7,
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        ax.set_xlabel("brokers (n)")
        ax.set_ylabel("hops")
        ax.set_title("Path length against broker count (seed 004 §3)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        try:
            fig.savefig(path, format="png")
        except OSError as exc:
            raise OperationError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
