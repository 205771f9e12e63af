"""A knowledge stream: what one node knows about the ticks of one pubend (seed 002 §2.1).

Every tick of a pubend's stream is, at each node of the knowledge graph, one of

* ``Q`` — nothing known yet;
* ``D`` — a data message was published at this tick (the stream holds it);
* ``F`` — final: no data is needed here, because none was published, or it was filtered out on
  the way (silence, ``S``), or it has been delivered and acknowledged (``D*``). Seed 002 treats
  S and F alike (§2.1: "in this algorithm F and S are treated the same"), and so does GES.

The values form the chain ``Q < D < F``; knowledge only *accumulates* by least upper bound
(§2.1: "the node changes its state to the lattice least upper bound between its previous state
and the new value"), so a late or duplicate copy of anything never lowers a tick, and a D that
arrives for a tick already final is ignored — the property that makes delivery exactly-once.

Storage is by ranges, never one object per tick: final ticks are disjoint ``[lo, hi]`` ranges
(merged as they touch), ``D`` ticks are a sorted map to their payloads, and everything below
``floor`` is final and forgotten. The number of final ranges and of held ``D`` ticks is bounded
(:data:`MAX_RANGES`, :data:`MAX_DATA`); a stream over either bound refuses more instead of
growing, and the caller (a subend or a forwarding cache) decides what to do — nack, drop, or
disconnect a slow consumer.

The *doubt horizon* (§2.3) is the first tick that is still ``Q``: every tick below it is known.
A subend delivers the ``D`` ticks below the horizon in tick order and then marks them final;
the ``Q`` ranges between the horizon and the highest known tick are the *gaps* that turn into
curiosity (nacks) when they persist.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from typing import Any

Q = 0
D = 1
F = 2

#: Disjoint final ranges a stream may hold above its floor (holes between them are gaps).
MAX_RANGES = 4_096
#: Data ticks a stream may hold at once, and their bytes (with a ``size`` function).
MAX_DATA = 65_536
MAX_DATA_BYTES = 16 * 1024 * 1024


class StreamFull(Exception):
    """The stream is at one of its bounds and would have to grow to take this knowledge."""


class HeldBytes:
    """Bytes of data held by several streams together, and their limit (a broker's subends)."""

    __slots__ = ("used", "limit")

    def __init__(self, limit: int) -> None:
        self.used = 0
        self.limit = limit


class KnowledgeStream:
    """Knowledge about one pubend's ticks ``1, 2, …`` at one node (see the module docstring).

    With ``size`` (a payload's bytes), the data held is bounded in bytes too: ``max_bytes`` for
    this stream, and ``shared.limit`` for all the streams sharing ``shared``."""

    __slots__ = (
        "floor",
        "_los",
        "_his",
        "_data",
        "_data_ticks",
        "max_ranges",
        "max_data",
        "max_bytes",
        "_size",
        "_sizes",
        "_bytes",
        "_shared",
    )

    def __init__(
        self,
        *,
        floor: int = 0,
        max_ranges: int = MAX_RANGES,
        max_data: int = MAX_DATA,
        max_bytes: int = MAX_DATA_BYTES,
        size: Callable[[Any], int] | None = None,
        shared: HeldBytes | None = None,
    ):
        #: every tick <= floor is final
        self.floor = floor
        self._los: list[int] = []  # final ranges above the floor, sorted and disjoint
        self._his: list[int] = []
        self._data: dict[int, Any] = {}
        self._data_ticks: list[int] = []  # sorted keys of _data
        self.max_ranges = max_ranges
        self.max_data = max_data
        self.max_bytes = max_bytes
        self._size = size
        self._sizes: dict[int, int] = {}  # tick -> bytes (with a size function)
        self._bytes = 0
        self._shared = shared

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def release(self) -> None:
        """The stream is dropped: what it holds no longer counts against the shared bound."""
        if self._shared is not None:
            self._shared.used -= self._bytes
        self._bytes = 0
        self._sizes.clear()
        self._data.clear()
        self._data_ticks.clear()

    def _forget(self, tick: int) -> Any:
        """Take a data tick out, with its bytes."""
        if self._size is not None:
            n = self._sizes.pop(tick, 0)
            self._bytes -= n
            if self._shared is not None:
                self._shared.used -= n
        return self._data.pop(tick)

    # -- reading -----------------------------------------------------------------------------------

    def value(self, tick: int) -> int:
        if tick <= self.floor or self._final_at(tick):
            return F
        return D if tick in self._data else Q

    @property
    def horizon(self) -> int:
        """The doubt horizon: the lowest tick that is still ``Q``."""
        t = self.floor + 1
        los, his, data = self._los, self._his, self._data
        while True:
            if t in data:
                t += 1
                continue
            i = bisect_right(los, t) - 1
            if i >= 0 and t <= his[i]:
                t = his[i] + 1
                continue
            return t

    @property
    def known_to(self) -> int:
        """The highest tick that is not ``Q`` (the floor if none above it is)."""
        top = self.floor
        if self._his:
            top = max(top, self._his[-1])
        if self._data_ticks:
            top = max(top, self._data_ticks[-1])
        return top

    def gaps(self, upto: int = 0) -> Iterator[tuple[int, int]]:
        """The ``Q`` ranges up to :attr:`known_to` (or ``upto``, if higher), lowest first."""
        t = self.floor + 1
        top = max(self.known_to, upto)
        d = self._data_ticks
        di = 0
        ri = 0
        los, his = self._los, self._his
        while t <= top:
            while ri < len(los) and his[ri] < t:
                ri += 1
            while di < len(d) and d[di] < t:
                di += 1
            if ri < len(los) and los[ri] <= t:
                t = his[ri] + 1
                continue
            if di < len(d) and d[di] == t:
                t += 1
                continue
            nxt = min(los[ri] if ri < len(los) else top + 1, d[di] if di < len(d) else top + 1)
            yield (t, nxt - 1)
            t = nxt

    def __len__(self) -> int:
        """Objects held: final ranges plus data ticks (bounded; 1 for a quiet in-order stream)."""
        return len(self._los) + len(self._data)

    # -- accumulating (least upper bound) ---------------------------------------------------------

    def add_data(self, tick: int, payload: Any) -> bool:
        """Accumulate ``D`` at ``tick``; True if the tick was ``Q`` (new data)."""
        if tick <= self.floor or self._final_at(tick) or tick in self._data:
            return False
        if len(self._data) >= self.max_data:
            raise StreamFull(f"{self.max_data} data ticks held")
        if self._size is not None:
            n = self._size(payload)
            shared = self._shared
            over = self._bytes + n > self.max_bytes or (
                shared is not None and shared.used + n > shared.limit
            )
            # over a bound only the tick at the doubt horizon still goes in: it is delivered
            # at once, and without it the stream could never move on
            if over and tick != self.horizon:
                raise StreamFull(f"{self._bytes} bytes of data held")
            self._sizes[tick] = n
            self._bytes += n
            if shared is not None:
                shared.used += n
        self._data[tick] = payload
        d = self._data_ticks
        if not d or tick > d[-1]:
            d.append(tick)
        else:
            d.insert(bisect_left(d, tick), tick)
        return True

    def add_final(self, lo: int, hi: int) -> None:
        """Accumulate ``F`` over ``lo..hi`` (silence, or data delivered and acknowledged)."""
        lo = max(lo, self.floor + 1)
        if lo > hi:
            return
        los, his = self._los, self._his
        i = bisect_left(his, lo - 1)  # first range that ends at or after lo - 1
        j = bisect_right(los, hi + 1)  # ranges i..j-1 touch or overlap lo..hi
        if i < j:
            lo = min(lo, los[i])
            hi = max(hi, his[j - 1])
        elif len(los) >= self.max_ranges:
            raise StreamFull(f"{self.max_ranges} final ranges held")
        los[i:j] = [lo]
        his[i:j] = [hi]
        d = self._data_ticks
        a, b = bisect_left(d, lo), bisect_right(d, hi)
        if a < b:
            for t in d[a:b]:
                self._forget(t)
            del d[a:b]
        self._compact()

    def _final_at(self, tick: int) -> bool:
        i = bisect_right(self._los, tick) - 1
        return i >= 0 and tick <= self._his[i]

    def _compact(self) -> None:
        """Fold a final range that starts right above the floor into the floor."""
        if self._los and self._los[0] <= self.floor + 1:
            self.floor = max(self.floor, self._his[0])
            del self._los[0], self._his[0]

    # -- delivering (subend, seed 002 §2.3) --------------------------------------------------------

    def take_deliverable(self) -> list[tuple[int, Any]]:
        """The ``D`` ticks below the doubt horizon, in tick order, each then made final."""
        h = self.horizon
        d = self._data_ticks
        n = bisect_left(d, h)
        if not n:
            return []
        out = [(t, self._forget(t)) for t in d[:n]]
        del d[:n]
        # everything below the horizon is now final
        self.add_final(self.floor + 1, h - 1)
        return out

    def add_silence(self, lo: int, hi: int) -> None:
        """Accumulate silence over the ``Q`` ticks of ``lo..hi``: a claim that nothing there was
        for this node leaves the data it did receive in place."""
        d = self._data_ticks
        a, b = bisect_left(d, lo), bisect_right(d, hi)
        for t in d[a:b]:
            self.add_final(lo, t - 1)
            lo = t + 1
        self.add_final(lo, hi)

    @property
    def highest_data(self) -> int | None:
        """The highest data tick held (None if none is)."""
        return self._data_ticks[-1] if self._data_ticks else None

    def drop_highest_data(self) -> int | None:
        """Forget the highest data tick (it becomes ``Q`` again, to be asked for later): room
        for a lower one at the bound. Returns the tick, or None if none is held."""
        if not self._data_ticks:
            return None
        t = self._data_ticks.pop()
        self._forget(t)
        return t
