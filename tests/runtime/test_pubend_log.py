"""The pubend's SQLite log: its side of where it differs from MemoryLog (group commit, a new
epoch at each start, whole batches released and trimmed), its file, and a broker using it. The
contract the two share is tested against both in tests/reliable/test_log_contract.py."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from contextlib import asynccontextmanager

import pytest
import trio

from ges.client import connect
from ges.core import BrokerConfig
from ges.reliable.log import MAX_EARLIER
from ges.runtime import BrokerServer
from ges.runtime.pubend_log import LogBounds, SqliteLog
from ges.runtime.up import wait_ready
from ges.wire import messages as m
from tests.conftest import receive
from tests.waiting import wait_until


def ev(n: int) -> m.Event:
    return m.Event({"n": n}, b"x" * n, 5)


@asynccontextmanager
async def chain_with_logs(chain3, data_dir, config=None, bounds=None):
    """chain3's brokers logging in ``data_dir``: a subscriber client at b3 (subscribed to every
    event with ``n``) and a publisher client at b1."""
    async with trio.open_nursery() as nursery:
        for bid in chain3.brokers:
            server = BrokerServer(chain3, bid, data_dir=data_dir, config=config, log_bounds=bounds)
            await nursery.start(server.run)
        await wait_ready(chain3, timeout=10)
        s1, s3 = chain3.brokers["b1"], chain3.brokers["b3"]
        async with (
            connect(s3.host, s3.port, topology="chain3") as sub_client,
            connect(s1.host, s1.port, topology="chain3") as pub_client,
        ):
            sub = await sub_client.subscribe([m.Constraint("n", ">=", 0)])
            yield sub, pub_client
        nursery.cancel_scope.cancel()


def thirty() -> list[m.Event]:
    return [m.Event({"n": i}, b"", time.time_ns()) for i in range(30)]


def test_appends_are_committed_by_the_group_and_read_back(tmp_path):
    # group commit: the core holds a publish's acknowledgement until committed covers it
    # (MemoryLog is durable as soon as appended)
    log = SqliteLog(tmp_path / "b1.pubend.db")
    assert (log.epoch, log.last, log.committed, log.previous) == (1, 0, 0, None)
    log.append(1, [ev(1), ev(2)])
    log.append(3, [ev(3)])
    assert (log.last, log.committed) == (3, 0)  # appended, not yet durable
    group = log.take_group()
    assert [(a, b) for a, b, _, _ in group] == [(1, 2), (3, 3)] and not log.pending
    last = log.write_group(group)
    assert log.committed == 0  # written, not yet told: still not read
    assert log.read(1, 3) == [] and log.read_epoch(log.epoch, 1, 3) == []
    log.committed_to(last)
    assert log.committed == 3
    assert log.read(2, 10) == [(2, ev(2)), (3, ev(3))]
    assert log.read(1, 3, limit=1) == [(1, ev(1))]
    assert log.read(2, 2) == [(2, ev(2))]  # inside a batch
    log.close()


def test_a_restart_opens_a_new_epoch_and_keeps_the_committed_events_of_the_old(tmp_path):
    # a new stream per start: appended ticks not committed before a crash were never
    # acknowledged nor sent, so they were not published (the simulator's log does the same:
    # ges.sim.commits.EpochLog)
    path = tmp_path / "b1.pubend.db"
    log = SqliteLog(path)
    log.append(1, [ev(1), ev(2)])
    log.committed_to(log.write_group(log.take_group()))
    log.append(3, [ev(3)])  # appended but never committed: never published
    log.close()
    again = SqliteLog(path)
    assert (again.epoch, again.last) == (2, 0)
    assert again.previous == (1, 2)  # announced after the restart
    assert again.read_epoch(1, 1, 10) == [(1, ev(1)), (2, ev(2))]
    assert again.read(1, 10) == []
    again.close()
    third = SqliteLog(path)  # the previous epoch is the one just before, which logged nothing
    assert (third.epoch, third.previous) == (3, None)
    # but epoch 1's end is still announced: epoch 2 may not have lived to announce it
    assert third.earlier == [(1, 2)] and third.ended(2) == 0 and third.ended(1) == 2
    third.close()


def test_an_emptied_epoch_of_a_file_from_before_ends_were_kept_has_ended_all_the_same(tmp_path):
    # a file whose earlier epochs ended before their ends were recorded: what was released
    # (or trimmed) of one that has no row left is where it ended, not "lost from there on"
    path = tmp_path / "b1.pubend.db"
    for _ in range(2):
        log = SqliteLog(path)
        log.append(1, [ev(1), ev(2), ev(3)])
        log.committed_to(log.write_group(log.take_group()))
        log.release(3)
        while log.release_pending:
            log.apply_release()
        log._reader.execute("DELETE FROM meta WHERE key LIKE 'end:%'")  # as it was then
        log.close()
    log = SqliteLog(path)  # the first start since: records epoch 2's end only
    assert log.released(1) == 3 and log.ended(2) == 3
    assert log.ended(1) == 3 and log.lowest(1) == 4
    log.close()


def test_every_earlier_epoch_still_held_is_named_newest_first_up_to_a_bound(tmp_path):
    path = tmp_path / "b1.pubend.db"
    for _ in range(MAX_EARLIER + 2):
        log = SqliteLog(path)
        log.append(1, [ev(log.epoch)])
        log.committed_to(log.write_group(log.take_group()))
        log.close()
    log = SqliteLog(path)
    n = log.epoch - 1
    assert log.earlier == [(e, 1) for e in range(n, n - MAX_EARLIER, -1)]
    log.close()


def test_the_bound_drops_whole_batches_oldest_first_and_lowest_says_where_the_log_starts(
    tmp_path,
):
    bounds = LogBounds(max_events=5, trim_every=1)
    path = tmp_path / "b1.pubend.db"
    log = SqliteLog(path, bounds=bounds)
    assert log.lowest() == 1  # nothing committed: nothing dropped
    log.append(1, [ev(1), ev(2)])
    log.committed_to(log.write_group(log.take_group()))
    log.close()
    log = SqliteLog(path, bounds=bounds)  # epoch 2
    assert log.lowest(1) == 1
    for first in (1, 3, 5):
        log.append(first, [ev(first), ev(first + 1)])
        log.committed_to(log.write_group(log.take_group()))
        while log.trim_pending:  # what the log task does after a group
            log.trim()
    # 8 events in all, 5 kept: epoch 1's batch and epoch 2's first went, whole; epoch 1 is
    # known to have ended at 2, so a nack for it is answered as lost up to there, silence after
    assert log.lowest(1) == 3 and log.ended(1) == 2 and log.lowest() == 3
    assert log.read(1, 10) == [(t, ev(t)) for t in range(3, 7)]
    log.close()


def test_the_file_is_in_wal_mode_and_strict_syncs_every_commit(tmp_path):
    log = SqliteLog(tmp_path / "a.db", strict=True)
    conn = sqlite3.connect(tmp_path / "a.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert log._reader.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert SqliteLog(tmp_path / "b.db")._reader.execute("PRAGMA synchronous").fetchone()[0] == 1
    conn.close()


def test_small_groups_may_be_committed_inline_and_strict_or_large_ones_may_not(tmp_path):
    import ges.runtime.pubend_log as pl

    log = SqliteLog(tmp_path / "a.db")
    log.append(1, [ev(10)])
    assert log.inline(log.take_group())  # one small event: a WAL write, no fsync
    big = [m.Event({"n": i}, b"x" * 1_000, 5) for i in range(pl.INLINE_MAX_BYTES // 1_000 + 1)]
    log.append(2, big)
    assert not log.inline(log.take_group())  # too large for the event loop's thread
    for i in range(pl.INLINE_MAX_ROWS + 1):  # small, but rows enough to take some ms
        log.append(100 + i, [ev(i)])
    assert not log.inline(log.take_group())
    strict = SqliteLog(tmp_path / "b.db", strict=True)
    strict.append(1, [ev(1)])
    assert not strict.inline(strict.take_group())  # an fsync
    log.close()
    strict.close()


def test_the_wal_is_checkpointed_by_the_log_task_not_inside_a_commit(tmp_path, monkeypatch):
    from ges.runtime.wal import CHECKPOINT_BYTES

    path = tmp_path / "a.db"
    wal = tmp_path / "a.db-wal"
    log = SqliteLog(path)
    assert log._reader.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    tick = 1

    def commit(n: int, size: int = 4_000) -> None:
        nonlocal tick
        events = [m.Event({"n": i}, b"x" * size, 5) for i in range(n)]
        log.append(tick, events)
        log.committed_to(log.write_group(log.take_group()))
        tick += len(events)

    while not log.backfill_due:
        assert not log.checkpoint_due
        commit(64)
    grown = wal.stat().st_size
    assert grown >= CHECKPOINT_BYTES  # no commit checkpointed on its own

    def restarts() -> int:  # the WAL header's checkpoint sequence: +1 each time it starts over
        return int.from_bytes(wal.read_bytes()[12:16], "big")

    before = restarts()
    # the backfill copies the WAL from a connection of its own (the log task runs it in a
    # worker thread and goes on committing): it does not start the WAL over
    log.start_backfill()
    assert not log.backfill_due and not log.checkpoint_due
    log.backfill()
    assert log.checkpoint_due and restarts() == before
    log.checkpoint()  # the catch-up
    assert not log.checkpoint_due and not log.backfill_due
    # the WAL started over inside checkpoint(), in its worker thread: the fsync of its new
    # header is not left to the next commit, which may run on the event loop's thread
    assert restarts() == before + 1
    log.append(tick, [ev(1)])
    log.committed_to(log.write_group(log.take_group()))
    assert restarts() == before + 1 and wal.stat().st_size == grown  # reused, not grown
    assert log.read(tick, tick) == [(tick, ev(1))] and log.read(1, 1)[0][0] == 1
    log.close()
    assert log._backfiller is None


def test_a_release_deletes_in_chunks_and_counts_as_released_at_once(tmp_path):
    log = SqliteLog(tmp_path / "a.db", bounds=LogBounds(release_chunk=2))
    for t in range(1, 6):
        log.append(t, [ev(t)])
        log.committed_to(log.write_group(log.take_group()))
    log.release(4)
    assert log.released() == 4  # nobody needs them any more, deleted or not
    log.apply_release()
    # recorded with the first chunk: after a crash in between, a nack for a tick deleted so far
    # is answered "nothing for you", not as lost
    row = log._reader.execute("SELECT value FROM meta WHERE key = 'released:1'").fetchone()
    assert row == (4,) and log.release_pending
    rounds = 1
    while log.release_pending:
        log.apply_release()
        rounds += 1
    # 2 + 2 batches, and a third round that finds none (a full chunk may not be the last)
    assert rounds == 3 and log.read(1, 10) == [(5, ev(5))]
    log.close()
    assert SqliteLog(tmp_path / "a.db").released(1) == 4  # recorded with the first chunk


def test_an_earlier_epochs_release_goes_in_chunks_after_this_epochs(tmp_path):
    path = tmp_path / "a.db"
    log = SqliteLog(path)
    for t in range(1, 6):
        log.append(t, [ev(t)])
        log.committed_to(log.write_group(log.take_group()))
    log.close()
    log = SqliteLog(path, bounds=LogBounds(release_chunk=2))
    log.append(1, [ev(1)])
    log.committed_to(log.write_group(log.take_group()))
    assert log.earlier == [(1, 5)]
    log.release(5, 1)
    log.release(1)
    assert log.released(1) == 5 and log.earlier == [] and log.release_pending
    log.apply_release()  # this epoch's first
    assert log.read(1, 1) == [] and len(log.read_epoch(1, 1, 9)) == 5
    while log.release_pending:
        log.apply_release()
    assert log.read_epoch(1, 1, 9) == []
    log.release(99, 7)  # an epoch the file never had: nothing
    assert not log.release_pending and log.released(7) == 0
    log.close()
    again = SqliteLog(path)
    assert again.released(1) == 5 and again.ended(1) == 5 and again.earlier == []
    again.close()


def _three_batches(path, bounds) -> SqliteLog:
    """The file opened for its next epoch, with three batches of one event committed in it."""
    log = SqliteLog(path, bounds=bounds)
    for t in range(1, 4):
        log.append(t, [ev(t)])
        log.committed_to(log.write_group(log.take_group()))
    return log


def test_a_release_a_crash_cut_short_goes_on_at_the_next_start(tmp_path):
    # a review's find: the mark goes with the first chunk, so the file showed epoch 1 released
    # to its end, named it no more, and kept its other rows for good
    path, bounds = tmp_path / "b1.pubend.db", LogBounds(release_chunk=1)
    _three_batches(path, bounds).close()
    log = SqliteLog(path, bounds=bounds)
    log.release(3, 1)
    log.apply_release()  # one batch of three deleted, and the broker dies
    log.close()
    log = SqliteLog(path, bounds=bounds)
    assert log.earlier == [] and log.released(1) == 3 and log.release_pending
    while log.release_pending:
        log.apply_release()
    assert log.read_epoch(1, 1, 10) == []
    log.close()


def test_epochs_released_to_their_end_do_not_crowd_an_unreleased_one_out_of_earlier(tmp_path):
    # a review's find: the bound of eight was applied before what was released was left out
    path, bounds = tmp_path / "b1.pubend.db", LogBounds(release_chunk=1)
    for _ in range(MAX_EARLIER + 1):
        _three_batches(path, bounds).close()  # epochs 1..9, three batches each
    db = sqlite3.connect(path)  # 2..9 released to their end, their rows not yet deleted
    db.executemany("INSERT INTO meta VALUES (?, 3)", [(f"released:{e}",) for e in range(2, 10)])
    db.commit()
    db.close()
    log = SqliteLog(path, bounds=bounds)
    assert log.earlier == [(1, 3)] and log.release_pending
    while log.release_pending:
        log.apply_release()
    assert [e for e in range(1, 10) if log.read_epoch(e, 1, 9)] == [1]
    log.close()


def test_acknowledgements_a_broker_says_it_holds_no_more_are_forgotten_on_disk(tmp_path):
    path = tmp_path / "b3.pubend.db"
    log = SqliteLog(path)
    for pubend in ("b1~1", "b1~2", "b1~5", "b2~1"):
        assert log.promise(pubend, 7)
    log.forget_promises("b1", 5)
    assert log.promised() == {"b1~5": 7, "b2~1": 7}
    log.close()
    assert SqliteLog(path).promised() == {"b1~5": 7, "b2~1": 7}


def test_a_file_with_one_acknowledgement_per_broker_keeps_them_by_pubend(tmp_path):
    # the promises table of a file from before earlier epochs were released
    path = tmp_path / "b3.pubend.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE promises (broker TEXT PRIMARY KEY, pubend TEXT, tick INTEGER)")
    db.executemany("INSERT INTO promises VALUES (?, ?, ?)", [("b1", "b1~4", 7), ("b2", "b2~1", 3)])
    db.commit()
    db.close()
    log = SqliteLog(path)
    assert log.promised() == {"b1~4": 7, "b2~1": 3}
    assert log.promise("b1~3", 9)
    log.close()
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert "promises" not in tables
    assert SqliteLog(path).promised() == {"b1~4": 7, "b2~1": 3, "b1~3": 9}


def test_an_sqlite_failure_while_writing_is_one_error_naming_the_file(tmp_path):
    from ges.errors import OperationError

    log = SqliteLog(tmp_path / "a.db")
    log.append(1, [ev(1)])
    log.committed_to(log.write_group(log.take_group()))
    # a full disk: SQLite rolls the transaction back itself, and that error is the one told
    log._writer.execute("PRAGMA max_page_count = 1")
    log.append(2, [m.Event({"n": 2}, b"x" * 20_000, 5)])
    with pytest.raises(OperationError, match=r"a\.db: .*full"):
        log.write_group(log.take_group())
    log._writer.close()  # a connection that fails every statement
    log.append(3, [ev(3)])
    for attempt in (lambda: log.write_group(log.take_group()), log.checkpoint):
        with pytest.raises(OperationError, match=r"a\.db"):
            attempt()


async def test_a_publishing_broker_keeps_its_wal_bounded(chain3, tmp_path):
    bounds = LogBounds(checkpoint_bytes=64 << 10)
    async with chain_with_logs(chain3, tmp_path, bounds=bounds) as (sub, pub_client):
        payload = b"x" * 2_000
        for i in range(200):  # single events: each commits inline, ~6 KB of WAL apiece
            await pub_client.publish([m.Event({"n": i}, payload, time.time_ns())])
        await receive(sub, 200, within=10)
        size = (tmp_path / "b1.pubend.db-wal").stat().st_size
    # 200 commits wrote over 1 MB to the WAL; checkpoints every 64 KB let it start over (it
    # grows while a backfill runs, up to WAL_FULL times the bound, besides what the file's
    # creation wrote, which is not counted)
    assert size < 512 << 10, size


def test_groups_wait_for_a_backfill_once_the_wal_is_full(tmp_path):
    """While a backfill runs the WAL grows by what is committed; at WAL_FULL times its bound
    the log says so (the log task and commit_alone then write no group until it ends)."""
    from ges.runtime.wal import WAL_FULL

    log = SqliteLog(tmp_path / "a.db", bounds=LogBounds(checkpoint_bytes=64 << 10))
    tick = 1
    while not log.backfill_due:
        log.append(tick, [ev(100)])
        log.committed_to(log.write_group(log.take_group()))
        tick += 1
    log.start_backfill()
    while not log.wal_full:
        assert log._wal < WAL_FULL * (64 << 10)
        log.append(tick, [ev(100)])
        log.committed_to(log.write_group(log.take_group()))
        tick += 1
    log.backfill()
    assert log.wal_full and log.checkpoint_due  # (until the catch-up)
    log.checkpoint()
    assert not log.wal_full and not log.checkpoint_due and not log.backfill_due
    assert log.read(tick - 1, tick - 1) == [(tick - 1, ev(100))]
    log.close()


async def test_groups_go_on_being_committed_while_the_wal_is_backfilled(
    chain3, tmp_path, monkeypatch
):
    """The log task starts a checkpoint's backfill in a worker thread and goes on committing
    groups meanwhile (ges.runtime.wal): events published while the backfill is held are
    delivered, and once it ends the task catches up and the WAL starts over."""
    import threading

    held, let_go, caught_up = threading.Event(), threading.Event(), []
    real_backfill, real_checkpoint = SqliteLog.backfill, SqliteLog.checkpoint

    def backfill(self) -> None:
        held.set()
        assert let_go.wait(20), "the backfill was never let go"
        real_backfill(self)

    def checkpoint(self) -> None:
        caught_up.append(self._backfilled)
        real_checkpoint(self)

    monkeypatch.setattr(SqliteLog, "backfill", backfill)
    monkeypatch.setattr(SqliteLog, "checkpoint", checkpoint)
    bounds = LogBounds(checkpoint_bytes=256 << 10)
    async with chain_with_logs(chain3, tmp_path, bounds=bounds) as (sub, pub_client):
        n = 0
        while not held.is_set():  # single events, ~6 KB of WAL apiece
            await pub_client.publish([m.Event({"n": n}, b"x" * 2_000, time.time_ns())])
            n += 1
            assert n < 1_000, "no backfill started"
        await receive(sub, n, within=10)
        for i in range(n, n + 30):  # committed and delivered while the backfill is held
            await pub_client.publish([m.Event({"n": i}, b"x", time.time_ns())])
        got = await receive(sub, 30, within=10)  # (~250 KB of WAL: not yet WAL_FULL)
        assert [d.event.attributes["n"] for d in got] == list(range(n, n + 30))
        assert caught_up == []  # no checkpoint on the writer while the backfill runs
        let_go.set()
        await wait_until(lambda: caught_up, "the catch-up after the backfill")
        assert caught_up[0] is True  # the catch-up came after the backfill
        wal = tmp_path / "b1.pubend.db-wal"
        restarts = lambda: int.from_bytes(wal.read_bytes()[12:16], "big")  # noqa: E731
        await wait_until(lambda: restarts() > 0, "the WAL started over")


def test_a_trim_goes_a_chunk_at_a_time_until_the_log_is_within_its_bound(tmp_path):
    bounds = LogBounds(max_events=3, trim_every=10, release_chunk=2)
    log = SqliteLog(tmp_path / "a.db", bounds=bounds)
    for t in range(1, 11):
        log.append(t, [ev(t)])
        log.committed_to(log.write_group(log.take_group()))
        assert log.trim_pending == (t == 10)  # looked at every TRIM_EVERY events, not each
    rounds = 0
    while log.trim_pending:
        log.trim()
        rounds += 1
    assert rounds == 4 and log.lowest() == 8  # 7 batches went, 2 per transaction
    log.close()


def test_a_read_far_into_an_epoch_costs_what_a_read_at_its_start_does(tmp_path):
    """A read (a nack's repair, a read-back's step) starts at the batch holding its first
    tick, found on the key: it did walk every batch of the epoch below it, 16 ms a read at the
    end of 300,000 events, on the event loop's thread."""
    log = SqliteLog(tmp_path / "a.db")
    for t in range(1, 6_001, 2):  # 3,000 batches of two events
        log.append(t, [ev(1), ev(2)])
    log.committed_to(log.write_group(log.take_group()))
    steps = []

    def cost(lo: int) -> int:  # the SQLite VM's steps, in tens
        steps.clear()
        log._reader.set_progress_handler(lambda: steps.append(1) and 0, 10)
        got = log.read_epoch(log.epoch, lo, lo + 9, 10)
        log._reader.set_progress_handler(None, 0)
        assert [tick for tick, _ in got] == list(range(lo, lo + 10))
        return len(steps)

    at_start, far = cost(1), cost(5_990)
    assert far <= 2 * at_start + 10, (at_start, far)
    assert [t for t, _ in log.read_epoch(log.epoch, 4, 6, 10)] == [4, 5, 6]  # mid-batch
    log.close()


