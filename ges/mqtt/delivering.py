"""The deliveries an MQTT session sends its client: sans-I/O, a part of
:class:`ges.mqtt.session.MqttSession` (the connection's state is the session's).

A delivery goes out at the lower of its publisher's QoS and the highest QoS of the filters it
matches (a persistent session's replicator says which subscriptions it matched; a clean
session's broker matched it, and the filters are matched again only when their QoS differ or
a change of them is unanswered). QoS 0 is written at once; QoS 1 and 2 get packet identifiers
(a persistent session's from its epoch, the same at any broker) and at most ``max_inflight``
are unacknowledged, the rest waiting in order, QoS 0 behind them too. A persistent session's
epochs are acknowledged to its replicator once the client has every one up to it
(``SessionAck``, cumulative: one per batch of PUBACKs).
"""

from __future__ import annotations

from ges.matching.model import RETAIN_ATTR, TOPIC_ATTR
from ges.matching.topics import TopicTree
from ges.mqtt import packets as p
from ges.mqtt import v5
from ges.wire import messages as m

#: The reserved attribute carrying a PUBLISH's QoS.
QOS_ATTR = "@qos"
#: What a delivery waiting for an identifier costs beyond its topic and payload (its packet
#: value, its place in the queue, the event it keeps alive).
WAITING_OVERHEAD = 256
#: A PUBLISH's topic name when its Topic Alias says it (5.0).
NO_TOPIC = b"\x00\x00"
#: A persistent session's subscription that matches nothing (it has no filters left).
NO_SUB = 9
#: A persistent session's subscriptions are one per QoS granted and 5.0 options (the option
#: bits and the Subscription Identifier, ``ges.mqtt.v5.ID_SHIFT``): its sub_id is
#: ``1 + qos + OPTIONS_STEP * (options >> 2)`` (1–3 with none, as before there were any), so
#: the session keeps them wherever it resumes.
OPTIONS_STEP = 16


def sub_id_of(qos: int, options: int) -> int:
    """A persistent session's subscription for filters of ``qos`` and 5.0 ``options`` bits."""
    return 1 + qos + OPTIONS_STEP * (options >> 2)


