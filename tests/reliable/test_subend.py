"""The subend: knowledge in from claims, data, silence and recovery; delivery in order, each
once; and curiosity (nacks) on a clock driven by explicit times. Also the knowledge stream's
``add_silence`` and ``gaps(upto)``, which the subend relies on, against a naive model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ges.reliable import D, F, KnowledgeStream, Q
from ges.reliable.subend import MAX_NACK_RANGES, NACK_AFTER, NACK_MAX, NACK_MIN, Subend
from tests.reliable.test_knowledge import Naive

TOP = 60


def values(s: Subend, lo: int, hi: int) -> list[int]:
    return [s.stream.value(t) for t in range(lo, hi + 1)]


def asks(s: Subend, until: float, step: float = 0.5) -> list[float]:
    """The times on a grid ``0, step, … until`` at which ``s`` nacks."""
    out = []
    for i in range(int(until / step) + 1):
        now = i * step
        if s.nack(now):
            out.append(now)
    return out


#: a first wait of one second and a high ceiling: times on a half-second grid are exact
WAIT_ONE = {"nack_after": 1.0, "nack_max": 100.0}


# -- knowledge in, delivery out ---------------------------------------------------------------------


def test_data_with_a_claim_fills_silence_and_holds_data():
    s = Subend()
    s.data(0, 3, "c", True)  # nothing for this broker in 1..2, data at 3
    assert values(s, 1, 3) == [F, F, D]
    s.data(5, 7, "g", True)  # 6 silent; 4 and 5 not claimed
    assert values(s, 4, 7) == [Q, Q, F, D]
    assert s.top == 7
    assert s.deliverable(0.0) == [(3, "c")]
    assert values(s, 4, 7) == [Q, Q, F, D]  # 7 is held behind the gap


def test_deliverable_is_in_order_below_the_horizon_each_once():
    s = Subend()
    s.data(3, 4, "d", True)
    s.data(1, 2, "b", True)
    assert s.deliverable(0.0) == []  # tick 1 unknown
    s.data(0, 1, "a", True)
    assert s.deliverable(0.0) == [(1, "a"), (2, "b")]  # 3 unknown still
    s.data(2, 3, "c", True)
    assert s.deliverable(0.0) == [(3, "c"), (4, "d")]
    assert s.deliverable(0.0) == []
    # duplicates of anything, delivered or not, are ignored
    for prev, tick, item in [(0, 1, "a"), (1, 2, "b"), (3, 4, "d"), (0, 4, "d")]:
        s.data(prev, tick, item, True)
    assert s.deliverable(0.0) == []
    s.data(4, 5, "e", True)
    s.data(4, 5, "e", True)
    assert s.deliverable(0.0) == [(5, "e")]


def test_a_claim_never_erases_data_it_received():
    s = Subend()
    s.data(4, 5, "e", True)  # held: 1..4 unknown
    s.data(0, 7, "g", True)  # claims 1..6; 5 is kept
    assert s.deliverable(0.0) == [(5, "e"), (7, "g")]
    s.data(10, 12, "l", True)
    s.silence(7, 12)  # silence over 8..12 leaves 12 in place
    assert s.deliverable(0.0) == [(12, "l")]


def test_unwanted_data_is_final_and_not_delivered():
    s = Subend()
    s.data(0, 1, "a", False)
    assert s.stream.value(1) == F
    assert s.deliverable(0.0) == []
    assert s.stream.horizon == 2
    s.data(0, 1, "a", True)  # a wanted copy later does not bring it back
    s.data(1, 2, "b", True)
    assert s.deliverable(0.0) == [(2, "b")]
    assert s.nack(100.0) == []


def test_a_subend_starts_above_its_floor():
    s = Subend(floor=10)
    assert s.top == 10
    s.data(3, 8, "h", True)  # at or below the floor: already final
    s.data(10, 11, "k", True)
    assert s.deliverable(0.0) == [(11, "k")]
    assert s.nack(100.0) == []


# -- curiosity ---------------------------------------------------------------------------------------


def test_a_gap_is_nacked_only_once_wait_has_passed():
    s = Subend()
    s.data(0, 1, "a", True)
    s.data(3, 4, "d", True)  # 2..3 unknown
    assert s.nack(50.0) == []  # the gap clock starts with deliverable()
    assert s.deliverable(0.0) == [(1, "a")]
    assert s.wait == NACK_AFTER
    assert s.nack(0.0) == []
    assert s.nack(NACK_AFTER * 0.99) == []
    assert s.nack(NACK_AFTER) == [(2, 3)]
    assert s.nack(NACK_AFTER) == []  # asked: not again at once


def test_nacks_back_off_doubling_between_asks():
    s = Subend(**WAIT_ONE)
    s.data(1, 2, "b", True)  # 1 unknown
    assert s.deliverable(0.0) == []
    assert asks(s, 40.0) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


def test_the_backoff_is_capped_by_nack_max():
    s = Subend(**{**WAIT_ONE, "nack_max": 3.0})
    s.data(1, 2, "b", True)
    s.deliverable(0.0)
    assert asks(s, 14.0) == [1.0, 2.0, 4.0, 7.0, 10.0, 13.0]


def test_the_default_backoff_reaches_nack_max():
    s = Subend()
    s.data(1, 2, "b", True)
    s.deliverable(0.0)
    times = []
    now = 0.0
    for _ in range(12):
        now = s.next_nack
        assert s.nack(now) == [(1, 1)]
        times.append(now)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert gaps[0] == pytest.approx(NACK_AFTER)
    assert gaps[1] == pytest.approx(2 * NACK_AFTER)
    assert max(gaps) == pytest.approx(NACK_MAX)
    assert all(g <= NACK_MAX + 1e-9 for g in gaps)


def test_progress_restarts_the_gap_clock():
    s = Subend(**WAIT_ONE)
    s.data(0, 1, "a", True)
    s.data(3, 4, "d", True)  # 2..3 unknown
    s.data(6, 7, "g", True)  # 5..6 unknown
    assert s.deliverable(0.0) == [(1, "a")]
    assert s.nack(1.0) == [(2, 3), (5, 6)]
    assert s.nack(2.0) == [(2, 3), (5, 6)]  # next after 2 s, at 4
    s.data(1, 2, "b", True)
    s.data(2, 3, "c", True)
    assert s.deliverable(3.0) == [(2, "b"), (3, "c"), (4, "d")]
    # the gap 5..6 is still there; the clock and backoff start again from 3
    assert s.nack(3.5) == []
    assert s.nack(4.0) == [(5, 6)]
    assert s.nack(5.0) == [(5, 6)]
    assert s.nack(6.0) == []
    assert s.nack(7.0) == [(5, 6)]


def test_no_gap_no_nack():
    s = Subend()
    s.data(0, 1, "a", True)
    s.data(1, 2, "b", True)
    assert s.deliverable(0.0) == [(1, "a"), (2, "b")]
    assert s.next_nack == float("inf")
    assert s.nack(1e9) == []


def test_a_gap_filled_before_its_nack_is_not_asked_for():
    s = Subend()
    s.data(2, 3, "c", True)
    assert s.deliverable(0.0) == []
    s.silence(0, 2)
    assert s.deliverable(0.05) == [(3, "c")]
    assert s.next_nack == float("inf")
    assert s.nack(10.0) == []


def test_a_gap_filled_without_deliverable_is_not_asked_for():
    s = Subend()
    s.data(2, 3, "c", True)
    s.deliverable(0.0)
    s.silence(0, 2)  # deliverable() not called since
    assert s.nack(10.0) == []
    assert s.next_nack == float("inf")


def test_one_nack_names_at_most_max_nack_ranges_lowest_first():
    s = Subend()
    n = MAX_NACK_RANGES + 6
    for t in range(2, 2 * n + 1, 2):
        s.data(t - 1, t, t, True)  # odd ticks unknown
    assert list(s.stream.gaps()) == [(t, t) for t in range(1, 2 * n, 2)]
    s.deliverable(0.0)
    got = s.nack(NACK_AFTER)
    assert got == [(t, t) for t in range(1, 2 * MAX_NACK_RANGES, 2)]


def test_silence_raises_top_so_an_empty_claim_still_shows_a_tail_gap():
    s = Subend()
    s.data(0, 2, "b", True)
    assert s.deliverable(0.0) == [(2, "b")]
    assert s.nack(100.0) == []
    s.silence(10, 8)  # the stream has reached 8, but the claim names nothing
    assert s.top == 8
    assert values(s, 3, 8) == [Q] * 6  # no tick was made silent
    assert s.deliverable(200.0) == []
    assert s.nack(200.0) == []
    assert s.nack(200.0 + NACK_AFTER) == [(3, 8)]


def test_an_empty_data_claim_also_raises_top():
    s = Subend()
    s.data(9, 6, "f", True)  # late: a claim over nothing, data at 6
    assert s.top == 6
    s.deliverable(0.0)
    assert s.nack(NACK_AFTER) == [(1, 5)]


def test_silence_fills_what_it_claims():
    s = Subend()
    s.silence(0, 5)
    assert values(s, 1, 5) == [F] * 5
    s.data(5, 6, "f", True)
    assert s.deliverable(0.0) == [(6, "f")]


# -- recovery -----------------------------------------------------------------------------------------


def test_recovered_fills_data_and_silence_and_measures_the_round_trip():
    s = Subend()
    s.data(0, 1, "a", True)
    s.data(5, 6, "f", True)  # 2..5 unknown
    assert s.deliverable(0.0) == [(1, "a")]
    assert s.nack(0.1) == [(2, 5)]
    s.recovered(2, 5, [(3, "c")], now=0.3)
    assert values(s, 2, 5) == [F, D, F, F]
    assert s.deliverable(0.3) == [(3, "c"), (6, "f")]
    assert s.srtt == pytest.approx(0.2)
    assert s.wait == pytest.approx(0.4)
    assert s.nack(100.0) == []


def test_the_wait_follows_the_smoothed_round_trip():
    s = Subend()
    s.data(1, 2, "b", True)
    s.deliverable(0.0)
    assert s.nack(0.1) == [(1, 1)]
    s.recovered(2, 2, [], now=0.3)  # any answer takes the sample
    assert s.srtt == pytest.approx(0.2)
    now = s.next_nack
    assert s.nack(now) == [(1, 1)]
    s.recovered(2, 2, [], now=now + 0.04)
    assert s.srtt == pytest.approx(0.875 * 0.2 + 0.125 * 0.04)
    assert s.wait == pytest.approx(2 * s.srtt)


def test_an_answer_without_a_nack_takes_no_sample():
    s = Subend()
    s.recovered(1, 3, [(2, "b")], now=5.0)
    assert s.srtt is None
    assert s.wait == NACK_AFTER
    assert s.deliverable(5.0) == [(2, "b")]


def test_only_the_first_answer_to_a_nack_takes_a_sample():
    s = Subend()
    s.data(3, 4, "d", True)
    s.deliverable(0.0)
    assert s.nack(0.1) == [(1, 3)]
    s.recovered(1, 1, [], now=0.2)
    s.recovered(2, 3, [], now=9.0)
    assert s.srtt == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("sample", "wait"),
    [(0.0001, NACK_MIN), (1000.0, NACK_MAX), (0.5, 1.0)],
)
def test_the_wait_is_bounded(sample, wait):
    s = Subend()
    s.data(1, 2, "b", True)
    s.deliverable(0.0)
    assert s.nack(NACK_AFTER)
    s.recovered(1, 1, [], now=NACK_AFTER + sample)
    assert s.wait == pytest.approx(wait)


def test_the_adapted_wait_times_the_next_gap():
    s = Subend()
    s.data(1, 2, "b", True)
    s.deliverable(0.0)
    assert s.nack(0.1)
    s.recovered(1, 1, [], now=1.1)  # srtt 1.0: wait 2.0
    assert s.deliverable(1.1) == [(2, "b")]
    s.data(3, 4, "d", True)  # 3 unknown
    assert s.deliverable(10.0) == []
    assert s.nack(11.9) == []
    assert s.nack(12.0) == [(3, 3)]


# A stream at its bound of final ranges raises StreamFull from add_final/add_silence too; the
# subend leaves those ticks Q (asked for again later) rather than letting it escape.
def test_a_full_stream_leaves_silence_unknown_instead_of_raising():
    s = Subend()
    s.stream = KnowledgeStream(max_ranges=2)
    s.silence(0, 2)  # folded into the floor: no range held
    s.silence(3, 5)
    s.silence(6, 8)  # two disjoint ranges above the floor
    assert s.stream.value(6) == Q
    s.silence(9, 11)  # a third: the stream refuses it
    assert s.stream.value(11) == Q


# -- the stream's add_silence and gaps(upto), against a naive model ------------------------------------


stream_ops = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.integers(1, TOP)),
        st.tuples(st.just("final"), st.integers(1, TOP), st.integers(-1, 5)),
        st.tuples(st.just("silence"), st.integers(1, TOP), st.integers(-1, 20)),
        st.tuples(st.just("take")),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream_ops, st.integers(0, TOP + 10))
def test_add_silence_turns_only_unknown_ticks_final(script, upto):
    s, n = KnowledgeStream(), Naive()
    for op in script:
        if op[0] == "data":
            s.add_data(op[1], op[1])
            n.add_data(op[1], op[1])
        elif op[0] == "final":
            s.add_final(op[1], op[1] + op[2])
            n.add_final(op[1], op[1] + op[2])
        elif op[0] == "silence":
            held = {t for t in range(1, TOP + 30) if s.value(t) == D}
            s.add_silence(op[1], op[1] + op[2])
            n.add_silence(op[1], op[1] + op[2])
            # silence never removes a data tick, nor its payload
            assert all(s.value(t) == D for t in held)
        else:
            assert s.take_deliverable() == n.take()
        assert [s.value(t) for t in range(1, TOP + 30)] == [n.value(t) for t in range(1, TOP + 30)]
        assert list(s.gaps(upto)) == n.gaps(upto)
        assert s.horizon == n.horizon()


def test_gaps_upto_extends_past_the_known_top():
    s = KnowledgeStream()
    s.add_final(1, 2)
    s.add_data(5, "e")
    assert list(s.gaps()) == [(3, 4)]
    assert list(s.gaps(5)) == [(3, 4)]
    assert list(s.gaps(3)) == [(3, 4)]  # lower than known_to: no effect
    assert list(s.gaps(9)) == [(3, 4), (6, 9)]
    s.add_final(6, 7)
    assert list(s.gaps(9)) == [(3, 4), (8, 9)]
