"""The three wire protocols of bench/peers.py, on plain blocking sockets: GES, MQTT 3.1.1, NATS.

Each protocol has the same four parts, so the publisher and subscriber processes
(``_peers_load.py``) run one code path for every broker:

- ``handshake_*``: connect a socket (TCP_NODELAY) and open the session — GES ``Hello`` →
  ``Welcome``; MQTT ``CONNECT`` → ``CONNACK``; NATS ``INFO`` ← , ``CONNECT`` + ``PING`` → ``PONG``;
- ``subscribe_*``: subscribe to everything the publisher sends and wait for the broker's answer
  (``SubAck``, ``SUBACK``, ``PONG``; for JetStream also the consumer's creation);
- ``*_frame``: one publish frame carrying one or more events (only GES can carry more than one);
- a ``*Parser`` fed the bytes a socket reads, which counts the events in them, the acks a
  publisher gets, the replies owed to the broker (PONG, PUBACK, JetStream ack), probes and, for
  latency runs, each event's ``now − sent`` from the timestamp in its payload.

Every event's payload is ``PAYLOAD_BYTES`` long: a little-endian u64 send timestamp
(``time.monotonic_ns()``, system-wide on Linux), the event's u64 number in the run (from 0: a
subscriber counts every event that does not follow the one before it — duplicated, reordered
or after a gap — as ``disorder``) and filler. A timestamp of 0 marks a *probe*:
sent before the measured run until the subscriber has one, so a run starts only once the
subscription is in place end to end (a bridge or leaf link up, a GES profile at its keepers);
probes are never counted.

Only the parts of each protocol the bench uses are here; anything unexpected from a broker
(an MQTT packet type, a NATS ``-ERR``, a GES ``Error``) is recorded as an error.
"""

from __future__ import annotations

import json
import socket
import struct
import time

from ges.wire import FrameDecoder, decode, encode
from ges.wire import messages as m

PAYLOAD_BYTES = 100
STAMP = struct.Struct("<QQ")
FILLER = b"x" * (PAYLOAD_BYTES - STAMP.size)
#: MQTT topic and NATS subject of the events.
TOPIC = "bench"
#: NATS: the JetStream stream (reliable runs) and the inbox the publisher's acks come to.
STREAM = "BENCH"
PUB_INBOX = "_INBOX.peers.pub"
READ_SIZE = 1 << 18
HANDSHAKE_TIMEOUT = 20.0

_stamp = STAMP.pack
_unstamp = STAMP.unpack_from


def payload(stamp: int, number: int = 0) -> bytes:
    return _stamp(stamp, number) + FILLER


def connect_socket(host: str, port: int, timeout: float = HANDSHAKE_TIMEOUT) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class ProtocolFailure(Exception):
    """A broker answered something the bench did not expect (refusal, error, bad frame)."""


def read_until(sock: socket.socket, parser, done) -> None:
    """Feed ``parser`` from ``sock`` until ``done()`` (replies owed are sent on the way)."""
    while not done():
        data = sock.recv(READ_SIZE)
        if not data:
            raise ProtocolFailure("closed by the broker during the handshake")
        parser.feed(data, 0)
        if parser.replies:
            sock.sendall(b"".join(parser.replies))
            parser.replies.clear()
        if parser.error:
            raise ProtocolFailure(parser.error)


# -- GES -------------------------------------------------------------------------------------


def ges_frame(seq: int, first: int, count: int, stamp: int) -> bytes:
    """One Publish frame of ``count`` events numbered from ``first`` (attribute ``n``)."""
    now = time.time_ns()
    events = [m.Event({"n": first + i}, payload(stamp, first + i), now) for i in range(count)]
    return encode(m.Publish(seq, events))


class _Counter:
    """What every parser counts of the stamped payloads it reads: events in order (a number
    out of sequence is a disorder), probes (stamped 0), latencies when asked."""

    def __init__(self, latency: bool) -> None:
        self.latency = latency
        self.latencies: list[int] = []
        self.events = self.probes = self.acks = self.disorder = self.next = 0
        self.replies: list[bytes] = []
        self.error: str | None = None

    def _seen(self, buf, at: int, now: int) -> int:
        """One payload at ``buf[at:]``: 1 if it is an event, 0 if a probe."""
        stamp, number = _unstamp(buf, at)
        if not stamp:
            self.probes += 1
            return 0
        if number != self.next:
            self.disorder += 1
        self.next = number + 1
        if self.latency:
            self.latencies.append(now - stamp)
        return 1


