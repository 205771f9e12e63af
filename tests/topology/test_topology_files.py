"""The ready topologies in ``topologies/``: all valid, and each one keeps the promises in its comments."""

from __future__ import annotations

import json
import re
import shlex
from collections import defaultdict, deque
from pathlib import Path

import pytest

from ges.topology import Topology

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
FILES = sorted(TOPOLOGIES.glob("*.yaml"))


def distances(topology, start: str, dead: frozenset[str] = frozenset()) -> dict[str, int]:
    """Hop counts from ``start`` over live brokers (plain BFS; the routing code is tested apart)."""
    seen = {start: 0}
    queue = deque([start])
    while queue:
        b = queue.popleft()
        for n in topology.neighbours[b]:
            if n not in seen and n not in dead:
                seen[n] = seen[b] + 1
                queue.append(n)
    return seen


def cut_vertices(topology) -> list[str]:
    """Brokers whose death disconnects the others (brute force; fine for small topologies)."""
    out = []
    for b in topology.brokers:
        rest = [x for x in topology.brokers if x != b]
        if len(distances(topology, rest[0], frozenset({b}))) < len(rest):
            out.append(b)
    return out


def test_there_are_ready_topologies():
    names = {p.name for p in FILES}
    assert {"demo.yaml", "ges-paper.yaml", "generated-512.yaml"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_check_passes(ges, path):
    result = ges("topology", "check", path)
    assert result.exit_code == 0, result.output
    assert f"{path}: ok" in result.stdout


def test_check_passes_all_at_once_as_json(ges):
    result = ges("topology", "check", "--json", *FILES)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and len(report["files"]) == len(FILES)


# -- demo.yaml ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> Topology:
    return Topology.from_yaml(TOPOLOGIES / "demo.yaml")


def test_demo_shape(demo):
    assert demo.depth == 3
    assert 12 <= len(demo.brokers) <= 20
    assert all(7100 <= b.port <= 7199 for b in demo.brokers.values())
    assert demo.warnings == ()


def test_demo_serves_mqtt_and_mqtt_over_websocket_where_its_comment_says(demo):
    text = (TOPOLOGIES / "demo.yaml").read_text()
    assert "MQTT\n# clients served on 7201-7220" in text and "WebSocket on 8201-8220" in text
    for bid, b in demo.brokers.items():
        n = int(bid[1:])
        assert (b.mqtt_port, b.mqtt_ws_port) == (7200 + n, 8200 + n)


def test_demo_one_replicator_per_super_cluster(demo):
    super_clusters = [u for u in demo.units if demo.unit_level(u) == 2] if demo.units else []
    assert super_clusters
    for sc in super_clusters:
        assert len(demo.replicators_in(sc)) == 1, sc
    assert len(demo.replicators) == len(super_clusters)


def test_demo_gateways_are_redundant(demo):
    """Every linked pair of units has ≥ 2 links through distinct gatekeepers on each side."""
    pairs: dict[tuple, list[tuple[str, str]]] = defaultdict(list)
    for link in demo.gateways():
        lv = demo.link_level(link.a, link.b)
        ends = sorted([(demo.context(link.a, lv), link.a), (demo.context(link.b, lv), link.b)])
        pairs[(ends[0][0], ends[1][0])].append((ends[0][1], ends[1][1]))
    assert pairs
    for pair, links in pairs.items():
        assert len(links) >= 2, pair
        assert len({a for a, _ in links}) >= 2, pair
        assert len({b for _, b in links}) >= 2, pair


def test_demo_failover_scenario_in_its_comment(demo):
    """'publish at b1, subscribe at b20, kill b6': a route across the SSCs survives b6."""
    text = (TOPOLOGIES / "demo.yaml").read_text()
    assert "publish at b1 (SSC-A), subscribe at b20 (SSC-B), kill b6" in text
    assert demo.context("b1", 3) != demo.context("b20", 3)
    assert distances(demo, "b1")["b20"] == 7
    assert demo.gatekeeper_levels("b6") == (2, 3)
    assert distances(demo, "b1", frozenset({"b6"}))["b20"] == 9
    for other in ("b14", "b16", "b19"):
        assert "b20" in distances(demo, "b1", frozenset({other}))
    assert cut_vertices(demo) == []  # any one broker may die
    # the shorter variant: subscribe at b16, kill b6 or b14
    assert distances(demo, "b1")["b16"] == 5
    for dead in ("b6", "b14"):
        assert "b16" in distances(demo, "b1", frozenset({dead}))


def test_show_draws_demo(ges):
    result = ges("topology", "show", TOPOLOGIES / "demo.yaml")
    assert result.exit_code == 0, result.output
    text = result.stdout
    for unit in ("SSC-A", "SSC-B", "SC-1", "SC-4", "c1", "c8"):
        assert unit in text
    assert "L3 gatekeepers b6 b10" in text
    assert "SSC-B: b6–b14, b10–b11" in text
    assert "gatekeeper L2 L3" in text  # b6
    for broker in ("b1", "b8", "b12", "b18"):
        assert f"replicator at {broker}" in text
    assert text.count("replicator for SC-") == 4
    assert "20 brokers" in text and "drawn in full" in text


def test_show_depth_limits_the_tree(ges):
    result = ges("topology", "show", TOPOLOGIES / "demo.yaml", "--depth", "1")
    assert result.exit_code == 0, result.output
    assert "SSC-A" in result.stdout and "SC-1" not in result.stdout
    assert "drawn to depth 1 of 4" in result.stdout


def test_show_big_topology_stops_at_clusters(ges):
    result = ges("topology", "show", TOPOLOGIES / "generated-512.yaml")
    assert result.exit_code == 0, result.output
    assert "c2-4-8" in result.stdout
    assert "127.0.0.1:20000" not in result.stdout
    assert "--depth 4 draws them" in result.stdout


def test_show_bad_file_is_one_line(ges, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nbrokers: {}\n")
    result = ges("topology", "show", path)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and str(path) in result.stderr


# -- ges-paper.yaml -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paper() -> Topology:
    return Topology.from_yaml(TOPOLOGIES / "ges-paper.yaml")


def test_paper_brokers_are_the_papers_numbers(paper):
    assert list(paper.brokers) == [str(n) for n in range(1, 23)]
    assert all(7200 <= b.port <= 7299 for b in paper.brokers.values())
    assert paper.depth == 3 and paper.warnings == ()


def test_paper_publisher_to_subscriber_is_five_hops(paper):
    d = distances(paper, "22")
    assert d["10"] == 5
    # the unique shortest path given in the file's comment
    path = ["22", "20", "17", "8", "11", "10"]
    assert [d[b] for b in path] == list(range(6))
    back = distances(paper, "10")
    on_a_shortest_path = sorted(
        (b for b in paper.brokers if d[b] + back[b] == 5), key=lambda b: d[b]
    )
    assert on_a_shortest_path == path
    assert [paper.link_level(a, b) for a, b in zip(path, path[1:], strict=False)] == [1, 2, 3, 1, 0]


def test_paper_survives_any_one_failure(paper):
    assert cut_vertices(paper) == []
    for dead in ("20", "17", "8", "11"):
        assert distances(paper, "22", frozenset({dead}))["10"] == 6


# -- generated-512.yaml ---------------------------------------------------------------------------


def test_generated_512_is_reproduced_by_its_header(ges, tmp_path):
    source = TOPOLOGIES / "generated-512.yaml"
    text = source.read_text()
    command = next(line for line in text.splitlines() if "ges topology generate" in line)
    args = shlex.split(command.lstrip("# "))
    assert args[:3] == ["ges", "topology", "generate"]
    out = args.index("-o")
    target = tmp_path / "again.yaml"
    args[out + 1] = str(target)
    result = ges(*args[1:])
    assert result.exit_code == 0, result.output
    assert target.read_text() == text.replace(
        f"-o {source.relative_to(TOPOLOGIES.parent)}", f"-o {target}"
    )


def test_generated_512_shape():
    t = Topology.from_yaml(TOPOLOGIES / "generated-512.yaml")
    assert len(t.brokers) >= 500 and t.depth == 3
    ports = sorted(b.port for b in t.brokers.values())
    assert ports[0] == 20000 and ports == list(range(20000, 20000 + len(ports)))
    assert re.search(r"--base-port 20000", (TOPOLOGIES / "generated-512.yaml").read_text())
