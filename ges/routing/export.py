"""A broker's aggregated profile: the conjunctions it tells its unit's keepers about.

Seed 004 §3.2 propagates a broker's profile change only when it changes the broker's profile;
seed 000 §3.3 (Definition 1) reduces a set of conjunctions by covering. The broker exports a set E
of its local conjunctions such that every local conjunction is covered by some member of E
(the empty conjunction covers everything). Adding a conjunction that an exported one covers
changes nothing upstream; adding one that covers exported ones replaces them; removing the last
copy of an exported conjunction re-exports the local ones it was covering.

Every exported conjunction gets a sequence number unique within this broker incarnation, so
``(broker, incarnation, seq)`` names it at every keeper (:mod:`ges.routing.table`).

Cost. Each local conjunction that is not exported remembers *one* exported conjunction that
covers it (its coverer), and each exported one the conjunctions it stands for. Finding a
coverer, or what a new conjunction covers, is a query of a :class:`CoverIndex` over the
exported set, bounded whatever its size; so adding or removing a conjunction costs about the
same with 1 or 100,000 stored, not a comparison with each (the old all-pairs scan took minutes
to remove a profile of 1,024 conjunctions). The index may miss a cover; then a conjunction is
exported although another covers it — more state upstream, never a lost event. Conjunctions
heavier than :data:`~ges.matching.cover_index.MAX_HEAVY` are exported as they are.

Removing an exported conjunction that stands for others is done in steps: it leaves the index
at once (nothing new is placed under it) but stays exported while the ones it stood for are
placed again — under another coverer, or exported themselves — :meth:`Exporter.step` at a
time, and is retracted after the last. So the keepers never miss a conjunction still wanted (the
adds go up before the removal), and one removal never holds the broker for longer than a step.
The ones it stood for are first indexed among themselves, and one that another of them covers
is placed after that one: the widest go up, and none is exported only to be retracted again.
Added back before it has left, it stays and stands for its own again — unless one exported while
it was out of the index covers it: then it is retracted at once and stands under that one.
"""

from __future__ import annotations

from ges.matching.cover_index import CoverIndex
from ges.matching.covering import analyse
from ges.matching.model import Conjunction

ADD = 1
REMOVE = 2

Op = tuple[int, int, Conjunction]


