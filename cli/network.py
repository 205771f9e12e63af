"""``ges up`` and ``ges broker``: run a topology's brokers on this host, or one broker."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

import trio
import typer
from rich.logging import RichHandler
from rich.text import Text

from cli._common import (
    CERTS,
    INSECURE,
    client_auth,
    default_data_dir,
    err,
    load_topology,
    network_certs,
    one_line_errors,
    out,
    parse_tags,
    resolve_broker,
)
from ges.core.broker import ROUTINGS
from ges.errors import UserInputError
from ges.monitor import Monitor
from ges.runtime import BrokerServer
from ges.runtime.broker import MAX_CLIENTS, freeze_heap
from ges.runtime.metrics import registry_of, serve_metrics, start_metrics
from ges.runtime.up import (
    Network,
    ProcessSupervisor,
    run_embedded,
    stop_on_signals,
    wait_ready,
    watch_parent,
)

LOG_LEVELS = ("debug", "info", "warning", "error")


def _check_log_level(level: str) -> str:
    """--log-level in lower case; anything else is one ``error:`` line (exit 2)."""
    if level.lower() not in LOG_LEVELS:
        raise UserInputError(f"--log-level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    return level.lower()


def _setup_logging(level: str, *, console=None, file: Path | None = None) -> None:
    level = _check_log_level(level)
    if file is not None:
        handler = logging.FileHandler(file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler = RichHandler(console=console or err, show_path=False, rich_tracebacks=False)
    logging.basicConfig(
        level=level.upper(), handlers=[handler], format="%(name)s: %(message)s", force=True
    )


#: Options ``ges up`` and ``ges broker`` share.
DELIVERY = typer.Option(
    None,
    "--delivery",
    help="reliable (the default with content routing: exactly once, in order, recovered "
    "from the pubend's log) or best-effort (the default with --routing flood).",
)
STRICT_LOG = typer.Option(
    False,
    "--strict-log",
    help="fsync the pubend log at every group commit (default: WAL with synchronous=NORMAL, "
    "which survives a broker crash but not a power loss).",
)


RECORD = typer.Option(
    None,
    "--record",
    help="Append a delivery record (the format of ges subscribe --record) for every event each "
    "broker hands to a local client, to DIR/<broker>.records.jsonl.",
    metavar="DIR",
)
TAGS = typer.Option(
    [],
    "--tag",
    help="KEY=VALUE experiment tag for the delivery records (repeatable).",
)
METRICS_PORT = typer.Option(
    None,
    "--metrics-port",
    help="Serve Prometheus metrics on this port (GET /metrics). ges broker: instead of the "
    "broker's metrics_port in the topology; ges up: every broker's on one port (embedded), or "
    "the n-th broker's on PORT + n (--processes).",
    metavar="PORT",
)
MAX_CLIENTS_OPTION = typer.Option(
    MAX_CLIENTS,
    "--max-clients",
    help="Clients a broker serves at once; one more is refused with a reason (each costs "
    "about 20 KB idle and one file descriptor).",
)


def up(
    topology_file: Path = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY"),
    data_dir: Path = typer.Option(
        None, "--data-dir", help="Where run.json and logs go (default: .ges/NAME)."
    ),
    processes: bool = typer.Option(
        False, "--processes", help="One supervised OS process per broker."
    ),
    no_live: bool = typer.Option(
        False, "--no-live", help="No live view; just a readiness line and logs."
    ),
    plain: bool = typer.Option(
        False,
        "--plain",
        help="The live view as a refreshing tree above the logs, instead of the interactive "
        "view (the default when the output is not a terminal).",
    ),
    ready_timeout: float = typer.Option(
        120.0, "--ready-timeout", help="Seconds to wait for every link."
    ),
    log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error."),
    routing: str = typer.Option(
        "content",
        "--routing",
        help="content: events go only where a profile matches (seed 004); flood: everywhere.",
    ),
    delivery: str = DELIVERY,
    strict_log: bool = STRICT_LOG,
    record: Path = RECORD,
    tag: list[str] = TAGS,
    max_clients: int = MAX_CLIENTS_OPTION,
    metrics_port: int = METRICS_PORT,
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Start every broker of a topology on this host and show them live.

    Prints a readiness line once every broker listens and all its links are up, writes
    DIR/run.json (id, host, port, pid per broker), and stops cleanly on Ctrl-C or SIGTERM.
    """
    one_line_errors(_up)(
        topology_file,
        data_dir,
        processes,
        no_live,
        ready_timeout,
        log_level,
        routing,
        delivery,
        strict_log,
        record,
        tag,
        max_clients,
        certs,
        insecure,
        metrics_port,
        plain,
    )


def _check_metrics_port(port: int | None) -> int | None:
    if port is not None and not 1 <= port <= 65535:
        raise UserInputError(f"--metrics-port {port}: must be in 1..65535")
    return port


def _check_max_clients(max_clients: int) -> int:
    if max_clients < 1:
        raise UserInputError(f"--max-clients {max_clients}: must be at least 1")
    return max_clients


