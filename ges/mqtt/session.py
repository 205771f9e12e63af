"""One MQTT client's connection at a broker, as GES requests and answers: sans-I/O.

Theory of operation
-------------------
A :class:`MqttSession` stands between an MQTT client and the broker's core, in the style of
h11: ``receive_data(bytes)`` returns what the client asked, as GES client messages
(``m.Publish``, ``m.Subscribe`` …) for the broker to handle as it handles a GES client's;
``from_broker(msg)`` takes what the broker answers that client (``m.PubAck``, ``m.SubAck``,
``m.Deliver`` …); both leave the MQTT bytes to send in ``data_to_send()``. The trio runtime
(ges.runtime.mqtt) owns the socket, the clock, authentication and the CONNECT's answer.

The mapping (MQTT 3.1.1):

* A PUBLISH is one event: its topic the reserved attribute ``@topic``, its QoS ``@qos``, its
  payload the event's payload. QoS 1 is acknowledged (PUBACK) once the pubend has it in its log
  (GES's PubAck); QoS 2 the same with PUBREC, and the packet identifier is kept until PUBREL,
  so a PUBLISH sent again with it is acknowledged and not published twice (§4.3.3, method A).
* The client's topic filters are one GES subscription, a disjunction of ``@topic topic F``
  conjunctions, replaced as a whole by each SUBSCRIBE and UNSUBSCRIBE (§3.8.4: a SUBSCRIBE for
  a filter it has replaces it); SUBACK and UNSUBACK go when the broker's SubAck says the
  network has the change. A message matching several filters goes once, at the highest QoS of
  those filters (§3.3.5 allows either).
* A delivered event goes out at the lower of its publisher's QoS and the filter's (an event a
  GES client published, without ``@qos``, at the filter's). QoS 1 and 2 deliveries get packet
  identifiers and are held until acknowledged; at most ``max_inflight`` at a time, the rest
  wait in order (bounded in bytes by the runtime, which cuts a client that lets them pile up).

What the session delivers is :mod:`ges.mqtt.delivering`'s part of it; the client's filters
and what is retained on them, :mod:`ges.mqtt.filtering`'s; a persistent session's moves
between replicators (seed 004 §4's hand-overs, the client staying connected) and its QoS 2
identifiers there, :mod:`ges.mqtt.moving`'s.

Bounds: packets of ``max_packet`` bytes (the framing), ``max_filters`` filters per client,
``max_inflight`` unacknowledged deliveries, and the QoS 2 identifiers are at most 65,535.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque

import msgspec

from ges.durable import session_name_problem
from ges.matching.model import RETAIN_ATTR, TOPIC_ATTR
from ges.matching.topics import TopicTree
from ges.mqtt import packets as p
from ges.mqtt import v5
from ges.mqtt.delivering import (
    QOS_ATTR,
    Delivering,
    epoch_packet_id,
)
from ges.mqtt.filtering import Filtering
from ges.mqtt.frames import DEFAULT_MAX_PACKET, Malformed, PacketReader
from ges.mqtt.moving import Moving
from ges.wire import messages as m

#: Topic filters one client may hold; a SUBSCRIBE past it gets 0x80 for the filters over.
MAX_FILTERS = 1024
#: Deliveries of QoS 1 and 2 sent and not yet acknowledged, per client.
MAX_INFLIGHT = 256
#: Bytes of packets a client may send before its CONNACK (a persistent session's waits for
#: its replicator), held until then.
MAX_EARLY_BYTES = 256 * 1024
#: Packets handled at once: a read full of small packets is taken in batches, the broker
#: serving others in between.
MAX_BATCH = 128
#: What one held packet counts for beyond its body (an empty PINGREQ is not free).
EARLY_OVERHEAD = 64


def _seconds(interval: int) -> float:
    """A Session Expiry Interval in seconds: 0xFFFFFFFF is never (inf)."""
    return float("inf") if interval == p.MAX_U32 else interval


def session_name(client_id: str) -> str:
    """The GES durable session of an MQTT client id's persistent session."""
    name = f"mqtt.{client_id}"
    if session_name_problem(name) is None:
        return name
    return "mqtt.h" + hashlib.sha256(client_id.encode()).hexdigest()[:40]


