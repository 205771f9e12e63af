"""The in-memory pubend log: appends by consecutive ticks, reads by tick range, and refuses to
go back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ges.reliable.log import MAX_READ, MemoryLog


def test_an_empty_log():
    log = MemoryLog()
    assert log.epoch == 1
    assert log.last == 0 and log.committed == 0 and len(log) == 0
    assert log.read(1, 100) == []


def test_the_epoch_is_kept():
    assert MemoryLog(7).epoch == 7
    assert MemoryLog(epoch=3).epoch == 3


def test_append_gives_consecutive_ticks_from_first():
    log = MemoryLog()
    log.append(1, ["a", "b", "c"])
    assert log.last == 3 and log.committed == 3 and len(log) == 3
    assert log.read(1, 3) == [(1, "a"), (2, "b"), (3, "c")]
    log.append(4, ["d"])
    assert log.last == 4 and log.committed == 4
    assert log.read(1, 4) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]


def test_read_is_bounded_by_lo_and_hi_inclusive():
    log = MemoryLog()
    log.append(1, list("abcdef"))
    assert log.read(2, 4) == [(2, "b"), (3, "c"), (4, "d")]
    assert log.read(3, 3) == [(3, "c")]
    assert log.read(0, 2) == [(1, "a"), (2, "b")]
    assert log.read(5, 100) == [(5, "e"), (6, "f")]
    assert log.read(7, 9) == []
    assert log.read(4, 3) == []  # an empty range


def test_read_returns_at_most_limit_from_lo():
    log = MemoryLog()
    log.append(1, list("abcdef"))
    assert log.read(2, 6, limit=2) == [(2, "b"), (3, "c")]
    assert log.read(1, 6, limit=6) == log.read(1, 6)
    assert log.read(1, 6, limit=0) == []


def test_read_defaults_to_max_read():
    log = MemoryLog()
    log.append(1, list(range(MAX_READ + 10)))
    got = log.read(1, MAX_READ + 10)
    assert len(got) == MAX_READ
    assert got[0] == (1, 0) and got[-1] == (MAX_READ, MAX_READ - 1)


def test_read_skips_ticks_not_held():
    log = MemoryLog()
    log.append(3, ["c", "d"])
    log.append(10, ["j"])
    assert log.last == 10 and len(log) == 3
    assert log.read(1, 20) == [(3, "c"), (4, "d"), (10, "j")]
    assert log.read(5, 9) == []
    assert log.read(4, 10, limit=1) == [(4, "d")]


@pytest.mark.parametrize("first", [1, 2, 3])
def test_appending_at_or_below_last_raises(first):
    log = MemoryLog()
    log.append(1, ["a", "b", "c"])
    with pytest.raises(ValueError):
        log.append(first, ["x"])
    # and nothing was appended
    assert log.last == 3 and len(log) == 3
    assert log.read(1, 10) == [(1, "a"), (2, "b"), (3, "c")]


def test_tick_zero_cannot_be_appended():
    with pytest.raises(ValueError):
        MemoryLog().append(0, ["x"])


def test_an_empty_batch_is_nothing():
    log = MemoryLog()
    log.append(1, ["a"])
    log.append(1, [])  # appends no tick: not a step back
    log.append(5, [])
    assert log.last == 1 and len(log) == 1
    log.append(2, ["b"])
    assert log.read(1, 5) == [(1, "a"), (2, "b")]


batches = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 5)),  # (skip from last + 1, size)
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(batches, st.integers(0, 60), st.integers(0, 60), st.integers(0, 20))
def test_the_log_agrees_with_a_dict_of_ticks(script, lo, hi, limit):
    log = MemoryLog()
    model: dict[int, object] = {}
    for skip, size in script:
        first = log.last + skip
        events = [(first, i) for i in range(size)]
        log.append(first, events)
        for i, ev in enumerate(events):
            model[first + i] = ev
        assert log.last == max(model, default=0) == log.committed
        assert len(log) == len(model)
    want = [(t, model[t]) for t in sorted(model) if lo <= t <= hi][:limit]
    assert log.read(lo, hi, limit) == want
