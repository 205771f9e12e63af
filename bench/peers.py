"""GES beside mosquitto and nats-server: one load generator, three protocols, one table.

    python bench/peers.py [--quick] [--json]
                          [--only ges,ges-mqtt,mosquitto,nats,relay-py,relay-trio]
                          [--scenarios ...] [--window W] [--batch B] [--no-ges-window]
                          [--repeats N]

The same publisher and subscriber processes (``bench/_peers_load.py``; codecs in
``_peers_proto.py``) speak GES to ``ges broker``, MQTT 3.1.1 to mosquitto and NATS to
nats-server, each broker started here as its own process on free ports with its
configuration in a temp directory. A fourth column, ``ges-mqtt`` ("GES (MQTT)"), is GES again
served through its MQTT port: ``ges broker`` started as for the ``ges`` column, with
``--mqtt-port`` on a free port, and measured with the very MQTT clients (QoS, window, session
flags) that measure mosquitto, so that it differs from the mosquitto column only in the
broker. Every event is one publish frame (the way MQTT and NATS clients send one message per
frame) with a 100-byte payload; the publisher encodes all frames
first and writes them back to back, many frames per socket write — a GES publisher keeping
at most ``--window`` (1,000) Publish frames unacknowledged, as its client library does with
its window (GES acknowledges every publish; MQTT QoS 0 and core NATS acknowledge nothing). The
rows (scenario keys of ``--scenarios`` and the JSON):

1. ``1to1``: events/s, one publisher → broker → one subscriber, counted at the subscriber from
   its first to its last receive;
2. ``1to100``: aggregate deliveries/s to 100 subscribing connections in one subscriber process;
3. ``latency_1``: one broker, single events paced at 1,000/s, each stamped with
   ``time.monotonic_ns()`` in its payload: p50/p99 of receive time − stamp at the subscriber;
4. ``latency_2``: the same through two brokers and the link between them (GES and GES (MQTT):
   two brokers of one topology, the MQTT clients at each one's MQTT port; mosquitto: a second
   mosquitto bridging ``#`` both ways to the first; nats-server: a leaf node of the first),
   publisher at one, subscriber at the other;
5. ``reliable``: events/s 1 → 1 with acknowledged, stored publishing — GES reliable delivery
   (the SQLite pubend log), MQTT QoS 1 both ways with ``persistence true`` (mosquitto) or
   ``--delivery reliable`` and its SQLite pubend log (GES (MQTT): a PUBACK once the event is
   in that log), JetStream with a file-store stream and a push consumer — at most ``--window``
   publishes unacknowledged;
6. broker CPU µs per event during ``1to1`` (utime + stime of the broker process from
   /proc/<pid>/stat, before and after, ÷ events).

The floor, in a second table: ``relay-py`` and ``relay-trio`` ("Python relay", "trio relay")
are ``_mqtt_relay.py``, an MQTT relay doing no broker work (CONNACK, SUBACK, PINGRESP, every
PUBLISH copied unchanged to every subscriber), on a ``selectors`` loop and on trio, measured by
the same MQTT clients in the QoS 0 rows. In the latency rows they show what a broker in Python
(on trio, as GES's runtime) costs before it does any work: ratios relay/mosquitto and
GES (MQTT)/trio relay.

GES's own batched figures (``--batch`` events per Publish frame) are in separate rows
(``1to1_batched``, ``reliable_batched``), never in the per-event ones; GES (MQTT) has none (an
MQTT PUBLISH carries one message). mosquitto is the baseline: every figure is shown with
GES/mosquitto, GES/nats-server and GES (MQTT)/mosquitto from the same run (the JSON also has
ges-mqtt/nats and ges-mqtt/ges, the cost of the MQTT port over GES's own). The full run repeats
every scenario three times, the brokers taking turns within each scenario (interleaved, the
order rotating), and shows the median; ``--quick`` runs each once with fewer events. A broker
that is not installed is reported as skipped and the rest are measured.

GES (MQTT) against mosquitto is like for like (clients, QoS, windows, process layout) but for
the brokers: the GES broker holds at most ``ges.mqtt.session.MAX_INFLIGHT`` (256) QoS 1
deliveries unacknowledged per client, where mosquitto is given ``max_inflight_messages`` =
``--window``; the reliable row's subscriber asks both for a persistent session (clean session
0), which mosquitto keeps in memory and GES as a durable session
``mqtt.<client id>``, whose replicator commits each delivery to its SQLite session store
before streaming it (from the store's memory of what it appended last, while the subscriber
keeps up) and deletes it once acknowledged — more stored than the ``ges`` column's reliable
row, whose subscriber has no durable session; every PUBLISH becomes a GES event (``@topic``, ``@qos``)
matched against content-based profiles (the filter ``bench`` as an ``@topic`` constraint) and
goes through the broker's publish and delivery paths as a GES client's does, its answers turned
back into MQTT packets. Against the ``ges`` column: the events carry ``@topic`` and ``@qos``
instead of ``n``, the subscription is that ``@topic`` filter instead of match-all, and at QoS 0
the broker sends the publisher no PubAcks and the publisher keeps no window (the ``ges``
publisher keeps ``--window``).

Exit code 0 when every run delivered every event, 1 when a run failed (lost events, an error,
a timeout), 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _peers_proto as proto
import yaml
from rich.console import Console
from rich.table import Table
from throughput import (
    BENCH,
    ROOT,
    STARTUP_TIMEOUT,
    BenchError,
    Child,
    Children,
    CpuWindow,
    _fmt,
    console,
    cpu_seconds,
    finish,
    latency_figures,
    log,
    throughput_figures,
    wait_listening,
)

from ges.mqtt.session import MAX_INFLIGHT as MQTT_MAX_INFLIGHT
from ges.runtime.ports import free_ports

LOAD = BENCH / "_peers_load.py"
GES = [sys.executable, "-m", "cli.main"]
BROKERS = ("ges", "ges-mqtt", "mosquitto", "nats")
#: the floor: the least a broker in Python does per message, MQTT relays with no broker work
#: (``_mqtt_relay.py``) on a plain ``selectors`` loop and on trio; QoS 0 rows only
FLOORS = ("relay-py", "relay-trio")
FLOOR_SCENARIOS = ("1to1", "1to100", "latency_1", "latency_2")
ALL = BROKERS + FLOORS
#: GES's columns: its own protocol, and MQTT 3.1.1 at its MQTT port (``--mqtt-port``)
GES_COLUMNS = ("ges", "ges-mqtt")
PROTOCOL = {
    "ges": "ges",
    "ges-mqtt": "mqtt",
    "mosquitto": "mqtt",
    "nats": "nats",
    "relay-py": "mqtt",
    "relay-trio": "mqtt",
}
LABEL = {
    "ges": "GES",
    "ges-mqtt": "GES (MQTT)",
    "mosquitto": "mosquitto",
    "nats": "nats-server",
    "relay-py": "Python relay",
    "relay-trio": "trio relay",
}
#: the ratios of the JSON: (broker, against)
RATIOS = (
    ("ges", "mosquitto"),
    ("ges", "nats"),
    ("ges-mqtt", "mosquitto"),
    ("ges-mqtt", "nats"),
    ("ges-mqtt", "ges"),
    ("relay-py", "mosquitto"),
    ("relay-trio", "mosquitto"),
    ("ges-mqtt", "relay-trio"),
)
#: the ratio columns of the table and their headings (the last on two lines: the table's width)
SHOWN_RATIOS = {
    ("ges", "mosquitto"): "GES/mosquitto",
    ("ges", "nats"): "GES/nats",
    ("ges-mqtt", "mosquitto"): "GES (MQTT)/\nmosquitto",
}
#: the floor table's columns and ratio columns
FLOOR_COLUMNS = ("mosquitto", "ges-mqtt", "relay-py", "relay-trio")
SHOWN_FLOOR_RATIOS = {
    ("relay-py", "mosquitto"): "Python relay/\nmosquitto",
    ("relay-trio", "mosquitto"): "trio relay/\nmosquitto",
    ("ges-mqtt", "relay-trio"): "GES (MQTT)/\ntrio relay",
}
BASELINE = "mosquitto"
FANOUT = 100
LATENCY_RATE = 1_000.0
SCENARIOS = (
    "1to1",
    "1to100",
    "latency_1",
    "latency_2",
    "reliable",
    "1to1_batched",
    "reliable_batched",
)
#: scenarios only GES runs (several events per Publish frame)
GES_ONLY = ("1to1_batched", "reliable_batched")
SIZES = {
    "quick": {
        "repeats": 1,
        "events_1to1": 200_000,
        "events_1to100": 5_000,
        "events_reliable": 50_000,
        "events_batched": 200_000,
        "latency_seconds": 2.0,
        "warmup_seconds": 0.5,
    },
    "full": {
        "repeats": 3,
        "events_1to1": 1_000_000,
        "events_1to100": 20_000,
        "events_reliable": 300_000,
        # 1,000,000 batched best-effort events had the GES broker cut its subscriber as a slow
        # consumer (over 64 MiB queued) in every run; 400,000 is about 55 MB in all
        "events_batched": 400_000,
        "latency_seconds": 8.0,
        "warmup_seconds": 1.0,
    },
}
#: the window of unacknowledged Publish frames of the batched GES runs (ges.client's default)
BATCHED_WINDOW = 16
PROBE_TIMEOUT = 60.0
#: Another process using more than this (% of one core) during a run makes a warning.
BUSY_OTHER = 25.0


# -- the brokers ---------------------------------------------------------------------------------


def find_binary(name: str, given: str | None) -> str | None:
    """The broker's executable: ``given`` (a flag), else PATH, else /usr/sbin (Debian's
    mosquitto lives there, outside a non-root user's PATH)."""
    if given is not None:
        return given if os.access(given, os.X_OK) else None
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")


