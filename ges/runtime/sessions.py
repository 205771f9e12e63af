"""Durable sessions at the client's broker: finding a session's replicator and following it.

Theory of operation
-------------------
A client opens (or resumes) durable session NAME at any broker. That broker finds the
session's replicator — the one its resume token names, else the first of the topology's
replicators, nearest first, that holds NAME; a new session is homed at the replicator of the
broker's own unit (ges.durable) — and opens it there for the client, saying who the client is
and where. A replicator on this broker is asked directly (ges.core.replicator); another one
through a *follow* connection: one per replicator this broker has clients for, opened with
``Hello(role="sessions")`` and this broker's certificate (the replicator trusts what a broker
says of its clients, as it trusts the events it routes). The replicator streams the session's
events on it in epoch order, within a window the client's acknowledgements open, and this
broker passes them to the client, and the acknowledgements back. When the client goes the
replicator is told (``SessionLeave``): the session stays and goes on storing. When the follow
connection fails every client it served is told to open its session again (``retry``). An
MQTT client's leave says more (still ``SessionLeave``): how long its session outlives it, or
that it ends (a 5.0 DISCONNECT's Session Expiry Interval), and a will with a delay for the
replicator to hold (the broker's last words for the client, its permission checked there).

A name lookup that cannot ask every replicator (one is unreachable) does not create the
session elsewhere: the client is told to try again, or to present its token.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque

import msgspec
import trio

from ges.core import ToClient
from ges.durable import home_replicator, replicator_brokers, session_name_problem
from ges.runtime.admission import MAX_HELLO_FRAME
from ges.runtime.retained_asks import RetainedAsking
from ges.security.access import ANONYMOUS
from ges.transport.connection import Connection, ConnectionClosed
from ges.wire import FrameError, encode
from ges.wire import messages as m
from ges.wire.frames import DEFAULT_MAX_FRAME
from ges.wire.messages import hello_for

#: Seconds to wait for a replicator to answer a lookup or an open.
ASK_WAIT = 5.0
#: Seconds an MQTT clean session's CONNACK waits at most for the persistent session its client
#: id had to be found (then it connects, and the broker logs that it could not tell).
DISCARD_WAIT = 2.0
#: What an open's client becomes once it has gone before the answer (a leave follows the
#: answer), or once it was taken over here by a new connection (nothing follows: the new one's
#: open, on the same follow connection, takes the session). Not connection numbers: nothing
#: is sent to them (``_told``).
_LEFT, _TAKEN = "left", "taken"
#: Seconds to wait for a follow connection to a replicator to open.
FOLLOW_CONNECT_WAIT = 5.0
#: Seconds between keepalives on a follow connection (as a client library's).
KEEPALIVE = 10.0
#: Changes to be kept (SessionAck or SessionQos2 with a req) one follow connection remembers
#: the client of, waiting for SessionKept (the oldest beyond go unanswered).
MAX_KEEPING = 4096
#: What a client may send about durable sessions (the runtime hands them here).
SESSION_REQUESTS = frozenset(
    {m.SessionOpen, m.SessionAck, m.SessionQos2, m.SessionControl, m.SessionLeave, m.RetainedAsk}
)


class Follow:
    """A follow connection to a replicator's broker."""

    def __init__(self, replicator: str):
        self.replicator = replicator
        self.conn: Connection | None = None
        self.ready = trio.Event()
        self.failed: str | None = None
        #: our req -> (client conn, the client's req, a waiter or None)
        self.asks: dict[int, list] = {}
        #: asks of what is retained: those not answered yet (our req -> their entry in
        #: ``asks``: one per client at a time); those sent (our req -> (ask, bytes as the
        #: replicator counts them)), and their bytes; those not sent yet, (req, ask, bytes) in
        #: order, and their bytes (SessionDesk._send_asks); when those refused for now were
        #: first refused (our req -> loop time), and whether the next try waits
        self.asking: dict[int, list] = {}
        self.sent: dict[int, tuple[m.RetainedAsk, int]] = {}
        self.ask_bytes = 0
        self.waiting: deque[tuple[int, m.RetainedAsk, int]] = deque()
        self.waiting_bytes = 0
        self.refused_since: dict[int, float] = {}
        self.pausing = False
        #: sessions it serves: name -> client conn
        self.sessions: dict[str, int] = {}
        #: changes passed on to be kept (a SessionAck or SessionQos2 with a req): (session
        #: name, the client's req) -> the client, so that SessionKept goes back to that client
        #: only (not to one that took the session over meanwhile); at most MAX_KEEPING
        self.keeping: OrderedDict[tuple[str, int], int] = OrderedDict()


