"""What a replicator's state keeps true between steps (ges.sim.invariants), checked by the
simulator after each step of a broker hosting one.

Each rule holds through a session's ordinary life, and each is broken here by hand once to
show the check sees it. A seed on which the check found a fault runs clean since the fault's
fix."""

from __future__ import annotations

from collections import deque

import pytest

from ges.core.handover import Hand, HandOver
from ges.core.readback import Replay
from ges.durable.store import SessionState
from ges.sim import Faults
from ges.sim.commits import GroupSessionStore
from ges.sim.invariants import replicator_problems, told_problem
from ges.sim.scenario import run_seed
from ges.wire import messages as m
from tests.durable.test_replicator_core import Rig
from tests.sim.test_simulator import topology


def streaming() -> tuple[Rig, object]:
    """A session open on connection 1 with three events sent and not acknowledged."""
    rig = Rig()
    rig.open(1)
    rig.publish(3)
    return rig, rig.rep.sessions["alice"]


def test_the_rules_hold_through_a_sessions_life():
    rig = Rig()
    assert replicator_problems(rig.core) == []
    rig.open(1)
    assert replicator_problems(rig.core) == []
    rig.publish(3)
    assert replicator_problems(rig.core) == []
    rig.ack(1, 2)
    assert replicator_problems(rig.core) == []
    rig.feed(rig.rep.leave(1, m.SessionLeave("alice", expiry=30.0), rig.now))
    rig.publish(2)
    assert replicator_problems(rig.core) == []
    rig.open(2)  # back, on another connection
    assert replicator_problems(rig.core) == []
    rig.control("end")
    assert replicator_problems(rig.core) == []


def _unsaved_ack(rig, live):
    live.state.acked += 1


def _off_count(rig, live):
    live.held += 1


def _lost_key(rig, live):
    del rig.rep._by_key[live.state.key]


def _dirty_nobody(rig, live):
    rig.rep._dirty.add(999)


def _bytes_miscounted(rig, live):
    live.inflight_bytes += 1


def _sent_beyond_commit(rig, live):
    live.sent = rig.store.committed + 1


def _stray_wait(rig, live):
    rig.rep._restoring.add(41)


def _answers_with_no_open(rig, live):
    live.also.append(5)


def _will_not_armed(rig, live):
    live.state.will = m.Event({"topic": "gone"})
    rig.store.save_session(live.state)


def _expiry_late(rig, live):
    rig.feed(rig.rep.leave(1, m.SessionLeave("alice", expiry=30.0), rig.now))
    rig.rep._expiry_due = float("inf")


def _handed_with_no_hand(rig, live):
    cut = rig.store.last
    live.state.handover = {"dir": "out", "to": "x", "hid": "h", "cuts": {}, "cut_epoch": cut,
                           "tail_last": cut, "phase": "asking"}  # fmt: skip
    rig.store.save_session(live.state)


def _empty_group(rig, live):
    rig.rep._uncommitted["r~1"] = deque()


def _subs_not_entered(rig, live):
    live.state.subs = {**live.state.subs, 7: ("q", [[m.Constraint("q", "exists")]])}
    rig.store.save_session(live.state)


def _waits_for_a_subscription_gone(rig, live):
    rig.rep._restarted = True
    rig.rep._restoring_of[live.state.key] = {9: 41}
    rig.rep._restoring.add(41)


def _tail_done_but_kept(rig, live):
    _handed_with_no_hand(rig, live)
    live.state.handover = {**live.state.handover, "phase": "tail", "tail_last": live.state.acked}
    rig.store.save_session(live.state)


def _reading_not_kept(rig, live):
    hand = rig.rep._hands["alice"] = Hand(0.0)
    hand.replays = {"x~1": Replay(1)}


def _moved_but_streaming(rig, live):
    _handed_with_no_hand(rig, live)
    rig.rep._hands["alice"] = Hand(0.0)
    live.state.handover = {**live.state.handover, "phase": "moved"}
    rig.store.save_session(live.state)


