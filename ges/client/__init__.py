"""A small trio client library: connect to any broker, publish, subscribe, ask for stats.

Example::

    async with ges.client.connect("127.0.0.1", 7101, topology="demo") as client:
        sub = await client.subscribe([parse_where("price > 10")])
        await client.publish([Event({"sym": "IBM", "price": 12})])
        async for delivery in sub:
            print(delivery.event.attributes)

Publishing is pipelined: :meth:`Client.publish` waits for the broker's acknowledgement, while
:meth:`Client.publish_nowait` returns once the batch is queued and keeps at most ``window``
unacknowledged batches in flight (:meth:`Client.flush` waits for the rest).
"""

from ges.client._client import Client, SessionStream, Subscription
from ges.client._connect import broker_stats, connect
from ges.client._session import (
    KEPT_WAIT,
    DurableSession,
    Move,
    SessionEnded,
    Token,
    failover_order,
)
from ges.records import Delivery, SessionDelivery

__all__ = [
    "KEPT_WAIT",
    "Client",
    "Delivery",
    "DurableSession",
    "Move",
    "SessionDelivery",
    "SessionEnded",
    "SessionStream",
    "Subscription",
    "Token",
    "broker_stats",
    "connect",
    "failover_order",
]
