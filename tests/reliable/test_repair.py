"""Nack repair near the loss (:mod:`ges.reliable.repair`): a keeper's cache of recent events,
the board of nacks a relay holds back, the claims that say when a keeper may answer from its
cache (``Known.covers``, ``Claims.knows``) — against naive models — and both in the broker core:
driven directly, and on the simulator with frame faults under the checker."""

from __future__ import annotations

import copy
import functools
from collections import namedtuple
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ges.sim.scenario as scenario
from ges.core import BrokerCore, ToPeer
from ges.matching.model import Conjunction, Constraint, Profile, profile_to_wire
from ges.reliable import claims as claims_mod
from ges.reliable.claims import Claims, Known
from ges.reliable.repair import HOLD, MAX_HELD, MAX_WAITERS, EventCache, NackBoard
from ges.sim import Checker, Faults, Sim
from ges.topology import Topology
from ges.wire import messages as m

ROOT = Path(__file__).resolve().parents[2]

#: An item as the cache sees one: a tick, and a tag telling copies of one tick apart.
It = namedtuple("It", "tick tag")


def its(*ticks: int, tag: str = "") -> list[It]:
    return [It(t, tag) for t in ticks]


# -- EventCache -----------------------------------------------------------------------------------


class NaiveCache:
    """One pubend's cache the slow way: the items kept in the order they were taken, and the
    floor — just below the first batch's lowest tick, then the highest tick ever dropped (a
    tick at or below it is not taken)."""

    def __init__(self, max_events: int):
        self.max_events = max_events
        self.kept: list[It] = []
        self.dropped: int | None = None
        self.floor_at_start = 0

    def add(self, items) -> None:
        if self.dropped is None:
            if not items:
                return
            self.dropped = self.floor_at_start = min(it.tick for it in items) - 1
        for it in items:
            if it.tick <= self.dropped or any(k.tick == it.tick for k in self.kept):
                continue
            self.kept.append(it)
        while len(self.kept) > self.max_events:
            self.dropped = max(self.dropped, self.kept.pop(0).tick)


batch_st = st.lists(st.integers(1, 30), max_size=8)  # out of order, with duplicates
cache_op_st = st.one_of(
    st.tuples(st.just("add"), batch_st),
    st.tuples(st.just("read"), st.tuples(st.integers(1, 32), st.integers(0, 33))),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(cache_op_st, max_size=40), st.integers(1, 12))
def test_the_cache_reads_every_item_of_a_range_in_tick_order_or_none(ops, max_events):
    """A read is every item ever added in the range (the first copy of each tick), in tick
    order — or None, and then only because a tick at or above the range's low end was dropped
    (never a partial list). While nothing was dropped every read is answered."""
    cache = EventCache(max_events=max_events)
    naive = NaiveCache(max_events)
    first: dict[int, It] = {}  # every tick ever added -> its first copy
    routed = False
    n = 0
    for op, arg in ops:
        if op == "add":
            routed = routed or bool(arg)
            batch = [It(t, f"#{n + i}") for i, t in enumerate(arg)]
            n += len(batch)
            cache.add("p~1", batch)
            naive.add(batch)
            for it in batch:
                if routed and it.tick > naive.floor_at_start:
                    first.setdefault(it.tick, it)
            continue
        lo, hi = arg
        got = cache.read("p~1", lo, hi)
        if not routed:
            assert got is None  # never routed here
            continue
        whole = [first[t] for t in sorted(first) if lo <= t <= hi]
        assert got is None or got == whole, (lo, hi, got, whole)
        if got is None:
            assert naive.dropped >= lo, (lo, hi, naive.dropped)
        if len(first) <= max_events and lo > naive.floor_at_start:
            assert got == whole


