"""Throughput and latency of GES beside a raw trio TCP relay measured in the same run.

    python bench/throughput.py [--quick] [--json] [--batch N] [--profile]

Four measurements, each run twice — once through GES, once through the baseline
(``bench/_relay.py``: a raw trio relay that copies length-prefixed bytes to every subscriber
with no protocol) — with the same process layout, event sizes and rates:

1. ``1→1``: 100-byte events through one broker, one publisher to one subscriber. The broker
   (``ges broker`` on a one-broker topology) and the subscriber (``bench/_subscriber.py``) are
   separate OS processes; the publisher, in this process, publishes as fast as it can with
   ``publish_nowait`` batches and then ``flush()``. Throughput is counted at the subscriber from
   its first to its last receive; the publish-side rate is reported too.
2. ``1→100``: the same with 100 subscribing clients (one subscriber process); the figure is
   aggregate deliveries per second.
3. one-hop latency: one publisher and one subscriber on that single broker; single events at
   1,000/s, one Publish each, ``published_at = time.time_ns()`` just before sending; latency =
   ``received_at − published_at``.
4. five-hop latency: ``ges up topologies/ges-paper.yaml --processes`` (22 broker processes, on
   free ports), publisher at broker 22, subscriber at broker 10; the baseline is a chain of relay
   processes along the same shortest path (22 → 20 → 17 → 8 → 11 → 10).

Every GES figure above is measured with ``--insecure`` (plain TCP, no identities, no
permission checks), as the baseline relay has none of those. **TLS against --insecure** (issue
19), in the same run: ``1→1`` and the one-hop latency are run a third time with the broker
started with ``--certs DIR`` instead (TLS 1.3, certificates made for the run's one-broker
topology in the temp directory: the CA, ``brokers/b1`` and the operator client ``admin``), the
publisher (this process) and the subscriber process each connecting over TLS and presenting
``clients/admin`` (a secure broker admits only clients that prove who they are). The same
events, batches, rates and process layout; the ``1→1`` runs alternate GES, GES over TLS and
the baseline. Reported: TLS/--insecure for throughput and the µs TLS adds to the one-hop p50
and p99, against the issue's aim (TLS costs at most 15 % of throughput and 50 µs of p50 per
hop). ``--no-tls`` leaves these runs out.

The table also shows the issue's aims and its reference figures for mosquitto and amqtt; those
were measured earlier on this machine and are NOT measured by this run. ``--json`` prints one
JSON object on stdout (the table then goes to stderr with the progress lines). ``--profile``
adds an extra GES 1→1 run under py-spy (broker, subscriber and publisher) and reports each
process's hottest functions; the measured figures are taken from the unprofiled runs.

Exit code 0 when every run completed and delivered every event, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio
import yaml
from _relay import RECORD_HEADER, ROLE_PUBLISHER
from rich.console import Console
from rich.table import Table

from cli._common import ADMIN, client_auth, init_certs
from ges.client import connect
from ges.runtime.ports import free_ports, on_free_ports
from ges.security.certs import CertDir
from ges.topology import Topology
from ges.wire import encode
from ges.wire import messages as m

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PAPER_TOPOLOGY = ROOT / "topologies" / "ges-paper.yaml"
PAPER_PUBLISHER = "22"
PAPER_SUBSCRIBER = "10"
GES = [sys.executable, "-m", "cli.main"]

PAYLOAD_BYTES = 100
FANOUT_CLIENTS = 100
SCENARIOS = ("1to1", "1to100", "latency_1hop", "latency_paper")
LATENCY_RATE = 1_000.0
SIZES = {
    "quick": {
        "events_1to1": 100_000,
        "events_1to100": 5_000,
        "repeats_1to1": 1,
        "latency_seconds": 2.0,
        "warmup_seconds": 0.5,
    },
    "full": {
        "events_1to1": 1_000_000,
        "events_1to100": 100_000,
        "repeats_1to1": 3,
        "latency_seconds": 10.0,
        "warmup_seconds": 1.0,
    },
}

#: The issue's aims for GES.
AIMS = {
    "1to1": 150_000,
    "1to100": 250_000,
    "latency_1hop_p50_us": 150,
    "latency_paper_p50_us": 1_000,
    # TLS against --insecure (issue 19): what TLS may cost
    "tls_throughput_cost_max": 0.15,
    "tls_added_p50_us_per_hop_max": 50,
}
#: The scenarios also run over TLS (unless --no-tls), beside their --insecure GES run.
TLS_SCENARIOS = ("1to1", "latency_1hop")
#: The client certificate the bench's clients present over TLS (role operator, as made by
#: ``ges certs init``; an operator may also publish idempotently under another client id).
TLS_CLIENT = ADMIN
#: The issue's reference figures, measured earlier on this 2-core machine in the same kind of
#: harness. Not measured by this script.
REFERENCE = {
    "mosquitto 2.0.11": {
        "1to1": 156_000,
        "1to100": 247_000,
        "latency_1hop_p50_us": 112,
        "latency_paper_p50_us": 183,
        "note": "latency over more than one broker: a 2-hop bridge chain",
    },
    "amqtt (pure-Python MQTT)": {"1to1": 9_800, "latency_1hop_p50_us": 295},
}

STARTUP_TIMEOUT = 60.0
UP_READY_TIMEOUT = 120.0
STOP_GRACE = 8.0


def _width(stream) -> int | None:
    """Rich's own width on a terminal; wide enough for the table when piped to a file."""
    return None if stream.isatty() else 150


console = Console(stderr=True, highlight=False, width=_width(sys.stderr))


def finish(report: dict, errors: list[str], render, as_json: bool, *, show_errors=True) -> int:
    """The end of a bench: the tables (on stderr with ``as_json``, which prints the report as
    one JSON line on stdout), each error as a line, and the exit code (1 if any error)."""
    render(report, console if as_json else Console(highlight=False, width=_width(sys.stdout)))
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
    if show_errors:
        for problem in errors:
            console.print(f"[bold red]error:[/bold red] {problem}", soft_wrap=True)
    return 1 if errors else 0


