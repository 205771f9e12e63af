"""Watching a network through one broker: every broker reports to the brokers clients watch at.

Theory of operation
-------------------
A client (``ges monitor``) sends :class:`~ges.wire.messages.Watch` to any broker, which
becomes a *root*: it floods a :class:`~ges.wire.messages.WatchLease` (its id, a sequence
number, the interval its watchers asked for, a time to live) over its links, and every broker
passes on each lease newer than the last it had from that root, once, to its other links — so a
lease reaches every broker that is connected to the root, whatever links are down, for about
two frames per link; the lease counts its hops, so each broker learns how far it is from the
root. While it holds a live lease a broker sends the root one
:class:`~ges.wire.messages.Report` each interval it asked for: its own report (its counters and
the lines it logged since its last, encoded once: :func:`~ges.wire.messages.carry`) with the
reports of other brokers that came to it since its last turn — passed on as the bytes they came
as, never decoded on the way — relayed hop by hop as nacks and hand-overs are
(ges.core.unicast). A root passes what comes for it, its own among it, to its watching clients
as it is. It renews its lease every third of the time to live while it has watchers; once they
are gone its lease runs out and the reports stop.

Reports are gathered on their way, as TAG's aggregation tree schedules its epochs (Madden et
al., OSDI 2002): the first report goes at once, so a watcher sees every broker at once; after
that a broker ``d`` hops from the root reports in slot :data:`DEPTH_SLOTS` − ``d`` of
``2 · DEPTH_SLOTS`` in each interval, counted from when the lease reached it — the farthest
first — so what its neighbours farther out sent has come by then and goes in the same frame.
With the brokers' clocks running at the same rate each broker sends about one frame per
interval, and the root gets every report within about half an interval of its taking. A report
that comes long before a broker's next turn (its path to the root is not the lease's, or it was
late) goes on one slot later with whatever else comes meanwhile; a report for a root this
broker holds no lease of goes on at once.

What it costs a broker: one frame per interval per root and a lease every few seconds —
instead of a connection and a request per broker per interval from wherever the monitor runs.
A broker that does not report is seen as silent by the watcher (ges.monitor), which is all a
watcher can know of a broker it cannot reach.

Bounds: roots are brokers of the topology (a lease naming another is a protocol error), so at
most one lease per broker is kept; the interval and time to live a lease asks for are
clamped to :data:`MIN_INTERVAL`–:data:`MAX_INTERVAL` and at most :data:`MAX_TTL`; the lines
of one broker's report are at most :data:`MAX_LINES`, each cut to :data:`MAX_LINE_CHARS` (the
rest are counted as ``missed``); a broker gathers for each root at most the latest report of each
broker of the topology (a newer one replaces it, their lines kept within the bound — the one
case where a report is opened on its way), and sends them in frames of at most
:data:`MAX_REPORT_BYTES`; a watcher's reports go through its
connection's queue, whose bound in bytes cuts a watcher that does not read as any slow
consumer.

The counters come from ``stats`` and the lines from ``lines`` — callables the driver sets
(the trio runtime's counters include its own, and it keeps the log's lines); by default the
core's own counters and no lines. No clock is read here: ``now`` comes in.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import msgspec

from ges.core.outputs import ProtocolError, ToClient, ToPeer, hop
from ges.core.part import Part
from ges.wire import FrameError
from ges.wire import messages as m

#: The shortest and longest report interval a watcher may ask for, in seconds.
MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0
#: A lease lives this many report intervals (at least MIN_TTL seconds), and is renewed every
#: third of that while the root has watchers.
TTL_INTERVALS = 6
MIN_TTL = 6.0
MAX_TTL = 6 * MAX_INTERVAL
#: Clients watching at one broker.
MAX_WATCHERS = 64
#: Lines one broker's report carries, and characters kept of each.
MAX_LINES = 64
MAX_LINE_CHARS = 400
#: Hops from the root a broker's turn in an interval can tell apart (farther ones share the
#: first turn).
DEPTH_SLOTS = 16
#: Bytes of reports in one Report frame.
MAX_REPORT_BYTES = 256 * 1024


@attrs.define
class Lease:
    #: (the root's incarnation, its sequence number): a later one replaces an earlier one
    seq: tuple[int, int]
    interval: float
    expires: float
    #: hops from the root, as the lease came; when it came (its turns count from then), and
    #: this broker's next turn to report to the root
    distance: int = 0
    started: float = 0.0
    next_at: float = 0.0
    #: when what came after this broker's turn goes on (INF: nothing waits)
    flush_at: float = float("inf")
    #: the reports gathered for the root since this broker's last turn, by broker
    gathered: dict = attrs.Factory(dict)


def turn(distance: int, interval: float) -> float:
    """Seconds into each interval at which a broker ``distance`` hops from the root reports."""
    return (DEPTH_SLOTS - min(distance, DEPTH_SLOTS)) * interval / (2 * DEPTH_SLOTS)


def clamp_interval(interval: float) -> float:
    if not math.isfinite(interval):
        return MAX_INTERVAL
    return min(MAX_INTERVAL, max(MIN_INTERVAL, interval))


class Watching(Part):
    """The roots this broker reports to, and the clients watching here (module docstring)."""

    def __init__(self, core):
        super().__init__(core)
        #: root broker -> the newest lease from it
        self.leases: dict[str, Lease] = {}
        #: client connection -> the interval it asked for
        self.watchers: dict[int, float] = {}
        self._seq = 0
        self._renew_at = INF
        self._report_at = INF
        #: the counters and the lines logged since the last call (set by the driver)
        self.stats: Callable[[], m.Stats] = core.stats
        self.lines: Callable[[], tuple[list[m.LogLine], int]] = lambda: ([], 0)

    # -- the watchers at this broker -----------------------------------------------------------

    def watch(self, conn: int, msg: m.Watch, now: float) -> list:
        if self.router is None:
            why = "watching needs content routing (this network floods): ges monitor --poll"
            return [ToClient(conn, m.Error(why))]
        if conn not in self.watchers and len(self.watchers) >= MAX_WATCHERS:
            return [ToClient(conn, m.Error(f"{MAX_WATCHERS} clients watch here already"))]
        self.watchers[conn] = clamp_interval(msg.interval)
        return self._renew(now)

    def unwatch(self, conn: int) -> None:
        self.watchers.pop(conn, None)
        if not self.watchers:
            self._renew_at = INF  # the lease runs out; the reports stop

    def _renew(self, now: float) -> list:
        """A new lease from this broker, kept here and flooded to every link."""
        interval = min(self.watchers.values())
        ttl = max(MIN_TTL, TTL_INTERVALS * interval)
        self._seq += 1
        lease = m.WatchLease(self.id, self.core.incarnation, self._seq, interval, ttl)
        self._renew_at = now + ttl / 3
        self._take(lease, now)
        return [ToPeer(p, lease) for p in sorted(self.links_up)]

    # -- leases --------------------------------------------------------------------------------

    def on_lease(self, peer: str, msg: m.WatchLease, now: float) -> list:
        if msg.root not in self.topology.brokers:
            raise ProtocolError(f"a watch lease from unknown broker {msg.root!r}")
        known = self.leases.get(msg.root)
        if msg.root == self.id or (known is not None and (msg.incarnation, msg.seq) <= known.seq):
            return []  # seen (or this broker's own, come round)
        onward = msgspec.structs.replace(msg, hops=msg.hops + 1)
        self._take(onward, now)
        return [ToPeer(p, onward) for p in sorted(self.links_up) if p != peer]

    def _take(self, msg: m.WatchLease, now: float) -> None:
        interval = clamp_interval(msg.interval)
        ttl = min(MAX_TTL, max(0.0, msg.ttl)) if math.isfinite(msg.ttl) else 0.0
        if not any(lease.expires > now for lease in self.leases.values()):
            self.lines()  # lines logged while nobody watched are not reported
        known = self.leases.get(msg.root)
        if known is not None and known.expires > now:  # renewed: its turns stay as they are
            known.seq, known.interval, known.expires = (
                (msg.incarnation, msg.seq),
                interval,
                now + ttl,
            )
            return
        # the first report goes now (the watcher sees this broker at once); then its turns
        lease = Lease((msg.incarnation, msg.seq), interval, now + ttl, msg.hops, now, now)
        self.leases[msg.root] = lease
        self._report_at = min(self._report_at, now)

    def leases_for(self, peer: str, now: float) -> list:
        """The live leases, for a link that just came up (a broker that restarted learns that
        it is watched at once, not at the next renewal)."""
        return [
            ToPeer(
                peer,
                m.WatchLease(root, *lease.seq, lease.interval, lease.expires - now, lease.distance),
            )
            for root, lease in sorted(self.leases.items())
            if lease.expires > now and root != peer
        ]

    # -- reports -------------------------------------------------------------------------------

    def on_timer(self, now: float) -> list:
        out: list = []
        if now >= self._renew_at and self.watchers:
            out += self._renew(now)
        if now >= self._report_at:
            out += self._report(now)
        return out

    def next_deadline(self) -> float:
        return min(self._renew_at, self._report_at)

    def _report(self, now: float) -> list:
        for root in [r for r, lease in self.leases.items() if lease.expires <= now]:
            del self.leases[root]
        due = [root for root, lease in sorted(self.leases.items()) if lease.next_at <= now]
        out: list = []
        for root, lease in sorted(self.leases.items()):  # late reports, gathered a moment
            if lease.flush_at <= now and root not in due:
                out += self._flush(root, lease, [], now)
        if due:
            own = self._own()
            for root in due:
                lease = self.leases[root]
                # the next turn: this broker's slot in the first interval after now, counted
                # from when the lease reached it
                slot = lease.started + turn(lease.distance, lease.interval)
                k = math.floor((now - slot) / lease.interval) + 1
                lease.next_at = slot + k * lease.interval
                if lease.next_at <= now:  # rounding: now was the turn itself
                    lease.next_at += lease.interval
                out += self._flush(root, lease, [own], now)
        self._report_at = min(
            (min(lease.next_at, lease.flush_at) for lease in self.leases.values()), default=INF
        )
        return out

    def _flush(self, root: str, lease: Lease, own: list, now: float) -> list:
        """What was gathered for ``root`` (and this broker's own report), sent on."""
        items = [*lease.gathered.values(), *own]
        lease.gathered = {}
        lease.flush_at = INF
        out: list = []
        for chunk in _chunks(items) if items else []:
            out += self._send(m.Report(root, chunk), now)
        return out

    def _own(self) -> m.Carried:
        stats = self.stats()
        lines, missed = self.lines()
        return m.carry(_bounded(m.Reported(stats, lines, missed)))

    def on_report(self, msg: m.Report, now: float) -> list:
        """Reports for a root: to this broker's watchers if it is that root; else gathered
        for this broker's next turn, or passed on at once if it holds no lease of the root."""
        if self.router is None:
            raise ProtocolError("a report, but this broker floods (nobody watches through it)")
        self.unicast.check(msg.to, msg.detour)
        brokers = self.topology.brokers
        if len(msg.items) > len(brokers):
            raise ProtocolError(f"{len(msg.items)} reports, the topology has {len(brokers)}")
        for item in msg.items:
            if item.broker not in brokers:
                raise ProtocolError(f"a report of unknown broker {item.broker!r}")
        if msg.to == self.id:
            return self._send(msg, now)
        lease = self.leases.get(msg.to)
        if lease is None or lease.expires <= now or msg.detour:
            return self._send(msg, now)  # no turn of its own here (or on a detour): on
        gathered = lease.gathered
        for item in msg.items:
            earlier = gathered.get(item.broker)
            gathered[item.broker] = item if earlier is None else _merged(earlier, item)
        if lease.next_at - now > lease.interval / 2 and lease.flush_at == INF:
            # after this broker's turn (they came another way than the lease's): they go on
            # after a moment with whatever else comes late, not an interval later
            lease.flush_at = now + lease.interval / (2 * DEPTH_SLOTS)
            self._report_at = min(self._report_at, lease.flush_at)
        return []

    def _send(self, msg: m.Report, now: float) -> list:
        """To this broker's watchers if it is the root (as the reports left their brokers),
        else a hop on towards the root."""
        if msg.to == self.id:
            if msg.hops:
                msg = hop(msg, 0, [])
            return [ToClient(conn, msg) for conn in self.watchers]
        return self.unicast.relay(msg.to, msg.detour, msg.hops, lambda h, d: hop(msg, h, d))


INF = float("inf")


def _chunks(items: list[m.Carried]) -> list[list[m.Carried]]:
    """``items`` in lists of at most MAX_REPORT_BYTES each."""
    chunks: list[list[m.Carried]] = [[]]
    size = 0
    for item in items:
        n = len(item.body) + len(item.broker) + 8
        if chunks[-1] and size + n > MAX_REPORT_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += n
    return chunks


def _bounded(item: m.Reported) -> m.Reported:
    """At most MAX_LINES lines (the latest) of at most MAX_LINE_CHARS characters."""
    lines, missed = item.lines, item.missed
    if len(lines) <= MAX_LINES and all(len(ln.text) <= MAX_LINE_CHARS for ln in lines):
        return item
    if len(lines) > MAX_LINES:
        missed += len(lines) - MAX_LINES
        lines = lines[-MAX_LINES:]
    lines = [
        ln
        if len(ln.text) <= MAX_LINE_CHARS
        else m.LogLine(ln.at, ln.level, ln.text[:MAX_LINE_CHARS] + "…")
        for ln in lines
    ]
    return m.Reported(item.stats, lines, missed)


def _merged(earlier: m.Carried, later: m.Carried) -> m.Carried:
    """Two reports of one broker gathered before a turn (rare: the broker's turns came twice
    before this one's): the later counters, both's lines. Only here is a report opened on its
    way; one that does not open is a protocol error of the peer that sent it."""
    try:
        a, b = m.opened(earlier), m.opened(later)
    except FrameError as exc:
        raise ProtocolError(str(exc)) from None
    return m.carry(_bounded(m.Reported(b.stats, [*a.lines, *b.lines], a.missed + b.missed)))