def test_a_trim_under_the_bound_reads_the_key_only(tmp_path):
    """Each TRIM_EVERY events the log looks at its bound: from the key alone (a seek or two
    per epoch, never a scan of the events) while what it holds is under it."""
    path = tmp_path / "a.db"
    log = SqliteLog(path)
    for t in range(1, 8, 2):  # epoch 1: ticks 1-8 in batches of two
        log.append(t, [ev(t), ev(t + 1)])
        log.committed_to(log.write_group(log.take_group()))
    log.close()
    log = SqliteLog(path, bounds=LogBounds(max_events=100, trim_every=4))
    for t in range(1, 5):  # epoch 2: ticks 1-4, the first two released
        log.append(t, [ev(t)])
        log.committed_to(log.write_group(log.take_group()))
    log.release(2)
    while log.release_pending:
        log.apply_release()
    w = log._writer
    held = w.execute("SELECT SUM(last - first + 1) FROM events").fetchone()[0]
    assert held == 10 and SqliteLog._held_at_most(w) == 10
    w.execute("DELETE FROM events WHERE epoch = 1 AND first = 3")  # (a hole: counted high)
    assert SqliteLog._held_at_most(w) == 10
    statements: list[str] = []
    w.set_trace_callback(statements.append)
    assert log.trim_pending
    log.trim()
    w.set_trace_callback(None)
    assert not log.trim_pending and statements
    for sql in statements:
        plan = " ".join(row[3] for row in w.execute("EXPLAIN QUERY PLAN " + sql))
        assert "SCAN events" not in plan, (sql, plan)
    log.close()


