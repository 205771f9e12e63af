"""Handing a durable session over to the replicator of its client's unit (ges.core.handover,
seed 004 §4's delegation), on the simulator: real broker cores, their links and their
replicators' stores, with the client driven by hand.

The topology nests a finer replicator inside a coarser one: ``a1`` keeps the whole network
``S``, ``b1`` its sub-unit ``S/c2``. Three publishers — one at each replicator (their own
pubends are read from their own logs) and one elsewhere — publish throughout; the session
wants every event, so its client must end up with each published event exactly once, in order
per publisher, whatever moved or crashed meanwhile."""

from __future__ import annotations

import attrs
import pytest

import ges.core.handover as handover
from ges.core import BrokerConfig
from ges.core.outputs import Notice
from ges.core.taking import Taking
from ges.errors import UserInputError
from ges.sim import Sim
from ges.topology import Topology
from ges.wire import messages as m

NEST = {
    "name": "nest",
    "brokers": {
        "a1": {"unit": "S/c1", "port": 1},
        "a2": {"unit": "S/c1", "port": 2},
        "b1": {"unit": "S/c2", "port": 3},
        "b2": {"unit": "S/c2", "port": 4},
    },
    "links": [["a1", "a2"], ["b1", "b2"], ["a2", "b2"], ["a1", "b1"]],
    "replicators": [{"unit": "S", "broker": "a1"}, {"unit": "S/c2", "broker": "b1"}],
}
PUBLISHERS = ("a1", "a2", "b1")
SUB = m.SessionSub(1, "all", [[m.Constraint("n", "exists")]])
#: seconds a client stays in another replicator's unit before its session is handed over
AFTER = 0.5


@attrs.define(eq=False)
class Client:
    """One durable client, driven by hand: it talks to a replicator's core directly (as the
    simulator's roaming clients do), acknowledges what it gets, and follows where it is sent."""

    name: str = "alice"
    sim: Sim | None = None
    replicator: str = ""
    at: str = ""
    conn: int | None = None
    store: str = ""
    epoch: int = -1
    conns: int = 100
    #: (pubend, n) in the order received, and what it was told
    got: list = attrs.Factory(list)
    closed: list = attrs.Factory(list)
    opened: list = attrs.Factory(list)

    def open(self, replicator: str, at: str, subs: bool = False) -> None:
        self.replicator, self.at = replicator, at
        self.conns += 1
        self.conn = self.conns
        msg = m.SessionOpen(
            self.name,
            [SUB] if subs else None,
            replicator=replicator,
            store=self.store,
            epoch=self.epoch,
            at=at,
        )
        if not self.sim.client(replicator, self.conn, msg):  # down: again soon
            self.conn = None
            self.sim.at(self.sim.now + 0.2, self.open, replicator, at, subs)

    def leave(self) -> None:
        if self.conn is not None:
            self.sim.close_client(self.replicator, self.conn)
            self.conn = None

    def move(self, at: str) -> None:
        """Away from where it is, and back at ``at`` with its token."""
        self.leave()
        self.open(self.replicator, at)

    def on_session(self, broker: str, conn: int, msg, now: float) -> None:
        if conn != self.conn:
            return
        kind = type(msg)
        if kind is m.SessionOpened:
            self.opened.append((broker, msg.start, msg.created))
            if msg.store != self.store:
                self.store, self.epoch = msg.store, msg.start
        elif kind is m.SessionEvents:
            fresh = [it for it in msg.items if it.epoch > self.epoch]
            for it in fresh:
                assert not it.gap_to, f"gap notice: {it}"
                self.got.append((it.pubend, it.item.event.attributes["n"]))
            if fresh:
                self.epoch = fresh[-1].epoch
                self.sim.at(now + 0.01, self._ack, conn, self.epoch)
        elif kind is m.SessionClosed:
            self.closed.append((broker, msg.reason, msg.replicator))
            self.conn = None
            if msg.replicator and msg.replicator != self.replicator:
                self.replicator, self.store, self.epoch = msg.replicator, "", -1
            self.sim.at(now + 0.05, self.open, self.replicator, self.at)
        elif kind is m.Error:
            raise AssertionError(f"{broker}: {msg.reason}")

    def _ack(self, conn: int, epoch: int) -> None:
        if conn == self.conn:
            self.sim.client(self.replicator, conn, m.SessionAck(self.name, epoch))

    def on_crash(self, broker: str) -> None:
        if broker == self.replicator and self.conn is not None:
            self.conn = None
            self.sim.at(self.sim.now + 0.2, self.open, self.replicator, self.at)