def test_a_read_is_none_once_a_tick_at_or_above_its_low_end_was_dropped():
    cache = EventCache(max_events=4)
    cache.add("p~1", its(1, 2, 3, 4, 5, 6))  # 1 and 2 dropped
    assert [it.tick for it in cache.read("p~1", 3, 6)] == [3, 4, 5, 6]
    assert [it.tick for it in cache.read("p~1", 3, 100)] == [3, 4, 5, 6]
    assert cache.read("p~1", 7, 9) == []
    assert cache.read("p~1", 2, 6) is None
    assert cache.read("p~1", 1, 1) is None
    # a dropped tick that comes again is not taken back: its range stays unanswered
    cache.add("p~1", its(2))
    assert cache.read("p~1", 2, 6) is None


def test_out_of_order_adds_drop_the_oldest_added_not_the_lowest_tick():
    cache = EventCache(max_events=3)
    cache.add("p~1", its(12, 10, 11))
    cache.add("p~1", its(5, 11, tag="late"))  # 5 is below where it started, 11 already there
    assert cache.read("p~1", 10, 12) == its(10, 11, 12)
    assert cache.read("p~1", 5, 12) is None  # it never had 5..9
    cache.add("p~1", its(13))  # drops 12, the oldest added (not 10, the lowest)
    assert cache.read("p~1", 10, 13) is None
    assert cache.read("p~1", 13, 13) == its(13)


def test_the_pubend_bound_drops_the_least_recently_routed_pubend():
    cache = EventCache(max_pubends=2)
    cache.add("a~1", its(1))
    cache.add("b~1", its(1))
    cache.add("a~1", its(2))  # a routed again: b is now the least recent
    assert cache.read("b~1", 1, 1) == its(1)  # a read is not routing: b stays the least recent
    cache.add("c~1", its(1))
    assert cache.read("b~1", 1, 1) is None
    assert cache.read("a~1", 1, 2) == its(1, 2)
    assert cache.read("c~1", 1, 1) == its(1)
    cache.add("d~1", its(7))  # now a goes
    assert cache.read("a~1", 1, 2) is None
    assert cache.read("c~1", 1, 1) == its(1)


def test_an_unknown_pubend_reads_none():
    cache = EventCache()
    assert cache.read("p~1", 1, 5) is None
    cache.add("p~1", its(1, 2))
    assert cache.read("q~1", 1, 5) is None
    assert cache.read("p~2", 1, 5) is None  # another epoch is another pubend


def test_a_pubend_dropped_by_the_bound_never_reads_a_partial_list_when_it_comes_back():
    cache = EventCache(max_pubends=1)
    cache.add("a~1", its(1, 2, 3))
    cache.add("b~1", its(1))  # a is dropped
    cache.add("a~1", its(4))  # and comes back
    got = cache.read("a~1", 1, 4)
    assert got is None or [it.tick for it in got] == [1, 2, 3, 4], got


# -- NackBoard ------------------------------------------------------------------------------------

P = "p~1"


def everyone(origin: str) -> bool:
    return True


def test_a_covered_nack_from_another_origin_is_held():
    board = NackBoard()
    assert board.ask(P, "x", [(1, 10)], 0.0) == [(1, 10)]
    assert board.ask(P, "y", [(3, 5)], 0.1) == []
    assert board.ask(P, "z", [(1, 10)], 0.1) == []
    # only the covered ranges wait; one reaching past the held nack goes on whole
    assert board.ask(P, "w", [(2, 4), (8, 12), (20, 30)], 0.1) == [(8, 12), (20, 30)]
    # another pubend is another stream
    assert board.ask("q~1", "y", [(3, 5)], 0.1) == [(3, 5)]
    assert board.ask("p~2", "y", [(3, 5)], 0.1) == [(3, 5)]


def test_the_same_origin_asking_again_is_sent_on():
    board = NackBoard()
    assert board.ask(P, "x", [(1, 10)], 0.0) == [(1, 10)]
    assert board.ask(P, "y", [(1, 10)], 0.0) == []
    assert board.ask(P, "x", [(1, 10)], 0.125) == [(1, 10)]
    assert board.ask(P, "x", [(2, 3)], 0.125) == [(2, 3)]
    assert board.ask(P, "y", [(4, 5)], 0.125) == [(4, 5)]  # y waits already: it asks again


