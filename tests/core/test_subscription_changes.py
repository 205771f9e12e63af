"""Subscriptions that are made, changed and replaced while their keepers catch up (reliable
delivery, on the simulator): complete and incomplete SubAcks, adds owed by every keeper, a
second request for a subscription, covering replacement, and profile changes."""

from __future__ import annotations

import copy
import functools
import itertools
import random
from pathlib import Path

import pytest

from ges.core import BrokerConfig, ToClient
from ges.matching.model import Conjunction, Constraint, Profile, profile_to_wire
from ges.sim import Checker, Faults, Sim
from ges.topology import Topology
from ges.wire import messages as m

SUBACK_WAIT = BrokerConfig().suback_wait

ROOT = Path(__file__).resolve().parents[2]
#: The publisher's broker and the subscribers' broker: far apart in the demo topology.
PUB, SUB = "b1", "b20"
#: b20's cluster keeper and only other link: the one keeper of b20 that b20 itself sees go
#: (the others sit inside units that b20's view shows as single nodes).
NEAR_KEEPER = "b19"
#: One of b20's top-level keepers, in the other super-super-cluster.
FAR_KEEPER = "b6"
SETTLE = 0.5
#: When the profile-change tests change the profile (the subscription started long before).
CHANGE = 0.8


def where(name: str, *constraints: tuple) -> Profile:
    """A one-conjunction profile, e.g. ``where("low", ("n", "lt", 50))``."""
    return Profile(name, (Conjunction(tuple(Constraint(*c) for c in constraints)),))


ALL = Profile("all")
LOW = where("low", ("n", "lt", 60))  # n 0..59
HIGH = where("high", ("n", "ge", 40))  # n 40..99; with LOW: 40..59


@functools.cache
def demo() -> Topology:
    return Topology.from_yaml(ROOT / "topologies/demo.yaml")


class Net:
    """The demo topology on the simulator, settled, with a checker and a record of every
    SubAck, delivery and publication (published events carry ``n``, spread over 0..99)."""

    def __init__(self, *, reliable: bool = True):
        self.checker = Checker()
        #: (broker, conn, sub_id) -> [(time, complete)]
        self.subacks: dict[tuple, list[tuple[float, bool]]] = {}
        #: (broker, conn, sub_id) -> [(time, tick, attributes)], pubend PUB's only
        self.got: dict[tuple, list[tuple[float, int, dict]]] = {}
        #: [(time, tick, attributes)] of PUB's pubend, as acknowledged to the publisher
        self.published: list[tuple[float, int, dict]] = []
        self._pending: dict = {}
        self._seq = 0
        self._i = 0
        self.sim = Sim(
            demo(),
            seed=1,
            reliable=reliable,
            on_deliver=self._deliver,
            on_puback=self._puback,
            on_suback=self._suback,
        )
        self.sim.run_until(SETTLE)

    # -- callbacks ---------------------------------------------------------------------------

    def _deliver(self, b, conn, msg, now):
        key = (b, conn, msg.sub_id)
        ticks = [(it.tick, dict(it.event.attributes)) for it in msg.items]
        if msg.pubend.startswith(PUB + "~"):
            self.got.setdefault(key, []).extend((now, t, a) for t, a in ticks)
        self.checker.deliver(key, msg.pubend, ticks, now)

    def _puback(self, b, conn, msg, now):
        batch = self._pending.pop((b, conn, msg.seq), None)
        if batch:
            self.checker.publish(msg.pubend, msg.first_tick, batch, now)
            if b == PUB:
                self.published += [(now, msg.first_tick + i, a) for i, a in enumerate(batch)]

    def _suback(self, b, conn, msg, now):
        self.subacks.setdefault((b, conn, msg.sub_id), []).append((now, msg.complete))
        self.checker.subscribed((b, conn, msg.sub_id), now, complete=msg.complete)

    # -- doing -------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.sim.now

    def run(self, until: float) -> None:
        self.sim.run_until(until)

    def subscribe(self, profile: Profile, conn: int = 1, broker: str = SUB) -> tuple:
        key = (broker, conn, 1)
        self.checker.subscribe(key, profile)
        self.sim.client(broker, conn, m.Subscribe(1, profile_to_wire(profile), profile.id))
        return key

    def unsubscribe(self, key: tuple) -> None:
        self.checker.gone(key)
        self.sim.client(key[0], key[1], m.Unsubscribe(key[2]))

    def publish(self, attributes: dict, broker: str = PUB) -> None:
        self._seq += 1
        self._pending[(broker, 900, self._seq)] = [attributes]
        self.sim.client(broker, 900, m.Publish(self._seq, [m.Event(attributes)]))

    def stream(self, start: float, stop: float, every: float = 0.001) -> None:
        """One event every ``every`` seconds from ``PUB``; ``n`` jumps by 37 (mod 100), so
        every profile here has matching and non-matching events within a few ticks."""
        t = start
        while t < stop - 1e-9:
            self.sim.at(t, self._next)
            t += every

    def _next(self) -> None:
        self.publish({"n": (self._i * 37) % 100})
        self._i += 1

    def when(self, condition, since: float, until: float) -> list[float]:
        """Poll ``condition()`` every millisecond from ``since``: the returned list gets the
        first time it holds (if it does by ``until``)."""
        seen: list[float] = []

        def poll():
            if condition():
                seen.append(self.now)
            elif self.now < until:
                self.sim.at(self.now + 0.001, poll)

        self.sim.at(since, poll)
        return seen

    # -- reading -----------------------------------------------------------------------------

    def ticks(self, key: tuple, after: float = float("-inf"), before: float = float("inf")):
        """PUB's ticks delivered to ``key`` in ``(after, before)``."""
        return [t for at, t, _ in self.got.get(key, []) if after < at < before]

    def due(self, match, after: float, before: float = float("inf")) -> list[int]:
        """PUB's ticks published in ``(after, before)`` that ``match`` (a predicate on ``n``)."""
        return [t for at, t, a in self.published if after < at < before and match(a["n"])]

    def finish(self) -> None:
        self.checker.finish(self.now)
        assert self.checker.ok, [str(v) for v in self.checker.violations]


