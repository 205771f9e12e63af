"""The hierarchy of seed 004 §2 on a small hand-made topology: contexts, link levels, gatekeepers.

SSC-A/SC-1/c1 {b1 b2}   SSC-A/SC-1/c2 {b3}   SSC-A/SC-2/c3 {b4}   SSC-B/SC-3/c4 {b5 b6}

b1-b2 level 0 (same cluster)      b2-b3 level 1 (c1 to c2 inside SC-1)
b3-b4 level 2 (SC-1 to SC-2)      b4-b5, b1-b6 level 3 (SSC-A to SSC-B)
b5-b6 level 0
"""

from __future__ import annotations

import pytest

from ges.topology import Topology
from ges.topology.generate import to_yaml_text

DATA = {
    "name": "tiny",
    "brokers": {
        "b1": {"unit": "SSC-A/SC-1/c1", "port": 7001},
        "b2": {"unit": "SSC-A/SC-1/c1", "port": 7002},
        "b3": {"unit": "SSC-A/SC-1/c2", "port": 7003},
        "b4": {"unit": "SSC-A/SC-2/c3", "port": 7004},
        "b5": {"unit": "SSC-B/SC-3/c4", "port": 7005},
        "b6": {"unit": "SSC-B/SC-3/c4", "host": "10.0.0.6", "port": 7006},
    },
    "links": [["b1", "b2"], ["b2", "b3"], ["b3", "b4"], ["b4", "b5"], ["b6", "b1"], ["b5", "b6"]],
    "replicators": [{"unit": "SSC-A/SC-1", "broker": "b2"}, {"unit": "SSC-B", "broker": "b6"}],
}


@pytest.fixture(scope="module")
def t() -> Topology:
    return Topology.from_dict(DATA)


def test_depth_and_units(t):
    assert t.depth == 3
    assert t.units[()] == ("b1", "b2", "b3", "b4", "b5", "b6")
    assert t.units[("SSC-A",)] == ("b1", "b2", "b3", "b4")
    assert t.units[("SSC-A", "SC-1")] == ("b1", "b2", "b3")
    assert t.units[("SSC-B", "SC-3", "c4")] == ("b5", "b6")
    assert len(t.units) == 1 + 2 + 3 + 4
    assert t.unit_level(()) == 4
    assert t.unit_level(("SSC-A",)) == 3
    assert t.unit_level(("SSC-A", "SC-1", "c1")) == 1


def test_context(t):
    assert t.context("b3", 0) == ("SSC-A", "SC-1", "c2", "b3")
    assert t.context("b3", 1) == ("SSC-A", "SC-1", "c2")
    assert t.context("b3", 2) == ("SSC-A", "SC-1")
    assert t.context("b3", 3) == ("SSC-A",)
    assert t.context("b3", 4) == ()
    with pytest.raises(ValueError):
        t.context("b3", 5)
    with pytest.raises(ValueError):
        t.context("b3", -1)


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        ("b1", "b2", 0),
        ("b2", "b3", 1),
        ("b3", "b4", 2),
        ("b4", "b5", 3),
        ("b1", "b6", 3),
        ("b5", "b6", 0),
    ],
)
def test_link_levels(t, a, b, level):
    assert t.link_level(a, b) == level
    assert t.link_level(b, a) == level
    assert t.common_level(a, b) == level + 1


def test_common_level_of_a_broker_with_itself(t):
    assert t.common_level("b4", "b4") == 0


def test_gateways_per_level(t):
    keys = lambda links: sorted(link.key for link in links)  # noqa: E731
    assert keys(t.gateways()) == [("b1", "b6"), ("b2", "b3"), ("b3", "b4"), ("b4", "b5")]
    assert keys(t.gateways(1)) == [("b2", "b3")]
    assert keys(t.gateways(2)) == [("b3", "b4")]
    assert keys(t.gateways(3)) == [("b1", "b6"), ("b4", "b5")]
    assert t.gateways(4) == ()


def test_gatekeepers_per_level(t):
    assert t.gatekeepers(1) == ("b2", "b3")
    assert t.gatekeepers(2) == ("b3", "b4")
    assert t.gatekeepers(3) == ("b1", "b4", "b5", "b6")
    assert t.gatekeeper_levels("b1") == (3,)
    assert t.gatekeeper_levels("b3") == (1, 2)
    assert t.gatekeeper_levels("b4") == (2, 3)
    assert t.gatekeeper_levels("b2") == (1,)


def test_unit_gatekeepers(t):
    assert t.unit_gatekeepers(("SSC-A", "SC-1", "c1")) == ("b1", "b2")
    assert t.unit_gatekeepers(("SSC-A", "SC-1", "c2")) == ("b3",)
    assert t.unit_gatekeepers(("SSC-A", "SC-1")) == ("b1", "b3")
    assert t.unit_gatekeepers(("SSC-A", "SC-2")) == ("b4",)
    assert t.unit_gatekeepers(("SSC-A",)) == ("b1", "b4")
    assert t.unit_gatekeepers(("SSC-B", "SC-3", "c4")) == ("b5", "b6")
    assert t.unit_gatekeepers(()) == ()  # nothing leaves the whole system


def test_members(t):
    assert t.members(()) == (("SSC-A",), ("SSC-B",))
    assert t.members(("SSC-A",)) == (("SSC-A", "SC-1"), ("SSC-A", "SC-2"))
    assert t.members(("SSC-A", "SC-1")) == (("SSC-A", "SC-1", "c1"), ("SSC-A", "SC-1", "c2"))
    assert t.members(("SSC-A", "SC-1", "c1")) == ("b1", "b2")


def test_neighbours_and_links(t):
    assert t.neighbours["b1"] == ("b2", "b6")
    assert t.link_between("b6", "b1") is t.link_between("b1", "b6")
    assert t.link_between("b1", "b6").a == "b1"  # the lower id dials
    assert t.link_between("b1", "b4") is None


def test_replicators(t):
    assert [r.broker for r in t.replicators_in(("SSC-A", "SC-1"))] == ["b2"]
    assert [r.broker for r in t.replicators_in(("SSC-B",))] == ["b6"]
    assert t.replicators_in(("SSC-A",)) == ()


def test_addresses(t):
    assert t.broker("b1").address == ("127.0.0.1", 7001)
    assert t.broker("b6").address == ("10.0.0.6", 7006)


def test_dict_round_trip(t):
    assert Topology.from_dict(t.to_dict()) == t
    assert Topology.from_dict(t.to_dict()).to_dict() == t.to_dict()


def test_yaml_round_trip(t):
    text = to_yaml_text(t, header=["a header line"])
    assert text.startswith("# a header line\n")
    again = Topology.from_yaml_text(text)
    assert again == t
    assert again.to_dict() == t.to_dict()


def test_round_trip_keeps_costs_and_quoted_ids():
    data = {
        "name": "numbers",
        "brokers": {
            "1": {"unit": "A/c1", "port": 7001},
            "2": {"unit": "A/c1", "host": "::1", "port": 7002},
            "10": {"unit": "B/c2", "port": 7010},
        },
        "links": [["1", "2", {"cost": 2.5}], ["2", "10"]],
        "link_costs": [[1, 2], [3, 4]],
    }
    t = Topology.from_dict(data)
    assert Topology.from_yaml_text(to_yaml_text(t)) == t
    assert list(t.brokers) == ["1", "2", "10"]
    assert t.link_between("2", "1").cost == 2.5
