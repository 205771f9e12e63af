"""A pure-Python dissemination loop for connectivity graphs, and the Figure 2 topology.

:class:`Network` is the smallest driver of :class:`ConnectivityGraph` cores: one graph per broker,
a FIFO of (sender, receiver, report), flooding each *new* report to every live neighbour it is
visible to (seed 004 §2: connection information is disseminated only within its context).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from ges.connectivity import ConnectivityGraph, GraphNode, LinkReport, Update, visible_to
from ges.topology import Topology, link_key

FIGURE2 = Path(__file__).resolve().parents[2] / "topologies" / "figure2.yaml"


class Network:
    """Graphs for every broker of a topology, connected by its links, flooded synchronously."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.incarnation = dict.fromkeys(topology.brokers, 0)
        self.graphs: dict[str, ConnectivityGraph | None] = {
            b: self._fresh(b) for b in topology.brokers
        }
        self.live: set[tuple[str, str]] = set()
        self.updates: list[tuple[str, LinkReport, Update]] = []
        self.deliveries = 0
        self._keys = {b: {n: link_key(b, n) for n in ns} for b, ns in topology.neighbours.items()}

    def _fresh(self, b: str) -> ConnectivityGraph:
        return ConnectivityGraph(
            b, self.unit(b), costs=self.topology.link_costs, incarnation=self.incarnation[b]
        )

    def unit(self, b: str) -> tuple[str, ...]:
        return self.topology.brokers[b].unit

    def graph(self, b: str) -> ConnectivityGraph:
        g = self.graphs[b]
        assert g is not None, f"broker {b} is down"
        return g

    def live_neighbours(self, b: str) -> list[str]:
        return [n for n, key in self._keys[b].items() if key in self.live]

    # -- the loop -----------------------------------------------------------------------------

    def _send_on(self, queue: deque, sender: str, report: LinkReport, *, skip: str = "") -> None:
        for n in self.live_neighbours(sender):
            if n != skip and visible_to(report, self.unit(n)):
                queue.append((sender, n, report))

    def _flood(self, queue: deque) -> None:
        while queue:
            sender, receiver, report = queue.popleft()
            self.deliveries += 1
            update = self.graph(receiver).receive(report)
            self.updates.append((receiver, report, update))
            if update.new:
                self._send_on(queue, receiver, report, skip=sender)

    def _observe(self, b: str, peer: str, *, up: bool) -> LinkReport:
        link = self.topology.link_between(b, peer)
        cost = link.cost if link is not None else None
        report, update = self.graph(b).observe(peer, self.unit(peer), up=up, cost=cost)
        self.updates.append((b, report, update))
        return report

    # -- events -------------------------------------------------------------------------------

    def connect_all(self) -> Network:
        """Bring every link up: each end starts with both ends' reports, then flood."""
        own: dict[str, list[LinkReport]] = {b: [] for b in self.topology.brokers}
        for link in self.topology.links:
            self.live.add(link.key)
            ra = self._observe(link.a, link.b, up=True)
            rb = self._observe(link.b, link.a, up=True)
            self.graph(link.a).receive(rb)
            self.graph(link.b).receive(ra)
            own[link.a] += [ra, rb]
            own[link.b] += [ra, rb]
        queue: deque = deque()
        for b, reports in own.items():
            for report in reports:
                self._send_on(queue, b, report)
        self._flood(queue)
        return self

    def _events_since(self, start: int) -> list[tuple[str, Update]]:
        return [(who, u) for who, _r, u in self.updates[start:] if u.partitions or u.healed]

    def link_up(self, a: str, b: str) -> list[tuple[str, Update]]:
        """Both ends see the link come up and sync; returns the updates that healed an edge."""
        start = len(self.updates)
        self.live.add(link_key(a, b))
        ra = self._observe(a, b, up=True)
        rb = self._observe(b, a, up=True)
        queue: deque = deque()
        # Anti-entropy across the new link, then the two observations to everyone else.
        queue.extend((a, b, r) for r in self.graph(a).reports_for(self.unit(b)))
        queue.extend((b, a, r) for r in self.graph(b).reports_for(self.unit(a)))
        self._send_on(queue, a, ra, skip=b)
        self._send_on(queue, b, rb, skip=a)
        self._flood(queue)
        return self._events_since(start)

    def link_down(self, a: str, b: str) -> list[tuple[str, Update]]:
        """Both ends see the link drop; returns the updates that reported a partition."""
        start = len(self.updates)
        self.live.discard(link_key(a, b))
        queue: deque = deque()
        for x, y in ((a, b), (b, a)):
            if self.graphs[x] is not None:
                self._send_on(queue, x, self._observe(x, y, up=False))
        self._flood(queue)
        return self._events_since(start)

    def crash(self, b: str) -> None:
        """b stops; its neighbours see their links to it drop. b's graph is lost."""
        for n in self.live_neighbours(b):
            self.live.discard(link_key(b, n))
            queue: deque = deque()
            self._send_on(queue, n, self._observe(n, b, up=False))
            self._flood(queue)
        self.graphs[b] = None

    def restart(self, b: str) -> None:
        """b comes back with a higher incarnation and an empty graph; its links come up."""
        self.incarnation[b] += 1
        self.graphs[b] = self._fresh(b)
        for n in self.topology.neighbours[b]:
            if self.graphs[n] is not None:
                self.link_up(b, n)


def by_name(graph: ConnectivityGraph, name: str) -> GraphNode:
    """The node of ``graph`` whose short name is ``name`` ("5", "c", "SC-2")."""
    found = [n for n in graph.nodes if str(n) == name]
    assert len(found) == 1, f"{name!r} names {found} at vertex {graph.vertex}"
    return found[0]


def edge_names(graph: ConnectivityGraph, *, level: int | None = None) -> set[str]:
    """The live edges of a graph as "u—w" strings, optionally of one link level."""
    return {str(e) for e in graph.edges.values() if level is None or e.level == level}


@pytest.fixture(scope="session")
def figure2() -> Topology:
    return Topology.from_yaml(FIGURE2)


@pytest.fixture
def make_network():
    """``make_network(topology)``: a :class:`Network` with every link up and flooded."""
    return lambda topology: Network(topology).connect_all()


@pytest.fixture
def net(figure2: Topology) -> Network:
    return Network(figure2).connect_all()


# Helpers as fixtures, so test modules never import conftest (works in any pytest import mode).
@pytest.fixture
def node():
    return by_name


@pytest.fixture
def edges_of():
    return edge_names
