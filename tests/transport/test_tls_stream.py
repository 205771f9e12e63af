"""The lean TLS stream (ges.transport.tls) over real sockets: it speaks standard TLS (a
trio.SSLStream at the other end understands it), keeps order when the kernel takes only part
of what write_nowait encrypted, and ends cleanly either way a peer closes."""

from __future__ import annotations

import select
import socket

import pytest
import trio

from ges.security.certs import CertDir, Identity
from ges.security.tls import context
from ges.transport.connection import Connection
from ges.transport.tls import TLSStream
from ges.wire import encode
from ges.wire import messages as m


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    certs = CertDir(tmp_path_factory.mktemp("certs"))
    certs.init("x", {"b1": ("127.0.0.1",)})
    certs.add(Identity("client", "admin"))
    other = CertDir(tmp_path_factory.mktemp("other"))
    other.init("y", {})
    return (
        context(certs, Identity("broker", "b1"), server=True),
        context(certs, Identity("client", "admin"), server=False),
        context(other, None, server=False),
    )


def pair():
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def handshake(server, client):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        await client.do_handshake()


async def receive_exactly(stream, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        data = await stream.receive_some(65536)
        assert data, f"closed after {len(got)} of {n} bytes"
        got += data
    return bytes(got)


async def test_both_ends_and_a_trio_ssl_stream_understand_each_other(contexts):
    server_ctx, client_ctx, _ = contexts
    for make_client in (TLSStream, trio.SSLStream):
        a, b = pair()
        server = TLSStream(a, server_ctx, server_side=True)
        client = make_client(b, client_ctx, server_side=False)
        await handshake(server, client)
        assert server.getpeercert(binary_form=True)  # the client's certificate
        big = bytes(range(256)) * 4096  # 1 MiB: many records
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, big)
            assert await receive_exactly(server, len(big)) == big
        await server.send_all(b"hello")
        assert await receive_exactly(client, 5) == b"hello"
        await server.aclose()  # with close_notify: a clean end for either kind of peer
        assert await client.receive_some(100) == b""
        await client.aclose()


async def test_what_the_kernel_does_not_take_goes_first_and_in_order(contexts):
    server_ctx, client_ctx, _ = contexts
    a, b = pair()
    server = TLSStream(a, server_ctx, server_side=True)
    client = TLSStream(b, client_ctx, server_side=False)
    await handshake(server, client)
    sent = bytearray()
    results = []
    n = 0
    while len(results) < 2 or results[-1] is not False:  # until the socket buffer is full
        chunk = n.to_bytes(4, "big") * 4096
        results.append(client.write_nowait(chunk))
        sent += chunk
        n += 1
    assert client.write_nowait(b"later") is None  # ciphertext waits: send_all must go first
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send_all, b"")  # flushes the rest
        got = await receive_exactly(server, len(sent))
    assert got == sent
    await client.send_all(b"last")
    assert await receive_exactly(server, 4) == b"last"


async def test_an_unclean_close_ends_the_stream_and_a_foreign_ca_fails_the_handshake(contexts):
    server_ctx, client_ctx, foreign_ctx = contexts
    a, b = pair()
    server = TLSStream(a, server_ctx, server_side=True)
    client = TLSStream(b, client_ctx, server_side=False)
    await handshake(server, client)
    await server.send_all(b"x")
    assert await receive_exactly(client, 1) == b"x"  # (and the session tickets read)
    await b.aclose()  # the socket alone: no close_notify
    assert await server.receive_some(100) == b""
    assert await server.receive_some(100) == b""
    a, b = pair()
    server = TLSStream(a, server_ctx, server_side=True)
    stranger = TLSStream(b, foreign_ctx, server_side=False)

    async def server_side():
        with pytest.raises(trio.BrokenResourceError, match="alert unknown ca"):
            await server.do_handshake()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_side)
        with pytest.raises(trio.BrokenResourceError) as info:
            await stranger.do_handshake()
    assert info.value.__cause__.reason == "CERTIFICATE_VERIFY_FAILED"


async def _reset_pair(contexts):
    """Our TLS end and the peer's, over real TCP; and a function that makes the peer send its
    last bytes and vanish with a reset (what it was sent unread), returning once the reset
    has reached our end."""
    server_ctx, client_ctx, _ = contexts
    with socket.create_server(("127.0.0.1", 0)) as listener:
        theirs = trio.socket.from_stdlib_socket(socket.create_connection(listener.getsockname()))
        ours = trio.socket.from_stdlib_socket(listener.accept()[0])
    server = TLSStream(trio.SocketStream(ours), server_ctx, server_side=True)
    client = TLSStream(trio.SocketStream(theirs), client_ctx, server_side=False)
    await handshake(server, client)
    await server.send_all(b"x" * 1000)  # never read by the peer

    async def reset_after(last: bytes) -> None:
        await client.send_all(last)
        theirs.close()
        poller = select.poll()
        poller.register(ours.fileno(), select.POLLERR)
        assert poller.poll(2000), "no reset within 2 s"

    return server, reset_after


async def test_what_a_peer_sent_before_it_reset_is_read_though_a_write_failed_first(contexts):
    """Over TLS as over a plain socket (tests/transport/test_connection.py): a peer's last
    frame before it reset the connection is read after the write that found the reset."""
    server, reset_after = await _reset_pair(contexts)
    conn = Connection(server, label="c")
    await reset_after(encode(m.SessionAck("alice", 41)))
    got = []
    with conn.cancel_scope:
        conn._enqueue(encode(m.Bye("a delivery")))
        await conn.writer()
        assert conn.close_reason.startswith("write failed")
        with trio.fail_after(2):
            async for batch in conn.read_messages():
                got += batch
    assert got == [m.SessionAck("alice", 41)]
    await server.aclose()


async def test_a_read_that_has_something_to_write_to_a_peer_gone_still_returns_what_it_sent(
    contexts,
):
    """Reading can make TLS data to send (a TLS 1.3 key update's answer, say); when the peer
    has reset the connection, that write fails — and the read still returns what the peer
    sent before it went, the stream then broken for the writer."""
    server, reset_after = await _reset_pair(contexts)
    await reset_after(b"last words")
    server._ssl.write(b"made while reading")  # ciphertext waiting for a write
    assert server._outgoing.pending
    with trio.fail_after(2):
        assert await server.receive_some(100) == b"last words"
    with pytest.raises(trio.BrokenResourceError):
        await server.send_all(b"more")
    await server.aclose()
