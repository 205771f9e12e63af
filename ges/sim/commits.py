"""A pubend log and a session store that commit a group at a time, later, as the runtime's do.

The trio runtime appends a publish to its log at once and commits everything appended since
the last group in one transaction (``ges.runtime.commits``); only then does the core
acknowledge the publishes and match them (``BrokerCore.on_logged``). Meanwhile the world goes
on: frames arrive, the same client's next requests are read. :class:`GroupLog` gives the
simulator that window. The simulator commits the group after a delay it draws and then tells
the core.

The replicators' session stores (:class:`GroupSessionStore`) are committed the same way, and
then the replicator is told (``Replicator.on_committed``).

A broker that crashes with a group in flight has it written, or lost, half the time each: the
runtime's two outcomes of a ``kill -9``, the transaction finished (its acknowledgements never
went) or it never did. A log's group is lost with :meth:`EpochGroupLog.lose`, a session
store's with :meth:`GroupSessionStore.lose`.

A pubend log is kept as the runtime's file keeps it (``ges.runtime.pubend_log``):
:class:`EpochLog` opens a new epoch of the pubend at each start of its broker (ticks from 1
again, V_m empty), keeps the earlier epochs' events for the nacks that ask for them, names
those still holding events (``earlier``, whose ends the restarted pubend announces), and keeps
its publishers' numbers and its promises across the epochs. A lost group's ticks are so never used again.
"""

from __future__ import annotations

from bisect import bisect_left

from ges.durable.store import MAX_READ, MemorySessionStore
from ges.reliable.log import MAX_EARLIER, NO_END, MemoryLog, NamedEpochs
from ges.reliable.log import MAX_READ as MAX_LOG_READ


class EpochLog(NamedEpochs, MemoryLog):
    """A :class:`MemoryLog` that is a broker's log file across its restarts: :meth:`reopen`
    gives the log of the next start, a new epoch, and the earlier epochs stay readable."""

    def __init__(self, epoch: int = 1, older: dict | None = None, **bounds):
        super().__init__(epoch, **bounds)
        #: the earlier epochs, by number (they take no more appends)
        self._older: dict[int, EpochLog] = {} if older is None else older
        #: those holding ticks past what was released when this epoch opened, newest first,
        #: at most MAX_EARLIER (as the runtime's file names them at its start)
        self._earlier = sorted(
            ((e, old.last) for e, old in self._older.items() if old.released() < old.last),
            reverse=True,
        )[:MAX_EARLIER]

    def reopen(self) -> EpochLog:
        """The log its broker's next start opens: the next epoch, with this one's publishers
        and promises (the file keeps them)."""
        self._older[self.epoch] = self
        bounds = {"max_events": self.max_events, "max_bytes": self.max_bytes}
        new = type(self)(self.epoch + 1, self._older, **bounds, max_publishers=self.max_publishers)
        new._publishers = self._publishers
        new._promises = self._promises
        return new

    def read_epoch(
        self, epoch: int, lo: int, hi: int, limit: int = MAX_LOG_READ
    ) -> list[tuple[int, object]]:
        log = self if epoch == self.epoch else self._older.get(epoch)
        return [] if log is None else log.read(lo, hi, limit)

    def lowest(self, epoch: int | None = None) -> int:
        if epoch is None or epoch == self.epoch:
            return super().lowest()
        old = self._older.get(epoch)
        if old is None:
            return NO_END
        return old._ticks[0] if old._ticks else old.last + 1

    def ended(self, epoch: int) -> int:
        if epoch == self.epoch:
            return self.committed
        old = self._older.get(epoch)
        return NO_END if old is None else old.last

    def released(self, epoch: int | None = None) -> int:
        if epoch is None or epoch == self.epoch:
            return super().released()
        old = self._older.get(epoch)
        return 0 if old is None else old._released

    def release(self, upto: int, epoch: int | None = None) -> None:
        if epoch is None or epoch == self.epoch:
            super().release(upto)
            return
        old = self._older.get(epoch)
        if old is not None:
            old.release(upto)

    def epochs_ended(self) -> tuple[int, int]:
        """Of the earlier epochs that logged events: how many, and how many of them are not
        released to their end (``ges simulate`` reports both)."""
        logged = [old for old in self._older.values() if old.last]
        return len(logged), sum(old.released() < old.last for old in logged)