def qos_options(sub_id: int) -> tuple[int, int]:
    """The QoS and 5.0 option bits a persistent session's subscription stands for."""
    n = sub_id - 1
    return n % OPTIONS_STEP, (n // OPTIONS_STEP) << 2


#: What a connection with 5.0 options remembers of the deliveries' QoS, RETAIN and
#: identifiers by topic (of at most MATCHED_CHARS characters), in bytes: each topic's
#: characters, its identifiers' bytes and MATCHED_OVERHEAD.
MATCHED_BYTES = 64 * 1024
MATCHED_CHARS = 256
MATCHED_OVERHEAD = 256


def identifiers(ids) -> bytes:
    """Subscription Identifiers as a PUBLISH's properties (``p.RAW_PROPS``), in order."""
    return p.props_bytes(tuple((p.SUBSCRIPTION_ID, i) for i in sorted(ids))) if ids else b""


def matched(found: list, own: bool, retained: bool) -> tuple[int, bool, bytes]:
    """What the filters a delivery matched (``found``: their QoS and options, as the filter
    tree holds them) say of it: its QoS (-1: none of them takes it — No Local, and ``own``,
    the client's own), its RETAIN (``retained``, and a filter's Retain As Published), and its
    Subscription Identifiers, each once, encoded."""
    if own:
        found = [value for value in found if not value & v5.NO_LOCAL]
    if not found:
        return -1, False, b""
    retain = retained and any([value & v5.RETAIN_AS_PUBLISHED for value in found])
    ids = {value >> v5.ID_SHIFT for value in found}
    ids.discard(0)
    return max([value & 3 for value in found]), retain, identifiers(ids)


def _raw(props: tuple) -> int:
    """The bytes of a delivery's identifiers (counted while it waits)."""
    return len(props[-1][1]) if props and props[-1][0] == p.RAW_PROPS else 0


def epoch_packet_id(epoch: int) -> int:
    """A persistent session's delivery's identifier: its epoch's, so that a broker the
    session moves to sends it again with the one the client had (§4.3.3). A negative epoch
    is one of a replicator the session was handed over from, its PUBREL still owed."""
    return abs(epoch) % 65535 + 1


class Delivering:
    """The deliveries half of :class:`ges.mqtt.session.MqttSession` (see the module
    docstring)."""

    def _deliver(self, event: m.Event) -> None:
        topic = event.attributes.get(TOPIC_ATTR)
        if type(topic) is not str:
            return  # not for MQTT (every filter tests @topic: never happens)
        tree = self._filter_tree()
        granted = None if self._changes else self._one_qos  # (a change unanswered: match)
        if self._options:
            granted = 0  # (5.0's option bits: _with_options matches)
        elif granted is None:
            found: list = []
            tree.match(topic, found)
            granted = max(found, default=-1)
            if granted < 0:
                return  # a filter just removed
        if self._live is not None:
            self._live_topic(topic)
        self._out_publish(topic, event, granted, None)

    def _filter_tree(self) -> TopicTree:
        """The filters by their levels, each with its QoS (and 5.0's options)."""
        tree = self._tree
        if tree is None:
            self._matched.clear()
            self._matched_bytes = 0
            tree = self._tree = TopicTree()
            options = self._options
            for f, qos in self.filters.items():
                tree.add(f, qos | options.get(f, 0) if options else qos)
            qos = set(self.filters.values())
            self._one_qos = qos.pop() if len(qos) == 1 else None
        return tree

    def _stored(self, item: m.SessionItem) -> None:
        """An event of the persistent session: delivered once per epoch, acknowledged to the
        replicator once the client has it and every one before it."""
        epoch = item.epoch
        if epoch <= self._sent_epoch:
            return  # sent on this connection already (a change of filters opened it again)
        self._sent_epoch = epoch
        self._epochs.append(epoch)
        event = item.item.event
        topic = event.attributes.get(TOPIC_ATTR)
        granted = max(((s - 1) % OPTIONS_STEP for s in item.subs if s != NO_SUB), default=-1)
        if item.gap_to or type(topic) is not str or granted < 0 or epoch in self._had:
            # a gap notice MQTT cannot say, nothing for MQTT, or what the client has (PUBREC)
            self._done(epoch)
            return
        if self._live is not None:
            self._live_topic(topic)
        self._out_publish(topic, event, granted, epoch)

    def _out_publish(
        self,
        topic: str,
        event: m.Event,
        granted: int,
        epoch: int | None,
        retain: bool = False,
        ids: bytes = b"",
    ) -> None:
        """A delivery of ``event`` at QoS ``granted`` (or lower, as its publisher's), with
        RETAIN set if ``retain`` (a retained one, with its filters' Subscription Identifiers
        ``ids``, encoded: ``identifiers``); ``epoch``: its persistent session's."""
        if self._options and not retain:  # 5.0's options and identifiers
            granted, retain, ids = self._with_options(topic, event, granted)
        field = p.topic_field(topic)
        if granted < 0 or field is None:
            if epoch is not None:  # a GES publisher's @topic MQTT cannot carry: skipped
                self._done(epoch)
            return
        attributes = event.attributes
        published = attributes.get(QOS_ATTR, 2)
        qos = min(granted, published if type(published) is int and published >= 0 else 2)
        expiry = attributes.get(v5.EXPIRY_ATTR)
        expires = 0  # the time of day its Message Expiry Interval ends (0: none)
        if type(expiry) is int and 0 <= expiry <= p.MAX_U32 and event.published_at > 0:
            # from its publish, or from now if its publisher's clock is ahead of this one's
            since = min(event.published_at, self.now_ns) if self.now_ns else event.published_at
            expires = since + expiry * 1_000_000_000
        props = v5.props_of(attributes) if self.v5 else ()
        if ids and self.v5:
            props = (*props, (p.RAW_PROPS, ids))
        dup = qos > 0 and epoch is not None and epoch <= self._replayed_to
        payload = event.payload
        if self.max_out:  # over what the client takes: not sent (5.0 §3.1.2.11.4)
            frame = bytearray()
            sized = (*props, (p.MESSAGE_EXPIRY, 1)) if expires else props  # as it would go
            p.write_publish(frame, field, payload, qos, retain, dup, 1, sized, self.v5)
            if len(frame) > self.max_out:
                if epoch is not None:
                    self._done(epoch)
                return
        if self._waiting or (qos and not self._room(epoch)):
            # in order: QoS 0 too waits behind them
            self._waiting.append((field, payload, qos, retain, dup, props, epoch, expires))
            self.waiting_bytes += len(payload) + len(field) + WAITING_OVERHEAD + _raw(props)
        else:
            self._send_one(field, payload, qos, retain, dup, props, epoch, expires)

    def _with_options(self, topic: str, event: m.Event, granted: int) -> tuple[int, bool, bytes]:
        """The QoS, RETAIN and Subscription Identifiers (encoded) of a delivery, as the filters
        it matches say with their No Local (not what this client published) and Retain As
        Published bits and their identifiers (each once, §3.3.4). Remembered by topic (short
        ones, MATCHED_BYTES of them) until the filters change: a topic that many filters
        match costs one pass over them, not one a delivery."""
        tree = self._filter_tree()  # (a new one forgets what was remembered)
        own = event.attributes.get(v5.ORIGIN_ATTR) == self.origin and bool(self.origin)
        retained = event.attributes.get(RETAIN_ATTR) == 1
        key = (topic, own, retained)
        known = self._matched.get(key)
        if known is not None:
            return known
        found: list = []
        tree.match(topic, found)
        known = matched(found, own, retained)
        cost = len(topic) + len(known[2]) + MATCHED_OVERHEAD
        if len(topic) <= MATCHED_CHARS and cost <= MATCHED_BYTES:
            if self._matched_bytes + cost > MATCHED_BYTES:
                self._matched.clear()
                self._matched_bytes = 0
            self._matched[key] = known
            self._matched_bytes += cost
        return known

    def _room(self, epoch: int | None) -> bool:
        if self.inflight >= self.max_inflight:
            return False
        if epoch is None:
            return True
        pid = epoch_packet_id(epoch)
        return pid not in self._inflight and pid not in self._released

    def _send_one(
        self,
        field: bytes,
        payload: bytes,
        qos: int,
        retain: bool,
        dup: bool,
        props: tuple,
        epoch: int | None,
        expires: int = 0,
    ) -> None:
        """A delivery out, written as bytes; one of QoS 1 or 2 held under its identifier. One
        whose Message Expiry Interval has passed is not sent (5.0 §3.3.2.3.3), one that goes
        carries what is left of it."""
        if expires:
            if self._expired(epoch, expires):
                if epoch is not None:
                    self._done(epoch)
                return
            if self.v5:
                left = expires - self.now_ns
                props = (*props, (p.MESSAGE_EXPIRY, max(1, -(-left // 1_000_000_000))))
        self.delivered += 1
        pid = 0
        if qos:
            if epoch is not None:  # the same identifier whichever broker sends it again
                pid = epoch_packet_id(epoch)
                self._pid_epoch[pid] = epoch
            else:
                while True:
                    self._next_id = self._next_id % 65535 + 1
                    if self._next_id not in self._inflight and self._next_id not in self._released:
                        break
                pid = self._next_id
            self._inflight[pid] = qos
        if self._alias_max:
            field, props = self._aliased(field, payload, qos, props)
        p.write_publish(self._out, field, payload, qos, retain, dup, pid, props, self.v5)
        if not qos and epoch is not None:
            self._done(epoch)

    def _aliased(self, field: bytes, payload: bytes, qos: int, props: tuple) -> tuple[bytes, tuple]:
        """5.0 §3.3.2.3.4: a delivery's topic as an alias the client was told of on this
        connection (no topic name), or told of now (the name and the alias); the least
        recently used alias is set to a new topic once all are taken. A topic over
        ``v5.ALIASED_BYTES``, or one as short as an alias, goes as it is, and so does one whose
        packet would not fit the client's Maximum Packet Size with an alias property added."""
        aliases = self._aliases_out
        alias = aliases.pop(field, None)
        if alias is not None:
            aliases[field] = alias  # (the most recently used now)
            return NO_TOPIC, (*props, (p.TOPIC_ALIAS, alias))
        if not 4 < len(field) <= v5.ALIASED_BYTES + 2:
            return field, props
        if self.max_out:  # (a new topic's: rare, so measured as it would go)
            frame = bytearray()
            told = (*props, (p.TOPIC_ALIAS, 65535))
            p.write_publish(frame, field, payload, qos, False, False, 1, told, True)
            if len(frame) > self.max_out:
                return field, props
        if len(aliases) < self._alias_max:
            alias = len(aliases) + 1
        else:
            alias = aliases.pop(next(iter(aliases)))
        aliases[field] = alias
        return field, (*props, (p.TOPIC_ALIAS, alias))

    def _send_waiting(self) -> None:
        waiting = self._waiting
        while waiting and (
            not waiting[0][2] or self._room(waiting[0][6]) or self._expired(*waiting[0][6:])
        ):
            delivery = waiting.popleft()
            self.waiting_bytes -= (
                len(delivery[1]) + len(delivery[0]) + WAITING_OVERHEAD + _raw(delivery[5])
            )
            self._send_one(*delivery)

    def _expired(self, epoch: int | None, expires: int) -> bool:
        """The delivery's Message Expiry Interval is over and it had not begun (one streamed
        to the client before it left goes again): it is not sent, and one waiting leaves the
        queue without waiting for room."""
        begun = epoch is not None and epoch <= self._started_to
        return 0 < expires <= self.now_ns and not begun

    def _delivered(self, pid: int) -> None:
        epoch = self._pid_epoch.pop(pid, None)
        if epoch is not None:
            self._done(epoch)

    def _done(self, epoch: int) -> None:
        """The client has the delivery of ``epoch``: the session's acknowledged epoch moves
        on past every delivery done from the oldest (SessionAck is cumulative)."""
        epochs, done = self._epochs, self._done_epochs
        done.add(epoch)
        acked = self._acked
        while epochs and epochs[0] in done:
            acked = epochs.popleft()
            done.discard(acked)
        if acked != self._acked:
            self._acked = acked
            pending = self._pending
            if pending and type(pending[-1]) is m.SessionAck:  # one per batch of PUBACKs
                pending[-1] = m.SessionAck(self.name, acked)
            else:
                pending.append(m.SessionAck(self.name, acked))

    @property
    def inflight(self) -> int:
        return len(self._inflight) + len(self._released)
