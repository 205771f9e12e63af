"""The session store's contract, run against both stores: ges.durable.store.MemorySessionStore
and ges.runtime.session_store.SqliteSessionStore (group commit: appends are read only once a
group is written and committed, see :func:`commit`) — the latter three ways: with its cache of
recent events at its default size, with one so small that it evicts all the time (reads then
come from the file and from memory by turns), and with none (every read from the file)."""

from __future__ import annotations

import sqlite3

import pytest

from ges.durable.retained import Kept
from ges.durable.store import MemorySessionStore, SessionState
from ges.runtime.session_store import RECENT_BYTES, SqliteSessionStore
from ges.wire import messages as m

A, B = 1, 2  # two sessions' keys


#: recent_bytes of the SQLite stores under test: the default, two small events' worth, none
RECENT = {"sqlite": RECENT_BYTES, "sqlite-small-cache": 2000, "sqlite-no-cache": 0}


@pytest.fixture(params=["memory", *RECENT])
def store(request, tmp_path):
    if request.param == "memory":
        yield MemorySessionStore()
        return
    s = SqliteSessionStore(tmp_path / "s.db", recent_bytes=RECENT[request.param])
    yield s
    s.close()


def commit(store) -> None:
    """Make everything appended (and saved, released, set) durable and readable."""
    if hasattr(store, "take_group"):
        group = store.take_group()
        last = store.write_group(group)
        store.committed_to(last)


def item(n: int = 1, tick: int = 1, payload: bytes = b"") -> m.EventItem:
    return m.EventItem(tick, tick - 1, 2, m.Event({"n": n}, payload))


def state(name: str = "alice", key: int = A, acked: int = 0) -> SessionState:
    subs = {
        1: ("p1", [[m.Constraint("n", "exists")]]),
        2: ("p2", [[m.Constraint("n", "gt", 3), m.Constraint("s", "eq", "x")], []]),
    }
    return SessionState(name, "owner-" + name, key, subs, 1234.5, acked)


def epochs(items: list) -> list[int]:
    return [it.epoch for it in items]


# -- appending and reading --------------------------------------------------------------------


def test_append_returns_increasing_epochs(store):
    got = [store.append("p~1", item(i, tick=i), [(A, [1])]) for i in range(1, 6)]
    assert got == sorted(got) and len(set(got)) == 5
    assert store.last == got[-1]
    commit(store)
    assert store.committed == got[-1]


def test_read_returns_only_that_sessions_events_after_the_epoch_in_order(store):
    e1 = store.append("p~1", item(1, tick=1), [(A, [1])])
    e2 = store.append("p~1", item(2, tick=2), [(B, [7])])
    e3 = store.append("q~1", item(3, tick=1), [(A, [2, 1])])
    e4 = store.append("p~1", item(4, tick=3), [(A, [1])])
    commit(store)
    assert store.read(A, 0) == [
        m.SessionItem(e1, "p~1", item(1, tick=1), [1]),
        m.SessionItem(e3, "q~1", item(3, tick=1), [2, 1]),
        m.SessionItem(e4, "p~1", item(4, tick=3), [1]),
    ]
    assert epochs(store.read(A, e1)) == [e3, e4]
    assert epochs(store.read(A, e4)) == []
    assert store.read(B, 0) == [m.SessionItem(e2, "p~1", item(2, tick=2), [7])]


def test_read_gives_items_as_session_items_with_the_event(store):
    store.append("p~1", item(5, tick=9, payload=b"abc"), [(A, [3])])
    commit(store)
    (got,) = store.read(A, 0)
    assert type(got) is m.SessionItem
    assert got.item == item(5, tick=9, payload=b"abc")
    assert got.item.event.attributes == {"n": 5} and got.item.event.payload == b"abc"
    assert (got.pubend, got.subs, got.gap_to, got.why) == ("p~1", [3], 0, "")


def test_an_event_two_sessions_want_is_stored_once(store):
    e = store.append("p~1", item(1), [(A, [1]), (B, [2, 3])])
    commit(store)
    assert store.last == e  # one epoch for both
    (a,) = store.read(A, 0)
    (b,) = store.read(B, 0)
    assert a.epoch == b.epoch == e
    assert a.item == b.item == item(1)
    assert (a.subs, b.subs) == ([1], [2, 3])


def test_read_respects_limit(store):
    got = [store.append("p~1", item(i, tick=i), [(A, [1])]) for i in range(1, 11)]
    commit(store)
    assert epochs(store.read(A, 0, limit=3)) == got[:3]
    assert epochs(store.read(A, got[2], limit=3)) == got[3:6]


