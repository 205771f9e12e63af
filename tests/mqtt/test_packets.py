"""MQTT 3.1.1's packets (ges.mqtt.packets): what a client and a server send survives encoding,
and every malformed field is refused in one line (§4.8: the connection is closed)."""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ges.mqtt import packets as p
from ges.mqtt.frames import (
    CONNECT,
    PUBLISH,
    SUBSCRIBE,
    UNSUBSCRIBE,
    Malformed,
    Packet,
    PacketReader,
    frame,
)


def roundtrip(value):
    reader = PacketReader()
    reader.feed(p.encode(value))
    (packet,) = reader.packets()
    return p.decode(packet)


TOPIC_TEXT = st.text(
    st.characters(exclude_characters="\x00+#", exclude_categories=("Cs",)), min_size=1, max_size=40
)


@pytest.mark.parametrize(
    "value",
    [
        p.Connect("c1"),
        p.Connect("", clean_session=True, keepalive=0),
        p.Connect("c2", False, 30, "alice", b"secret", p.Will("w/t", b"gone", 1, True)),
        p.ConnAck(p.ACCEPTED, True),
        p.ConnAck(p.BAD_LOGIN),
        p.Publish("a/b", b"", 0),
        p.Publish("a/b", b"x" * 1000, 1, packet_id=7),
        p.Publish("$SYS/x", b"y", 2, retain=True, dup=True, packet_id=65535),
        p.PubAck(1),
        p.PubRec(2),
        p.PubRel(3),
        p.PubComp(4),
        p.Subscribe(5, (("a/+", 0), ("#", 2))),
        p.SubAck(5, (0, p.SUBSCRIBE_FAILED)),
        p.Unsubscribe(6, ("a/+", "#")),
        p.UnsubAck(6),
        p.PingReq(),
        p.PingResp(),
        p.Disconnect(),
    ],
    ids=lambda v: type(v).__name__,
)
def test_what_is_sent_is_what_is_read(value):
    assert roundtrip(value) == value


@given(TOPIC_TEXT, st.binary(max_size=300), st.integers(0, 2), st.booleans())
def test_any_publish_survives(topic, payload, qos, retain):
    value = p.Publish(topic, payload, qos, retain, packet_id=9 if qos else 0)
    assert roundtrip(value) == value


@given(
    TOPIC_TEXT,
    st.binary(max_size=300),
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.integers(1, 65535),
    st.sampled_from([(), ((p.USER_PROPERTY, ("k", "v")),), ((p.CONTENT_TYPE, "text/x"),)]),
)
def test_a_delivery_written_as_bytes_is_the_packet_encoded(
    topic, payload, qos, retain, dup, pid, props
):
    """The broker writes its deliveries as bytes (their topic's field made once): the same
    bytes as the packet's, at either level."""
    dup, pid = (dup, pid) if qos else (False, 0)
    field = p.topic_field(topic)
    for v5, level in ((False, p.LEVEL_311), (True, p.LEVEL_5)):
        value = p.Publish(topic, payload, qos, retain, dup, pid, props if v5 else ())
        want = p.encode(value, level)
        out = bytearray(b"before")
        p.write_publish(out, field, payload, qos, retain, dup, pid, value.props, v5)
        assert out == b"before" + want


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("!H", len(raw)) + raw


def connect_body(flags: int, payload: bytes, name: bytes = b"MQTT") -> bytes:
    return s(name) + bytes([4, flags]) + struct.pack("!H", 60) + payload


