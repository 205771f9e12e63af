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
adds. A sync also retires every entry of an older incarnation of the origin. Keepers acknowledge
removals too, and an origin that has waited :data:`RESEND_AFTER` seconds for a keeper's acks
(a change or an ack was lost on the way) sends that keeper a sync again, waiting twice as long
each time up to :data:`RESEND_MAX`. A keeper acknowledges every change a sync carries, so a lost
ack is repaired the same way.

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
  dropping an event a subscriber wants is not. With reliable delivery a child also gets every
  event when the event's V_m knows a newer clock of one of its brokers than this keeper's V_b
  (seed 000 §3.5; :mod:`ges.reliable.vt`);
* for a unit it is inside but does not keep: forwards the route to the nearest reachable keeper.

Every hop is the connectivity graph's hierarchical next hop, which avoids suspected nodes and
links. When a unit is split inside, the hierarchical route to its far side does not exist, and
brokers that see the unit as one node would send a message for the far side back to this side;
so a message (event route, profile change or ack) that must go round the split carries a
*detour*, the brokers where the whole view's shortest path crosses between nodes
(:meth:`ContentRouter._detour`). Routes are grouped by next hop, so an event crosses each link
at most once per branch, and the routes of one event name disjoint sets of brokers, so each destination broker gets the
event once even over redundant gateways — properties (a)–(c) of the issue: every matching
subscriber's broker is reached; a unit is entered only when some profile inside it matches (or
to cross it on the way to one); and no broker gets an event twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Protocol

from ges.connectivity import ConnectivityGraph, GraphNode
from ges.matching.graph import ProfileGraph
from ges.matching.model import (
    Conjunction,
    conjunction_from_wire,
    conjunction_to_wire,
    constraint_weight,
)
from ges.routing.acks import PENDING, REMOVING, WAIVED, AckBook, Ticket
from ges.routing.export import ADD, REMOVE, Exporter
from ges.routing.hierarchy import Hierarchy
from ges.topology import UnitPath, broker_order_key
from ges.wire import messages as m


class ClaimChains(Protocol):
    """What routing needs of reliable delivery's claim chains (ges.reliable.claims.Claims, seed
    002 §2): a keeper records each route it learns and makes a claim per child from it."""

    def learn(self, pubend: str, unit: tuple, prev: int, tick: int) -> object:
        """A route for ``unit`` claiming ``(prev, tick)`` arrived: the unit's state."""

    def claim(self, st, kid: str, tick: int) -> int:
        """The claim of the route this broker makes for child ``kid`` at ``tick``."""

    def latest(self) -> list[tuple[str, int]]:
        """``(pubend, tick)``: the highest tick of each pubend routed here as a keeper."""


SYNC = 0