class Run:
    """The nested topology on the simulator, publishing from PUBLISHERS every 50 ms from
    t = 1 s to ``publish_until``."""

    def __init__(
        self,
        publish_until: float = 6.0,
        on_arrive=None,
        handover_after: float | None = AFTER,
        publishers: tuple = PUBLISHERS,
        topology: dict = NEST,
    ):
        self.client = Client()
        self.published: list[tuple[str, int]] = []
        self._pending: dict = {}
        self.sim = Sim(
            Topology.from_dict(topology, source="<nest>"),
            seed=7,
            config=BrokerConfig(handover_after=handover_after),
            on_session=self.client.on_session,
            on_puback=self._puback,
            on_crash=self.client.on_crash,
            on_arrive=on_arrive,
        )
        self.client.sim = self.sim
        self.n = 0
        t = 1.0
        while t < publish_until:
            for i, b in enumerate(publishers):
                self.sim.at(t + i * 0.01, self._publish, b)
            t += 0.05

    def _publish(self, broker: str) -> None:
        self.n += 1
        seq = self.n
        self._pending[(broker, seq)] = self.n
        self.sim.client(broker, 9, m.Publish(seq, [m.Event({"n": self.n})]))

    def _puback(self, broker: str, conn: int, msg: m.PubAck, now: float) -> None:
        n = self._pending.pop((broker, msg.seq), None)
        if n is not None:
            self.published.append((msg.pubend, n))

    def rep(self, broker: str):
        return self.sim.cores[broker].replicator

    def check(self) -> None:
        """Every acknowledged event exactly once, in order per publisher."""
        got = self.client.got
        assert len(got) == len(set(got)), "delivered twice: " + str(
            sorted({g for g in got if got.count(g) > 1})[:10]
        )
        assert set(got) == set(self.published), (
            f"missing {sorted(set(self.published) - set(got))[:10]}, "
            f"extra {sorted(set(got) - set(self.published))[:10]}"
        )
        for pubend in {p for p, _ in got}:
            ns = [n for p, n in got if p == pubend]
            assert ns == sorted(ns), f"{pubend} out of order"


def slow_target(monkeypatch, answers: int) -> list:
    """The target ignores the source's asks but the ``answers``-th (as if they were lost);
    the times it was asked."""
    real = Taking.on_handover
    asked: list = []

    def slow(self, msg, now):
        asked.append(now)
        return [] if len(asked) < answers else real(self, msg, now)

    monkeypatch.setattr(Taking, "on_handover", slow)
    return asked


def fast_release(run: Run) -> None:
    """Logs released as fast as every broker acknowledges: release rounds every 0.2 s (the
    brokers start again with it, before anything happens)."""
    run.sim.config = attrs.evolve(run.sim.config, ack_every=0.2)
    for b in list(run.sim.cores):
        run.sim.kill(b)
        run.sim.restart(b)


