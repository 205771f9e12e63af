"""A durable session that roams: resume anywhere, follow a redirect, fail over by itself.

Theory of operation
-------------------
:class:`DurableSession` keeps the session's *resume token* — the replicator holding it, that
replicator's store, and the last epoch the application took — and opens the session on one
connection after another. Each batch of deliveries is acknowledged when the application asks
for the next one, so the replicator resumes the session after what the application has; a
delivery at or below the token's epoch (one the replicator had sent before a resume crossed
it) is dropped, so the stream the application sees has each epoch once, in order.

The session moves when the broker says so — an operator's ``ges roam`` names the broker to
resume at — and when its connection fails: then it tries the other brokers of the topology,
those sharing the most units with the last one first, and that one again last, with a
growing pause between rounds. Being taken over by another connection, or the session
ending, ends it here (:class:`SessionEnded`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from ges.client._connect import connect
from ges.errors import BrokerUnreachable, OperationError, PermissionDenied
from ges.records import SessionDelivery
from ges.topology import Topology, broker_order_key
from ges.wire import messages as m

#: Seconds between rounds of failover attempts: the first, and the most it doubles to.
RETRY_FIRST = 0.2
RETRY_MAX = 5.0
#: Seconds a broker has to open the session (it may look for it at every replicator).
OPEN_WAIT = 30.0
#: Seconds the last acknowledgement waits to be kept (made durable by the replicator) as a
#: session's ``running`` block ends.
KEPT_WAIT = 2.0


class SessionEnded(OperationError):
    """The session stopped here for good: taken over by another connection, or ended."""


@attrs.define
class Token:
    """What a roaming client presents: the replicator, its store, the last epoch it has."""

    replicator: str = ""
    store: str = ""
    epoch: int = -1


@attrs.frozen
class Move:
    """The session opened at ``to`` (after ``frm``; '' the first time): ``replayed`` events
    were stored for it before that open (caught up first), ``why`` it moved."""

    frm: str
    to: str
    replayed: int
    why: str
    created: bool


class DurableSession:
    """Durable session ``name`` of ``topology``, first opened at ``broker``.

    ``subs``: its subscriptions (None: resume with the stored ones). ``connect_args(broker)``:
    the keyword arguments of :func:`connect` for a broker (TLS, token). ``on_move(move)`` is
    called at each open."""

    def __init__(
        self,
        topology: Topology,
        name: str,
        broker: str,
        subs: Sequence[m.SessionSub] | None,
        *,
        connect_args: Callable[[str], dict] = lambda broker: {},
        on_move: Callable[[Move], None] = lambda move: None,
        token: Token | None = None,
        max_events: int = 0,
        max_age: float = 0.0,
        fallback: Sequence[m.SessionSub] | None = None,
    ):
        self.topology = topology
        self.name = name
        self.broker = broker
        self.subs = None if subs is None else list(subs)
        self.connect_args = connect_args
        self.on_move = on_move
        self.token = token or Token()
        #: its own retention limits (0: the topology's), sent with the first open
        self.limits = (max_events, max_age)
        #: without ``subs``: what to make the session with if it does not exist yet
        self.fallback = None if fallback is None else list(fallback)
        #: the opens so far
        self.moves: list[Move] = []
        self._receive: trio.MemoryReceiveChannel | None = None
        self._error: OperationError | None = None
        #: the last batch handed out and not acknowledged: (its stream, its last epoch)
        self._handed = None
        #: the stream of the open answered last (an acknowledgement to be kept goes there), and
        #: the last epoch the replicator said it kept
        self._stream = None
        self._kept = -1

    @asynccontextmanager
    async def running(self) -> AsyncIterator[DurableSession]:
        """Run the session (connections, moves) while the block is open: iterate
        :meth:`batches` inside it."""
        send, receive = trio.open_memory_channel(0)
        self._receive = receive
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run, send)
                try:
                    yield self
                    # the block ended normally: it has the last batch (kept, if it comes soon)
                    with trio.move_on_after(KEPT_WAIT):
                        await self.ack(kept=True)
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # the caller's own exception, not one wrapped by this internal nursery
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def ack(self, upto: int | None = None, *, kept: bool = False) -> bool | None:
        """Acknowledge every batch handed out so far — or, with ``upto``, its deliveries up to
        that epoch only (an application that stopped part way through a batch): the session
        resumes after them. Asking for the next batch, or the ``running`` block ending
        normally, acknowledges the last one. ``kept``: wait until the replicator has made the
        acknowledgement durable (also of batches acknowledged before), and say whether it
        did (None: nothing was handed out); a process that stops for good and does not keep
        its token asks for that, and bounds the wait."""
        if self._handed is None:
            if not kept or self._stream is None or self.token.epoch < 0:
                return None
            if self.token.epoch <= self._kept:
                return True  # (said kept already)
            stream, epoch = self._stream, self.token.epoch
        else:
            stream, epoch = self._handed
            if upto is not None:
                epoch = min(epoch, upto)
            self.token.epoch = max(self.token.epoch, epoch)
            epoch = self.token.epoch
        done = await stream.ack(epoch, kept=kept)
        self._handed = None  # only once sent: an ack interrupted before it is sent again
        if kept and done:
            self._kept = max(self._kept, epoch)
        return done

    async def batches(self) -> AsyncIterator[list[SessionDelivery]]:
        """The session's deliveries, a batch at a time, across every move; each batch is
        acknowledged when the next one is asked for. Raises what ended the session
        (:class:`SessionEnded`, a refusal)."""
        if self._receive is None:
            raise RuntimeError("iterate a session inside `async with session.running()`")
        async for stream, batch in self._receive:
            self._handed = (stream, batch[-1].epoch)
            yield batch
            await self.ack()
        if self._error is not None:
            raise self._error

    async def _run(self, out: trio.MemorySendChannel) -> None:
        """Open the session on one connection after another and hand its batches over."""
        async with out:
            try:
                await self._roam(out)
            except OperationError as exc:
                self._error = exc

    async def _roam(self, out: trio.MemorySendChannel) -> None:
        broker, why, frm = self.broker, "opened", ""
        failures = 0
        while True:
            closed: m.SessionClosed | None = None
            try:
                spec = self.topology.brokers[broker]
                async with connect(
                    spec.host,
                    spec.port,
                    topology=self.topology,
                    client_id=self.name,
                    **self.connect_args(broker),
                ) as client:
                    token = self.token
                    answer = None
                    with trio.move_on_after(OPEN_WAIT):
                        answer, stream = await client.open_session(
                            self.name,
                            self.subs,
                            replicator=token.replicator,
                            store=token.store,
                            epoch=token.epoch,
                            max_events=self.limits[0],
                            max_age=self.limits[1],
                            fallback=self.fallback if self.subs is None else None,
                        )
                    if answer is None:
                        why = f"broker {broker} did not open the session within {OPEN_WAIT:g}s"
                    elif isinstance(answer, m.SessionClosed):
                        closed = answer
                    else:
                        failures = 0
                        self.subs = None  # entered: later opens resume with them
                        self._stream = stream  # (where an acknowledgement goes now)
                        if token.store and answer.store != token.store:
                            token.epoch = -1  # another store: its epochs are not ours
                        token.replicator, token.store = answer.replicator, answer.store
                        if token.epoch < 0:
                            token.epoch = answer.start
                        move = Move(frm, broker, answer.backlog, why, answer.created)
                        self.moves.append(move)
                        self.broker = broker
                        self.on_move(move)
                        sent = token.epoch
                        async for batch in stream.batches():
                            batch = [d for d in batch if d.epoch > max(sent, token.epoch)]
                            if batch:
                                await out.send((stream, batch))
                                sent = batch[-1].epoch
                        closed = stream.closed
                        if closed is None:
                            why = f"connection lost: {client.closed_reason or 'closed'}"
            except PermissionDenied:
                raise
            except BrokerUnreachable as exc:
                why = str(exc)
            except OperationError as exc:
                if "unreachable" not in str(exc) and "did not complete" not in str(exc):
                    raise
                why = str(exc)
            if closed is not None:
                if closed.ended or closed.reason.startswith("taken over"):
                    raise SessionEnded(f"session {self.name}: {closed.reason}")
                why = closed.reason
                if closed.to:
                    frm, broker = self.broker, closed.to
                    continue
                if closed.replicator and closed.replicator != self.token.replicator:
                    # handed over (or being): the token's epochs were the old replicator's,
                    # and it sends the session on only once the client has acknowledged them
                    self.token = Token(closed.replicator)
                    failures = 0
                    if self.moves:  # it streamed here: a move (else still its first open)
                        frm = self.broker
                    continue  # at once, there
                if closed.retry:  # this broker is fine; the session's replicator is not, yet
                    failures += 1
                    await trio.sleep(min(RETRY_FIRST * 2 ** min(failures, 5), RETRY_MAX))
                    continue
            failures += 1
            if failures > 1:  # every broker once, then pause between rounds
                await trio.sleep(min(RETRY_FIRST * 2 ** min(failures // 4, 8), RETRY_MAX))
            frm, broker = self.broker, self._next(broker, failures)

    def _next(self, failed: str, failures: int) -> str:
        """The broker to try after ``failed``: nearest to the last one first, it last."""
        order = failover_order(self.topology, self.broker)
        return order[(failures - 1) % len(order)]


def failover_order(topology: Topology, broker: str) -> list[str]:
    """Every broker, those in the smallest unit around ``broker`` first, ``broker`` last."""
    others = sorted(
        (b for b in topology.brokers if b != broker),
        key=lambda b: (topology.link_level(broker, b), broker_order_key(b)),
    )
    return [*others, broker]
