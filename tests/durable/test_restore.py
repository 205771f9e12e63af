"""A restarted replicator reads the logs back for its sessions once their subscriptions are
in place again (ges.core.readback), waiting for each one's complete SubAck; on the
simulator, with the client driven by hand (tests.durable.test_handover's harness)."""

from __future__ import annotations

from ges.wire import messages as m
from tests.durable.test_handover import Client, Run

#: the session's profile, changed: what it had, and events of another kind
CHANGED = m.SessionSub(1, "all2", [[m.Constraint("n", "exists")], [m.Constraint("k", "exists")]])


def restarted_with_its_links_down():
    """alice's session at a1 from 0.1 s; a1 crashes at 2 s and is back at 3 s with its links
    down until 5 s (its restored subscription's keepers unreachable); run to 3.2 s. The run
    and a1's replicator."""
    run = Run(handover_after=None, publish_until=10.0)
    run.sim.at(0.1, run.client.open, "a1", "a2", True)
    run.sim.run_until(2.0)
    run.sim.crash("a1", 1.0)
    for peer in ("a2", "b1"):
        run.sim.at(2.999, run.sim.fail_link, "a1", peer, 2.0)
    run.sim.run_until(3.2)
    return run, run.rep("a1")


def test_a_subscription_changed_before_its_restored_one_completes_is_waited_for_instead():
    """Its replicator restarts with its links down (the restored subscription's keepers
    unreachable: no complete SubAck), and the client comes back at once with a changed
    profile. The read-back waits for the change's complete SubAck, which comes once the
    links are up — not for the restored one's, which never will: that held every session of
    the replicator back until RESTORE_WAIT (60 s)."""
    run, rep = restarted_with_its_links_down()
    c, sim = run.client, run.sim
    assert rep._restoring  # the restored subscription is not complete

    def back():
        c.leave()
        c.conns += 1
        c.conn = c.conns
        ask = m.SessionOpen("alice", [CHANGED], replicator="a1", store=c.store, epoch=c.epoch)
        sim.client("a1", c.conn, ask)

    sim.at(3.3, back)
    sim.run_until(8.0)
    assert not run.rep("a1")._restoring and not run.rep("a1")._replays  # read back by 8 s
    sim.run_until(14.0)
    run.check()


def test_a_publisher_first_heard_after_a_restart_and_a_hand_over_is_read_once():
    """b1 restarts holding bob's session, then takes alice's over from a1. A publisher it
    first hears of after both (b2) is read back for every session of b1's — and for alice,
    whose hand-over also reads every publisher first heard in the while after it: once, not
    by both (each from a floor of its own, alice got b2's events twice)."""
    run = Run(publish_until=8.0, publishers=("a1", "a2"))
    alice, sim = run.client, run.sim
    bob = Client(name="bob", sim=sim, conns=500)
    sim.on_session = lambda *a: (alice.on_session(*a), bob.on_session(*a))
    sim.on_crash = lambda b: (alice.on_crash(b), bob.on_crash(b))
    sim.at(0.1, alice.open, "a1", "a2", True)
    sim.at(0.1, bob.open, "b1", "b2", True)
    sim.at(0.6, sim.crash, "b1", 0.4)
    sim.at(2.0, alice.move, "b2")
    t = 4.0
    while t < 8.0:  # b2 publishes from 4 s on: b1 first hears of it then
        sim.at(t, run._publish, "b2")
        t += 0.05
    sim.run_until(16.0)
    assert alice.replicator == "b1" and run.rep("b1")._restarted
    assert any(p == "b2~1" for p, _ in alice.got)
    run.check()  # alice: every event once
    assert sorted(bob.got) == sorted(run.published)


def test_a_change_refused_while_restoring_waits_for_what_the_session_keeps():
    """The client is back with a profile this broker refuses (over its weight bound): the
    session keeps the one it had, entered again, and the read-back waits for that one's
    complete SubAck — not for none, reading the logs back before it has started."""
    import attrs

    run, rep = restarted_with_its_links_down()
    c, sim = run.client, run.sim
    rep.subscriptions.config = attrs.evolve(rep.subscriptions.config, max_client_weight=1)
    refused = []

    def on_session(broker, conn, msg, now):
        if type(msg) is m.Error:  # refused: back with what it had
            refused.append(msg.reason)
            c.conn = None
            sim.at(now + 0.05, c.open, "a1", "a2")
            return
        c.on_session(broker, conn, msg, now)

    sim.on_session = on_session
    ask = m.SessionOpen("alice", [CHANGED], replicator="a1", store=c.store, epoch=c.epoch)
    sim.at(3.3, lambda: (c.leave(), setattr(c, "conn", 900), sim.client("a1", 900, ask)))
    sim.run_until(3.5)
    assert refused and rep._restoring  # waiting for the profile it kept, its keepers away
    sim.run_until(14.0)
    assert not rep._restoring
    run.check()
