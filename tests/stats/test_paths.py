"""``ges stats paths``: every Spark figure against two pure-Python computations, and the CLI.

The Spark job runs once per topology (module fixture ``measured``) on the session-wide local
Spark; each figure is checked against ``_paths_reference.bfs_counts`` (a layered BFS per source)
and ``removal_counts`` (the definitions: BFS on subgraphs without / only up to a link level, and
shortest-path counts), which share no code with the Spark job or with each other.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from cli import stats_paths
from ges.errors import UserInputError
from ges.stats import paths
from ges.stats._paths_reference import bfs_counts, clustering, removal_counts
from ges.stats.path_results import PathStats
from ges.topology import Topology
from ges.topology.generate import generate

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: cluster c2 = {d, e} is not connected inside (d and e meet through c in c1, a warning, not an
#: error): shortest paths climb above the pair's common unit. Brokers of degree 1 (clustering 0)
#: and a triangle (clustering 1).
DETOUR = {
    "name": "detour",
    "brokers": {
        "a": {"unit": "S/c1", "port": 1},
        "b": {"unit": "S/c1", "port": 2},
        "c": {"unit": "S/c1", "port": 3},
        "d": {"unit": "S/c2", "port": 4},
        "e": {"unit": "S/c2", "port": 5},
        "f": {"unit": "T/c3", "port": 6},
        "g": {"unit": "T/c3", "port": 7},
        "h": {"unit": "T/c4", "port": 8},
    },
    "links": [
        ["a", "b"],
        ["b", "c"],
        ["a", "c"],
        ["c", "d"],
        ["c", "e"],
        ["e", "g"],
        ["f", "g"],
        ["f", "h"],
    ],
}

#: a path a - b - c - d - e - f across three clusters: distances up to 5, one shortest path each
CHAIN = {
    "name": "chain",
    "brokers": {
        "a": {"unit": "S/c1", "port": 1},
        "b": {"unit": "S/c1", "port": 2},
        "c": {"unit": "S/c2", "port": 3},
        "d": {"unit": "S/c2", "port": 4},
        "e": {"unit": "T/c3", "port": 5},
        "f": {"unit": "T/c3", "port": 6},
    },
    "links": [["a", "b"], ["b", "c"], ["c", "d"], ["d", "e"], ["e", "f"]],
}


def _topologies() -> dict[str, Topology]:
    return {
        "demo": Topology.from_yaml(ROOT / "topologies/demo.yaml"),
        "figure2": Topology.from_yaml(ROOT / "topologies/figure2.yaml"),
        "gen-2x3x4-s1": generate(levels=2, members=(2, 3, 4), seed=1, chords=0.5),
        "gen-3x3x3-s2": generate(
            levels=2, members=(3, 3, 3), seed=2, links_per_pair=1, redundancy=1, chords=0
        ),
        "gen-1x4x6-s3": generate(levels=2, members=(1, 4, 6), seed=3, links_per_pair=3),
        "detour": Topology.from_dict(DETOUR),
    }


TOPOLOGIES = _topologies()


@pytest.fixture(scope="module")
def measured(spark) -> dict[str, PathStats]:
    """All the topologies in one Spark run (as ``ges stats paths`` does with several files)."""
    results = paths.path_stats_many(spark, list(TOPOLOGIES.values()))
    return dict(zip(TOPOLOGIES, results, strict=True))


def counts_of(stats: PathStats) -> dict:
    """The Spark result in the references' shape (plain integer counts)."""
    return {
        "sources": stats.sources,
        "pairs": stats.pairs,
        "unreachable_pairs": stats.unreachable_pairs,
        "hops": stats.hops,
        "must_cross": [lv.must_cross for lv in stats.levels],
        "may_cross": [lv.may_cross for lv in stats.levels],
        "top_level": [lv.top_level for lv in stats.levels],
        "common_unit": [lv.common_unit for lv in stats.levels],
    }


# -- the figures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_counts_match_both_references(measured, name):
    topology = TOPOLOGIES[name]
    got = counts_of(measured[name])
    assert got == bfs_counts(topology)
    assert got == removal_counts(topology)


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_path_length_diameter_and_clustering(measured, name):
    topology = TOPOLOGIES[name]
    stats = measured[name]
    ref = removal_counts(topology)
    assert stats.exact and stats.mode == "exact" and stats.seed is None
    assert stats.sources == stats.brokers == len(topology.brokers)
    assert stats.links == len(topology.links)
    assert stats.avg_path_length == pytest.approx(
        sum(d * c for d, c in ref["hops"].items()) / ref["pairs"]
    )
    assert stats.diameter == max(ref["hops"])
    assert stats.clustering_coefficient == pytest.approx(clustering(topology), abs=1e-12)


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_level_shares_are_consistent(measured, name):
    """Top levels partition the pairs; must ≤ may; a pair climbs at least to its common unit."""
    stats = measured[name]
    assert sum(lv.top_level for lv in stats.levels) == stats.pairs
    assert sum(lv.common_unit for lv in stats.levels) == stats.pairs
    climbed = below = 0
    for lv in stats.levels:
        assert lv.must_cross <= lv.may_cross <= stats.pairs
        climbed += lv.top_level
        below += lv.common_unit
        assert climbed <= below  # pairs topped out by ℓ ≤ pairs whose common unit is ≤ ℓ+1
    assert [lv.links for lv in stats.levels] == [
        sum(1 for k in TOPOLOGIES[name].links if TOPOLOGIES[name].link_level(k.a, k.b) == lv)
        for lv in range(TOPOLOGIES[name].depth + 1)
    ]


