"""The topology model: brokers in a hierarchy of units, the links between them, replicators.

Seed 004 §2 ("the organization of the broker network") defines the hierarchy this module encodes:
brokers (level 0) form clusters (level 1), clusters form super-clusters (level 2), and so on, with
at most ``block_limit`` members in any unit. A broker's *unit path* names its units from the top
level down, so ``SSC-A/SC-1/c1`` is broker in cluster ``c1`` of super-cluster ``SC-1`` of
super-super-cluster ``SSC-A``. Every broker has a path of the same length, the topology's *depth*.

A unit is identified by its full path (a tuple of names), so ``SSC-A/SC-1/c1`` and
``SSC-B/SC-1/c1`` are different clusters. The empty path is the whole system (level depth+1).

Everything here is a frozen value; build one with :meth:`Topology.from_yaml` or
:meth:`Topology.from_dict`, which validate, so a ``Topology`` that exists is valid.

A topology's *digest* (:attr:`Topology.digest`) is its identity as a network: a SHA-256 of its
content in a canonical form, so two files describing the same brokers, links and replicators
have the same digest whatever their name, path, comments or order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import cached_property

import attrs

from ges.topology import _loader
from ges.topology.specs import (
    DIGEST_FORMAT,
    PORT_KEYS,
    SHORT_DIGEST_CHARS,
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


@attrs.frozen
class Topology:
    """A validated broker network. Build it with :meth:`from_yaml` or :meth:`from_dict`."""

    name: str
    block_limit: int
    brokers: Mapping[str, BrokerSpec]
    links: tuple[LinkSpec, ...]
    replicators: tuple[ReplicatorSpec, ...] = ()
    link_costs: LinkCostMatrix = LinkCostMatrix()
    #: what replicators keep for a durable session nobody takes events from (``sessions:``)
    session_limits: SessionLimits = SessionLimits()
    #: what every broker's MQTT listener holds its clients to (``mqtt:``; not in the digest:
    #: brokers of one network may serve MQTT differently, as they may on other ports)
    mqtt: MqttSettings = MqttSettings()
    #: Non-fatal findings of validation, one line each (a unit not connected inside itself).
    warnings: tuple[str, ...] = attrs.field(default=(), eq=False)
    source: str = attrs.field(default="<topology>", eq=False)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, path) -> Topology:
        """Read and validate a YAML topology file; raises ``UserInputError`` with one line."""
        return _loader.load_yaml_file(path, cls)

    @classmethod
    def from_yaml_text(cls, text: str, *, source: str = "<string>") -> Topology:
        return _loader.load_yaml_text(text, cls, source=source)

    @classmethod
    def from_dict(cls, data: Mapping, *, source: str = "<dict>") -> Topology:
        """Validate a plain mapping of the YAML form (no line numbers in errors)."""
        return _loader.build(data, cls, source=source, lines=None)

    def _session_limits(self) -> dict:
        """``sessions:`` as a dict, ``expire_after`` left out at its default (never): a
        topology that does not set it reads and hashes as before it was there."""
        sessions = attrs.asdict(self.session_limits)
        if sessions["expire_after"] == float("inf"):
            del sessions["expire_after"]
        return sessions

    def to_dict(self) -> dict:
        """The YAML form of this topology; ``from_dict(t.to_dict()) == t``."""
        out: dict = {"name": self.name, "block_limit": self.block_limit, "brokers": {}}
        for b in self.brokers.values():
            out["brokers"][b.id] = {"unit": unit_name(b.unit), "host": b.host, "port": b.port}
            for name in PORT_KEYS:
                if getattr(b, name) is not None:
                    out["brokers"][b.id][name] = getattr(b, name)
        out["links"] = [
            [link.a, link.b] if link.cost is None else [link.a, link.b, {"cost": link.cost}]
            for link in self.links
        ]
        if self.replicators:
            out["replicators"] = [
                {"unit": unit_name(r.unit), "broker": r.broker} for r in self.replicators
            ]
        if self.link_costs.rows:
            out["link_costs"] = [list(row) for row in self.link_costs.rows]
        if self.session_limits != SessionLimits():
            sessions = self._session_limits()
            if sessions["handover_after"] == float("inf"):
                sessions["handover_after"] = "never"
            out["sessions"] = sessions
        if self.mqtt != MqttSettings():
            out["mqtt"] = {"max_keepalive": self.mqtt.max_keepalive}
        return out

    # -- the hierarchy (seed 004 §2) ------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Number of unit levels above the brokers (3 for SSC/SC/cluster)."""
        return len(next(iter(self.brokers.values())).unit)

    def broker(self, broker_id: str) -> BrokerSpec:
        return self.brokers[broker_id]

    def context(self, broker_id: str, level: int) -> UnitPath:
        """C(b, ℓ): the level-ℓ unit broker b belongs to (level 0 is the broker itself).

        Level 1 is b's cluster, level ``depth`` its top-level unit, level ``depth + 1`` the whole
        system (the empty path).
        """
        if not 0 <= level <= self.depth + 1:
            raise ValueError(f"level {level} outside 0..{self.depth + 1}")
        unit = self.brokers[broker_id].unit
        if level == 0:
            return (*unit, broker_id)
        return unit[: self.depth - level + 1]

    def unit_level(self, unit: UnitPath) -> int:
        """The level of a unit path: a cluster is 1, the whole system ``depth + 1``."""
        return self.depth - len(unit) + 1

    def common_level(self, a: str, b: str) -> int:
        """The level of the lowest unit containing both brokers (1 if they share a cluster)."""
        if a == b:
            return 0
        ua, ub = self.brokers[a].unit, self.brokers[b].unit
        shared = 0
        for x, y in zip(ua, ub, strict=True):
            if x != y:
                break
            shared += 1
        return self.depth - shared + 1

    def link_level(self, a: str, b: str) -> int:
        """A link whose lowest common unit is level ℓ+1 is a level-ℓ link (0: inside a cluster)."""
        return self.common_level(a, b) - 1

    @cached_property
    def neighbours(self) -> Mapping[str, tuple[str, ...]]:
        adj: dict[str, list[str]] = {b: [] for b in self.brokers}
        for link in self.links:
            adj[link.a].append(link.b)
            adj[link.b].append(link.a)
        return {b: tuple(sorted(ns, key=broker_order_key)) for b, ns in adj.items()}

    @cached_property
    def link_index(self) -> Mapping[tuple[str, str], LinkSpec]:
        return {link.key: link for link in self.links}

    def link_between(self, a: str, b: str) -> LinkSpec | None:
        return self.link_index.get(link_key(a, b))

    # -- identity -------------------------------------------------------------------------------

    @cached_property
    def digest(self) -> str:
        """The network's identity: SHA-256 (64 hex digits) of its content in canonical form.

        Hashed: ``block_limit``; every broker's id, unit path, host and port; every link as its
        canonical (lower, higher) pair with its cost override; the link cost matrix's entries
        that differ from the default; every replicator's unit and broker — each list sorted.
        Not hashed: the name, the file it came from, warnings, and the order or spelling of the
        YAML (key order, comments, the order of brokers, links, link ends and replicators).
        """
        content = {
            "format": DIGEST_FORMAT,
            "block_limit": self.block_limit,
            "brokers": sorted([b.id, list(b.unit), b.host, b.port] for b in self.brokers.values()),
            "links": sorted(
                [*link_key(link.a, link.b), None if link.cost is None else float(link.cost)]
                for link in self.links
            ),
            "link_costs": [list(entry) for entry in self.link_costs.overrides()],
            "replicators": sorted([list(r.unit), r.broker] for r in self.replicators),
        }
        if self.session_limits != SessionLimits():  # the same digest as before without it
            content["sessions"] = self._session_limits()
        text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def short_digest(self) -> str:
        """The first 16 hex digits of :attr:`digest`, for tables and log lines."""
        return self.digest[:SHORT_DIGEST_CHARS]

    @cached_property
    def units(self) -> Mapping[UnitPath, tuple[str, ...]]:
        """Every unit (levels 1..depth+1) and the ids of the brokers inside it."""
        inside: dict[UnitPath, list[str]] = {}
        for b in sorted(self.brokers, key=broker_order_key):
            path = self.brokers[b].unit
            for n in range(len(path) + 1):
                inside.setdefault(path[:n], []).append(b)
        return {u: tuple(bs) for u, bs in inside.items()}

    def members(self, unit: UnitPath) -> tuple:
        """The direct members of a unit: broker ids for a cluster, child unit paths otherwise."""
        if self.unit_level(unit) == 1:
            return self.units[unit]
        children = {self.brokers[b].unit[: len(unit) + 1] for b in self.units[unit]}
        return tuple(sorted(children))

    def gateways(self, level: int | None = None) -> tuple[LinkSpec, ...]:
        """Links of level ≥ 1 (between units), or of exactly ``level``."""
        return tuple(
            link
            for link in self.links
            if (lv := self.link_level(link.a, link.b)) >= 1 and (level is None or lv == level)
        )

    def gatekeepers(self, level: int) -> tuple[str, ...]:
        """Brokers at either end of a level-``level`` gateway: the level-ℓ gatekeepers."""
        found = {end for link in self.gateways(level) for end in (link.a, link.b)}
        return tuple(sorted(found, key=broker_order_key))

    def gatekeeper_levels(self, broker_id: str) -> tuple[int, ...]:
        """The gateway levels at which a broker is a gatekeeper (empty for an inner broker)."""
        levels = {self.link_level(broker_id, n) for n in self.neighbours[broker_id]}
        return tuple(sorted(lv for lv in levels if lv >= 1))

    def unit_gatekeepers(self, unit: UnitPath) -> tuple[str, ...]:
        """Brokers in ``unit`` with a link leaving it: the unit's gatekeepers."""
        inside = set(self.units[unit])
        found = {b for b in inside for n in self.neighbours[b] if n not in inside}
        return tuple(sorted(found, key=broker_order_key))

    def replicators_in(self, unit: UnitPath) -> tuple[ReplicatorSpec, ...]:
        return tuple(r for r in self.replicators if r.unit == unit)
