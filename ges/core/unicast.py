"""Messages for one broker, passed hop by hop along the routes (nacks, answers, acks, wants).

Theory of operation
-------------------
Reliable delivery's control messages (seed 002 §2: nacks travel upstream towards the pubend,
answers back to the nacker; §1: acknowledgements towards the pubend) go to one broker, not
along event routes. Each broker passes one on a hop: the next hop of its shortest path towards
the target in its connectivity graph, or along the ``detour`` the message carries when the
sender had to route round a lost link (``ContentRouter.relay_step``). A message whose next hop
is not up is dropped: the sender asks again (a nack comes due again, an ask round repeats).
A target or detour a peer names is checked against the topology first: a bad one is a
:class:`ProtocolError` for that peer.
"""

from __future__ import annotations

from collections.abc import Callable

from ges.core.outputs import ProtocolError, ToPeer
from ges.topology import Topology


class Unicast:
    """Relaying to one broker, for every part that sends such messages."""

    def __init__(self, topology: Topology, router, links_up: set[str]):
        self.topology = topology
        self.router = router
        #: the core's live set of up links
        self.links_up = links_up

    def relay(self, to: str, detour, hops: int, make: Callable[[int, list], object]) -> list:
        """``make(hops + 1, detour)`` for the next hop towards ``to`` (nothing if it is down)."""
        step = self.router.relay_step(to, detour, hops)
        if step is None or step[0] not in self.links_up:
            return []
        hop, detour = step
        return [ToPeer(hop, make(hops + 1, list(detour)))]

    def check(self, broker: str, detour) -> None:
        """A peer's target broker and detour are known ones, or a ProtocolError."""
        if broker not in self.topology.brokers:
            raise ProtocolError(f"unknown broker {broker!r}")
        if detour:
            try:
                self.router.check_detour(detour)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None

    def check_brokers(self, brokers) -> None:
        known = self.topology.brokers
        if len(brokers) > len(known):
            raise ProtocolError(f"{len(brokers)} brokers named, the topology has {len(known)}")
        for b in brokers:
            if b not in known:
                raise ProtocolError(f"unknown broker {b!r}")
