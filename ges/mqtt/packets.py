"""MQTT 3.1.1's and 5.0's control packets: bodies decoded into values and values encoded into
packets.

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

MQTT 5.0 (protocol level 5) adds *properties* to most packets (5.0 §2.2.2): a variable byte
integer length, then identifier-value pairs, each identifier one of those the spec lists for
that packet, none but User Property (and a server's Subscription Identifier) twice. They are
kept as a tuple of ``(identifier, value)`` pairs in order (:data:`PROPERTY_TYPES` says each
one's type); the acknowledgements, UNSUBACK and DISCONNECT gain reason codes, and a
SUBSCRIBE's requested QoS becomes an options byte (QoS, No Local, Retain As Published, Retain
Handling). :func:`decode` and :func:`encode` take the connection's protocol level.

Bounds are the framing's: a packet is at most ``max_packet`` bytes, so every field is too; the
number of filters in one SUBSCRIBE is bounded by the broker (ges.mqtt.session), not here.
"""

from __future__ import annotations

import functools
import struct

import msgspec

from ges.matching.topics import check_filter, check_topic
from ges.mqtt.frames import (
    AUTH,
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
    encode_length,
    frame,
)

#: CONNACK return codes (§3.2.2.3).
ACCEPTED, BAD_VERSION, BAD_CLIENT_ID, UNAVAILABLE, BAD_LOGIN, NOT_AUTHORIZED = range(6)
#: A SUBACK's code for a refused filter (§3.9.3).
SUBSCRIBE_FAILED = 0x80
#: The protocol levels of MQTT 3.1.1 (§3.1.2.2) and 5.0.
LEVEL_311 = 4
LEVEL_5 = 5

#: MQTT 5.0's property identifiers (5.0 §2.2.2.2) and their types.
PAYLOAD_FORMAT, MESSAGE_EXPIRY, CONTENT_TYPE = 0x01, 0x02, 0x03
RESPONSE_TOPIC, CORRELATION_DATA, SUBSCRIPTION_ID = 0x08, 0x09, 0x0B
SESSION_EXPIRY, ASSIGNED_CLIENT_ID, SERVER_KEEP_ALIVE = 0x11, 0x12, 0x13
AUTH_METHOD, AUTH_DATA, REQUEST_PROBLEM_INFO, WILL_DELAY = 0x15, 0x16, 0x17, 0x18
REQUEST_RESPONSE_INFO, RESPONSE_INFO, SERVER_REFERENCE, REASON_STRING = 0x19, 0x1A, 0x1C, 0x1F
RECEIVE_MAXIMUM, TOPIC_ALIAS_MAXIMUM, TOPIC_ALIAS, MAXIMUM_QOS = 0x21, 0x22, 0x23, 0x24
RETAIN_AVAILABLE, USER_PROPERTY, MAXIMUM_PACKET_SIZE = 0x25, 0x26, 0x27
WILDCARD_AVAILABLE, SUBSCRIPTION_IDS_AVAILABLE, SHARED_AVAILABLE = 0x28, 0x29, 0x2A
BYTE, U16, U32, VARINT, STRING, BINARY, PAIR = range(7)
#: The largest Four Byte Integer (a Message or Session Expiry Interval's "never", §3.1.2.11.2).
MAX_U32 = 0xFFFFFFFF
PROPERTY_TYPES = {
    PAYLOAD_FORMAT: BYTE, MESSAGE_EXPIRY: U32, CONTENT_TYPE: STRING, RESPONSE_TOPIC: STRING,
    CORRELATION_DATA: BINARY, SUBSCRIPTION_ID: VARINT, SESSION_EXPIRY: U32,
    ASSIGNED_CLIENT_ID: STRING, SERVER_KEEP_ALIVE: U16, AUTH_METHOD: STRING, AUTH_DATA: BINARY,
    REQUEST_PROBLEM_INFO: BYTE, WILL_DELAY: U32, REQUEST_RESPONSE_INFO: BYTE,
    RESPONSE_INFO: STRING, SERVER_REFERENCE: STRING, REASON_STRING: STRING,
    RECEIVE_MAXIMUM: U16, TOPIC_ALIAS_MAXIMUM: U16, TOPIC_ALIAS: U16, MAXIMUM_QOS: BYTE,
    RETAIN_AVAILABLE: BYTE, USER_PROPERTY: PAIR, MAXIMUM_PACKET_SIZE: U32,
    WILDCARD_AVAILABLE: BYTE, SUBSCRIPTION_IDS_AVAILABLE: BYTE, SHARED_AVAILABLE: BYTE,
}  # fmt: skip
#: Properties that may come more than once in one packet.
_REPEATED = frozenset({USER_PROPERTY, SUBSCRIPTION_ID})

