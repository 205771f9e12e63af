"""Frames: length-prefixed, versioned, decoded incrementally in any chunking (h11 style)."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ges.wire.frames import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    FrameDecoder,
    FrameError,
    frame,
)
from ges.wire.messages import decode

bodies = st.lists(st.binary(max_size=64), max_size=20)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates allowed)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


def decode_all(chunks: list[bytes], **kw) -> list[bytes]:
    dec = FrameDecoder(**kw)
    out: list[bytes] = []
    for chunk in chunks:
        dec.feed(chunk)
        out += [bytes(b) for b in dec.frames()]
    assert dec.buffered == 0
    return out


def test_header_layout():
    assert frame(b"abc") == struct.pack(">IB", 4, PROTOCOL_VERSION) + b"abc"
    assert HEADER_SIZE == 5


def test_round_trip_one_frame():
    dec = FrameDecoder()
    dec.feed(frame(b"hello"))
    assert [bytes(b) for b in dec.frames()] == [b"hello"]
    assert dec.frames() == []
    assert dec.buffered == 0


def test_zero_length_body():
    dec = FrameDecoder()
    dec.feed(frame(b"") * 3)
    assert [bytes(b) for b in dec.frames()] == [b"", b"", b""]
    assert dec.buffered == 0


def test_partial_frame_is_held_until_complete():
    data = frame(b"0123456789")
    dec = FrameDecoder()
    dec.feed(data[:3])  # not even a header yet
    assert dec.frames() == []
    dec.feed(data[3:-1])  # header and all but the last byte
    assert dec.frames() == []
    assert dec.buffered == len(data) - 1
    dec.feed(data[-1:])
    assert [bytes(b) for b in dec.frames()] == [b"0123456789"]
    assert dec.buffered == 0


def test_feed_without_frames_accumulates_then_yields_in_order():
    dec = FrameDecoder()
    for body in (b"a", b"bb", b"ccc"):
        dec.feed(frame(body))
    assert [bytes(b) for b in dec.frames()] == [b"a", b"bb", b"ccc"]


@given(bodies)
def test_one_byte_at_a_time_equals_one_big_feed(msgs):
    data = b"".join(map(frame, msgs))
    whole = decode_all([data])
    bytewise = decode_all([data[i : i + 1] for i in range(len(data))])
    assert whole == bytewise == msgs


@given(bodies, st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_any_chunking_gives_the_same_frames(msgs, cuts):
    data = b"".join(map(frame, msgs))
    assert decode_all(split(data, cuts)) == msgs


def test_oversized_frame_raises_from_the_header_alone():
    dec = FrameDecoder(max_frame=100)
    # only the 5-byte header has arrived: the decoder must not wait for 101 body bytes
    dec.feed(struct.pack(">IB", 102, PROTOCOL_VERSION))
    with pytest.raises(FrameError, match="exceeds the 100-byte limit"):
        dec.frames()


def test_frame_of_exactly_max_frame_is_accepted():
    dec = FrameDecoder(max_frame=100)
    dec.feed(frame(b"x" * 100))
    assert [bytes(b) for b in dec.frames()] == [b"x" * 100]
    dec.feed(frame(b"x" * 101))
    with pytest.raises(FrameError):
        dec.frames()


def test_default_limit_rejects_a_huge_length_prefix():
    dec = FrameDecoder()
    dec.feed(struct.pack(">IB", DEFAULT_MAX_FRAME + 2, PROTOCOL_VERSION))
    with pytest.raises(FrameError):
        dec.frames()


def test_zero_length_prefix_is_an_error():
    # length counts the version byte, so 0 is impossible
    dec = FrameDecoder()
    dec.feed(struct.pack(">IB", 0, PROTOCOL_VERSION))
    with pytest.raises(FrameError):
        dec.frames()


def test_wrong_version_raises():
    dec = FrameDecoder()
    dec.feed(frame(b"abc", version=PROTOCOL_VERSION + 1))
    with pytest.raises(FrameError, match="unsupported protocol version"):
        dec.frames()


def test_wrong_version_raises_after_good_frames_are_not_lost_silently():
    dec = FrameDecoder()
    dec.feed(frame(b"ok"))
    assert [bytes(b) for b in dec.frames()] == [b"ok"]
    dec.feed(frame(b"bad", version=7))
    with pytest.raises(FrameError):
        dec.frames()


def test_decoder_for_another_version():
    dec = FrameDecoder(version=9)
    dec.feed(frame(b"x", version=9))
    assert [bytes(b) for b in dec.frames()] == [b"x"]
    dec.feed(frame(b"x"))
    with pytest.raises(FrameError):
        dec.frames()


def test_buffer_does_not_grow_over_many_frames_fed_bytewise():
    data = frame(b"y" * 37)
    dec = FrameDecoder()
    count = 0
    for _ in range(2_000):
        for i in range(len(data)):
            dec.feed(data[i : i + 1])
            count += len(dec.frames())
            assert dec.buffered <= len(data)
            # white-box: the underlying buffer is compacted, not just the read position moved
            assert len(dec._buf) <= 2 * len(data)
    assert count == 2_000
    assert dec.buffered == 0


@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=30),
    st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=30),
)
@settings(max_examples=50)
def test_buffer_stays_bounded_under_any_chunking(msgs, sizes):
    data = b"".join(map(frame, msgs)) * 20
    largest = max(len(b) for b in msgs) + HEADER_SIZE
    dec = FrameDecoder()
    pos, i, got = 0, 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        dec.feed(data[pos : pos + size])
        pos += size
        i += 1
        got += len(dec.frames())
        # what is left is one partial frame; what is kept is at most twice that plus one read
        assert dec.buffered < largest
        assert len(dec._buf) <= 2 * largest + max(sizes)
    assert got == 20 * len(msgs)
    assert dec.buffered == 0


@given(st.lists(st.binary(max_size=80), max_size=10))
@settings(max_examples=300)
def test_fuzz_random_bytes_only_raise_frame_error(chunks):
    dec = FrameDecoder(max_frame=1_000)
    with contextlib.suppress(FrameError):
        for chunk in chunks:
            dec.feed(chunk)
            for body in dec.frames():
                with contextlib.suppress(FrameError):
                    decode(body)


@given(st.binary(max_size=200))
@example(b"\x91\xa2\x00\x80")  # found by this test: a str that is not UTF-8 (see test_messages)
@settings(max_examples=300)
def test_fuzz_plausible_frames_only_raise_frame_error(body):
    # a valid header in front of random bytes gets the fuzzer past the framing into msgpack
    dec = FrameDecoder()
    dec.feed(frame(body))
    (got,) = dec.frames()
    assert bytes(got) == body
    with contextlib.suppress(FrameError):
        decode(got)