_settled: dict[bool, Net] = {}


def settled(*, reliable: bool = True) -> Net:
    """A fresh settled network: a copy of one settled once per delivery mode (settling the
    connectivity of 20 brokers costs most of a test here)."""
    base = _settled.get(reliable)
    if base is None:
        base = _settled[reliable] = Net(reliable=reliable)
    net = copy_of(base)
    assert net.sim.on_deliver.__self__ is net and net.now == SETTLE
    return net


def copy_of(net: Net) -> Net:
    """A copy of ``net`` that goes on apart from it."""
    # the simulator's counters go on where they are, in both (copying an itertools.count is
    # deprecated): the original gets a fresh one, the copy another
    sim = net.sim
    memo: dict = {}
    for name, value in list(vars(sim).items()):
        if isinstance(value, itertools.count):
            n = next(value)
            setattr(sim, name, itertools.count(n))
            memo[id(getattr(sim, name))] = itertools.count(n)
    return copy.deepcopy(net, memo)


def isolate(net: Net, broker: str, how: str, down_for: float) -> None:
    """Make ``broker`` unreachable for ``down_for`` seconds: crash it, or cut all its links."""
    if how == "crash":
        net.sim.crash(broker, down_for)
    else:
        for n in net.sim.topology.neighbours[broker]:
            net.sim.fail_link(broker, n, down_for)


# -- SubAck.complete ------------------------------------------------------------------------


def test_a_subscription_every_keeper_acknowledged_gets_a_complete_suback():
    net = settled()
    core = net.sim.cores[SUB]
    key = net.subscribe(ALL)
    assert net.subacks == {}  # not before the keepers' acks
    (seq,) = core.router.pending
    assert core.router.pending[seq] == set(core.router.h.all_keepers(SUB))
    net.stream(0.6, 1.0)
    net.run(1.5)
    ((at, complete),) = net.subacks[key]
    assert complete is True
    assert at < SETTLE + 0.1  # the acks took milliseconds, not SUBACK_WAIT
    assert core.router.pending == {}
    assert net.ticks(key) == net.due(lambda n: True, SETTLE)  # everything after it
    net.finish()


@pytest.mark.parametrize("how", ["crash", "cut"])
def test_an_unreachable_keeper_makes_the_suback_incomplete_and_holds_delivery_until_it_acks(how):
    """The SubAck goes after SUBACK_WAIT, incomplete; nothing is delivered until the keeper is
    back and has the profile; from then on every matching event is."""
    net = settled()
    back = 7.0
    isolate(net, NEAR_KEEPER, how, back - net.now)
    net.run(0.6)
    core = net.sim.cores[SUB]
    key = net.subscribe(ALL)
    (seq,) = core.router.pending
    acked = net.when(lambda: core.router.acked({seq}), net.now, back + 1.5)
    net.stream(0.7, 1.2, every=0.005)
    net.stream(back - 0.5, back + 1.0, every=0.005)
    net.run(0.6 + SUBACK_WAIT - 0.01)
    assert net.subacks == {}
    assert set().union(*core.router.pending.values()) == {NEAR_KEEPER}
    net.run(0.6 + SUBACK_WAIT + 0.01)
    assert net.subacks[key] == [(pytest.approx(0.6 + SUBACK_WAIT), False)]
    net.run(back + 1.5)
    (start,) = acked
    assert back < start < back + 0.1  # the keeper acknowledged it once it was back
    # no second incomplete answer; a complete one only once every keeper has it
    assert all(c and at > start - 0.001 for at, c in net.subacks[key][1:]), net.subacks[key]
    assert net.ticks(key, before=start) == []  # nothing until then
    want = net.due(lambda n: True, start)
    assert len(want) > 150
    assert set(want) <= set(net.ticks(key))  # everything after
    net.finish()


