"""Large requests in slices (ges.core.work): a subscription of thousands of conjunctions is
entered, changed and removed a slice at a time, with other clients served in between, and a
client that goes away half way leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ges.core import BrokerCore, ProtocolError, ToClient, ToPeer
from ges.core.work import WORK_SLICE
from ges.matching.model import Conjunction, Constraint, Profile
from ges.topology import Topology
from ges.wire import messages as m
from tests.core.test_reliable_core import World

ROOT = Path(__file__).resolve().parents[2]
DEMO = Topology.from_yaml(ROOT / "topologies/demo.yaml")


def quotes(n: int, start: int = 0) -> list[list[m.Constraint]]:
    return [
        [m.Constraint("sym", "eq", f"S{i}"), m.Constraint("price", "gt", float(i))]
        for i in range(start, start + n)
    ]


def kinds(out, conn=None) -> list[type]:
    return [type(o.msg) for o in out if type(o) is ToClient and conn in (None, o.conn)]


def core(broker: str = "b3", reliable: bool = False) -> BrokerCore:
    c = BrokerCore(DEMO, broker, incarnation=1, reliable=reliable)
    c.client_open(1, "subscriber")
    c.client_open(2, "publisher")
    return c


@pytest.mark.parametrize("n", [1024, 4096])
def test_a_large_subscription_is_entered_in_slices_while_others_are_served(n):
    c = core()
    out = c.client_message(1, m.Subscribe(1, quotes(n)), 0.0)
    assert m.SubAck not in kinds(out) and c.busy(1) and not c.busy(2)
    slices, publishes = 0, 0
    while c.has_work:
        # another client's publish is answered at once, between two slices
        got = c.client_message(2, m.Publish(slices + 1, [m.Event({"sym": "S1", "price": 5.0})]), 0)
        assert m.PubAck in kinds(got, 2)
        publishes += 1
        before = c.router.exporter.work
        out = c.work(0.0)
        # a slice is bounded: a chunk of conjunctions at most, whatever the profile's size
        assert c.router.exporter.work - before < 4 * WORK_SLICE
        slices += 1
        if m.SubAck in kinds(out, 1):
            break
    assert slices > n // 100 and not c.busy(1)
    assert c.stats().subscriptions == 1
    # the last conjunction matches: the whole profile is in
    out = c.client_message(2, m.Publish(99_999, [m.Event({"sym": f"S{n - 1}", "price": 1e9})]), 0)
    assert m.Deliver in kinds(out, 1)
    # and the keepers were told about every one, a bounded message at a time
    profiles = [o.msg for o in out if type(o) is ToPeer and type(o.msg) is m.Profiles]
    assert profiles == []  # nothing new for a publish
    assert len(c.router.exporter) == n


def test_a_subscription_being_entered_delivers_nothing_until_it_is_in():
    c = core()
    c.client_message(1, m.Subscribe(1, quotes(2000)), 0.0)
    assert c.busy(1)
    out = c.client_message(2, m.Publish(1, [m.Event({"sym": "S0", "price": 5.0})]), 0.0)
    assert m.Deliver not in kinds(out, 1)  # S0 is in the graph, but the SubAck is not out yet


def test_a_client_closed_half_way_through_leaves_nothing_behind():
    c = core()
    c.client_message(1, m.Subscribe(1, quotes(3000)), 0.0)
    for _ in range(5):
        c.work(0.0)
    assert c.busy(1)
    c.client_closed(1, 1.0)
    assert not c.busy(1)
    while c.has_work:
        c.work(1.0)
    assert c.router.is_empty() and not c.profiles
    assert c.stats().subscriptions == 0 and c.stats().clients == 1


def test_a_large_unsubscribe_answers_once_its_profile_is_gone():
    c = core()
    c.client_message(1, m.Subscribe(1, quotes(2000)), 0.0)
    while c.has_work:
        c.work(0.0)
    out = c.client_message(1, m.Unsubscribe(1, req=7), 1.0)
    assert m.SubAck not in kinds(out, 1) and c.busy(1)
    # it no longer gets anything, though its conjunctions are still being taken out
    out = c.client_message(2, m.Publish(1, [m.Event({"sym": "S0", "price": 5.0})]), 1.0)
    assert m.Deliver not in kinds(out, 1)
    acks = []
    while c.has_work:
        acks += [o.msg for o in c.work(1.0) if type(o) is ToClient and type(o.msg) is m.SubAck]
    assert acks == [m.SubAck(1, req=7)]
    assert c.router.is_empty() and not c.profiles


def test_a_profile_over_the_weight_bound_is_refused_before_anything_changes():
    c = core()
    big = [
        [m.Constraint("n", "in", list(range(4000))), m.Constraint("m", "eq", i)] for i in range(20)
    ]
    out = c.client_message(1, m.Subscribe(1, big), 0.0)
    while c.has_work:
        out += c.work(0.0)
    (error,) = [o.msg for o in out if type(o) is ToClient and type(o.msg) is m.Error]
    assert "weight over 32768" in error.reason
    assert c.router.is_empty() and not c.profiles


def test_a_large_profile_changes_with_no_gap_in_what_both_match():
    """The replaced profile is indexed (it is large), and the events both profiles match keep
    arriving while the change spreads: the checker follows every delivery."""
    w = World(faults="drop,dup,delay,reorder")
    w.sim.run_until(0.5)
    old = Profile("old", [Conjunction((Constraint("n", "eq", i),)) for i in range(0, 60)])
    new = Profile("new", [Conjunction((Constraint("n", "eq", i),)) for i in range(30, 90)])
    key = w.subscribe("b20", 1, old)
    for i in range(300):
        w.publish_at(1.0 + i * 0.01, "b1", i % 100)

    def change():
        w.checker.subscribe(key, new)
        w.sim.client(
            "b20", 1, m.Subscribe(1, [[m.Constraint("n", "eq", i)] for i in range(30, 90)])
        )

    w.sim.at(2.0, change)
    w.sim.run_until(12.0)
    w.checker.finish(w.sim.now, start_by=0.5)
    assert w.checker.ok, w.checker.violations[:3]
    got = [t for ticks in w.checker.subs[key].got.values() for t in ticks]
    assert len(got) > 100


def test_a_client_and_a_broker_hold_subscriptions_up_to_a_weight():
    c = core()
    half = [[m.Constraint("a", "eq", i), m.Constraint("b", "eq", i)] for i in range(16_384)]
    for sub_id in (1, 2):  # 32,768 each: the client's bound exactly
        c.client_message(1, m.Subscribe(sub_id, half), 0.0)
        while c.has_work:
            c.work(0.0)
    out = c.client_message(1, m.Subscribe(3, [[m.Constraint("a", "eq", 1)]]), 0.0)
    (error,) = [o.msg for o in out if type(o) is ToClient and type(o.msg) is m.Error]
    assert "the client's subscriptions would weigh over 65536" in error.reason
    assert c.stats().subscriptions == 2
    # a changed profile counts what it adds, less what it replaces
    smaller = [[m.Constraint("a", "eq", 1)]]
    out = c.client_message(1, m.Subscribe(2, smaller), 0.0)
    while c.has_work:
        out += c.work(0.0)
    assert not [o.msg for o in out if type(o) is ToClient and type(o.msg) is m.Error]


def test_a_request_while_the_previous_one_is_in_progress_is_a_protocol_error():
    c = core()
    c.client_message(1, m.Subscribe(1, quotes(2000)), 0.0)
    assert c.busy(1)
    with pytest.raises(ProtocolError, match="in progress"):
        c.client_message(1, m.Unsubscribe(1), 0.0)
    c.client_message(1, m.Publish(1, [m.Event({"n": 1})]), 0.0)  # publishing is not a request


def test_each_slice_stamps_its_changes_with_its_own_time():
    """A slice running a second after the request came sends its profile changes then: the
    origin waits for their acks from then (stamped with the request's time, a long job made
    every keeper look late and get full resyncs)."""
    c = core()
    for peer in sorted(c.neighbours):  # its keepers are reachable: changes are sent, and timed
        c.link_up(peer, 0.0)
    c.client_message(1, m.Subscribe(1, quotes(2000)), 0.0)
    t = 0.0
    while c.has_work:
        t += 1.0
        c.work(t)
    last = max(c.router.exporter.exported.values())
    assert c.router.origin._sent_at[last] == t
