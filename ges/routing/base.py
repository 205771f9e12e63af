"""What the parts of a content router share: limits, the claim chains' interface, chunking.

Theory of operation
-------------------
:class:`ges.routing.ContentRouter` is composed of four parts, each a :class:`RouterPart`: the
origin side (this broker's own profile: exports, acknowledgements, resends and syncs;
``ges.routing.origin``), the keeper side (the snapshots of the units this broker keeps, built
from the changes origins send; ``ges.routing.keeper``), paths and detours (next hops towards
brokers, units and keepers, round a split unit when needed; ``ges.routing.paths``) and event
routing (an event's routes resolved against the kept snapshots; ``ges.routing.events``). A part
takes the router's fixed values at construction and, once all exist, the other parts
(:meth:`RouterPart.bind`). Profile changes travel in messages bounded in count and weight
(:func:`chunks`), so a sync of a broker with many subscriptions is several messages.
"""

from __future__ import annotations

from typing import Protocol

from ges.matching.model import constraint_weight
from ges.routing.export import ADD
from ges.wire import messages as m


class ClaimChains(Protocol):
    """What routing needs of reliable delivery's claim chains (ges.reliable.claims.Claims, seed
    002 §2): a keeper records each route it learns and makes a claim per child from it."""

    def learn(self, pubend: str, unit: tuple, prev: int, tick: int) -> object:
        """A route for ``unit`` claiming ``(prev, tick)`` arrived: the unit's state."""

    def claim(self, st, kid: str, tick: int) -> int:
        """The claim of the route this broker makes for child ``kid`` at ``tick``."""

    def latest(self) -> list[tuple[str, int]]:
        """``(pubend, tick)``: the highest tick of each pubend routed here as a keeper."""


SYNC = 0

#: (unit, pubend) sufficiency results cached (seed 000 §5.1); beyond it the cache starts over.
MAX_SUFFICIENCY = 16_384
#: Removed change ids remembered so a late copy of their add is not applied.
MAX_TOMBSTONES = 65_536
#: Changes one ``Profiles`` message may carry, and their weight (constraints plus ``in``
#: values: what applying them costs a keeper, which does it in one go) — a sync of a broker
#: with many subscriptions is split into several messages.
MAX_CHANGES_PER_MESSAGE = 4_096
MAX_MESSAGE_WEIGHT = 512
#: Relays after which a profile message is dropped (the origin's next sync repairs it).
MAX_RELAY_HOPS = 64
#: Seconds an origin waits for a keeper's acks before sending it a sync again; the wait doubles
#: with every resend up to RESEND_MAX.
RESEND_AFTER = 1.0
RESEND_MAX = 30.0
#: Unanswered resends after which an origin stops waiting for a keeper (it may be dead behind a
#: unit this broker sees as one node); the keeper gets a sync again when a route to it changes.
MAX_RESENDS = 8
#: Replaced adds remembered for the subscriptions waiting on them (the oldest go first).
MAX_REPLACED = 4_096
#: Pubends read from one acknowledgement's ``ticks``.
MAX_TICKS_PER_ACK = 1_024
#: Brokers a detour round a split unit may name.
MAX_DETOUR = 32
#: The detour of a route whose detour could not be followed: it takes no other.
GAVE_UP = ("",)
#: ``route_event``'s ``vm`` for the empty V_m
NO_VECTOR: tuple[int, dict] = (0, {})

EntryId = tuple[str, int, int]


class RouterPart:
    """A part of a content router (see the module docstring)."""

    def __init__(self, router):
        self.router = router
        self.h = router.h
        self.id = router.id
        self.inc = router.inc
        self.graph = router.graph
        self.depth = router.depth
        self.unit = router.unit
        self.counters = router.counters

    def bind(self) -> None:
        router = self.router
        self.origin = router.origin
        self.keeper = router.keeper
        self.paths = router.paths
        self.events = router.events


def chunks(changes: list[m.ProfileChange]) -> list[list[m.ProfileChange]]:
    """``changes`` split into messages of at most MAX_CHANGES_PER_MESSAGE changes and
    MAX_MESSAGE_WEIGHT weight (one change more if a single one weighs more)."""
    out: list[list[m.ProfileChange]] = []
    chunk: list[m.ProfileChange] = []
    load = 0
    for c in changes:
        w = weight(c)
        if chunk and (load + w > MAX_MESSAGE_WEIGHT or len(chunk) >= MAX_CHANGES_PER_MESSAGE):
            out.append(chunk)
            chunk, load = [], 0
        chunk.append(c)
        load += w
    if chunk:
        out.append(chunk)
    return out


def weight(c: m.ProfileChange) -> int:
    """What applying a change costs a keeper, in the unit of a conjunction's weight (which
    bounds its bytes too: a message stays within a frame)."""
    if c.op == ADD:
        return sum(constraint_weight(k.op, k.attr, k.value) for k in c.conjunction)
    return 1 + len(c.seqs) // 64