#: MQTT 5.0 reason codes a server sends (5.0 §2.4), and what a 3.1.1 CONNACK code is in 5.0.
SUCCESS, DISCONNECT_WITH_WILL, NO_SUBSCRIPTION = 0x00, 0x04, 0x11
UNSPECIFIED, MALFORMED, PROTOCOL_ERROR, NOT_AUTHORIZED_5 = 0x80, 0x81, 0x82, 0x87
BAD_AUTH_METHOD, KEEP_ALIVE_TIMEOUT, TAKEN_OVER, FILTER_INVALID = 0x8C, 0x8D, 0x8E, 0x8F
PACKET_TOO_LARGE, QUOTA_EXCEEDED, ADMINISTRATIVE, USE_ANOTHER_SERVER = 0x95, 0x97, 0x98, 0x9C
RECEIVE_MAXIMUM_EXCEEDED = 0x93
SHARED_NOT_SUPPORTED, SUBSCRIPTION_IDS_NOT_SUPPORTED = 0x9E, 0xA1
CONNACK_5 = {
    ACCEPTED: SUCCESS,
    BAD_VERSION: 0x84,
    BAD_CLIENT_ID: 0x85,
    UNAVAILABLE: 0x88,
    BAD_LOGIN: 0x86,
    NOT_AUTHORIZED: NOT_AUTHORIZED_5,
}


class Will(msgspec.Struct, frozen=True):
    topic: str
    message: bytes
    qos: int = 0
    retain: bool = False
    props: tuple = ()


class Connect(msgspec.Struct, frozen=True):
    client_id: str
    clean_session: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    level: int = LEVEL_311
    props: tuple = ()


class ConnAck(msgspec.Struct, frozen=True):
    code: int = ACCEPTED
    session_present: bool = False
    props: tuple = ()


class Publish(msgspec.Struct, frozen=True):
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    props: tuple = ()


class PubAck(msgspec.Struct, frozen=True):
    packet_id: int
    reason: int = SUCCESS
    props: tuple = ()


class PubRec(msgspec.Struct, frozen=True):
    packet_id: int
    reason: int = SUCCESS
    props: tuple = ()


class PubRel(msgspec.Struct, frozen=True):
    packet_id: int
    reason: int = SUCCESS
    props: tuple = ()


class PubComp(msgspec.Struct, frozen=True):
    packet_id: int
    reason: int = SUCCESS
    props: tuple = ()


class Subscribe(msgspec.Struct, frozen=True):
    packet_id: int
    #: (filter, options): the requested QoS, and under 5.0 No Local (4), Retain As Published
    #: (8) and Retain Handling (bits 4-5)
    filters: tuple[tuple[str, int], ...]
    props: tuple = ()


class SubAck(msgspec.Struct, frozen=True):
    packet_id: int
    codes: tuple[int, ...]
    props: tuple = ()


class Unsubscribe(msgspec.Struct, frozen=True):
    packet_id: int
    filters: tuple[str, ...]
    props: tuple = ()


class UnsubAck(msgspec.Struct, frozen=True):
    packet_id: int
    codes: tuple[int, ...] = ()  # 5.0 only
    props: tuple = ()


class PingReq(msgspec.Struct, frozen=True):
    pass


class PingResp(msgspec.Struct, frozen=True):
    pass


