"""MQTT's framing, incremental and bounded: bytes in, whole packets out.

Theory of operation
-------------------
Every MQTT control packet (MQTT 3.1.1 §2, 5.0 §2) starts with a fixed header: one byte whose
high four bits are the packet type and low four bits its flags, then the *remaining length* —
the bytes that follow — as a variable byte integer of one to four bytes, seven bits each,
least significant first, the high bit saying another byte follows (§1.5.5 of 5.0, §2.2.3 of
3.1.1; at most 268,435,455). :class:`PacketReader` takes bytes as they come (``feed``) and
hands out each packet once it is whole (``packets``): its type, its flags and its body, the
variable header and payload undecoded.

What is malformed closes the connection (§4.13 of 5.0, §4.8 of 3.1.1): packet type 0 (and 15,
AUTH, under 3.1.1), flags other than those a packet type has (``0010`` for PUBREL, SUBSCRIBE and
UNSUBSCRIBE, ``0000`` for the rest but PUBLISH; a PUBLISH with both QoS bits set), a remaining
length of more than four bytes or not in its shortest form, and a packet larger than the
reader's bound. The bound is in bytes (``max_packet``, what a broker advertises as its Maximum
Packet Size under 5.0); the reader holds at most one packet's bytes plus what came with it, and
says why in :class:`Malformed`, whose text is the one line the connection is closed with.
"""

from __future__ import annotations

import msgspec

#: The largest remaining length the variable byte integer can say (§1.5.5).
MAX_REMAINING = 268_435_455
#: The bound a reader has unless told another: a packet, fixed header included, in bytes.
DEFAULT_MAX_PACKET = 1024 * 1024

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)
NAMES = {
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
}
#: The flags each packet type must have (PUBLISH's are its DUP, QoS and RETAIN).
FLAGS = {t: 0b0010 if t in (PUBREL, SUBSCRIBE, UNSUBSCRIBE) else 0 for t in NAMES}


class Malformed(ValueError):
    """A malformed packet: the connection is closed, saying this (under MQTT 5.0 in a
    DISCONNECT with reason ``code``: 0x81 malformed packet, 0x82 protocol error …)."""

    def __init__(self, text: str, code: int = 0x81):
        super().__init__(text)
        self.code = code


class Packet(msgspec.Struct, frozen=True):
    type: int
    flags: int
    body: bytes

    @property
    def name(self) -> str:
        return NAMES[self.type]


def encode_length(n: int) -> bytes:
    """``n`` as a variable byte integer (its shortest form)."""
    if 0 <= n < 128:
        return bytes((n,))
    if not 0 <= n <= MAX_REMAINING:
        raise ValueError(f"a remaining length of {n} is not one MQTT can say")
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(packet_type: int, flags: int, body: bytes) -> bytes:
    """One packet's bytes: fixed header, then ``body``."""
    return bytes([packet_type << 4 | flags]) + encode_length(len(body)) + body


class PacketReader:
    """Bytes from one connection in, whole packets out (see the module docstring).

    ``version``: 4 (MQTT 3.1.1) or 5; ``max_packet``: the largest packet taken, in bytes."""

    def __init__(self, *, version: int = 4, max_packet: int = DEFAULT_MAX_PACKET):
        self.version = version
        self.max_packet = max_packet
        self._buf = bytearray()
        #: ``packets(limit)`` stopped at its limit: more may be whole already
        self.more = False
        #: packets taken whole so far
        self.taken = 0

    @property
    def buffered(self) -> int:
        """Bytes of a packet not yet whole."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def packets(self, limit: int | None = None) -> list[Packet]:
        """Every whole packet received so far (at most ``limit``: then ``more`` says whether
        whole ones are left), in order; what is left waits for more bytes.

        Raises:
            Malformed: the bytes are not MQTT (the connection is to be closed).
        """
        out: list[Packet] = []
        buf = self._buf
        start = 0
        self.more = False
        while len(buf) - start >= 2:
            if limit is not None and len(out) >= limit:
                self.more = True
                break
            head = buf[start]
            packet_type, flags = head >> 4, head & 0x0F
            self._check_type(packet_type, flags)
            length, used = _remaining(buf, start + 1)
            if used is None:
                break  # the remaining length is not all here yet
            size = 1 + used + length
            if size > self.max_packet:
                raise Malformed(
                    f"a {NAMES[packet_type]} of {size} bytes, over the limit of {self.max_packet}"
                )
            if len(buf) - start < size:
                break
            body = bytes(buf[start + 1 + used : start + size])
            out.append(Packet(packet_type, flags, body))
            start += size
        del buf[:start]
        self.taken += len(out)
        return out

    def _check_type(self, packet_type: int, flags: int) -> None:
        if packet_type == 0 or (packet_type == AUTH and self.version < 5):
            raise Malformed(f"packet type {packet_type} is reserved")
        if packet_type == PUBLISH:
            if flags & 0b0110 == 0b0110:
                raise Malformed("a PUBLISH with QoS 3")
        elif flags != FLAGS[packet_type]:
            raise Malformed(
                f"a {NAMES[packet_type]} with flags {flags:04b}, not {FLAGS[packet_type]:04b}"
            )


def _remaining(buf: bytearray, at: int) -> tuple[int, int | None]:
    """The remaining length at ``buf[at:]`` and the bytes it took (None: not all here)."""
    if at < len(buf) and buf[at] < 0x80:  # one byte: most packets
        return buf[at], 1
    value = 0
    for i in range(4):
        if at + i >= len(buf):
            return 0, None
        byte = buf[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if i and byte == 0:
                raise Malformed("a remaining length not in its shortest form")
            return value, i + 1
    raise Malformed("a remaining length of more than four bytes")
