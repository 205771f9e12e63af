"""MQTT clients at a broker: the listener, the CONNECT, and the connection the broker serves.

Theory of operation
-------------------
A broker with an MQTT port (``mqtt_port:`` in the topology, ``--mqtt-port``) listens on it
beside its GES port, over TLS with the network's certificates unless ``--insecure``.
:class:`MqttListener` takes each connection through its CONNECT — the first packet, whole
within ``HANDSHAKE_TIMEOUT`` and at most ``MAX_CONNECT_BYTES`` — and answers it (CONNACK):

* a protocol level other than 3.1 or 3.1.1: code 1; an empty client id with a persistent
  session, or one over ``MAX_CLIENT_ID`` characters: code 2; the broker at its maximum of
  clients: code 3;
* with access control (ges.security.access), the user name is the GES identity and the
  password its token (or a client certificate names it; without either the client id is the
  name an anonymous grant is asked for): a wrong password is code 4, no grant code 5;
* a client id already connected here takes the connection over: the old one is closed.

Then the broker serves the connection as it serves a GES client (``BrokerServer._run_client``):
:class:`MqttConnection` is a :class:`Connection` whose reads turn MQTT packets into GES client
messages and whose sends turn the broker's answers into MQTT packets, both through the
sans-I/O :class:`ges.mqtt.session.MqttSession`. So MQTT clients get what GES clients get:
access checks per request, flow control of publishers, the bound on bytes queued towards a
client (a client that does not keep up is cut as a slow consumer), and the same publish and
delivery paths. Silence of one and a half keepalives ends the connection (§3.1.2.10); so does a
malformed packet (§4.8), after which the client's will, if any, is published — as it is when
the connection ends any way but by DISCONNECT.

A persistent session (clean session 0) is a GES durable session (ges.mqtt.session): its
CONNACK waits for the session's replicator, found wherever it is, to open it — and says whether
it was present. When its replicator hands it over to another (ges.core.handover) the broker
opens it there, the client connected as it was (:meth:`MqttListener._move`).
"""

from __future__ import annotations

import contextlib
import os
import time

import msgspec
import trio

from ges.mqtt import packets as p
from ges.mqtt import v5
from ges.mqtt.frames import DEFAULT_MAX_PACKET, Malformed, PacketReader
from ges.mqtt.session import MqttSession
from ges.runtime.access import Admitted
from ges.runtime.admission import ADMIT_WAIT, REFUSE_WAIT, peer_of
from ges.security.tls import peer_identity
from ges.transport.connection import (
    HANDSHAKE_TIMEOUT,
    READ_SIZE,
    Connection,
    ConnectionClosed,
    linger,
)
from ges.transport.tls import tls_of
from ges.transport.websocket import UpgradeRefused, WebSocketStream
from ges.wire import MAX_EVENT_BYTES, FrameError
from ges.wire import messages as m

#: The largest CONNECT taken: a client id, a will and credentials.
MAX_CONNECT_BYTES = 64 * 1024
#: The largest packet taken after it: a PUBLISH of the largest event GES carries.
MAX_PACKET = min(DEFAULT_MAX_PACKET, MAX_EVENT_BYTES)
MAX_CLIENT_ID = 256
#: Seconds a persistent session's CONNACK waits for its replicator to open it; then CONNACK
#: 3 (server unavailable), and the client tries again (a GES client's open waits as long).
OPEN_WAIT = 15.0


