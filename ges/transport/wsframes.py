"""The frames of a WebSocket's server end (RFC 6455 §5), sans-I/O: bytes in, MQTT's bytes and
control frames out; frames for the client made.

wsproto (ges.transport.websocket) takes the HTTP upgrade; once it is accepted the frames are
read here. wsproto parsed a frame in about 15 µs (a generator, an event object and a frame
object each): with one MQTT packet per message, as browsers send them, that tripled a
broker's CPU per message over WebSocket. Here a whole frame costs a few µs.

:class:`FrameReader` takes a client's frames as they come, any split across reads: each must
be masked (§5.1), with no RSV bit (no extension was agreed), a known opcode (§5.2), a control
frame whole and at most 125 bytes (§5.5), continuations only inside a message (§5.4), and no
text (MQTT §6: binary only). What breaks a rule raises :class:`FrameError` with the close code
to send (§7.4.1). The payload of binary messages is handed on as it arrives, unmasked, part of
a frame included (nothing waits for a frame's end), so what is held is at most one read.
"""

from __future__ import annotations

import struct

#: Opcodes (§5.2).
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: Close codes (§7.4.1).
NORMAL, PROTOCOL_ERROR, UNSUPPORTED_DATA, TOO_BIG = 1000, 1002, 1003, 1009
#: The largest control frame payload (§5.5).
MAX_CONTROL = 125


class FrameError(Exception):
    """A frame that breaks the protocol: close the connection with ``code``."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


def unmask(data: bytes, key: bytes, offset: int) -> bytes:
    """``data`` XOR the mask ``key`` (4 bytes), starting at byte ``offset`` of the payload."""
    n = len(data)
    if not n:
        return b""
    turn = offset % 4
    key = key[turn:] + key[:turn]
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")


class FrameReader:
    """A client's frames, read as they come (see the module docstring)."""

    def __init__(self) -> None:
        self._buffer = b""
        #: the data frame being read: its payload bytes still to come, its mask, its offset
        self._left = 0
        self._key = b""
        self._at = 0
        #: a data message is under way (its next data frame must be a continuation)
        self._in_message = False
        #: the peer sent a close frame: nothing may follow it
        self.closed = False

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def take(self, frames: int) -> tuple[bytes, list[tuple[int, bytes]], bool]:
        """What up to ``frames`` frames of what was fed hold: the payload of binary messages,
        in order, the control frames met (opcode, payload), in order, and whether it stopped
        at ``frames`` (more may be whole: take again) rather than for want of bytes."""
        out: list[bytes] = []
        controls: list[tuple[int, bytes]] = []
        buf = self._buffer
        i = 0
        n = len(buf)
        while frames > 0 and not self.closed:
            if self._left:  # the rest of a data frame
                part = buf[i : i + self._left]
                if not part:
                    break
                out.append(unmask(part, self._key, self._at))
                self._at += len(part)
                self._left -= len(part)
                i += len(part)
                if self._left:
                    break
                frames -= 1
                continue
            if n - i < 2:
                break
            b0, b1 = buf[i], buf[i + 1]
            length, at = b1 & 0x7F, i + 2
            if length == 126:
                if n - at < 2:
                    break
                (length,) = struct.unpack_from("!H", buf, at)
                at += 2
            elif length == 127:
                if n - at < 8:
                    break
                (length,) = struct.unpack_from("!Q", buf, at)
                at += 8
                if length >> 63:
                    raise FrameError(PROTOCOL_ERROR, "a payload length with its top bit set")
            if not b1 & 0x80:
                raise FrameError(PROTOCOL_ERROR, "a client's frame not masked")
            if b0 & 0x70:
                raise FrameError(PROTOCOL_ERROR, "an RSV bit set (no extension was agreed)")
            opcode, fin = b0 & 0x0F, b0 & 0x80
            if opcode >= CLOSE:  # a control frame: read whole
                if opcode not in (CLOSE, PING, PONG):
                    raise FrameError(PROTOCOL_ERROR, f"an unknown control opcode {opcode:#x}")
                if not fin or length > MAX_CONTROL:
                    raise FrameError(PROTOCOL_ERROR, "a control frame fragmented or over 125")
                if n - at < 4 + length:
                    break
                key = buf[at : at + 4]
                controls.append((opcode, unmask(buf[at + 4 : at + 4 + length], key, 0)))
                i = at + 4 + length
                frames -= 1
                if opcode == CLOSE:
                    self.closed = True
                continue
            if opcode == TEXT:
                raise FrameError(UNSUPPORTED_DATA, "a text message (MQTT goes in binary ones)")
            if opcode == BINARY:
                if self._in_message:
                    raise FrameError(PROTOCOL_ERROR, "a new message inside a fragmented one")
            elif opcode == CONTINUATION:
                if not self._in_message:
                    raise FrameError(PROTOCOL_ERROR, "a continuation outside a message")
            else:
                raise FrameError(PROTOCOL_ERROR, f"an unknown data opcode {opcode:#x}")
            if n - at < 4:
                break
            self._in_message = not fin
            self._key, self._at, self._left = buf[at : at + 4], 0, length
            i = at + 4
            if not length:
                frames -= 1
        self._buffer = buf[i:]
        return b"".join(out), controls, frames == 0 and not self.closed


def frame(opcode: int, payload: bytes) -> bytes:
    """A server's frame (not masked, §5.1), whole (FIN)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, n))
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def close_frame(code: int, reason: str = "") -> bytes:
    """A close frame saying ``code`` (and ``reason``, cut to fit 125 bytes)."""
    return frame(CLOSE, struct.pack("!H", code) + reason.encode()[:123])
