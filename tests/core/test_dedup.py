"""TickWindow: which ticks of one pubend were seen, as disjoint ranges bounded by ``limit``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ges.core.dedup import DEFAULT_WINDOW, TickWindow


def test_in_order_ticks_keep_one_range():
    w = TickWindow()
    assert [w.add(t) for t in range(1, 101)] == [True] * 100
    assert w.ranges() == [(1, 100)]


def test_a_stream_first_heard_mid_stream_keeps_one_range():
    w = TickWindow()
    assert all(w.add(t) for t in range(5_000, 5_100))
    assert w.ranges() == [(5_000, 5_099)]
    assert w.add(4_999)  # an older tick never seen is still new
    assert not w.add(5_050)


def test_duplicates_are_rejected():
    w = TickWindow()
    assert w.add(1)
    assert not w.add(1)
    assert w.add(3)
    assert not w.add(3)
    assert w.ranges() == [(1, 1), (3, 3)]


def test_reordered_ticks_fill_holes_and_merge():
    w = TickWindow()
    for t in (3, 4, 6):
        assert w.add(t)
    assert w.ranges() == [(3, 4), (6, 6)]
    assert w.add(1)
    assert w.add(2)
    assert w.ranges() == [(1, 4), (6, 6)]
    assert w.add(5)
    assert w.ranges() == [(1, 6)]
    assert not any(w.add(t) for t in range(1, 7))


def test_add_range_and_contains():
    w = TickWindow()
    w.add_range(1, 10)
    w.add_range(11, 20)
    assert w.ranges() == [(1, 20)]
    w.add_range(30, 31)
    assert w.ranges() == [(1, 20), (30, 31)]
    w.add_range(25, 26)  # out of order: still merged correctly
    assert w.ranges() == [(1, 20), (25, 26), (30, 31)]
    assert 20 in w and 21 not in w and 25 in w and 31 in w and 32 not in w
    assert not w.add(15)


def test_default_limit_and_validation():
    assert TickWindow().limit == DEFAULT_WINDOW
    with pytest.raises(ValueError):
        TickWindow(limit=0)


@given(st.lists(st.integers(min_value=-5, max_value=60), max_size=200))
def test_matches_a_set_model_within_the_limit(ticks):
    w = TickWindow(limit=100)  # never more than 33 holes: no compaction
    seen: set[int] = set()
    for t in ticks:
        assert w.add(t) is (t not in seen)
        seen.add(t)
    covered = {t for lo, hi in w.ranges() for t in range(lo, hi + 1)}
    assert covered == seen
    # ranges are sorted, disjoint and not adjacent (adjacent ones merge)
    rs = w.ranges()
    assert all(a[1] + 1 < b[0] for a, b in zip(rs, rs[1:], strict=False))


@given(st.permutations(range(1, 41)))
def test_every_permutation_ends_as_one_range(order):
    w = TickWindow(limit=100)
    assert all(w.add(t) for t in order)
    assert w.ranges() == [(1, 40)]


def test_compaction_bounds_the_ranges_and_drops_old_stragglers():
    w = TickWindow(limit=3)
    for t in (2, 4, 6, 8):  # four ranges: the two lowest merge
        assert w.add(t)
    assert len(w) == 3
    assert w.ranges() == [(2, 4), (6, 6), (8, 8)]
    assert not w.add(3)  # the forgotten hole counts as seen: dropped, never duplicated
    assert w.add(1)  # below every range: not forgotten, still new


@given(st.lists(st.integers(min_value=1, max_value=500), max_size=400))
@settings(max_examples=200)
def test_ranges_never_exceed_the_limit(ticks):
    w = TickWindow(limit=8)
    for t in ticks:
        w.add(t)
        assert len(w) <= 8


@given(st.lists(st.integers(min_value=1, max_value=60), max_size=200))
@settings(max_examples=300)
def test_never_accepts_a_tick_twice_even_when_compacting(ticks):
    w = TickWindow(limit=4)
    accepted: set[int] = set()
    for t in ticks:
        if w.add(t):
            assert t not in accepted, (t, w.ranges())
            accepted.add(t)
