"""Profile propagation pieces: who keeps what (seed 004 Figure 3), the covering exporter, and
change ids that keep a duplicated change from counting twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from ges.connectivity import ConnectivityGraph
from ges.matching.model import Conjunction, Constraint
from ges.routing import ContentRouter, Exporter, Hierarchy
from ges.routing.export import ADD, REMOVE
from ges.routing.table import SYNC
from ges.topology import Topology
from ges.wire import messages as m

ROOT = Path(__file__).resolve().parents[2]
FIGURE2 = Topology.from_yaml(ROOT / "topologies" / "figure2.yaml")


def view_of(topology: Topology, vertex: str, targets) -> set[str]:
    """Targets as the vertex's connectivity graph names them ("5", "b", "SC-2")."""
    graph = ConnectivityGraph(vertex, topology.brokers[vertex].unit)
    return {str(graph.node_for(t, topology.brokers[t].unit)) for t in targets}


def test_figure_3_targets():
    """Seed 004 §3.2: "any level-0 changes at any of the nodes within cluster c need to be routed
    to node 4. Any level-1 changes at node 4 need to be routed to node 5, and also to a node in
    cluster b. Similarly level-2 changes at node 5 need to be routed to the level-3 gatekeeper in
    cluster a and superclusters SC-3, SC-2." """
    h = Hierarchy(FIGURE2)
    cluster_c, sc1, ssc_a = ("SSC-A", "SC-1", "c"), ("SSC-A", "SC-1"), ("SSC-A",)
    # the paper's level-1 gatekeeper 4, and 5, which is on c's boundary too (its SC-2 gateway)
    assert view_of(FIGURE2, "6", h.keepers[cluster_c]) == {"4", "5"}
    assert h.next_targets("6", "6") == ("4", "5")
    # level-1 changes: node 5 and cluster b, as the paper says, and cluster a, whose level-3
    # gateway also leaves SC-1
    assert view_of(FIGURE2, "4", h.keepers[sc1]) == {"5", "b", "a"}
    assert view_of(FIGURE2, "4", h.next_targets("4", "6")) == {"b", "a"}  # 5 got it as c's
    # level-2 changes: exactly the paper's cluster a, SC-3 and SC-2
    assert view_of(FIGURE2, "5", h.keepers[ssc_a]) == {"a", "SC-3", "SC-2"}
    # a unit with one child has no keepers; the whole system is kept by the top gatekeepers
    assert h.keepers[("SSC-B", "SC-5")] == ()
    assert set(h.keepers[()]) == set(FIGURE2.gatekeepers(3))


def test_every_origin_reaches_every_keeper_of_its_units_along_next_targets():
    h = Hierarchy(FIGURE2)
    for origin in FIGURE2.brokers:
        reached, frontier = {origin}, [origin]
        while frontier:
            b = frontier.pop()
            for t in h.next_targets(b, origin):
                if t not in reached:
                    reached.add(t)
                    frontier.append(t)
        assert reached - {origin} == h.all_keepers(origin), origin


def c(*constraints: tuple) -> Conjunction:
    return Conjunction(tuple(Constraint(*x) for x in constraints))


def test_exporter_sends_only_what_changes_the_aggregate():
    e = Exporter()
    narrow, wide, middle = c(("x", "gt", 10)), c(("x", "gt", 5)), c(("x", "gt", 7))
    assert e.add(narrow) == [(ADD, 1, narrow)]
    assert e.add(narrow) == []  # a second local copy
    assert e.add(wide) == [(REMOVE, 1, narrow), (ADD, 2, wide)]  # wide covers narrow
    assert e.replaced == {1: (2,)}  # a subscription waiting for narrow's acks waits for wide's
    e.replaced.clear()
    assert e.add(middle) == []  # covered
    assert e.seq_for(middle) == 2
    # wide leaves in steps: what it stood for goes up first, then wide is retracted
    assert e.remove(wide) == []
    assert e.pending and e.exported[wide] == 2
    ops = e.step(budget=1_000)
    assert not e.pending
    assert ops[-1] == (REMOVE, 2, wide)
    assert set(e.exported) == {middle}  # the wider of the two is exported, the other under it
    assert e.seq_for(narrow) == e.exported[middle]
    assert e.replaced[2] == (e.exported[middle],)
    assert e.remove(middle) == []  # what it stood for (narrow) goes up, then it goes
    ops = e.step(budget=1_000)
    assert [op for op, _, _ in ops] == [ADD, REMOVE] and ops[1][2] == middle
    assert set(e.exported) == {narrow}
    assert e.remove(narrow) == []
    assert e.remove(narrow)[0][0] == REMOVE
    assert len(e) == 0 and not e.pending
    with pytest.raises(KeyError):
        e.remove(narrow)


def test_exporter_a_conjunction_back_before_it_left_stays():
    e = Exporter()
    wide, narrow = c(("x", "gt", 5)), c(("x", "gt", 10))
    e.add(wide)
    e.add(narrow)
    assert e.remove(wide) == [] and e.pending
    assert e.add(wide) == []  # back: nothing changed upstream
    assert not e.pending and e.exported == {wide: 1} and e.seq_for(narrow) == 1
    assert e.step(budget=1_000) == []


