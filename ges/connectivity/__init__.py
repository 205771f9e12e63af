"""Connectivity graphs: each broker's abbreviated view of the system (seed 004 §2).

Sans-I/O: a :class:`ConnectivityGraph` is fed :class:`LinkReport` values and answers with
:class:`Update` values, shortest paths, next hops and gateways; the caller moves the reports.
"""

from ges.connectivity._graph import ConnectivityGraph
from ges.connectivity._paths import ShortestPathTree, shortest_path_tree
from ges.connectivity._values import (
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

__all__ = [
    "ConnectivityError",
    "ConnectivityGraph",
    "Edge",
    "Gateway",
    "GraphNode",
    "Healed",
    "LinkKey",
    "LinkReport",
    "Partition",
    "ShortestPathTree",
    "Update",
    "express",
    "express_unit",
    "shortest_path_tree",
    "visible_to",
]
