"""Durable sessions: where they live, what is stored for them, and their names (seed 004 §4,
seed 001 §4).

A durable session is homed at one *replicator*: the stable storage of a unit (the topology's
``replicators:``; :func:`replicators` gives the default for a topology without any). The
replicator's broker holds the session's subscriptions as its own, so content routing brings
every matching event into its unit whether or not the session's client is connected, stores
each such event once with the sessions it is for (ges.durable.store), numbered by the
replicator's *epochs*, and streams them in epoch order to wherever the client is
(ges.core.replicator).
"""

from __future__ import annotations

import re

from ges.topology import Topology, broker_order_key
from ges.topology.specs import ReplicatorSpec

#: A session's name: what ``--client`` takes (also the id its client connects with).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


def session_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a durable session (None: it can)."""
    if not NAME_PATTERN.fullmatch(name):
        return (
            f"session name {name[:64]!r} must be 1-128 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )
    return None


def replicators(topology: Topology) -> tuple[ReplicatorSpec, ...]:
    """The topology's replicators; without any, one per top-level unit (each child of the whole
    network), hosted by the unit's first broker."""
    if topology.replicators:
        return topology.replicators
    tops = sorted({spec.unit[:1] for spec in topology.brokers.values()})
    return tuple(ReplicatorSpec(unit, topology.units[unit][0]) for unit in tops)


def home_replicator(topology: Topology, broker: str) -> str:
    """The broker hosting the replicator of the smallest unit around ``broker`` that has one
    (a session opened at ``broker`` is homed there); the nearest by topology order if none."""
    reps = replicators(topology)
    unit = topology.brokers[broker].unit
    best = None
    for r in reps:
        if unit[: len(r.unit)] == r.unit and (best is None or len(r.unit) > len(best.unit)):
            best = r
    if best is not None:
        return best.broker
    return min((r.broker for r in reps), key=broker_order_key)


def replicator_brokers(topology: Topology, near: str) -> list[str]:
    """Every replicator's broker, ``near`` first, then those in the smallest unit around it."""
    found = sorted({r.broker for r in replicators(topology)}, key=broker_order_key)
    return sorted(
        found, key=lambda b: (b != near, topology.link_level(near, b) if b != near else 0)
    )