class MqttSession(Filtering, Moving, Delivering):
    """An MQTT client's connection after its CONNECT was accepted (see the module docstring)."""

    def __init__(
        self,
        connect: p.Connect,
        *,
        max_packet: int = DEFAULT_MAX_PACKET,
        max_filters: int = MAX_FILTERS,
        max_inflight: int = MAX_INFLIGHT,
        assigned: str = "",
        max_expiry: float = float("inf"),
        keepalive: int | None = None,
    ):
        self.connect = connect
        #: 5.0: the keepalive this server holds the client to where it is not the client's
        #: (its CONNACK says so: Server Keep Alive); None: the client's
        self.server_keepalive = keepalive
        self.level = connect.level
        self.v5 = connect.level == p.LEVEL_5
        self.reader = PacketReader(max_packet=max_packet, version=connect.level)
        self.max_packet = max_packet
        self.max_filters = max_filters
        self.max_inflight = max_inflight
        #: 5.0: what the client takes (Receive Maximum, Maximum Packet Size), the id this
        #: server gave it (the runtime sets it), its client id's token on what it publishes
        #: (``@origin``: No Local is by client id, §3.8.3.1, so what a persistent session's
        #: earlier connections published stays its own), and its filters' options: No Local
        #: and Retain As Published bits, and Subscription Identifier (``v5.ID_SHIFT``)
        self.max_out = 0
        #: 5.0: the topic aliases this server sets on its deliveries (at most the client's
        #: Topic Alias Maximum): a topic's bytes as a PUBLISH carries them -> its alias, the
        #: least recently used first (``Delivering._aliased``)
        self._alias_max = 0
        self._aliases_out: dict[bytes, int] = {}
        self.assigned = assigned
        self.origin = ""
        self._options: dict[str, int] = {}
        #: a 3.1.1 connection's: the option bits its persistent session's filters had (from a
        #: 5.0 connection), not applied here but kept with the session when it changes
        self._kept_options: dict[str, int] = {}
        if self.v5:
            self.origin = hashlib.sha256(b"origin " + connect.client_id.encode()).hexdigest()[:12]
            receive_max = p.prop(connect.props, p.RECEIVE_MAXIMUM, 65535)
            self.max_inflight = min(max_inflight, receive_max)
            self.max_out = p.prop(connect.props, p.MAXIMUM_PACKET_SIZE, 0)
            self._alias_max = min(p.prop(connect.props, p.TOPIC_ALIAS_MAXIMUM, 0), v5.ALIASES_OUT)
        #: filter -> granted QoS, as the broker has it (or is about to)
        self.filters: dict[str, int] = {}
        #: 5.0: the topic aliases the client set on this connection (§3.3.2.3.4)
        self._aliases: dict[int, str] = {}
        self._out = bytearray()
        #: the last number given to a GES request: a Publish's seq, a Subscribe's req (one
        #: count, so that a refusal's req names which)
        self._req = 0
        self._acks: dict[int, tuple[int, int]] = {}  # GES seq -> (QoS, packet id) to answer
        #: 5.0's Receive Maximum counts what this connection's client published and has not
        #: been answered: the QoS 1 ones of ``_acks``, the QoS 2 ones not released
        self._qos1_unanswered = 0
        self._received_here: set[int] = set()
        self._before_connack = False  # handling packets sent before the CONNACK said it
        #: GES req -> the MQTT answers once the broker has the change, each with what undoes
        #: it if the broker refuses it (filter -> its QoS and options before, None: it had
        #: none) and the filters to send what is retained on once answered
        self._changes: dict[int, list[tuple[object, dict, list[str]]]] = {}
        self._batch_change: tuple[int, int] | None = None  # (req, index in out) this batch
        self._tree: TopicTree | None = None  # the filters, for matching deliveries
        self._matched: dict[tuple, tuple] = {}  # 5.0 options by topic (_with_options)
        self._matched_bytes = 0
        self._kinds: Counter | None = None  # a persistent session's (``_kinds_counted``)
        #: and the kinds refusals may bring back (``_kinds_back``)
        self._back: set[int] | bool | None = None
        #: the QoS every filter has, with the tree (None: they differ; no match is needed
        #: for a delivery's QoS when they do not and the broker has every change of them,
        #: the broker having matched it)
        self._one_qos: int | None = None
        self._received: dict[int, bool] = {}  # QoS 2 packet ids in: acknowledged (PUBREC) yet?
        #: packet id -> the QoS of a delivery not acknowledged
        self._inflight: dict[int, int] = {}
        self._released: set[int] = set()  # QoS 2 deliveries PUBREC'd, PUBCOMP awaited
        #: deliveries waiting for an identifier: (its topic field, payload, QoS, RETAIN, DUP,
        #: 5.0 properties, its session epoch (None: clean), when it expires (0: never))
        self._waiting: deque[tuple] = deque()
        self.waiting_bytes = 0
        self._next_id = 0
        #: why the connection is to end: the client's DISCONNECT, or the broker's refusal or
        #: takeover of its session (then the CONNACK or what is queued goes first)
        self.closed: str | None = None
        #: the CONNACK is sent (a persistent session's once the replicator has answered)
        self.connected = False
        #: 5.0: a Session Expiry Interval over 0 is a persistent session, which outlives the
        #: connection by that many seconds, at most ``max_expiry`` (the topology's
        #: ``sessions.expire_after``; the CONNACK says so when it is less, §3.2.2.3.2):
        #: ``expiry``, 0 for as the topology says (3.1.1, and 5.0's 0xFFFFFFFF when it says
        #: never). Clean Start discards the old one first. Without Clean Start and with an
        #: interval of 0, the session the client id has is resumed, if there is one, and ends
        #: as this connection closes (§3.1.2.4, §3.1.2.11.2): ``_resume_only``; none is made
        self.expiry = 0
        self._max_expiry = max_expiry
        #: what a DISCONNECT said of the session's expiry, when it goes with the will
        self._leave: m.SessionLeave | None = None
        #: the session was taken over by a new connection of its client (a will with a
        #: delay then never goes: the client is back within it), or it ended (the will goes
        #: at once)
        self.taken_over = False
        self.session_ended = False
        self._granted: int | None = None
        if self.v5:
            interval = p.prop(connect.props, p.SESSION_EXPIRY, 0)
            self._resume_only = (
                interval == 0
                and not connect.clean_session
                and bool(connect.client_id)
                and not assigned
            )
            self.persistent = interval > 0 or self._resume_only
            self._keep(interval)
            if self.persistent and self._max_expiry < _seconds(interval):
                self._granted = max(1, int(self._max_expiry))
            self._discard = connect.clean_session and bool(connect.client_id) and not assigned
        else:
            self._resume_only = False
            self.persistent = not connect.clean_session
            self._discard = not self.persistent and bool(connect.client_id) and not assigned
        self.name = session_name(connect.client_id) if self.persistent else ""
        self._opening = 0  # the req of the SessionOpen the CONNACK waits for
        self._exists = False  # the GES durable session exists
        self._sent_epoch = -1  # the highest epoch handed to the client (or queued for it)
        self._replayed_to = -1  # epochs up to this may have been delivered before: DUP
        self._started_to = 0  # epochs up to this were streamed to it before: sent even expired
        self._epochs: deque[int] = deque()  # epochs of deliveries not yet taken, in order
        self._done_epochs: set[int] = set()  # those of them the client has
        self._pid_epoch: dict[int, int] = {}  # packet id -> epoch of a delivery in flight
        self._acked = -1
        #: the store of the replicator the session's epochs are counted by; while it moves to
        #: another (a hand-over): that replicator, how many opens the move took, the open
        #: awaited; and how long the runtime is to wait before it calls ``reopen`` (None: no
        #: open to make)
        self._store = ""
        self._moving = ""
        self._moves = 0
        self._reopening: set[int] = set()
        self.reopen_after: float | None = None
        self.move_id = 0
        #: the request of the QoS 2 identifiers told whole after a move, until it is kept
        self._whole: int | None = None
        #: QoS 2 identifiers in whose PUBREC waits for the session to keep them (persistent
        #: sessions: ``SessionQos2``), to ask for and asked for (GES req -> identifiers), and
        #: those released, to tell
        self._to_keep: list[int] = []
        self._keeping: dict[int, tuple[list[int], list[int], list[int]]] = {}
        self._to_drop: list[int] = []
        #: likewise, deliveries' identifiers PUBREC'd whose PUBREL waits for the session to
        #: keep them, those it keeps (PUBREL owed until PUBCOMP), and those completed, to tell
        #: (all of them by epoch; identifier -> epoch for those owed)
        self._to_owe: list[int] = []
        self._owed: dict[int, int] = {}
        self._to_paid: list[int] = []
        self._had: set[int] = set()
        #: GES req -> the filters a RetainedAsk asked about (its answer goes out at their QoS;
        #: one at a time), and the filters the next one is to ask about
        self._retained_asks: dict[int, list[str]] = {}
        self._ask_next: dict[str, None] = {}
        #: answers whose messages are still to be sent: [the tree of the filters asked that
        #: the client holds, events, the next, the filters asked, the ask]; the topics delivered live
        #: while an ask or an answer is in hand (None: none is)
        self._answering: deque[list] = deque()
        self._live: dict[str, int] | None = None  # topic -> the last ask sent then
        self._live_bytes = 0
        #: session acks that arose from the broker's own answers (QoS 0 deliveries taken):
        #: ``take_pending``
        self._pending: list = []
        self._early: list = []  # packets that came before the CONNACK, with their time
        self._early_bytes = 0
        #: events published and deliveries sent, for the broker's counters
        self.published = 0
        self.delivered = 0
        #: the time of day (ns) given with what came in last, bytes or the broker's messages
        self.now_ns = 0

    def start(self) -> list:
        """What the broker is asked first, the CONNACK waiting for its answer: a persistent
        session's open (made if it is new, with a subscription that matches nothing until
        the client has filters: a publisher's QoS 2 identifiers are kept by it too, §4.3.3);
        for a clean session, to discard the persistent session its client id had, if any
        (§3.1.2.4)."""
        if not self._discard and not self.persistent:
            self._connected(False)
            return []
        self._req += 1
        self._opening = self._req
        if self._discard:
            name = session_name(self.connect.client_id)
            return [m.SessionControl("discard", name, req=self._req)]
        if self._resume_only:
            return [self._open(None)]
        return [self._open(None, fallback=self._session_subs())]

    def _open(self, subs: list | None, req: int = 0, **more) -> m.SessionOpen:
        """The persistent session's open (request ``req``, else the last one numbered), with
        its expiry as this connection has it (one it only resumes: as it was, for it ends as
        the connection closes)."""
        more.setdefault("expiry", None if self._resume_only else float(self.expiry))
        if self._resume_only:  # (a reopen after a move too: never made, and it ends with us)
            more.update(create=False, ends=True)
        return m.SessionOpen(self.name, subs, req=req or self._req, **more)

    def take_pending(self) -> list:
        """GES messages that arose from the broker's answers (see ``_pending``)."""
        out, self._pending = self._pending, []
        return out

    # -- bytes in ------------------------------------------------------------------------------

    def receive_data(self, data: bytes, wall_ns: int = 0) -> list:
        """GES client messages for what ``data`` completes; ``wall_ns`` stamps publishes.

        Raises:
            Malformed: the client broke the protocol (close the connection, saying this).
        """
        self.reader.feed(data)
        return self.receive_packets(self.reader.packets(MAX_BATCH), wall_ns)

    @property
    def more(self) -> bool:
        """Whole packets wait beyond the last batch: ``receive_data(b"")`` takes the next."""
        return self.reader.more

    def receive_packets(self, packets: list, wall_ns: int = 0) -> list:
        """:meth:`receive_data` for packets already cut (those that came with the CONNECT)."""
        out: list = []
        self._batch_change = self._back = None
        self.now_ns = wall_ns
        for packet in packets:
            pkt = p.decode(packet, self.level)
            if self.connected:
                self._packet(pkt, wall_ns, out)
                continue
            # sent before the CONNACK (MQTT allows it): handled once the session is open
            self._early.append((pkt, wall_ns))
            self._early_bytes += len(packet.body) + EARLY_OVERHEAD
            if self._early_bytes > MAX_EARLY_BYTES:
                raise Malformed(f"over {MAX_EARLY_BYTES} bytes of packets before its CONNACK")
        return self._batch_done(out)

    def _packet(self, pkt, wall_ns: int, out: list) -> None:
        kind = type(pkt)
        if kind is p.Publish:
            if self._batch_change is not None:  # the filters' change so far goes before it:
                self._end_batch(out)  # (a later one is a request of its own, after it)
                self._back = None
            self._publish(pkt, wall_ns, out)
        elif kind is p.PubAck:
            if self._inflight.get(pkt.packet_id) == 1:  # else not ours, or acked before: tolerated
                del self._inflight[pkt.packet_id]
                self._delivered(pkt.packet_id)
                self._send_waiting()
        elif kind is p.PubRec:
            pid = pkt.packet_id
            if pkt.reason >= 0x80:  # 5.0: refused, and so done with: no PUBREL (§4.3.3)
                if self._inflight.get(pid) == 2:
                    del self._inflight[pid]
                    self._delivered(pid)
                    self._send_waiting()
                return
            if self._inflight.get(pid) == 2:
                del self._inflight[pid]
                self._released.add(pid)
                epoch = self._pid_epoch.get(pid)
                if epoch is not None and self._exists:  # PUBREL once the session owes it
                    self._to_owe.append(epoch)
                    return
            self._send(p.PubRel(pid))
        elif kind is p.PubComp:
            if pkt.packet_id in self._released:
                self._released.discard(pkt.packet_id)
                self._delivered(pkt.packet_id)
                epoch = self._owed.pop(pkt.packet_id, None)
                if epoch is not None:
                    self._to_paid.append(epoch)
            self._send_waiting()
        elif kind is p.PubRel:
            self._received_here.discard(pkt.packet_id)
            if self._received.pop(pkt.packet_id, None) is not None and self._exists:
                self._to_drop.append(pkt.packet_id)  # PUBCOMP once the session lets go of it
            else:
                self._send(p.PubComp(pkt.packet_id))
        elif kind is p.Subscribe:
            self._subscribe(pkt, out)
        elif kind is p.Unsubscribe:
            self._unsubscribe(pkt, out)
        elif kind is p.PingReq:
            self._send(p.PingResp())
        elif kind is p.Disconnect:  # 5.0: only reason 0 discards the will (§3.14.4)
            will = self.v5 and pkt.reason != p.SUCCESS
            if self.v5:
                self._leaving(pkt, out, will and self.connect.will is not None)
            self.closed = "disconnected with its will" if will else "disconnected"
        else:  # CONNECT again, or what only a server sends
            raise Malformed(f"a {kind.__name__.upper()} from a client that is connected")

    def _leaving(self, pkt: p.Disconnect, out: list, will: bool) -> None:
        """5.0: a DISCONNECT's Session Expiry Interval is the session's from now on, 0 ending it
        as the connection closes (§3.14.2.2.2, at most the topology's bound as at CONNECT); one
        over 0 when the CONNECT's was 0 is a protocol error, not a DISCONNECT (its will goes).
        With a ``will`` to go, it leaves with the will (:meth:`will`)."""
        interval = p.prop(pkt.props, p.SESSION_EXPIRY)
        if interval and (not self.persistent or self._resume_only):
            raise Malformed(
                "a DISCONNECT's Session Expiry Interval over 0 after a CONNECT's 0",
                p.PROTOCOL_ERROR,
            )
        if self._resume_only or interval is None or not self.persistent:
            return  # (one it only resumed ends as its client leaves: its replicator knows)
        if interval == 0:
            self._leave = m.SessionLeave(self.name, end=True)
        else:
            self._keep(interval)
            self._leave = m.SessionLeave(self.name, expiry=float(self.expiry))
        if not will:
            out.append(self._leave)
            self._leave = None  # (said: not again as the connection ends)

    def _keep(self, interval: int) -> None:
        """A Session Expiry Interval (CONNECT's or DISCONNECT's) as kept: at most the
        topology's bound, 0 for "as the topology says" when neither ends it."""
        kept = min(_seconds(interval), self._max_expiry)
        self.expiry = 0 if kept == float("inf") else kept

    def _publish(self, pkt: p.Publish, wall_ns: int, out: list) -> None:
        if pkt.qos == 2:
            acked = self._received.get(pkt.packet_id)
            if acked is not None:  # sent again: answered once the first is in the log
                if acked:
                    self._send(p.PubRec(pkt.packet_id))
                return
            if len(self._received) >= 65535:
                raise Malformed("over 65,535 QoS 2 messages not released")
        if (
            pkt.qos
            and self.v5
            and self._unanswered() >= v5.RECEIVE_MAX
            and not self._before_connack
        ):
            raise Malformed(
                f"over {v5.RECEIVE_MAX:,} QoS 1 and 2 PUBLISHes unanswered (its Receive Maximum)",
                p.RECEIVE_MAXIMUM_EXCEEDED,
            )
        if pkt.qos == 2:
            self._received[pkt.packet_id] = False
            self._received_here.add(pkt.packet_id)
        self._req += 1
        if pkt.qos:
            self._acks[self._req] = (pkt.qos, pkt.packet_id)
            self._qos1_unanswered += pkt.qos == 1
        topic = pkt.topic
        if self.v5 and pkt.props:
            topic = self._alias(pkt)
        attributes = {TOPIC_ATTR: topic, QOS_ATTR: pkt.qos}
        if pkt.retain:
            attributes[RETAIN_ATTR] = 1
        if self.v5:
            if not topic:
                raise Malformed("a PUBLISH with no topic name (and no topic alias)", 0x82)
            if pkt.props:
                v5.attributes_of(pkt.props, attributes)
            if self.origin:
                attributes[v5.ORIGIN_ATTR] = self.origin
        out.append(m.Publish(self._req, [m.Event(attributes, pkt.payload, wall_ns)]))
        self.published += 1

    def _unanswered(self) -> int:
        """What 5.0's Receive Maximum counts (``_qos1_unanswered``)."""
        return len(self._received_here) + self._qos1_unanswered

    def _alias(self, pkt: p.Publish) -> str:
        """The topic of a 5.0 PUBLISH with its Topic Alias (§3.3.2.3.4): a name with an alias
        sets it for this connection, an empty name takes the one set."""
        alias = p.prop(pkt.props, p.TOPIC_ALIAS)
        if alias is None:
            return pkt.topic
        if not 0 < alias <= v5.TOPIC_ALIAS_MAX:
            raise Malformed(f"a topic alias of {alias}, not 1-{v5.TOPIC_ALIAS_MAX}", 0x94)
        if pkt.topic:
            self._aliases[alias] = pkt.topic
            return pkt.topic
        topic = self._aliases.get(alias)
        if topic is None:
            raise Malformed(f"topic alias {alias} was not set on this connection", 0x82)
        return topic

    def will(self, wall_ns: int = 0) -> list:
        """The client's will, once (the connection ended without DISCONNECT): a GES publish, or
        a 5.0 persistent session's with a Will Delay Interval left with its replicator in a
        ``SessionLeave``, which publishes it once the delay has passed unless the session is
        opened again first, or once the session ends if that comes first (§3.1.3.2.2). A
        session that ends as its client goes (a Session Expiry Interval of 0) has it go now."""
        will = self.connect.will
        if will is None:
            return []
        self.connect = msgspec.structs.replace(self.connect, will=None)
        self._req += 1
        attributes = {TOPIC_ATTR: will.topic, QOS_ATTR: will.qos}
        if will.retain:
            attributes[RETAIN_ATTR] = 1
        if self.v5 and will.props:  # (the CONNECT's decoding took only a will's properties)
            v5.attributes_of(will.props, attributes)
        event = m.Event(attributes, will.message, wall_ns)
        leave = self._leave
        delay = p.prop(will.props, p.WILL_DELAY, 0) if self.v5 else 0
        if delay and self.persistent:
            if self.taken_over:  # its client is back already
                return []
            ending = self.session_ended or (leave is not None and leave.end)
            if self._exists and not ending:
                leave = leave or m.SessionLeave(self.name)
                return [msgspec.structs.replace(leave, will=event, will_delay=float(delay))]
        publish = m.Publish(self._req, [event])
        return [publish] if leave is None else [publish, leave]

    # -- the broker's answers ------------------------------------------------------------------

    def from_broker(self, msg, wall_ns: int = 0) -> None:
        """A message of the broker's for this client (``wall_ns``: the time of day now, which
        5.0's Message Expiry is counted against)."""
        self.now_ns = wall_ns
        kind = type(msg)
        if kind is m.Deliver:
            for item in msg.items:
                self._deliver(item.event)
        elif kind is m.PubAck:
            for seq in range(msg.seq - msg.seqs + 1, msg.seq + 1):
                self._published(seq)
            self._qos2_changes()
        elif kind is m.SessionKept:
            kept, owed, dropped = self._keeping.pop(msg.req, ((), (), ()))
            for packet_id in dropped:  # released here and there: PUBCOMP
                self._send(p.PubComp(packet_id))
            for packet_id in kept:
                if self._received.get(packet_id) is False:
                    self._received[packet_id] = True
                    self._send(p.PubRec(packet_id))
            for epoch in owed:  # the client has the message: the epoch is done
                packet_id = epoch_packet_id(epoch)
                if packet_id not in self._released:
                    continue
                if epoch < 0:  # the old replicator's (a move): owed since
                    if self._owed.get(packet_id) == epoch:
                        self._send(p.PubRel(packet_id))
                elif self._pid_epoch.get(packet_id) == epoch:
                    self._owed[packet_id] = epoch
                    self._send(p.PubRel(packet_id))
                    self._delivered(packet_id)
            if msg.req == self._whole:  # the changes meanwhile go now
                self._whole = None
                self._qos2_changes()
        elif kind is m.SubAck:
            for answer, _, retained in self._changes.pop(msg.req, ()):
                self._answer(answer, retained)
        elif kind is m.Retained:
            self._retained(msg)
        elif kind is m.SessionEvents:
            if msg.name == self.name:
                for item in msg.items:
                    self._stored(item)
        elif kind is m.SessionOpened:
            self._opened(msg)
        elif kind is m.SessionList:
            if msg.req and msg.req == self._opening and self._discard:  # discarded
                self._discarded()
        elif kind is m.SessionClosed:
            if msg.name == self.name:
                self._closed(msg)
        elif kind is m.Error:
            self._refused(msg)

    def _published(self, seq: int, refused: bool = False) -> None:
        answer = self._acks.pop(seq, None)
        if answer is None:
            return
        qos, packet_id = answer
        self._qos1_unanswered -= qos == 1
        if refused and self.v5:  # 5.0 can say so: not authorized, and no PUBREL follows
            self._received.pop(packet_id, None)
            self._received_here.discard(packet_id)
            ack = p.PubAck if qos == 1 else p.PubRec
            self._send(ack(packet_id, p.NOT_AUTHORIZED_5))
        elif qos == 1:
            self._send(p.PubAck(packet_id))
        elif packet_id in self._received:
            if self._exists:  # PUBREC once the session keeps the identifier, wherever it goes
                self._to_keep.append(packet_id)
                return
            self._received[packet_id] = True
            self._send(p.PubRec(packet_id))

    def _opened(self, msg: m.SessionOpened) -> None:
        if msg.name != self.name:  # answered after it connected without it (``_resume_only``)
            return
        self._exists = True
        whole = False
        if self.connected and self._store and msg.store != self._store:
            self._new_store(msg)  # whichever open brought it there
            whole = True
        elif self.connected and not self._store:  # made by the first filter
            self._store = msg.store
        if msg.req and msg.req in self._reopening:
            self._moved(msg, whole)
            return
        self._replayed_to = max(self._replayed_to, msg.last)
        self._started_to = max(self._started_to, msg.sent)
        if msg.req == self._opening:  # the CONNACK's: the filters it kept come back
            self._opening = 0
            self._store = msg.store
            self._moving, self._moves = "", 0
            # and the QoS 2 messages it published and did not release: not published again;
            # and the PUBRELs it is owed: sent again (§4.4), the messages not
            self._received = dict.fromkeys(msg.qos2, True)
            self._owed = {epoch_packet_id(epoch): epoch for epoch in msg.rel}
            self._released = set(self._owed)
            self._had = {e for e in msg.rel if e > 0}  # replayed, they are not sent again
            self._kept_filters(msg)
            self._acked = self._sent_epoch = msg.start
            self._connected(not msg.created)
            for packet_id in self._owed:
                self._send(p.PubRel(packet_id))
            return
        for answer, _, retained in self._changes.pop(msg.req, ()):
            self._answer(answer, retained)

    def _discarded(self) -> None:
        """The old session is no more: connected, or (5.0, Clean Start with a Session Expiry
        Interval) a new persistent one is opened."""
        self._discard = False
        self._opening = 0
        if not self.persistent:
            self._connected(False)
            return
        self._req += 1
        self._opening = self._req
        self._pending.append(self._open(None, fallback=self._session_subs()))

    def _without_session(self) -> None:
        """5.0, no Clean Start and a Session Expiry Interval of 0, and no session to resume
        (or none that can be found now): connected without one, as a clean session is."""
        self._opening = 0
        self._resume_only = self.persistent = False
        self.name = ""
        self._connected(False)

    def _connected(self, present: bool) -> None:
        props = (
            v5.connack_props(self.max_packet, self.assigned, self._granted, self.server_keepalive)
            if self.v5
            else ()
        )
        self._send(p.ConnAck(p.ACCEPTED, present, props))
        self.connected = True

    def _connack(self, code: int) -> p.ConnAck:
        """A refusing CONNACK, its code as the client's protocol level says it."""
        return p.ConnAck(p.CONNACK_5[code] if self.v5 else code)

    def release_early(self) -> list:
        """Once connected: the GES messages of the packets that came before the CONNACK (the
        runtime asks from its reading task, so they go through the broker as any request)."""
        out: list = []
        self._batch_change = self._back = None
        early, self._early = self._early, []
        self._before_connack = True  # (its Receive Maximum was not said yet: not checked)
        try:
            for pkt, wall_ns in early:
                self._packet(pkt, wall_ns, out)
        finally:
            self._before_connack = False
        return self._batch_done(out)

    def _batch_done(self, out: list) -> list:
        """``out`` with what a batch of packets asks at its end: the filters' change, the
        QoS 2 identifiers', and the session acks that arose."""
        self._end_batch(out)
        self._qos2_changes()
        if self._pending:
            out += self.take_pending()
        return out

    def _refused(self, msg: m.Error) -> None:
        """A request refused (a publish or filters not allowed, a profile over the bounds)."""
        if msg.req and msg.req in self._reopening:  # where it moved, it may not be opened
            self._lost(msg.reason, False)
            return
        if msg.req and msg.req == self._opening:
            if self._discard:  # not discarded (another's, say): not this one's to end
                self._discarded()
                return
            if self._resume_only and not msg.denied:  # none to resume: a clean one
                self._without_session()
                return
            self._opening = 0
            if msg.denied:
                self._send(self._connack(p.NOT_AUTHORIZED))
                self.closed = f"durable session {self.name}: {msg.reason}"
            else:  # its replicator did not make it (full, say): the first filter tries again
                self._connected(False)
            return
        if self._asked_retained(msg.req) is not None:
            if not self._answering and not self._retained_asks:
                self._live = None
            return  # nothing retained is sent (its replicator is unreachable, say)
        if msg.req in self._acks:
            # MQTT 3.1.1 cannot refuse a PUBLISH: it is acknowledged and dropped (the broker
            # logged why), as mosquitto does with what its ACL denies
            self._published(msg.req, refused=True)
            self._qos2_changes()
            return
        self._change_refused(msg)

    # -- bytes out -----------------------------------------------------------------------------

    def _send(self, pkt) -> None:
        self._out += p.encode(pkt, self.level)

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out
