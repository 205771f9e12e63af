"""``ges up``: start every broker of a topology on this host, wait until ready, supervise.

Two modes:

* embedded (default): every broker is a :class:`BrokerServer` task in this one trio process;
* ``processes``: one ``ges broker`` OS process per broker, supervised — a broker that dies is
  restarted with backoff, and all of them are stopped (SIGTERM, then SIGKILL after a grace
  period) when ``ges up`` stops. Children also watch their parent and exit if it disappears,
  so no broker outlives a killed ``ges up``.

Readiness is the same in both modes: every broker answers a stats request over the client
protocol, from the process this ``ges up`` started for it (the pid in its Stats), and reports all
of its links up. Another network already on the same ports answers too; its answers do not count.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import trio

from ges.client import broker_stats
from ges.errors import OperationError
from ges.routing import Hierarchy
from ges.runtime.broker import MAX_CLIENTS, BrokerServer
from ges.security.certs import CertDir
from ges.topology import Topology, broker_order_key

#: Seconds a topology has to come up (every broker listening, every link up) before ``ges up``
#: gives up and stops what it started. Generous: 500 Python processes take a while to import.
READY_TIMEOUT = 120.0
#: Seconds between readiness polls.
POLL_INTERVAL = 0.2
#: Seconds children get to exit after SIGTERM before SIGKILL.
STOP_GRACE = 5.0
#: Restart backoff for a crashed broker process.
RESTART_FIRST = 0.5
RESTART_MAX = 10.0
#: Environment variable naming the supervising process; a child exits when it disappears.
PARENT_ENV = "GES_PARENT_PID"

log = logging.getLogger("ges.up")


@attrs.define(eq=False)
class BrokerProcess:
    id: str
    process: trio.Process | None = None
    restarts: int = 0
    log_path: Path | None = None


@attrs.define(eq=False)
class Network:
    """What ``ges up`` started: the topology, the mode, and per broker its pid."""

    topology: Topology
    processes: bool
    data_dir: Path
    pids: dict[str, int] = attrs.Factory(dict)

    def run_json(self) -> dict:
        return {
            "topology": self.topology.name,
            "source": self.topology.source,
            "digest": self.topology.digest,
            "mode": "processes" if self.processes else "embedded",
            "supervisor_pid": os.getpid(),
            "brokers": [
                {
                    "id": b.id,
                    "host": b.host,
                    "port": b.port,
                    "pid": self.pids.get(b.id, os.getpid()),
                }
                for b in sorted(
                    self.topology.brokers.values(), key=lambda b: broker_order_key(b.id)
                )
            ],
        }

    def write_run_json(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.run_json(), indent=2) + "\n")
        tmp.replace(path)
        return path


def foreign_pid_line(topology: Topology, broker_id: str, pid: int) -> str:
    """What to say about a broker that answers from a process ``ges up`` did not start."""
    spec = topology.brokers[broker_id]
    return (
        f"broker {broker_id} at {spec.host}:{spec.port} answers with pid {pid}, not the process "
        "this ges up started (another network on the same ports?)"
    )


async def wait_ready(
    topology: Topology,
    *,
    pids: Mapping[str, int] | None = None,
    timeout: float = READY_TIMEOUT,
    check: Callable[[], None] | None = None,
    progress: Callable[[int, int, int, int], None] | None = None,
    report: Callable[[str, str], None] | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Poll every broker until it answers and all its links are up (over TLS with ``tls``).

    Args:
        pids: the pid of the process serving each broker, as started (read at every poll, so a
            live mapping such as ``Network.pids`` may change). A broker counts only once its
            Stats come from that pid: another network on the same ports answers too, and its
            brokers are not ours. ``None`` counts any answer (tests of a network already known
            to be the only one).
        check: called between polls; may raise to abort (a child died during start-up).
        progress: ``progress(listening, brokers, links_up, links)`` says how far it got.
        report: ``report(broker_id, line)`` is called once per broker that answers from another
            pid, with a line saying so.

    Error handling:
        OperationError after ``timeout`` naming the brokers not ready. When brokers answered from
        other pids, that error — and one that ``check`` raises — starts with the first of them
        (:func:`foreign_pid_line`), so the cause of a failed start-up is on its one line.
    """
    pending = set(topology.brokers)
    links_total = 2 * len(topology.links)
    up_counts: dict[str, int] = {}
    listening: set[str] = set()
    foreign: dict[str, int] = {}  # broker -> the pid that answered for it
    deadline = trio.current_time() + timeout

    async def poll(bid: str) -> None:
        spec = topology.brokers[bid]
        try:
            stats = await broker_stats(spec.host, spec.port, topology=topology, tls=tls)
        except OperationError:
            return
        if pids is not None and stats.pid != pids.get(bid):
            if bid not in foreign:
                foreign[bid] = stats.pid
                if report is not None:
                    report(bid, foreign_pid_line(topology, bid, stats.pid))
            return
        listening.add(bid)
        up_counts[bid] = len(stats.links_up)
        if len(stats.links_up) >= stats.links_expected:
            pending.discard(bid)

    def failure(reason: str) -> OperationError:
        if not foreign:
            return OperationError(reason)
        first = min(foreign, key=broker_order_key)
        more = len(foreign) - 1
        also = f", and so do {more} more brokers" if more else ""
        return OperationError(
            f"{foreign_pid_line(topology, first, foreign[first])}{also}; {reason}"
        )

    while pending:
        if check is not None:
            try:
                check()
            except OperationError as exc:
                raise failure(str(exc)) from None
        async with trio.open_nursery() as nursery:
            for bid in list(pending):
                nursery.start_soon(poll, bid)
        if progress is not None:
            progress(len(listening), len(topology.brokers), sum(up_counts.values()), links_total)
        if not pending:
            break
        if trio.current_time() > deadline:
            waiting = sorted(pending, key=broker_order_key)
            shown = ", ".join(waiting[:6]) + (", …" if len(waiting) > 6 else "")
            raise failure(
                f"topology {topology.name} not ready after {timeout:.0f}s: "
                f"brokers {shown} are not listening or miss links"
            )
        await trio.sleep(POLL_INTERVAL)


