"""The broker state machine: a thin composition of the protocol's parts, with no I/O.

Theory of operation
-------------------
``BrokerCore`` is fed inputs by a driver (the trio runtime or the simulator) — a peer's or a
client's message, a link going up or down, a timer, the log's commit — and returns the outputs
the driver must perform, in order (ges.core.outputs): ``ToPeer`` a message to a neighbouring
broker, ``ToClient`` a message to a client, ``DropPeer`` a link to drop, ``Notice`` a line for
the log. The router answers ``(peer, msg)`` pairs; ``to_peers`` makes them ``ToPeer`` outputs
for the links that are up. It never reads a clock (``now`` comes in), never does I/O, never
draws random numbers.

The work is done by parts, each named after what it owns (ges.core.part):

* ``links`` — the handshake and connection information (seed 004 §2.2, ges.core.links);
* ``subscriptions`` — clients, their subscriptions entered in slices, local delivery;
* ``gates`` — where each subscription's delivery starts on each stream (seed 000 §3–5);
* ``publishing`` — the pubend: ticks, the log, acknowledgements, silence (seed 002 §2);
* ``forwarding`` — flooding, or best-effort content routes (seed 004 §3.3);
* ``subends`` — routing with claims into subends that deliver in order (seed 002 §2);
* ``release`` and ``repair`` — log release rounds (seed 002 §1) and nacks (§2.3), with
  reliable delivery only.

The mode is chosen once, at construction: ``routing="flood"`` (the baseline the benchmarks
compare against), content routing with best effort, or reliable delivery (content routing with
the log, claims and subends). It picks the table that says which part handles each message from
a peer (module level, as h11 keeps its transitions as data); a message the mode has no use for
is a protocol error for that peer. Every bound and period is in one :class:`BrokerConfig`.
"""

from __future__ import annotations

from ges.core.config import BrokerConfig
from ges.core.failure import FailureDetector
from ges.core.forwarding import Forwarding
from ges.core.gates import Gates
from ges.core.links import Links
from ges.core.outputs import DropPeer, Notice, Output, ProtocolError, ToClient, ToPeer, hop
from ges.core.provenance import Provenance
from ges.core.publishing import Publishing
from ges.core.release import ReleaseRounds
from ges.core.repair import NackRepair
from ges.core.replicator import Replicator
from ges.core.retaining import RETAINED_CONN
from ges.core.subends import Subends
from ges.core.subscriptions import Subscriptions
from ges.core.unicast import Unicast
from ges.core.watch import Watching
from ges.durable.store import SessionStore
from ges.reliable.claims import Claims
from ges.reliable.log import MemoryLog, PubendLog
from ges.reliable.vt import VirtualTime
from ges.routing import ContentRouter, Hierarchy
from ges.routing.table import MAX_RESENDS
from ges.topology import Topology
from ges.wire import messages as m

ROUTINGS = ("content", "flood")
#: A client's changes of what it subscribes to: handled once its publishes sent before them
#: are matched (the log's commit and hand-on), so that none matches a subscription it made
#: after it (:meth:`BrokerCore.waits_for_publishes`).
AFTER_PUBLISHES = frozenset({m.Subscribe, m.Unsubscribe, m.SessionOpen})


