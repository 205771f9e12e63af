"""The knowledge stream against a naive model that keeps one value per tick."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ges.reliable import D, F, KnowledgeStream, Q, StreamFull
from ges.reliable.knowledge import HeldBytes

TOP = 60


class Naive:
    def __init__(self):
        self.v = {}  # tick -> D or F; absent: Q
        self.payload = {}

    def value(self, t):
        return self.v.get(t, Q)

    def add_data(self, t, p):
        if self.value(t) == Q:
            self.v[t] = D
            self.payload[t] = p
            return True
        return False

    def add_final(self, lo, hi):
        for t in range(lo, hi + 1):
            self.v[t] = F
            self.payload.pop(t, None)

    def horizon(self):
        t = 1
        while self.value(t) != Q:
            t += 1
        return t

    def add_silence(self, lo, hi):
        for t in range(lo, hi + 1):
            if self.value(t) == Q:
                self.v[t] = F

    def gaps(self, upto=0):
        top = max(max(self.v, default=0), upto)
        out, t = [], 1
        while t <= top:
            if self.value(t) == Q:
                lo = t
                while t <= top and self.value(t) == Q:
                    t += 1
                out.append((lo, t - 1))
            else:
                t += 1
        return out

    def take(self):
        h = self.horizon()
        out = [(t, self.payload.pop(t)) for t in range(1, h) if self.v.get(t) == D]
        for t in range(1, h):
            self.v[t] = F
        return out


ops = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.integers(1, TOP)),
        st.tuples(st.just("final"), st.integers(1, TOP), st.integers(0, 8)),
        st.tuples(st.just("take")),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_the_stream_agrees_with_one_value_per_tick(script):
    s, n = KnowledgeStream(), Naive()
    delivered = []
    for op in script:
        if op[0] == "data":
            assert s.add_data(op[1], f"e{op[1]}") == n.add_data(op[1], f"e{op[1]}")
        elif op[0] == "final":
            s.add_final(op[1], op[1] + op[2])
            n.add_final(op[1], op[1] + op[2])
        else:
            got = s.take_deliverable()
            assert got == n.take()
            delivered += [t for t, _ in got]
        assert [s.value(t) for t in range(1, TOP + 10)] == [n.value(t) for t in range(1, TOP + 10)]
        assert s.horizon == n.horizon()
        assert list(s.gaps()) == n.gaps()
        assert s.known_to == max(n.v, default=0)
    # exactly once, in order: a tick is delivered at most once, and ascending
    assert delivered == sorted(set(delivered))


def test_an_in_order_stream_stays_one_object():
    s = KnowledgeStream()
    for t in range(1, 10_001):
        if t % 10:
            s.add_final(t, t)  # silence
        else:
            s.add_data(t, t)
        s.take_deliverable()
    assert s.floor == 10_000 and len(s) == 0
    assert s.horizon == 10_001 and list(s.gaps()) == []


def test_late_and_duplicate_knowledge_never_lowers_a_tick():
    s = KnowledgeStream()
    s.add_data(3, "x")
    s.add_final(1, 2)
    assert s.take_deliverable() == [(3, "x")]
    assert s.add_data(3, "x") is False  # a duplicate after delivery
    assert s.add_data(2, "late") is False  # data for a tick known silent
    assert s.value(3) == F and s.take_deliverable() == []


def test_gaps_are_the_unknown_ticks_below_the_highest_known():
    s = KnowledgeStream()
    s.add_data(5, "a")
    s.add_final(8, 9)
    s.add_data(12, "b")
    assert list(s.gaps()) == [(1, 4), (6, 7), (10, 11)]
    assert s.horizon == 1 and s.known_to == 12
    assert s.take_deliverable() == []  # tick 5 waits behind the gap 1..4


def test_bounds_refuse_growth_instead_of_growing():
    s = KnowledgeStream(max_ranges=2, max_data=2)
    s.add_final(2, 2)
    s.add_final(4, 4)
    with pytest.raises(StreamFull):
        s.add_final(6, 6)
    s.add_final(3, 3)  # merging ranges is always allowed
    assert len(s) == 1
    s.add_data(10, 1)
    s.add_data(11, 2)
    with pytest.raises(StreamFull):
        s.add_data(12, 3)
    assert s.add_data(11, 2) is False  # a duplicate is not growth


def test_data_held_is_bounded_in_bytes_per_stream_and_shared():
    """With a size function a stream holds at most max_bytes of data, and streams sharing a
    HeldBytes at most its limit together (issue 17: every bound in bytes, not items)."""
    shared = HeldBytes(limit=150)
    a = KnowledgeStream(size=len, max_bytes=100, shared=shared)
    b = KnowledgeStream(size=len, max_bytes=100, shared=shared)
    for t in (2, 3, 4):
        a.add_data(t, "x" * 30)
    with pytest.raises(StreamFull):
        a.add_data(5, "x" * 30)  # 120 bytes in a
    assert (a.held_bytes, shared.used) == (90, 90)
    b.add_data(2, "y" * 50)
    with pytest.raises(StreamFull):
        b.add_data(3, "y" * 20)  # 160 bytes in all
    a.add_silence(1, 1)  # tick 1 known: 2..4 go to the subscriber and free their bytes
    assert [t for t, _ in a.take_deliverable()] == [2, 3, 4]
    assert (a.held_bytes, shared.used) == (0, 50)
    b.add_data(3, "y" * 20)
    assert b.drop_highest_data() == 3 and shared.used == 50
    b.release()
    assert shared.used == 0
    # over the bounds, only the tick at the doubt horizon still goes in (it leaves at once):
    # twenty streams each holding one large event beyond it stay within the shared limit
    c = KnowledgeStream(size=len, max_bytes=10)
    with pytest.raises(StreamFull):
        c.add_data(2, "z" * 1000)
    assert c.add_data(1, "z" * 1000)
    assert [t for t, _ in c.take_deliverable()] == [1]
    pool = HeldBytes(limit=100)
    streams = [KnowledgeStream(size=len, shared=pool) for _ in range(20)]
    for s in streams:
        with contextlib.suppress(StreamFull):
            s.add_data(5, "w" * 60)
    assert pool.used <= 100
