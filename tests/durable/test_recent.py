"""The session store's cache of recent events (ges.durable.recent): alone, and as part of the
SQLite store, whose reads must be the same with it as without it."""

from __future__ import annotations

import tracemalloc

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ges.durable.recent import ATTRIBUTE_OVERHEAD, EVENT_OVERHEAD, WANT_OVERHEAD, Recent
from ges.durable.store import SessionState
from ges.runtime.session_store import SqliteSessionStore
from ges.wire import messages as m

A, B, C = 1, 2, 3


def item(n: int, payload: bytes = b"") -> m.EventItem:
    return m.EventItem(n, n - 1, 0, m.Event({"n": n}, payload))


def epochs(items: list) -> list[int]:
    return [it.epoch for it in items]


def cost(size: int, sessions: int = 1) -> int:
    """What an event of ``size`` bytes with one attribute, held for ``sessions`` sessions,
    counts."""
    return size + EVENT_OVERHEAD + ATTRIBUTE_OVERHEAD + WANT_OVERHEAD * sessions


def test_it_covers_a_session_after_what_it_began_at_and_reads_what_was_added():
    r = Recent(since=10, limit=1 << 20)
    assert r.covers(A, 10) and not r.covers(A, 9)
    r.add(11, "p", item(1), [(A, [1]), (B, [2])], 0, "", 10)
    r.add(12, "p", item(2), [(B, [2])], 0, "", 10)
    assert r.bytes == cost(10, 2) + cost(10)
    assert r.read(A, 10, upto=99, limit=9, max_bytes=1 << 20) == [
        m.SessionItem(11, "p", item(1), [1])
    ]
    assert epochs(r.read(B, 10, upto=99, limit=9, max_bytes=1 << 20)) == [11, 12]
    assert epochs(r.read(B, 11, upto=99, limit=9, max_bytes=1 << 20)) == [12]
    assert epochs(r.read(B, 10, upto=11, limit=9, max_bytes=1 << 20)) == [11]  # not committed
    assert epochs(r.read(B, 10, upto=99, limit=1, max_bytes=1 << 20)) == [11]
    assert epochs(r.read(B, 10, upto=99, limit=9, max_bytes=1)) == [11]  # at least one
    assert r.read(C, 10, upto=99, limit=9, max_bytes=1 << 20) == []


