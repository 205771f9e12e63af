"""The live view of a running network (``ges monitor``, and ``ges up`` unless ``--no-live``).

It asks every broker for its counters over the ordinary client protocol (a ``StatsRequest``
once per refresh), so it works the same for embedded brokers, ``--processes`` and brokers on
other hosts, feeds what they answer to the network's model (ges.monitor.model: rates, link
states, unit health, the event log) and draws it as the unit tree (ges.monitor.tree).
"""

from __future__ import annotations

import ssl

import msgspec
import trio
from rich.console import Console, Group
from rich.live import Live

from ges.client import broker_stats
from ges.errors import OperationError
from ges.monitor.model import NetworkModel
from ges.monitor.tree import overview
from ges.topology import Topology
from ges.wire import messages as m

#: Seconds between refreshes.
REFRESH = 1.0
#: Seconds a broker has to answer one request for its counters.
TIMEOUT = 2.0


class Monitor:
    """Asks brokers for their counters and draws the tree; ``await run()`` until cancelled."""

    def __init__(
        self,
        topology: Topology,
        *,
        console: Console | None = None,
        refresh: float = REFRESH,
        tls: ssl.SSLContext | None = None,
        client_id: str = "monitor",
    ):
        self.topology = topology
        self.tls = tls
        self.client_id = client_id
        self.console = console or Console()
        self.refresh = refresh
        self.model = NetworkModel(topology)
        #: when the first round began (the event log's times count from it)
        self.started: float | None = None

    async def poll_once(self) -> None:
        """One round: every broker's counters, asked concurrently, into the model."""
        self.apply(await self.collect())

    async def collect(self) -> list[tuple[str, m.Stats | str, float]]:
        """One round's answers — (broker, its Stats or why it did not answer, when) — without
        touching the model (the interactive view collects on a trio thread and applies on its
        own)."""
        if self.started is None:
            self.started = trio.current_time()
        answers: list[tuple[str, m.Stats | str, float]] = []

        async def ask(broker: str) -> None:
            spec = self.topology.brokers[broker]
            try:
                stats = await broker_stats(
                    spec.host,
                    spec.port,
                    topology=self.topology,
                    client_id=self.client_id,
                    timeout=TIMEOUT,
                    tls=self.tls,
                )
            except OperationError as exc:
                answers.append((broker, str(exc), trio.current_time()))
                return
            # the broker counted the connection that asked: not one of its users
            stats = msgspec.structs.replace(stats, clients=max(0, stats.clients - 1))
            answers.append((broker, stats, trio.current_time()))

        async with trio.open_nursery() as nursery:
            for broker in self.model.brokers:
                nursery.start_soon(ask, broker)
        return answers

    def apply(self, answers) -> list:
        """Feed one round's answers to the model; the log entries they made."""
        said = []
        for broker, answer, at in sorted(answers, key=lambda a: a[2]):
            if isinstance(answer, str):
                said += self.model.unreachable(broker, answer, at)
            else:
                said += self.model.observe(broker, answer, at)
        return said

    def render(self, height: int | None = None) -> Group:
        """The view; with ``height``, fitted to a terminal that many lines high."""
        return overview(self.model, self.started or 0.0, height=height)

    async def run(self) -> None:
        fit = self.console.is_terminal  # a terminal's height is a bound; a file's is not
        with Live(
            self.render(), console=self.console, refresh_per_second=2, transient=False
        ) as live:
            while True:
                await self.poll_once()
                live.update(self.render(self.console.size.height if fit else None))
                await trio.sleep(self.refresh)