def test_read_respects_max_bytes_but_returns_at_least_one_item(store):
    big = b"x" * 1000
    got = [store.append("p~1", item(i, tick=i, payload=big), [(A, [1])]) for i in range(1, 6)]
    commit(store)
    size = m.event_size(item(1, payload=big).event)
    assert epochs(store.read(A, 0, max_bytes=1)) == got[:1]
    two = store.read(A, 0, max_bytes=2 * size)
    assert epochs(two) == got[:2]
    assert epochs(store.read(A, 0, max_bytes=2 * size + 1)) == got[:3]
    assert epochs(store.read(A, 0, max_bytes=1 << 30)) == got


def test_gap_items_are_read_back_with_their_range_and_reason(store):
    gap = m.EventItem(3, 0, 0, m.Event({}))
    e = store.append("p~1", gap, [(A, []), (B, [])], gap_to=9, why="x")
    commit(store)
    for key in (A, B):
        (got,) = store.read(key, 0)
        assert (got.epoch, got.pubend, got.item.tick, got.gap_to, got.why) == (e, "p~1", 3, 9, "x")
        assert got.subs == []


# -- held and released ------------------------------------------------------------------------


def test_count_is_of_a_sessions_events_between_two_epochs_once_committed(store):
    got = [
        store.append("p~1", item(i, tick=i), [(A, [1])] if i % 2 else [(B, [1])])
        for i in range(1, 9)
    ]
    commit(store)
    assert store.count(A, 0, got[-1]) == 4 and store.count(B, got[1], got[5]) == 2
    store.release(A, got[2])
    commit(store)
    assert store.count(A, got[2], got[-1]) == 2
    later = store.append("p~1", item(9, tick=9), [(A, [1])])
    commit(store)
    assert store.count(A, got[-1], later) == 1


def test_held_counts_a_sessions_events_after_an_epoch_and_the_last(store):
    assert store.held(A, 0) == (0, 0)
    e1 = store.append("p~1", item(1, tick=1), [(A, [1])])
    store.append("p~1", item(2, tick=2), [(B, [1])])
    e3 = store.append("p~1", item(3, tick=3), [(A, [1]), (B, [1])])
    commit(store)
    assert store.held(A, 0) == (2, e3)
    assert store.held(A, e1) == (1, e3)
    assert store.held(A, e3) == (0, 0)
    assert store.held(B, 0) == (2, e3)


def test_stored_before_is_the_last_epoch_stored_over_that_age_ago(store):
    now = [1000.0]
    store.clock = lambda: now[0]
    assert store.stored_before(10) == 0
    e1 = store.append("p~1", item(1, tick=1), [(A, [1])])
    now[0] = 1005.0
    e2 = store.append("p~1", item(2, tick=2), [(B, [1])])
    e3 = store.append("p~1", item(3, tick=3), [(A, [1])])
    commit(store)
    now[0] = 1012.0
    assert e1 < e2 < e3
    assert store.stored_before(10) == e1  # the two of 1005 are 7 s old
    assert store.stored_before(5) == e3
    assert store.stored_before(60) == 0


def test_stored_before_finds_its_epoch_without_reading_every_event(tmp_path):
    """Retention asks once a second; most of the time no event is that old. A store holding
    many events answers by its index, in work that does not grow with them (SQLite's virtual
    machine instructions counted): the query it replaced read every event to say "none"."""
    now = [1000.0]
    s = SqliteSessionStore(tmp_path / "s.db", clock=lambda: now[0])
    for i in range(20_000):
        s.append("p~1", item(i, tick=i + 1), [(A, [1])])
    commit(s)
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    s._reader.set_progress_handler(step, 100)
    now[0] += 7 * 24 * 3600.0
    assert s.stored_before(7 * 24 * 3600.0 + 1) == 0
    assert s.stored_before(3600.0) == 20_000
    s._reader.set_progress_handler(None, 0)
    assert steps[0] < 20  # the old query: 800 (of 100 instructions each)
    s.close()