class BrokerCore:
    """One broker's protocol state. See the module docstring for the contract."""

    def __init__(
        self,
        topology: Topology,
        broker_id: str,
        *,
        incarnation: int,
        routing: str = "content",
        hierarchy: Hierarchy | None = None,
        reliable: bool = False,
        log: PubendLog | None = None,
        config: BrokerConfig | None = None,
        sessions: SessionStore | None = None,
    ):
        if broker_id not in topology.brokers:
            raise ValueError(f"unknown broker {broker_id!r}")
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r} (use one of {', '.join(ROUTINGS)})")
        self.topology = topology
        self.id = broker_id
        self.incarnation = incarnation
        self.config = config = config or BrokerConfig()
        if reliable and routing != "content":
            raise ValueError("reliable delivery needs content routing")
        self.reliable = reliable
        #: the pubend's log (reliable delivery): only logged events are published
        if reliable and log is None:
            log = MemoryLog(incarnation)
        self.log = log if reliable else None
        self.pubend = f"{broker_id}~{incarnation if self.log is None else self.log.epoch}"
        #: VT vectors (seed 000): the leaf clocks heard of (this pubend's V_m), other pubends'
        #: vectors, what each link has had
        self.vt = VirtualTime(
            broker_id,
            self.pubend,
            frozenset(topology.brokers),
            None if self.log is None else self.log.clocks,
        )
        self.links_up: set[str] = set()
        #: the handshake, and connection information (seed 004 §2.2)
        self.links = Links(topology, broker_id, incarnation, self.links_up)
        self.neighbours = self.links.neighbours
        self.unit = self.links.unit
        self.graph = self.links.graph
        self.detector = FailureDetector(
            interval=config.heartbeat_every, timeout=config.suspect_after
        )
        self.routing = routing
        #: content routing (None when flooding)
        #: reliable delivery: the keepers' claim chains (seed 002 §2)
        self.claims = Claims()
        #: content routing (None when flooding); with reliable delivery every route carries its
        #: claim, and an add is owed by every keeper until it acknowledges or is given up
        self.router = (
            ContentRouter(
                hierarchy or Hierarchy(topology),
                broker_id,
                incarnation,
                self.graph,
                claims=self.claims if reliable else None,
                wait_for_all=reliable,
            )
            if routing == "content"
            else None
        )
        #: messages for one broker, passed hop by hop (nacks, answers, acks, profile wants)
        self.unicast = Unicast(topology, self.router, self.links_up)
        #: work units per slice (the simulator makes it tiny to interleave more)
        self.work_slice = config.work_slice
        self.counters = dict.fromkeys(
            (
                "events_in",
                "events_out",
                "published",
                "delivered",
                "duplicates",
                "frames_in",
                "frames_out",
                "event_frames",
                "hop_limit",
                "nacks_sent",
                "nacks_answered",
                "nacks_answered_from_cache",
                "nack_answers_shared",
                "recovered",
                "lost",
                "silences",
                "duplicates_published",
            ),
            0,
        )
        #: only a pubend's own broker originates its ticks (ges.core.provenance)
        self.provenance = Provenance(
            topology,
            broker_id,
            self.counters,
            None if self.router is None else self.router.h.kept_by,
        )
        #: the parts (ges.core.part), each named after what it owns
        self.forwarding = Forwarding(self)
        self.subscriptions = Subscriptions(self)
        self.gates = Gates(self)
        self.publishing = Publishing(self)
        self.subends = Subends(self)
        #: a replicator's durable sessions (reliable delivery; None: no replicator here)
        self.replicator = Replicator(self, sessions) if sessions is not None and reliable else None
        #: reliable delivery: log release rounds (seed 002 §1) and nack repair (§2.3)
        self.release: ReleaseRounds | None = None
        self.repair: NackRepair | None = None
        if self.log is not None:
            others = frozenset(topology.brokers) - {broker_id}
            self.release = ReleaseRounds(
                broker_id, self.pubend, self.log, others, self.unicast, config, self.gates.needed
            )
            self.repair = NackRepair(
                broker_id,
                self.pubend,
                topology,
                self.log,
                self.claims,
                self.unicast,
                self.counters,
                self.subends.on_recovered_here,
                lambda msg, now: (
                    [] if self.replicator is None else self.replicator.replayed(msg, now)
                ),
            )
            self.release.routed = lambda: self.publishing.routed
            if self.replicator is not None:  # its own log keeps what its sessions have not
                self.release.pinned = self.replicator.floor
        for part in (
            self.forwarding,
            self.subscriptions,
            self.gates,
            self.publishing,
            self.subends,
            *([self.replicator] if self.replicator is not None else []),
        ):
            part.bind()
        #: what each message from a peer is handled by: chosen here, once, by the mode
        self._from_peer = (
            FROM_PEER_FLOODING
            if self.router is None
            else FROM_PEER_RELIABLE
            if reliable
            else FROM_PEER_BEST_EFFORT
        )
        #: Set by the driver (the process hosting this broker) for ``Stats``.
        self.pid = 0
        #: clients watching the network here, and the roots this broker reports to
        self.watching = Watching(self)

    # -- links ----------------------------------------------------------------------------------

    def hello(self, hello: m.Hello) -> m.Welcome | m.Refuse:
        """Decide whether to accept a connection from its first frame (ges.core.links)."""
        return self.links.hello(hello)

    def link_up(self, peer: str, now: float) -> list[Output]:
        self.links_up.add(peer)
        self.detector.up(peer, now)
        out, notices = self.links.up(peer)
        if self.reliable and self.vt.table:  # and every clock (it may have missed a flood)
            out.append(ToPeer(peer, m.Clocks(self.vt.entries())))
        out += self.watching.leases_for(peer, now)
        return out + notices + self._routes_changed((self.id, peer), now, downs=False)

    def link_down(self, peer: str, now: float) -> list[Output]:
        was_up = peer in self.links_up
        self.links_up.discard(peer)
        self.detector.down(peer)
        self.forwarding.link_down(peer)
        self.vt.link_down(peer)
        if not was_up:
            return []
        return self.links.down(peer) + self._routes_changed((), now)

    def peer_message(self, peer: str, msg, now: float) -> list[Output]:
        self.detector.heard(peer, now)
        handle = self._from_peer.get(type(msg))
        if handle is None:
            raise ProtocolError(f"unexpected {type(msg).__name__} from broker {peer}")
        return handle(self, peer, msg, now)

    def on_handover(self, msg, now: float) -> list:
        """A step of a durable session's hand-over between replicators (ges.core.handover):
        handled here if it is for this broker, else passed on a hop."""
        self.unicast.check(msg.to, msg.detour)
        self.unicast.check(msg.source, [])
        if msg.to != self.id:
            return self.unicast.relay(msg.to, msg.detour, msg.hops, lambda h, d: hop(msg, h, d))
        if self.replicator is None:
            return []  # not a replicator (any more): the sender gives up in time
        if type(msg) is m.Handover:
            return self.replicator.on_handover(msg, now)
        return self.replicator.on_note(msg, now)

    def _on_bye(self, peer: str, msg: m.Bye, now: float) -> list:
        self.links.stopped.add(peer)  # the link goes down next: a planned stop, not a failure
        return []

    def _on_profile_message(self, peer: str, msg, now: float) -> list:
        try:
            if type(msg) is m.Profiles:
                sends = self.router.on_profiles(msg)
            else:
                sends = self.router.on_ack(msg)
        except ValueError as exc:
            raise ProtocolError(f"bad profile message from {peer}: {exc}") from None
        return self.to_peers(sends) + self.subscriptions.release_waits(now)

    def _on_vector(self, peer: str, msg: m.Vector, now: float) -> list:
        if len(msg.clocks) > len(self.topology.brokers):
            raise ValueError("a vector longer than the broker list")
        self.vt.learn(msg)
        return []

    def _on_connectivity(self, peer: str, msg: m.Connectivity, now: float) -> list:
        out, notices, up_ends, downs = self.links.on_connectivity(peer, msg.reports)
        out += notices
        if up_ends or downs:
            out += self._routes_changed(up_ends, now, downs=downs)
        return out

    def _routes_changed(self, up_ends, now: float, *, downs: bool = True) -> list:
        """Connectivity changed: the router re-syncs keepers whose route changed."""
        if self.router is None:
            return []
        out = self.to_peers(self.router.connectivity_changed(up_ends, now, downs=downs))
        return out + self.subscriptions.release_waits(float("-inf"))

    def to_peers(self, sends: list) -> list[Output]:
        """The router's ``(peer, msg)`` sends as outputs, for the links that are up."""
        up = self.links_up
        return [ToPeer(peer, msg) for peer, msg in sends if peer in up]

    # -- clients (ges.core.subscriptions, ges.core.publishing) ---------------------------------

    def client_open(self, conn: int, client_id: str) -> None:
        self.subscriptions.client_open(conn, client_id)

    def client_closed(self, conn: int, now: float) -> list[Output]:
        """A client connection ended: its subscriptions go (a job, see :meth:`work`); durable
        sessions it followed stay."""
        out = [] if self.replicator is None else self.replicator.follower_closed(conn, now)
        self.watching.unwatch(conn)
        self.publishing.forget(conn)
        return out + self.subscriptions.client_closed(conn, now)

    def client_name(self, conn: int) -> str:
        """The id a connected client gave (its connection number if it has gone)."""
        return self.subscriptions.client_name(conn)

    def connected(self, conn: int) -> bool:
        """Client ``conn`` is open here."""
        return conn in self.subscriptions.clients

    def subscribed(self, conn: int, sub_id: int) -> bool:
        """Client ``conn`` holds subscription ``sub_id`` here."""
        return sub_id in self.subscriptions.clients.get(conn, {})

    def on_logged(self, now: float) -> list[Output]:
        """The log committed more: acknowledge and send on the publishes it now holds (a
        slice now, the rest as the core's own job: :attr:`has_work`)."""
        return self.publishing.on_logged(now)

    @property
    def logged_pending(self) -> bool:
        """The log committed publishes not yet handed on (the driver reads no more publishes
        meanwhile: their hand-on is the broker's backlog)."""
        return self.publishing.logged_pending

    @property
    def profiles(self):
        """Every local subscription's profile (the profile graph, seed 004 §3.1)."""
        return self.subscriptions.profiles

    # -- large requests in slices (ges.core.work) -------------------------------------------

    @property
    def has_work(self) -> bool:
        """A job or a removal's steps are in progress: the driver calls :meth:`work`."""
        return self.subscriptions.has_work

    def publishes_unsent(self, conn: int) -> bool:
        """Client ``conn``'s publishes wait for the log or their hand-on: its next change of
        subscriptions waits for them (ges.core.publishing)."""
        return self.publishing.publishes_unsent(conn)

    def waits_for_publishes(self, conn: int, msg) -> bool:
        """Client ``conn``'s ``msg`` changes what it subscribes to while publishes it sent
        before are not yet matched: the driver holds it (and what the client sends after it)
        until :meth:`publishes_unsent` is false, or an event published before a Subscribe
        could match it (reliable delivery matches once the log commits an event)."""
        return type(msg) in AFTER_PUBLISHES and self.publishing.publishes_unsent(conn)

    def busy(self, conn: int) -> bool:
        """A request of client ``conn`` is still in progress: its next message must wait."""
        return self.subscriptions.busy(conn)

    def changing(self, conn: int, sub_id: int) -> bool:
        """Subscription ``(conn, sub_id)`` is being changed and its new profile is going in."""
        return self.subscriptions.changing(conn, sub_id)

    @property
    def work_kept(self) -> bool:
        """The last slice of :meth:`work` made objects that stay alive (the driver may take
        them out of the garbage collector's full passes)."""
        return self.subscriptions.work_kept

    @property
    def kept(self) -> int:
        """Changes so far that keep objects alive outside the core's jobs — the retained
        messages its replicator took — where :attr:`work_kept` tells of a job's slice."""
        replicator = self.replicator
        return 0 if replicator is None else replicator.retained.kept

    def work(self, now: float) -> list[Output]:
        """One slice (``config.work_slice`` units) of what is in progress; the outputs."""
        return self.subscriptions.work(now)

    def work_of(self, conn: int, now: float) -> list[Output]:
        """One slice of client ``conn``'s request in progress, and nothing else."""
        return self.subscriptions.work_of(conn, now)

    def client_publishes(self, conn: int, msgs: list[m.Publish], now: float) -> list[Output]:
        """Consecutive Publish messages one read brought from a client, handled together
        (natural batching: ges.core.publishing's ``on_publishes``)."""
        return self.publishing.on_publishes(conn, msgs, now)

    def client_message(self, conn: int, msg, now: float) -> list[Output]:
        """A client's message. One that starts a large request leaves the client busy
        (:meth:`busy`): the driver holds its next message back until :meth:`work` is done."""
        kind = type(msg)
        if kind is m.Publish:
            return self.publishing.on_publish(conn, msg, now)
        self.subscriptions.now = now  # a job's first slice runs now, later ones at work()'s
        if (kind is m.Subscribe or kind is m.Unsubscribe) and self.subscriptions.busy(conn):
            raise ProtocolError(f"client {conn}: a request while its previous one is in progress")
        if kind is m.Subscribe:
            return self.subscriptions.on_subscribe(conn, msg, now)
        if kind is m.Unsubscribe:
            return self.subscriptions.on_unsubscribe(conn, msg, now)
        if kind is m.StatsRequest:
            return [ToClient(conn, self.stats())]
        if kind is m.Heartbeat:  # a keepalive: the client is there
            return []
        if kind is m.Watch:
            return self.watching.watch(conn, msg, now)
        if self.replicator is not None and kind in _SESSION_REQUESTS:
            # a client of this replicator's sessions, met here (the trio runtime passes a
            # client's session requests through ges.runtime.sessions first, for its name's
            # lookup and its owner; the simulator's durable clients come straight here)
            return _SESSION_REQUESTS[kind](self.replicator, conn, msg, now)
        raise ProtocolError(f"unexpected {kind.__name__} from a client")

    # -- reliable delivery's rounds ---------------------------------------------------------------

    def _reliable_timer(self, now: float) -> list:
        return (
            self.release.on_timer(now)
            + self.publishing.silence_round(now)
            + self.subends.nack_round(now)
        )

    def _reliable_deadline(self) -> float:
        return min(
            self.publishing.silence_deadline(),
            self.release.next_deadline(),
            self.subends.nack_deadline(),
        )

    # -- time -------------------------------------------------------------------------------------

    def on_timer(self, now: float) -> list[Output]:
        owed, suspected = self.detector.poll(now)
        out: list[Output] = [ToPeer(p, m.Heartbeat()) for p in owed if p in self.links_up]
        for p in suspected:
            out.append(DropPeer(p, f"no frame from {p} for {self.detector.timeout:.1f}s"))
            out += self.link_down(p, now)
        if self.router is not None:
            sends, given_up = self.router.on_timer(now)
            out += self.to_peers(sends)
            for keeper in given_up:
                text = (
                    f"keeper {keeper} has not acknowledged this broker's profile through "
                    f"{MAX_RESENDS} resends: subscriptions waiting for it start without it "
                    "(incomplete); it is sent the profile again until it acknowledges"
                )
                out.append(Notice("warning", text))
        if self.reliable:
            out += self._reliable_timer(now)
        if self.replicator is not None:
            out += self.replicator.on_timer(now)
        out += self.watching.on_timer(now)
        return out + self.subscriptions.release_waits(now)

    def next_deadline(self) -> float:
        deadline = self.detector.next_deadline()
        deadlines = [w.deadline for w in self.subscriptions.waits if w.deadline is not None]
        if deadlines:
            deadline = min(deadline, min(deadlines))
        if self.router is not None:
            deadline = min(deadline, self.router.next_deadline())
        if self.reliable:
            deadline = min(deadline, self._reliable_deadline())
        if self.replicator is not None:
            deadline = min(deadline, self.replicator.next_deadline())
        return min(deadline, self.watching.next_deadline())

    def note_sent(self, peer: str, now: float) -> None:
        """The driver wrote a frame to ``peer``: no heartbeat is owed for a while."""
        self.detector.sent(peer, now)

    # -- introspection ----------------------------------------------------------------------------

    def stats(self) -> m.Stats:
        c = self.counters
        return m.Stats(
            broker=self.id,
            incarnation=str(self.incarnation),
            clients=sum(1 for conn in self.subscriptions.clients if conn >= 0),
            # a replicator's own subscription to retained events is no one's (its sessions'
            # are their clients')
            subscriptions=self.subscriptions.count
            - len(self.subscriptions.clients.get(RETAINED_CONN, ())),
            links_up=sorted(self.links_up),
            links_expected=len(self.neighbours),
            events_in=c["events_in"],
            events_out=c["events_out"],
            frames_in=c["frames_in"],
            frames_out=c["frames_out"],
            published=c["published"],
            delivered=c["delivered"],
            duplicates=c["duplicates"],
            pid=self.pid,
            profile_entries=0 if self.router is None else self.router.entries,
            event_frames=c["event_frames"],
            log_held=0 if self.log is None else self.log.committed - self.log.released(),
            log_released=0 if self.log is None else self.log.released(),
            log_epochs=0 if self.log is None else len(self.log.earlier),
            forged=c["forged"],
            sessions=0 if self.replicator is None else len(self.replicator.sessions),
            nacks_sent=c["nacks_sent"],
            nacks_answered=c["nacks_answered"],
            recovered=c["recovered"],
            lost=c["lost"],
            session_events=0 if self.replicator is None else self.replicator.held_total,
            session_epoch=0 if self.replicator is None else self.replicator.store.last,
        )


