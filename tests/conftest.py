"""Shared test helpers: free ports, topologies on free ports."""

from __future__ import annotations

import socket

import pytest

from ges.topology import Topology


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago on 127.0.0.1."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def on_free_ports(data: dict) -> dict:
    """A copy of a topology mapping with every broker moved to a free port on 127.0.0.1."""
    data = {**data, "brokers": {k: dict(v) for k, v in data["brokers"].items()}}
    for spec, port in zip(data["brokers"].values(), free_ports(len(data["brokers"])), strict=True):
        spec["port"] = port
        spec["host"] = "127.0.0.1"
    return data


def topology_on_free_ports(data: dict) -> Topology:
    return Topology.from_dict(on_free_ports(data), source="<test>")


@pytest.fixture
def chain3() -> Topology:
    """b1 - b2 - b3 in two clusters of one super-cluster."""
    return topology_on_free_ports(
        {
            "name": "chain3",
            "brokers": {
                "b1": {"unit": "S/c1", "port": 1},
                "b2": {"unit": "S/c1", "port": 2},
                "b3": {"unit": "S/c2", "port": 3},
            },
            "links": [["b1", "b2"], ["b2", "b3"]],
        }
    )
