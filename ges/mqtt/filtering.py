"""An MQTT client's topic filters: sans-I/O, a part of :class:`ges.mqtt.session.MqttSession`
(the connection's state is the session's).

SUBSCRIBE and UNSUBSCRIBE change the filters at once and ask the broker for them as they now
are: a clean session's one GES subscription (``SUB_ID``, a disjunction of ``@topic topic F``
conjunctions), or a persistent session's subscriptions, one per kind of filter — its QoS
granted and 5.0 options: option bits and Subscription Identifier (``sub_id_of``) — in its
``SessionOpen``, at most ``MAX_SESSION_SUBS`` of them whatever the broker refuses. The changes of one batch of packets are one request;
the SUBACK or UNSUBACK goes once the broker has the change, and a refused change is undone
(only what it did). A granted filter then gets what is retained on it (§3.3.1.3), asked of the
broker one ``RetainedAsk`` at a time (an answer may be megabytes); an answer's messages become
PUBLISHes ``RETAINED_STEP`` at a time, one step per turn of the driver (``retained_more``).
"""

from __future__ import annotations

from collections import Counter

from ges.durable.profiles import MAX_SESSION_SUBS
from ges.matching.model import TOPIC_ATTR
from ges.matching.topics import TopicTree
from ges.mqtt import packets as p
from ges.mqtt import v5
from ges.mqtt.delivering import NO_SUB, matched, qos_options, sub_id_of
from ges.mqtt.frames import Malformed
from ges.wire import messages as m

#: The GES subscription holding a clean session's filters.
SUB_ID = 1
#: Retained messages of an answer turned into PUBLISHes in one step (~1 ms).
RETAINED_STEP = 256
#: Topics remembered as delivered live while what is retained is asked or sent (the answer's
#: older messages for them are skipped); past this many, or these bytes, no more are.
MAX_LIVE_TOPICS = 16_384
MAX_LIVE_BYTES = 1 << 20
LIVE_OVERHEAD = 100


def _profile_name(sub_id: int) -> str:
    """A persistent session's subscription's name, as ``ges clients`` lists it."""
    qos, options = qos_options(sub_id)
    flags = "-nolocal" * bool(options & v5.NO_LOCAL) + "-rap" * bool(
        options & v5.RETAIN_AS_PUBLISHED
    )
    ident = options >> v5.ID_SHIFT
    return f"mqtt-qos{qos}{flags}" + (f"-id{ident}" if ident else "")


def _less(kinds: Counter, kind: int) -> None:
    """One filter fewer of ``kind``."""
    kinds[kind] -= 1
    if kinds[kind] <= 0:
        del kinds[kind]


