"""Who keeps which unit's profile snapshot: static facts read once from the topology.

Seed 004 §3.2 gives the snapshot of a level-ℓ unit to its level-ℓ gatekeepers ("a cluster gateway
snapshots the profile of all clients attached to any of the broker nodes that are a part of that
cluster") and has a level-ℓ gatekeeper compute, for an event, the level-(ℓ−1) units it must reach.
GES gives the snapshot of unit V to its *keepers*:

1. every broker of V with a link leaving V — V's gatekeepers at any level ≥ ℓ, not only level ℓ.
   An event enters V only across one of those links, so the broker it enters at can always
   compute V's destinations; with level-ℓ gatekeepers only, an event entering a cluster through a
   super-cluster gateway would first detour to a cluster gatekeeper (one extra hop on the
   ges-paper 22 → 10 path). The paper's level-ℓ gatekeepers are always among the keepers;
2. for a unit with no link leaving it — the whole system, or an isolated unit — the brokers that
   join its children (for the whole system: the top-level gatekeepers), so that someone decides
   between top-level units; the paper leaves that level without a snapshot;
3. a unit with a single child has no keepers: its only child is its only destination.

Everything here is derived from the topology file every broker loads. Which keepers are alive and
how to reach them is the connectivity graph's business (:mod:`ges.routing.table`).
"""

from __future__ import annotations

from functools import cached_property

from ges.topology import Topology, UnitPath, broker_order_key


class Hierarchy:
    """The unit tree of a topology and the keepers of each unit (see the module docstring)."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.depth = topology.depth
        units = topology.units  # every unit path, levels 1..depth+1, with its brokers
        self._inside: dict[UnitPath, frozenset[str]] = {u: frozenset(bs) for u, bs in units.items()}
        self.children: dict[UnitPath, tuple[str, ...]] = {}
        for unit in units:
            if len(unit) == self.depth:  # a cluster: its children are brokers
                self.children[unit] = tuple(sorted(units[unit], key=broker_order_key))
            else:
                names = {topology.brokers[b].unit[len(unit)] for b in units[unit]}
                self.children[unit] = tuple(sorted(names))
        self.keepers: dict[UnitPath, tuple[str, ...]] = {
            unit: self._keepers_of(unit) for unit in units
        }
        kept: dict[str, list[UnitPath]] = {b: [] for b in topology.brokers}
        for unit, keepers in self.keepers.items():
            for b in keepers:
                kept[b].append(unit)
        self._targets: dict[tuple[str, str], tuple[str, ...]] = {}
        #: the units each broker keeps, lowest first
        self.kept_by: dict[str, tuple[UnitPath, ...]] = {
            b: tuple(sorted(us, key=len, reverse=True)) for b, us in kept.items()
        }

    def _keepers_of(self, unit: UnitPath) -> tuple[str, ...]:
        if len(self.children[unit]) < 2:
            return ()
        inside = self._inside[unit]
        neighbours = self.topology.neighbours
        found = {b for b in inside if any(n not in inside for n in neighbours[b])}
        if not found:
            found = {
                b
                for b in inside
                if any(
                    n in inside and self.child_of(unit, n) != self.child_of(unit, b)
                    for n in neighbours[b]
                )
            }
        if not found:  # children with no link between them: everyone keeps it
            found = set(inside)
        return tuple(sorted(found, key=broker_order_key))

    # -- paths -----------------------------------------------------------------------------------

    def chain(self, broker_id: str) -> tuple[UnitPath, ...]:
        """The units holding a broker, its cluster first and the whole system (``()``) last."""
        unit = self.topology.brokers[broker_id].unit
        return tuple(unit[:n] for n in range(len(unit), -1, -1))

    def child_of(self, unit: UnitPath, broker_id: str) -> str:
        """The name of the child of ``unit`` holding the broker (the broker id in a cluster)."""
        if len(unit) == self.depth:
            return broker_id
        return self.topology.brokers[broker_id].unit[len(unit)]

    def contains(self, unit: UnitPath, broker_id: str) -> bool:
        return broker_id in self._inside[unit]

    @cached_property
    def valid_paths(self) -> frozenset[UnitPath]:
        """Every unit path and every broker path (cluster + id): what a route may name."""
        brokers = {(*spec.unit, b) for b, spec in self.topology.brokers.items()}
        return frozenset(self._inside) | brokers

    # -- profile propagation targets (seed 004 §3.2) ----------------------------------------------

    def keeps(self, keeper: str, origin: str) -> bool:
        """Whether ``keeper`` holds a snapshot that contains ``origin``'s profile."""
        return any(self.contains(u, origin) for u in self.kept_by[keeper])

    def next_targets(self, broker_id: str, origin: str) -> tuple[str, ...]:
        """Where ``broker_id`` sends a change from ``origin`` that it has just made or applied.

        Along ``origin``'s chain of units with keepers, the origin sends to its cluster's keepers
        and every keeper of one unit sends to the keepers of the next unit up that do not keep
        the lower one (those got the change at the lower level already): level-0 changes go to
        the cluster's keepers, a cluster keeper's changes to the super-cluster's other keepers,
        and so on (seed 004 §3.2, Figure 3). A change reaches a keeper once per keeper of the
        unit below; the change's id makes the extra copies harmless.
        """
        key = (broker_id, origin)
        hit = self._targets.get(key)
        if hit is None:
            levels = [frozenset((origin,))]
            levels += [frozenset(self.keepers[u]) for u in self.chain(origin) if self.keepers[u]]
            out: set[str] = set()
            for lower, upper in zip(levels, levels[1:], strict=False):
                if broker_id in lower:
                    out |= upper - lower
            out.discard(broker_id)
            hit = self._targets[key] = tuple(sorted(out, key=broker_order_key))
        return hit

    def all_keepers(self, origin: str) -> frozenset[str]:
        """Every broker that keeps a snapshot containing ``origin`` (acks come from these)."""
        return frozenset(k for u in self.chain(origin) for k in self.keepers[u]) - {origin}
