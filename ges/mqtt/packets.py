"""MQTT 3.1.1's control packets: bodies decoded into values and values encoded into packets.

Theory of operation
-------------------
:mod:`ges.mqtt.frames` cuts the byte stream into packets; this module reads each packet's
variable header and payload (MQTT 3.1.1 §3) into a frozen value — :class:`Connect`,
:class:`Publish`, :class:`Subscribe` … — and writes such values as packets (:func:`encode`).
Both directions are here, a server's and a client's, so that the tests can speak as a client
with the same code.

Every field is checked as the spec says a receiver must, and what fails is :class:`Malformed`,
whose text is the one line the connection is closed with (§4.8): strings are well-formed UTF-8
without U+0000 and fit their length prefix (§1.5.3); a packet holds exactly its fields, nothing
left over; packet identifiers are non-zero (§2.3.1); SUBSCRIBE and UNSUBSCRIBE carry at least
one topic filter, a requested QoS of 0-2 and no reserved bits (§3.8.3); CONNECT's reserved flag
is 0, a will's QoS 0-2 and none without a will, a password only with a user name (§3.1.2).
A topic name holds no wildcard (§4.7.1) and a filter is well-formed (ges.matching.topics).

Bounds are the framing's: a packet is at most ``max_packet`` bytes, so every field is too; the
number of filters in one SUBSCRIBE is bounded by the broker (ges.mqtt.session), not here.
"""

from __future__ import annotations

import struct

import attrs

from ges.matching.topics import check_filter, check_topic
from ges.mqtt.frames import (
    CONNACK,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Malformed,
    Packet,
    frame,
)

#: CONNACK return codes (§3.2.2.3).
ACCEPTED, BAD_VERSION, BAD_CLIENT_ID, UNAVAILABLE, BAD_LOGIN, NOT_AUTHORIZED = range(6)
#: A SUBACK's code for a refused filter (§3.9.3).
SUBSCRIBE_FAILED = 0x80
#: The protocol level of MQTT 3.1.1 (§3.1.2.2).
LEVEL_311 = 4


@attrs.frozen
class Will:
    topic: str
    message: bytes
    qos: int = 0
    retain: bool = False


@attrs.frozen
class Connect:
    client_id: str
    clean_session: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    level: int = LEVEL_311


@attrs.frozen
class ConnAck:
    code: int = ACCEPTED
    session_present: bool = False


@attrs.frozen
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0


@attrs.frozen
class PubAck:
    packet_id: int


@attrs.frozen
class PubRec:
    packet_id: int


@attrs.frozen
class PubRel:
    packet_id: int


@attrs.frozen
class PubComp:
    packet_id: int


@attrs.frozen
class Subscribe:
    packet_id: int
    filters: tuple[tuple[str, int], ...]


@attrs.frozen
class SubAck:
    packet_id: int
    codes: tuple[int, ...]


@attrs.frozen
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]


@attrs.frozen
class UnsubAck:
    packet_id: int


@attrs.frozen
class PingReq:
    pass


@attrs.frozen
class PingResp:
    pass


@attrs.frozen
class Disconnect:
    pass


_ACKS = {PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp, UNSUBACK: UnsubAck}
_ACK_TYPES = {cls: t for t, cls in _ACKS.items()}


class _Reader:
    """Fields read off one packet's body, in order."""

    __slots__ = ("body", "at", "what")

    def __init__(self, body: bytes, what: str):
        self.body, self.at, self.what = body, 0, what

    def left(self) -> int:
        return len(self.body) - self.at

    def byte(self) -> int:
        if self.at >= len(self.body):
            raise Malformed(f"a {self.what} cut short")
        self.at += 1
        return self.body[self.at - 1]

    def u16(self) -> int:
        if self.at + 2 > len(self.body):
            raise Malformed(f"a {self.what} cut short")
        (value,) = struct.unpack_from("!H", self.body, self.at)
        self.at += 2
        return value

    def binary(self) -> bytes:
        n = self.u16()
        if self.at + n > len(self.body):
            raise Malformed(f"a {self.what} whose field of {n} bytes runs past its end")
        self.at += n
        return self.body[self.at - n : self.at]

    def string(self, field: str) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed(f"a {self.what}'s {field} is not well-formed UTF-8") from None
        if "\x00" in text:
            raise Malformed(f"a {self.what}'s {field} holds U+0000")
        return text

    def packet_id(self) -> int:
        value = self.u16()
        if value == 0:
            raise Malformed(f"a {self.what} with packet identifier 0")
        return value

    def rest(self) -> bytes:
        out = self.body[self.at :]
        self.at = len(self.body)
        return out

    def done(self) -> None:
        if self.at != len(self.body):
            raise Malformed(f"a {self.what} with {self.left()} bytes more than its fields")