def test_a_client_that_settles_in_a_finer_unit_has_its_session_handed_over_there_exactly():
    run = Run()
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)  # made at a2: homed at the coarser a1

    def mqtt_client_holds():  # the QoS 2 identifiers an MQTT client would hold
        state = run.rep("a1").sessions["alice"].state
        state.qos2, state.rel = {7}, {3}
        state.expiry = 90.0  # and its Session Expiry Interval

    run.sim.at(1.0, mqtt_client_holds)
    run.sim.at(2.0, c.move, "b2")  # into the finer replicator b1's sub-unit
    run.sim.run_until(12.0)
    # they go with it; the PUBREL owed by a1's epoch 3 is negative at b1: never one of its own
    taken = run.rep("b1").sessions["alice"].state
    assert (taken.qos2, taken.rel, taken.expiry) == ({7}, {-3}, 90.0)
    assert c.opened[0] == ("a1", 0, True)
    assert [why for _, why, _ in c.closed] == ["handed over to replicator b1 (its client's unit)"]
    assert c.replicator == "b1" and c.opened[-1][0] == "b1"
    assert "alice" in run.rep("b1").sessions
    assert run.rep("b1").sessions["alice"].state.handover is None  # served there
    run.check()
    assert len(run.published) > 250  # every publisher, throughout
    # the coarser replicator keeps a tombstone a while for openers sent to it, then forgets
    assert run.rep("a1").sessions["alice"].state.handover["phase"] == "moved"
    run.sim.run_until(12.0 + handover.TOMBSTONE_KEEP + 2)
    assert "alice" not in run.rep("a1").sessions


def test_the_coarser_replicator_keeps_a_client_whose_broker_it_serves():
    """A client that stays in the coarser replicator's own part of the unit is served where it
    is: moving within it hands nothing over."""
    run = Run()
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "a1")
    run.sim.run_until(10.0)
    assert c.closed == [] and c.replicator == "a1"
    assert "alice" not in run.rep("b1").sessions
    run.check()


def test_a_client_that_leaves_the_finer_unit_is_handed_back_to_the_coarser_one():
    run = Run()
    c = run.client
    run.sim.at(0.1, c.open, "b1", "b2", True)  # made at b2: homed at the finer b1
    run.sim.at(2.0, c.move, "a2")
    run.sim.run_until(10.0)
    assert c.opened[0][0] == "b1" and c.replicator == "a1"
    run.check()


def test_a_client_away_during_the_hand_over_gets_the_old_part_first_then_the_new():
    """The source streams up to its cut only once the client is back, then sends it on: a
    client that went away just after the hand-over began gets both parts, in order."""
    run = Run()
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    # the hand-over begins at 2.5 s (the timer's next look after AFTER); away just after it
    run.sim.at(2.6, c.leave)
    run.sim.at(5.0, c.open, "a1", "b2")
    run.sim.run_until(12.0)
    assert c.replicator == "b1"
    run.check()


def _crash_on(kind, what: str, broker: str, down_for: float, times: int = 1):
    """An ``on_arrive`` hook crashing ``broker`` just after the first ``times`` messages of
    ``kind`` (a hand-over note ``what``) reach it."""
    seen: list = []

    def hook(src, dst, msg):
        hit = type(msg) is kind and dst == broker and (kind is m.Handover or msg.what == what)
        if hit and len(seen) < times:
            seen.append(msg)
            run.sim.at(run.sim.now, run.sim.crash, broker, down_for)

    run = None

    def bind(r):
        nonlocal run
        run = r

    return hook, bind, seen


@pytest.mark.parametrize(
    ("kind", "what", "broker"),
    [
        (m.Handover, "", "b1"),  # the target, while it takes the session
        (m.HandoverNote, "taken", "a1"),  # the source, as it is told the session is taken
        (m.HandoverNote, "released", "b1"),  # the target, as it may serve the session
    ],
    ids=["target-taking", "source-taken", "target-released"],
)
def test_a_replicator_crashing_during_the_hand_over_loses_and_repeats_nothing(kind, what, broker):
    hook, bind, seen = _crash_on(kind, what, broker, down_for=1.0)
    run = Run(on_arrive=hook)
    bind(run)
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    run.sim.run_until(16.0)
    assert seen, "the crash came"
    assert run.sim.stats["crashes"] == 1
    assert c.replicator == "b1"
    run.check()


