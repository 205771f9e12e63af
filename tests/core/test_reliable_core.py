"""Reliable delivery in the broker core, on the simulator: starting points, nacks, bounds."""

from __future__ import annotations

from pathlib import Path

from ges.core import BrokerConfig, BrokerCore, Notice, ToPeer
from ges.core.readback import ALL_TICKS
from ges.core.repair import MAX_ANSWER_BYTES
from ges.matching.model import Profile, profile_to_wire
from ges.reliable.log import MAX_PROMISED_EPOCHS, MAX_READ, NO_END, MemoryLog
from ges.sim import Checker, Faults, Sim
from ges.topology import Topology
from ges.wire import messages as m

ROOT = Path(__file__).resolve().parents[2]


def demo() -> Topology:
    return Topology.from_yaml(ROOT / "topologies/demo.yaml")


class World:
    """A Sim with a checker wired to it and helpers to subscribe and publish."""

    def __init__(self, faults: str = "none", seed: int = 1, topology=None, **options):
        self.checker = Checker()
        self.pending: dict = {}
        self.subacks: dict = {}
        self.sim = Sim(
            topology or demo(),
            seed=seed,
            faults=Faults.parse(faults),
            on_deliver=self._deliver,
            on_puback=self._puback,
            on_suback=self._suback,
            **options,
        )
        self.seq = 0

    def _deliver(self, b, conn, msg, now):
        key = (b, conn, msg.sub_id)
        ticks = [(it.tick, dict(it.event.attributes)) for it in msg.items]
        self.checker.deliver(key, msg.pubend, ticks, now)

    def _puback(self, b, conn, msg, now):
        batch = self.pending.pop((b, conn, msg.seq), None)
        if batch:
            self.checker.publish(msg.pubend, msg.first_tick, batch, now)

    def _suback(self, b, conn, msg, now):
        self.subacks[(b, conn, msg.sub_id)] = now
        self.checker.subscribed((b, conn, msg.sub_id), now, complete=msg.complete)

    def subscribe(self, broker: str, conn: int, profile: Profile | None = None) -> tuple:
        profile = profile or Profile("all")
        key = (broker, conn, 1)
        self.checker.subscribe(key, profile)
        self.sim.client(broker, conn, m.Subscribe(1, profile_to_wire(profile), profile.id))
        return key

    def ten_to_b20(self, until: float) -> None:
        """A subscriber to everything at b20, then ten events from b1 0.6 s in; run to
        ``until``."""
        self.sim.run_until(0.5)
        self.subscribe("b20", 1)
        for i in range(10):
            self.publish_at(0.6 + i * 0.01, "b1", i)
        self.sim.run_until(until)

    def publish_at(self, when: float, broker: str, n: int) -> None:
        def go(n=n):
            self.seq += 1
            batch = [{"n": n}]
            self.pending[(broker, 900, self.seq)] = batch
            self.sim.client(broker, 900, m.Publish(self.seq, [m.Event(a) for a in batch]))

        self.sim.at(when, go)


def test_a_subscription_at_the_publishers_broker_gets_its_own_events_from_its_start():
    """Its start on its own pubend is the broker's next tick, not what lagging keeper acks say:
    events published while the keepers acknowledge are delivered."""
    w = World()
    w.sim.run_until(0.5)
    for i in range(200):
        w.publish_at(0.5 + i * 0.005, "b1", i)
    w.sim.run_until(0.7)
    key = w.subscribe("b1", 1)
    w.sim.run_until(5.0)
    got = w.checker.subs[key].got
    assert key in w.subacks
    ticks = got[next(iter(got))]
    # from its first delivery on, every one of the broker's own later events, in order
    assert ticks == list(range(ticks[0], 201))
    assert ticks[0] <= 45  # it started while the publisher was still going
    assert w.checker.ok


def test_a_subscription_starts_only_after_every_keeper_acknowledged_it():
    """The SubAck may go after SUBACK_WAIT, but delivery starts only once every keeper has the
    profile: nothing before that moment, everything matching after."""
    w = World()
    w.sim.run_until(0.5)
    key = w.subscribe("b20", 1)
    core = w.sim.cores["b20"]
    # gated until the acks are in, except on its own broker's pubend (no keeper decides that)
    assert core.gates.gate[(1, 1)].levels == [{}] + [None] * len(core.gates.chain)
    for i in range(100):
        w.publish_at(1.0 + i * 0.01, "b1", i)
    w.sim.run_until(5.0)
    w.checker.finish(w.sim.now, start_by=0.5)
    assert w.checker.ok, w.checker.violations
    # no keeper had routed any of b1's ticks before applying it: it gets the whole stream
    assert sum(len(t) for t in w.checker.subs[key].got.values()) == 100
    assert (1, 1) not in core.gates.gate