def test_a_covered_nack_is_sent_on_again_after_the_hold():
    assert NackBoard().hold == HOLD
    board = NackBoard(hold=0.25)
    assert board.ask(P, "x", [(1, 10)], 0.0) == [(1, 10)]
    assert board.ask(P, "y", [(1, 10)], 0.125) == []
    assert board.ask(P, "z", [(1, 10)], 0.25) == [(1, 10)]  # the hold has lapsed
    # that one is held in turn, from when it was sent on
    assert board.ask(P, "w", [(1, 10)], 0.375) == []
    assert board.ask(P, "v", [(1, 10)], 0.5) == [(1, 10)]


def test_an_answer_releases_each_waiting_origin_once_with_the_part_it_has():
    board = NackBoard()
    assert board.ask(P, "x", [(1, 100)], 0.0) == [(1, 100)]
    for origin, rng in (("y", (10, 20)), ("z", (50, 60)), ("w", (90, 100)), ("out", (15, 18))):
        assert board.ask(P, origin, [rng], 0.1) == []
    # an answer to x for 1..55, whole for everyone but "out"
    got = board.answered(P, 1, 55, "x", lambda o: o != "out")
    assert sorted(got) == [("y", 10, 20), ("z", 50, 55)]  # z gets its part, asks for the rest
    # out (outside the answer's unit) and w (not in the answer's range) wait on
    assert board.answered("q~1", 1, 100, "x", everyone) == []  # another pubend's answer
    assert board.answered(P, 101, 200, "x", everyone) == []  # past the held nack
    got = board.answered(P, 1, 100, "x", everyone)
    assert sorted(got) == [("out", 15, 18), ("w", 90, 100)]
    assert len(board) == 0  # nobody waits: the held nack is gone
    assert board.ask(P, "v", [(1, 10)], 0.2) == [(1, 10)]  # so nothing holds this one


def test_an_answer_skips_its_own_destination_even_outside_its_unit():
    board = NackBoard()
    board.ask(P, "x", [(1, 10)], 0.0)
    board.ask(P, "y", [(1, 10)], 0.0)
    assert board.answered(P, 1, 10, "y", lambda o: o == "x") == [("x", 1, 10)]
    assert len(board) == 0


def test_a_held_nack_nobody_waits_on_is_dropped():
    board = NackBoard()
    board.ask(P, "x", [(1, 10)], 0.0)
    board.ask(P, "x", [(20, 30)], 0.0)
    assert len(board) == 2
    assert board.answered(P, 1, 10, "x", everyone) == []
    assert len(board) == 1
    assert board.ask(P, "y", [(1, 10)], 0.1) == [(1, 10)]  # no longer held back
    assert board.ask(P, "y", [(22, 25)], 0.1) == []  # the other one still is


def test_an_answer_keeps_origins_outside_its_unit_waiting_for_a_whole_one():
    board = NackBoard()
    board.ask(P, "x", [(1, 10)], 0.0)
    board.ask(P, "in", [(1, 10)], 0.0)
    board.ask(P, "out", [(1, 10)], 0.0)
    assert board.answered(P, 1, 10, "x", lambda o: o == "in") == [("in", 1, 10)]
    assert len(board) == 1
    assert board.ask(P, "other", [(1, 10)], 0.1) == []  # still held: out waits on it
    assert sorted(board.answered(P, 1, 10, "nobody", everyone)) == [
        ("other", 1, 10),
        ("out", 1, 10),
    ]
    assert len(board) == 0


def test_a_held_nack_takes_at_most_max_waiters_and_the_rest_go_on():
    board = NackBoard()
    assert board.ask(P, "o0", [(1, 10)], 0.0) == [(1, 10)]
    n = MAX_WAITERS + 20
    sent = [i for i in range(1, n) if board.ask(P, f"o{i}", [(2, 9)], 0.1)]
    # the first nack's origin is one of its waiters
    assert sent == list(range(MAX_WAITERS, n))
    got = board.answered(P, 1, 10, "o0", everyone)
    names = [o for o, _, _ in got]
    assert len(names) == len(set(names))  # each once
    assert set(names) == {f"o{i}" for i in range(1, n)}
    assert all((lo, hi) == (2, 9) for _, lo, hi in got)
    assert len(board) == 0