def test_a_target_that_never_answers_is_given_up_and_the_session_streams_on(monkeypatch):
    monkeypatch.setattr(handover, "HANDOVER_GIVE_UP", 3.0)
    run = Run()
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(1.5, run.sim.kill, "b1")  # gone for good
    run.sim.at(2.0, c.move, "b2")
    run.sim.run_until(12.0)
    live = run.rep("a1").sessions["alice"]
    assert live.state.handover is None and live.backoff > 0  # given up, tried again later
    assert c.closed == [] and c.replicator == "a1"
    run.check()


def test_a_target_holding_a_session_of_the_same_name_refuses_it():
    run = Run()
    c = run.client
    other = Client(sim=run.sim, conns=500)
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(0.2, other.open, "b1", "b2", True)  # another 'alice', made at b1
    run.sim.at(2.0, c.move, "b2")
    run.sim.run_until(8.0)
    assert run.rep("a1").sessions["alice"].state.handover is None  # refused: it stays
    assert c.replicator == "a1"
    run.check()


def test_ges_clients_lists_a_session_being_handed_over_once():
    run = Run()
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    listed: list = []

    def look():
        names = [
            b
            for b in ("a1", "b1")
            for live in run.rep(b).sessions.values()
            if run.rep(b)._listed(live)
        ]
        listed.append(names)

    handing: list = []

    def find():  # what a lookup by name (ges roam, ges clients end) is told at each
        now = run.sim.now
        got = {b: run.rep(b).find("alice", now).sessions for b in ("a1", "b1")}
        handing.append(tuple(sorted((b, i[0].handover) for b, i in got.items() if i)))

    for i in range(800):
        run.sim.at(2.0 + i * 0.005, look)
        run.sim.at(2.0 + i * 0.005, find)
    run.sim.run_until(8.0)
    assert all(len(names) <= 1 for names in listed)
    assert listed[0] == ["a1"] and listed[-1] == ["b1"]
    seen = set(handing)
    assert (("a1", ""),) in seen  # before
    assert (("a1", "to b1"), ("b1", "from a1")) in seen  # while it is taken
    assert (("a1", "moved to b1"), ("b1", "")) in seen  # after: a tombstone sends openers on


def test_a_bad_hand_over_from_a_peer_is_refused_in_a_note():
    run = Run()
    core = run.sim.cores["b1"]
    bad = m.Handover("b1", "a1", "h", "no good name!", "", 0.0, [SUB], {})
    out = core.on_handover(bad, 1.0)
    (note,) = [o.msg for o in out]
    assert type(note) is m.HandoverNote and note.what == "refused" and "session name" in note.why
    assert "no good name!" not in core.replicator.sessions


def test_the_logs_keep_what_the_target_reads_while_it_is_slow_to_answer(monkeypatch):
    """Logs that release as fast as every broker acknowledges (here every 0.2 s) still hold
    what is after the source's cuts until the target has read it: the source acknowledges
    nothing above its cuts meanwhile. The target answers only the source's fourth ask."""
    asked = slow_target(monkeypatch, answers=4)
    run = Run(handover_after=AFTER)
    fast_release(run)
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    run.sim.run_until(14.0)
    assert len(asked) >= 4 and c.replicator == "b1"
    released = sum(log.released() for log in run.sim.logs.values())
    assert released > 100  # the logs did release, fast
    run.check()


@pytest.mark.parametrize("until", [3.12, 5.0])
def test_there_and_back_again_hands_over_twice_exactly(until):
    """Handed over to the finer replicator and back: the second source's cuts cover what it
    read from the logs for the session, not only what it stored live (else the first
    replicator would read those again) — with publishing ending during the first hand-over
    (nothing stored live after the read), and going on throughout."""
    run = Run(publish_until=until)
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    run.sim.at(3.6, c.move, "a2")
    run.sim.run_until(14.0)
    handed = [r for _, why, r in c.closed if why.startswith("handed over")]
    assert handed == ["b1", "a1"]
    run.check()


