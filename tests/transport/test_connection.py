"""One connection's send queue, in virtual time: bounded in bytes, first come first served
among the senders that wait for room, and a write deadline that measures progress."""

from __future__ import annotations

import select
import socket

import pytest
import trio
import trio.testing

from ges.transport.connection import (
    HOLD_BYTES,
    LAST_READ_SECONDS,
    Budget,
    Connection,
    ConnectionClosed,
    Watchdog,
)
from ges.wire import FrameDecoder, FrameError, decode, encode
from ges.wire import messages as m


async def test_a_sender_waiting_for_room_is_not_overtaken_by_a_later_smaller_frame():
    a, b = trio.testing.memory_stream_pair()
    conn = Connection(a, label="link", max_queued=1000)
    first = encode(m.Bye("FIRST " + "y" * 300))
    second = encode(m.Bye("SECOND"))
    async with trio.open_nursery() as nursery:
        await conn.send(encode(m.Bye("x" * 880)))  # queued: the writer is not running yet
        nursery.start_soon(conn.send, first)  # over the bound: waits for room
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(conn.send, second)  # it would fit, but one waits before it
        await trio.testing.wait_all_tasks_blocked()
        assert conn.queued < 1000  # the second has not gone in ahead of the first
        nursery.start_soon(conn.writer)
        dec, got = FrameDecoder(), []
        with trio.fail_after(2):
            while len(got) < 3:
                dec.feed(await b.receive_some(1 << 16))
                got += [decode(f).reason[:6] for f in dec.frames()]
        assert got == ["xxxxxx", "FIRST ", "SECOND"]
        nursery.cancel_scope.cancel()


async def test_a_sender_over_the_byte_bound_waits_and_a_client_is_refused():
    a, _ = trio.testing.memory_stream_pair()
    conn = Connection(a, label="client", max_queued=100)
    assert conn.send_nowait(b"x" * 80)
    assert not conn.send_nowait(b"y" * 30)  # 110 bytes: over the bound
    assert conn.send_nowait(b"z" * 20)
    with trio.move_on_after(0.1) as waited:
        await conn.send(b"w" * 10)  # nothing drains the queue: the sender waits
    assert waited.cancelled_caught and conn.queued == 100


async def test_a_client_reading_slowly_but_steadily_is_not_cut_and_a_stalled_one_is(
    autojump_clock,
):
    for steady in (True, False):
        a, b = trio.testing.lockstep_stream_pair()
        conn = Connection(a, label="client", write_deadline=2.0)
        got = 0

        async def reader(b=b, steady=steady):
            nonlocal got
            while steady:
                data = await b.receive_some(64 * 1024)
                got += len(data)
                await trio.sleep(0.5)  # 128 KB/s
            await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            nursery.start_soon(conn.writer)
            await conn.send(b"z" * (1 << 20))
            await trio.sleep(6)
            if steady:
                assert conn.close_reason is None and got > 600_000
            else:
                assert conn.close_reason == "slow consumer: nothing written for 2s"
            nursery.cancel_scope.cancel()


async def test_on_a_stream_that_is_not_a_socket_the_frame_deadline_restarts_with_each_frame(
    autojump_clock,
):
    """A TLS stream's reads keep their own deadline: a peer whose every read ends inside a
    frame, but which completes one frame after another, is not cut; one frame that does not
    complete within the deadline is."""
    a, b = trio.testing.memory_stream_pair()
    conn = Connection(a, label="tls", frame_deadline=1.0)
    assert conn.watchdog is None
    frame = encode(m.Publish(1, [m.Event({"n": 1}, b"x" * 100, 0)]))
    half = len(frame) // 2
    got = []

    async def steady() -> None:
        await b.send_all(frame[:half])
        for _ in range(10):  # 6 s in all: the rest of one frame and half of the next, each time
            await trio.sleep(0.6)
            await b.send_all(frame[half:] + frame[:half])
        await trio.sleep(5)  # and then the half frame stays half

    async with trio.open_nursery() as nursery:
        nursery.start_soon(steady)
        with pytest.raises(FrameError, match=r"not complete 1s after it began"):
            async for batch in conn.read_messages():
                got += batch
        nursery.cancel_scope.cancel()
    assert len(got) == 10