def test_sqlite_writes_a_group_on_the_event_loop_only_when_it_is_small(tmp_path):
    """In bytes and in rows: a few events inline; many small ones, or the release of a long
    backlog (rows deleted), from a worker thread."""
    from ges.runtime.session_store import INLINE_MAX_ROWS

    s = SqliteSessionStore(tmp_path / "s.db")
    s.append("p~1", item(1, tick=1), [(A, [1])])
    first = s.take_group()
    assert s.inline(first)
    s.committed_to(s.write_group(first))
    for i in range(2 * INLINE_MAX_ROWS):
        s.append("p~1", item(i, tick=i + 2), [(A, [1])])
    many = s.take_group()
    assert not s.inline(many)  # an event row and a wants row each
    s.committed_to(s.write_group(many))
    s.release(A, 3)
    group = s.take_group()
    assert s.inline(group)  # three rows
    s.committed_to(s.write_group(group))
    s.release(A, s.last)
    group = s.take_group()
    assert not s.inline(group)  # the rest of the backlog
    s.committed_to(s.write_group(group))
    assert s.read(A, 0) == []
    s.close()


def test_sqlite_writes_many_retained_changes_from_a_worker_thread(tmp_path):
    """Retained messages kept or cleared are rows too (and their bytes count)."""
    from ges.runtime.session_store import INLINE_MAX_BYTES, INLINE_MAX_ROWS

    s = SqliteSessionStore(tmp_path / "s.db")
    for i in range(INLINE_MAX_ROWS + 1):
        s.retain(Kept(f"t/{i}", i, "p", i, m.Event({"@topic": f"t/{i}", "@retain": 1}, b"x")))
    assert not s.inline(s.take_group())
    s.retain(Kept("big", 1, "p", 1, m.Event({"@topic": "big"}, b"x" * INLINE_MAX_BYTES)))
    assert not s.inline(s.take_group())
    s.retain(Kept("small", 1, "p", 1, m.Event({"@topic": "small"}, b"x")))
    assert s.inline(s.take_group())
    s.close()


def test_the_sessions_wal_is_checkpointed_by_its_task_not_inside_a_commit(tmp_path):
    """SQLite's own checkpoint would fsync inside the commit that crosses its threshold, and a
    small group commits on the event loop's thread: it is off, the store counts what it
    wrote to the WAL, and the sessions task checkpoints from a worker thread when that is
    due — retained messages on random topics counted a page each."""
    from ges.runtime.wal import CHECKPOINT_BYTES

    path = tmp_path / "s.db"
    wal = tmp_path / "s.db-wal"
    s = SqliteSessionStore(path)
    assert s._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    n = 0
    while not s.backfill_due:
        for _ in range(64):  # as bench/retained.py's filling: topics all over the index
            topic = f"home/{n * 7919 % 100_000}/t"
            s.retain(Kept(topic, n, "p", n, m.Event({"@topic": topic, "@retain": 1}, b"x" * 99)))
            n += 1
        s.committed_to(s.write_group(s.take_group()))
    # counted high: the WAL (everything since the start) is not over what was counted
    assert wal.stat().st_size <= s._wal and s._wal >= CHECKPOINT_BYTES

    def restarts() -> int:  # the WAL header's checkpoint sequence: +1 each time it starts over
        return int.from_bytes(wal.read_bytes()[12:16], "big")

    before, grown = restarts(), wal.stat().st_size
    s.start_backfill()
    s.backfill()  # (beside the commits, from a connection of its own)
    assert s.checkpoint_due and restarts() == before
    s.checkpoint()
    assert not s.checkpoint_due and restarts() == before + 1  # started over in checkpoint()
    s.retain(Kept("last", n, "p", n, None))
    s.committed_to(s.write_group(s.take_group()))
    assert restarts() == before + 1 and wal.stat().st_size == grown  # reused, not grown
    s.close()
    assert len(SqliteSessionStore(path).retained()) == n + 1


def test_what_a_session_that_keeps_up_writes_to_the_wal_is_counted_high(tmp_path):
    """Groups of a few events, the release of what was acknowledged and the session saved
    again (a persistent subscriber keeping up), and now and then a session with many
    subscriptions saved: the WAL (no checkpoint ran, so it holds every frame written) is not
    over what the store counted when its checkpoint falls due."""
    from ges.runtime.wal import CHECKPOINT_BYTES

    s = SqliteSessionStore(tmp_path / "s.db")
    s.save_session(state("alice", A))
    groups = 0
    while not s.backfill_due:
        got = [s.append("p~1", item(i, tick=i, payload=b"x" * 100), [(A, [1])]) for i in range(4)]
        s.release(A, got[0] - 1)
        s.save_session(state("alice", A, acked=got[0] - 1))
        if groups % 50 == 0:
            big = state("bob", B)
            big.subs = {i: (f"p{i}", [[m.Constraint("n", "gt", i)]]) for i in range(2000)}
            s.save_session(big)
        s.committed_to(s.write_group(s.take_group()))
        groups += 1
    assert (tmp_path / "s.db-wal").stat().st_size <= s._wal, groups
    assert s._wal < 2 * CHECKPOINT_BYTES  # (and not due at the first group)
    assert groups > 10
    s.close()


