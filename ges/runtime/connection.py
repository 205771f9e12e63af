"""One framed TCP connection: a bounded outbound queue drained by a batching writer task.

Writes are batched: the writer takes every frame already queued (up to ``WRITE_BATCH_BYTES``)
and hands them to the kernel in one ``send_all``. When nothing is queued or being written, a
frame goes straight to the kernel from the task that produced it (one non-blocking write), which
saves a task hand-off per frame on a lightly loaded connection; whatever the kernel does not take
at once is queued for the writer, so frame order never changes. The queue is bounded in frames; a broker link
that fills it makes the sender wait (backpressure reaches the publisher through TCP), a client
that fills it is a slow consumer and is disconnected, as NATS does, so one stuck subscriber
cannot stall a broker.
"""

from __future__ import annotations

import logging
import os

import trio

from ges.wire import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, decode, encode

#: Frames queued towards one peer before the sender waits / a client counts as slow. 4,096
#: frames of batched events is tens of MB at most; enough to ride out a scheduling hiccup.
MAX_QUEUED_FRAMES = 4_096
#: Bytes handed to the kernel per write.
WRITE_BATCH_BYTES = 1 << 20
#: Bytes asked of the kernel per read.
READ_SIZE = 1 << 18
#: Seconds a new connection has to complete its handshake.
HANDSHAKE_TIMEOUT = 5.0

log = logging.getLogger("ges.runtime")


class ConnectionClosed(Exception):
    """The connection is gone (peer closed, reset, or we closed it)."""


class Connection:
    """A framed stream with a bounded send queue. Run ``writer()`` in a task while it is open."""

    def __init__(self, stream: trio.abc.Stream, *, label: str, max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.label = label
        self.decoder = FrameDecoder(max_frame=max_frame)
        self._send, self._queue = trio.open_memory_channel[bytes](MAX_QUEUED_FRAMES)
        self.cancel_scope = trio.CancelScope()
        self.close_reason: str | None = None
        # frames read along with the handshake, handed out first by read_messages()
        self._early: list = []
        # the raw descriptor for direct writes; None for streams that are not sockets
        sock = getattr(stream, "socket", None)
        self._fd = sock.fileno() if sock is not None else None
        # frames handed to the queue and not yet written: a queued frame may already sit with the
        # writer task (trio hands items straight to a waiting receiver), so the queue's own
        # length cannot tell whether a direct write would overtake it
        self._unwritten = 0

    def _write_now(self, data: bytes) -> bytes | None:
        """Write ``data`` directly if nothing is queued or in flight.

        Returns None if a direct write was not possible (queue it all), else what the kernel did
        not take (b"" when it took everything).
        """
        if self._fd is None or self._unwritten:
            return None
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            return data
        except OSError as exc:
            self.close(f"write failed: {exc.strerror or exc}")
            raise ConnectionClosed(self.label) from None
        return data[written:]

    # -- sending -----------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Send one encoded frame, waiting while the queue is full (backpressure)."""
        rest = self._write_now(data)
        if rest == b"":
            return
        self._unwritten += 1
        try:
            await self._send.send(data if rest is None else rest)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._unwritten -= 1
            raise ConnectionClosed(self.label) from None
        except BaseException:  # cancelled while waiting for room: the frame never went
            self._unwritten -= 1
            if rest is not None and rest is not data:
                self.close("cancelled mid-frame")
            raise

    def send_nowait(self, data: bytes) -> bool:
        """Send one frame if there is room; False if the queue is full."""
        rest = self._write_now(data)
        if rest == b"":
            return True
        try:
            self._send.send_nowait(data if rest is None else rest)
            self._unwritten += 1
        except trio.WouldBlock:
            if rest is not None and rest is not data:
                # part of this frame is on the wire already: the rest must follow it
                self.close("slow consumer: send queue full mid-frame")
            return False
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionClosed(self.label) from None
        return True

    async def send_message(self, message) -> None:
        await self.send(encode(message))

    async def writer(self) -> None:
        queue = self._queue
        stream = self.stream
        try:
            async for first in queue:
                chunks = [first]
                size = len(first)
                while size < WRITE_BATCH_BYTES:
                    try:
                        data = queue.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    chunks.append(data)
                    size += len(data)
                await stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                self._unwritten -= len(chunks)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.close(f"write failed: {exc or type(exc).__name__}")

    # -- receiving ---------------------------------------------------------------------------

    async def read_messages(self):
        """Yield lists of decoded messages, one list per read; ends when the peer closes.

        A bad frame (too large, wrong version, undecodable) raises :class:`FrameError`.
        """
        stream = self.stream
        decoder = self.decoder
        if self._early:
            early, self._early = self._early, []
            yield [decode(body) for body in early]
        while True:
            try:
                data = await stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.close(f"read failed: {exc or type(exc).__name__}")
                return
            if not data:
                self.close("closed by peer")
                return
            decoder.feed(data)
            bodies = decoder.frames()
            if bodies:
                yield [decode(body) for body in bodies]

    async def receive_one(self, *, timeout: float = HANDSHAKE_TIMEOUT):
        """The next single message (used during the handshake); raises on close or timeout."""
        with trio.move_on_after(timeout):
            while True:
                self._early += self.decoder.frames()
                if self._early:
                    return decode(self._early.pop(0))
                data = await self.stream.receive_some(READ_SIZE)
                if not data:
                    raise ConnectionClosed(f"{self.label}: closed during handshake")
                self.decoder.feed(data)
        raise ConnectionClosed(f"{self.label}: no handshake within {timeout:.0f}s")

    # -- closing -----------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """Ask the task running this connection to stop; idempotent, the first reason wins."""
        if self.close_reason is None:
            self.close_reason = reason
        self._send.close()
        self.cancel_scope.cancel()

    async def aclose(self) -> None:
        self._send.close()
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self.stream.aclose()


def frame_error_reason(exc: FrameError) -> str:
    return f"protocol error: {exc}"