def decode(packet: Packet):
    """The value one packet says.

    Raises:
        Malformed: it breaks the spec (the connection is to be closed, saying this).
    """
    t, flags, body = packet.type, packet.flags, packet.body
    r = _Reader(body, packet.name)
    if t == PUBLISH:
        qos = (flags >> 1) & 3
        topic = r.string("topic name")
        why = check_topic(topic)
        if why is not None:
            raise Malformed(f"a PUBLISH's topic name: {why}")
        packet_id = r.packet_id() if qos else 0
        if not qos and flags & 0b1000:
            raise Malformed("a PUBLISH of QoS 0 with DUP set")
        return Publish(topic, r.rest(), qos, bool(flags & 1), bool(flags & 0b1000), packet_id)
    if t in _ACKS:
        out = _ACKS[t](r.packet_id())
    elif t == CONNECT:
        out = _connect(r)
    elif t == SUBSCRIBE:
        packet_id = r.packet_id()
        out = Subscribe(packet_id, tuple(_filters(r, "a SUBSCRIBE", with_qos=True)))
    elif t == UNSUBSCRIBE:
        packet_id = r.packet_id()
        out = Unsubscribe(packet_id, tuple(_filters(r, "an UNSUBSCRIBE", with_qos=False)))
    elif t == CONNACK:
        flags_byte, code = r.byte(), r.byte()
        if flags_byte & 0xFE:
            raise Malformed("a CONNACK with reserved flags set")
        out = ConnAck(code, bool(flags_byte & 1))
    elif t == SUBACK:
        packet_id = r.packet_id()
        out = SubAck(packet_id, tuple(r.rest()))
    elif t == PINGREQ:
        out = PingReq()
    elif t == PINGRESP:
        out = PingResp()
    elif t == DISCONNECT:
        out = Disconnect()
    else:
        raise Malformed(f"a {packet.name}, which MQTT 3.1.1 does not have")
    r.done()
    return out


def _filters(r: _Reader, what: str, *, with_qos: bool) -> list:
    """A SUBSCRIBE's (filter, QoS) pairs or an UNSUBSCRIBE's filters: at least one."""
    out: list = []
    while r.left():
        f = r.string("topic filter")
        why = check_filter(f)
        if why is not None:
            raise Malformed(f"{what}'s {why}")
        if with_qos:
            qos = r.byte()
            if qos > 2:
                raise Malformed(f"{what} asking for QoS {qos} (reserved bits or QoS 3)")
            f = (f, qos)
        out.append(f)
    if not out:
        raise Malformed(f"{what} with no topic filter")
    return out


def _connect(r: _Reader) -> Connect:
    name = r.binary()
    level = r.byte()
    if name not in (b"MQTT", b"MQIsdp"):
        raise Malformed(f"a CONNECT for protocol {name[:32]!r}, not MQTT")
    flags = r.byte()
    keepalive = r.u16()
    if flags & 1:
        raise Malformed("a CONNECT with its reserved flag set")
    will_flag, will_qos, will_retain = bool(flags & 4), (flags >> 3) & 3, bool(flags & 32)
    if will_qos > 2:
        raise Malformed("a CONNECT with a will of QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise Malformed("a CONNECT with a will's QoS or retain but no will")
    has_user, has_password = bool(flags & 128), bool(flags & 64)
    if has_password and not has_user:
        raise Malformed("a CONNECT with a password but no user name")
    client_id = r.string("client identifier")
    will = None
    if will_flag:
        topic = r.string("will topic")
        why = check_topic(topic)
        if why is not None:
            raise Malformed(f"a CONNECT's will topic: {why}")
        will = Will(topic, r.binary(), will_qos, will_retain)
    username = r.string("user name") if has_user else None
    password = r.binary() if has_password else None
    return Connect(client_id, bool(flags & 2), keepalive, username, password, will, level)


# -- encoding ----------------------------------------------------------------------------------


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 65535:
        raise ValueError(f"a string of {len(raw)} bytes, over MQTT's 65,535")
    return struct.pack("!H", len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > 65535:
        raise ValueError(f"a field of {len(data)} bytes, over MQTT's 65,535")
    return struct.pack("!H", len(data)) + data


def encode(value) -> bytes:
    """One packet's bytes."""
    kind = type(value)
    if kind is Publish:
        flags = value.qos << 1 | int(value.retain) | (8 if value.dup else 0)
        head = _string(value.topic)
        if value.qos:
            head += struct.pack("!H", value.packet_id)
        return frame(PUBLISH, flags, head + value.payload)
    if kind in _ACK_TYPES:
        t = _ACK_TYPES[kind]
        return frame(t, 0b0010 if t == PUBREL else 0, struct.pack("!H", value.packet_id))
    if kind is ConnAck:
        return frame(CONNACK, 0, bytes([int(value.session_present), value.code]))
    if kind is SubAck:
        return frame(SUBACK, 0, struct.pack("!H", value.packet_id) + bytes(value.codes))
    if kind is PingResp:
        return frame(PINGRESP, 0, b"")
    if kind is PingReq:
        return frame(PINGREQ, 0, b"")
    if kind is Disconnect:
        return frame(DISCONNECT, 0, b"")
    if kind is Subscribe:
        body = struct.pack("!H", value.packet_id)
        for f, qos in value.filters:
            body += _string(f) + bytes([qos])
        return frame(SUBSCRIBE, 0b0010, body)
    if kind is Unsubscribe:
        body = struct.pack("!H", value.packet_id) + b"".join(map(_string, value.filters))
        return frame(UNSUBSCRIBE, 0b0010, body)
    if kind is Connect:
        flags = (2 if value.clean_session else 0) | (128 if value.username is not None else 0)
        flags |= 64 if value.password is not None else 0
        payload = _string(value.client_id)
        if value.will is not None:
            flags |= 4 | value.will.qos << 3 | (32 if value.will.retain else 0)
            payload += _string(value.will.topic) + _binary(value.will.message)
        if value.username is not None:
            payload += _string(value.username)
        if value.password is not None:
            payload += _binary(value.password)
        head = _string("MQTT") + bytes([value.level, flags]) + struct.pack("!H", value.keepalive)
        return frame(CONNECT, 0, head + payload)
    raise TypeError(f"not an MQTT packet: {value!r}")
