"""A pubend's log in SQLite: WAL, group commit in a worker thread (seed 001 §2, issue 5).

The core appends a publish batch to :class:`SqliteLog` (in memory, at once) and holds the
publisher's acknowledgement and the forwarding until :attr:`committed` covers it. The broker's
log task takes everything appended so far as one group, writes it in one transaction from a
worker thread (``trio.to_thread``) while new appends queue up for the next group, and then tells
the core (``BrokerCore.on_logged``). So one commit covers every publish that arrived while the
previous one was being written: the group commit of seed 001 §4.

``synchronous=NORMAL`` in WAL mode (the default) survives a broker crash but not a power loss
of the host — the same footing as NATS JetStream's and mosquitto's defaults; ``strict`` uses
``synchronous=FULL``, an fsync per group commit.

Each start of the broker opens a new *epoch* of its pubend (``<broker>~<epoch>``, ticks from 1):
appended ticks that were not committed before a crash were never acknowledged nor sent, so
they were not published, and a new subscriber never sees an earlier epoch's events. The
earlier epochs stay in the file, so a subscriber that was missing the last events of the
pubend before its broker crashed nacks that epoch and is answered from the file: an event
whose publisher saw its call return is not lost with the broker.

Entries are released once every other broker has acknowledged them (``BrokerCore``'s ack
rounds, ges.core.release): :meth:`release` names the tick — of this epoch, or of an earlier one
the file still holds, which has rounds of its own until it is released to its end — the log
task deletes the batches up to it from a worker thread (:meth:`apply_release`) and records how
far each epoch was released, so a nack for a released tick is answered as nothing-for-you even
after a restart. An earlier epoch released to its end is no longer named (:attr:`earlier`), nor
announced. Beyond that, the file
holds at most :data:`MAX_LOG_EVENTS` events; the oldest go first, and a nack for them is
answered as lost.

A small group is committed on the event loop's thread (:meth:`SqliteLog.inline`): without an
fsync the commit is one write to the WAL, about 25 µs, where the round trip to a worker thread and
back took about 100 µs at the median on an idle machine (and more with 22 broker processes
sharing 2 cores) — the largest part of what reliable delivery added to an event's latency.
SQLite's automatic checkpoint (inside whichever commit crosses its threshold) is off; the log
task checkpoints every :data:`ges.runtime.wal.CHECKPOINT_BYTES`, most of it from a worker thread
while groups go on being committed (ges.runtime.wal).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from time import perf_counter

import attrs
import msgspec
import sqlite_utils

from ges.errors import OperationError
from ges.reliable.log import (
    MAX_EARLIER,
    MAX_PUBLISHERS,
    MAX_READ,
    NO_END,
    NamedEpochs,
    Promises,
    PublisherState,
    remember,
)
from ges.runtime.wal import CHECKPOINT_BYTES, WalCheckpoints, transaction
from ges.wire.messages import Event

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[Event]).decode

#: Appended events not yet committed (the log task writes them as one group); the publishers'
#: windows keep this far below the bound in practice.
MAX_PENDING = 1_000_000
#: Events the file keeps (all epochs); checked every TRIM_EVERY appended events.
MAX_LOG_EVENTS = 10_000_000
TRIM_EVERY = 100_000
#: A group at most this large (encoded bytes) is committed on the event loop's thread when the
#: log is not strict: the commit is a write to the WAL without an fsync (tens of µs), while the
#: hand-off to a worker thread and back costs about 100 µs on an idle machine and more on a busy
#: one. Larger groups, strict commits (an fsync each), trims and checkpoints go to a thread.
INLINE_MAX_BYTES = 16_384
#: ... and of at most this many rows (each costs some µs, whatever its size).
INLINE_MAX_ROWS = 256
#: What a commit adds to the WAL besides its rows: a frame per changed page, the events table's
#: and its key's (a page each at least).
COMMIT_OVERHEAD = 8_192
#: What deleting one batch may add to the WAL (the page it sat on is written again): counted
#: high, so a release or trim of large batches cannot outgrow the WAL's bound.
DELETE_COST = 4_096
#: Batches one release (or trim) transaction deletes at most: the log task goes on with the next
#: chunk after any publishes waiting, and no transaction holds the write lock for long (an
#: acknowledgement's promise is written on the event loop's thread and would wait for it).
RELEASE_CHUNK = 10_000
#: ... and the time one aims at. Its chunk is weighed in bytes (each batch's body, and
#: ROW_WEIGHT for its row and key: a burst's batches are large, a trickle's small, and a
#: delete costs by the pages it frees) and sized from the last one's time per byte, at most
#: twice the last, between MIN_DELETE_BYTES and MAX_DELETE_BYTES. A chunk of 10,000 batches
#: took 190 ms after a burst, 1,500 of them 71 ms, and the log's groups — so every reliable
#: delivery — waited for it.
DELETE_SECONDS = 0.005
ROW_WEIGHT = 256
MIN_DELETE_BYTES = 64 << 10
MAX_DELETE_BYTES = 64 << 20


@attrs.frozen
class LogBounds:
    """The bounds of one :class:`SqliteLog` (the defaults are the module's constants; tests
    make them small)."""

    max_events: int = MAX_LOG_EVENTS
    trim_every: int = TRIM_EVERY
    release_chunk: int = RELEASE_CHUNK
    checkpoint_bytes: int = CHECKPOINT_BYTES
    max_publishers: int = MAX_PUBLISHERS


class SqliteLog(NamedEpochs, WalCheckpoints):
    """One pubend's durable log (see the module docstring)."""

    def __init__(self, path: Path, *, strict: bool = False, bounds: LogBounds | None = None):
        self.path = Path(path)
        self.strict = strict
        self.bounds = bounds = bounds or LogBounds()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._reader = self._connect()
            db = sqlite_utils.Database(self._reader)
            if "meta" not in db.table_names():
                db["meta"].create({"key": str, "value": int}, pk="key")
            if "pubend_promises" not in db.table_names():
                # this broker's acknowledgements of other pubends (ges.core.release), by pubend;
                # a file from before earlier epochs were released kept one per broker
                self._reader.executescript(
                    "BEGIN; CREATE TABLE pubend_promises (pubend TEXT PRIMARY KEY, tick INTEGER);"
                    + (
                        " INSERT INTO pubend_promises SELECT pubend, tick FROM promises;"
                        " DROP TABLE promises;"
                        if "promises" in db.table_names()
                        else ""
                    )
                    + " COMMIT;"
                )
            if "publishers" not in db.table_names():
                # idempotent publishing: per publisher its last event number published, with
                # the epoch and tick it went in (written with the events, in one transaction)
                db["publishers"].create(
                    {"publisher": str, "seq": int, "epoch": int, "tick": int}, pk="publisher"
                )
            if "events" not in db.table_names():
                # one row per publish batch: ticks first..last, the events encoded together
                db["events"].create(
                    {"epoch": int, "first": int, "last": int, "body": bytes},
                    pk=("epoch", "first"),
                )
            rows = list(db["meta"].rows_where("key = ?", ["epoch"]))
            old = rows[0]["value"] if rows else 0
            self.epoch = old + 1
            #: the earlier epochs still holding events past what was released of them, and their
            #: last ticks, newest first
            self._earlier = self._reader.execute(
                "SELECT e.epoch, MAX(e.last) FROM events e WHERE e.epoch <= ? GROUP BY e.epoch"
                " HAVING MAX(e.last) > COALESCE((SELECT value FROM meta"
                " WHERE key = 'released:' || e.epoch), 0) ORDER BY e.epoch DESC LIMIT ?",
                (old, MAX_EARLIER),
            ).fetchall()
            # releases a crash cut short (the mark goes with the first chunk): the rest goes now
            interrupted = dict(
                self._reader.execute(
                    "SELECT DISTINCT e.epoch, m.value FROM events e JOIN meta m"
                    " ON m.key = 'released:' || e.epoch WHERE e.epoch <= ? AND e.last <= m.value",
                    (old,),
                ).fetchall()
            )
            if old:  # where it ended, for good (ended())
                end = self._last_seen(old) or 0
                db["meta"].upsert({"key": f"end:{old}", "value": end}, pk="key")
            self._promises = Promises()
            for row in db["pubend_promises"].rows:
                self._promises.keep(row["pubend"], row["tick"], limit=None)
            self._publishers: dict[str, PublisherState] = {}
            for row in self._reader.execute(
                "SELECT publisher, seq, epoch, tick FROM publishers ORDER BY epoch, tick"
            ):
                remember(self._publishers, row[0], tuple(row[1:]), bounds.max_publishers)
            db["meta"].upsert({"key": "epoch", "value": self.epoch}, pk="key")
        except (sqlite3.Error, OSError) as exc:
            raise OperationError(f"{self._what}: {exc}") from None
        self._last = self._committed = 0
        self._written = 0
        #: V_m of this epoch (a new stream: it starts empty; see PubendLog.clocks)
        self.clocks: tuple[int, dict] = (0, {})
        #: enough was written since the last look at the bound that the log task looks again
        self.trim_pending = False
        #: events a trim in progress has still to delete (counted once, when it starts)
        self._excess: int | None = None
        #: bytes written to the WAL since the last checkpoint (estimated)
        self._wal = 0
        #: released ticks of this epoch: done, and asked for (applied by the log task)
        self._done = self._release_to = 0
        #: the bytes of batches the next release or trim transaction deletes (DELETE_SECONDS),
        #: and how many batches the last one took (where the next looks first)
        self._budget = 4 * MIN_DELETE_BYTES
        self._rows = min(64, bounds.release_chunk)
        #: earlier epochs: how far each is released (as asked; the file's marks when not
        #: asked since the start), and the releases asked for and done (rows deleted)
        self._old_released: dict[int, int] = {}
        self._old_release_to: dict[int, int] = interrupted
        self._old_done: dict[int, int] = {}
        self._old_ends: dict[int, int] = {}
        self._pending: list[tuple[int, int, bytes, tuple | None]] = []
        #: publishers forgotten (MAX_PUBLISHERS) since the last group: their rows go with it
        self._forgotten: dict[str, None] = {}
        self._n_pending = 0
        #: bytes of encoded events appended and not yet durable (pending, and the group being
        #: written): the runtime stops reading publishes while it is over PAUSE_LOG_BYTES
        self.uncommitted = 0
        self._taken = 0
        self._writer: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self.strict else 'NORMAL'}")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # the log task checkpoints (checkpoint())
        return conn

    # -- the PubendLog interface ---------------------------------------------------------------

    @property
    def last(self) -> int:
        return self._last

    @property
    def committed(self) -> int:
        return self._committed

    def append(self, first: int, events: list, publisher: tuple[str, int] | None = None) -> None:
        if events and first <= self._last:
            raise ValueError(f"tick {first} appended after {self._last}")
        if self._n_pending + len(events) > MAX_PENDING:
            raise OperationError(f"{self._what}: {MAX_PENDING} events wait to commit")
        if events:
            self._last = first + len(events) - 1
            row = None
            if publisher is not None:
                name, seq = publisher
                gone = remember(
                    self._publishers,
                    name,
                    (seq, self.epoch, self._last),
                    self.bounds.max_publishers,
                )
                if gone is not None:
                    self._forgotten[gone] = None
                self._forgotten.pop(name, None)  # back before its row went: it stays
                row = (name, seq, self.epoch, self._last)
            body = _encode(events)
            self._pending.append((first, self._last, body, row))
            self.uncommitted += len(body)
            self._n_pending += len(events)

    def publishers(self) -> dict[str, PublisherState]:
        return self._publishers

    def read(self, lo: int, hi: int, limit: int = MAX_READ) -> list[tuple[int, object]]:
        return self.read_epoch(self.epoch, lo, hi, limit)

    def lowest(self, epoch: int | None = None) -> int:
        """The lowest tick an epoch (this one by default) still holds: those below it were
        dropped by the bound (lost); ``last + 1`` when it holds none."""
        epoch = self.epoch if epoch is None else epoch
        (lo,) = self._read("SELECT MIN(first) FROM events WHERE epoch = ?", (epoch,))[0]
        if lo is not None:
            return lo
        if epoch == self.epoch:
            return self._committed + 1
        end = self.ended(epoch)  # none left of an earlier epoch: after its end
        return end + 1 if end < NO_END else NO_END

    def ended(self, epoch: int) -> int:
        if epoch == self.epoch:
            return self._committed
        if epoch > self.epoch or epoch < 1:
            return NO_END
        got = self._old_ends.get(epoch)  # at most one per earlier epoch
        if got is None:
            rows = self._read("SELECT value FROM meta WHERE key = ?", (f"end:{epoch}",))
            if rows:
                got = rows[0][0]
            else:  # an epoch that ended before ends were kept
                got = self._last_seen(epoch)
                got = NO_END if got is None else got
            self._old_ends[epoch] = got
        return got

    def _last_seen(self, epoch: int) -> int | None:
        """The last tick of ``epoch`` the file shows: its last row, or what was released or
        trimmed of it when no row is left (None: nothing)."""
        marks = (f"released:{epoch}", f"trimmed:{epoch}")
        ((gone,),) = self._read("SELECT MAX(value) FROM meta WHERE key IN (?, ?)", marks)
        ((last,),) = self._read("SELECT MAX(last) FROM events WHERE epoch = ?", (epoch,))
        known = [v for v in (gone, last) if v is not None]
        return max(known) if known else None

    def released(self, epoch: int | None = None) -> int:
        if epoch is None or epoch == self.epoch:
            # once acknowledged by all it is released, whether or not the rows are gone yet
            return self._release_to
        if epoch > self.epoch:  # no such epoch (yet): nothing of it was released
            return 0
        got = self._old_released.get(epoch)  # at most one per earlier epoch
        if got is None:
            rows = self._read("SELECT value FROM meta WHERE key = ?", (f"released:{epoch}",))
            got = self._old_released[epoch] = rows[0][0] if rows else 0
        return got

    def _read(self, sql: str, args: tuple) -> list:
        """The rows of a query on the reader connection (the event loop's thread); an SQLite
        error is an OperationError naming the file."""
        try:
            return self._reader.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None

    def release(self, upto: int, epoch: int | None = None) -> None:
        if epoch is None or epoch == self.epoch:
            self._release_to = max(self._release_to, min(upto, self._committed))
            return
        end = self.ended(epoch)
        if end >= NO_END:
            return  # an epoch this file knows nothing of
        upto = min(upto, end)
        if upto > self.released(epoch):
            self._old_released[epoch] = self._old_release_to[epoch] = upto

    def promised(self) -> dict[str, int]:
        return self._promises.ticks

    def promise(self, pubend: str, tick: int) -> bool:
        """Kept on disk before the acknowledgement goes (one small write on the event loop's
        thread, once per pubend per ack round)."""
        if self._promises.refuses(pubend):
            return False
        try:
            self._reader.execute(
                "INSERT OR REPLACE INTO pubend_promises (pubend, tick) VALUES (?, ?)",
                (pubend, tick),
            )
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None
        self._wal += COMMIT_OVERHEAD
        self._forget(self._promises.keep(pubend, tick))  # older epochs beyond the bound
        return True

    def forget_promises(self, broker: str, epoch: int) -> None:
        self._forget(self._promises.before(broker, epoch))

    def _forget(self, pubends: list[str]) -> None:
        if not pubends:
            return
        try:
            self._reader.executemany(
                "DELETE FROM pubend_promises WHERE pubend = ?", [(p,) for p in pubends]
            )
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None
        self._wal += COMMIT_OVERHEAD
        self._promises.forget(pubends)

    @property
    def release_pending(self) -> bool:
        done = self._old_done
        return self._release_to > self._done or any(
            done.get(e, 0) < upto for e, upto in self._old_release_to.items()
        )

    def apply_release(self) -> None:
        """Delete a chunk of released batches (DELETE_SECONDS' worth, at most RELEASE_CHUNK)
        and record how far the epoch is released, in one transaction (a worker thread, like
        :meth:`write_group`); the log task calls it again while :attr:`release_pending`. This
        epoch's release goes first, then the earlier epochs', oldest first."""
        epoch, upto, budget = self.epoch, self._release_to, self._budget
        if upto <= self._done:
            # (a copy of the dict at once, under the GIL: the event loop's thread adds to it)
            done = self._old_done
            epoch, upto = min(
                (e, u) for e, u in list(self._old_release_to.items()) if done.get(e, 0) < u
            )

        def delete(w: sqlite3.Connection) -> tuple[int, int, bool]:
            where, args = "WHERE epoch = ? AND first <= ? AND last <= ?", (epoch, upto, upto)
            n, weight, rest = self._rows_within(w, where, args, "first", budget)
            gone = w.execute(
                f"DELETE FROM events WHERE rowid IN (SELECT rowid FROM events {where}"
                " ORDER BY first LIMIT ?)",
                (*args, n),
            ).rowcount
            w.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                (f"released:{epoch}", upto),
            )
            return gone, weight, rest or gone < n

        self._excess = None  # (a trim under way counts again: what is released is not over)
        if self._deleting(delete, budget):
            if epoch == self.epoch:
                self._done = upto
            else:
                self._old_done[epoch] = upto

    def _rows_within(self, w: sqlite3.Connection, where: str, args: tuple, order: str, budget: int):
        """How many of the rows ``where`` (with ``args``), in ``order``, a transaction
        deletes, their weight, and whether they are all that is left: the first whose weight
        reaches ``budget`` (one at least), among at most twice as many as the last transaction
        took (from 64, up to RELEASE_CHUNK). One statement, as the delete is: the worker
        thread needs the GIL for neither while it runs (a loop over the rows in Python waited
        for it at every row while a burst kept the event loop busy: a chunk took 150 ms)."""
        limit = min(self.bounds.release_chunk, max(64, 2 * self._rows))
        k, weight, seen = w.execute(
            "SELECT COUNT(*) FILTER (WHERE c - n < ?), COALESCE(MAX(c) FILTER (WHERE c - n < ?),"
            f" 0), COUNT(*) FROM (SELECT n, SUM(n) OVER (ORDER BY {order} ROWS UNBOUNDED PRECEDING)"
            f" AS c FROM (SELECT {order}, length(body) + {ROW_WEIGHT} AS n FROM events {where}"
            f" ORDER BY {order} LIMIT ?))",
            (budget, budget, *args, limit),
        ).fetchone()
        self._rows = max(1, k)
        return k, weight, k == seen < limit

    def _deleting(self, work, budget: int) -> bool:
        """``work``'s transaction, deleting (count, weight, ended = nothing left) a chunk of
        ``budget`` bytes; the next budget is sized from its time per byte (when it was not the
        last) to take DELETE_SECONDS, at most twice this one. Whether it was the last."""
        started = perf_counter()
        gone, weight, ended = self._transaction(work)
        self._wal += COMMIT_OVERHEAD + gone * DELETE_COST
        if not ended:
            took = max(perf_counter() - started, 1e-6)
            aimed = min(2 * budget, int(weight * DELETE_SECONDS / took))
            self._budget = max(MIN_DELETE_BYTES, min(MAX_DELETE_BYTES, aimed))
        return ended

    def read_epoch(
        self, epoch: int, lo: int, hi: int, limit: int = MAX_READ
    ) -> list[tuple[int, object]]:
        """``(tick, event)`` of an epoch (an earlier one: what it logged before a crash); of
        this one only what :attr:`committed` covers, as :meth:`read`."""
        if epoch == self.epoch:
            hi = min(hi, self._committed)
        # from the batch holding ``lo`` (the last that starts at or before it: batches of an
        # epoch do not overlap), found on the key; ``last >= lo`` alone let the search walk
        # every batch of the epoch below lo (16 ms a read at the end of 300,000 events, on the
        # event loop's thread, each step of a read-back or a nack's repair)
        rows = self._read(
            "SELECT first, body FROM events WHERE epoch = ? AND first <= ? AND last >= ?"
            " AND first >= COALESCE((SELECT MAX(first) FROM events WHERE epoch = ?"
            " AND first <= ?), 0) ORDER BY first LIMIT ?",
            (epoch, hi, lo, epoch, lo, limit),
        )
        out: list[tuple[int, object]] = []
        for first, body in rows:
            for i, event in enumerate(_decode(body)):
                tick = first + i
                if lo <= tick <= hi:
                    out.append((tick, event))
                    if len(out) >= limit:
                        return out
        return out

    # -- group commit --------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    @property
    def appended(self) -> list[tuple]:
        """What the next group holds so far (read only; :meth:`take_group` takes it)."""
        return self._pending

    def take_group(self) -> list[tuple]:
        """Everything appended since the last group (the log task writes it next), and the
        publishers forgotten meanwhile."""
        group, self._pending = self._pending, []
        self._taken += sum(len(g[2]) for g in group)
        if self._forgotten:
            group.append((0, 0, b"", ("forget", *self._forgotten)))
            self._forgotten = {}
        self._n_pending = 0
        return group

    def inline(self, group: list[tuple]) -> bool:
        """Whether the log task may write ``group`` on the event loop's thread (a small group,
        no fsync): see :data:`INLINE_MAX_BYTES`."""
        if self.strict or len(group) > INLINE_MAX_ROWS:
            return False
        size = 0
        for _, _, body, _ in group:
            size += len(body)
            if size > INLINE_MAX_BYTES:
                return False
        return True

    def write_group(self, group: list[tuple]) -> int:
        """Write one group in one transaction (from a worker thread, or on the event loop's
        thread when :meth:`inline`): its events, and what it says of idempotent publishers.
        Returns its last tick."""
        epoch = self.epoch
        batches = [g for g in group if g[2]]
        publishers = [g[3] for g in batches if g[3] is not None]
        forgotten = [(p,) for g in group if not g[2] for p in g[3][1:]]

        def insert(w: sqlite3.Connection) -> None:
            w.executemany(
                "INSERT INTO events (epoch, first, last, body) VALUES (?, ?, ?, ?)",
                [(epoch, first, last, body) for first, last, body, _ in batches],
            )
            if forgotten:  # before the new rows: a publisher forgotten and back is kept
                w.executemany("DELETE FROM publishers WHERE publisher = ?", forgotten)
            if publishers:
                w.executemany(
                    "INSERT OR REPLACE INTO publishers (publisher, seq, epoch, tick)"
                    " VALUES (?, ?, ?, ?)",
                    publishers,
                )

        self._transaction(insert)
        if not batches:
            return self._committed
        self._written += batches[-1][1] - batches[0][0] + 1
        if self._written >= self.bounds.trim_every:
            self._written = 0
            self.trim_pending = True
        self._wal += COMMIT_OVERHEAD + sum(len(g[2]) for g in batches)
        return batches[-1][1]

    def _transaction(self, work):
        return transaction(self._writing(), work, self._what)

    def trim(self) -> None:
        """Keep about the newest MAX_LOG_EVENTS events, the oldest batches going whole (runs in
        a worker thread when :attr:`trim_pending`). Outside any transaction (a WAL reader
        holds no lock), a bound on the events held is read from the key (:meth:`_held_at_most`)
        and only over MAX_LOG_EVENTS are they counted (a scan of the whole table, 40-80 ms for
        300,000 batches, which the log's groups waited for every TRIM_EVERY events); a chunk
        of batches goes per transaction (as a release's: DELETE_SECONDS, in SQL statements
        only); the log task calls it again while it is still over. A release between two
        chunks has the events counted again (what it deleted is no longer over)."""
        w = self._writing()
        try:
            if self._excess is None:  # one count per trim, not per chunk
                if self._held_at_most(w) > self.bounds.max_events:
                    (n,) = w.execute(
                        "SELECT COALESCE(SUM(last - first + 1), 0) FROM events"
                    ).fetchone()
                    self._excess = n - self.bounds.max_events
                if self._excess is None or self._excess <= 0:
                    self._excess = None
                    self.trim_pending = False
                    return
            n, weight, rest = self._rows_within(w, "", (), "epoch, first", self._budget)
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None

        def delete(c: sqlite3.Connection) -> tuple[int, int, bool]:
            # of those n, the first whose events reach the excess; per epoch the last tick
            ends = c.execute(
                "SELECT epoch, MAX(last), COUNT(*), SUM(size) FROM (SELECT epoch, last, size,"
                " SUM(size) OVER (ORDER BY epoch, first ROWS UNBOUNDED PRECEDING) AS upto FROM"
                " (SELECT epoch, first, last, last - first + 1 AS size FROM events"
                " ORDER BY epoch, first LIMIT ?)) WHERE upto - size < ? GROUP BY epoch",
                (n, self._excess),
            ).fetchall()
            k = sum(count for _, _, count, _ in ends)
            c.execute(
                "DELETE FROM events WHERE rowid IN"
                " (SELECT rowid FROM events ORDER BY epoch, first LIMIT ?)",
                (k,),
            )
            c.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key)"
                " DO UPDATE SET value = MAX(value, excluded.value)",
                [(f"trimmed:{epoch}", last) for epoch, last, _, _ in ends],
            )
            self._excess -= sum(size for _, _, _, size in ends)
            return k, weight, (rest and k == n) or self._excess <= 0

        if not n or self._deleting(delete, self._budget):
            self._excess = None
            self.trim_pending = False

    @staticmethod
    def _held_at_most(w: sqlite3.Connection) -> int:
        """At least the events the file holds, from its key alone (a seek or two per epoch):
        each epoch's ticks from its first row's first to its last row's last."""
        (n,) = w.execute(
            "WITH RECURSIVE e(epoch) AS (SELECT MIN(epoch) FROM events UNION ALL"
            " SELECT (SELECT MIN(epoch) FROM events WHERE epoch > e.epoch) FROM e"
            " WHERE e.epoch IS NOT NULL)"
            " SELECT COALESCE(SUM((SELECT last FROM events WHERE epoch = e.epoch"
            " ORDER BY first DESC LIMIT 1) - (SELECT first FROM events WHERE epoch = e.epoch"
            " ORDER BY first LIMIT 1) + 1), 0) FROM e WHERE e.epoch IS NOT NULL"
        ).fetchone()
        return n

    def committed_to(self, tick: int) -> None:
        """The group ending at ``tick`` is durable (called on the event loop's thread)."""
        self._committed = max(self._committed, tick)
        self.uncommitted -= self._taken
        self._taken = 0

    @property
    def _what(self) -> str:
        return f"pubend log {self.path}"

    @property
    def _wal_bound(self) -> int:
        return self.bounds.checkpoint_bytes

    def close(self) -> None:
        self._close_backfill()
        for conn in (self._reader, self._writer):
            if conn is not None:
                conn.close()


def size_on_disk(path) -> int:
    """Bytes of a SQLite database's files (the database, its WAL and shared memory)."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += os.stat(f"{path}{suffix}").st_size
    return total
