"""Covering between conjunctions (seed 000 §3.3, Definition 1).

``c1`` *covers* ``c2`` iff every message matching ``c2`` also matches ``c1``, i.e.
``M(c1) ⊇ M(c2)`` where ``M(c)`` is the set of events matching ``c`` under the reference semantics
of :func:`ges.matching.model.test`. :func:`covers` decides it and :func:`witness` returns a
counterexample event (one matching ``c2`` but not ``c1``) when it does not hold. Both share one
analysis, so ``covers(c1, c2)`` is False exactly when ``witness(c1, c2)`` is not None; the decision
is exact (sound and complete) for every operator.

The reasoning:

* ``M(c)`` is a product over attributes: an event matches ``c`` iff every attribute ``a`` that
  ``c`` constrains is present with a value in ``S_c(a)``, the intersection of the value sets of
  ``c``'s constraints on ``a``. Attributes ``c`` does not mention are free.
* So if ``c2`` is unsatisfiable (some ``S_c2(a)`` empty), ``M(c2)`` is empty and everything covers
  it. Otherwise ``c1`` covers ``c2`` iff for every attribute ``a`` constrained by ``c1``, ``c2``
  constrains ``a`` too (else an event without ``a`` matches ``c2`` only) and
  ``S_c2(a) ⊆ S_c1(a)``.
* A value set is a union over the three kinds (numbers, strings, booleans). A constraint with a
  value admits only values of its kind — ``ne`` too — and ``exists`` admits everything. Per kind a
  set is kept as an interval, an optional finite *only* set (from ``eq`` / ``in``), a finite set of
  *excluded* points (from ``ne``), and for numbers whether ``NaN`` is in (``NaN`` satisfies only
  ``ne`` and ``exists``). (Event values of no kind satisfy only ``exists``; that never changes the
  answer, since a set admitting them admits all values of every kind.)
* Numbers are the values events can carry: every int, every float, ±inf. That domain is handled
  exactly — no approximation by the reals: ints and floats compare exactly in Python, and every
  finite number has an immediate successor (the smaller of the next int and the next float), so
  an interval's least element is computable and "(-inf, x)" is the only interval without one
  (it holds every small enough int). Float gaps such as ``(1.0, nextafter(1.0))`` are therefore
  recognised as holding no float (and no int).
* Strings use code-point order with ``""`` the minimum; ``s + "\\x00"`` is the immediate successor
  of ``s``. String intervals are half-open ``[lo, hi)`` (``hi`` None: unbounded):
  ``s > x`` is ``s >= x + "\\x00"``, ``s <= x`` is ``s < x + "\\x00"``, and ``prefix p`` is
  ``[p, succ(p))`` where ``succ(p)`` strips trailing U+10FFFF and increments the last remaining
  character (None when nothing remains).
* Topic filters (``topic``) test only ``@topic``, which takes no interval, so its string set is
  an only-set or the filters' intersection (itself a filter, or nothing) minus finitely many
  points. A string of it outside another set is found among finitely many candidate topics
  (ges.matching.topics.candidates), enough of them that excluded points cannot hide them all.
* ``S2 \\ S1`` (per kind) is ``(S2 ∩ E1) ∪ (S2 below I1) ∪ (S2 above I1) ∪ (S2 \\ Only1)`` plus
  ``NaN``: each part is a point test or "does interval I minus finite set E hold an element?",
  which walks up from I's least element through immediate successors — at most ``|E| + 1`` steps,
  as the walked elements are distinct. When ``S2`` has an *only* set it is enumerated instead.
  Every element found is an explicit witness value.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

from ges.matching import topics
from ges.matching.model import BOOLEAN, NUMBER, STRING, Conjunction, Constraint, weight

__all__ = ["Analysis", "analyse", "covers", "covers_analysed", "witness"]

_KINDS = (NUMBER, STRING, BOOLEAN)
_INF = math.inf
_MAX_CHAR = chr(0x10FFFF)
_NOTHING = object()  # "no element": None is not usable, values are never None anyway


def covers(c1: Conjunction, c2: Conjunction) -> bool:
    """Does ``c1`` cover ``c2`` (seed 000 §3.3, Definition 1: ``M(c1) ⊇ M(c2)``)?

    Exact for every operator: True iff every event matching ``c2`` matches ``c1``. An
    unsatisfiable ``c2`` is covered by everything; the empty conjunction covers everything.
    """
    return _counterexample(analyse(c1), analyse(c2)) is None


def covers_analysed(a1: Analysis, a2: Analysis) -> bool:
    """:func:`covers` on conjunctions analysed once (an index asks about each many times)."""
    return _counterexample(a1, a2) is None


def witness(c1: Conjunction, c2: Conjunction) -> dict | None:
    """An event (attribute dict) matching ``c2`` but not ``c1``; None iff ``c1`` covers ``c2``."""
    event = _counterexample(analyse(c1), analyse(c2))
    if event is not None and not (c2.matches(event) and not c1.matches(event)):
        raise AssertionError(f"covering: bad witness {event!r} for {c1} / {c2}")
    return event


class Analysis:
    """What covering needs to know of one conjunction, worked out once.

    ``sets``: per constrained attribute, its allowed value set (one part per kind); ``members``:
    one allowed value per attribute, or None when the conjunction is unsatisfiable; ``attrs``:
    the constrained attributes; ``pins``: the attributes whose set is one value, as
    ``attr -> (kind, value)`` (a conjunction pinning ``a`` covers another only if that one pins
    ``a`` to the same value, which is what makes an index on pins possible); ``weight``: its
    size — constraints plus ``in`` values — which is what analysing and comparing it costs.
    """

    __slots__ = ("conj", "sets", "members", "attrs", "pins", "weight")

    def __init__(self, conj: Conjunction) -> None:
        self.conj = conj
        self.sets = _value_sets(conj)
        members: dict | None = {}
        pins: dict[str, tuple] = {}
        for attr, parts in self.sets.items():
            value = _any_member(parts)
            if value is _NOTHING:
                members = None  # unsatisfiable: M(conj) is empty
                break
            members[attr] = value
            pin = _pin(parts)
            if pin is not None:
                pins[attr] = pin
        self.members = members
        self.attrs = frozenset(self.sets)
        self.pins = pins
        self.weight = weight(conj)


def analyse(conj: Conjunction) -> Analysis:
    return Analysis(conj)


def _pin(parts: dict[str, _Part]) -> tuple | None:
    """``(kind, value)`` if the value set is that one value (as far as an only-set shows it;
    a singleton written as a closed range is not recognised, which costs an index a hit, not
    a wrong answer)."""
    if len(parts) != 1:
        return None
    ((kind, part),) = parts.items()
    if part.only is None:
        return None
    found = None
    for value in part.only:
        if value in part:
            if found is not None:
                return None
            found = (kind, value)
    return found


def _counterexample(a1: Analysis, a2: Analysis) -> dict | None:
    members = a2.members
    if members is None:
        return None  # c2 is unsatisfiable: M(c2) is empty
    sets2 = a2.sets
    for attr, parts1 in a1.sets.items():
        parts2 = sets2.get(attr)
        if parts2 is None:
            return dict(members)  # c2 lets attr be absent, c1 does not
        value = _difference(parts2, parts1)
        if value is not _NOTHING:
            return {**members, attr: value}
    return None


# -- value sets -------------------------------------------------------------------------------


class _Part:
    """The values of one kind allowed on one attribute: ``(interval ∩ only) \\ excluded`` (+NaN).

    Intervals: strings ``(lo, hi)`` meaning ``[lo, hi)`` (hi None: unbounded); numbers
    ``((lo, lo_inclusive), (hi, hi_inclusive))`` over ``[-inf, +inf]``; booleans none (their
    *only* set starts as {False, True}).
    """

    __slots__ = ("kind", "interval", "only", "excluded", "nan", "topics")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.only: frozenset | None = frozenset((False, True)) if kind is BOOLEAN else None
        self.excluded: set = set()
        self.nan = kind is NUMBER
        self.topics: list[str] = []  # topic filters (only ever on TOPIC_ATTR: no interval)
        if kind is NUMBER:
            self.interval = ((-_INF, True), (_INF, True))
        elif kind is STRING:
            self.interval = ("", None)
        else:
            self.interval = None

    def add(self, op: str, value) -> None:
        if op == "ne":
            self.excluded.add(value)
            return
        self.nan = False
        if op == "topic":
            self.topics.append(value)
        elif op == "eq" or op == "in":
            values = frozenset(value) if op == "in" else frozenset((value,))
            self.only = values if self.only is None else self.only & values
        elif self.kind is NUMBER:
            lower, upper = self.interval
            if op in ("gt", "ge"):
                lower = max(lower, (value, op == "ge"), key=_lower_key)
            else:  # lt, le
                upper = min(upper, (value, op == "le"), key=_upper_key)
            self.interval = (lower, upper)
        else:  # strings: lt le gt ge prefix
            lo, hi = self.interval
            if op == "ge" or op == "prefix":
                lo = max(lo, value)
            elif op == "gt":
                lo = max(lo, value + "\x00")
            if op == "lt":
                hi = _str_min(hi, value)
            elif op == "le":
                hi = _str_min(hi, value + "\x00")
            elif op == "prefix":
                hi = _str_min(hi, _prefix_end(value))
            self.interval = (lo, hi)

    def __contains__(self, value) -> bool:
        if self.kind is NUMBER and value != value:
            return self.nan
        if self.only is not None and value not in self.only:
            return False
        if value in self.excluded:
            return False
        if self.topics and not all(topics.matches(f, value) for f in self.topics):
            return False
        return self.interval is None or _in_interval(self.kind, self.interval, value)


def _value_sets(conj: Conjunction) -> dict[str, dict[str, _Part]]:
    """Per attribute constrained by ``conj``: its allowed value set, one _Part per allowed kind."""
    by_attr: dict[str, list[Constraint]] = {}
    for c in conj.constraints:
        by_attr.setdefault(c.attr, []).append(c)
    out = {}
    for attr, cs in by_attr.items():
        kinds = set(_KINDS)
        for c in cs:
            if c.op != "exists":
                kinds &= {c.kind}
        parts = {k: _Part(k) for k in _KINDS if k in kinds}
        for c in cs:
            if c.op != "exists" and c.kind in parts:
                parts[c.kind].add(c.op, c.value)
        out[attr] = parts
    return out


def _any_member(parts: dict[str, _Part]):
    for part in parts.values():
        value = _pick(part)
        if value is not _NOTHING:
            return value
    return _NOTHING


def _pick(part: _Part):
    """Some member of the part, or _NOTHING when it is empty."""
    if part.only is not None:
        for value in sorted(part.only):
            if value in part:
                return value
        return _NOTHING
    if part.topics:
        return _pick_topic(part, None, len(part.excluded) + 1)
    value = _pick_interval(part.kind, part.interval, part.excluded)
    if value is _NOTHING and part.nan:
        return math.nan
    return value


def _difference(parts2: dict[str, _Part], parts1: dict[str, _Part]):
    """Some value in S2 but not in S1 (one attribute, all kinds), or _NOTHING if S2 ⊆ S1."""
    for kind, p2 in parts2.items():
        p1 = parts1.get(kind)
        value = _pick(p2) if p1 is None else _part_difference(p2, p1)
        if value is not _NOTHING:
            return value
    return _NOTHING


def _part_difference(p2: _Part, p1: _Part):
    """Some value in p2 but not in p1 (one kind), or _NOTHING."""
    if p2.only is not None:  # finite: enumerate (booleans always come here)
        for value in sorted(p2.only):
            if value in p2 and value not in p1:
                return value
        return _NOTHING
    # p2 is an interval minus finitely many points (plus NaN maybe)
    for value in sorted(p1.excluded):
        if value in p2:
            return value
    if p2.topics or p1.topics:  # on TOPIC_ATTR, so neither has an interval
        return _topic_difference(p2, p1)
    kind = p2.kind
    for outside in _outside(kind, p1.interval):
        value = _pick_interval(kind, _meet(kind, p2.interval, outside), p2.excluded)
        if value is not _NOTHING:
            return value
    if p1.only is not None:
        value = _pick_interval(kind, p2.interval, p2.excluded | p1.only)
        if value is not _NOTHING:
            return value
    if p2.nan and not p1.nan:
        return math.nan
    return _NOTHING


# -- topic filters (ges.matching.topics) ------------------------------------------------------


def _within(part: _Part) -> str | None | object:
    """The one filter the part's filters amount to (None: any string; _NOTHING: no topic)."""
    within = None
    for f in part.topics:
        within = f if within is None else topics.intersect(within, f)
        if within is None:
            return _NOTHING
    return within