class MqttListener:
    """One broker's MQTT port (see the module docstring)."""

    def __init__(self, server):
        self.server = server
        self.connected: dict[str, MqttConnection] = {}

    async def dismiss(self, stream, why: str) -> None:
        """Refuse a connection (no CONNACK: over the bound on those opening, or before its
        CONNECT), logged once per cause."""
        self.server.counters["clients_refused"] += 1
        self.server.notes.warning(
            f"mqtt {why}", "refused an MQTT connection from %s: %s", peer_of(stream), why
        )
        with trio.CancelScope(shield=True), trio.move_on_after(REFUSE_WAIT):
            await stream.aclose()

    async def _refuse(self, stream, code: int, why: str, level: int = p.LEVEL_311) -> None:
        if level == p.LEVEL_5:  # a 3.1.1 code as 5.0 says it (5.0's own pass as they are)
            code = p.CONNACK_5.get(code, code)
        with (
            trio.move_on_after(REFUSE_WAIT),
            contextlib.suppress(trio.BrokenResourceError, OSError),
        ):
            await stream.send_all(p.encode(p.ConnAck(code), level))
            await linger(stream)  # (packets it sent after its CONNECT would reset it unread)
        await self.dismiss(stream, why)

    async def handle(self, stream) -> None:
        server = self.server
        opening = True
        try:
            got = await self._connect(stream)
            if got is None:
                return
            connect, reader, early = got
            refusal = await self._check(stream, connect)
            if refusal is not None:
                code, why = refusal
                await self._refuse(stream, code, why, connect.level)
                return
            admitted = await self._admit(stream, connect)
            if isinstance(admitted, tuple):
                await self._refuse(stream, *admitted, connect.level)
                return
            server._opening -= 1
            opening = False
            await self._serve(stream, connect, reader, early, admitted)
        finally:
            if opening:
                server._opening -= 1
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async def handle_ws(self, stream) -> None:
        """A connection to the MQTT WebSocket port (``mqtt_ws_port:``): its HTTP upgrade
        (ges.transport.websocket) within ``HANDSHAKE_TIMEOUT``, then as :meth:`handle` (its
        CONNECT within the same again)."""
        ws = WebSocketStream(stream)
        why = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as late:
            try:
                await ws.accept()
            except UpgradeRefused as exc:
                why = str(exc)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                why = f"before its WebSocket upgrade: {exc}"
            except Exception as exc:  # a parser's fault must end this connection, not the broker
                why = f"its WebSocket upgrade failed: {type(exc).__name__}: {exc}"
        if late.cancelled_caught:
            why = f"no WebSocket upgrade within {HANDSHAKE_TIMEOUT:g}s"
        if why is not None:
            self.server._opening -= 1
            await self.dismiss(ws, why)
            return
        await self.handle(ws)

    async def _connect(self, stream):
        """The CONNECT, the reader holding what came after it, and the packets that did."""
        reader = PacketReader(max_packet=MAX_CONNECT_BYTES)
        why = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            try:
                while True:
                    data = await stream.receive_some(READ_SIZE)
                    if not data:
                        why = "closed before its CONNECT"
                        break
                    reader.feed(data)
                    packets = reader.packets()
                    if packets:
                        if packets[0].name != "CONNECT":
                            why = f"its first packet was a {packets[0].name}, not CONNECT"
                            break
                        reader.max_packet = MAX_PACKET
                        return p.decode(packets[0]), reader, packets[1:]
            except Malformed as exc:
                why = str(exc)
            except (trio.BrokenResourceError, OSError) as exc:
                why = f"before its CONNECT: {exc}"
        await self.dismiss(stream, why or f"no CONNECT within {HANDSHAKE_TIMEOUT:g}s")
        return None

    async def _check(self, stream, connect: p.Connect) -> tuple[int, str] | None:
        if connect.level not in (3, p.LEVEL_311, p.LEVEL_5):
            return p.BAD_VERSION, f"MQTT protocol level {connect.level} (3.1.1 and 5.0 are served)"
        if connect.level == p.LEVEL_5:
            props = connect.props
            if p.prop(props, p.AUTH_METHOD) is not None:
                return p.BAD_AUTH_METHOD, "enhanced authentication, which is not served"
            if p.prop(props, p.RECEIVE_MAXIMUM) == 0 or p.prop(props, p.MAXIMUM_PACKET_SIZE) == 0:
                return p.PROTOCOL_ERROR, "a Receive Maximum or Maximum Packet Size of 0"
            if connect.will is not None and connect.will.props:  # they become its event's
                try:
                    v5.attributes_of(connect.will.props, {})
                except Malformed as exc:
                    return p.PROTOCOL_ERROR, f"its will: {exc}"
        elif not connect.client_id and not connect.clean_session:
            return p.BAD_CLIENT_ID, "an empty client id with a persistent session"
        if len(connect.client_id) > MAX_CLIENT_ID:
            return p.BAD_CLIENT_ID, f"a client id of over {MAX_CLIENT_ID} characters"
        most = self._held_keepalive(connect)
        if most is not None and connect.level != p.LEVEL_5:
            # (a 5.0 client is told the server's instead: _serve)
            asked = f"{connect.keepalive}s" if connect.keepalive else "none (0)"
            return p.BAD_CLIENT_ID, f"a keepalive of {asked}, where this server allows {most}s"
        if self.server._admitted >= self.server.max_clients:
            return p.UNAVAILABLE, f"at its maximum of {self.server.max_clients} clients"
        return None

    def _held_keepalive(self, connect: p.Connect) -> int | None:
        """The topology's ``mqtt.max_keepalive`` when the client asks for more, or for none;
        else None (its own holds)."""
        most = self.server.topology.mqtt.max_keepalive
        return None if most is None or 0 < connect.keepalive <= most else most

    async def _admit(self, stream, connect: p.Connect) -> Admitted | None | tuple[int, str]:
        """The client's grant (None: ``--insecure``), or the CONNACK code refusing it and why."""
        access = self.server.access
        if access is None:
            return None
        name = connect.username or connect.client_id
        try:
            secret = (connect.password or b"").decode("utf-8")
        except UnicodeDecodeError:
            return p.BAD_LOGIN, f"user {name!r}: a password that is not UTF-8"
        tls = tls_of(stream)
        cert = None if tls is None else peer_identity(tls)
        if getattr(stream, "cross_origin", False):  # a page of another site, in a browser
            cert = None  # that holds the certificate: its user and token must say who it is
        admitted = None
        with trio.move_on_after(ADMIT_WAIT):
            admitted = await access.admit(name, cert, secret)
        if admitted is None:
            return p.UNAVAILABLE, "too many passwords to check at once"
        if isinstance(admitted.grant, str):
            code = p.BAD_LOGIN if secret and not admitted.token_ok else p.NOT_AUTHORIZED
            return code, admitted.grant
        return admitted

    async def _serve(self, stream, connect, reader, early, admitted) -> None:
        server = self.server
        client_id = assigned = ""
        if not connect.client_id:  # one of its own (5.0 says which, and may keep a session)
            client_id = assigned = f"mqtt-{server.id}-{os.urandom(8).hex()}"
            connect = msgspec.structs.replace(connect, client_id=client_id)
        client_id = connect.client_id
        told = self._held_keepalive(connect)  # 5.0: the one its CONNACK holds it to, if any
        if told is not None:
            connect = msgspec.structs.replace(connect, keepalive=told)
        old = self.connected.get(client_id)
        identity = None if admitted is None else (admitted.client_id, admitted.cert)
        if old is not None and old.identity != identity:  # not another's to take over
            await self._refuse(
                stream, p.BAD_CLIENT_ID, f"client id {client_id!r} is connected as someone else"
            )
            return
        if old is not None:  # §3.1.4: the new connection takes over
            server.log.info("MQTT client %s connected again: closing its old connection", client_id)
            old_id = getattr(old, "conn_id", None)
            if not connect.clean_session and old_id is not None and old.session.name:
                # its client is back in the session (Clean Start ends it: the old one's will
                # goes then): a will with a delay never goes, and the session does not end
                old.session.taken_over = True
                now = trio.current_time()
                await server._dispatch(server.sessions.taken_over(old_id, old.session.name, now))
            old.close_after(b"", "taken over by a new connection with the same client id", 1.0)
        session = MqttSession(
            connect,
            max_packet=MAX_PACKET,
            assigned=assigned,
            max_expiry=server.topology.session_limits.expire_after,
            keepalive=told,
        )
        reader.version = connect.level
        session.reader = reader
        conn = MqttConnection(
            stream,
            session,
            early,
            label=f"mqtt {client_id}",
            max_queued=server.client_queue_bytes,
            write_deadline=server.client_write_deadline,
            frame_deadline=server.frame_deadline,
            idle_deadline=connect.keepalive * 1.5 if connect.keepalive else None,
            budget=server._client_budget,
            watchdog=server.watchdog,
        )
        conn.on_acks = self._acks
        conn.on_move = self._moving
        conn.on_retained = self._retained_steps
        conn.identity = identity
        self.connected[client_id] = conn
        server._admitted += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._open_deadline, conn)
                await server._run_client(client_id, conn, admitted)
                nursery.cancel_scope.cancel()
        finally:
            server._admitted -= 1
            if self.connected.get(client_id) is conn:
                del self.connected[client_id]
            await conn.aclose()  # (once what it still sent is read, if its end said why)

    def _acks(self, conn: MqttConnection, acks: list) -> None:
        """Session acks that arose from the broker's answers (not from a packet the client
        sent): handed to the broker by a task of their own, since they arose while it was
        sending (acks are cumulative: their order does not matter)."""
        asks = [a for a in acks if type(a) is m.RetainedAsk]
        if asks:  # one may wait on a replicator far away: the acks do not wait behind it
            acks = [a for a in acks if type(a) is not m.RetainedAsk]
            self.server._nursery.start_soon(self._send_acks, conn, asks)
        if acks:
            self.server._nursery.start_soon(self._send_acks, conn, acks)

    async def _send_acks(self, conn: MqttConnection, acks: list) -> None:
        conn_id = getattr(conn, "conn_id", None)
        if conn_id is None or conn.closing:
            return
        for ack in acks:  # each answer goes before the next may wait (the stream's order)
            outs = await self.server.sessions.request(conn_id, ack)
            # (none: an answer may still be in the making, a job of the core's: its worker
            # wakes here for it)
            await self.server._dispatch(outs)

    def _retained_steps(self, conn: MqttConnection) -> None:
        self.server._nursery.start_soon(self._send_retained, conn)

    async def _send_retained(self, conn: MqttConnection) -> None:
        """The rest of an answer's retained messages, a step at each turn of the loop
        (ges.mqtt.filtering's ``retained_step``), so that thousands do not hold the broker."""
        session = conn.session
        try:
            while True:
                await trio.lowlevel.checkpoint()
                if conn.closing or not session.retained_more:
                    return
                session.retained_step()
                fits = conn.send_messages([])
                self.server._queued(conn, fits)
                if not fits:
                    return
        except ConnectionClosed:
            pass
        finally:
            conn.retained_stepping = False

    def _moving(self, conn: MqttConnection, pause: float) -> None:
        session = conn.session
        self.server._nursery.start_soon(self._move, conn, pause)
        if session.connected and conn.move_watched != session.move_id:
            conn.move_watched = session.move_id
            self.server._nursery.start_soon(self._move_deadline, conn, session.move_id)

    async def _move(self, conn: MqttConnection, pause: float) -> None:
        """A persistent session handed over to another replicator is opened there after
        ``pause`` (ges.mqtt.session)."""
        await trio.sleep(pause)
        if not conn.closing and conn.close_reason is None:
            opens = conn.session.reopen()
            if opens:
                await self._send_acks(conn, opens)

    async def _move_deadline(self, conn: MqttConnection, move_id: int) -> None:
        """A move not over within OPEN_WAIT disconnects the client (which connects again,
        wherever the session is then)."""
        await trio.sleep(OPEN_WAIT)
        session = conn.session
        if session.moving and session.move_id == move_id and not conn.closing:
            session.move_timed_out(move_id)
            self.server.log.warning("%s: %s", conn.label, session.closed)
            MqttConnection.close_after(conn, session.data_to_send(), session.closed, REFUSE_WAIT)

    async def _open_deadline(self, conn: MqttConnection) -> None:
        """The CONNACK waits for the session's replicator at most OPEN_WAIT seconds (finding
        it may wait on replicators that do not answer): then CONNACK 3 and close."""
        await trio.sleep(OPEN_WAIT)
        session = conn.session
        if not session.connected and session.closed is None:
            session.open_timed_out()
            self.server.log.warning(
                "%s: %s; CONNACK 3, it may connect again", conn.label, session.closed
            )
            Connection.close_after(conn, session.data_to_send(), session.closed, REFUSE_WAIT)


