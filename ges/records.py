"""Delivery records: one record per delivered event, the input of ``ges stats latency``.

The format (JSON lines — one object per line — or Parquet with the same columns):

=====================  =========  ===========================================================
field                  type       meaning
=====================  =========  ===========================================================
``event_id``           string     ``"<pubend>:<tick>"``
``pubend``             string     the publishing endpoint, ``<broker>~<incarnation>``
``tick``               integer    the event's tick (sequence) on its pubend
``publisher_broker``   string     the broker hosting the pubend
``subscriber_broker``  string     the broker the receiving client is attached to
``client``             string     the receiving client's name
``published_at``       integer    ns since the Unix epoch, publisher's clock
``received_at``        integer    ns since the Unix epoch, subscriber's clock
``size``               integer    payload bytes
``hops``               integer    broker-to-broker links the event crossed
``tags``               object     free-form experiment labels (``matching_rate``, ``rate``, …)
=====================  =========  ===========================================================

Every field but ``tags`` is required and not null. Integers are JSON integers (no fraction, no
exponent, no quotes) in the signed 64-bit range; ``tick``, ``published_at``, ``received_at``,
``size`` and ``hops`` are ≥ 0. A string field given a JSON number or boolean takes its text, as
Spark's JSON reader does. ``tags`` may be absent or null (no tags); its values are scalars
compared as text — a number as written (``0.50`` and ``0.5`` differ), ``true``/``false``, or
null. Blank lines are skipped; other fields are ignored. In Parquet the integers are
``int64`` (narrower integer columns are widened), the strings ``string`` and ``tags`` a
``map<string,string>``: the schema :func:`spark_schema` returns, which JSON lines are read with.

Latency is ``received_at − published_at``: negative when the two clocks disagree by more than
the delivery took, which ``ges stats latency`` counts and reports rather than rejects.
"""

from __future__ import annotations

import json
from typing import IO

import attrs

from ges.wire import messages as m


@attrs.frozen
class Delivery:
    """One event delivered to a subscription, with where it came from and when it arrived."""

    pubend: str
    tick: int
    hops: int
    event: m.Event
    received_at: int


@attrs.frozen
class SessionDelivery(Delivery):
    """A delivery of a durable session: also its epoch at the session's replicator (its
    position in the session's stream) and the session's subscriptions it matched."""

    epoch: int = 0
    subs: tuple[int, ...] = ()
    #: a gap notice instead of an event: ticks ``tick..gap_to`` of the pubend may have held
    #: events for the session that are gone, and why (``event`` is empty)
    gap_to: int = 0
    why: str = ""


#: Every field of a delivery record and its kind, in the order records are written.
FIELDS: tuple[tuple[str, str], ...] = (
    ("event_id", "string"),
    ("pubend", "string"),
    ("tick", "integer"),
    ("publisher_broker", "string"),
    ("subscriber_broker", "string"),
    ("client", "string"),
    ("published_at", "integer"),
    ("received_at", "integer"),
    ("size", "integer"),
    ("hops", "integer"),
    ("tags", "tags"),
)
FIELD_NAMES = tuple(name for name, _ in FIELDS)
#: Fields a record must have (not null); ``tags`` may be left out.
REQUIRED = tuple(name for name, kind in FIELDS if kind != "tags")
#: Integer fields that must not be negative (timestamps since the epoch, counts).
NON_NEGATIVE = ("tick", "published_at", "received_at", "size", "hops")

_INT64 = (-(2**63), 2**63 - 1)


class RecordError(ValueError):
    """One line is not a valid delivery record; the message says why (no file or line)."""


class _JsonFloat(str):
    """A JSON number with a fraction or exponent, kept as written (Spark keeps the text too)."""


def _text(value) -> str | None:
    """A JSON value as the text Spark's reader stores in a string column."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # an object or array: its JSON text


def parse_record(line: str) -> dict | None:
    """One JSON line as a record dict (``tags`` values as text), ``None`` for a blank line.

    Raises RecordError saying what is wrong: not JSON, not an object, a field missing, null, of
    the wrong type, out of range or negative.
    """
    if not line.strip():
        return None
    try:
        obj = json.loads(line, parse_float=_JsonFloat)
    except ValueError as exc:
        raise RecordError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise RecordError(f"not a JSON object but {type(obj).__name__} (one record per line)")
    record: dict = {}
    for name, kind in FIELDS:
        value = obj.get(name)
        if kind == "tags":
            if value is None:
                record[name] = {}
            elif not isinstance(value, dict):
                raise RecordError(f"tags must be an object, not {json.dumps(value)[:40]}")
            else:
                record[name] = {str(k): _text(v) for k, v in value.items()}
            continue
        if value is None:
            raise RecordError(f"no {name}" if name not in obj else f"{name} is null")
        if kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise RecordError(f"{name} must be an integer, not {json.dumps(value)[:40]}")
            if not _INT64[0] <= value <= _INT64[1]:
                raise RecordError(f"{name} {value} is outside the 64-bit integer range")
            if value < 0 and name in NON_NEGATIVE:
                raise RecordError(f"{name} must not be negative, not {value}")
            record[name] = value
        else:
            record[name] = _text(value)
    return record


def spark_schema():
    """The Spark schema of a delivery record (imports pyspark, which the client does not need)."""
    from pyspark.sql import types as T

    kinds = {
        "string": T.StringType(),
        "integer": T.LongType(),
        "tags": T.MapType(T.StringType(), T.StringType()),
    }
    return T.StructType([T.StructField(name, kinds[kind], True) for name, kind in FIELDS])


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