class BenchError(Exception):
    """A run could not be completed (a process died, a timeout); exit code 1."""


def log(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


# -- processes -----------------------------------------------------------------------------------


class Lines:
    """Lines of a child's stdout, read by a daemon thread so waiting can time out."""

    def __init__(self, stream) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._run, args=(stream,), daemon=True).start()

    def _run(self, stream) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def next(self, timeout: float) -> str | None:
        """The next line; None at EOF; raises queue.Empty after ``timeout`` seconds."""
        return self._queue.get(timeout=max(0.0, timeout))


class Child:
    def __init__(self, name: str, proc: subprocess.Popen, log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self.lines = Lines(proc.stdout) if proc.stdout is not None else None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 8) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def fail(self, what: str) -> BenchError:
        tail = self.log_tail()
        return BenchError(f"{self.name}: {what}" + (f"\n{tail}" if tail else ""))

    def wait_line(self, predicate, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.next(deadline - time.monotonic())
            except queue.Empty:
                raise self.fail(f"no {what} within {timeout:g}s") from None
            if line is None:
                self.proc.wait()
                raise self.fail(f"exited with code {self.proc.returncode} before {what}")
            if predicate(line):
                return line


class Children:
    """Every process this bench starts, each in its own process group, stopped on exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.children: list[Child] = []
        self._count = 0

    def spawn(
        self, name: str, cmd: list[str], *, stdout_pipe: bool = True, stdin_pipe: bool = False
    ) -> Child:
        self._count += 1
        log_path = self.tmp / f"{self._count:02d}-{name.replace(' ', '-')}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(log_path, "ab") as logfile:
            proc = subprocess.Popen(
                [str(c) for c in cmd],
                stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdout_pipe else logfile,
                stderr=logfile,
                cwd=ROOT,
                env=env,
                text=True,
                start_new_session=True,  # its own process group: ges up's brokers go with it
            )
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def stop(self, child: Child) -> None:
        proc = child.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                # still alive, so its process group exists and is ours: kill all of it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if child in self.children:
            self.children.remove(child)

    def stop_all(self) -> None:
        for child in reversed(list(self.children)):
            self.stop(child)


def wait_listening(child: Child, port: int, timeout: float = STARTUP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise child.fail(f"exited with code {child.proc.returncode} during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise child.fail(f"not listening on port {port} within {timeout:g}s")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux /proc), None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine spent busy so far (Linux /proc/stat)."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """CPU use of the processes of one run, of this process (the publisher) and of the machine.

    Percentages are of one core (this machine has ``os.cpu_count()`` of them). ``other`` is what
    processes that are not part of the run used meanwhile: a busy neighbour makes every figure
    of that run pessimistic.
    """

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.before = {role: self._sum(p) for role, p in pids.items()}
        self.own = own_cpu_seconds()
        self.machine = machine_busy_seconds()
        self.wall = time.perf_counter()

    @staticmethod
    def _sum(pids: list[int]) -> float | None:
        values = [cpu_seconds(pid) for pid in pids]
        return None if None in values else sum(values)

    def finish(self, reported: dict[str, float | None] = ()) -> dict:
        """Percentages since creation; ``reported`` adds CPU seconds a process measured itself."""
        wall = time.perf_counter() - self.wall
        used = {role: _delta(self.before[role], self._sum(p)) for role, p in self.pids.items()}
        used |= dict(reported)
        used["publisher"] = own_cpu_seconds() - self.own
        machine = _delta(self.machine, machine_busy_seconds())
        out = {role: _percent(sec, wall) for role, sec in used.items()}
        if machine is not None and None not in used.values():
            out["machine"] = _percent(machine, wall)
            out["other"] = _percent(max(0.0, machine - sum(used.values())), wall)
        return out


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _percent(seconds: float | None, wall: float) -> float | None:
    return None if seconds is None or wall <= 0 else round(100 * seconds / wall, 1)


# -- servers: a GES broker or network, or the baseline relay(s) ----------------------------------


def make_certs(kids: Children, topology: Topology) -> Path:
    """The certificates of ``topology``'s network (its name is the CA's) in the temp directory,
    as ``ges up`` makes them (the CA, one per broker, the operator client ``admin``). Made once
    per network name; a later start of the same network only adds what is missing."""
    root = kids.tmp / f"certs-{topology.name}"
    init_certs(topology, root)
    return root


def client_tls(certs: Path | None):
    """The TLS context of a bench client (presenting ``clients/admin``), None for plain TCP."""
    return None if certs is None else client_auth(CertDir(certs)).tls


class Server:
    """What a scenario publishes into and subscribes from."""

    def __init__(
        self,
        children: list[Child],
        pub_port: int,
        sub_port: int,
        topology: str = "",
        pids: list[int] | None = None,
        certs: Path | None = None,
    ):
        self.children = children
        self.pub_port = pub_port
        self.sub_port = sub_port
        self.topology = topology
        #: the network's certificate directory when its brokers run TLS (None: --insecure)
        self.certs = certs
        #: every process doing the broker/relay work (ges up's brokers, not ges up itself)
        self.pids = pids or [c.pid for c in children]

    def cpu_roles(self) -> dict[str, list[int]]:
        roles = {"broker": self.pids}
        supervisors = [c.pid for c in self.children if c.pid not in self.pids]
        if supervisors:
            roles["supervisor"] = supervisors
        return roles


def start_ges_broker(kids: Children, flags: tuple[str, ...] = (), *, tls: bool = False) -> Server:
    """``ges broker`` of a one-broker topology on a free port: ``--insecure``, or with ``tls``
    over TLS with ``--certs`` (certificates made for this topology)."""
    port = free_ports(1)[0]
    name = "bench-one-broker"
    data = {
        "name": name,
        "brokers": {"b1": {"unit": "bench/c1", "host": "127.0.0.1", "port": port}},
        "links": [],
    }
    path = kids.tmp / "one-broker.yaml"
    path.write_text(yaml.safe_dump(data))
    certs = make_certs(kids, Topology.from_yaml(path)) if tls else None
    security = ["--certs", certs] if certs else ["--insecure"]
    child = kids.spawn(
        "ges broker" + (" TLS" if tls else ""),
        [*GES, "broker", path, "--id", "b1", "--data-dir", kids.tmp / "data-one"]
        + ["--log-level", "warning", *security, *flags],
        stdout_pipe=False,
    )
    wait_listening(child, port)
    return Server([child], port, port, name, certs=certs)


def paper_on_free_ports(kids: Children) -> tuple[Path, Topology]:
    data = on_free_ports(yaml.safe_load(PAPER_TOPOLOGY.read_text()))
    path = kids.tmp / "ges-paper.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, Topology.from_yaml(path)


def shortest_path(topology: Topology, src: str, dst: str) -> list[str]:
    previous = {src: None}
    frontier = collections.deque([src])
    while frontier:
        node = frontier.popleft()
        if node == dst:
            break
        for peer in sorted(topology.neighbours[node]):
            if peer not in previous:
                previous[peer] = node
                frontier.append(peer)
    path = [dst]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])
    return path[::-1]


def start_ges_paper(kids: Children) -> tuple[Server, list[tuple[str, int]]]:
    """``ges up --processes`` on the paper's topology; with it the brokers (and their ports)
    along the shortest path from PAPER_PUBLISHER to PAPER_SUBSCRIBER, in that order."""
    path, topology = paper_on_free_ports(kids)
    child = kids.spawn(
        "ges up",
        [*GES, "up", path, "--no-live", "--processes", "--data-dir", kids.tmp / "data-paper"]
        + ["--log-level", "warning", "--ready-timeout", str(UP_READY_TIMEOUT), "--insecure"],
    )
    child.wait_line(lambda line: line.startswith("ready:"), UP_READY_TIMEOUT + 10, "ready line")
    run = json.loads((kids.tmp / "data-paper" / "run.json").read_text())
    brokers = topology.brokers
    route = shortest_path(topology, PAPER_PUBLISHER, PAPER_SUBSCRIBER)
    server = Server(
        [child],
        brokers[PAPER_PUBLISHER].port,
        brokers[PAPER_SUBSCRIBER].port,
        topology.name,
        pids=[b["pid"] for b in run["brokers"]],
    )
    return server, [(b, brokers[b].port) for b in route]


def start_relays(kids: Children, hops: int) -> Server:
    """A chain of ``hops + 1`` relay processes (one relay for hops == 0)."""
    ports = free_ports(hops + 1)
    children = []
    upstream: list[str] = []
    for i, port in enumerate(ports):
        child = kids.spawn(
            f"relay {i}", [sys.executable, BENCH / "_relay.py", "--port", port, *upstream]
        )
        child.wait_line(lambda line: line.strip() == "ready", STARTUP_TIMEOUT, "ready line")
        children.append(child)
        upstream = ["--upstream", f"127.0.0.1:{port}"]
    return Server(children, ports[0], ports[-1])


class Subscribers:
    def __init__(
        self,
        kids: Children,
        proto: str,
        server: Server,
        *,
        clients: int,
        expect: int,
        latency,
        ports: list[int] | None = None,
    ):
        """``clients`` subscribers at the server's subscriber port, or one per port of
        ``ports`` (GES), in that order."""
        cmd = [sys.executable, BENCH / "_subscriber.py", "--proto", proto]
        cmd += ["--port", server.sub_port, "--clients", clients, "--expect", expect]
        if ports:
            cmd += ["--ports", ",".join(map(str, ports))]
        if server.topology:
            cmd += ["--topology", server.topology]
        if server.certs:
            cmd += ["--certs", server.certs]
        if latency:
            cmd.append("--latency")
        self.child = kids.spawn(f"{proto} subscriber", cmd)
        self.child.wait_line(lambda line: line.strip() == "ready", STARTUP_TIMEOUT, "ready line")

    def result(self, timeout: float) -> dict:
        line = self.child.wait_line(lambda line: line.startswith("{"), timeout, "result")
        return json.loads(line)


# -- publishers (in this process) ----------------------------------------------------------------


def record_size() -> int:
    """Bytes per event of a GES Publish batch of 100-byte events; baseline records match it."""
    batch = [m.Event({"n": 123_456}, b"x" * PAYLOAD_BYTES, time.time_ns()) for _ in range(256)]
    return max(RECORD_HEADER.size, round(len(encode(m.Publish(1, batch))) / len(batch)))


async def ges_publish_fast(server: Server, n: int, batch: int) -> float:
    payload = b"x" * PAYLOAD_BYTES
    event = m.Event
    async with connect(
        "127.0.0.1",
        server.pub_port,
        topology=server.topology,
        client_id="bench-publisher",
        tls=client_tls(server.certs),
    ) as client:
        started = time.perf_counter()
        for start in range(0, n, batch):
            now = time.time_ns()
            await client.publish_nowait(
                [event({"n": i}, payload, now) for i in range(start, min(n, start + batch))]
            )
        await client.flush()
        return time.perf_counter() - started


async def raw_publish_fast(server: Server, n: int, batch: int, size: int) -> float:
    pack, length = RECORD_HEADER.pack, size - 4
    filler = b"x" * (size - RECORD_HEADER.size)
    stream = await trio.open_tcp_stream("127.0.0.1", server.pub_port)
    async with stream:
        await stream.send_all(ROLE_PUBLISHER)
        started = time.perf_counter()
        for start in range(0, n, batch):
            now = time.time_ns()
            await stream.send_all(
                b"".join(
                    [pack(length, now, i) + filler for i in range(start, min(n, start + batch))]
                )
            )
        return time.perf_counter() - started


async def paced(send_one, rate: float, count: int) -> float:
    """Call ``send_one(i)`` for i in range(count) at ``rate`` per second; the elapsed seconds."""
    t0 = trio.current_time()
    for i in range(count):
        await trio.sleep_until(t0 + i / rate)
        await send_one(i)
    return trio.current_time() - t0


async def ges_publish_paced(server: Server, rate: float, count: int) -> float:
    payload = b"x" * PAYLOAD_BYTES
    event = m.Event
    async with connect(
        "127.0.0.1",
        server.pub_port,
        topology=server.topology,
        client_id="bench-publisher",
        tls=client_tls(server.certs),
    ) as client:

        async def send_one(i: int) -> None:
            await client.publish_nowait([event({"n": i}, payload, time.time_ns())])

        elapsed = await paced(send_one, rate, count)
        await client.flush()
        return elapsed


async def raw_publish_paced(server: Server, rate: float, count: int, size: int) -> float:
    pack, length = RECORD_HEADER.pack, size - 4
    filler = b"x" * (size - RECORD_HEADER.size)
    stream = await trio.open_tcp_stream("127.0.0.1", server.pub_port)
    async with stream:
        await stream.send_all(ROLE_PUBLISHER)

        async def send_one(i: int) -> None:
            await stream.send_all(pack(length, time.time_ns(), i) + filler)

        return await paced(send_one, rate, count)


# -- scenarios -----------------------------------------------------------------------------------


def throughput_figures(result: dict, expect_per_client: int) -> dict:
    clients = result["clients"]
    got = [c for c in clients if c["first_ns"] is not None]
    delivered = sum(c["count"] for c in clients)
    out = {
        "subscribers": len(clients),
        "events": expect_per_client,
        "delivered": delivered,
        "lost": len(clients) * expect_per_client - delivered,
        "errors": sorted({c["error"] for c in clients if c["error"]}),
    }
    if got:
        earliest = min(got, key=lambda c: c["first_ns"])
        span = (max(c["last_ns"] for c in got) - earliest["first_ns"]) / 1e9
        # events in the first batch arrived at the start of the span, not during it
        counted = delivered - earliest["first_n"]
        rate = counted / span if span > 0 else math.nan
        out |= {
            "receive_seconds": round(span, 4),
            "deliveries_per_s": round(rate, 1),
            "events_per_s_per_subscriber": round(rate / len(clients), 1),
        }
    return out


def run_throughput(
    kids: Children,
    proto: str,
    clients: int,
    n: int,
    args,
    size: int,
    flags: tuple[str, ...] = (),
    *,
    tls: bool = False,
) -> dict:
    """One throughput run; ``tls``: the GES broker and clients over TLS, not ``--insecure``."""
    label = f"{'GES' if proto == 'ges' else 'baseline'}{' TLS' if tls else ''} 1→{clients}"
    if flags:
        label += f" ({' '.join(flags)})"
    log(f"{label}: {n:,} events of {PAYLOAD_BYTES} B to {clients} subscriber(s) …")
    server = start_ges_broker(kids, flags, tls=tls) if proto == "ges" else start_relays(kids, 0)
    subs = None
    try:
        subs = Subscribers(kids, proto, server, clients=clients, expect=n, latency=False)
        cpu = CpuWindow(server.cpu_roles())
        if proto == "ges":
            pub_seconds = trio.run(ges_publish_fast, server, n, args.batch)
        else:
            pub_seconds = trio.run(raw_publish_fast, server, n, args.batch, size)
        result = subs.result(timeout=max(60.0, n * clients / 20_000))
        cpu_percent = cpu.finish({"subscriber": result.get("cpu_seconds")})
    finally:
        if subs is not None:
            kids.stop(subs.child)
        for child in server.children:
            kids.stop(child)
    figures = throughput_figures(result, n)
    figures["publish_seconds"] = round(pub_seconds, 4)
    figures["publish_events_per_s"] = round(n / pub_seconds, 1)
    figures["cpu_percent"] = cpu_percent
    log(
        f"{label}: {figures.get('deliveries_per_s', 0):,.0f} deliveries/s at the subscriber"
        f" side, {figures['publish_events_per_s']:,.0f} events/s published, lost {figures['lost']}"
    )
    return figures


def median_run(runs: list[dict]) -> dict:
    """The run with the median subscriber-side rate, with every run's headline figures."""
    ordered = sorted(runs, key=lambda f: f.get("deliveries_per_s") or 0.0)
    pick = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        pick["runs"] = [
            {k: f.get(k) for k in ("deliveries_per_s", "publish_events_per_s", "lost", "errors")}
            for f in runs
        ]
    return pick


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of a sorted list."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_figures(result: dict, count: int, skip: int) -> dict:
    client = result["clients"][0]
    samples = client["latencies_ns"][skip:]
    out = {
        "published": count,
        "delivered": client["count"],
        "lost": count - client["count"],
        "warmup_events_dropped": skip,
        "samples": len(samples),
        "errors": [client["error"]] if client["error"] else [],
    }
    if client.get("hops"):
        out["hops_seen"] = client["hops"]
    if samples:
        s = sorted(samples)
        out |= {
            "p50_us": round(percentile(s, 50) / 1e3, 1),
            "p99_us": round(percentile(s, 99) / 1e3, 1),
            "mean_us": round(sum(s) / len(s) / 1e3, 1),
            "max_us": round(s[-1] / 1e3, 1),
            "min_us": round(s[0] / 1e3, 1),
        }
        # a queue that builds up shows as a later p50 well above an earlier one
        tenth = max(1, len(samples) // 10)
        out["p50_first_10pct_us"] = round(percentile(sorted(samples[:tenth]), 50) / 1e3, 1)
        out["p50_last_10pct_us"] = round(percentile(sorted(samples[-tenth:]), 50) / 1e3, 1)
    return out


def run_latency(
    kids: Children, proto: str, paper: bool, args, sizes: dict, size: int, *, tls: bool = False
) -> dict:
    """One latency run; ``tls`` (one hop only): the GES broker and clients over TLS."""
    label = f"{'GES' if proto == 'ges' else 'baseline'}{' TLS' if tls else ''} latency"
    label += f" {'22→10' if paper else 'one hop'}"
    rate = LATENCY_RATE
    count = int(rate * (sizes["latency_seconds"] + sizes["warmup_seconds"]))
    skip = int(rate * sizes["warmup_seconds"])
    hops = 0
    path: list[tuple[str, int]] = []  # GES 22→10: the brokers along it, one run at each
    if paper:
        if proto == "ges":
            log(f"{label}: starting ges up --processes on ges-paper.yaml …")
            server, path = start_ges_paper(kids)
        else:
            _path, topology = paper_on_free_ports(kids)
            route = shortest_path(topology, PAPER_PUBLISHER, PAPER_SUBSCRIBER)
            hops = len(route) - 1
            log(f"{label}: a chain of {len(route)} relay processes along {' → '.join(route)} …")
            server = start_relays(kids, hops)
    else:
        server = start_ges_broker(kids, tls=tls) if proto == "ges" else start_relays(kids, 0)

    def measure(port: int | None, what: str) -> tuple[dict, float, dict]:
        subs = None
        try:
            ports = [port] if port is not None else None
            subs = Subscribers(
                kids, proto, server, clients=1, expect=count, latency=True, ports=ports
            )
            log(f"{what}: {count:,} single events at {rate:,.0f}/s …")
            cpu = CpuWindow(server.cpu_roles())
            if proto == "ges":
                elapsed = trio.run(ges_publish_paced, server, rate, count)
            else:
                elapsed = trio.run(raw_publish_paced, server, rate, count, size)
            result = subs.result(timeout=60.0)
            return result, elapsed, cpu.finish({"subscriber": result.get("cpu_seconds")})
        finally:
            if subs is not None:
                kids.stop(subs.child)

    along: list[dict] = []  # per hop count along the path, the subscriber's broker that far
    try:
        for position, (broker, port) in enumerate(path[:-1]):
            result, _, _ = measure(port, f"{label}, subscriber at {broker} ({position} hops)")
            along.append(
                {"hops": position, "broker": broker} | latency_figures(result, count, skip)
            )
        result, elapsed, cpu_percent = measure(path[-1][1] if path else None, label)
    finally:
        for child in reversed(server.children):
            kids.stop(child)
    figures = latency_figures(result, count, skip)
    if path:
        along.append({"hops": len(path) - 1, "broker": path[-1][0]} | figures)
        figures["by_hop_count"] = along
    figures["rate_per_s"] = round(count / elapsed, 1) if elapsed > 0 else None
    figures["broker_processes"] = len(server.pids)
    figures["cpu_percent"] = cpu_percent
    if hops:
        figures["relay_hops"] = hops
    log(
        f"{label}: p50 {figures.get('p50_us', math.nan):,.0f} µs, "
        f"p99 {figures.get('p99_us', math.nan):,.0f} µs, lost {figures['lost']}"
    )
    return figures


# -- profiling (optional) ------------------------------------------------------------------------


def run_profiled(kids: Children, n: int, args, top: int = 12) -> dict:
    """An extra GES 1→1 run with py-spy attached to the broker, subscriber and publisher."""
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        log("[yellow]--profile: py-spy not found; install it with pip install py-spy[/yellow]")
        return {"error": "py-spy not found"}
    log(f"profile: GES 1→1 with py-spy, {n:,} events …")
    server = start_ges_broker(kids)
    subs = spies = None
    try:
        subs = Subscribers(kids, "ges", server, clients=1, expect=n, latency=False)
        targets = {
            "broker": server.children[0].pid,
            "subscriber": subs.child.pid,
            "publisher": os.getpid(),
        }
        spies = {}
        for role, pid in targets.items():
            out = kids.tmp / f"py-spy-{role}.txt"
            spies[role] = (
                kids.spawn(
                    f"py-spy {role}",
                    [py_spy, "record", "--pid", pid, "--rate", "500", "--nonblocking"]
                    + ["--format", "raw", "--output", out],
                    stdout_pipe=False,
                ),
                out,
            )
        time.sleep(1.0)  # let py-spy attach
        trio.run(ges_publish_fast, server, n, args.batch)
        subs.result(timeout=max(60.0, n / 20_000))
    finally:
        if spies:
            for spy, _out in spies.values():
                with contextlib.suppress(ProcessLookupError):
                    spy.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            for spy, _out in spies.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.proc.wait(timeout=20)
                kids.stop(spy)
        if subs is not None:
            kids.stop(subs.child)
        for child in server.children:
            kids.stop(child)
    return {role: hot_functions(out, top) for role, (_spy, out) in spies.items()}


def hot_functions(path: Path, top: int) -> dict:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    self_counts: collections.Counter = collections.Counter()
    incl_counts: collections.Counter = collections.Counter()
    total = 0
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {"error": f"no py-spy output at {path}"}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";") if "(" in f]
        if frames:
            self_counts[frames[-1]] += n
            for name in set(frames):
                incl_counts[name] += n
    if not total:
        return {"samples": 0}
    # frames on (almost) every stack are entry points (runpy, typer, trio.run): not informative
    inclusive = [(n, c) for n, c in incl_counts.most_common() if c < 0.85 * total][:top]
    return {
        "samples": total,
        "self": [(name, round(100 * c / total, 1)) for name, c in self_counts.most_common(top)],
        "inclusive": [(name, round(100 * c / total, 1)) for name, c in inclusive],
    }


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` → ``func (file.py)``."""
    func, _, where = frame.strip().partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(where).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else where
    return f"{func} ({short})"


# -- report --------------------------------------------------------------------------------------


def _fmt(value, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if unit == "µs":
        return f"{value:,.0f} µs" if value >= 10 else f"{value:,.1f} µs"
    return f"{value:,.0f}{unit}"


def _ratio(ges, base) -> float | None:
    if ges is None or base is None or not base:
        return None
    return round(ges / base, 3)


def build_report(results: dict, sizes: dict, size: int, args, started: float) -> dict:
    for key, res in results.items():
        if key == "profile":
            continue
        g, b = res["ges"], res["baseline"]
        fields = (
            ("deliveries_per_s", "publish_events_per_s")
            if key.startswith("1to")
            else ("p50_us", "p99_us", "mean_us", "max_us")
        )
        res["ratio_ges_over_baseline"] = {f: _ratio(g.get(f), b.get(f)) for f in fields}
        if "ges_tls" in res:
            res["tls_vs_insecure"] = tls_vs_insecure(key, g, res["ges_tls"])
    meets = {}
    for key in ("1to1", "1to100"):
        if key in results:
            value = results[key]["ges"].get("deliveries_per_s")
            meets[key] = _meets(value, AIMS[key], higher=True)
    for key in ("latency_1hop", "latency_paper"):
        if key in results:
            value = results[key]["ges"].get("p50_us")
            meets[f"{key}_p50_us"] = _meets(value, AIMS[f"{key}_p50_us"], higher=False)
    if "tls_vs_insecure" in results.get("1to1", {}):
        value = results["1to1"]["tls_vs_insecure"]["deliveries_per_s_ratio"]
        meets["1to1_tls_cost"] = _meets(value, 1 - AIMS["tls_throughput_cost_max"], higher=True)
    if "tls_vs_insecure" in results.get("latency_1hop", {}):
        value = results["latency_1hop"]["tls_vs_insecure"]["added_p50_us"]
        meets["latency_1hop_tls_added_p50_us"] = _meets(
            value, AIMS["tls_added_p50_us_per_hop_max"], higher=False
        )
    return {
        "bench": "throughput",
        "mode": "quick" if args.quick else "full",
        "scenarios": [k for k in results if k != "profile"],
        "config": {
            **sizes,
            "payload_bytes": PAYLOAD_BYTES,
            "ges_bytes_per_event_in_publish": size,
            "baseline_record_bytes": size,
            "publish_batch": args.batch,
            "fanout_subscribers": FANOUT_CLIENTS,
            "latency_rate_per_s": LATENCY_RATE,
            "tls_scenarios": [k for k in TLS_SCENARIOS if "ges_tls" in results.get(k, {})],
            "tls_client_certificate": f"clients/{TLS_CLIENT} (role operator)",
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "results": results,
        "aims": AIMS,
        "meets_aims": meets,
        "reference_not_measured_in_this_run": REFERENCE,
        "warnings": _busy_neighbours(results),
        "seconds": round(time.perf_counter() - started, 1),
    }


def tls_vs_insecure(key: str, insecure: dict, tls: dict) -> dict:
    """TLS against --insecure, both GES runs of this process: TLS/--insecure for throughput
    (and the share of it TLS costs), the µs TLS adds for latency."""
    if key.startswith("1to"):
        out = {
            f"{f}_ratio": _ratio(tls.get(f), insecure.get(f))
            for f in ("deliveries_per_s", "publish_events_per_s")
        }
        ratio = out["deliveries_per_s_ratio"]
        out["throughput_cost"] = None if ratio is None else round(1 - ratio, 3)
        return out
    out = {}
    for f in ("p50_us", "p99_us", "mean_us"):
        a, b = tls.get(f), insecure.get(f)
        out[f"added_{f}"] = None if a is None or b is None else round(a - b, 1)
        out[f"{f}_ratio"] = _ratio(a, b)
    return out


def _meets(value, aim, *, higher: bool) -> bool | None:
    if value is None:
        return None
    return value >= aim if higher else value <= aim


def render(report: dict, out: Console) -> None:
    res = report["results"]
    cfg = report["config"]
    mosq, amqtt = REFERENCE["mosquitto 2.0.11"], REFERENCE["amqtt (pure-Python MQTT)"]
    table = Table(
        title=f"GES throughput and latency ({report['mode']} run, {report['seconds']:.0f} s)",
        caption=(
            f"{cfg['payload_bytes']}-byte payloads ({cfg['ges_bytes_per_event_in_publish']} B per"
            f" event in a GES Publish; baseline records padded to the same size); publish batches"
            f" of {cfg['publish_batch']}; latency at {cfg['latency_rate_per_s']:,.0f} events/s, one"
            " event per frame.\nbaseline = raw trio TCP relay (bench/_relay.py), same process"
            " layout, measured in this run.\n* reference figures from the issue, measured earlier"
            " on this machine — NOT measured in this run."
        ),
        caption_justify="left",
    )
    table.add_column("measure")
    table.add_column("GES", justify="right", style="bold")
    table.add_column("baseline", justify="right")
    table.add_column("GES/baseline", justify="right")
    table.add_column("aim (GES)", justify="right")
    table.add_column("mosquitto 2.0.11*", justify="right", style="dim")
    table.add_column("amqtt*", justify="right", style="dim")

    def mark(key):
        ok = report["meets_aims"].get(key)
        return "" if ok is None else (" [green]✓[/green]" if ok else " [red]✗[/red]")

    def ratio(key, field):
        value = res[key]["ratio_ges_over_baseline"].get(field)
        return "—" if value is None else f"{value:.2f}×"

    def row(*cells, end_section=False):
        table.add_row(*cells, *[""] * (7 - len(cells)), end_section=end_section)

    def cpu_row(label, g, b):
        row(f"{label} CPU % broker(s)·sub·pub (other)", _cpu(g), _cpu(b), end_section=True)

    for key, label in (("1to1", "1→1"), ("1to100", f"1→{FANOUT_CLIENTS}")):
        if key not in res:
            continue
        g, b = res[key]["ges"], res[key]["baseline"]
        what = "events/s" if key == "1to1" else "aggregate deliveries/s"
        row(
            f"{label} {what} (subscriber side)",
            _fmt(g.get("deliveries_per_s")),
            _fmt(b.get("deliveries_per_s")),
            ratio(key, "deliveries_per_s"),
            f"≥ {AIMS[key]:,}{mark(key)}",
            _fmt(mosq.get(key)),
            _fmt(amqtt.get(key)),
        )
        if key == "1to100":
            row(
                f"{label} events/s per subscriber",
                _fmt(g.get("events_per_s_per_subscriber")),
                _fmt(b.get("events_per_s_per_subscriber")),
            )
        if "runs" in g:
            row(
                f"{label} all {len(g['runs'])} runs (median shown)",
                _spread(g),
                _spread(b),
            )
        row(
            f"{label} publish-side events/s",
            _fmt(g.get("publish_events_per_s")),
            _fmt(b.get("publish_events_per_s")),
            ratio(key, "publish_events_per_s"),
        )
        row(f"{label} delivered / lost", _count(g), _count(b))
        cpu_row(label, g, b)
    for key, label in (("latency_1hop", "one hop"), ("latency_paper", "22→10 (5 hops)")):
        if key not in res:
            continue
        g, b = res[key]["ges"], res[key]["baseline"]
        aim_key = f"{key}_p50_us"
        for field in ("p50_us", "p99_us", "mean_us", "max_us"):
            is_p50 = field == "p50_us"
            mosq_cell = amqtt_cell = ""
            if is_p50:
                mosq_cell = _fmt(mosq.get(aim_key), "µs")
                if key == "latency_paper":
                    mosq_cell += " (2-hop bridge)"
                amqtt_cell = _fmt(amqtt.get(aim_key), "µs") if aim_key in amqtt else ""
            row(
                f"latency {label} {field.removesuffix('_us')}",
                _fmt(g.get(field), "µs"),
                _fmt(b.get(field), "µs"),
                ratio(key, field),
                f"≤ {AIMS[aim_key]:,} µs{mark(aim_key)}" if is_p50 else "",
                mosq_cell,
                amqtt_cell,
            )
        row(
            f"latency {label} p50 first → last 10 %",
            _drift(g),
            _drift(b),
        )
        row(
            f"latency {label} samples / lost",
            f"{g.get('samples', 0):,} / {g['lost']}",
            f"{b.get('samples', 0):,} / {b['lost']}",
        )
        cpu_row(f"latency {label}", g, b)
    out.print(table)
    if any("tls_vs_insecure" in r for r in res.values()):
        out.print(render_tls(report))
    path = res.get("latency_paper", {}).get("ges", {}).get("by_hop_count")
    if path:
        out.print(render_path(path))
    for warning in report["warnings"]:
        out.print(f"[yellow]warning:[/yellow] {warning}", soft_wrap=True)
    profile = res.get("profile")
    if profile:
        for role, prof in profile.items():
            if not prof.get("self"):
                out.print(f"profile {role}: {prof}")
                continue
            t = Table(title=f"py-spy: {role} (GES 1→1, {prof['samples']:,} samples)")
            t.add_column("self %", justify="right")
            t.add_column("function (self time)")
            t.add_column("incl %", justify="right")
            t.add_column("function (inclusive)")
            rows = max(len(prof["self"]), len(prof["inclusive"]))
            for i in range(rows):
                s = prof["self"][i] if i < len(prof["self"]) else ("", "")
                c = prof["inclusive"][i] if i < len(prof["inclusive"]) else ("", "")
                t.add_row(str(s[1]), s[0], str(c[1]), c[0])
            out.print(t)


def render_path(path: list[dict]) -> Table:
    """GES latency along the 22→10 path, a subscriber at every broker on it."""
    t = Table(
        title="GES 22→10 (reliable, ges up --processes): latency by hop count",
        caption="One run per broker along the path, its subscriber there (the last is the "
        "22→10 row above); 'added' is the p50 over the previous broker's.",
    )
    for col in ("hops", "broker", "p50", "p99", "added p50", "samples", "delivered via"):
        t.add_column(col, justify="left" if col in ("broker", "delivered via") else "right")
    previous = None
    for row in path:
        p50 = row["p50_us"]
        added = p50 - previous if p50 is not None and previous is not None else None
        t.add_row(
            str(row["hops"]),
            row["broker"],
            _fmt(p50, "µs"),
            _fmt(row["p99_us"], "µs"),
            _fmt(added, "µs") if added is not None else "",
            f"{row['samples']:,}",
            ", ".join(f"{k} hops: {v:,}" for k, v in row.get("hops_seen", {}).items())
            or "; ".join(row["errors"]),
        )
        previous = p50
    return t


def render_tls(report: dict) -> Table:
    """GES over TLS beside GES --insecure, both measured in this run."""
    res = report["results"]
    table = Table(
        title="GES over TLS against GES --insecure (issue 19), measured in this run",
        caption=(
            "TLS: the broker started with --certs (TLS 1.3, the run's own CA), the publisher and"
            f" the subscriber process presenting clients/{TLS_CLIENT}; --insecure: plain TCP, the"
            " GES column above. Same events, batches, rates and process layout; 1→1 runs"
            " alternate.\nAims (issue 19): TLS costs ≤ 15 % of throughput (TLS/--insecure ≥"
            " 0.85×) and ≤ 50 µs p50 per hop."
        ),
        caption_justify="left",
    )
    table.add_column("measure")
    table.add_column("GES --insecure", justify="right")
    table.add_column("GES TLS", justify="right", style="bold")
    table.add_column("TLS/--insecure", justify="right")
    table.add_column("TLS adds", justify="right")
    table.add_column("aim (TLS)", justify="right")

    def mark(key):
        ok = report["meets_aims"].get(key)
        return "" if ok is None else (" [green]✓[/green]" if ok else " [red]✗[/red]")

    def x(value):
        return "—" if value is None else f"{value:.2f}×"

    def row(*cells, end_section=False):
        table.add_row(*cells, *[""] * (6 - len(cells)), end_section=end_section)

    if "tls_vs_insecure" in res.get("1to1", {}):
        g, t, vs = res["1to1"]["ges"], res["1to1"]["ges_tls"], res["1to1"]["tls_vs_insecure"]
        cost = vs.get("throughput_cost")
        row(
            "1→1 events/s (subscriber side)",
            _fmt(g.get("deliveries_per_s")),
            _fmt(t.get("deliveries_per_s")),
            x(vs.get("deliveries_per_s_ratio")),
            "—" if cost is None else f"{100 * cost:.0f} % cost",
            f"cost ≤ {100 * AIMS['tls_throughput_cost_max']:.0f} %{mark('1to1_tls_cost')}",
        )
        if "runs" in t:
            row(f"1→1 all {len(t['runs'])} runs (median shown)", _spread(g), _spread(t))
        row(
            "1→1 publish-side events/s",
            _fmt(g.get("publish_events_per_s")),
            _fmt(t.get("publish_events_per_s")),
            x(vs.get("publish_events_per_s_ratio")),
        )
        row("1→1 delivered / lost", _count(g), _count(t))
        row("1→1 CPU % broker·sub·pub (other)", _cpu(g), _cpu(t), end_section=True)
    if "tls_vs_insecure" in res.get("latency_1hop", {}):
        lat = res["latency_1hop"]
        g, t, vs = lat["ges"], lat["ges_tls"], lat["tls_vs_insecure"]
        for field in ("p50_us", "p99_us", "mean_us"):
            added = vs.get(f"added_{field}")
            row(
                f"latency one hop {field.removesuffix('_us')}",
                _fmt(g.get(field), "µs"),
                _fmt(t.get(field), "µs"),
                x(vs.get(f"{field}_ratio")),
                "—" if added is None else f"{added:+,.0f} µs",
                f"≤ {AIMS['tls_added_p50_us_per_hop_max']} µs{mark('latency_1hop_tls_added_p50_us')}"
                if field == "p50_us"
                else "",
            )
        row("latency one hop p50 first → last 10 %", _drift(g), _drift(t))
        row(
            "latency one hop samples / lost",
            f"{g.get('samples', 0):,} / {g['lost']}",
            f"{t.get('samples', 0):,} / {t['lost']}",
        )
        row("latency one hop CPU % broker·sub·pub (other)", _cpu(g), _cpu(t))
    return table


def _cpu(fig: dict) -> str:
    cpu = fig.get("cpu_percent", {})
    main = "·".join(_fmt(cpu.get(k)) for k in ("broker", "subscriber", "publisher"))
    return f"{main} ({_fmt(cpu.get('other'))})"


def _spread(fig: dict) -> str:
    return " ".join(f"{(r['deliveries_per_s'] or 0) / 1e3:,.0f}k" for r in fig.get("runs", []))


def _count(fig: dict) -> str:
    return f"{fig['delivered']:,} / {fig['lost']:,}"


def _drift(fig: dict) -> str:
    first, last = fig.get("p50_first_10pct_us"), fig.get("p50_last_10pct_us")
    return f"{_fmt(first, 'µs')} → {_fmt(last, 'µs')}" if first is not None else "—"


def _busy_neighbours(results: dict, limit: float = 25.0) -> list[str]:
    """Runs during which processes outside the bench used more than ``limit`` % of a core."""
    warnings = []
    for key, res in results.items():
        if key == "profile":
            continue
        for side in [s for s in ("ges", "ges_tls", "baseline") if s in res]:
            other = res[side].get("cpu_percent", {}).get("other")
            if other is not None and other > limit:
                warnings.append(
                    f"{key} {side}: other processes used {other:.0f} % of a core during the run;"
                    " its figures are pessimistic"
                )
    return warnings


# -- main ----------------------------------------------------------------------------------------


def _failures(results: dict) -> list[str]:
    problems = []
    for key, res in results.items():
        if key == "profile":
            continue
        for side in [s for s in ("ges", "ges_tls", "baseline") if s in res]:
            for i, fig in enumerate(res[side].get("runs") or [res[side]]):
                run = f"{key} {side}" + (f" run {i + 1}" if "runs" in res[side] else "")
                if fig.get("lost"):
                    problems.append(f"{run}: {fig['lost']} events not delivered")
                for error in fig.get("errors", []):
                    problems.append(f"{run}: {error}")
    return problems


def variants(key: str, args) -> list[tuple[str, str, bool]]:
    """(result key, protocol, over TLS) of a scenario's runs, in the order they alternate:
    GES --insecure, GES over TLS (the TLS scenarios, unless --no-tls), the baseline."""
    out = [("ges", "ges", False)]
    if key in TLS_SCENARIOS and not args.no_tls:
        out.append(("ges_tls", "ges", True))
    return [*out, ("baseline", "raw", False)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description="GES throughput and latency beside a raw trio relay baseline."
    )
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--batch", type=int, default=256, help="events per publish batch")
    parser.add_argument(
        "--profile", action="store_true", help="add a GES 1→1 run under py-spy and report hot spots"
    )
    parser.add_argument(
        "--no-tls",
        action="store_true",
        help=f"leave out the runs over TLS ({', '.join(TLS_SCENARIOS)} beside --insecure)",
    )
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)} [default: all]",
    )
    args = parser.parse_args()
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = sorted(set(only) - set(SCENARIOS))
    if unknown or not only:
        parser.error(f"--only: unknown scenario(s) {', '.join(unknown) or '(none given)'}")
    sizes = dict(SIZES["quick" if args.quick else "full"])
    started = time.perf_counter()
    size = record_size()
    tmp = Path(tempfile.mkdtemp(prefix="ges-bench-"))
    kids = Children(tmp)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict = {}
    try:
        for key, clients, n, repeats in (
            ("1to1", 1, sizes["events_1to1"], sizes["repeats_1to1"]),
            ("1to100", FANOUT_CLIENTS, sizes["events_1to100"], 1),
        ):
            if key not in only:
                continue
            sides = variants(key, args)
            runs: dict[str, list] = {side: [] for side, _proto, _tls in sides}
            for _ in range(repeats):  # alternate, so a busy neighbour hits all alike
                for side, proto, tls in sides:
                    runs[side].append(run_throughput(kids, proto, clients, n, args, size, tls=tls))
            results[key] = {side: median_run(r) for side, r in runs.items()}
        for key, paper in (("latency_1hop", False), ("latency_paper", True)):
            if key not in only:
                continue
            results[key] = {
                side: run_latency(kids, proto, paper, args, sizes, size, tls=tls)
                for side, proto, tls in variants(key, args)
            }
        if args.profile:
            results["profile"] = run_profiled(kids, sizes["events_1to1"], args)
    except BenchError as exc:
        console.print(f"[bold red]error:[/bold red] {exc}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        kids.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    report = build_report(results, sizes, size, args, started)
    return finish(report, _failures(results), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