class Disconnect(msgspec.Struct, frozen=True):
    reason: int = SUCCESS  # 5.0 only
    props: tuple = ()


def prop(props: tuple, pid: int, default=None):
    """The value of property ``pid`` in ``props`` (the first, if repeated)."""
    for key, value in props:
        if key == pid:
            return value
    return default


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

    def u32(self) -> int:
        if self.at + 4 > len(self.body):
            raise Malformed(f"a {self.what} cut short")
        (value,) = struct.unpack_from("!I", self.body, self.at)
        self.at += 4
        return value

    def varint(self) -> int:
        value = 0
        for i in range(4):
            b = self.byte()
            value |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                if i and not b:
                    raise Malformed(
                        f"a {self.what} with a variable byte integer not in its shortest form"
                    )
                return value
        raise Malformed(f"a {self.what} with a variable byte integer of over four bytes")

    def props(self, allowed: frozenset | None) -> tuple:
        """MQTT 5.0 properties (5.0 §2.2.2): those of the packet's kind, each once but those
        that may repeat."""
        n = self.varint()
        end = self.at + n
        if end > len(self.body):
            raise Malformed(f"a {self.what} whose properties run past its end")
        out: list = []
        seen: set[int] = set()
        while self.at < end:
            pid = self.varint()
            kind = PROPERTY_TYPES.get(pid)
            if kind is None or (allowed is not None and pid not in allowed):
                raise Malformed(f"a {self.what} with property 0x{pid:02x}, which it may not have")
            if pid in seen and pid not in _REPEATED:
                raise Malformed(f"a {self.what} with property 0x{pid:02x} twice")
            seen.add(pid)
            if kind == BYTE:
                value = self.byte()
            elif kind == U16:
                value = self.u16()
            elif kind == U32:
                value = self.u32()
            elif kind == VARINT:
                value = self.varint()
            elif kind == STRING:
                value = self.string(f"property 0x{pid:02x}")
            elif kind == BINARY:
                value = self.binary()
            else:
                value = (self.string("user property's name"), self.string("user property"))
            out.append((pid, value))
        if self.at != end:
            raise Malformed(f"a {self.what} whose properties overrun their length")
        return tuple(out)

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


_ACK_PROPS = frozenset({REASON_STRING, USER_PROPERTY})
_PUBLISH_PROPS = frozenset(
    {PAYLOAD_FORMAT, MESSAGE_EXPIRY, TOPIC_ALIAS, RESPONSE_TOPIC, CORRELATION_DATA,
     USER_PROPERTY, SUBSCRIPTION_ID, CONTENT_TYPE}
)  # fmt: skip
_CONNECT_PROPS = frozenset(
    {SESSION_EXPIRY, RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, TOPIC_ALIAS_MAXIMUM,
     REQUEST_RESPONSE_INFO, REQUEST_PROBLEM_INFO, USER_PROPERTY, AUTH_METHOD, AUTH_DATA}
)  # fmt: skip
_WILL_PROPS = frozenset(
    {WILL_DELAY, PAYLOAD_FORMAT, MESSAGE_EXPIRY, CONTENT_TYPE, RESPONSE_TOPIC,
     CORRELATION_DATA, USER_PROPERTY}
)  # fmt: skip
_DISCONNECT_PROPS = frozenset({SESSION_EXPIRY, REASON_STRING, USER_PROPERTY, SERVER_REFERENCE})