def _nack_at(core, msg):
    return core.peer_message(next(iter(core.links_up)), msg, 10.0)


def test_a_nack_gets_one_bounded_answer_per_range():
    w = World()
    w.sim.run_until(0.5)
    for i in range(MAX_READ + 100):
        w.publish_at(0.5 + i * 0.0001, "b1", i)
    w.sim.run_until(2.0)
    core = w.sim.cores["b1"]
    out = _nack_at(core, m.Nack(core.pubend, "b20", [(1, 10**15), (5, 7)]))
    answers = [o.msg for o in out if type(o) is ToPeer and type(o.msg) is m.Recovered]
    assert [(a.lo, a.hi, len(a.items)) for a in answers] == [
        (1, MAX_READ, MAX_READ),
        (5, 7, 3),
    ]


def test_an_answer_is_bounded_in_bytes_too():
    """Fifty 200 KB events in the log: one answer carries about 4 MiB of them and says where
    it stops (its hi), so the subend asks again for the rest."""
    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b1"]
    core.client_open(900, "p")
    core.client_message(
        900, m.Publish(1, [m.Event({"n": i}, b"x" * 200_000) for i in range(50)]), 0.6
    )
    out = _nack_at(core, m.Nack(core.pubend, "b20", [(1, 50)]))
    (answer,) = [o.msg for o in out if type(o) is ToPeer and type(o.msg) is m.Recovered]
    assert answer.lo == 1 and answer.hi == len(answer.items) < 50
    assert sum(len(it.event.payload) for it in answer.items) <= MAX_ANSWER_BYTES


def test_ticks_the_logs_bound_dropped_are_answered_as_lost_not_as_silence():
    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b1"]
    core.log.max_events = 20
    for i in range(50):
        w.publish_at(0.5 + i * 0.0001, "b1", i)
    w.sim.run_until(2.0)
    assert core.log.lowest() == 31
    out = _nack_at(core, m.Nack(core.pubend, "b20", [(5, 10), (25, 40), (45, 60)]))
    answers = [o.msg for o in out if type(o) is ToPeer and type(o.msg) is m.Recovered]
    got = [(a.lo, a.hi, a.lost, [it.tick for it in a.items]) for a in answers]
    assert got == [
        (5, 10, True, []),
        (25, 30, True, []),
        (31, 40, False, list(range(31, 41))),
        (45, 50, False, list(range(45, 51))),
    ]


def test_a_nack_for_an_older_epoch_is_answered_as_lost():
    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b1"]
    out = _nack_at(core, m.Nack("b1~0", "b20", [(3, 9)]))
    (answer,) = [o.msg for o in out if type(o) is ToPeer]
    assert type(answer) is m.Recovered and answer.lost and (answer.lo, answer.hi) == (3, 9)
    assert answer.items == []


def test_a_lost_answer_lets_the_subend_go_on_and_says_so():
    w = World()
    w.ten_to_b20(until=2.0)
    core = w.sim.cores["b20"]
    pubend = w.sim.cores["b1"].pubend
    sub = core.subends.streams[pubend]
    top = sub.top
    sub.silence(top + 5, top + 5)  # five more ticks heard of, none known
    assert list(sub.stream.gaps(sub.top)) == [(top + 1, top + 5)]
    peer = next(iter(core.links_up))
    far = core.provenance.distance("b1", peer) + 1  # from the pubend's log, b1
    answer = m.Recovered(pubend, "b20", top + 1, top + 5, [], far, lost=True, by="b1")
    out = core.peer_message(peer, answer, 3.0)
    assert core.counters["lost"] == 5
    assert any(type(o) is Notice and "lost" in o.text for o in out)
    assert list(sub.stream.gaps(sub.top)) == []


