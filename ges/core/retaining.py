"""A replicator's retained messages: its standing subscription to them, keeping the last per
topic, and answering what is retained on a subscriber's filters (ges.durable.retained has the
theory of operation).

A restarted replicator catches up on what was retained while it was down as it does for its
sessions (ges.core.readback, seed 004 §4): its standing subscription is one of the restored
subscriptions the read-back waits for, every page read back from a pubend's log is offered to
the retained set, and this broker acknowledges no tick of a pubend above the retained
changes its store has made durable — so the pubends' logs keep whatever a crash could lose.
Offering is idempotent and the set is a last-writer-wins register, so events read back, live
ones and those of other pubends may come in any order.
"""

from __future__ import annotations

from collections import deque

from ges.core.outputs import Notice, ToClient
from ges.durable.retained import RETAINED_PROFILE, RetainedSet
from ges.matching.topics import check_filter
from ges.wire import messages as m

#: The connection number of the replicator's own subscription to retained events (a session's
#: own are ``-key``; no session has this key).
RETAINED_CONN = -(1 << 40)
#: Filters one ask may name (an MQTT SUBSCRIBE's, whose filters a client holds at most 1,024).
MAX_ASK_FILTERS = 1024


class Retaining:
    """The retained messages of :class:`ges.core.replicator.Replicator` (``self.retained``)."""

    def _retained_start(self) -> list:
        """Read the kept messages back and enter the standing subscription (in a network
        that serves MQTT: some broker of the topology has an ``mqtt_port``); the outputs. A
        replicator that ran before (it kept something, or its broker acknowledged ticks) reads
        the logs back once the subscription is in place, as for restored sessions."""
        self.retained = RetainedSet()
        for kept in self.store.retained():
            self.retained.load(kept)
        if not any(spec.mqtt_port for spec in self.topology.brokers.values()):
            return []
        self.subscriptions.client_open(RETAINED_CONN, "retained messages")
        self._reqs += 1
        if self.log is not None and (len(self.retained) or self._top or self.log.promised()):
            self._restoring.add(self._reqs)
            self._retained_req = self._reqs
        msg = m.Subscribe(1, RETAINED_PROFILE, "mqtt-retained", req=self._reqs)
        return self.subscriptions.on_subscribe(RETAINED_CONN, msg, self.subscriptions.now)

    def _retained_answered(self, msg, now: float) -> list:
        """The standing subscription's answer: once it is in place everywhere, the read-back
        need not wait for it."""
        if msg.req != self._retained_req or msg.req not in self._restoring:
            return []
        out: list = []
        if type(msg) is m.Error:
            out.append(Notice("warning", f"retained messages: not subscribed: {msg.reason}"))
        elif type(msg) is not m.SubAck or not msg.complete:
            return []  # a keeper not reached yet (see Replicator.own)
        self._restoring.discard(msg.req)
        return out + ([] if self._restoring else self._replay_all(now))

    def _retain(self, pubend: str, items: list) -> list:
        """Retained events the standing subscription got, or a page read back: each topic's
        last is kept, and this broker acknowledges none of their ticks before the store has
        made the change durable (:meth:`_retained_floor`)."""
        retained = self.retained
        refused = retained.refused
        store = self.store
        for it in items:
            kept = retained.offer(pubend, it.tick, it.event)
            if kept is not None:
                for topic in retained.forgotten:
                    store.forget(topic)
                retained.forgotten.clear()
                store.retain(kept)
                q = self._retaining.get(pubend)
                if q is None:
                    q = self._retaining[pubend] = deque()
                q.append((store.saved, it.tick))
        if retained.refused != refused and refused % 1000 == 0:
            text = (
                f"retained messages: {retained.refused:,} new topics not kept, the "
                f"{retained.max_topics:,} topics or {retained.max_bytes:,} bytes held are full"
            )
            return [Notice("warning", text)]
        return []

    def _retained_floor(self, pubend: str) -> int | None:
        """The highest tick of ``pubend`` whose retained changes are all durable (None: any)."""
        q = self._retaining.get(pubend)
        if not q:
            return None
        durable = self.store.durable
        while q and durable(q[0][0]):
            q.popleft()
        if not q:
            del self._retaining[pubend]
            return None
        return q[0][1] - 1

    def retained_ask(self, conn: int, msg: m.RetainedAsk) -> list:
        """What is retained on ``msg.filters``, answered to ``conn``."""
        why = None
        if len(msg.filters) > MAX_ASK_FILTERS:
            why = f"{len(msg.filters)} topic filters, over {MAX_ASK_FILTERS}"
        for f in msg.filters if why is None else ():
            why = check_filter(f)
            if why is not None:
                break
        if why is not None:
            return [ToClient(conn, m.Error(f"retained messages: {why}", req=msg.req))]
        events, complete = self.retained.find(msg.filters)
        return [ToClient(conn, m.Retained(events, complete, req=msg.req))]