def test_held_nacks_are_bounded_per_pubend_and_in_pubends():
    board = NackBoard()
    n = MAX_HELD + 30
    for i in range(n):
        assert board.ask(P, "x", [(10 * i, 10 * i + 5)], 0.0) == [(10 * i, 10 * i + 5)]
    assert len(board) == MAX_HELD
    assert board.ask(P, "y", [(1, 3)], 0.1) == []  # the first ones are held
    last = 10 * (n - 1)
    assert board.ask(P, "y", [(last, last + 1)], 0.1) == [(last, last + 1)]  # past the bound

    board = NackBoard()
    for i in range(n):
        assert board.ask(f"p{i}~1", "x", [(1, 5)], 0.0) == [(1, 5)]
    assert len(board) <= MAX_HELD
    assert board.ask("p0~1", "y", [(1, 5)], 0.1) == []
    assert board.ask(f"p{n - 1}~1", "y", [(1, 5)], 0.1) == [(1, 5)]  # not held: sent on


def test_lapsed_holds_do_not_count_against_the_bound():
    board = NackBoard(hold=0.25)
    for i in range(MAX_HELD):
        board.ask(f"p{i}~1", "x", [(1, 5)], 0.0)  # their answers take another way back
    assert board.ask("q~1", "x", [(1, 5)], 100.0) == [(1, 5)]
    assert board.ask("q~1", "y", [(1, 5)], 100.0) == []


def test_an_origin_that_asked_twice_gets_one_copy_of_an_answer():
    board = NackBoard()
    board.ask(P, "x", [(1, 10)], 0.0)
    board.ask(P, "y", [(1, 10)], 0.0)  # held
    board.ask(P, "y", [(1, 10)], 0.125)  # asks again: sent on, and held in turn
    assert board.answered(P, 1, 10, "x", everyone) == [("y", 1, 10)]


# -- Known.covers and Claims.knows ----------------------------------------------------------------

TOP = 40
span_st = st.tuples(st.integers(0, TOP), st.integers(-2, 8)).map(lambda p: (p[0], p[0] + p[1]))
known_op_st = st.tuples(st.sampled_from(("add", "ask")), span_st)


@settings(max_examples=400, deadline=None)
@given(st.lists(known_op_st, max_size=50))
def test_known_covers_exactly_the_ranges_of_ticks_added(ops):
    k = Known()
    ticks: set[int] = set()
    for op, (lo, hi) in ops:
        if op == "add":
            k.add(lo, hi)
            ticks.update(range(lo, hi + 1))
        else:
            assert k.covers(lo, hi) == ticks.issuperset(range(lo, hi + 1)), (lo, hi)
    for lo in range(TOP + 10):
        for hi in range(lo, TOP + 10):
            assert k.covers(lo, hi) == ticks.issuperset(range(lo, hi + 1)), (lo, hi)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(span_st, max_size=30), st.integers(1, 4))
def test_known_at_its_bound_covers_nothing_it_was_not_told(adds, bound):
    with mock.patch.object(claims_mod, "MAX_KNOWN_RANGES", bound):
        k = Known()
        ticks: set[int] = set()
        for lo, hi in adds:
            k.add(lo, hi)
            ticks.update(range(lo, hi + 1))
        for lo in range(TOP + 10):
            for hi in range(lo, TOP + 10):
                if k.covers(lo, hi):
                    assert ticks.issuperset(range(lo, hi + 1)), (lo, hi)