class GesParser(_Counter):
    """Deliver frames (subscriber) and PubAcks (publisher), with the handshake's answers."""

    def __init__(self, latency: bool = False) -> None:
        super().__init__(latency)
        self.decoder = FrameDecoder()
        self.welcome: m.Welcome | None = None
        self.subacks: list[m.SubAck] = []

    def feed(self, data: bytes, now: int) -> int:
        """The events (not probes) in ``data``."""
        self.decoder.feed(data)
        n = 0
        for body in self.decoder.frames():
            msg = decode(body)
            kind = type(msg)
            if kind is m.Deliver:
                for item in msg.items:
                    n += self._seen(item.event.payload, 0, now)
            elif kind is m.PubAck:
                # one PubAck may acknowledge ``seqs`` consecutive publishes (ges.core.coalesce)
                self.acks += getattr(msg, "seqs", 1)
            elif kind is m.Welcome:
                self.welcome = msg
            elif kind is m.SubAck:
                self.subacks.append(msg)
            elif kind is m.Error or kind is m.Refuse:
                self.error = f"GES broker: {kind.__name__}: {msg.reason}"
        self.events += n
        return n


def handshake_ges(host: str, port: int, topology: str, client_id: str):
    sock = connect_socket(host, port)
    parser = GesParser()
    sock.sendall(encode(m.hello_for(topology, "client", client_id, "")))
    read_until(sock, parser, lambda: parser.welcome is not None)
    return sock, parser


def subscribe_ges(sock: socket.socket, parser: GesParser) -> None:
    """Subscribe to every event (one empty conjunction) and wait for the SubAck."""
    sock.sendall(encode(m.Subscribe(1, [[]], "", 1)))
    read_until(sock, parser, lambda: any(a.req == 1 for a in parser.subacks))


# -- MQTT 3.1.1 ------------------------------------------------------------------------------


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _mqtt_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def mqtt_connect(client_id: str, clean: bool = True) -> bytes:
    # protocol name, level 4 (3.1.1), flags (clean session), keepalive 0 (off)
    var = _mqtt_str("MQTT") + bytes([4, 0x02 if clean else 0x00]) + struct.pack(">H", 0)
    body = var + _mqtt_str(client_id)
    return b"\x10" + _remaining_length(len(body)) + body


def mqtt_subscribe(topic: str, qos: int, packet_id: int = 1) -> bytes:
    body = struct.pack(">H", packet_id) + _mqtt_str(topic) + bytes([qos])
    return b"\x82" + _remaining_length(len(body)) + body


def mqtt_publish(topic: str, body: bytes, qos: int = 0, packet_id: int = 0) -> bytes:
    var = _mqtt_str(topic) + (struct.pack(">H", packet_id) if qos else b"")
    return bytes([0x30 | (qos << 1)]) + _remaining_length(len(var) + len(body)) + var + body


def mqtt_frame(stamp: int, number: int, qos: int, packet_id: int) -> bytes:
    return mqtt_publish(TOPIC, payload(stamp, number), qos, packet_id)


class MqttParser(_Counter):
    """PUBLISH packets (subscriber; QoS 1 ones owe a PUBACK), PUBACKs (publisher), CONNACK and
    SUBACK."""

    def __init__(self, latency: bool = False) -> None:
        super().__init__(latency)
        self.buf = bytearray()
        self.connack: int | None = None
        self.suback: int | None = None

    def feed(self, data: bytes, now: int) -> int:
        buf = self.buf
        buf += data
        pos, end, n = 0, len(buf), 0
        acks: list[bytes] = []
        while end - pos >= 2:
            b0 = buf[pos]
            # remaining length: 1 to 4 bytes of 7 bits
            i, length, shift = pos + 1, 0, 0
            while i < end:
                byte = buf[i]
                i += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
            else:
                break  # the length itself is incomplete
            stop = i + length
            if stop > end:
                break
            kind = b0 >> 4
            if kind == 3:  # PUBLISH
                p = i + 2 + ((buf[i] << 8) | buf[i + 1])
                if b0 & 0x06:  # QoS 1: a packet id, acknowledged with a PUBACK
                    acks.append(b"\x40\x02" + bytes(buf[p : p + 2]))
                    p += 2
                n += self._seen(buf, p, now)
            elif kind == 4:  # PUBACK
                self.acks += 1
            elif kind == 2:  # CONNACK
                self.connack = buf[i + 1]
                if self.connack:
                    self.error = f"MQTT broker refused the connection (CONNACK code {self.connack})"
            elif kind == 9:  # SUBACK
                self.suback = buf[i + 2]
                if self.suback == 0x80:
                    self.error = "MQTT broker refused the subscription (SUBACK 0x80)"
            elif kind != 13:  # PINGRESP is harmless; anything else is not expected
                self.error = f"unexpected MQTT packet type {kind}"
            pos = stop
        del buf[:pos]
        if acks:
            self.replies.append(b"".join(acks))
        self.events += n
        return n


