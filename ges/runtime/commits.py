"""Group commit in the broker's runtime: the pubend log's task and the session store's.

Each store appends in memory at once (the core's call) and is written a group at a time:
everything appended since the last group in one transaction — on the event loop's thread when
small, else from a worker thread — after which the core goes on with what became durable
(acknowledging publishers and sending events on; streaming sessions). A task sleeps until
``BrokerServer._logged_later`` wakes it.
"""

from __future__ import annotations

import trio


async def _commit_group(store) -> None:
    """Group commit: everything appended since the last group, in one transaction — on the
    event loop's thread when small (a write to the WAL), else from a worker thread — then
    durable as far as it went (the pubend log and the session store alike)."""
    group = store.take_group()
    if store.inline(group):
        last = store.write_group(group)
    else:
        last = await trio.to_thread.run_sync(store.write_group, group)
    store.committed_to(last)


def commit_alone(server) -> list | None:
    """Commit the pubend log's pending group right away, on the event loop's thread, when it
    arrived alone: the log task is idle (no group, checkpoint, release or trim of its own in
    progress — they share the writer), the group is small enough to write inline, and no other
    task is ready to run (none could add to the group in this turn of the scheduler). Returns
    the core's outputs for what became durable, or None when the log task is left to it.

    An event that arrives alone then goes out without a scheduler hop to the log task (at
    1,000 events/s that hop was ~90 µs of a ~290 µs path through the broker), while a burst
    from several connections still forms one group (seed 001 §4)."""
    log = server.pubend_log
    if log is None or not log.pending or server._log_busy:
        return None
    if log.checkpoint_due or log.wal_full:  # (the log task catches up first, or waits)
        return None
    if trio.lowlevel.current_statistics().tasks_runnable:
        return None
    if not log.inline(log.appended):
        return None
    log.committed_to(log.write_group(log.take_group()))
    return _logged(server)


def _logged(server) -> list:
    """The log committed more: the core's outputs for a slice of it (acknowledgements, events
    sent on; the rest is the core's own job, ``BrokerServer._worker``), and publishes paused
    for the log may go on."""
    outs = server.core.on_logged(trio.current_time())
    server._freeze_kept()  # (retained messages it took)
    server._log_room.set()
    if server.core.has_work:  # the rest of a large group, a slice at a time
        server._work_wakeup.set()
    return outs


class Backfills:
    """The backfills of one store's WAL (ges.runtime.wal), each in a worker thread beside
    its task's commits, in ``nursery`` (the store is not closed while one runs); ``wake()``
    tells the task when one ended and the catch-up is due."""

    def __init__(self, nursery: trio.Nursery, store, wake) -> None:
        self.nursery, self.store, self.wake = nursery, store, wake
        self.ended = trio.Event()
        self.ended.set()

    def start(self) -> None:
        """Start a backfill if one is due."""
        if self.store.backfill_due:
            self.store.start_backfill()
            self.ended = trio.Event()
            self.nursery.start_soon(self._run, self.ended)

    async def _run(self, ended: trio.Event) -> None:
        try:
            await trio.to_thread.run_sync(self.store.backfill)
        finally:
            ended.set()
        self.wake()


def deletes_due(log) -> bool:
    """A release or trim chunk is due and may go now (no backfill under way: one wakes the log
    task as it ends)."""
    return (log.release_pending or log.trim_pending) and not log.backfilling


async def log_task(server) -> None:
    """The pubend log of ``server`` (a BrokerServer): write everything appended since the
    last group in one transaction (in a worker thread unless the group is small, see
    ``SqliteLog.inline``), then let the core acknowledge and send it on; checkpoint the WAL
    (mostly beside the groups: ges.runtime.wal), and release or trim a chunk, in between."""
    log = server.pubend_log

    def wake() -> None:
        server._log_wakeup.set()

    try:
        async with trio.open_nursery() as nursery:
            backfills = Backfills(nursery, log, wake)
            while True:
                server._log_busy = False
                backfills.start()  # (the WAL grown by commit_alone's groups)
                await server._log_wakeup.wait()
                server._log_busy = True  # commit_alone leaves the writer to this task meanwhile
                server._log_wakeup = trio.Event()
                while log.pending or log.checkpoint_due or deletes_due(log):
                    if log.checkpoint_due:  # the WAL's bound holds under any stream of publishes
                        await trio.to_thread.run_sync(log.checkpoint)
                        continue
                    if log.wal_full:
                        await backfills.ended.wait()
                        continue
                    if log.pending:
                        await _commit_group(log)
                        outs = _logged(server)
                        if outs:
                            await server._dispatch(outs)
                    # deletions a chunk at a time, one after each group: a publish waits for
                    # at most one, and a steady stream of publishes does not starve them; none
                    # while a backfill runs (each page they write would be the catch-up's)
                    if not log.backfilling:
                        if log.release_pending:  # every other broker acknowledged these
                            await trio.to_thread.run_sync(log.apply_release)
                        elif log.trim_pending:
                            await trio.to_thread.run_sync(log.trim)
                    backfills.start()
    finally:
        log.close()


async def sessions_task(server) -> None:
    """Group commit of the replicator's store, as :func:`log_task` does for the log; then
    the core streams what was committed. Its WAL is checkpointed here too, as the log's is:
    the catch-up before a group (which would start the WAL over itself, on the event loop's
    thread if it is small)."""
    store = server.session_store

    def wake() -> None:
        server._sessions_wakeup.set()

    try:
        async with trio.open_nursery() as nursery:
            backfills = Backfills(nursery, store, wake)
            while True:
                backfills.start()
                await server._sessions_wakeup.wait()
                server._sessions_wakeup = trio.Event()
                while store.pending or store.checkpoint_due:
                    if store.checkpoint_due:
                        await trio.to_thread.run_sync(store.checkpoint)
                    if store.wal_full:
                        await backfills.ended.wait()
                        continue
                    if store.pending:
                        await _commit_group(store)
                        server._log_room.set()  # publishes paused for the store may go on
                        outs = server.core.replicator.on_committed()
                        if outs:
                            await server._dispatch(outs)
                    backfills.start()
    finally:
        store.close()