# -- an add is owed by every keeper (reliable), or by the reachable ones (best effort) ------


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "best-effort"])
def test_an_add_is_owed_by_a_keeper_unreachable_when_subscribing_only_with_reliable_delivery(
    reliable,
):
    net = settled(reliable=reliable)
    isolate(net, NEAR_KEEPER, "crash", 20.0)
    net.run(0.6)
    core = net.sim.cores[SUB]
    assert core.router.wait_for_all is reliable
    key = net.subscribe(ALL)
    (seq,) = core.router.pending
    keepers = set(core.router.h.all_keepers(SUB))
    net.stream(1.0, 1.5, every=0.01)
    if reliable:
        assert core.router.pending[seq] == keepers
        net.run(2.0)
        assert core.router.pending == {seq: {NEAR_KEEPER}}
        assert net.subacks == {}
        net.run(7.0)
        assert net.subacks[key] == [(pytest.approx(0.6 + SUBACK_WAIT), False)]
        assert core.router.pending == {seq: {NEAR_KEEPER}}
        assert key not in net.got  # not started
    else:
        assert core.router.pending[seq] == keepers - {NEAR_KEEPER}
        net.run(2.0)
        assert core.router.pending == {}
        assert net.subacks[key] == [(pytest.approx(0.6, abs=0.05), True)]
        assert len(net.got[key]) == 50


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "best-effort"])
def test_a_keeper_lost_while_it_owes_an_ack_is_settled_only_with_best_effort(reliable):
    """``_forget_keeper`` (the keeper became unreachable) no longer settles adds when every
    keeper must have them."""
    net = settled(reliable=reliable)
    core = net.sim.cores[SUB]
    key = net.subscribe(ALL)
    (seq,) = core.router.pending
    assert NEAR_KEEPER in core.router.pending[seq]
    net.sim.crash(NEAR_KEEPER, 20.0)  # before its ack can come
    net.run(2.0)
    if reliable:
        assert core.router.pending == {seq: {NEAR_KEEPER}}
        assert net.subacks == {}
        net.run(7.0)
        assert net.subacks[key] == [(pytest.approx(SETTLE + SUBACK_WAIT), False)]
        assert core.router.pending == {seq: {NEAR_KEEPER}}
    else:
        assert core.router.pending == {}
        assert net.subacks[key] == [(pytest.approx(SETTLE, abs=0.05), True)]


def test_a_dead_keeper_that_looks_reachable_is_waited_for_through_its_resends():
    """b20 sees b6's super-super-cluster as one node, so a dead b6 looks reachable: the add
    stays owed while b20 resends, nothing is delivered, and the subscription starts once b6 is
    back and has it."""
    net = settled()
    back = 60.0
    isolate(net, FAR_KEEPER, "crash", back - net.now)
    net.run(0.6)
    core = net.sim.cores[SUB]
    key = net.subscribe(ALL)
    (seq,) = core.router.pending
    net.stream(back - 10, back - 9)
    net.run(back - 5)
    assert core.router.counters["resyncs"] >= 5  # b6 was resent to, round after round
    assert core.router.pending == {seq: {FAR_KEEPER}}
    assert net.subacks[key] == [(pytest.approx(0.6 + SUBACK_WAIT), False)]
    assert key not in net.got  # not started
    net.run(back + 5)
    assert core.router.pending == {}
    net.stream(back + 5, back + 6)
    net.run(back + 7)
    assert net.ticks(key) == net.due(lambda n: True, back)
    net.finish()


def test_a_subscription_starts_even_when_a_keeper_is_gone_for_good():
    net = settled()
    isolate(net, FAR_KEEPER, "crash", 10_000.0)
    net.run(0.6)
    core = net.sim.cores[SUB]
    key = net.subscribe(ALL)
    net.run(170.0)
    assert core.router.counters["keepers_given_up"] == 1  # after MAX_RESENDS rounds
    net.stream(170.0, 171.0)
    net.run(172.0)
    want = net.due(lambda n: True, 169.0)
    assert len(want) == 1000
    assert net.ticks(key) == want
    # it started, but it never says it is complete: the keeper never acknowledged
    assert [complete for _, complete in net.subacks[key]] == [False]


def test_a_keeper_down_before_the_subscription_is_given_up_too():
    """A keeper already unreachable when the subscription is made counts its resend rounds
    from then (not from a connectivity change that may never come)."""
    net = settled()
    isolate(net, NEAR_KEEPER, "crash", 10_000.0)
    net.run(0.6)
    core = net.sim.cores[SUB]
    key = net.subscribe(ALL)
    net.run(170.0)
    assert core.router.counters["keepers_given_up"] == 1
    net.stream(170.0, 171.0)
    net.run(172.0)
    assert net.ticks(key) == net.due(lambda n: True, 169.0)
    assert [complete for _, complete in net.subacks[key]] == [False]