def _pick_topic(p2: _Part, escape: str | None, variants: int, p1: _Part | None = None):
    """A member of ``p2`` outside ``p1`` (if given) among the topics of ``p2``'s filters that
    would lie outside filter ``escape`` (ges.matching.topics.candidates: complete when
    ``variants`` is one more than the strings that may be excluded)."""
    within = _within(p2)
    if within is _NOTHING:
        return _NOTHING
    for value in topics.candidates(within, escape, variants):
        if value in p2 and (p1 is None or value not in p1):
            return value
    return _NOTHING


def _topic_difference(p2: _Part, p1: _Part):
    """Some string in p2 but not in p1, where either has topic filters and p1's excluded
    strings are already tried: outside p1's only-set, or outside one of p1's filters."""
    if p1.only is not None:
        value = _pick_topic(p2, None, len(p2.excluded) + len(p1.only) + 1, p1)
        if value is not _NOTHING:
            return value
    for f in p1.topics:
        value = _pick_topic(p2, f, len(p2.excluded) + 1, p1)
        if value is not _NOTHING:
            return value
    return _NOTHING


# -- intervals --------------------------------------------------------------------------------


def _lower_key(bound):  # a larger key is a tighter lower bound (exclusive beats inclusive)
    value, inclusive = bound
    return (value, not inclusive)