def handshake_mqtt(host: str, port: int, client_id: str, clean: bool = True):
    sock = connect_socket(host, port)
    parser = MqttParser()
    sock.sendall(mqtt_connect(client_id, clean))
    read_until(sock, parser, lambda: parser.connack is not None)
    return sock, parser


def subscribe_mqtt(sock: socket.socket, parser: MqttParser, qos: int) -> None:
    sock.sendall(mqtt_subscribe(TOPIC, qos))
    read_until(sock, parser, lambda: parser.suback is not None)


# -- NATS ------------------------------------------------------------------------------------

NATS_CONNECT = (
    b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"echo":false,'
    b'"name":"ges-bench-peers","lang":"python","version":"0"}\r\n'
)


def nats_frame(stamp: int, number: int = 0, reply: str = "") -> bytes:
    reply_part = f" {reply}" if reply else ""
    head = f"PUB {TOPIC}{reply_part} {PAYLOAD_BYTES}\r\n".encode()
    return head + payload(stamp, number) + b"\r\n"


def nats_pub(subject: str, body: bytes, reply: str = "") -> bytes:
    reply_part = f" {reply}" if reply else ""
    return f"PUB {subject}{reply_part} {len(body)}\r\n".encode() + body + b"\r\n"


class NatsParser(_Counter):
    """MSG/HMSG frames (a subscriber's events, a publisher's JetStream acks, requests' answers),
    PING (owes a PONG), PONG, +OK, INFO, -ERR.

    ``ack_sid``: MSGs on that subscription are a publisher's acks (counted as ``acks``; one with
    an ``"error"`` in its JSON is an error). ``js_ack``: a JetStream push consumer with
    ``ack_policy: all``: the last event of each read is acknowledged (an empty PUB to its reply
    subject), which acknowledges every one before it.
    """

    def __init__(self, latency: bool = False, ack_sid: bytes = b"", js_ack: bool = False) -> None:
        super().__init__(latency)
        self.buf = bytearray()
        self.pongs = 0
        self.info = False
        self.ack_sid = ack_sid
        self.js_ack = js_ack
        #: answers of MSGs on other sids than the events' (JetStream API requests)
        self.answers: dict[bytes, list[bytes]] = {}
        self.event_sid = b"1"

    def feed(self, data: bytes, now: int) -> int:
        buf = self.buf
        buf += data
        pos, end, n = 0, len(buf), 0
        event_sid, ack_sid = self.event_sid, self.ack_sid
        last_reply = None
        # the usual frame, an event on the core subscription, parsed without splitting its line
        fast = b"MSG " + TOPIC.encode() + b" " + event_sid + b" %d\r\n" % PAYLOAD_BYTES
        fast_len, fast_size = len(fast), len(fast) + PAYLOAD_BYTES + 2
        while True:
            if buf.startswith(fast, pos):
                if pos + fast_size > end:
                    break
                n += self._seen(buf, pos + fast_len, now)
                pos += fast_size
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            head = buf[pos]
            if head == 77 or head == 72:  # MSG / HMSG
                parts = buf[pos:eol].split()
                start = eol + 2
                if head == 77:  # MSG subject sid [reply] size
                    size = int(parts[-1])
                    body_at = start
                else:  # HMSG subject sid [reply] header_size total_size
                    size = int(parts[-1])
                    body_at = start + int(parts[-2])
                stop = start + size + 2
                if stop > end:
                    break
                sid = bytes(parts[2])
                reply = bytes(parts[3]) if len(parts) == (5 if head == 77 else 6) else None
                if sid == event_sid:
                    if start + size - body_at >= STAMP.size:
                        n += self._seen(buf, body_at, now)
                        if reply is not None:
                            last_reply = reply
                    # else: a JetStream status message (no body): nothing to count
                elif sid == ack_sid:
                    self.acks += 1
                    if b'"error"' in buf[body_at : start + size]:
                        self.error = "JetStream: " + bytes(buf[body_at : start + size]).decode(
                            errors="replace"
                        )
                else:
                    self.answers.setdefault(sid, []).append(bytes(buf[body_at : start + size]))
                pos = stop
            else:
                line = bytes(buf[pos:eol])
                if line == b"PING":
                    self.replies.append(b"PONG\r\n")
                elif line == b"PONG":
                    self.pongs += 1
                elif line.startswith(b"INFO"):
                    self.info = True
                elif line.startswith(b"-ERR"):
                    self.error = f"nats-server: {line.decode(errors='replace')}"
                pos = eol + 2
        del buf[:pos]
        if self.js_ack and last_reply is not None:
            self.replies.append(b"PUB " + last_reply + b" 0\r\n\r\n")
        self.events += n
        return n


