"""The pubend log's task (ges.runtime.commits) around a checkpoint's backfill: groups go on
being committed while it runs, except when the WAL is full; releases wait for its end; and a
publish that arrives alone is not committed on the event loop's thread between its end and the
catch-up. The real task and SqliteLog, with a stand-in for the broker around them."""

from __future__ import annotations

import threading

import trio

from ges.runtime import commits
from ges.runtime.pubend_log import LogBounds, SqliteLog
from ges.wire import messages as m
from tests.waiting import wait_until


class Core:
    has_work = False

    def __init__(self) -> None:
        self.logged = 0

    def on_logged(self, now: float) -> list:
        self.logged += 1
        return []


class Server:
    """What log_task and commit_alone use of a BrokerServer."""

    def __init__(self, log: SqliteLog) -> None:
        self.pubend_log = log
        self.core = Core()
        self._log_busy = False
        self._log_wakeup = trio.Event()
        self._log_room = trio.Event()
        self._work_wakeup = trio.Event()

    def _freeze_kept(self) -> None:
        pass

    async def _dispatch(self, outs: list) -> None:
        pass


def held_backfill(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """SqliteLog.backfill made to wait, in its worker thread, until let go: (held, let_go)."""
    held, let_go = threading.Event(), threading.Event()
    real = SqliteLog.backfill

    def backfill(self) -> None:
        held.set()
        assert let_go.wait(20), "the backfill was never let go"
        real(self)

    monkeypatch.setattr(SqliteLog, "backfill", backfill)
    return held, let_go


def append(log: SqliteLog, size: int = 2_000) -> None:
    tick = log.last + 1
    log.append(tick, [m.Event({"n": tick}, b"x" * size, 5)])


def rows(log: SqliteLog) -> int:
    return log._reader.execute("SELECT COUNT(*) FROM events").fetchone()[0]


async def start(nursery, log: SqliteLog, monkeypatch):
    """The log task of a stand-in server, run until a backfill is held; the server, and the
    backfill's (held, let_go)."""
    held, let_go = held_backfill(monkeypatch)
    server = Server(log)
    nursery.start_soon(commits.log_task, server)
    while not held.is_set():  # groups of ~2 KB until the WAL's bound starts a backfill
        append(log)
        server._log_wakeup.set()
        await wait_until(lambda: not log.pending, "the group committed")
        await trio.sleep(0.001)
    return server, held, let_go


async def test_releases_wait_for_a_backfill_and_groups_do_not(tmp_path, monkeypatch):
    log = SqliteLog(tmp_path / "a.db", bounds=LogBounds(checkpoint_bytes=64 << 10))
    async with trio.open_nursery() as nursery:
        server, held, let_go = await start(nursery, log, monkeypatch)
        before = rows(log)
        log.release(log.last)
        append(log)
        server._log_wakeup.set()
        await wait_until(lambda: log.committed == log.last, "a group committed meanwhile")
        await trio.sleep(0.2)  # (time enough for a release chunk, were it let go)
        assert log.release_pending and rows(log) == before + 1
        let_go.set()
        await wait_until(lambda: not log.release_pending, "the release after the backfill")
        assert rows(log) == 1  # the last, appended after the release's tick
        nursery.cancel_scope.cancel()


async def test_groups_wait_for_the_backfill_once_the_wal_is_full(tmp_path, monkeypatch):
    log = SqliteLog(tmp_path / "a.db", bounds=LogBounds(checkpoint_bytes=64 << 10))
    async with trio.open_nursery() as nursery:
        server, held, let_go = await start(nursery, log, monkeypatch)
        while not log.wal_full:  # committed while the backfill runs, up to WAL_FULL
            append(log, 20_000)
            server._log_wakeup.set()
            await wait_until(lambda: not log.pending, "the group committed")
        append(log)
        server._log_wakeup.set()
        await trio.sleep(0.2)
        assert log.committed < log.last  # it waits
        let_go.set()
        await wait_until(lambda: log.committed == log.last, "the group after the backfill")
        assert not log.wal_full and not log.checkpoint_due  # caught up
        nursery.cancel_scope.cancel()


async def test_a_lone_publish_is_left_to_the_task_between_a_backfill_and_its_catch_up(
    tmp_path,
):
    """commit_alone commits a lone group on the event loop's thread; not once the backfill
    has ended (that commit would start the WAL over, and its fsync would fall on the loop)
    nor while the WAL is full (the group waits for the backfill)."""
    log = SqliteLog(tmp_path / "a.db", bounds=LogBounds(checkpoint_bytes=64 << 10))
    server = Server(log)
    append(log, 100)
    assert commits.commit_alone(server) == [] and log.committed == log.last  # committed inline
    while not log.backfill_due:
        append(log)
        log.committed_to(log.write_group(log.take_group()))
    log.start_backfill()
    while not log.wal_full:
        append(log, 20_000)
        log.committed_to(log.write_group(log.take_group()))
    append(log, 100)
    assert commits.commit_alone(server) is None and log.pending  # full: the task's, later
    log.backfill()
    assert log.checkpoint_due
    assert commits.commit_alone(server) is None and log.pending  # the catch-up first
    log.checkpoint()
    assert commits.commit_alone(server) == [] and not log.pending
    log.close()
