"""What watching a network costs its brokers: ``ges monitor`` on a running network, beside the same
network unwatched, in the same run.

    python bench/monitor.py [--quick] [--json] [--topology T.yaml] [--seconds S] [--interval I]

``ges up T --no-live --insecure`` (embedded: every broker in one process, on free ports) runs
the topology — by default ``topologies/generated-512.yaml``, 512 brokers. Then, in turn:

1. **unwatched**: nothing but the network for S seconds;
2. **watched**: ``ges monitor T --plain --interval I`` (its output to /dev/null) for S seconds —
   watching through one broker, to which every broker reports each interval (ges.core.watch);
3. **polled**: the same with ``--poll``, which asks every broker each interval over a
   connection of its own (how ``ges monitor`` worked before it watched through one broker).

Per phase: the brokers' CPU (the ``ges up`` process, % of one core), the monitor's CPU, and the
frames the brokers received and sent per second (their ``frames_in``/``frames_out`` counters,
read from every broker before and after the phase — that reading is outside both phases). The
ratios are watched ÷ unwatched and polled ÷ unwatched, from the same run. ``--quick``: 128 brokers
(``ges.topology.generate``, 2·4·4·4, on free ports), 10 s phases. ``--tls``: the network runs
secure, as ``ges up`` does by default (every connection the monitor opens is then a TLS
handshake); otherwise ``--insecure``.

Nothing here asserts a timing. Exit 0 when every phase ran; 1 otherwise; 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli._common import client_auth  # noqa: E402
from ges.client import broker_stats  # noqa: E402
from ges.errors import OperationError  # noqa: E402
from ges.runtime.ports import on_free_ports  # noqa: E402
from ges.security.certs import CertDir  # noqa: E402
from ges.topology import Topology  # noqa: E402
from ges.topology.generate import generate  # noqa: E402

GES = [sys.executable, "-m", "cli.main"]
KINDS = ("unwatched", "watched", "polled")
READY_SECONDS = 600


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def frames(topology: Topology, tls=None) -> tuple[int, int]:
    """Every broker's frames in and out, summed."""

    async def main() -> tuple[int, int]:
        total = [0, 0]
        limit = trio.CapacityLimiter(64)

        async def one(spec) -> None:
            async with limit:
                try:
                    s = await broker_stats(
                        spec.host, spec.port, topology=topology, timeout=10, tls=tls
                    )
                except OperationError:
                    return
                total[0] += s.frames_in
                total[1] += s.frames_out

        async with trio.open_nursery() as nursery:
            for spec in topology.brokers.values():
                nursery.start_soon(one, spec)
        return total[0], total[1]

    return trio.run(main)