def test_a_release_chunk_is_weighed_in_bytes_and_sized_from_the_last_ones_time(
    tmp_path, monkeypatch
):
    """A release (or trim) transaction deletes the first batches that reach its budget of
    bytes (their bodies, and ROW_WEIGHT each), the budget sized from the
    last one's time per byte to take DELETE_SECONDS, at most twice the last, from
    MIN_DELETE_BYTES up: the log's groups wait for one at most, a burst's large batches as a
    trickle's small ones."""
    import ges.runtime.pubend_log as pl

    log = SqliteLog(tmp_path / "a.db", bounds=LogBounds(release_chunk=1_000))
    for t in range(1, 3_001):
        log.append(t, [m.Event({"n": 0}, b"x" * 1_000, 5)])
    log.committed_to(log.write_group(log.take_group()))
    log.release(3_000)
    weights = {w for (w,) in log._reader.execute("SELECT length(body) FROM events")}
    assert len(weights) == 1
    weight = weights.pop() + pl.ROW_WEIGHT
    took = []  # what the clock says as a transaction starts, and as it ends
    monkeypatch.setattr(pl, "perf_counter", lambda: took.pop(0) if took else 0.0)
    held = [3_000]

    def release(seconds: float) -> int:
        """Apply one chunk that takes ``seconds``; the bytes it deleted (as weighed)."""
        budget, most = log._budget, max(64, 2 * log._rows)
        took[:] = [0.0, seconds]
        log.apply_release()
        (now,) = log._reader.execute("SELECT COUNT(*) FROM events").fetchone()
        gone, held[0] = held[0] - now, now
        # the first that reach it, of at most twice as many as the last took
        assert gone * weight < budget + weight and (gone * weight >= budget or gone == most)
        return gone * weight

    release(0.25)  # slow: 50 times DELETE_SECONDS
    assert log._budget == pl.MIN_DELETE_BYTES
    release(1e-5)  # fast: twice as much, no more
    assert log._budget == 2 * pl.MIN_DELETE_BYTES
    release(1e-5)
    assert log._budget == 4 * pl.MIN_DELETE_BYTES
    gone = release(0.05)  # ten times over: a tenth of what it deleted
    assert log._budget == max(pl.MIN_DELETE_BYTES, int(gone * pl.DELETE_SECONDS / 0.05))
    while log.release_pending:
        took[:] = [0.0, 1e-5]
        log.apply_release()
    assert log._reader.execute("SELECT COUNT(*) FROM events").fetchone() == (0,)
    log.close()


