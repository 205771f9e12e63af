"""``ges stats``: batch analytics on Apache Spark — path lengths of broker networks and latency
statistics of delivery records (seed 004 §3, Figure 7, Table 2)."""

from __future__ import annotations

import typer

from cli import stats_latency, stats_paths
from cli._common import OneLineUsageGroup, command

app = typer.Typer(
    help="Batch analytics on Apache Spark (local[*] by default, any cluster by --master): path "
    "lengths of broker networks and latency statistics of delivery records.",
    no_args_is_help=True,
    cls=OneLineUsageGroup,
)
command(app, "paths")(stats_paths.paths)
command(app, "latency")(stats_latency.latency)