def _check_routing(routing: str) -> str:
    if routing not in ROUTINGS:
        raise UserInputError(f"--routing: {routing!r} is not one of {', '.join(ROUTINGS)}")
    return routing


def _check_delivery(delivery: str | None, routing: str) -> bool | None:
    """--delivery as the runtime's ``reliable`` (None: the routing's default)."""
    if delivery is None:
        return None
    if delivery not in ("reliable", "best-effort"):
        raise UserInputError(f"--delivery: {delivery!r} is not one of reliable, best-effort")
    if delivery == "reliable" and routing != "content":
        raise UserInputError("--delivery reliable needs --routing content")
    return delivery == "reliable"


def _up(
    topology_file,
    data_dir,
    processes,
    no_live,
    ready_timeout,
    log_level,
    routing,
    delivery,
    strict_log=False,
    record=None,
    tag=(),
    max_clients=MAX_CLIENTS,
    certs=None,
    insecure=False,
    metrics_port=None,
    plain=False,
    mqtt_port=None,
) -> None:
    log_level = _check_log_level(log_level)
    _check_max_clients(max_clients)
    _check_metrics_port(metrics_port)
    if mqtt_port is not None and not 1 <= mqtt_port <= 65535:
        raise UserInputError(f"--mqtt-port {mqtt_port}: must be in 1..65535")
    _check_routing(routing)
    reliable = _check_delivery(delivery, routing)
    tags = parse_tags(tag)
    topology = load_topology(topology_file)
    data_dir = data_dir or default_data_dir(topology.name)
    # on one host, the first start makes the network's certificates (as `ges certs init`)
    cert_dir = network_certs(topology, certs, insecure, data_dir=data_dir, make=True)
    tls = client_auth(cert_dir).tls  # ges up's own polls, as the operator
    network = Network(topology=topology, processes=processes, data_dir=data_dir)
    interactive = not no_live and not plain and out.is_terminal and sys.stdin.isatty()
    if interactive:  # the interactive view owns the terminal: logs go to a file
        log_file = Path(data_dir) / "logs" / "up.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        _setup_logging(log_level, file=log_file)
    else:  # with the plain live view on, logs print above it through the same console
        _setup_logging(log_level, console=err if no_live else out)
    run = functools.partial(
        _run_up,
        topology,
        topology_file,
        network,
        no_live,
        ready_timeout,
        log_level,
        routing,
        reliable,
        {
            "strict_log": strict_log,
            "record_dir": record,
            "record_tags": tags,
            "max_clients": _check_max_clients(max_clients),
            "certs": cert_dir,
        },
        tls,
        metrics_port,
    )
    if not interactive:
        trio.run(run)
        return
    from cli.up_view import up_with_view  # Textual: only for the interactive view

    up_with_view(run, Monitor(topology, tls=tls, client_id="up"), log_file)


async def _run_up(
    topology,
    topology_file,
    network: Network,
    no_live,
    ready_timeout,
    log_level,
    routing,
    reliable,
    options: dict,
    tls=None,
    metrics_port=None,
    *,
    beside=None,
):
    """``options``: the keyword options every broker gets (strict_log, record_dir, …);
    ``tls``: what this process polls the brokers with. ``beside``: the network runs in a
    thread beside the interactive view (cli.up_view), which stops it: called with the
    nursery's cancel scope at the start, and with None once the network is ready."""
    supervisor = None
    try:
        async with trio.open_nursery() as nursery:
            if beside is None:
                nursery.start_soon(stop_on_signals, nursery.cancel_scope)
            else:
                beside(nursery.cancel_scope)
            mode = "processes" if network.processes else "embedded"
            if routing != "content":
                mode += f", {routing} routing"
            if reliable is False:
                mode += ", best-effort delivery"
            err.print(
                f"starting {len(topology.brokers)} brokers of {topology.name} ({mode}) …",
                highlight=False,
            )
            if network.processes:
                supervisor = ProcessSupervisor(
                    topology,
                    Path(topology_file),
                    network,
                    log_level=log_level,
                    routing=routing,
                    reliable=reliable,
                    metrics_port=metrics_port,
                    **options,
                )
                await supervisor.start_all(nursery)
                check = supervisor.check
            else:
                servers = await run_embedded(
                    topology,
                    nursery,
                    network,
                    routing=routing,
                    reliable=reliable,
                    **options,
                )
                freeze_heap()
                for port in await start_metrics(nursery, servers.values(), metrics_port):
                    err.print(f"metrics on port {port} (GET /metrics)", highlight=False)
                check = None
            await wait_ready(
                topology,
                pids=network.pids,
                timeout=ready_timeout,
                check=check,
                report=_ForeignReport(),
                tls=tls,
            )
            if supervisor is not None:
                supervisor.ready = True
            path = network.write_run_json()
            out.print(
                f"ready: {len(topology.brokers)} brokers of {topology.name} listening, "
                f"{2 * len(topology.links)}/{2 * len(topology.links)} link ends up ({mode}); "
                f"run file {path}",
                highlight=False,
                soft_wrap=True,
            )
            if beside is not None:
                beside(None)
            elif not no_live:
                nursery.start_soon(Monitor(topology, console=out, tls=tls, client_id="up").run)
    finally:
        if supervisor is not None:
            with trio.CancelScope(shield=True):
                await supervisor.stop_all()
    err.print("stopped", highlight=False)


