"""Graph nodes, link reports and the two pure rules: how a vertex sees a broker, who may see a
report (seed 004 §2)."""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

import ges.connectivity as connectivity
from ges.connectivity import (
    ConnectivityError,
    GraphNode,
    LinkReport,
    express,
    express_unit,
    visible_to,
)

V6 = ("SSC-A", "SC-1", "c")  # the vertex of Figure 3
B = ("SSC-A", "SC-1", "b")
E = ("SSC-A", "SC-2", "e")
G = ("SSC-A", "SC-3", "g")
I = ("SSC-B", "SC-4", "i")  # noqa: E741 - the cluster's name in figure2.yaml

SC1_SC2 = LinkReport.observe("5", V6, "13", E, up=True, version=(0, 0))


def test_graph_node_names_and_order():
    five = GraphNode(0, (*V6, "5"))
    sc2 = GraphNode(2, ("SSC-A", "SC-2"))
    assert (str(five), str(sc2)) == ("5", "SC-2")
    assert repr(sc2) == "GraphNode(2, 'SSC-A/SC-2')"
    assert five.broker == "5" and sc2.broker is None
    assert GraphNode(0, [*V6, "5"]) == five and hash(GraphNode(0, (*V6, "5"))) == hash(five)
    # natural order: level first, then b2 < b10
    assert GraphNode(0, (*V6, "9")).sort_key < GraphNode(0, (*V6, "10")).sort_key
    assert five.sort_key < sc2.sort_key
    with pytest.raises(ValueError):
        GraphNode(0, ())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        five.level = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("vertex_unit", "broker", "broker_unit", "expected"),
    [
        # Figure 3: the ends of the SC-1–SC-2 connection as seen from cluster c ...
        (V6, "5", V6, GraphNode(0, (*V6, "5"))),
        (V6, "13", E, GraphNode(2, ("SSC-A", "SC-2"))),
        # ... from cluster b of SC-1 ("a connection between the cluster c and SC-2") ...
        (B, "5", V6, GraphNode(1, V6)),
        (B, "13", E, GraphNode(2, ("SSC-A", "SC-2"))),
        # ... from SC-3 ...
        (G, "5", V6, GraphNode(2, ("SSC-A", "SC-1"))),
        # ... and from another super-super-cluster.
        (I, "5", V6, GraphNode(3, ("SSC-A",))),
    ],
)
def test_express_is_the_child_of_the_lowest_common_unit(vertex_unit, broker, broker_unit, expected):
    assert express(vertex_unit, broker, broker_unit) == expected


def test_express_rejects_other_depths():
    with pytest.raises(ConnectivityError, match="depth"):
        express(V6, "x", ("SSC-A", "SC-1"))


def test_express_unit():
    assert express_unit(V6, ("SSC-A", "SC-1")) is None  # contains the vertex
    assert express_unit(V6, V6) is None
    assert express_unit(V6, ("SSC-A", "SC-1", "b")) == GraphNode(1, B)
    assert express_unit(V6, E) == GraphNode(2, ("SSC-A", "SC-2"))  # a cluster inside SC-2
    assert express_unit(V6, ("SSC-B",)) == GraphNode(3, ("SSC-B",))


def test_report_orders_endpoints_and_knows_its_scope():
    r = LinkReport.observe("13", E, "5", V6, up=True, version=(0, 3), cost=2)
    assert (r.a, r.b, r.a_unit, r.b_unit, r.reporter) == ("5", "13", V6, E, "13")
    assert r.cost == 2.0 and isinstance(r.cost, float)
    assert r.level == 2 and r.lcu == ("SSC-A",) and r.key == ("5", "13")
    inside = LinkReport.observe("4", V6, "5", V6, up=True, version=(0, 0))
    assert inside.level == 0 and inside.lcu == V6
    # unit paths may come in as "A/B/c" strings (from YAML or a codec)
    assert LinkReport("4", "5", "SSC-A/SC-1/c", "SSC-A/SC-1/c", None, "4", [0, 1], True) == (
        attrs.evolve(inside, version=(0, 1))
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"a": "13", "b": "5"},  # out of natural order
        {"b": "5"},  # self-link
        {"reporter": "6"},  # not an endpoint
        {"b_unit": ("SSC-A", "SC-2")},  # depth mismatch
        {"version": (0,)},
        {"version": (-1, 0)},
        {"cost": 0},
    ],
)
def test_report_invariants(bad):
    with pytest.raises(ValueError):
        attrs.evolve(SC1_SC2, **bad)


@pytest.mark.parametrize(
    ("receiver", "visible"),
    [
        (V6, True),
        (B, True),
        (G, True),  # SC-3 is inside SSC-A
        (E, True),
        (I, False),  # "disseminated only within the super-super-cluster SSC-A"
        (("SSC-A", "SC-1"), False),  # wrong depth
    ],
)
def test_visibility_is_inside_the_lowest_common_unit(receiver, visible):
    assert visible_to(SC1_SC2, receiver) is visible


def test_exports_are_unique_and_resolve():
    names = connectivity.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(connectivity, name) is not None


FORBIDDEN = {"trio", "time", "random", "socket", "sqlite3", "asyncio", "threading"}


def test_connectivity_is_sans_io():
    package = Path(connectivity.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not roots & FORBIDDEN, f"{path.name}:{node.lineno} imports {roots & FORBIDDEN}"
        assert len(path.read_text(encoding="utf-8").splitlines()) < 600, path.name
