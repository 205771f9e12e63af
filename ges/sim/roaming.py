"""Durable clients in the simulator: sessions that go away, come back, are taken over and moved.

Each durable client holds one session, homed at the replicator of a broker drawn per seed
(ges.durable). The simulator's clients talk to the replicator's core directly — the
runtime's follow connection through the client's broker (ges.runtime.sessions) is not
simulated — so a *move* is a new connection with the session's token, which is what a move
is to the replicator. During the publishing window each client, ``roams`` times: goes away
for a while and comes back; is taken over by a new connection while the old one is still
open; is moved by an operator (``SessionControl("roam")``, the old connection told where to
go); or comes back as a new process that kept no token, after a clean stop (its last
acknowledgement kept by the replicator: ``SessionAck.req``, answered once durable). Its
replicator crashes with everything else the faults pick, and it reconnects until the
replicator is back. It acknowledges each batch a little after it arrives, as the client
library does when the application asks for the next, and drops what it has had by epoch.

The checker (ges.sim.checker) sees each session as one subscription: from its first
``SessionOpened`` on, every matching event published must arrive once, in order per pubend,
across every move — a gap notice would be a violation too (no log drops anything here).
"""

from __future__ import annotations

import itertools

import attrs

from ges.durable import home_replicator
from ges.matching.model import Profile, profile_to_wire
from ges.sim.checker import Checker
from ges.wire import messages as m

#: Seconds between attempts to reach a replicator that is down.
RETRY = 0.2
#: Seconds a clean stop waits for its acknowledgement to be kept (the library's KEPT_WAIT).
KEPT_WAIT = 2.0
#: Connection numbers of durable clients start here (others use lower ones).
FIRST_CONN = 50_000


@attrs.define(eq=False)
class Durable:
    name: str
    profile: Profile
    replicator: str
    #: the broker it is at (the replicator hands its session over to the one of that
    #: broker's unit once it has stayed there a while: ges.core.handover)
    at: str
    #: the current connection (None: away), and the epoch it has up to (the token's)
    conn: int | None = None
    epoch: int = -1
    store: str = ""
    #: connections taken over or moved away: what comes on them is not this client's now
    old: set = attrs.Factory(set)
    #: deliveries dropped as had already (by epoch), and moves made
    dropped: int = 0
    moves: int = 0
    #: times its session was handed over to another replicator (ges.core.handover)
    handovers: int = 0
    #: a clean stop's acknowledgement waiting to be kept (its req; 0: none)
    stopping: int = 0
    #: an open of its session was answered (later ones resume with what is stored)
    entered: bool = False


