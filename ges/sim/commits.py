"""A pubend log and a session store that commit a group at a time, later, as the runtime's do.

The trio runtime appends a publish to its log at once and commits everything appended since
the last group in one transaction (``ges.runtime.commits``); only then does the core
acknowledge the publishes and match them (``BrokerCore.on_logged``). Meanwhile the world goes
on: frames arrive, the same client's next requests are read. :class:`GroupLog` gives the
simulator that window. The simulator commits the group after a delay it draws and then tells
the core.

The replicators' session stores (:class:`GroupSessionStore`) are committed the same way, and
then the replicator is told (``Replicator.on_committed``).

A broker that crashes with a group of its log in flight has it written just before it died.
The core's ``on_logged`` never ran for it, so its publishers were never acknowledged. This is
one of the runtime's outcomes of a ``kill -9``: the transaction finished, the acknowledgement
did not go. A session store's group in flight is written, or lost (:meth:`GroupSessionStore.lose`),
half the time each: the runtime's other outcome, the transaction never finished. (A log's lost
group is not modelled: the runtime opens a new epoch of its pubend at each start, so a lost
group's ticks are never used again, while the simulator's log goes on in one epoch.)
"""

from __future__ import annotations

from ges.durable.store import MAX_READ, MemorySessionStore
from ges.reliable.log import MemoryLog


class GroupLog(MemoryLog):
    """A :class:`MemoryLog` whose appends are durable only once :meth:`commit` is called."""

    def __init__(self, epoch: int = 1):
        super().__init__(epoch)
        self._committed = 0

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
