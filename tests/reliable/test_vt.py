"""VT vectors (seed 000 §3–5): the clock table and digests, V_b at a keeper, the sufficiency
test and its cache, and the keeper's request for a sync when it is behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ges.connectivity import ConnectivityGraph
from ges.reliable.claims import Claims
from ges.reliable.vt import VirtualTime
from ges.routing import ContentRouter, Hierarchy
from ges.routing.export import ADD, REMOVE
from ges.routing.table import RESEND_AFTER, SYNC
from ges.topology import Topology
from ges.wire import messages as m

ROOT = Path(__file__).resolve().parents[2]
FIGURE2 = Topology.from_yaml(ROOT / "topologies" / "figure2.yaml")
BROKERS = frozenset(FIGURE2.brokers)
#: node 4 keeps cluster c = {4, 5, 6} (seed 004 Figure 3)
CLUSTER_C = ("SSC-A", "SC-1", "c")


def vt(me: str = "1") -> VirtualTime:
    return VirtualTime(me, f"{me}~1", BROKERS)


# -- the clock table --------------------------------------------------------------------------


def test_merge_keeps_the_newest_clock_and_counts_a_digest_per_change():
    t = vt()
    assert t.digest == 0 and t.entries() == []
    assert t.merge([("6", 1, 3)]) == [("6", 1, 3)]
    assert t.digest == 1
    assert t.merge([("6", 1, 2), ("6", 1, 3)]) == []  # older or known: no news, same digest
    assert t.digest == 1
    assert t.merge([("6", 2, 1), ("5", 1, 1)]) == [("6", 2, 1), ("5", 1, 1)]  # a restart wins
    assert t.digest == 2
    assert t.table == {"6": (2, 1), "5": (1, 1)}


@pytest.mark.parametrize("entry", [("nope", 1, 1), ("6", -1, 1), ("6", 1, "x")])
def test_a_bad_clock_is_refused(entry):
    with pytest.raises(ValueError):
        vt().merge([entry])


def test_a_clocks_message_with_one_bad_entry_changes_nothing():
    t = vt()
    with pytest.raises(ValueError, match="unknown broker"):
        t.merge([("6", 1, 7), ("nope", 1, 1)])
    assert t.table == {} and t.digest == 0
    with pytest.raises(ValueError, match="bad digest"):
        t.learn(m.Vector("2~1", 0, []))
    with pytest.raises(ValueError, match="bad clock"):
        t.learn(m.Vector("2~1", 3, [("6", 1, -1, 0)]))


def test_a_kept_table_goes_on_with_its_digest():
    """A pubend whose stream goes on across a restart starts from what its log kept, so its
    V_m never shrinks and its digests keep growing."""
    t = vt()
    t.merge([("6", 1, 3)], since=40)
    again = VirtualTime("1", "1~1", BROKERS, t.snapshot())
    assert again.table == {"6": (1, 3)} and again.since == {"6": 40} and again.digest == 1
    again.merge([("5", 1, 1)], since=90)
    assert again.digest == 2 and again.since == {"6": 40, "5": 90}


# -- vectors of other pubends -----------------------------------------------------------------


def test_a_vector_bounds_the_v_m_of_digests_around_it():
    t = vt()
    t.learn(m.Vector("2~1", 5, [("6", 1, 3, 70)]))
    t.learn(m.Vector("2~1", 4, [("6", 1, 1, 20)]))  # older: ignored
    # up to digest 5 it is an upper bound (for the sufficiency test), above it unknown
    assert t.upper("2~1", 3) == (5, {"6": (1, 3)})
    assert t.upper("2~1", 5) == (5, {"6": (1, 3)})
    assert t.upper("2~1", 6) is None
    assert t.upper("2~1", 0) == (0, {})  # the empty V_m
    assert t.upper("3~1", 1) is None  # never heard of
    # from digest 5 up it is a lower bound (for starting points: the clock, and the first tick
    # stamped with it), below it tells nothing
    assert t.lower("2~1", 5, "6") == ((1, 3), 70)
    assert t.lower("2~1", 9, "6") == ((1, 3), 70)
    assert t.lower("2~1", 4, "6") is None
    assert t.lower("2~1", 5, "5") is None
    with pytest.raises(ValueError, match="unknown broker"):
        t.learn(m.Vector("2~1", 9, [("nope", 1, 1, 1)]))


def test_each_link_gets_a_vector_once_before_the_first_frame_with_its_digest():
    t = vt()
    assert t.before("2", "1~1", 0) is None  # the empty V_m needs none
    t.merge([("6", 1, 3)], since=12)
    assert t.before("2", "1~1", 1) == m.Vector("1~1", 1, [("6", 1, 3, 12)])
    assert t.before("2", "1~1", 1) is None  # already had it
    assert t.before("3", "1~1", 1) is not None  # another link
    t.link_down("2")
    assert t.before("2", "1~1", 1) is not None  # a new connection has had nothing
    # a relay passes on what it knows; a digest it has no vector for goes without one
    assert t.before("2", "2~1", 1) is None
    t.learn(m.Vector("2~1", 7, [("5", 1, 1, 3)]))
    assert t.before("2", "2~1", 6) == m.Vector("2~1", 7, [("5", 1, 1, 3)])


# -- V_b and the sufficiency test at a keeper -------------------------------------------------


def keeper() -> ContentRouter:
    h = Hierarchy(FIGURE2)
    return ContentRouter(h, "4", 1, ConnectivityGraph("4", FIGURE2.brokers["4"].unit))


def change(seq: int, op: int = ADD, origin: str = "6", inc: int = 1) -> m.ProfileChange:
    conj = [m.Constraint("x", "lt", 5)] if op == ADD else []
    return m.ProfileChange(origin, inc, seq, op, conj)


def apply(k: ContentRouter, *changes) -> None:
    k.on_profiles(m.Profiles(["4"], list(changes)))


def test_v_b_moves_only_over_a_complete_prefix_of_an_origins_adds():
    k = keeper()
    apply(k, change(1))
    assert k.vb["6"] == [1, 1]
    apply(k, change(3))  # 2 not seen yet: its constraint (6: 2) does not hold
    assert k.vb["6"] == [1, 1]
    apply(k, change(2, REMOVE))  # 2 is known gone
    assert k.vb["6"] == [1, 3]
    apply(k, m.ProfileChange("6", 1, 9, SYNC, seqs=[3, 8]))  # 4..7 gone, 8 still to come
    assert k.vb["6"] == [1, 7]
    apply(k, change(8))
    assert k.vb["6"] == [1, 9]  # 9 itself was not live at the sync
    apply(k, m.ProfileChange("6", 2, 0, SYNC))  # 6 restarted
    assert k.vb["6"] == [2, 0]
    # a sync of a long-lived origin moves V_b in one step, not one seq at a time
    apply(k, m.ProfileChange("6", 2, 1 << 62, SYNC, seqs=[5]))
    assert k.vb["6"] == [2, 4]
    apply(k, change(5, inc=2))
    assert k.vb["6"] == [2, 1 << 62]


def test_the_sufficiency_test_floods_the_child_whose_clock_v_m_knows_newer():
    k = keeper()
    for peer in ("5", "6"):
        k.graph.observe(peer, FIGURE2.brokers[peer].unit, up=True)
    k.keeper.synced.update({"5", "6"})  # both synced: the unsynced rule is out of the way
    apply(k, change(1))
    # 6's clock is (1, 1) here; an event stamped with 6 at (1, 2) finds this keeper behind
    route = m.Route(CLUSTER_C, prev=0)
    wants = {"x": 50}  # matches no profile: only the test can send it anywhere

    def kids(vm, tick):
        hops = k.route_event(wants, [route], claims=Claims(), pubend="1~1", tick=tick, vm=vm)
        return {r.unit[-1] for rs in hops.values() for r in rs}

    assert kids((0, {}), 1) == set()  # the empty V_m: the profile decides
    assert kids((3, {"6": (1, 1)}), 2) == set()  # V_b has it
    assert kids((4, {"6": (1, 2)}), 3) == {"6"}  # behind for 6 only
    assert k.take_lagging(0.0) == ["6"]  # asked for a sync (once per RESEND_AFTER)
    assert k.take_lagging(0.5) == []
    assert kids((4, {"6": (1, 2)}), 4) == {"6"}  # the cached result
    assert k.counters["insufficient"] == 1  # computed once for the digest
    assert kids(None, 5) == {"5", "6"}  # a digest with no vector known: every child
    apply(k, change(2))
    assert kids((4, {"6": (1, 2)}), 6) == set()  # V_b moved: computed again, and passes
    k.sufficiency = False
    assert kids((5, {"6": (1, 9)}), 7) == set()  # switched off: the profile alone decides


def test_a_keeper_behind_asks_the_origin_for_a_sync_which_answers_once_per_resend_wait():
    h = Hierarchy(FIGURE2)
    origin = ContentRouter(h, "6", 1, ConnectivityGraph("6", FIGURE2.brokers["6"].unit))
    origin.graph.observe("4", FIGURE2.brokers["4"].unit, up=True)
    want = m.ProfileWant("6", "4")
    out = origin.on_want(want, 10.0)
    assert [(hop, type(msg)) for hop, msg in out] == [("4", m.Profiles)]
    assert out[0][1].resend and out[0][1].changes[0].op == SYNC
    assert origin.on_want(want, 10.5) == []
    assert origin.on_want(want, 10.0 + RESEND_AFTER) != []
    with pytest.raises(ValueError, match="unknown broker"):
        origin.on_want(m.ProfileWant("6", "nope"), 20.0)
