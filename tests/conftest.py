"""Shared test helpers: free ports, topologies on free ports."""

from __future__ import annotations

import pytest
import trio

from ges.runtime.ports import free_ports, on_free_ports
from ges.topology import Topology

__all__ = ["CHAIN3", "DIAMOND", "free_ports", "on_free_ports", "receive", "topology_on_free_ports"]

#: a - b, a - c, b - d, c - d in two clusters: every link has a way round it
DIAMOND = {
    "name": "diamond",
    "brokers": {
        "a": {"unit": "S/c1", "port": 1},
        "b": {"unit": "S/c1", "port": 2},
        "c": {"unit": "S/c2", "port": 3},
        "d": {"unit": "S/c2", "port": 4},
    },
    "links": [["a", "b"], ["a", "c"], ["b", "d"], ["c", "d"]],
}


async def receive(sub, n: int, *, within: float = 5.0) -> list:
    """The next ``n`` deliveries of a client subscription; fails after ``within`` seconds."""
    got = []
    with trio.fail_after(within):
        async for d in sub:
            got.append(d)
            if len(got) == n:
                break
    return got


def topology_on_free_ports(data: dict) -> Topology:
    return Topology.from_dict(on_free_ports(data), source="<test>")


#: b1 - b2 - b3 in two clusters of one super-cluster
CHAIN3 = {
    "name": "chain3",
    "brokers": {
        "b1": {"unit": "S/c1", "port": 1},
        "b2": {"unit": "S/c1", "port": 2},
        "b3": {"unit": "S/c2", "port": 3},
    },
    "links": [["b1", "b2"], ["b2", "b3"]],
}


@pytest.fixture
def chain3() -> Topology:
    """b1 - b2 - b3 in two clusters of one super-cluster."""
    return topology_on_free_ports(CHAIN3)
