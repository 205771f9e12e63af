"""Topologies: brokers organised into units (seed 004 §2), their links, validation, generators."""

from ges.topology._loader import parse_duration, parse_yaml
from ges.topology.model import Topology
from ges.topology.specs import (
    DEFAULT_BLOCK_LIMIT,
    BrokerSpec,
    LinkCostMatrix,
    LinkSpec,
    MqttSettings,
    ReplicatorSpec,
    SessionLimits,
    UnitPath,
    broker_order_key,
    link_key,
    unit_name,
)

__all__ = [
    "DEFAULT_BLOCK_LIMIT",
    "BrokerSpec",
    "LinkCostMatrix",
    "LinkSpec",
    "MqttSettings",
    "ReplicatorSpec",
    "SessionLimits",
    "Topology",
    "UnitPath",
    "broker_order_key",
    "parse_duration",
    "parse_yaml",
    "link_key",
    "unit_name",
]
