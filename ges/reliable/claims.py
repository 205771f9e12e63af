"""Knowledge claims along content routes: how silence travels without a fixed tree (seed 002 §2.2).

Seed 002 forwards each pubend's stream down a fixed tree; every *filter edge* turns the data a
child does not want into silence, and a child accumulates what its parent tells it. GES routes
through the unit hierarchy instead (seed 004 §3.3): the publisher attaches one route per
enclosing unit, and a keeper of a unit matches the event against the unit's snapshot and makes
one route per matching child. This is Gryphon's redundant routing tree with units as tree nodes
(seed 000 §2): the tree node of a unit is the set of its keepers, any of which may take a given
tick, and a child accumulates knowledge from all of them by least upper bound.

The filter edge's knowledge travels as a *claim* on each route (``Route.prev``): the broker that
made the route says that no tick strictly between ``prev`` and this one had anything for the
route's unit. A claim is only ever made over ticks its maker *knows*:

* the publisher knows every tick of its pubend, so its route for unit ``U`` claims back to the
  last tick it made a route for ``U`` (:meth:`Claims.root`);
* a keeper knows, for a unit ``U`` it resolved, the ticks the routes it received for ``U``
  claimed plus the ticks it resolved itself (:class:`Known`); its route for child ``C`` at tick
  ``t`` claims back to the later of the last tick it made a route for ``C`` and the last tick
  before ``t`` it does not know (:meth:`Claims.claim`).

So when the publisher or a keeper switches between redundant keepers, the new one does not
know the ticks the old one took and claims nothing over them; the child sees them as unknown
(``Q``) and asks the pubend's log. A route made but never delivered (its link was down) still
counts as made: later claims stop at it, so the child asks for it rather than taking it for
silence. Relays, and brokers that forward a unit's route to every child for want of a reachable
keeper, pass the claim on unchanged: nothing for ``U`` implies nothing for any child of ``U``.

All of this is soft state and bounded: forgetting it only shortens later claims, which costs
nacks, never correctness.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict

#: Disjoint known ranges a resolver keeps per (pubend, unit); the lowest is forgotten first.
MAX_KNOWN_RANGES = 256
#: (pubend, unit) states one broker keeps; the least recently used is forgotten first.
MAX_STATES = 65_536
#: Pubends a keeper reports in one acknowledgement (the most recently routed first).
MAX_LATEST = 1_024


class Known:
    """Ticks known as sorted, disjoint, merged ``[lo, hi]`` ranges (bounded; forgetting is safe)."""

    __slots__ = ("_los", "_his", "_max")

    def __init__(self, max_ranges: int = MAX_KNOWN_RANGES):
        self._los: list[int] = []
        self._his: list[int] = []
        self._max = max_ranges

    def add(self, lo: int, hi: int) -> None:
        if lo > hi:
            return
        los, his = self._los, self._his
        if his and lo <= his[-1] + 1 and lo >= los[-1]:  # the common case: extends the last
            if hi > his[-1]:
                his[-1] = hi
            return
        i = bisect_right(his, lo - 2)  # first range ending at or after lo - 1
        j = bisect_right(los, hi + 1)  # ranges i..j-1 touch or overlap lo..hi
        if i < j:
            lo = min(lo, los[i])
            hi = max(hi, his[j - 1])
        los[i:j] = [lo]
        his[i:j] = [hi]
        if len(los) > self._max:
            del los[0], his[0]

    def run_start(self, tick: int) -> int:
        """The lowest ``s`` with every tick of ``s..tick`` known (``tick + 1`` if it is not)."""
        i = bisect_right(self._los, tick) - 1
        if i < 0 or self._his[i] < tick:
            return tick + 1
        return self._los[i]

    def covers(self, lo: int, hi: int) -> bool:
        """Every tick of ``lo..hi`` is known."""
        return self.run_start(hi) <= lo

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._los, self._his, strict=True))


class Resolved:
    """One broker's knowledge of one unit's share of one pubend, and its claims to each child."""

    __slots__ = ("known", "last")

    def __init__(self):
        self.known = Known()
        #: child -> the highest tick a route was made for it (data or silence)
        self.last: dict[str, int] = {}


class Claims:
    """Every claim chain of one broker (see the module docstring)."""

    def __init__(self, *, max_states: int = MAX_STATES):
        self.max_states = max_states
        self._states: OrderedDict[tuple[str, tuple], Resolved] = OrderedDict()
        #: (pubend, unit) -> the last tick the publisher made a route for that unit
        self._root: dict[tuple[str, tuple], int] = {}
        #: pubend -> the highest tick this broker has routed as a keeper
        self._latest: OrderedDict[str, int] = OrderedDict()

    def root(self, pubend: str, unit: tuple, tick: int) -> int:
        """The publisher makes a route for ``unit`` at ``tick``: its claim."""
        key = (pubend, unit)
        prev = self._root.get(key, tick - 1 if tick > 0 else 0)
        if tick > prev:
            self._root[key] = tick
        return prev

    def root_silence(self, pubend: str, unit: tuple, tick: int) -> int:
        """The publisher sends silence for ``unit`` up to ``tick``: its claim (back to the last
        tick it made a route for there; nothing if it made none)."""
        key = (pubend, unit)
        prev = min(self._root.get(key, tick), tick)
        self._root[key] = tick
        return prev

    def state(self, pubend: str, unit: tuple) -> Resolved:
        key = (pubend, unit)
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = Resolved()
            if len(self._states) > self.max_states:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(key)
        return st

    def knows(self, pubend: str, unit: tuple, lo: int, hi: int) -> bool:
        """This broker knows, for ``unit``, every tick of ``lo..hi``: which had data for it
        (it routed them) and which were silence."""
        st = self._states.get((pubend, unit))
        return st is not None and st.known.covers(lo, hi)

    def learn(self, pubend: str, unit: tuple, prev: int, tick: int) -> Resolved:
        """A route for ``unit`` arrived claiming ``(prev, tick)`` with data at ``tick`` (or, for
        silence, claiming ``(prev, tick]``): record what this broker now knows."""
        st = self.state(pubend, unit)
        st.known.add(prev + 1, tick)
        latest = self._latest
        if latest.get(pubend, 0) < tick:
            latest[pubend] = tick
            latest.move_to_end(pubend)
            if len(latest) > self.max_states:
                latest.popitem(last=False)
        return st

    def highest(self, pubend: str) -> int:
        """The highest tick of ``pubend`` this broker has routed as a keeper (0: none it
        remembers)."""
        return self._latest.get(pubend, 0)

    def latest(self, limit: int = MAX_LATEST) -> list[tuple[str, int]]:
        """``(pubend, tick)``: the highest tick of each pubend this broker has routed as a
        keeper, most recent first (at most ``limit``)."""
        out = []
        for pubend in reversed(self._latest):
            if len(out) >= limit:
                break
            out.append((pubend, self._latest[pubend]))
        return out

    @staticmethod
    def claim(st: Resolved, kid: str, tick: int) -> int:
        """The claim of the route (data or silence) this broker makes for child ``kid`` at
        ``tick``."""
        last = st.last.get(kid, 0)
        prev = max(last, st.known.run_start(tick) - 1)
        if tick > last:
            st.last[kid] = tick
        return prev
