"""The parts a topology is made of: unit paths, broker and link specs, link costs, and helpers.

These are the values :class:`ges.topology.model.Topology` is built from, kept apart from it so
that the YAML loader (``_loader``) can build them without importing the class that calls it.
Seed 004 §2 defines the units; ``block_limit`` is its limit of 64 members per unit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

UnitPath = tuple[str, ...]

#: Seed 004 §2: "This limit, the block-limit, is set at 64."
DEFAULT_BLOCK_LIMIT = 64
DEFAULT_HOST = "127.0.0.1"
#: Names the canonical form the digest hashes; change it whenever that form changes, so a digest
#: never means two different things.
DIGEST_FORMAT = "ges-topology-digest/1"
#: Hex digits of :attr:`Topology.short_digest`: 64 bits, plenty to tell networks apart by eye.
SHORT_DIGEST_CHARS = 16
#: A broker entry's ports besides its own (none of them in the digest: BrokerSpec).
PORT_KEYS = ("metrics_port", "mqtt_port", "mqtt_ws_port")

_NATURAL_SPLIT = re.compile(r"(\d+)")


def broker_order_key(broker_id: str) -> tuple:
    """Natural order on broker ids (``b2`` < ``b10``); the lower broker dials each link."""
    return tuple(int(part) if part.isdigit() else part for part in _NATURAL_SPLIT.split(broker_id))


def unit_name(path: UnitPath) -> str:
    """The display form of a unit path: ``SSC-A/SC-1/c1``; the whole system is ``/``."""
    return "/".join(path) if path else "/"


@attrs.frozen
class BrokerSpec:
    """One broker: its id, its unit path (top level first) and where it listens."""

    id: str
    unit: UnitPath
    host: str = DEFAULT_HOST
    port: int = 0
    #: where it serves Prometheus metrics (ges.runtime.metrics); None: nowhere. A setting of
    #: the deployment, not of the network: not in the topology's digest
    metrics_port: int | None = None
    #: where it serves MQTT clients (ges.runtime.mqtt); None: nowhere. Not in the digest either
    mqtt_port: int | None = None
    #: ... and MQTT clients over WebSocket (ges.transport.websocket); None: nowhere
    mqtt_ws_port: int | None = None

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


@attrs.frozen
class LinkSpec:
    """An undirected link between two brokers; ``a`` is the lower id, the one that dials."""

    a: str
    b: str
    cost: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.a, self.b)

    def other(self, broker_id: str) -> str:
        return self.b if broker_id == self.a else self.a


@attrs.frozen
class ReplicatorSpec:
    """Stable storage attached to a unit, hosted by one broker inside it: it keeps the durable
    sessions homed in the unit (ges.durable)."""

    unit: UnitPath
    broker: str


@attrs.frozen
class SessionLimits:
    """The topology's ``sessions:``. How long a replicator keeps events for a durable session
    nobody takes them from: at most ``max_events`` held per session, none older than
    ``max_age`` seconds (a session may ask for less or more of either); beyond, the oldest go
    and the session is told (a gap notice). How long a session whose client has gone is kept
    (``expire_after``; one with an expiry of its own, an MQTT 5.0 client's Session Expiry
    Interval, by that). And when a session follows its client to the replicator of the unit
    it is in (``handover_after``)."""

    max_events: int = 1_000_000
    max_age: float = 7 * 24 * 3600.0
    #: seconds a session's client stays in the unit of another replicator before the session
    #: is handed over to that one (ges.core.handover; inf: never)
    handover_after: float = 10.0
    #: seconds a session whose client has gone is kept before it is ended (inf: for good)
    expire_after: float = float("inf")


@attrs.frozen
class MqttSettings:
    """The topology's ``mqtt:``: what every broker's MQTT listener holds its clients to.
    ``max_keepalive``: the longest keepalive a client may ask for, in seconds (None: any, 0 —
    no keepalive — included). A 5.0 client asking for more, or for none, is told this one in
    its CONNACK (Server Keep Alive, §3.2.2.3.14) and held to it; a 3.1.1 client, which cannot
    be told, is refused (identifier rejected, as mosquitto's ``max_keepalive`` does)."""

    max_keepalive: int | None = None


@attrs.frozen
class LinkCostMatrix:
    """Seed 004 §2.2: the cost of traversing a level-ℓ link from a level-x unit.

    The cost rises with both x (a bigger unit takes more internal hops to cross) and ℓ (higher
    gateways are longer, slower links). ``rows[x][ℓ]`` overrides the default for that pair; the
    default is ``1 + x + ℓ``.
    """

    rows: tuple[tuple[float, ...], ...] = ()

    def cost(self, unit_level: int, link_level: int) -> float:
        if unit_level < len(self.rows) and link_level < len(self.rows[unit_level]):
            return self.rows[unit_level][link_level]
        return float(1 + unit_level + link_level)

    def overrides(self) -> tuple[tuple[int, int, float], ...]:
        """``(x, ℓ, cost)`` for every entry that differs from the default, in order.

        Two matrices with the same overrides price every link the same: writing a default out
        (or leaving it off) changes nothing.
        """
        return tuple(
            (x, lv, float(c))
            for x, row in enumerate(self.rows)
            for lv, c in enumerate(row)
            if float(c) != float(1 + x + lv)
        )


def link_key(a: str, b: str) -> tuple[str, str]:
    """The canonical (lower, higher) key of an undirected link."""
    return (a, b) if broker_order_key(a) <= broker_order_key(b) else (b, a)


def connected_components(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[set[str]]:
    """Connected components of an undirected graph, largest first."""
    nodes = list(nodes)
    adj: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        if a in adj and b in adj:
            adj[a].add(b)
            adj[b].add(a)
    seen: set[str] = set()
    parts: list[set[str]] = []
    for start in nodes:
        if start in seen:
            continue
        part = {start}
        stack = [start]
        while stack:
            for n in adj[stack.pop()]:
                if n not in part:
                    part.add(n)
                    stack.append(n)
        seen |= part
        parts.append(part)
    parts.sort(key=len, reverse=True)
    return parts
