"""The simulator's logs commit a group at a time, later, as the runtime's do (ges.sim.commits).

The cores acknowledge and match a reliable publish only once their log has committed it. The
simulator's logs used to commit at once, so it never saw what happens in between. One thing
happens there that matters: the same client subscribing. A Subscribe handled before the commit
matched that client's own earlier publish to the new subscription. The MQTT conformance suites
found this in the runtime, and it was fixed there (``BrokerCore.waits_for_publishes``). The
simulator holds the Subscribe back in the same way, and its checker is told which events each
such subscription must never get.
"""

from __future__ import annotations

import json

import attrs
import pytest

from ges.core import BrokerCore
from ges.matching.model import Profile
from ges.sim import Faults
from ges.sim.scenario import run_seed
from ges.wire import messages as m
from tests.core.test_reliable_core import World
from tests.sim.test_simulator import simulate_cli, topology

OWN_BEFORE = "its own client published it before subscribing"


def test_a_subscribe_right_after_a_publish_waits_for_its_commit_and_gets_none_of_it():
    world = World(commit_after=(0.004, 0.004))
    sim = world.sim
    sim.run_until(0.5)
    world.publish_at(0.5, "b1", 0)
    sim.run_until(0.5)
    key = world.subscribe("b1", 900)  # the publisher, in the same instant
    assert sim.logs["b1"].pending  # the publish waits for its commit…
    assert sim._held_msgs[("b1", 900)]  # …and the Subscribe for the publish
    sim.run_until(0.503)
    assert world.pending and not world.checker.published  # not yet acknowledged
    sim.run_until(0.6)
    assert not sim._held_msgs and not world.pending
    world.checker.not_for(key, "b1~1", [1], OWN_BEFORE)
    world.publish_at(0.7, "b1", 1)
    sim.run_until(3.0)
    world.checker.finish(sim.now)
    assert world.checker.ok, [str(v) for v in world.checker.violations]
    assert world.checker.subs[key].got == {"b1~1": [2]}  # what came after, not before


def test_the_checker_sees_a_subscribe_that_overtakes_its_clients_publish(monkeypatch):
    """With the wait undone, every seed has a publisher's own subscription get what it
    published before it; with commits at once (the simulator before) none did."""
    monkeypatch.setattr(BrokerCore, "waits_for_publishes", lambda self, conn, msg: False)
    for seed in range(3):
        o = run_seed(topology("demo"), seed, faults=Faults(kinds=frozenset()), own=6)
        assert o.ok, o.violations[:3]
        o = run_seed(topology("demo"), seed, faults=Faults(kinds=frozenset()), commit_ms=5, own=6)
        assert not o.ok and all(OWN_BEFORE in v for v in o.violations), o.violations[:3]


@pytest.mark.parametrize("name", ["demo", "figure2"])
def test_every_guarantee_holds_with_group_commits(name):
    """Every fault, durable clients roaming, publishers subscribing as they publish, logs
    committing up to 5 ms late — and a crash between a commit and its acknowledgement, whose
    events the checker then requires."""
    for seed in range(6):
        o = run_seed(
            topology(name), seed, faults=Faults(), durable=2, commit_ms=5, own=6, events=150
        )
        assert o.ok, f"{name} seed {seed}: " + "; ".join(o.violations[:3])


def test_crashes_between_commits_and_acknowledgements_in_runs_cost_no_event():
    """Crashes 4 a second, 8 publishers, logs committing up to 300 ms late: some crashes
    come with a group in flight; its events, never acknowledged, arrive all the same (the
    checker requires them, and fails a run where one goes missing or arrives unpublished).
    Some come with a session store's group in flight, lost: the replicator reads it back; and
    some with a log's group in flight, lost: never published, the next epoch goes on."""
    unacked = lost = lost_log = 0
    faults = attrs.evolve(Faults(), crash_rate=4.0)
    for seed in range(4):
        o = run_seed(
            topology("demo"), seed, faults=faults, commit_ms=300, own=6, durable=2, publishers=8
        )
        assert o.ok, f"seed {seed}: " + "; ".join(o.violations[:3])
        unacked += o.unacked
        lost += o.lost
        lost_log += o.lost_log
    assert unacked > 0 and lost > 0 and lost_log > 0


