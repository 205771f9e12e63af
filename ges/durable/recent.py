"""The events a session store appended last, kept in memory too (bounded in bytes).

A replicator streams a session from its store (seed 001 §4.2): what is appended is committed,
then read back and sent. For a client that keeps up, the read-back is of what was written a
moment ago; :class:`Recent` keeps those events, as the items a read returns, so the store reads
them from memory and goes to its file only for what is older (a client catching up after time
away, or one slower than the cache is long).

The cache answers for a session only where it is sure to hold every event the session wants:
after its *floor*, the newest epoch it let go of for that session (or, for a session it never
let go of, the store's last epoch when the cache began). Older events are evicted first, once
the events held are over ``limit`` bytes — each counted as its encoded size and what the
objects holding it take (:data:`EVENT_OVERHEAD`, :data:`ATTRIBUTE_OVERHEAD` per attribute,
:data:`WANT_OVERHEAD` per session it is held for); what a session releases leaves at once.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from itertools import islice

from ges.durable.store import page
from ges.wire import messages as m

#: What holding one event costs beyond its encoded size (its decoded objects: the item, the
#: event, its attribute dict and values), and each session it is held for (a SessionItem, its
#: list of subscriptions, a slot in a deque); measured with tracemalloc, rounded up.
EVENT_OVERHEAD = 640
WANT_OVERHEAD = 224
#: ... and each of its attributes (a dict slot, its name and value as objects)
ATTRIBUTE_OVERHEAD = 144


def _epoch(item: m.SessionItem) -> int:
    return item.epoch


class Recent:
    """The last appended events of a store, per session key, at most ``limit`` bytes."""

    def __init__(self, since: int, limit: int):
        #: every event appended after this epoch went through :meth:`add`
        self.since = since
        self.limit = limit
        #: the bytes of the events held (their encoded size, as given to :meth:`add`)
        self.bytes = 0
        self._order: deque[tuple[int, int, list[int]]] = deque()  # (epoch, bytes, keys)
        self._items: dict[int, deque[m.SessionItem]] = {}
        #: per key that lost an event to eviction: the newest epoch it lost
        self._floor: dict[int, int] = {}

    def add(
        self,
        epoch: int,
        pubend: str,
        item: m.EventItem,
        wants: list[tuple[int, list[int]]],
        gap_to: int,
        why: str,
        size: int,
    ) -> int:
        """The store appended ``item`` as ``epoch`` for ``wants`` ((key, subs) pairs), ``size``
        bytes encoded; returns what holding it counts (whether it is held or not)."""
        size += (
            EVENT_OVERHEAD
            + ATTRIBUTE_OVERHEAD * len(item.event.attributes)
            + WANT_OVERHEAD * len(wants)
        )
        if size > self.limit:  # never held: the sessions it is for read it from the file
            for key, _ in wants:
                self._lose(epoch, key)
            return size
        keys = []
        for key, subs in wants:
            held = self._items.get(key)
            if held is None:
                held = self._items[key] = deque()
            held.append(m.SessionItem(epoch, pubend, item, subs, gap_to, why))
            keys.append(key)
        self._order.append((epoch, size, keys))
        self.bytes += size
        while self.bytes > self.limit:
            old, old_size, old_keys = self._order.popleft()
            self.bytes -= old_size
            for key in old_keys:
                held = self._items.get(key)
                if held and held[0].epoch == old:  # (else released, or the session is gone)
                    held.popleft()
                    if not held:
                        del self._items[key]
                    self._lose(old, key)
        return size

    def _lose(self, epoch: int, key: int) -> None:
        """Session ``key`` wants ``epoch``, which is not held (any more)."""
        if epoch > self._floor.get(key, self.since):
            self._floor[key] = epoch

    def covers(self, key: int, after: int) -> bool:
        """Whether every event session ``key`` wants after ``after`` is held here."""
        return after >= self._floor.get(key, self.since)

    def read(self, key: int, after: int, upto: int, limit: int, max_bytes: int) -> list:
        """As the store's read, from memory (only where :meth:`covers` says so): the session's
        events after ``after`` and at most ``upto``, ``limit`` of them at most, stopping once
        their events' sizes reach ``max_bytes``."""
        held = self._items.get(key)
        if not held:
            return []
        i = bisect_right(held, after, key=_epoch)
        j = min(bisect_right(held, upto, key=_epoch), i + limit)
        return page(islice(held, i, j), max_bytes)

    def release(self, key: int, upto: int) -> None:
        """Session ``key`` no longer wants what is at most ``upto`` (< 0: anything)."""
        held = self._items.get(key)
        if held is None:
            return
        if upto < 0:
            del self._items[key]
            return
        while held and held[0].epoch <= upto:
            held.popleft()
        if not held:
            del self._items[key]

    def forget(self, key: int) -> None:
        """Session ``key`` is gone: nothing of it is held or remembered."""
        self._items.pop(key, None)
        self._floor.pop(key, None)