def test_a_release_chunk_of_large_batches_holds_fewer_of_them(tmp_path):
    log = SqliteLog(tmp_path / "a.db")
    for t in range(1, 21):  # a trickle of small batches, then ten of about 100 KB
        log.append(t, [m.Event({"n": t}, b"x" * 100, 5)])
        log.committed_to(log.write_group(log.take_group()))
    for t in range(21, 31):
        log.append(t, [m.Event({"n": t}, b"x" * 100_000, 5)])
        log.committed_to(log.write_group(log.take_group()))
    log.release(30)
    assert log._budget == 256 << 10
    log.apply_release()  # the small ones and three large ones reach 256 KB
    assert log.lowest() == 24
    while log.release_pending:
        log.apply_release()
    assert log.lowest() == 31
    log.close()


def test_a_release_between_two_trim_chunks_does_not_make_the_trim_go_below_the_bound(tmp_path):
    """The trim counts what is over the bound once, then deletes a chunk at a time; a release
    landing between two chunks deletes events that count was made with. (A review found the
    trim then deleted that many more of the oldest unreleased events: 20 held of a bound of
    50, ticks 51-80 lost.)"""
    bounds = LogBounds(max_events=50, trim_every=100, release_chunk=10)
    log = SqliteLog(tmp_path / "a.db", bounds=bounds)
    for t in range(1, 101):
        log.append(t, [ev(1)])
        log.committed_to(log.write_group(log.take_group()))
    assert log.trim_pending
    log.trim()  # a first chunk: ticks 1-10
    assert log.lowest() == 11 and log.trim_pending
    log.release(40)
    while log.release_pending:
        log.apply_release()
    while log.trim_pending:
        log.trim()
    held = log._reader.execute("SELECT SUM(last - first + 1) FROM events").fetchone()[0]
    assert held == 50 and log.lowest() == 51
    log.close()


