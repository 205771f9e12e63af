"""How long the event loop is busy between two waits for I/O: the measure of a stall.

Theory of operation
-------------------
A trio run is a loop: wait for I/O (up to the next deadline, or not at all when tasks are
ready), then run every task that is ready, once, then wait again. While that batch of task
steps runs, nothing new is read from any socket: a batch that takes 30 ms delays every
broker of the process by up to 30 ms. The project's rule is that no client input holds the
loop for more than a few milliseconds; :class:`LoopClock` is how an operator sees whether it
does.

It is a trio :class:`~trio.abc.Instrument` with two hooks only: ``after_io_wait`` (the loop
woke: the time is noted) and ``before_io_wait`` (the loop is about to wait: the busy stretch
since it woke has ended). A wait with a zero timeout (tasks were ready) counts as a wait: the
loop looked at its sockets there, and what was ready runs in the next batch. The per-task
hooks (``before_task_step``) are not used: they run at every step of every task, these once
per loop iteration.

Kept, all of a fixed size:

- the longest stretch of the last :data:`WINDOW_SECONDS` seconds: the longest of each second
  in a ring, rotated when a stretch ends in a new second (no task, no timer, no extra wake-up;
  a loop that has nothing to do ends no stretch, and :meth:`LoopClock.longest` leaves out the
  seconds that are too old when it is read);
- the busy seconds since the clock started (their rate is the loop's utilisation);
- how many stretches fell in each of the fixed :data:`BOUNDS` (a histogram, as Prometheus
  has it: a stretch of exactly a bound counts in that bound's bucket).

One clock per trio run (:func:`installed`), shared by every broker the run holds: ``ges
broker`` runs one, ``ges up`` all of a topology's in one process. Its figures are the
process's, not one broker's.

The work per loop iteration is two calls from trio (a perf_counter each) and a few attribute
reads and compares: GES's latency bench runs about a thousand events a second, about one loop
iteration each, and each iteration's microsecond shows there. Under callgrind (CPython 3.11,
trio 0.35) an iteration of a loop doing nothing but checkpoints takes 33,400 instructions,
9,600 more with this clock: 7,200 of them are trio's calling the two hooks (an instrument whose
hooks do nothing costs as much), 2,400 the hooks' own work.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

import trio

#: Seconds of the window the longest stretch is taken over. A stretch counts for 10 to 11
#: seconds after it ended (the seconds are whole ones; a monitor polling each second sees it
#: in ten polls at least).
WINDOW_SECONDS = 10
#: Upper bounds, in seconds, of the histogram's buckets (and +Inf after them): a millisecond
#: is the project's aim for one slice of work, 10 ms is where the monitor warns, a second is
#: two of a link's heartbeats late (ges.core.failure: one each 0.5 s).
BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 1.0)

_FIRST = BOUNDS[0]


class LoopClock(trio.abc.Instrument):
    """The busy stretches of one trio run's loop (see the module). ``now``: the time source,
    in seconds (tests pass a fake one)."""

    # slots, not a __dict__: the hooks' own work per loop iteration halves (5,300 -> 2,400
    # instructions of CPython 3.11; trio's calling them is another 7,200 that no hook avoids)
    __slots__ = (
        "_now",
        "_woke",
        "busy",
        "counts",
        "_second",
        "_second_max",
        "_second_ends",
        "_maxima",
        "_seconds",
    )

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        #: when the loop last woke; None while it waits (or before the first wake seen)
        self._woke: float | None = None
        #: seconds busy in all, and the stretches counted per bucket (not cumulative; the
        #: last is over every bound)
        self.busy = 0.0
        self.counts = [0] * (len(BOUNDS) + 1)
        #: the whole second of the latest stretch, the longest stretch that ended in it, and
        #: when it ends
        start = now()
        self._second = int(start)
        self._second_max = 0.0
        self._second_ends = self._second + 1.0
        #: the longest of each earlier second, at index second % WINDOW_SECONDS, and which
        #: second each holds (-1: none)
        self._maxima = [0.0] * WINDOW_SECONDS
        self._seconds = [-1] * WINDOW_SECONDS

    # -- trio's hooks: once per loop iteration each ----------------------------------------

    def after_io_wait(self, timeout: float) -> None:
        self._woke = self._now()

    def before_io_wait(self, timeout: float) -> None:
        woke = self._woke
        if woke is None:  # installed in mid-batch, or two waits in a row: no stretch to end
            return
        self._woke = None
        now = self._now()
        busy = now - woke
        self.busy += busy
        if busy <= _FIRST:
            self.counts[0] += 1
        else:
            self.counts[bisect.bisect_left(BOUNDS, busy)] += 1
        if now >= self._second_ends:
            self._rotate(now)
        if busy > self._second_max:
            self._second_max = busy

    def _rotate(self, now: float) -> None:
        """A stretch ended in a later second than the last: the last second's longest goes
        into the ring, and a new second begins."""
        slot = self._second % WINDOW_SECONDS
        self._maxima[slot] = self._second_max
        self._seconds[slot] = self._second
        self._second = int(now)
        self._second_max = 0.0
        self._second_ends = self._second + 1.0

    # -- reading (a scrape, a report: on the loop's own thread) ---------------------------

    def longest(self, now: float | None = None) -> float:
        """Seconds of the longest stretch that ended in the last :data:`WINDOW_SECONDS`
        seconds (whole ones: 10 to 11 s), 0.0 if none did."""
        current = int(self._now() if now is None else now)
        oldest = current - WINDOW_SECONDS
        found = self._second_max if self._second >= oldest else 0.0
        for second, longest in zip(self._seconds, self._maxima, strict=True):
            if second >= oldest and longest > found:
                found = longest
        return found

    @property
    def stretches(self) -> int:
        """Busy stretches ended since the clock started."""
        return sum(self.counts)

    def buckets(self) -> list[tuple[float, int]]:
        """(upper bound, stretches at most that long) for each of :data:`BOUNDS` and
        ``inf``: the cumulative histogram, as Prometheus exposes it."""
        out = []
        total = 0
        for bound, count in zip((*BOUNDS, float("inf")), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


_CLOCK: trio.lowlevel.RunVar[LoopClock] = trio.lowlevel.RunVar("ges_loop_clock")


def installed() -> LoopClock:
    """The loop clock of the current trio run, added to the run as an instrument the first
    time it is asked for (every broker of a process asks when it starts, and they share it)."""
    try:
        return _CLOCK.get()
    except LookupError:
        clock = LoopClock()
        trio.lowlevel.add_instrument(clock)
        _CLOCK.set(clock)
        return clock
