"""Nack repair near the loss: a keeper's cache of recent events, and consolidated nacks.

A subend's nack travels hop by hop towards the pubend's broker. Two things shorten that trip
(seed 002 §2.3: curiosity is satisfied by the nearest node that knows the ticks; the issue asks
for one upstream nack per hop however many subends miss the same ticks):

* **A keeper answers from its cache.** Every broker that keeps a unit keeps the last events of
  each pubend it routed (:class:`EventCache`, bounded). A keeper of a unit containing the
  nack's origin answers a range itself when it *knows* the whole range for that unit (its
  claims say which ticks had data there and which were silence,
  :meth:`ges.reliable.claims.Claims.knows`) and its cache still holds every event it routed in
  the range. Its answer is as good as the log's: every event in the range that could match a
  subscriber in the unit, the rest silence — the subend matches the events itself.
* **A relay holds back a nack it has just sent on** (:class:`NackBoard`). A nack for ticks of
  a pubend that an earlier nack through this broker already asked for, less than
  :data:`HOLD` seconds ago, is not sent on again; its origin waits with the earlier one, and
  when the answer passes back through this broker (or is made here), a copy of it goes to every
  origin that waited. An answer that takes another way back leaves the waiters to ask again
  after their own timeout, by when the hold has lapsed.

Both are soft state and bounded; losing them costs nacks, never correctness.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from ges.wire.messages import held_size

#: Events kept per pubend, and pubends kept (the least recently routed goes first); and the
#: bytes of those events (ges.wire.event_size), per pubend and in all.
MAX_CACHED_EVENTS = 4_096
MAX_CACHED_PUBENDS = 128
MAX_CACHED_BYTES = 8 * 1024 * 1024
MAX_CACHE_BYTES = 64 * 1024 * 1024
#: Seconds a relay holds back a nack covered by one it sent on.
HOLD = 0.25
#: Nacks held per pubend, and origins waiting on one (more are sent on as they come).
MAX_HELD = 256
MAX_WAITERS = 64


class _Recent:
    __slots__ = ("items", "order", "floor", "bytes")

    def __init__(self):
        #: tick -> (the event item routed at it, its bytes)
        self.items: dict[int, tuple[Any, int]] = {}
        #: ticks in the order they were added (the oldest is dropped first)
        self.order: deque[int] = deque()
        #: every tick above this one that was routed here is in ``items``
        self.floor = 0
        self.bytes = 0


class EventCache:
    """The recent events of each pubend one broker routed (see the module docstring)."""

    def __init__(
        self,
        *,
        max_events: int = MAX_CACHED_EVENTS,
        max_pubends: int = MAX_CACHED_PUBENDS,
        max_bytes: int = MAX_CACHED_BYTES,
        max_total: int = MAX_CACHE_BYTES,
    ):
        self.max_events = max_events
        self.max_pubends = max_pubends
        self.max_bytes = max_bytes
        self.max_total = max_total
        self._pubends: OrderedDict[str, _Recent] = OrderedDict()
        self._bytes = 0

    def add(self, pubend: str, items, *, routed_before: int = 0) -> None:
        """Items (``.tick`` set) this broker routed for ``pubend``; ``routed_before``: the
        highest tick it had routed before these (a pubend's cache is whole only above both that
        and the lowest tick it starts with: it may have been dropped and made again)."""
        got = self._pubends.get(pubend)
        if got is None:
            if not items:
                return
            got = self._pubends[pubend] = _Recent()
            got.floor = max(routed_before, min(it.tick for it in items) - 1)
            if len(self._pubends) > self.max_pubends:
                self._bytes -= self._pubends.popitem(last=False)[1].bytes
        else:
            self._pubends.move_to_end(pubend)
        cached, order = got.items, got.order
        for it in items:
            tick = it.tick
            if tick <= got.floor or tick in cached:
                continue
            size = held_size(it)
            cached[tick] = (it, size)
            got.bytes += size
            self._bytes += size
            order.append(tick)
        while order and (len(order) > self.max_events or got.bytes > self.max_bytes):
            self._drop_oldest(got)
        while self._bytes > self.max_total and len(self._pubends) > 1:
            self._bytes -= self._pubends.popitem(last=False)[1].bytes  # the least recent
        while order and self._bytes > self.max_total:
            self._drop_oldest(got)

    def _drop_oldest(self, got: _Recent) -> None:
        gone = got.order.popleft()
        _, size = got.items.pop(gone)
        got.bytes -= size
        self._bytes -= size
        if gone > got.floor:
            got.floor = gone

    def read(self, pubend: str, lo: int, hi: int) -> list | None:
        """Every item routed here in ``lo..hi``, in tick order; None if some may have been
        dropped (or this pubend was never routed here)."""
        got = self._pubends.get(pubend)
        if got is None or lo <= got.floor:
            return None
        cached = got.items
        if hi - lo < len(cached):
            return [cached[t][0] for t in range(lo, hi + 1) if t in cached]
        return sorted(
            (it for t, (it, _) in cached.items() if lo <= t <= hi), key=lambda it: it.tick
        )


class NackBoard:
    """Nacks this broker sent on towards a pubend, and the origins waiting on each."""

    def __init__(self, *, hold: float = HOLD):
        self.hold = hold
        #: pubend -> [lo, hi, until, {origin: (lo, hi)}] per nack sent on
        self._held: dict[str, list[list]] = {}

    def ask(self, pubend: str, origin: str, ranges, now: float) -> list[tuple[int, int]]:
        """``origin`` asks for ``ranges``: those to send on (the others wait with a nack sent on
        before that covers them)."""
        held = self._held.get(pubend)
        if held is not None:
            held[:] = [h for h in held if h[2] > now]
        out = []
        for lo, hi in ranges:
            if held:
                cover = next((h for h in held if h[0] <= lo and hi <= h[1]), None)
                # an origin asking again has waited long enough: its ask goes on
                if cover is not None and origin not in cover[3] and len(cover[3]) < MAX_WAITERS:
                    cover[3][origin] = (lo, hi)
                    continue
            out.append((lo, hi))
            if held is None:
                if len(self._held) >= MAX_HELD:
                    self._lapse(now)
                if len(self._held) >= MAX_HELD:
                    continue  # too many pubends held already: send on without holding
                held = self._held[pubend] = []
            if len(held) < MAX_HELD:
                held.append([lo, hi, now + self.hold, {origin: (lo, hi)}])
        return out

    def _lapse(self, now: float) -> None:
        """Forget every hold that has lapsed."""
        for pubend in list(self._held):
            held = [h for h in self._held[pubend] if h[2] > now]
            if held:
                self._held[pubend] = held
            else:
                del self._held[pubend]

    def answered(
        self, pubend: str, lo: int, hi: int, to: str, inside
    ) -> list[tuple[str, int, int]]:
        """An answer for ``lo..hi`` passes on its way to ``to``, whole for the origins for
        which ``inside(origin)`` holds: ``(origin, lo, hi)`` for every other such origin waiting
        on a nack it overlaps (each gets the part of what it asked for that the answer has, and
        asks again for the rest). A held nack stays held while some origin waits on it."""
        held = self._held.get(pubend)
        if not held:
            return []
        out = []
        keep = []
        sent: set[str] = set()
        for h in held:
            if h[0] <= hi and lo <= h[1]:
                waiting = h[3]
                for o, (a, b) in list(waiting.items()):
                    if o == to or (a <= hi and lo <= b and inside(o)):
                        del waiting[o]
                        if o != to and o not in sent:  # one copy, if it waits twice
                            sent.add(o)
                            out.append((o, max(a, lo), min(b, hi)))
                if waiting:
                    keep.append(h)
            else:
                keep.append(h)
        if keep:
            self._held[pubend] = keep
        else:
            del self._held[pubend]
        return out

    def __len__(self) -> int:
        return sum(len(h) for h in self._held.values())
