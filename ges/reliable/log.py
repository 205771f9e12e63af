"""The pubend log interface, and the in-memory log the simulator and tests use (seed 001 §2).

Only the publishing broker stores events (seed 002 §1: "the pubend logs once"). A log holds one
pubend's events by tick; ``append`` takes a batch with consecutive ticks and ``committed`` says
how far they are durable, so a driver with an asynchronous writer (group commit in a thread)
lets the core hold a publisher's acknowledgement, and the forwarding of the events, until their
batch is committed. ``epoch`` names the stream: it is the same across restarts for a log that
survives them, so the pubend's ticks go on where they stopped.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Protocol

from ges.wire.messages import held_size

#: Events a Recovered answer carries at most (the nacker asks again for the rest).
MAX_READ = 512
#: Events an in-memory log holds, and their bytes (roughly, ges.wire.event_size); the oldest
#: are dropped beyond either, and a nack for them is answered as lost (the subscriber's broker
#: logs a warning; nothing is passed off as silence).
MAX_MEMORY_EVENTS = 1_000_000
MAX_MEMORY_BYTES = 256 * 1024 * 1024
#: Publishers whose last event number a pubend remembers for idempotent publishing (the least
#: recently active is forgotten first: its resent events would be published again).
MAX_PUBLISHERS = 65_536

#: Earlier epochs whose ends a restarted pubend announces at most (PubendLog.earlier).
MAX_EARLIER = 8
#: Epochs of one publishing broker whose acknowledgements a log keeps at most. Its broker says
#: which it still holds (``AckAsk.oldest``: the older ones are forgotten, PubendLog.
#: forget_promises); beyond this bound the oldest go, and an older epoch is not acknowledged.
MAX_PROMISED_EPOCHS = 64
#: The end of an earlier epoch a log does not know (PubendLog.ended): past any tick.
NO_END = 1 << 62

#: A publisher's state: the highest event number published, and the epoch and tick it went in.
PublisherState = tuple[int, int, int]


class PubendLog(Protocol):
    """What the broker core (:class:`ges.core.broker.BrokerCore`) asks of a pubend's log: every
    member it uses is here, so any log it is given answers all of them. :class:`MemoryLog` and
    ``ges.runtime.pubend_log.SqliteLog`` implement it; ``tests/reliable/test_log_contract.py``
    runs the same tests against both."""

    #: the epoch this log appends to: the pubend is ``<broker>~<epoch>``. A log that survives
    #: its broker's restarts either goes on with the same epoch (its ticks go on after
    #: :attr:`last`) or opens a higher one (ticks from 1 again; see :attr:`previous`)
    epoch: int
    #: the pubend's V_m digest and clock table as of the last change (:mod:`ges.reliable.vt`);
    #: a log whose epoch goes on across restarts keeps it, one that opens a new epoch at each
    #: start (a new stream) may start it empty
    clocks: tuple[int, dict]

    @property
    def previous(self) -> tuple[int, int] | None:
        """The epoch before this one and its last committed tick, when this log opened a new
        epoch at this start and still holds events of the previous one (the core announces that
        tick, so subscribers missing the previous epoch's last events nack them, and answers
        from :meth:`read_epoch`); None otherwise."""

    @property
    def earlier(self) -> list[tuple[int, int]]:
        """The earlier epochs this log still holds ticks of past what was released, and the
        last tick of each, newest first, at most :data:`MAX_EARLIER` (the core announces
        each: a restart that came before the epoch before had announced its own
        predecessor's end must not hide it; and runs release rounds for each until it is
        released to its end); empty for a log that goes on in one epoch."""

    @property
    def last(self) -> int:
        """The highest tick appended (0 for none)."""

    @property
    def committed(self) -> int:
        """The highest tick that is durable."""

    def append(self, first: int, events: list, publisher: tuple[str, int] | None = None) -> None:
        """Log events at ticks ``first``..; ``publisher``: ``(id, number of the last event)`` of
        an idempotent publisher, kept with them (see :meth:`publishers`)."""

    def publishers(self) -> dict[str, PublisherState]:
        """Idempotent publishing: per publisher, the highest event number published and the
        epoch and tick it went in, the most recently active last (the live dict; at most
        MAX_PUBLISHERS). A log that survives restarts keeps it with the events."""

    def read(self, lo: int, hi: int, limit: int = MAX_READ) -> list[tuple[int, object]]:
        """``(tick, event)`` for the committed ticks of ``lo..hi`` held, at most ``limit``, in
        order."""

    def read_epoch(
        self, epoch: int, lo: int, hi: int, limit: int = MAX_READ
    ) -> list[tuple[int, object]]:
        """:meth:`read` of any epoch (the core answers nacks for an earlier epoch from it): for
        this one the same as :meth:`read`; for an epoch the log does not hold, nothing (its
        :meth:`lowest` says the ticks are lost)."""

    def lowest(self, epoch: int | None = None) -> int:
        """The lowest tick held of an epoch (this one by default): those below it were
        released or dropped by the log's bound (lost)."""

    def ended(self, epoch: int) -> int:
        """The last tick an earlier epoch committed (ticks after it were never published),
        or :data:`NO_END` when the log does not know it (it kept no record of that epoch)."""

    def released(self, epoch: int | None = None) -> int:
        """The highest tick of an epoch (this one by default) released: every other broker
        acknowledged it, so no subscription needs it (0: none)."""

    def release(self, upto: int, epoch: int | None = None) -> None:
        """Every other broker acknowledged an epoch's ticks (this one's by default) up to
        ``upto``: drop them."""

    def promised(self) -> dict[str, int]:
        """This broker's acknowledgements (its stable storage keeps them across crashes): per
        pubend, the tick acknowledged; at most :data:`MAX_PROMISED_EPOCHS` of each publishing
        broker, the newest. The live dict."""

    def promise(self, pubend: str, tick: int) -> bool:
        """Keep an acknowledgement before it is sent (:meth:`Promises.keep`): False, and
        nothing kept, for an epoch older than all those kept of its broker."""

    def forget_promises(self, broker: str, epoch: int) -> None:
        """Forget the acknowledgements of ``broker``'s epochs below ``epoch``: it holds none
        of them any more (it asks no more about them, nor announces them)."""