#: (unit, pubend) sufficiency results cached (seed 000 §5.1); beyond it the cache starts over.
MAX_SUFFICIENCY = 16_384
#: Removed change ids remembered so a late copy of their add is not applied.
MAX_TOMBSTONES = 65_536
#: Changes one ``Profiles`` message may carry, and their weight (constraints plus ``in``
#: values: what applying them costs a keeper, which does it in one go) — a sync of a broker
#: with many subscriptions is split into several messages.
MAX_CHANGES_PER_MESSAGE = 4_096
MAX_MESSAGE_WEIGHT = 512
#: Relays after which a profile message is dropped (the origin's next sync repairs it).
MAX_RELAY_HOPS = 64
#: Seconds an origin waits for a keeper's acks before sending it a sync again; the wait doubles
#: with every resend up to RESEND_MAX.
RESEND_AFTER = 1.0
RESEND_MAX = 30.0
#: Unanswered resends after which an origin stops waiting for a keeper (it may be dead behind a
#: unit this broker sees as one node); the keeper gets a sync again when a route to it changes.
MAX_RESENDS = 8
#: Replaced adds remembered for the subscriptions waiting on them (the oldest go first).
MAX_REPLACED = 4_096
#: Pubends read from one acknowledgement's ``ticks``.
MAX_TICKS_PER_ACK = 1_024
#: Brokers a detour round a split unit may name.
MAX_DETOUR = 32
#: The detour of a route whose detour could not be followed: it takes no other.
GAVE_UP = ("",)
#: ``route_event``'s ``vm`` for the empty V_m
NO_VECTOR: tuple[int, dict] = (0, {})

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
        #: the acknowledgements this broker's changes are owed, and the subscriptions waiting
        #: on them (:mod:`ges.routing.acks`)
        self.book = AckBook()
        #: reliable delivery: the keepers' claim chains (set by the core), and per live add the
        #: last tick of each pubend routed before its keepers applied it (from their acks)
        self.claims: ClaimChains | None = None
        #: reliable delivery's sufficiency rule (seed 000 §3.5): a child with a broker whose
        #: profile this keeper lacks gets every event. Off only to show what it prevents.
        self.sufficiency = True
        #: reliable delivery: an add is owed by *every* keeper, reachable or not, until it acks
        #: or is given up after MAX_RESENDS rounds (the subscription starts only then). A
        #: keeper this broker cannot reach may still be reached by publishers and route with
        #: the old profile — and a view from outside a unit cannot see it split, so that keeper
        #: may take this broker for reachable and synced.
        self.wait_for_all = False
        self.starts: dict[int, dict[str, int]] = {}
        #: keepers given up since the core last looked (it logs them)
        self.given_up: list[str] = []
        #: keepers given up and not heard from since: what they owe is waived, not pending
        self._silent: set[str] = set()
        #: an add removed, still unacknowledged, because a new one covers it: seq -> the new
        #: adds (a subscription waiting for the old one waits for these instead; bounded)
        self._replaced: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        #: when each seq in pending or _removing was first sent
        self._sent_at: dict[int, float] = {}
        #: keeper -> [when to look again, current wait, resends so far] while it owes acks
        self._retry: dict[str, list] = {}
        self._detours: dict[GraphNode, tuple[str, tuple[str, ...]] | None] = {}
        self._keepers = hierarchy.all_keepers(broker_id)
        self._hops: dict[str, str | None] = {}
        self._unit_hops: dict[UnitPath, str | None] = {}
        self._nearest: dict[UnitPath, str | None] = {}
        self._sync_hops: dict[str, str | None] = {}
        #: origins whose sync this broker has applied; a kept unit is *complete* once every
        #: reachable broker in it has synced
        self._synced: set[str] = {broker_id}
        self._complete: dict[UnitPath, bool] = {}
        #: per kept unit, the children with a broker that has not synced (reliable delivery)
        self._unsynced: dict[UnitPath, tuple[str, ...]] = {}
        self.initial_routes: tuple[m.Route, ...] = tuple(
            m.Route(u, hierarchy.child_of(u, broker_id))
            for u in hierarchy.chain(broker_id)
            if len(hierarchy.children[u]) > 1
        )
        #: V_b (seed 000 §3.4): per origin of a kept unit, [inc, seq] such that every add of
        #: the origin's incarnation ``inc`` up to ``seq`` is applied or known gone
        self.vb: dict[str, list[int]] = {}
        #: sufficiency test results: (unit, pubend) -> (vector key, children that fail it)
        self._sufficient: dict[tuple[UnitPath, str], tuple[int, tuple[str, ...]]] = {}
        #: origins whose profile here was found behind an event's V_m since the core last
        #: looked (it asks them for a sync: seed 000 §4, non-leaf liveness)
        self.lagging: set[str] = set()
        #: keeper -> when a ProfileWant last made this broker send it a sync
        self._wanted: dict[str, float] = {}
        self.counters = {
            "routes_dropped": 0,
            "resyncs": 0,
            "keepers_given_up": 0,
            "insufficient": 0,
        }

    # -- introspection -----------------------------------------------------------------------------

    @property
    def pending(self) -> dict[int, set[str]]:
        """Adds of this broker not yet acknowledged: seq -> keepers still to ack."""
        return self.book.tables[PENDING]

    @property
    def waived(self) -> dict[int, set[str]]:
        """wait_for_all: adds a keeper was given up on before it acknowledged them (seq ->
        keepers); it is still sent a sync every RESEND_MAX seconds until it does, and only
        then is the subscription complete."""
        return self.book.tables[WAIVED]

    @property
    def _removing(self) -> dict[int, set[str]]:
        """Removals of this broker not yet acknowledged: seq -> keepers still to ack."""
        return self.book.tables[REMOVING]

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
        self, add: Iterable[Conjunction], remove: Iterable[Conjunction], now: float
    ) -> tuple[list, frozenset[int]]:
        """Local conjunctions added and removed at time ``now`` (adds first, so a replaced
        profile never leaves a gap upstream). Returns the sends and the seqs of adds to wait for
        acks on. A removal may leave work for :meth:`background`."""
        exporter = self.exporter
        ops: list[tuple[int, int, Conjunction]] = []
        add = list(add)
        for conj in add:
            ops += exporter.add(conj)
        for conj in remove:
            ops += exporter.remove(conj)
        # an add that an exported conjunction covers starts where that one started, and waits
        # for its acks if still owed
        waits = {seq for seq in map(exporter.seq_for, add) if seq is not None}
        return self._exported(ops, waits, now)

    @property
    def busy(self) -> bool:
        """A removal still has conjunctions to export again, or a closed ticket registrations
        to take out (:meth:`background`)."""
        return self.exporter.pending or self.book.busy

    def background(self, now: float, budget: int) -> list:
        """About ``budget`` work of what removals left (:meth:`Exporter.step`) and of closing
        large tickets (:meth:`AckBook.step`): the sends."""
        budget -= self.book.step(budget)
        if budget <= 0 or not self.exporter.pending:
            return []
        sends, _ = self._exported(self.exporter.step(budget), set(), now)
        return sends

    def _exported(self, ops: list, waits: set[int], now: float) -> tuple[list, frozenset[int]]:
        """Tell the keepers about the exporter's ``ops``; ``waits`` grows by the adds to wait
        for."""
        if not ops:
            return [], frozenset(waits)
        # the adds go first: the changes may go in several messages, and a keeper routes
        # events between them — a covering add must be in before what it replaces goes
        ops = sorted(ops, key=lambda op: op[0] != ADD)
        changes = [
            m.ProfileChange(self.id, self.inc, seq, op, conjunction_to_wire(conj))
            for op, seq, conj in ops
        ]
        if self._placements(self.id):  # this broker keeps a unit around itself
            self._inc[self.id] = self.inc
            for op, seq, conj in ops:
                if op == ADD:
                    self._apply_add(self.id, self.inc, seq, conj)
                else:
                    self._apply_remove(self.id, self.inc, seq)
            self._advance(self.id)
        expect = {k for k in self._keepers if self._path_to(k) is not None}
        owe = set(self._keepers) if self.wait_for_all else expect
        book = self.book
        for op, seq, _ in ops:
            if op == ADD:
                if owe:
                    book.owe(PENDING, seq, sorted(owe - self._silent))
                    book.owe(WAIVED, seq, sorted(owe & self._silent))
                    waits.add(seq)
            else:
                replaced = self.exporter.replaced.pop(seq, ())
                if (seq in self.pending or seq in self.waived) and replaced:
                    self._replaced[seq] = replaced
                    if len(self._replaced) > MAX_REPLACED:
                        self._replaced.popitem(last=False)
                    book.replace(seq, self.waited(replaced))
                book.drop(PENDING, seq)
                book.drop(WAIVED, seq)
                self.starts.pop(seq, None)
                if expect:
                    book.owe(REMOVING, seq, sorted(expect))
            if expect:
                self._sent_at[seq] = now
            else:
                self._sent_at.pop(seq, None)
        for k in owe if any(op == ADD for op, _, _ in ops) else expect:
            # an unreachable keeper too: its rounds count towards giving it up
            self._retry.setdefault(k, [now + RESEND_AFTER, RESEND_AFTER, 0])
        targets = self.h.next_targets(self.id, self.id)
        return self._send(targets, changes), frozenset(waits)

    def waited(self, seqs: Iterable[int]) -> set[int]:
        """The adds that subscriptions waiting for ``seqs`` wait for now: each one replaced by
        a covering add stands for that add's seqs."""
        out: set[int] = set()
        todo = list(seqs)
        while todo:
            seq = todo.pop()
            if seq in out:
                continue
            out.add(seq)
            todo += self._replaced.get(seq, ())
        return out

    def ticket(self, seqs: Iterable[int]) -> Ticket:
        """A :class:`Ticket` for a subscription waiting on the adds ``seqs`` (and those that
        replaced them): which keepers still owe it, kept up to date. Close it with
        :meth:`AckBook.close` when the subscription no longer waits."""
        return self.book.ticket(self.waited(seqs))

    def acked(self, seqs: Iterable[int]) -> bool:
        return not any(s in self.pending for s in self.waited(seqs))

    def clock(self) -> tuple[int, int]:
        """This broker's virtual clock (seed 000 §3.3): its newest exported add."""
        return self.inc, self.exporter.last_seq

    # -- profile messages ------------------------------------------------------------------------------

    def on_profiles(self, msg: m.Profiles) -> list:
        """Relay a ``Profiles`` message towards its other targets and apply it if it is for us."""
        brokers = self.h.topology.brokers
        for t in msg.to:
            if t not in brokers:
                raise ValueError(f"profile changes for unknown broker {t!r}")
        if msg.detour:
            self.check_detour(msg.detour)
        others = [t for t in msg.to if t != self.id]
        out = []
        if others and msg.hops < MAX_RELAY_HOPS:  # views that disagree can loop for a while
            step, gave_up = self._follow(msg.detour)
            if step is None:
                out = self._send(
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

    def _follow(self, detour) -> tuple[tuple[str, tuple[str, ...]] | None, bool]:
        """A message's next step along its detour, if any, and whether it has given up on one
        (a message takes no second detour after one failed: views that disagree about a split
        could send it round forever)."""
        if not detour:
            return None, False
        if tuple(detour) == GAVE_UP:
            return None, True
        step = self._transit(detour)
        return step, step is None and any(b != self.id for b in detour)

    def on_ack(self, msg: m.ProfileAck) -> list:
        if msg.origin not in self.h.topology.brokers:
            raise ValueError(f"profile ack for unknown broker {msg.origin!r}")
        relayed = self._to_origin(
            msg,
            lambda hops, detour: m.ProfileAck(
                msg.origin, msg.keeper, msg.inc, msg.seqs, hops, msg.removed, detour, msg.ticks
            ),
        )
        if relayed is not None:
            return relayed
        if msg.inc == self.inc:
            keeper = msg.keeper
            if msg.ticks:
                for seq in msg.seqs:
                    if seq in self.pending or seq in self.waived or seq in self.starts:
                        got = self.starts.setdefault(seq, {})
                        for pubend, tick in msg.ticks[:MAX_TICKS_PER_ACK]:
                            if got.get(pubend, 0) < tick:
                                got[pubend] = tick
            for which, seqs in (
                (PENDING, msg.seqs),
                (WAIVED, msg.seqs),
                (REMOVING, msg.removed),
            ):
                for seq in seqs:
                    self._settle(which, seq, keeper)
            self._silent.discard(keeper)  # heard from again: waited for like any other
            if keeper in self._retry and not self.book.owes(keeper):
                del self._retry[keeper]
        return []

    def _to_origin(self, msg, make) -> list | None:
        """A message for ``msg.origin`` one hop on (``make(hops, detour)`` builds the copy;
        ``[]`` when it can go no further), or None at the origin itself."""
        if msg.detour:
            self.check_detour(msg.detour)
        if msg.origin == self.id:
            return None
        step = self.relay_step(msg.origin, msg.detour, msg.hops)
        if step is None:
            return []
        hop, detour = step
        return [(hop, make(msg.hops + 1, list(detour)))]

    def steps(
        self, targets: Iterable[str], detour, hops: int
    ) -> dict[tuple[str, tuple[str, ...]], list[str]]:
        """Where a message for several brokers goes next: ``{(next hop, detour): targets}``.
        It follows its own detour first (every target goes that way); unreachable targets are
        left out, and all of them once it has gone MAX_RELAY_HOPS."""
        targets = list(targets)
        if hops >= MAX_RELAY_HOPS or not targets:
            return {}
        step, gave_up = self._follow(detour)
        if step is not None:
            return {step: targets}
        by_hop: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for t in targets:
            s = self._path_to(t, gave_up=gave_up)
            if s is not None:
                by_hop.setdefault(s, []).append(t)
        return by_hop

    def relay_step(self, to: str, detour, hops: int) -> tuple[str, tuple[str, ...]] | None:
        """``(next hop, detour)`` for a message relayed to broker ``to`` (it follows its
        detour first); None if there is none or the message has gone too far."""
        if hops >= MAX_RELAY_HOPS:
            return None
        step, gave_up = self._follow(detour)
        if step is None:
            step = self._path_to(to, gave_up=gave_up)
        return step

    def _settle(self, which: int, seq: int, keeper: str) -> None:
        """``keeper`` owes nothing more for ``seq`` in table ``which`` (PENDING, WAIVED or
        REMOVING)."""
        last = self.book.settle(which, seq, keeper)
        if last and seq not in self.pending and seq not in self._removing:
            self._sent_at.pop(seq, None)

    def _waive(self, keeper: str, now: float) -> None:
        """wait_for_all: stop holding subscriptions back for ``keeper`` (it has not acknowledged
        through MAX_RESENDS rounds); its adds stay owed (:attr:`waived`) and it is sent a sync
        every RESEND_MAX seconds until it acknowledges them."""
        book = self.book
        for seq in sorted(book.seqs_of(PENDING, keeper)):
            book.owe(WAIVED, seq, (keeper,))
            self._settle(PENDING, seq, keeper)
        for seq in sorted(book.seqs_of(REMOVING, keeper)):
            self._settle(REMOVING, seq, keeper)
        self._retry[keeper] = [now + RESEND_MAX, RESEND_MAX, MAX_RESENDS]
        self._silent.add(keeper)
        self.given_up.append(keeper)

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
                    self._unsynced.clear()
                continue
            if c.op == ADD:
                conj = conjunction_from_wire(c.conjunction)
                new = self._apply_add(c.origin, c.inc, c.seq, conj)
                if c.origin != self.id and (
                    new or (resend and (c.origin, c.inc, c.seq) in self._entries)
                ):
                    acks.setdefault((c.origin, c.inc), ([], []))[0].append(c.seq)
            elif c.op == REMOVE:
                new = self._apply_remove(c.origin, c.inc, c.seq)
                if c.origin != self.id and (new or resend) and self._placements(c.origin):
                    acks.setdefault((c.origin, c.inc), ([], []))[1].append(c.seq)
            else:
                raise ValueError(f"profile change with unknown op {c.op}")
            if new and c.origin not in synced:
                fresh.setdefault(c.origin, []).append(c)
        for origin in {c.origin for c in changes}:
            if origin in self._inc:
                self._advance(origin)
        out = []
        for origin, cs in fresh.items():
            out += self._send(self.h.next_targets(self.id, origin), cs)
        for (origin, inc), (seqs, removed) in acks.items():
            step = self._path_to(origin)
            if step is not None:
                hop, detour = step
                ticks = self.claims.latest() if self.claims is not None and seqs else []
                ack = m.ProfileAck(origin, self.id, inc, seqs, 0, removed, list(detour), ticks)
                out.append((hop, ack))
        return out

    def _advance(self, origin: str) -> None:
        """Move ``origin``'s V_b over every add now applied or known gone (seed 000 §3.4: a
        change is applied only on a complete prefix — its constraint vector is the origin's
        clock just before it)."""
        inc = self._inc[origin]
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
            self._sufficient.clear()

    def own_units(self) -> tuple[tuple[UnitPath, str], ...]:
        """The units this broker keeps that hold itself (its own adds go into their graphs)."""
        return self._placements(self.id)

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
        self.vb.pop(origin, None)
        self._sufficient.clear()

    def _apply_sync(self, c: m.ProfileChange) -> None:
        floor = self._floor.get(c.origin)
        if floor is not None and floor[0] == c.inc and floor[1] > c.seq:
            return  # an older sync overtaken by a newer one (they can take different paths)
        live = frozenset(c.seqs)
        for seq in list(self._by_origin.get(c.origin, ())):
            if seq <= c.seq and seq not in live and (c.origin, c.inc, seq) in self._entries:
                self._apply_remove(c.origin, c.inc, seq)
        self._floor[c.origin] = (c.inc, c.seq, live)

    # -- resync on connectivity changes --------------------------------------------------------------

    def connectivity_changed(
        self, up_ends: Iterable[str], now: float, *, downs: bool = True
    ) -> list:
        """The connectivity graph changed: forget cached hops and send a sync to every keeper of
        this broker's profile whose route changed or that has a link just up. ``downs``: some
        link or node went down (only then can a broker have become unreachable)."""
        self._hops.clear()
        self._unit_hops.clear()
        self._nearest.clear()
        self._complete.clear()
        self._unsynced.clear()
        self._detours.clear()
        # a broker this one cannot reach must sync again before its units count as complete
        # (when a partition heals, events flood its units until its sync arrives)
        if downs:
            for b in [b for b in self._synced if b != self.id and self._path_to(b) is None]:
                self._synced.discard(b)
        up = set(up_ends)
        targets = []
        for k in sorted(self._keepers, key=broker_order_key):
            hop = self._path_to(k)
            if hop is None:
                if self.wait_for_all:  # unreachable: its adds stay owed until it gives up
                    if self.book.owes(k):
                        self._retry.setdefault(k, [now + RESEND_AFTER, RESEND_AFTER, 0])
                else:
                    self._forget_keeper(k)  # unreachable: do not wait for it
            elif hop != self._sync_hops.get(k) or k in up:
                targets.append(k)
            self._sync_hops[k] = hop
        return self._resync(targets, now)

    def _resync(self, keepers: list[str], now: float) -> list:
        """Send ``keepers`` a sync and expect their acks for every live add."""
        if not keepers:
            return []
        live = self.exporter.exported.values()
        silent = self._silent.intersection(keepers)
        heard = set(keepers) - silent
        book = self.book
        heard_keepers, silent_keepers = sorted(heard), sorted(silent)
        for seq in live:
            book.owe(PENDING, seq, heard_keepers)
            book.owe(WAIVED, seq, silent_keepers)
            self._sent_at.setdefault(seq, now)
        for k in keepers:
            self._retry.setdefault(k, [now + RESEND_AFTER, RESEND_AFTER, 0])
        return self._send(keepers, self._resync_changes(), resend=True)

    def _forget_keeper(self, keeper: str) -> None:
        """Stop waiting for ``keeper`` (unreachable, or silent too long): what it owes is
        settled; it gets a sync when a route to it appears."""
        for which in (PENDING, REMOVING):
            for seq in sorted(self.book.seqs_of(which, keeper)):
                self._settle(which, seq, keeper)
        self._retry.pop(keeper, None)

    def on_timer(self, now: float) -> list:
        """Send a sync to every keeper that owes an ack for a change sent ``wait`` ago."""
        targets = []
        for k, (due, wait, tries) in list(self._retry.items()):
            if due > now:
                continue
            owed = self.book.owed_by(k)
            if not owed:
                del self._retry[k]
            elif self.wait_for_all and tries >= MAX_RESENDS:
                if self.book.seqs_of(PENDING, k):
                    self.counters["keepers_given_up"] += 1
                    self._waive(k, now)
                else:
                    self._retry[k] = [now + RESEND_MAX, RESEND_MAX, tries]
                if self._path_to(k) is not None:
                    targets.append(k)  # it may be alive and out of date: try it again
            elif tries >= MAX_RESENDS or (self._path_to(k) is None and not self.wait_for_all):
                self.counters["keepers_given_up"] += tries >= MAX_RESENDS
                self._forget_keeper(k)
            elif self._path_to(k) is None:
                # wait_for_all: an unreachable keeper is waited for through the same rounds as
                # a silent one (about two minutes), then given up — a subscription must start
                # even when a keeper is gone for good
                wait = min(2 * wait, RESEND_MAX)
                self._retry[k] = [now + wait, wait, tries + 1]
            else:
                oldest = min(self._sent_at.get(s, now) for s in owed)
                if oldest + wait > now:  # acks are coming in; only recent changes are owed
                    self._retry[k] = [oldest + wait, wait, tries]
                    continue
                wait = min(2 * wait, RESEND_MAX)
                self._retry[k] = [now + wait, wait, tries + 1]
                targets.append(k)
        self.counters["resyncs"] += len(targets)
        return self._resync(sorted(targets, key=broker_order_key), now)

    def next_deadline(self) -> float:
        return min((r[0] for r in self._retry.values()), default=float("inf"))

    def _resync_changes(self) -> list[m.ProfileChange]:
        """This broker's complete profile: every live add, then every removal still to be
        acknowledged, then the sync that retires the rest. In that order, because the changes
        may go in several messages and a keeper routes events between them: what is wanted is
        in before anything it replaces goes."""
        live = self.exporter.exported
        out = [
            m.ProfileChange(self.id, self.inc, seq, ADD, conjunction_to_wire(conj))
            for conj, seq in live.items()
        ]
        out += [m.ProfileChange(self.id, self.inc, seq, REMOVE) for seq in self._removing]
        out.append(
            m.ProfileChange(
                self.id, self.inc, self.exporter.last_seq, SYNC, seqs=sorted(live.values())
            )
        )
        return out

    # -- sending -------------------------------------------------------------------------------------

    def _send(
        self,
        targets: Iterable[str],
        changes: list[m.ProfileChange],
        hops: int = 0,
        *,
        resend: bool = False,
        gave_up: bool = False,
    ) -> list:
        """``Profiles`` messages towards ``targets``, one per next hop; unreachable ones are
        skipped (the origin syncs them when a route appears)."""
        by_hop: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for t in targets:
            step = self._path_to(t, gave_up=gave_up)
            if step is not None:
                by_hop.setdefault(step, []).append(t)
        out = []
        chunks = _chunks(changes) if by_hop else []
        for (hop, detour), tos in by_hop.items():
            for chunk in chunks:
                out.append((hop, m.Profiles(tos, chunk, hops, list(detour), resend)))
        return out

    def _path_to(
        self, broker_id: str, *, gave_up: bool = False
    ) -> tuple[str, tuple[str, ...]] | None:
        """``(next hop, detour)`` towards a broker: the hierarchical route's hop, or a detour
        round a split unit (:meth:`_detour`) unless the message has ``gave_up`` on one; None if
        unreachable."""
        hop = self._hop(broker_id)
        if hop is not None:
            return (hop, GAVE_UP if gave_up else ())
        if gave_up or broker_id == self.id or broker_id not in self.h.topology.brokers:
            return None
        return self._detour(self._node(broker_id))

    def _transit(self, detour) -> tuple[str, tuple[str, ...]] | None:
        """The next step of a message on a detour: ``(next hop, brokers still to pass)``; None
        once it has passed them all, or if the next one is not on a hierarchical route from here
        (the message then finds its own way)."""
        i = 0
        while i < len(detour) and detour[i] == self.id:
            i += 1
        rest = tuple(detour[i:])
        if not rest:
            return None
        head = rest[0]
        if self.graph.link_up(self.id, head):
            return (head, rest)
        hop = self._hop(head)
        # None: this broker's view differs from the one that planned the detour
        return None if hop is None else (hop, rest)

    def _hop(self, broker_id: str) -> str | None:
        """The next hop towards a broker on the hierarchical route; None for this broker, an
        unreachable one, or one reachable only around a split unit (:meth:`_detour`)."""
        try:
            return self._hops[broker_id]
        except KeyError:
            pass
        spec = self.h.topology.brokers.get(broker_id)
        hop = None
        if spec is not None and broker_id != self.id:
            hop = self.graph.next_hop(broker_id, spec.unit)
        self._hops[broker_id] = hop
        return hop

    def _unit_hop(self, unit: UnitPath) -> str | None:
        try:
            return self._unit_hops[unit]
        except KeyError:
            pass
        node = self.graph.node_for_unit(unit)
        hop = None if node is None else self.graph.next_hop_to(node)
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
            # a keeper the hierarchical route reaches first: one reached only round a split may
            # be dead behind it (a view outside a unit cannot tell)
            rank = (self._hop(k) is None, dist, broker_order_key(k))
            if best is None or rank < best[0]:
                best = (rank, k)
        self._nearest[unit] = found = None if best is None else best[1]
        return found

    # -- events (seed 004 §3.3) -----------------------------------------------------------------------

    def route_event(
        self,
        attributes: Mapping | None,
        routes: Iterable[m.Route],
        been: tuple[str, ...] = (),
        *,
        claims: ClaimChains | None = None,
        pubend: str = "",
        tick: int = 0,
        mine: list | None = None,
        vm: tuple[int, dict] | None = NO_VECTOR,
    ) -> dict[str, list[m.Route]]:
        """Where an event goes next: {next hop: routes to pass on}.

        Best effort (``claims`` None): every broker that an event passes through delivers it to
        its own matching subscribers (the core does that), so a keeper never sends it back to a
        broker it has ``been`` to. Reliable (``claims`` given, :mod:`ges.reliable.claims`): only
        a route to a broker delivers there, routes to this broker are appended to ``mine``, and
        every route a keeper makes carries its claim for ``tick`` of ``pubend``, and ``vm`` is
        ``(key, vector)``, an upper bound of the V_m the pubend stamped (None: not known; see
        :mod:`ges.reliable.vt`). With ``attributes`` None the routes are silence up to
        ``tick``: a keeper passes them on to every child (see :meth:`_resolve`).

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
            if r.detour:  # going round a split unit (see _detour)
                step, gave_up = self._follow(r.detour)
                if step is not None:
                    hop, detour = step
                    out.setdefault(hop, []).append(m.Route(path, r.skip, r.via, detour, r.prev))
                    continue
                r = m.Route(path, r.skip, r.via, GAVE_UP if gave_up else (), r.prev)
            if n > depth:  # one broker
                target = path[-1]
                if target == self.id:
                    if mine is not None:
                        mine.append(r)
                    continue
                if target in been:
                    continue
                hop = self._hop(target)
                if hop is None:
                    hop, r = self._around(self._node(target), r)
            elif my_unit[:n] != path:  # a unit elsewhere
                hop = self._hop(r.via) if r.via else None
                if hop is None:  # no keeper chosen, or it became unreachable: towards the unit
                    hop = self._unit_hop(path)
                if hop is None:
                    hop, r = self._around(self.graph.node_for_unit(path), r)
            else:  # a unit around this broker
                kids = children[path]
                if len(kids) == 1:  # nothing to choose: the claim holds for the child too
                    stack.append(m.Route((*path, kids[0]), prev=r.prev))
                    continue
                snapshot = kept.get(path)
                if snapshot is not None:
                    skip = r.skip
                    if claims is not None:
                        stack += self._resolve(snapshot, attributes, r, claims, pubend, tick, vm)
                        continue
                    complete = self._complete.get(path)
                    if complete is None:
                        complete = self._is_complete(path)
                    for kid in snapshot.match(attributes) if complete else kids:
                        if kid != skip:
                            stack.append(m.Route((*path, kid)))
                    continue
                via = r.via
                hop = self._hop(via) if via and via != self.id else None
                if hop is None:  # no keeper chosen yet, or the route to it is gone
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
                        skip, prev = r.skip, r.prev
                        stack.extend(
                            m.Route((*path, kid), prev=prev) for kid in kids if kid != skip
                        )
                        continue
                    r = m.Route(path, r.skip, via, r.detour, r.prev)  # detour () or GAVE_UP
                    hop = self._hop(via)
                    if hop is None:
                        hop, r = self._around(self._node(via), r)
            if hop is None:
                self.counters["routes_dropped"] += 1
            else:
                got = out.get(hop)
                if got is None:
                    out[hop] = [r]
                else:
                    got.append(r)
        return out

    def _resolve(
        self,
        snapshot: ProfileGraph,
        attributes: Mapping | None,
        r: m.Route,
        claims: ClaimChains,
        pubend: str,
        tick: int,
        vm: tuple[int, dict] | None,
    ) -> list[m.Route]:
        """A kept unit's routes for one tick, each with its claim (:mod:`ges.reliable.claims`):
        the matching children for data (and every child that fails the sufficiency test),
        every child for silence."""
        path = r.unit
        kids = self.h.children[path]
        st = claims.learn(pubend, path, r.prev, tick)
        skip = r.skip
        claim = claims.claim
        # the sufficiency test (seed 000 §3.5): a child with a broker whose profile this keeper
        # lacks — it has not synced since this keeper started (it may be unreachable now), or
        # the event's V_m knows a newer clock of it than V_b — gets the event whatever it
        # wants: no claim may say a tick was not for a subscriber the keeper does not know
        extra: tuple[str, ...] | set[str] = ()
        if self.sufficiency:
            extra = self._unsynced_kids(path)
            if vm is None or vm[1]:
                failed = self._insufficient(path, pubend, vm)
                if failed:
                    extra = {*extra, *failed}
        if attributes is None:
            # silence goes to every child with a subscriber (or one failing the test): one
            # whose last data or silence was lost, even with a failed link, learns from the
            # next round that it is missing something; a child with no subscriber has no
            # subend to tell
            dests = snapshot.destinations
            return [
                m.Route((*path, k), prev=claim(st, k, tick))
                for k in kids
                if k != skip and (k in dests or k in extra)
            ]
        wanted = set(snapshot.match(attributes))
        wanted.update(extra)
        return [
            m.Route((*path, k), prev=claim(st, k, tick)) for k in kids if k in wanted and k != skip
        ]

    def _insufficient(
        self, unit: UnitPath, pubend: str, vm: tuple[int, dict] | None
    ) -> tuple[str, ...]:
        """The children of ``unit`` for which V_b sliced to their brokers is behind ``vm``
        (seed 000 §3.5; every child when the vector is not known). Cached per (unit, pubend)
        for the newest vector (§5.1) until V_b moves."""
        kids = self.h.children[unit]
        if vm is None:
            self.counters["insufficient"] += 1
            return kids
        key = (unit, pubend)
        got = self._sufficient.get(key)
        if got is not None and got[0] == vm[0]:
            return got[1]
        h = self.h
        vb = self.vb
        failed: set[str] = set()
        for leaf, clock in vm[1].items():
            if not h.contains(unit, leaf):
                continue
            v = vb.get(leaf)
            if v is None or (v[0], v[1]) < clock:
                failed.add(h.child_of(unit, leaf))
                self.lagging.add(leaf)
        result = tuple(k for k in kids if k in failed)
        if len(self._sufficient) >= MAX_SUFFICIENCY:
            self._sufficient.clear()
        self._sufficient[key] = (vm[0], result)
        if result:
            self.counters["insufficient"] += 1
        return result

    def on_want(self, msg: m.ProfileWant, now: float) -> list:
        """Relay a :class:`ProfileWant` towards its origin; at the origin, send the keeper a
        sync (at most once per RESEND_AFTER)."""
        brokers = self.h.topology.brokers
        if msg.origin not in brokers or msg.keeper not in brokers:
            raise ValueError("profile want names an unknown broker")
        relayed = self._to_origin(
            msg, lambda hops, detour: m.ProfileWant(msg.origin, msg.keeper, hops, detour)
        )
        if relayed is not None:
            return relayed
        keeper = msg.keeper
        if keeper not in self._keepers or now < self._wanted.get(keeper, -RESEND_AFTER) + (
            RESEND_AFTER
        ):
            return []
        self._wanted[keeper] = now
        self.counters["resyncs"] += 1
        return self._resync([keeper], now)

    def _unsynced_kids(self, unit: UnitPath) -> tuple[str, ...]:
        got = self._unsynced.get(unit)
        if got is None:
            synced = self._synced
            units = self.h.topology.units
            got = self._unsynced[unit] = tuple(
                kid
                for kid in self.h.children[unit]
                if any(b not in synced for b in units.get((*unit, kid), (kid,)))
            )
        return got

    def _is_complete(self, unit: UnitPath) -> bool:
        synced = self._synced
        done = all(b in synced or self._path_to(b) is None for b in self.h.topology.units[unit])
        self._complete[unit] = done
        return done

    def _node(self, broker_id: str) -> GraphNode | None:
        return self.graph.node_for(broker_id, self.h.topology.brokers[broker_id].unit)

    def _around(self, node: GraphNode | None, r: m.Route) -> tuple[str | None, m.Route]:
        """The hop and route for ``r`` towards ``node`` when the hierarchical route has none."""
        step = None if node is None or r.detour == GAVE_UP else self._detour(node)
        if step is None:
            return None, r
        hop, detour = step
        return hop, (m.Route(r.unit, r.skip, r.via, detour, r.prev) if detour else r)

    def _detour(self, node: GraphNode) -> tuple[str, tuple[str, ...]] | None:
        """How to reach a graph node that the whole view reaches but the hierarchical route does
        not, because some unit is split inside: ``(first hop, brokers to pass)``.

        Brokers see other units as single nodes (seed 004 §2), so one that does not see the
        split routes a message for the far side back to the cheapest link into the unit, maybe
        on this side. So the message carries the whole view's shortest path as the two ends
        of every link where it crosses from one node of this broker's view to another; between
        them it stays inside one node, where the brokers that see inside it route it (and go
        round a split in there the same way). None if unreachable.
        """
        try:
            return self._detours[node]
        except KeyError:
            pass
        graph = self.graph
        found = None
        path = graph.shortest_path(node) if graph.route(node) is None else None
        hop = None if path is None else graph.next_hop_to(node, fallback=True)
        if hop is not None:
            brokers = self.h.topology.brokers
            suspected = graph.suspected_links
            passes: list[str] = []
            for u, w in zip(path, path[1:], strict=False):
                if not u.level and not w.level:
                    continue  # a link inside this broker's cluster: the hierarchical route's
                edge = graph.edge(u, w)
                links = sorted(
                    (k for k in (edge.links if edge else ()) if k not in suspected),
                    key=lambda k: (broker_order_key(k[0]), broker_order_key(k[1])),
                )
                if not links:
                    break
                a, b = links[0]
                inner = w.path
                if (*brokers[b].unit, b)[: len(inner)] != inner:
                    a, b = b, a
                passes += [x for x in (a, b) if x != self.id and (not passes or passes[-1] != x)]
            found = (hop, tuple(passes[:MAX_DETOUR]))
        self._detours[node] = found
        return found

    def check_routes(self, routes: Iterable[m.Route]) -> None:
        """Raise ValueError for a route naming a unit or broker this topology does not have."""
        valid = self.h.valid_paths
        brokers = self.h.topology.brokers
        for r in routes:
            if r.unit not in valid:
                raise ValueError(f"route to unknown unit {'/'.join(r.unit) or '/'}")
            if r.via and r.via not in brokers:
                raise ValueError(f"route via unknown broker {r.via!r}")
            if r.detour:
                self.check_detour(r.detour)

    def check_detour(self, detour) -> None:
        if len(detour) > MAX_DETOUR:
            raise ValueError(f"detour through {len(detour)} brokers, over {MAX_DETOUR}")
        if tuple(detour) != GAVE_UP:
            brokers = self.h.topology.brokers
            for b in detour:
                if b not in brokers:
                    raise ValueError(f"detour through unknown broker {b!r}")


def _chunks(changes: list[m.ProfileChange]) -> list[list[m.ProfileChange]]:
    """``changes`` split into messages of at most MAX_CHANGES_PER_MESSAGE changes and
    MAX_MESSAGE_WEIGHT weight (one change more if a single one weighs more)."""
    out: list[list[m.ProfileChange]] = []
    chunk: list[m.ProfileChange] = []
    load = 0
    for c in changes:
        w = _weight(c)
        if chunk and (load + w > MAX_MESSAGE_WEIGHT or len(chunk) >= MAX_CHANGES_PER_MESSAGE):
            out.append(chunk)
            chunk, load = [], 0
        chunk.append(c)
        load += w
    if chunk:
        out.append(chunk)
    return out


def _weight(c: m.ProfileChange) -> int:
    """What applying a change costs a keeper, in the unit of a conjunction's weight (which
    bounds its bytes too: a message stays within a frame)."""
    if c.op == ADD:
        return sum(constraint_weight(k.op, k.attr, k.value) for k in c.conjunction)
    return 1 + len(c.seqs) // 64
