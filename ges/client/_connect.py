"""Opening a client connection: TCP, TLS, the handshake, and the broker's proof of who it is.

Over TLS a client checks, before it sends anything (its ``Hello`` may carry a token), that the
server presents a broker's certificate of the network, and after the ``Welcome`` that the
broker answering is the one that certificate names. A broker that refuses says why in one
``Refuse`` frame, which becomes the one line of an OperationError.
"""

from __future__ import annotations

import itertools
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ges.client._client import CONNECT_TIMEOUT, DEFAULT_WINDOW, KEEPALIVE, Client
from ges.errors import BrokerUnreachable, OperationError
from ges.security.certs import Identity
from ges.security.tls import peer_identity
from ges.topology import Topology
from ges.transport.connection import Connection, ConnectionClosed, Watchdog
from ges.transport.tls import TLSStream
from ges.wire import FrameError, encode
from ges.wire import messages as m
from ges.wire.messages import hello_for


@asynccontextmanager
async def connect(
    host: str,
    port: int,
    *,
    topology: Topology | str | None = None,
    client_id: str | None = None,
    window: int = DEFAULT_WINDOW,
    timeout: float = CONNECT_TIMEOUT,
    keepalive: float = KEEPALIVE,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> AsyncIterator[Client]:
    """Connect to a broker and run the client's reader until the block exits.

    ``topology``: the Topology the caller runs (the broker refuses a client of another
    network: its name and content digest must match), or a name alone, or None (anonymous).
    ``tls``: a context from ``ges.security.tls.context`` (the network's CA, and this client's
    certificate if it has one); the broker must prove with its certificate that it is the
    broker that answers. ``token``: a secret proving the client is the user ``client_id`` (``ges
    users add``) when it has no certificate; sent only over TLS.

    Raises:
        BrokerUnreachable: nothing answered at ``host:port`` within ``timeout``.
        OperationError: the broker refused the client or did not complete the handshake.
        ValueError: a token without TLS, or without a client id.
    """
    if token and (tls is None or not client_id):
        raise ValueError("a token is sent only over TLS, for a named client (client_id)")
    client_id = client_id or f"client-{os.getpid()}-{next(_client_numbers)}"
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as exc:
        why = getattr(exc, "strerror", None) or "no answer"
        raise BrokerUnreachable(f"cannot reach broker at {host}:{port}: {why}") from None
    if tls is not None:
        stream = TLSStream(stream, tls, server_side=False)
        try:
            with trio.fail_after(timeout):
                await stream.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            await trio.aclose_forcefully(stream)
            why = exc.__cause__ or exc
            raise OperationError(
                f"broker at {host}:{port}: TLS failed: {getattr(why, 'reason', None) or why}"
            ) from None
    if tls is not None:  # a broker of the network, before anything (a token) is sent
        who = peer_identity(stream)
        if who is None or who.kind != "broker":
            await trio.aclose_forcefully(stream)
            raise OperationError(
                f"the server at {host}:{port} presented {who or 'no certificate'}, not a "
                "broker's certificate"
            )
    watchdog = Watchdog()  # the read deadline of a frame in progress, without a scope per read
    conn = Connection(stream, label=f"broker {host}:{port}", watchdog=watchdog)
    try:
        await stream.send_all(encode(hello_for(topology, "client", client_id, token or "")))
        reply = await conn.receive_one(timeout=timeout)
    except (ConnectionClosed, FrameError, trio.BrokenResourceError, OSError) as exc:
        await conn.aclose()
        hint = (
            "" if tls is not None else " (if it runs TLS: connect with the network's certificates)"
        )
        raise OperationError(
            f"broker at {host}:{port} did not complete the handshake: {exc}{hint}"
        ) from None
    if isinstance(reply, m.Refuse):
        await conn.aclose()
        raise OperationError(f"broker at {host}:{port} refused the connection: {reply.reason}")
    if not isinstance(reply, m.Welcome):
        await conn.aclose()
        raise OperationError(
            f"broker at {host}:{port} answered {type(reply).__name__}, not Welcome"
        )
    if tls is not None:
        who = peer_identity(stream)
        if who != Identity("broker", reply.broker):
            await conn.aclose()
            raise OperationError(
                f"broker at {host}:{port} says it is {reply.broker} but its certificate names "
                f"{who or 'nobody'}"
            )
    client = Client(
        conn, broker=reply.broker, window=window, client_id=client_id, keepalive=keepalive
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.writer)
            nursery.start_soon(watchdog.run)
            nursery.start_soon(client._keepalive)
            nursery.start_soon(client._reader)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # the caller's own exception, not one wrapped by our internal nursery
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        await conn.aclose()


_client_numbers = itertools.count(1)


async def broker_stats(
    host: str,
    port: int,
    *,
    topology: Topology | str | None = None,
    timeout: float = 2.0,
    client_id: str = "stats",
    tls: ssl.SSLContext | None = None,
) -> m.Stats:
    """One broker's counters over a short-lived connection.

    Raises:
        OperationError: the broker is unreachable, refused, or did not answer within ``timeout``.
    """
    try:
        with trio.fail_after(timeout):
            async with connect(
                host, port, topology=topology, client_id=client_id, timeout=timeout, tls=tls
            ) as client:
                return await client.stats()
    except trio.TooSlowError:
        raise OperationError(
            f"broker at {host}:{port} did not answer within {timeout:g}s"
        ) from None