def test_a_session_s_first_release_after_a_restart_counts_only_what_it_held(tmp_path):
    """Its floor is what it had acknowledged: one more acknowledged event is a few rows (on
    the event loop's thread, no checkpoint due), not every epoch since the store began."""
    s = SqliteSessionStore(tmp_path / "s.db")
    s.save_session(state("alice", A))
    for i in range(3000):
        s.append("p~1", item(i, tick=i + 1), [(A, [1])])
    s.release(A, 2998)
    s.save_session(state("alice", A, acked=2998))
    s.committed_to(s.write_group(s.take_group()))
    s.close()
    s = SqliteSessionStore(tmp_path / "s.db")
    s.sessions()
    s.release(A, 2999)
    group = s.take_group()
    assert s.inline(group) and not s.backfill_due
    s.committed_to(s.write_group(group))
    assert not s.backfill_due
    assert epochs(s.read(A, 0)) == [3000]
    s.close()


def test_release_drops_that_sessions_records_up_to_the_epoch(store):
    got = [store.append("p~1", item(i, tick=i), [(A, [1])]) for i in range(1, 5)]
    commit(store)
    store.release(A, got[1])
    commit(store)
    assert epochs(store.read(A, 0)) == got[2:]
    assert store.held(A, 0) == (2, got[-1])


def test_an_event_another_session_still_wants_stays_after_one_releases_it(store):
    e1 = store.append("p~1", item(1, tick=1), [(A, [1]), (B, [5])])
    e2 = store.append("p~1", item(2, tick=2), [(A, [1])])
    commit(store)
    store.release(A, e2)
    commit(store)
    assert store.read(A, 0) == []
    assert store.read(B, 0) == [m.SessionItem(e1, "p~1", item(1, tick=1), [5])]
    assert store.held(B, 0) == (1, e1)


def test_an_event_goes_once_no_session_wants_it(store):
    e1 = store.append("p~1", item(1, tick=1), [(A, [1]), (B, [5])])
    commit(store)
    store.release(A, e1)
    commit(store)
    store.release(B, e1)
    commit(store)
    assert store.read(A, 0) == store.read(B, 0) == []
    assert store.held(A, 0) == store.held(B, 0) == (0, 0)
    if isinstance(store, SqliteSessionStore):
        assert store._query("SELECT COUNT(*) FROM events", ()) == [(0,)]
    else:
        assert store._events == {}


# -- sessions and tops ------------------------------------------------------------------------


def test_saved_sessions_come_back_from_sessions(store):
    alice, bob = state("alice", A, acked=0), state("bob", B, acked=7)
    store.save_session(alice)
    store.save_session(bob)
    commit(store)
    got = store.sessions()
    assert got == {"alice": alice, "bob": bob}
    sub = got["alice"].subs[2]
    assert sub[0] == "p2"
    assert [[type(c) for c in conj] for conj in sub[1]] == [[m.Constraint, m.Constraint], []]


def test_saving_a_session_again_replaces_it(store):
    s = state("alice", A)
    store.save_session(s)
    commit(store)
    s.acked = 5
    s.subs = {3: ("p3", [[m.Constraint("k", "eq", 1)]])}
    store.save_session(s)
    commit(store)
    got = store.sessions()["alice"]
    assert (got.acked, got.subs) == (5, {3: ("p3", [[m.Constraint("k", "eq", 1)]])})


def test_a_saved_session_is_a_copy(store):
    s = state("alice", A)
    store.save_session(s)
    s.subs[9] = ("p9", [])
    s.acked = 3
    commit(store)
    got = store.sessions()["alice"]
    assert 9 not in got.subs and got.acked == 0


def test_drop_session_forgets_it_and_what_only_it_held(store):
    alice, bob = state("alice", A), state("bob", B)
    store.save_session(alice)
    store.save_session(bob)
    e1 = store.append("p~1", item(1, tick=1), [(A, [1])])
    e2 = store.append("p~1", item(2, tick=2), [(A, [1]), (B, [1])])
    commit(store)
    store.drop_session(alice)
    commit(store)
    assert set(store.sessions()) == {"bob"}
    assert store.read(A, 0) == [] and store.held(A, 0) == (0, 0)
    assert epochs(store.read(B, 0)) == [e2]
    assert e1 < e2


