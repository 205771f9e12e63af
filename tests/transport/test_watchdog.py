"""Direct reads on a plain socket, their deadlines kept by a Watchdog instead of a cancel scope per
read: frames come out whole and in order, a frame trickling in past its deadline and a silent
peer are cut with the same reasons as before, and time the reader spends not reading is not the
peer's silence."""

from __future__ import annotations

import pytest
import trio

from ges.transport.connection import Connection, Watchdog
from ges.wire import FrameError, encode
from ges.wire import messages as m


def _pair(watchdog: Watchdog, **deadlines) -> tuple[Connection, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    conn = Connection(trio.SocketStream(a), label="test", watchdog=watchdog, **deadlines)
    assert conn.watchdog is watchdog  # a plain socket: direct reads
    return conn, trio.SocketStream(b)


def _frames(n: int) -> bytes:
    return b"".join(encode(m.Publish(i, [])) for i in range(n))


async def test_frames_split_across_reads_come_out_whole_and_in_order():
    watchdog = Watchdog()
    conn, peer = _pair(watchdog)
    data = _frames(50) + encode(m.Publish(1, [m.Event({"n": 1}, b"x" * 300_000, 0)]))
    got = []

    async def read() -> None:
        async for batch in conn.read_messages():
            got.extend(batch)
            if len(got) == 51:
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watchdog.run)
        nursery.start_soon(read)
        for at in range(0, len(data), 7_001):  # pieces that cut frames and headers
            await peer.send_all(data[at : at + 7_001])
            await trio.sleep(0)
        with trio.fail_after(5):
            while len(got) < 51:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert [msg.seq for msg in got[:50]] == list(range(50))
    assert len(got[50].events[0].payload) == 300_000


async def test_a_frame_trickling_in_past_its_deadline_is_refused_though_bytes_keep_coming():
    watchdog = Watchdog()
    conn, peer = _pair(watchdog, frame_deadline=0.3)
    frame = encode(m.Publish(1, [m.Event({"n": 1}, b"x" * 1000, 0)]))

    async def trickle() -> None:
        for i in range(len(frame) - 1):  # never the last byte
            await peer.send_all(frame[i : i + 1])
            await trio.sleep(0.02)

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watchdog.run)
        nursery.start_soon(trickle)
        with pytest.raises(FrameError, match=r"not complete 0\.3s after it began"):
            with trio.fail_after(5):
                async for _ in conn.read_messages():
                    pass
        nursery.cancel_scope.cancel()
    assert 0.3 <= trio.current_time() - started < 1.0


async def test_a_silent_peer_is_closed_as_idle_and_one_that_keeps_talking_is_not():
    watchdog = Watchdog()
    quiet, quiet_peer = _pair(watchdog, idle_deadline=0.3)
    chatty, chatty_peer = _pair(watchdog, idle_deadline=0.3)
    heard = 0

    async def talk() -> None:
        for _ in range(20):  # 1 s of keepalives, one per 50 ms
            await chatty_peer.send_all(encode(m.Heartbeat()))
            await trio.sleep(0.05)

    async def listen() -> None:
        nonlocal heard
        async for batch in chatty.read_messages():
            heard += len(batch)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watchdog.run)
        nursery.start_soon(listen)
        nursery.start_soon(talk)
        started = trio.current_time()
        with trio.fail_after(5):
            async for _ in quiet.read_messages():
                pass
        idle_for = trio.current_time() - started
        await trio.sleep(1.0 - idle_for)
        nursery.cancel_scope.cancel()
    assert quiet.close_reason == "idle: nothing received for 0.3s"
    assert 0.3 <= idle_for < 1.0
    assert chatty.close_reason is None and heard >= 15


async def test_time_spent_not_reading_is_not_the_peers_silence():
    watchdog = Watchdog()
    conn, peer = _pair(watchdog, idle_deadline=0.2)
    got = 0
    back = trio.Event()  # the reader is done with a batch and reads again

    async def read() -> None:
        nonlocal got, back
        async for batch in conn.read_messages():
            got += len(batch)
            if got >= 3:
                return
            await trio.sleep(0.6)  # busy with it for three idle deadlines
            back.set()

    async def talk() -> None:
        nonlocal back
        for _ in range(3):
            await peer.send_all(encode(m.Heartbeat()))
            await back.wait()
            back = trio.Event()
            await trio.sleep(0.1)  # half a deadline after the reader came back

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watchdog.run)
        nursery.start_soon(talk)
        with trio.fail_after(5):
            await read()
        nursery.cancel_scope.cancel()
    assert got == 3 and conn.close_reason is None


async def test_the_peer_closing_ends_the_read_and_a_closed_connection_is_not_read_again():
    watchdog = Watchdog()
    conn, peer = _pair(watchdog)
    await peer.send_all(_frames(2))
    await peer.aclose()
    batches = [batch async for batch in conn.read_messages()]
    assert sum(map(len, batches)) == 2 and conn.close_reason == "closed by peer"

    conn, peer = _pair(watchdog)
    await conn.stream.aclose()  # closed under it: its descriptor number may be reused
    assert [batch async for batch in conn.read_messages()] == []
    assert conn.close_reason == "read failed: closed"