class NamedEpochs:
    """``earlier`` and ``previous`` of a log that opens a new epoch at each start: the
    earlier epochs it held ticks of when it opened (``_earlier``, newest first, at most
    :data:`MAX_EARLIER`), less those released to their end since. The runtime's file and the
    simulator's log share them."""

    epoch: int
    _earlier: list[tuple[int, int]]
    released: Callable[[int | None], int]  # (the log's own)

    @property
    def earlier(self) -> list[tuple[int, int]]:
        return [(e, last) for e, last in self._earlier if self.released(e) < last]

    @property
    def previous(self) -> tuple[int, int] | None:
        """The epoch before this one and its last tick, while it is named (:attr:`earlier`)."""
        return next((end for end in self.earlier if end[0] == self.epoch - 1), None)


class MemoryLog:
    """A log in memory. It survives a simulated broker crash when the simulator keeps the object
    (its stable storage) and hands it to the restarted core."""

    def __init__(
        self,
        epoch: int = 1,
        *,
        max_events: int = MAX_MEMORY_EVENTS,
        max_bytes: int = MAX_MEMORY_BYTES,
        max_publishers: int = MAX_PUBLISHERS,
    ):
        self.epoch = epoch
        #: the pubend's V_m digest and clock table (:mod:`ges.reliable.vt`): its stream goes on
        #: across restarts, so the V_m it stamps must not shrink
        self.clocks: tuple[int, dict] = (0, {})
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_publishers = max_publishers
        self._ticks: list[int] = []
        self._events: list = []
        self._sizes: list[int] = []
        self._bytes = 0
        self._released = 0
        self._last = 0
        self._promises = Promises()
        self._publishers: dict[str, PublisherState] = {}

    @property
    def last(self) -> int:
        return self._last

    @property
    def committed(self) -> int:
        return self.last

    def append(self, first: int, events: list, publisher: tuple[str, int] | None = None) -> None:
        if events and first <= self.last:
            raise ValueError(f"tick {first} appended after {self.last}")
        self._ticks.extend(range(first, first + len(events)))
        self._events.extend(events)
        sizes = [held_size(e) for e in events]
        self._sizes.extend(sizes)
        self._bytes += sum(sizes)
        if events:
            self._last = first + len(events) - 1
            if publisher is not None:
                remember(
                    self._publishers,
                    publisher[0],
                    (publisher[1], self.epoch, self._last),
                    self.max_publishers,
                )
        over = max(len(self._ticks) - self.max_events, 0)
        excess = self._bytes - sum(self._sizes[:over]) - self.max_bytes
        while excess > 0 and over < len(self._sizes):
            excess -= self._sizes[over]
            over += 1
        if over:  # beyond a bound the oldest go (a nack for them is answered as lost)
            self._drop(over)

    def _drop(self, n: int) -> None:
        self._bytes -= sum(self._sizes[:n])
        del self._ticks[:n], self._events[:n], self._sizes[:n]

    def publishers(self) -> dict[str, PublisherState]:
        return self._publishers

    @property
    def previous(self) -> tuple[int, int] | None:
        # one epoch only: a new one knows nothing of the stream before it (a nack for that
        # is answered as lost)
        return None

    @property
    def earlier(self) -> list[tuple[int, int]]:
        return []

    def read(self, lo: int, hi: int, limit: int = MAX_READ) -> list[tuple[int, object]]:
        i = bisect_left(self._ticks, lo)
        j = min(bisect_left(self._ticks, hi + 1), i + limit)
        return list(zip(self._ticks[i:j], self._events[i:j], strict=True))

    def read_epoch(
        self, epoch: int, lo: int, hi: int, limit: int = MAX_READ
    ) -> list[tuple[int, object]]:
        return self.read(lo, hi, limit) if epoch == self.epoch else []

    def lowest(self, epoch: int | None = None) -> int:
        if epoch is not None and epoch != self.epoch:
            return NO_END  # it holds no other epoch
        return self._ticks[0] if self._ticks else self.last + 1

    def ended(self, epoch: int) -> int:
        return self.committed if epoch == self.epoch else NO_END  # it holds no other epoch

    def released(self, epoch: int | None = None) -> int:
        return self._released if epoch is None or epoch == self.epoch else 0

    def release(self, upto: int, epoch: int | None = None) -> None:
        if epoch is not None and epoch != self.epoch:
            return  # it holds no other epoch
        upto = min(upto, self.last)
        if upto <= self._released:
            return
        self._released = upto
        self._drop(bisect_left(self._ticks, upto + 1))

    def promised(self) -> dict[str, int]:
        return self._promises.ticks

    def promise(self, pubend: str, tick: int) -> bool:
        return self._promises.keep(pubend, tick) is not None

    def forget_promises(self, broker: str, epoch: int) -> None:
        self._promises.forget(self._promises.before(broker, epoch))

    def __len__(self) -> int:
        return len(self._ticks)