def test_an_answer_past_anything_heard_of_is_ignored():
    w = World()
    w.sim.run_until(0.5)
    w.subscribe("b20", 1)
    w.publish_at(0.6, "b1", 0)
    w.sim.run_until(2.0)
    core = w.sim.cores["b20"]
    pubend = w.sim.cores["b1"].pubend
    top = core.subends.streams[pubend].top
    peer = next(iter(core.links_up))
    far = core.provenance.distance("b1", peer) + 1
    bogus = m.Recovered(pubend, "b20", top + 1, top + 10**9, [], far, by="b1")
    out = core.peer_message(peer, bogus, 3.0)
    assert out == [] and core.subends.streams[pubend].stream.known_to == top


class EpochLog(MemoryLog):
    """A log that opened epoch 2 at this start and still holds epoch 1's five events."""

    previous = (1, 5)
    earlier = [(1, 5)]

    def read_epoch(self, epoch, lo, hi, limit=MAX_READ):
        assert epoch == 1
        return [(t, m.Event({"n": t})) for t in range(max(lo, 1), min(hi, 5) + 1)][:limit]

    def lowest(self, epoch=None):
        return 1 if epoch == 1 else super().lowest(epoch)


def test_a_restarted_pubend_announces_its_previous_epoch_and_answers_for_it():
    core = BrokerCore(demo(), "b1", incarnation=9, reliable=True, log=EpochLog(epoch=2))
    assert core.pubend == "b1~2"
    out = core.link_up("b2", 0.0) + core.on_timer(0.0)
    silences = [o.msg for o in out if type(o) is ToPeer and type(o.msg) is m.Silence]
    assert any(s.pubend == "b1~1" and s.tick == 5 for s in silences)
    out = core.peer_message("b2", m.Nack("b1~1", "b2", [(3, 9)]), 0.1)
    (answer,) = [o.msg for o in out if type(o) is ToPeer]
    assert (answer.lo, answer.hi, answer.lost) == (3, 9, False)
    assert [it.tick for it in answer.items] == [3, 4, 5]


def test_a_replay_of_an_earlier_epoch_reads_to_its_end_and_is_told_it_is_done():
    """A replicator reading an earlier epoch back (a restart, a hand-over, the retained
    catch-up) asks for everything from a tick on; it is answered with what the epoch holds,
    silence past it, and its next ask, past that, with nothing: it is done (it used to get
    no answer, and asked again each second for ever)."""
    log = EpochLog(epoch=2)
    core = BrokerCore(demo(), "b1", incarnation=9, reliable=True, log=log)
    core.link_up("b2", 0.0)
    (page,) = core.repair.from_log(m.Nack("b1~1", "b2", [(3, ALL_TICKS)], replay=True))
    assert page.replay and [it.tick for it in page.items] == [3, 4, 5]
    assert (page.lo, page.hi) == (3, NO_END)
    (done,) = core.repair.from_log(m.Nack("b1~1", "b2", [(page.hi + 1, ALL_TICKS)], replay=True))
    assert done.replay and done.lo == page.hi + 1 and done.hi == page.hi and not done.items


def test_a_restarted_pubend_announces_every_earlier_epoch_its_log_names():
    """Epoch 3 of a broker whose epoch 2 was too short to announce epoch 1's end: both are
    announced (a subscriber that missed epoch 1's last events learns of them)."""
    log = EpochLog(epoch=4)
    log.earlier = [(3, 2), (1, 5)]
    core = BrokerCore(demo(), "b1", incarnation=9, reliable=True, log=log)
    out = core.link_up("b2", 0.0) + core.on_timer(0.0)
    silences = {(o.msg.pubend, o.msg.tick) for o in out if type(o.msg) is m.Silence}
    assert {("b1~3", 2), ("b1~1", 5)} <= silences


# -- releasing the log (issue 5, Deliver 1) ---------------------------------------------------


def _ask(core, pubend: str, tick: int, oldest: int = 0) -> int | None:
    """Feed ``core`` an AckAsk for it; the tick it acknowledges (None if it does not answer)."""
    ask = m.AckAsk(pubend, [core.id], tick, oldest=oldest)
    out = core.peer_message(next(iter(core.links_up)), ask, 10.0)
    acks = [o.msg for o in out if type(o) is ToPeer and type(o.msg) is m.Ack]
    assert len(acks) <= 1
    if not acks:
        return None
    ((origin, acked),) = acks[0].acks
    assert origin == core.id and acks[0].asked == tick
    return acked