#: A client's durable-session requests a replicator answers itself.
_SESSION_REQUESTS = {
    m.SessionOpen: lambda r, conn, msg, now: r.open(conn, msg, now, now),
    m.SessionAck: lambda r, conn, msg, now: r.ack(conn, msg),
    m.SessionQos2: lambda r, conn, msg, now: r.qos2(conn, msg),
    m.SessionControl: lambda r, conn, msg, now: r.control(conn, msg, "", True, now),
    m.SessionLeave: lambda r, conn, msg, now: r.leave(conn, msg, now),
    m.RetainedAsk: lambda r, conn, msg, now: r.retained_ask(conn, msg),
}


# -- what a peer's message is handled by, per mode (the mode picks one table at construction) --
#
# Each handler is ``(core, peer, msg, now) -> outputs``. Tables are data, as h11 keeps its
# transitions: a message a mode has no use for is a protocol error for that peer.

#: Messages every broker handles.
_LINKS = {
    m.Heartbeat: lambda core, peer, msg, now: [],
    m.Bye: BrokerCore._on_bye,
    m.Connectivity: BrokerCore._on_connectivity,
}
#: Reliable delivery's messages (silence, nacks and answers, log release, VT vectors).
_RELIABLE_ONLY = (
    m.Silence,
    m.Nack,
    m.Recovered,
    m.AckAsk,
    m.Ack,
    m.Clocks,
    m.Vector,
    m.ProfileWant,
    m.Handover,
    m.HandoverNote,
)