def test_exporter_a_dependent_removed_while_its_coverer_leaves():
    e = Exporter()
    wide, a, b = c(("x", "gt", 5)), c(("x", "gt", 10)), c(("x", "gt", 20))
    for conj in (wide, a, b):
        e.add(conj)
    e.remove(wide)
    e.remove(a)  # not placed yet: it just goes
    e.remove(b)  # the last one: wide goes with it
    assert e.exported == {} and not e.pending


def keeper(broker: str = "4") -> ContentRouter:
    h = Hierarchy(FIGURE2)
    graph = ConnectivityGraph(broker, FIGURE2.brokers[broker].unit)
    return ContentRouter(h, broker, 1, graph)


def change(seq: int, op: int = ADD, origin: str = "6", inc: int = 1, limit: int = 5):
    conj = [m.Constraint("x", "lt", limit)] if op == ADD else []
    return m.ProfileChange(origin, inc, seq, op, conj)


def test_a_change_delivered_twice_counts_once_and_removal_reverses_it():
    k = keeper("4")
    msg = m.Profiles(["4"], [change(1), change(2, limit=9)])
    k.on_profiles(msg)
    k.on_profiles(msg)  # the same changes again, e.g. from a second keeper below
    snapshot = k.kept[("SSC-A", "SC-1", "c")]
    assert snapshot.destinations == {"6": 2}  # two conjunctions, each counted once
    assert snapshot.match({"x": 3}) == {"6"}
    k.on_profiles(m.Profiles(["4"], [change(1, REMOVE), change(2, REMOVE)]))
    k.on_profiles(m.Profiles(["4"], [change(1)]))  # a late copy of a removed add
    assert k.is_empty()


def test_a_sync_retires_what_the_origin_no_longer_has_and_older_incarnations():
    k = keeper("4")
    k.on_profiles(m.Profiles(["4"], [change(1), change(2, limit=9), change(3, limit=20)]))
    k.on_profiles(m.Profiles(["4"], [m.ProfileChange("6", 1, 3, SYNC, seqs=[2])]))
    assert k.entries == 1
    k.on_profiles(m.Profiles(["4"], [change(1)]))  # gone as of the sync: not resurrected
    assert k.entries == 1
    k.on_profiles(m.Profiles(["4"], [m.ProfileChange("6", 2, 0, SYNC)]))  # 6 restarted
    assert k.is_empty()
    k.on_profiles(m.Profiles(["4"], [change(5, inc=1)]))  # from the dead incarnation
    assert k.is_empty()


def test_changes_are_passed_up_and_acknowledged_to_the_origin():
    k = keeper("4")
    # 4's links: 5 and 6 in its cluster, 7 in cluster b (seed 004 Figure 3)
    for peer in ("5", "6", "7"):
        k.graph.observe(peer, FIGURE2.brokers[peer].unit, up=True)
    out = k.on_profiles(m.Profiles(["4"], [change(1)]))
    acks = [msg for _, msg in out if type(msg) is m.ProfileAck]
    assert acks == [m.ProfileAck("6", "4", 1, [1])]
    ups = [msg for _, msg in out if type(msg) is m.Profiles]
    assert set(k.h.next_targets("4", "6")) == {"1", "9"}
    # 9 is in cluster b, reachable over 4-7; 4's view has no route to cluster a yet (its origin
    # syncs it when one appears)
    assert {t for msg in ups for t in msg.to} == {"9"}
    assert k.on_profiles(m.Profiles(["4"], [change(1)])) == []  # a duplicate goes no further


def test_bad_changes_are_refused():
    k = keeper("4")
    with pytest.raises(ValueError, match="unknown broker"):
        k.on_profiles(m.Profiles(["4"], [change(1, origin="nope")]))
    with pytest.raises(ValueError, match="unknown op"):
        k.on_profiles(m.Profiles(["4"], [m.ProfileChange("6", 1, 1, 7)]))
    with pytest.raises(ValueError, match="unknown unit"):
        k.check_routes([m.Route(("SSC-Z",))])


def test_a_resync_sends_what_is_wanted_before_what_it_retires():
    """A resync may go in several messages, and a keeper routes events between them: every live
    add comes before the removals and the sync that retire what they replace."""
    k = keeper("6")
    for peer in ("4", "5"):  # its keepers are reachable: the removal is owed their acks
        k.graph.observe(peer, FIGURE2.brokers[peer].unit, up=True)
    for i in range(3):
        k.local_change([c(("x", "eq", i))], [], 0.0)
    k.local_change([], [c(("x", "eq", 0))], 0.0)
    ops = [change.op for change in k.origin._resync_changes()]
    assert ops == [ADD, ADD, REMOVE, SYNC]


def test_profile_messages_stay_within_a_frame_whatever_the_strings():
    from ges.routing.base import chunks as _chunks
    from ges.wire import DEFAULT_MAX_FRAME, encode
    from ges.wire.frames import HEADER_SIZE

    big = [m.Constraint(f"a{i}", "eq", "z" * 60_000) for i in range(70)]  # ~4 MB, the most
    changes = [m.ProfileChange("6", 1, seq, ADD, big) for seq in range(1, 20)]
    for chunk in _chunks(changes):
        assert len(encode(m.Profiles(["4"], chunk))) - HEADER_SIZE <= DEFAULT_MAX_FRAME
