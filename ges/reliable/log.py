"""The pubend log interface, and the in-memory log the simulator and tests use (seed 001 §2).

Only the publishing broker stores events (seed 002 §1: "the pubend logs once"). A log holds one
pubend's events by tick; ``append`` takes a batch with consecutive ticks and ``committed`` says
how far they are durable, so a driver with an asynchronous writer (group commit in a thread)
lets the core hold a publisher's acknowledgement, and the forwarding of the events, until their
batch is committed. ``epoch`` names the stream: it is the same across restarts for a log that
survives them, so the pubend's ticks go on where they stopped.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Protocol

#: Events a Recovered answer carries at most (the nacker asks again for the rest).
MAX_READ = 512
#: Events an in-memory log holds; the oldest are dropped beyond it, and a nack for them is
#: answered as lost (the subscriber's broker logs a warning; nothing is passed off as silence).
MAX_MEMORY_EVENTS = 1_000_000


class PubendLog(Protocol):
    epoch: int
    #: the pubend's V_m digest and clock table as of the last change (:mod:`ges.reliable.vt`);
    #: a log whose epoch goes on across restarts keeps it, one that opens a new epoch at each
    #: start (a new stream) may start it empty
    clocks: tuple[int, dict]

    @property
    def last(self) -> int:
        """The highest tick appended (0 for none)."""

    @property
    def committed(self) -> int:
        """The highest tick that is durable."""

    def append(self, first: int, events: list) -> None: ...

    def read(self, lo: int, hi: int, limit: int = MAX_READ) -> list[tuple[int, object]]:
        """``(tick, event)`` for the ticks of ``lo..hi`` held, at most ``limit``, in order."""

    def lowest(self, epoch: int | None = None) -> int:
        """The lowest tick held of an epoch (this one by default): those below it were
        released or dropped by the log's bound (lost)."""

    def released(self, epoch: int | None = None) -> int:
        """The highest tick of an epoch (this one by default) released: every other broker
        acknowledged it, so no subscription needs it (0: none)."""

    def release(self, upto: int) -> None:
        """Every other broker acknowledged this epoch's ticks up to ``upto``: drop them."""

    def promised(self) -> dict[str, tuple[str, int]]:
        """This broker's acknowledgements (its stable storage keeps them across crashes): per
        publishing broker, its pubend and the tick acknowledged. The live dict."""

    def promise(self, broker: str, pubend: str, tick: int) -> None:
        """Keep an acknowledgement before it is sent."""


class MemoryLog:
    """A log in memory. It survives a simulated broker crash when the simulator keeps the object
    (its stable storage) and hands it to the restarted core."""

    def __init__(self, epoch: int = 1, *, max_events: int = MAX_MEMORY_EVENTS):
        self.epoch = epoch
        #: the pubend's V_m digest and clock table (:mod:`ges.reliable.vt`): its stream goes on
        #: across restarts, so the V_m it stamps must not shrink
        self.clocks: tuple[int, dict] = (0, {})
        self.max_events = max_events
        self._ticks: list[int] = []
        self._events: list = []
        self._released = 0
        self._last = 0
        self._promises: dict[str, tuple[str, int]] = {}

    @property
    def last(self) -> int:
        return self._last

    @property
    def committed(self) -> int:
        return self.last

    def append(self, first: int, events: list) -> None:
        if events and first <= self.last:
            raise ValueError(f"tick {first} appended after {self.last}")
        self._ticks.extend(range(first, first + len(events)))
        self._events.extend(events)
        if events:
            self._last = first + len(events) - 1
        over = len(self._ticks) - self.max_events
        if over > 0:  # beyond the bound the oldest go (a nack for them is answered as lost)
            del self._ticks[:over], self._events[:over]

    def read(self, lo: int, hi: int, limit: int = MAX_READ) -> list[tuple[int, object]]:
        i = bisect_left(self._ticks, lo)
        j = min(bisect_left(self._ticks, hi + 1), i + limit)
        return list(zip(self._ticks[i:j], self._events[i:j], strict=True))

    def lowest(self, epoch: int | None = None) -> int:
        if epoch is not None and epoch != self.epoch:
            return 1 << 62  # it holds no other epoch
        return self._ticks[0] if self._ticks else self.last + 1

    def released(self, epoch: int | None = None) -> int:
        return self._released if epoch is None or epoch == self.epoch else 0

    def release(self, upto: int) -> None:
        upto = min(upto, self.last)
        if upto <= self._released:
            return
        self._released = upto
        n = bisect_left(self._ticks, upto + 1)
        del self._ticks[:n], self._events[:n]

    def promised(self) -> dict[str, tuple[str, int]]:
        return self._promises

    def promise(self, broker: str, pubend: str, tick: int) -> None:
        self._promises[broker] = (pubend, tick)

    def __len__(self) -> int:
        return len(self._ticks)
