"""Shortest paths and reachability over a connectivity graph, as pure functions.

Seed 004 §3 (event routing): "At every node the best hops to reach the destinations are computed
... Nodes and links that have not been failure suspected are the only entities that can be part of
the shortest path." The graph hands these functions a neighbour function that already leaves out
suspected nodes and links and knows each edge's directional cost.

Ties are broken so that the answer depends only on the graph, never on the order reports arrived
in: among equal-cost routes the one with fewer hops wins, then the one whose last hop comes from
the node with the smallest natural sort key. Brokers holding the same reports therefore pick the
same routes, which keeps hop-by-hop forwarding consistent.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import attrs

from ges.connectivity._values import GraphNode

Neighbours = Callable[[GraphNode], Iterable[tuple[GraphNode, float]]]


@attrs.frozen
class ShortestPathTree:
    """Dijkstra's result from one source: distance and predecessor of every reachable node."""

    source: GraphNode
    distance: dict[GraphNode, float]
    predecessor: dict[GraphNode, GraphNode]

    def path(self, target: GraphNode) -> list[GraphNode] | None:
        """Source … target, or None if the target is unreachable."""
        if target not in self.distance:
            return None
        out = [target]
        while out[-1] != self.source:
            out.append(self.predecessor[out[-1]])
        out.reverse()
        return out


def shortest_path_tree(source: GraphNode, neighbours: Neighbours) -> ShortestPathTree:
    """Dijkstra from ``source`` with the deterministic tie-break described in the module doc."""
    # label = (distance, hops, sort key of predecessor); smaller is better.
    label: dict[GraphNode, tuple] = {source: (0.0, 0, ())}
    predecessor: dict[GraphNode, GraphNode] = {}
    done: set[GraphNode] = set()
    heap: list[tuple] = [(0.0, 0, source.sort_key, source)]
    while heap:
        dist, hops, _key, node = heapq.heappop(heap)
        if node in done or label[node][:2] != (dist, hops):
            continue
        done.add(node)
        for nxt, cost in neighbours(node):
            if nxt in done:
                continue
            candidate = (dist + cost, hops + 1, node.sort_key)
            if nxt not in label or candidate < label[nxt]:
                label[nxt] = candidate
                predecessor[nxt] = node
                heapq.heappush(heap, (candidate[0], candidate[1], nxt.sort_key, nxt))
    distance = {node: label[node][0] for node in done}
    return ShortestPathTree(source, distance, predecessor)


def reachable(source: GraphNode, adjacent: Callable[[GraphNode], Iterable[GraphNode]]) -> set:
    """Every node reachable from ``source`` (including it) over the given adjacency."""
    seen = {source}
    stack = [source]
    while stack:
        for nxt in adjacent(stack.pop()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen
