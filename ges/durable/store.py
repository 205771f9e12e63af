"""What a replicator keeps: durable sessions and the events stored for them (seed 001 §4.2).

An event that some sessions want is stored once, with an *epoch* (the replicator's number, one
more for each event stored) and, per session, the subscriptions it matched — the persistent
filtering subsystem's layout, not a copy per subscriber. A session keeps its subscriptions,
its owner and its resume point (``acked``: the last epoch its client acknowledged). ``append``
takes an event at once and :attr:`committed` says how far appends are durable: a driver with
an asynchronous writer (``ges.runtime.session_store``) commits a group at a time, and the core
streams nothing to a client before it is committed (a replicator that crashes never numbers an
event twice). :class:`MemorySessionStore` is the same in memory (the simulator, unit tests);
``tests/durable/test_store_contract.py`` runs the same tests against both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import attrs

from ges.durable.retained import Kept
from ges.wire import messages as m
from ges.wire.messages import event_size

#: What one read returns at most (events; bytes: ``max_bytes``).
MAX_READ = 512


def page(items: Iterable[m.SessionItem], max_bytes: int) -> list[m.SessionItem]:
    """What a read returns of ``items`` (each store's, in epoch order, at most its limit): up to
    the one whose event brings their sizes to ``max_bytes`` — at least one."""
    out = []
    size = 0
    for it in items:
        out.append(it)
        size += event_size(it.item.event)
        if size >= max_bytes:
            break
    return out


@attrs.define
class SessionState:
    """A durable session as stored."""

    name: str
    #: the identity that made it ('' without identities: --insecure)
    owner: str
    #: its number in the store (events are kept for it under this)
    key: int
    #: sub_id -> (profile id, conjunctions as on the wire)
    subs: dict[int, tuple[str, list]]
    created: float
    #: the last epoch its client acknowledged (0: none)
    acked: int = 0
    #: its own retention limits (0: the topology's ``sessions:``)
    max_events: int = 0
    max_age: float = 0.0
    #: retention let go of its events up to this epoch (0: none), the ticks per pubend its
    #: client has not been told of yet, and how many events went in all
    trimmed: int = 0
    gaps: dict[str, tuple[int, int]] = attrs.Factory(dict)
    dropped: int = 0
    gap_why: str = ""
    #: a hand-over to or from another replicator in progress (ges.core.handover), as kept
    handover: dict | None = None
    #: per pubend, the tick up to which its events came to it from elsewhere (a hand-over's
    #: source, or what the hand-over read from the pubend's log): none up to it is stored again
    floors: dict[str, int] = attrs.Factory(dict)
    #: per pubend a hand-over's own read of it for this session is still reading, the tick
    #: it reads after (its cut): a replicator restarted meanwhile reads on from there (with
    #: ``floors``), where the rest of its sessions may have more of that pubend
    reading: dict[str, int] = attrs.Factory(dict)
    #: the QoS 2 packet identifiers its MQTT client published and has not released yet
    #: (PUBREL): a PUBLISH sent again with one, at any broker, is not published twice
    qos2: set[int] = attrs.Factory(set)
    #: the epochs of QoS 2 deliveries its MQTT client acknowledged (PUBREC) whose PUBCOMP has
    #: not come: a broker it reconnects at sends PUBREL for them, not the messages again
    rel: set[int] = attrs.Factory(set)
    #: seconds it outlives its client's leaving (0: as the topology's ``sessions.expire_after``
    #: says, which also bounds it; retention lets go of its oldest events, never of it): an
    #: MQTT 5.0 client's Session Expiry Interval
    expiry: float = 0.0
    #: an MQTT 5.0 client's will, held for its Will Delay Interval after the client left
    #: (§3.1.3.2.2): published once that passed or the session ends, dropped if the session
    #: is opened again before; the delay, counted anew from a replicator's restart
    will: m.Event | None = None
    will_delay: float = 0.0

    def copy(self) -> SessionState:
        """A copy sharing nothing that changes (what a store keeps of a save)."""
        return attrs.evolve(
            self,
            subs=dict(self.subs),
            gaps=dict(self.gaps),
            floors=dict(self.floors),
            reading=dict(self.reading),
            qos2=set(self.qos2),
            rel=set(self.rel),
        )


class SessionStore(Protocol):
    """What the replicator (:class:`ges.core.replicator.Replicator`) asks of its storage."""

    #: this store's identity: a token naming another store (a replicator whose files were
    #: replaced) does not resume at a position of this one
    id: str

    def sessions(self) -> dict[str, SessionState]:
        """Every stored session by name, as when the store was opened (read once)."""

    def save_session(self, state: SessionState) -> None:
        """Keep ``state`` (its subscriptions, owner, resume point) with the next commit."""

    def drop_session(self, state: SessionState) -> None:
        """Forget the session and what was held for it only."""

    @property
    def saved(self) -> int:
        """How many saves and drops of sessions and retained messages kept were made so far
        (a mark for :meth:`durable`)."""

    def durable(self, saved: int) -> bool:
        """Whether every save, drop and retained message up to mark ``saved`` is durable."""

    @property
    def last(self) -> int:
        """The highest epoch appended (0 for none)."""

    @property
    def committed(self) -> int:
        """The highest epoch that is durable."""

    def append(
        self,
        pubend: str,
        item: m.EventItem,
        wants: list[tuple[int, list[int]]],
        gap_to: int = 0,
        why: str = "",
    ) -> int:
        """Store an event for the sessions ``wants`` names (``(key, sub_ids)``); its epoch.
        With ``gap_to``: a gap notice for ticks ``item.tick..gap_to`` instead, and ``why``."""

    def tops(self) -> dict[str, int]:
        """Per pubend, the tick up to which every event its sessions wanted is stored."""

    def set_top(self, pubend: str, tick: int) -> None:
        """Keep :meth:`tops` of ``pubend`` with the next commit."""

    def read(self, key: int, after: int, limit: int = MAX_READ, max_bytes: int = 1 << 20) -> list:
        """Session ``key``'s committed events after epoch ``after``, in order, as
        :class:`~ges.wire.messages.SessionItem` (at most ``limit``, and ``max_bytes`` but one)."""

    def held(self, key: int, after: int) -> tuple[int, int]:
        """How many events are held for session ``key`` after epoch ``after``, and the last
        epoch among them (0: none)."""

    def release(self, key: int, upto: int) -> None:
        """Session ``key`` needs nothing up to epoch ``upto`` any more."""

    def nth(self, key: int, after: int, n: int) -> int:
        """The epoch of session ``key``'s ``n``-th event after ``after`` (its last if it has
        fewer; ``after`` if none)."""

    def stored_before(self, age: float) -> int:
        """The last epoch stored over ``age`` seconds ago (0: none); the store keeps the time
        of day of each append (the core reads no clock)."""

    def count(self, key: int, after: int, upto: int) -> int:
        """How many of session ``key``'s events are in epochs ``after + 1..upto``."""

    def ticks(self, key: int, after: int, upto: int) -> dict[str, tuple[int, int]]:
        """Per pubend, the lowest and highest tick of session ``key``'s events in epochs
        ``after + 1..upto``."""

    def retain(self, kept: Kept) -> None:
        """Keep a topic's retained message (ges.durable.retained) with the next commit."""

    def retained(self) -> list[Kept]:
        """Every topic's retained message as kept (cleared ones too)."""

    def forget(self, topic: str) -> None:
        """Let go of what is kept for ``topic`` (a clearing whose room a new topic took)."""