def test_detour_topology(measured):
    stats = measured["detour"]
    assert TOPOLOGIES["detour"].warnings  # c2 is not connected inside
    assert stats.pairs == 8 * 7 and stats.unreachable_pairs == 0
    # d and e share cluster c2 but their only shortest path d-c-e uses level-1 links
    level0, level1 = stats.levels[0], stats.levels[1]
    assert level1.top_level == level1.common_unit + 2
    assert level0.top_level == level0.common_unit - 2
    # a and b in a triangle (1 each), c: 1 of its 6 neighbour pairs linked; the rest 0
    assert stats.clustering_coefficient == pytest.approx((1 + 1 + 1 / 6) / 8)


def test_figure2_shortest_paths_detour_above_the_common_unit(measured):
    """figure2's SC-1 reaches SC-2 through SC-3 too: some pairs' shortest paths climb higher."""
    stats = measured["figure2"]
    assert any(lv.top_level != lv.common_unit for lv in stats.levels)


def test_json_entry_carries_every_figure(measured):
    stats = measured["demo"]
    entry = stats.to_dict()
    assert entry["brokers"] == 20
    assert entry["avg_path_length"] == pytest.approx(stats.avg_path_length)
    assert entry["diameter"] == stats.diameter
    assert entry["clustering_coefficient"] == pytest.approx(stats.clustering_coefficient)
    assert entry["mode"] == "exact" and entry["sources"] == 20
    assert sum(entry["hops"].values()) == entry["pairs"] == 380
    assert sum(entry["hop_shares"].values()) == pytest.approx(1)
    assert [lv["level"] for lv in entry["gateway_levels"]] == [0, 1, 2, 3]
    k = 2 * len(TOPOLOGIES["demo"].links) / 20
    assert entry["reference"]["regular_n_over_2k"] == pytest.approx(20 / (2 * k), abs=1e-6)


# -- sampled sources and batches ------------------------------------------------------------------


def test_sampled_sources_match_the_reference_from_the_same_sources(spark, measured):
    """Over 10 brokers, 24 sources: all of gen-2x3x4 (24 brokers, so exact), 24 of figure2's 32."""
    small, figure2 = TOPOLOGIES["gen-2x3x4-s1"], TOPOLOGIES["figure2"]
    every, sampled = paths.path_stats_many(
        spark, [small, figure2], exact_up_to=10, sample=24, seed=7
    )
    assert every.exact and every.sources == 24 and every.seed is None
    assert counts_of(every) == counts_of(measured["gen-2x3x4-s1"])
    assert every.clustering_coefficient == pytest.approx(
        measured["gen-2x3x4-s1"].clustering_coefficient, abs=1e-12
    )
    chosen = paths.pick_sources(figure2, 24, 7)
    assert len(set(chosen)) == 24 and chosen == paths.pick_sources(figure2, 24, 7)
    assert chosen != paths.pick_sources(figure2, 24, 8)
    assert not sampled.exact and sampled.mode == "sampled"
    assert sampled.sources == 24 and sampled.seed == 7
    assert sampled.to_dict()["diameter_is_lower_bound"] is True
    assert counts_of(sampled) == bfs_counts(figure2, chosen) == removal_counts(figure2, chosen)
    assert sampled.clustering_coefficient == pytest.approx(clustering(figure2), abs=1e-12)


def test_batches_of_sources_add_up_to_one_run(spark):
    """At most 56 pairs a batch: chain's 6 sources (6 pairs each) and 2 of detour's (8 each) in
    the first, detour's other 6 in the second."""
    chain, detour = Topology.from_dict(CHAIN), TOPOLOGIES["detour"]
    steps: list[str] = []
    got = paths.path_stats_many(spark, [chain, detour], batch_pairs=56, on_step=steps.append)
    assert counts_of(got[0]) == bfs_counts(chain)
    assert got[0].hops == {1: 10, 2: 8, 3: 6, 4: 4, 5: 2}
    assert counts_of(got[1]) == bfs_counts(detour)
    assert any(s.startswith("sources 2/2") for s in steps)
    assert not any("sources 3/" in s for s in steps)


def test_bad_arguments_are_user_errors(spark):
    topology = Topology.from_dict(CHAIN)
    with pytest.raises(UserInputError, match="--sample"):
        paths.path_stats(spark, topology, sample=0)
    with pytest.raises(UserInputError, match="unknown source broker 'zz'"):
        paths.path_stats(spark, topology, sources=["a", "zz"])


