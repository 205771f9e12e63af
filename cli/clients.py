"""``ges clients`` and ``ges roam``: durable sessions of a running network (issue 20).

Each replicator answers for the sessions it holds, so these commands ask every replicator of
the topology (``ges.durable.replicators``); one that does not answer is named in a warning,
and what the others hold is still shown.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio
import typer
from rich.table import Table

from cli._common import (
    CERTS,
    CLIENT_AS,
    INSECURE,
    OneLineUsageGroup,
    client_auth,
    command,
    err,
    load_topology,
    network_certs,
    one_line_errors,
    out,
    resolve_broker,
)
from ges.client import connect
from ges.durable import replicators, session_name_problem
from ges.errors import BrokerUnreachable, OperationError, UserInputError
from ges.topology import Topology, broker_order_key

#: Seconds each replicator has to answer.
DEFAULT_TIMEOUT = 5.0


class _ListByDefault(OneLineUsageGroup):
    """``ges clients T`` is ``ges clients list T``: an argument that names no command is the
    list's topology."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["list", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(
    help="Durable sessions: list them (where each is, what it holds), end one.",
    no_args_is_help=True,
    cls=_ListByDefault,
)

TOPOLOGY = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY")
SESSION = typer.Argument(..., help="The session's name (its client's --client).", metavar="NAME")
TIMEOUT = typer.Option(
    DEFAULT_TIMEOUT, "--timeout", "-t", help="Seconds each replicator has to answer."
)


async def _ask_each(topology: Topology, auth, action: str, name: str, timeout: float):
    """``(replicator, SessionList or None if it did not answer, why)`` for every replicator."""
    reps = sorted({r.broker for r in replicators(topology)}, key=broker_order_key)
    found: dict[str, tuple] = {}

    async def ask(rep: str) -> None:
        spec = topology.brokers[rep]
        try:
            with trio.fail_after(timeout):
                async with connect(
                    spec.host, spec.port, topology=topology, timeout=timeout, **auth.connect_args()
                ) as client:
                    found[rep] = (rep, await client.sessions(action, name), "")
        except (BrokerUnreachable, OperationError, trio.TooSlowError) as exc:
            found[rep] = (rep, None, str(exc) or "no answer")

    async with trio.open_nursery() as nursery:  # all at once: one slow one costs its timeout
        for rep in reps:
            nursery.start_soon(ask, rep)
    return [found[rep] for rep in reps]


def _unanswered(found) -> list[str]:
    lines = [
        f"warning: replicator {rep} did not answer: {why}" for rep, got, why in found if got is None
    ]
    for line in lines:
        err.print(line, highlight=False)
    return lines


@command(app, "list")
def list_(
    topology_file: Path = TOPOLOGY,
    name: str = typer.Option("", "--name", "-n", help="Only this session."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    timeout: float = TIMEOUT,
    client: str = CLIENT_AS,
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """List the durable sessions every replicator holds: where each client is connected (or
    since when it is not), its subscriptions, its replicator, and how many events are held for
    it."""
    one_line_errors(_list)(topology_file, name, as_json, timeout, client, certs, insecure)


def _list(topology_file, name, as_json, timeout, client, certs, insecure) -> None:
    topology = load_topology(topology_file)
    auth = client_auth(network_certs(topology, certs, insecure), client)
    found = trio.run(_ask_each, topology, auth, "list", name, timeout)
    missing = _unanswered(found)
    sessions = sorted((s for _, got, _ in found if got for s in got.sessions), key=lambda s: s.name)
    if len(missing) == len(found):
        raise OperationError("no replicator answered")
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "sessions": [
                        {
                            "name": s.name,
                            "owner": s.owner,
                            "replicator": s.replicator,
                            "connected_at": s.at or None,
                            "for_seconds": round(s.for_s, 3),
                            "subscriptions": [
                                {"id": i, "profile_id": p, "profile": text} for i, p, text in s.subs
                            ],
                            "acked_epoch": s.acked,
                            "last_epoch": s.last,
                            "held": s.held,
                            "dropped_by_retention": s.dropped,
                            "stale": s.stale,
                            "handover": s.handover or None,
                            "created": s.created,
                        }
                        for s in sessions
                    ],
                    "unanswered": [rep for rep, got, _ in found if got is None],
                }
            )
        )
        return
    if not sessions:
        err.print("no durable sessions", highlight=False)
        return
    table = Table(title=f"durable sessions of {topology.name}")
    for col in ("session", "owner", "connected", "replicator", "subscriptions", "held", "acked"):
        table.add_column(col, justify="right" if col in ("held", "acked") else "left")
    for s in sessions:
        ago = _ago(s.for_s)
        where = f"at {s.at} for {ago}" if s.at else f"no, for {ago}"
        if s.stale:
            where += " (stale: nobody resumed it within its age limit)"
        if s.handover:
            where += f" (being handed over {s.handover})"
        subs = "; ".join(f"{p or i}: {text}" for i, p, text in s.subs)
        held = f"{s.held:,}" + (f" ({s.dropped:,} let go)" if s.dropped else "")
        table.add_row(s.name, s.owner or "—", where, s.replicator, subs, held, str(s.acked))
    out.print(table)


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