BAD = [
    (Packet(PUBLISH, 0, s(b"a/\xff")), "not well-formed UTF-8"),
    (Packet(PUBLISH, 0, s("a\x00b")), "U+0000"),
    (Packet(PUBLISH, 0, s("a/+")), "wildcards"),
    (Packet(PUBLISH, 0, s("")), "empty"),
    (Packet(PUBLISH, 2, s("a") + b"\x00\x00"), "packet identifier 0"),
    (Packet(PUBLISH, 8, s("a")), "QoS 0 with DUP"),
    (Packet(PUBLISH, 2, s("a")), "cut short"),
    (Packet(PUBLISH, 0, b"\x00\x09ab"), "runs past its end"),
    (Packet(SUBSCRIBE, 2, b"\x00\x01"), "no topic filter"),
    (Packet(SUBSCRIBE, 2, b"\x00\x01" + s("a/#/b") + b"\x00"), "last level"),
    (Packet(SUBSCRIBE, 2, b"\x00\x01" + s("a") + b"\x03"), "QoS 3"),
    (Packet(SUBSCRIBE, 2, b"\x00\x01" + s("a") + b"\x41"), "reserved bits"),
    (Packet(SUBSCRIBE, 2, b"\x00\x01" + s("a")), "cut short"),
    (Packet(UNSUBSCRIBE, 2, b"\x00\x01"), "no topic filter"),
    (Packet(CONNECT, 0, connect_body(1, s("c"))), "reserved flag"),
    (Packet(CONNECT, 0, connect_body(0x08, s("c"))), "no will"),
    (Packet(CONNECT, 0, connect_body(0x40, s("c"))), "password but no user"),
    (Packet(CONNECT, 0, connect_body(0x1C, s("c") + s("t") + s("m"))), "QoS 3"),
    (Packet(CONNECT, 0, connect_body(0, s("c"), b"HTTP")), "not MQTT"),
    (Packet(CONNECT, 0, connect_body(0, s("c") + b"x")), "more than its fields"),
    (Packet(CONNECT, 0, connect_body(0x04, s("c") + s("w/+") + s("m"))), "will topic"),
]


@pytest.mark.parametrize(("packet", "why"), BAD, ids=[w for _, w in BAD])
def test_malformed_fields_are_refused_in_one_line(packet, why):
    with pytest.raises(Malformed, match=re.escape(why)) as info:
        p.decode(packet)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("topic", "why"),
    [(b"a/\xff", "not well-formed UTF-8"), (b"a\x00b", "U+0000"), (b"a/+", "wildcards")],
)
def test_a_topic_name_malformed_under_5_is_refused_as_under_3(topic, why):
    """5.0 lets a PUBLISH's topic name be empty (a topic alias), not bad: the same refusal as
    3.1.1's, the second time from the reader's memory too."""
    body = s(topic) + b"\x00" + b"payload"  # an empty property list
    for _ in range(2):
        with pytest.raises(Malformed, match=re.escape(why)):
            p.decode(Packet(PUBLISH, 0, body), p.LEVEL_5)
    assert p.decode(Packet(PUBLISH, 0, s(b"") + b"\x00x"), p.LEVEL_5).topic == ""


def test_a_connect_for_another_protocol_level_still_decodes():
    # the level is the server's to answer (CONNACK 1, unacceptable protocol version)
    body = s("MQTT") + bytes([6, 2]) + struct.pack("!H", 10) + b"whatever level 6 has"
    assert p.decode(Packet(CONNECT, 0, body)).level == 6


def test_strings_over_their_length_prefix_are_not_encoded():
    with pytest.raises(ValueError, match="65,535"):
        p.encode(p.Publish("a" * 70000))


def test_a_packet_cut_anywhere_reads_the_same():
    data = b"".join(
        p.encode(v) for v in (p.Connect("c"), p.Publish("t", b"abc", 1, packet_id=1), p.PingReq())
    )
    for cut in range(1, len(data)):
        reader = PacketReader()
        reader.feed(data[:cut])
        got = reader.packets()
        reader.feed(data[cut:])
        got += reader.packets()
        assert [p.decode(x) for x in got] == [
            p.Connect("c"),
            p.Publish("t", b"abc", 1, packet_id=1),
            p.PingReq(),
        ]
    assert frame(12, 0, b"") == p.encode(p.PingReq())


# -- MQTT 5.0 -----------------------------------------------------------------------------------


def roundtrip5(value):
    reader = PacketReader(version=5)
    reader.feed(p.encode(value, p.LEVEL_5))
    (packet,) = reader.packets()
    return p.decode(packet, p.LEVEL_5)