def test_eviction_is_oldest_first_by_bytes_and_raises_the_floor_of_the_sessions_it_held():
    r = Recent(since=0, limit=cost(10) * 2 + cost(10) // 2)
    r.add(1, "p", item(1), [(A, [1])], 0, "", 10)
    r.add(2, "p", item(2), [(B, [1])], 0, "", 10)
    assert r.bytes == 2 * cost(10) and r.covers(A, 0) and r.covers(B, 0)
    r.add(3, "p", item(3), [(A, [1])], 0, "", 10)  # over: epoch 1 goes
    assert r.bytes == 2 * cost(10)
    assert not r.covers(A, 0) and r.covers(A, 1)
    assert r.covers(B, 0)  # it lost nothing
    assert epochs(r.read(A, 1, upto=9, limit=9, max_bytes=1 << 20)) == [3]


def test_an_event_larger_than_the_whole_cache_is_never_held():
    r = Recent(since=0, limit=cost(10) * 2)
    r.add(1, "p", item(1), [(A, [1])], 0, "", 10)
    r.add(2, "p", item(2), [(A, [1]), (B, [1])], 0, "", cost(10) * 2)
    assert r.bytes == cost(10)
    assert not r.covers(A, 1) and r.covers(A, 2)
    assert not r.covers(B, 0)
    assert epochs(r.read(A, 0, upto=9, limit=9, max_bytes=1 << 20)) == [1]


def test_what_a_session_releases_leaves_and_a_forgotten_session_leaves_nothing():
    r = Recent(since=0, limit=cost(10, 2) * 3)
    for e in (1, 2, 3):
        r.add(e, "p", item(e), [(A, [1]), (B, [1])], 0, "", 10)
    r.release(A, 2)
    assert epochs(r.read(A, 0, upto=9, limit=9, max_bytes=1 << 20)) == [3]
    r.release(A, -1)
    assert r.read(A, 0, upto=9, limit=9, max_bytes=1 << 20) == []
    assert epochs(r.read(B, 0, upto=9, limit=9, max_bytes=1 << 20)) == [1, 2, 3]
    r.forget(B)
    assert r.read(B, 0, upto=9, limit=9, max_bytes=1 << 20) == []
    r.add(4, "p", item(4), [(A, [1])], 0, "", cost(10, 2) * 3 - cost(0))  # the rest go
    assert r.bytes == cost(10, 2) * 3
    assert r.covers(A, 0)  # what it lost it had released
    assert r._floor == {}  # nothing kept of the forgotten session, nor of what was released


def test_the_objects_held_stay_within_about_the_bound():
    """Small events held for many sessions, and events of many small attributes: the Python
    heap the cache holds is about its bound (each event counted with what its objects take)."""
    limit = 1 << 20
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder(m.EventItem).decode  # as the wire gives them
    for sessions, attributes in ((1, 2), (300, 2), (1, 200)):
        tracemalloc.start()
        r = Recent(since=0, limit=limit)
        for e in range(1, 3000):
            values = {f"a{i}": e + i for i in range(attributes)}
            it = decode(encode(m.EventItem(e, e - 1, 0, m.Event(values, b"x" * 8))))
            wants = [(k, [1]) for k in range(1, sessions + 1)]
            r.add(e, "p~1", it, wants, 0, "", len(encode(it)))
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert r.bytes <= limit and held < 1.5 * limit, (sessions, attributes, held)


# -- the SQLite store with its cache reads what it reads without one ---------------------------

_op = st.one_of(
    st.tuples(
        st.just("append"),
        st.lists(st.sampled_from([A, B, C]), min_size=1, max_size=3, unique=True),
        st.integers(0, 300),  # payload bytes
    ),
    st.tuples(st.just("commit")),
    st.tuples(st.just("release"), st.sampled_from([A, B, C]), st.integers(0, 40)),
    st.tuples(st.just("drop"), st.sampled_from([A, B, C])),
    st.tuples(
        st.just("read"),
        st.sampled_from([A, B, C]),
        st.integers(0, 40),
        st.integers(1, 6),
        st.integers(1, 900),
    ),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_op, max_size=60), recent=st.integers(0, 6000))
def test_reads_with_the_cache_are_the_reads_without_it(tmp_path_factory, ops, recent):
    where = tmp_path_factory.mktemp("recent")
    cached = SqliteSessionStore(where / "cached.db", recent_bytes=recent)
    plain = SqliteSessionStore(where / "plain.db", recent_bytes=0)
    acked = {A: 0, B: 0, C: 0}  # a session reads after what it released, as a replicator does
    dropped: set[int] = set()  # a dropped session's key is never given events again
    try:
        for op in ops:
            if op[0] == "append":
                wants = [(k, [k]) for k in sorted(op[1]) if k not in dropped]
                if not wants:
                    continue
            for store in (cached, plain):
                if op[0] == "append":
                    n = store.last + 1
                    store.append("p~1", item(n, b"x" * op[2]), wants)
                elif op[0] == "commit":
                    store.committed_to(store.write_group(store.take_group()))
                elif op[0] == "release":
                    store.release(op[1], max(acked[op[1]], op[2]))
                elif op[0] == "drop":
                    store.drop_session(SessionState(f"s{op[1]}", "o", op[1], {}, 0.0, 0))
            if op[0] == "release":
                acked[op[1]] = max(acked[op[1]], op[2])
            elif op[0] == "drop":
                dropped.add(op[1])
            elif op[0] == "read" and op[1] not in dropped:  # nothing reads a dropped session
                _, key, after, limit, max_bytes = op
                after = max(after, acked[key])
                got = cached.read(key, after, limit=limit, max_bytes=max_bytes)
                assert got == plain.read(key, after, limit=limit, max_bytes=max_bytes)
    finally:
        cached.close()
        plain.close()