PUBENDS = ("p~1", "q~1")
UNITS = ((), ("A",), ("A", "c1"))
learn_st = st.tuples(
    st.just("learn"),
    st.sampled_from(PUBENDS),
    st.sampled_from(UNITS),
    st.integers(0, TOP),
    st.integers(0, TOP),
)
knows_st = st.tuples(st.just("knows"), st.sampled_from(PUBENDS), st.sampled_from(UNITS), span_st)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(learn_st, knows_st), max_size=60))
def test_claims_know_a_range_for_a_unit_exactly_when_told_every_tick_of_it(ops):
    """``learn(prev, tick)`` tells ``prev + 1..tick``; each (pubend, unit) on its own."""
    claims = Claims()
    told: dict[tuple, set[int]] = {}
    for op in ops:
        if op[0] == "learn":
            _, pubend, unit, prev, tick = op
            claims.learn(pubend, unit, prev, tick)
            told.setdefault((pubend, unit), set()).update(range(prev + 1, tick + 1))
        else:
            _, pubend, unit, (lo, hi) = op
            if lo > hi:
                continue  # the core never asks for an empty range
            want = told.get((pubend, unit), set()).issuperset(range(lo, hi + 1))
            assert claims.knows(pubend, unit, lo, hi) == want, op


def test_claims_bounded_in_states_forget_the_least_recent_and_know_nothing_of_it():
    claims = Claims(max_states=2)
    claims.learn("p~1", ("A",), 0, 10)
    claims.learn("p~1", ("B",), 0, 10)
    claims.learn("p~1", ("A",), 10, 12)  # A used again: B is the least recent
    claims.learn("q~1", ("A",), 0, 10)
    assert not claims.knows("p~1", ("B",), 1, 10)
    assert claims.knows("p~1", ("A",), 1, 12)
    assert claims.knows("q~1", ("A",), 1, 10)
    assert not claims.knows("q~1", ("A",), 1, 11)
    assert not claims.knows("r~1", ("A",), 1, 1)


# -- in the broker core ---------------------------------------------------------------------------

PUB, SUB = "b1", "b20"
#: The demo topology around SUB: c8 = {b19, b20} and c7 = {b17, b18} make up SC-4.
C8 = ("SSC-B", "SC-4", "c8")
SC4 = ("SSC-B", "SC-4")
#: SUB's keeper of c8 and SC-4 (the one that routes PUB's events to SUB), and a relay next to it
#: that keeps only c7.
KEEPER, RELAY = "b19", "b18"
LOW = Profile("low", (Conjunction((Constraint("n", "lt", 10),)),))


@functools.cache
def topology(name: str) -> Topology:
    return Topology.from_yaml(ROOT / f"topologies/{name}.yaml")


def quiet_world() -> tuple[Sim, Checker]:
    """The demo topology without faults: SUB subscribes to ``n < 10``; PUB publishes ``n`` =
    0..19 (ticks 1..20, so 1..10 match) and the network is left until silence has told every
    keeper on the way all of 1..20."""
    checker = Checker()
    pending: dict = {}

    def on_puback(b, conn, msg, now):
        checker.publish(msg.pubend, msg.first_tick, pending.pop(msg.seq), now)

    def on_deliver(b, conn, msg, now):
        ticks = [(it.tick, dict(it.event.attributes)) for it in msg.items]
        checker.deliver((b, conn, msg.sub_id), msg.pubend, ticks, now)

    def on_suback(b, conn, msg, now):
        checker.subscribed((b, conn, msg.sub_id), now, complete=msg.complete)

    sim = Sim(
        topology("demo"),
        seed=1,
        on_deliver=on_deliver,
        on_puback=on_puback,
        on_suback=on_suback,
    )
    sim.run_until(0.5)
    checker.subscribe((SUB, 1, 1), LOW)
    sim.client(SUB, 1, m.Subscribe(1, profile_to_wire(LOW), LOW.id))
    sim.run_until(0.6)
    for i in range(20):
        pending[i + 1] = [{"n": i}]
        sim.at(0.6 + i * 0.01, sim.client, PUB, 900, m.Publish(i + 1, [m.Event({"n": i})]))
    sim.run_until(2.5)
    checker.finish(sim.now)
    assert checker.ok, checker.violations
    return sim, checker


@functools.cache
def _quiet() -> tuple[Sim, Checker]:
    return quiet_world()


def quiet() -> tuple[Sim, str]:
    """A copy of the quiet world (each test feeds its cores as it likes), and PUB's pubend."""
    sim, _ = copy.deepcopy(_quiet())
    return sim, sim.cores[PUB].pubend


