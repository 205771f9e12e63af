"""Admission: listening, fitting the descriptor limit, and each connection's handshake.

Theory of operation
-------------------
A broker listens on its topology port and hands every accepted connection to
:meth:`Admission.handle_incoming`, which reads one ``Hello`` (at most ``MAX_HELLO_FRAME`` bytes,
within the handshake timeout) and asks the core (``BrokerCore.hello``) whether to accept it: a
neighbour broker becomes a link (ges.runtime.links), a client gets its bounds in bytes and time
and is served by the broker (``BrokerServer._run_client``). Every bound has a count too: at
most ``MAX_OPENING`` connections may be in their handshake at once and at most ``max_clients``
clients admitted — fitted to the process's descriptor limit at start, since past it ``accept``
fails for everyone. A refused connection is told why in one frame (without waiting long for a
slow reader), and each cause is logged once, then summarised (ges.runtime.notes).
"""

from __future__ import annotations

import contextlib
import errno
import re

import trio

from ges.runtime.access import Admitted
from ges.runtime.links import LINK_CUT_REASON
from ges.security.certs import Identity
from ges.security.tls import peer_identity
from ges.transport.connection import (
    Connection,
    ConnectionClosed,
    linger,
    probe_when_silent,
)
from ges.transport.tls import TLSStream
from ges.wire import DEFAULT_MAX_FRAME, FrameError, encode
from ges.wire import messages as m

#: Connections that have not completed their handshake yet; more are refused at once. Each may
#: hold at most MAX_HELLO_FRAME bytes, for at most HANDSHAKE_TIMEOUT seconds.
MAX_OPENING = 512
MAX_HELLO_FRAME = 64 * 1024
#: Seconds a refusal (or a Welcome) may take to be written before the connection is dropped.
REFUSE_WAIT = 2.0
#: Seconds a client's Hello may wait for its token to be checked (one scrypt at a time).
ADMIT_WAIT = 5.0
#: File descriptors kept for what is not a connection (the log, listeners, the interpreter).
RESERVED_FDS = 64
#: Quoted parts of a reason (what a peer chose): left out of the cause a warning is keyed on.
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
#: Descriptor limits already warned about in this process (embedded brokers share one).
_FD_WARNED: set[int] = set()