def test_a_broker_acknowledges_no_further_than_its_subends_horizon():
    w = World()
    w.ten_to_b20(until=3.0)
    core = w.sim.cores["b20"]
    pubend = w.sim.cores["b1"].pubend
    sub = core.subends.streams[pubend]
    assert sub.stream.floor == 10
    assert _ask(core, pubend, 8) == 8  # never past the tick asked about
    sub.silence(15, 15)  # ticks 11..14 heard of but not known: the horizon stays at 10
    assert _ask(core, pubend, 15) == 10
    # a broker with no subscription needs nothing up to the tick asked about
    assert _ask(w.sim.cores["b12"], pubend, 15) == 15


def test_a_broker_with_a_subscription_waiting_for_its_start_does_not_answer():
    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b20"]
    pubend = w.sim.cores["b1"].pubend
    core.client_open(5, "late")
    core.client_message(5, m.Subscribe(1, profile_to_wire(Profile("all")), "all"), 0.6)
    assert core.gates.gate[(5, 1)].levels[core.gates.level(pubend)] is None
    assert _ask(core, pubend, 3) is None


def test_the_log_is_released_once_every_other_broker_acknowledged_it():
    w = World()
    w.ten_to_b20(until=4.0)
    log = w.sim.logs["b1"]
    assert (len(log), log.released()) == (10, 0)  # the first round is ACK_EVERY after
    w.sim.run_until(12.0)
    assert (len(log), log.released(), log.last) == (0, 10, 10)  # ticks go on from 11
    assert w.sim.cores["b1"].stats().log_released == 10
    # a nack for released ticks is answered "nothing for you", not as a loss
    core = w.sim.cores["b1"]
    out = _nack_at(core, m.Nack(core.pubend, "b20", [(2, 6)]))
    (answer,) = [o.msg for o in out if type(o) is ToPeer]
    assert (answer.lo, answer.hi, answer.items, answer.lost) == (2, 6, [], False)


def test_a_broker_passes_an_ask_on_once_per_hop_and_gathers_the_answers_from_beyond():
    ACK_GATHER = BrokerConfig().ack_gather
    w = World()
    w.sim.run_until(0.5)
    pubend = w.sim.cores["b1"].pubend
    core = w.sim.cores["b3"]  # b3-b7 is the gateway to SC-2

    def ask(tick, now):
        out = core.peer_message("b1", m.AckAsk(pubend, ["b3", "b7", "b8"], tick), now)
        return [(o.peer, o.msg) for o in out if type(o) is ToPeer]

    def answer(origin, tick, asked, now):
        out = core.peer_message("b7", m.Ack(pubend, [(origin, tick)], asked=asked), now)
        return [(o.peer, o.msg) for o in out if type(o) is ToPeer]

    # one ask to b7 names both brokers beyond it; b3's own answer waits for theirs
    assert ask(5, 1.0) == [("b7", m.AckAsk(pubend, ["b7", "b8"], 5, hops=1))]
    assert ask(5, 1.05) == []  # a copy of it: passed on and gathered for already
    assert answer("b7", 5, 5, 1.1) == []
    ((dest, ack),) = answer("b8", 4, 5, 1.2)  # less than asked: a subend's horizon
    assert (dest, sorted(ack.acks), ack.asked) == ("b1", [("b3", 5), ("b7", 5), ("b8", 4)], 5)
    # a broker that does not answer in time: what came goes on, and its answer later alone
    ask(9, 2.0)
    assert answer("b7", 9, 9, 2.1) == []
    assert core.next_deadline() <= 2.0 + ACK_GATHER
    out = core.on_timer(2.0 + ACK_GATHER)
    (ack,) = [o.msg for o in out if type(o) is ToPeer and type(o.msg) is m.Ack]
    assert sorted(ack.acks) == [("b3", 9), ("b7", 9)]
    ((dest, late),) = answer("b8", 9, 9, 3.5)
    assert (dest, late.acks) == ("b1", [("b8", 9)])


def test_a_broker_further_out_gives_up_gathering_first():
    ACK_GATHER, GATHER_STEP = BrokerConfig().ack_gather, BrokerConfig().gather_step
    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b3"]
    for pubend, hops in (("b1~1", 1), ("b2~1", 6)):
        core.peer_message("b1", m.AckAsk(pubend, ["b7", "b8"], 5, hops=hops), 1.0)
    due = {p: g.due for p, g in core.release.gathers.items()}
    assert due == {
        "b1~1": 1.0 + ACK_GATHER - GATHER_STEP,
        "b2~1": 1.0 + ACK_GATHER - 6 * GATHER_STEP,
    }
    assert core.next_deadline() <= due["b2~1"]
    core.on_timer(due["b2~1"])
    assert list(core.release.gathers) == ["b1~1"]