def delivery_name(reliable: bool) -> str:
    return "reliable" if reliable else "best-effort"


async def run_embedded(
    topology: Topology,
    nursery: trio.Nursery,
    network: Network,
    *,
    routing: str = "content",
    reliable: bool | None = None,
    strict_log: bool = False,
    record_dir: Path | None = None,
    record_tags: dict | None = None,
    max_clients: int = MAX_CLIENTS,
    certs: CertDir | None = None,
) -> dict[str, BrokerServer]:
    """Start every broker as a task in ``nursery``; raises OperationError if one cannot listen."""
    servers = {}
    hierarchy = Hierarchy(topology)  # the same static facts for every broker of the process
    for bid in sorted(topology.brokers, key=broker_order_key):
        server = BrokerServer(
            topology,
            bid,
            routing=routing,
            hierarchy=hierarchy,
            reliable=reliable,
            data_dir=network.data_dir,
            strict_log=strict_log,
            record_dir=record_dir,
            record_tags=record_tags,
            max_clients=max_clients,
            certs=certs,
        )
        await nursery.start(server.run)
        servers[bid] = server
        network.pids[bid] = os.getpid()
    return servers


class ProcessSupervisor:
    """Starts and watches one ``ges broker`` process per broker."""

    def __init__(
        self,
        topology: Topology,
        topology_path: Path,
        network: Network,
        *,
        log_level: str,
        routing: str = "content",
        reliable: bool | None = None,
        strict_log: bool = False,
        record_dir: Path | None = None,
        record_tags: dict | None = None,
        max_clients: int = MAX_CLIENTS,
        certs: CertDir | None = None,
        metrics_port: int | None = None,
    ):
        #: with ``ges up --metrics-port P``, the n-th broker (in broker order) serves on P + n
        self.metrics_ports = (
            {
                bid: metrics_port + n
                for n, bid in enumerate(sorted(topology.brokers, key=broker_order_key))
            }
            if metrics_port
            else {}
        )
        self.max_clients = max_clients
        self.certs = certs
        self.routing = routing
        self.reliable = reliable
        self.strict_log = strict_log
        self.record_dir = record_dir
        self.record_tags = record_tags or {}
        self.topology = topology
        self.topology_path = topology_path
        self.network = network
        self.log_level = log_level
        self.children: dict[str, BrokerProcess] = {}
        self.stopping = False
        self.startup_failure: str | None = None
        #: Set once the network is ready: a death before that aborts start-up, after it restarts.
        self.ready = False
        self.log_dir = network.data_dir / "logs"

    def command(self, bid: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "cli.main",
            "broker",
            str(self.topology_path),
            "--id",
            bid,
            "--data-dir",
            str(self.network.data_dir),
            "--log-level",
            self.log_level,
            "--routing",
            self.routing,
            *(() if self.reliable is None else ("--delivery", delivery_name(self.reliable))),
            *(("--strict-log",) if self.strict_log else ()),
            *(("--record", str(self.record_dir)) if self.record_dir is not None else ()),
            *(a for k, v in self.record_tags.items() for a in ("--tag", f"{k}={v}")),
            "--max-clients",
            str(self.max_clients),
            *(("--certs", str(self.certs.root)) if self.certs is not None else ("--insecure",)),
            *(
                ("--metrics-port", str(self.metrics_ports[bid]))
                if bid in self.metrics_ports
                else ()
            ),
        ]

    async def start_all(self, nursery: trio.Nursery) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for bid in sorted(self.topology.brokers, key=broker_order_key):
            child = self.children[bid] = BrokerProcess(bid, log_path=self.log_dir / f"{bid}.log")
            await self._spawn(child)
            nursery.start_soon(self._watch, child)

    async def _spawn(self, child: BrokerProcess) -> None:
        env = dict(os.environ)
        env[PARENT_ENV] = str(os.getpid())
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(child.log_path, "ab") as logfile:
            child.process = await trio.lowlevel.open_process(
                self.command(child.id),
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=logfile,
                env=env,
                cwd=os.getcwd(),
            )
        self.network.pids[child.id] = child.process.pid

    async def _watch(self, child: BrokerProcess) -> None:
        backoff = RESTART_FIRST
        while True:
            started = trio.current_time()
            code = await child.process.wait()
            if self.stopping:
                return
            if not self.ready:
                if self.startup_failure is None:
                    self.startup_failure = (
                        _last_line(child.log_path) or f"broker {child.id} exited with code {code}"
                    )
                return
            log.warning(
                "broker %s exited with code %s; restarting in %.1fs", child.id, code, backoff
            )
            await trio.sleep(backoff)
            if self.stopping:
                return
            if trio.current_time() - started > 30:
                backoff = RESTART_FIRST
            else:
                backoff = min(backoff * 2, RESTART_MAX)
            child.restarts += 1
            await self._spawn(child)
            self.network.write_run_json()

    def check(self) -> None:
        if self.startup_failure is not None:
            raise OperationError(self.startup_failure)

    async def stop_all(self) -> None:
        self.stopping = True
        alive = [
            c.process for c in self.children.values() if c.process and c.process.returncode is None
        ]
        for proc in alive:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE):
            for proc in alive:
                await proc.wait()
        for proc in alive:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _last_line(path: Path | None) -> str | None:
    if path is None or not path.exists():
        return None
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return None
    last = lines[-1]
    return last.removeprefix("error: ")


async def watch_parent() -> None:
    """Exit the process when the supervising parent is gone (no orphaned brokers)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    parent_pid = int(parent)
    while True:
        await trio.sleep(0.5)
        if os.getppid() != parent_pid:
            log.warning("supervisor %d is gone; stopping", parent_pid)
            os._exit(0)


async def stop_on_signals(cancel_scope: trio.CancelScope) -> None:
    """Cancel ``cancel_scope`` on SIGINT or SIGTERM (a clean stop, exit code 0)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            cancel_scope.cancel()
            return
