"""Delivery records: one JSON object per delivered event, the input of ``ges stats``.

Fields (times in nanoseconds since the Unix epoch, publisher's and subscriber's clocks):

``event_id`` ("<pubend>:<tick>"), ``pubend``, ``tick``, ``publisher_broker``,
``subscriber_broker``, ``client``, ``published_at``, ``received_at``, ``size`` (payload bytes),
``hops`` (broker-to-broker links crossed), ``tags`` (free-form experiment labels).
"""

from __future__ import annotations

import json
from typing import IO

from ges.client._client import Delivery


def publisher_broker(pubend: str) -> str:
    """The broker hosting a pubend: pubends are named ``<broker>~<incarnation>``."""
    return pubend.rpartition("~")[0] or pubend


def delivery_record(
    delivery: Delivery, *, subscriber_broker: str, client: str, tags: dict | None = None
) -> dict:
    return {
        "event_id": f"{delivery.pubend}:{delivery.tick}",
        "pubend": delivery.pubend,
        "tick": delivery.tick,
        "publisher_broker": publisher_broker(delivery.pubend),
        "subscriber_broker": subscriber_broker,
        "client": client,
        "published_at": delivery.event.published_at,
        "received_at": delivery.received_at,
        "size": len(delivery.event.payload),
        "hops": delivery.hops,
        "tags": tags or {},
    }


class RecordWriter:
    """Appends delivery records as JSON lines; flushes per batch."""

    def __init__(self, stream: IO[str], *, subscriber_broker: str, client: str, tags=None):
        self.stream = stream
        self.subscriber_broker = subscriber_broker
        self.client = client
        self.tags = tags or {}

    def write(self, deliveries) -> None:
        lines = [
            json.dumps(
                delivery_record(
                    d, subscriber_broker=self.subscriber_broker, client=self.client, tags=self.tags
                ),
                separators=(",", ":"),
            )
            for d in deliveries
        ]
        if lines:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