def test_malformed_asks_and_answers_are_protocol_errors():
    from ges.core.broker import ProtocolError

    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b3"]
    bad = [
        m.AckAsk("b1~1", ["b7", "nobody"], 5),
        m.AckAsk("b1~1", ["b7"] * 21, 5),  # more names than the topology has brokers
        m.AckAsk("x9~1", ["b7"], 5),
        m.Ack("b1~1", [("nobody", 5)], 5),
    ]
    for msg in bad:
        try:
            core.peer_message("b1", msg, 1.0)
        except ProtocolError:
            continue
        raise AssertionError(f"accepted {msg}")


def test_a_release_round_sends_one_ask_and_one_answer_per_broker():
    """The asks fan out over a tree and the answers gather back up it (seed 002 §2): a round
    costs a frame per broker each way, not one per broker per hop of its path."""
    w = World()
    w.ten_to_b20(until=4.0)
    before = dict(w.sim.frame_types)
    w.sim.run_until(7.0)  # the first round, 5 s after the first publish
    assert w.sim.logs["b1"].released() == 10
    others = len(w.sim.cores) - 1
    asks = w.sim.frame_types["AckAsk"] - before.get("AckAsk", 0)
    acks = w.sim.frame_types["Ack"] - before.get("Ack", 0)
    assert asks == others  # every broker is named in exactly one frame that reaches it
    assert acks <= others  # gathered: one per broker, not one per hop of every answer


def test_a_broker_that_never_answers_holds_the_release_back():
    w = World()
    w.sim.run_until(0.5)
    w.subscribe("b20", 1)
    w.sim.crash("b12", 100.0)  # down for good, as far as this run goes
    for i in range(10):
        w.publish_at(0.6 + i * 0.01, "b1", i)
    w.sim.run_until(20.0)
    core = w.sim.cores["b1"]
    assert w.sim.logs["b1"].released() == 0 and len(w.sim.logs["b1"]) == 10
    assert core.release.behind == {"b12"}


def test_acknowledgements_are_kept_per_epoch_until_their_broker_says_it_holds_them_no_more():
    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b12"]
    assert _ask(core, "b1~1", 15) == 15
    assert core.log.promised() == {"b1~1": 15}
    assert _ask(core, "b1~2", 4) == 4  # b1 restarted with a new epoch
    assert _ask(core, "b1~1", 20) == 20  # the old one is still released
    assert _ask(core, "b7~1", 0) == 0  # (an answer of 0 keeps nothing)
    assert core.log.promised() == {"b1~1": 20, "b1~2": 4}
    assert _ask(core, "b1~3", 1, oldest=2) == 1  # b1 holds epoch 1 no more
    assert core.log.promised() == {"b1~2": 4, "b1~3": 1}
    assert _ask(core, "b1~2", 9, oldest=7) == 9  # (no ask says its own epoch is gone)
    assert core.log.promised() == {"b1~2": 9, "b1~3": 1}


def test_against_a_broker_that_never_says_the_newest_epochs_are_kept_up_to_a_bound():
    w = World()
    w.sim.run_until(0.5)
    core = w.sim.cores["b12"]
    for epoch in range(2, 2 + MAX_PROMISED_EPOCHS):
        assert _ask(core, f"b1~{epoch}", 1) == 1
    assert _ask(core, "b1~1", 30) is None  # older than every one kept: not given
    assert _ask(core, f"b1~{2 + MAX_PROMISED_EPOCHS}", 1) == 1  # a newer one: the oldest goes
    assert "b1~2" not in core.log.promised() and len(core.log.promised()) == MAX_PROMISED_EPOCHS