async def test_frames_held_go_in_one_write_in_order_and_count_as_queued():
    """What slices of a fan-out send a client is held and goes in one write (one system call
    for many small frames), counted as queued meanwhile; over HOLD_BYTES held, what is held
    goes first; a frame not held, a send that waits for room or a last frame goes after what
    was held; closing after a last frame writes what was held, and keeps the rest of a frame
    partly written (else the peer reads the last frame as the end of that one)."""

    def readable(sock) -> bytes:
        try:
            return sock.recv(1 << 20)
        except BlockingIOError:
            return b""

    a, b = socket.socketpair()
    b.setblocking(False)
    budget = Budget()
    conn = Connection(trio.SocketStream(trio.socket.from_stdlib_socket(a)), label="c",
                      max_queued=HOLD_BYTES * 4, budget=budget)  # fmt: skip
    frames = [encode(m.Bye(f"frame {i}")) for i in range(50)]
    for frame in frames:
        assert conn.send_nowait(frame, hold=True)
    held = sum(map(len, frames))
    assert conn.holding and readable(b) == b""
    assert conn.queued == held and budget.used == held
    conn.flush_held()
    assert readable(b) == b"".join(frames) and conn.queued == 0 and budget.used == 0
    assert not conn.holding
    conn.flush_held()  # (nothing held: nothing)

    assert conn.send_nowait(b"x" * 100, hold=True)
    assert conn.send_nowait(b"y" * (HOLD_BYTES - 50), hold=True)  # over HOLD_BYTES: x goes
    assert readable(b) == b"x" * 100
    assert not conn.send_nowait(b"w" * HOLD_BYTES * 4, hold=True)  # the bound counts y
    assert conn.send_nowait(b"now")  # not held: what was held goes first
    assert readable(b) == b"y" * (HOLD_BYTES - 50) + b"now" and conn.queued == 0
    assert conn.send_nowait(b"z", hold=True)
    await conn.send(b"after")  # likewise
    assert readable(b) == b"zafter" and conn.queued == 0

    assert conn.send_nowait(b"held", hold=True)
    conn.close_after(b"last", "closing", 1.0)
    assert readable(b) == b"held"  # written, not dropped
    assert conn.queued == budget.used == len(b"last")  # (the writer would write it)
    a.close()
    b.close()


async def test_closing_after_a_last_frame_keeps_the_rest_of_a_frame_partly_written():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    conn = Connection(trio.SocketStream(trio.socket.from_stdlib_socket(a)), label="c")
    big = encode(m.Bye("x" * 1_000_000))  # the kernel takes part of it
    assert conn.send_nowait(big)
    assert 0 < conn.queued < len(big)
    conn.send_nowait(encode(m.Bye("dropped")))
    conn.close_after(encode(m.Bye("the end")), "closing", 5.0)
    decoder, got = FrameDecoder(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.writer)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(b))
        with trio.fail_after(5):
            while len(got) < 2:
                data = await stream.receive_some(1 << 16)
                assert data, "closed before the last frame"
                decoder.feed(data)
                got += [decode(f).reason[:7] for f in decoder.frames()]
        nursery.cancel_scope.cancel()
    assert got == ["x" * 7, "the end"]
    a.close()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a real TCP connection on the loopback (a reset is TCP's)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        theirs = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    return ours, theirs


def _reset_after(theirs: socket.socket, last: bytes, ours: socket.socket) -> None:
    """The peer sends its last frame and closes with what it was sent unread: a reset, which
    has reached ``ours`` when this returns."""
    theirs.sendall(last)
    theirs.close()
    poller = select.poll()
    poller.register(ours, select.POLLERR)
    assert poller.poll(2000), "no reset within 2 s"


@pytest.mark.parametrize("writer", [False, True], ids=["direct-write", "writer-task"])
async def test_what_a_peer_sent_before_it_reset_is_read_though_a_write_failed_first(writer):
    """A subscriber acknowledges what it has had and exits with deliveries unread (its kernel
    resets the connection): the broker's next write fails before its reader has run, and the
    acknowledgement is still read — a write failure used to cancel the reader, and the
    subscriber's next resume repeated what it had printed. Nothing is sent after the failure,
    and the reader ends at the reset."""
    ours, theirs = _tcp_pair()
    watchdog = Watchdog()
    conn = Connection(
        trio.SocketStream(trio.socket.from_stdlib_socket(ours)), label="c", watchdog=watchdog
    )
    assert conn.send_nowait(encode(m.Bye("a delivery the peer never reads")))
    _reset_after(theirs, encode(m.SessionAck("alice", 41)), ours)
    got = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watchdog.run)
        with conn.cancel_scope:
            if writer:  # a frame queued behind a write that the kernel has not finished
                conn._enqueue(encode(m.Bye("queued")))
                await conn.writer()
            else:
                with pytest.raises(ConnectionClosed):
                    conn.send_nowait(encode(m.Bye("another delivery")))
            assert conn.close_reason.startswith("write failed")
            with pytest.raises(ConnectionClosed):
                conn.send_nowait(encode(m.Bye("after the failure")))
            with trio.fail_after(2):
                async for batch in conn.read_messages():
                    got += batch
        nursery.cancel_scope.cancel()
    assert got == [m.SessionAck("alice", 41)]
    assert conn.close_reason.startswith("write failed")
    ours.close()


async def test_after_a_write_failed_a_reader_that_does_not_end_is_cancelled_within_a_second(
    autojump_clock,
):
    """Past LAST_READ_SECONDS after a write failed, the connection's tasks are cancelled, as a
    close cancels them at once: a peer cannot keep a dead connection's reader going."""
    a, _ = trio.testing.memory_stream_pair()
    conn = Connection(a, label="c")
    with conn.cancel_scope:
        conn._write_failed("write failed: reset")
        await trio.sleep_forever()
    assert conn.cancel_scope.cancelled_caught
    assert trio.current_time() == pytest.approx(LAST_READ_SECONDS)