def version_of(broker: str, binary: str) -> str:
    cmd = [binary, "-h"] if broker == "mosquitto" else [binary, "--version"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (out.stdout + out.stderr).strip().splitlines()
    first = text[0] if text else ""
    return first.replace("mosquitto version ", "").replace("nats-server: ", "").lstrip("v")


def ges_version() -> str:
    """The commit the GES code is at, and whether ges/ has changes not committed yet."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "ges", "cli"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{' + uncommitted changes in ges/' if dirty else ''}" if head else "unknown"


class Setup:
    """Running broker process(es) of one run: where the publisher and subscriber connect."""

    def __init__(self, broker: str, children: list[Child], pub_port: int, sub_port: int, **kw):
        self.broker = broker
        self.children = children
        self.pub_port = pub_port
        self.sub_port = sub_port
        #: GES: the topology's name, which a GES client's Hello names ("" for MQTT clients)
        self.topology: str = kw.get("topology", "")
        self.pids = [c.pid for c in children]


class Brokers:
    """Starts each broker with a configuration made for the run, in a directory of its own."""

    def __init__(self, kids: Children, binaries: dict[str, str], window: int) -> None:
        self.kids = kids
        self.binaries = binaries
        self.window = window
        self._runs = 0

    def _dir(self, name: str) -> Path:
        self._runs += 1
        path = self.kids.tmp / f"{self._runs:03d}-{name}"
        path.mkdir()
        return path

    def start(self, broker: str, *, brokers: int = 1, reliable: bool = False) -> Setup:
        start = {
            "ges": self.ges,
            "ges-mqtt": self.ges_mqtt,
            "mosquitto": self.mosquitto,
            "nats": self.nats,
            "relay-py": self.relay_py,
            "relay-trio": self.relay_trio,
        }[broker]
        before = list(self.kids.children)
        try:
            return start(brokers, reliable)
        except BaseException:  # one that did start goes now, not at the end of the bench
            for child in [c for c in self.kids.children if c not in before]:
                self.kids.stop(child)
            raise

    def stop(self, setup: Setup) -> None:
        for child in reversed(setup.children):
            self.kids.stop(child)

    # GES ---------------------------------------------------------------------------------

    def ges(self, brokers: int, reliable: bool, *, mqtt: bool = False) -> Setup:
        """``ges broker --insecure`` per broker of a one- or two-broker topology (one link);
        ``--delivery reliable`` (the default, with its SQLite pubend log in the data directory)
        or ``best-effort``. ``mqtt``: each broker with ``--mqtt-port`` on a free port too, and
        the clients sent there (the GES (MQTT) column)."""
        where = self._dir("ges-mqtt" if mqtt else "ges")
        ports = free_ports(brokers * (2 if mqtt else 1))
        ports, mqtt_ports = ports[:brokers], ports[brokers:]
        ids = [f"b{i + 1}" for i in range(brokers)]
        name = f"bench-peers-{brokers}"
        data = {
            "name": name,
            "brokers": {
                b: {"unit": "bench/c1", "host": "127.0.0.1", "port": port}
                for b, port in zip(ids, ports, strict=True)
            },
            "links": [ids] if brokers == 2 else [],
        }
        path = where / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        children = []
        for b in ids:
            children.append(
                self.kids.spawn(
                    f"ges broker {b}",
                    [*GES, "broker", path, "--id", b, "--data-dir", where / f"data-{b}"]
                    + ["--log-level", "warning", "--insecure"]
                    + ["--delivery", "reliable" if reliable else "best-effort"]
                    + (["--mqtt-port", mqtt_ports[ids.index(b)]] if mqtt else []),
                    stdout_pipe=False,
                )
            )
        for child, port in zip(children, ports, strict=True):
            wait_listening(child, port)
        if mqtt:
            for child, port in zip(children, mqtt_ports, strict=True):
                wait_listening(child, port)
            return Setup("ges-mqtt", children, mqtt_ports[0], mqtt_ports[-1])
        return Setup("ges", children, ports[0], ports[-1], topology=name)

    def ges_mqtt(self, brokers: int, reliable: bool) -> Setup:
        """GES served through its MQTT port: the brokers of :meth:`ges`, each with
        ``--mqtt-port``; the publisher and subscriber are MQTT clients there."""
        return self.ges(brokers, reliable, mqtt=True)

    # mosquitto ---------------------------------------------------------------------------

    def mosquitto(self, brokers: int, reliable: bool) -> Setup:
        """mosquitto with a generated config: loopback listener, anonymous, TCP_NODELAY, no
        queue limit (``max_queued_messages 0``: nothing dropped for a slow subscriber);
        reliable: ``persistence true`` in the run's directory and ``max_inflight_messages`` =
        the window; two brokers: the second bridges ``#`` both ways to the first."""
        where = self._dir("mosquitto")
        ports = free_ports(brokers)
        children = []
        for i, port in enumerate(ports):
            lines = [
                "per_listener_settings false",
                f"listener {port} 127.0.0.1",
                "allow_anonymous true",
                "set_tcp_nodelay true",
                "max_queued_messages 0",
                f"max_inflight_messages {self.window if reliable else 0}",
                "log_dest stderr",
                "log_type error",
                "log_type warning",
            ]
            if reliable:
                store = where / f"store-{i + 1}"
                store.mkdir()
                lines += ["persistence true", f"persistence_location {store}/"]
            else:
                lines.append("persistence false")
            if i == 1:
                lines += [
                    "connection bench-bridge",
                    f"address 127.0.0.1:{ports[0]}",
                    "topic # both 0",
                    "cleansession true",
                    "notifications false",
                    "restart_timeout 1",
                ]
            conf = where / f"mosquitto-{i + 1}.conf"
            conf.write_text("\n".join(lines) + "\n")
            child = self.kids.spawn(
                f"mosquitto {i + 1}", [self.binaries["mosquitto"], "-c", conf], stdout_pipe=False
            )
            wait_listening(child, port)
            children.append(child)
        return Setup("mosquitto", children, ports[0], ports[-1])

    # the floor: MQTT relays in Python ---------------------------------------------------------

    def relay(self, brokers: int, loop: str, name: str) -> Setup:
        """``_mqtt_relay.py --loop LOOP`` per broker; two: the second subscribes to ``#`` at
        the first (``--upstream``), the publisher at the first, the subscriber at the second."""
        ports = free_ports(brokers)
        children = []
        for i, port in enumerate(ports):
            cmd = [sys.executable, BENCH / "_mqtt_relay.py", "--port", port, "--loop", loop]
            child = self.kids.spawn(
                f"{LABEL[name]} {i + 1}",
                cmd + (["--upstream", ports[0]] if i else []),
                stdout_pipe=False,
            )
            wait_listening(child, port)
            children.append(child)
        return Setup(name, children, ports[0], ports[-1])

    def relay_py(self, brokers: int, reliable: bool) -> Setup:
        return self.relay(brokers, "selectors", "relay-py")

    def relay_trio(self, brokers: int, reliable: bool) -> Setup:
        return self.relay(brokers, "trio", "relay-trio")

    # nats-server -------------------------------------------------------------------------

    def nats(self, brokers: int, reliable: bool) -> Setup:
        """nats-server with a generated config: loopback, ``max_pending`` 1 GiB per client
        (the default 64 MiB cuts a subscriber that falls that far behind); reliable:
        JetStream with its store in the run's directory and a file-store stream created
        through ``$JS.API.STREAM.CREATE``; two brokers: the second is a leaf node of the
        first."""
        where = self._dir("nats")
        ports = free_ports(2 * brokers)
        client_ports, leaf_port = ports[:brokers], ports[brokers]
        children = []
        for i, port in enumerate(client_ports):
            lines = [f"listen: 127.0.0.1:{port}", "max_pending: 1073741824"]
            if reliable:
                lines.append(f'jetstream {{ store_dir: "{where / "jetstream"}" }}')
            if brokers == 2:
                if i == 0:
                    lines.append(f'leafnodes {{ listen: "127.0.0.1:{leaf_port}" }}')
                else:
                    lines.append(
                        f'leafnodes {{ remotes: [ {{ url: "nats://127.0.0.1:{leaf_port}" }} ] }}'
                    )
            conf = where / f"nats-{i + 1}.conf"
            conf.write_text("\n".join(lines) + "\n")
            child = self.kids.spawn(
                f"nats-server {i + 1}",
                [self.binaries["nats"], "-c", conf],
                stdout_pipe=False,
            )
            wait_listening(child, port)
            children.append(child)
        if reliable:
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while True:
                try:
                    proto.create_stream("127.0.0.1", client_ports[0])
                    break
                except (OSError, proto.ProtocolFailure) as exc:
                    if time.monotonic() > deadline:
                        raise children[0].fail(f"JetStream stream not created: {exc}") from None
                    time.sleep(0.2)
        return Setup("nats", children, client_ports[0], client_ports[-1])


# -- one run ---------------------------------------------------------------------------------------


class Scenario:
    def __init__(self, key: str, sizes: dict, args) -> None:
        self.key = key
        self.latency = key.startswith("latency")
        self.brokers = 2 if key == "latency_2" else 1
        self.reliable = key.startswith("reliable")
        self.clients = FANOUT if key == "1to100" else 1
        self.batch = args.batch if key.endswith("_batched") else 1
        self.window = BATCHED_WINDOW if self.batch > 1 else args.window
        #: GES without a window of unacknowledged Publish frames (--no-ges-window)
        self.ges_window = 0 if args.no_ges_window and not self.reliable else self.window
        self.skip = 0
        if self.latency:
            self.events = int(LATENCY_RATE * (sizes["latency_seconds"] + sizes["warmup_seconds"]))
            self.skip = int(LATENCY_RATE * sizes["warmup_seconds"])
        elif self.reliable:
            self.events = sizes["events_batched" if self.batch > 1 else "events_reliable"]
        else:
            self.events = sizes[
                {"1to1": "events_1to1", "1to100": "events_1to100"}.get(key, "events_batched")
            ]


def wait_probed(sub: Child, pub: Child) -> None:
    """Until the subscriber has a probe from every connection; fails early if the publisher
    exits meanwhile (its error is in its log)."""
    deadline = time.monotonic() + PROBE_TIMEOUT
    while True:
        try:
            sub.wait_line(lambda line: line.strip() == "probed", 0.5, "probe delivered")
            return
        except BenchError:
            if sub.proc.poll() is not None:
                raise sub.fail(f"exited with code {sub.proc.returncode} while probing") from None
            if pub.proc.poll() is not None:
                raise pub.fail(f"exited with code {pub.proc.returncode} while probing") from None
            if time.monotonic() > deadline:
                raise sub.fail(f"no probe delivered within {PROBE_TIMEOUT:g}s") from None


def run_one(kids: Children, brokers: Brokers, broker: str, sc: Scenario) -> dict:
    """One measured run of one broker: a fresh broker (or two), the subscriber process, the
    publisher process; the figures, or ``{"error": ...}``."""
    what = f"{LABEL[broker]} {sc.key}"
    log(f"{what}: {sc.events:,} events, {sc.clients} subscriber(s)…")
    setup = sub = pub = None
    try:
        setup = brokers.start(broker, brokers=sc.brokers, reliable=sc.reliable)
        window = sc.ges_window if broker == "ges" else sc.window
        common = ["--proto", PROTOCOL[broker], "--window", window]
        if setup.topology:
            common += ["--topology", setup.topology]
        if sc.reliable:
            common.append("--reliable")
        sub_cmd = [sys.executable, LOAD, "sub", "--port", setup.sub_port, *common]
        sub_cmd += ["--clients", sc.clients, "--expect", sc.events]
        if sc.latency:
            sub_cmd.append("--latency")
        sub = kids.spawn(f"{broker} sub", sub_cmd)
        sub.wait_line(lambda line: line.strip() == "ready", STARTUP_TIMEOUT, "ready line")
        pub_cmd = [sys.executable, LOAD, "pub", "--port", setup.pub_port, *common]
        pub_cmd += ["--events", sc.events, "--batch", sc.batch]
        if sc.latency:
            pub_cmd += ["--rate", LATENCY_RATE]
        pub = kids.spawn(f"{broker} pub", pub_cmd, stdin_pipe=True)
        pub.wait_line(lambda line: line.strip() == "ready", STARTUP_TIMEOUT * 2, "ready line")
        wait_probed(sub, pub)
        broker_cpu0 = [cpu_seconds(pid) for pid in setup.pids]
        cpu_window = CpuWindow({"broker": setup.pids})
        pub.proc.stdin.write("go\n")
        pub.proc.stdin.flush()
        limit = 120.0 + sc.events * sc.clients / 5_000
        pres = json.loads(pub.wait_line(lambda line: line.startswith("{"), limit, "result"))
        sres = json.loads(sub.wait_line(lambda line: line.startswith("{"), limit, "result"))
        broker_cpu1 = [cpu_seconds(pid) for pid in setup.pids]
        cpu = cpu_window.finish(
            {"subscriber": sres.get("cpu_seconds"), "load publisher": pres.get("cpu_seconds")}
        )
    except BenchError as exc:
        log(f"[red]{what}: failed: {exc}[/red]")
        return {"error": str(exc)}
    finally:
        for child in (pub, sub):
            if child is not None:
                kids.stop(child)
        if setup is not None:
            brokers.stop(setup)
    cpu["driver"] = cpu.pop("publisher", None)
    cpu["publisher"] = cpu.pop("load publisher", None)
    if sc.latency:
        fig = latency_figures(sres, sc.events, sc.skip)
    else:
        fig = throughput_figures(sres, sc.events)
        if pres.get("done_seconds"):
            fig["publish_events_per_s"] = round(sc.events / pres["done_seconds"], 1)
    fig["cpu_percent"] = cpu
    if None not in broker_cpu0 + broker_cpu1:
        used = sum(broker_cpu1) - sum(broker_cpu0)
        fig["broker_cpu_seconds"] = round(used, 3)
        if fig["delivered"]:
            fig["broker_cpu_us_per_delivery"] = round(1e6 * used / fig["delivered"], 2)
    reads = sum(c.get("reads", 0) for c in sres["clients"])
    if reads:  # how many events the subscriber got per socket read: the broker's write batching
        fig["events_per_read"] = round(sum(c["count"] for c in sres["clients"]) / reads, 1)
    disorder = sum(c.get("disorder", 0) for c in sres["clients"])
    fig["disorder"] = disorder
    if disorder:
        fig["errors"] = [
            *fig["errors"],
            f"{disorder:,} events duplicated, reordered or after a gap",
        ]
    if pres.get("error"):
        fig["errors"] = [*fig["errors"], f"publisher: {pres['error']}"]
    fig["probes_sent"] = pres.get("probes")
    if fig["lost"] or fig["errors"]:
        fig["failed"] = True
    headline = (
        f"p50 {fig.get('p50_us', 0):,.0f} µs, p99 {fig.get('p99_us', 0):,.0f} µs"
        if sc.latency
        else f"{fig.get('deliveries_per_s', 0):,.0f} deliveries/s"
    )
    log(
        f"{what}: {headline}, lost {fig['lost']:,}, other CPU {_fmt(cpu.get('other'))} %"
        + (f" [red]errors: {'; '.join(fig['errors'])}[/red]" if fig["errors"] else "")
    )
    return fig


# -- figures -------------------------------------------------------------------------------------

#: the figures of each scenario taken as the median of its successful runs (and for the ratios)
FIELDS = {
    "1to1": ("deliveries_per_s", "broker_cpu_us_per_delivery"),
    "1to100": ("deliveries_per_s", "broker_cpu_us_per_delivery"),
    "latency_1": ("p50_us", "p99_us", "broker_cpu_us_per_delivery"),
    "latency_2": ("p50_us", "p99_us", "broker_cpu_us_per_delivery"),
    "reliable": ("deliveries_per_s", "broker_cpu_us_per_delivery"),
    "1to1_batched": ("deliveries_per_s", "broker_cpu_us_per_delivery"),
    "reliable_batched": ("deliveries_per_s", "broker_cpu_us_per_delivery"),
}


def summarise(key: str, runs: list[dict]) -> dict:
    good = [r for r in runs if not r.get("failed") and "error" not in r]
    out: dict = {"runs": runs, "failed_runs": len(runs) - len(good)}
    for field in FIELDS[key]:
        values = [r[field] for r in good if r.get(field) is not None]
        out[field] = round(statistics.median(values), 2) if values else None
    for role in ("broker", "subscriber", "publisher"):
        values = [r["cpu_percent"].get(role) for r in good]
        values = [v for v in values if v is not None]
        out[f"{role}_cpu_percent"] = round(statistics.median(values), 1) if values else None
    reads = [r["events_per_read"] for r in good if r.get("events_per_read") is not None]
    out["events_per_read"] = round(statistics.median(reads), 1) if reads else None
    others = [r["cpu_percent"].get("other") for r in runs if r.get("cpu_percent")]
    others = [o for o in others if o is not None]
    out["other_cpu_percent_max"] = max(others) if others else None
    return out


def ratio(a, b) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def build_report(results: dict, sizes: dict, args, versions: dict, skipped: dict, t0) -> dict:
    for key, res in results.items():
        res["ratios"] = {
            f"{one}/{other}": {f: ratio(res[one].get(f), res[other].get(f)) for f in FIELDS[key]}
            for one, other in RATIOS
            if one in res and other in res
        }
    return {
        "bench": "peers",
        "mode": "quick" if args.quick else "full",
        "baseline": BASELINE,
        "versions": versions,
        "skipped": skipped,
        "config": {
            **sizes,
            "payload_bytes": proto.PAYLOAD_BYTES,
            "events_per_frame": 1,
            "ges_batch": args.batch,
            "window": args.window,
            "ges_window": 0 if args.no_ges_window else args.window,
            "ges_batched_window": BATCHED_WINDOW,
            "ges_mqtt_max_inflight": MQTT_MAX_INFLIGHT,
            "fanout_subscribers": FANOUT,
            "latency_rate_per_s": LATENCY_RATE,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "results": results,
        "warnings": busy_warnings(results),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def busy_warnings(results: dict) -> list[str]:
    """One line naming the runs during which other processes used over BUSY_OTHER % of a core."""
    busy, total = [], 0
    for key, res in results.items():
        for broker in ALL:
            for i, run in enumerate(res.get(broker, {}).get("runs", [])):
                total += 1
                other = run.get("cpu_percent", {}).get("other")
                if other is not None and other > BUSY_OTHER:
                    busy.append((other, f"{key} {LABEL[broker]} #{i + 1}"))
    if not busy:
        return []
    worst = max(o for o, _ in busy)
    which = (
        "all"
        if len(busy) == total
        else ", ".join(name for _, name in busy[:6]) + (", …" if len(busy) > 6 else "")
    )
    return [
        f"other processes used more than {BUSY_OTHER:.0f} % of a core during {len(busy)} of"
        f" {total} runs (up to {worst:.0f} %; {which}): those figures are pessimistic"
    ]


def failures(results: dict) -> list[str]:
    out = []
    for key, res in results.items():
        for broker in ALL:
            for i, run in enumerate(res.get(broker, {}).get("runs", [])):
                where = f"{key} {LABEL[broker]} run {i + 1}"
                if "error" in run:
                    out.append(f"{where}: {run['error']}")
                    continue
                if run.get("lost"):
                    out.append(f"{where}: {run['lost']:,} events not delivered (run not counted)")
                out += [f"{where}: {e}" for e in run.get("errors", [])]
    return out


# -- the table -------------------------------------------------------------------------------------


class Rows:
    """Rows of one table: a measure per row, a column per broker of ``columns`` (the median of
    its runs), then the ratio columns ``shown`` (``{(one, other): heading}``)."""

    def __init__(self, table: Table, report: dict, columns: tuple, shown: dict) -> None:
        self.table, self.columns, self.shown = table, columns, shown
        self.res, self.cfg = report["results"], report["config"]
        self.present = [b for b in columns if b not in report["skipped"]]
        table.add_column("measure", no_wrap=True)
        for b in columns:
            table.add_column(LABEL[b], justify="right", style="bold" if b in GES_COLUMNS else None)
        for heading in shown.values():
            table.add_column(heading, justify="right")
        self.blank = [""] * len(shown)

    def cell(self, key, broker, field, unit=""):
        if broker not in self.present:
            return "skipped"
        r = self.res.get(key, {}).get(broker)
        if r is None:
            return "—"
        value = r.get(field)
        if value is None:
            return "failed" if r.get("failed_runs") else "—"
        return (
            _fmt(value, unit)
            if unit == "µs"
            else (f"{value:,.1f}" if unit == "cpu" else _fmt(value))
        )

    def ratios(self, key, field):
        rs = self.res.get(key, {}).get("ratios", {})
        out = []
        for one, other in self.shown:
            value = rs.get(f"{one}/{other}", {}).get(field)
            out.append("—" if value is None else f"{value:.2f}×")
        return out

    def row(self, label, key, field, unit="", *, end=False):
        if key not in self.res:
            return
        self.table.add_row(
            label,
            *[self.cell(key, b, field, unit) for b in self.columns],
            *self.ratios(key, field),
            end_section=end,
        )

    def spread(self, label, key, field, unit=""):
        if key not in self.res or self.cfg["repeats"] < 2:
            return
        cells = []
        for b in self.columns:
            runs = self.res[key].get(b, {}).get("runs", [])
            cells.append(
                " ".join(
                    "✗" if r.get("failed") or "error" in r else _short(r.get(field), unit)
                    for r in runs
                )
                or ("skipped" if b not in self.present else "—")
            )
        self.table.add_row(f"[dim]{label}[/dim]", *cells, *self.blank, style="dim")

    def other(self, key, *, end=True):
        """CPU (% of a core, medians): broker(s) · subscriber process (max of other
        processes); for throughput, events per subscriber socket read."""
        if key not in self.res:
            return
        cells, reads = [], []
        for b in self.columns:
            r = self.res[key].get(b)
            if r is None:
                cells.append("")
                reads.append("")
                continue
            cells.append(
                f"{_fmt(r.get('broker_cpu_percent'))}·{_fmt(r.get('subscriber_cpu_percent'))}"
                f" ({_fmt(r.get('other_cpu_percent_max'))})"
            )
            reads.append(_fmt(r.get("events_per_read")))
        label = "  CPU %: broker·subscriber (other)"
        if not key.startswith("latency"):
            self.table.add_row(
                "[dim]  events per subscriber read[/dim]", *reads, *self.blank, style="dim"
            )
        self.table.add_row(f"[dim]{label}[/dim]", *cells, *self.blank, style="dim", end_section=end)

    def shared(self) -> None:
        """The rows both tables have: the QoS 0 scenarios."""
        self.row("1→1 events/s (one event per frame)", "1to1", "deliveries_per_s")
        self.spread("  runs", "1to1", "deliveries_per_s")
        self.other("1to1")
        label = f"1→{FANOUT} deliveries/s ({FANOUT} subscriber connections)"
        self.row(label, "1to100", "deliveries_per_s")
        self.spread("  runs", "1to100", "deliveries_per_s")
        self.other("1to100")
        self.row("latency, one broker, p50", "latency_1", "p50_us", "µs")
        self.row("latency, one broker, p99", "latency_1", "p99_us", "µs")
        self.spread("  runs p50", "latency_1", "p50_us", "µs")
        self.other("latency_1")
        self.row("latency, two brokers (one link), p50", "latency_2", "p50_us", "µs")
        self.row("latency, two brokers (one link), p99", "latency_2", "p99_us", "µs")
        self.spread("  runs p50", "latency_2", "p50_us", "µs")
        self.other("latency_2")


def render(report: dict, out: Console) -> None:
    cfg, versions = report["config"], report["versions"]
    table = Table(
        title=f"GES beside mosquitto and nats-server ({report['mode']} run, "
        f"{report['seconds']:.0f} s, median of {cfg['repeats']})",
        caption=(
            f"One event per publish frame, {cfg['payload_bytes']}-byte payloads, frames written"
            " back to back; publisher, broker(s) and subscriber in separate processes.\n"
            f"Versions: GES {versions.get('ges')}, mosquitto {versions.get('mosquitto', '—')},"
            f" nats-server {versions.get('nats', '—')}. Ratios GES/other: > 1 means GES is"
            " higher (better for rates, worse for latency and CPU).\n"
            "GES (MQTT): the same ges broker through its --mqtt-port, measured with the MQTT"
            " clients that measure mosquitto (QoS 0; QoS 1 both ways in the reliable row);"
            f" it sends at most {cfg['ges_mqtt_max_inflight']} QoS 1 deliveries unacknowledged.\n"
            f"GES publishers keep at most {cfg['ges_window'] or 'unlimited'} Publish frames"
            f" unacknowledged (batched rows: {cfg['ges_batched_window']}); MQTT QoS 1 and"
            f" JetStream publishers {cfg['window']}; QoS 0 and core NATS have no acknowledgement."
            "\nreliable: GES reliable delivery (GES (MQTT): QoS 1 to its pubend log), MQTT QoS 1"
            " + persistence, JetStream file store.\nCPU %: medians of the runs, % of"
            " one core (2 cores here); (other) = processes outside the run, the most in any run."
            " A subscriber near 100 % bounds that figure: it is the load generator's limit."
            + "".join(
                f"\n{LABEL[b]}: {why}, skipped."
                for b, why in report["skipped"].items()
                if b in BROKERS
            )
        ),
        caption_justify="left",
    )
    rows = Rows(table, report, BROKERS, SHOWN_RATIOS)
    rows.shared()
    rows.row("reliable 1→1 events/s (stored, acknowledged)", "reliable", "deliveries_per_s")
    rows.spread("  runs", "reliable", "deliveries_per_s")
    rows.other("reliable")
    label = "broker CPU µs per event (1→1 run)"
    rows.row(label, "1to1", "broker_cpu_us_per_delivery", "cpu", end=True)
    b = cfg["ges_batch"]
    rows.row(
        f"GES batched: 1→1 events/s, {b} events per Publish", "1to1_batched", "deliveries_per_s"
    )
    rows.spread("  runs", "1to1_batched", "deliveries_per_s")
    rows.other("1to1_batched")
    rows.row(
        f"GES batched: reliable 1→1 events/s, {b} per Publish",
        "reliable_batched",
        "deliveries_per_s",
    )
    rows.spread("  runs", "reliable_batched", "deliveries_per_s")
    rows.other("reliable_batched")
    out.print(table)
    if any(f not in report["skipped"] for f in FLOORS):
        floor = Table(
            title="The floor: MQTT relays in Python that do no broker work (same run)",
            caption=(
                "Python relay and trio relay: bench/_mqtt_relay.py on a selectors loop and on"
                " trio — CONNACK, SUBACK, PINGRESP, and every PUBLISH read copied unchanged to"
                " every subscriber: no matching, sessions, QoS, bounds or logging. Two brokers:"
                " the second subscribes to # at the first.\nWhat a relay spends above mosquitto"
                " is the interpreter's and the loop's, not a broker's; what GES (MQTT) spends"
                " above the trio relay is GES's own work."
            ),
            caption_justify="left",
        )
        floor_rows = Rows(floor, report, FLOOR_COLUMNS, SHOWN_FLOOR_RATIOS)
        floor_rows.shared()
        label = "broker CPU µs per event (1→1 run)"
        floor_rows.row(label, "1to1", "broker_cpu_us_per_delivery", "cpu")
        floor_rows.row(
            "broker CPU µs per event (latency, one broker)",
            "latency_1",
            "broker_cpu_us_per_delivery",
            "cpu",
            end=True,
        )
        out.print(floor)
    for warning in report["warnings"]:
        out.print(f"[yellow]warning:[/yellow] {warning}", soft_wrap=True)


def _short(value, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "µs":
        return f"{value:,.0f}"
    return f"{value / 1e3:,.0f}k"


# -- main ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description="GES beside mosquitto and nats-server.")
    parser.add_argument(
        "--quick", action="store_true", help="one run each, fewer events (~1.5 min)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--only", default=",".join(ALL), help=f"brokers, of {','.join(ALL)} [all]")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"of {','.join(SCENARIOS)} [all]"
    )
    parser.add_argument(
        "--window", type=int, default=1000, help="publish frames unacknowledged at most [1000]"
    )
    parser.add_argument(
        "--no-ges-window",
        action="store_true",
        help="GES publishes back to back in the best-effort rows, PubAcks read but not waited for",
    )
    parser.add_argument("--batch", type=int, default=256, help="GES batched rows: events/Publish")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each [quick 1, full 3]")
    parser.add_argument("--mosquitto-bin", default=None, help="mosquitto executable [PATH]")
    parser.add_argument("--nats-bin", default=None, help="nats-server executable [PATH]")
    args = parser.parse_args()
    only = [b.strip() for b in args.only.split(",") if b.strip()]
    keys = [k.strip() for k in args.scenarios.split(",") if k.strip()]
    if not only or set(only) - set(ALL):
        parser.error(f"--only: brokers are {', '.join(ALL)}")
    if not keys or set(keys) - set(SCENARIOS):
        parser.error(f"--scenarios: of {', '.join(SCENARIOS)}")
    if args.window < 1 or args.batch < 1 or (args.repeats is not None and args.repeats < 1):
        parser.error("--window, --batch and --repeats must be at least 1")
    sizes = dict(SIZES["quick" if args.quick else "full"])
    if args.repeats is not None:
        sizes["repeats"] = args.repeats
    t0 = time.perf_counter()

    binaries: dict[str, str] = {}
    versions = {"ges": ges_version()}
    skipped: dict[str, str] = {}
    for broker, name, given in (
        ("mosquitto", "mosquitto", args.mosquitto_bin),
        ("nats", "nats-server", args.nats_bin),
    ):
        if broker not in only:
            skipped[broker] = "not selected (--only)"
            continue
        binary = find_binary(name, given)
        if binary is None:
            skipped[broker] = "not installed"
            console.print(f"[yellow]{name}: not installed, skipped[/yellow]")
            continue
        binaries[broker] = binary
        versions[broker] = version_of(broker, binary)
    for broker in GES_COLUMNS + FLOORS:
        if broker not in only:
            skipped[broker] = "not selected (--only)"
    present = [b for b in ALL if b not in skipped]
    log(
        "brokers: "
        + ", ".join(f"{LABEL[b]} {versions.get(b, '')}".strip() for b in present)
        + (
            f"; skipped: {', '.join(f'{LABEL[b]} ({w})' for b, w in skipped.items())}"
            if skipped
            else ""
        )
    )

    tmp = Path(tempfile.mkdtemp(prefix="ges-bench-peers-"))
    kids = Children(tmp)
    brokers = Brokers(kids, binaries, args.window)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: dict[str, dict[str, list]] = {}
    try:
        for r in range(sizes["repeats"]):
            for key in [k for k in SCENARIOS if k in keys]:
                sc = Scenario(key, sizes, args)
                order = [
                    b
                    for b in present
                    if (b == "ges" or key not in GES_ONLY)
                    and (b not in FLOORS or key in FLOOR_SCENARIOS)
                ]
                if not order:
                    continue
                shift = r % len(order)  # a different broker first in each repeat
                for broker in order[shift:] + order[:shift]:
                    runs.setdefault(key, {}).setdefault(broker, []).append(
                        run_one(kids, brokers, broker, sc)
                    )
    except KeyboardInterrupt:
        return 130
    finally:
        kids.stop_all()
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp, ignore_errors=True)
    results = {
        key: {broker: summarise(key, rs) for broker, rs in by_broker.items()}
        for key, by_broker in runs.items()
    }
    report = build_report(results, sizes, args, versions, skipped, t0)
    return finish(report, failures(results), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
