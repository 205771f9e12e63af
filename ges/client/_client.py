"""The client library's connection: publishing with a window, subscriptions, keepalives
(opening one: ges.client._connect).

Theory of operation
-------------------
A :class:`Client` holds one framed connection (ges.transport) to one broker and a reader task
that hands each message to whoever waits for it: a ``PubAck`` to its publish, a ``SubAck`` to its
request (only the answer to the latest request of a subscription says how it stands), a
``Deliver`` to its :class:`Subscription`, whose buffer is bounded in bytes (the reader stops
reading the socket while it is full, so a slow application slows its broker's queue, not this
process's memory). Publishing is pipelined: at most ``window`` batches (and WINDOW_BYTES of
events) are unacknowledged, each
batch split into frames within the frame limit, and an event over the event limit is refused
before anything is sent. An idempotent publisher numbers its events so a resend after a failure
is published once. A keepalive goes every KEEPALIVE seconds. When the connection ends, every
waiter is freed and :attr:`Client.closed_reason` says why — the broker's ``Error`` if it sent one
(a slow consumer is told so), else what the connection saw.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import suppress

import msgspec
import trio

from ges.errors import OperationError, PermissionDenied
from ges.matching.model import (
    Conjunction,
    Constraint,
    Profile,
    conjunction_from_wire,
    profile_to_wire,
)
from ges.records import Delivery, SessionDelivery
from ges.transport.connection import Connection, ConnectionClosed
from ges.wire import MAX_EVENT_BYTES, FrameError, encode, event_size
from ges.wire import messages as m
from ges.wire.frames import HEADER_SIZE

_encode_event = msgspec.msgpack.Encoder().encode

#: Unacknowledged publish frames in flight per client: deep enough that a publisher of one
#: event per publish keeps a broker busy across a log commit (16 held one such publisher to
#: some 12,000 events/s); WINDOW_BYTES bounds what they hold.
DEFAULT_WINDOW = 1024
#: Bytes of events (about: ges.wire.event_size) in unacknowledged publishes per client: a
#: stalled broker stops the publisher once this much is in flight.
WINDOW_BYTES = 4 * 1024 * 1024
#: Bytes of deliveries (about: ges.wire.event_size) buffered per subscription before the
#: client stops reading its socket (and the broker, seeing its queue fill, treats it as a slow
#: consumer).
SUBSCRIPTION_BUFFER_BYTES = 64 * 1024 * 1024
CONNECT_TIMEOUT = 5.0
#: Reports of a watch (:meth:`Client.watch`) waiting to be taken: two rounds of a 1,024-broker
#: network. A report is bounded (ges.core.watch: at most 64 lines of 400 characters beside its
#: counters, a few hundred bytes without lines), so this is a bound in bytes too.
MAX_REPORTS = 2048
#: Seconds between keepalives: a broker disconnects a client it has heard nothing from for
#: three of these (ges.runtime.broker.CLIENT_IDLE_TIMEOUT).
KEEPALIVE = 10.0


def _stamped(events: Sequence[m.Event]) -> list[m.Event]:
    """The events, each without a publish time (0) given this client's clock now: delivery
    records and latency figures need it."""
    now = 0
    out = []
    for ev in events:
        if not ev.published_at:
            now = now or time.time_ns()
            ev = m.Event(ev.attributes, ev.payload, now)
        out.append(ev)
    return out


class Subscription:
    """An async iterator over deliveries for one subscription."""

    def __init__(self, client: Client, sub_id: int, profile: Profile):
        self.client = client
        self.id = sub_id
        self.profile = profile
        #: every keeper of the broker's units has the profile (the last SubAck said so): every
        #: matching event published from then on is delivered. False while some keeper is
        #: unreachable; with reliable delivery, events from beyond that keeper start only once
        #: it has the profile (a later SubAck sets this)
        self.complete = False
        # batches with their size; bounded in bytes by the reader (SUBSCRIPTION_BUFFER_BYTES)
        self._send, self._receive = trio.open_memory_channel[tuple[list, int]](float("inf"))
        self._ready: deque[Delivery] = deque()
        self._buffered = 0
        self._room = trio.Event()

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        if not self._ready:
            try:
                batch = await self._next_batch()
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
            self._ready.extend(batch)
        return self._ready.popleft()

    async def batches(self) -> AsyncIterator[list[Delivery]]:
        """Deliveries as they arrive, a batch at a time (cheaper than one at a time)."""
        if self._ready:
            batch = list(self._ready)
            self._ready.clear()
            yield batch
        while True:
            try:
                batch = await self._next_batch()
            except trio.EndOfChannel:
                return
            yield batch

    async def _next_batch(self) -> list[Delivery]:
        batch, size = await self._receive.receive()
        self._buffered -= size
        if self._buffered <= SUBSCRIPTION_BUFFER_BYTES:
            self._room.set()
        return batch

    async def _put(self, batch: list[Delivery], size: int) -> None:
        """The reader hands a batch over; it waits while the subscription holds too much."""
        self._send.send_nowait((batch, size))
        self._buffered += size
        while self._buffered > SUBSCRIPTION_BUFFER_BYTES:
            self._room = trio.Event()
            await self._room.wait()


class SessionStream(Subscription):
    """A durable session open on one connection: its deliveries in epoch order (a bounded
    buffer, as a subscription's), acknowledged with :meth:`ack`; :attr:`closed` says why the
    broker stopped it (taken over, moved, ended, its replicator unreachable)."""

    def __init__(self, client: Client, name: str):
        super().__init__(client, 0, Profile(name))
        self.name = name
        self.closed: m.SessionClosed | None = None

    async def ack(self, epoch: int, *, kept: bool = False) -> bool:
        """The application has every event up to ``epoch``: the session resumes after it.
        With ``kept``, wait until the replicator has made that durable (a process that stops
        and forgets the session's token needs it: a replicator killed before then could
        lose it); whether it was (bound the wait with a trio timeout)."""
        with suppress(OperationError):
            if not kept:
                await self.client._send(m.SessionAck(self.name, epoch))
                return True
            req = next(self.client._reqs)
            try:
                answer = await self.client._ask(
                    m.SessionAck(self.name, epoch, req=req), req, self.name
                )
            finally:
                self.client._answers.pop(req, None)
            return type(answer) is m.SessionKept
        return False


class Client:
    """A connection to one broker. Create it with :func:`connect`."""

    def __init__(
        self,
        conn: Connection,
        *,
        broker: str,
        window: int,
        client_id: str = "",
        keepalive: float = KEEPALIVE,
    ):
        self.conn = conn
        #: seconds between keepalives
        self.keepalive = keepalive
        self.broker = broker
        #: the id this client gave the broker; with idempotent publishing (``first=``), the
        #: publisher's id, under which the pubend remembers its event numbers
        self.id = client_id
        #: events the broker acknowledged so far (new ones, and duplicates of ones it already
        #: had), and of those the duplicates (idempotent publishing)
        self.acknowledged = 0
        self.duplicates = 0
        self._seq = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._window = trio.Semaphore(window)
        self._window_size = window
        #: bytes of events in unacknowledged publishes, at most WINDOW_BYTES (but for one)
        self._unacked_bytes = 0
        self._bytes_room = trio.Event()
        self._all_acked = trio.Event()
        self._all_acked.set()
        #: seq -> [trio.Event, PubAck | None, events, bytes]
        self._acks: dict[int, list] = {}
        #: (sub_id, req) -> set when that request's SubAck came
        self._subacks: dict[tuple[int, int], trio.Event] = {}
        self._reqs = itertools.count(1)
        #: sub_id -> the req of the latest request for it (older requests' SubAcks are stale)
        self._latest_req: dict[int, int] = {}
        self._subs: dict[int, Subscription] = {}
        #: durable sessions open on this connection, and answers awaited by request number
        self._sessions: dict[str, SessionStream] = {}
        self._answers: dict[int, list] = {}
        self._stats: deque[list] = deque()
        self._link_acks: deque[list] = deque()  # [trio.Event, LinkControlled | None], in order
        #: reports of a watch (:meth:`watch`): where the reader puts them, and their channel
        self._reports: trio.MemorySendChannel | None = None
        self._reports_out: trio.MemoryReceiveChannel | None = None
        self._errors: list[str] = []
        #: the last Error was a refusal for want of permission
        self._denied = False
        self._closed: str | None = None

    # -- publishing --------------------------------------------------------------------------

    async def publish(self, events: Sequence[m.Event], *, first: int | None = None) -> m.PubAck:
        """Publish a batch and wait for the broker to acknowledge it.

        A batch too large for one frame goes as several (then the acknowledgement spans them:
        ``first_tick`` of the first, ``last_tick`` of the last, the duplicates of all — other
        publishers' events may lie in between). ``first``: idempotent publishing — event ``i``
        of the batch is this client's event number ``first + i`` (numbers from 1, kept by the
        publisher across connections; see :class:`ges.wire.messages.Publish`): one the pubend
        already published is acknowledged as a duplicate, not published again.

        Raises:
            ValueError: an event is over MAX_EVENT_BYTES (nothing of the batch is sent).
            OperationError: the connection was lost before the broker acknowledged the batch
                (``acknowledged`` says how many events were).
        """
        seqs = await self._send_publish(events, first)
        acks = [await self._wait_ack(seq) for seq in seqs]
        return m.PubAck(
            acks[-1].seq,
            acks[-1].pubend,
            acks[0].first_tick,
            acks[-1].last_tick,
            sum(a.duplicates for a in acks),
        )

    async def publish_nowait(self, events: Sequence[m.Event], *, first: int | None = None) -> int:
        """Queue a batch (as :meth:`publish`); waits only while ``window`` frames are
        unacknowledged. Returns the seq of its last frame."""
        return (await self._send_publish(events, first))[-1]

    async def flush(self) -> None:
        """Wait until every published batch has been acknowledged."""
        await self._all_acked.wait()
        self._raise_if_closed()

    async def _send_publish(self, events: Sequence[m.Event], first: int | None) -> list[int]:
        self._raise_if_closed()
        if first is not None and (first < 1 or not self.id):
            raise ValueError("idempotent publishing needs a client id and numbers from 1")
        events = _stamped(events)
        publisher = self.id if first is not None else ""
        seqs = []
        weight = sum(map(event_size, events))
        parts = _frames_of(events, first, weight)
        for chunk, number in parts:
            await self._window.acquire()
            size = weight if len(parts) == 1 else sum(map(event_size, chunk))
            while self._unacked_bytes and self._unacked_bytes + size > WINDOW_BYTES:
                if self._closed is not None:
                    break
                if self._bytes_room.is_set():
                    self._bytes_room = trio.Event()
                await self._bytes_room.wait()
            if self._closed is not None:
                self._window.release()
                self._raise_if_closed()
            seq = next(self._seq)
            self._acks[seq] = [trio.Event(), None, len(chunk), size]
            self._unacked_bytes += size
            self._all_acked = trio.Event()
            await self._send(m.Publish(seq, chunk, publisher, number or 0))
            seqs.append(seq)
        return seqs

    def _acked(self, seq: int, ack: m.PubAck) -> None:
        waiter = self._acks.pop(seq, None)
        if waiter is not None:
            waiter[1] = ack
            waiter[0].set()
            self.acknowledged += waiter[2]
            self.duplicates += ack.duplicates
            self._unacked_bytes -= waiter[3]
            self._bytes_room.set()
            if not self._acks:
                self._all_acked.set()
            self._window.release()

    async def _wait_ack(self, seq: int) -> m.PubAck:
        waiter = self._acks.get(seq)
        if waiter is not None:
            await waiter[0].wait()
        self._raise_if_closed()
        return waiter[1]

    # -- subscribing -------------------------------------------------------------------------

    async def subscribe(
        self, profile: Profile | Conjunction | Sequence[Constraint | m.Constraint] = ()
    ) -> Subscription:
        """Subscribe with a profile (or one conjunction, or a list of constraints that must all
        hold; empty: every event); returns once the broker accepted it."""
        self._raise_if_closed()
        profile = as_profile(profile)
        sub = Subscription(self, next(self._sub_ids), profile)
        self._subs[sub.id] = sub
        await self._subscribe(sub.id, profile)
        return sub

    async def change(
        self,
        sub: Subscription,
        profile: Profile | Conjunction | Sequence[Constraint | m.Constraint],
    ) -> None:
        """Replace a subscription's profile; returns once the broker has the new one. With
        reliable delivery, events matching both profiles keep arriving in between, with no gap;
        those only the old one matches stop, and those only the new one matches start at its
        starting point (every one published after this returns with ``sub.complete`` set)."""
        self._raise_if_closed()
        if self._subs.get(sub.id) is not sub:
            raise ValueError(f"subscription {sub.id} is not open on this client")
        profile = as_profile(profile)
        await self._subscribe(sub.id, profile)
        sub.profile = profile

    async def _subscribe(self, sub_id: int, profile: Profile) -> None:
        """Send a Subscribe (new, or replacing ``sub_id``'s profile) and wait for its SubAck."""
        req = self._latest_req[sub_id] = next(self._reqs)
        done = self._subacks[(sub_id, req)] = trio.Event()
        await self._send(m.Subscribe(sub_id, profile_to_wire(profile), profile.id, req))
        await done.wait()
        self._raise_if_closed()

    async def unsubscribe(self, sub: Subscription) -> None:
        req = self._latest_req[sub.id] = next(self._reqs)
        done = self._subacks[(sub.id, req)] = trio.Event()
        await self._send(m.Unsubscribe(sub.id, req))
        await done.wait()
        self._subs.pop(sub.id, None)
        self._latest_req.pop(sub.id, None)
        sub._send.close()

    # -- durable sessions --------------------------------------------------------------------

    async def open_session(
        self,
        name: str,
        subs: Sequence[m.SessionSub] | None,
        *,
        replicator: str = "",
        store: str = "",
        epoch: int = -1,
        max_events: int = 0,
        max_age: float = 0.0,
        fallback: Sequence[m.SessionSub] | None = None,
    ) -> tuple[m.SessionOpened | m.SessionClosed, SessionStream]:
        """Open (or resume, or take over) durable session ``name`` on this connection; the
        broker's answer — ``SessionOpened``, or ``SessionClosed`` when it cannot be opened now
        (``retry``) — and the stream its deliveries arrive on.

        Raises:
            OperationError: the broker refused (a bad name or profile, another owner's
                session, one that does not exist without subscriptions).
        """
        self._raise_if_closed()
        stream = SessionStream(self, name)
        self._sessions[name] = stream
        req = next(self._reqs)
        answer = await self._ask(
            m.SessionOpen(
                name,
                None if subs is None else list(subs),
                replicator=replicator,
                store=store,
                epoch=epoch,
                req=req,
                max_events=max_events,
                max_age=max_age,
                fallback=None if fallback is None else list(fallback),
            ),
            req,
            name,
        )
        return answer, stream

    async def sessions(self, action: str, name: str = "", to: str = "") -> m.SessionList:
        """Ask this broker's replicator about its durable sessions (``list``, ``end``,
        ``roam``, ``find``)."""
        self._raise_if_closed()
        req = next(self._reqs)
        return await self._ask(m.SessionControl(action, name, to, req), req)

    async def _ask(self, msg, req: int, name: str = ""):
        waiter = self._answers[req] = [trio.Event(), None, name]
        await self._send(msg)
        await waiter[0].wait()
        self._answers.pop(req, None)
        if waiter[1] is None:
            if self._errors:
                kind = PermissionDenied if self._denied else OperationError
                raise kind(f"broker {self.broker}: {self._errors[-1]}")
            self._raise_if_closed()
        return waiter[1]

    # -- introspection -----------------------------------------------------------------------

    async def stats(self) -> m.Stats:
        self._raise_if_closed()
        waiter = [trio.Event(), None]
        self._stats.append(waiter)
        await self._send(m.StatsRequest())
        await waiter[0].wait()
        self._raise_if_closed()
        return waiter[1]

    async def watch(self, interval: float) -> trio.MemoryReceiveChannel:
        """Every broker's :class:`~ges.wire.messages.Report` each ``interval`` seconds, through
        this broker (ges.core.watch), for as long as the connection lasts: the channel ends
        with it (``closed_reason`` says why — a refusal, say: watching is an operator's
        request). At most MAX_REPORTS wait in the channel; while it is full this client reads
        nothing more, and the broker in time cuts it as a slow consumer."""
        self._raise_if_closed()
        if self._reports is None:
            self._reports, self._reports_out = trio.open_memory_channel(MAX_REPORTS)
        await self._send(m.Watch(interval))
        return self._reports_out

    # -- administration ----------------------------------------------------------------------

    async def link(self, peer: str, *, up: bool) -> bool:
        """Cut (``up=False``) or restore (``up=True``) this broker's link to its neighbour
        ``peer``; returns once the broker has applied it (a cut link is down in its core by
        then), True if that changed anything.

        Cut state is soft: a broker that restarts has all its links again. Only this end acts;
        cut the link at both ends (``ges link down``) to keep the other from redialling.

        Raises:
            OperationError: ``peer`` is not a neighbour of this broker (the broker answers with
                an error, which, as every broker error does, ends this connection), or the
                connection is lost.
        """
        self._raise_if_closed()
        waiter = [trio.Event(), None]
        self._link_acks.append(waiter)
        await self._send(m.LinkControl(peer, up))
        await waiter[0].wait()
        if waiter[1] is None and self._errors:
            kind = PermissionDenied if self._denied else OperationError
            raise kind(f"broker {self.broker}: {self._errors[-1]}")
        self._raise_if_closed()
        return waiter[1].changed

    # -- plumbing ----------------------------------------------------------------------------

    async def _send(self, message) -> None:
        try:
            await self.conn.send(encode(message))
        except ConnectionClosed:
            self._raise_if_closed()
            raise OperationError(f"connection to broker {self.broker} closed") from None

    def _raise_if_closed(self) -> None:
        if self._closed is None:
            return
        if self._denied:  # the broker refused a request; the connection ended with it
            raise PermissionDenied(f"broker {self.broker} {self._closed}")
        raise OperationError(f"connection to broker {self.broker} lost: {self._closed}")

    @property
    def closed_reason(self) -> str | None:
        """Why the connection ended (None while it is open)."""
        return self._closed

    async def _keepalive(self) -> None:
        """A frame every ``keepalive`` seconds, so the broker knows an idle client is there."""
        while True:
            await trio.sleep(self.keepalive)
            try:
                await self.conn.send(encode(m.Heartbeat()))
            except ConnectionClosed:
                return

    async def _reader(self) -> None:
        try:
            async for batch in self.conn.read_messages():
                now = time.time_ns()
                for msg in batch:
                    kind = type(msg)
                    if kind is m.Deliver:
                        sub = self._subs.get(msg.sub_id)
                        if sub is not None:
                            pubend = msg.pubend
                            deliveries = [
                                Delivery(pubend, it.tick, it.hops, it.event, now)
                                for it in msg.items
                            ]
                            size = sum(event_size(it.event) for it in msg.items)
                            with suppress(trio.ClosedResourceError):
                                await sub._put(deliveries, size)
                    elif kind is m.PubAck:
                        if msg.seqs == 1:
                            self._acked(msg.seq, msg)
                        else:  # several publishes at once: each had its own events' ticks
                            tick = msg.first_tick
                            for seq in range(msg.seq - msg.seqs + 1, msg.seq + 1):
                                waiter = self._acks.get(seq)
                                n = 0 if waiter is None else waiter[2]
                                one = m.PubAck(seq, msg.pubend, tick, tick + n - 1)
                                self._acked(seq, one)
                                tick += n
                    elif kind is m.SubAck:
                        # only the answer to the latest request says how the subscription stands
                        sub = self._subs.get(msg.sub_id)
                        if sub is not None and self._latest_req.get(msg.sub_id) == msg.req:
                            sub.complete = msg.complete
                        done = self._subacks.pop((msg.sub_id, msg.req), None)
                        if done is not None:
                            done.set()
                    elif kind is m.SessionEvents:
                        stream = self._sessions.get(msg.name)
                        if stream is not None:
                            deliveries = [
                                SessionDelivery(
                                    it.pubend,
                                    it.item.tick,
                                    it.item.hops,
                                    it.item.event,
                                    now,
                                    it.epoch,
                                    tuple(it.subs),
                                    it.gap_to,
                                    it.why,
                                )
                                for it in msg.items
                            ]
                            size = sum(event_size(it.item.event) for it in msg.items)
                            with suppress(trio.ClosedResourceError):
                                await stream._put(deliveries, size)
                    elif kind is m.SessionOpened or kind is m.SessionList or kind is m.SessionKept:
                        waiter = self._answers.get(msg.req)
                        if waiter is not None:
                            waiter[1] = msg
                            waiter[0].set()
                    elif kind is m.SessionClosed:
                        for waiter in self._answers.values():
                            if waiter[2] == msg.name and waiter[1] is None:
                                waiter[1] = msg  # the open it answers could not be done now
                                waiter[0].set()
                        stream = self._sessions.pop(msg.name, None)
                        if stream is not None:
                            stream.closed = msg
                            stream._send.close()
                    elif kind is m.Stats:
                        if self._stats:
                            waiter = self._stats.popleft()
                            waiter[1] = msg
                            waiter[0].set()
                    elif kind is m.Report:
                        if self._reports is not None:
                            with suppress(trio.ClosedResourceError):
                                await self._reports.send(msg)
                    elif kind is m.LinkControlled:
                        if self._link_acks:
                            waiter = self._link_acks.popleft()
                            waiter[1] = msg
                            waiter[0].set()
                    elif kind is m.Error:
                        self._errors.append(msg.reason)
                        self._denied = msg.denied
                        self._fail(
                            f"refused: {msg.reason}"
                            if msg.denied
                            else f"broker error: {msg.reason}"
                        )
                        return
        except FrameError as exc:
            self._fail(f"protocol error: {exc}")
            return
        self._fail(self.conn.close_reason or "closed by broker")

    def _fail(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
        for waiter in self._acks.values():
            waiter[0].set()
            self._window.release()  # never to be acknowledged: free the publisher
        self._acks.clear()
        self._unacked_bytes = 0
        self._bytes_room.set()
        self._all_acked.set()
        for done in self._subacks.values():
            done.set()
        for waiter in self._stats:
            waiter[0].set()
        for waiter in self._link_acks:
            waiter[0].set()
        for waiter in self._answers.values():
            waiter[0].set()
        for sub in [*self._subs.values(), *self._sessions.values()]:
            sub._send.close()
        if self._reports is not None:
            self._reports.close()
        self.conn.close(reason)


def _frames_of(
    events: list[m.Event], first: int | None, weight: int | None = None
) -> list[tuple[list, int | None]]:
    """A batch as the parts that fit a frame each, with the number of each part's first event
    (idempotent publishing; None otherwise). One part unless the batch is over the frame limit.
    ``weight``: the batch's ``event_size`` sum, if the caller has it.

    Raises:
        ValueError: an event is over MAX_EVENT_BYTES.
    """
    if weight is None:
        weight = sum(map(event_size, events))
    size = HEADER_SIZE + 64 + weight
    if size <= MAX_EVENT_BYTES // 2:  # the usual case: nothing near any limit, no encoding
        return [(events, first)]
    sizes = [len(_encode_event(ev)) for ev in events]
    for i, n in enumerate(sizes):
        if n > MAX_EVENT_BYTES:
            raise ValueError(
                f"event {i} of the batch is {n} bytes encoded, over the {MAX_EVENT_BYTES}-byte "
                "limit of one event"
            )
    parts: list[tuple[list, int | None]] = []
    start, load = 0, 0
    for i, n in enumerate(sizes):
        if i > start and load + n > MAX_EVENT_BYTES:  # a frame's worth, leaving its headroom
            parts.append((events[start:i], None if first is None else first + start))
            start, load = i, 0
        load += n + 8
    parts.append((events[start:], None if first is None else first + start))
    return parts


def as_profile(profile: Profile | Conjunction | Sequence[Constraint | m.Constraint]) -> Profile:
    """A ``Profile`` from any of the forms ``subscribe`` accepts (ValueError if invalid)."""
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, Conjunction):
        return Profile("", (profile,))
    items = list(profile)
    if all(isinstance(c, Constraint) for c in items):
        return Profile("", (Conjunction(items),))
    return Profile("", (conjunction_from_wire(items),))
