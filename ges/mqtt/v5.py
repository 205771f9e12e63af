"""What MQTT 5.0 adds to the mapping onto GES: properties as attributes and back, the CONNACK's
properties, and the reason codes a server closes a connection with.

Theory of operation
-------------------
A PUBLISH's User Properties (5.0 §3.3.2.3.7) become the event's attributes, so that GES
profiles and GES clients see them as any other attribute (a name that is not a GES attribute
name — ``[A-Za-z_][\\w.-]*``, at most 256 characters — is dropped; of a name given twice the last
value is kept). The request-response properties travel as reserved attributes:
``@content_type``, ``@response_topic`` and ``@correlation`` (the correlation data in hex). Going
out, an event's attributes that are not reserved become User Properties again (a GES client's
typed values as text: ``true``, ``3``, ``2.5``), so MQTT 5.0 subscribers see what GES
publishers attach. A Payload Format Indicator of 1 (UTF-8) travels as ``@payload_format`` (1)
and goes to every subscriber unaltered (§3.3.2.3.2); the payload is not checked. ``@origin`` names the connection that published (No Local, §3.8.3.1).

A Message Expiry Interval travels as ``@expiry`` (seconds from the publish: the event's
``published_at``, which the broker that took the PUBLISH stamped): a delivery whose interval
has passed by the time it would be written is not sent — live, stored for a persistent
session, waiting for room in the client's window, or retained — and one that goes carries
what is left of it (§3.3.2.3.3), rounded up to whole seconds. A will's properties are its
event's as a PUBLISH's are.

A SUBSCRIBE's Subscription Identifier (§3.8.2.1.2) is kept with each of its filters, beside
their option bits (``ID_SHIFT``): a delivery carries the identifiers of the filters it matched
(§3.3.4), once each, and a persistent session keeps them wherever it resumes, as it keeps the
option bits. Topic aliases from clients are taken, up to :data:`TOPIC_ALIAS_MAX`; this server
offers no Shared Subscriptions (said in its CONNACK): a client that uses them gets 0x9E for
those filters.
"""

from __future__ import annotations

import contextlib

from ges.matching.model import MAX_NAME, NAME
from ges.matching.topics import check_topic
from ges.mqtt import packets as p
from ges.mqtt.frames import Malformed

CONTENT_TYPE_ATTR = "@content_type"
RESPONSE_TOPIC_ATTR = "@response_topic"
CORRELATION_ATTR = "@correlation"
#: A PUBLISH's Payload Format Indicator when it says UTF-8 (1; 0, unspecified, is not kept).
PAYLOAD_FORMAT_ATTR = "@payload_format"
#: The connection that published an event (a token the runtime gives each MQTT 5.0 connection).
ORIGIN_ATTR = "@origin"
#: A PUBLISH's Message Expiry Interval, in seconds from the event's ``published_at``.
EXPIRY_ATTR = "@expiry"
#: A SUBSCRIBE's option bits (5.0 §3.8.3.1).
NO_LOCAL, RETAIN_AS_PUBLISHED = 4, 8
#: A filter's options as kept: those bits, and its Subscription Identifier shifted by this.
ID_SHIFT = 8
#: The largest Subscription Identifier (a Variable Byte Integer, §3.8.2.1.2).
MAX_SUBSCRIPTION_ID = 268_435_455
SHARED_PREFIX = "$share/"


def attributes_of(props: tuple, attributes: dict) -> None:
    """Add a client's PUBLISH properties to its event's ``attributes``.

    Raises:
        Malformed: what this server told the client it does not take.
    """
    for pid, value in props:
        if pid == p.USER_PROPERTY:
            name, text = value
            if len(name) <= MAX_NAME and NAME.fullmatch(name):
                attributes[name] = text
        elif pid == p.CONTENT_TYPE:
            attributes[CONTENT_TYPE_ATTR] = value
        elif pid == p.PAYLOAD_FORMAT:
            if value not in (0, 1):  # (0: bytes, 1: UTF-8 — nothing else, §3.3.2.3.2)
                raise Malformed(f"a Payload Format Indicator of {value}", p.PROTOCOL_ERROR)
            if value:
                attributes[PAYLOAD_FORMAT_ATTR] = 1
        elif pid == p.RESPONSE_TOPIC:
            why = check_topic(value)
            if why is not None:
                raise Malformed(f"a PUBLISH's response topic: {why}", p.PROTOCOL_ERROR)
            attributes[RESPONSE_TOPIC_ATTR] = value
        elif pid == p.CORRELATION_DATA:
            attributes[CORRELATION_ATTR] = value.hex()
        elif pid == p.MESSAGE_EXPIRY:
            attributes[EXPIRY_ATTR] = value
        elif pid == p.SUBSCRIPTION_ID:
            raise Malformed("a PUBLISH from a client with a subscription identifier", 0x82)


