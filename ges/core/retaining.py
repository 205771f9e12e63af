"""A replicator's retained messages: its standing subscription to them, keeping the last per
topic, and answering what is retained on a subscriber's filters (ges.durable.retained has the
theory of operation).
"""

from __future__ import annotations

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
        that serves MQTT: some broker of the topology has an ``mqtt_port``); the outputs."""
        self.retained = RetainedSet()
        for kept in self.store.retained():
            self.retained.load(kept)
        if not any(spec.mqtt_port for spec in self.topology.brokers.values()):
            return []
        self.subscriptions.client_open(RETAINED_CONN, "retained messages")
        msg = m.Subscribe(1, RETAINED_PROFILE, "mqtt-retained")
        return self.subscriptions.on_subscribe(RETAINED_CONN, msg, self.subscriptions.now)

    def _retain(self, pubend: str, items: list) -> list:
        """Retained events the standing subscription got: each topic's last is kept."""
        retained = self.retained
        refused = retained.refused
        for it in items:
            kept = retained.offer(pubend, it.tick, it.event)
            if kept is not None:
                for topic in retained.forgotten:
                    self.store.forget(topic)
                retained.forgotten.clear()
                self.store.retain(kept)
        if retained.refused != refused and refused % 1000 == 0:
            text = (
                f"retained messages: {retained.refused:,} new topics not kept, the "
                f"{retained.max_topics:,} topics or {retained.max_bytes:,} bytes held are full"
            )
            return [Notice("warning", text)]
        return []

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
