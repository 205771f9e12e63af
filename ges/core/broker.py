"""The broker state machine: links, clients, publish, flood with duplicate suppression, deliver.

Theory of operation
-------------------
``BrokerCore`` is fed inputs by a driver (the trio runtime or the simulator) and returns the
outputs the driver must perform, as ``(kind, destination, message)`` tuples:

* ``(PEER, broker_id, message)`` — send to a neighbouring broker;
* ``(CLIENT, conn_id, message)`` — send to a connected client;
* ``(DROP_PEER, broker_id, reason)`` — close that link (the failure detector suspects it);
* ``(NOTICE, level, text)`` — a line for the operator's log, level "info" or "warning" (a
  partition that leaves units unreachable is a warning; a lost edge with a detour is info).

It never reads a clock (``now`` comes in), never does I/O, never draws random numbers.

Links that come up or go down are observed into the broker's :class:`ConnectivityGraph` and
the resulting connection information is disseminated to neighbours inside its context only
(seed 004 §2.2); a neighbour whose link just came up gets every report visible to it.

Events are published into the broker's *pubend* (one ordered stream per broker incarnation,
``"<broker>~<incarnation>"``), which numbers them with consecutive ticks. With content routing
(the default; seed 004 §3) a :class:`ContentRouter` propagates the local profiles to the keepers
of each enclosing unit and says, for every event, whether to deliver it here and which routes to
pass to which neighbour; a subscription's ``SubAck`` waits until every reachable keeper has the
profile (at most :data:`SUBACK_WAIT` seconds). With ``routing="flood"`` (the baseline the
benchmarks compare against) events go over every up link and each broker forwards and delivers
only the first copy of each tick. Either way a :class:`TickWindow` per pubend makes sure no tick
is delivered twice, and every forwarded item carries ``prev``, the previous tick sent on that
link for that pubend, so the reliable-delivery layer (seed 002 §2) can read the ticks in between
as silence on that path.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Generator, Iterator
from itertools import chain

import attrs

from ges.core.config import BrokerConfig
from ges.core.dedup import TickWindow
from ges.core.failure import FailureDetector
from ges.core.links import Links
from ges.core.outputs import CLIENT, DROP_PEER, NOTICE, PEER, ProtocolError
from ges.core.release import ReleaseRounds
from ges.core.repair import MAX_ANSWER_BYTES, NackRepair
from ges.core.unicast import Unicast
from ges.core.work import Job, JobBody, Jobs
from ges.matching.graph import ProfileGraph
from ges.matching.model import (
    MAX_CONJUNCTIONS,
    MAX_PROFILE_WEIGHT,
    Conjunction,
    Profile,
    conjunction_from_wire,
    weight,
)
from ges.reliable.claims import Claims
from ges.reliable.knowledge import HeldBytes
from ges.reliable.log import MemoryLog, PubendLog, remember
from ges.reliable.subend import Subend
from ges.reliable.vt import VirtualTime
from ges.routing import ContentRouter, Hierarchy
from ges.routing.acks import Ticket
from ges.routing.table import MAX_RESENDS, RESEND_AFTER
from ges.topology import Topology
from ges.wire import messages as m

__all__ = [
    "CLIENT",
    "DROP_PEER",
    "MAX_ANSWER_BYTES",
    "NOTICE",
    "PEER",
    "BrokerConfig",
    "BrokerCore",
    "ProtocolError",
]

#: Work units (ges.core.work) per unit of weight of a conjunction entered in or taken out of
#: the profile graph and the exporter.
COST_PER_WEIGHT = 4
#: Characters of an idempotent publisher's id.
MAX_PUBLISHER_ID = 256
ROUTINGS = ("content", "flood")


class BrokerCore:
    """One broker's protocol state. See the module docstring for the contract."""

    def __init__(
        self,
        topology: Topology,
        broker_id: str,
        *,
        incarnation: int,
        detector: FailureDetector | None = None,
        routing: str = "content",
        hierarchy: Hierarchy | None = None,
        reliable: bool = False,
        log: PubendLog | None = None,
        config: BrokerConfig | None = None,
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
        self.detector = detector or FailureDetector()
        self.routing = routing
        #: content routing (None when flooding)
        self.router = (
            ContentRouter(hierarchy or Hierarchy(topology), broker_id, incarnation, self.graph)
            if routing == "content"
            else None
        )
        #: SubAcks waiting for keepers: [conn, sub_id, seqs, deadline, the request's req]
        self._waits: list[list] = []
        #: messages for one broker, passed hop by hop (nacks, answers, acks, profile wants)
        self.unicast = Unicast(topology, self.router, self.links_up)
        self._next_tick = 1 if self.log is None else self.log.last + 1
        #: the last tick of this pubend routed (a clock heard now is stamped from the next)
        self._routed = self._next_tick - 1
        #: reliable delivery: claim chains, subends, publishes waiting for their log commit
        self.claims = Claims()
        #: this broker's units, its cluster first; per level (:meth:`_level`) the keepers that
        #: decide whether that level's pubends reach it
        self._chain: tuple = ()
        self._deciders: list[frozenset[str]] = [frozenset()]
        if self.router is not None and reliable:
            self.router.claims = self.claims
            self.router.wait_for_all = True
            h = self.router.h
            self._chain = h.chain(broker_id)
            self._deciders += [
                frozenset(k for u in self._chain[:i] for k in h.keepers[u]) - {broker_id}
                for i in range(1, len(self._chain) + 1)
            ]
        self._subends: OrderedDict[str, Subend] = OrderedDict()
        #: the bytes of events all subends hold beyond their doubt horizons, and their bound
        self._held_bytes = HeldBytes(config.max_held_bytes)
        #: pubends whose subend has a gap (a nack may come due): the timer looks only at these
        self._doubtful: set[str] = set()
        #: publishes waiting for their log commit (reliable delivery)
        self._held: list[_Held] = []
        #: idempotent publishing: per publisher its last event number published (the log's,
        #: which keeps it across restarts; in memory with best-effort delivery)
        self._publishers: dict = self.log.publishers() if self.log is not None else {}
        #: subscriptions not delivering from the start of every stream (reliable delivery):
        #: (conn, sub_id) -> per *level* (see :meth:`_level`) None until the starting point of
        #: its pubends is known, then {pubend: last tick not for it}
        self._gate: dict[tuple[int, int], list[dict[str, int] | None]] = {}
        #: pubend's broker -> its level here (cached)
        self._levels: dict[str, int] = {}
        #: started subscriptions whose profile is changing: (conn, sub_id) -> (the profiles it
        #: had, the old starting point still ahead, the levels it had started on). Until the new
        #: profile's starting point, and up to it, they get the events every one of them matches
        #: (such an event is routed to them whichever profile a keeper holds while the change
        #: spreads). Each profile but the last comes with the starting point of the one that
        #: replaced it, per level (None: not known then): above it, it is not needed any more.
        self._changing: dict[tuple[int, int], tuple[tuple, dict[str, int], set]] = {}
        #: subscriptions started on a level where a keeper was given up before it had their
        #: profile: there each pubend starts only at the first frame whose V_m has this
        #: broker's clock at the subscription's vst (seed 000 §3.6), as the keeper that lacks
        #: the profile floods from then on. (conn, sub_id) -> {level: (vst, {broker: the pubend
        #: started on})} (one per broker: an older epoch's stream has nothing new for it)
        self._vgate: dict[tuple[int, int], dict[int, tuple[tuple[int, int], dict[str, str]]]] = {}
        #: changing subscriptions whose old profile had a level waiting for its V_m start:
        #: dest -> {level: the pubends it had started on there}
        self._vchanging: dict[tuple[int, int], dict[int, frozenset[str]]] = {}
        #: origin -> when this keeper last asked it for a sync (its profile here was behind)
        self._wants: dict[str, float] = {}
        self._last_publish = float("-inf")
        # a pubend restarting with a log announces its last tick: events logged (and
        # acknowledged) just before a crash may never have left this broker
        restarted = self.log is not None and self.log.last > 0
        # a log that opens a new epoch at each start names the previous one: its last tick
        # is announced too, and nacks for it are answered from the log
        previous = None if self.log is None else self.log.previous
        self._previous = (f"{broker_id}~{previous[0]}", previous[1]) if previous else None
        restarted = restarted or self._previous is not None
        self._silence_due = 0.0 if restarted else float("inf")
        #: seconds from the next silence round to the one after
        self._silence_gap = config.silence_every
        #: quiet silence rounds in a row (no publish since the round before)
        self._silence_idle = 0
        self._published_since_round = False
        #: reliable delivery: log release rounds (seed 002 §1) and nack repair (§2.3)
        self.release: ReleaseRounds | None = None
        self.repair: NackRepair | None = None
        if self.log is not None:
            others = frozenset(topology.brokers) - {broker_id}
            self.release = ReleaseRounds(
                broker_id, self.pubend, self.log, others, self.unicast, config, self._needed
            )
        self._windows: OrderedDict[str, TickWindow] = OrderedDict()
        self._path_prev: dict[tuple[str, str], int] = {}
        # conn_id -> {sub_id: Profile}
        self._clients: dict[int, dict[int, Profile]] = {}
        self._client_names: dict[int, str] = {}
        #: large requests in progress (ges.core.work), and how many closed clients had jobs
        self._jobs = Jobs()
        self._closings = 0
        #: the time of the slice running now (a job's slices run at different times)
        self._now = 0.0
        #: work units per slice (the simulator makes it tiny to interleave more)
        self.work_slice = config.work_slice
        #: changing subscriptions whose new profile is being entered: the new profile's test
        #: (ges.core.broker._indexed)
        self._entering: dict[tuple[int, int], object] = {}
        #: per subscription, the conjunctions the profile graph and the exporter hold for it
        #: (while a job runs, more or other than its profile's), with their copies
        self._entered: dict[tuple[int, int], dict[Conjunction, int]] = {}
        #: units this broker keeps around itself (its exported conjunctions go into each)
        self._kept_here = 0 if self.router is None else len(self.router.own_units())
        #: the weight of each client's subscriptions, and of all of them
        self._weights: dict[int, int] = {}
        self._local_weight = 0
        #: every local subscription's profile, destination (conn, sub_id) (seed 004 §3.1)
        self.profiles = ProfileGraph()
        self._n_subs = 0
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
        if self.log is not None:
            self.repair = NackRepair(
                broker_id,
                self.pubend,
                topology,
                self.log,
                self.claims,
                self.unicast,
                self.counters,
                self._on_recovered_here,
            )
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

    # -- links ----------------------------------------------------------------------------------

    def hello(self, hello: m.Hello) -> m.Welcome | m.Refuse:
        """Decide whether to accept a connection from its first frame (ges.core.links)."""
        return self.links.hello(hello)

    def link_up(self, peer: str, now: float) -> list:
        self.links_up.add(peer)
        self.detector.up(peer, now)
        out, notices = self.links.up(peer)
        if self.reliable and self.vt.table:  # and every clock (it may have missed a flood)
            out.append((PEER, peer, m.Clocks(self.vt.entries())))
        return out + notices + self._routes_changed((self.id, peer), now, downs=False)

    def link_down(self, peer: str, now: float) -> list:
        was_up = peer in self.links_up
        self.links_up.discard(peer)
        self.detector.down(peer)
        for key in [k for k in self._path_prev if k[0] == peer]:
            del self._path_prev[key]
        self.vt.link_down(peer)
        if not was_up:
            return []
        return self.links.down(peer) + self._routes_changed((), now)

    def peer_message(self, peer: str, msg, now: float) -> list:
        self.detector.heard(peer, now)
        handle = self._from_peer.get(type(msg))
        if handle is None:
            raise ProtocolError(f"unexpected {type(msg).__name__} from broker {peer}")
        return handle(self, peer, msg, now)

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
        return self._to_peers(sends) + self._release_waits(now)

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

    # -- VT vectors (seed 000 §3–5; see ges.reliable.vt) ---------------------------------------

    def _on_clocks(self, peer: str | None, clocks) -> list:
        """Leaf clocks heard (from ``peer``, or this broker's own): the news go on to every
        other neighbour, and into this pubend's V_m."""
        if len(clocks) > len(self.topology.brokers):
            raise ValueError("more clocks than brokers")
        news = self.vt.merge(clocks, self._routed + 1)
        if not news:
            return []
        if self.log is not None:
            self.log.clocks = self.vt.snapshot()
        return [(PEER, p, m.Clocks(news)) for p in sorted(self.links_up) if p != peer]

    def _want_profiles(self, now: float) -> list:
        """Ask each origin whose profile was found behind an event's V_m for a sync (seed 000
        §4, non-leaf liveness), at most once per RESEND_AFTER."""
        out: list = []
        wants = self._wants
        lagging = self.router.lagging
        for origin in sorted(lagging):
            if now < wants.get(origin, -RESEND_AFTER) + RESEND_AFTER:
                continue  # asked lately: again on a later frame, once the wait is over
            wants[origin] = now
            lagging.discard(origin)
            out += self.unicast.relay(
                origin, [], 0, lambda h, d, o=origin: m.ProfileWant(o, self.id, h, d)
            )
        return out

    def _vm_observe(self, pubend: str, digest: int) -> None:
        """A frame of ``pubend`` stamped with ``digest`` arrived: a subscription waiting for its
        V_m start on this pubend starts at the first tick stamped with this broker's clock
        once that clock is at its vst (seed 000 §3.6) — never below what this broker already
        knows or has promised of the pubend. Ticks between that one and this frame that were
        lost are asked for like any other."""
        got = self.vt.lower(pubend, digest, self.id)
        if got is None:
            return
        clock, since = got
        level = self._level(pubend)
        floor = since - 1
        broker = pubend.partition("~")[0]
        if broker not in self.topology.brokers:
            return
        sub = self._subends.get(pubend)
        if sub is not None:
            floor = max(floor, sub.stream.known_to)
        floor = max(floor, self.release.promised(pubend))
        for dest, vgate in self._vgate.items():
            waiting = vgate.get(level)
            if waiting is None or waiting[1].get(broker) == pubend or clock < waiting[0]:
                continue
            waiting[1][broker] = pubend
            start = self._gate[dest][level]
            at = max(floor, start.get(pubend, 0))
            if at > 0:
                start[pubend] = at

    def _stamped(self, peer: str, pubend: str, vm: int, frame) -> list:
        """``frame`` (of ``pubend``, V_m digest ``vm``) for ``peer``, after the vector the link
        has not had yet (:meth:`VirtualTime.before`)."""
        vector = self.vt.before(peer, pubend, vm) if vm else None
        if vector is None:
            return [(PEER, peer, frame)]
        return [(PEER, peer, vector), (PEER, peer, frame)]

    def _held_back(self, dest: tuple[int, int], level: int, pubend: str) -> bool:
        """``dest`` waits for its V_m start on ``pubend`` (see :attr:`_vgate`)."""
        vgate = self._vgate.get(dest)
        if vgate is None:
            return False
        waiting = vgate.get(level)
        return waiting is not None and waiting[1].get(pubend.partition("~")[0]) != pubend

    def _routes_changed(self, up_ends, now: float, *, downs: bool = True) -> list:
        """Connectivity changed: the router re-syncs keepers whose route changed."""
        if self.router is None:
            return []
        out = self._to_peers(self.router.connectivity_changed(up_ends, now, downs=downs))
        return out + self._release_waits(float("-inf"))

    def _to_peers(self, sends: list) -> list:
        up = self.links_up
        return [(PEER, peer, msg) for peer, msg in sends if peer in up]

    # -- clients --------------------------------------------------------------------------------

    def client_open(self, conn: int, client_id: str) -> None:
        self._clients[conn] = {}
        self._client_names[conn] = client_id
        self._weights[conn] = 0

    def client_closed(self, conn: int, now: float) -> list:
        """A client connection ended: its subscriptions go — a job, whose profile changes come
        out of this call and of :meth:`work`."""
        self._now = now
        for job in self._jobs.of(conn):
            self._jobs.drop(job)  # what it entered so far is in _entered, and goes below
        subs = self._clients.pop(conn, {})
        self._n_subs -= len(subs)
        self._local_weight -= self._weights.pop(conn, 0)
        self._client_names.pop(conn, None)
        self._drop_waits(lambda w: w[0] == conn)
        for dest in [d for d in self._gate if d[0] == conn]:
            del self._gate[dest]
            self._changing.pop(dest, None)
            self._vchanging.pop(dest, None)
            self._vgate.pop(dest, None)
        for dest in [d for d in self._entering if d[0] == conn]:
            del self._entering[dest]
        held = [(d, self._entered.pop(d)) for d in [d for d in self._entered if d[0] == conn]]
        if not held:
            return []
        out: list = []
        self._closings += 1

        def body() -> JobBody:
            while held:  # each let go of as it is taken out (see _copies)
                dest, counts = held.pop()
                yield from self._apply(dest, (), _copies(counts), out, held=counts)

        return self._jobs.start(Job(("closed", conn, self._closings), body(), out), self.work_slice)

    def _local_change(self, add, remove, now: float) -> tuple[list, frozenset[int]]:
        if self.router is None:
            return [], frozenset()
        sends, waits = self.router.local_change(add, remove, now)
        return self._to_peers(sends), waits

    def client_name(self, conn: int) -> str:
        """The id a connected client gave (its connection number if it has gone)."""
        return self._client_names.get(conn, str(conn))

    def client_message(self, conn: int, msg, now: float) -> list:
        """A client's message. One that starts a large request leaves the client busy
        (:meth:`busy`): the driver holds its next message back until :meth:`work` is done."""
        kind = type(msg)
        if kind is m.Publish:
            return self._on_publish(conn, msg, now)
        self._now = now  # a job's first slice runs now; later ones get the time of work()
        if (kind is m.Subscribe or kind is m.Unsubscribe) and self._jobs.busy(conn):
            raise ProtocolError(f"client {conn}: a request while its previous one is in progress")
        if kind is m.Subscribe:
            return self._on_subscribe(conn, msg, now)
        if kind is m.Unsubscribe:
            return self._on_unsubscribe(conn, msg, now)
        if kind is m.StatsRequest:
            return [(CLIENT, conn, self.stats())]
        if kind is m.Heartbeat:  # a keepalive: the client is there
            return []
        raise ProtocolError(f"unexpected {kind.__name__} from a client")

    # -- large requests in slices (ges.core.work) -------------------------------------------

    @property
    def has_work(self) -> bool:
        """A job or a removal's steps are in progress: the driver calls :meth:`work`."""
        return bool(self._jobs) or (self.router is not None and self.router.busy)

    def busy(self, conn: int) -> bool:
        """A request of client ``conn`` is still in progress: its next message must wait."""
        return self._jobs.busy(conn)

    def changing(self, conn: int, sub_id: int) -> bool:
        """Subscription ``(conn, sub_id)`` is being changed and its new profile is going in:
        from now on it gets only what the new profile matches too."""
        return (conn, sub_id) in self._entering

    def work(self, now: float) -> list:
        """One slice (:data:`WORK_SLICE` units) of what is in progress; the outputs."""
        self._now = now
        out, left = self._jobs.run(self.work_slice)
        router = self.router
        if router is not None and router.busy and left > 0:
            out += self._to_peers(router.background(now, left))
        return out + self._release_waits(now)

    def _apply(self, dest, add, remove, out: list, ticket=None, held=None) -> JobBody:
        """Enter ``add`` and take out ``remove`` (conjunctions) for ``dest``, in the profile
        graph (local matching) and the exporter (the keepers) alike, a chunk at a time; each
        chunk's profile changes go to ``out``, and the adds to wait for into ``ticket``. Yields
        the work of each chunk; between chunks the graph and the exporter agree, and
        ``self._entered`` says what they hold for ``dest`` (``held``: a count taken out of it,
        of a client gone, kept up to date instead)."""
        if held is None:
            held = self._entered.setdefault(dest, {})
        graph = self.profiles
        router = self.router
        work = router.exporter.work if router is not None else 0
        # a conjunction goes into the local graph and, exported, into the graph of every unit
        # this broker keeps around itself
        per_weight = COST_PER_WEIGHT * (1 + self._kept_here)
        chunk_add: list = []
        chunk_remove: list = []
        cost = 0
        todo = chain(((True, c) for c in add), ((False, c) for c in remove))
        for adding, conj in chain(todo, ((None, None),)):  # a last, empty one flushes
            if adding is None:
                if not chunk_add and not chunk_remove:
                    break
            elif adding:
                graph.add(conj, dest)
                held[conj] = held.get(conj, 0) + 1
                chunk_add.append(conj)
            else:
                graph.remove(conj, dest)
                n = held.get(conj, 0) - 1
                if n > 0:
                    held[conj] = n
                else:
                    held.pop(conj, None)
                chunk_remove.append(conj)
            if adding is not None:
                cost += per_weight * weight(conj)
            if cost >= self.work_slice or adding is None:
                if router is not None:
                    # a slice may run well after the request came: it stamps its own time
                    sends, added = self._local_change(chunk_add, chunk_remove, self._now)
                    out += sends
                    if ticket is not None:
                        router.book.extend(ticket, router.waited(added))
                    cost += router.exporter.work - work
                    work = router.exporter.work
                chunk_add, chunk_remove = [], []
                yield cost
                cost = 0
        if not held and self._entered.get(dest) is held:
            del self._entered[dest]

    # -- subscriptions ------------------------------------------------------------------------

    def _on_unsubscribe(self, conn: int, msg: m.Unsubscribe, now: float) -> list:
        profile = self._clients[conn].pop(msg.sub_id, None)
        out = self._supersede(conn, msg.sub_id)
        done = (CLIENT, conn, m.SubAck(msg.sub_id, req=msg.req))
        if profile is None:
            return [*out, done]
        dest = (conn, msg.sub_id)
        self._gate.pop(dest, None)
        self._changing.pop(dest, None)
        self._vchanging.pop(dest, None)
        self._vgate.pop(dest, None)
        self._n_subs -= 1
        self._set_weight(conn, -profile.weight)
        held = _copies(self._entered.get(dest, {}))

        def body() -> JobBody:
            yield from self._apply(dest, (), held, out)
            out.append(done)

        job = Job(("sub", conn, msg.sub_id), body(), out, conn=conn)
        return self._jobs.start(job, self.work_slice)

    def _on_subscribe(self, conn: int, msg: m.Subscribe, now: float) -> list:
        subs = self._clients[conn]
        if msg.sub_id not in subs and len(subs) >= self.config.max_subscriptions_per_client:
            return [
                (
                    CLIENT,
                    conn,
                    m.Error(f"over {self.config.max_subscriptions_per_client} subscriptions"),
                )
            ]
        if len(msg.conjunctions) > MAX_CONJUNCTIONS:
            reason = f"subscription {msg.sub_id}: over {MAX_CONJUNCTIONS} conjunctions"
            return [(CLIENT, conn, m.Error(reason))]
        out: list = []
        tickets: list[Ticket] = []  # the one it opens, closed if the job is dropped
        body = self._subscribe(conn, msg, out, now, tickets)
        book = self.router.book if self.router is not None else None
        cancel = None if book is None else lambda: [book.close(t) for t in tickets]
        job = Job(("sub", conn, msg.sub_id), body, out, conn=conn, cancel=cancel)
        return self._jobs.start(job, self.work_slice)

    def _subscribe(
        self, conn: int, msg: m.Subscribe, out: list, now: float, tickets: list
    ) -> JobBody:
        """A new or changed subscription, in slices: parse the profile, enter it (the old one
        goes on delivering meanwhile), take out the old one, then answer."""
        conjunctions = []
        total = 0
        cost = 0
        try:
            for items in msg.conjunctions:
                conj = conjunction_from_wire(items)
                total += weight(conj)
                if total > MAX_PROFILE_WEIGHT:
                    raise ValueError(
                        f"weight over {MAX_PROFILE_WEIGHT} (constraints plus in-values)"
                    )
                conjunctions.append(conj)
                cost += weight(conj)
                if cost >= self.work_slice:
                    yield cost
                    cost = 0
        except ValueError as exc:
            out.append((CLIENT, conn, m.Error(f"subscription {msg.sub_id}: {exc}")))
            return
        profile = Profile.parsed(msg.profile_id, tuple(conjunctions) or (Conjunction(),), total)
        dest = (conn, msg.sub_id)
        subs = self._clients[conn]
        old = subs.get(msg.sub_id)
        grow = profile.weight - (old.weight if old is not None else 0)
        refusal = self._over_weight(conn, grow)
        if refusal is not None:
            out.append((CLIENT, conn, m.Error(f"subscription {msg.sub_id}: {refusal}")))
            return
        self._set_weight(conn, grow)
        out += self._supersede(conn, msg.sub_id)
        if old is not None:
            # while the new profile is entered (and the old taken out) the graph holds some of
            # both: what it matches is delivered only if the new profile matches it too
            entering = yield from _indexed(profile, self.work_slice, self.config.index_old_profiles)
            if self.reliable:
                yield from self._change(dest, old)
            self._entering[dest] = entering
        if self.reliable:
            # nothing new delivered until its starting point is known, level by level
            self._gate[dest] = [None] * (len(self._chain) + 1)
            self._vgate.pop(dest, None)
        # what it waits for, kept up to date as acknowledgements come while it is entered
        ticket = self.router.ticket(()) if self.router is not None else None
        if ticket is not None:
            tickets.append(ticket)
        old_held = _copies(self._entered.get(dest, {}))  # the old profile goes after the new is in
        yield from self._apply(dest, profile.effective, old_held, out, ticket)
        self._entering.pop(dest, None)
        if old is None:
            self._n_subs += 1
        subs[msg.sub_id] = profile
        if self.reliable:
            out += self._start(dest, ticket)
        if ticket is not None and not ticket.confirmed():
            self._waits.append(
                [conn, msg.sub_id, ticket, self._now + self.config.suback_wait, msg.req]
            )
            return
        if ticket is not None:
            self.router.book.close(ticket)
        out.insert(0, (CLIENT, conn, m.SubAck(msg.sub_id, req=msg.req)))

    def _over_weight(self, conn: int, grow: int) -> str | None:
        """Why a client may not grow its subscriptions by ``grow`` weight (None: it may)."""
        if grow <= 0:
            return None
        if self._weights.get(conn, 0) + grow > self.config.max_client_weight:
            return (
                f"the client's subscriptions would weigh over {self.config.max_client_weight} "
                "(constraints plus in-values)"
            )
        if self._local_weight + grow > self.config.max_local_weight:
            return (
                f"this broker's subscriptions would weigh over {self.config.max_local_weight} "
                "(constraints plus in-values)"
            )
        return None

    def _set_weight(self, conn: int, grow: int) -> None:
        if conn in self._weights:
            self._weights[conn] += grow
        self._local_weight += grow

    def _change(self, dest: tuple[int, int], profile: Profile) -> JobBody:
        """``dest``'s profile is replaced: it goes on getting what the old one (and any before
        it still changing) matches too, unless it had not started. A large old profile is
        indexed first (in slices), so that testing an event against it costs a match, not a
        test of every conjunction."""
        old = yield from _indexed(profile, self.work_slice, self.config.index_old_profiles)
        changing = self._changing.get(dest)
        levels = self._gate.get(dest)
        # on a level waiting for its V_m start, ``old`` started only on the pubends whose V_m
        # start came (:attr:`_vchanging`); where it is not known, its replaced profile is
        # needed without a limit
        vgate = self._vgate.get(dest) or {}
        held = {i: frozenset(w[1].values()) for i, w in vgate.items()}
        if changing is not None:
            # the profile before ``old`` is needed only up to where ``old`` started; the newest
            # config.max_changing profiles are kept (beyond that, what the oldest matched is no longer
            # held back)
            *earlier, (last, _) = changing[0]
            upto = [
                None if start is None or i in held else dict(start)
                for i, start in enumerate(levels)
            ]
            olds = (*earlier, (last, upto), (old, None))[-self.config.max_changing :]
            # where ``old`` started and the ones before it had not, it goes on from its start
            ahead, started = dict(changing[1]), set(changing[2])
            vchanging = dict(self._vchanging.get(dest, {}))
            for i, start in enumerate(levels):
                if start is not None and i not in started:
                    started.add(i)
                    ahead.update(start)
                    if i in held:
                        vchanging[i] = held[i]
            self._changing[dest] = olds, ahead, started
            self._set_vchanging(dest, vchanging)
            return
        if levels is None:  # it had started everywhere
            self._changing[dest] = ((old, None),), {}, set(range(len(self._chain) + 1))
            return
        started = {i for i, start in enumerate(levels) if start is not None}
        if started:
            ahead = {p: t for i in started for p, t in levels[i].items()}
            self._changing[dest] = ((old, None),), ahead, started
            self._set_vchanging(dest, {i: p for i, p in held.items() if i in started})

    def _set_vchanging(self, dest: tuple[int, int], held: dict) -> None:
        if held:
            self._vchanging[dest] = held
        else:
            self._vchanging.pop(dest, None)

    def _old_started(self, dest: tuple[int, int], level: int, pubend: str) -> bool:
        """The profiles ``dest`` is changing from had started on ``pubend`` (its level is
        among the started ones)."""
        held = self._vchanging.get(dest)
        return held is None or level not in held or pubend in held[level]

    def _supersede(self, conn: int, sub_id: int) -> list:
        """A new request for a subscription ends the wait of an earlier one still waiting for
        its keepers: it is answered now, as incomplete (only the newest one starts delivery)."""
        return [
            (CLIENT, conn, m.SubAck(sub_id, complete=False, req=w[4]))
            for w in self._drop_waits(lambda w: w[0] == conn and w[1] == sub_id)
            if w[3] is not None  # its client has not had its SubAck yet
        ]

    def _drop_waits(self, which) -> list:
        """Stop waiting for the keepers on the SubAcks ``which(w)`` picks; returns them."""
        gone = [w for w in self._waits if which(w)]
        if gone:
            self._waits = [w for w in self._waits if not which(w)]
            for w in gone:
                self.router.book.close(w[2])
        return gone

    def _level(self, pubend: str) -> int:
        """Which keepers decide whether a pubend's events come here: the level ``i`` such that
        the keepers of this broker's units up to ``self._chain[i - 1]`` — the smallest unit
        holding the pubend's broker too — route them here (seed 004 §3.3); 0 for this broker's
        own pubends, which need no keeper."""
        broker = pubend.partition("~")[0]
        level = self._levels.get(broker)
        if level is None:
            chain = self._chain
            level = len(chain)
            if broker == self.id:
                level = 0
            elif broker in self.topology.brokers:
                contains = self.router.h.contains
                level = next(i + 1 for i, u in enumerate(chain) if contains(u, broker))
            if len(self._levels) < len(self.topology.brokers):
                self._levels[broker] = level
        return level

    def _start(self, dest: tuple[int, int], ticket: Ticket) -> list:
        """Open a subscription's gate on every level whose deciding keepers all have its
        profile (reliable delivery): its pubends there start after the last tick any of its
        keepers had routed before applying it (their acks say), after anything this broker
        routed as a keeper, and after what its subend already knows — every later tick is
        routed with the subscription in place. Until then it gets nothing from them. So a
        subscription starts at once on its own broker's pubend, and on its cluster's pubends
        as soon as the cluster's keepers have it, even while a keeper further off is cut off.

        A keeper given up before it acknowledged (:meth:`ContentRouter._waive`) routes with
        an old profile: on its level each pubend starts only where its V_m has this broker's
        clock at the subscription's vst (seed 000 §3.6), from where that keeper fails the
        sufficiency test and floods. This broker's clock is flooded for it. Once the keeper
        acknowledges, the pubends not started yet start after its last tick too, as usual."""
        levels = self._gate.get(dest)
        if levels is None:
            return []
        router = self.router
        vgate = self._vgate.get(dest)
        start = None
        out: list = []
        for i, got in enumerate(levels):
            if got is not None:
                if vgate is not None and i in vgate and not ticket.waived_by(self._deciders[i]):
                    # the keeper came back with the profile: the rest start as usual
                    if start is None:
                        start = self._start_map(ticket)
                    started = set(vgate.pop(i)[1].values())
                    level = self._level
                    got.update(
                        (p, t) for p, t in start.items() if level(p) == i and p not in started
                    )
                continue
            if not ticket.settled(self._deciders[i]):
                continue
            if start is None:
                start = self._start_map(ticket)
            level = self._level
            levels[i] = {p: t for p, t in start.items() if level(p) == i}
            if ticket.waived_by(self._deciders[i]):
                vst = (router.inc, max(ticket.seqs))
                if vgate is None:
                    vgate = self._vgate[dest] = {}
                vgate[i] = (vst, {})
                if self.vt.table.get(self.id, (0, 0)) < vst:
                    out += self._on_clocks(None, [(self.id, *router.clock())])
        if vgate is not None and not vgate:
            del self._vgate[dest]
        self._gate_passed(dest, levels)
        return out

    def _pass_gates(self, pubend: str, floor: int) -> None:
        """Every tick of ``pubend`` up to ``floor`` is final at its subend (delivered or not
        wanted): starting points up to it are behind every subscription."""
        level = self._level(pubend)
        for dest, levels in list(self._gate.items()):
            start = levels[level]
            if start is not None and start.get(pubend, floor + 1) <= floor:
                del start[pubend]
                if not start:
                    self._gate_passed(dest, levels)

    def _gate_passed(self, dest: tuple[int, int], levels: list) -> None:
        """Drop the gate once every level is open and past its starting point."""
        if dest not in self._vgate and all(start is not None and not start for start in levels):
            del self._gate[dest]
            self._changing.pop(dest, None)
            self._vchanging.pop(dest, None)

    def _start_map(self, ticket: Ticket) -> dict[str, int]:
        """Every pubend's starting point for a subscription waiting on ``ticket`` (its own
        adds, or the covering ones), as of now."""
        start: dict[str, int] = {}
        starts = self.router.starts
        for seq in ticket.seqs:
            for pubend, tick in starts.get(seq, {}).items():
                if start.get(pubend, 0) < tick:
                    start[pubend] = tick
        for pubend, tick in self.claims.latest():
            if start.get(pubend, 0) < tick:
                start[pubend] = tick
        for pubend, sub in self._subends.items():
            known = sub.stream.known_to
            if start.get(pubend, 0) < known:
                start[pubend] = known
        # this broker's own pubend: from its next event (local delivery needs no keeper)
        own = self._next_tick - 1 - sum(len(h.events) for h in self._held)
        if own > 0:
            start[self.pubend] = max(start.get(self.pubend, 0), own)
        return start

    def _release_waits(self, now: float) -> list:
        """SubAcks whose profile every reachable keeper has acknowledged (or that waited long
        enough)."""
        if not self._waits:
            return []
        out, keep = [], []
        for w in self._waits:
            out += self._start((w[0], w[1]), w[2])
            if w[2].confirmed():
                # complete; a client told it was not gets a second SubAck saying it now is
                out.append((CLIENT, w[0], m.SubAck(w[1], req=w[4])))
                self.router.book.close(w[2])
            else:
                if w[3] is not None and now >= w[3]:
                    # the client is told; reliable delivery still starts only once every
                    # keeper has the profile (resends go on until then)
                    out.append((CLIENT, w[0], m.SubAck(w[1], complete=False, req=w[4])))
                    if self.reliable:
                        w[3] = None
                    else:
                        self.router.book.close(w[2])  # best effort waits no longer
                        continue
                keep.append(w)
        self._waits = keep
        return out

    def _on_publish(self, conn: int, msg: m.Publish, now: float) -> list:
        events = msg.events
        if len(events) > self.config.max_publish_batch:
            return [
                (
                    CLIENT,
                    conn,
                    m.Error(f"publish batch over {self.config.max_publish_batch} events"),
                )
            ]
        duplicates, wait = 0, 0
        if msg.publisher:
            if len(msg.publisher) > MAX_PUBLISHER_ID or msg.first < 1:
                reason = (
                    f"publisher id of at most {MAX_PUBLISHER_ID} characters, with event "
                    "numbers from 1"
                )
                return [(CLIENT, conn, m.Error(f"idempotent publish needs a {reason}"))]
            duplicates, wait = self._published_before(msg)
            events = events[duplicates:]
        if self.reliable:
            return self._publish_logged(conn, msg, events, duplicates, wait, now)
        first = self._next_tick
        items = [m.EventItem(first + i, first + i - 1, 0, ev) for i, ev in enumerate(events)]
        self._next_tick = first + len(events)
        if msg.publisher and events:
            remember(self._publishers, msg.publisher, (msg.first + len(msg.events) - 1, 0, 0))
        self.counters["published"] += len(events)
        self.counters["events_in"] += len(events)
        self.counters["duplicates_published"] += duplicates
        ack = m.PubAck(msg.seq, self.pubend, first, self._next_tick - 1, duplicates)
        out = [(CLIENT, conn, ack)]
        if items:
            self._window(self.pubend).add_range(first, self._next_tick - 1)
            if self.router is None:
                out += self._forward(self.pubend, items, exclude=None)
            else:
                initial = self.router.initial_routes
                if initial:  # a one-broker system has nowhere else to send
                    out += self._route(self.pubend, [(it, initial) for it in items])
            out += self._deliver(self.pubend, items)
        return out

    # -- reliable delivery (seed 002 §2, seed 001 §2) ---------------------------------------------

    def _published_before(self, msg: m.Publish) -> tuple[int, int]:
        """Idempotent publishing: how many leading events of ``msg`` its publisher published
        before (their numbers are at or below the highest the pubend published for it), and
        the tick of this epoch the acknowledgement must wait for (0: none — they are durable)."""
        state = self._publishers.get(msg.publisher)
        if state is None:
            return 0, 0
        seq, epoch, tick = state
        duplicates = min(max(seq - msg.first + 1, 0), len(msg.events))
        log = self.log
        wait = tick if duplicates and log is not None and epoch == log.epoch else 0
        return duplicates, wait

    def _publish_logged(
        self, conn: int, msg: m.Publish, events: list, duplicates: int, wait: int, now: float
    ) -> list:
        """Give the events the next ticks and append them to the pubend's log; they are
        acknowledged and sent on once the log has committed them (:meth:`on_logged`) — and
        the duplicates of an idempotent publish once what they duplicate is committed."""
        first = self._next_tick
        self._next_tick = first + len(events)
        if events:
            publisher = None
            if msg.publisher:
                publisher = (msg.publisher, msg.first + len(msg.events) - 1)
            self.log.append(first, events, publisher)
        last = self._next_tick - 1
        self._held.append(_Held(conn, msg.seq, first, last, events, max(last, wait), duplicates))
        self._last_publish = now
        return self.on_logged(now)

    def on_logged(self, now: float) -> list:
        """The log committed more: acknowledge and send on the publishes it now holds."""
        out: list = []
        committed = self.log.committed
        held = self._held
        n = 0
        passed = 0
        while n < len(held) and held[n].wait <= committed:
            h = held[n]
            n += 1
            if h.conn in self._clients:
                ack = m.PubAck(h.seq, self.pubend, h.first, h.last, h.duplicates)
                out.append((CLIENT, h.conn, ack))
            self.counters["duplicates_published"] += h.duplicates
            events = h.events
            if not events:
                continue
            first = h.first
            passed = h.last
            items = [m.EventItem(first + i, 0, 0, ev) for i, ev in enumerate(events)]
            self._routed = items[-1].tick
            self.counters["published"] += len(items)
            self.counters["events_in"] += len(items)
            if self.router.initial_routes:  # a one-broker system has nowhere else to send
                out += self._route_claimed(
                    self.pubend, [(it, None) for it in items], now, self.vt.digest
                )
            out += self._deliver(self.pubend, items)
            if self._silence_due == float("inf") or self._silence_idle:
                # the first event after a quiet round: silence follows it soon
                self._silence_due = min(self._silence_due, now + self.config.silence_after)
            self._silence_idle = 0
            self._silence_gap = self.config.silence_every
            self._published_since_round = True
            self.release.published(now)
        if n:
            if self._gate and passed:  # own events past a starting point: none below it comes
                self._pass_gates(self.pubend, passed)
            del held[:n]
        return out

    def _root_routes(self, tick: int) -> list[m.Route]:
        root = self.claims.root
        pubend = self.pubend
        return [
            m.Route(r.unit, r.skip, prev=root(pubend, r.unit, tick))
            for r in self.router.initial_routes
        ]

    def _route_claimed(self, pubend: str, todo: list, now: float, vm: int = 0) -> list:
        """Route ``(item, routes)`` pairs one tick at a time, each route the claims make carrying
        its own (routes None: the publisher's own); routes to this broker feed its subend.
        ``vm``: the digest of the V_m the pubend stamped them with; it goes on with them."""
        route = self.router.route_event
        claims = self.claims
        vt = self.vt
        bound = vt.upper(pubend, vm)
        routed_before = claims.highest(pubend)
        per_hop: dict[str, list] = {}
        item_type = m.EventItem
        me = self.id
        mine: list = []
        local = []
        for it, routes in todo:
            tick = it.tick
            if routes is None:
                routes = self._root_routes(tick)
            hops = route(
                it.event.attributes,
                routes,
                claims=claims,
                pubend=pubend,
                tick=tick,
                mine=mine,
                vm=bound,
            )
            if mine:
                local.append((it, mine))
                mine = []
            for hop, rs in hops.items():
                fwd = item_type(tick, 0, it.hops + 1, it.event, tuple(rs), (*it.path, me))
                got = per_hop.get(hop)
                if got is None:
                    per_hop[hop] = [fwd]
                else:
                    got.append(fwd)
        out = []
        up = self.links_up
        frames = 0
        for peer, items in per_hop.items():
            if peer in up:
                out += self._stamped(peer, pubend, vm, m.Events(pubend, items, vm))
                self.counters["events_out"] += len(items)
                frames += 1
        self.counters["event_frames"] += frames
        if self.router.lagging:
            out += self._want_profiles(now)
        if self.router.kept and pubend != self.pubend:
            self.repair.cache.add(pubend, [it for it, _ in todo], routed_before=routed_before)
        if local and pubend != self.pubend:
            sub = self._subend(pubend, min(r.prev for _, rs in local for r in rs))
            if sub is not None:
                match = self.profiles.match
                for it, rs in local:
                    prev = min(r.prev for r in rs)
                    sub.data(prev, it.tick, it, bool(match(it.event.attributes)))
                out += self._drain(pubend, sub, now)
        return out

    def _drain(self, pubend: str, sub: Subend, now: float) -> list:
        """Deliver what ``sub`` can deliver now; remember it while a nack may come due."""
        out = self._deliver(pubend, [it for _, it in sub.deliverable(now)])
        if self._gate:
            self._pass_gates(pubend, sub.stream.floor)
        if sub.next_nack < float("inf"):
            self._doubtful.add(pubend)
        else:
            self._doubtful.discard(pubend)
        return out

    def _subend(self, pubend: str, floor: int) -> Subend | None:
        """The subend of ``pubend`` here (made, starting above ``floor``, if a local
        subscription exists)."""
        sub = self._subends.get(pubend)
        if sub is None:
            if not self.profiles:
                return None
            start = self._start_floor(pubend)
            if start is not None:
                floor = min(floor, start)
            # never below what this broker acknowledged (see :meth:`_promise`)
            floor = max(floor, self.release.promised(pubend))
            sub = self._subends[pubend] = Subend(floor, self._held_bytes)
            if len(self._subends) > self.config.max_subends:
                gone, old = self._subends.popitem(last=False)
                old.stream.release()
                self._doubtful.discard(gone)
        else:
            self._subends.move_to_end(pubend)
        return sub

    def _start_floor(self, pubend: str) -> int | None:
        """The earliest starting point on ``pubend`` of a started subscription here (None:
        none has started on its level): 0 for one that started before this pubend was routed
        anywhere (it wants the whole stream)."""
        level = self._level(pubend)
        held = self._held_back
        started = [
            0 if levels is None else levels[level].get(pubend, 0)
            for d in self._started_dests(level)
            if not held(d, level, pubend)
            for levels in (self._gate.get(d),)
        ]
        # a changing subscription still gets what its old profiles match from their start
        started += [
            ahead.get(pubend, 0)
            for d, (_, ahead, old_levels) in self._changing.items()
            if level in old_levels and self._old_started(d, level, pubend)
        ]
        return min(started) if started else None

    def _started_dests(self, level: int):
        """The subscriptions started on the pubends of ``level``."""
        gate = self._gate
        for conn, subs in self._clients.items():
            for sub_id in subs:
                dest = (conn, sub_id)
                if dest not in gate or gate[dest][level] is not None:
                    yield dest

    def _on_reliable_events(
        self, peer: str, pubend: str, items: list, now: float, vm: int = 0
    ) -> list:
        todo = self._checked(peer, items)
        if vm and self._vgate:
            self._vm_observe(pubend, vm)
        return self._route_claimed(pubend, todo, now, vm)

    def _on_silence(self, peer: str, msg: m.Silence, now: float) -> list:
        if msg.hops >= self.config.max_hops:
            return []
        try:
            self.router.check_routes(msg.to)
        except ValueError as exc:
            raise ProtocolError(f"bad silence route from {peer}: {exc}") from None
        if msg.vm and self._vgate:
            self._vm_observe(msg.pubend, msg.vm)
        return self._silence(msg.pubend, msg.tick, msg.to, msg.hops, now, msg.vm)

    def _silence(self, pubend: str, tick: int, routes, hops: int, now: float, vm: int = 0) -> list:
        mine: list = []
        vt = self.vt
        per_hop = self.router.route_event(
            None,
            routes,
            claims=self.claims,
            pubend=pubend,
            tick=tick,
            mine=mine,
            vm=vt.upper(pubend, vm),
        )
        out: list = []
        for peer, rs in per_hop.items():
            if peer in self.links_up:
                out += self._stamped(peer, pubend, vm, m.Silence(pubend, tick, rs, hops + 1, vm))
                self.counters["silences"] += 1
        if self.router.lagging:
            out += self._want_profiles(now)
        if mine and pubend != self.pubend:
            prev = min(r.prev for r in mine)
            sub = self._subend(pubend, min(prev, tick))
            if sub is not None:
                sub.silence(prev, tick)
                out += self._drain(pubend, sub, now)
        return out

    def _on_recovered_here(self, msg: m.Recovered, now: float) -> list:
        sub = self._subends.get(msg.pubend)
        if sub is None or msg.lo > msg.hi or msg.hi > sub.top:
            return []  # nothing asked for here, or an answer past anything heard of
        match = self.profiles.match
        wanted = [
            (it.tick, it)
            for it in msg.items
            if msg.lo <= it.tick <= msg.hi and match(it.event.attributes)
        ]
        sub.recovered(msg.lo, msg.hi, wanted, now)
        self.counters["recovered"] += len(wanted)
        if msg.lost:
            self.counters["lost"] += msg.hi - msg.lo + 1
            text = (
                f"{msg.pubend} ticks {msg.lo}..{msg.hi} are lost: that pubend's log no longer "
                "holds them (its broker restarted with a log in memory, or its bound dropped them)"
            )
            return [
                (NOTICE, "warning", text),
                *self._drain(msg.pubend, sub, now),
            ]
        return self._drain(msg.pubend, sub, now)

    # -- log release (seed 002 §1; ges.core.release) ------------------------------------------

    def _needed(self, pubend: str, tick: int) -> int | None:
        """How far this broker acknowledges ``pubend``'s ticks when asked about those up to
        ``tick``; None while a subscription here waits for its starting point on the
        pubend's level (it may need ticks from before the answer)."""
        if not self.profiles:  # no subscription here: a later one starts after the answer
            return tick
        level = self._level(pubend)
        if any(levels[level] is None for levels in self._gate.values()):
            return None
        sub = self._subends.get(pubend)
        if sub is not None:
            return min(tick, sub.stream.floor)
        start = self._start_floor(pubend)
        return tick if start is None else min(tick, start)

    def _reliable_timer(self, now: float) -> list:
        return self.release.on_timer(now) + self.silence_round(now) + self.nack_round(now)

    def silence_round(self, now: float) -> list:
        """Silence on this pubend's routes (seed 002 §2.2: idle pubends advance silence), when
        due: up to the last tick published, and the previous epoch's last tick after a
        restart; the rounds space out while the pubend stays idle."""
        if now < self._silence_due:
            return []
        tick = self._next_tick - 1 - sum(len(h.events) for h in self._held)
        out = self._silence(self.pubend, tick, self._root_silence(tick), 0, now, self.vt.digest)
        if self._previous is not None:
            old, last = self._previous
            routes = [m.Route(r.unit, r.skip, prev=last) for r in self.router.initial_routes]
            out += self._silence(old, last, routes, 0, now)
        self._silence_due = now + self._silence_gap
        if self._published_since_round:
            self._published_since_round = False
        else:
            self._silence_idle += 1
            if self._silence_idle >= self.config.silence_steady:
                self._silence_gap = min(2 * self._silence_gap, self.config.silence_max)
        return out

    def silence_deadline(self) -> float:
        return self._silence_due

    def nack_round(self, now: float) -> list:
        """A nack towards the pubend's broker for each subend whose gap came due."""
        out: list = []
        for pubend in sorted(self._doubtful):
            sub = self._subends[pubend]
            if sub.next_nack == float("inf"):
                self._doubtful.discard(pubend)
            elif now >= sub.next_nack:
                ranges = sub.nack(now)
                if ranges:
                    self.counters["nacks_sent"] += 1
                    broker = pubend.partition("~")[0]
                    out += self.unicast.relay(
                        broker, [], 0, lambda h, d, p=pubend, r=ranges: m.Nack(p, self.id, r, h, d)
                    )
        return out

    def nack_deadline(self) -> float:
        deadline = float("inf")
        subends = self._subends
        for pubend in self._doubtful:
            nack = subends[pubend].next_nack
            if nack < deadline:
                deadline = nack
        return deadline

    def _root_silence(self, tick: int) -> list[m.Route]:
        """The publisher's routes for silence up to ``tick``: each claims back to the last tick
        it made that route for."""
        silence = self.claims.root_silence
        return [
            m.Route(r.unit, r.skip, prev=silence(self.pubend, r.unit, tick))
            for r in self.router.initial_routes
        ]

    def _reliable_deadline(self) -> float:
        return min(self.silence_deadline(), self.release.next_deadline(), self.nack_deadline())

    # -- content routing (seed 004 §3.3) ----------------------------------------------------------

    def _route(self, pubend: str, todo: list) -> list:
        """Route ``(item, routes)`` pairs: the Events to send on."""
        route = self.router.route_event
        per_hop: dict[str, list] = {}
        last_attrs = last_routes = None
        hops: dict = {}
        for it, routes in todo:
            attrs = it.event.attributes
            # a batch of events with the same attributes and routes is routed once
            if routes is not last_routes or attrs != last_attrs:
                hops = {hop: tuple(rs) for hop, rs in route(attrs, routes, it.path).items()}
                last_attrs, last_routes = attrs, routes
            for hop, rs in hops.items():
                per_hop.setdefault(hop, []).append((it, rs))
        out = []
        item_type = m.EventItem
        me = self.id
        for peer, pairs in per_hop.items():
            if peer not in self.links_up:
                continue
            key = (peer, pubend)
            prev = self._path_prev.get(key, 0)
            hop = []
            for it, rs in pairs:
                hop.append(item_type(it.tick, prev, it.hops + 1, it.event, rs, (*it.path, me)))
                prev = it.tick
            self._path_prev[key] = prev
            out.append((PEER, peer, m.Events(pubend, hop)))
            self.counters["events_out"] += len(hop)
        self.counters["event_frames"] += len(out)
        return out

    def _checked(self, peer: str, items: list) -> list:
        """``(item, routes)`` for the received items within the hop limit; a bad route is a
        protocol error."""
        check = self.router.check_routes
        todo = []
        for it in items:
            if it.hops >= self.config.max_hops:
                self.counters["hop_limit"] += 1
                continue
            try:
                check(it.to)
            except ValueError as exc:
                raise ProtocolError(f"bad event route from {peer}: {exc}") from None
            todo.append((it, it.to))
        self.counters["events_in"] += len(items)
        return todo

    def _on_routed(self, peer: str, pubend: str, items: list) -> list:
        todo = self._checked(peer, items)
        out = self._route(pubend, todo)
        # every copy passing through is offered to the local subscriptions, once per tick
        if todo and self.profiles:
            add = self._window(pubend).add
            fresh = [it for it, _ in todo if add(it.tick)]
            self.counters["duplicates"] += len(todo) - len(fresh)
            if fresh:
                out += self._deliver(pubend, fresh)
        return out

    # -- flooding ---------------------------------------------------------------------------------

    def _window(self, pubend: str) -> TickWindow:
        window = self._windows.get(pubend)
        if window is None:
            window = self._windows[pubend] = TickWindow(limit=self.config.window_limit)
            if len(self._windows) > self.config.max_pubends:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(pubend)
        return window

    def _on_flooded(self, peer: str, pubend: str, items: list) -> list:
        window = self._window(pubend)
        add = window.add
        fresh = [it for it in items if add(it.tick)]
        self.counters["events_in"] += len(fresh)
        self.counters["duplicates"] += len(items) - len(fresh)
        if not fresh:
            return []
        return self._forward(pubend, fresh, exclude=peer) + self._deliver(pubend, fresh)

    def _forward(self, pubend: str, items: list, *, exclude: str | None) -> list:
        out = []
        item_type = m.EventItem
        for peer in self.links_up:
            if peer == exclude:
                continue
            key = (peer, pubend)
            prev = self._path_prev.get(key, 0)
            hop = []
            for it in items:
                hop.append(item_type(it.tick, prev, it.hops + 1, it.event))
                prev = it.tick
            self._path_prev[key] = prev
            out.append((PEER, peer, m.Events(pubend, hop)))
            self.counters["events_out"] += len(hop)
        self.counters["event_frames"] += len(out)
        return out

    def _deliver(self, pubend: str, items: list) -> list:
        """Match each event against the local profiles (one profile-graph walk per event) and
        send each subscription its matching events, in order, as one ``Deliver``."""
        if not self.profiles or not items:
            return []
        match = self.profiles.match
        results = [match(it.event.attributes) for it in items]
        first = results[0]
        if all(r == first for r in results):
            # the common case (same interests for the whole batch): one shared message per
            # subscription id, which the driver encodes once
            per = dict.fromkeys(first, items)
        else:
            per = {}
            for it, dests in zip(items, results, strict=True):
                for dest in dests:
                    got = per.get(dest)
                    if got is None:
                        per[dest] = [it]
                    else:
                        got.append(it)
        if self._gate:
            self._filter_gated(pubend, per)
        if self._entering:
            for dest in [d for d in per if d in self._entering]:
                test = self._entering[dest].matches
                kept = [it for it in per[dest] if test(it.event.attributes)]
                if kept:
                    per[dest] = kept
                else:
                    del per[dest]
        out = []
        shared: dict[tuple[int, int], m.Deliver] = {}
        delivered = 0
        clients = self._clients
        for (conn, sub_id), matched in per.items():
            subs = clients.get(conn)
            if subs is None or sub_id not in subs:
                continue  # a subscription still being entered, or one going away
            key = (sub_id, id(matched))
            msg = shared.get(key)
            if msg is None:
                msg = shared[key] = m.Deliver(sub_id, pubend, matched)
            out.append((CLIENT, conn, msg))
            delivered += len(matched)
        self.counters["delivered"] += delivered
        self.counters["events_out"] += delivered
        return out

    def _filter_gated(self, pubend: str, per: dict) -> None:
        """Drop what gated subscriptions must not get: everything before their starting point
        is known, and the ticks of ``pubend`` up to it after — except, for a changing one, the
        events its old profile matches too."""
        gate = self._gate
        changing = self._changing
        level = self._level(pubend)
        vgate = self._vgate
        for dest in [d for d in per if d in gate]:
            levels = gate[dest]
            start = levels[level]
            if vgate and self._held_back(dest, level, pubend):
                start = None  # not started on this pubend yet
            first = None if start is None else start.get(pubend)
            if start is not None and first is None:
                continue
            was = changing.get(dest)
            if was is not None and (
                level not in was[2] or not self._old_started(dest, level, pubend)
            ):
                was = None  # the old profile had not started here either
            if first is None:
                items = [] if was is None else per[dest]
                first = float("inf")
            else:
                items = per[dest]
            if was is None:
                items = [it for it in items if it.tick > first]
            else:
                olds, before, _ = was
                floor = before.get(pubend, 0)
                items = [
                    it
                    for it in items
                    if it.tick > first or (it.tick > floor and _old_match(olds, level, pubend, it))
                ]
            if start is not None and items and items[-1].tick > first:
                del start[pubend]  # the stream is past it
                if not start:
                    self._gate_passed(dest, levels)
            if items:
                per[dest] = items
            else:
                del per[dest]

    # -- time -------------------------------------------------------------------------------------

    def on_timer(self, now: float) -> list:
        owed, suspected = self.detector.poll(now)
        out: list = [(PEER, p, m.Heartbeat()) for p in owed if p in self.links_up]
        for p in suspected:
            out.append((DROP_PEER, p, f"no frame from {p} for {self.detector.timeout:.1f}s"))
            out += self.link_down(p, now)
        if self.router is not None:
            out += self._to_peers(self.router.on_timer(now))
            for keeper in self.router.given_up:
                text = (
                    f"keeper {keeper} has not acknowledged this broker's profile through "
                    f"{MAX_RESENDS} resends: subscriptions waiting for it start without it "
                    "(incomplete); it is sent the profile again until it acknowledges"
                )
                out.append((NOTICE, "warning", text))
            self.router.given_up.clear()
        if self.reliable:
            out += self._reliable_timer(now)
        return out + self._release_waits(now)

    def next_deadline(self) -> float:
        deadline = self.detector.next_deadline()
        deadlines = [w[3] for w in self._waits if w[3] is not None]
        if deadlines:
            deadline = min(deadline, min(deadlines))
        if self.router is not None:
            deadline = min(deadline, self.router.next_deadline())
        if self.reliable:
            deadline = min(deadline, self._reliable_deadline())
        return deadline

    def note_sent(self, peer: str, now: float) -> None:
        """The driver wrote a frame to ``peer``: no heartbeat is owed for a while."""
        self.detector.sent(peer, now)

    # -- introspection ----------------------------------------------------------------------------

    def stats(self) -> m.Stats:
        c = self.counters
        return m.Stats(
            broker=self.id,
            incarnation=str(self.incarnation),
            clients=len(self._clients),
            subscriptions=self._n_subs,
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
        )


@attrs.define(eq=False)
class _Held:
    """A publish waiting for the log: acknowledged once the log has committed up to ``wait``
    (its last tick, or the earlier one its duplicates went in)."""

    conn: int
    seq: int
    first: int
    last: int
    events: list
    wait: int
    duplicates: int


class _Indexed:
    """A profile in a graph of its own, for testing events against while it changes (see
    :func:`_indexed`)."""

    __slots__ = ("graph",)

    def __init__(self) -> None:
        self.graph = ProfileGraph()

    def matches(self, attributes) -> bool:
        return bool(self.graph.match(attributes))


def _indexed(
    profile: Profile, slice_units: int, small: int
) -> Generator[int, None, Profile | _Indexed]:
    """Something with ``matches(attributes)`` for ``profile``: the profile itself when it is
    small, else the profile indexed in a graph of its own (built a slice at a time), so that
    testing an event costs a match, not a test of every conjunction."""
    if len(profile.effective) <= small:
        return profile
    indexed = _Indexed()
    cost = 0
    for conj in profile.effective:
        indexed.graph.add(conj, 0)
        cost += COST_PER_WEIGHT * weight(conj)
        if cost >= slice_units:
            yield cost
            cost = 0
    yield cost
    return indexed


def _copies(counts: dict) -> Iterator[Conjunction]:
    """The conjunctions of a ``{conjunction: copies}`` count as it is now, each as often as it
    is held (the count is copied here: it changes while they are taken out). The copy lets go
    of each as it is handed out, so a large profile is freed a chunk at a time as it is taken
    out, not all at once when the last chunk is done (16,384 conjunctions took 18 ms to free)."""
    items = list(counts.items())
    items.reverse()

    def handed_out() -> Iterator[Conjunction]:
        while items:
            conj, n = items.pop()
            for _ in range(n):
                yield conj

    return handed_out()


def _old_match(olds: tuple, level: int, pubend: str, it: m.EventItem) -> bool:
    """A changing subscription's old profiles all match ``it`` — each where it is still needed
    (up to the starting point of the profile that replaced it, when that was known)."""
    attributes = it.event.attributes
    for profile, upto in olds:
        if upto is not None:
            start = upto[level]
            if start is not None and it.tick > start.get(pubend, 0):
                continue
        if not profile.matches(attributes):
            return False
    return True


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


_BEST_EFFORT_REFUSES = dict.fromkeys(
    _RELIABLE_ONLY, _refused("{kind} from {peer}, but delivery is best effort")
)
FROM_PEER_FLOODING = {
    **_LINKS,
    **_BEST_EFFORT_REFUSES,
    m.Events: lambda core, peer, msg, now: core._on_flooded(peer, msg.pubend, msg.items),
    m.Profiles: _refused("profile message from {peer}, but this broker floods"),
    m.ProfileAck: _refused("profile message from {peer}, but this broker floods"),
}
FROM_PEER_BEST_EFFORT = {
    **_LINKS,
    **_BEST_EFFORT_REFUSES,
    m.Events: lambda core, peer, msg, now: core._on_routed(peer, msg.pubend, msg.items),
    m.Profiles: BrokerCore._on_profile_message,
    m.ProfileAck: BrokerCore._on_profile_message,
}
FROM_PEER_RELIABLE = {
    **_LINKS,
    m.Events: lambda core, peer, msg, now: core._on_reliable_events(
        peer, msg.pubend, msg.items, now, msg.vm
    ),
    m.Profiles: BrokerCore._on_profile_message,
    m.ProfileAck: BrokerCore._on_profile_message,
    m.Silence: BrokerCore._on_silence,
    m.Nack: lambda core, peer, msg, now: core.repair.on_nack(msg, now),
    m.Recovered: lambda core, peer, msg, now: core.repair.on_recovered(msg, now),
    m.AckAsk: lambda core, peer, msg, now: core.release.on_ack_ask(peer, msg, now),
    m.Ack: lambda core, peer, msg, now: core.release.on_ack(msg),
    m.Clocks: _checked_values(lambda core, peer, msg, now: core._on_clocks(peer, msg.clocks)),
    m.Vector: _checked_values(BrokerCore._on_vector),
    m.ProfileWant: _checked_values(
        lambda core, peer, msg, now: core._to_peers(core.router.on_want(msg, now))
    ),
}