def _refused(reason: str):
    """A handler for a message this broker's mode has no use for: ``reason`` (with ``{peer}``
    and ``{kind}``) as a protocol error."""

    def refuse(core, peer: str, msg, now: float) -> list:
        raise ProtocolError(reason.format(peer=peer, kind=type(msg).__name__))

    return refuse


def _checked_values(handle):
    """``handle`` with a ValueError it raises turned into a protocol error naming the peer."""

    def checked(core, peer: str, msg, now: float) -> list:
        try:
            return handle(core, peer, msg, now)
        except ValueError as exc:
            raise ProtocolError(f"bad {type(msg).__name__} from {peer}: {exc}") from None

    return checked


def _proven(handle, refusal):
    """``handle`` for frames that pass ``refusal(provenance, peer, msg)``; one that does not
    is dropped, counted and noticed (ges.core.provenance)."""

    def proven(core, peer: str, msg, now: float) -> list:
        why = refusal(core.provenance, peer, msg)
        if why is not None:
            return core.provenance.dropped(peer, msg, why)
        return handle(core, peer, msg, now)

    return proven


def _flooded_refusal(p: Provenance, peer: str, msg) -> str | None:
    return p.events_refusal(peer, msg.pubend, msg.items, routed=False)


def _routed_refusal(p: Provenance, peer: str, msg) -> str | None:
    return p.events_refusal(peer, msg.pubend, msg.items, routed=True)


