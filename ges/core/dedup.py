"""Duplicate suppression for flooded events: which ticks of a pubend this broker has seen.

A :class:`TickWindow` keeps a *floor* (every tick at or below it has been seen) and the set of
seen ticks above it. In-order arrival keeps the set empty; reordering across redundant paths
fills it briefly. The set is bounded by ``limit``: past it the floor jumps forward and the
oldest holes are treated as seen, so a straggler more than ``limit`` ticks late is dropped (the
reliable-delivery layer recovers such ticks by nack; flooding alone cannot).
"""

from __future__ import annotations

#: Ticks held above the floor per pubend. 65,536 ints is ~4 MiB worst case per pubend; in-order
#: traffic uses none of it.
DEFAULT_WINDOW = 65_536


class TickWindow:
    __slots__ = ("floor", "limit", "_above")

    def __init__(self, floor: int = 0, *, limit: int = DEFAULT_WINDOW):
        self.floor = floor
        self.limit = limit
        self._above: set[int] = set()

    def add(self, tick: int) -> bool:
        """Record ``tick``; True if it is new, False if it was seen before (a duplicate)."""
        if tick <= self.floor:
            return False
        if tick == self.floor + 1:
            self.floor = tick
            above = self._above
            if above:
                nxt = tick + 1
                while nxt in above:
                    above.discard(nxt)
                    nxt += 1
                self.floor = nxt - 1
            return True
        above = self._above
        if tick in above:
            return False
        above.add(tick)
        if len(above) > self.limit:
            self._compact()
        return True

    def _compact(self) -> None:
        ordered = sorted(self._above)
        cut = ordered[len(ordered) // 2]
        self.floor = cut
        self._above = {t for t in ordered if t > cut}

    def __len__(self) -> int:
        return len(self._above)