class GroupLog(MemoryLog):
    """A :class:`MemoryLog` whose appends are durable only once :meth:`commit` is called."""

    def __init__(self, epoch: int = 1, **bounds):
        super().__init__(epoch, **bounds)
        self._committed = 0
        #: the publishers' numbers as the last commit left them (what :meth:`lose` goes back to)
        self._kept_publishers: dict = {}

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def pending(self) -> bool:
        """Appends wait for a commit."""
        return self._committed < self.last

    def commit(self) -> None:
        """Everything appended so far is durable."""
        self._committed = self.last
        self._kept_publishers = dict(self._publishers)

    def read(self, lo: int, hi: int, limit: int = MAX_LOG_READ) -> list[tuple[int, object]]:
        """As the runtime's log reads: what is committed only."""
        return super().read(lo, min(hi, self._committed), limit)

    def release(self, upto: int, epoch: int | None = None) -> None:
        if epoch is None or epoch == self.epoch:
            super().release(min(upto, self._committed))

    def lose(self) -> None:
        """The group in flight is lost (its broker died before the transaction finished): the
        log holds what its last commit left, and so do its publishers' numbers."""
        n = bisect_left(self._ticks, self._committed + 1)
        self._bytes -= sum(self._sizes[n:])
        del self._ticks[n:], self._events[n:], self._sizes[n:]
        self._last = self._committed
        self._publishers.clear()
        self._publishers.update(self._kept_publishers)


class EpochGroupLog(EpochLog, GroupLog):
    """An :class:`EpochLog` committed a group at a time (:class:`GroupLog`)."""

    def reopen(self) -> EpochGroupLog:
        new = super().reopen()
        new._kept_publishers = dict(self._publishers)
        return new


class GroupSessionStore(MemorySessionStore):
    """A :class:`MemorySessionStore` committed a group at a time, as the runtime's session
    store is (``SqliteSessionStore``): the events appended for sessions, and the sessions and
    retained messages saved (``saved`` counts them, ``durable`` says whether a count is), are
    durable only once :meth:`commit` is called. Until then the replicator streams none of
    those events and acknowledges none of them to the pubends' release rounds."""

    def __init__(self, store_id: str = "memory", clock=lambda: 0.0):
        super().__init__(store_id, clock)
        self._committed = 0
        self._saves = self._saves_durable = 0
        #: what the last commit left (what :meth:`lose` goes back to)
        self._kept = self._state()

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def saved(self) -> int:
        return self._saves

    def durable(self, saved: int) -> bool:
        return saved <= self._saves_durable

    def save_session(self, state) -> None:
        super().save_session(state)
        self._saves += 1

    def drop_session(self, state) -> None:
        super().drop_session(state)
        self._saves += 1

    def retain(self, kept) -> None:
        super().retain(kept)
        self._saves += 1

    def read(self, key: int, after: int, limit: int = MAX_READ, max_bytes: int = 1 << 20) -> list:
        """As the runtime's store reads: what is committed only."""
        return [
            it for it in super().read(key, after, limit, max_bytes) if it.epoch <= self._committed
        ]

    @property
    def pending(self) -> bool:
        """Appends or saves wait for a commit."""
        return self._committed < self.last or self._saves_durable < self._saves

    def commit(self) -> None:
        """Everything appended and saved so far is durable."""
        self._committed = self.last
        self._saves_durable = self._saves
        self._kept = self._state()

    def kept_sessions(self) -> dict:
        """The sessions as the last commit left them (what a crash now would keep)."""
        return self._kept[0]

    def lose(self) -> None:
        """The group in flight is lost (its broker died before the transaction finished):
        the store is as its last commit left it."""
        (self._sessions, self._events, self._wants, self._last, self._tops, self._retained,
         self._times) = self._kept  # fmt: skip
        self._kept = self._state()  # (a copy: what was restored changes from here on)
        self._saves = self._saves_durable

    def _state(self) -> tuple:
        """A copy of what the store holds (what it keeps of sessions and retained messages
        is not changed in place; what an event is held for is)."""
        events = {e: (p, it, dict(w), g, y) for e, (p, it, w, g, y) in self._events.items()}
        wants = {k: list(v) for k, v in self._wants.items()}
        return (dict(self._sessions), events, wants, self._last, dict(self._tops),
                dict(self._retained), list(self._times))  # fmt: skip
