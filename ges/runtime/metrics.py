"""Prometheus metrics of the brokers running in this process, served over HTTP by trio.

``ges broker --metrics-port P`` and ``ges up --metrics-port P`` (or ``metrics_port:`` of a
broker in the topology) serve ``GET /metrics`` in Prometheus's text format: the counters and
gauges of ``ges monitor``'s view, labelled by ``broker`` and ``unit``, and the busy stretches
of the process's event loop (ges.runtime.loopclock). Each scrape reads every broker's figures
on the event loop's thread, a broker at a time (:class:`Snapshot`: nothing changes them during
one read); the ``prometheus-client`` library makes the text from them (:class:`BrokerCollector`
is one of its collectors) in a worker thread, so a scrape of the many brokers of one ``ges
up`` does not hold the loop for the whole text. The HTTP side is a few lines of trio with bounds in bytes and time, as every other
listener of a broker has: a request head of at most :data:`MAX_REQUEST_BYTES` within
:data:`REQUEST_SECONDS`, one request per connection, at most :data:`MAX_SCRAPERS` at once.
"""

from __future__ import annotations

import logging

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ges.errors import OperationError
from ges.topology import unit_name
from ges.transport.connection import linger

log = logging.getLogger("ges.runtime")

#: Bytes of a request head read at most (a scrape's is a few hundred).
MAX_REQUEST_BYTES = 8 * 1024
#: Seconds a scraper has to send its request head, and to take the answer.
REQUEST_SECONDS = 5.0
#: Scrapes answered at once; more connections wait in the kernel's backlog.
MAX_SCRAPERS = 8

#: (name, help, Stats field) of the counters: totals since the broker started.
COUNTERS = (
    (
        "events_in",
        "Events received, from this broker's clients and from other brokers.",
        "events_in",
    ),
    ("events_out", "Events sent on to other brokers.", "events_out"),
    ("frames_in", "Frames received from clients and links.", "frames_in"),
    ("frames_out", "Frames sent to clients and links.", "frames_out"),
    ("published", "Events this broker's pubend published.", "published"),
    ("delivered", "Events delivered to this broker's clients.", "delivered"),
    ("duplicates", "Events received twice and dropped.", "duplicates"),
    ("event_frames", "Events frames sent to other brokers.", "event_frames"),
    ("slow_consumers", "Clients disconnected as slow consumers.", "slow_consumers"),
    (
        "clients_refused",
        "Connections refused (at the cap, another network, bad handshake).",
        "clients_refused",
    ),
    ("requests_refused", "Client requests refused for want of permission.", "requests_refused"),
    ("forged", "Frames from peers dropped as not from their pubend's broker.", "forged"),
    (
        "log_released",
        "Pubend log ticks released (every other broker acknowledged them).",
        "log_released",
    ),
    ("nacks_sent", "Nacks sent for events missed (reliable delivery's repair).", "nacks_sent"),
    ("nacks_answered", "Nacks answered from this broker's log or cache.", "nacks_answered"),
    ("recovered", "Events recovered by nacks.", "recovered"),
    ("lost", "Ticks reported lost (no log held them any more).", "lost"),
)
#: (name, help, Stats field) of the gauges read from the broker's Stats.
GAUGES = (
    ("clients", "Clients connected.", "clients"),
    ("subscriptions", "Subscriptions of this broker's clients.", "subscriptions"),
    ("links_expected", "Links this broker has in the topology.", "links_expected"),
    ("profile_entries", "Profile entries held for the units this broker keeps.", "profile_entries"),
    ("log_held", "Events this broker's pubend log holds.", "log_held"),
    (
        "log_earlier_epochs",
        "Earlier epochs of this broker's pubend its log holds, not released to their end.",
        "log_epochs",
    ),
    ("sessions", "Durable sessions this broker's replicator holds.", "sessions"),
    (
        "session_events",
        "Events the replicator holds for its sessions (once per session waiting for one).",
        "session_events",
    ),
    ("session_epoch", "The last epoch the replicator's store numbered.", "session_epoch"),
)


class Snapshot:
    """What one broker's families are made of, read on the event loop's thread at once."""

    __slots__ = ("at", "stats", "neighbours", "uncommitted", "incarnation", "loop")

    def __init__(self, server) -> None:
        self.at = [server.id, unit_name(server.spec.unit)]
        self.stats = server.stats()
        self.neighbours = list(server.core.neighbours)
        log = server.pubend_log
        self.uncommitted = None if log is None else log.uncommitted
        self.incarnation = server.core.incarnation
        clock = server.loop_clock
        self.loop = None if clock is None else (clock.longest(), clock.busy, list(clock.buckets()))


class Metrics:
    """What one metrics port serves: the families of some brokers (``BrokerServer``s) of one
    process. Each broker's figures are read on the event loop a broker at a time, and the text
    is made from them in a worker thread, so a scrape of many brokers holds the loop for one
    broker's read at most."""

    def __init__(self, servers) -> None:
        self.servers = list(servers)

    async def text(self) -> bytes:
        snapshots = []
        for i, server in enumerate(self.servers):
            if i:
                await trio.lowlevel.checkpoint()
            snapshots.append(Snapshot(server))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(snapshots))
        return await trio.to_thread.run_sync(generate_latest, registry)