async def test_a_broker_keeps_its_log_within_the_bound(chain3, tmp_path):
    bounds = LogBounds(max_events=40, trim_every=10)
    no_release = BrokerConfig(ack_every=3600.0)  # no release: only the bound trims
    async with chain_with_logs(chain3, tmp_path, no_release, bounds) as (sub, pub_client):
        for i in range(100):
            await pub_client.publish([m.Event({"n": i}, b"", time.time_ns())])
        await receive(sub, 100, within=10)

        def held() -> int:
            with contextlib.closing(sqlite3.connect(tmp_path / "b1.pubend.db")) as db:
                return db.execute("SELECT SUM(last - first + 1) FROM events").fetchone()[0]

        # the log task trims after the last group
        await wait_until(lambda: held() < 50, "the log task to trim the log to its bound")
        assert held() >= 40


def test_answers_to_nacks_read_within_bounds_and_fail_as_one_error(tmp_path):
    from ges.errors import OperationError

    path = tmp_path / "a.db"
    log = SqliteLog(path)
    log.append(1, [ev(1), ev(2), ev(3)])
    log.committed_to(log.write_group(log.take_group()))
    log.close()
    log = SqliteLog(path)  # epoch 2
    assert log.read_epoch(1, 1, 3, limit=2) == [(1, ev(1)), (2, ev(2))]
    # a nack may name any epoch: one that does not exist yet is not remembered
    for epoch in range(3, 1_000):
        assert log.released(epoch) == 0
    assert log.released(1) == 0 and set(log._old_released) == {1}
    log._reader.close()
    for read in (lambda: log.read_epoch(1, 1, 3), lambda: log.lowest(1)):
        with pytest.raises(OperationError, match=r"a\.db"):
            read()


