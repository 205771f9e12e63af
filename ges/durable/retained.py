"""Retained messages: per topic, the last message published with MQTT's RETAIN flag (MQTT 3.1.1
§3.3.1.3), kept by every replicator so that a subscriber at any broker gets it.

Theory of operation
-------------------
A PUBLISH with RETAIN set is an event carrying the reserved attribute ``@retain`` (1)
(a GES client may set it too, with ``@topic``). Each replicator holds one standing
subscription, :data:`RETAINED_PROFILE`, under its own connection number
(ges.core.replicator): content routing brings every retained event of the network to every
replicator, exactly once and in order per pubend, and the ticks of every other event are
silence for it. A :class:`RetainedSet` keeps per topic the *last* such event: last by (the wall
clock its publisher's broker stamped on it, its pubend, its tick) — a last-writer-wins register,
so replicators that see two publishers' streams interleaved differently still keep the same
message. An event with an empty payload clears its topic (§3.3.1.3); the clearing is kept,
counted in the bounds, so that an older message that arrives after it does not come back.

A subscriber's broker asks a replicator (its home replicator, ges.runtime.retained_asks) for what
is retained on the filters of a SUBSCRIBE (``m.RetainedAsk``); :meth:`RetainedSet.find` walks
each filter down a :class:`~ges.matching.topics.TopicIndex`, so an answer costs what it
matches, and holds at most ``max_bytes`` of messages. The MQTT session sends them with RETAIN
set (ges.mqtt.session).

Bounds: ``max_bytes`` of topics and messages and ``max_topics`` topics in all. A topic already
held is always replaced; a new one beyond the bounds takes the room of the oldest clearings
(``forgotten``: the store lets go of them), and if there is none is not kept (``refused``
counts them). A clearing of a topic not held is kept all the same, as a new topic is: an older
message of the topic may come after it (another publisher's, read back or repaired later), and
kept is what keeps it out — the register is the same whatever order a replicator sees its
changes in, as long as no clearing had to give its room up. An answer walks at most
``MAX_VISITS`` levels of the index, so no ask holds the replicator for long. Storage: the
replicator's store keeps each change, and its broker acknowledges no tick before the change it
made is durable, so a crash loses nothing the pubends' logs still hold: the restarted
replicator reads them back (ges.core.retaining).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

import attrs

from ges.matching.model import RETAIN_ATTR, TOPIC_ATTR
from ges.matching.topics import TopicIndex, check_topic
from ges.wire import messages as m
from ges.wire.messages import event_size

#: The replicators' standing subscription: every retained event that has a topic.
RETAINED_PROFILE = [[m.Constraint(RETAIN_ATTR, "eq", 1), m.Constraint(TOPIC_ATTR, "exists")]]
#: Bytes of topics and messages a replicator retains at most, and topics.
MAX_BYTES = 64 << 20
MAX_TOPICS = 100_000
#: Bytes of messages one answer carries at most (what lies beyond is not sent: a SUBSCRIBE to
#: '#' on a network retaining gigabytes gets the first of them).
MAX_ANSWER_BYTES = 1 << 20
#: What one kept topic costs beyond its topic and event (its index node and record).
OVERHEAD = 200
#: Levels of the index one answer walks at most (each filter's walk counts).
MAX_VISITS = 200_000


@attrs.frozen(slots=True)
class Kept:
    """A topic's retained message (``event`` None: cleared) and its place in the order."""

    topic: str
    wall_ns: int
    pubend: str
    tick: int
    event: m.Event | None

    @property
    def order(self) -> tuple[int, str, int]:
        return (self.wall_ns, self.pubend, self.tick)

    @property
    def size(self) -> int:
        body = 0 if self.event is None else event_size(self.event)
        return len(self.topic.encode()) + body + OVERHEAD


def retained_topic(event: m.Event) -> str | None:
    """The topic ``event`` is retained on (None: it is not a retained event MQTT can carry)."""
    attributes = event.attributes
    if attributes.get(RETAIN_ATTR) != 1:
        return None
    topic = attributes.get(TOPIC_ATTR)
    if type(topic) is not str or check_topic(topic) is not None or len(topic.encode()) > 65535:
        return None
    return topic