async def _on_holder(topology: Topology, auth, name: str, action: str, to: str, timeout: float):
    """Do ``action`` on session ``name`` at the replicator that holds it."""
    found = await _ask_each(topology, auth, "find", name, timeout)
    # the replicator serving it: not one handing it over to another, or taking it from one
    holders = [rep for rep, got, _ in found if got and got.sessions]
    serving = [
        rep
        for rep, got, _ in found
        if got and got.sessions and not got.sessions[0].handover.startswith(("moved", "from"))
    ]
    holder = next(iter(serving or holders), None)
    if holder is None:
        missing = [rep for rep, got, _ in found if got is None]
        if missing:
            raise OperationError(
                f"no answering replicator holds durable session {name!r}; "
                f"{', '.join(missing)} did not answer"
            )
        raise UserInputError(f"{topology.source}: no durable session {name!r}")
    spec = topology.brokers[holder]
    async with connect(
        spec.host, spec.port, topology=topology, timeout=timeout, **auth.connect_args()
    ) as c:
        got = await c.sessions(action, name, to)
    return holder, got.sessions[0]


@command(app)
def end(
    topology_file: Path = TOPOLOGY,
    name: str = SESSION,
    timeout: float = TIMEOUT,
    client: str = CLIENT_AS,
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """End durable session NAME: its replicator forgets it and frees what it held; its client,
    if connected, is told the session ended."""
    one_line_errors(_end)(topology_file, name, timeout, client, certs, insecure)


def _end(topology_file, name, timeout, client, certs, insecure) -> None:
    topology = load_topology(topology_file)
    _check_name(name)
    auth = client_auth(network_certs(topology, certs, insecure), client)
    holder, info = trio.run(_on_holder, topology, auth, name, "end", "", timeout)
    out.print(
        f"ended durable session {name} at replicator {holder}: {info.held:,} held events freed",
        highlight=False,
    )


def roam(
    topology_file: Path = TOPOLOGY,
    name: str = SESSION,
    to: str = typer.Option(..., "--to", help="The broker its client is to resume at."),
    timeout: float = TIMEOUT,
    client: str = CLIENT_AS,
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Move the connected client of durable session NAME to broker TO: its broker redirects it
    (as MQTT 5's server redirect does), its client library resumes at TO with nothing missed
    and nothing twice."""
    one_line_errors(_roam)(topology_file, name, to, timeout, client, certs, insecure)


def _roam(topology_file, name, to, timeout, client, certs, insecure) -> None:
    topology = load_topology(topology_file)
    _check_name(name)
    resolve_broker(topology, to)
    auth = client_auth(network_certs(topology, certs, insecure), client)
    holder, info = trio.run(_on_holder, topology, auth, name, "roam", to, timeout)
    out.print(
        f"moved durable session {name}: {info.at} -> {to} (replicator {holder})", highlight=False
    )


def _check_name(name: str) -> None:
    why = session_name_problem(name)
    if why is not None:
        raise UserInputError(why)