def test_a_hand_over_in_progress_and_the_floors_are_kept(store):
    s = state("alice", A)
    s.handover = {"dir": "out", "to": "b1", "hid": "h", "cuts": {"p~1": 4}, "phase": "asking"}
    s.floors = {"p~1": 9}
    store.save_session(s)
    s.floors["q~1"] = 3  # a copy was kept
    commit(store)
    got = store.sessions()["alice"]
    assert got.handover == {
        "dir": "out",
        "to": "b1",
        "hid": "h",
        "cuts": {"p~1": 4},
        "phase": "asking",
    }
    assert got.floors == {"p~1": 9}
    got.handover = None
    store.save_session(got)
    commit(store)
    assert store.sessions()["alice"].handover is None


def test_the_pubends_a_hand_over_is_still_reading_are_kept_alone_too(store):
    s = state("alice", A)
    s.reading = {"p~1": 0, "q~1": 4}  # (a session served here: no hand-over, no floors)
    store.save_session(s)
    s.reading["r~1"] = 1  # a copy was kept
    commit(store)
    assert store.sessions()["alice"].reading == {"p~1": 0, "q~1": 4}
    s.reading = {}
    store.save_session(s)
    commit(store)
    assert store.sessions()["alice"].reading == {}


def test_a_sessions_expiry_is_kept(store):
    s = state("alice", A)
    s.expiry = 300.0
    store.save_session(s)
    store.save_session(state("bob", B))
    commit(store)
    got = store.sessions()
    assert (got["alice"].expiry, got["bob"].expiry) == (300.0, 0.0)


def test_a_held_will_and_its_delay_are_kept_and_so_is_its_going(store):
    will = m.Event({"@topic": "w/car", "@qos": 1, "@retain": 1}, b"gone", 123)
    s = state("alice", A)
    s.will, s.will_delay = will, 30.0
    store.save_session(s)
    store.save_session(state("bob", B))
    commit(store)
    got = store.sessions()
    assert (got["alice"].will, got["alice"].will_delay) == (will, 30.0)
    assert got["bob"].will is None
    s.will = None
    store.save_session(s)
    commit(store)
    assert store.sessions()["alice"].will is None


def test_a_store_made_before_hand_overs_opens_and_keeps_them(tmp_path):
    """A session store file from before hand-overs (no ``handover`` column) is opened as it
    is, its sessions intact, and keeps hand-overs from then on."""
    path = tmp_path / "old.db"
    s = SqliteSessionStore(path)
    s.save_session(state("alice", A, acked=2))
    commit(s)
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE sessions DROP COLUMN handover")
    conn.commit()
    conn.close()
    again = SqliteSessionStore(path)
    try:
        got = again.sessions()["alice"]
        assert got.acked == 2 and got.handover is None
        got.floors = {"p~1": 1}
        again.save_session(got)
        commit(again)
        assert again.sessions()["alice"].floors == {"p~1": 1}
    finally:
        again.close()


def test_a_save_is_durable_once_committed(store):
    """What a replicator tells another of a session's state waits until its save is durable
    (ges.core.handover): a save's mark is durable once a group holding it is committed."""
    before = store.saved
    store.save_session(state("alice", A))
    mark = store.saved
    if isinstance(store, MemorySessionStore):  # kept at once
        assert store.durable(mark)
        return
    assert mark > before and store.durable(before) and not store.durable(mark)
    group = store.take_group()
    store.save_session(state("bob", B))  # saved while the group is written: not in it
    store.committed_to(store.write_group(group))
    assert store.durable(mark) and not store.durable(store.saved)
    commit(store)
    assert store.durable(store.saved)


def test_tops_keep_each_pubends_tick(store):
    assert store.tops() == {}
    store.set_top("p~1", 5)
    store.set_top("q~2", 3)
    store.set_top("p~1", 8)
    commit(store)
    assert store.tops() == {"p~1": 8, "q~2": 3}


# -- SQLite: what a reopened file keeps -----------------------------------------------------


