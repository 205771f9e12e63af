"""``ges stats latency``: latency statistics of delivery records (seed 004 Figure 7, Table 2)."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from cli._common import SPARK_CONF, SPARK_MASTER, err, one_line_errors, out, parse_spark_conf
from ges.errors import UserInputError
from ges.stats import spark as sparkjob
from ges.stats.group_keys import check_tags, parse_by, scan_tags
from ges.stats.latency import latency_stats
from ges.stats.latency_results import STATS, LatencyStats, key_order
from ges.stats.record_input import record_sources

#: Panels a plot may have (one per combination of the keys that are neither x nor the lines);
#: beyond this every combination becomes a line of one panel instead.
MAX_PANELS = 12


def latency(
    records: list[Path] = typer.Argument(
        ...,
        metavar="RECORDS",
        help="Delivery record files or directories: JSON lines, or Parquet (.parquet files or "
        "directories of them); mixed inputs are read together.",
    ),
    by: list[str] = typer.Option(
        [],
        "--by",
        metavar="KEY,…",
        help="Group by record fields (hops, size, client, subscriber_broker, publisher_broker, "
        "pubend, …) or tags: tags.NAME, or a bare NAME that is no field (matching_rate), which "
        "some record must have as a tag; rate is tag rate, else publish_rate. Repeatable. "
        "None: one group of everything.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object (by, unit, records, groups) on stdout."
    ),
    csv_file: Path = typer.Option(
        None, "--csv", metavar="FILE", help="Write the table as CSV (keys, then statistics)."
    ),
    parquet_dir: Path = typer.Option(
        None,
        "--parquet",
        metavar="DIR",
        help="Write the table as a Parquet directory (replaced if it holds Spark output).",
    ),
    plot_file: Path = typer.Option(
        None,
        "--plot",
        metavar="FILE.png",
        help="Plot mean latency against rate (or the first --by key), one line per "
        "matching_rate (or per value of the next key), one panel per value of the others.",
    ),
    approx: bool = typer.Option(
        False,
        "--approx",
        help="One pass instead of two: percentiles interpolated within a histogram bucket "
        "(within 0.8 % of the exact value).",
    ),
    master: str = SPARK_MASTER,
    conf: list[str] = SPARK_CONF,
) -> None:
    """Latency (received_at − published_at) per group of delivery records, on Spark.

    Per group: count, mean, standard deviation and population variance (Σ(x − mean)²/n), min,
    nearest-rank p50/p95/p99 (the smallest latency with at least P % of the group at or below
    it: always a measured latency) and max, in microseconds (µs² for the variance), exact unless
    --approx. A record received before it was published (clocks of two hosts) counts as a
    negative latency; a warning says how many. A malformed record stops the run with its file
    and line (exit 2). Records (README, Delivery records) are written by `ges subscribe --record`
    and bench/routing.py.
    """
    one_line_errors(_latency)(
        records, by, as_json, csv_file, parquet_dir, plot_file, approx, master, conf
    )


def _latency(records, by, as_json, csv_file, parquet_dir, plot_file, approx, master, conf):
    sparkjob.require("pyspark")  # before any input is read
    keys = parse_by(by)
    settings = parse_spark_conf(conf)
    sources = record_sources(records)  # a missing path fails before the JVM starts
    tags = scan_tags(keys, sources)  # so does a bare --by name that no record has as a tag
    if tags is not None:
        check_tags(keys, tags)
    if plot_file is not None and not keys:
        raise UserInputError("--plot: nothing to plot against without --by (e.g. --by rate)")
    if plot_file is not None:
        sparkjob.require("matplotlib", "--plot")
    if parquet_dir is not None:
        _check_replaceable(parquet_dir)
    for option, path in (("--csv", csv_file), ("--plot", plot_file)):
        # before the run, not after it
        if path is not None and not path.parent.is_dir():
            raise UserInputError(f"{option} {path}: no directory {path.parent}")
    spark = sparkjob.session(master, settings)
    stats = latency_stats(
        spark,
        records,
        by=keys,
        exact=not approx,
        stage=lambda description: sparkjob.progress(spark, err, description),
    )
    if stats.negative:
        err.print(
            Text.assemble(
                ("warning: ", "yellow"),
                f"{stats.negative:,} of {stats.records:,} records were received before they "
                "were published (clocks of different hosts?); counted as negative latencies",
            ),
            soft_wrap=True,
        )
    if csv_file is not None:
        write_csv(stats, csv_file)
    if parquet_dir is not None:
        write_parquet(spark, stats, parquet_dir)
    if plot_file is not None:
        plot(stats, plot_file)
    if as_json:
        sys.stdout.write(json.dumps(stats.to_json()) + "\n")
    else:
        out.print(table(stats))


def _show(value) -> str:
    return "null" if value is None else str(value)


def table(stats: LatencyStats) -> Table:
    """The statistics as a rich table (latencies in µs)."""
    kind = "nearest-rank" if stats.exact else "approximate (--approx)"
    result = Table(
        title=f"latency in µs · {stats.records:,} records · {kind} percentiles · "
        "population variance (µs²)",
        title_justify="left",
    )
    shown = [s for s in STATS if s != "negative" or stats.negative]
    for name in stats.by:
        result.add_column(name, overflow="fold")
    for name in shown:
        result.add_column(name, justify="right", overflow="fold")
    for row in stats.rows():
        cells = [_show(row[name]) for name in stats.by]
        for name in shown:
            value = row[name]
            if name in ("count", "negative"):
                cells.append(f"{value:,}")
            elif name == "variance":
                cells.append(f"{value:.4g}")
            else:
                cells.append(f"{value:,.1f}")
        result.add_row(*cells)
    return result


def write_csv(stats: LatencyStats, path: Path) -> None:
    """One row per group: the ``--by`` keys (empty for null), then every statistic (full floats)."""
    try:
        with open(path, "w", newline="", encoding="utf-8") as stream:
            writer = csv.DictWriter(stream, fieldnames=[*stats.by, *STATS])
            writer.writeheader()
            for row in stats.rows():
                writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    except OSError as exc:
        raise UserInputError(f"--csv {path}: cannot write: {exc.strerror}") from None


def _check_replaceable(path: Path) -> None:
    """Refuse to replace a directory that is not (empty or) Spark output: --parquet . is a slip."""
    if not path.exists():
        return
    if not path.is_dir():
        raise UserInputError(f"--parquet {path}: exists and is not a directory")
    foreign = [
        p.name
        for p in path.iterdir()
        if not p.name.startswith(("part-", "_", "."))
        or (p.name.startswith("part-") and not p.name.endswith(".parquet"))
    ]
    if foreign:
        raise UserInputError(
            f"--parquet {path}: holds {foreign[0]!r}, not Spark output; not replacing it"
        )


def write_parquet(spark, stats: LatencyStats, path: Path) -> None:
    """The table as one Parquet file in directory ``path`` (keys typed: long, double or string)."""
    from pyspark.sql import types as T

    rows = stats.rows()
    fields, converters = [], []
    for name in stats.by:
        values = [r[name] for r in rows if r[name] is not None]
        if all(isinstance(v, int) for v in values):
            kind, convert = T.LongType(), (lambda v: v)
        elif all(isinstance(v, int | float) for v in values):
            kind, convert = T.DoubleType(), (lambda v: None if v is None else float(v))
        else:
            kind, convert = T.StringType(), (lambda v: None if v is None else str(v))
        fields.append(T.StructField(name, kind, True))
        converters.append(convert)
    for name in STATS:
        kind = T.LongType() if name in ("count", "negative") else T.DoubleType()
        fields.append(T.StructField(name, kind, False))
    data = [
        tuple(c(r[n]) for c, n in zip(converters, stats.by, strict=True))
        + tuple(r[s] for s in STATS)
        for r in rows
    ]
    frame = spark.createDataFrame(data, schema=T.StructType(fields))
    try:
        frame.coalesce(1).write.mode("overwrite").parquet(str(path))
    except Exception as exc:  # noqa: BLE001 - Spark's error: one line
        raise UserInputError(
            f"--parquet {path}: cannot write: {sparkjob.failure_reason(exc)}"
        ) from None


def plot(stats: LatencyStats, path: Path) -> None:
    """Mean latency against the x key (seed 004 Figure 7 plots mean transit delay).

    x is ``rate`` when grouped by it, else the first ``--by`` key; one line per
    ``matching_rate`` (or the next key); one panel per combination of the other keys.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    names = list(stats.by)
    x_name = "rate" if "rate" in names else names[0]
    rest = [n for n in names if n != x_name]
    line_names = ["matching_rate"] if "matching_rate" in rest else rest[:1]
    panel_names = [n for n in rest if n not in line_names]
    rows = stats.rows()
    if len({tuple(r[n] for n in panel_names) for r in rows}) > MAX_PANELS:
        line_names, panel_names = rest, []

    panels: dict[tuple, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        panel = tuple(r[n] for n in panel_names)
        panels[panel][tuple(r[n] for n in line_names)].append((r[x_name], r["mean"]))
    numeric = all(isinstance(r[x_name], int | float) for r in rows)

    count = len(panels)
    cols = min(3, count)
    rows_n = math.ceil(count / cols)
    figure = Figure(figsize=(5.5 * cols, 4.0 * rows_n), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows_n, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, sorted(panels, key=key_order), strict=False):
        for line in sorted(panels[panel], key=key_order):
            points = panels[panel][line]
            if numeric:
                points.sort()
                xs = [p[0] for p in points]
            else:
                points.sort(key=lambda p: key_order((p[0],)))
                xs = [_show(p[0]) for p in points]
            label = ", ".join(f"{n}={_show(v)}" for n, v in zip(line_names, line, strict=True))
            ax.plot(xs, [p[1] for p in points], marker="o", label=label or "all")
        if numeric:
            xs = [r[x_name] for r in rows]
            if min(xs) > 0 and max(xs) >= 100 * min(xs):
                ax.set_xscale("log")
                ax.xaxis.set_major_formatter(ScalarFormatter())  # 1, 10, 100, not 10⁰, 10¹
        ax.set_xlabel(x_name)
        ax.set_ylabel("mean latency (µs)")
        if panel_names:
            ax.set_title(
                ", ".join(f"{n}={_show(v)}" for n, v in zip(panel_names, panel, strict=True))
            )
        if line_names:
            ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    for ax in axes[count:]:
        ax.set_visible(False)
    lines = f", one line per {', '.join(line_names)}" if line_names else ""
    figure.suptitle(f"Mean latency against {x_name}{lines} ({stats.records:,} delivery records)")
    try:
        figure.savefig(path, dpi=110)
    except OSError as exc:
        raise UserInputError(f"--plot {path}: cannot write: {exc.strerror}") from None