def logged(sim: Sim, lo: int, hi: int) -> dict[int, dict]:
    return {t: dict(ev.attributes) for t, ev in sim.logs[PUB].read(lo, hi, 10_000)}


def sent(out: list, kind: type) -> list[tuple[str, object]]:
    return [(o.peer, o.msg) for o in out if type(o) is ToPeer and type(o.msg) is kind]


def towards(core: BrokerCore, broker: str) -> str:
    return core.router.relay_step(broker, [], 0)[0]


def test_a_keeper_answers_from_its_cache_for_an_origin_inside_a_unit_whose_range_it_knows():
    sim, pe = quiet()
    core = sim.cores[KEEPER]
    assert core.claims.knows(pe, C8, 1, 20) and core.claims.knows(pe, SC4, 1, 20)
    log = logged(sim, 1, 20)
    for origin, (lo, hi) in ((SUB, (1, 20)), ("b17", (5, 15)), ("b18", (12, 20))):
        keeper = copy.deepcopy(core)
        out = keeper.peer_message(SUB, m.Nack(pe, origin, [(lo, hi)]), 3.0)
        assert sent(out, m.Nack) == []  # nothing asked of the pubend's broker
        ((hop, a),) = sent(out, m.Recovered)
        assert hop == towards(keeper, origin)
        assert (a.pubend, a.to, a.lo, a.hi, a.lost) == (pe, origin, lo, hi, False)
        # the widest unit it keeps around the origin and knows 1..20 for
        assert a.unit == SC4
        # every event in the range that anything in SC-4 could want: those SUB's n < 10 match
        assert [it.tick for it in a.items] == [t for t in range(lo, hi + 1) if log[t]["n"] < 10]
        assert all(dict(it.event.attributes) == log[it.tick] for it in a.items)
        assert keeper.counters["nacks_answered_from_cache"] == 1


def test_a_keeper_relays_a_nack_for_an_origin_outside_the_units_it_knows_or_ticks_it_does_not():
    sim, pe = quiet()
    core = sim.cores[KEEPER]
    assert not any(core.router.h.contains(u, "b12") for u in core.router.kept)
    cases = (
        ("b12", [(1, 20)], [], [(1, 20)]),  # outside every unit it keeps
        ("b16", [(3, 4)], [], [(3, 4)]),
        (SUB, [(1, 25)], [], [(1, 25)]),  # 21..25: not known
        (SUB, [(2, 6), (18, 30), (40, 41)], [(2, 6)], [(18, 30), (40, 41)]),
    )
    for origin, ranges, answered, relayed in cases:
        keeper = copy.deepcopy(core)
        out = keeper.peer_message(SUB, m.Nack(pe, origin, ranges), 3.0)
        answers = sent(out, m.Recovered)
        assert [(a.to, a.lo, a.hi) for _, a in answers] == [(origin, lo, hi) for lo, hi in answered]
        ((hop, nack),) = sent(out, m.Nack)
        assert hop == towards(keeper, PUB)
        assert (nack.pubend, nack.origin, nack.ranges) == (pe, origin, relayed)
        assert keeper.counters["nacks_answered_from_cache"] == len(answered)