async def test_a_broker_with_a_data_dir_logs_before_it_acknowledges(chain3, tmp_path):
    async with chain_with_logs(chain3, tmp_path) as (sub, pub_client):
        ack = await pub_client.publish(thirty())
        assert ack.pubend == "b1~1" and (ack.first_tick, ack.last_tick) == (1, 30)
        # acknowledged: on disk, in the file the broker keeps in its data directory
        rows = sqlite3.connect(tmp_path / "b1.pubend.db").execute(
            "SELECT SUM(last - first + 1) FROM events WHERE epoch = 1"
        )
        assert rows.fetchone()[0] == 30
        got = await receive(sub, 30)
        assert [d.event.attributes["n"] for d in got] == list(range(30))


def test_released_batches_are_deleted_and_remembered_per_epoch(tmp_path):
    path = tmp_path / "b1.pubend.db"
    log = SqliteLog(path)
    for first in (1, 4):
        log.append(first, [ev(first), ev(first + 1), ev(first + 2)])
        log.committed_to(log.write_group(log.take_group()))
    log.release(5)  # inside the second batch: only the first goes
    # released as soon as asked (the rows go from the log task's thread later)
    assert log.release_pending and log.released() == 5 and log.lowest() == 1
    log.apply_release()
    assert not log.release_pending and log.released() == 5
    assert log.lowest() == 4 and log.read(1, 10)[0][0] == 4
    log.release(99)  # never past what is committed
    log.apply_release()
    assert log.released() == 6 and log.read(1, 10) == []
    log.close()
    again = SqliteLog(path)
    assert again.released(1) == 6 and again.released() == 0
    # nothing of epoch 1 is left, and it is known to have ended where it was released: a
    # nack past that is answered with silence, not as lost (it used to be: no row said where
    # epoch 1 ended)
    assert again.earlier == [] and again.previous is None
    assert again.ended(1) == 6 and again.lowest(1) == 7
    again.close()