USER = (p.USER_PROPERTY, ("site", "north")), (p.USER_PROPERTY, ("site", "south"))


@pytest.mark.parametrize(
    "value",
    [
        p.Connect("c", False, 30, "u", b"pw", level=5,
                  props=((p.SESSION_EXPIRY, 3600), (p.RECEIVE_MAXIMUM, 10), *USER),
                  will=p.Will("w", b"bye", 1, True, ((p.WILL_DELAY, 5), (p.CONTENT_TYPE, "t")))),
        p.Connect("", True, 0, None, b"pw-without-user", level=5),
        p.ConnAck(0, True, ((p.ASSIGNED_CLIENT_ID, "x"), (p.MAXIMUM_PACKET_SIZE, 1 << 20))),
        p.Publish("a/b", b"x", 1, True, True, 9,
                  ((p.RESPONSE_TOPIC, "r/1"), (p.CORRELATION_DATA, b"\x00\xff"), *USER)),
        p.Publish("a", b"", 0),
        p.PubAck(3), p.PubAck(3, p.NOT_AUTHORIZED_5), p.PubRec(4, 0x10, ((p.REASON_STRING, "no"),)),
        p.PubRel(5), p.PubComp(6, 0x92),
        p.Subscribe(7, (("a/+", 1 | 4 | 8 | 32), ("b", 2)), ((p.SUBSCRIPTION_ID, 300),)),
        p.SubAck(7, (1, 0x87, 0x9E), ((p.REASON_STRING, "why"),)),
        p.Unsubscribe(8, ("a/+",), USER), p.UnsubAck(8, (0, 0x11)),
        p.Disconnect(), p.Disconnect(p.TAKEN_OVER, ((p.REASON_STRING, "elsewhere"),)),
        p.Disconnect(p.USE_ANOTHER_SERVER, ((p.SERVER_REFERENCE, "b2"),)),
    ],
)  # fmt: skip
def test_mqtt5_packets_survive_encoding(value):
    assert roundtrip5(value) == value


def test_mqtt5_properties_are_checked_as_the_spec_says():
    def publish(props: bytes) -> Packet:
        return Packet(PUBLISH, 2, b"\x00\x01a\x00\x01" + bytes([len(props)]) + props)

    assert p.decode(publish(b"\x23\x00\x05"), 5).props == ((p.TOPIC_ALIAS, 5),)
    cases = {
        b"\x23\x00\x05\x23\x00\x06": "property 0x23 twice",
        b"\x11\x00\x00\x00\x01": "property 0x11, which it may not have",  # a CONNECT's
        b"\x7f\x00": "property 0x7f",
        b"\x08\x00\x05ab": "run",
        b"\x0b\x80\x00": "shortest form",
    }
    for props, why in cases.items():
        with pytest.raises(Malformed, match=why):
            p.decode(publish(props), 5)
    two_users = b"\x26\x00\x01k\x00\x01v\x26\x00\x01k\x00\x01w"  # user properties may repeat
    assert len(p.decode(publish(two_users), 5).props) == 2


@pytest.mark.parametrize("options", [0xC1, 0x31, 0x03])
def test_mqtt5_subscribe_options_with_reserved_bits_are_malformed(options):
    body = b"\x00\x01\x00" + b"\x00\x01a" + bytes([options])
    with pytest.raises(Malformed, match="options"):
        p.decode(Packet(SUBSCRIBE, 2, body), 5)
    with pytest.raises(Malformed):  # and 3.1.1 takes no options at all
        p.decode(Packet(SUBSCRIBE, 2, b"\x00\x01\x00\x01a\x04"))


def test_mqtt5_auth_is_refused_and_a_short_ack_means_success():
    reader = PacketReader(version=5)
    reader.feed(b"\xf0\x00")
    with pytest.raises(Malformed, match="enhanced authentication"):
        p.decode(reader.packets()[0], 5)
    assert p.decode(Packet(4, 0, b"\x00\x07"), 5) == p.PubAck(7)
    assert p.decode(Packet(14, 0, b""), 5) == p.Disconnect()
