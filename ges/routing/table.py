"""Content routing at one broker: profile propagation and event destinations (seed 004 §3).

Theory of operation
-------------------
A :class:`ContentRouter` is the routing half of a broker core. It does no I/O and reads no clock;
its methods take messages and return ``(peer, message)`` pairs for the core to send.

**Profiles** (seed 004 §3.2). The broker's local subscriptions enter an :class:`Exporter`, which
keeps the aggregated (covering-reduced) set of conjunctions the rest of the system must know.
Each export or retraction is a :class:`~ges.wire.messages.ProfileChange` with a unique id
``(origin, incarnation, seq)``. It goes to the keepers of the broker's cluster
(:mod:`ges.routing.hierarchy` says who keeps what); every keeper that applies a change it had not
seen passes it on to the keepers of the next unit up (``Hierarchy.next_targets``), so a
level-ℓ change reaches the level-(ℓ+1) keepers, and so on to the top. A keeper holds one
:class:`ProfileGraph` per unit it keeps, whose destinations are that unit's children: brokers for
a cluster, clusters for a super-cluster, … A change that arrives twice (several keepers below
forward it) finds its id known and changes no predicate count; a removal reverses its add.
Keepers acknowledge adds to the origin, which holds a client's ``SubAck`` until every reachable
keeper has the subscription, so an event published anywhere after ``subscribe`` returns is
routed to it.

Messages carrying changes travel hop by hop along the connectivity graph and are lost when a link
drops or a keeper restarts. So the origin is the authority for its own profile: whenever the
route to one of its keepers changes, or a link of that keeper comes up (it restarted, or its
unit came back), the origin sends that keeper a *sync* — its complete live set — plus its live
adds. A sync also retires every entry of an older incarnation of the origin.

**Events** (seed 004 §3.3). An event carries :class:`~ges.wire.messages.Route` values. At the
publisher they are one per enclosing unit with more than one child: "this cluster except me",
"this super-cluster except my cluster", …, "the system except my top-level unit". A broker
handling a route:

* for a broker: delivers if it is that broker, else forwards along its best hop;
* for a unit it is outside of: forwards towards the unit;
* for a unit it is inside and keeps: matches the event against that unit's snapshot and
  replaces the route by one per matching child (except ``skip``), handled the same way. A keeper
  that has not yet had a sync from every reachable broker of the unit (it has just started, or
  the unit just came back) sends the event to every child instead: flooding a sub-unit is safe,
  dropping an event a subscriber wants is not;
* for a unit it is inside but does not keep: forwards the route to the nearest reachable keeper.

Every hop is the connectivity graph's hierarchical next hop, which avoids suspected nodes and
links. Routes are grouped by next hop, so an event crosses each link at most once per branch,
and the routes of one event name disjoint sets of brokers, so each destination broker gets the
event once even over redundant gateways — properties (a)–(c) of the issue: every matching
subscriber's broker is reached; a unit is entered only when some profile inside it matches (or
to cross it on the way to one); and no broker gets an event twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

from ges.connectivity import ConnectivityGraph
from ges.matching.graph import ProfileGraph
from ges.matching.model import Conjunction, conjunction_from_wire, conjunction_to_wire
from ges.routing.export import ADD, REMOVE, Exporter
from ges.routing.hierarchy import Hierarchy
from ges.topology import broker_order_key
from ges.topology.model import UnitPath
from ges.wire import messages as m

SYNC = 0

#: Removed change ids remembered so a late copy of their add is not applied.
MAX_TOMBSTONES = 65_536
#: Changes one ``Profiles`` message may carry (a sync of a broker with many subscriptions is
#: split into several messages).
MAX_CHANGES_PER_MESSAGE = 4_096
#: Relays after which a profile message is dropped (the origin's next sync repairs it).
MAX_RELAY_HOPS = 64

EntryId = tuple[str, int, int]


class ContentRouter:
    """One broker's profile snapshots and event routing (see the module docstring)."""

    def __init__(
        self, hierarchy: Hierarchy, broker_id: str, incarnation: int, graph: ConnectivityGraph
    ):
        self.h = hierarchy
        self.id = broker_id
        self.inc = incarnation
        self.graph = graph
        self.depth = hierarchy.depth
        self.unit: UnitPath = hierarchy.topology.brokers[broker_id].unit
        self.exporter = Exporter()
        #: the snapshot of every unit this broker keeps; destinations are the unit's children
        self.kept: dict[UnitPath, ProfileGraph] = {
            u: ProfileGraph() for u in hierarchy.kept_by[broker_id]
        }
        self._entries: dict[EntryId, tuple[Conjunction, tuple[tuple[UnitPath, str], ...]]] = {}
        self._by_origin: dict[str, set[int]] = {}
        self._inc: dict[str, int] = {}
        self._floor: dict[str, tuple[int, int, frozenset[int]]] = {}
        self._tombs: OrderedDict[EntryId, None] = OrderedDict()
        #: adds of this broker not yet acknowledged: seq -> keepers still to ack
        self.pending: dict[int, set[str]] = {}
        self._keepers = hierarchy.all_keepers(broker_id)
        self._hops: dict[str, str | None] = {}
        self._unit_hops: dict[UnitPath, str | None] = {}
        self._nearest: dict[UnitPath, str | None] = {}
        self._sync_hops: dict[str, str | None] = {}
        #: origins whose sync this broker has applied; a kept unit is *complete* once every
        #: reachable broker in it has synced
        self._synced: set[str] = {broker_id}
        self._complete: dict[UnitPath, bool] = {}
        self.initial_routes: tuple[m.Route, ...] = tuple(
            m.Route(u, hierarchy.child_of(u, broker_id))
            for u in hierarchy.chain(broker_id)
            if len(hierarchy.children[u]) > 1
        )
        self.counters = {"routes_dropped": 0}

    # -- introspection -----------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        """Profile entries held for the units this broker keeps."""
        return len(self._entries)

    def is_empty(self) -> bool:
        """No entry, no exported conjunction, no snapshot with anything in it."""
        return (
            not self._entries
            and not self._by_origin
            and not len(self.exporter)
            and all(not g for g in self.kept.values())
        )

    # -- local subscriptions -------------------------------------------------------------------------

    def local_change(
        self, add: Iterable[Conjunction] = (), remove: Iterable[Conjunction] = ()
    ) -> tuple[list, frozenset[int]]:
        """Local conjunctions added and removed (adds first, so a replaced profile never leaves a
        gap upstream). Returns the sends and the seqs of adds to wait for acks on."""
        ops: list[tuple[int, int, Conjunction]] = []
        for conj in add:
            ops += self.exporter.add(conj)
        for conj in remove:
            ops += self.exporter.remove(conj)
        if not ops:
            return [], frozenset()
        changes = [
            m.ProfileChange(self.id, self.inc, seq, op, conjunction_to_wire(conj))
            for op, seq, conj in ops
        ]
        if self._placements(self.id):  # this broker keeps a unit around itself
            for op, seq, conj in ops:
                if op == ADD:
                    self._apply_add(self.id, self.inc, seq, conj)
                else:
                    self._apply_remove(self.id, self.inc, seq)
        waits = set()
        expect = {k for k in self._keepers if self._hop(k) is not None}
        for op, seq, _ in ops:
            if op == ADD and expect:
                self.pending[seq] = set(expect)
                waits.add(seq)
            elif op == REMOVE:
                self.pending.pop(seq, None)
        targets = self.h.next_targets(self.id, self.id)
        return self._send(targets, changes), frozenset(waits)

    def acked(self, seqs: Iterable[int]) -> bool:
        return not any(s in self.pending for s in seqs)

    # -- profile messages ------------------------------------------------------------------------------

    def on_profiles(self, msg: m.Profiles) -> list:
        """Relay a ``Profiles`` message towards its other targets and apply it if it is for us."""
        brokers = self.h.topology.brokers
        for t in msg.to:
            if t not in brokers:
                raise ValueError(f"profile changes for unknown broker {t!r}")
        others = [t for t in msg.to if t != self.id]
        out = []
        if others and msg.hops < MAX_RELAY_HOPS:  # views that disagree can loop for a while
            out = self._send(others, msg.changes, msg.hops + 1)
        if len(others) < len(msg.to):
            out += self._apply(msg.changes)
        return out

    def on_ack(self, msg: m.ProfileAck) -> list:
        if msg.origin not in self.h.topology.brokers:
            raise ValueError(f"profile ack for unknown broker {msg.origin!r}")
        if msg.origin != self.id:
            hop = self._hop(msg.origin)
            if hop is None or msg.hops >= MAX_RELAY_HOPS:
                return []
            return [(hop, m.ProfileAck(msg.origin, msg.keeper, msg.inc, msg.seqs, msg.hops + 1))]
        if msg.inc == self.inc:
            for seq in msg.seqs:
                waiting = self.pending.get(seq)
                if waiting is not None:
                    waiting.discard(msg.keeper)
                    if not waiting:
                        del self.pending[seq]
        return []

    def _apply(self, changes: list[m.ProfileChange]) -> list:
        brokers = self.h.topology.brokers
        synced = {c.origin for c in changes if c.op == SYNC}
        fresh: dict[str, list[m.ProfileChange]] = {}
        acks: dict[tuple[str, int], list[int]] = {}
        for c in changes:
            if c.origin not in brokers:
                raise ValueError(f"profile change from unknown broker {c.origin!r}")
            known = self._inc.get(c.origin, 0)
            if c.inc < known:
                continue  # from an incarnation that has restarted since
            if c.inc > known:
                self._purge(c.origin, below=c.inc)
                self._inc[c.origin] = c.inc
            if c.op == SYNC:
                self._apply_sync(c)
                if c.origin not in self._synced:
                    self._synced.add(c.origin)
                    self._complete.clear()
                continue
            if c.op == ADD:
                conj = conjunction_from_wire(c.conjunction)
                new = self._apply_add(c.origin, c.inc, c.seq, conj)
                if new and c.origin != self.id:
                    acks.setdefault((c.origin, c.inc), []).append(c.seq)
            elif c.op == REMOVE:
                new = self._apply_remove(c.origin, c.inc, c.seq)
            else:
                raise ValueError(f"profile change with unknown op {c.op}")
            if new and c.origin not in synced:
                fresh.setdefault(c.origin, []).append(c)
        out = []
        for origin, cs in fresh.items():
            out += self._send(self.h.next_targets(self.id, origin), cs)
        for (origin, inc), seqs in acks.items():
            hop = self._hop(origin)
            if hop is not None:
                out.append((hop, m.ProfileAck(origin, self.id, inc, seqs)))
        return out

    def _placements(self, origin: str) -> tuple[tuple[UnitPath, str], ...]:
        h = self.h
        return tuple((u, h.child_of(u, origin)) for u in self.kept if h.contains(u, origin))

    def _apply_add(self, origin: str, inc: int, seq: int, conj: Conjunction) -> bool:
        eid = (origin, inc, seq)
        if eid in self._entries or eid in self._tombs:
            return False
        floor = self._floor.get(origin)
        if floor is not None and floor[0] == inc and seq <= floor[1] and seq not in floor[2]:
            return False  # gone as of the origin's last sync
        places = self._placements(origin)
        if not places:
            return False  # not ours to keep
        for unit, child in places:
            self.kept[unit].add(conj, child)
        self._entries[eid] = (conj, places)
        self._by_origin.setdefault(origin, set()).add(seq)
        return True

    def _apply_remove(self, origin: str, inc: int, seq: int) -> bool:
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

    def _apply_sync(self, c: m.ProfileChange) -> None:
        live = frozenset(c.seqs)
        for seq in list(self._by_origin.get(c.origin, ())):
            if seq <= c.seq and seq not in live and (c.origin, c.inc, seq) in self._entries:
                self._apply_remove(c.origin, c.inc, seq)
        self._floor[c.origin] = (c.inc, c.seq, live)

    # -- resync on connectivity changes --------------------------------------------------------------

    def connectivity_changed(self, up_ends: Iterable[str] = ()) -> list:
        """The connectivity graph changed: forget cached hops and send a sync to every keeper of
        this broker's profile whose route changed or that has a link just up."""
        self._hops.clear()
        self._unit_hops.clear()
        self._nearest.clear()
        self._complete.clear()
        # a broker this one cannot reach must sync again before its units count as complete
        # (when a partition heals, events flood its units until its sync arrives)
        for b in [b for b in self._synced if b != self.id and self._hop(b) is None]:
            self._synced.discard(b)
        up = set(up_ends)
        targets = []
        for k in sorted(self._keepers, key=broker_order_key):
            hop = self._hop(k)
            if hop is None:
                for waiting in self.pending.values():  # unreachable: do not wait for it
                    waiting.discard(k)
            elif hop != self._sync_hops.get(k) or k in up:
                targets.append(k)
            self._sync_hops[k] = hop
        for seq in [s for s, w in self.pending.items() if not w]:
            del self.pending[seq]
        if not targets:
            return []
        return self._send(targets, self.sync_changes())

    def sync_changes(self) -> list[m.ProfileChange]:
        """This broker's complete profile: a sync followed by every live add."""
        live = self.exporter.exported
        out = [
            m.ProfileChange(
                self.id, self.inc, self.exporter.last_seq, SYNC, seqs=sorted(live.values())
            )
        ]
        out += [
            m.ProfileChange(self.id, self.inc, seq, ADD, conjunction_to_wire(conj))
            for conj, seq in live.items()
        ]
        return out

    # -- sending -------------------------------------------------------------------------------------

    def _send(self, targets: Iterable[str], changes: list[m.ProfileChange], hops: int = 0) -> list:
        """``Profiles`` messages towards ``targets``, one per next hop; unreachable ones are
        skipped (the origin syncs them when a route appears)."""
        by_hop: dict[str, list[str]] = {}
        for t in targets:
            hop = self._hop(t)
            if hop is not None:
                by_hop.setdefault(hop, []).append(t)
        out = []
        for hop, tos in by_hop.items():
            for i in range(0, len(changes), MAX_CHANGES_PER_MESSAGE):
                chunk = changes[i : i + MAX_CHANGES_PER_MESSAGE]
                out.append((hop, m.Profiles(tos, chunk, hops)))
        return out

    def _hop(self, broker_id: str) -> str | None:
        try:
            return self._hops[broker_id]
        except KeyError:
            pass
        spec = self.h.topology.brokers.get(broker_id)
        hop = None
        if spec is not None and broker_id != self.id:
            hop = self.graph.next_hop(broker_id, spec.unit, fallback=True)
        self._hops[broker_id] = hop
        return hop

    def _unit_hop(self, unit: UnitPath) -> str | None:
        try:
            return self._unit_hops[unit]
        except KeyError:
            pass
        node = self.graph.node_for_unit(unit)
        hop = None if node is None else self.graph.next_hop_to(node, fallback=True)
        self._unit_hops[unit] = hop
        return hop

    def _nearest_keeper(self, unit: UnitPath) -> str | None:
        try:
            return self._nearest[unit]
        except KeyError:
            pass
        best = None
        brokers = self.h.topology.brokers
        for k in self.h.keepers[unit]:
            if k == self.id:
                continue
            node = self.graph.node_for(k, brokers[k].unit)
            dist = self.graph.distance(node)
            if dist is None:
                continue
            rank = (dist, broker_order_key(k))
            if best is None or rank < best[0]:
                best = (rank, k)
        self._nearest[unit] = found = None if best is None else best[1]
        return found

    # -- events (seed 004 §3.3) -----------------------------------------------------------------------

    def route_event(
        self, attributes: Mapping, routes: Iterable[m.Route], been: tuple[str, ...] = ()
    ) -> dict[str, list[m.Route]]:
        """Where an event goes next: {next hop: routes to pass on}.

        Every broker that an event passes through delivers it to its own matching subscribers
        (the core does that), so a keeper never sends it back to a broker it has ``been`` to.
        Routes with no reachable next hop are counted in ``routes_dropped`` and forgotten.
        """
        out: dict[str, list[m.Route]] = {}
        stack = list(routes)
        depth = self.depth
        my_unit = self.unit
        kept = self.kept
        children = self.h.children
        keepers = self.h.keepers
        chosen: list[str] = []  # keepers asked in this call: one keeper serves several units
        while stack:
            r = stack.pop()
            path = r.unit
            n = len(path)
            if n > depth:  # one broker
                if path[-1] == self.id or path[-1] in been:
                    continue
                hop = self._hop(path[-1])
            elif my_unit[:n] != path:  # a unit elsewhere
                hop = self._hop(r.via) if r.via else self._unit_hop(path)
            else:  # a unit around this broker
                kids = children[path]
                if len(kids) == 1:
                    stack.append(m.Route((*path, kids[0])))
                    continue
                snapshot = kept.get(path)
                if snapshot is not None:
                    skip = r.skip
                    complete = self._complete.get(path)
                    if complete is None:
                        complete = self._is_complete(path)
                    for kid in snapshot.match(attributes) if complete else kids:
                        if kid != skip:
                            stack.append(m.Route((*path, kid)))
                    continue
                via = r.via
                hop = self._hop(via) if via and via != self.id else None
                if hop is None:  # no keeper chosen yet, or it became unreachable
                    # the routes of the publisher's units come highest first; a keeper of a
                    # higher unit inside this one keeps this one too, so one keeper answers for
                    # all of them and the event takes one branch to them, not one per unit
                    unit_keepers = keepers[path]
                    via = next((k for k in chosen if k in unit_keepers), None)
                    if via is None:
                        via = self._nearest_keeper(path)
                        if via is not None:
                            chosen.append(via)
                    if via is None:  # no keeper reachable: every child, the safe fallback
                        skip = r.skip
                        stack.extend(m.Route((*path, kid)) for kid in kids if kid != skip)
                        continue
                    hop = self._hop(via)
                    r = m.Route(path, r.skip, via)
            if hop is None:
                self.counters["routes_dropped"] += 1
            else:
                got = out.get(hop)
                if got is None:
                    out[hop] = [r]
                else:
                    got.append(r)
        return out

    def _is_complete(self, unit: UnitPath) -> bool:
        synced = self._synced
        done = all(b in synced or self._hop(b) is None for b in self.h.topology.units[unit])
        self._complete[unit] = done
        return done

    def check_routes(self, routes: Iterable[m.Route]) -> None:
        """Raise ValueError for a route naming a unit or broker this topology does not have."""
        valid = self.h.valid_paths
        brokers = self.h.topology.brokers
        for r in routes:
            if r.unit not in valid:
                raise ValueError(f"route to unknown unit {'/'.join(r.unit) or '/'}")
            if r.via and r.via not in brokers:
                raise ValueError(f"route via unknown broker {r.via!r}")