def props_of(attributes: dict) -> tuple:
    """An event's attributes as a PUBLISH's properties (the module docstring); what MQTT
    cannot carry — a GES publisher's value over 65,535 bytes — is left out."""
    out: list = []
    for name, value in attributes.items():
        if name[0] != "@":
            if type(value) is bool:
                value = "true" if value else "false"
            text = str(value)
            if len(text) <= _FITS or len(text.encode()) <= 65535:
                out.append((p.USER_PROPERTY, (name, text)))
        elif name == PAYLOAD_FORMAT_ATTR:
            if value == 1:
                out.append((p.PAYLOAD_FORMAT, 1))
        elif type(value) is not str or len(value) > 2 * 65535:
            continue
        elif name == CONTENT_TYPE_ATTR and len(value.encode()) <= 65535:
            out.append((p.CONTENT_TYPE, value))
        elif name == RESPONSE_TOPIC_ATTR and check_topic(value) is None:
            if len(value.encode()) <= 65535:
                out.append((p.RESPONSE_TOPIC, value))
        elif name == CORRELATION_ATTR:
            with contextlib.suppress(ValueError):  # not hex: not from MQTT, not carried
                out.append((p.CORRELATION_DATA, bytes.fromhex(value)))
    return tuple(out)


#: Topic aliases a client may set on one connection (its CONNACK says so): each holds a topic
#: of at most 65,535 bytes, so a connection's cost no more than 4 MiB, a quarter of a packet.
TOPIC_ALIAS_MAX = 64
#: Topic aliases this server sets on a connection's deliveries, at most (and at most the
#: client's Topic Alias Maximum): each for a topic of at most ``ALIASED_BYTES`` bytes, the
#: least recently used one given to the next topic once all are taken.
ALIASES_OUT = 64
ALIASED_BYTES = 256
#: QoS 1 and 2 PUBLISHes a 5.0 client may have unanswered at once (its CONNACK's Receive
#: Maximum, §3.2.2.3.3): a QoS 1 one until its PUBACK, a QoS 2 one until its PUBREL; one more
#: closes the connection with 0x93 (§4.9). (3.1.1 has no such bound: its packet identifiers
#: are the only one.)
RECEIVE_MAX = 1024
#: Characters that are surely within 65,535 bytes of UTF-8 (four bytes each at most).
_FITS = 65535 // 4


def connack_props(
    max_packet: int, assigned: str, expiry: int | None = None, keepalive: int | None = None
) -> tuple:
    """What this server says of itself in a CONNACK (and the client id it gave, if it did, the
    Session Expiry Interval it keeps the session for if not the client's, §3.2.2.3.2, and the
    keepalive it holds the client to if not the client's, §3.2.2.3.14)."""
    props = [
        (p.RECEIVE_MAXIMUM, RECEIVE_MAX),
        (p.MAXIMUM_PACKET_SIZE, max_packet),
        (p.TOPIC_ALIAS_MAXIMUM, TOPIC_ALIAS_MAX),
        (p.SHARED_AVAILABLE, 0),
    ]
    if assigned:
        props.append((p.ASSIGNED_CLIENT_ID, assigned))
    if expiry is not None:
        props.append((p.SESSION_EXPIRY, expiry))
    if keepalive is not None:
        props.append((p.SERVER_KEEP_ALIVE, keepalive))
    return tuple(props)


def disconnect(reason: str) -> p.Disconnect:
    """The DISCONNECT a server closes a connection with, for why it closes it."""
    code = p.UNSPECIFIED
    for start, c in _REASONS:
        if reason.startswith(start) or f": {start}" in reason:
            code = c
            break
    text = reason if len(reason.encode()) <= 1024 else reason[:256]
    return p.Disconnect(code, ((p.REASON_STRING, text),))


_REASONS = (
    ("taken over", p.TAKEN_OVER),
    ("keepalive", p.KEEP_ALIVE_TIMEOUT),
    ("slow consumer", p.QUOTA_EXCEEDED),
    ("ended by an operator", p.ADMINISTRATIVE),
    ("moved to", p.USE_ANOTHER_SERVER),
)
