"""The pre-issue-17 all-pairs exporter, kept only as the benchmark's baseline (bench/matching.py).

This is ``ges/routing/export.py`` exactly as it was at commit 6678d4f, the last commit before
bd88727 (issue 17: a covering index and bounded work per request) — unchanged except for this
paragraph and one import: ``covers`` comes from :mod:`_baseline_covering`, the
``ges/matching/covering.py`` of the same commit (today's ``covers`` analyses both conjunctions
more thoroughly on every call and is slower, which would flatter the new code). Every change
compares the conjunction with every exported or local one (``covers``: n² calls to add n
conjunctions, of the order of n³ to remove them); above ``MAX_COVERING_SCAN`` distinct
conjunctions it stops covering. Nothing in GES uses it.

The original docstring follows.

A broker's aggregated profile: the conjunctions it tells its unit's keepers about.

Seed 004 §3.2 propagates a broker's profile change only when it changes the broker's profile;
seed 000 §3.3 (Definition 1) reduces a set of conjunctions by covering. The broker exports a set E
of its local conjunctions such that every local conjunction is covered by some member of E
(the empty conjunction covers everything). Adding a conjunction that an exported one covers
changes nothing upstream; adding one that covers exported ones replaces them; removing the last
copy of an exported conjunction re-exports the local ones it was covering.

Every exported conjunction gets a sequence number unique within this broker incarnation, so
``(broker, incarnation, seq)`` names it at every keeper (:mod:`ges.routing.table`).
"""

from __future__ import annotations

from _baseline_covering import covers

from ges.matching.model import Conjunction

ADD = 1
REMOVE = 2

#: Above this many distinct local conjunctions the exporter stops looking for covers (each
#: change would cost a scan of them all) and exports every distinct conjunction.
MAX_COVERING_SCAN = 4_096


class Exporter:
    """Local conjunctions (a multiset) in, ``(op, seq, conjunction)`` changes out."""

    def __init__(self) -> None:
        self._local: dict[Conjunction, int] = {}  # conjunction -> local copies
        self.exported: dict[Conjunction, int] = {}  # conjunction -> seq
        self._seq = 0

    def __len__(self) -> int:
        return len(self.exported)

    @property
    def last_seq(self) -> int:
        return self._seq

    def add(self, conj: Conjunction) -> list[tuple[int, int, Conjunction]]:
        n = self._local.get(conj, 0)
        self._local[conj] = n + 1
        if n:
            return []
        if len(self._local) > MAX_COVERING_SCAN:
            return [self._export(conj)]
        return self._cover(conj)

    def remove(self, conj: Conjunction) -> list[tuple[int, int, Conjunction]]:
        n = self._local.get(conj, 0)
        if n == 0:
            raise KeyError(conj)
        if n > 1:
            self._local[conj] = n - 1
            return []
        del self._local[conj]
        if conj not in self.exported:
            return []
        out = [self._retract(conj)]
        if len(self._local) > MAX_COVERING_SCAN:  # no covering: what it covered goes up as is
            for c in self._local:
                if c not in self.exported and covers(conj, c):
                    out.append(self._export(c))
            return out
        # re-export the widest of what the removed conjunction alone was covering
        loose = [c for c in self._local if not any(covers(e, c) for e in self.exported)]
        for c in loose:
            if not any(o is not c and covers(o, c) and not covers(c, o) for o in loose):
                out += self._cover(c)
        return out

    def _cover(self, conj: Conjunction) -> list[tuple[int, int, Conjunction]]:
        """Export ``conj`` unless an exported one covers it, retracting those it covers."""
        if any(covers(e, conj) for e in self.exported):
            return []
        out = [self._retract(e) for e in list(self.exported) if covers(conj, e)]
        out.append(self._export(conj))
        return out

    def _export(self, conj: Conjunction) -> tuple[int, int, Conjunction]:
        self._seq += 1
        self.exported[conj] = self._seq
        return (ADD, self._seq, conj)

    def _retract(self, conj: Conjunction) -> tuple[int, int, Conjunction]:
        return (REMOVE, self.exported.pop(conj), conj)