def _crash_with_a_group_in_flight(lost: bool):
    """b20 subscribes to everything, b1 publishes one event, and crashes before its log's
    group is committed; that group is written, or lost. The world, the subscription, and the
    events the crash wrote."""
    unacked = []
    world = World(
        commit_after=(0.004, 0.004),
        on_unacked=lambda b, pubend, written, now: unacked.extend(written),
    )
    sim = world.sim
    sim.lose_at_crash = 1.0 if lost else 0.0
    sim.run_until(0.5)
    key = world.subscribe("b20", 1, Profile("all"))
    sim.run_until(1.0)
    world.publish_at(1.0, "b1", 0)
    sim.run_until(1.001)
    sim.crash("b1", 0.5)
    assert world.pending  # never acknowledged
    return world, key, unacked


def test_a_crash_between_commit_and_acknowledgement_keeps_the_events():
    """The group in flight at a crash was written: its events are delivered after the
    restart (from the epoch before, which the restarted pubend announces), though their
    publisher never had an acknowledgement."""
    world, key, unacked = _crash_with_a_group_in_flight(lost=False)
    sim = world.sim
    assert [t for t, _ in unacked] == [1] and sim.lost_log_groups == 0
    world.checker.publish("b1~1", 1, [{"n": 0}], sim.now)
    sim.run_until(20.0)
    log = sim.logs["b1"]
    assert sim.cores["b1"].pubend == "b1~2" and log.ended(1) == 1
    # released once every other broker had it (then no longer named)
    assert log.released(1) == 1 and log.previous is None
    world.checker.finish(sim.now)
    assert world.checker.ok, [str(v) for v in world.checker.violations]
    assert world.checker.subs[key].got == {"b1~1": [1]}


def test_a_group_lost_at_a_crash_is_never_published():
    """The group in flight at a crash never finished: its events were never acknowledged nor
    sent, and the restarted pubend's new epoch never uses their ticks. Nothing arrives, and
    nothing is taken for lost: a publish after the restart arrives alone."""
    world, key, unacked = _crash_with_a_group_in_flight(lost=True)
    sim = world.sim
    assert unacked == [] and sim.lost_log_groups == 1
    sim.run_until(2.0)
    log = sim.logs["b1"]
    assert sim.cores["b1"].pubend == "b1~2" and log.previous is None
    assert log.read_epoch(1, 1, 10) == [] and log.ended(1) == 0
    world.publish_at(2.0, "b1", 1)
    sim.run_until(20.0)
    world.checker.finish(sim.now)
    assert world.checker.ok, [str(v) for v in world.checker.violations]
    assert world.checker.subs[key].got == {"b1~2": [1]}
    assert not sim.cores["b20"].counters["lost"]


def test_group_commits_from_the_cli(monkeypatch):
    """``ges simulate --commit-ms MS --own N``; a failed seed's replay line carries both."""
    done = simulate_cli("--faults", "none", "--json", "--commit-ms", "5", "--own", "4")
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    assert summary["ok"] and (summary["commit_ms"], summary["own"]) == (5.0, 4)
    assert summary["log_groups_lost_at_crash"] == summary["groups_lost_at_crash"] == 0
    monkeypatch.setattr(BrokerCore, "waits_for_publishes", lambda self, conn, msg: False)
    failed = simulate_cli("--faults", "none", "--json", "--commit-ms", "5", "--own", "4")
    assert failed.exit_code == 1
    (example,) = json.loads(failed.stdout)["examples"]
    assert example["replay"].endswith(" --commit-ms 5 --own 4")
    table = simulate_cli("--faults", "none", "--commit-ms", "5")
    assert table.exit_code == 0 and "group commits: up to 5 ms late; 0 events" in table.stdout
    bad = simulate_cli("--commit-ms", "-1")
    assert bad.exit_code == 2
    assert "--commit-ms: must be 0 to 1000, not -1" in bad.output
    assert "Traceback" not in bad.output