class RetainedSet:
    """The retained messages one replicator holds (see the module docstring)."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_topics: int = MAX_TOPICS):
        self.max_bytes = max_bytes
        self.max_topics = max_topics
        self._index = TopicIndex()
        self.bytes = 0
        #: new topics not kept for want of room
        self.refused = 0
        #: cleared topics, oldest first (a tombstone each: their room is taken first)
        self._cleared: dict[str, None] = {}
        #: clearings let go of to make room, for the store to forget (the caller empties it)
        self.forgotten: list[str] = []
        #: changes taken so far (each keeps objects alive while its topic's message stands)
        self.kept = 0

    def __len__(self) -> int:
        return len(self._index)

    def get(self, topic: str) -> Kept | None:
        return self._index.get(topic)

    def offer(self, pubend: str, tick: int, event: m.Event) -> Kept | None:
        """Take ``event`` of ``pubend`` at ``tick``; the change to store (None: nothing
        changed — not retained, older than what the topic has, or no room for a new topic)."""
        topic = retained_topic(event)
        if topic is None:
            return None
        kept = Kept(topic, event.published_at, pubend, tick, event if event.payload else None)
        old = self._index.get(topic)
        if old is not None and old.order >= kept.order:
            return None
        if old is None and not self._room(kept.size):
            self.refused += 1
            return None
        grows = kept.size - (0 if old is None else old.size)
        if grows > 0 and self.bytes + grows > self.max_bytes:
            # a topic held is replaced whatever its size: its old message goes, cleared
            kept = attrs.evolve(kept, event=None)
            grows = kept.size - old.size
        self._index.set(topic, kept)
        self.kept += 1
        self.bytes += grows
        self._cleared.pop(topic, None)
        if kept.event is None:
            self._cleared[topic] = None
        return kept

    def _room(self, size: int) -> bool:
        """Room for a new topic of ``size``, made of the oldest clearings if need be."""
        cleared = self._cleared
        while len(self._index) >= self.max_topics or self.bytes + size > self.max_bytes:
            if not cleared:
                return False
            topic = next(iter(cleared))
            del cleared[topic]
            self.bytes -= self._index.pop(topic).size
            self.forgotten.append(topic)
        return True

    def load(self, kept: Kept) -> None:
        """A change read back from the store (a restart): kept as it was."""
        old = self._index.get(kept.topic)
        if old is not None:
            if old.order >= kept.order:
                return
            self.bytes -= old.size
        self._index.set(kept.topic, kept)
        self.bytes += kept.size
        self._cleared.pop(kept.topic, None)
        if kept.event is None:
            self._cleared[kept.topic] = None

    def find(
        self, filters: list[str], max_bytes: int = MAX_ANSWER_BYTES, max_visits: int = MAX_VISITS
    ) -> tuple[list, bool]:
        """The retained events on the topics ``filters`` match, each once, at most
        ``max_bytes`` of them; and whether that is all of them."""
        answer: list = []
        for _ in self.finding(filters, answer, max_bytes, max_visits):
            pass
        return answer[0], answer[1]

    def finding(
        self,
        filters: list[str],
        answer: list,
        max_bytes: int = MAX_ANSWER_BYTES,
        max_visits: int = MAX_VISITS,
        pause: int = 0,
    ) -> Iterator[int]:
        """:meth:`find` in pieces of about ``pause`` levels walked each (a message found counts
        its bytes too, 8 a level), yielding each piece's; once done, ``answer`` holds the
        events and whether that is all of them."""
        out: list[m.Event] = []
        seen: set[str] = set()
        size = 0
        budget = [max_visits]
        piece = 0  # what the piece in progress cost, beyond the levels walked in it
        walked = max_visits  # the budget when it began
        for f in dict.fromkeys(filters):
            # (None after each filter too: many filters that match little make a piece)
            for kept in chain(self._index.find(f, budget, pause), (None,)):
                if kept is not None:
                    if kept.event is None or kept.topic in seen:
                        continue
                    grows = event_size(kept.event)
                    size += grows
                    if size > max_bytes:
                        answer[:] = [out, False]
                        return
                    seen.add(kept.topic)
                    out.append(kept.event)
                    piece += grows >> 3
                if pause and walked - budget[0] + piece >= pause:
                    yield walked - budget[0] + piece
                    walked, piece = budget[0], 0
            if budget[0] <= 0:
                answer[:] = [out, False]
                return
        answer[:] = [out, True]
