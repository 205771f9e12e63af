"""Helpers of bench/reliable.py: a whole network under ``ges up --processes`` with a delivery
variant's flags (``--insecure``, or over TLS with ``--certs``), latency figures, and the 22 → 10
runs on seed 004's network.

Not a benchmark itself; ``bench/reliable.py`` drives it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import trio
import yaml
from throughput import (
    GES,
    PAPER_PUBLISHER,
    PAPER_SUBSCRIBER,
    PAPER_TOPOLOGY,
    UP_READY_TIMEOUT,
    Child,
    Children,
    CpuWindow,
    Server,
    Subscribers,
    ges_publish_fast,
    ges_publish_paced,
    log,
    make_certs,
    percentile,
    throughput_figures,
)

from ges.runtime.ports import on_free_ports
from ges.topology import Topology


class Network:
    """``ges up TOPOLOGY --processes --no-live`` on free ports, with a delivery variant's flags.

    Every start gets a fresh data directory, so a reliable run's pubend log starts empty. With
    ``tls`` every broker runs TLS (``--certs``: the network's certificates, made once per
    network name in the bench's temp directory, see ``throughput.make_certs``), links as well
    as clients, and the bench's clients present ``clients/admin``; else ``--insecure``.
    """

    def __init__(
        self,
        kids: Children,
        data: dict,
        label: str,
        flags: tuple[str, ...],
        *,
        tls: bool = False,
    ) -> None:
        self.label = label
        path = kids.tmp / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(on_free_ports(data)))
        self.path = path
        self.topology = Topology.from_yaml(path)
        self.certs: Path | None = make_certs(kids, self.topology) if tls else None
        security = ["--certs", self.certs] if self.certs else ["--insecure"]
        data_dir = _fresh(kids.tmp / f"data-{data['name']}")
        self.child: Child = kids.spawn(
            f"ges up {label}",
            [*GES, "up", path, "--no-live", "--processes", "--data-dir", data_dir]
            + [
                "--log-level",
                "warning",
                "--ready-timeout",
                str(UP_READY_TIMEOUT),
                *security,
                *flags,
            ],
        )
        self.child.wait_line(
            lambda line: line.startswith("ready:"), UP_READY_TIMEOUT + 10, "ready line"
        )
        run = json.loads((data_dir / "run.json").read_text())
        self.pids = [b["pid"] for b in run["brokers"]]
        self.broker_pid = {b["id"]: b["pid"] for b in run["brokers"]}

    def server(self, publisher: str, subscriber: str) -> Server:
        """The shape ``throughput.py``'s publishers and subscriber process take."""
        brokers = self.topology.brokers
        return Server(
            [self.child],
            brokers[publisher].port,
            brokers[subscriber].port,
            self.topology.name,
            pids=self.pids,
            certs=self.certs,
        )

    def alive(self) -> list[str]:
        """Problems: brokers that are gone (the supervisor restarts a crashed one, with a new pid)."""
        if self.child.proc.poll() is not None:
            return [f"{self.label}: ges up exited with code {self.child.proc.returncode}"]
        return [
            f"{self.label}: broker {b} (pid {pid}) is no longer running"
            for b, pid in self.broker_pid.items()
            if not Path(f"/proc/{pid}").exists()
        ]


_starts = 0


def _fresh(base: Path) -> Path:
    global _starts
    _starts += 1
    return base.with_name(f"{base.name}-{_starts}")


def latency_summary(samples_ns: list[int]) -> dict:
    """p50, p99, mean, min, max in µs of latencies in ns (in arrival order), and the p50 of the
    first and last tenth (a queue that keeps growing shows as a later p50 above an earlier)."""
    if not samples_ns:
        return {"samples": 0}
    s = sorted(samples_ns)
    tenth = max(1, len(samples_ns) // 10)
    return {
        "samples": len(s),
        "p50_us": round(percentile(s, 50) / 1e3, 1),
        "p99_us": round(percentile(s, 99) / 1e3, 1),
        "mean_us": round(sum(s) / len(s) / 1e3, 1),
        "min_us": round(s[0] / 1e3, 1),
        "max_us": round(s[-1] / 1e3, 1),
        "p50_first_10pct_us": round(percentile(sorted(samples_ns[:tenth]), 50) / 1e3, 1),
        "p50_last_10pct_us": round(percentile(sorted(samples_ns[-tenth:]), 50) / 1e3, 1),
    }


# -- 22 → 10 on ges-paper.yaml ---------------------------------------------------------------


def paper_data() -> dict:
    return yaml.safe_load(PAPER_TOPOLOGY.read_text())


def run_paper_path(
    kids: Children, variant: str, flags: tuple[str, ...], plan: dict, *, tls: bool = False
) -> dict:
    """One network start of ``variant`` (over TLS with ``tls``, else ``--insecure``): a latency
    run, then a throughput run, 22 → 10.

    Latency: single events (one per Publish) at ``plan["path_rate"]`` per second, published
    from this process with ``published_at = time.time_ns()``; the subscriber process
    (``bench/_subscriber.py``, subscribed to everything at 10) takes ``received_at`` on the same
    host clock. Throughput: 100-byte events as fast as ``publish_nowait`` batches of 256 go,
    counted at the subscriber from its first to its last receive.
    """
    label = f"22→10 {variant}"
    log(f"{label}: starting ges up --processes on ges-paper.yaml …")
    net = Network(kids, paper_data(), label, flags, tls=tls)
    server = net.server(PAPER_PUBLISHER, PAPER_SUBSCRIBER)
    out: dict = {"variant": variant, "errors": []}
    subs = None
    try:
        rate, count = plan["path_rate"], plan["path_latency_events"]
        skip = int(rate * plan["path_warmup_seconds"])
        subs = Subscribers(kids, "ges", server, clients=1, expect=count, latency=True)
        cpu = CpuWindow(server.cpu_roles())
        elapsed = trio.run(ges_publish_paced, server, rate, count)
        result = subs.result(timeout=60.0)
        cpu_lat = cpu.finish({"subscriber": result.get("cpu_seconds")})
        kids.stop(subs.child)
        subs = None
        client = result["clients"][0]
        out["latency"] = {
            "published": count,
            "delivered": client["count"],
            "lost": count - client["count"],
            "rate_per_s": round((count - 1) / elapsed, 1) if elapsed > 0 else None,
            "warmup_events_dropped": skip,
            "samples_ns": client["latencies_ns"][skip:],
            "hops": client.get("hops", {}),
            "cpu_percent": cpu_lat,
        }
        if client["error"]:
            out["errors"].append(f"{label} latency: {client['error']}")
        n = plan["path_throughput_events"]
        subs = Subscribers(kids, "ges", server, clients=1, expect=n, latency=False)
        cpu = CpuWindow(server.cpu_roles())
        pub_seconds = trio.run(ges_publish_fast, server, n, 256)
        result = subs.result(timeout=max(60.0, n / 2_000))
        cpu_tput = cpu.finish({"subscriber": result.get("cpu_seconds")})
        tput = throughput_figures(result, n)
        tput["publish_events_per_s"] = round(n / pub_seconds, 1)
        tput["cpu_percent"] = cpu_tput
        out["throughput"] = tput
        out["errors"] += [f"{label} throughput: {e}" for e in tput["errors"]]
        out["errors"] += net.alive()
    finally:
        if subs is not None:
            kids.stop(subs.child)
        kids.stop(net.child)
    lat = latency_summary(out["latency"]["samples_ns"])
    log(
        f"{label}: p50 {lat.get('p50_us', math.nan):,.0f} µs, p99 {lat.get('p99_us', math.nan):,.0f}"
        f" µs at {out['latency']['rate_per_s']}/s, lost {out['latency']['lost']};"
        f" {out['throughput'].get('deliveries_per_s', 0):,.0f} events/s, lost"
        f" {out['throughput']['lost']}"
    )
    return out
