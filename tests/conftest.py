"""Shared test helpers: free ports, topologies on free ports."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio

from ges.runtime.ports import free_ports, on_free_ports
from ges.topology import Topology

__all__ = [
    "CHAIN3",
    "DIAMOND",
    "free_ports",
    "on_free_ports",
    "receive",
    "ten_events_through",
    "topology_on_free_ports",
]

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


@asynccontextmanager
async def ten_events_through(chain3: Topology, nursery, **options):
    """Chain3's brokers running in ``nursery`` (each with ``options``), a subscriber at b3
    that has received ten events published at b1; the servers, both clients still connected
    inside."""
    from ges.client import connect
    from ges.runtime import BrokerServer
    from ges.runtime.up import wait_ready
    from ges.wire import messages as m

    servers = [
        await nursery.start(BrokerServer(chain3, bid, **options).run) for bid in chain3.brokers
    ]
    await wait_ready(chain3, timeout=30)
    s1, s3 = chain3.brokers["b1"], chain3.brokers["b3"]
    async with (
        connect(s3.host, s3.port, topology=chain3) as sub_client,
        connect(s1.host, s1.port, topology=chain3) as pub_client,
    ):
        sub = await sub_client.subscribe([])
        await pub_client.publish([m.Event({"n": i}) for i in range(10)])
        await receive(sub, 10, within=30)
        yield servers
