"""Event routing: an event's routes resolved, hop by hop, against the kept snapshots (seed 004 §3.3).

Theory of operation
-------------------
An event carries :class:`~ges.wire.messages.Route` values. At the publisher they are one per
enclosing unit with more than one child: "this cluster except me", "this super-cluster except
my cluster", …, "the system except my top-level unit". A broker handling a route:

* for a broker: delivers if it is that broker, else forwards along its best hop;
* for a unit it is outside of: forwards towards the unit;
* for a unit it is inside and keeps: matches the event against that unit's snapshot and
  replaces the route by one per matching child (except ``skip``), handled the same way. A keeper
  whose unit is not complete (it has just started, or the unit just came back) sends the event
  to every child instead: flooding a sub-unit is safe, dropping an event a subscriber wants is
  not. With reliable delivery a child also gets every event when the event's V_m knows a newer
  clock of one of its brokers than this keeper's V_b (seed 000 §3.5: the sufficiency test), and
  every route a keeper makes carries its claim (ges.reliable.claims);
* for a unit it is inside but does not keep: forwards the route to the nearest reachable keeper.

Routes are grouped by next hop, so an event crosses each link at most once per branch, and the
routes of one event name disjoint sets of brokers, so each destination broker gets the event
once even over redundant gateways.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ges.matching.graph import ProfileGraph
from ges.routing.base import (
    GAVE_UP,
    MAX_SUFFICIENCY,
    NO_VECTOR,
    RESEND_AFTER,
    ClaimChains,
    RouterPart,
)
from ges.topology import UnitPath
from ges.wire import messages as m


class EventRouting(RouterPart):
    """Where an event goes from here: its routes, resolved against the kept snapshots."""

    def __init__(self, router):
        super().__init__(router)
        #: reliable delivery: the keepers' claim chains (set by the core), and per live add the
        #: last tick of each pubend routed before its keepers applied it (from their acks)
        self.claims: ClaimChains | None = None
        #: reliable delivery's sufficiency rule (seed 000 §3.5): a child with a broker whose
        #: profile this keeper lacks gets every event. Off only to show what it prevents.
        self.sufficiency = True
        self.initial_routes: tuple[m.Route, ...] = tuple(
            m.Route(u, self.h.child_of(u, self.id))
            for u in self.h.chain(self.id)
            if len(self.h.children[u]) > 1
        )
        #: origins whose profile here was found behind an event's V_m, to be asked for a sync
        #: (seed 000 §4, non-leaf liveness; :meth:`take_lagging`), and when each was last asked
        self.lagging: set[str] = set()
        self._asked: dict[str, float] = {}

    def take_lagging(self, now: float) -> list[str]:
        """The origins to ask for a sync now: found behind an event's V_m and not asked in the
        last RESEND_AFTER seconds (the others stay, to be asked on a later frame)."""
        asked = self._asked
        due = sorted(o for o in self.lagging if now >= asked.get(o, -RESEND_AFTER) + RESEND_AFTER)
        for origin in due:
            asked[origin] = now
            self.lagging.discard(origin)
        return due

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
        kept = self.keeper.kept
        children = self.h.children
        keepers = self.h.keepers
        chosen: list[str] = []  # keepers asked in this call: one keeper serves several units
        while stack:
            r = stack.pop()
            path = r.unit
            n = len(path)
            if r.detour:  # going round a split unit (see _detour)
                step, gave_up = self.paths.follow(r.detour)
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
                hop = self.paths.hop(target)
                if hop is None:
                    hop, r = self.paths.around(self.paths.node(target), r)
            elif my_unit[:n] != path:  # a unit elsewhere
                hop = self.paths.hop(r.via) if r.via else None
                if hop is None:  # no keeper chosen, or it became unreachable: towards the unit
                    hop = self.paths.unit_hop(path)
                if hop is None:
                    hop, r = self.paths.around(self.graph.node_for_unit(path), r)
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
                    complete = self.keeper.complete.get(path)
                    if complete is None:
                        complete = self.keeper.is_complete(path)
                    for kid in snapshot.match(attributes) if complete else kids:
                        if kid != skip:
                            stack.append(m.Route((*path, kid)))
                    continue
                via = r.via
                hop = self.paths.hop(via) if via and via != self.id else None
                if hop is None:  # no keeper chosen yet, or the route to it is gone
                    # the routes of the publisher's units come highest first; a keeper of a
                    # higher unit inside this one keeps this one too, so one keeper answers for
                    # all of them and the event takes one branch to them, not one per unit
                    unit_keepers = keepers[path]
                    via = next((k for k in chosen if k in unit_keepers), None)
                    if via is None:
                        via = self.paths.nearest_keeper(path)
                        if via is not None:
                            chosen.append(via)
                    if via is None:  # no keeper reachable: every child, the safe fallback
                        skip, prev = r.skip, r.prev
                        stack.extend(
                            m.Route((*path, kid), prev=prev) for kid in kids if kid != skip
                        )
                        continue
                    r = m.Route(path, r.skip, via, r.detour, r.prev)  # detour () or GAVE_UP
                    hop = self.paths.hop(via)
                    if hop is None:
                        hop, r = self.paths.around(self.paths.node(via), r)
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
            extra = self.keeper.unsynced_kids(path)
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
        got = self.keeper.sufficient.get(key)
        if got is not None and got[0] == vm[0]:
            return got[1]
        h = self.h
        vb = self.keeper.vb
        failed: set[str] = set()
        for leaf, clock in vm[1].items():
            if not h.contains(unit, leaf):
                continue
            v = vb.get(leaf)
            if v is None or (v[0], v[1]) < clock:
                failed.add(h.child_of(unit, leaf))
                self.lagging.add(leaf)
        result = tuple(k for k in kids if k in failed)
        if len(self.keeper.sufficient) >= MAX_SUFFICIENCY:
            self.keeper.sufficient.clear()
        self.keeper.sufficient[key] = (vm[0], result)
        if result:
            self.counters["insufficient"] += 1
        return result
