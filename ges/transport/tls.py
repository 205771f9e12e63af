"""TLS over a trio socket stream: the standard library's ``ssl`` with memory buffers, lean.

Why not ``trio.SSLStream``: it is general — a handshake any task may start, renegotiation,
careful conflict detection between tasks — and here it cost some 75–85 µs of CPU per record
(``bench/tls.py``), where encrypting and decrypting a 150-byte record with ``ssl`` costs ~5 µs.
An event sent one per Publish is three records at its broker, so that was most of what TLS
added to a hop. A GES connection needs less: its handshake runs first (the dialling side
asks for it; the accepting side's first read does it), then one task reads and one writes. So
this stream keeps an ``ssl.SSLObject`` between two memory buffers: ``send_all`` encrypts into
the outgoing buffer and writes it to the socket; ``receive_some`` decrypts what is buffered —
everything one read brought, across records — and reads the socket only when nothing is. A
read may have something to write (a TLS 1.3 key update's answer), so writes to the socket
take a lock, taken without a checkpoint when free; ciphertext goes out in the order it was
made, whichever task writes it. :meth:`write_nowait` encrypts and writes from the calling task
when nothing else is waiting, as ``ges.transport.connection`` does for plain sockets.

Closing sends TLS's ``close_notify`` if it fits the socket's buffer at once, and never waits
on the peer; a peer that closes without one ends the stream like a clean close (a frame it
cut short is the frame decoder's to notice). A send that was cancelled or failed half way
leaves the TLS stream unusable, and later sends say so.
"""

from __future__ import annotations

import contextlib
import os
import ssl

import trio

#: Bytes asked of the socket per read.
RECEIVE_SIZE = 65536
#: The largest frame :meth:`TLSStream.write_nowait` takes: a larger one goes through
#: ``send_all`` from the connection's writer, in pieces, each with its write deadline (and
#: what the kernel does not take at once stays this small).
WRITE_NOWAIT_MAX = 64 * 1024


def direct_write(fd: int, data: bytes) -> bytes:
    """Write ``data`` to the socket ``fd`` now, without waiting: what it did not take (b"":
    all of it). An OSError other than a full buffer is raised."""
    try:
        written = os.write(fd, data)
    except BlockingIOError:
        written = 0
    return data[written:]


def tls_of(stream) -> TLSStream | None:
    """The TLS stream ``stream`` is or runs over (a WebSocket's: ges.transport.websocket), if
    any."""
    while not isinstance(stream, TLSStream):
        stream = getattr(stream, "transport_stream", None)
        if stream is None:
            return None
    return stream


