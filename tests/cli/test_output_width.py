"""Results written to a file or a pipe are not wrapped: a table row or tree line stays one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cli._common import FILE_WIDTH, ResultConsole, out
from cli.stats_latency import table
from ges.stats.latency_results import LatencyGroup, LatencyStats

ROOT = Path(__file__).resolve().parents[2]


def test_topology_show_into_a_pipe_keeps_each_line_whole():
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "topology", "show", "topologies/generated-512.yaml"],
        cwd=ROOT,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("generated-512") and "512 brokers" in lines[-1]
    unit_line = re.compile(r"\S+  (super-)*cluster · \d+ members|L\d gatekeepers .* · gateways → ")
    for line in lines[1:-1]:
        # a folded line would go on with the rest of a gateway list: "b35–b247; SC-1-2: …"
        assert unit_line.match(line.lstrip("│├└─ ")), line
    assert max(len(line) for line in lines) > 120  # long enough that 80 or 120 columns fold


def test_latency_table_rows_are_one_line_each(capsys):
    big = 12_345_678_901.5  # µs: fourteen digits and separators per cell
    group = LatencyGroup(
        keys=("subscriber-broker-with-a-long-name", 0.5),
        count=9_876_543_210,
        mean=big,
        stddev=big,
        variance=big * big,
        min=big,
        p50=big,
        p95=big,
        p99=big,
        max=big,
        negative=1,
    )
    stats = LatencyStats(by=("subscriber_broker", "matching_rate"), groups=(group,))
    out.print(table(stats))
    rows = [ln for ln in capsys.readouterr().out.splitlines() if "subscriber-broker" in ln]
    assert len(rows) == 1
    assert rows[0].count("12,345,678,901.5") == 7 and "9,876,543,210" in rows[0]


def test_the_console_keeps_the_terminal_width_on_a_terminal():
    terminal = ResultConsole(force_terminal=True, width=77)
    assert terminal.width == 77
    piped = ResultConsole(force_terminal=False, width=77)
    assert piped.width == FILE_WIDTH
