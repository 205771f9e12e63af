"""What every part of a broker core shares: the core's fixed values, and the other parts.

Theory of operation
-------------------
:class:`ges.core.BrokerCore` is composed of parts, each owning one concept's state and
named after it (links, subscriptions, gates, publishing, subends, forwarding, release rounds,
repair). A part is constructed with the core, takes references to the values that never change
after construction (the broker's id, topology, config, log, router, counters …), and once every
part exists :meth:`Part.bind` gives it the others: a part asks another through its methods and
reads the state it exposes without a leading underscore. A part's methods return lists of the
core's outputs (``ToPeer``, ``ToClient``, ``DropPeer``, ``Notice``: ges.core.outputs), in the
order the driver is to perform them. Nothing here does I/O.
"""

from __future__ import annotations


class Part:
    """A part of a broker core (see the module docstring)."""

    def __init__(self, core):
        self.core = core
        self.id = core.id
        self.topology = core.topology
        self.config = core.config
        self.reliable = core.reliable
        self.log = core.log
        self.pubend = core.pubend
        self.vt = core.vt
        self.links_up = core.links_up
        self.router = core.router
        self.claims = core.claims
        self.counters = core.counters
        self.unicast = core.unicast
        self.work_slice = core.config.work_slice

    def bind(self) -> None:
        """The other parts (and those made after this one), once every part exists."""
        core = self.core
        self.release = core.release
        self.repair = core.repair
        self.forwarding = core.forwarding
        self.subscriptions = core.subscriptions
        self.gates = core.gates
        self.publishing = core.publishing
        self.subends = core.subends
        self.replicator = core.replicator