@pytest.mark.parametrize(
    "broken, said",
    [
        (_unsaved_ack, "the store has another acked"),
        (_off_count, "holds 3 events, its count says 4"),
        (_lost_key, "1 sessions but 0 keys"),
        (_dirty_nobody, "key 999 is dirty"),
        (_bytes_miscounted, "bytes in flight, its count says"),
        (_sent_beyond_commit, "beyond the store's commit"),
        (_stray_wait, "waits for reqs [41]"),
        (_answers_with_no_open, "opens to answer ([5]) but none is waiting"),
        (_will_not_armed, "holds a will but is not among those willing"),
        (_expiry_late, "its end is late"),
        (_handed_with_no_hand, "handed over to x with no hand"),
        (_empty_group, "uncommitted groups of r~1"),
        (_subs_not_entered, "the broker has subscriptions {1: 'p'}"),
        (_moved_but_streaming, "handed over to x but still streams"),
        (_waits_for_a_subscription_gone, "a restart waits for its subscription 9 (req 41)"),
        (_tail_done_but_kept, "has its tail up to epoch"),
        (_reading_not_kept, "is being read x~1 for, not kept as reading it"),
    ],
)
def test_each_broken_rule_is_said(broken, said):
    rig, live = streaming()
    assert replicator_problems(rig.core) == []
    broken(rig, live)
    problems = replicator_problems(rig.core)
    assert any(said in p for p in problems), problems


def test_a_hand_over_target_saves_each_page_with_what_it_stored():
    """The check's first find: a target reading a pubend for a session it takes kept the tick
    it had read up to (its floors) in memory until the whole pubend was read, while what it
    stored went into the store's groups; a crash in between left a store whose events were
    after its floors. The seed that showed it, and one that ran the same path."""
    for seed in (80001, 80002):
        o = run_seed(topology("demo"), seed, faults=Faults(), durable=3, commit_ms=300, own=6)
        assert o.ok, o.violations[:3]
        assert o.handovers > 0


def test_what_a_replicator_tells_is_checked_against_its_last_commit():
    """Rule 12 on one store: an answer that a session is open, and a hand-over's ``taken``
    and ``done``, each break it until the store's commit holds what they say."""
    store = GroupSessionStore("b1")
    state = SessionState("alice", "", 1, {}, 0.0)
    taking = {"dir": "in", "from": "b2", "hid": "h", "cuts": {}, "phase": "taking"}
    state.handover = taking  # (a target's copy, being taken)
    opened = m.SessionOpened("alice", "b1", "b1", True, 0, 0, [])
    store.save_session(state)
    assert "told a client session alice is open" in told_problem(store, opened)
    store.commit()
    assert told_problem(store, opened) is None
    taken = m.HandoverNote("b2", "b1", "h", "alice", "taken")
    state.handover = {**taking, "phase": "taken"}
    store.save_session(state)
    assert "said 'taken' of session alice" in told_problem(store, taken)
    store.commit()
    assert told_problem(store, taken) is None
    done = m.HandoverNote("b2", "b1", "h", "alice", "done")
    state.handover = None  # served here now
    store.save_session(state)
    assert "said 'done' of session alice" in told_problem(store, done)
    store.commit()
    assert told_problem(store, done) is None
    assert told_problem(store, m.SessionKept("alice", 1)) is None  # (not looked at)
    store.drop_session(state)  # a step said after its session ended here: stale, not this rule's
    assert told_problem(store, taken) is None


def test_a_replicator_that_tells_before_its_commit_is_caught(monkeypatch):
    """With a hand-over's steps said at once rather than once durable (as they were before
    the fault lost groups found), runs that hand sessions over break rule 12."""
    monkeypatch.setattr(HandOver, "_once_kept", lambda self, outs: outs)
    said = []
    for seed in range(4):
        o = run_seed(topology("demo"), seed, faults=Faults(), durable=3, commit_ms=300, own=6)
        said += [v for v in o.violations if "before a commit kept it" in v]
    assert said, "no run told a step before its commit"
