"""MQTT over WebSocket (MQTT 3.1.1 and 5.0, §6): the bytes of a WebSocket's binary messages as
a trio stream, so the MQTT listener serves a browser's connection as any other.

Theory of operation
-------------------
:class:`WebSocketStream` wraps a transport stream (a socket, or TLS over one) whose peer opens
with an HTTP upgrade request. :meth:`WebSocketStream.accept` reads that request — at most
:data:`MAX_UPGRADE_BYTES`; the caller bounds the time — and answers it: ``101`` with the
subprotocol ``mqtt`` (or ``mqttv3.1``, which older clients offer), or an HTTP error and
:class:`UpgradeRefused` when it is no upgrade or offers neither (§6: "the Client MUST include
mqtt in the list of WebSocket Sub Protocols it offers"). No extension is accepted, so no
compressed message can inflate past what was read.

Then the stream is what the MQTT connection reads and writes: ``receive_some`` gives the
payload of the binary messages in order, whatever their frames' boundaries (§6: a frame may
hold part of a packet or several), and answers pings; a text message breaks the stream (§6:
"MUST close the Network Connection"), as does a frame the protocol does not allow. What one
read of the transport brings is all it buffers. Its frames are taken :data:`FRAMES_PER_TURN`
at a time, the event loop's other tasks running in between: a read of tiny frames is
thousands of them, 130 ms of parsing at once. Of the pings one read brings, the last is
answered (RFC 6455 §5.5.3 allows it). ``send_all`` sends its bytes as one binary message.
The upgrade is taken by `wsproto <https://python-hyper.org/projects/wsproto/>`_ (sans-I/O,
h11's HTTP); the frames after it by :mod:`ges.transport.wsframes` (sans-I/O too), a few µs a
frame where wsproto took 15.
"""

from __future__ import annotations

import contextlib

import trio
from trio.lowlevel import checkpoint
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, Request
from wsproto.utilities import RemoteProtocolError

from ges.transport import wsframes
from ges.transport.tls import direct_write
from ges.transport.wsframes import BINARY, CLOSE, PING, PONG

#: The largest upgrade request read (its request line and headers; a browser's take a few KiB).
MAX_UPGRADE_BYTES = 16 * 1024
#: The subprotocols taken, in order of preference: ``mqtt`` (both specs, §6), and ``mqttv3.1``.
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
#: Bytes asked of the transport per read.
RECEIVE_SIZE = 65536
#: Seconds a close frame is given to be written as the stream closes.
CLOSE_WAIT = 0.5
#: Frames taken from a read before the other tasks get a turn (each costs some µs to parse).
FRAMES_PER_TURN = 64


class UpgradeRefused(Exception):
    """The connection's opening was no WebSocket upgrade for MQTT (answered, when it could be,
    with an HTTP error); ``str()`` says why."""