@pytest.mark.parametrize("start", [2.955, 3.005, 3.015])
def test_a_publisher_first_heard_during_the_hand_over_is_read_from_its_start(start):
    """A publisher (b2) that begins just as the hand-over does (the source cuts at 3.005 s): the
    source has not heard of it when it cuts, its first events are on their way to the source
    under the session's old subscriptions, and the target's are not in place yet — the target
    reads it from its first tick once it hears of it."""
    asked: list = []
    run = Run(on_arrive=lambda src, dst, msg: type(msg) is m.Handover and asked.append(run.sim.now))
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    t = start
    while t < 4.0:
        run.sim.at(t, run._publish, "b2")
        t += 0.01
    run.sim.run_until(12.0)
    assert 3.0 <= asked[0] < 3.05  # the premise: the cut falls among the publisher's first
    assert c.replicator == "b1"
    assert any(p == "b2~1" for p, _ in run.published)
    run.check()


def test_the_target_answers_taken_only_once_every_pubend_is_read(monkeypatch):
    """The target's own log answers at once: pubends read after it must still be waited for
    before the session counts as taken. Here the finer replicator is a1, whose own pubend's
    name sorts first, and it takes the source's third ask (so there is much to read)."""
    asked = slow_target(monkeypatch, answers=3)
    swapped = {
        **NEST,
        "replicators": [{"unit": "S", "broker": "b1"}, {"unit": "S/c1", "broker": "a1"}],
    }
    run = Run(topology=swapped)
    fast_release(run)
    c = run.client
    run.sim.at(0.1, c.open, "b1", "b2", True)
    run.sim.at(2.0, c.move, "a2")
    run.sim.run_until(12.0)
    assert len(asked) >= 3 and c.replicator == "a1"
    run.check()


def test_a_session_still_being_read_is_not_handed_on_before_it_is_read(monkeypatch):
    """A publisher first heard just as the session is taken (b2, from 3.11 s) is read by the
    finer replicator from its start — slowly: the answers are lost until 5 s. The client is
    back in the coarser unit meanwhile; the session is handed back only once that read is
    done, so the next cut covers it (another session at b1, bob, stores b2's events live
    meanwhile: what b1 has stored of b2 is beyond what it read for alice)."""
    real = Taking.taking_replayed

    def lossy(self, msg, now):
        if self.id == "b1" and msg.pubend == "b2~1" and now < 5.0:
            return [], any(h.replays and msg.pubend in h.replays for h in self._hands.values())
        return real(self, msg, now)

    monkeypatch.setattr(Taking, "taking_replayed", lossy)
    run = Run()
    c = run.client
    bob = Client("bob", sim=run.sim, conns=500)
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(0.1, bob.open, "b1", "b2", True)
    run.sim.at(2.0, c.move, "b2")
    t = 3.11
    while t < 4.0:
        run.sim.at(t, run._publish, "b2")
        t += 0.01
    run.sim.at(3.3, c.move, "a2")
    run.sim.run_until(14.0)
    handed = [r for _, why, r in c.closed if why.startswith("handed over")]
    assert handed == ["b1", "a1"]
    run.check()


def test_the_topology_says_when_sessions_are_handed_over_or_that_they_never_are():
    t = Topology.from_dict({**NEST, "sessions": {"handover_after": "30s"}}, source="<t>")
    assert t.session_limits.handover_after == 30.0
    never = Topology.from_dict({**NEST, "sessions": {"handover_after": "never"}}, source="<t>")
    assert never.session_limits.handover_after == float("inf")
    again = Topology.from_dict(never.to_dict(), source="<again>")
    assert again.session_limits == never.session_limits and again.digest == never.digest
    assert Topology.from_dict(NEST, source="<t>").session_limits.handover_after == 10.0