def phase(
    up_pid: int,
    topology: Topology,
    path: Path,
    seconds: float,
    interval: float,
    kind: str,
    auth: tuple = ("--insecure",),
    tls=None,
):
    """One phase of ``kind`` (unwatched, watched, polled); its figures."""
    f0 = frames(topology, tls)
    monitor = None
    if kind != "unwatched":
        how = ["--poll"] if kind == "polled" else []
        monitor = subprocess.Popen(
            [*GES, "monitor", str(path), "--plain", "--interval", str(interval), *auth] + how,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    c0, t0 = cpu_seconds(up_pid), time.monotonic()
    m0 = cpu_seconds(monitor.pid) if monitor else 0.0
    time.sleep(seconds)
    c1, t1 = cpu_seconds(up_pid), time.monotonic()
    m1 = cpu_seconds(monitor.pid) if monitor else 0.0
    if monitor is not None:
        monitor.send_signal(signal.SIGINT)
        monitor.wait(timeout=30)
    f1 = frames(topology, tls)
    wall = t1 - t0
    # the frames of the two readings around the phase are the same in both kinds of phase
    return {
        "seconds": round(wall, 1),
        "brokers_cpu_percent": round(100 * (c1 - c0) / wall, 1),
        "monitor_cpu_percent": round(100 * (m1 - m0) / wall, 1) if monitor else None,
        "frames_in_per_s": round((f1[0] - f0[0]) / wall, 1),
        "frames_out_per_s": round((f1[1] - f0[1]) / wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 brokers, 10 s phases")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--topology", type=Path, default=None, help="topology file")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per phase")
    parser.add_argument("--interval", type=float, default=1.0, help="the monitor's interval")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the three phases")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="run the network secure (TLS, the default of ges up) instead of --insecure",
    )
    args = parser.parse_args()
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    rounds = args.rounds or (1 if args.quick else 2)
    console = Console(stderr=args.json)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"ges-bench-monitor-{os.getpid()}"
    work.mkdir(parents=True)
    if args.topology is not None:
        data = yaml.safe_load(args.topology.read_text())
    elif args.quick:
        data = generate(levels=3, members=(2, 4, 4, 4), seed=0).to_dict()
    else:
        data = yaml.safe_load((ROOT / "topologies" / "generated-512.yaml").read_text())
    path = work / "network.yaml"
    path.write_text(yaml.safe_dump(on_free_ports(data)))
    topology = Topology.from_yaml(path)
    n = len(topology.brokers)
    certs = work / "run" / "certs"
    up_auth = () if args.tls else ("--insecure",)
    auth = ("--certs", str(certs)) if args.tls else ("--insecure",)
    console.print(f"starting ges up on {n} brokers (embedded{', TLS' if args.tls else ''}) …")
    up = subprocess.Popen(
        [*GES, "up", str(path), "--no-live", *up_auth, "--data-dir", str(work / "run")]
        + ["--ready-timeout", str(READY_SECONDS)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    phases: dict[str, list] = {kind: [] for kind in KINDS}
    try:
        line = up.stdout.readline()
        if not line.startswith("ready:"):
            console.print(f"ges up did not become ready: {line!r}")
            return 1
        time.sleep(5)  # let the start-up's traffic settle
        for r in range(rounds):
            for kind in KINDS:
                console.print(f"round {r + 1}: {kind} for {seconds:g} s …")
                tls = client_auth(CertDir(certs)).tls if args.tls else None
                phases[kind].append(
                    phase(up.pid, topology, path, seconds, args.interval, kind, auth, tls)
                )
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()

    def median(kind: str, key: str) -> float:
        values = sorted(p[key] for p in phases[kind])
        return values[len(values) // 2]

    rows = ("brokers_cpu_percent", "frames_in_per_s", "frames_out_per_s")
    report = {
        "brokers": n,
        "seconds_per_phase": seconds,
        "rounds": rounds,
        "interval": args.interval,
        "phases": phases,
        "median": {k: {r: median(k, r) for r in rows} for k in phases},
        "monitor_cpu_percent": {k: median(k, "monitor_cpu_percent") for k in KINDS[1:]},
    }
    report["ratio"] = {
        k: {
            r: round(median(k, r) / median("unwatched", r), 2) if median("unwatched", r) else None
            for r in rows
        }
        for k in KINDS[1:]
    }
    report["tls"] = args.tls
    table = Table(
        title=f"ges monitor on {n} brokers (embedded{', TLS' if args.tls else ''}), "
        f"interval {args.interval:g} s, "
        f"median of {rounds} × {seconds:g} s"
    )
    columns = ("measure", "unwatched", "watched", "polled", "watched ÷ un", "polled ÷ un")
    for col in columns:
        table.add_column(col, justify="left" if col == "measure" else "right")
    labels = {
        "brokers_cpu_percent": "brokers' CPU, % of a core",
        "frames_in_per_s": "frames in per s (all brokers)",
        "frames_out_per_s": "frames out per s (all brokers)",
    }
    for r in rows:
        ratios = [report["ratio"][k][r] for k in KINDS[1:]]
        table.add_row(
            labels[r],
            *(f"{median(k, r):,.1f}" for k in KINDS),
            *(f"{x:.2f}×" if x is not None else "—" for x in ratios),
        )
    table.add_row(
        "the monitor's own CPU, % of a core",
        "—",
        *(f"{report['monitor_cpu_percent'][k]:,.1f}" for k in KINDS[1:]),
    )
    console.print(table)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