class MemorySessionStore:
    """:class:`SessionStore` in memory: every append is committed at once."""

    def __init__(self, store_id: str = "memory", clock=lambda: 0.0):
        self.id = store_id
        #: the time of day of an append (the simulator gives its own)
        self.clock = clock
        self._times: list[tuple[float, int]] = []
        self._sessions: dict[str, SessionState] = {}
        #: epoch -> (pubend, item, {key: sub_ids}, gap_to, why)
        self._events: dict[int, tuple] = {}
        #: key -> its epochs, in order
        self._wants: dict[int, list[int]] = {}
        self._last = 0
        self._tops: dict[str, int] = {}
        self._retained: dict[str, Kept] = {}

    def sessions(self) -> dict[str, SessionState]:
        return {n: s.copy() for n, s in self._sessions.items()}

    def save_session(self, state: SessionState) -> None:
        self._sessions[state.name] = state.copy()
        self._wants.setdefault(state.key, [])

    def drop_session(self, state: SessionState) -> None:
        self._sessions.pop(state.name, None)
        self.release(state.key, self._last)
        self._wants.pop(state.key, None)

    @property
    def last(self) -> int:
        return self._last

    @property
    def committed(self) -> int:
        return self._last

    saved = 0  # what is saved is kept at once

    def durable(self, saved: int) -> bool:
        return True

    def append(
        self,
        pubend: str,
        item: m.EventItem,
        wants: list[tuple[int, list[int]]],
        gap_to: int = 0,
        why: str = "",
    ) -> int:
        self._last += 1
        epoch = self._last
        self._events[epoch] = (pubend, item, dict(wants), gap_to, why)
        self._times.append((self.clock(), epoch))
        for key, _ in wants:
            self._wants.setdefault(key, []).append(epoch)
        return epoch

    def _epochs_after(self, key: int, after: int) -> list[int]:
        from bisect import bisect_right

        epochs = self._wants.get(key, [])
        return epochs[bisect_right(epochs, after) :]

    def read(self, key: int, after: int, limit: int = MAX_READ, max_bytes: int = 1 << 20) -> list:
        def stored(epoch: int) -> m.SessionItem:
            pubend, item, wants, gap_to, why = self._events[epoch]
            return m.SessionItem(epoch, pubend, item, wants[key], gap_to, why)

        return page(map(stored, self._epochs_after(key, after)[:limit]), max_bytes)

    def tops(self) -> dict[str, int]:
        return dict(self._tops)

    def set_top(self, pubend: str, tick: int) -> None:
        self._tops[pubend] = tick

    def held(self, key: int, after: int) -> tuple[int, int]:
        epochs = self._epochs_after(key, after)
        return len(epochs), (epochs[-1] if epochs else 0)

    def nth(self, key: int, after: int, n: int) -> int:
        epochs = self._epochs_after(key, after)[:n]
        return epochs[-1] if epochs else after

    def stored_before(self, age: float) -> int:
        from bisect import bisect_left

        i = bisect_left(self._times, (self.clock() - age, 0))
        return self._times[i - 1][1] if i else 0

    def count(self, key: int, after: int, upto: int) -> int:
        return sum(1 for epoch in self._epochs_after(key, after) if epoch <= upto)

    def ticks(self, key: int, after: int, upto: int) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for epoch in self._epochs_after(key, after):
            if epoch > upto:
                break
            pubend, item = self._events[epoch][:2]
            lo, hi = out.get(pubend, (item.tick, item.tick))
            out[pubend] = (min(lo, item.tick), max(hi, item.tick))
        return out

    def release(self, key: int, upto: int) -> None:
        epochs = self._wants.get(key)
        if not epochs:
            return
        keep = self._epochs_after(key, upto)
        for epoch in epochs[: len(epochs) - len(keep)]:
            got = self._events.get(epoch)
            if got is not None:
                got[2].pop(key, None)
                if not got[2]:
                    del self._events[epoch]
        self._wants[key] = keep

    def retain(self, kept: Kept) -> None:
        self._retained[kept.topic] = kept

    def retained(self) -> list[Kept]:
        return list(self._retained.values())

    def forget(self, topic: str) -> None:
        self._retained.pop(topic, None)