def test_a_keeper_given_up_that_comes_back_completes_the_subscription():
    """Given up after its resend rounds, the keeper is still sent the profile; once it is back
    and acknowledges, a second SubAck says the subscription is complete, and everything
    published after that arrives."""
    net = settled()
    isolate(net, FAR_KEEPER, "crash", 200.0)
    net.run(0.6)
    key = net.subscribe(ALL)
    net.run(170.0)
    assert net.sim.cores[SUB].router.counters["keepers_given_up"] == 1
    net.run(260.0)
    (first, incomplete), (done, complete) = net.subacks[key]
    assert (incomplete, complete) == (False, True)
    assert 200.0 < done < 260.0
    net.stream(260.0, 261.0)
    net.run(262.0)
    assert net.ticks(key, after=259.0) == net.due(lambda n: True, 259.0)


def cut_off_profiles(net: Net, keeper: str, until: float) -> None:
    """Until ``until``, ``keeper`` gets none of SUB's profile changes — while it stays up and
    routes events (seed 000 §3.1: a subscription that reaches one redundant gatekeeper and not
    the other)."""

    def blocked(src, dst, msg):
        return (
            dst == keeper
            and type(msg) is m.Profiles
            and net.now < until
            and any(c.origin == SUB for c in msg.changes)
        )

    net.sim.blocked = blocked


@pytest.mark.parametrize("sufficiency", [True, False])
def test_a_keeper_given_up_without_the_profile_floods_where_v_m_says_it_is_behind(sufficiency):
    """b6, the level-3 gatekeeper on b1's path to b20, never gets b20's new subscription and
    is given up. Its old profile of b20's cluster (LOW, n < 60) would let it claim the other
    ticks as silence. With VT vectors b20's clock reaches b1, b1's events carry it in their
    V_m, b6 fails the sufficiency test for b20's child and floods it, and the subscription
    starts at the first such event and misses nothing. Without the test it misses every
    event LOW does not match."""
    net = settled()
    for core in net.sim.cores.values():
        core.router.sufficiency = sufficiency
    net.subscribe(LOW, conn=1)
    net.run(0.6)
    cut_off_profiles(net, FAR_KEEPER, 200.0)
    key = net.subscribe(ALL, conn=2)
    net.run(170.0)
    core = net.sim.cores[SUB]
    assert core.router.counters["keepers_given_up"] == 1
    clock = core.router.clock()
    assert net.sim.cores[PUB].vt.table == {SUB: clock}  # b20's clock was flooded
    net.stream(170.0, 171.0)
    net.run(172.0)
    want = net.due(lambda n: True, 169.0)
    if sufficiency:
        assert net.ticks(key) == want
        assert net.sim.cores[FAR_KEEPER].router.counters["insufficient"] >= 1
    else:
        assert net.ticks(key) == net.due(lambda n: n < 60, 169.0)  # b6's old profile
    net.run(260.0)  # b6 gets the profile at last: the subscription is complete
    assert [complete for _, complete in net.subacks[key]] == [False, True]
    net.checker.finish(net.now)
    assert net.checker.ok is sufficiency
    if not sufficiency:
        assert all("gap" in str(v) for v in net.checker.violations)


def test_a_v_m_start_waits_for_the_first_frame_that_carries_the_clock():
    """Events published before b1 has heard b20's clock are not for the subscription on a
    level whose keeper was given up (b6 may have filtered them); from the first one stamped
    with the clock everything arrives. Where every keeper answers, no clock travels at all."""
    net = settled()
    net.subscribe(LOW, conn=1)
    net.run(0.6)
    net.stream(0.6, 1.0)
    net.run(1.5)
    assert not {"Clocks", "Vector"} & set(net.sim.frame_types)  # V_m stays empty
    assert all(not c.vt.table for c in net.sim.cores.values())
    # b1 hears the clock a while after b6 is given up, whatever is published meanwhile: a copy
    # that publishes nothing finds when, so that events go every 10 ms for 2 s either side of
    # that moment (and every 100 ms from 100 s until then)
    around = _when_b1_hears_the_clock(copy_of(net))
    cut_off_profiles(net, FAR_KEEPER, 10_000.0)
    key = net.subscribe(ALL, conn=2)
    heard = net.when(lambda: net.sim.cores[PUB].vt.table, around - 2.0, 200.0)
    net.stream(100.0, around - 2.0, every=0.1)
    net.stream(around - 2.0, around + 2.0, every=0.01)
    net.run(around + 3.0)
    assert heard, "b20's clock never reached b1"
    got = net.ticks(key)
    assert got and got == [t for t in net.due(lambda n: True, 0.0) if t >= got[0]]
    assert got[0] in net.due(lambda n: True, heard[0] - 0.01)[:3]  # right after b1 heard it
    assert net.sim.frame_types["Vector"] >= 1
    net.checker.finish(net.now, start_by=heard[0] + 0.1)
    assert [str(v) for v in net.checker.violations] == [
        f"t={net.now:.3f}s {SUB}/2/1 -: never completed: no complete SubAck by the end"
    ]


