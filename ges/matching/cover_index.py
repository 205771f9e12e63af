"""An index of conjunctions for covering queries (seed 000 §3.3), so that finding what covers a
conjunction, or what it covers, does not compare it with every stored one.

Two facts of :mod:`ges.matching.covering` make it work. If ``e`` covers a satisfiable ``c``,
every attribute ``e`` constrains is constrained by ``c`` too; and if ``e`` *pins* an attribute
to one value (``sym = IBM``), so does ``c``, to the same value. So:

* **What covers c?** Each stored conjunction is filed under one *anchor*: one of its pins
  ``(attr, value)`` if it has any, else ``(attr, None)`` for one of its attributes, else the
  empty anchor (it constrains nothing and covers everything). Only the anchors that ``c``'s own
  attributes and pins name can hold a conjunction covering ``c``. Of the pins and attributes a
  conjunction offers, it is filed under the one whose bucket is smallest when it arrives, so a
  pin every conjunction shares (an event type) does not gather them all in one bucket.
* **What does c cover?** A conjunction ``c`` covers only stored ones that constrain all of
  ``c``'s attributes and pin ``c``'s pins to the same values: every stored conjunction is also
  filed under each of its pins and attributes, and the smallest of the sets ``c`` names holds
  all candidates.

Candidates are first compared by their attribute sets and pins (set operations) and only then
by :func:`covers_analysed`. Both are bounded per query — :data:`MAX_SCAN` candidates looked at,
:data:`MAX_VERIFY` compared in full — so one query costs at most that much whatever is stored.
An answer is therefore sound but may be incomplete: a cover beyond the bounds (or a pin written
as a closed range) is not found. For the exporter that only means exporting a conjunction that a
stored one would have covered — more routing state upstream, never a lost event.
"""

from __future__ import annotations

from collections.abc import Iterator

from ges.matching.covering import Analysis, covers_analysed
from ges.matching.model import Conjunction

#: Candidates one query looks at (an attribute-set and pin comparison each, well under a µs).
MAX_SCAN = 256
#: Candidates one query compares in full (``covers``: a few µs for small conjunctions, more for
#: heavy ones — see :data:`MAX_HEAVY`).
MAX_VERIFY = 32
#: Conjunctions heavier than this (constraints plus ``in`` values) are not indexed: comparing
#: one costs time in proportion to its weight, and they are rare enough to export as they are.
MAX_HEAVY = 256

_EVERYTHING = ("",)  # the anchor of the empty conjunction


class CoverIndex:
    """Conjunctions (with their :class:`Analysis`) filed for covering queries."""

    def __init__(self) -> None:
        self._analysis: dict[Conjunction, Analysis] = {}
        self._anchor: dict[Conjunction, tuple] = {}
        #: anchor -> conjunctions filed under it (dicts as ordered sets: runs are repeatable)
        self._by_anchor: dict[tuple, dict[Conjunction, None]] = {}
        #: (attr, pin) and (attr, None) -> every stored conjunction with that pin / attribute
        self._by_key: dict[tuple, dict[Conjunction, None]] = {}
        #: work done by queries so far (candidates looked at, plus the weight of those compared
        #: in full): what a caller that bounds its time per step counts
        self.work = 0

    def __len__(self) -> int:
        return len(self._analysis)

    def __contains__(self, conj: Conjunction) -> bool:
        return conj in self._analysis

    @staticmethod
    def indexable(a: Analysis) -> bool:
        return a.weight <= MAX_HEAVY

    def add(self, a: Analysis) -> None:
        conj = a.conj
        if conj in self._analysis:
            return
        self._analysis[conj] = a
        if not a.attrs:
            anchor = _EVERYTHING
        else:
            offers = [(attr, pin) for attr, pin in a.pins.items()] or [(x, None) for x in a.attrs]
            anchor = min(offers, key=lambda k: (len(self._by_anchor.get(k, ())), _order(k)))
        self._anchor[conj] = anchor
        self._by_anchor.setdefault(anchor, {})[conj] = None
        for key in _keys(a):
            self._by_key.setdefault(key, {})[conj] = None

    def remove(self, conj: Conjunction) -> None:
        a = self._analysis.pop(conj, None)
        if a is None:
            return
        anchor = self._anchor.pop(conj)
        _discard(self._by_anchor, anchor, conj)
        for key in _keys(a):
            _discard(self._by_key, key, conj)

    def coverer(self, a: Analysis, *, strict: bool = False, exclude=None) -> Conjunction | None:
        """A stored conjunction covering ``a``'s (``strict``: and not covered by it), other than
        ``exclude``; None if none was found within the bounds."""
        for conj in self._verified(self._coverer_candidates(a), a, strict, exclude, up=True):
            return conj
        return None

    def covered(self, a: Analysis) -> list[Conjunction]:
        """The stored conjunctions ``a``'s covers (as many as the bounds find)."""
        return list(self._verified(self._covered_candidates(a), a, False, None, up=False))

    # -- candidates --------------------------------------------------------------------------

    def _coverer_candidates(self, a: Analysis) -> Iterator[Conjunction]:
        by_anchor = self._by_anchor
        yield from by_anchor.get(_EVERYTHING, ())
        if a.members is None:  # unsatisfiable: covered by anything
            yield from self._analysis
            return
        for attr in sorted(a.attrs):
            yield from by_anchor.get((attr, None), ())
            pin = a.pins.get(attr)
            if pin is not None:
                yield from by_anchor.get((attr, pin), ())

    def _covered_candidates(self, a: Analysis) -> Iterator[Conjunction]:
        keys = [(attr, pin) for attr, pin in a.pins.items()]
        keys += [(attr, None) for attr in a.attrs if attr not in a.pins]
        if not keys:
            return iter(self._analysis)  # the empty conjunction covers everything
        sets = [self._by_key.get(k) for k in keys]
        if any(s is None for s in sets):
            return iter(())  # nothing stored constrains one of its attributes as it does
        return iter(min(sets, key=len))

    def _verified(self, candidates, a: Analysis, strict: bool, exclude, *, up: bool):
        scanned = verified = 0
        analysis = self._analysis
        for conj in candidates:
            if scanned >= MAX_SCAN or verified >= MAX_VERIFY:
                break
            scanned += 1
            self.work += 1
            if conj is exclude or conj == exclude:
                continue
            b = analysis[conj]
            upper, lower = (b, a) if up else (a, b)
            if lower.members is not None and not _may_cover(upper, lower):
                continue
            verified += 1
            self.work += upper.weight + lower.weight
            if covers_analysed(upper, lower) and not (strict and covers_analysed(lower, upper)):
                yield conj


def _may_cover(upper: Analysis, lower: Analysis) -> bool:
    """The cheap necessary conditions for ``upper`` to cover a satisfiable ``lower``."""
    if not upper.attrs <= lower.attrs:
        return False
    pins = lower.pins
    return all(pins.get(attr) == pin for attr, pin in upper.pins.items())


def _keys(a: Analysis) -> list[tuple]:
    return [(attr, a.pins.get(attr)) for attr in a.attrs] + [
        (attr, None) for attr in a.attrs if attr in a.pins
    ]


def _order(key: tuple) -> tuple:
    attr, pin = key
    return (attr, pin is None, repr(pin))


def _discard(table: dict, key, conj) -> None:
    members = table.get(key)
    if members is not None:
        members.pop(conj, None)
        if not members:
            del table[key]