def test_a_relay_shares_an_answer_only_with_waiting_origins_inside_its_unit():
    sim, pe = quiet()
    relay = sim.cores[RELAY]
    assert not any(relay.claims.knows(pe, u, 1, 1) for u in relay.router.kept)
    out = relay.peer_message(SUB, m.Nack(pe, SUB, [(1, 20)]), 3.0)
    assert [(n.origin, n.ranges) for _, n in sent(out, m.Nack)] == [(SUB, [(1, 20)])]
    # covered by the nack just sent on: held back, whoever asks
    for origin, rng in (("b19", (5, 8)), ("b17", (6, 7)), ("b16", (5, 8))):
        assert relay.peer_message(SUB, m.Nack(pe, origin, [rng]), 3.05) == []
    log = sim.logs[PUB].read(1, 20, 10_000)
    items = [m.EventItem(t, 0, 0, ev) for t, ev in log]

    # an answer whole for c8 only: b19 gets its part; b17 (c7) and b16 (SC-3) wait on
    # made by a keeper of c8 (provenance: hops counted from it, at least its distance)
    keeper = next(k for k in relay.router.h.keepers[C8] if k not in (RELAY, "b17"))
    far = relay.provenance.distance(keeper, "b17") + 1
    answer = m.Recovered(pe, SUB, 1, 20, items, far, [], False, C8, by=keeper)
    out = relay.peer_message("b17", answer, 3.1)
    recovered = {a.to: (hop, a) for hop, a in sent(out, m.Recovered)}
    assert set(recovered) == {SUB, "b19"}
    hop, a = recovered[SUB]
    assert hop == towards(relay, SUB) and (a.lo, a.hi, a.items, a.unit) == (1, 20, items, C8)
    hop, a = recovered["b19"]
    assert hop == towards(relay, "b19")
    assert (a.pubend, a.lo, a.hi, a.lost, a.unit) == (pe, 5, 8, False, C8)
    assert [it.tick for it in a.items] == [5, 6, 7, 8]
    assert relay.counters["nack_answers_shared"] == 1

    # the log's answer (whole for everyone) releases the others, and b19 is not sent it again
    far = relay.provenance.distance(PUB, "b17") + 1
    answer = m.Recovered(pe, SUB, 1, 20, items, far, [], True, by=PUB)
    out = relay.peer_message("b17", answer, 3.2)
    recovered = {a.to: a for _, a in sent(out, m.Recovered)}
    assert set(recovered) == {SUB, "b17", "b16"}
    assert [(a.lo, a.hi, a.lost, a.unit) for a in (recovered["b17"], recovered["b16"])] == [
        (6, 7, True, ()),
        (5, 8, True, ()),
    ]
    assert recovered[SUB].lost  # a relayed answer keeps its lost flag
    assert [it.tick for it in recovered["b17"].items] == [6, 7]
    assert relay.counters["nack_answers_shared"] == 3


def test_a_keeper_shares_the_answer_it_makes_only_with_waiting_origins_inside_its_unit():
    """Nacks for ticks the keeper does not know yet go on, and the later ones wait; once the
    events come and it answers from its cache, a copy goes to the origins that waited inside
    the unit the answer is whole for."""
    sim, pe = quiet()
    keeper = sim.cores[KEEPER]
    assert not keeper.claims.knows(pe, SC4, 21, 21)
    out = keeper.peer_message("b17", m.Nack(pe, "b17", [(21, 24)]), 3.0)
    assert [n.origin for _, n in sent(out, m.Nack)] == ["b17"]
    assert keeper.peer_message(SUB, m.Nack(pe, SUB, [(22, 23)]), 3.01) == []
    assert keeper.peer_message("b16", m.Nack(pe, "b12", [(21, 24)]), 3.01) == []
    # ticks 21..24 reach the keeper on SC-4's route (its claim: nothing since 20)
    routes = (m.Route(SC4, prev=20),)
    items = [
        m.EventItem(t, 0, 6, m.Event({"n": t - 21}), routes, ("b1", "b2", "b4", "b6", "b14", "b16"))
        for t in range(21, 25)
    ]
    keeper.peer_message("b16", m.Events(pe, items), 3.02)
    assert keeper.claims.knows(pe, SC4, 21, 24)
    out = keeper.peer_message("b17", m.Nack(pe, "b17", [(21, 24)]), 3.05)
    assert sent(out, m.Nack) == []
    got = {a.to: (hop, a) for hop, a in sent(out, m.Recovered)}
    assert set(got) == {"b17", SUB}  # not b12: SC-3 is not in SC-4
    assert [(a.lo, a.hi, a.unit) for _, a in (got["b17"], got[SUB])] == [
        (21, 24, SC4),
        (22, 23, SC4),
    ]
    assert [it.tick for it in got[SUB][1].items] == [22, 23]
    assert got[SUB][0] == towards(keeper, SUB)
    assert keeper.counters["nacks_answered_from_cache"] == 1
    assert keeper.counters["nack_answers_shared"] == 1


# -- on the simulator, with frame faults ----------------------------------------------------------


