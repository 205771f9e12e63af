"""One framed TCP connection: a send queue bounded in bytes, drained by a batching writer task.

Writes are batched: the writer takes every frame already queued (up to ``WRITE_BATCH_BYTES``)
and hands them to the kernel in one ``send_all``. When nothing is queued or being written, a
frame goes straight to the kernel from the task that produced it (one non-blocking write), which
saves a task hand-off per frame on a lightly loaded connection; whatever the kernel does not take
at once is queued for the writer, so frame order never changes.

Every bound is in bytes and time, never in frames (a peer chooses their size):

* the send queue holds at most ``max_queued`` bytes. A broker link that fills it makes the
  sender wait (backpressure reaches the publisher through TCP); a client that fills it is a
  slow consumer and is disconnected, as NATS does, so one stuck subscriber cannot hold a
  broker's memory;
* with ``write_deadline`` set (clients), a connection whose writer has frames to send and has
  got none of them into the kernel for that long is a slow consumer too, however little it has
  queued;
* a frame being received must arrive whole within ``frame_deadline`` of its first bytes, and
  (``idle_deadline``) a connection that sends nothing at all for that long is closed — clients
  send keepalives when they have nothing else to say.

Reads on a plain socket with a :class:`Watchdog` wait for the socket to be readable and read it
directly, the two deadlines checked by the watchdog's one task for every connection rather
than by a cancel scope around each read: on a connection woken once per event that saves about
a fifth of a wake-up's latency and half its CPU (``bench/wakeup.py``: ``trio.SocketStream`` with
a deadline 105 µs round trip p50 and 162 µs CPU, the direct read 81 µs and 78 µs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections import deque

import trio

from ges.wire import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, decode, encode

#: Bytes queued towards one peer before the sender waits (broker links) or the peer counts as a
#: slow consumer (clients): NATS's default max_pending. A recovery burst fits in it.
MAX_QUEUED_BYTES = 64 * 1024 * 1024
#: Bytes handed to the kernel per write.
WRITE_BATCH_BYTES = 1 << 20
#: With a write deadline, bytes written under one deadline: a peer reading slowly but steadily
#: makes progress within it, one that reads nothing does not.
PROGRESS_PIECE = 64 * 1024
#: Bytes a connection holds at most to write together (:meth:`Connection.send_nowait`).
HOLD_BYTES = 64 * 1024
#: Bytes asked of the kernel per read.
READ_SIZE = 1 << 18
#: Seconds a new connection has to complete its handshake.
HANDSHAKE_TIMEOUT = 5.0
#: Seconds a frame may take to arrive whole once its first bytes have (a slow sender of one
#: large frame would otherwise hold its buffer forever).
FRAME_DEADLINE = 30.0
#: Seconds the reader has, once a write failed, to read what the peer sent before it went
#: (:meth:`Connection._write_failed`) before the connection's tasks are cancelled.
LAST_READ_SECONDS = 1.0
#: Once a connection's last frame saying why it closes is written (:meth:`Connection.
#: close_after`), what the peer still sends is read and dropped for this long, at most
#: ``LINGER_BYTES``, before the socket closes (:func:`linger`).
LINGER_SECONDS = 0.5
LINGER_BYTES = 1 << 20

#: TCP keepalive on accepted connections (:func:`probe_when_silent`): after this many seconds
#: of silence the kernel probes the peer, every interval seconds, and fails the connection
#: after count probes unanswered — about two minutes for a peer whose host vanished (powered
#: off, or behind a NAT that forgot it), even one whose protocol asks for no keepalive (MQTT's
#: 0), whose slot would otherwise be held until a write to it failed.
TCP_KEEPALIVE = (60, 10, 6)

log = logging.getLogger("ges.runtime")


def probe_when_silent(sock, keepalive: tuple[int, int, int] = TCP_KEEPALIVE) -> None:
    """Have the kernel probe ``sock``'s peer when it is silent (:data:`TCP_KEEPALIVE`); where
    the platform lacks the per-socket settings, its defaults apply."""
    idle, interval, count = keepalive
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


class Budget:
    """Bytes queued by several connections together (a broker's clients): each adds what it
    queues and gives back what it writes or drops; the owner looks at ``used`` against its
    limit, and may wait (:meth:`below`) until the queues have drained to ``resume_at``."""

    __slots__ = ("used", "resume_at", "_drained")

    def __init__(self, resume_at: int = 0) -> None:
        self.used = 0
        self.resume_at = resume_at
        self._drained: trio.Event | None = None

    def give_back(self, size: int) -> None:
        self.used -= size
        if self._drained is not None and self.used <= self.resume_at:
            self._drained.set()
            self._drained = None

    async def below(self, resume_at: int) -> None:
        """Wait until at most ``resume_at`` bytes are queued (at once if that is so now)."""
        self.resume_at = resume_at
        while self.used > resume_at:
            if self._drained is None:
                self._drained = trio.Event()
            await self._drained.wait()


class Watchdog:
    """The read deadlines of many connections (``frame_deadline``, ``idle_deadline``), checked
    by one task, :meth:`run`, a few times per the shortest of them (at most every second), so
    a read needs no cancel scope of its own. A deadline is noticed up to a check late, and a
    check costs a few attribute reads per connection."""

    #: The most seconds between two checks.
    MAX_PERIOD = 1.0

    def __init__(self) -> None:
        #: conn -> [the frame or read count seen, whether a frame was in progress, since when]
        self._watched: dict[Connection, list] = {}

    def watch(self, conn: Connection) -> None:
        self._watched[conn] = [-1, -1, 0.0]

    def unwatch(self, conn: Connection) -> None:
        self._watched.pop(conn, None)

    def period(self) -> float:
        shortest = self.MAX_PERIOD * 4
        for conn in self._watched:
            shortest = min(shortest, conn.frame_deadline, conn.idle_deadline or shortest)
        return max(0.005, shortest / 4)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.period())
            self.check(trio.current_time())

    def check(self, now: float) -> None:
        """Expire each watched connection over one of its deadlines (see
        :meth:`Connection._expire`): its read ends with its ``_late()`` error, or it closes as
        idle."""
        for conn, seen in list(self._watched.items()):
            if not conn._reading:  # busy with what it read, or held back: not the peer's delay
                seen[0] = -1
                continue
            buffered = conn.decoder.buffered
            # the frame in progress, else the reads: a change since the last check restarts
            # the count (the bytes of one frame trickling in do not)
            key = conn.decoder.taken if buffered else conn._reads
            if seen[0] != key or seen[1] != bool(buffered):
                seen[0], seen[1], seen[2] = key, bool(buffered), now
                continue
            waited = now - seen[2]
            if buffered:  # the same frame still incomplete: since when it was first seen
                if waited > conn.frame_deadline:
                    conn._expire(conn._late())
            elif conn.idle_deadline is not None and waited > conn.idle_deadline:
                conn._expire(conn._idle())


#: What :meth:`Connection._write_now` returns when a TLS stream took a frame but the kernel
#: did not take all of its ciphertext: an empty frame for the writer, whose send flushes it.
_FLUSH = bytearray()  # compared by identity


class ConnectionClosed(Exception):
    """The connection is gone (peer closed, reset, or we closed it)."""


class Connection:
    """A framed stream with a send queue bounded in bytes. Run ``writer()`` in a task while it is
    open."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        label: str,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_queued: int = MAX_QUEUED_BYTES,
        write_deadline: float | None = None,
        frame_deadline: float = FRAME_DEADLINE,
        idle_deadline: float | None = None,
        budget: Budget | None = None,
        watchdog: Watchdog | None = None,
    ):
        self.stream = stream
        self.label = label
        self.decoder = FrameDecoder(max_frame=max_frame)
        self.max_queued = max_queued
        self.write_deadline = write_deadline
        self.frame_deadline = frame_deadline
        self.idle_deadline = idle_deadline
        self.budget = budget
        self._queue: deque[bytes] = deque()
        #: bytes handed to the queue and not yet written (including those with the writer)
        self.queued = 0
        #: frames handed to the queue and not yet written: a direct write must not overtake them
        self._unwritten = 0
        self._ready = trio.Event()  # the writer has something to do
        self._room = trio.Event()  # a waiting sender may try again
        self._senders = trio.Lock()  # held by the sender waiting for room (FIFO)
        self._closed = False
        #: closing after a last frame (:meth:`close_after`): nothing more is sent
        self._closing = False
        self.said_why = False  # that last frame is written: the peer reads it (``aclose``)
        self._last_words = False  # (that close_after had a last frame)
        self.cancel_scope = trio.CancelScope()
        self.close_reason: str | None = None
        # frames read along with the handshake, handed out first by read_messages()
        self._early: list = []
        # the raw descriptor for direct writes; None for streams that are not sockets
        sock = getattr(stream, "socket", None)
        self._fd = sock.fileno() if sock is not None else None
        # a TLS stream writes directly itself (ges.transport.tls)
        self._tls = stream if hasattr(stream, "write_nowait") else None
        #: the deadlines of direct reads (a plain socket) are checked by this watchdog
        self.watchdog = watchdog if self._fd is not None else None
        #: frames held to be written together (:meth:`send_nowait`'s ``hold``)
        self._held: bytearray | None = None
        #: the first frame queued is the rest of one partly written
        self._head_partial = False
        self._reading = False  # waiting for the peer (the watchdog's deadlines run)
        self._reads = 0  # reads that brought bytes
        self._expired: Exception | str | None = None

    def _write_now(self, data: bytes) -> bytes | None:
        """Write ``data`` directly if nothing is queued or in flight.

        Returns None if a direct write was not possible (queue it all), else what the kernel did
        not take (b"" when it took everything).
        """
        if self._unwritten:
            return None
        if self._tls is not None:
            done = self._tls.write_nowait(data)
            # encrypted and partly written: the writer sends the rest (an empty frame flushes)
            return None if done is None else b"" if done else _FLUSH
        if self._fd is None:
            return None
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            return data
        except OSError as exc:
            self._write_failed(f"write failed: {exc.strerror or exc}")
            raise ConnectionClosed(self.label) from None
        return data[written:]

    def _enqueue(self, data: bytes) -> None:
        self._queue.append(data)
        self.queued += len(data)
        if self.budget is not None:
            self.budget.used += len(data)
        self._unwritten += 1
        self._ready.set()

    # -- sending -----------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Send one encoded frame, waiting while the queue is over its bound (backpressure).
        Senders that wait go in the order they came: a later, smaller frame that would fit
        does not overtake a waiting one."""
        if self._closed or self._closing:
            raise ConnectionClosed(self.label)
        if self._held is not None:  # what was held goes first
            self.flush_held()
        if not self._senders.locked():  # nobody waits: nothing to overtake
            rest = self._write_now(data)
            if rest is _FLUSH:
                self._enqueue(b"")
                return
            if rest == b"":
                return
            if rest is not None and rest is not data:
                self._enqueue(rest)  # part of it is on the wire: the rest must follow at once
                self._head_partial = True
                return
            if not (self.queued and self.queued + len(data) > self.max_queued):
                self._enqueue(data)
                return
        async with self._senders:  # fair: first come, first served
            while self.queued and self.queued + len(data) > self.max_queued:
                if self._room.is_set():
                    self._room = trio.Event()
                await self._room.wait()
                if self._closed:
                    raise ConnectionClosed(self.label)
            self._enqueue(data)

    def would_wait(self, size: int) -> bool:
        """:meth:`send` of ``size`` bytes would wait for room now."""
        return self._senders.locked() or bool(self.queued and self.queued + size > self.max_queued)

    def send_nowait(self, data: bytes, *, hold: bool = False) -> bool:
        """Send one frame if the queue has room for it; False if it would go over its bound.

        ``hold``: the frame is held with those held before it, to go in one write (one system
        call, one TLS record) at :meth:`flush_held` — or at once when HOLD_BYTES would be
        held: a burst of small frames (a fan-out's slices) where each would take a write.
        Without it, what is held goes first. Held bytes count as queued (the bound, the
        budget)."""
        if self._closed or self._closing:
            raise ConnectionClosed(self.label)
        if self.queued and self.queued + len(data) > self.max_queued:
            return False
        held = self._held
        if hold:
            if held and len(held) + len(data) > HOLD_BYTES:
                self.flush_held()
                held = None
            if len(data) < HOLD_BYTES:
                if held is None:
                    held = self._held = bytearray()
                held += data
                self.queued += len(data)
                if self.budget is not None:
                    self.budget.used += len(data)
                return True
        elif held:
            self.flush_held()
        self._put(data)
        return True

    def _put(self, data: bytes) -> None:
        rest = self._write_now(data)
        if rest is _FLUSH:
            self._enqueue(b"")
        elif rest is None:
            self._enqueue(data)
        elif rest:
            self._enqueue(rest)
            if rest is not data:  # the rest of a frame partly written: it goes whatever is
                self._head_partial = True  # dropped (close_after), the first queued

    @property
    def holding(self) -> bool:
        """Frames are held (:meth:`send_nowait`'s ``hold``), to go at :meth:`flush_held`."""
        return self._held is not None

    def flush_held(self) -> None:
        """Write what is held (:meth:`send_nowait`'s ``hold``), and hold no more."""
        held, self._held = self._held, None
        if not held or self._closed or self._closing:
            return
        self.queued -= len(held)  # counted again as it is written or queued
        if self.budget is not None:
            self.budget.give_back(len(held))
        with contextlib.suppress(ConnectionClosed):  # (closed with the reason the write gave)
            self._put(bytes(held))

    def write_last(self, data: bytes) -> None:
        """A last frame, written now if the kernel takes it whole and nothing is queued before
        it (a connection about to close; the writer task may be gone already)."""
        self.flush_held()
        if self._unwritten or self._closed:
            return
        rest = self._write_now(data)
        if rest or rest is _FLUSH:  # part of it went: the peer will see it cut
            self.close("closed mid-frame")

    async def send_message(self, message) -> None:
        await self.send(encode(message))

    def close_after(self, data: bytes, reason: str, within: float) -> None:
        """Close, telling the peer why first: the frames queued and not yet with the writer are
        dropped, ``data`` (a last frame) goes after what the writer is writing now, and the
        connection closes once it is written — or once ``within`` seconds pass with nothing
        written. Nothing more can be sent meanwhile."""
        if self._closed or self._closing:
            return
        if self.close_reason is None:
            self.close_reason = reason
        self.flush_held()  # (what was held is as good as written)
        self._closing = True
        queue = self._queue
        # the rest of a frame partly written goes, or the peer would read the last frame as
        # the end of that one
        head = queue.popleft() if queue and self._head_partial else None
        dropped = sum(map(len, queue))
        self._unwritten -= len(queue)
        queue.clear()
        if head is not None:
            queue.append(head)
        self.queued -= dropped
        if self.budget is not None:
            self.budget.give_back(dropped)
        if self.write_deadline is None or self.write_deadline > within:
            self.write_deadline = within
        self._last_words = bool(data)
        self._enqueue(data)

    @property
    def closing(self) -> bool:
        """Closed, or closing after a last frame: what it sends is not read any more."""
        return self._closed or self._closing

    async def writer(self) -> None:
        queue = self._queue
        stream = self.stream
        try:
            while True:
                while not queue:
                    if self._closed:
                        return
                    ready = self._ready = trio.Event()
                    await ready.wait()
                chunks = []
                size = 0
                while queue and size < WRITE_BATCH_BYTES:
                    data = queue.popleft()
                    chunks.append(data)
                    size += len(data)
                self._head_partial = False  # (with the writer now)
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                deadline = self.write_deadline
                if deadline is None:
                    await stream.send_all(data)
                else:  # the deadline is for progress: each piece gets it anew
                    view = memoryview(data)
                    for at in range(0, max(1, len(view)), PROGRESS_PIECE):  # b"": a flush
                        with trio.move_on_after(deadline) as late:
                            await stream.send_all(view[at : at + PROGRESS_PIECE])
                        if late.cancelled_caught:
                            self.close(f"slow consumer: nothing written for {deadline:g}s")
                            return
                self.queued -= size
                if self.budget is not None:
                    self.budget.give_back(size)
                self._unwritten -= len(chunks)
                self._room.set()
                if self._closing and not queue:  # the last frame is out
                    self.said_why = self._last_words
                    self.close(self.close_reason or "closed")
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._write_failed(f"write failed: {exc or type(exc).__name__}")

    # -- receiving ---------------------------------------------------------------------------

    async def read_messages(self):
        """Yield lists of decoded messages, one list per read; ends when the peer closes.

        A bad frame (too large, wrong version, undecodable) raises :class:`FrameError`; so does
        a frame that does not arrive whole within ``frame_deadline``, and silence longer than
        ``idle_deadline`` closes the connection.
        """
        if self._early:
            early, self._early = self._early, []
            yield [decode(body) for body in early]
        decoder = self.decoder
        async with contextlib.aclosing(self.read_chunks()) as chunks:
            async for data in chunks:
                decoder.feed(data)
                bodies = decoder.frames()
                if bodies:
                    yield [decode(body) for body in bodies]

    async def read_chunks(self):
        """The bytes the peer sends, one chunk per read, until it closes; a frame not whole
        ``frame_deadline`` after it began (in ``self.decoder``) raises :meth:`_late`, and
        silence longer than ``idle_deadline`` closes the connection (:meth:`_idle`).

        On a plain socket: wait until it is readable, then read it, the deadlines left to the
        watchdog (a read needs no cancel scope of its own); after a read that filled the
        buffer, more is likely waiting, so the next read is tried first (after a checkpoint).
        Other streams: :meth:`_read_stream`."""
        if self.watchdog is None:
            async for data in self._read_stream():
                yield data
            return
        fd = self._fd
        sock = self.stream.socket
        wait_readable = trio.lowlevel.wait_readable
        full = False
        self.watchdog.watch(self)
        try:
            while True:
                try:
                    if sock.fileno() != fd:  # closed (its number may be another file's by now)
                        raise trio.ClosedResourceError
                    if full:
                        await trio.lowlevel.checkpoint()
                        data = os.read(fd, READ_SIZE)
                    else:
                        self._reading = True
                        try:
                            await wait_readable(fd)
                        finally:
                            self._reading = False
                        self._expired = None  # readable first: an expiry then is moot
                        data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    full = False
                    continue
                except trio.ClosedResourceError:
                    expired, self._expired = self._expired, None
                    if isinstance(expired, Exception):
                        raise expired from None
                    self.close(expired or "read failed: closed")
                    return
                except OSError as exc:
                    self.close(f"read failed: {exc.strerror or exc}")
                    return
                if not data:
                    self.close("closed by peer")
                    return
                self._reads += 1
                full = len(data) == READ_SIZE
                yield data
        finally:
            self.watchdog.unwatch(self)

    async def _read_stream(self):
        """:meth:`read_chunks` on a stream that is not a plain socket (TLS): each read has a
        cancel scope for the deadline that applies."""
        stream = self.stream
        decoder = self.decoder
        started = None  # when the partial frame in the decoder began to arrive
        whole = -1  # the frames taken whole then (those the reader took since: a new one)
        while True:
            wait = self.idle_deadline if not decoder.buffered else None
            if decoder.buffered:
                now = trio.current_time()
                if started is None or whole != decoder.taken:
                    started, whole = now, decoder.taken
                wait = max(0.0, started + self.frame_deadline - now)
            else:
                started = None
            with trio.move_on_after(wait if wait is not None else float("inf")) as late:
                try:
                    data = await stream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self.close(f"read failed: {exc or type(exc).__name__}")
                    return
            if late.cancelled_caught:
                if decoder.buffered:
                    raise self._late()
                self.close(self._idle())
                return
            if not data:
                self.close("closed by peer")
                return
            self._reads += 1
            yield data

    def _late(self) -> Exception:
        """What a frame not whole ``frame_deadline`` after it began raises."""
        decoder = self.decoder
        return FrameError(
            f"a frame of {decoder.pending_length} bytes not complete "
            f"{self.frame_deadline:g}s after it began ({decoder.buffered} received)"
        )

    def _idle(self) -> str:
        """Why silence longer than ``idle_deadline`` closed the connection."""
        return f"idle: nothing received for {self.idle_deadline:g}s"

    def _expire(self, why: Exception | str) -> None:
        """Called by the watchdog: end the read waiting on this connection, with ``why`` (an
        error it raises, or the reason it closes with)."""
        if self._expired is None and self._reading:
            self._expired = why
            trio.lowlevel.notify_closing(self._fd)

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
        """Ask the task running this connection to stop; idempotent, the first reason wins.
        What it still had queued is dropped (and given back to its budget)."""
        self._shut(reason)
        self.cancel_scope.cancel()

    def _write_failed(self, reason: str) -> None:
        """The peer is gone (a write failed: it reset the connection, closing it with what we
        sent unread): nothing more is sent, but what it sent before it went is still read — its
        last frames, such as the acknowledgement of what it has had, precede its reset in the
        kernel's buffer, and the reader reaches the end right after them. (The broker handles a
        closing connection's session requests, acknowledgements and leaves among them, and
        drops its publishes and subscriptions, as for a slow consumer's.) The connection's
        tasks are cancelled once the reader has ended (:meth:`close`), or at most
        :data:`LAST_READ_SECONDS` later."""
        if self._closed:
            return
        self._shut(reason)
        scope = self.cancel_scope
        scope.deadline = min(scope.deadline, trio.current_time() + LAST_READ_SECONDS)

    def _shut(self, reason: str) -> None:
        """Nothing more is sent: what is queued or held is dropped, and senders that wait are
        woken (they find it closed)."""
        if self.close_reason is None:
            self.close_reason = reason
        self._release()
        self._held = None
        self._closed = True
        self._ready.set()
        self._room.set()

    def _release(self) -> None:
        if self.budget is not None and not self._closed:
            # what the writer has not written goes with the connection
            self.budget.give_back(self.queued)
            self.budget = None

    async def aclose(self) -> None:
        """Close the stream: at once, or once what the peer still sends has been read for a
        while if its last frame said why (:func:`linger`)."""
        self._release()
        self._closed = True
        self._ready.set()
        self._room.set()
        with trio.CancelScope(shield=True), trio.move_on_after(1 + LINGER_SECONDS):
            if self.said_why:
                await linger(self.stream)
            await self.stream.aclose()


async def linger(stream, max_bytes: int = LINGER_BYTES, seconds: float | None = None) -> None:
    """A lingering close's first half: nothing more is sent (a plain socket's FIN), and what
    the peer sends meanwhile is read and dropped until it closes its side, ``max_bytes`` were
    read or ``seconds`` passed. A socket closed with bytes unread resets the connection, and
    a peer that was still sending (pipelined requests, PUBRELs for the PUBRECs before an MQTT
    DISCONNECT) would have its reads fail before the last frame that said why."""
    send_eof = getattr(stream, "send_eof", None)  # (TLS has none: its close_notify follows)
    with (
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError),
        trio.move_on_after(LINGER_SECONDS if seconds is None else seconds),
    ):
        if send_eof is not None:
            await send_eof()
        dropped = 0
        while dropped < max_bytes:
            data = await stream.receive_some(PROGRESS_PIECE)
            if not data:
                return
            dropped += len(data)


def frame_error_reason(exc: FrameError) -> str:
    return f"protocol error: {exc}"