def handshake_nats(host: str, port: int, parser: NatsParser | None = None):
    sock = connect_socket(host, port)
    parser = parser or NatsParser()
    read_until(sock, parser, lambda: parser.info)
    pongs = parser.pongs
    sock.sendall(NATS_CONNECT + b"PING\r\n")
    read_until(sock, parser, lambda: parser.pongs > pongs)
    return sock, parser


def nats_flush(sock: socket.socket, parser: NatsParser, extra: bytes = b"") -> None:
    """Send ``extra`` and a PING, and wait for its PONG (the server has processed both)."""
    pongs = parser.pongs
    sock.sendall(extra + b"PING\r\n")
    read_until(sock, parser, lambda: parser.pongs > pongs)


def nats_request(sock: socket.socket, parser: NatsParser, subject: str, body: dict, sid: str):
    """A request on ``subject`` answered on a one-off inbox (subscription ``sid``): the JSON
    answer; a JetStream API error raises ProtocolFailure."""
    inbox = f"_INBOX.peers.req.{sid}"
    sock.sendall(
        f"SUB {inbox} {sid}\r\n".encode() + nats_pub(subject, json.dumps(body).encode(), inbox)
    )
    key = sid.encode()
    read_until(sock, parser, lambda: key in parser.answers)
    answer = json.loads(parser.answers.pop(key)[0])
    sock.sendall(f"UNSUB {sid}\r\n".encode())
    if "error" in answer:
        raise ProtocolFailure(f"JetStream {subject}: {answer['error']}")
    return answer


def create_stream(host: str, port: int) -> dict:
    """The file-store JetStream stream of the reliable runs (subject ``TOPIC``)."""
    sock, parser = handshake_nats(host, port)
    try:
        return nats_request(
            sock,
            parser,
            f"$JS.API.STREAM.CREATE.{STREAM}",
            {
                "name": STREAM,
                "subjects": [TOPIC],
                "storage": "file",
                "retention": "limits",
                "discard": "old",
                "num_replicas": 1,
            },
            "90",
        )
    finally:
        sock.close()


def subscribe_nats(
    sock: socket.socket,
    parser: NatsParser,
    *,
    jetstream: bool = False,
    window: int = 1000,
    tag: str = "0",
) -> None:
    """Core NATS: subscribe to ``TOPIC``. JetStream: subscribe to a deliver subject and create
    an ephemeral push consumer of the stream delivering to it, acknowledged ``all`` with at
    most ``window`` unacknowledged."""
    if not jetstream:
        nats_flush(sock, parser, f"SUB {TOPIC} 1\r\n".encode())
        return
    deliver = f"peers.deliver.{tag}"
    nats_flush(sock, parser, f"SUB {deliver} 1\r\n".encode())
    nats_request(
        sock,
        parser,
        f"$JS.API.CONSUMER.CREATE.{STREAM}",
        {
            "stream_name": STREAM,
            "config": {
                "deliver_subject": deliver,
                "deliver_policy": "all",
                "ack_policy": "all",
                "max_ack_pending": window,
                "ack_wait": 30_000_000_000,
            },
        },
        "91",
    )
