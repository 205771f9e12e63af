"""One framed TCP connection: a bounded outbound queue drained by a batching writer task.

Writes are batched: the writer takes every frame already queued (up to ``WRITE_BATCH_BYTES``)
and hands them to the kernel in one ``send_all``. The queue is bounded in frames; a broker link
that fills it makes the sender wait (backpressure reaches the publisher through TCP), a client
that fills it is a slow consumer and is disconnected, as NATS does, so one stuck subscriber
cannot stall a broker.
"""

from __future__ import annotations

import logging

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
        self.frames_in = 0
        self.frames_out = 0
        # frames read along with the handshake, handed out first by read_messages()
        self._early: list = []

    # -- sending -----------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Queue one encoded frame, waiting while the queue is full (backpressure)."""
        try:
            await self._send.send(data)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionClosed(self.label) from None

    def send_nowait(self, data: bytes) -> bool:
        """Queue one frame if there is room; False if the queue is full."""
        try:
            self._send.send_nowait(data)
        except trio.WouldBlock:
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
                self.frames_out += len(chunks)
                await stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
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
                self.frames_in += len(bodies)
                yield [decode(body) for body in bodies]

    async def receive_one(self, *, timeout: float = HANDSHAKE_TIMEOUT):
        """The next single message (used during the handshake); raises on close or timeout."""
        with trio.move_on_after(timeout):
            while True:
                self._early += self.decoder.frames()
                if self._early:
                    self.frames_in += 1
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
