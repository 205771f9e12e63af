"""The live view of a running network (``ges monitor``, and ``ges up`` unless ``--no-live``).

It watches the network through one broker (ges.core.watch): a ``Watch`` sent to the broker
named, or to the first of the topology that answers, after which every broker of the network
sends that broker a report each interval — its counters and the lines it logged — and the
broker passes them on. If that broker goes away the monitor watches through the next that
answers (the one named, again, if one was). A broker whose reports stop is shown as not
answering after :data:`SILENT_AFTER` intervals. A network that floods (``--routing flood``)
cannot relay reports: the monitor then asks every broker for its counters (a ``StatsRequest``
each interval), as ``--poll`` makes it do anyway.

What the brokers say goes to the network's model (ges.monitor.model: rates, link states, unit
health, the event log) in batches, :meth:`Monitor.feed` handing each to a callback — on the
same trio thread for the plain view, through ``call_from_thread`` for the interactive one
(ges.monitor.app), so the model is only touched on one thread.
"""

from __future__ import annotations

import ssl
import time
from collections import Counter
from collections.abc import Callable

import attrs
import msgspec
import trio
from rich.console import Console, Group
from rich.live import Live

from ges.client import broker_stats, connect
from ges.errors import OperationError
from ges.monitor.model import NetworkModel
from ges.monitor.tree import overview
from ges.topology import Topology
from ges.wire import FrameError
from ges.wire import messages as m

#: Seconds between refreshes.
REFRESH = 1.0
#: Seconds a broker has to answer one request for its counters, or a connection.
TIMEOUT = 2.0
#: A broker that sent no report for this many intervals (and at least SILENT_MIN seconds)
#: counts as not answering.
SILENT_AFTER = 3
SILENT_MIN = 3.0
#: Seconds between two batches of reports handed to the model (at most; the interval if
#: shorter).
BATCH_EVERY = 0.5


@attrs.define
class Batch:
    """What the brokers said since the last batch, for :meth:`Monitor.apply`."""

    now: float
    #: (broker, its Stats or why it did not answer, when)
    answers: list = attrs.Factory(list)
    #: (broker, lines, missed, when, the wall clock then)
    lines: list = attrs.Factory(list)
    #: the monitor's own lines: (level, text, when)
    notes: list = attrs.Factory(list)


