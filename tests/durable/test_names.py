"""Durable sessions' names and where they live: ges.durable's session_name_problem,
replicators, home_replicator and replicator_brokers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ges.durable import home_replicator, replicator_brokers, replicators, session_name_problem
from ges.topology import Topology
from ges.topology.specs import ReplicatorSpec
from tests.conftest import DIAMOND

ROOT = Path(__file__).resolve().parents[2]


def demo() -> Topology:
    return Topology.from_yaml(ROOT / "topologies/demo.yaml")


def topology(data: dict) -> Topology:
    return Topology.from_dict(data, source="<test>")


#: two top-level units, the first with brokers named out of their natural order
TWO_TOPS = {
    "name": "two-tops",
    "brokers": {
        "b10": {"unit": "A/c1", "port": 1},
        "b2": {"unit": "A/c1", "port": 2},
        "b3": {"unit": "A/c2", "port": 3},
        "x": {"unit": "B/c1", "port": 4},
    },
    "links": [["b10", "b2"], ["b2", "b3"], ["b3", "x"]],
}


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["alice", "a.b-c_d@x", "A", "7", "x" * 128, "Z9.@_-"])
def test_a_session_name_of_letters_digits_and_dot_underscore_at_dash_is_accepted(name):
    assert session_name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-x",
        ".x",
        "_x",
        "@x",
        "x" * 129,
        "a b",
        " alice",
        "alice ",
        "a/b",
        "/",
        "a\nb",
        "alice\n",
        "é",
    ],
)
def test_a_bad_session_name_is_rejected_with_a_reason(name):
    why = session_name_problem(name)
    assert isinstance(why, str) and "session name" in why


def test_the_reason_for_a_very_long_name_quotes_only_its_start():
    why = session_name_problem("y" * 1000)
    assert why is not None and "y" * 64 in why and "y" * 65 not in why


# -- replicators ------------------------------------------------------------------------------


def test_replicators_are_the_topologys_own_when_it_names_some():
    data = {**DIAMOND, "replicators": [{"unit": "S/c2", "broker": "d"}]}
    assert replicators(topology(data)) == (ReplicatorSpec(("S", "c2"), "d"),)


def test_the_demo_topologys_replicators_are_one_per_super_cluster():
    got = {(r.unit, r.broker) for r in replicators(demo())}
    assert got == {
        (("SSC-A", "SC-1"), "b1"),
        (("SSC-A", "SC-2"), "b8"),
        (("SSC-B", "SC-3"), "b12"),
        (("SSC-B", "SC-4"), "b18"),
    }


def test_without_replicators_each_top_level_unit_has_one_at_its_first_broker():
    assert replicators(topology(DIAMOND)) == (ReplicatorSpec(("S",), "a"),)
    # the first broker in natural order: b2 before b10
    assert replicators(topology(TWO_TOPS)) == (
        ReplicatorSpec(("A",), "b2"),
        ReplicatorSpec(("B",), "x"),
    )


# -- home_replicator --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("broker", "home"),
    [
        ("b1", "b1"),
        ("b2", "b1"),
        ("b6", "b1"),
        ("b7", "b8"),
        ("b10", "b8"),
        ("b11", "b12"),
        ("b16", "b12"),
        ("b17", "b18"),
        ("b20", "b18"),
    ],
)
def test_a_brokers_home_replicator_is_its_super_clusters_in_the_demo(broker, home):
    assert home_replicator(demo(), broker) == home


def test_the_home_replicator_is_that_of_the_smallest_unit_around_the_broker():
    data = {
        **DIAMOND,
        "replicators": [{"unit": "S", "broker": "a"}, {"unit": "S/c2", "broker": "d"}],
    }
    t = topology(data)
    assert home_replicator(t, "c") == "d"  # S/c2 is smaller than S
    assert home_replicator(t, "d") == "d"
    assert home_replicator(t, "b") == "a"  # only S is around b
    # the order the replicators are listed in does not matter
    data["replicators"] = data["replicators"][::-1]
    t = topology(data)
    assert (home_replicator(t, "c"), home_replicator(t, "b")) == ("d", "a")


def test_a_broker_no_replicators_unit_holds_is_homed_at_some_replicator():
    t = topology({**DIAMOND, "replicators": [{"unit": "S/c2", "broker": "d"}]})
    assert home_replicator(t, "a") == "d"


def test_without_replicators_a_broker_is_homed_at_its_top_level_units_first_broker():
    t = topology(TWO_TOPS)
    assert [home_replicator(t, b) for b in ("b10", "b2", "b3", "x")] == ["b2", "b2", "b2", "x"]


# -- replicator_brokers -----------------------------------------------------------------------


def test_replicator_brokers_lists_near_first_when_it_is_one():
    got = replicator_brokers(demo(), "b12")
    assert got[0] == "b12"
    assert sorted(got) == sorted(["b1", "b8", "b12", "b18"])
    assert got[1] == "b18"  # the other one of SSC-B before SSC-A's


def test_replicator_brokers_lists_the_nearest_first_when_near_is_not_one():
    got = replicator_brokers(demo(), "b2")
    assert got[0] == "b1"  # b2's own cluster
    assert got[1] == "b8"  # SSC-A before SSC-B
    assert set(got[2:]) == {"b12", "b18"}


def test_replicator_brokers_lists_each_replicator_once():
    data = {
        **DIAMOND,
        "replicators": [{"unit": "S", "broker": "a"}, {"unit": "S/c1", "broker": "a"}],
    }
    assert replicator_brokers(topology(data), "d") == ["a"]


def test_replicator_brokers_without_replicators_are_the_top_units_first_brokers():
    assert replicator_brokers(topology(TWO_TOPS), "x") == ["x", "b2"]
    assert replicator_brokers(topology(TWO_TOPS), "b3") == ["b2", "x"]
