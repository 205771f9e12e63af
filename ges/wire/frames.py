"""Length-prefixed, versioned frames; incremental decoding in the style of h11.

A frame on the wire is::

    +----------------+-----------+------------------------+
    | length: u32 BE | version:u8| body: msgpack message  |
    +----------------+-----------+------------------------+

``length`` counts the version byte and the body. :class:`FrameDecoder` is fed bytes in any
chunking (one byte at a time gives the same frames as one big read) and hands back complete
bodies. A frame over the size limit or with an unknown version raises :class:`FrameError`; the
connection that sent it is closed by its driver, nothing else is affected.
"""

from __future__ import annotations

import struct

#: Bump on any incompatible change to the frame layout or the message set.
PROTOCOL_VERSION = 4
#: Largest frame accepted or produced. A batch of events is split below this; 16 MiB leaves room
#: for large payloads while keeping one bad peer from making a broker allocate gigabytes.
DEFAULT_MAX_FRAME = 16 * 1024 * 1024

_HEADER = struct.Struct(">IB")
HEADER_SIZE = _HEADER.size


class FrameError(Exception):
    """The peer sent bytes that are not a valid frame; the reason says what was wrong."""


def frame(body: bytes, *, version: int = PROTOCOL_VERSION) -> bytes:
    """Wrap an encoded message body into one frame."""
    return _HEADER.pack(len(body) + 1, version) + body


class FrameDecoder:
    """Incremental frame parser: ``feed(data)`` then iterate ``frames()``.

    The buffer holds at most one partial frame plus whatever the last read returned, so its size
    is bounded by ``max_frame`` plus the transport's read size.
    """

    def __init__(self, *, max_frame: int = DEFAULT_MAX_FRAME, version: int = PROTOCOL_VERSION):
        self.max_frame = max_frame
        self.version = version
        self._buf = bytearray()
        self._pos = 0
        #: frames taken whole so far
        self.taken = 0

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def frames(self) -> list[memoryview | bytes]:
        """Every complete frame body fed so far, in order; raises FrameError on a bad frame."""
        out = []
        buf, pos, end = self._buf, self._pos, len(self._buf)
        while end - pos >= HEADER_SIZE:
            length, version = _HEADER.unpack_from(buf, pos)
            if length - 1 > self.max_frame or length < 1:
                raise FrameError(
                    f"frame of {length - 1} bytes exceeds the {self.max_frame}-byte limit"
                )
            if version != self.version:
                raise FrameError(
                    f"unsupported protocol version {version} (expected {self.version})"
                )
            stop = pos + 4 + length
            if stop > end:
                break
            out.append(bytes(buf[pos + HEADER_SIZE : stop]))
            pos = stop
        # compact once most of the buffer is consumed, so it never grows without bound
        if pos and pos > len(buf) // 2:
            del buf[:pos]
            pos = 0
        self._pos = pos
        self.taken += len(out)
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    @property
    def pending_length(self) -> int:
        """The body length the partial frame in the buffer announced (0: none known yet)."""
        if len(self._buf) - self._pos < HEADER_SIZE:
            return 0
        length, _ = _HEADER.unpack_from(self._buf, self._pos)
        return length - 1