@pytest.mark.parametrize("bad", ["soon", -3, 0, True, "5x"])
def test_a_bad_handover_after_is_one_line(bad):
    with pytest.raises(UserInputError) as e:
        Topology.from_dict({**NEST, "sessions": {"handover_after": bad}}, source="<t>")
    assert "sessions.handover_after must be" in str(e.value) and "\n" not in str(e.value)


def test_sessions_that_are_never_handed_over_stay_where_they_were_made():
    run = Run(handover_after=None, topology={**NEST, "sessions": {"handover_after": "never"}})
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    run.sim.run_until(10.0)
    assert c.closed == [] and c.replicator == "a1"
    run.check()


def test_the_target_reads_the_logs_only_once_its_subscriptions_are_complete():
    """A keeper of the target's units (b2) is down while the session is taken: the target's
    SubAck comes incomplete after 5 s, and its subscriptions start only once b2 is back and
    has them — later than the logs' last commit then. The target reads the logs only after the
    complete SubAck, so nothing falls between what it read and where its subscriptions
    started."""
    run = Run(publish_until=14.0)
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    run.sim.at(3.0, run.sim.crash, "b2", 9.0)
    run.sim.run_until(24.0)
    assert c.replicator == "b1"
    run.check()


def test_a_will_left_soon_after_a_hand_over_is_held_for_its_delay():
    """A hand-over that has finished is no reason to publish a client's will at once: the target
    watches the session's pubends for a while after, but holds the will for its delay (and a
    return within it cancels it) as for any session."""
    run = Run()
    c = run.client
    run.sim.at(0.1, c.open, "a1", "a2", True)
    run.sim.at(2.0, c.move, "b2")
    run.sim.run_until(12.0)
    rep = run.rep("b1")
    live = rep.sessions["alice"]
    assert live.state.handover is None and live.follower == c.conn
    will = m.Event({"w": 1})
    leave = m.SessionLeave("alice", will=will, will_delay=300.0)
    assert rep.leave(c.conn, leave, run.sim.now) == []
    assert live.state.will == will and live.follower is None
    assert [o for o in rep.on_timer(run.sim.now + 299) if type(o) is not Notice] == []
    assert live.state.will == will


def test_a_session_given_away_while_its_restored_subscription_starts_holds_up_no_other(
    monkeypatch,
):
    """A source restarts with a hand-over still asking: the session's subscriptions are
    entered again, and the logs are read back for every session once all are complete. If
    the target's ``taken`` comes first, the source takes them out: they are not waited for
    any more. (They were, for RESTORE_WAIT: every other session of that replicator got
    nothing for a minute. The simulator found it with its logs committing 300 ms late.)"""
    from ges.core.replicator import Replicator

    seen: list = []

    def hook(src, dst, msg):  # a1 crashes as its ask reaches the target: it stays asking
        if type(msg) is m.Handover and dst == "b1" and not seen:
            seen.append(msg)
            run.sim.at(run.sim.now, run.sim.crash, "a1", 1.0)

    run = Run(on_arrive=hook, publish_until=8.0)
    alice = run.client
    bob = Client(name="bob", sim=run.sim, conns=500)
    run.sim.on_session = lambda *a: (alice.on_session(*a), bob.on_session(*a))
    run.sim.on_crash = lambda b: (alice.on_crash(b), bob.on_crash(b))
    real_own = Replicator.own
    withheld: list = []

    def own(self, conn, msg, now):  # alice's restored subscription never completes
        live = self._by_key.get(-conn)
        restored = self.id == "a1" and run.sim.stats["crashes"] and live is not None
        if restored and live.state.name == "alice" and type(msg) is m.SubAck and msg.complete:
            withheld.append(msg)
            return []
        return real_own(self, conn, msg, now)

    monkeypatch.setattr(Replicator, "own", own)
    run.sim.at(0.1, alice.open, "a1", "a2", True)
    run.sim.at(0.1, bob.open, "a1", "a2", True)
    run.sim.at(2.0, alice.move, "b2")
    run.sim.run_until(14.0)
    assert seen and withheld, "a1 crashed while asking, and restored alice's subscription"
    assert alice.replicator == "b1" and bob.replicator == "a1"
    run.check()  # alice, handed over
    assert sorted(bob.got) == sorted(run.published)  # bob, at the restarted source


