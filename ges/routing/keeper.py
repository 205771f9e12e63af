"""The keeper side: one profile snapshot per kept unit, built from the origins' changes (seed 004 §3.2).

Theory of operation
-------------------
A keeper holds one :class:`~ges.matching.graph.ProfileGraph` per unit it keeps, whose
destinations are that unit's children: brokers for a cluster, clusters for a super-cluster, …
Each change carries a unique id ``(origin, incarnation, seq)``; a change that arrives twice
(several keepers below forward it) finds its id known and changes no predicate count, and a
removal reverses its add (removed ids are remembered, so a late copy of an add is not applied).
A sync — an origin's complete live set — retires every entry of an older incarnation of that
origin. Every change a keeper applies for the first time goes on to the keepers of the next
unit up, and adds are acknowledged to the origin, with the last tick of each pubend the keeper
had routed before applying them (reliable delivery starts there; ges.core.gates). V_b (seed 000
§3.4) says, per origin, up to which of its adds every one is applied or known gone; a kept unit
is *complete* once every reachable broker in it has synced.
"""

from __future__ import annotations

from collections import OrderedDict

from ges.matching.graph import ProfileGraph
from ges.matching.model import Conjunction, conjunction_from_wire
from ges.routing.base import (
    MAX_RELAY_HOPS,
    MAX_TOMBSTONES,
    SYNC,
    EntryId,
    RouterPart,
)
from ges.routing.export import ADD, REMOVE
from ges.topology import UnitPath
from ges.wire import messages as m