class BrokerCollector(Collector):
    """The metric families of some brokers, from their :class:`Snapshot`s."""

    def __init__(self, snapshots: list[Snapshot]) -> None:
        self.snapshots = snapshots

    def collect(self):
        labels = ["broker", "unit"]
        counters = {
            name: CounterMetricFamily(f"ges_{name}", text, labels=labels)
            for name, text, _ in COUNTERS
        }
        gauges = {
            name: GaugeMetricFamily(f"ges_{name}", text, labels=labels) for name, text, _ in GAUGES
        }
        links_up = GaugeMetricFamily(
            "ges_link_up",
            "1 if the link to the peer is up, 0 if not (cut: cut by an operator).",
            labels=[*labels, "peer", "cut"],
        )
        queued = GaugeMetricFamily(
            "ges_queued_bytes",
            "Bytes queued towards this broker's clients and links, not yet written.",
            labels=[*labels, "to"],
        )
        log_bytes = GaugeMetricFamily(
            "ges_log_bytes",
            "The pubend log: bytes waiting for their commit, and its files' size on disk.",
            labels=[*labels, "what"],
        )
        started = GaugeMetricFamily(
            "ges_start_time_seconds",
            "When this incarnation of the broker started (Unix time).",
            labels=labels,
        )
        # the event loop's (ges.runtime.loopclock): the process's, the same for each of its
        # brokers
        loop_longest = GaugeMetricFamily(
            "ges_loop_longest_seconds",
            "The longest the broker's event loop ran between two waits for I/O, in the last "
            "10 s (the process's loop, shared by the brokers it runs).",
            labels=labels,
        )
        loop_busy = CounterMetricFamily(
            "ges_loop_busy_seconds",
            "Seconds the broker's event loop ran (not waiting for I/O) since it started.",
            labels=labels,
        )
        loop_stretches = HistogramMetricFamily(
            "ges_loop_busy_stretch_seconds",
            "The event loop's runs between two waits for I/O, by how long each took.",
            labels=labels,
        )
        for snap in self.snapshots:
            stats = snap.stats
            at = snap.at
            for name, _, field in COUNTERS:
                counters[name].add_metric(at, getattr(stats, field))
            for name, _, field in GAUGES:
                gauges[name].add_metric(at, getattr(stats, field))
            cut = set(stats.links_cut)
            for peer in snap.neighbours:
                up = 1 if peer in stats.links_up else 0
                links_up.add_metric([*at, peer, "1" if peer in cut else "0"], up)
            queued.add_metric([*at, "clients"], stats.queued_clients)
            queued.add_metric([*at, "links"], stats.queued_links)
            if snap.uncommitted is not None:
                log_bytes.add_metric([*at, "uncommitted"], snap.uncommitted)
                log_bytes.add_metric([*at, "on_disk"], stats.log_bytes)
            incarnation = snap.incarnation
            if incarnation > 10**18:  # a start time in ns (tests may choose small numbers)
                started.add_metric(at, incarnation / 1e9)
            if snap.loop is not None:
                longest, busy, buckets = snap.loop
                loop_longest.add_metric(at, longest)
                loop_busy.add_metric(at, busy)
                loop_stretches.add_metric(
                    at, [(floatToGoString(bound), count) for bound, count in buckets], busy
                )
        yield from counters.values()
        yield from gauges.values()
        yield from (links_up, queued, log_bytes, started)
        yield from (loop_longest, loop_busy, loop_stretches)


def registry_of(servers) -> Metrics:
    return Metrics(servers)


async def serve_metrics(
    registry: Metrics,
    port: int,
    host: str = "",
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer ``GET /metrics`` (and ``GET /``) on ``host:port`` until cancelled."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host or None)
    except OSError as exc:
        raise OperationError(f"metrics port {port}: cannot listen: {exc.strerror or exc}") from None
    limit = trio.CapacityLimiter(MAX_SCRAPERS)

    async def handler(stream: trio.SocketStream) -> None:
        async with limit:
            try:
                with trio.fail_after(REQUEST_SECONDS):
                    await _answer(stream, registry)
            except (trio.TooSlowError, trio.BrokenResourceError, OSError):
                pass
            finally:
                await trio.aclose_forcefully(stream)

    log.info("metrics on port %d", port)
    task_status.started()
    await trio.serve_listeners(handler, listeners)


async def _answer(stream: trio.SocketStream, registry: Metrics) -> None:
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        if len(head) > MAX_REQUEST_BYTES:
            await stream.send_all(_response(431, b"request head too large\n"))
            await linger(stream, 8 * MAX_REQUEST_BYTES)  # (so that closing does not reset it)
            return
        data = await stream.receive_some(MAX_REQUEST_BYTES)
        if not data:
            return
        head += data
    method, _, rest = head.partition(b" ")
    path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
    if method != b"GET":
        await stream.send_all(_response(405, b"only GET\n"))
    elif path not in (b"/metrics", b"/"):
        await stream.send_all(_response(404, b"not found: try /metrics\n"))
    else:
        await stream.send_all(_response(200, await registry.text()))


def _response(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}[status]
    kind = "text/plain; version=0.0.4; charset=utf-8" if status == 200 else "text/plain"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def start_metrics(nursery: trio.Nursery, servers, port: int | None) -> list[int]:
    """Serve the metrics of ``servers`` (BrokerServers of this process) in ``nursery``: all of
    them on ``port`` when given (``--metrics-port``), and each that has a ``metrics_port`` in
    the topology on that port too; the ports serving, in that order. Raises OperationError for
    a port taken."""
    servers = list(servers)
    ports = []
    if port:
        await nursery.start(serve_metrics, registry_of(servers), port, servers[0].listen_host)
        ports.append(port)
    for server in servers:
        own = server.spec.metrics_port
        if own and own != port:
            await nursery.start(serve_metrics, registry_of([server]), own, server.listen_host)
            ports.append(own)
    return ports