def test_a_publish_message_is_not_held_for_publishes():
    """Only changes of subscriptions wait: a client's next publish goes in at once."""
    world = World(commit_after=(0.004, 0.004))
    sim = world.sim
    sim.run_until(0.5)
    sim.client("b1", 900, m.Publish(1, [m.Event({"n": 0})]))
    sim.client("b1", 900, m.Publish(2, [m.Event({"n": 1})]))
    assert not sim._held_msgs and sim.logs["b1"].last == 2


def test_a_replicator_streams_only_what_its_session_store_committed():
    """The session store commits a group at a time too: an event reaches a durable session's
    client only once the store that keeps it for the session has committed it."""
    from ges.sim import Sim
    from ges.topology import Topology
    from tests.durable.test_handover import NEST, Client

    client = Client()
    sim = Sim(
        Topology.from_dict(NEST, source="<nest>"),
        seed=3,
        on_session=client.on_session,
        commit_after=(0.01, 0.01),
    )
    client.sim = sim
    sim.at(0.1, client.open, "a1", "a2", True)
    sim.run_until(1.0)
    sim.client("a1", 9, m.Publish(1, [m.Event({"n": 1})]))
    store = sim.session_stores["a1"]
    sim.run_until(1.015)  # the log committed at 1.01, the store's group not yet
    assert store.last > store.committed and client.got == []
    sim.run_until(1.05)
    assert store.committed == store.last and client.got == [("a1~1", 1)]


def test_the_session_store_gives_only_what_it_committed():
    """As the runtime's store does (its reads stop at its last commit): the simulator's
    streamed a session's events before their commit, and a client that came back with its
    token was given them again (ges-paper seed 80083 at --commit-ms 300)."""
    from ges.sim.commits import GroupSessionStore

    store = GroupSessionStore("s")
    for tick in (1, 2):
        store.append("p~1", m.EventItem(tick, 0, 0, m.Event({"n": tick})), [(7, [1])])
    assert store.pending and store.read(7, 0) == []
    store.commit()
    assert [it.epoch for it in store.read(7, 0)] == [1, 2] and not store.pending
    store.append("p~1", m.EventItem(3, 0, 0, m.Event({"n": 3})), [(7, [1])])
    assert [it.epoch for it in store.read(7, 0)] == [1, 2]


def test_a_session_stores_group_lost_at_a_crash_leaves_it_as_its_last_commit():
    """The runtime's other outcome of a ``kill -9``: the transaction never finished. What was
    appended, saved, kept as retained or let go of since the last commit is undone, and the
    epochs go on from the last commit's."""
    from ges.durable.retained import Kept
    from ges.durable.store import SessionState
    from ges.sim.commits import GroupSessionStore

    store = GroupSessionStore("s")
    alice = SessionState("alice", "", 7, {1: ("p", [])}, 0.0)
    store.save_session(alice)
    store.append("p~1", m.EventItem(1, 0, 0, m.Event({"n": 1})), [(7, [1])])
    store.set_top("p~1", 1)
    store.commit()
    alice.acked = 1
    store.save_session(alice)
    store.release(7, 1)
    store.append("p~1", m.EventItem(2, 0, 0, m.Event({"n": 2})), [(7, [1])])
    store.set_top("p~1", 2)
    store.retain(Kept("t", 1, "p~1", 2, m.Event({"n": 2}, b"x")))
    assert store.pending
    store.lose()
    assert not store.pending and store.last == store.committed == 1
    assert store.sessions()["alice"].acked == 0 and store.tops() == {"p~1": 1}
    assert [it.epoch for it in store.read(7, 0)] == [1] and store.retained() == []
    epoch = store.append("p~1", m.EventItem(2, 0, 0, m.Event({"n": 2})), [(7, [1])])
    assert epoch == 2  # (the lost one's: it never reached anyone)
    store.lose()  # (what was restored is not the copy kept: a second loss goes back again)
    assert store.last == 1 and [it.epoch for it in store.read(7, 0)] == [1]