class Admission:
    """Accepting connections for one broker: the listener, the handshake, refusals."""

    def __init__(self, server):
        self.server = server

    def fit_descriptors(self) -> None:
        """Raise the process's descriptor limit as far as allowed, and serve no more clients
        than it leaves room for (each client is one descriptor; links, connections opening and
        the log take others) — past it ``accept`` would fail for everyone."""
        try:
            import resource
        except ImportError:  # not on this platform: nothing to fit
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        fixed = 2 * len(self.server.core.neighbours) + RESERVED_FDS
        want = self.server.max_clients + self.server.max_opening + fixed
        if soft != resource.RLIM_INFINITY and soft < want:
            with contextlib.suppress(ValueError, OSError):
                top = want if hard == resource.RLIM_INFINITY else min(want, hard)
                resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY and soft < want:
            room = max(2, soft - fixed)
            self.server.max_opening = min(self.server.max_opening, max(1, room // 8))
            clients = max(1, room - self.server.max_opening)
            if soft not in _FD_WARNED:  # a fact of the process: once, whatever it hosts
                _FD_WARNED.add(soft)
                self.server.log.warning(
                    "only %d file descriptors: serving at most %d clients, not %d (raise the "
                    "limit: ulimit -n)",
                    soft,
                    clients,
                    self.server.max_clients,
                )
            self.server.max_clients = clients

    def listen_error(self, exc: OSError) -> str:
        where = f"{self.server.listen_host}:{self.server.spec.port}"
        if exc.errno == errno.EADDRINUSE:
            why = "address already in use (another broker or program holds this port)"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = "address not available on this host"
        elif exc.errno == errno.EACCES:
            why = "permission denied"
        else:
            why = exc.strerror or str(exc)
        return f"broker {self.server.id}: cannot listen on {where}: {why}"

    async def serve_listener(self, listener: trio.SocketListener, handle=None, refuse=None) -> None:
        """Accept connections, within the bound on those opening at once, each handed to
        ``handle(stream)`` (default: a GES handshake) or ``refuse(stream, reason)`` over the
        bound; TLS wraps them when the network has certificates. The MQTT port
        (ges.runtime.mqtt) is served by the same loop with its own two."""
        handle = handle or self.handle_incoming
        refuse = refuse or self.refuse
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # EMFILE and friends: back off, keep serving
                    self.server.notes.warning(
                        f"accept {exc.errno}", "accept failed: %s", exc.strerror or exc
                    )
                    await trio.sleep(0.1)
                    continue
                if self.server._opening >= self.server.max_opening:
                    self.server._nursery.start_soon(
                        refuse,
                        stream,
                        f"broker {self.server.id}: {self.server.max_opening} connections are already "
                        "opening; try again later",
                    )
                    continue
                self.server._opening += 1
                stream.peer = peer_of(stream)  # (a socket reset later no longer says)
                probe_when_silent(stream.socket, self.server.tcp_keepalive)
                if self.server.tls_accept is not None:  # the handshake runs with the first read
                    stream = TLSStream(stream, self.server.tls_accept, server_side=True)
                self.server._nursery.start_soon(handle, stream)

    async def refuse(self, stream: trio.SocketStream, reason: str) -> None:
        """Tell a connection it is refused (without waiting long for a slow reader), and close
        it; logged once per reason, then summarised."""
        self.server.counters["clients_refused"] += 1
        cause = _QUOTED.sub("…", reason)[:120]  # what the peer chose is no new cause
        self.server.notes.warning(
            cause, "refused a connection from %s: %s", peer_of(stream), reason
        )
        with trio.move_on_after(REFUSE_WAIT):
            with contextlib.suppress(trio.BrokenResourceError, OSError):
                await stream.send_all(encode(m.Refuse(reason)))
                await linger(stream)  # (what it sent after its Hello would reset it unread)
        with trio.CancelScope(shield=True), trio.move_on_after(REFUSE_WAIT):
            await stream.aclose()

    def proven(self, stream: TLSStream, hello: m.Hello) -> m.Refuse | None:
        """A broker must be the one its certificate names (None: it is, or it is a client —
        what a client may do is decided by its identity, kept on its connection)."""
        who = peer_identity(stream)
        if hello.role not in ("broker", "sessions") or who == Identity("broker", hello.id):
            return None
        shown = "no certificate" if who is None else f"the certificate of {who}"
        return m.Refuse(
            f"a connection claiming to be broker {hello.id} presented {shown}: only the broker "
            "with the network's certificate for that id may link here"
        )

    async def admit(self, stream, hello: m.Hello) -> Admitted:
        """Who a client proved to be, and what it may do (ges.security.access)."""
        access = self.server.access
        cert = peer_identity(stream) if isinstance(stream, TLSStream) else None
        with trio.move_on_after(ADMIT_WAIT):
            return await access.admit(hello.id, cert, hello.secret)
        return Admitted(
            hello.id, None, False, "too many tokens to check at once; try again", access.version
        )

    async def handle_incoming(self, stream: trio.SocketStream) -> None:
        # until its Hello, a connection may send one small frame, within HANDSHAKE_TIMEOUT
        conn = Connection(
            stream,
            label="incoming",
            max_frame=MAX_HELLO_FRAME,
            frame_deadline=self.server.frame_deadline,
            watchdog=self.server.watchdog,
        )
        opening = True
        client = False
        try:
            try:
                hello = await conn.receive_one()
            except (ConnectionClosed, FrameError, trio.BrokenResourceError, OSError) as exc:
                self.server.notes.warning(
                    f"handshake {type(exc).__name__}",
                    "dropped a connection from %s before its handshake: %s",
                    peer_of(stream),
                    exc,
                )
                return
            if not isinstance(hello, m.Hello):
                self.server.notes.warning(
                    "not hello",
                    "dropped a connection from %s: its first frame was %s, not Hello",
                    peer_of(stream),
                    type(hello).__name__,
                )
                return
            reply = self.server.core.hello(hello)
            if isinstance(stream, TLSStream) and isinstance(reply, m.Welcome):
                reply = self.proven(stream, hello) or reply
            admitted = None  # --insecure: everyone may do everything
            if (
                self.server.access is not None
                and hello.role == "client"
                and isinstance(reply, m.Welcome)
            ):
                admitted = await self.admit(stream, hello)
                if isinstance(admitted.grant, str):
                    reply = m.Refuse(f"broker {self.server.id}: {admitted.grant}")
            if (
                hello.role == "broker"
                and hello.id in self.server._cut
                and isinstance(reply, m.Welcome)
            ):
                reply = m.Refuse(f"{LINK_CUT_REASON} at {self.server.id} (ges link up restores it)")
            client = hello.role in ("client", "sessions") and isinstance(reply, m.Welcome)
            if client and self.server._admitted >= self.server.max_clients:
                reply = m.Refuse(
                    f"broker {self.server.id} has its maximum of {self.server.max_clients} clients; try again "
                    "later or at another broker"
                )
                client = False
            self.server._opening -= 1
            opening = False
            if client:
                self.server._admitted += 1  # counted now: handshakes in flight cannot all get in
            if isinstance(reply, m.Refuse):
                await self.refuse(stream, reply.reason)
                return
            try:
                with trio.fail_after(REFUSE_WAIT):
                    await stream.send_all(encode(reply))
            except (trio.BrokenResourceError, OSError, trio.TooSlowError):
                return
            conn.decoder.max_frame = DEFAULT_MAX_FRAME
            if hello.role == "broker":
                conn.label = f"link {self.server.id}<-{hello.id}"
                await self.server.links.run_link(hello.id, conn)
            else:
                conn.max_queued = self.server.client_queue_bytes
                conn.write_deadline = self.server.client_write_deadline
                conn.idle_deadline = self.server.client_idle_timeout
                conn.budget = self.server._client_budget
                await self.server._run_client(
                    hello.id, conn, admitted, follower=hello.role == "sessions"
                )
        finally:
            if opening:
                self.server._opening -= 1
            if client:
                self.server._admitted -= 1
            await conn.aclose()


def peer_of(stream) -> str:
    """``host:port`` of a socket stream's peer (for the log): as the connection came, if its
    listener noted it (``peer``), else as its socket says now."""
    while not hasattr(stream, "socket") and hasattr(stream, "transport_stream"):
        stream = stream.transport_stream  # (TLS, a WebSocket)
    known = getattr(stream, "peer", None)
    if known is not None:
        return known
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, AttributeError, ValueError):
        return "an unknown address"
    return f"{host}:{port}"