def _when_b1_hears_the_clock(net: Net) -> float:
    """When b1 first holds b20's clock once b6 is cut off and b20 subscribes to everything."""
    cut_off_profiles(net, FAR_KEEPER, 10_000.0)
    net.subscribe(ALL, conn=2)
    heard = net.when(lambda: net.sim.cores[PUB].vt.table, 100.0, 200.0)
    while not heard and net.now < 200.0:
        net.run(net.now + 1.0)
    assert heard, "b20's clock never reached b1"
    return heard[0]


def test_a_change_of_a_profile_started_by_v_m_keeps_what_both_profiles_match():
    """A subscription started on b1 by V_m (b6 given up) changes from n ≥ 70 to n ≥ 65: what
    both match goes on arriving across the change (a level waiting for V_m had counted as not
    started for the old profile, and those events were dropped until the new start)."""
    net = settled()
    net.subscribe(LOW, conn=1)
    net.run(0.6)
    cut_off_profiles(net, FAR_KEEPER, 10_000.0)
    key = net.subscribe(where("mid", ("n", "ge", 70)), conn=2)
    net.run(170.0)
    net.stream(170.0, 173.0)
    net.run(172.0)
    assert net.ticks(key)  # started by V_m
    net.subscribe(where("wider", ("n", "ge", 65)), conn=2)
    net.run(174.0)
    both = net.due(lambda n: n >= 70, 169.0)
    got = net.ticks(key)
    assert [t for t in both if t >= got[0]] == [t for t in got if t in both]
    net.checker.finish(net.now)
    assert all("never completed" in str(v) for v in net.checker.violations)


def test_a_subscription_waiting_on_a_given_up_keeper_is_not_completed_by_a_covering_one():
    """A second subscription whose add covers the first one's replaces that add upstream; the
    first one still waits for the given-up keeper (it is not told it is complete, nor started
    from acks that keeper never sent), even while b1 has not heard the clock."""
    net = settled()
    net.subscribe(LOW, conn=1)
    net.run(0.6)

    def blocked(src, dst, msg):
        if dst == FAR_KEEPER and type(msg) is m.Profiles:
            return any(c.origin == SUB for c in msg.changes)
        return dst == PUB and type(msg) is m.Clocks

    net.sim.blocked = blocked
    key = net.subscribe(where("mid", ("n", "ge", 70)), conn=2)
    net.run(170.0)
    wider = net.subscribe(where("wider", ("n", "ge", 65)), conn=3)
    net.stream(170.1, 171.0)
    net.run(172.0)
    assert [complete for _, complete in net.subacks[key]] == [False]
    assert wider not in net.subacks  # waiting for its keepers too (b6 was given up on)
    assert key[1:] in net.sim.cores[SUB].gates.vm_waiting
    assert net.ticks(key) == [] and net.ticks(wider) == []  # b1 never stamped the clock
    net.checker.finish(net.now)
    assert all("never completed" in str(v) for v in net.checker.violations)


@pytest.mark.parametrize("seed", range(1, 9))
def test_v_m_starts_hold_with_frames_lost_duplicated_and_reordered_and_the_pubend_crashing(seed):
    """The same keeper cut off, then 1,000 events from b1 while 5 % of data frames are lost and
    others are duplicated, delayed and reordered (a Vector can arrive after the frames it
    describes), and on even seeds b1 crashes mid-stream (its V_m must not shrink)."""
    net = settled()
    net.subscribe(LOW, conn=1)
    net.run(0.6)
    cut_off_profiles(net, FAR_KEEPER, 200.0)
    key = net.subscribe(ALL, conn=2)
    net.run(165.0)
    net.sim.rng = random.Random(seed)
    net.sim.faults = Faults(frozenset({"drop", "dup", "delay", "reorder"}), drop=0.05)
    if seed % 2 == 0:
        net.sim.at(170.5, net.sim.crash, PUB, 0.3)
    net.stream(170.0, 172.0, every=0.002)
    net.run(175.0)
    net.sim.faults = Faults(frozenset())
    net.run(260.0)
    assert len(net.ticks(key)) > 500
    assert [complete for _, complete in net.subacks[key]] == [False, True]
    net.finish()


# -- a second request for a subscription before the first is acknowledged ------------------


@pytest.mark.parametrize("gap", [0.0, 0.003])
def test_a_second_subscribe_answers_the_first_as_incomplete_and_starts_from_its_own_point(gap):
    """The first request gets an incomplete SubAck the moment the second arrives; only the
    second's starting point opens delivery, and everything its profile matches after its
    SubAck arrives (the two profiles are disjoint: starting on the first's acks would miss
    the second's events at the keepers that do not have it yet)."""
    first, second = where("first", ("n", "lt", 50)), where("second", ("n", "ge", 50))
    net = settled()
    core = net.sim.cores[SUB]
    net.stream(SETTLE, 1.0)
    net.run(0.6)
    key = net.subscribe(first)
    net.run(0.6 + gap)
    assert net.subacks == {}
    net.subscribe(second)
    assert net.subacks[key] == [(pytest.approx(0.6 + gap), False)]  # at once
    net.run(0.6 + SUBACK_WAIT + 1)  # the first's wait is over: no answer at its deadline
    (_, (acked, complete)) = net.subacks[key]
    assert complete is True and 0.6 + gap < acked < 0.7
    assert core.router.pending == {}
    got = net.got[key]
    assert got[0][0] >= acked  # nothing before its starting point
    assert all(a["n"] >= 50 for _, _, a in got)
    assert set(net.due(lambda n: n >= 50, acked)) <= {t for _, t, _ in got}
    net.finish()