def test_a_reopened_store_keeps_sessions_events_tops_and_its_id(tmp_path):
    path = tmp_path / "s.db"
    s = SqliteSessionStore(path)
    store_id = s.id
    alice = state("alice", A, acked=1)
    alice.qos2, alice.rel = {3, 65535}, {1}  # its MQTT client's QoS 2 identifiers held
    s.save_session(alice)
    e1 = s.append("p~1", item(1, tick=1), [(A, [1])])
    e2 = s.append("p~1", item(2, tick=2), [(A, [1]), (B, [4])])
    s.set_top("p~1", 2)
    commit(s)
    s.close()

    again = SqliteSessionStore(path)
    try:
        assert again.id == store_id
        assert again.sessions() == {"alice": alice}
        assert again.tops() == {"p~1": 2}
        assert (again.last, again.committed) == (e2, e2)
        assert epochs(again.read(A, 0)) == [e1, e2]
        assert again.read(B, 0) == [m.SessionItem(e2, "p~1", item(2, tick=2), [4])]
    finally:
        again.close()


def test_two_store_files_have_different_ids(tmp_path):
    one, two = SqliteSessionStore(tmp_path / "1.db"), SqliteSessionStore(tmp_path / "2.db")
    try:
        assert one.id != two.id
    finally:
        one.close()
        two.close()


def test_epochs_keep_increasing_after_reopen(tmp_path):
    path = tmp_path / "s.db"
    s = SqliteSessionStore(path)
    first = s.append("p~1", item(1, tick=1), [(A, [1])])
    commit(s)
    s.close()
    s = SqliteSessionStore(path)
    second = s.append("p~1", item(2, tick=2), [(A, [1])])
    commit(s)
    s.close()
    assert second > first
    s = SqliteSessionStore(path)
    try:
        assert epochs(s.read(A, 0)) == [first, second]
    finally:
        s.close()


def test_epochs_are_never_reused_after_their_events_were_released(tmp_path):
    path = tmp_path / "s.db"
    s = SqliteSessionStore(path)
    s.save_session(state("alice", A))
    got = [s.append("p~1", item(i, tick=i), [(A, [1])]) for i in range(1, 4)]
    commit(s)
    s.release(A, got[-1])
    commit(s)
    assert s.read(A, 0) == []
    s.close()

    s = SqliteSessionStore(path)
    try:
        assert s.last == got[-1]
        e = s.append("p~1", item(9, tick=9), [(A, [1])])
        assert e > got[-1]
        commit(s)
        assert epochs(s.read(A, 0)) == [e]
    finally:
        s.close()


def test_epochs_are_never_reused_after_a_dropped_session(tmp_path):
    path = tmp_path / "s.db"
    s = SqliteSessionStore(path)
    alice = state("alice", A)
    s.save_session(alice)
    last = s.append("p~1", item(1, tick=1), [(A, [1])])
    commit(s)
    s.drop_session(alice)
    commit(s)
    s.close()
    s = SqliteSessionStore(path)
    try:
        assert s.sessions() == {}
        assert s.append("p~1", item(2, tick=2), [(B, [1])]) > last
    finally:
        s.close()


def test_sqlite_reads_nothing_before_the_group_is_committed(tmp_path):
    s = SqliteSessionStore(tmp_path / "s.db")
    try:
        e = s.append("p~1", item(1), [(A, [1])])
        assert (s.last, s.committed) == (e, 0)
        assert s.read(A, 0) == []
        group = s.take_group()
        last = s.write_group(group)
        assert last == e
        assert s.read(A, 0) == []  # written, but not yet committed_to
        s.committed_to(last)
        assert epochs(s.read(A, 0)) == [e]
    finally:
        s.close()


# -- retained messages (ges.durable.retained) ------------------------------------------------


def test_stores_keep_the_last_change_per_topic_cleared_ones_too(store, tmp_path):
    store.retain(Kept("a", 1, "p", 1, m.Event({"@topic": "a", "@retain": 1}, b"1")))
    store.retain(Kept("a", 2, "p", 2, m.Event({"@topic": "a", "@retain": 1}, b"2")))
    store.retain(Kept("b", 3, "p", 3, None))
    store.retain(Kept("c", 4, "p", 4, None))
    store.forget("c")  # its room went to another topic
    if hasattr(store, "take_group"):
        store.write_group(store.take_group())
        store.close()
        store = SqliteSessionStore(tmp_path / "s.db")  # what a restart reads
    got = sorted(store.retained(), key=lambda k: k.topic)
    assert got == [
        Kept("a", 2, "p", 2, m.Event({"@topic": "a", "@retain": 1}, b"2")),
        Kept("b", 3, "p", 3, None),
    ]