class WatchedSim(Sim):
    """A Sim that checks every answer made from a keeper's cache where it arrives: its
    destination is inside the unit it is whole for, its events are the log's, and it holds
    every logged event of its range that the destination's subscriptions match."""

    runs: list[WatchedSim] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, on_arrive=self._arrived, **kwargs)
        self.checked = 0
        self.problems: list[str] = []
        WatchedSim.runs.append(self)

    def _arrived(self, src, dst, msg):
        if type(msg) is m.Recovered and msg.to == dst and msg.unit:
            self._check(dst, msg)

    def _check(self, dst: str, a: m.Recovered) -> None:
        self.checked += 1
        if dst not in self.topology.units[a.unit]:
            self.problems.append(f"{dst} got an answer for {a.unit}")
        log = {
            t: dict(ev.attributes)
            for t, ev in self.logs[a.pubend.partition("~")[0]].read(a.lo, a.hi, 100_000)
        }
        got = {it.tick: dict(it.event.attributes) for it in a.items}
        if any(not a.lo <= t <= a.hi or log.get(t) != attrs for t, attrs in got.items()):
            self.problems.append(f"{dst}: {a.pubend} {a.lo}..{a.hi} has events not logged so")
        match = self.cores[dst].profiles.match
        missing = [t for t, attrs in log.items() if t not in got and match(attrs)]
        if missing:
            self.problems.append(f"{dst}: {a.pubend} {a.lo}..{a.hi} lacks {missing[:5]}")


@pytest.mark.parametrize("name", ["redundant-24", "demo"])
def test_with_frame_faults_nacks_are_answered_near_the_loss_and_nothing_is_violated(
    name, monkeypatch
):
    """Drops (and duplicates, delays, reordering) of data frames: some nacks are answered
    from a keeper's cache, some answers are shared with origins that waited, every cache
    answer is whole for its destination, and every subscriber gets exactly what it must."""
    monkeypatch.setattr(scenario, "Sim", WatchedSim)
    WatchedSim.runs = []
    faults = Faults.parse("drop,dup,delay,reorder")
    from_cache = shared = checked = 0
    for seed in range(3):
        outcome = scenario.run_seed(topology(name), seed, faults=faults, churn=0)
        assert outcome.ok, outcome.violations
        sim = WatchedSim.runs[-1]
        assert sim.stats["dropped"] > 0
        assert sim.problems == []
        checked += sim.checked
        from_cache += sum(c.counters["nacks_answered_from_cache"] for c in sim.cores.values())
        shared += sum(c.counters["nack_answers_shared"] for c in sim.cores.values())
    assert from_cache > 0
    assert shared > 0
    assert checked > 0


@pytest.mark.parametrize("name", ["redundant-24", "demo"])
def test_with_frame_drops_and_churn_the_checker_finds_no_violation(name):
    """Drops only, subscriptions changing meanwhile: the repair still answers near the loss
    and exactly-once delivery holds."""
    from_cache = shared = 0
    sims: list[Sim] = []

    class Recorded(Sim):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sims.append(self)

    with mock.patch.object(scenario, "Sim", Recorded):
        for seed in range(3, 6):
            outcome = scenario.run_seed(topology(name), seed, faults=Faults.parse("drop"))
            assert outcome.ok, outcome.violations
            from_cache += sum(
                c.counters["nacks_answered_from_cache"] for c in sims[-1].cores.values()
            )
            shared += sum(c.counters["nack_answers_shared"] for c in sims[-1].cores.values())
    assert from_cache > 0
    assert shared > 0


def test_a_pubend_made_again_is_whole_only_above_what_was_routed_before():
    """Dropped by the pubend bound, then routed again with a late copy of an older tick: the
    cache must not answer for the ticks it routed before it was dropped."""
    cache = EventCache(max_pubends=1)
    cache.add("x~1", its(*range(1, 11)))
    cache.add("y~1", its(1))  # x dropped
    cache.add("x~1", its(5), routed_before=10)
    assert cache.read("x~1", 5, 10) is None
    cache.add("x~1", its(11))
    assert cache.read("x~1", 11, 11) == its(11)