@pytest.mark.parametrize("gap", [0.0, 0.003])
def test_an_unsubscribe_answers_a_subscribe_still_waiting_as_incomplete(gap):
    net = settled()
    core = net.sim.cores[SUB]
    net.stream(SETTLE, 0.7)
    key = net.subscribe(ALL)
    net.run(SETTLE + gap)
    net.unsubscribe(key)
    expect = [(pytest.approx(SETTLE + gap), False), (pytest.approx(SETTLE + gap), True)]
    assert net.subacks[key] == expect  # the subscribe's answer first, then the unsubscribe's
    net.run(SETTLE + SUBACK_WAIT + 1)
    assert net.subacks[key] == expect  # nothing more
    assert key not in net.got
    assert core.router.pending == {} and len(core.router.exporter) == 0


# -- a wait on an add that a covering add replaced ------------------------------------------


@pytest.mark.parametrize("gap", [0.0, 0.003])
def test_a_subscription_whose_add_was_replaced_by_a_covering_one_waits_for_that_one(gap):
    narrow, wide = where("narrow", ("n", "lt", 50)), where("wide", ("n", "lt", 80))
    net = settled()
    router = net.sim.cores[SUB].router
    seen = {}  # conn -> the adds still owed when its SubAck came

    def on_suback(b, conn, msg, now, inner=net.sim.on_suback):
        seen[conn] = {s: set(k) for s, k in router.pending.items()}
        inner(b, conn, msg, now)

    net.sim.on_suback = on_suback
    # a subscription already delivering some of what the others want: the new ones may be
    # sent events before their keepers have them, and must not start on those
    net.subscribe(where("other", ("n", "ge", 40)), conn=3)
    net.stream(SETTLE, 1.0)
    net.run(0.6)
    assert router.pending == {}
    a = net.subscribe(narrow, conn=1)
    (seq_a,) = router.pending
    net.run(0.6 + gap)
    assert router.pending[seq_a]  # still owed by some keeper
    b = net.subscribe(wide, conn=2)
    (seq_b,) = router.pending
    assert seq_b != seq_a
    exported = router.exporter.exported
    assert exported[wide.conjunctions[0]] == seq_b and narrow.conjunctions[0] not in exported
    assert router.waited({seq_a}) == {seq_a, seq_b}
    assert not router.acked({seq_a})
    covered = net.when(lambda: seq_b not in router.pending, net.now, 1.2)
    net.run(1.2)
    assert router.acked({seq_a})
    ((acked, complete),) = net.subacks[a]
    assert complete and seq_b not in seen[1]  # not before every keeper had the covering add
    assert covered == [pytest.approx(acked, abs=0.0015)]
    assert net.got[a][0][0] >= acked
    assert set(net.due(lambda n: n < 50, acked)) <= set(net.ticks(a))
    assert net.subacks[b][0][1] is True
    net.finish()


# -- changing a started subscription's profile ----------------------------------------------


def test_a_changed_profile_keeps_delivering_what_both_match_and_starts_the_new_one():
    old, new = LOW, HIGH
    net = settled()
    net.stream(SETTLE, 1.0)
    key = net.subscribe(old)
    net.run(CHANGE)
    (first_ack, complete) = net.subacks[key][0]
    assert complete
    net.subscribe(new)  # the change
    net.run(1.1)
    assert len(net.subacks[key]) == 2
    acked, complete = net.subacks[key][1]
    assert complete and CHANGE < acked < CHANGE + 0.1
    got = net.ticks(key)
    # what both match: every one after the subscription's first SubAck, across the change
    both = net.due(lambda n: 40 <= n < 60, first_ack)
    assert set(both) <= set(got)
    assert net.due(lambda n: 40 <= n < 60, CHANGE, acked)  # some were published during it
    # only the old: none after the change; only the new: none before it, every one
    # published after its SubAck
    assert all(a["n"] >= 40 for at, _, a in net.got[key] if at > CHANGE)
    assert all(a["n"] < 60 for at, _, a in net.got[key] if at < CHANGE)
    assert set(net.due(lambda n: n >= 60, acked)) <= set(got)
    assert set(net.due(lambda n: n >= 40, acked)) <= set(got)
    net.finish()


