"""``ges stats`` without the ``stats`` extra: one line saying how to install it, and the rest of
``ges`` untouched (pyspark and matplotlib are imported only where they are used).

Each test runs ``ges`` in a child Python whose ``sys.modules`` maps the missing packages to
None, which makes every import of them fail as if they were not installed; nothing here starts
Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ges.stats.spark import INSTALL_STATS

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "topologies" / "demo.yaml"

#: Run ``cli.main.main`` as the ``ges`` script does, with the named packages unimportable.
RUN_GES = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
sys.argv = ["ges", *sys.argv[2:]]
from cli.main import main
main()
"""

#: Import every module of ges and cli with the named packages unimportable.
IMPORT_ALL = """
import importlib, pkgutil, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
import cli, ges
names = [
    info.name
    for package in (ges, cli)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def run(script: str, missing: str, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    return subprocess.run(
        [sys.executable, "-c", script, missing, *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=120,
        cwd=ROOT,
    )


@pytest.fixture
def records_file(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"pubend": "b1~1", "tick": 1}) + "\n")
    return path


@pytest.mark.parametrize("command", ["paths", "latency"])
def test_ges_stats_without_pyspark_is_one_line_and_exit_1(command, records_file):
    target = DEMO if command == "paths" else records_file
    done = run(RUN_GES, "pyspark", "stats", command, target, "--json")
    assert (
        done.stderr
        == f"error: ges stats needs pyspark: install the stats extra ({INSTALL_STATS})\n"
    )
    assert done.stdout == ""
    assert done.returncode == 1


def test_plot_without_matplotlib_is_one_line_before_spark_starts(tmp_path):
    done = run(RUN_GES, "matplotlib", "stats", "paths", DEMO, "--plot", tmp_path / "paths.png")
    assert (
        done.stderr
        == f"error: --plot needs matplotlib: install the stats extra ({INSTALL_STATS})\n"
    )
    assert done.stdout == ""
    assert done.returncode == 1
    assert not (tmp_path / "paths.png").exists()


def test_every_module_of_ges_and_cli_imports_without_pyspark_or_matplotlib():
    done = run(IMPORT_ALL, "pyspark,py4j,matplotlib")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 50  # the walk found the packages' modules


def test_other_commands_run_without_the_stats_extra():
    done = run(RUN_GES, "pyspark,py4j,matplotlib", "topology", "check", DEMO, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)
