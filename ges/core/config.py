"""One broker's settings: every bound and period of the core, as one value given at construction.

Theory of operation
-------------------
A :class:`BrokerConfig` is frozen and passed to :class:`ges.core.BrokerCore` once; each part
reads what it needs from it. The defaults are what a deployment runs with; tests and the
simulator make variants with ``attrs.evolve`` (a short ack period, a tiny work slice) instead
of patching module constants. The routing mode and the delivery guarantee are not here: they
choose which parts the core is composed of (``BrokerCore(routing=…, reliable=…)``).
"""

from __future__ import annotations

import attrs

from ges.core.dedup import DEFAULT_WINDOW
from ges.core.failure import HEARTBEAT_INTERVAL, SUSPECT_AFTER
from ges.core.work import WORK_SLICE
from ges.reliable.subend import NACK_AFTER, NACK_MAX


@attrs.frozen
class BrokerConfig:
    #: Pubends whose duplicate windows are kept; the least recently seen is forgotten first. A
    #: forgotten pubend's stragglers would be delivered twice, so this is far above the number
    #: of publisher-hosting brokers any topology here has (a 64^3-broker system has 262,144).
    max_pubends: int = 16_384
    #: The failure detector (ges.core.failure): seconds of sending nothing on a link before a
    #: heartbeat goes, and of hearing nothing before the link is suspected and dropped.
    heartbeat_every: float = HEARTBEAT_INTERVAL
    suspect_after: float = SUSPECT_AFTER
    #: Ranges of ticks one duplicate window keeps (ges.core.dedup).
    window_limit: int = DEFAULT_WINDOW
    #: Subscriptions one client connection may hold.
    max_subscriptions_per_client: int = 1_024
    #: The weight (constraints plus ``in`` values, ges.matching.model) of all the subscriptions
    #: one client may hold, and of all this broker's local subscriptions: what they cost in
    #: memory (measured: about 6 KB per unit at a broker keeping two units around itself — its
    #: profile graph, the exporter's index, the two units' graphs; 1.5 GB at the broker's
    #: bound) and in matching time.
    max_client_weight: int = 65_536
    max_local_weight: int = 262_144
    #: A changing profile of more conjunctions than this (old or new) is indexed for the events
    #: tested against it while it changes (testing each conjunction per event would be slow).
    index_old_profiles: int = 16
    #: Profiles a changing subscription keeps matching against while it changes again and again.
    max_changing: int = 8
    #: Work units per slice of a large request (ges.core.work; the simulator makes it tiny to
    #: interleave more).
    work_slice: int = WORK_SLICE
    #: Events one Publish frame may carry (the client library batches well below this).
    max_publish_batch: int = 65_536
    #: Deliveries (an event to one subscription or one peer counts 1) of what the pubend's log
    #: committed that one step hands on (about 2 ms); the rest follow a slice at a time as the
    #: core's own job (ges.core.publishing), so no commit holds the event loop for long.
    logged_slice: int = 1024
    #: ... and at most about this many bytes of events (each counted once per destination, as
    #: ges.wire.messages.event_size counts it): a slice of large events appends no more than
    #: this to the session store, whose commits the hand-on waits for (ges.runtime.broker).
    logged_slice_bytes: int = 1 << 20
    #: Seconds a SubAck waits for the keepers' acknowledgements before it is sent anyway.
    suback_wait: float = 5.0
    #: Broker-to-broker hops after which a routed event is dropped (only views that disagree
    #: for a moment can make a route go round; every topology's diameter is far below this).
    max_hops: int = 64
    #: Reliable delivery: seconds a pubend stays quiet before it sends silence on its routes, so
    #: a lost last event is found out and asked for; then every ``silence_every`` seconds while
    #: it publishes and for ``silence_steady`` rounds after, then twice as long after each round
    #: up to ``silence_max``, for as long as it stays idle (seed 002 §2.2: idle pubends advance
    #: silence). A publish after an idle spell brings a round ``silence_after`` later.
    silence_after: float = 0.05
    silence_every: float = 1.0
    silence_steady: int = 5
    silence_max: float = 30.0
    #: Reliable delivery: seconds between the pubend's rounds of asking every other broker how
    #: far its log may be released (m.AckAsk), while it holds unreleased entries.
    ack_every: float = 5.0
    #: Seconds a broker that passed an ask on waits for the answers from beyond it, to send them
    #: on as one Ack (one that comes later goes on by itself) ...
    ack_gather: float = 1.0
    #: ... less this much per hop the ask came (a broker further out gives up on a silent one
    #: first, so what it gathered still reaches the gatherer before it), but at least gather_min.
    gather_step: float = 0.02
    gather_min: float = 0.1
    #: Other pubends' rounds a broker gathers answers for at once (the oldest goes on as it is).
    max_gathers: int = 1_024
    #: Reliable delivery: seconds a subend waits before it asks for a gap the first time, and
    #: the most its wait grows to (ges.reliable.subend).
    nack_after: float = NACK_AFTER
    nack_max: float = NACK_MAX
    #: Subends (pubends whose streams a subscriber-hosting broker follows); least recently used go.
    max_subends: int = 16_384
    #: Bytes of events all subends together hold beyond their doubt horizons (each holds at most
    #: ges.reliable.knowledge.MAX_DATA_BYTES); beyond it the highest become Q again, asked for
    #: once the stream has caught up — so a recovery reaches a subscriber in bursts of this.
    max_held_bytes: int = 64 * 1024 * 1024
    #: Durable sessions: seconds a session's client stays connected in the unit of another
    #: replicator before its replicator hands the session over to that one (ges.core.handover;
    #: inf: never; None: the topology's ``sessions: {handover_after}``).
    handover_after: float | None = None