def test_a_change_before_the_stream_passed_the_old_starting_point_keeps_what_both_match():
    """The old profile had its starting point but no event past it yet when it changed: what
    both match after that point is delivered while the change spreads (the events in flight
    then were routed with the old profile)."""
    old, new = LOW, HIGH
    net = settled()
    net.stream(SETTLE, 0.6)  # PUB's keepers route some of its ticks before the subscription
    net.run(0.7)
    point = net.published[-1][1]  # so its starting point is here
    key = net.subscribe(old)
    net.stream(CHANGE - 0.005, 1.0)  # the first of these reach b20 after the change
    net.run(CHANGE)
    (first_ack, complete) = net.subacks[key][0]
    assert complete and key not in net.got  # started, but nothing past its starting point
    net.subscribe(new)
    net.run(1.1)
    acked, complete = net.subacks[key][1]
    assert complete
    both = net.due(lambda n: 40 <= n < 60, first_ack)
    during = net.ticks(key, before=acked)
    assert during and set(during) <= set(both)  # what both match, while the change spread
    assert set(both) <= set(net.ticks(key))
    assert min(net.ticks(key)) > point
    assert set(net.due(lambda n: n >= 40, acked)) <= set(net.ticks(key))
    net.finish()


def test_a_change_delivers_nothing_from_before_the_old_starting_point():
    """A tick both profiles match but older than the old profile's starting point, recovered
    (nacked) after the change, goes to the subscription that wanted it, not to the changed
    one: the next tick both match was never routed here, so delivering the first would leave
    a gap."""
    net = settled()
    other = net.subscribe(where("other", ("n", "ge", 40), ("n", "lt", 50)), conn=3)
    net.run(0.6)
    net.sim.faults = Faults(kinds=frozenset({"drop"}), drop=1.0)
    net.publish({"n": 45})  # tick 1, for every profile; every copy lost on the first hop
    net.sim.faults = Faults(kinds=frozenset())
    net.publish({"n": 55})  # tick 2, for LOW and HIGH only: routed nowhere (no one has them)
    net.sim.at(0.601, net.publish, {"n": 46})  # tick 3, for every profile: tick 1 is nacked
    key = net.subscribe(LOW)  # after ticks 1 and 2: its starting point is past them
    net.run(0.62)
    assert net.subacks[key] == [(pytest.approx(0.61, abs=0.01), True)]
    net.subscribe(HIGH)
    net.stream(0.8, 1.0)
    net.run(1.1)
    (at, tick, _) = net.got[other][0]
    assert tick == 1 and at > 0.62  # recovered after the change
    assert not {1, 2} & set(net.ticks(key))
    assert set(net.due(lambda n: n >= 40, 0.8)) <= set(net.ticks(key))
    net.finish()


def test_a_change_during_a_change_delivers_what_every_profile_matches_meanwhile():
    p1 = LOW  # 0..59
    p2 = where("p2", ("n", "ge", 20))  # 20..99
    p3 = where("p3", ("n", "ge", 30), ("n", "lt", 80))  # 30..79; all three: 30..59
    net = settled()
    net.stream(SETTLE, 1.0)
    key = net.subscribe(p1)
    net.run(CHANGE)
    first_ack = net.subacks[key][0][0]
    net.subscribe(p2)
    net.run(CHANGE + 0.003)
    assert len(net.subacks[key]) == 1  # the first change is still spreading
    net.subscribe(p3)
    assert net.subacks[key][1] == (pytest.approx(CHANGE + 0.003), False)  # the first's answer
    net.run(1.1)
    assert len(net.subacks[key]) == 3
    acked, complete = net.subacks[key][2]
    assert complete and acked > CHANGE + 0.003
    early = [a["n"] for at, _, a in net.got[key] if CHANGE < at < CHANGE + 0.003]
    assert all(20 <= n < 60 for n in early)  # p1 and p2
    late = [a["n"] for at, _, a in net.got[key] if CHANGE + 0.003 < at < acked]
    assert late, "nothing delivered while the second change spread"
    assert all(30 <= n < 60 for n in late)  # p1, p2 and p3
    got = set(net.ticks(key))
    assert set(net.due(lambda n: 30 <= n < 60, first_ack)) <= got  # no gap in what all match
    assert set(net.due(lambda n: 30 <= n < 80, acked)) <= got
    net.finish()


@pytest.mark.parametrize("keeper", ["reachable", "cut-off"])
def test_a_subscription_changed_before_it_started_starts_cleanly(keeper):
    """Nothing of the first profile, nothing before the change's starting point (not even
    what both match), then every event the new profile matches. With its cluster's keeper cut
    off for a while, the first profile is routed to the subscriber's broker long before the
    change starts."""
    net = settled()
    back = 1.5 if keeper == "cut-off" else 0.0
    if back:
        isolate(net, NEAR_KEEPER, "cut", back - net.now)
    net.stream(SETTLE, max(back, 0.6) + 0.4, every=0.002)
    net.run(0.6)
    key = net.subscribe(LOW)
    net.run(1.0 if back else 0.601)
    assert net.subacks == {} and net.got == {}  # not started
    net.subscribe(HIGH)
    assert net.subacks[key] == [(pytest.approx(net.now), False)]
    net.run(max(back, 0.6) + 0.5)
    assert len(net.subacks[key]) == 2
    acked, complete = net.subacks[key][-1]
    assert complete and acked > back
    got = net.got[key]
    assert got[0][0] >= acked
    assert all(a["n"] >= 40 for _, _, a in got)
    assert set(net.due(lambda n: n >= 40, acked)) <= {t for _, t, _ in got}
    net.finish()


