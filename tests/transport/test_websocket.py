"""The server's end of MQTT over WebSocket (ges.transport.websocket), driven over an in-memory
stream pair by a wsproto client: the upgrade and its refusals, MQTT's bytes whatever the
frames' boundaries, pings, closes, and what breaks the stream."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Pong,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import Opcode

from ges.transport import websocket
from ges.transport.websocket import MAX_UPGRADE_BYTES, UpgradeRefused, WebSocketStream


class Client:
    """A WebSocket client's end: wsproto over the other stream of the pair."""

    def __init__(self, stream):
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)

    async def send(self, event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def events(self, n: int) -> list:
        got: list = []
        with trio.fail_after(5):
            while len(got) < n:
                data = await self.stream.receive_some(65536)
                self.ws.receive_data(data or None)
                got += list(self.ws.events())
        return got


async def opened(subprotocols=("mqtt",)) -> tuple[WebSocketStream, Client]:
    """A server stream that accepted a client's upgrade, and that client."""
    ours, theirs = trio.testing.memory_stream_pair()
    server, client = WebSocketStream(ours), Client(theirs)
    await client.send(Request(host="b1", target="/mqtt", subprotocols=list(subprotocols)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.accept)
        (answer,) = await client.events(1)
    assert isinstance(answer, AcceptConnection)
    return server, client


async def test_an_upgrade_offering_mqtt_is_accepted_with_it():
    server, _ = await opened(("v12.stomp", "mqtt"))
    assert (server.subprotocol, server.path) == ("mqtt", "/mqtt")
    server, _ = await opened(("mqttv3.1",))  # what clients of MQTT 3.1 offer
    assert server.subprotocol == "mqttv3.1"


async def test_mqtt_bytes_come_in_order_whatever_the_frames_and_go_as_one_binary_message():
    server, client = await opened()
    # one packet over two frames of a fragmented message, then two packets in one message
    await client.send(Message(data=b"\x10\x0c\x00\x04MQ", message_finished=False))
    await client.send(Message(data=b"TT\x04\x02\x00\x3c\x00\x00"))
    await client.send(Message(data=b"\xc0\x00\xe0\x00"))
    got = b""
    with trio.fail_after(5):
        while len(got) < 18:
            got += await server.receive_some()
    assert got == b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00\xc0\x00\xe0\x00"
    await server.send_all(b"\x20\x02\x00\x00")
    await server.send_all(b"")  # (a writer's flush: no empty frame)
    (message,) = await client.events(1)
    assert isinstance(message, BytesMessage) and message.data == b"\x20\x02\x00\x00"
    assert message.message_finished


async def test_a_read_gives_at_most_what_is_asked_and_keeps_the_rest():
    server, client = await opened()
    await client.send(Message(data=b"0123456789"))
    assert await server.receive_some(4) == b"0123"
    assert await server.receive_some() == b"456789"


async def test_a_ping_is_answered_and_a_close_ends_the_stream_answered():
    server, client = await opened()
    await client.send(Ping(b"are you there"))
    await client.send(Message(data=b"\xc0\x00"))
    assert await server.receive_some() == b"\xc0\x00"
    (pong,) = await client.events(1)
    assert isinstance(pong, Pong) and pong.payload == b"are you there"
    await client.send(CloseConnection(code=1000))
    with trio.fail_after(5):
        assert await server.receive_some() == b""  # the end, as a socket's
    (close,) = await client.events(1)
    assert isinstance(close, CloseConnection) and close.code == 1000
    assert await server.receive_some() == b""


async def test_a_read_of_thousands_of_tiny_frames_is_taken_in_turns(monkeypatch):
    """64 KiB of two-byte messages is 8,192 frames, about 130 ms of parsing: other tasks get a
    turn every FRAMES_PER_TURN of them, and a read's pings get one pong, for the last."""
    turns = []
    real = websocket.checkpoint

    async def counted():
        turns.append(1)
        await real()

    monkeypatch.setattr(websocket, "checkpoint", counted)
    server, client = await opened()
    frames = b"".join(client.ws.send(Message(data=b"\xc0\x00")) for _ in range(8192))
    pings = b"".join(client.ws.send(Ping(str(i).encode())) for i in range(100))
    await client.stream.send_all(pings + frames)  # (the pings in the first read)
    got = b""
    with trio.fail_after(10):
        while len(got) < 2 * 8192:
            got += await server.receive_some()
    assert got == b"\xc0\x00" * 8192
    assert len(turns) >= 8292 // websocket.FRAMES_PER_TURN - 2
    (pong,) = await client.events(1)
    assert isinstance(pong, Pong) and pong.payload == b"99"


async def test_a_text_message_breaks_the_stream():
    server, client = await opened()
    await client.send(TextMessage("\x10\x0c"))
    with pytest.raises(trio.BrokenResourceError, match="text message"):
        await server.receive_some()


async def test_an_unmasked_frame_from_the_client_breaks_the_stream():
    server, client = await opened()
    frame = bytes([0x80 | Opcode.BINARY, 2]) + b"\x10\x00"  # FIN, binary, no mask bit
    await client.stream.send_all(frame)
    with pytest.raises(trio.BrokenResourceError, match="not masked"):
        await server.receive_some()
    (close,) = await client.events(1)  # told why, as RFC 6455 says
    assert isinstance(close, CloseConnection) and close.code == 1002


async def test_aclose_sends_a_close_frame_and_closes_the_transport():
    server, client = await opened()
    await server.aclose()
    (close,) = await client.events(1)
    assert isinstance(close, CloseConnection) and close.code == 1000
    with pytest.raises(trio.ClosedResourceError):
        await server.receive_some()


async def refused(request: bytes) -> tuple[str, bytes]:
    """Why an opening was refused, and the HTTP answer the peer read."""
    ours, theirs = trio.testing.memory_stream_pair()
    server = WebSocketStream(ours)
    await theirs.send_all(request)
    with pytest.raises(UpgradeRefused) as why, trio.fail_after(5):
        await server.accept()
    return str(why.value), await theirs.receive_some(65536)


UPGRADE = (
    b"GET /mqtt HTTP/1.1\r\nHost: b1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


@pytest.mark.parametrize(
    ("request_", "why", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: b1\r\n\r\n", "not a WebSocket upgrade", b"400"),
        (b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00", "not a WebSocket upgrade", b"400"),
        (UPGRADE + b"\r\n", "no MQTT subprotocol offered (mqtt; it offered none)", b"400"),
        (UPGRADE + b"Sec-WebSocket-Protocol: wamp\r\n\r\n", "it offered wamp", b"400"),
        (UPGRADE + b"X: " + b"x" * MAX_UPGRADE_BYTES + b"\r\n\r\n", "", b"4"),
    ],
)
async def test_an_opening_that_is_no_upgrade_for_mqtt_is_refused_with_an_http_error(
    request_, why, status
):
    said, answer = await refused(request_)
    assert why in said
    assert answer.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in answer


BASE = UPGRADE.replace(b"Host: b1\r\n", b"") + b"Sec-WebSocket-Protocol: mqtt\r\n"


@pytest.mark.parametrize(
    "extra",
    [
        b"Host: \xff\r\n",
        b"Host: xn--zz\r\n",
        b"Host: b1\r\nConnection: \xe9\r\n",
        b"Host: b1\r\nSec-WebSocket-Protocol: \xe9\r\n",
    ],
)
async def test_bytes_no_header_may_hold_are_refused_not_raised(extra):
    """A review's find: wsproto decodes these and raised UnicodeError, which took the whole
    broker down (an HTTP request of one line to its WebSocket port)."""
    said, answer = await refused(BASE + extra + b"\r\n")
    assert said.startswith("not a WebSocket upgrade request")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request")


async def test_a_websocket_version_not_13_is_told_the_one_there_is():
    said, answer = await refused(UPGRADE.replace(b"Version: 13", b"Version: 8") + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 426 Upgrade Required")
    assert b"Sec-WebSocket-Version: 13\r\n" in answer


async def test_what_a_client_sent_right_behind_its_request_is_read_first():
    """A client that does not wait for the answer (RFC 6455 says it must): its first frame
    came with the request, and is not lost (wsproto's server end drops such bytes)."""
    ours, theirs = trio.testing.memory_stream_pair()
    request = Client(theirs).ws.send(Request(host="b1", target="/mqtt", subprotocols=["mqtt"]))
    key, payload = b"\x01\x02\x03\x04", b"\xc0\x00\xe0\x00"
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    frame = bytes([0x82, 0x80 | len(payload)]) + key + masked  # FIN, binary, masked
    await theirs.send_all(request + frame)
    server = WebSocketStream(ours)
    with trio.fail_after(5):
        await server.accept()
        assert await server.receive_some() == payload


@pytest.mark.parametrize(
    ("origin", "cross"),
    [
        (None, False),  # not a browser
        (b"https://b1", False),  # a page the broker's own address served
        (b"https://B1", False),
        (b"https://evil.example", True),
        (b"http://b1:8080", True),
    ],
)
async def test_a_page_of_another_origin_is_told_apart(origin, cross):
    ours, theirs = trio.testing.memory_stream_pair()
    client = Client(theirs)
    headers = [] if origin is None else [(b"Origin", origin)]
    await client.send(
        Request(host="b1", target="/mqtt", subprotocols=["mqtt"], extra_headers=headers)
    )
    server = WebSocketStream(ours)
    await server.accept()
    assert server.cross_origin is cross


async def test_a_peer_gone_before_its_upgrade_is_refused_as_such():
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(UPGRADE)  # not the end of it
    await theirs.aclose()
    with pytest.raises(UpgradeRefused, match="closed before its WebSocket upgrade"):
        await WebSocketStream(ours).accept()


async def test_a_direct_write_goes_at_once_and_what_the_socket_did_not_take_goes_first_later():
    """As TLSStream's: the connection writes without its writer task (ges.transport.connection)."""
    a, b = trio.socket.socketpair()
    a.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    theirs = trio.SocketStream(b)
    server, client = WebSocketStream(trio.SocketStream(a)), Client(theirs)
    await client.send(Request(host="b1", target="/mqtt", subprotocols=["mqtt"]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.accept)
        (answer,) = await client.events(1)
    assert isinstance(answer, AcceptConnection)
    assert server.write_nowait(b"\x30\x03\x00\x01t") is True
    (message,) = await client.events(1)
    assert isinstance(message, BytesMessage) and message.data == b"\x30\x03\x00\x01t"
    big = bytes(range(256)) * 4096  # more than the socket takes at once
    assert server.write_nowait(big) is False
    assert server.write_nowait(b"later") is None  # (the rest first: send_all)
    got = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.send_all, b"")  # the writer's flush
        with trio.fail_after(10):
            while len(got) < len(big):
                for event in await client.events(1):
                    got += event.data
    assert got == big
    await server.send_all(b"after")
    (message,) = await client.events(1)
    assert message.data == b"after"
