"""The connectivity graph: one broker's abbreviated view of the system (seed 004 §2).

Theory of operation
-------------------
Every broker (the *vertex*) holds one :class:`ConnectivityGraph`. Its inputs are
:class:`LinkReport` values: the vertex's own observations (:meth:`ConnectivityGraph.observe`) and
reports relayed by neighbours (:meth:`ConnectivityGraph.receive`). Its outputs are
:class:`Update` values (pass the report on? did routes change? did a partition open or heal?) and
answers to queries: shortest paths, next hops, gateways. It does no I/O, keeps no clock and does
not know its neighbours; the driver floods each *new* report to the neighbours it is visible to
(:meth:`ConnectivityGraph.report_visible_to`) and hands a neighbour whose link just came up
:meth:`ConnectivityGraph.reports_for`.

State, all bounded by the links inside the vertex's contexts:

* per link: the latest report from each endpoint. A link is up iff at least one report exists and
  every endpoint's latest report says up; so when an endpoint crashes, the survivor's "down"
  overrides the crashed end's stale "up", and when it restarts it reports up with a higher
  incarnation.
* per edge (an unordered pair of graph nodes): the known and the live links between them. Every
  link of one edge has the same link level, the level of the lowest unit holding both nodes.
* suspected nodes and links, which routes avoid but partition detection ignores (a partition is a
  fact about links that are down; suspicion is this vertex's opinion about where not to route).

Costs (seed 004 §2): traversing a level-ℓ link from a level-x node costs
``LinkCostMatrix.cost(x, ℓ)`` unless the link carries its own cost; an edge over several links
costs the minimum over its live links. :meth:`ConnectivityGraph.set_costs` swaps the matrix ("the
link cost matrix, which can be dynamically updated").

Routes: :meth:`ConnectivityGraph.next_hop` follows the hierarchical :meth:`ConnectivityGraph.route`,
not the flat :meth:`ConnectivityGraph.shortest_path`; ``_routes`` explains why (flat forwarding on
abbreviated views loops).

Known limit: a link whose two endpoints both crash keeps both ends' last "up" until one of them
restarts; nobody else observes that link. Its edge can then look live in remote views.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from ges.connectivity._paths import reachable
from ges.connectivity._routes import RoutableEdge, Router
from ges.connectivity._values import (
    STALE,
    ConnectivityError,
    Edge,
    Gateway,
    GraphNode,
    Healed,
    LinkKey,
    LinkReport,
    Partition,
    Update,
    express,
    express_unit,
    visible_to,
)
from ges.topology import LinkCostMatrix, UnitPath, broker_order_key, link_key, unit_name

NodePair = tuple[GraphNode, GraphNode]


def _pair(u: GraphNode, w: GraphNode) -> NodePair:
    return (u, w) if u.sort_key <= w.sort_key else (w, u)


class _Link:
    """One broker link as the vertex knows it."""

    __slots__ = ("key", "pair", "reports", "up", "cost")

    def __init__(self, key: LinkKey, pair: NodePair) -> None:
        self.key = key
        self.pair = pair
        self.reports: dict[str, LinkReport] = {}
        self.up = False
        self.cost: float | None = None

    def settle(self) -> tuple[bool, float | None]:
        """(up, cost override) from the latest report of each endpoint."""
        reports = self.reports.values()
        up = bool(self.reports) and all(r.up for r in reports)
        # Two live ends may disagree on an override (one just raised it under load); the higher
        # one wins so that neither end's congestion signal is ignored.
        costs = [r.cost for r in reports if r.cost is not None]
        return up, (max(costs) if up and costs else None)


class _Edge:
    """All links between one pair of graph nodes."""

    __slots__ = ("pair", "level", "links", "live", "was_live")

    def __init__(self, pair: NodePair, level: int) -> None:
        self.pair = pair
        self.level = level
        self.links: set[LinkKey] = set()
        self.live: set[LinkKey] = set()
        self.was_live = False


class ConnectivityGraph:
    """One broker's connectivity graph (seed 004 §2, Figure 3).

    Args:
        vertex: the id of the broker holding the graph.
        unit: its unit path, top level first (``("SSC-A", "SC-1", "c")``).
        costs: the link cost matrix.
        incarnation: this run of the broker; must grow across restarts so that the broker's new
            reports supersede those of its previous life.
    """

    def __init__(
        self,
        vertex: str,
        unit: UnitPath,
        *,
        costs: LinkCostMatrix = LinkCostMatrix(),
        incarnation: int = 0,
    ) -> None:
        self.vertex = vertex
        self.unit: UnitPath = tuple(unit)
        if not self.unit:
            raise ValueError("a connectivity graph needs the vertex's unit path")
        self.depth = len(self.unit)
        self.incarnation = incarnation
        self._seq = 0
        self._costs = costs
        self.vertex_node = GraphNode(0, (*self.unit, vertex))
        self._links: dict[LinkKey, _Link] = {}
        self._edges: dict[NodePair, _Edge] = {}
        self._adjacent: dict[GraphNode, set[GraphNode]] = {self.vertex_node: set()}
        self._suspected_nodes: set[GraphNode] = set()
        self._suspected_links: set[LinkKey] = set()
        # Caches, dropped on any change that can affect them.
        self._router: Router | None = None
        self._edges_view: Mapping[NodePair, Edge] | None = None

    def __repr__(self) -> str:
        return (
            f"<ConnectivityGraph {self.vertex} in {unit_name(self.unit)}: "
            f"{len(self._adjacent)} nodes, {len(self._links)} links>"
        )

    # -- inputs ----------------------------------------------------------------------------------

    def observe(
        self, peer: str, peer_unit: UnitPath, *, up: bool, cost: float | None = None
    ) -> tuple[LinkReport, Update]:
        """The vertex saw its link to ``peer`` come up or go down (or its cost change).

        Returns the report to disseminate (it is stored here first) and its effect on this graph.
        """
        report = LinkReport.observe(
            self.vertex,
            self.unit,
            peer,
            tuple(peer_unit),
            up=up,
            version=(self.incarnation, self._seq),
            cost=cost,
        )
        self._seq += 1
        return report, self.receive(report)

    def receive(self, report: LinkReport) -> Update:
        """Take in one report; store it if it is newer than what this graph holds from its
        reporter for its link, and recompute the link's edge.

        Error handling: raises :class:`ConnectivityError` for a report of another depth or one
        that should never have reached this vertex (outside lcu(a, b)).
        """
        if not visible_to(report, self.unit):
            raise ConnectivityError(
                f"report on link {report.a}-{report.b} (scope {unit_name(report.lcu)}) "
                f"reached broker {self.vertex} in {unit_name(self.unit)}, outside its scope"
            )
        if report.reporter == self.vertex:
            if report.version[0] < self.incarnation:
                return STALE  # our previous life's opinion; our own observations replace it
            if report.version >= (self.incarnation, self._seq):
                # A report of ours we do not remember issuing: make sure ours come after it.
                self.incarnation, self._seq = report.version[0], report.version[1] + 1
        link = self._links.get(report.key)
        if link is None:
            link = self._add_link(report)
        held = link.reports.get(report.reporter)
        if held is not None and held.version >= report.version:
            return STALE
        link.reports[report.reporter] = report
        up, cost = link.settle()
        if up == link.up and cost == link.cost:
            return Update(new=True)
        return self._apply(link, up, cost)

    def set_costs(self, costs: LinkCostMatrix) -> None:
        """Replace the link cost matrix (seed 004 §2: it "can be dynamically updated")."""
        self._costs = costs
        self._invalidate()

    # -- suspicion (seed 004 §3: only unsuspected nodes and links are on shortest paths) --------

    def suspect(self, node: GraphNode) -> None:
        if node == self.vertex_node:
            raise ValueError("the vertex cannot suspect itself")
        self._suspected_nodes.add(node)
        self._router = None

    def clear_suspicion(self, node: GraphNode) -> None:
        self._suspected_nodes.discard(node)
        self._router = None

    def suspect_link(self, a: str, b: str) -> None:
        self._suspected_links.add(link_key(a, b))
        self._router = None

    def clear_link_suspicion(self, a: str, b: str) -> None:
        self._suspected_links.discard(link_key(a, b))
        self._router = None

    @property
    def suspected(self) -> frozenset[GraphNode]:
        return frozenset(self._suspected_nodes)

    @property
    def suspected_links(self) -> frozenset[LinkKey]:
        return frozenset(self._suspected_links)

    # -- dissemination ----------------------------------------------------------------------------

    def report_visible_to(self, report: LinkReport, receiver_unit: UnitPath) -> bool:
        """May ``report`` be sent to a broker in ``receiver_unit``? (inside lcu(a, b) only)"""
        return visible_to(report, tuple(receiver_unit))

    def reports(self) -> Iterator[LinkReport]:
        """Every report held (the latest per link and reporter), in a stable order."""
        for key in sorted(self._links, key=_link_order):
            link = self._links[key]
            for reporter in sorted(link.reports, key=broker_order_key):
                yield link.reports[reporter]

    def reports_for(self, receiver_unit: UnitPath) -> list[LinkReport]:
        """The reports to hand a neighbour in ``receiver_unit`` whose link to us just came up."""
        unit = tuple(receiver_unit)
        return [r for r in self.reports() if visible_to(r, unit)]

    # -- the view ---------------------------------------------------------------------------------

    @property
    def costs(self) -> LinkCostMatrix:
        return self._costs

    @property
    def nodes(self) -> frozenset[GraphNode]:
        """Every node the vertex knows of (the vertex and every end of every known link)."""
        return frozenset(self._adjacent)

    @property
    def edges(self) -> Mapping[NodePair, Edge]:
        """The live edges (link count ≥ 1), keyed by their canonical node pair."""
        if self._edges_view is None:
            view = {}
            for pair in sorted(self._edges, key=_pair_order):
                edge = self._edges[pair]
                if edge.live:
                    view[pair] = self._edge_value(edge)
            self._edges_view = MappingProxyType(view)
        return self._edges_view

    def edge(self, u: GraphNode, w: GraphNode) -> Edge | None:
        """The live edge between two nodes, in either order, or None."""
        return self.edges.get(_pair(u, w))

    def link_up(self, a: str, b: str) -> bool | None:
        """Whether the vertex believes link a–b is up; None if it has never heard of it."""
        link = self._links.get(link_key(a, b))
        return None if link is None else link.up

    def node_for(self, broker_id: str, broker_unit: UnitPath) -> GraphNode | None:
        """The graph node standing for a broker; None if it is the vertex itself."""
        if broker_id == self.vertex:
            return None
        return express(self.unit, broker_id, tuple(broker_unit))

    def node_for_unit(self, unit: UnitPath) -> GraphNode | None:
        """The graph node standing for a unit; None if the unit contains the vertex."""
        return express_unit(self.unit, tuple(unit))

    def context(self, level: int) -> UnitPath:
        """C(vertex, ℓ): the vertex's level-ℓ unit, 1 ≤ ℓ ≤ depth + 1."""
        if not 1 <= level <= self.depth + 1:
            raise ValueError(f"level {level} outside 1..{self.depth + 1}")
        return self.unit[: self.depth - level + 1]

    def gateways(self, level: int) -> list[Gateway]:
        """The live level-ℓ gateways out of C(vertex, ℓ), as this vertex sees them.

        These are where profile changes go (seed 004 §2, profile propagation): level-(ℓ-1)
        changes at the vertex travel to the level-ℓ gatekeepers of C(vertex, ℓ), i.e. to the
        ``inner`` end of each gateway. Every live edge of one level, gateway or not, is in
        :attr:`edges` with that ``level``.
        """
        if not 1 <= level <= self.depth:
            raise ValueError(f"gateway level {level} outside 1..{self.depth}")
        inside = self.context(level)
        out = []
        for edge in self.edges.values():
            if edge.level != level:
                continue
            u_in = _within(edge.u, inside)
            w_in = _within(edge.w, inside)
            if u_in != w_in:
                inner, outer = (edge.u, edge.w) if u_in else (edge.w, edge.u)
                out.append(Gateway(level, inner, outer, edge.links))
        return out

    # -- routes (seed 004 §3; see _routes for why there are two kinds) -----------------------

    def route(self, target: GraphNode) -> list[GraphNode] | None:
        """The hierarchical route vertex … target, which :meth:`next_hop` follows, or None.

        It stays inside the lowest unit holding the vertex and the target and chooses, level by
        level, the next unit on a path every broker of that unit agrees on, so hop-by-hop
        forwarding cannot loop while the views agree. None also when that unit is split inside.
        """
        return self._routes().route(target)

    def shortest_path(self, target: GraphNode) -> list[GraphNode] | None:
        """The cheapest path vertex … target over the whole view (Dijkstra), or None.

        Avoids suspected nodes and links; ties go to fewer hops, then to the predecessor with the
        smallest natural order. Forwarding on it alone can loop between units (see
        :meth:`route`); ``next_hop(..., fallback=True)`` uses it when no route exists.
        """
        return self._routes().flat_tree().path(target)

    def distance(self, target: GraphNode) -> float | None:
        """The cost of :meth:`shortest_path`, or None if unreachable."""
        return self._routes().flat_tree().distance.get(target)

    def next_hop(
        self, target_broker_id: str, target_unit: UnitPath, *, fallback: bool = False
    ) -> str | None:
        """The neighbour to send to for a broker: None if it is the vertex or unreachable."""
        node = self.node_for(target_broker_id, target_unit)
        return None if node is None else self.next_hop_to(node, fallback=fallback)

    def next_hop_to(self, target: GraphNode, *, fallback: bool = False) -> str | None:
        """The neighbour to send to for a graph node, following :meth:`route`.

        Either a broker of the vertex's cluster (a level-0 first hop), or — when the first edge
        is one of the vertex's own gateways — the broker at the far end of the cheapest
        unsuspected live link of that edge (ties: lowest link key). With ``fallback``, a target
        with no route (its unit is split inside) is tried along :meth:`shortest_path`, which may
        leave and re-enter units.
        """
        path = self.route(target)
        if path is None and fallback:
            path = self.shortest_path(target)
        if path is None or len(path) < 2:
            return None
        first = path[1]
        if first.level == 0:
            return first.broker
        edge = self._edges[_pair(self.vertex_node, first)]
        best: tuple | None = None
        for key in edge.live:
            if key in self._suspected_links:
                continue
            rank = (self._link_cost(key, self.vertex_node, edge.level), _link_order(key))
            if best is None or rank < best[0]:
                best = (rank, key)
        if best is None:  # pragma: no cover - the path would not have used this edge
            return None
        a, b = best[1]
        return b if a == self.vertex else a

    def reachable_nodes(self) -> frozenset[GraphNode]:
        """Nodes connected to the vertex by live edges (suspicion ignored)."""
        return frozenset(reachable(self.vertex_node, self._live_adjacent))

    # -- internals --------------------------------------------------------------------------------

    def _add_link(self, report: LinkReport) -> _Link:
        u = express(self.unit, report.a, report.a_unit)
        w = express(self.unit, report.b, report.b_unit)
        if u == w:  # unreachable given visible_to, kept as a guard
            raise ConnectivityError(f"link {report.a}-{report.b} is inside node {u}")
        pair = _pair(u, w)
        link = _Link(report.key, pair)
        self._links[report.key] = link
        edge = self._edges.get(pair)
        if edge is None:
            edge = self._edges[pair] = _Edge(pair, report.level)
            self._adjacent.setdefault(u, set()).add(w)
            self._adjacent.setdefault(w, set()).add(u)
        edge.links.add(report.key)
        return link

    def _apply(self, link: _Link, up: bool, cost: float | None) -> Update:
        edge = self._edges[link.pair]
        was_up = link.up
        link.up, link.cost = up, cost
        partitions: tuple[Partition, ...] = ()
        healed: tuple[Healed, ...] = ()
        if up != was_up:
            # Reachability is only worth computing when an edge's count crosses zero, and on the
            # way up only for an edge that was live before (a first link is growth, not healing).
            crossing = (not up and edge.live == {link.key}) or (
                up and not edge.live and edge.was_live
            )
            before = self.reachable_nodes() if crossing else frozenset()
            if up:
                edge.live.add(link.key)
            else:
                edge.live.discard(link.key)
            if crossing:
                after = self.reachable_nodes()
                if up:
                    healed = (Healed(edge.pair, after - before),)
                else:
                    partitions = (Partition(edge.pair, before - after),)
            edge.was_live = edge.was_live or up
        self._invalidate()
        return Update(new=True, changed=True, partitions=partitions, healed=healed)

    def _invalidate(self) -> None:
        self._router = None
        self._edges_view = None

    def _live_adjacent(self, node: GraphNode) -> Iterator[GraphNode]:
        for other in self._adjacent.get(node, ()):
            if self._edges[_pair(node, other)].live:
                yield other

    def _link_cost(self, key: LinkKey, frm: GraphNode, level: int) -> float:
        cost = self._links[key].cost
        return self._costs.cost(frm.level, level) if cost is None else cost

    def _edge_value(self, edge: _Edge) -> Edge:
        u, w = edge.pair
        keys = tuple(sorted(edge.live, key=_link_order))
        return Edge(
            u=u,
            w=w,
            level=edge.level,
            links=keys,
            cost_u=min(self._link_cost(k, u, edge.level) for k in keys),
            cost_w=min(self._link_cost(k, w, edge.level) for k in keys),
        )

    def _routes(self) -> Router:
        if self._router is None:
            usable = []
            for edge in self._edges.values():
                u, w = edge.pair
                if not edge.live or u in self._suspected_nodes or w in self._suspected_nodes:
                    continue
                overrides = tuple(
                    self._links[key].cost
                    for key in sorted(edge.live, key=_link_order)
                    if key not in self._suspected_links
                )
                if overrides:
                    usable.append(RoutableEdge(u, w, edge.level, overrides))
            self._router = Router(self.vertex_node, self.unit, usable, self._costs)
        return self._router


def _within(node: GraphNode, unit: UnitPath) -> bool:
    return node.path[: len(unit)] == unit and len(node.path) > len(unit)


def _link_order(key: LinkKey) -> tuple:
    return (broker_order_key(key[0]), broker_order_key(key[1]))


def _pair_order(pair: NodePair) -> tuple:
    return (pair[0].sort_key, pair[1].sort_key)