class SessionDesk(RetainedAsking):
    """The client-side half of durable sessions at one broker (see the module docstring);
    the asks of what is retained its clients make: :class:`RetainedAsking`."""

    def __init__(self, server):
        self.server = server
        self.topology = server.topology
        self.id = server.id
        self.home = home_replicator(self.topology, self.id)
        self.log = logging.getLogger(f"ges.broker.{self.id}.sessions")
        self._follows: dict[str, Follow] = {}
        self._reqs = itertools.count(1)
        #: client conn -> {session name: replicator} it holds here
        self._held: dict[int, dict[str, str]] = {}
        #: set (and replaced) as an open sent on a follow connection is answered or dropped
        self._answers = trio.Event()

    @property
    def core(self):
        return self.server.core

    # -- a client's requests --------------------------------------------------------------------

    async def request(self, conn_id: int, msg) -> list:
        """A client's session request; the outputs for the runtime to dispatch."""
        kind = type(msg)
        now = trio.current_time()
        if kind is m.SessionAck or kind is m.SessionQos2:
            take = _FROM_FOLLOWER[kind]
            if self.server.is_follower(conn_id):  # passed on by the client's broker
                return take(self.core.replicator, conn_id, msg) if self.core.replicator else []
            rep = self._held.get(conn_id, {}).get(msg.name)
            if rep is None:
                return []
            if rep == self.id:  # the replicator takes it only from the session's follower
                return take(self.core.replicator, conn_id, msg)
            follow = self._follows.get(rep)
            # only from the client the session streams to (not one whose open is unanswered)
            if (
                follow is not None
                and follow.conn is not None
                and follow.sessions.get(msg.name) == conn_id
            ):
                if msg.req:
                    follow.keeping[(msg.name, msg.req)] = conn_id
                    if len(follow.keeping) > MAX_KEEPING:
                        follow.keeping.popitem(last=False)  # (its client's wait ends unanswered)
                self._send(follow, msg)
            return []
        if kind is m.SessionLeave:
            if self.server.is_follower(conn_id):  # a broker's client of a session here went
                return self._leave(conn_id, self.id, msg, now)
            if not self.server.is_mqtt(conn_id):
                return []  # (what a GES client library never sends)
            # an MQTT 5.0 DISCONNECT's expiry; a will only ever comes through last words
            return self.leave(conn_id, msgspec.structs.replace(msg, will=None), now)
        if kind is m.RetainedAsk:
            return await self._retained(conn_id, msg)
        follower = self.server.is_follower(conn_id)
        who, operator = ("", True) if follower else self._who(conn_id)
        if follower and kind is m.SessionControl and msg.action == "end":
            who, operator = msg.owner, msg.operator  # for a client of that broker
        if kind is m.SessionControl and msg.action == "discard" and not follower:
            return await self._discard(conn_id, msg, who, operator, now)
        if kind is m.SessionControl:
            replicator = self.core.replicator
            if replicator is None:
                reason = f"broker {self.id} holds no durable sessions (it is not a replicator)"
                return [ToClient(conn_id, m.Error(reason, req=msg.req))]
            if msg.action == "find":  # a broker looking for it, its owner, or an operator
                found = replicator.find(msg.name, now, lookup=follower)
                if not operator:
                    found.sessions[:] = [s for s in found.sessions if s.owner in ("", who)]
                return [ToClient(conn_id, msgspec.structs.replace(found, req=msg.req))]
            return replicator.control(conn_id, msg, who, operator, now)
        if follower:  # a broker opening a session for its client here
            return self._open_here(conn_id, msg, now)
        why = session_name_problem(msg.name) or self._anonymous(conn_id)
        if why is not None:
            return [ToClient(conn_id, m.Error(why, req=msg.req))]
        msg = msgspec.structs.replace(msg, owner=who, operator=operator, at=self.id)
        return await self._open(conn_id, msg, now)

    async def _discard(
        self, conn_id: int, msg: m.SessionControl, who: str, operator: bool, now: float
    ) -> list:
        """End session ``msg.name`` if it exists and is this client's (an MQTT clean session
        discards the persistent one its client id had, §3.1.2.4); answered either way."""
        nothing = [ToClient(conn_id, m.SessionList([], req=msg.req))]
        if session_name_problem(msg.name) or self._anonymous(conn_id):
            return nothing  # it could not have one
        rep, why = await self._find(msg.name, DISCARD_WAIT)  # a CONNACK waits no longer
        if rep is None:
            if why is not None:
                self.log.warning("client %s: session %s not discarded: %s", conn_id, msg.name, why)
            return nothing
        end = m.SessionControl("end", msg.name, req=msg.req, owner=who, operator=operator)
        if rep == self.id:
            return self.core.replicator.control(conn_id, end, who, operator, now)
        follow = await self._follow(rep)
        if follow.conn is None:
            return nothing
        req = next(self._reqs)
        follow.asks[req] = [conn_id, msg.req, None, None]
        self._send(follow, msgspec.structs.replace(end, req=req))
        return []

    def _anonymous(self, conn_id: int) -> str | None:
        """Why this client may not hold a durable session (None: it may): one that proved no
        identity has no name of its own to own it by."""
        access = self.server.access
        grant = None if access is None else access.grant(conn_id)
        if grant is not None and not isinstance(grant, str) and ANONYMOUS in grant.roles:
            return "an anonymous client may not hold a durable session (it has no name of its own)"
        return None

    def _who(self, conn_id: int) -> tuple[str, bool]:
        access = self.server.access
        if access is None:
            return "", True
        grant = access.grant(conn_id)
        if isinstance(grant, str):
            return access.who(conn_id), False
        return grant.who, grant.operator

    def _open_here(self, conn_id: int, msg: m.SessionOpen, now: float) -> list:
        replicator = self.core.replicator
        if replicator is None:
            reason = f"broker {self.id} holds no durable sessions (it is not a replicator)"
            return [ToClient(conn_id, m.Error(reason, req=msg.req))]
        self.core.subscriptions.now = now
        return replicator.open(conn_id, msg, now, time.time())

    async def _open(self, conn_id: int, msg: m.SessionOpen, now: float) -> list:
        reps = set(replicator_brokers(self.topology, self.id))
        if msg.replicator in reps:
            rep = msg.replicator
        else:
            # one it would only resume (never make) waits no longer than a discard would
            rep, why = await self._find(msg.name, float("inf") if msg.create else DISCARD_WAIT)
            if why is not None:  # the client may try again
                return [ToClient(conn_id, m.SessionClosed(msg.name, why, retry=True))]
            if rep is None:
                rep = self.home
        if rep == self.id:
            self._held.setdefault(conn_id, {})[msg.name] = rep
            return self._open_here(conn_id, msg, now)
        follow = await self._follow(rep)
        if follow.conn is None:
            reason = f"replicator {rep} of session {msg.name!r} is unreachable: {follow.failed}"
            return [ToClient(conn_id, m.SessionClosed(msg.name, reason, retry=True))]
        out = []
        note = m.SessionClosed(msg.name, f"taken over at {self.id}")
        holder = follow.sessions.get(msg.name)
        if holder is not None and holder != conn_id and self._may_take(holder, msg):
            # taken over from another client of this broker: it is told now, and its leaving
            # later must not end the new one's stream (both share this follow connection)
            del follow.sessions[msg.name]
            self._held.get(holder, {}).pop(msg.name, None)
            out.append(ToClient(holder, note))
        told = {o.conn for o in out}
        for ask in follow.asks.values():  # another client's open not answered yet: the same
            # (the replicator sees one follow connection, whose later open takes its place)
            opener = ask[0]
            mine = type(opener) is not int or opener == conn_id
            if ask[2] is None and ask[3] == msg.name and not mine and self._may_take(opener, msg):
                ask[0] = _TAKEN
                if opener not in told:
                    told.add(opener)
                    out.append(ToClient(opener, note))
                self._opens_done()  # (it waits for no answer now)
        req = next(self._reqs)
        follow.asks[req] = [conn_id, msg.req, None, msg.name]
        self._send(follow, msgspec.structs.replace(msg, req=req))
        return out

    def opening(self, conn_id: int) -> bool:
        """Client ``conn_id`` has an open on its way to another broker's replicator."""
        return any(
            ask[0] == conn_id and ask[2] is None and ask[3] is not None
            for follow in self._follows.values()
            for ask in follow.asks.values()
        )

    async def answered(self, conn_id: int) -> None:
        """Wait (at most ASK_WAIT) until client ``conn_id``'s opens sent on are answered. The
        runtime reads nothing more of the client meanwhile, as it waits for its other
        requests to go in: a publish after a change of its session's subscriptions is then
        matched against them (the profile has reached this broker by the time the answer
        has, in practice; the replicator answers once it entered it)."""
        with trio.move_on_after(ASK_WAIT):
            while self.opening(conn_id):
                await self._answers.wait()

    def _opens_done(self) -> None:
        self._answers.set()
        self._answers = trio.Event()

    def _may_take(self, holder: int, msg: m.SessionOpen) -> bool:
        """Whether ``msg``'s opener may take the session over from client ``holder`` here
        before its replicator answers: the same identity, or an operator (another is refused
        there, and the holder keeps it)."""
        return msg.operator or self._who(holder)[0] == msg.owner

    async def _find(self, name: str, within: float = float("inf")) -> tuple[str | None, str | None]:
        """The replicator holding session ``name`` (None: none does), or why that cannot be
        told (``within`` seconds have passed, say)."""
        with trio.move_on_after(within):
            return await self._lookup(name)
        return None, f"the replicators did not answer within {within:g}s"

    async def _lookup(self, name: str) -> tuple[str | None, str | None]:
        missing = []
        for rep in replicator_brokers(self.topology, self.id):
            if rep == self.id:
                if self.core.replicator is not None and name in self.core.replicator.sessions:
                    return rep, None
                continue
            follow = await self._follow(rep)
            answer = None
            if follow.conn is not None:
                req = next(self._reqs)
                done = trio.Event()
                follow.asks[req] = [None, 0, done]
                self._send(follow, m.SessionControl("find", name, req=req))
                try:
                    with trio.move_on_after(ASK_WAIT):
                        await done.wait()
                finally:  # a caller that gives up leaves nothing behind
                    answer = follow.asks.pop(req, [None, 0, None])[3:]
            if not answer or answer[0] is None:
                missing.append(rep)
            elif answer[0].sessions:
                return rep, None
        if missing:
            return None, (
                f"cannot tell whether durable session {name!r} exists: replicator "
                f"{', '.join(missing)} did not answer (try again, or resume with its token)"
            )
        return None, None

    def client_closed(self, conn_id: int, now: float) -> list:
        """A client of this broker went: its sessions stay, and go on storing."""
        held = self._held.pop(conn_id, {})
        out: list = []
        for follow in self._follows.values():  # asks it was waiting for: nobody waits now
            for req in [r for r, ask in follow.asks.items() if ask[0] == conn_id]:
                if follow.asks[req][3] is None:
                    del follow.asks[req]
                else:  # an open: a session it opens is left as soon as it is open
                    follow.asks[req][0] = _LEFT
            self._forget_asks(follow, conn_id)
        for name, rep in held.items():
            out += self._leave(conn_id, rep, m.SessionLeave(name), now)
        if self.server.is_follower(conn_id) and self.core.replicator is not None:
            out += self.core.replicator.follower_closed(conn_id, now)
        return out

    def taken_over(self, conn_id: int, name: str, now: float) -> list:
        """Client ``conn_id`` of this broker is taken over by a new connection of its client
        here (MQTT, §3.1.4), before that one asks for session ``name``: the session is left
        as its client being back (``SessionLeave.back``: not ended, whatever it was opened
        for), and nothing of the old connection's leaving reaches its replicator later."""
        for follow in self._follows.values():  # an open not answered yet: nothing follows it
            for ask in follow.asks.values():
                if ask[0] == conn_id and ask[3] == name:
                    ask[0] = _TAKEN
                    self._opens_done()
        return self.leave(conn_id, m.SessionLeave(name, back=True), now)

    def reaches(self, conn_id: int, name: str) -> bool:
        """Client ``conn_id`` holds session ``name`` (it streams to it) and its replicator can
        be told now (it is here, or its follow connection is up)."""
        rep = self._held.get(conn_id, {}).get(name)
        if rep is None:
            return False
        if rep == self.id:
            return self.core.replicator is not None
        follow = self._follows.get(rep)
        return follow is not None and follow.conn is not None

    def leave(self, conn_id: int, leave: m.SessionLeave, now: float) -> list:
        """Client ``conn_id`` leaves session ``leave.name`` (if it holds it), saying how long
        the session outlives it, or that it ends, or with a will its replicator is to hold
        (the broker's last words for a client, its publish permission checked)."""
        rep = self._held.get(conn_id, {}).pop(leave.name, None)
        return [] if rep is None else self._leave(conn_id, rep, leave, now)

    def _leave(self, conn_id: int, rep: str, leave: m.SessionLeave, now: float) -> list:
        """Client ``conn_id`` leaves session ``leave.name``, which replicator ``rep`` holds."""
        if rep == self.id:
            if self.core.replicator is None:
                return []
            return self.core.replicator.leave(conn_id, leave, now)
        follow = self._follows.get(rep)
        if follow is not None and follow.sessions.get(leave.name) == conn_id:
            del follow.sessions[leave.name]
            if follow.conn is not None:
                self._send(follow, leave)
        return []

    # -- follow connections ---------------------------------------------------------------------

    async def _follow(self, rep: str) -> Follow:
        follow = self._follows.get(rep)
        if follow is None or (follow.ready.is_set() and follow.conn is None):
            follow = self._follows[rep] = Follow(rep)
            self.server._nursery.start_soon(self._run_follow, follow)
        with trio.move_on_after(FOLLOW_CONNECT_WAIT + 1):
            await follow.ready.wait()
        return follow

    async def _run_follow(self, follow: Follow) -> None:
        rep = follow.replicator
        spec = self.topology.brokers[rep]
        stream = None
        try:
            with trio.fail_after(FOLLOW_CONNECT_WAIT):
                stream = await trio.open_tcp_stream(spec.host, spec.port)
                stream = await self.server.links._secure(stream, rep)
                conn = Connection(
                    stream, label=f"sessions {self.id}->{rep}", max_frame=MAX_HELLO_FRAME
                )
                await stream.send_all(encode(hello_for(self.topology, "sessions", self.id)))
                reply = await conn.receive_one()
        except (
            OSError,
            trio.TooSlowError,
            trio.BrokenResourceError,
            ConnectionClosed,
            FrameError,
        ) as exc:
            follow.failed = str(exc) or type(exc).__name__
            follow.ready.set()
            if stream is not None:
                await trio.aclose_forcefully(stream)
            return
        if not isinstance(reply, m.Welcome):
            follow.failed = getattr(reply, "reason", "no welcome")
            follow.ready.set()
            await conn.aclose()
            return
        conn.decoder.max_frame = DEFAULT_MAX_FRAME
        follow.conn = conn
        follow.ready.set()
        why = "closed"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.writer)
                nursery.start_soon(self._keepalive, follow)
                try:
                    async for batch in conn.read_messages():
                        outs: list = []
                        for msg in batch:
                            outs += self._from_replicator(follow, msg)
                        if outs:
                            await self.server._dispatch(outs)
                except FrameError as exc:
                    why = str(exc)
                why = conn.close_reason or why
                nursery.cancel_scope.cancel()
        finally:
            follow.conn = None
            follow.failed = why
            outs = []
            for name, client in follow.sessions.items():
                self._held.get(client, {}).pop(name, None)
                note = m.SessionClosed(name, f"replicator {rep} unreachable: {why}", retry=True)
                outs.append(ToClient(client, note))
            follow.sessions.clear()
            for ask in follow.asks.values():
                if ask[2] is not None:
                    ask[2].set()
                elif ask[3] is None:  # an ask of what is retained, or an end
                    note = m.Error(f"replicator {rep} unreachable: {why}", req=ask[1])
                    outs += _told(ask[0], note)
                else:  # an open waiting for its answer: open it again later
                    note = m.SessionClosed(
                        ask[3], f"replicator {rep} unreachable: {why}", retry=True
                    )
                    outs += _told(ask[0], note)
            follow.asks.clear()
            self._opens_done()
            self._forget_all_asks(follow)
            with trio.CancelScope(shield=True):
                await conn.aclose()
                if outs:
                    await self.server._dispatch(outs)

    async def _keepalive(self, follow: Follow) -> None:
        """A frame every KEEPALIVE seconds: the replicator closes a connection it has heard
        nothing from for longer than its clients' idle deadline."""
        while follow.conn is not None:
            await trio.sleep(KEEPALIVE)
            self._send(follow, m.Heartbeat())

    def _send(self, follow: Follow, msg) -> None:
        conn = follow.conn
        if conn is None:
            return
        try:
            if not conn.send_nowait(encode(msg)):
                conn.close("follow connection over its queue bound")
        except ConnectionClosed:
            pass

    def _from_replicator(self, follow: Follow, msg) -> list:
        kind = type(msg)
        if kind is m.SessionKept:  # to the client that asked (gone: to no one)
            client = follow.keeping.pop((msg.name, msg.req), None)
            return [] if client is None else [ToClient(client, msg)]
        if kind is m.SessionEvents:
            client = follow.sessions.get(msg.name)
            return [] if client is None else [ToClient(client, msg)]
        if kind in _ANSWERS:
            done = self._ask_answered(follow, msg)  # (an ask of what is retained)
            if done is not None:
                return done
            ask = follow.asks.get(msg.req)
            if ask is None:
                return []
            client, req, done = ask[:3]
            if done is not None:  # a lookup: the waiter reads the answer
                ask.append(msg if kind is m.SessionList else None)
                done.set()
                return []
            del follow.asks[msg.req]
            if ask[3] is not None:
                self._opens_done()
            if kind is m.SessionOpened:  # streams to this client from now on
                if not self.server.is_client(client):  # it left before the answer
                    if client != _TAKEN:
                        self._send(follow, m.SessionLeave(msg.name))
                    return []
                follow.sessions[msg.name] = client
                self._held.setdefault(client, {})[msg.name] = follow.replicator
            return _told(client, msgspec.structs.replace(msg, req=req))
        if kind is m.SessionClosed:
            ask = follow.asks.get(msg.req) if msg.req else None
            if ask is not None and ask[2] is None and ask[3] == msg.name:  # an open's answer
                del follow.asks[msg.req]
                self._opens_done()
                return _told(ask[0], msgspec.structs.replace(msg, req=ask[1]))
            client = follow.sessions.pop(msg.name, None)
            if client is not None:  # its holder (an open of its on the way is answered later)
                self._held.get(client, {}).pop(msg.name, None)
                return [ToClient(client, msg)]
            # opens still waiting (ended or taken over meanwhile): every opener is told, once,
            # and none waits for an answer any more
            waiting = [r for r, ask in follow.asks.items() if ask[2] is None and ask[3] == msg.name]
            told = []
            for req in waiting:
                opener = follow.asks.pop(req)[0]
                if opener not in told:
                    told.append(opener)
            if waiting:
                self._opens_done()
            return [out for opener in told for out in _told(opener, msg)]
        return []


def _told(client, msg) -> list:
    """``msg`` for the client an open was asked for; nothing once it has gone (``_LEFT``,
    ``_TAKEN``)."""
    return [ToClient(client, msg)] if type(client) is int else []


#: What a session's client sends about its stream, taken from its follower only.
_FROM_FOLLOWER = {
    m.SessionAck: lambda r, conn, msg: r.ack(conn, msg),
    m.SessionQos2: lambda r, conn, msg: r.qos2(conn, msg),
}
#: What a replicator answers to a request of this broker's (by the request's number).
_ANSWERS = frozenset({m.SessionOpened, m.Error, m.SessionList, m.Retained})
