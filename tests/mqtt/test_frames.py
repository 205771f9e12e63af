"""MQTT's framing (ges.mqtt.frames): packets whole however the bytes come, and what is malformed
refused in one line (MQTT 3.1.1 §2, §4.8; 5.0 §1.5.5, §2, §4.13)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ges.mqtt.frames import (
    AUTH,
    MAX_REMAINING,
    PINGREQ,
    PUBLISH,
    SUBSCRIBE,
    Malformed,
    Packet,
    PacketReader,
    encode_length,
    frame,
)


@pytest.mark.parametrize(
    ("n", "encoded"),
    [  # the spec's table of boundaries (5.0 §1.5.5, 3.1.1 §2.2.3)
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (MAX_REMAINING, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_lengths_at_the_specs_boundaries(n, encoded):
    assert encode_length(n) == encoded
    reader = PacketReader(max_packet=MAX_REMAINING + 5)
    reader.feed(bytes([PUBLISH << 4]) + encoded)
    # a body still to come (or none at all)
    assert reader.packets() == ([] if n else [Packet(PUBLISH, 0, b"")])
    with pytest.raises(ValueError):
        encode_length(MAX_REMAINING + 1)


@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=50),
)
def test_packets_come_out_whole_however_the_bytes_are_cut(bodies, step):
    data = b"".join(frame(PUBLISH, 0b0010, body) for body in bodies)
    reader = PacketReader()
    got = []
    for i in range(0, len(data), step):
        reader.feed(data[i : i + step])
        got += reader.packets()
    assert got == [Packet(PUBLISH, 0b0010, body) for body in bodies]


def test_a_packet_over_the_bound_is_refused_as_soon_as_its_length_is_known():
    reader = PacketReader(max_packet=100)
    reader.feed(bytes([PUBLISH << 4]) + encode_length(1_000_000))  # nothing of the body yet
    with pytest.raises(Malformed, match="PUBLISH of 1000004 bytes, over the limit of 100"):
        reader.packets()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x00\x00", "packet type 0 is reserved"),
        (bytes([AUTH << 4, 0]), "packet type 15 is reserved"),
        (bytes([SUBSCRIBE << 4, 0]), "SUBSCRIBE with flags 0000, not 0010"),
        (bytes([PINGREQ << 4 | 1, 0]), "PINGREQ with flags 0001, not 0000"),
        (bytes([PUBLISH << 4 | 0b0110, 0]), "PUBLISH with QoS 3"),
        (bytes([PUBLISH << 4]) + b"\x80\x80\x80\x80\x01", "more than four bytes"),
        (bytes([PUBLISH << 4]) + b"\x80\x00", "not in its shortest form"),
    ],
)
def test_malformed_packets_are_refused_in_one_line(data, why):
    reader = PacketReader()
    reader.feed(data)
    with pytest.raises(Malformed, match=why):
        reader.packets()


def test_auth_is_a_packet_under_mqtt_5():
    reader = PacketReader(version=5)
    reader.feed(frame(AUTH, 0, b"\x00"))
    (packet,) = reader.packets()
    assert packet.name == "AUTH" and packet.body == b"\x00"
