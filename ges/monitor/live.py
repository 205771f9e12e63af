"""The live view of a running topology: per broker its clients, links up, events in/out per second.

It polls every broker over the ordinary client protocol (a ``StatsRequest`` once per refresh),
so it works the same for embedded brokers, ``--processes`` and brokers on other hosts. Rates are
differences between two polls. Rows are grouped by unit (cluster path) so a unit's health reads
at a glance; for large topologies only the busiest rows are drawn.
"""

from __future__ import annotations

import math
import ssl

import attrs
import trio
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ges.client import broker_stats
from ges.errors import OperationError
from ges.topology import Topology, broker_order_key, unit_name
from ges.wire import messages as m

#: Seconds between refreshes.
REFRESH = 1.0
#: Rows drawn at most; a 512-broker topology shows its busiest brokers and a summary line.
MAX_ROWS = 40


@attrs.define
class BrokerView:
    id: str
    unit: str
    stats: m.Stats | None = None
    at: float = 0.0
    rate_in: float = 0.0
    rate_out: float = 0.0
    error: str | None = None


class Monitor:
    """Polls brokers and renders a rich table; ``await run()`` until cancelled."""

    def __init__(
        self,
        topology: Topology,
        *,
        console: Console | None = None,
        refresh: float = REFRESH,
        tls: ssl.SSLContext | None = None,
    ):
        self.topology = topology
        self.tls = tls
        self.console = console or Console()
        self.refresh = refresh
        self.views = {
            b.id: BrokerView(b.id, unit_name(b.unit))
            for b in sorted(topology.brokers.values(), key=lambda b: broker_order_key(b.id))
        }

    async def poll_once(self) -> None:
        async with trio.open_nursery() as nursery:
            for view in self.views.values():
                nursery.start_soon(self._poll, view)

    async def _poll(self, view: BrokerView) -> None:
        spec = self.topology.brokers[view.id]
        try:
            stats = await broker_stats(
                spec.host, spec.port, topology=self.topology, client_id="monitor", tls=self.tls
            )
        except OperationError as exc:
            view.error = str(exc)
            view.rate_in = view.rate_out = 0.0
            view.stats = None
            return
        now = trio.current_time()
        old, old_at = view.stats, view.at
        if old is not None and old.incarnation == stats.incarnation and now > old_at:
            dt = now - old_at
            view.rate_in = max(0.0, (stats.events_in - old.events_in) / dt)
            view.rate_out = max(0.0, (stats.events_out - old.events_out) / dt)
        view.stats, view.at, view.error = stats, now, None

    def render(self) -> Group:
        table = Table(
            title=f"GES — topology {self.topology.name}",
            title_justify="left",
            expand=False,
            header_style="bold",
        )
        for col, just in (
            ("broker", "left"),
            ("unit", "left"),
            ("clients", "right"),
            ("subs", "right"),
            ("links up", "right"),
            ("events in/s", "right"),
            ("events out/s", "right"),
            ("delivered", "right"),
        ):
            table.add_column(col, justify=just)
        views = list(self.views.values())
        if len(views) > MAX_ROWS:
            views.sort(key=lambda v: (v.error is None, -(v.rate_in + v.rate_out)))
            views = views[:MAX_ROWS]
        up = 0
        for v in views:
            if v.stats is None:
                table.add_row(v.id, v.unit, "", "", Text("down", style="red"), "", "", "")
                continue
            s = v.stats
            links = f"{len(s.links_up)}/{s.links_expected}"
            style = "green" if len(s.links_up) == s.links_expected else "yellow"
            table.add_row(
                v.id,
                v.unit,
                str(max(0, s.clients - 1)),  # the monitor's own connection is not a user
                str(s.subscriptions),
                Text(links, style=style),
                _rate(v.rate_in),
                _rate(v.rate_out),
                str(s.delivered),
            )
        for v in self.views.values():
            up += v.stats is not None
        total_in = sum(v.rate_in for v in self.views.values())
        total_out = sum(v.rate_out for v in self.views.values())
        footer = Text(
            f"{up}/{len(self.views)} brokers answering · {_rate(total_in)} events in/s · "
            f"{_rate(total_out)} events out/s"
            + (f" · showing {MAX_ROWS} busiest" if len(self.views) > MAX_ROWS else "")
            + " · Ctrl-C stops",
            style="dim",
        )
        return Group(table, footer)

    async def run(self) -> None:
        with Live(
            self.render(), console=self.console, refresh_per_second=4, transient=False
        ) as live:
            while True:
                await self.poll_once()
                live.update(self.render())
                await trio.sleep(self.refresh)


def _rate(value: float) -> str:
    if value <= 0 or math.isnan(value):
        return "0"
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.0f}"