def decode(packet: Packet, level: int = LEVEL_311):
    """The value one packet says, at protocol ``level`` (a CONNECT says its own).

    Raises:
        Malformed: it breaks the spec (the connection is to be closed, saying this).
    """
    t, flags, body = packet.type, packet.flags, packet.body
    v5 = level == LEVEL_5
    if t == PUBLISH:  # the one a broker reads most: its fields read in line, as _Reader would
        return _publish(flags, body, v5)
    r = _Reader(body, packet.name)
    if t in _ACKS:
        if t == UNSUBACK and v5:
            packet_id, props = r.packet_id(), r.props(_ACK_PROPS)
            out = UnsubAck(packet_id, tuple(r.rest()), props)
        else:
            packet_id = r.packet_id()
            reason = r.byte() if v5 and r.left() else SUCCESS
            props = r.props(_ACK_PROPS) if v5 and r.left() else ()
            out = _ACKS[t](packet_id, reason, props) if t != UNSUBACK else UnsubAck(packet_id)
    elif t == CONNECT:
        out = _connect(r)
    elif t == SUBSCRIBE:
        packet_id = r.packet_id()
        props = r.props(frozenset({SUBSCRIPTION_ID, USER_PROPERTY})) if v5 else ()
        out = Subscribe(packet_id, tuple(_filters(r, "a SUBSCRIBE", with_qos=True, v5=v5)), props)
    elif t == UNSUBSCRIBE:
        packet_id = r.packet_id()
        props = r.props(frozenset({USER_PROPERTY})) if v5 else ()
        filters = tuple(_filters(r, "an UNSUBSCRIBE", with_qos=False))
        out = Unsubscribe(packet_id, filters, props)
    elif t == CONNACK:
        flags_byte, code = r.byte(), r.byte()
        if flags_byte & 0xFE:
            raise Malformed("a CONNACK with reserved flags set")
        out = ConnAck(code, bool(flags_byte & 1), r.props(None) if v5 else ())
    elif t == SUBACK:
        packet_id = r.packet_id()
        props = r.props(_ACK_PROPS) if v5 else ()
        out = SubAck(packet_id, tuple(r.rest()), props)
    elif t == PINGREQ:
        out = PingReq()
    elif t == PINGRESP:
        out = PingResp()
    elif t == DISCONNECT:
        reason = r.byte() if v5 and r.left() else SUCCESS
        out = Disconnect(reason, r.props(_DISCONNECT_PROPS) if v5 and r.left() else ())
    elif v5 and t == AUTH:
        raise Malformed("an AUTH: this server takes no enhanced authentication")
    else:
        raise Malformed(f"a {packet.name}, which MQTT 3.1.1 does not have")
    r.done()
    return out


def _filters(r: _Reader, what: str, *, with_qos: bool, v5: bool = False) -> list:
    """A SUBSCRIBE's (filter, options) pairs or an UNSUBSCRIBE's filters: at least one."""
    out: list = []
    while r.left():
        f = r.string("topic filter")
        why = check_filter(f)
        if why is not None:
            raise Malformed(f"{what}'s {why}")
        if with_qos:
            options = r.byte()
            if (options & 3) == 3 or options & (0xC0 if v5 else 0xFC) or (options >> 4) == 3:
                raise Malformed(f"{what} with options 0x{options:02x} (reserved bits or QoS 3)")
            f = (f, options)
        out.append(f)
    if not out:
        raise Malformed(f"{what} with no topic filter")
    return out


def _connect(r: _Reader) -> Connect:
    name = r.binary()
    level = r.byte()
    if name not in (b"MQTT", b"MQIsdp"):
        raise Malformed(f"a CONNECT for protocol {name[:32]!r}, not MQTT")
    if level not in (3, LEVEL_311, LEVEL_5):  # the server's to answer (unacceptable version)
        r.rest()
        return Connect("", level=level)
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
    v5 = level == LEVEL_5
    if has_password and not has_user and not v5:  # 5.0 allows it (§3.1.2.9)
        raise Malformed("a CONNECT with a password but no user name")
    props = r.props(_CONNECT_PROPS) if v5 else ()
    client_id = r.string("client identifier")
    will = None
    if will_flag:
        will_props = r.props(_WILL_PROPS) if v5 else ()
        topic = r.string("will topic")
        why = check_topic(topic)
        if why is not None:
            raise Malformed(f"a CONNECT's will topic: {why}")
        will = Will(topic, r.binary(), will_qos, will_retain, will_props)
    username = r.string("user name") if has_user else None
    password = r.binary() if has_password else None
    return Connect(client_id, bool(flags & 2), keepalive, username, password, will, level, props)


