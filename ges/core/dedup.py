"""Duplicate suppression for flooded events: which ticks of a pubend this broker has seen.

A :class:`TickWindow` stores the seen ticks as sorted, disjoint ranges ``[lo, hi]`` — never one
object per tick (seed 002 §2 keeps knowledge the same way). In-order arrival extends the last
range in O(1), whether the stream was first heard at tick 1 or mid-stream; reordering across
redundant paths opens a few short-lived ranges that merge as the holes fill.

The number of ranges is bounded by ``limit``. Past it, the two lowest ranges are merged: the
hole between them is treated as seen, so a straggler that old is dropped — never delivered twice.
(The reliable-delivery layer recovers such ticks by nack; flooding alone cannot.)
"""

from __future__ import annotations

from bisect import bisect_right

#: Ranges held per pubend: 4,096 holes at once is far more reordering than redundant paths
#: produce, and costs at most ~0.3 MiB per pubend.
DEFAULT_WINDOW = 4_096


class TickWindow:
    __slots__ = ("limit", "_los", "_his")

    def __init__(self, *, limit: int = DEFAULT_WINDOW):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._los: list[int] = []
        self._his: list[int] = []

    def add(self, tick: int) -> bool:
        """Record ``tick``; True if it is new, False if it was seen before (a duplicate)."""
        los, his = self._los, self._his
        if his and tick == his[-1] + 1:  # the common case: the next tick in order
            his[-1] = tick
            return True
        i = bisect_right(los, tick)
        if i and tick <= his[i - 1]:
            return False
        joins_left = i > 0 and his[i - 1] == tick - 1
        joins_right = i < len(los) and los[i] == tick + 1
        if joins_left and joins_right:
            his[i - 1] = his[i]
            del los[i], his[i]
        elif joins_left:
            his[i - 1] = tick
        elif joins_right:
            los[i] = tick
        else:
            los.insert(i, tick)
            his.insert(i, tick)
            if len(los) > self.limit:
                # forget the oldest hole: everything in it now counts as seen
                his[0] = his[1]
                del los[1], his[1]
        return True

    def add_range(self, lo: int, hi: int) -> None:
        """Record every tick in ``lo..hi`` (used for a broker's own publications)."""
        if lo > hi:
            return
        los, his = self._los, self._his
        if not his or lo > his[-1] + 1:
            los.append(lo)
            his.append(hi)
            if len(los) > self.limit:
                his[0] = his[1]
                del los[1], his[1]
        elif lo >= los[-1]:
            his[-1] = max(his[-1], hi)
        else:
            for t in range(lo, hi + 1):
                self.add(t)

    def __contains__(self, tick: int) -> bool:
        i = bisect_right(self._los, tick)
        return i > 0 and tick <= self._his[i - 1]

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._los, self._his, strict=True))

    def __len__(self) -> int:
        """The number of disjoint ranges held (1 for an in-order stream)."""
        return len(self._los)