class Filtering:
    """The filters half of :class:`ges.mqtt.session.MqttSession` (see the module docstring)."""

    @property
    def _kept(self) -> dict[str, int]:
        """The filters' 5.0 options (bits and identifier) as this connection has them: applied
        (5.0: ``_options``), or kept for the session only (3.1.1: ``_kept_options``)."""
        return self._options if self.v5 else self._kept_options

    def _subscribe(self, pkt: p.Subscribe, out: list) -> None:
        ident = self._identifier(pkt) if pkt.props else 0
        undo: dict = {}
        codes = []
        retained: dict[str, None] = {}
        kept = self._kept
        combos = self._kinds_counted() if self.persistent else Counter()
        back = self._kinds_back() if self.persistent else False
        for f, options in pkt.filters:
            qos = options & 3
            if self.v5 and f.startswith(v5.SHARED_PREFIX):
                codes.append(p.SHARED_NOT_SUPPORTED)
                continue
            if f not in self.filters and len(self.filters) >= self.max_filters:
                codes.append(p.QUOTA_EXCEEDED if self.v5 else p.SUBSCRIBE_FAILED)
                continue
            # 5.0: its No Local and Retain As Published bits and its identifier; 3.1.1
            # subscribing again: neither
            flags = options & (v5.NO_LOCAL | v5.RETAIN_AS_PUBLISHED) | ident << v5.ID_SHIFT
            flags = flags if self.v5 else 0
            had = self.filters.get(f)
            if self.persistent:
                combo = sub_id_of(qos, flags)
                old = None if had is None else sub_id_of(had, kept.get(f, 0))
                if back is False:  # only this batch's change can be refused, all of it
                    frees = old is not None and old != combo and combos[old] == 1
                    fits = combo in combos or len(combos) - frees < MAX_SESSION_SUBS
                else:  # what refusals may bring back counts as held
                    fits = len(combos.keys() | back | {combo}) <= MAX_SESSION_SUBS
                if not fits:
                    codes.append(p.QUOTA_EXCEEDED if self.v5 else p.SUBSCRIBE_FAILED)
                    continue
                if old is not None:
                    _less(combos, old)
                    if back is not False:
                        back.add(old)
                combos[combo] += 1
            if f not in undo:
                undo[f] = None if had is None else (had, kept.get(f, 0))
            # once granted, what is retained on it follows (§3.3.1.3), again for a filter it
            # had (§3.8.4) unless 5.0's Retain Handling says only for a new one, or never
            handling = options >> 4
            if handling == 0 or (handling == 1 and undo[f] is None):
                retained[f] = None
            self.filters[f] = qos
            if flags:
                kept[f] = flags
            else:
                kept.pop(f, None)
            codes.append(qos)
        self._change(p.SubAck(pkt.packet_id, tuple(codes)), undo, out, list(retained))

    def _kinds_counted(self) -> Counter:
        """A persistent session's filters by kind (QoS and options: ``sub_id_of``), each kind
        one of its subscriptions, of which it holds at most ``MAX_SESSION_SUBS``; kept up to
        date by each change (a read of many SUBSCRIBEs counts its filters once)."""
        if self._kinds is None:
            kept = self._kept
            self._kinds = Counter(sub_id_of(q, kept.get(f, 0)) for f, q in self.filters.items())
        return self._kinds

    def _kinds_back(self) -> set[int] | bool:
        """The kinds refusals of the changes still unanswered may bring back (their undo):
        counted as held beside the filters' own, so that no refusal, of any of them, leaves
        more than ``MAX_SESSION_SUBS``. False while no change before this batch's is
        unanswered: this batch's, refused, is undone whole, so what it frees may be taken.
        Worked out as a batch of packets begins, and this batch's own added as it goes."""
        if self._back is None:  # (None again as each batch begins)
            batch = None if self._batch_change is None else self._batch_change[0]
            earlier = [changes for req, changes in self._changes.items() if req != batch]
            self._back = bool(earlier) and {
                sub_id_of(*before)
                for changes in earlier
                for _, undo, _ in changes
                for before in undo.values()
                if before is not None
            }
        return self._back

    def _identifier(self, pkt: p.Subscribe) -> int:
        """A 5.0 SUBSCRIBE's Subscription Identifier (0: none).

        Raises:
            Malformed: one of 0, or two of them (§3.8.2.1.2).
        """
        ids = [value for pid, value in pkt.props if pid == p.SUBSCRIPTION_ID]
        if len(ids) > 1:
            raise Malformed("a SUBSCRIBE with two subscription identifiers", p.PROTOCOL_ERROR)
        if ids and not 0 < ids[0] <= v5.MAX_SUBSCRIPTION_ID:
            raise Malformed(f"a SUBSCRIBE with subscription identifier {ids[0]}", p.PROTOCOL_ERROR)
        return ids[0] if ids else 0

    def _change(self, answer, undo: dict, out: list, retained: list[str]) -> None:
        """Ask the broker for the filters as they now are; the changes of one batch of packets
        go as one request (a client's thousand SUBSCRIBEs in one read are one profile).
        ``retained``: the filters to send what is retained on once the answer is sent."""
        if not undo and not self._changes:  # nothing changed, nothing before it unanswered
            self._answer(answer, retained)
            return
        self._tree = None
        if self._batch_change is not None:
            req, at = self._batch_change
            if at < len(out) and out[at] is None:  # made once the batch is read
                self._changes[req].append((answer, undo, retained))
                return
        self._req += 1
        if self.persistent and not (self.filters or self._exists):
            self._answer(answer, retained)  # nothing to keep and nothing kept: nothing to ask
            return
        self._changes[self._req] = [(answer, undo, retained)]
        self._batch_change = (self._req, len(out))
        out.append(None)  # the request, made at the end of the batch (_end_batch)

    def _end_batch(self, out: list) -> list:
        if self._batch_change is not None:
            req, at = self._batch_change
            self._batch_change = None
            if at < len(out) and out[at] is None:
                out[at] = self._change_message(req)
        return out

    def _change_message(self, req: int):
        if self.persistent:
            return self._open(self._session_subs(), req)
        if self.filters:
            conjunctions = [[m.Constraint(TOPIC_ATTR, "topic", f)] for f in self.filters]
            return m.Subscribe(SUB_ID, conjunctions, req=req)
        return m.Unsubscribe(SUB_ID, req=req)

    def _session_subs(self) -> list[m.SessionSub]:
        """The filters as a durable session's subscriptions: one per QoS granted and 5.0
        options (``sub_id_of``), so a stored event's matched subscriptions say its QoS and the
        session keeps its No Local, Retain As Published and Subscription Identifiers wherever
        it resumes; none left, one that matches nothing (a session holds at least one)."""
        by_sub: dict[int, list] = {}
        options = self._kept
        for f, qos in self.filters.items():
            sub_id = sub_id_of(qos, options.get(f, 0))
            by_sub.setdefault(sub_id, []).append([m.Constraint(TOPIC_ATTR, "topic", f)])
        if not by_sub:
            nothing = [m.Constraint(TOPIC_ATTR, "eq", ""), m.Constraint(TOPIC_ATTR, "ne", "")]
            return [m.SessionSub(NO_SUB, "mqtt-none", [nothing])]
        return [m.SessionSub(s, _profile_name(s), c) for s, c in sorted(by_sub.items())]

    def _unsubscribe(self, pkt: p.Unsubscribe, out: list) -> None:
        undo = {}
        kept = self._kept
        back = self._kinds_back() if self.persistent else False
        for f in pkt.filters:
            if f in self.filters:
                undo[f] = (self.filters.pop(f), kept.pop(f, 0))
                if self._kinds is not None:
                    _less(self._kinds, sub_id_of(*undo[f]))
                if back is not False:
                    back.add(sub_id_of(*undo[f]))
        if undo and self._answering:  # §3.10.4: what is retained on them goes no more
            for entry in self._answering:
                entry[0] = self._answer_tree(entry[3])
        codes = ()
        if self.v5:  # §3.11.3: whether each was there
            codes = tuple(p.SUCCESS if f in undo else p.NO_SUBSCRIPTION for f in pkt.filters)
        self._change(p.UnsubAck(pkt.packet_id, codes), undo, out, [])

    def _kept_filters(self, msg: m.SessionOpened) -> None:
        """The filters a persistent session kept, as its open's answer says, are the
        client's (with their 5.0 options: kept, not applied, on a 3.1.1 connection)."""
        self._tree = self._kinds = None
        self.filters, self._options, self._kept_options = {}, {}, {}
        kept = self._kept
        for (sub_id, _), conjs in zip(msg.subs, msg.profiles, strict=False):
            if sub_id == NO_SUB:
                continue
            qos, options = qos_options(sub_id)
            for conj in conjs:
                self.filters[conj[0].value] = qos
                if options:
                    kept[conj[0].value] = options

    def _change_refused(self, msg: m.Error) -> None:
        """The filters' change ``msg`` refuses is undone, and answered as failed."""
        changes = self._changes.pop(msg.req, None) if msg.req else None
        if changes is None:
            return
        kept = self._kept
        for _, undo, _ in reversed(changes):  # only what these changes did is undone
            for f, before in undo.items():
                kept.pop(f, None)
                if before is None:
                    self.filters.pop(f, None)
                else:
                    self.filters[f] = before[0]
                    if before[1]:
                        kept[f] = before[1]
        self._tree = self._kinds = None
        for answer, _, _ in changes:
            if type(answer) is p.SubAck:
                code = p.NOT_AUTHORIZED_5 if self.v5 and msg.denied else p.SUBSCRIBE_FAILED
                answer = p.SubAck(answer.packet_id, (code,) * len(answer.codes))
            self._send(answer)

    def _answer(self, answer, retained: list[str]) -> None:
        """A SUBACK or UNSUBACK goes; then the ask for what is retained on the filters a
        SUBSCRIBE was granted (a session request: ``take_pending``)."""
        self._send(answer)
        if retained:
            self._ask_retained(retained)

    def _ask_retained(self, filters: list[str]) -> None:
        """Ask what is retained on ``filters``: one ask at a time (an answer may be megabytes),
        the filters of SUBSCRIBEs meanwhile joining the next."""
        if self._retained_asks:
            waiting = self._ask_next
            waiting.update(dict.fromkeys(filters))
            if len(waiting) > len(self.filters):  # those still held, and so bounded
                self._ask_next = dict.fromkeys(f for f in waiting if f in self.filters)
            return
        self._req += 1
        self._retained_asks[self._req] = filters
        self._pending.append(m.RetainedAsk(filters, req=self._req))
        if self._live is None:
            self._live, self._live_bytes = {}, 0

    def _asked_retained(self, req: int) -> list[str] | None:
        """The filters ask ``req`` was for (None: not one); the next ask goes."""
        asked = self._retained_asks.pop(req, None)
        if asked is not None and self._ask_next:
            waiting = [f for f in self._ask_next if f in self.filters]
            self._ask_next = {}
            if waiting:
                self._ask_retained(waiting)
        return asked

    def _retained(self, msg: m.Retained) -> None:
        """What is retained on the filters asked: sent with RETAIN set, each at the highest
        QoS of those filters it matches that the client still holds."""
        asked = self._asked_retained(msg.req)
        if not asked:
            return
        self._answering.append([self._answer_tree(asked), msg.events, 0, asked, msg.req])
        self.retained_step()

    def _answer_tree(self, asked: list[str]) -> TopicTree:
        """The filters of an answer's ask that the client still holds, for its messages."""
        tree = TopicTree(remember=False)  # for this answer only
        for f in asked:
            qos = self.filters.get(f)
            if qos is not None:
                tree.add(f, qos | self._options.get(f, 0))
        return tree

    def _live_topic(self, topic: str) -> None:
        """A live message on ``topic`` goes to the client while what is retained is asked or
        sent: the answers to the asks sent so far must not follow it with theirs for it, older
        (the client would keep that); a later ask's answer may (it was asked after)."""
        live = self._live  # (not None: the callers look first, on every delivery)
        if topic not in live:
            if len(live) >= MAX_LIVE_TOPICS or self._live_bytes >= MAX_LIVE_BYTES:
                return
            self._live_bytes += len(topic) + LIVE_OVERHEAD
        live[topic] = self._req

    @property
    def retained_more(self) -> bool:
        """Retained messages of an answer are still to be sent: :meth:`retained_step` sends
        the next of them (the driver calls it at its next turn)."""
        return bool(self._answering)

    def retained_step(self) -> None:
        """Up to RETAINED_STEP more retained messages of the answers in hand become PUBLISHes
        (an answer may hold thousands: turned into packets at once, one held a broker for
        tens of milliseconds)."""
        budget = RETAINED_STEP
        answering = self._answering
        live = self._live or {}
        while answering and budget > 0:
            entry = answering[0]
            tree, events, i, _, req = entry
            j = min(len(events), i + budget)
            budget -= j - i
            for event in events[i:j]:
                topic = event.attributes.get(TOPIC_ATTR)
                if type(topic) is not str or live.get(topic, 0) >= req:
                    continue
                found: list = []
                tree.match(topic, found)
                if found:
                    granted, _, ids = matched(found, False, False)
                    self._out_publish(topic, event, granted, None, retain=True, ids=ids)
            if j < len(events):
                entry[2] = j
            else:
                answering.popleft()
        if not answering and not self._retained_asks:
            self._live = None
