"""``ges monitor``: the unit tree of a running network, its health, links and events."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio
import typer

from cli._common import (
    CERTS,
    CLIENT_AS,
    INSECURE,
    client_auth,
    err,
    load_topology,
    network_certs,
    one_line_errors,
    out,
    write_out,
)
from ges.core.watch import MAX_INTERVAL, MIN_INTERVAL
from ges.errors import OperationError, UserInputError
from ges.monitor.live import REFRESH, Monitor
from ges.runtime.up import stop_on_signals


def monitor(
    topology_file: Path = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY"),
    once: bool = typer.Option(
        False, "--once", help="Print one report (two rounds, for the rates) and exit."
    ),
    as_json: bool = typer.Option(False, "--json", help="With --once: one JSON object."),
    plain: bool = typer.Option(
        False,
        "--plain",
        help="A refreshing tree without keys instead of the interactive view (the default "
        "when the output is not a terminal).",
    ),
    interval: float = typer.Option(
        REFRESH, "--interval", "-i", help="Seconds between two reports of each broker."
    ),
    broker: str = typer.Option(
        None,
        "--broker",
        "-b",
        help="Watch through this broker (default: the first of the topology that answers).",
    ),
    poll: bool = typer.Option(
        False,
        "--poll",
        help="Ask every broker for its counters each interval instead of watching through "
        "one (no lines logged by the brokers then).",
    ),
    client: str = CLIENT_AS,
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Watch a running network: its units as a tree with their health (ok, links down, some
    down, split, unreachable), clients, sessions and rates; every broker's links, counters and
    restarts; the links that are not up; and what changed (brokers restarting or not
    answering, links going down, cut or up, slow consumers).

    On a terminal the view is interactive: arrows move, space or enter opens and closes a
    unit, the selected unit or broker is shown in detail on the right and the event log below;
    s sorts members (name, rate, health), / filters by name (esc clears), p pauses, e and c
    open and close everything, ? shows the keys, q quits. --plain (or output that is not a
    terminal) draws a refreshing tree instead; Ctrl-C stops it.

    It watches through one broker (--broker, or the first that answers): every broker of the
    network reports to that one each interval — its counters and the lines it logged — and
    it passes the reports on. --poll asks every broker instead.
    """
    one_line_errors(_monitor)(
        topology_file, once, as_json, interval, client, certs, insecure, plain, broker, poll
    )


def _monitor(
    topology_file,
    once,
    as_json,
    interval,
    client,
    certs,
    insecure,
    plain=False,
    broker=None,
    poll=False,
) -> None:
    if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise UserInputError(
            f"--interval {interval:g}: must be from {MIN_INTERVAL:g} to {MAX_INTERVAL:g} s"
        )
    if as_json and not once:
        raise UserInputError("--json: only with --once (one JSON object)")
    topology = load_topology(topology_file)
    if broker is not None and broker not in topology.brokers:
        raise UserInputError(f"--broker {broker}: not a broker of {topology.name}")
    if broker is not None and poll:
        raise UserInputError("--broker: not with --poll (which asks every broker)")
    auth = client_auth(network_certs(topology, certs, insecure), client)
    monitor = Monitor(
        topology,
        console=out,
        refresh=interval,
        tls=auth.tls,
        client_id=auth.client_id or "monitor",
        broker=broker,
        poll=poll,
    )
    if not once:
        if plain or not sys.stdout.isatty():
            trio.run(_live, monitor)
        else:
            from ges.monitor.app import MonitorApp  # Textual: only for the interactive view

            MonitorApp(monitor).run()
        return
    trio.run(monitor.settle)
    if as_json:
        snapshot = monitor.model.snapshot()
        snapshot["through"] = None if monitor.poll else monitor.through
        write_out(sys.stdout, json.dumps(snapshot) + "\n")
    else:
        out.print(monitor.render())
    if not any(v.answering for v in monitor.model.brokers.values()):
        raise OperationError(f"no broker of {topology.name} answers")


async def _live(monitor: Monitor) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_signals, nursery.cancel_scope)
        await monitor.run()
    err.print("stopped", highlight=False)