def test_runtime_conf_is_restored(spark):
    before = spark.conf.get("spark.sql.adaptive.enabled")
    flipped = "false" if before == "true" else "true"
    conf = {"spark.sql.adaptive.enabled": flipped, "spark.sql.ges.test": "1"}
    with pytest.raises(UserInputError):  # fails after the settings were made
        paths.path_stats(spark, Topology.from_dict(CHAIN), sql_conf=conf, sources=["zz"])
    paths.path_stats(spark, Topology.from_dict(CHAIN), sql_conf=conf, sources=["a"])
    assert spark.conf.get("spark.sql.adaptive.enabled") == before
    assert spark.conf.get("spark.sql.ges.test", None) is None


# -- the command ----------------------------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("paths")(stats_paths.paths)

    @app.callback()
    def main() -> None:
        """A group, so the command is called by name as under ``ges stats``."""

    return app


def ges_stats(*args):
    return CliRunner().invoke(_app(), ["paths", *[str(a) for a in args]])


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(CHAIN), encoding="utf-8")
    return path


def test_cli_json_one_topology_has_the_keys_at_top_level(spark, chain_file):
    result = ges_stats(chain_file, "--json", "--master", "local[2]")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    topology = Topology.from_dict(CHAIN)
    ref = bfs_counts(topology)
    for entry in (report, report["topologies"][0]):
        assert entry["brokers"] == 6
        assert entry["avg_path_length"] == pytest.approx(
            sum(d * c for d, c in ref["hops"].items()) / ref["pairs"]
        )
        assert entry["diameter"] == 5
        assert entry["clustering_coefficient"] == pytest.approx(clustering(topology))
        assert entry["mode"] == "exact" and entry["sources"] == 6
    assert len(report["topologies"]) == 1


def test_cli_several_topologies_json_and_png(spark, chain_file, tmp_path):
    detour_file = tmp_path / "detour.yaml"
    detour_file.write_text(yaml.safe_dump(DETOUR), encoding="utf-8")
    png = tmp_path / "paths.png"
    result = ges_stats(
        chain_file, detour_file, "--json", "--plot", png, "--conf", "x.y=1",
        "--exact-up-to", 7, "--sample", 3, "--seed", 5,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert "brokers" not in report
    chain, detour = report["topologies"]
    assert [chain[k] for k in ("topology", "brokers", "mode", "sources")] == [
        "chain", 6, "exact", 6,
    ]  # fmt: skip
    assert [detour[k] for k in ("topology", "brokers", "mode", "sources", "seed")] == [
        "detour", 8, "sampled", 3, 5,
    ]  # fmt: skip
    assert detour["diameter_is_lower_bound"] is True
    ref = bfs_counts(TOPOLOGIES["detour"], paths.pick_sources(TOPOLOGIES["detour"], 3, 5))
    assert detour["hops"] == {str(d): c for d, c in ref["hops"].items()}
    assert chain["diameter"] == 5
    assert report["plot"] == str(png)
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 10_000


def test_cli_table_names_sampled_sources(spark, chain_file):
    result = ges_stats(chain_file, "--exact-up-to", "3", "--sample", "2", "--seed", "1")
    assert result.exit_code == 0, result.output
    assert "sampled" in result.stdout
    assert "≥" in result.stdout  # the diameter of sampled sources is a lower bound
    for title_word in ("Path lengths", "Hop", "Gateway"):  # the three tables (titles may wrap)
        assert title_word in result.stdout
    assert "seed 1" in result.stdout  # the note naming the sampled sources
    # a row of the first table is one line, however wide: no cell folds when output is a pipe
    row = re.compile(r"\s*chain +6 +[\d.]+ +[\d.]+\* +≥ \d+ +[\d.]+ +[\d.]+ +[\d.]+\s*")
    assert sum(1 for line in result.stdout.splitlines() if row.fullmatch(line)) == 1


def test_cli_malformed_yaml_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbrokers: [\n", encoding="utf-8")
    result = ges_stats(bad, "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "bad.yaml" in lines[0]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--sample", "0"], "--sample"),
        (["--conf", "novalue"], "--conf"),
        (["--plot", "/no/such/dir/p.png"], "--plot"),
    ],
)
def test_cli_bad_flags_are_one_line_exit_2(chain_file, args, flag):
    result = ges_stats(chain_file, *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0]


# -- the Spark session ----------------------------------------------------------------------------

_QUIET = """
from ges.errors import OperationError
from ges.stats import spark as sparkjob
try:
    sparkjob.session("nonsense")
except OperationError as exc:
    print("error:", exc)
spark = sparkjob.session("local[1]")
print(spark.range(3).count())
"""


def test_session_is_quiet_and_a_bad_master_is_one_line():
    """A fresh JVM (own process): nothing on stderr, and a JVM that cannot start says why."""
    done = subprocess.run(
        [sys.executable, "-c", _QUIET], capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("error: Spark (master nonsense) did not start: Master must")
    assert lines[1:] == ["3"]
    assert done.stderr == ""
