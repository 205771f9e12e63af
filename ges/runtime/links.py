"""Links to neighbour brokers: dialling with backoff, running a link, and operator cuts.

Theory of operation
-------------------
The lower broker id dials each link (``broker_order_key``), reconnecting with exponential
backoff from ``BACKOFF_FIRST`` to ``BACKOFF_MAX`` with jitter, so brokers restarted together do
not dial in lockstep; the higher one accepts (ges.runtime.admission). A link runs a writer and a
reader feeding the core (``BrokerServer._pump``); when it ends the core is told the link is
down. An operator can cut one link (``LinkControl`` over the client protocol, ``ges link
down``): the broker closes the open connection as the failure detector would, and until the
link is restored it neither dials the peer nor accepts its ``Hello``. Cut state lives in the
server object only, so a restarted broker has every link back.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random

import trio

from ges.core import ToClient
from ges.security.certs import Identity
from ges.security.tls import peer_identity
from ges.transport.connection import (
    Connection,
    ConnectionClosed,
)
from ges.transport.tls import TLSStream
from ges.wire import FrameError, encode
from ges.wire import messages as m
from ges.wire.messages import hello_for

#: Reconnect backoff: first retry after 50 ms, doubling to at most 2 s, with ±25 % jitter so
#: brokers restarted together do not dial in lockstep.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0
#: Seconds to wait for a TCP connect to a neighbour before retrying.
CONNECT_TIMEOUT = 3.0
#: Why a cut link's connection was closed, and the start of the Refuse a cut link's Hello gets
#: (the dialler logs that one quietly: it is the operator's doing, not a fault).
LINK_CUT_REASON = "link cut by an operator"


class Links:
    """This broker's links to its neighbours."""

    def __init__(self, server):
        self.server = server

    async def dial_forever(self, peer: str) -> None:
        spec = self.server.topology.brokers[peer]
        backoff = self.server.backoff[0]
        while True:
            first, most = self.server.backoff
            restored = self.server._cut.get(peer)
            if restored is not None:
                await restored.wait()
                backoff = first
                continue
            stream = None
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    stream = await trio.open_tcp_stream(spec.host, spec.port)
                    stream = await self._secure(stream, peer)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError):
                if stream is not None:
                    await trio.aclose_forcefully(stream)
                stream = None
            if stream is not None:
                started = trio.current_time()
                conn = Connection(
                    stream, label=f"link {self.server.id}->{peer}", watchdog=self.server.watchdog
                )
                try:
                    hello = hello_for(self.server.topology, "broker", self.server.id)
                    await stream.send_all(encode(hello))  # before the writer task exists
                    reply = await conn.receive_one()
                except (ConnectionClosed, FrameError, trio.BrokenResourceError, OSError) as exc:
                    self.server.log.debug("handshake with %s failed: %s", peer, exc)
                    reply = None
                if isinstance(reply, m.Welcome):
                    await self.run_link(peer, conn)
                    if trio.current_time() - started > 5.0:
                        backoff = first
                elif isinstance(reply, m.Refuse):
                    cut = reply.reason.startswith(LINK_CUT_REASON)
                    self.server.log.log(
                        logging.INFO if cut else logging.WARNING,
                        "broker %s refused the link: %s",
                        peer,
                        reply.reason,
                    )
                await conn.aclose()
            await trio.sleep(backoff * random.uniform(0.75, 1.25))
            backoff = min(backoff * 2, most)

    async def _secure(self, stream, peer: str):
        """With TLS, the handshake, and the peer proven to be ``peer`` by its certificate (a
        server that is not is logged once and dropped, as if it did not answer)."""
        ctx = self.server.tls_dial
        if ctx is None:
            return stream
        tls = TLSStream(stream, ctx, server_side=False)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            why = exc.__cause__ or exc
            self.server.notes.warning(
                f"tls {peer}", "TLS with broker %s failed: %s", peer, getattr(why, "reason", why)
            )
            raise
        who = peer_identity(tls)
        if who != Identity("broker", peer):
            self.server.notes.warning(
                f"impostor {peer}",
                "the server at broker %s's address presented %s, not %s's certificate",
                peer,
                who or "no certificate",
                peer,
            )
            await trio.aclose_forcefully(tls)
            raise trio.BrokenResourceError(f"not broker {peer}")
        return tls

    async def run_link(self, peer: str, conn: Connection) -> None:
        if peer in self.server._cut:  # cut while this connection was shaking hands
            conn.close(LINK_CUT_REASON)
            return
        await self.server._dispatch(
            self.drop_link(peer, "replaced by a new connection", trio.current_time())
        )
        self.server._peers[peer] = conn
        self.server.log.info("link %s up", peer)
        stopping = False
        try:
            with conn.cancel_scope:  # absorbs the connection's own close
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.writer)
                    await self.server._dispatch(self.server.core.link_up(peer, trio.current_time()))
                    await self.server._pump(
                        conn, functools.partial(self.server.core.peer_message, peer)
                    )
                    nursery.cancel_scope.cancel()
        except trio.Cancelled:
            # the broker is stopping: its links go with it, and its neighbours hear why
            stopping = True
            with contextlib.suppress(ConnectionClosed):
                conn.write_last(encode(m.Bye()))
            raise
        finally:
            # the connection's own scope may have absorbed the cancellation (it was closed
            # too): the broker is stopping if the scope around it is cancelled
            stopping = stopping or trio.current_effective_deadline() == float("-inf")
            if self.server._peers.get(peer) is conn:
                del self.server._peers[peer]
                outs = self.server.core.link_down(peer, trio.current_time())
                if not stopping:
                    with trio.CancelScope(shield=True):
                        await self.server._dispatch(outs)
            self.server.log.info("link %s down: %s", peer, conn.close_reason or "stopping")

    def drop_link(self, peer: str, reason: str, now: float) -> list:
        """Close the connection to ``peer`` (if any) and tell the core the link is down, as a
        TCP failure would; the connection's task then finds it unregistered and only logs."""
        conn = self.server._peers.pop(peer, None)
        if conn is None:
            return []
        conn.close(reason)
        return self.server.core.link_down(peer, now)

    def link_control(self, conn_id: int, msg: m.LinkControl, now: float) -> list:
        """Cut or restore the link to a neighbour; the answer follows the core's outputs."""
        peer = msg.peer
        if peer not in self.server.topology.brokers:
            reason = f"link control at {self.server.id}: unknown broker {peer!r} in {self.server.topology.name}"
            return [ToClient(conn_id, m.Error(reason))]
        if peer not in self.server.core.neighbours:
            reason = (
                f"link control at {self.server.id}: {peer} is not a neighbour of {self.server.id}"
            )
            return [ToClient(conn_id, m.Error(reason))]
        outs = []
        if msg.up:
            restored = self.server._cut.pop(peer, None)
            changed = restored is not None
            if restored is not None:
                restored.set()  # the dialler (if this end dials) redials at once
                self.server.log.warning("link %s restored by an operator", peer)
        else:
            changed = peer not in self.server._cut
            if changed:
                self.server._cut[peer] = trio.Event()
                self.server.log.warning("link %s cut by an operator", peer)
            outs = self.drop_link(peer, LINK_CUT_REASON, now)
        return [*outs, ToClient(conn_id, m.LinkControlled(peer, msg.up, changed))]