class Monitor:
    """Watches a network and draws its tree; ``await run()`` until cancelled.

    ``broker``: watch through this broker only (None: the first that answers). ``poll``: ask
    every broker each interval instead of watching through one."""

    def __init__(
        self,
        topology: Topology,
        *,
        console: Console | None = None,
        refresh: float = REFRESH,
        tls: ssl.SSLContext | None = None,
        client_id: str = "monitor",
        broker: str | None = None,
        poll: bool = False,
    ):
        self.topology = topology
        self.tls = tls
        self.client_id = client_id
        self.console = console or Console()
        self.refresh = refresh
        self.broker = broker
        self.poll = poll
        self.model = NetworkModel(topology)
        #: when the first round began (the event log's times count from it)
        self.started: float | None = None
        #: the broker watched through (None: not connected, or polling), and the last one
        self.via: str | None = None
        self.through: str | None = None
        #: when the current watch began (brokers not heard of since are silent after a while)
        self.since = 0.0
        #: reports applied, per broker
        self.heard: Counter = Counter()
        #: no broker answered a whole round of attempts to watch through it
        self.nobody = False

    # -- asking every broker ------------------------------------------------------------------

    async def poll_once(self) -> None:
        """One round: every broker's counters, asked concurrently, into the model."""
        self.apply(await self.collect())

    async def collect(self, brokers: list[str] | None = None) -> Batch:
        """One round's answers, asking every broker (or these), without touching the
        model."""
        if self.started is None:
            self.started = trio.current_time()
        answers: list[tuple[str, m.Stats | str, float]] = []

        async def ask(broker: str) -> None:
            try:
                stats = await broker_stats(**self._reach(broker))
            except OperationError as exc:
                answers.append((broker, str(exc), trio.current_time()))
                return
            # the broker counted the connection that asked: not one of its users
            answers.append((broker, _less_one(stats), trio.current_time()))

        async with trio.open_nursery() as nursery:
            for broker in self.topology.brokers if brokers is None else brokers:
                nursery.start_soon(ask, broker)
        return Batch(trio.current_time(), answers)

    def _reach(self, broker: str) -> dict:
        """How to connect to ``broker``: the keyword arguments of ``connect``."""
        spec = self.topology.brokers[broker]
        return {
            "host": spec.host,
            "port": spec.port,
            "topology": self.topology,
            "client_id": self.client_id,
            "timeout": TIMEOUT,
            "tls": self.tls,
        }

    # -- the model -----------------------------------------------------------------------------

    def apply(self, batch: Batch) -> list:
        """Feed a batch to the model; the log entries it made."""
        model = self.model
        said = [model.note(level, text, at) for level, text, at in batch.notes]
        for broker, lines, missed, at, wall in batch.lines:
            said += model.lines(broker, lines, missed, at, wall)
        for broker, answer, at in sorted(batch.answers, key=lambda a: a[2]):
            if isinstance(answer, str):
                said += model.unreachable(broker, answer, at)
            else:
                self.heard[broker] += 1
                said += model.observe(broker, answer, at)
        if not self.poll:
            said += model.silent(batch.now, self.silent_after(), self.since)
        if batch.answers and all(  # every broker heard of once, or known not to answer
            self.heard[b] or view.error is not None for b, view in model.brokers.items()
        ):
            said += model.health_changes(batch.now)
        return said

    def render(self, height: int | None = None) -> Group:
        """The view; with ``height``, fitted to a terminal that many lines high."""
        return overview(self.model, self.started or 0.0, height=height, source=self.source)

    @property
    def source(self) -> str:
        """Where the reports come from, said in a few words."""
        if self.poll:
            return f"asking every broker every {self.refresh:g} s"
        if self.via is None and self.through is None:
            return "not connected yet"
        return f"through {self.via or self.through}, reports every {self.refresh:g} s"

    # -- feeding -------------------------------------------------------------------------------

    async def feed(self, take: Callable[[Batch], object]) -> None:
        """Forever: what the brokers say, in batches handed to ``take``.

        Raises:
            OperationError: the broker refused to be watched through (no operator role), or
                the broker named does not exist.
        """
        if self.started is None:
            self.started = trio.current_time()
        if not self.poll:
            await self._watch(take)  # returns if the network cannot be watched: then poll
        while True:
            take(await self.collect())
            await trio.sleep(self.refresh)

    async def _watch(self, take) -> None:
        names = list(self.model.brokers)
        if self.broker is not None:
            if self.broker not in self.topology.brokers:
                raise OperationError(f"--broker {self.broker}: not a broker of this topology")
            names = [self.broker]
        first = 0
        while True:
            tried: list[str] = []
            for i in range(len(names)):
                broker = names[(first + i) % len(names)]
                why = await self._watch_through(broker, take)
                if why is None:
                    return  # it cannot relay reports: the caller polls
                tried.append(f"{broker}: {why}")
                if why.startswith("lost"):
                    first = (first + i + 1) % len(names)  # the next after it, first
                    break
            else:
                self.nobody = True
                now = trio.current_time()
                text = "no broker answers: " + "; ".join(tried[:3])
                take(Batch(now, notes=[("warning", text, now)]))
                await trio.sleep(self.refresh)

    async def _watch_through(self, broker: str, take) -> str | None:
        """Watch through ``broker`` until the connection ends: why it ended (None: the
        network floods, and must be polled)."""
        try:
            async with connect(**self._reach(broker)) as client:
                reports = await client.watch(self.refresh)
                self.via = self.through = broker
                self.since = trio.current_time()
                take(Batch(self.since, notes=[("info", f"watching through {broker}", self.since)]))
                await self._relay(broker, reports, take)
                why = client.closed_reason or "closed"
        except OperationError as exc:
            return str(exc)
        finally:
            self.via = None
        if "--poll" in why:  # this network floods: nothing relays reports
            now = trio.current_time()
            take(Batch(now, notes=[("info", f"{broker}: {why}; asking every broker", now)]))
            self.poll = True
            return None
        if why.startswith("refused"):
            raise OperationError(f"broker {broker} {why}")
        now = trio.current_time()
        take(Batch(now, notes=[("warning", f"lost {broker}: {why}", now)]))
        return f"lost: {why}"

    async def _relay(self, broker: str, reports: trio.MemoryReceiveChannel, take) -> None:
        """Reports as they come, handed on in a batch every BATCH_EVERY seconds; brokers
        whose reports do not come are asked directly meanwhile (:meth:`_ask_silent`)."""
        every = min(BATCH_EVERY, self.refresh)
        box = [Batch(0.0)]  # the batch being filled
        last_report: dict[str, float] = {}  # when each broker's last report came
        due = trio.current_time() + every
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ask_silent, last_report, box)
            while True:
                with trio.move_on_at(due):
                    try:
                        report = await reports.receive()
                    except trio.EndOfChannel:
                        break
                    at, wall = trio.current_time(), time.time()
                    batch = box[0]
                    for carried in report.items:
                        try:
                            item = m.opened(carried)
                        except FrameError as exc:  # a broker that lies: said, and left out
                            batch.notes.append(("warning", f"{broker}: {exc}", at))
                            continue
                        stats = item.stats
                        last_report[stats.broker] = at
                        if stats.broker == broker:  # the root counted this watcher as a client
                            stats = _less_one(stats)
                        batch.answers.append((stats.broker, stats, at))
                        if item.lines or item.missed:
                            batch.lines.append((stats.broker, item.lines, item.missed, at, wall))
                    continue
                box[0].now = trio.current_time()
                take(box[0])
                due = box[0].now + every
                box[0] = Batch(0.0)
            nursery.cancel_scope.cancel()
        box[0].now = trio.current_time()
        take(box[0])

    def silent_after(self) -> float:
        """Seconds without a report after which a broker counts as silent."""
        return max(SILENT_AFTER * self.refresh, SILENT_MIN)

    async def _ask_silent(self, last_report: dict[str, float], box: list[Batch]) -> None:
        """Each interval, the brokers whose reports have stopped (or never came) are asked for
        their counters directly: one cut off from the broker watched through by a partition
        may still answer the monitor, and one that does not is seen not to answer, and why."""
        while True:
            await trio.sleep(self.refresh)
            now = trio.current_time()
            after = self.silent_after()
            silent = [
                b for b in self.topology.brokers if now - last_report.get(b, self.since) > after
            ]
            if silent:
                box[0].answers += (await self.collect(silent)).answers

    # -- the plain view ------------------------------------------------------------------------

    async def settle(self) -> None:
        """Until every broker has been heard twice (its rates known) or could not be: two
        rounds when polling; when watching, at most SILENT_AFTER intervals beyond two."""
        if self.poll:
            await self.poll_once()
            await trio.sleep(self.refresh)
            await self.poll_once()
            return
        give_up = trio.current_time() + (2 + SILENT_AFTER) * self.refresh + SILENT_MIN
        async with trio.open_nursery() as nursery:

            def take(batch: Batch) -> None:
                self.apply(batch)
                now = trio.current_time()
                done = all(self.heard[b] >= 2 for b in self.model.brokers)
                if done or now > give_up or self.poll or self.nobody:
                    for b in self.model.brokers:  # not heard of at all by now: silent
                        view = self.model.brokers[b]
                        if not self.poll and not self.heard[b] and view.error is None:
                            self.model.unreachable(b, "has not reported", now)
                    nursery.cancel_scope.cancel()

            nursery.start_soon(self.feed, take)
            await trio.sleep_until(give_up + TIMEOUT)  # a batch comes at least every 0.5 s
            nursery.cancel_scope.cancel()
        if self.poll and not all(self.heard[b] >= 2 for b in self.model.brokers):
            await self.settle()

    async def run(self) -> None:
        fit = self.console.is_terminal  # a terminal's height is a bound; a file's is not
        with Live(
            self.render(), console=self.console, refresh_per_second=2, transient=False
        ) as live:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.feed, self.apply)
                while True:
                    await trio.sleep(self.refresh)
                    live.update(self.render(self.console.size.height if fit else None))


def _less_one(stats: m.Stats) -> m.Stats:
    """``stats`` without the connection that asked for them among its clients."""
    return msgspec.structs.replace(stats, clients=max(0, stats.clients - 1))