def _upper_key(bound):  # a smaller key is a tighter upper bound
    value, inclusive = bound
    return (value, inclusive)


def _str_min(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _prefix_end(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (None: there is none)."""
    stem = prefix.rstrip(_MAX_CHAR)
    if not stem:
        return None
    return stem[:-1] + chr(ord(stem[-1]) + 1)


def _in_interval(kind: str, interval, value) -> bool:
    if kind is STRING:
        lo, hi = interval
        return lo <= value and (hi is None or value < hi)
    (lo, lo_inc), (hi, hi_inc) = interval
    return (lo < value or (lo_inc and lo == value)) and (value < hi or (hi_inc and value == hi))


def _meet(kind: str, a, b):
    if kind is STRING:
        return (max(a[0], b[0]), _str_min(a[1], b[1]))
    return (max(a[0], b[0], key=_lower_key), min(a[1], b[1], key=_upper_key))


def _outside(kind: str, interval) -> Iterable:
    """The (up to two) intervals of the kind's domain outside ``interval``: below it, above it."""
    if kind is STRING:
        lo, hi = interval
        yield ("", lo)
        if hi is not None:
            yield (hi, None)
        return
    (lo, lo_inc), (hi, hi_inc) = interval
    yield ((-_INF, True), (lo, not lo_inc))
    yield ((hi, not hi_inc), (_INF, True))


def _pick_interval(kind: str, interval, excluded):
    """Some element of ``interval`` not in the finite set ``excluded``, or _NOTHING."""
    if kind is STRING:
        lo, hi = interval
        value = lo  # the least element; walk up through immediate successors
        for _ in range(len(excluded) + 1):
            if hi is not None and value >= hi:
                return _NOTHING
            if value not in excluded:
                return value
            value += "\x00"
        return _NOTHING  # unreachable: len(excluded) + 1 distinct elements were walked
    return _pick_number(interval, excluded)


def _pick_number(interval, excluded):
    (lo, lo_inc), (hi, hi_inc) = interval

    def fits(value) -> bool:
        return _in_interval(NUMBER, interval, value) and value not in excluded

    # Readable candidates first; the exact walk below decides when none fits.
    for value in _nice_numbers(lo, hi):
        if fits(value):
            return value
    if lo == -_INF:
        if lo_inc and fits(-_INF):
            return -_INF
        # (-inf, hi): holds every int below hi, unless hi is -inf
        if hi == -_INF:
            return _NOTHING
        finite = [v for v in excluded if _finite(v)]
        if _finite(hi):
            finite.append(hi)
        return math.floor(min(finite, default=0)) - 1
    value = lo if lo_inc else _successor(lo)
    for _ in range(len(excluded) + 1):
        if value is _NOTHING or not _in_interval(NUMBER, interval, value):
            return _NOTHING
        if value not in excluded:
            return value
        value = _successor(value)
    return _NOTHING  # unreachable: len(excluded) + 1 distinct elements were walked


def _nice_numbers(lo, hi) -> Iterable:
    yield 0
    if _finite(lo):
        yield lo
        yield math.floor(lo) + 1
    if _finite(hi):
        yield hi
        yield math.ceil(hi) - 1
    if _finite(lo) and _finite(hi):
        try:
            middle = lo / 2 + hi / 2
        except OverflowError:  # an int too large for a float
            middle = (math.floor(lo) + math.floor(hi)) // 2
        yield middle


def _successor(value):
    """The least int or float above a number that is not -inf (_NOTHING above +inf)."""
    if value == _INF:
        return _NOTHING
    if type(value) is int:
        next_int = value + 1
        try:
            next_float = float(value)
        except OverflowError:
            next_float = _INF if value > 0 else -sys.float_info.max
        else:
            if next_float <= value:  # float() rounded down (or was exact)
                next_float = math.nextafter(next_float, _INF)
    else:
        next_int = math.floor(value) + 1
        next_float = math.nextafter(value, _INF)
    return next_int if next_int <= next_float else next_float


def _finite(value) -> bool:
    """Not ±inf (math.isfinite would overflow on a huge int)."""
    return -_INF < value < _INF
