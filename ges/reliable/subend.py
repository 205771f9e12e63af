"""A subend: one pubend's stream at a broker hosting subscribers (seed 002 §2.3).

The subend accumulates knowledge from the claims and data of the routes that reach its broker
(:mod:`ges.reliable.claims`), from silence, and from the pubend's answers to its nacks. Its
local subscriptions get the ``D`` ticks below the doubt horizon in tick order, each exactly once.

A ``Q`` range below the highest known tick that persists is *curiosity*: after ``wait`` seconds
the subend nacks the pubend's broker for it, and again after twice as long (up to
:data:`NACK_MAX`) while it persists. ``wait`` adapts to the answers: twice the smoothed time
from a nack to the answer that fills it (as TCP estimates its retransmission timeout), between
:data:`NACK_MIN` and :data:`NACK_MAX`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ges.reliable.knowledge import HeldBytes, KnowledgeStream, StreamFull
from ges.wire.messages import held_size

#: Seconds a gap waits before the first nack, until answers give a better estimate.
NACK_AFTER = 0.1
NACK_MIN = 0.02
NACK_MAX = 2.0
#: Ranges one nack may name.
MAX_NACK_RANGES = 64


class Subend:
    """One pubend's knowledge stream at one subscriber-hosting broker."""

    __slots__ = (
        "stream",
        "top",
        "doubt_since",
        "next_nack",
        "backoff",
        "srtt",
        "_asked_at",
        "nack_after",
        "nack_max",
    )

    def __init__(
        self,
        floor: int = 0,
        held: HeldBytes | None = None,
        *,
        nack_after: float = NACK_AFTER,
        nack_max: float = NACK_MAX,
    ):
        #: the first wait before a gap is asked for, and the most any wait grows to
        self.nack_after = nack_after
        self.nack_max = nack_max
        # the events held beyond the doubt horizon are bounded in bytes (each subend's, and
        # with ``held`` all of a broker's together): at the bound the highest become Q again
        self.stream = KnowledgeStream(floor=floor, size=held_size, shared=held)
        #: the highest tick heard of (silence may name ticks it claims nothing about)
        self.top = floor
        #: when the doubt horizon last got stuck below known data (None: no gap)
        self.doubt_since: float | None = None
        self.next_nack = float("inf")
        self.backoff = 1
        self.srtt: float | None = None
        self._asked_at: float | None = None

    # -- knowledge in --------------------------------------------------------------------------

    def data(self, prev: int, tick: int, item: Any, wanted: bool) -> None:
        """A route to this broker: no data for it in ``(prev, tick)``, and ``item`` at ``tick``
        (``wanted``: some local subscription matches it; if not, the tick is silence here)."""
        s = self.stream
        if tick > self.top:
            self.top = tick
        # at a bound the knowledge is left Q (asked for again later), never raised
        if wanted:
            self._hold(tick, item)
        with contextlib.suppress(StreamFull):
            if prev + 1 < tick:
                s.add_silence(prev + 1, tick - 1)
            if not wanted:
                s.add_final(tick, tick)

    def silence(self, prev: int, tick: int) -> None:
        """No data for this broker in ``(prev, tick]``, and the stream has reached ``tick``."""
        if tick > self.top:
            self.top = tick
        with contextlib.suppress(StreamFull):
            self.stream.add_silence(prev + 1, tick)

    def recovered(self, lo: int, hi: int, wanted: list[tuple[int, Any]], now: float) -> None:
        """The pubend's log for ``lo..hi``: ``wanted`` are its events local subscriptions match;
        every other tick there is silence here."""
        s = self.stream
        missing = [t for t, item in wanted if not self._hold(t, item)]
        with contextlib.suppress(StreamFull):
            for t in missing:  # silence round a wanted tick that could not be held
                s.add_silence(lo, t - 1)
                lo = t + 1
            s.add_silence(lo, hi)
        if self._asked_at is not None:
            sample = now - self._asked_at
            self.srtt = sample if self.srtt is None else 0.875 * self.srtt + 0.125 * sample
            self._asked_at = None

    def _hold(self, tick: int, item: Any) -> bool:
        """Hold data at ``tick``; at the bound, a lower tick displaces the highest held one
        (which becomes Q again, to be asked for once the consumer catches up), so the ticks
        next to the horizon always fit. False if it could not be held."""
        s = self.stream
        while True:
            try:
                s.add_data(tick, item)
                return True
            except StreamFull:
                highest = s.highest_data
                if highest is None or highest <= tick:
                    return False
                s.drop_highest_data()

    # -- out -------------------------------------------------------------------------------------

    def deliverable(self, now: float) -> list[tuple[int, Any]]:
        """The data ticks below the doubt horizon, in order (each once); updates the gap clock."""
        out = self.stream.take_deliverable()
        s = self.stream
        if s.horizon <= max(s.known_to, self.top):
            if out or self.doubt_since is None:
                self.doubt_since = now
                self.backoff = 1
                self.next_nack = now + self.wait
        else:
            self.doubt_since = None
            self.next_nack = float("inf")
        return out

    @property
    def wait(self) -> float:
        if self.srtt is None:
            return self.nack_after
        return min(self.nack_max, max(NACK_MIN, 2 * self.srtt))

    def nack(self, now: float) -> list[tuple[int, int]]:
        """The gaps to ask for now (empty if none is due); schedules the next ask."""
        if now < self.next_nack:
            return []
        ranges = []
        for gap in self.stream.gaps(self.top):
            ranges.append(gap)
            if len(ranges) >= MAX_NACK_RANGES:
                break
        if not ranges:
            self.next_nack = float("inf")
            return []
        self._asked_at = now
        self.next_nack = now + min(self.nack_max, self.wait * self.backoff)
        self.backoff = min(self.backoff * 2, 64)
        return ranges