class MqttConnection(Connection):
    """A client's MQTT connection, read and written as a GES client's (the module docstring)."""

    def __init__(self, stream, session: MqttSession, early: list, **kwargs):
        super().__init__(stream, **kwargs)
        self.session = session
        #: the read deadlines (Connection.read_chunks) see the packet in progress here
        self.decoder = session.reader
        self._early_packets = early
        #: set once the CONNACK is decided (sent, or a refusal on its way)
        self._decided = trio.Event()
        #: where acks that arise from the broker's answers go: ``MqttListener.acks``; where a
        #: session's move to another replicator goes (``MqttListener._moving``)
        self.on_acks = None
        self.on_move = None
        #: where the rest of a retained answer goes to be sent a step a turn
        #: (``MqttListener._send_retained``), and whether that is under way
        self.on_retained = None
        self.retained_stepping = False
        self.move_watched = 0  # the last move of its session given a deadline
        #: who the client proved to be (None: --insecure): only they may take its id over
        self.identity = None

    async def read_messages(self):
        """GES client messages, one list per read (the will goes once the connection has
        ended, however it ended: the broker asks for ``last_words``)."""
        session = self.session
        try:
            out = session.start()  # a clean session's CONNACK, or a persistent one's open
            out += session.receive_packets(self._early_packets, time.time_ns())
            self._early_packets = []
            self._flush_session()
            if out:
                yield out
            if not session.connected:  # the CONNACK waits for the replicator's answer
                await self._decided.wait()
                if not session.connected:  # refused: closed once the CONNACK is written
                    await trio.sleep_forever()
            # what came before the CONNACK: also when the answer came before this resumed
            early = session.release_early()
            self._flush_session()
            if early:
                yield early
            async for batch in self._read_packets():
                yield batch
        except Malformed as exc:  # (its will goes as the connection ends: last_words)
            if session.v5 and session.connected:  # 5.0 says why (§4.13): then it closes
                text = f"malformed MQTT: {exc}"
                bye = p.Disconnect(exc.code, ((p.REASON_STRING, text[:256]),))
                Connection.close_after(self, p.encode(bye, p.LEVEL_5), text, REFUSE_WAIT)
                await trio.sleep_forever()
            raise FrameError(f"malformed MQTT: {exc}") from None

    async def _read_packets(self):
        session = self.session
        async with contextlib.aclosing(self.read_chunks()) as chunks:
            async for data in chunks:
                while True:
                    msgs = session.receive_data(data, time.time_ns())
                    self._flush_session()
                    if msgs:
                        yield msgs
                    if not session.more or session.closed is not None:
                        break
                    await trio.lowlevel.checkpoint()  # a read of many small packets: in turns
                    data = b""
                if session.closed is not None:
                    break
        if self.close_reason is not None and session.closed is None:
            return  # the peer closed, the read failed, or the keepalive passed
        if self._closing and not self._closed:  # the broker ends it after a last answer:
            await trio.sleep_forever()  # wait until that is written (not if a write failed)
        self.close(session.closed)

    def _late(self) -> Exception:
        return Malformed(f"a packet not complete {self.frame_deadline:g}s after it began")

    def _idle(self) -> str:
        return f"keepalive: nothing received for {self.idle_deadline:g}s"

    def last_words(self) -> list:
        """The will as a publish, if it is still to go: once, when the connection ended
        without DISCONNECT (5.0: one with reason 0) — the client's doing or the broker's."""
        if self.session.closed == "disconnected" or not self.session.connected:
            return []  # a client never connected has no will yet
        return self.session.will(time.time_ns())

    def _flush_session(self) -> None:
        out = self.session.data_to_send()
        if out:
            with contextlib.suppress(ConnectionClosed):
                if not self.send_nowait(out):
                    self.close("slow consumer: its answers do not fit its queue")

    def send_messages(self, msgs: list, *, hold: bool = False) -> bool:
        """The broker's messages for this client, as MQTT packets; False: over its bound (the
        broker hands them so, not encoded: ``BrokerServer._to_client``; ``hold``: as
        ``send_nowait``'s)."""
        session = self.session
        now = time.time_ns()
        for msg in msgs:
            session.from_broker(msg, now)
        if session.waiting_bytes > self.max_queued:
            return False
        out = session.data_to_send()
        if session.closed is not None:  # refused or taken over: what it has goes, then it ends
            super().close_after(out + self._bye(session.closed), session.closed, REFUSE_WAIT)
            return True
        if session.connected:
            self._decided.set()
        if session.reopen_after is not None and self.on_move is not None:
            pause, session.reopen_after = session.reopen_after, None
            self.on_move(self, pause)
        acks = session.take_pending()  # QoS 0 deliveries taken: the replicator hears now
        if acks and self.on_acks is not None:
            self.on_acks(self, acks)
        if session.retained_more and not self.retained_stepping and self.on_retained is not None:
            self.retained_stepping = True
            self.on_retained(self)
        return self.send_nowait(out, hold=hold) if out else True

    def close_after(self, data: bytes, reason: str, within: float) -> None:
        """What the writer has goes, then the connection closes: under 5.0 after a DISCONNECT
        saying why (MQTT 3.1.1 cannot say)."""
        super().close_after(self._bye(reason), reason, within)

    def _bye(self, reason: str) -> bytes:
        """The DISCONNECT saying why the server closes the connection (5.0 only)."""
        if self.session.v5 and self.session.connected:
            return p.encode(v5.disconnect(reason), p.LEVEL_5)
        return b""