class KeeperSnapshots(RouterPart):
    """The snapshots of the units this broker keeps, and what each origin's changes did to them."""

    def __init__(self, router):
        super().__init__(router)
        #: the snapshot of every unit this broker keeps; destinations are the unit's children
        self.kept: dict[UnitPath, ProfileGraph] = {
            u: ProfileGraph() for u in self.h.kept_by[self.id]
        }
        self._entries: dict[EntryId, tuple[Conjunction, tuple[tuple[UnitPath, str], ...]]] = {}
        self._by_origin: dict[str, set[int]] = {}
        self.incs: dict[str, int] = {}
        self._floor: dict[str, tuple[int, int, frozenset[int]]] = {}
        self._tombs: OrderedDict[EntryId, None] = OrderedDict()
        #: origins whose sync this broker has applied; a kept unit is *complete* once every
        #: reachable broker in it has synced
        self.synced: set[str] = {self.id}
        self.complete: dict[UnitPath, bool] = {}
        #: per kept unit, the children with a broker that has not synced (reliable delivery)
        self.unsynced: dict[UnitPath, tuple[str, ...]] = {}
        #: V_b (seed 000 §3.4): per origin of a kept unit, [inc, seq] such that every add of
        #: the origin's incarnation ``inc`` up to ``seq`` is applied or known gone
        self.vb: dict[str, list[int]] = {}
        #: sufficiency test results: (unit, pubend) -> (vector key, children that fail it)
        self.sufficient: dict[tuple[UnitPath, str], tuple[int, tuple[str, ...]]] = {}

    @property
    def entries(self) -> int:
        """Profile entries held for the units this broker keeps."""
        return len(self._entries)

    def is_empty(self) -> bool:
        """No entry, no exported conjunction, no snapshot with anything in it."""
        return (
            not self._entries
            and not self._by_origin
            and not len(self.origin.exporter)
            and all(not g for g in self.kept.values())
        )

    def on_profiles(self, msg: m.Profiles) -> list:
        """Relay a ``Profiles`` message towards its other targets and apply it if it is for us."""
        brokers = self.h.topology.brokers
        for t in msg.to:
            if t not in brokers:
                raise ValueError(f"profile changes for unknown broker {t!r}")
        if msg.detour:
            self.paths.check_detour(msg.detour)
        others = [t for t in msg.to if t != self.id]
        out = []
        if others and msg.hops < MAX_RELAY_HOPS:  # views that disagree can loop for a while
            step, gave_up = self.paths.follow(msg.detour)
            if step is None:
                out = self.paths.send(
                    others, msg.changes, msg.hops + 1, resend=msg.resend, gave_up=gave_up
                )
            else:
                hop, detour = step
                out = [
                    (hop, m.Profiles(others, msg.changes, msg.hops + 1, list(detour), msg.resend))
                ]
        if len(others) < len(msg.to):
            out += self._apply(msg.changes, msg.resend)
        return out

    def _apply(self, changes: list[m.ProfileChange], resend: bool = False) -> list:
        brokers = self.h.topology.brokers
        synced = {c.origin for c in changes if c.op == SYNC}
        fresh: dict[str, list[m.ProfileChange]] = {}
        # (origin, inc) -> (adds held, removals applied) to acknowledge; a change the origin sent
        # again is acknowledged even when known (it resends when an ack is lost)
        acks: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for c in changes:
            if c.origin not in brokers:
                raise ValueError(f"profile change from unknown broker {c.origin!r}")
            known = self.incs.get(c.origin, 0)
            if c.inc < known:
                continue  # from an incarnation that has restarted since
            if c.inc > known:
                self._purge(c.origin, below=c.inc)
                self.incs[c.origin] = c.inc
            if c.op == SYNC:
                self._apply_sync(c)
                if c.origin not in self.synced:
                    self.synced.add(c.origin)
                    self.complete.clear()
                    self.unsynced.clear()
                continue
            if c.op == ADD:
                conj = conjunction_from_wire(c.conjunction)
                new = self.apply_add(c.origin, c.inc, c.seq, conj)
                if c.origin != self.id and (
                    new or (resend and (c.origin, c.inc, c.seq) in self._entries)
                ):
                    acks.setdefault((c.origin, c.inc), ([], []))[0].append(c.seq)
            elif c.op == REMOVE:
                new = self.apply_remove(c.origin, c.inc, c.seq)
                if c.origin != self.id and (new or resend) and self.placements(c.origin):
                    acks.setdefault((c.origin, c.inc), ([], []))[1].append(c.seq)
            else:
                raise ValueError(f"profile change with unknown op {c.op}")
            if new and c.origin not in synced:
                fresh.setdefault(c.origin, []).append(c)
        for origin in {c.origin for c in changes}:
            if origin in self.incs:
                self.advance(origin)
        out = []
        for origin, cs in fresh.items():
            out += self.paths.send(self.h.next_targets(self.id, origin), cs)
        for (origin, inc), (seqs, removed) in acks.items():
            step = self.paths.path_to(origin)
            if step is not None:
                hop, detour = step
                ticks = (
                    self.events.claims.latest() if self.events.claims is not None and seqs else []
                )
                ack = m.ProfileAck(origin, self.id, inc, seqs, 0, removed, list(detour), ticks)
                out.append((hop, ack))
        return out

    def advance(self, origin: str) -> None:
        """Move ``origin``'s V_b over every add now applied or known gone (seed 000 §3.4: a
        change is applied only on a complete prefix — its constraint vector is the origin's
        clock just before it)."""
        inc = self.incs[origin]
        v = self.vb.get(origin)
        if v is None or v[0] != inc:
            v = self.vb[origin] = [inc, 0]
        entries, tombs = self._entries, self._tombs
        seq = v[1]
        floor = self._floor.get(origin)
        if floor is not None and floor[0] == inc and seq < floor[1]:
            # up to the sync's seq every add is gone but the live ones: V_b reaches the first
            # live one not applied yet (in one step, however far the sync's seq is)
            missing = [
                n
                for n in floor[2]
                if seq < n <= floor[1]
                and (origin, inc, n) not in entries
                and (origin, inc, n) not in tombs
            ]
            seq = min(missing) - 1 if missing else floor[1]
        while (origin, inc, seq + 1) in entries or (origin, inc, seq + 1) in tombs:
            seq += 1
        if seq != v[1]:
            v[1] = seq
            self.sufficient.clear()

    def own_units(self) -> tuple[tuple[UnitPath, str], ...]:
        """The units this broker keeps that hold itself (its own adds go into their graphs)."""
        return self.placements(self.id)

    def placements(self, origin: str) -> tuple[tuple[UnitPath, str], ...]:
        h = self.h
        return tuple((u, h.child_of(u, origin)) for u in self.kept if h.contains(u, origin))

    def apply_add(self, origin: str, inc: int, seq: int, conj: Conjunction) -> bool:
        eid = (origin, inc, seq)
        if eid in self._entries or eid in self._tombs:
            return False
        floor = self._floor.get(origin)
        if floor is not None and floor[0] == inc and seq <= floor[1] and seq not in floor[2]:
            return False  # gone as of the origin's last sync
        places = self.placements(origin)
        if not places:
            return False  # not ours to keep
        for unit, child in places:
            self.kept[unit].add(conj, child)
        self._entries[eid] = (conj, places)
        self._by_origin.setdefault(origin, set()).add(seq)
        return True

    def apply_remove(self, origin: str, inc: int, seq: int) -> bool:
        eid = (origin, inc, seq)
        if eid in self._tombs:
            return False
        self._tombs[eid] = None
        if len(self._tombs) > MAX_TOMBSTONES:
            self._tombs.popitem(last=False)
        self._drop(eid)
        return True

    def _drop(self, eid: EntryId) -> None:
        got = self._entries.pop(eid, None)
        if got is None:
            return
        conj, places = got
        for unit, child in places:
            self.kept[unit].remove(conj, child)
        seqs = self._by_origin[eid[0]]
        seqs.discard(eid[2])
        if not seqs:
            del self._by_origin[eid[0]]

    def _purge(self, origin: str, *, below: int) -> None:
        for eid in [e for e in self._entries if e[0] == origin and e[1] < below]:
            self._drop(eid)
        self._floor.pop(origin, None)
        self.vb.pop(origin, None)
        self.sufficient.clear()

    def _apply_sync(self, c: m.ProfileChange) -> None:
        floor = self._floor.get(c.origin)
        if floor is not None and floor[0] == c.inc and floor[1] > c.seq:
            return  # an older sync overtaken by a newer one (they can take different paths)
        live = frozenset(c.seqs)
        for seq in list(self._by_origin.get(c.origin, ())):
            if seq <= c.seq and seq not in live and (c.origin, c.inc, seq) in self._entries:
                self.apply_remove(c.origin, c.inc, seq)
        self._floor[c.origin] = (c.inc, c.seq, live)

    def unsynced_kids(self, unit: UnitPath) -> tuple[str, ...]:
        got = self.unsynced.get(unit)
        if got is None:
            synced = self.synced
            units = self.h.topology.units
            got = self.unsynced[unit] = tuple(
                kid
                for kid in self.h.children[unit]
                if any(b not in synced for b in units.get((*unit, kid), (kid,)))
            )
        return got

    def is_complete(self, unit: UnitPath) -> bool:
        synced = self.synced
        done = all(
            b in synced or self.paths.path_to(b) is None for b in self.h.topology.units[unit]
        )
        self.complete[unit] = done
        return done