# -- encoding ----------------------------------------------------------------------------------


def _publish(flags: int, body: bytes, v5: bool) -> Publish:
    qos = (flags >> 1) & 3
    n = len(body)
    if n < 2:
        raise Malformed("a PUBLISH cut short")
    at = 2 + (body[0] << 8 | body[1])
    if at > n:
        raise Malformed(f"a PUBLISH whose field of {at - 2} bytes runs past its end")
    raw = body[2:at]
    topic, why = (_short_topic_name if at <= TOPIC_CACHE_CHARS else _topic_name)(raw)
    if why is not None and (at > 2 or not v5):  # 5.0: empty with a topic alias
        raise Malformed(why)
    packet_id = 0
    if qos:
        if at + 2 > n:
            raise Malformed("a PUBLISH cut short")
        packet_id = body[at] << 8 | body[at + 1]
        if not packet_id:
            raise Malformed("a PUBLISH with packet identifier 0")
        at += 2
    elif flags & 0b1000:
        raise Malformed("a PUBLISH of QoS 0 with DUP set")
    props = ()
    if v5:
        r = _Reader(body, "PUBLISH")
        r.at = at
        props = r.props(_PUBLISH_PROPS)
        at = r.at
    return Publish(topic, body[at:], qos, bool(flags & 1), bool(flags & 0b1000), packet_id, props)


def _topic_name(raw: bytes) -> tuple[str, str | None]:
    """A PUBLISH's topic name from its bytes, and why it is not one (None: it is)."""
    try:
        topic = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "", "a PUBLISH's topic name is not well-formed UTF-8"
    if "\x00" in topic:
        return "", "a PUBLISH's topic name holds U+0000"
    why = check_topic(topic)
    return topic, None if why is None else f"a PUBLISH's topic name: {why}"


def write_publish(
    out: bytearray,
    topic: bytes,
    payload: bytes,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int = 0,
    props: tuple = (),
    v5: bool = False,
) -> None:
    """A PUBLISH written at the end of ``out``, its topic name already as the packet carries
    it (``_string``): the broker's deliveries are written so, a topic's bytes made once for
    many, with no copy of the payload on the way."""
    props_field = _props(props) if v5 else b""
    length = len(topic) + len(payload) + len(props_field) + (2 if qos else 0)
    out.append(PUBLISH << 4 | qos << 1 | (1 if retain else 0) | (8 if dup else 0))
    out += encode_length(length)
    out += topic
    if qos:
        out += packet_id.to_bytes(2, "big")
    if v5:
        out += props_field
    out += payload


def topic_field(topic: str) -> bytes | None:
    """A topic name as a PUBLISH carries it, or None if it is not one MQTT can carry (a GES
    publisher's ``@topic`` may be anything); a short one's is made once."""
    return _short_topic_field(topic) if len(topic) <= TOPIC_CACHE_CHARS else _topic_field(topic)


def _topic_field(topic: str) -> bytes | None:
    if check_topic(topic) is not None or len(topic.encode("utf-8")) > 65535:
        return None
    return _string(topic)