@pytest.mark.parametrize("change", [False, True], ids=["started", "changing"])
def test_an_event_lost_on_the_way_to_a_subscription_is_recovered_even_while_it_changes(change):
    """The first event of a pubend to reach the subscriber's broker is lost on the way: the
    subend made for the next one starts at 0 for a started subscription, nacks the lost tick
    and delivers it. While the subscription changes (``changing``), the subend starts at the
    next one's ``prev`` unless it is floored for the change too — tick 1, published after the
    change and matched by both profiles, must be delivered."""
    net = settled()
    key = net.subscribe(LOW)
    net.run(1.0)
    assert net.subacks[key] == [(pytest.approx(SETTLE, abs=0.05), True)]
    if change:
        net.subscribe(HIGH)
    net.sim.faults = Faults(kinds=frozenset({"drop"}), drop=1.0)
    net.publish({"n": 45})  # both match; every copy is lost on the first hop
    net.sim.faults = Faults(kinds=frozenset())
    net.sim.at(1.001, net.publish, {"n": 46})
    net.sim.at(1.002, net.publish, {"n": 47})
    net.run(3.0)
    assert [t for _, t, _ in net.published] == [1, 2, 3]
    assert net.ticks(key) == [1, 2, 3]


# -- the checker across a change --------------------------------------------------------------

#: tick -> (n, published at); LOW (< 60) is changed to HIGH (>= 40) at 1.0, complete at 2.0
_TICKS = {
    1: (10, 0.5),  # old only
    2: (50, 0.5),  # both
    3: (70, 0.5),  # new only
    4: (45, 0.5),  # both
    5: (20, 1.5),  # old only, after the change
    6: (55, 1.5),  # both, during the change: due
    7: (80, 1.5),  # new only, before the change's SubAck: not due
    8: (90, 2.5),  # new only, after it: due
    9: (42, 2.5),  # both, after it: due
}


def _checker_across_a_change(after: list[int]) -> Checker:
    """LOW got 1, 2, 4; then it changes to HIGH, which gets ``after`` at 3.0."""
    checker = Checker()
    for tick, (n, at) in _TICKS.items():
        checker.publish("p~1", tick, [{"n": n}], at)
    key = ("b", 1, 1)
    checker.subscribe(key, LOW)
    checker.subscribed(key, 0.1)
    checker.deliver(key, "p~1", [(t, {"n": _TICKS[t][0]}) for t in (1, 2, 4)], 0.6)
    checker.subscribe(key, HIGH)
    checker.subscribed(key, 2.0)
    checker.deliver(key, "p~1", [(t, {"n": _TICKS[t][0]}) for t in after], 3.0)
    checker.finish(4.0)
    return checker


@pytest.mark.parametrize("after", [[6, 7, 8, 9], [6, 8, 9]])
def test_the_checker_passes_a_change_that_lost_nothing_due(after):
    checker = _checker_across_a_change(after)
    assert checker.ok, [str(v) for v in checker.violations]
    assert checker.delivered == 3 + len(after)


@pytest.mark.parametrize(
    ("after", "what"),
    [
        ([8, 9], "gap: 6 skipped before 8"),  # both match it: must arrive across the change
        ([6, 9], "gap: 8 skipped before 9"),  # the new one's, after its SubAck
        ([5, 6, 8, 9], "tick 5 delivered but does not match"),  # the old one's, after the change
        ([6, 8], "never delivered: 9"),
    ],
    ids=["both-skipped", "new-skipped-after-suback", "old-only-after-change", "both-never"],
)
def test_the_checker_flags_what_a_change_must_not_lose_or_add(after, what):
    checker = _checker_across_a_change(after)
    assert not checker.ok
    assert what in [v.what for v in checker.violations], checker.violations
    assert {v.sub for v in checker.violations} == {"b/1/1'"}


def test_every_suback_names_the_request_it_answers():
    """A SubAck echoes its request's ``req``: the incomplete answer to a superseded request,
    the answer to the newer one and a later complete one can be told apart by the client."""
    net = settled()
    core = net.sim.cores[SUB]
    core.client_open(7, "client-7")
    first = core.client_message(7, m.Subscribe(1, profile_to_wire(ALL), "all", req=11), 0.6)
    assert [o.msg for o in first if type(o) is ToClient] == []  # waiting for the keepers
    second = core.client_message(7, m.Subscribe(1, profile_to_wire(LOW), "low", req=12), 0.6)
    answers = [o.msg for o in second if type(o) is ToClient]
    assert answers == [m.SubAck(1, complete=False, req=11)]
    out = core.client_message(7, m.Unsubscribe(1, req=13), 0.6)
    answers = [o.msg for o in out if type(o) is ToClient]
    assert answers == [m.SubAck(1, complete=False, req=12), m.SubAck(1, req=13)]
