"""A WebSocket server's frame reader (ges.transport.wsframes) against wsproto's client as the
reference: whatever the messages, their fragments and the reads they are split into, the
binary payload and the control frames come out as they went in; each rule of RFC 6455 §5 a
client's frame may break is refused with its close code."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Ping, Pong, Request

from ges.transport import wsframes
from ges.transport.wsframes import (
    BINARY,
    CLOSE,
    PING,
    PONG,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    FrameError,
    FrameReader,
    frame,
    unmask,
)


def client() -> WSConnection:
    """A wsproto client past its handshake: what it sends is what browsers send."""
    c, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(c.send(Request(host="b1", target="/mqtt", subprotocols=["mqtt"])))
    list(server.events())
    c.receive_data(server.send(AcceptConnection(subprotocol="mqtt")))
    list(c.events())
    return c


def read_all(data: bytes, cuts: list[int], per_turn: int = 3) -> tuple[bytes, list]:
    """Feed ``data`` in the pieces ``cuts`` makes, taking ``per_turn`` frames at a time."""
    reader, payload, controls = FrameReader(), b"", []
    at = 0
    for cut in [*sorted(cuts), len(data)]:
        reader.feed(data[at:cut])
        at = cut
        more = True
        while more:
            got, ctl, more = reader.take(per_turn)
            payload += got
            controls += ctl
    return payload, controls


messages = st.lists(
    st.one_of(
        st.tuples(st.just("binary"), st.binary(max_size=300), st.integers(1, 4)),
        st.tuples(st.just("ping"), st.binary(max_size=125), st.just(1)),
        st.tuples(st.just("pong"), st.binary(max_size=125), st.just(1)),
    ),
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(messages, st.lists(st.integers(0, 10_000), max_size=12), st.integers(1, 5))
def test_what_a_client_sends_comes_out_as_it_went_in_whatever_the_reads(sent, cuts, per_turn):
    c = client()
    data, payload, controls = b"", b"", []
    for kind, body, parts in sent:
        if kind == "binary":  # a message in ``parts`` fragments (§5.4)
            size = -(-len(body) // parts) if body else 0
            pieces = [body[i : i + size] for i in range(0, len(body), size)] if size else [b""]
            for j, piece in enumerate(pieces):
                data += c.send(Message(data=piece, message_finished=j == len(pieces) - 1))
            payload += body
        else:
            data += c.send(Ping(body) if kind == "ping" else Pong(body))
            controls.append((PING if kind == "ping" else PONG, body))
    data += c.send(CloseConnection(code=1000))
    got, ctl = read_all(data, [x % (len(data) + 1) for x in cuts], per_turn)
    assert got == payload
    assert ctl == [*controls, (CLOSE, struct.pack("!H", 1000))]


def test_a_large_frame_comes_out_part_by_part_as_its_bytes_arrive():
    body = bytes(range(256)) * 1000
    data = client().send(Message(data=body))
    reader, out = FrameReader(), b""
    for at in range(0, len(data), 7001):
        reader.feed(data[at : at + 7001])
        got, _, _ = reader.take(64)
        out += got
        assert len(out) >= at + 7001 - 14 or at + 7001 >= len(data)  # nothing waits for the end
    assert out == body


def masked(b0: int, payload: bytes, length: bytes | None = None) -> bytes:
    """A client's frame, byte by byte (``length``: the length bytes as given)."""
    key = b"\x11\x22\x33\x44"
    head = bytes([b0]) + (bytes([0x80 | len(payload)]) if length is None else length)
    return head + key + unmask(payload, key, 0)


@pytest.mark.parametrize(
    ("data", "code", "why"),
    [
        (bytes([0x82, 0x02]) + b"\xc0\x00", PROTOCOL_ERROR, "not masked"),
        (masked(0xC2, b"x"), PROTOCOL_ERROR, "RSV bit"),
        (masked(0x81, b"x"), UNSUPPORTED_DATA, "text message"),
        (masked(0x83, b"x"), PROTOCOL_ERROR, "unknown data opcode"),
        (masked(0x8B, b"x"), PROTOCOL_ERROR, "unknown control opcode"),
        (masked(0x09, b"x"), PROTOCOL_ERROR, "control frame fragmented"),
        (masked(0x89, b"x", bytes([0x80 | 126]) + struct.pack("!H", 126)), PROTOCOL_ERROR, "over 125"),
        (masked(0x80, b"x"), PROTOCOL_ERROR, "continuation outside a message"),
        (masked(0x02, b"x") + masked(0x82, b"y"), PROTOCOL_ERROR, "new message inside"),
        (bytes([0x82, 0x80 | 127]) + struct.pack("!Q", 1 << 63), PROTOCOL_ERROR, "top bit"),
    ],
)  # fmt: skip
def test_a_frame_that_breaks_a_rule_is_refused_with_its_close_code(data, code, why):
    reader = FrameReader()
    reader.feed(data)
    with pytest.raises(FrameError, match=why) as refused:
        reader.take(64)
    assert refused.value.code == code


def test_nothing_after_a_close_is_read():
    c = client()
    reader = FrameReader()
    reader.feed(c.send(CloseConnection(code=1001)) + masked(0x82, b"late"))
    got, controls, more = reader.take(64)
    assert (got, controls, more) == (b"", [(CLOSE, struct.pack("!H", 1001))], False)
    assert reader.closed and reader.take(64) == (b"", [], False)


def test_a_servers_frames_are_what_a_client_reads():
    c = client()
    for size in (0, 125, 126, 65535, 65536):
        c.receive_data(frame(BINARY, b"z" * size))
        (event,) = list(c.events())
        assert isinstance(event, Message) and event.data == b"z" * size
    c.receive_data(wsframes.close_frame(1002, "x" * 300))
    (event,) = list(c.events())
    assert isinstance(event, CloseConnection) and event.code == 1002 and len(event.reason) == 123