class _ForeignReport:
    """Warns about the first broker that answers from a process this ``ges up`` did not start.

    One line, not one per broker: a second ``ges up`` of a running topology meets every broker
    of the first, and the error that ends start-up says how many there were.
    """

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, broker_id: str, line: str) -> None:
        self.seen += 1
        if self.seen == 1:
            err.print(Text.assemble(("warning: ", "yellow"), line), soft_wrap=True)


def broker(
    topology_file: Path = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY"),
    broker_id: str = typer.Option(..., "--id", help="Which broker of the topology to run."),
    data_dir: Path = typer.Option(None, "--data-dir", help="Data directory (default: .ges/NAME)."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    routing: str = typer.Option(
        "content", "--routing", help="content (default) or flood; the same on every broker."
    ),
    delivery: str = DELIVERY,
    strict_log: bool = STRICT_LOG,
    record: Path = RECORD,
    tag: list[str] = TAGS,
    max_clients: int = MAX_CLIENTS_OPTION,
    metrics_port: int = METRICS_PORT,
    mqtt_port: int = typer.Option(
        None,
        "--mqtt-port",
        help="Serve MQTT 3.1.1 clients on this port (over TLS unless --insecure), instead of "
        "the broker's mqtt_port in the topology.",
        metavar="PORT",
    ),
    mqtt_ws_port: int = typer.Option(
        None,
        "--mqtt-ws-port",
        help="Serve MQTT clients over WebSocket on this port (wss:// unless --insecure), "
        "instead of the broker's mqtt_ws_port in the topology.",
        metavar="PORT",
    ),
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Run one broker of a topology (for deployments across hosts).

    It needs the network's certificate directory (`ges certs init` on one host, then copy the
    CA certificate and the broker's own key and certificate to its host), unless --insecure.
    """
    one_line_errors(_broker)(
        topology_file,
        broker_id,
        data_dir,
        log_level,
        routing,
        delivery,
        strict_log,
        record,
        tag,
        max_clients,
        certs,
        insecure,
        metrics_port,
        mqtt_port=mqtt_port,
        mqtt_ws_port=mqtt_ws_port,
    )


def _broker(
    topology_file,
    broker_id,
    data_dir,
    log_level,
    routing,
    delivery,
    strict_log,
    record,
    tag,
    max_clients=MAX_CLIENTS,
    certs=None,
    insecure=False,
    metrics_port=None,
    plain=False,
    mqtt_port=None,
    mqtt_ws_port=None,
) -> None:
    log_level = _check_log_level(log_level)
    _check_max_clients(max_clients)
    _check_metrics_port(metrics_port)
    for flag, port in (("--mqtt-port", mqtt_port), ("--mqtt-ws-port", mqtt_ws_port)):
        if port is not None and not 1 <= port <= 65535:
            raise UserInputError(f"{flag} {port}: must be in 1..65535")
    _check_routing(routing)
    reliable = _check_delivery(delivery, routing)
    tags = parse_tags(tag)
    topology = load_topology(topology_file)
    resolve_broker(topology, broker_id)
    cert_dir = network_certs(topology, certs, insecure, data_dir=data_dir)
    _setup_logging(log_level)
    data_dir = data_dir or default_data_dir(topology.name)
    data_dir.mkdir(parents=True, exist_ok=True)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signals, nursery.cancel_scope)
            nursery.start_soon(watch_parent)
            server = BrokerServer(
                topology,
                broker_id,
                routing=routing,
                reliable=reliable,
                data_dir=data_dir,
                strict_log=strict_log,
                record_dir=record,
                record_tags=tags,
                max_clients=max_clients,
                certs=cert_dir,
                mqtt_port=mqtt_port,
                mqtt_ws_port=mqtt_ws_port,
            )
            await nursery.start(server.run)
            freeze_heap()
            spec = topology.brokers[broker_id]
            err.print(
                f"broker {broker_id} listening on {spec.host}:{spec.port} (pid {os.getpid()})",
                highlight=False,
            )
            if server.mqtt_port is not None:
                err.print(
                    f"broker {broker_id} MQTT on {spec.host}:{server.mqtt_port}"
                    f"{'' if cert_dir is None else ' (TLS)'}",
                    highlight=False,
                )
            if server.mqtt_ws_port is not None:
                scheme = "ws" if cert_dir is None else "wss"
                err.print(
                    f"broker {broker_id} MQTT over WebSocket on "
                    f"{scheme}://{spec.host}:{server.mqtt_ws_port}/",
                    highlight=False,
                )
            port = metrics_port or spec.metrics_port
            if port:
                await nursery.start(serve_metrics, registry_of([server]), port, server.listen_host)
                err.print(
                    f"broker {broker_id} metrics on port {port} (GET /metrics)", highlight=False
                )

    trio.run(main)