def epoch_of(pubend: str) -> int:
    """A pubend's epoch (``<broker>~<epoch>``); -1 if it names none."""
    epoch = pubend.partition("~")[2]
    return int(epoch) if epoch.isascii() and epoch.isdigit() and len(epoch) <= 18 else -1


class Promises:
    """A broker's acknowledgements of other pubends (PubendLog.promised): per pubend the tick
    acknowledged (``ticks``), and per publishing broker the epochs kept, in order."""

    def __init__(self) -> None:
        self.ticks: dict[str, int] = {}
        self._epochs: dict[str, list[tuple[int, str]]] = {}

    def keep(self, pubend: str, tick: int, limit: int | None = MAX_PROMISED_EPOCHS) -> list | None:
        """Note that ``pubend`` was acknowledged up to ``tick``, keeping at most ``limit``
        epochs of its broker (None: any number): the pubends forgotten to make room, the
        oldest (None, and nothing noted: ``pubend`` is older than every one of those kept)."""
        ticks = self.ticks
        if pubend in ticks:
            ticks[pubend] = tick
            return []
        if self.refuses(pubend, limit):
            return None
        epochs = self._epochs.setdefault(pubend.partition("~")[0], [])
        gone: list[str] = []
        while limit is not None and len(epochs) >= limit:
            gone.append(epochs.pop(0)[1])
        insort(epochs, (epoch_of(pubend), pubend))
        ticks[pubend] = tick
        for old in gone:
            del ticks[old]
        return gone

    def refuses(self, pubend: str, limit: int | None = MAX_PROMISED_EPOCHS) -> bool:
        """Whether :meth:`keep` would not note ``pubend`` (older than every one of ``limit``
        epochs of its broker kept)."""
        if limit is None or pubend in self.ticks:
            return False
        epochs = self._epochs.get(pubend.partition("~")[0], ())
        return len(epochs) >= limit and (epoch_of(pubend), pubend) < epochs[0]

    def before(self, broker: str, epoch: int) -> list[str]:
        """The pubends of ``broker`` kept whose epoch is below ``epoch``."""
        epochs = self._epochs.get(broker)
        if not epochs or epochs[0][0] >= epoch:
            return []
        return [p for _, p in epochs[: bisect_left(epochs, (epoch,))]]

    def forget(self, pubends: list[str]) -> None:
        for pubend in pubends:
            if self.ticks.pop(pubend, None) is None:
                continue
            broker = pubend.partition("~")[0]
            epochs = self._epochs[broker]
            epochs.remove((epoch_of(pubend), pubend))
            if not epochs:
                del self._epochs[broker]


def remember(
    publishers: dict[str, PublisherState],
    publisher: str,
    state: PublisherState,
    limit: int = MAX_PUBLISHERS,
) -> str | None:
    """Note ``publisher``'s newest state, the most recently active last; beyond ``limit``
    the least recently active is forgotten: returns it (None if none was)."""
    publishers.pop(publisher, None)
    publishers[publisher] = state
    if len(publishers) > limit:
        gone = next(iter(publishers))
        del publishers[gone]
        return gone
    return None
