"""Pure-Python path statistics: what ``ges.stats.paths`` is checked and timed against.

Two computations of the same figures, sharing no code with the Spark job or with each other:

* :func:`bfs_counts` — one breadth-first search per source over plain dicts, carrying along each
  reached broker the levels its shortest paths use. This is the single-process baseline of
  ``bench/stats_paths.py``.
* :func:`removal_counts` — the definitions taken literally, for small topologies in tests: a pair
  *must cross* level ℓ when the graph without level-ℓ links has no path as short as the shortest
  (a longer one or none); it *may cross* ℓ when fewer of its shortest paths avoid level ℓ than
  it has shortest paths in all (shortest paths counted by BFS); its *top level* is the lowest ℓ
  for which the graph of the links of level ≤ ℓ still has a path as short as the shortest.

Both return :class:`Counts`-shaped dicts of plain integers (``ges.stats.paths`` documents the
figures): sources, pairs, unreachable pairs, hop counts, and per link level the pairs that must
cross, may cross, have it as top level, or have their lowest common unit one level above it.
:func:`clustering` is the average local clustering coefficient by neighbour-set intersection.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ges.topology import Topology, broker_order_key


def _graph(topology: Topology) -> dict[str, list[tuple[str, int]]]:
    """Each broker's neighbours with the level of the link to them."""
    adj: dict[str, list[tuple[str, int]]] = {b: [] for b in topology.brokers}
    for link in topology.links:
        level = topology.link_level(link.a, link.b)
        adj[link.a].append((link.b, level))
        adj[link.b].append((link.a, level))
    return adj


def _sources(topology: Topology, sources: Iterable[str] | None) -> list[str]:
    if sources is None:
        return sorted(topology.brokers, key=broker_order_key)
    return list(sources)


def _empty(topology: Topology) -> dict:
    levels = topology.depth + 1
    return {
        "sources": 0,
        "pairs": 0,
        "unreachable_pairs": 0,
        "hops": {},
        "must_cross": [0] * levels,
        "may_cross": [0] * levels,
        "top_level": [0] * levels,
        "common_unit": [0] * levels,
    }


def _count_pair(out: dict, topology: Topology, s: str, t: str, d: int) -> None:
    out["pairs"] += 1
    out["hops"][d] = out["hops"].get(d, 0) + 1
    out["common_unit"][topology.common_level(s, t) - 1] += 1


def bfs_counts(topology: Topology, sources: Iterable[str] | None = None) -> dict:
    """Path counts from ``sources`` (default: every broker) by one layered BFS per source."""
    adj = _graph(topology)
    out = _empty(topology)
    levels = topology.depth + 1
    for s in _sources(topology, sources):
        out["sources"] += 1
        seen = {s}
        # per broker of the current layer: (levels every shortest path uses as a bit set, levels
        # some shortest path uses, the lowest possible highest level on a shortest path)
        layer: dict[str, tuple[int, int, int]] = {s: (0, 0, -1)}
        d = 0
        while layer:
            d += 1
            following: dict[str, tuple[int, int, int]] = {}
            for u, (must, may, top) in layer.items():
                for v, level in adj[u]:
                    if v in seen:
                        continue
                    bit = 1 << level
                    via = (must | bit, may | bit, max(top, level))
                    if v in following:
                        m0, m1, t0 = following[v]
                        following[v] = (m0 & via[0], m1 | via[1], min(t0, via[2]))
                    else:
                        following[v] = via
            seen.update(following)
            for v, (must, may, top) in following.items():
                _count_pair(out, topology, s, v, d)
                for lv in range(levels):
                    out["must_cross"][lv] += (must >> lv) & 1
                    out["may_cross"][lv] += (may >> lv) & 1
                out["top_level"][top] += 1
            layer = following
        out["unreachable_pairs"] += len(topology.brokers) - len(seen)
    return out


def _bfs(adj, s: str, allowed) -> tuple[dict[str, int], dict[str, int]]:
    """Distances and numbers of shortest paths from ``s`` over links whose level is allowed."""
    dist = {s: 0}
    paths = {s: 1}
    queue = deque([s])
    while queue:
        u = queue.popleft()
        for v, level in adj[u]:
            if not allowed(level):
                continue
            if v not in dist:
                dist[v] = dist[u] + 1
                paths[v] = 0
                queue.append(v)
            if dist[v] == dist[u] + 1:
                paths[v] += paths[u]
    return dist, paths


def removal_counts(topology: Topology, sources: Iterable[str] | None = None) -> dict:
    """The same counts as :func:`bfs_counts` from the definitions: BFS on subgraphs, path counts.

    About 2·(depth+1) BFS per source: meant for topologies of a few hundred brokers.
    """
    adj = _graph(topology)
    out = _empty(topology)
    levels = range(topology.depth + 1)
    for s in _sources(topology, sources):
        out["sources"] += 1
        dist, paths = _bfs(adj, s, lambda level: True)
        without = [_bfs(adj, s, lambda level, lv=lv: level != lv) for lv in levels]
        up_to = [_bfs(adj, s, lambda level, lv=lv: level <= lv)[0] for lv in levels]
        for t, d in dist.items():
            if t == s:
                continue
            _count_pair(out, topology, s, t, d)
            for lv in levels:
                dist_lv, paths_lv = without[lv]
                avoiding = paths_lv[t] if dist_lv.get(t) == d else 0
                out["must_cross"][lv] += avoiding == 0
                out["may_cross"][lv] += avoiding < paths[t]
            out["top_level"][next(lv for lv in levels if up_to[lv].get(t) == d)] += 1
        out["unreachable_pairs"] += len(topology.brokers) - len(dist)
    return out


def clustering(topology: Topology) -> float:
    """Average over brokers of the share of their neighbour pairs that are linked (0 if < 2)."""
    neighbours = {b: set(ns) for b, ns in topology.neighbours.items()}
    total = 0.0
    for ns in neighbours.values():
        k = len(ns)
        if k < 2:
            continue
        linked = sum(len(neighbours[x] & ns) for x in ns) / 2
        total += linked / (k * (k - 1) / 2)
    return total / len(neighbours) if neighbours else 0.0
