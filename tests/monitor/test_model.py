"""The monitor's model of a network (ges.monitor.model), fed Stats reports by hand on the demo
topology: the unit tree, rates, link states from both ends, unit health, and the event log."""

from __future__ import annotations

from pathlib import Path

import pytest

from ges.monitor.model import (
    LINK_CUT,
    LINK_DOWN,
    LINK_HALF,
    LINK_UNKNOWN,
    LINK_UP,
    LINKS_DOWN,
    OK,
    SOME_DOWN,
    SPLIT,
    UNREACHABLE,
    NetworkModel,
    worst,
)
from ges.topology import Topology
from ges.wire import messages as m

DEMO = Topology.from_yaml(Path(__file__).parents[2] / "topologies" / "demo.yaml")


def stats(broker: str, *, down=(), cut=(), incarnation="i1", **counters) -> m.Stats:
    """A report from ``broker`` with every link up but ``down`` and ``cut``."""
    up = [p for p in DEMO.neighbours[broker] if p not in down and p not in cut]
    fields = dict(
        clients=0,
        subscriptions=0,
        events_in=0,
        events_out=0,
        frames_in=0,
        frames_out=0,
        published=0,
        delivered=0,
        duplicates=0,
    )
    fields |= counters
    return m.Stats(
        broker=broker,
        incarnation=incarnation,
        links_up=up,
        links_expected=len(DEMO.neighbours[broker]),
        links_cut=list(cut),
        **fields,
    )


def everyone(model: NetworkModel, now: float, **special) -> None:
    for b in model.brokers:
        model.observe(b, special.get(b) or stats(b), now)


def unit(model: NetworkModel, path: str):
    node = model.root
    for name in path.split("/"):
        node = next(u for u in node.units if u.name == name)
    return node


def test_the_tree_holds_every_unit_and_broker_of_the_topology_in_order():
    model = NetworkModel(DEMO)
    assert [u.name for u in model.root.units] == ["SSC-A", "SSC-B"]
    assert [u.name for u in unit(model, "SSC-A").units] == ["SC-1", "SC-2"]
    assert unit(model, "SSC-A/SC-1/c1").brokers == ["b1", "b2", "b3"]
    assert sorted(model.unit_brokers(model.root)) == sorted(DEMO.brokers)
    assert len(model.unit_brokers(unit(model, "SSC-B"))) == 10


def test_rates_come_from_two_reports_of_one_incarnation_and_a_restart_is_told():
    model = NetworkModel(DEMO)
    model.observe("b1", stats("b1", events_in=100, delivered=10), 10.0)
    assert model.brokers["b1"].rate_in == 0.0  # one report: no rate yet
    model.observe("b1", stats("b1", events_in=300, events_out=50, delivered=410), 12.0)
    b1 = model.brokers["b1"]
    assert (b1.rate_in, b1.rate_out, b1.rate_delivered) == (100.0, 25.0, 200.0)
    said = model.observe("b1", stats("b1", incarnation="i2", events_in=5), 13.0)
    assert [e.text for e in said] == ["b1 restarted"] and b1.restarts == 1
    assert b1.rate_in == 0.0  # counters started again: no difference across incarnations


def test_a_link_is_up_only_when_every_answering_end_says_so():
    model = NetworkModel(DEMO)
    state = {(link.a, link.b): link.state for link in model.links()}
    assert set(state.values()) == {LINK_UNKNOWN}
    everyone(model, 1.0)
    assert {link.state for link in model.links()} == {LINK_UP}
    model.observe("b2", stats("b2", down=["b4"]), 2.0)  # b4 still lists b2
    states = {(link.a, link.b): link.state for link in model.links()}
    assert states[("b2", "b4")] == LINK_HALF
    model.observe("b4", stats("b4", down=["b2"]), 2.0)
    model.observe("b3", stats("b3", cut=["b5"]), 2.0)
    states = {(link.a, link.b): link.state for link in model.links()}
    assert states[("b2", "b4")] == LINK_DOWN and states[("b3", "b5")] == LINK_CUT
    assert {link.level for link in model.links() if link.a == "b6" and link.b == "b14"} == {3}
    texts = [e.text for e in model.log]
    assert "link b2–b4 half" in texts and "link b2–b4 down" in texts and "link b3–b5 cut" in texts


def test_unit_health_from_ok_through_links_down_split_some_down_to_unreachable():
    model = NetworkModel(DEMO)
    c1, sc1 = unit(model, "SSC-A/SC-1/c1"), unit(model, "SSC-A/SC-1")
    assert model.health(c1) == UNREACHABLE  # nothing reported yet
    everyone(model, 1.0)
    assert model.health(model.root) == OK
    # one of c1/c2's two gateways down: SC-1 still connected inside
    everyone(model, 2.0, b2=stats("b2", down=["b4"]), b4=stats("b4", down=["b2"]))
    assert model.health(sc1) == LINKS_DOWN and model.health(c1) == OK
    # both gateways down: c1 and c2 no longer reach each other inside SC-1
    everyone(
        model,
        3.0,
        b2=stats("b2", down=["b4"]),
        b4=stats("b4", down=["b2"]),
        b3=stats("b3", down=["b5"]),
        b5=stats("b5", down=["b3"]),
    )
    assert model.health(sc1) == SPLIT and model.health(c1) == OK
    everyone(model, 4.0)
    model.unreachable("b2", "connection refused", 4.5)
    assert model.health(c1) == SOME_DOWN and model.health(sc1) == SOME_DOWN
    for b in ("b1", "b3"):
        model.unreachable(b, "connection refused", 5.0)
    assert model.health(c1) == UNREACHABLE
    assert worst([model.health(u) for u in unit(model, "SSC-A/SC-1").units]) == UNREACHABLE
    said = model.observe("b2", stats("b2"), 6.0)
    assert said[0].text == "b2 answers again"


def test_a_unit_whose_health_changes_is_logged_a_partition_as_split():
    model = NetworkModel(DEMO)
    everyone(model, 1.0)
    assert model.health_changes(1.0) == []  # the first look: how each unit stands
    split = dict(
        b2=stats("b2", down=["b4"]),
        b4=stats("b4", down=["b2"]),
        b3=stats("b3", down=["b5"]),
        b5=stats("b5", down=["b3"]),
    )
    everyone(model, 2.0, **split)
    said = {e.text: e.level for e in model.health_changes(2.0)}
    assert said["SSC-A/SC-1: ok -> split"] == "warning"
    assert model.health_changes(2.5) == []  # told once
    everyone(model, 3.0)
    said = {e.text: e.level for e in model.health_changes(3.0)}
    assert said["SSC-A/SC-1: split -> ok"] == "info"


def test_totals_add_up_a_units_brokers_and_the_snapshot_is_plain_data():
    model = NetworkModel(DEMO)
    everyone(model, 1.0)
    model.observe("b1", stats("b1", clients=3, sessions=2), 1.0)
    model.observe("b2", stats("b2", clients=4, slow_consumers=0), 1.0)
    model.observe("b2", stats("b2", clients=4, slow_consumers=2), 2.0)
    c1 = unit(model, "SSC-A/SC-1/c1")
    got = model.totals(c1)
    assert got["clients"] == 7 and got["sessions"] == 2 and got["answering"] == 3
    assert "b2: 2 slow consumer(s) disconnected" in [e.text for e in model.log]
    snap = model.snapshot()
    assert snap["network"]["units"][0]["unit"] == "SSC-A"
    leaf = snap["network"]["units"][0]["units"][0]["units"][0]
    assert leaf["unit"] == "SSC-A/SC-1/c1" and [b["broker"] for b in leaf["brokers"]] == [
        "b1",
        "b2",
        "b3",
    ]
    import json

    json.dumps(snap)  # plain data


def test_loop_busy_is_its_share_of_the_time_between_two_reports_and_a_unit_has_its_longest():
    model = NetworkModel(DEMO)
    everyone(model, 1.0)
    model.observe("b1", stats("b1", loop_busy_us=1_000_000, loop_longest_us=2_000), 10.0)
    model.observe("b1", stats("b1", loop_busy_us=1_500_000, loop_longest_us=34_000), 12.0)
    model.observe("b2", stats("b2", loop_busy_us=100_000, loop_longest_us=5_000), 12.0)
    assert model.brokers["b1"].loop_busy == pytest.approx(0.25)  # 0.5 s busy in 2 s
    assert model.totals(unit(model, "SSC-A/SC-1/c1"))["loop_longest_us"] == 34_000
    assert model.totals(unit(model, "SSC-A"))["loop_longest_us"] == 34_000
    assert model.totals(unit(model, "SSC-B"))["loop_longest_us"] == 0
    b1 = model.snapshot()["network"]["units"][0]["units"][0]["units"][0]["brokers"][0]
    assert (b1["loop_longest_us"], b1["loop_busy_us"], b1["loop_busy_percent"]) == (
        34_000,
        1_500_000,
        25.0,
    )
    # a report that came late and the next on time: never more than the whole
    model.observe("b1", stats("b1", loop_busy_us=3_000_000), 12.5)
    assert model.brokers["b1"].loop_busy == 1.0
    # a restart: no share until two reports of the new incarnation; one not answering has none
    model.observe("b1", stats("b1", incarnation="i2", loop_busy_us=10), 13.0)
    assert model.brokers["b1"].loop_busy == 0.0
    model.unreachable("b1", "refused", 14.0)
    assert model.brokers["b1"].loop_longest_us == 0


def test_the_event_log_is_bounded():
    model = NetworkModel(DEMO, log_entries=5)
    for i in range(20):
        model.unreachable("b1", "refused", float(i))
        model.observe("b1", stats("b1"), i + 0.5)
    assert len(model.log) == 5
    assert model.log[-1].text == "b1 answers again"


@pytest.mark.parametrize("b", ["b1", "b20"])
def test_a_broker_that_never_answered_is_told_once(b):
    model = NetworkModel(DEMO)
    assert len(model.unreachable(b, "refused", 1.0)) == 1
    assert model.unreachable(b, "refused", 2.0) == []