async def test_a_broker_releases_its_log_once_every_other_broker_acknowledged(
    chain3, tmp_path, monkeypatch
):
    async with chain_with_logs(chain3, tmp_path, BrokerConfig(ack_every=0.2)) as (sub, pub_client):
        await pub_client.publish(thirty())
        await receive(sub, 30, within=5)
        with trio.fail_after(10):
            while (await pub_client.stats()).log_released < 30:
                await trio.sleep(0.1)
        # the log task deletes what was released right after (in a worker thread)
        db = sqlite3.connect(tmp_path / "b1.pubend.db")
        with trio.fail_after(5):
            while db.execute("SELECT COUNT(*) FROM events WHERE epoch = 1").fetchone()[0]:
                await trio.sleep(0.05)


async def test_a_restarted_broker_releases_its_earlier_epoch_once_every_broker_has_it(
    chain3, tmp_path
):
    path = tmp_path / "b1.pubend.db"
    old = SqliteLog(path)  # what b1 logged before it crashed
    old.append(1, [ev(1), ev(2), ev(3)])
    old.committed_to(old.write_group(old.take_group()))
    old.close()
    async with chain_with_logs(chain3, tmp_path, BrokerConfig(ack_every=0.2)) as (sub, pub_client):
        await pub_client.publish(thirty())  # the new epoch goes on as before
        await receive(sub, 30, within=5)
        db = sqlite3.connect(path)
        with trio.fail_after(10):
            while db.execute("SELECT COUNT(*) FROM events WHERE epoch = 1").fetchone()[0]:
                await trio.sleep(0.05)
        assert db.execute("SELECT value FROM meta WHERE key = 'released:1'").fetchone() == (3,)
        for other in ("b2", "b3"):  # each kept its acknowledgement of it before it answered
            kept = sqlite3.connect(tmp_path / f"{other}.pubend.db").execute(
                "SELECT tick FROM pubend_promises WHERE pubend = 'b1~1'"
            )
            assert kept.fetchone() == (3,)
    again = SqliteLog(path)
    assert [e for e, _ in again.earlier] == [2] and again.released(1) == again.ended(1) == 3
    again.close()