class TLSStream(trio.abc.Stream):
    """TLS over ``transport_stream`` with ``ssl_context`` (see the module docstring).

    The handshake must be done (:meth:`do_handshake`, or the first ``receive_some``) before a
    second task uses the stream: two tasks driving it at once would both read the socket."""

    def __init__(self, transport_stream, ssl_context: ssl.SSLContext, *, server_side: bool):
        self.transport_stream = transport_stream
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = ssl_context.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        self._write_lock = trio.Lock()
        self._handshaken = False
        self._eof = False
        self._broken: str | None = None
        self._closed = False
        #: ciphertext :meth:`write_nowait` made that the socket did not take at once
        self._pending = b""
        sock = getattr(transport_stream, "socket", None)
        self._fd = sock.fileno() if sock is not None else None

    # -- what trio.SSLStream also offers ---------------------------------------------------------

    def getpeercert(self, binary_form: bool = False):
        return self._ssl.getpeercert(binary_form)

    async def do_handshake(self) -> None:
        """The TLS handshake (once). A failure raises BrokenResourceError whose ``__cause__``
        is the ``ssl.SSLError`` (its ``reason`` says what failed)."""
        if self._handshaken:
            return
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                data = await self._receive_raw()
                if not data:
                    raise trio.BrokenResourceError("closed during the TLS handshake") from None
                self._incoming.write(data)
            except ssl.SSLError as exc:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._flush()  # the alert saying why, if it goes at once
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
        self._handshaken = True
        await self._flush()

    # -- trio.abc.Stream -------------------------------------------------------------------------

    async def send_all(self, data) -> None:
        if self._broken is not None:
            raise trio.BrokenResourceError(self._broken)
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        if not self._handshaken:
            await self.do_handshake()
        if data:
            try:
                self._ssl.write(data)
            except ssl.SSLError as exc:
                self._broken = f"TLS: {exc}"
                raise trio.BrokenResourceError(self._broken) from exc
        await self._flush()

    def write_nowait(self, data) -> bool | None:
        """Encrypt ``data`` and write it to the socket now, without waiting (what saves a
        connection's writer task a hand-off per frame). None: not now — the handshake is not
        done, or other ciphertext is waiting, so send it with :meth:`send_all`. True: all of it
        is in the kernel. False: it is encrypted and part of it is not: ``send_all(b"")``
        writes the rest, before anything else."""
        if (
            self._fd is None
            or len(data) > WRITE_NOWAIT_MAX
            or not self._handshaken
            or self._broken is not None
            or self._closed
            or self._pending
            or self._outgoing.pending
            or self._write_lock.locked()
        ):
            return None
        try:
            self._ssl.write(data)
        except ssl.SSLError as exc:
            self._broken = f"TLS: {exc}"
            return None  # send_all says so
        try:
            self._pending = direct_write(self._fd, self._outgoing.read())
        except OSError as exc:
            self._broken = f"write failed: {exc.strerror or exc}"
            return None
        return not self._pending

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        if not self._handshaken:
            await self.do_handshake()
        want = max_bytes or RECEIVE_SIZE
        read = self._ssl.read
        while True:
            try:
                data = read(want)
                break
            except ssl.SSLWantReadError:
                if self._outgoing.pending and self._broken is None:
                    await self._flush_for_reader()
                if self._eof:
                    return b""
                raw = await self._receive_raw()
                if raw:
                    self._incoming.write(raw)
                else:  # the peer closed: ssl says whether cleanly (both end the stream)
                    self._eof = True
                    self._incoming.write_eof()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True
                return b""
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS: {exc}") from exc
        # what else is decrypted or buffered goes with it: one read, many records
        if len(data) < want and (self._ssl.pending() or self._incoming.pending):
            chunks = [data]
            size = len(data)
            while size < want:
                try:
                    more = read(want - size)
                except ssl.SSLError:  # wants more, or the end: the next call finds out
                    break
                if not more:
                    break
                chunks.append(more)
                size += len(more)
            data = b"".join(chunks)
        if self._outgoing.pending and self._broken is None:
            await self._flush_for_reader()
        return data

    async def _flush_for_reader(self) -> None:
        """What reading made (a TLS 1.3 key update's answer, say) goes out; if the peer is gone,
        what it sent before it went is still read (the writer finds the stream broken)."""
        with contextlib.suppress(trio.BrokenResourceError):
            await self._flush()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if (
            self._handshaken
            and self._broken is None
            and not self._pending  # after half a record, an alert would read as garbage
            and not self._write_lock.locked()
        ):
            with contextlib.suppress(ssl.SSLError, OSError, AttributeError):
                self._ssl.unwrap()
            notify = self._outgoing.read()
            sock = getattr(self.transport_stream, "socket", None)
            if notify and sock is not None:
                with contextlib.suppress(OSError):  # only what fits at once: never wait here
                    os.write(sock.fileno(), notify)
        await self.transport_stream.aclose()

    # -- the socket --------------------------------------------------------------------------------

    async def _receive_raw(self) -> bytes:
        try:
            return await self.transport_stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, OSError) as exc:
            raise trio.BrokenResourceError(f"read failed: {exc}") from exc

    async def _flush(self) -> None:
        """Write what the TLS layer has made to the socket, in order."""
        lock = self._write_lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            data = self._outgoing.read()
            if self._pending:
                data, self._pending = self._pending + data, b""
            if data:
                try:
                    await self.transport_stream.send_all(data)
                except BaseException as exc:  # half a record may be out: the stream is done
                    self._broken = f"write failed: {exc or type(exc).__name__}"
                    if isinstance(exc, OSError):
                        raise trio.BrokenResourceError(self._broken) from exc
                    raise
        finally:
            lock.release()