class WebSocketStream(trio.abc.Stream):
    """A server's end of a WebSocket carrying MQTT (see the module docstring)."""

    def __init__(self, transport_stream):
        self.transport_stream = transport_stream
        self._ws = WSConnection(ConnectionType.SERVER)
        self._write_lock = trio.Lock()
        self._buffer = bytearray()
        self._eof = False
        self._closed = False
        self._close_sent = False
        self._frames: wsframes.FrameReader | None = None
        #: over a plain socket: its descriptor for direct writes, and what one did not write
        sock = getattr(transport_stream, "socket", None)
        self._fd = None if sock is None else sock.fileno()
        self._pending = b""
        #: the upgrade request's target (``/mqtt``, say), once accepted
        self.path: str | None = None
        #: the subprotocol chosen
        self.subprotocol: str | None = None
        #: the request came from a web page of another origin than the broker's own address
        #: (its ``Origin`` is not its ``Host``): a client certificate the browser holds does
        #: not prove who that page is (RFC 6455 §10.2; ges.runtime.mqtt)
        self.cross_origin = False

    async def accept(self) -> None:
        """Read the upgrade request and accept it; :class:`UpgradeRefused` (after an HTTP
        error, when the peer can still read one) if it is none, or offers no MQTT
        subprotocol, or is over :data:`MAX_UPGRADE_BYTES`. What came after it (a client that
        did not wait for the answer) is read first."""
        seen = b""  # what was read (at most MAX_UPGRADE_BYTES and one read)
        fed = 0  # what of it the handshake parser has: the request, not what follows it
        request = None
        while request is None:
            if len(seen) > MAX_UPGRADE_BYTES:
                await self._refuse(431, "Request Header Fields Too Large")
                raise UpgradeRefused(f"an upgrade request over {MAX_UPGRADE_BYTES:,} bytes")
            data = await self.transport_stream.receive_some(RECEIVE_SIZE)
            if not data:
                raise UpgradeRefused("closed before its WebSocket upgrade")
            seen += data
            end = seen.find(b"\r\n\r\n", max(0, fed - 3))
            upto = len(seen) if end < 0 else end + 4
            try:
                self._ws.receive_data(seen[fed:upto])
                request = next((e for e in self._ws.events() if isinstance(e, Request)), None)
            except (RemoteProtocolError, ValueError) as exc:  # (bytes no header may hold, too)
                hint = getattr(exc, "event_hint", None)
                if isinstance(hint, RejectConnection) and hint.status_code == 426:
                    await self._refuse(426, "Upgrade Required", b"Sec-WebSocket-Version: 13\r\n")
                else:
                    await self._refuse(400, "Bad Request")
                raise UpgradeRefused(f"not a WebSocket upgrade request: {exc}") from None
            fed = upto
            if request is None and end >= 0:  # (the head ended, and no upgrade came of it)
                await self._refuse(400, "Bad Request")
                raise UpgradeRefused("not a WebSocket upgrade request")
        after = seen[fed:]
        offered = list(request.subprotocols)
        chosen = next((s for s in offered if s in SUBPROTOCOLS), None)
        if chosen is None:
            await self._refuse(400, "Bad Request")
            said = ", ".join(offered) if offered else "none"
            raise UpgradeRefused(f"no MQTT subprotocol offered (mqtt; it offered {said})")
        await self._write(self._ws.send(AcceptConnection(subprotocol=chosen)))
        self.path, self.subprotocol = request.target, chosen
        headers = dict(request.extra_headers)
        origin = headers.get(b"origin")
        if origin is not None:  # scheme://host[:port]: another origin than the Host asked
            self.cross_origin = origin.partition(b"://")[2].lower() != request.host.encode().lower()
        self._frames = wsframes.FrameReader()  # the frames from here on are read there
        if after:
            await self._take(after)

    async def _refuse(self, status: int, reason: str, headers: bytes = b"") -> None:
        """An HTTP error for an opening that is no upgrade for MQTT (not waited on long)."""
        answer = (
            f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Length: 0\r\n".encode()
            + headers
            + b"\r\n"
        )
        with (
            trio.move_on_after(CLOSE_WAIT),
            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError),
        ):
            await self.transport_stream.send_all(answer)

    # -- trio.abc.Stream -------------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the WebSocket stream is closed")
        while not self._buffer:
            if self._eof:
                await checkpoint()
                return b""
            data = await self.transport_stream.receive_some(RECEIVE_SIZE)
            if not data:
                self._eof = True
                continue
            await self._take(data)
        if max_bytes is None or max_bytes >= len(self._buffer):
            data, self._buffer = bytes(self._buffer), bytearray()
        else:
            data = bytes(self._buffer[:max_bytes])
            del self._buffer[:max_bytes]
        return data

    async def _take(self, data: bytes) -> None:
        """The frames of one read (ges.transport.wsframes), FRAMES_PER_TURN at a time: their
        payload to the buffer, the last ping answered, a close answered; a frame that breaks
        the protocol closes the connection saying why."""
        frames = self._frames
        frames.feed(data)
        ping = None
        try:
            while True:
                payload, controls, more = frames.take(FRAMES_PER_TURN)
                self._buffer += payload
                for opcode, body in controls:
                    if opcode == PING:
                        ping = body
                    elif opcode == CLOSE:  # answered with its code (§5.5.1), and the end
                        self._eof = True
                        code = body[:2] if len(body) >= 2 else b""
                        await self._say(wsframes.frame(CLOSE, code))
                if not more:
                    break
                await checkpoint()
        except wsframes.FrameError as exc:
            await self._say(wsframes.close_frame(exc.code, str(exc)))
            raise trio.BrokenResourceError(f"WebSocket: {exc}") from None
        if ping is not None and not self._eof:
            await self._say(wsframes.frame(PONG, ping))

    async def _say(self, data: bytes) -> None:
        """A control frame of ours (once a close went, nothing more; a peer that is gone
        need not hear it)."""
        if self._close_sent:
            return
        self._close_sent = data[0] & 0x0F == CLOSE
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await self._write(data)

    async def send_all(self, data) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the WebSocket stream is closed")
        if self._close_sent:
            raise trio.BrokenResourceError("WebSocket: closing (no more messages)")
        # (empty: a writer's flush of what write_nowait left, no frame)
        await self._write(wsframes.frame(BINARY, bytes(data)) if data else b"")

    def write_nowait(self, data) -> bool | None:
        """Frame ``data`` and write it now, without waiting, as ``TLSStream.write_nowait`` does
        (what saves a connection's writer task a hand-off per write; ges.transport.connection):
        None, not now (send it with ``send_all``); True, all of it is in the kernel; False,
        part of it is not, and ``send_all(b"")`` writes the rest before anything else."""
        if not data or self._closed or self._close_sent or self._write_lock.locked():
            return None
        out = wsframes.frame(BINARY, bytes(data))
        inner = getattr(self.transport_stream, "write_nowait", None)
        if inner is not None:  # TLS: its own (the rest is its to write)
            return inner(out)
        if self._fd is None or self._pending:
            return None
        try:
            self._pending = direct_write(self._fd, out)
        except OSError:
            return None  # send_all says what
        return not self._pending

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.subprotocol is not None:  # (accepted: a close frame says it ends)
            with trio.move_on_after(CLOSE_WAIT):
                await self._say(wsframes.close_frame(wsframes.NORMAL))
        await self.transport_stream.aclose()

    async def _write(self, data: bytes) -> None:
        """Bytes to the transport, one writer at a time (a pong goes from the reader's task),
        after what a direct write left."""
        async with self._write_lock:
            if self._pending:
                data, self._pending = self._pending + data, b""
            await self.transport_stream.send_all(data)