#: Topics up to this many characters have their bytes kept, for the last TOPIC_CACHE of them
#: (the topic and its bytes, at most 4 bytes a character each: under 2.5 MiB in all).
TOPIC_CACHE_CHARS = 256
TOPIC_CACHE = 1024
_short_topic_field = functools.lru_cache(maxsize=TOPIC_CACHE)(_topic_field)
#: and the topic names read from PUBLISHes of up to TOPIC_CACHE_CHARS bytes, each with why it
#: is not one (the bytes, the name and the reason: under 1 MiB in all)
_short_topic_name = functools.lru_cache(maxsize=TOPIC_CACHE)(_topic_name)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 65535:
        raise ValueError(f"a string of {len(raw)} bytes, over MQTT's 65,535")
    return struct.pack("!H", len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > 65535:
        raise ValueError(f"a field of {len(data)} bytes, over MQTT's 65,535")
    return struct.pack("!H", len(data)) + data


#: A property list's entry holding properties already encoded (``props_bytes``): the
#: Subscription Identifiers a broker's delivery carries, made once for many deliveries.
RAW_PROPS = -1


def props_bytes(props: tuple) -> bytes:
    """MQTT 5.0 properties encoded, without their length: a ``RAW_PROPS`` entry's value."""
    return bytes(_props(props, False))


def _props(props: tuple, with_length: bool = True) -> bytes:
    """MQTT 5.0 properties, with their length."""
    out = bytearray()
    for pid, value in props:
        if pid == RAW_PROPS:
            out += value
            continue
        out += encode_length(pid)
        kind = PROPERTY_TYPES[pid]
        if kind == BYTE:
            out.append(value)
        elif kind == U16:
            out += struct.pack("!H", value)
        elif kind == U32:
            out += struct.pack("!I", value)
        elif kind == VARINT:
            out += encode_length(value)
        elif kind == STRING:
            out += _string(value)
        elif kind == BINARY:
            out += _binary(value)
        else:
            out += _string(value[0]) + _string(value[1])
    return encode_length(len(out)) + bytes(out) if with_length else out


def encode(value, level: int = LEVEL_311) -> bytes:
    """One packet's bytes, at protocol ``level`` (a CONNECT says its own)."""
    kind = type(value)
    v5 = level == LEVEL_5
    if kind is Publish:
        out = bytearray()
        write_publish(
            out,
            _string(value.topic),
            value.payload,
            value.qos,
            value.retain,
            value.dup,
            value.packet_id,
            value.props,
            v5,
        )
        return bytes(out)
    if kind in _ACK_TYPES:
        t = _ACK_TYPES[kind]
        body = struct.pack("!H", value.packet_id)
        if v5 and kind is UnsubAck:
            body += _props(value.props) + bytes(value.codes)
        elif v5 and (value.reason or value.props):
            body += bytes([value.reason]) + (_props(value.props) if value.props else b"")
        return frame(t, 0b0010 if t == PUBREL else 0, body)
    if kind is ConnAck:
        body = bytes([int(value.session_present), value.code])
        return frame(CONNACK, 0, body + _props(value.props) if v5 else body)
    if kind is SubAck:
        props = _props(value.props) if v5 else b""
        return frame(SUBACK, 0, struct.pack("!H", value.packet_id) + props + bytes(value.codes))
    if kind is PingResp:
        return frame(PINGRESP, 0, b"")
    if kind is PingReq:
        return frame(PINGREQ, 0, b"")
    if kind is Disconnect:
        if not v5 or (value.reason == SUCCESS and not value.props):
            return frame(DISCONNECT, 0, b"")
        return frame(DISCONNECT, 0, bytes([value.reason]) + _props(value.props))
    if kind is Subscribe:
        body = struct.pack("!H", value.packet_id) + (_props(value.props) if v5 else b"")
        for f, options in value.filters:
            body += _string(f) + bytes([options])
        return frame(SUBSCRIBE, 0b0010, body)
    if kind is Unsubscribe:
        body = struct.pack("!H", value.packet_id) + (_props(value.props) if v5 else b"")
        body += b"".join(map(_string, value.filters))
        return frame(UNSUBSCRIBE, 0b0010, body)
    if kind is Connect:
        v5 = value.level == LEVEL_5
        flags = (2 if value.clean_session else 0) | (128 if value.username is not None else 0)
        flags |= 64 if value.password is not None else 0
        payload = (_props(value.props) if v5 else b"") + _string(value.client_id)
        if value.will is not None:
            flags |= 4 | value.will.qos << 3 | (32 if value.will.retain else 0)
            payload += _props(value.will.props) if v5 else b""
            payload += _string(value.will.topic) + _binary(value.will.message)
        if value.username is not None:
            payload += _string(value.username)
        if value.password is not None:
            payload += _binary(value.password)
        head = _string("MQTT") + bytes([value.level, flags]) + struct.pack("!H", value.keepalive)
        return frame(CONNECT, 0, head + payload)
    raise TypeError(f"not an MQTT packet: {value!r}")
