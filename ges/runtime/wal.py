"""The SQLite files' write-ahead logs: transactions, and checkpoints that keep commits going.

The pubend log and the session store (ges.runtime.pubend_log, ges.runtime.session_store)
each write their file through one connection, a group at a time, from one task
(ges.runtime.commits), in WAL mode with SQLite's own checkpoint off: it would run inside
whichever commit crossed its threshold, and a small commit runs on the event loop's thread.
Their tasks checkpoint the WAL instead, each :data:`CHECKPOINT_BYTES` written.

Theory of operation
-------------------
A checkpoint copies the WAL's newest version of each page into the database; its time grows
with the frames the WAL holds (5-10 ms for the 4 MiB of 500 single-event commits on the CI
machine's disk, 80 ms after a release deleted 10,000 batches). Run between two groups by the
task that commits them, it held every commit back that long: at 1,000 events a second, one
event in 500 waited for it, and the p99 of a reliable delivery was the checkpoint's time.

So a checkpoint has two steps (:class:`WalCheckpoints`):

1. the *backfill*: a PASSIVE checkpoint on a connection of its own, in a worker thread, while
   the task goes on committing groups through the writer. SQLite lets the two run side by
   side (a checkpointer takes no writer's lock); it copies the frames there were when it
   began;
2. the *catch-up*, by the task between two groups, as before on the writer: what was
   committed during the backfill (a few frames), and the small write that starts the WAL
   over from its beginning (:func:`checkpoint`). A WAL that is never caught up with while
   commits keep coming would never start over, and grow without a bound.

A commit waits for the catch-up only: a few ms, growing with what was committed during the
backfill (a review measured 4-11 ms after 50-390 small commits), where it waited for the
whole checkpoint. The WAL grows meanwhile by what is committed while the backfill runs; at
:data:`WAL_FULL` times its bound (:attr:`WalCheckpoints.wal_full`) groups wait for the
backfill's end. The pubend log's deletes (a release's, a trim's) wait for it too: they write
many pages, and every page written during the backfill is the catch-up's to copy (20 ms of it
after a burst's release, which the groups waited for).

Left as it is: a backfill that copied everything leaves the WAL's restart (an fsync of its
header) to whichever write comes next. The log task's groups and a lone publish's commit wait
for the catch-up, but an acknowledgement's promise (``SqliteLog.promise``, on the event
loop's thread) may come first and pay it (0.3-0.5 ms, found by a review).
"""

from __future__ import annotations

import contextlib
import sqlite3

from ges.errors import OperationError

#: Bytes appended to a WAL (as its writer counts them) after which it is checkpointed.
CHECKPOINT_BYTES = 4 << 20
#: Times CHECKPOINT_BYTES the WAL may reach while a backfill is under way; then groups wait
#: for its end (commits faster than the backfill copies cannot grow the file without a bound).
WAL_FULL = 4


def transaction(w: sqlite3.Connection, work, what: str):
    """``work(w)`` in one transaction on connection ``w``; its result. An SQLite error (a full
    disk, an I/O error) is an OperationError naming ``what``."""
    try:
        w.execute("BEGIN")
        try:
            got = work(w)
            w.execute("COMMIT")
        except BaseException:
            # SQLite has rolled back by itself after some errors (a full disk): the error to
            # report is the one that got here, not the rollback's
            if w.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    w.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise OperationError(f"{what}: {exc}") from None
    return got


def checkpoint(w: sqlite3.Connection, what: str, bound: int) -> int:
    """Copy the WAL of connection ``w`` into its database (PASSIVE: no reader waits for it),
    where it is counted to have reached ``bound`` bytes; the bytes to count it at from now: 0
    after a complete one, half the bound after one a reader kept from completing (it is tried
    again sooner). After a complete one, a small write to ``w``'s ``meta`` table starts the WAL
    over: that restart fsyncs the WAL's new header even with ``synchronous=NORMAL``, and
    whatever wrote next — a commit on the event loop's thread — would pay for it. An SQLite
    error is an OperationError naming ``what``."""
    try:
        busy, frames, done = w.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if busy or frames != done:
            return bound // 2
        w.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('checkpoint', ?)", (done,))
    except sqlite3.Error as exc:
        raise OperationError(f"{what}: {exc}") from None
    return 0


class WalCheckpoints:
    """The two steps of a file's checkpoint (see the module). The file's class has ``_wal``
    (the bytes its commits added to the WAL since the last checkpoint, as it counts them),
    ``_writer`` (the connection its groups are written through, or None until the first:
    :meth:`_writing` opens it),
    ``_connect()`` (a new connection to the file) and ``_what`` (its name in errors), and
    calls :meth:`_close_backfill` as it closes.

    The task that commits the file's groups starts :meth:`backfill` in a worker thread when
    :attr:`backfill_due` (after :meth:`start_backfill`), goes on committing, and runs
    :meth:`checkpoint` between two groups once :attr:`checkpoint_due`. The file is not closed
    while a backfill runs (the task waits for its thread)."""

    _wal_bound: int = CHECKPOINT_BYTES
    #: a backfill was started and has not been caught up with; it ended
    _backfilling: bool = False
    _backfilled: bool = False
    _backfiller: sqlite3.Connection | None = None

    @property
    def backfill_due(self) -> bool:
        """The WAL crossed its bound and no backfill is under way."""
        return not self._backfilling and self._wal >= self._wal_bound

    @property
    def backfilling(self) -> bool:
        """A backfill is under way."""
        return self._backfilling and not self._backfilled

    @property
    def wal_full(self) -> bool:
        """A backfill is under way and the WAL has grown to WAL_FULL times its bound: no
        group is written before it ends."""
        return self._backfilling and self._wal >= WAL_FULL * self._wal_bound

    @property
    def checkpoint_due(self) -> bool:
        """A backfill ended: the catch-up is due."""
        return self._backfilled

    def start_backfill(self) -> None:
        """The task is about to run :meth:`backfill` (on the event loop's thread)."""
        self._backfilling = True

    def backfill(self) -> None:
        """Copy the WAL's frames into the database from a connection of its own (a worker
        thread, beside the commits). Whatever it could not copy (a reader in the way, frames
        written meanwhile) the catch-up copies."""
        try:
            if self._backfiller is None:
                self._backfiller = self._connect()
            self._backfiller.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None
        finally:
            self._backfilled = True

    def checkpoint(self) -> None:
        """The catch-up: copy what is left of the WAL and start it over (the task, between
        two groups, from a worker thread: :func:`checkpoint`). Without a backfill before it,
        it is the whole checkpoint. An incomplete one is tried again sooner."""
        writer = self._writing()
        self._backfilling = self._backfilled = False
        self._wal = checkpoint(writer, self._what, self._wal_bound)

    def _writing(self) -> sqlite3.Connection:
        """The connection groups are written through, opened at its first use (an SQLite error
        is an OperationError naming the file)."""
        try:
            if self._writer is None:
                self._writer = self._connect()
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None
        return self._writer

    def _close_backfill(self) -> None:
        if self._backfiller is not None:
            self._backfiller.close()
            self._backfiller = None