def _silence_refusal(p: Provenance, peer: str, msg) -> str | None:
    return p.origin_refusal(peer, p.owner(msg.pubend), msg.hops)


def _answer_refusal(p: Provenance, peer: str, msg) -> str | None:
    return p.answer_refusal(peer, msg)


_BEST_EFFORT_REFUSES = dict.fromkeys(
    _RELIABLE_ONLY, _refused("{kind} from {peer}, but delivery is best effort")
)
#: Watching the network through one broker (ges.core.watch): needs content routing's relays.
_WATCHING = {
    m.WatchLease: lambda core, peer, msg, now: core.watching.on_lease(peer, msg, now),
    m.Report: lambda core, peer, msg, now: core.watching.on_report(msg, now),
}
FROM_PEER_FLOODING = {
    **_LINKS,
    **_BEST_EFFORT_REFUSES,
    m.WatchLease: _refused("{kind} from {peer}, but this broker floods"),
    m.Report: _refused("{kind} from {peer}, but this broker floods"),
    m.Events: _proven(
        lambda core, peer, msg, now: core.forwarding.on_flooded(peer, msg.pubend, msg.items),
        _flooded_refusal,
    ),
    m.Profiles: _refused("profile message from {peer}, but this broker floods"),
    m.ProfileAck: _refused("profile message from {peer}, but this broker floods"),
}
FROM_PEER_BEST_EFFORT = {
    **_LINKS,
    **_WATCHING,
    **_BEST_EFFORT_REFUSES,
    m.Events: _proven(
        lambda core, peer, msg, now: core.forwarding.on_routed(peer, msg.pubend, msg.items),
        _routed_refusal,
    ),
    m.Profiles: BrokerCore._on_profile_message,
    m.ProfileAck: BrokerCore._on_profile_message,
}
FROM_PEER_RELIABLE = {
    **_LINKS,
    **_WATCHING,
    m.Events: _proven(
        lambda core, peer, msg, now: core.subends.on_reliable_events(
            peer, msg.pubend, msg.items, now, msg.vm
        ),
        _routed_refusal,
    ),
    m.Profiles: BrokerCore._on_profile_message,
    m.ProfileAck: BrokerCore._on_profile_message,
    m.Silence: _proven(
        lambda core, peer, msg, now: core.subends.on_silence(peer, msg, now), _silence_refusal
    ),
    m.Nack: lambda core, peer, msg, now: core.repair.on_nack(msg, now),
    m.Recovered: _proven(
        lambda core, peer, msg, now: core.repair.on_recovered(msg, now), _answer_refusal
    ),
    m.AckAsk: lambda core, peer, msg, now: core.release.on_ack_ask(peer, msg, now),
    m.Ack: lambda core, peer, msg, now: core.release.on_ack(msg),
    m.Clocks: _checked_values(
        lambda core, peer, msg, now: core.subends.on_clocks(peer, msg.clocks)
    ),
    m.Vector: _checked_values(BrokerCore._on_vector),
    m.ProfileWant: _checked_values(
        lambda core, peer, msg, now: core.to_peers(core.router.on_want(msg, now))
    ),
    m.Handover: lambda core, peer, msg, now: core.on_handover(msg, now),
    m.HandoverNote: lambda core, peer, msg, now: core.on_handover(msg, now),
}