def test_an_acknowledgement_of_an_epoch_still_held_stays_when_newer_ones_are_given():
    """A review's find: a bound of nine epochs forgot b2's acknowledgement of b1~3, which b1
    still counted, so a subend made later started below it and could miss what b1 released
    meanwhile. Only b1 saying it holds b1~3 no more lets b2 forget it."""
    w = World()
    w.sim.run_until(0.5)
    b2 = w.sim.cores["b2"]
    for epoch in range(4, 12):  # eight newer epochs, from b1's earlier incarnations
        assert _ask(b2, f"b1~{epoch}", 5, oldest=3) == 5
    assert _ask(b2, "b1~3", 500, oldest=3) == 500
    assert _ask(b2, "b1~13", 1, oldest=3) == 1
    assert b2.release.promised("b1~3") == 500
    w.subscribe("b2", 1)
    w.sim.run_until(3.0)
    assert b2.subends.subend("b1~3", 0).stream.floor >= 500


def test_older_epochs_held_while_a_broker_was_down_are_released_once_it_is_back():
    """A review's find: b12 down while b1 restarts eleven times, each epoch keeping rows; with
    acknowledgements kept for the nine newest epochs only, b1~1 and b1~2 came back into
    rounds nobody would answer, for good."""
    w = World()
    w.sim.run_until(0.5)
    w.sim.kill("b12")
    t = 0.5
    for _ in range(11):
        for i in range(3):
            w.publish_at(t + 0.1 + i * 0.01, "b1", i)
        w.sim.run_until(t + 1.0)
        w.sim.crash("b1", 0.2)
        t += 1.5
        w.sim.run_until(t)
    w.sim.restart("b12")
    w.sim.run_until(t + 60)
    w.sim.crash("b1", 0.2)  # the older epochs come back into its rounds
    w.sim.run_until(t + 360)
    log, core = w.sim.logs["b1"], w.sim.cores["b1"]
    assert log.earlier == [] and core.release.ended == {}
    assert all(log.released(e) == log.ended(e) == 3 for e in range(1, 12))


def test_an_earlier_epoch_is_acknowledged_only_as_far_as_a_subend_of_it_has_it():
    """Its last ticks may never have been routed: a broker with subscriptions learns of them
    only from its end announced, which makes its subend. Until then it acknowledges none."""
    w = World()
    w.ten_to_b20(until=3.0)
    assert _ask(w.sim.cores["b12"], "b1~7", 30) == 30  # nothing subscribed there
    b20 = w.sim.cores["b20"]
    assert _ask(b20, "b1~7", 30) == 0  # subscribed, but no subend of it
    floor = b20.subends.streams["b1~1"].stream.floor
    assert floor == 10 and _ask(b20, "b1~1", 10) == 10


def test_an_earlier_epoch_is_released_everywhere_and_then_no_longer_announced():
    w = World()
    w.ten_to_b20(until=1.0)
    w.sim.crash("b1", 0.5)  # before its first release round: all ten still in its log
    w.sim.run_until(2.0)
    log = w.sim.logs["b1"]
    assert log.epoch == 2 and log.released(1) == 0 and log.earlier == [(1, 10)]
    core = w.sim.cores["b1"]
    assert list(core.release.ended) == ["b1~1"] and core.stats().log_epochs == 1
    w.sim.run_until(20.0)
    assert log.released(1) == 10 and log.earlier == [] and core.release.ended == {}
    assert core.stats().log_epochs == 0
    assert log.read_epoch(1, 1, 100) == []
    others = [b for b in w.sim.cores if b != "b1"]
    assert all(w.sim.logs[b].promised().get("b1~1") == 10 for b in others)
    silences = dict(w.sim.frame_types).get("Silence", 0)
    w.sim.run_until(120.0)
    out = core.publishing.silence_round(w.sim.now + 1000)  # none of the old epoch any more
    assert {o.msg.pubend for o in out if type(o) is ToPeer} == {"b1~2"}
    assert dict(w.sim.frame_types).get("Silence", 0) > silences  # (the new one's still go)
    w.checker.finish(w.sim.now, start_by=0.5)
    assert w.checker.ok and w.checker.subs[("b20", 1, 1)].got["b1~1"] == list(range(1, 11))


def test_a_nack_for_an_epoch_that_is_no_number_is_answered_as_lost():
    core = BrokerCore(demo(), "b1", incarnation=9, reliable=True, log=EpochLog(epoch=2))
    core.link_up("b2", 0.0)
    for epoch in ("99999999999999999999999", "²", "x"):
        out = core.peer_message("b2", m.Nack(f"b1~{epoch}", "b2", [(3, 9)]), 0.1)
        (answer,) = [o.msg for o in out if type(o) is ToPeer]
        assert (answer.lo, answer.hi, answer.lost) == (3, 9, True)
