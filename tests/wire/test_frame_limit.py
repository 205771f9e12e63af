"""Every frame built stays within the frame limit the receiver enforces (issue 17, finding 2:
a recovery after a 3 s cut went out in Deliver frames of 37 and 67 MB, and the subscriber
dropped the connection)."""

from __future__ import annotations

import pytest

from ges.wire import (
    DEFAULT_MAX_FRAME,
    MAX_EVENT_BYTES,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    decode,
    encode,
    encode_frames,
    event_size,
)
from ges.wire import messages as m
from ges.wire.frames import HEADER_SIZE

KB = 1024


def items(n: int, size: int = KB, first: int = 1) -> list[m.EventItem]:
    return [m.EventItem(first + i, 0, 0, m.Event({"n": i}, b"x" * size)) for i in range(n)]


def decoded(frames: list[bytes], limit: int) -> list:
    dec = FrameDecoder(max_frame=limit)
    for f in frames:
        assert len(f) - HEADER_SIZE <= limit
        dec.feed(f)
    return [decode(body) for body in dec.frames()]


def test_a_small_message_is_one_frame():
    msg = m.Deliver(1, "b1~1", items(3))
    assert encode_frames(msg) == [encode(msg)]


@pytest.mark.parametrize("kind", [m.Deliver, m.Events])
def test_a_batch_over_the_limit_goes_as_several_frames_with_every_item_once_in_order(kind):
    limit = 64 * KB
    batch = items(500)  # ~0.5 MB
    msg = m.Deliver(7, "b1~1", batch) if kind is m.Deliver else m.Events("b1~1", batch, 3)
    parts = decoded(encode_frames(msg, max_frame=limit), limit)
    assert len(parts) > 8
    assert all(type(p) is kind for p in parts)
    assert [it for p in parts for it in p.items] == batch
    if kind is m.Deliver:
        assert {p.sub_id for p in parts} == {7}
    else:
        assert {p.vm for p in parts} == {3}


def test_an_answer_is_split_into_answers_for_consecutive_ranges():
    """A Recovered says: every event of lo..hi (a tick it lacks had none). Its parts cover the
    same range, each whole for its own part of it."""
    limit = 32 * KB
    batch = [it for it in items(200) if it.tick % 3]  # ticks with gaps: silence in between
    msg = m.Recovered("b1~1", "b9", 1, 250, batch)
    parts = decoded(encode_frames(msg, max_frame=limit), limit)
    assert len(parts) > 2
    assert parts[0].lo == 1 and parts[-1].hi == 250
    for a, b in zip(parts, parts[1:], strict=False):
        assert b.lo == a.hi + 1
    for p in parts:
        assert all(p.lo <= it.tick <= p.hi for it in p.items)
    assert [it for p in parts for it in p.items] == batch


def test_profile_changes_and_link_states_split_too():
    limit = 16 * KB
    changes = [
        m.ProfileChange("b1", 1, i, 1, [m.Constraint("sym", "eq", "x" * 100)]) for i in range(500)
    ]
    parts = decoded(encode_frames(m.Profiles(["b2"], changes), max_frame=limit), limit)
    assert [c for p in parts for c in p.changes] == changes


def test_what_cannot_be_split_below_the_limit_is_refused_where_it_is_built():
    with pytest.raises(FrameTooLarge, match="cannot be split"):
        encode_frames(m.Deliver(1, "b1~1", items(1, size=100 * KB)), max_frame=64 * KB)
    with pytest.raises(FrameTooLarge):
        encode_frames(m.Error("x" * 100_000), max_frame=64 * KB)


def test_a_broker_frame_around_the_largest_event_fits():
    """An event at the event limit, forwarded with routes and a long path, still fits."""
    body = b"x" * (MAX_EVENT_BYTES - 200)
    event = m.Event({"n": 1}, body)
    assert event_size(event) <= MAX_EVENT_BYTES
    route = m.Route(("SSC-A", "SC-1", "c1"), "b" * 64, "b" * 64, tuple("b" * 64 for _ in range(32)))
    item = m.EventItem(
        1 << 40, 1 << 40, 63, event, (route,) * 4, tuple("b" * 64 for _ in range(64))
    )
    (frame,) = encode_frames(m.Events("b" * 64 + "~1", [item], 1 << 60))
    assert len(frame) - HEADER_SIZE <= DEFAULT_MAX_FRAME


def test_a_publish_frame_carrying_an_event_over_the_limit_is_refused_on_decode():
    big = m.Event({"n": 1}, b"x" * (MAX_EVENT_BYTES + 10))
    body = encode(m.Publish(1, [big]))[HEADER_SIZE:]
    with pytest.raises(FrameError, match="event 0 of a publish is .* over the"):
        decode(body)
    ok = m.Event({"n": 1}, b"x" * (MAX_EVENT_BYTES - 100))
    assert len(decode(encode(m.Publish(1, [ok]))[HEADER_SIZE:]).events[0].payload) > 0


def test_the_client_library_splits_a_batch_by_its_size_attributes_included():
    from ges.client._client import _frames_of

    heavy = [m.Event({"blob": "a" * 10_000, "n": i}) for i in range(2_000)]  # 20 MB, tiny payloads
    parts = _frames_of(heavy, first=11)
    assert len(parts) == 2 and [e for p, _ in parts for e in p] == heavy
    assert parts[0][1] == 11 and parts[1][1] == 11 + len(parts[0][0])  # idempotent numbers
    for chunk, first in parts:
        assert len(encode(m.Publish(1, chunk, "P", first))) - HEADER_SIZE <= DEFAULT_MAX_FRAME
    with pytest.raises(ValueError, match="event 1 of the batch is .* over the"):
        _frames_of([m.Event({"n": 1}), m.Event({"blob": "b" * (MAX_EVENT_BYTES + 1)})], None)
    small = [m.Event({"n": 1})]
    assert _frames_of(small, None) == [(small, None)]