class Roaming:
    """The durable clients of one run (see the module docstring)."""

    def __init__(self, sim, rng, checker: Checker, profiles: list[Profile]):
        self.sim = sim
        self.rng = rng
        self.checker = checker
        self._conns = itertools.count(FIRST_CONN)
        brokers = sorted(sim.topology.brokers)
        self.clients: dict[str, Durable] = {}
        for i, profile in enumerate(profiles):
            at = rng.choice(brokers)
            self.clients[f"d{i}"] = Durable(f"d{i}", profile, home_replicator(sim.topology, at), at)
        self._by_conn: dict[int, Durable] = {}

    @property
    def moves(self) -> int:
        return sum(d.moves for d in self.clients.values())

    @property
    def handovers(self) -> int:
        return sum(d.handovers for d in self.clients.values())

    def start(self) -> None:
        for d in self.clients.values():
            self.checker.subscribe(("session", d.name, 1), d.profile)
            self._connect(d, True)

    def _connect(self, d: Durable, subs: bool = False, token: bool = True) -> None:
        """Open ``d``'s session; with its subscriptions until an open of it was answered (as
        the library does: a crash may have lost a session not answered yet)."""
        if d.conn is not None:
            return
        subs = subs or not d.entered
        conn = next(self._conns)
        self._by_conn[conn] = d
        sub = m.SessionSub(1, d.profile.id, profile_to_wire(d.profile))
        msg = m.SessionOpen(
            d.name,
            [sub] if subs else None,
            replicator=d.replicator,
            store=d.store if token else "",
            epoch=d.epoch if token else -1,
            at=d.at,
        )
        d.conn = conn  # what it answers comes at once, on this connection
        if not self.sim.client(d.replicator, conn, msg):  # its replicator is down: again later
            d.conn = None
            self.sim.at(self.sim.now + RETRY, self._connect, d, subs, token)

    # -- what the replicator says ------------------------------------------------------------

    def on_session(self, broker: str, conn: int, msg, now: float) -> None:
        d = self._by_conn.get(conn)
        if d is None:
            return
        kind = type(msg)
        if conn in d.old or conn != d.conn:
            return  # a connection this client left
        if kind is m.SessionOpened:
            if not d.entered:  # its first answer (made by it, or by an open a crash cut off)
                self.checker.subscribed(("session", d.name, 1), now)
            d.entered = True
            d.store = msg.store
            if d.epoch < 0:
                d.epoch = msg.start
        elif kind is m.SessionEvents and d.stopping:
            pass  # a process stopping takes no more (what comes now comes again after it)
        elif kind is m.SessionEvents:
            fresh = [it for it in msg.items if it.epoch > d.epoch]
            d.dropped += len(msg.items) - len(fresh)
            for it in fresh:
                if it.gap_to:
                    self.checker._violate(
                        now,
                        self.checker.subs[("session", d.name, 1)],
                        it.pubend,
                        f"gap notice {it.item.tick}..{it.gap_to}: {it.why}",
                    )
                    continue
                self.checker.deliver(
                    ("session", d.name, 1),
                    it.pubend,
                    [(it.item.tick, dict(it.item.event.attributes))],
                    now,
                )
            if fresh:
                d.epoch = fresh[-1].epoch
                when = now + self.rng.uniform(0.0, 0.02)
                self.sim.at(when, self._ack, d, conn, d.epoch)
        elif kind is m.SessionKept and msg.req == d.stopping:
            d.stopping = 0
            self._leave(d, token=False)  # its acknowledgement is durable: it may forget
        elif kind is m.SessionClosed:
            d.stopping = 0  # (it goes on elsewhere with its token: no clean stop now)
            d.old.add(conn)
            d.conn = None
            if msg.to:  # moved by an operator: it comes back there
                d.at = msg.to
            if msg.replicator and msg.replicator != d.replicator:  # handed over, or being
                d.handovers += msg.reason.startswith("handed over")
                d.replicator, d.store, d.epoch = msg.replicator, "", -1
            self.sim.at(now + self.rng.uniform(0.01, 0.2), self._connect, d)
        elif kind is m.Error:
            self.checker.broker_fault(now, broker, f"session {d.name}: {msg.reason}")

    def on_crash(self, broker: str) -> None:
        for d in self.clients.values():
            if d.replicator == broker and d.conn is not None:
                # a clean stop whose acknowledgement was not kept yet: the process does not
                # forget the session (``ges subscribe`` warns that what came after the last
                # one kept may come again; this client keeps its token instead)
                d.stopping = 0
                d.old.add(d.conn)
                d.conn = None
                self.sim.at(self.sim.now + RETRY, self._connect, d)

    def _ack(self, d: Durable, conn: int, epoch: int) -> None:
        if d.conn == conn:
            self.sim.client(d.replicator, conn, m.SessionAck(d.name, epoch))

    # -- moves ---------------------------------------------------------------------------------

    def roam(self, d: Durable) -> None:
        """One move of ``d``, drawn from the seed."""
        sim = self.sim
        if d.conn is None or d.stopping or d.replicator not in sim.cores:
            return  # (away, stopping, or its replicator is down: no move now)
        d.moves += 1
        kind = self.rng.choice(("away", "takeover", "redirect", "fresh"))
        if kind != "redirect":  # it comes back at another broker
            d.at = self.rng.choice(sorted(sim.topology.brokers))
        if kind == "takeover":  # a new connection while the old one is open
            d.old.add(d.conn)
            d.conn = None
            self._connect(d)
        elif kind == "redirect":  # an operator moves it: the old connection is told
            ctl = next(self._conns)
            to = self.rng.choice(sorted(sim.topology.brokers))
            sim.client(d.replicator, ctl, m.SessionControl("roam", d.name, to))
            sim.close_client(d.replicator, ctl)
        elif kind == "fresh":  # a clean stop: what it has is acknowledged, and kept, first
            d.stopping = req = next(self._conns)
            sim.client(d.replicator, d.conn, m.SessionAck(d.name, d.epoch, req=req))
            sim.at(sim.now + KEPT_WAIT, self._not_kept, d, req)
        else:  # away for a while, keeping its token
            self._leave(d, token=True)

    def _not_kept(self, d: Durable, req: int) -> None:
        """No ``SessionKept`` in time (its open was still unanswered, say, or it was taken
        over): the process does not forget the session, and leaves with its token."""
        if d.stopping == req and d.conn is not None:
            d.stopping = 0
            self._leave(d, token=True)

    def _leave(self, d: Durable, token: bool) -> None:
        """``d`` disconnects and comes back a while later (``token``: with it; else as a new
        process that knows nothing of the session)."""
        sim, conn = self.sim, d.conn
        if not token:
            d.epoch = -1
        d.old.add(conn)
        d.conn = None
        sim.close_client(d.replicator, conn)
        back = sim.now + self.rng.uniform(0.05, 1.0)
        sim.at(back, self._connect, d, False, token)
