"""Paths and detours: the next hop towards a broker, a unit or its nearest keeper (seed 004 §3.3).

Theory of operation
-------------------
Every hop is the connectivity graph's hierarchical next hop (ges.connectivity), which avoids
suspected nodes and links; the next hops towards brokers, units and keepers are cached until
connectivity changes. When a unit is split inside, the hierarchical route to its far side does
not exist, and brokers that see the unit as one node would send a message for the far side back
to this side; so a message (event route, profile change, ack, nack, answer) that must go round
the split carries a *detour*, the brokers where the whole view's shortest path crosses between
nodes (:meth:`Paths.detour`). A detour a peer names is checked: known brokers only, at most
``MAX_DETOUR`` of them. Profile messages for a keeper go in chunks (``ges.routing.base``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ges.connectivity import GraphNode
from ges.routing.base import (
    GAVE_UP,
    MAX_DETOUR,
    MAX_RELAY_HOPS,
    RouterPart,
    chunks,
)
from ges.topology import UnitPath, broker_order_key
from ges.wire import messages as m


class Paths(RouterPart):
    """Next hops and detours, cached until connectivity changes."""

    def __init__(self, router):
        super().__init__(router)
        self.detours: dict[GraphNode, tuple[str, tuple[str, ...]] | None] = {}
        self.hops: dict[str, str | None] = {}
        self.unit_hops: dict[UnitPath, str | None] = {}
        self.nearest: dict[UnitPath, str | None] = {}
        self.sync_hops: dict[str, str | None] = {}

    def follow(self, detour) -> tuple[tuple[str, tuple[str, ...]] | None, bool]:
        """A message's next step along its detour, if any, and whether it has given up on one
        (a message takes no second detour after one failed: views that disagree about a split
        could send it round forever)."""
        if not detour:
            return None, False
        if tuple(detour) == GAVE_UP:
            return None, True
        step = self._transit(detour)
        return step, step is None and any(b != self.id for b in detour)

    def to_origin(self, msg, make) -> list | None:
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
        step, gave_up = self.follow(detour)
        if step is not None:
            return {step: targets}
        by_hop: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for t in targets:
            s = self.path_to(t, gave_up=gave_up)
            if s is not None:
                by_hop.setdefault(s, []).append(t)
        return by_hop

    def relay_step(self, to: str, detour, hops: int) -> tuple[str, tuple[str, ...]] | None:
        """``(next hop, detour)`` for a message relayed to broker ``to`` (it follows its
        detour first); None if there is none or the message has gone too far."""
        if hops >= MAX_RELAY_HOPS:
            return None
        step, gave_up = self.follow(detour)
        if step is None:
            step = self.path_to(to, gave_up=gave_up)
        return step

    def send(
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
            step = self.path_to(t, gave_up=gave_up)
            if step is not None:
                by_hop.setdefault(step, []).append(t)
        out = []
        parts = chunks(changes) if by_hop else []
        for (hop, detour), tos in by_hop.items():
            for chunk in parts:
                out.append((hop, m.Profiles(tos, chunk, hops, list(detour), resend)))
        return out

    def path_to(
        self, broker_id: str, *, gave_up: bool = False
    ) -> tuple[str, tuple[str, ...]] | None:
        """``(next hop, detour)`` towards a broker: the hierarchical route's hop, or a detour
        round a split unit (:meth:`_detour`) unless the message has ``gave_up`` on one; None if
        unreachable."""
        hop = self.hop(broker_id)
        if hop is not None:
            return (hop, GAVE_UP if gave_up else ())
        if gave_up or broker_id == self.id or broker_id not in self.h.topology.brokers:
            return None
        return self._detour(self.node(broker_id))

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
        hop = self.hop(head)
        # None: this broker's view differs from the one that planned the detour
        return None if hop is None else (hop, rest)

    def hop(self, broker_id: str) -> str | None:
        """The next hop towards a broker on the hierarchical route; None for this broker, an
        unreachable one, or one reachable only around a split unit (:meth:`_detour`)."""
        try:
            return self.hops[broker_id]
        except KeyError:
            pass
        spec = self.h.topology.brokers.get(broker_id)
        hop = None
        if spec is not None and broker_id != self.id:
            hop = self.graph.next_hop(broker_id, spec.unit)
        self.hops[broker_id] = hop
        return hop

    def unit_hop(self, unit: UnitPath) -> str | None:
        try:
            return self.unit_hops[unit]
        except KeyError:
            pass
        node = self.graph.node_for_unit(unit)
        hop = None if node is None else self.graph.next_hop_to(node)
        self.unit_hops[unit] = hop
        return hop

    def nearest_keeper(self, unit: UnitPath) -> str | None:
        try:
            return self.nearest[unit]
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
            rank = (self.hop(k) is None, dist, broker_order_key(k))
            if best is None or rank < best[0]:
                best = (rank, k)
        self.nearest[unit] = found = None if best is None else best[1]
        return found

    def node(self, broker_id: str) -> GraphNode | None:
        return self.graph.node_for(broker_id, self.h.topology.brokers[broker_id].unit)

    def around(self, node: GraphNode | None, r: m.Route) -> tuple[str | None, m.Route]:
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
            return self.detours[node]
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
        self.detours[node] = found
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
