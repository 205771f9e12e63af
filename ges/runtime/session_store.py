"""A replicator's store in SQLite: durable sessions and their events (seed 001 §4.2).

Same footing as the pubend log (ges.runtime.pubend_log): WAL, ``synchronous=NORMAL``, group
commit. The core appends (in memory, at once); the broker's session task takes everything
appended as one group and writes it in one transaction — on the event loop's thread when it is
small (a write to the WAL, tens of µs), else from a worker thread — then tells the core, which
streams it. Reads (a page of a session's events) run on the event loop's thread: from memory
when the session wants nothing older than the last :data:`RECENT_BYTES` appended
(:class:`ges.durable.recent.Recent`: a client that keeps up is streamed without reading back
what was just written), else against a reader connection, at most
:data:`~ges.durable.store.MAX_READ` rows by primary key.

Layout: ``events(epoch, pubend, item)`` holds each stored event once; ``wants(key, epoch,
subs)`` says which sessions it is for (the persistent filtering subsystem's matching records);
``sessions`` holds each session's name, owner, subscriptions and resume point. An event goes
once no session wants it any more.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import msgspec

from ges.durable.recent import Recent
from ges.durable.retained import Kept
from ges.durable.store import MAX_READ, SessionState, page
from ges.errors import OperationError
from ges.runtime.wal import WalCheckpoints, transaction
from ges.wire import messages as m

_encode = msgspec.msgpack.Encoder().encode
_decode_item = msgspec.msgpack.Decoder(m.EventItem).decode
_decode_event = msgspec.msgpack.Decoder(m.Event).decode
_decode_subs = msgspec.msgpack.Decoder(dict[int, tuple[str, list[list[m.Constraint]]]]).decode
_decode_ints = msgspec.msgpack.Decoder(list[int]).decode
_decode_handover = msgspec.msgpack.Decoder(dict).decode
_decode_retention = msgspec.msgpack.Decoder(
    tuple[int, float, int, dict[str, tuple[int, int]], int, str]
).decode

#: A group at most this large (bytes of events) is committed on the event loop's thread ...
INLINE_MAX_BYTES = 256 * 1024
#: ... if it also writes or deletes at most this many rows (about 3 µs each whatever their size:
#: ~3 ms; a group of many small events, or the release of a long backlog, is written from a
#: worker thread instead — the release of 50,000 held the loop 8 ms. A thread costs the
#: broker more CPU, its hand-off and the GIL shared: a bound of 256 rows cost the persistent
#: QoS 1 row of bench/peers.py 10-20 % more broker CPU per delivery)
INLINE_MAX_ROWS = 1024

#: What the WAL is counted to grow by (as ges.runtime.pubend_log counts it, for checkpoints):
#: a commit (the pages of the tables and indexes every group touches: 11 for one event), an
#: event row or a session's want of one beyond its bytes (rows in epoch order share pages), a
#: deleted one (its pages are written again), a retained topic's row (two pages: where its
#: key falls in the table and its index) and a session's (three, and its encoded state).
#: Counted high, against the frames SQLite wrote: the WAL's bound holds.
PAGE_WAL = 4096
COMMIT_WAL = 12 * PAGE_WAL
ROW_WAL = 64
DELETE_WAL = 128
RETAINED_WAL = 2 * PAGE_WAL
SESSION_WAL = 3 * PAGE_WAL

#: The events appended last are kept in memory too, this many bytes of them (as
#: ges.durable.recent counts them: encoded, and the objects that hold them); a client that
#: keeps up reads only the last group committed, far less.
RECENT_BYTES = 4 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    name TEXT PRIMARY KEY, key INTEGER NOT NULL UNIQUE, owner TEXT NOT NULL,
    subs BLOB NOT NULL, created REAL NOT NULL, acked INTEGER NOT NULL, retention BLOB);
CREATE TABLE IF NOT EXISTS events (
    epoch INTEGER PRIMARY KEY, pubend TEXT NOT NULL, item BLOB NOT NULL,
    gap_to INTEGER NOT NULL DEFAULT 0, why TEXT NOT NULL DEFAULT '',
    tick INTEGER NOT NULL DEFAULT 0, stored_at REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS events_stored_at ON events (stored_at);
CREATE TABLE IF NOT EXISTS tops (pubend TEXT PRIMARY KEY, tick INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS wants (
    key INTEGER NOT NULL, epoch INTEGER NOT NULL, subs BLOB NOT NULL,
    PRIMARY KEY (key, epoch)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS wants_epoch ON wants (epoch);
CREATE TABLE IF NOT EXISTS retained (
    topic TEXT PRIMARY KEY, wall_ns INTEGER NOT NULL, pubend TEXT NOT NULL,
    tick INTEGER NOT NULL, event BLOB);
"""