def test_a_client_back_at_the_source_with_all_the_tail_is_sent_on(monkeypatch):
    """The source streams the tail up to the cut, then sends the client on once it has
    acknowledged it. A client that had it all but left before acknowledging, and came back
    to the source with its token, raised the acknowledged epoch by the open: nothing more to
    stream, no ack to come, and the session stayed in its tail for good."""
    run = Run()
    c, sim = run.client, run.sim
    quiet = [True]
    real_ack = Client._ack
    monkeypatch.setattr(
        Client,
        "_ack",
        lambda self, conn, epoch: (
            None if quiet[0] and sim.now > 2.3 else real_ack(self, conn, epoch)
        ),
    )
    seen = []

    def watch():  # as the source enters its tail: gone with all it had, none acknowledged
        live = run.rep("a1").sessions.get("alice") if "a1" in sim.cores else None
        h = live and live.state.handover
        if h and h["dir"] == "out" and h["phase"] == "tail":
            seen.append((c.epoch, h["tail_last"]))
            quiet[0] = False
            c.leave()
            sim.at(sim.now + 0.1, c.open, "a1", "b2")
        elif sim.now < 8:
            sim.at(sim.now + 0.005, watch)

    sim.at(2.3, watch)
    sim.at(0.1, c.open, "a1", "a2", True)
    sim.at(2.0, c.move, "b2")
    sim.run_until(14.0)
    (had,) = seen
    assert had[0] >= had[1]  # it had the whole tail
    assert (
        c.replicator == "b1" and run.rep("a1").sessions["alice"].state.handover["phase"] == "moved"
    )
    run.check()


def test_a_target_restarted_while_its_watch_reads_a_new_publisher_reads_on_for_the_session():
    """After the hand-over, the target (b1) hears of a publisher (b2) for the first time and
    reads it for the session from its start — while another session there (bob's, never
    handed over) stores b2's events as they come, so the target's mark of what its sessions
    have of b2 moves past what alice has. The target crashes before its read is answered.
    Restarted, it goes on with alice's read from where it was (``SessionState.reading``), not
    from that mark: the simulator's soak found alice missing b2's first events
    (``ges simulate topologies/ges-paper.yaml --seed 83014 --commit-ms 300 --own 6 --durable 3``)."""
    crashed: list = []

    def hook(src, dst, msg):
        replay = type(msg) is m.Nack and msg.replay and msg.pubend.startswith("b2~")
        if replay and src == "b1" and run.sim.now > 3.5 and not crashed:
            crashed.append(run.sim.now)
            run.sim.at(run.sim.now, run.sim.crash, "b1", 1.0)

    run = Run(on_arrive=hook, publish_until=7.0)
    alice, bob = run.client, Client("bob")
    bob.sim = run.sim
    clients = (alice, bob)
    run.sim.on_session = lambda *a: [c.on_session(*a) for c in clients]
    run.sim.on_crash = lambda b: [c.on_crash(b) for c in clients]
    run.sim.at(0.1, alice.open, "a1", "a2", True)
    run.sim.at(0.1, bob.open, "b1", "b2", True)
    run.sim.at(2.0, alice.move, "b2")
    t = 4.0  # b2 publishes from well after alice's session was handed over to b1
    while t < 6.0:
        run.sim.at(t, run._publish, "b2")
        t += 0.05
    run.sim.run_until(16.0)
    assert crashed and run.sim.stats["crashes"] == 1  # the premise
    assert alice.replicator == "b1" and any(p.startswith("b2~") for p, _ in run.published)
    run.check()
    assert {g for g in bob.got if g[0].startswith("b2~")} == {
        p for p in run.published if p[0].startswith("b2~")
    }