class Exporter:
    """Local conjunctions (a multiset) in, ``(op, seq, conjunction)`` changes out."""

    def __init__(self) -> None:
        self._local: dict[Conjunction, int] = {}  # conjunction -> local copies
        self.exported: dict[Conjunction, int] = {}  # conjunction -> seq
        self._index = CoverIndex()
        #: local conjunction not exported -> the exported one standing for it
        self._cover_of: dict[Conjunction, Conjunction] = {}
        #: exported conjunction -> the local ones it stands for (an ordered set)
        self._stands_for: dict[Conjunction, dict[Conjunction, None]] = {}
        #: exported conjunctions no longer local whose dependents are being placed again; each is
        #: retracted after its last (oldest first)
        self._leaving: dict[Conjunction, _Leaving] = {}
        #: seq retracted -> the seqs now standing for what it stood for (a subscription waiting
        #: for the old one's acks waits for these); taken by the caller
        self.replaced: dict[int, tuple[int, ...]] = {}
        self._seq = 0
        self._work = 0

    def __len__(self) -> int:
        return len(self.exported)

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def work(self) -> int:
        """Work done so far (index queries and conjunctions analysed, by weight): a caller
        bounding its steps counts the difference."""
        return self._work + self._index.work

    @property
    def pending(self) -> bool:
        """Some removal still has conjunctions to place again (:meth:`step`)."""
        return bool(self._leaving)

    def seq_for(self, conj: Conjunction) -> int | None:
        """The seq of the exported conjunction standing for the local ``conj`` (its own, or its
        coverer's); None for one that matches nothing."""
        seq = self.exported.get(conj)
        if seq is None:
            cover = self._cover_of.get(conj)
            if cover is not None:
                seq = self.exported.get(cover)
        return seq

    def add(self, conj: Conjunction) -> list[Op]:
        n = self._local.get(conj, 0)
        self._local[conj] = n + 1
        if n:
            return []
        if conj in self._leaving:
            return self._return(conj)
        return self._place(conj)

    def remove(self, conj: Conjunction) -> list[Op]:
        """Remove one local copy. The last copy of an exported conjunction that stands for
        others leaves in steps (:meth:`step`); the first is taken here."""
        n = self._local.get(conj, 0)
        if n == 0:
            raise KeyError(conj)
        if n > 1:
            self._local[conj] = n - 1
            return []
        del self._local[conj]
        cover = self._cover_of.pop(conj, None)
        if cover is not None:
            dependents = self._stands_for[cover]
            del dependents[conj]
            leaving = self._leaving.get(cover)
            if leaving is not None:
                leaving.siblings.remove(conj)
            if not dependents:
                del self._stands_for[cover]
                if leaving is not None:  # its last dependent went: it goes too
                    del self._leaving[cover]
                    return [self._retract(cover, leaving.seqs)]
            return []
        if conj not in self.exported:
            return []  # it matches nothing (see _place)
        dependents = self._stands_for.get(conj)
        if not dependents:
            return [self._retract(conj)]
        self._index.remove(conj)
        self._leaving[conj] = _Leaving(list(dependents))
        return []

    def step(self, budget: int) -> list[Op]:
        """Place again the dependents of leaving conjunctions until ``budget`` work is done;
        retract each leaving conjunction after its last dependent."""
        out: list[Op] = []
        start = self.work
        while self._leaving and self.work - start < budget:
            conj, leaving = next(iter(self._leaving.items()))
            dependents = self._stands_for.get(conj)
            if not dependents:
                del self._leaving[conj]
                self._stands_for.pop(conj, None)
                out.append(self._retract(conj, leaving.seqs))
                continue
            first = leaving.first
            if leaving.indexed < first:  # first: index them among themselves
                dependent = leaving.order[leaving.indexed]
                leaving.indexed += 1
                if dependent in dependents:
                    a = self._analyse(dependent)
                    if CoverIndex.indexable(a):
                        leaving.siblings.add(a)
                continue
            if leaving.placed < len(leaving.order):
                dependent = leaving.order[leaving.placed]
                leaving.placed += 1
                if dependent not in dependents:
                    continue  # removed meanwhile
                a = self._analyse(dependent)
                if (
                    leaving.placed <= first
                    and dependent in leaving.siblings
                    and leaving.siblings.coverer(a, strict=True, exclude=dependent)
                ):
                    leaving.order.append(dependent)  # after the one that covers it
                    continue
            else:
                dependent = next(iter(dependents))
                a = None
            del dependents[dependent]
            del self._cover_of[dependent]
            out += self._place(dependent, a)
            seq = self.seq_for(dependent)
            if seq is not None:
                leaving.seqs.append(seq)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _analyse(self, conj: Conjunction):
        a = analyse(conj)
        self._work += a.weight
        return a

    def _return(self, conj: Conjunction) -> list[Op]:
        """The leaving ``conj`` is local again before it left. It was out of the index while
        leaving, so a conjunction exported meanwhile may cover it without having absorbed it:
        then it is retracted now and it, with what it still stood for, stands under that one.
        Else it stays, and stands for its own again."""
        leaving = self._leaving.pop(conj)
        a = self._analyse(conj)
        cover = self._index.coverer(a)
        if cover is not None:
            return [self._stand_under(conj, cover, [*leaving.seqs, self.exported[cover]])]
        if not self._stands_for.get(conj):  # step placed the last one, then ran out of budget
            self._stands_for.pop(conj, None)
        out = self._absorb(conj, a, self.exported[conj])
        self._index.add(a)
        return out

    def _place(self, conj: Conjunction, a=None) -> list[Op]:
        """Make the local ``conj`` covered: by an exported conjunction, else export it,
        retracting the exported ones it covers (they stand under it from now on)."""
        if a is None:
            a = self._analyse(conj)
        if a.members is None:
            return []  # unsatisfiable: it matches no event, so no keeper needs it
        if not CoverIndex.indexable(a):
            return [self._export(conj, None)]
        cover = self._index.coverer(a)
        if cover is not None:
            self._cover_of[conj] = cover
            self._stands_for.setdefault(cover, {})[conj] = None
            return []
        out = self._absorb(conj, a, self._seq + 1)  # the seq _export gives it below
        out.append(self._export(conj, a))
        return out

    def _absorb(self, conj: Conjunction, a, seq: int) -> list[Op]:
        """Retract the exported conjunctions ``conj`` (exported as ``seq``) covers: they and
        what they stood for stand under it from now on."""
        return [self._stand_under(old, conj, [seq]) for old in self._index.covered(a)]

    def _stand_under(self, old: Conjunction, cover: Conjunction, replaced_by: list[int]) -> Op:
        """Retract the exported ``old``, which ``cover`` covers: it and what it stood for stand
        under ``cover`` from now on."""
        mine = self._stands_for.setdefault(cover, {})
        for d in self._stands_for.pop(old, ()):
            self._cover_of[d] = cover
            mine[d] = None
        self._cover_of[old] = cover
        mine[old] = None
        return self._retract(old, replaced_by)

    def _export(self, conj: Conjunction, a) -> Op:
        self._seq += 1
        self.exported[conj] = self._seq
        if a is not None:
            self._index.add(a)
        return (ADD, self._seq, conj)

    def _retract(self, conj: Conjunction, replaced_by: list[int] | None = None) -> Op:
        self._index.remove(conj)
        seq = self.exported.pop(conj)
        if replaced_by:
            self.replaced[seq] = tuple(dict.fromkeys(replaced_by))
        return (REMOVE, seq, conj)


class _Leaving:
    """A leaving conjunction's dependents, in the order they are placed again: ``order`` (those
    another one covers are moved to its end), ``siblings`` indexing them among themselves (the
    first ``indexed`` of ``order``), ``placed`` how far placing has gone; ``seqs`` the exported
    conjunctions now standing for them."""

    __slots__ = ("order", "first", "siblings", "indexed", "placed", "seqs")

    def __init__(self, order: list[Conjunction]) -> None:
        self.order = order
        self.first = len(order)  # the ones placed in a second round are appended after these
        self.siblings = CoverIndex()
        self.indexed = 0
        self.placed = 0
        self.seqs: list[int] = []