class SqliteSessionStore(WalCheckpoints):
    """:class:`ges.durable.store.SessionStore` in one SQLite file."""

    def __init__(self, path: Path, recent_bytes: int = RECENT_BYTES, clock=time.time):
        self.path = Path(path)
        #: the time of day kept with each event (retention by age)
        self.clock = clock
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = self._connect()
            self._writer.executescript(_SCHEMA)
            columns = {row[1] for row in self._writer.execute("PRAGMA table_info(sessions)")}
            if "handover" not in columns:  # a store made before hand-overs
                self._writer.execute("ALTER TABLE sessions ADD COLUMN handover BLOB")
            row = self._writer.execute("SELECT value FROM meta WHERE key = 'id'").fetchone()
            if row is None:
                self.id = os.urandom(8).hex()
                self._writer.execute("INSERT INTO meta (key, value) VALUES ('id', ?)", (self.id,))
            else:
                self.id = row[0]
            (last,) = self._writer.execute("SELECT COALESCE(MAX(epoch), 0) FROM events").fetchone()
            (floor,) = self._writer.execute(
                "SELECT COALESCE(MAX(CAST(value AS INTEGER)), 0) FROM meta WHERE key = 'last'"
            ).fetchone()
            self._reader = self._connect()
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None
        #: epochs are never reused, even once the events numbered by them are gone
        self._last = self._committed = max(last, floor)
        self._recent = Recent(self._last, recent_bytes)
        self._pending_events: list[tuple] = []
        self._pending_wants: list[tuple] = []
        self._pending_bytes = 0
        #: the events appended and not yet committed (to come, or in the group being written),
        #: in bytes as the memory of them counts them (Recent.add): the broker pauses what
        #: appends while it is large (ges.runtime.broker.PAUSE_SESSIONS_BYTES)
        self.uncommitted = 0
        self._pending_held = self._taken_held = 0  # ... of them to come, and being written
        self._saves: dict[str, SessionState | None] = {}
        self._releases: dict[int, int] = {}
        #: per session, the epoch up to which the groups so far release what it held (the
        #: rows a release deletes are at most its epochs since then)
        self._released_to: dict[int, int] = {}
        self._tops: dict[str, int] = {}
        self._retains: dict[str, Kept | None] = {}  # None: forget it
        self._retains_bytes = 0  # ... the bytes of those kept
        #: bytes written to the WAL since the last checkpoint (estimated: ROW_WAL, PAGE_WAL)
        self._wal = 0
        #: sessions saved so far, up to which the group being written saves them, and up to
        #: which the file has them
        self._saved = self._saved_taken = self._saved_durable = 0

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        # SQLite's own checkpoint (an fsync, inside whichever commit crosses its threshold:
        # 4-7 ms on the event loop's thread, once every dozen commits of retained messages)
        # is off; the sessions task checkpoints (ges.runtime.wal)
        conn.execute("PRAGMA wal_autocheckpoint=0")
        return conn

    # -- the SessionStore interface -------------------------------------------------------------

    def sessions(self) -> dict[str, SessionState]:
        rows = self._query(
            "SELECT name, owner, key, subs, created, acked, retention, handover FROM sessions", ()
        )
        out = {}
        for name, owner, key, subs, created, acked, retention, handover in rows:
            state = SessionState(name, owner, key, _decode_subs(subs), created, acked)
            # what it acknowledged was let go of: its first release here counts from there
            self._released_to.setdefault(key, acked)
            if handover:
                kept = _decode_handover(handover)
                state.handover, state.floors = kept.get("handover"), kept.get("floors", {})
                state.reading = kept.get("reading", {})
                state.qos2 = set(kept.get("qos2", ()))
                state.rel = set(kept.get("rel", ()))
                state.expiry = kept.get("expiry", 0.0)
                if kept.get("will") is not None:
                    state.will = _decode_event(kept["will"])
                    state.will_delay = kept.get("will_delay", 0.0)
            if retention:
                n, age, trimmed, gaps, dropped, why = _decode_retention(retention)
                state.max_events, state.max_age, state.trimmed = n, age, trimmed
                state.gaps, state.dropped = {p: tuple(t) for p, t in gaps.items()}, dropped
                state.gap_why = why
            out[name] = state
        return out

    def save_session(self, state: SessionState) -> None:
        self._saved += 1
        # a session new here wants nothing appended before it (one read back holds its own)
        self._released_to.setdefault(state.key, self._last)
        self._saves[state.name] = state.copy()

    def drop_session(self, state: SessionState) -> None:
        self._saved += 1
        self._saves[state.name] = None
        self._releases[state.key] = -1  # everything
        self._recent.forget(state.key)

    @property
    def last(self) -> int:
        return self._last

    @property
    def committed(self) -> int:
        return self._committed

    def append(
        self,
        pubend: str,
        item: m.EventItem,
        wants: list[tuple[int, list[int]]],
        gap_to: int = 0,
        why: str = "",
    ) -> int:
        self._last += 1
        epoch = self._last
        body = _encode(item)
        self._pending_events.append((epoch, pubend, body, gap_to, why, item.tick, self.clock()))
        self._pending_wants += [(key, epoch, _encode(subs)) for key, subs in wants]
        size = self._recent.add(epoch, pubend, item, wants, gap_to, why, len(body))
        self._pending_bytes += len(body)
        self._pending_held += size
        self.uncommitted += size
        return epoch

    def read(self, key: int, after: int, limit: int = MAX_READ, max_bytes: int = 1 << 20) -> list:
        if self._recent.covers(key, after):
            return self._recent.read(key, after, self._committed, limit, max_bytes)
        rows = self._query(
            "SELECT w.epoch, e.pubend, e.item, w.subs, e.gap_to, e.why"
            " FROM wants w JOIN events e ON e.epoch = w.epoch"
            " WHERE w.key = ? AND w.epoch > ? AND w.epoch <= ? ORDER BY w.epoch LIMIT ?",
            (key, after, self._committed, limit),
        )
        return page(
            (
                m.SessionItem(epoch, pubend, _decode_item(body), _decode_ints(subs), gap_to, why)
                for epoch, pubend, body, subs, gap_to, why in rows
            ),
            max_bytes,
        )

    def tops(self) -> dict[str, int]:
        return dict(self._query("SELECT pubend, tick FROM tops", ()))

    def set_top(self, pubend: str, tick: int) -> None:
        self._tops[pubend] = tick

    def held(self, key: int, after: int) -> tuple[int, int]:
        ((n, last),) = self._query(
            "SELECT COUNT(*), COALESCE(MAX(epoch), 0) FROM wants WHERE key = ? AND epoch > ?",
            (key, after),
        )
        return n, last

    def nth(self, key: int, after: int, n: int) -> int:
        rows = self._query(
            "SELECT MAX(epoch) FROM (SELECT epoch FROM wants WHERE key = ? AND epoch > ?"
            " ORDER BY epoch LIMIT ?)",
            (key, after, n),
        )
        return rows[0][0] or after

    def stored_before(self, age: float) -> int:
        # down the index to the one row: MAX(epoch) ... WHERE stored_at < ? walks the table
        # from its newest epoch to the first match — every event when none is that old, as
        # none is most of the time, once a second (ges.core.lifetime)
        rows = self._query(
            "SELECT epoch FROM events WHERE stored_at < ?"
            " ORDER BY stored_at DESC, epoch DESC LIMIT 1",
            (self.clock() - age,),
        )
        return rows[0][0] if rows else 0

    def count(self, key: int, after: int, upto: int) -> int:
        rows = self._query(
            "SELECT COUNT(*) FROM wants WHERE key = ? AND epoch > ? AND epoch <= ?",
            (key, after, upto),
        )
        return rows[0][0]

    def ticks(self, key: int, after: int, upto: int) -> dict[str, tuple[int, int]]:
        rows = self._query(
            "SELECT e.pubend, MIN(e.tick), MAX(e.tick) FROM wants w JOIN events e"
            " ON e.epoch = w.epoch WHERE w.key = ? AND w.epoch > ? AND w.epoch <= ?"
            " GROUP BY e.pubend",
            (key, after, upto),
        )
        return {pubend: (lo, hi) for pubend, lo, hi in rows}

    def retain(self, kept: Kept) -> None:
        self._saved += 1  # a mark for durable() (the replicator's floor waits for it)
        self._retain_change(kept.topic, kept)

    def forget(self, topic: str) -> None:
        self._retain_change(topic, None)

    def _retain_change(self, topic: str, kept: Kept | None) -> None:
        """The next group keeps ``kept`` for ``topic`` (None: forgets it); the bytes of
        those it keeps are counted as they come (a group may hold thousands)."""
        old = self._retains.get(topic)
        if old is not None:
            self._retains_bytes -= old.size
        if kept is not None:
            self._retains_bytes += kept.size
        self._retains[topic] = kept

    def retained(self) -> list[Kept]:
        rows = self._query("SELECT topic, wall_ns, pubend, tick, event FROM retained", ())
        return [
            Kept(topic, wall_ns, pubend, tick, None if event is None else _decode_event(event))
            for topic, wall_ns, pubend, tick, event in rows
        ]

    def release(self, key: int, upto: int) -> None:
        if self._releases.get(key) != -1:
            self._releases[key] = max(upto, self._releases.get(key, 0))
        self._recent.release(key, upto)

    # -- group commit (the broker's session task) ----------------------------------------------

    @property
    def pending(self) -> bool:
        return bool(
            self._pending_events or self._saves or self._releases or self._tops or self._retains
        )

    def take_group(self) -> tuple:
        added = len(self._pending_events) + len(self._pending_wants)
        size = self._pending_bytes + self._retains_bytes
        rows = added + len(self._saves) + len(self._retains)
        deleted = 0
        for key, upto in self._releases.items():
            before = self._released_to.get(key, 0)
            if upto < 0:  # the whole session: its rows are unknown here
                rows += INLINE_MAX_ROWS + 1
                deleted += 2 * max(0, self._last - before)
                self._released_to.pop(key, None)
            else:  # an event row and a wants row an epoch, at most
                deleted += 2 * max(0, upto - before)
                self._released_to[key] = max(upto, before)
        rows += deleted
        # (the sessions saved are counted once encoded: write_group)
        wal = COMMIT_WAL + size + ROW_WAL * added + RETAINED_WAL * len(self._retains)
        wal += DELETE_WAL * deleted
        group = (
            self._pending_events,
            self._pending_wants,
            self._saves,
            self._releases,
            self._last,
            size,
            self._tops,
            self._retains,
            rows,
            wal,
        )
        self._pending_events, self._pending_wants, self._saves, self._releases = [], [], {}, {}
        self._tops, self._retains = {}, {}
        self._retains_bytes = 0
        self._taken_held += self._pending_held
        self._pending_bytes = self._pending_held = 0
        self._saved_taken = self._saved
        return group

    @staticmethod
    def inline(group: tuple) -> bool:
        return group[5] <= INLINE_MAX_BYTES and group[8] <= INLINE_MAX_ROWS

    def write_group(self, group: tuple) -> int:
        """Write one group in one transaction; returns the last epoch it covers."""
        events, wants, saves, releases, last, _, tops, retains, _, wal = group
        retained = [
            (k.topic, k.wall_ns, k.pubend, k.tick, None if k.event is None else _encode(k.event))
            for k in retains.values()
            if k is not None
        ]
        forgotten = [(topic,) for topic, k in retains.items() if k is None]
        dropped = [(name,) for name, state in saves.items() if state is None]
        saved = [_session_row(state) for state in saves.values() if state is not None]
        wal += SESSION_WAL * len(saves) + sum(
            len(r[3]) + len(r[6]) + len(r[7] or b"") for r in saved
        )

        def work(w: sqlite3.Connection) -> None:
            w.executemany(
                "INSERT INTO events (epoch, pubend, item, gap_to, why, tick, stored_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                events,
            )
            w.executemany("INSERT OR REPLACE INTO tops (pubend, tick) VALUES (?, ?)", tops.items())
            w.executemany("INSERT INTO wants (key, epoch, subs) VALUES (?, ?, ?)", wants)
            w.executemany("INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?, ?)", retained)
            w.executemany("DELETE FROM retained WHERE topic = ?", forgotten)
            w.executemany("DELETE FROM sessions WHERE name = ?", dropped)
            w.executemany(
                "INSERT OR REPLACE INTO sessions"
                " (name, key, owner, subs, created, acked, retention, handover)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                saved,
            )
            for key, upto in releases.items():
                upto = last if upto < 0 else upto
                # the events only this session still wanted go with its matching records
                w.execute(
                    "DELETE FROM events WHERE epoch IN"
                    " (SELECT epoch FROM wants WHERE key = ? AND epoch <= ?) AND NOT EXISTS"
                    " (SELECT 1 FROM wants o WHERE o.epoch = events.epoch AND o.key != ?)",
                    (key, upto, key),
                )
                w.execute("DELETE FROM wants WHERE key = ? AND epoch <= ?", (key, upto))
            w.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last', ?)", (str(last),))

        self._transaction(work)
        self._wal += wal
        return last

    @property
    def _what(self) -> str:
        return f"session store {self.path}"

    def committed_to(self, epoch: int) -> None:
        self._committed = max(self._committed, epoch)
        self._saved_durable = self._saved_taken
        self.uncommitted -= self._taken_held
        self._taken_held = 0

    @property
    def saved(self) -> int:
        return self._saved

    def durable(self, saved: int) -> bool:
        return saved <= self._saved_durable

    def _transaction(self, work) -> None:
        transaction(self._writer, work, self._what)

    def _query(self, sql: str, args: tuple) -> list:
        try:
            return self._reader.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise OperationError(f"{self._what}: {exc}") from None

    def close(self) -> None:
        self._close_backfill()
        for conn in (self._reader, self._writer):
            conn.close()


def _session_row(state: SessionState) -> tuple:
    """The ``sessions`` row of ``state``: name, key, owner, subs, created, acked, retention,
    handover (the hand-over, floors, reads, QoS 2 marks, expiry and will, if it has any)."""
    retention = (
        state.max_events,
        state.max_age,
        state.trimmed,
        state.gaps,
        state.dropped,
        state.gap_why,
    )
    kept = (
        state.handover
        or state.floors
        or state.reading
        or state.qos2
        or state.rel
        or state.expiry
        or state.will is not None
    )
    handover = None
    if kept:
        handover = _encode(
            {
                "handover": state.handover,
                "floors": state.floors,
                "reading": state.reading,
                "qos2": sorted(state.qos2),
                "rel": sorted(state.rel),
                "expiry": state.expiry,
                "will": None if state.will is None else _encode(state.will),
                "will_delay": state.will_delay,
            }
        )
    return (
        state.name,
        state.key,
        state.owner,
        _encode(state.subs),
        state.created,
        state.acked,
        _encode(retention),
        handover,
    )
