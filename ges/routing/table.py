"""Content routing at one broker: profile propagation and event destinations (seed 004 §3).

Theory of operation
-------------------
A :class:`ContentRouter` is the routing half of a broker core. It does no I/O and reads no clock;
its methods take messages and return ``(peer, message)`` pairs for the core to send. It is a
thin composition of four parts (``ges.routing.base``): the origin side (``origin``), the keeper
side (``keeper``), paths and detours (``paths``) and event routing (``events``).

**Profiles** (seed 004 §3.2). The broker's local subscriptions enter an :class:`Exporter`, which
keeps the aggregated (covering-reduced) set of conjunctions the rest of the system must know.
Each export or retraction is a :class:`~ges.wire.messages.ProfileChange` with a unique id
``(origin, incarnation, seq)``. It goes to the keepers of the broker's cluster
(:mod:`ges.routing.hierarchy` says who keeps what); every keeper that applies a change it had not
seen passes it on to the keepers of the next unit up (``Hierarchy.next_targets``), so a
level-ℓ change reaches the level-(ℓ+1) keepers, and so on to the top. A keeper holds one
:class:`ProfileGraph` per unit it keeps, whose destinations are that unit's children: brokers for
a cluster, clusters for a super-cluster, … A change that arrives twice (several keepers below
forward it) finds its id known and changes no predicate count; a removal reverses its add.
Keepers acknowledge adds to the origin, which holds a client's ``SubAck`` until every reachable
keeper has the subscription, so an event published anywhere after ``subscribe`` returns is
routed to it.

Messages carrying changes travel hop by hop along the connectivity graph and are lost when a link
drops or a keeper restarts. So the origin is the authority for its own profile: whenever the
route to one of its keepers changes, or a link of that keeper comes up (it restarted, or its
unit came back), the origin sends that keeper a *sync* — its complete live set — plus its live
adds. A sync also retires every entry of an older incarnation of the origin. Keepers acknowledge
removals too, and an origin that has waited :data:`RESEND_AFTER` seconds for a keeper's acks
(a change or an ack was lost on the way) sends that keeper a sync again, waiting twice as long
each time up to :data:`RESEND_MAX`. A keeper acknowledges every change a sync carries, so a lost
ack is repaired the same way.

**Events** (seed 004 §3.3). An event carries :class:`~ges.wire.messages.Route` values. At the
publisher they are one per enclosing unit with more than one child: "this cluster except me",
"this super-cluster except my cluster", …, "the system except my top-level unit". A broker
handling a route:

* for a broker: delivers if it is that broker, else forwards along its best hop;
* for a unit it is outside of: forwards towards the unit;
* for a unit it is inside and keeps: matches the event against that unit's snapshot and
  replaces the route by one per matching child (except ``skip``), handled the same way. A keeper
  that has not yet had a sync from every reachable broker of the unit (it has just started, or
  the unit just came back) sends the event to every child instead: flooding a sub-unit is safe,
  dropping an event a subscriber wants is not. With reliable delivery a child also gets every
  event when the event's V_m knows a newer clock of one of its brokers than this keeper's V_b
  (seed 000 §3.5; :mod:`ges.reliable.vt`);
* for a unit it is inside but does not keep: forwards the route to the nearest reachable keeper.

Every hop is the connectivity graph's hierarchical next hop, which avoids suspected nodes and
links. When a unit is split inside, the hierarchical route to its far side does not exist, and
brokers that see the unit as one node would send a message for the far side back to this side;
so a message (event route, profile change or ack) that must go round the split carries a
*detour*, the brokers where the whole view's shortest path crosses between nodes
(``ges.routing.paths.Paths._detour``). Routes are grouped by next hop, so an event crosses each link
at most once per branch, and the routes of one event name disjoint sets of brokers, so each destination broker gets the
event once even over redundant gateways — properties (a)–(c) of the issue: every matching
subscriber's broker is reached; a unit is entered only when some profile inside it matches (or
to cross it on the way to one); and no broker gets an event twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from ges.connectivity import ConnectivityGraph
from ges.routing.acks import Ticket
from ges.routing.base import (
    MAX_RESENDS,
    RESEND_AFTER,
    SYNC,
    ClaimChains,
    chunks,
)
from ges.routing.events import EventRouting
from ges.routing.hierarchy import Hierarchy
from ges.routing.keeper import KeeperSnapshots
from ges.routing.origin import OriginProfiles
from ges.routing.paths import Paths
from ges.topology import UnitPath
from ges.wire import messages as m

__all__ = ["MAX_RESENDS", "RESEND_AFTER", "SYNC", "ClaimChains", "ContentRouter", "chunks"]


class ContentRouter:
    """One broker's profile snapshots and event routing (see the module docstring)."""

    def __init__(
        self,
        hierarchy: Hierarchy,
        broker_id: str,
        incarnation: int,
        graph: ConnectivityGraph,
        *,
        claims: ClaimChains | None = None,
        wait_for_all: bool = False,
        sufficiency: bool = True,
    ):
        self.h = hierarchy
        self.id = broker_id
        self.inc = incarnation
        self.graph = graph
        self.depth = hierarchy.depth
        self.unit: UnitPath = hierarchy.topology.brokers[broker_id].unit
        self.counters = {
            "routes_dropped": 0,
            "resyncs": 0,
            "keepers_given_up": 0,
            "insufficient": 0,
        }
        self.origin = OriginProfiles(self)
        self.keeper = KeeperSnapshots(self)
        self.paths = Paths(self)
        self.events = EventRouting(self)
        for part in (self.origin, self.keeper, self.paths, self.events):
            part.bind()
        #: reliable delivery: the keepers' claim chains, and an add owed by every keeper
        self.events.claims = claims
        self.origin.wait_for_all = wait_for_all
        #: reliable delivery's sufficiency rule (seed 000 §3.5); off only to show what it prevents
        self.events.sufficiency = sufficiency
        # the hot path, without a call in between: where an event goes, and checking its routes
        self.route_event = self.events.route_event
        self.check_routes = self.paths.check_routes

    # -- what the parts hold ---------------------------------------------------------------------

    @property
    def exporter(self):
        return self.origin.exporter

    @property
    def book(self):
        return self.origin.book

    @property
    def starts(self) -> dict[int, dict[str, int]]:
        return self.origin.starts

    @property
    def kept(self):
        return self.keeper.kept

    @property
    def vb(self) -> dict[str, list[int]]:
        return self.keeper.vb

    @property
    def lagging(self) -> bool:
        """Origins were found behind an event's V_m: :meth:`take_lagging` says which to ask."""
        return bool(self.events.lagging)

    def take_lagging(self, now: float) -> list[str]:
        return self.events.take_lagging(now)

    @property
    def initial_routes(self) -> tuple[m.Route, ...]:
        return self.events.initial_routes

    @property
    def claims(self) -> ClaimChains | None:
        return self.events.claims

    @property
    def sufficiency(self) -> bool:
        return self.events.sufficiency

    @sufficiency.setter
    def sufficiency(self, on: bool) -> None:
        self.events.sufficiency = on

    @property
    def wait_for_all(self) -> bool:
        return self.origin.wait_for_all

    @property
    def pending(self) -> dict[int, set[str]]:
        return self.origin.pending

    @property
    def waived(self) -> dict[int, set[str]]:
        return self.origin.waived

    @property
    def entries(self) -> int:
        return self.keeper.entries

    @property
    def busy(self) -> bool:
        return self.origin.busy

    def is_empty(self) -> bool:
        return self.keeper.is_empty()

    # -- the origin side ---------------------------------------------------------------------------

    def local_change(self, add, remove, now: float) -> tuple[list, frozenset[int]]:
        return self.origin.local_change(add, remove, now)

    def background(self, now: float, budget: int) -> list:
        return self.origin.background(now, budget)

    def waited(self, seqs: Iterable[int]) -> set[int]:
        return self.origin.waited(seqs)

    def ticket(self, seqs: Iterable[int]) -> Ticket:
        return self.origin.ticket(seqs)

    def acked(self, seqs: Iterable[int]) -> bool:
        return self.origin.acked(seqs)

    def clock(self) -> tuple[int, int]:
        return self.origin.clock()

    def on_ack(self, msg: m.ProfileAck) -> list:
        return self.origin.on_ack(msg)

    def on_want(self, msg: m.ProfileWant, now: float) -> list:
        return self.origin.on_want(msg, now)

    def connectivity_changed(self, up_ends, now: float, *, downs: bool = True) -> list:
        return self.origin.connectivity_changed(up_ends, now, downs=downs)

    def on_timer(self, now: float) -> tuple[list, list[str]]:
        """Resends due: the ``(peer, message)`` sends, and the keepers given up now."""
        return self.origin.on_timer(now)

    def next_deadline(self) -> float:
        return self.origin.next_deadline()

    # -- the keeper side ---------------------------------------------------------------------------

    def on_profiles(self, msg: m.Profiles) -> list:
        return self.keeper.on_profiles(msg)

    def own_units(self):
        return self.keeper.own_units()

    # -- paths and events --------------------------------------------------------------------------

    def steps(self, to, detour, hops: int):
        return self.paths.steps(to, detour, hops)

    def relay_step(self, to: str, detour, hops: int):
        return self.paths.relay_step(to, detour, hops)

    def check_detour(self, detour) -> None:
        self.paths.check_detour(detour)
