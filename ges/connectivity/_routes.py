"""Routes over one vertex's connectivity graph: the flat shortest path and the hierarchical route.

Seed 004 §3: "At every node the best hops to reach the destinations are computed ... Nodes and
links that have not been failure suspected are the only entities that can be part of the shortest
path", and "When a gatekeeper g with GES context C_i is presented with an event it computes the
u_{i-1}'s within C_i that the event must be routed to".

Why two kinds of route
----------------------
The *flat* shortest path is Dijkstra over the whole abbreviated view. It is the cheapest path the
vertex can see, but hop-by-hop forwarding on it can loop: every unit outside the vertex's own is
one node with a fixed crossing cost, so a broker in SC-3 may send towards SSC-0 through SC-0
while the broker it hands the event to, deep inside SC-0 and far from SC-0's own exit, sends it
back through SC-3. On the generated 512-broker networks of tests/connectivity, about a quarter of
random broker pairs loop under flat forwarding.

The *hierarchical* route removes that. To reach a target, the vertex takes S = the lowest unit
holding both, collapses its view onto S's children (its own child A is one node, like the
others), and picks the cheapest unit-level path A → Y → … → target. Every broker inside S holds
the same collapsed graph (the links between S's children are visible to all of S, and units
outside S look the same from anywhere in S), so they all make the same choice, and each crossing
into the next child strictly lowers the remaining unit-level distance: no child of S is entered
twice. To get from inside A to Y the vertex recurses with S := A and Y as the sink, down to its
own cluster, where the nodes are brokers. The route never leaves S, so once an event enters the
target's unit it stays there. Suspicion is local, so brokers that suspect differently may still
disagree; the routing layer bounds hops for that.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from ges.connectivity._paths import ShortestPathTree, shortest_path_tree
from ges.connectivity._values import GraphNode
from ges.topology import LinkCostMatrix, UnitPath


@attrs.frozen
class RoutableEdge:
    """An edge that routes may use: both ends unsuspected, and the per-link cost overrides
    (None: use the matrix) of its live, unsuspected links."""

    u: GraphNode
    w: GraphNode
    level: int
    overrides: tuple[float | None, ...]


def crossing_cost(edge: RoutableEdge, from_level: int, costs: LinkCostMatrix) -> float:
    """The cost of traversing ``edge`` from a node of ``from_level``: min over its links."""
    matrix = costs.cost(from_level, edge.level)
    return min(matrix if c is None else c for c in edge.overrides)


def _collapse(node: GraphNode, scope: UnitPath, child_level: int) -> GraphNode:
    """The child of ``scope`` holding ``node``, or the node itself if it is outside ``scope``."""
    if node.path[: len(scope)] != scope or len(node.path) <= len(scope):
        return node
    if node.level == child_level:
        return node
    return GraphNode(child_level, node.path[: len(scope) + 1])


class Router:
    """Both kinds of route over one snapshot of a view; the graph drops it when the view changes.

    Holds one flat tree and at most one collapsed tree per enclosing unit of the vertex, so it is
    bounded by depth + 2 Dijkstra results over graphs of at most a few hundred nodes.
    """

    def __init__(
        self,
        vertex: GraphNode,
        unit: UnitPath,
        edges: Iterable[RoutableEdge],
        costs: LinkCostMatrix,
    ) -> None:
        self.vertex = vertex
        self.unit = unit
        self.depth = len(unit)
        self.costs = costs
        self.edges = list(edges)
        self._flat: ShortestPathTree | None = None
        self._collapsed: dict[UnitPath, ShortestPathTree] = {}

    # -- flat -------------------------------------------------------------------------------------

    def flat_tree(self) -> ShortestPathTree:
        if self._flat is None:
            adjacency: dict[GraphNode, dict[GraphNode, float]] = {}
            for edge in self.edges:
                for a, b in ((edge.u, edge.w), (edge.w, edge.u)):
                    adjacency.setdefault(a, {})[b] = crossing_cost(edge, a.level, self.costs)
            self._flat = shortest_path_tree(self.vertex, _neighbours(adjacency))
        return self._flat

    # -- hierarchical -----------------------------------------------------------------------------

    def scope(self, target: GraphNode) -> UnitPath:
        """The lowest unit holding both the vertex and ``target``."""
        k = 0
        for x, y in zip(self.unit, target.path, strict=False):
            if x != y:
                break
            k += 1
        return self.unit[:k]

    def route(self, target: GraphNode) -> list[GraphNode] | None:
        """The hierarchical route vertex … target (see the module docstring), or None."""
        if target == self.vertex:
            return [self.vertex]
        scope, sink = self.scope(target), target
        segments: list[list[GraphNode]] = []
        while True:
            here = self._own_child(scope)
            path = self._collapsed_tree(scope).path(sink)
            if path is None:
                return None
            segments.append(path)
            if here == self.vertex:
                break
            scope, sink = here.path, path[1]
        # segments[-1] runs vertex … Y0 inside the cluster; each level above starts [A_k, Y_k, …]
        # where Y_k is where the level below ended, and ends at that level's sink.
        route = segments[-1]
        for segment in reversed(segments[:-1]):
            route = route + segment[2:]
        return route

    def _own_child(self, scope: UnitPath) -> GraphNode:
        if len(scope) == self.depth:
            return self.vertex
        return GraphNode(self.depth - len(scope), self.unit[: len(scope) + 1])

    def _collapsed_tree(self, scope: UnitPath) -> ShortestPathTree:
        tree = self._collapsed.get(scope)
        if tree is None:
            child_level = self.depth - len(scope)
            adjacency: dict[GraphNode, dict[GraphNode, float]] = {}
            for edge in self.edges:
                u = _collapse(edge.u, scope, child_level)
                w = _collapse(edge.w, scope, child_level)
                if u == w:
                    continue
                for a, b in ((u, w), (w, u)):
                    # Only S's children are expanded; a node outside S can only be a sink.
                    if a.level == child_level and a.path[: len(scope)] == scope:
                        cost = crossing_cost(edge, child_level, self.costs)
                        best = adjacency.setdefault(a, {})
                        if b not in best or cost < best[b]:
                            best[b] = cost
            tree = shortest_path_tree(self._own_child(scope), _neighbours(adjacency))
            self._collapsed[scope] = tree
        return tree


def _neighbours(adjacency: dict[GraphNode, dict[GraphNode, float]]):
    def neighbours(node: GraphNode) -> Iterator[tuple[GraphNode, float]]:
        yield from adjacency.get(node, {}).items()

    return neighbours
