"""What the monitor knows of a running network, built from the brokers' ``Stats``: sans-I/O.

The units of the topology as a tree (top unit → … → cluster → broker), each broker's last
counters and the rates between two of them, each link's state as its two ends report it, each
unit's health, and a bounded log of what changed between two reports (a broker restarting or no
longer answering, a link going down or being cut, slow consumers). The caller feeds it reports
(:meth:`NetworkModel.observe`, :meth:`NetworkModel.unreachable`) with the time they were taken;
the terminal view, ``ges monitor --once`` and the metrics read it. No I/O, clock or trio here.
"""

from __future__ import annotations

from collections import deque

import attrs

from ges.topology import Topology, broker_order_key
from ges.wire import messages as m

#: Entries the event log keeps (the oldest go first).
LOG_ENTRIES = 500

#: Link states, as the two ends report it.
LINK_UP, LINK_DOWN, LINK_CUT, LINK_HALF, LINK_UNKNOWN = "up", "down", "cut", "half", "unknown"

#: Unit health, worst last.
OK, LINKS_DOWN, SOME_DOWN, SPLIT, UNREACHABLE = (
    "ok",
    "links down",
    "some down",
    "split",
    ("unreachable"),
)
HEALTH_ORDER = (OK, LINKS_DOWN, SOME_DOWN, SPLIT, UNREACHABLE)
#: A health's rank: 0 for ok, higher the worse (for sorting and :func:`worst`).
HEALTH_RANK = {health: rank for rank, health in enumerate(HEALTH_ORDER)}

#: A broker whose event loop ran longer than this (µs) between two waits for I/O in the last
#: 10 s is shown as held (the project's aim is a few milliseconds at most; Stats.loop_longest_us).
LOOP_HELD_US = 10_000


@attrs.define
class LogEntry:
    at: float
    level: str  # "info" or "warning"
    text: str


@attrs.define
class BrokerState:
    """One broker as last reported: its counters (None while it does not answer), the rates
    between its last two reports of one incarnation, and what the monitor saw of its life."""

    id: str
    unit: tuple[str, ...]
    stats: m.Stats | None = None
    at: float = 0.0
    error: str | None = None
    #: events per second in, out and delivered to clients, between the last two reports
    rate_in: float = 0.0
    rate_out: float = 0.0
    rate_delivered: float = 0.0
    #: the share of the time its process's event loop was busy between its last two reports
    #: (0.0-1.0; Stats.loop_busy_us)
    loop_busy: float = 0.0
    #: restarts seen (a new incarnation in a report)
    restarts: int = 0

    @property
    def answering(self) -> bool:
        return self.stats is not None

    @property
    def clients(self) -> int:
        return self.stats.clients if self.stats is not None else 0

    @property
    def loop_longest_us(self) -> int:
        """The longest its process's event loop ran between two waits for I/O in the last
        10 s, as last reported (0: not answering, or a broker that does not say)."""
        return self.stats.loop_longest_us if self.stats is not None else 0


@attrs.define
class Unit:
    """A unit of the topology: its path (top level first; () is the whole network), the units
    inside it and, for a cluster, its brokers."""

    path: tuple[str, ...]
    units: list[Unit] = attrs.Factory(list)
    brokers: list[str] = attrs.Factory(list)
    #: every broker inside it, at any depth, and the links between two of them (their keys):
    #: fixed by the topology, so found once
    members: list[str] = attrs.Factory(list)
    links: list[tuple[str, str]] = attrs.Factory(list)

    @property
    def name(self) -> str:
        return self.path[-1] if self.path else ""


@attrs.define
class LinkState:
    a: str
    b: str
    level: int  # its level (ges.topology: 0 inside a cluster, 1 between clusters, …)
    state: str


class NetworkModel:
    """The monitor's picture of one network (see the module)."""

    def __init__(self, topology: Topology, *, log_entries: int = LOG_ENTRIES) -> None:
        self.topology = topology
        order = sorted(topology.brokers, key=broker_order_key)
        self.brokers: dict[str, BrokerState] = {
            b: BrokerState(b, tuple(topology.brokers[b].unit)) for b in order
        }
        #: every unit by its path (() is the whole network), top down
        self.units: dict[tuple[str, ...], Unit] = _unit_tree(topology, order)
        self.root = self.units[()]
        self.log: deque[LogEntry] = deque(maxlen=log_entries)
        #: entries ever logged (the log keeps the last ``log_entries``): a reader that
        #: remembers it knows how many are new
        self.logged = 0
        self._links: dict[tuple[str, str], str] = {
            link.key: LINK_UNKNOWN for link in topology.links
        }
        #: each unit's health when health_changes last looked (the interactive view opens the
        #: unhealthy ones of a large network from it)
        self.unit_health: dict[tuple[str, ...], str] = {}

    # -- reports ---------------------------------------------------------------------------------

    def observe(self, broker: str, stats: m.Stats, now: float) -> list[LogEntry]:
        """A report from ``broker`` taken at ``now``; what it changed, also kept in the log."""
        view = self.brokers[broker]
        old, old_at = view.stats, view.at
        said: list[LogEntry] = []
        if old is None and view.error is not None:
            said.append(LogEntry(now, "info", f"{broker} answers again"))
        if old is not None and old.incarnation != stats.incarnation:
            view.restarts += 1
            said.append(LogEntry(now, "warning", f"{broker} restarted"))
            old = None
        if old is not None and now > old_at:
            dt = now - old_at
            view.rate_in = max(0.0, (stats.events_in - old.events_in) / dt)
            view.rate_out = max(0.0, (stats.events_out - old.events_out) / dt)
            view.rate_delivered = max(0.0, (stats.delivered - old.delivered) / dt)
            # reports are timed here and the busy time there: a report that came late and the
            # next on time would make more than the whole
            busy = (stats.loop_busy_us - old.loop_busy_us) / 1e6 / dt
            view.loop_busy = min(1.0, max(0.0, busy))
            if stats.slow_consumers > old.slow_consumers:
                n = stats.slow_consumers - old.slow_consumers
                said.append(
                    LogEntry(now, "warning", f"{broker}: {n} slow consumer(s) disconnected")
                )
        else:
            view.rate_in = view.rate_out = view.rate_delivered = view.loop_busy = 0.0
        view.stats, view.at, view.error = stats, now, None
        said += self._relink(broker, now)
        self._log(said)
        return said

    def unreachable(self, broker: str, error: str, now: float) -> list[LogEntry]:
        """``broker`` did not answer at ``now`` (``error`` says how)."""
        view = self.brokers[broker]
        said: list[LogEntry] = []
        if view.stats is not None or view.error is None:
            said.append(LogEntry(now, "warning", f"{broker} does not answer: {error}"))
        view.stats, view.error = None, error
        view.rate_in = view.rate_out = view.rate_delivered = view.loop_busy = 0.0
        said += self._relink(broker, now)
        self._log(said)
        return said

    def lines(
        self, broker: str, lines: list[m.LogLine], missed: int, now: float, wall: float
    ) -> list[LogEntry]:
        """Lines ``broker`` logged, reported at ``now`` (``wall``: the same moment on the
        clock the lines' times are on): each at the moment it was logged, named by its
        broker."""
        said = [
            LogEntry(min(now, now - (wall - ln.at)), ln.level, f"{broker}: {ln.text}")
            for ln in lines
        ]
        if missed:
            said.append(LogEntry(now, "warning", f"{broker}: {missed:,} more lines not shown"))
        self._log(said)
        return said

    def silent(self, now: float, after: float, since: float) -> list[LogEntry]:
        """Brokers that reported nothing for ``after`` seconds (or never, ``after`` seconds
        into a watch that began at ``since``) count as not answering."""
        said: list[LogEntry] = []
        for broker, view in self.brokers.items():
            if view.stats is not None and now - view.at > after:
                said += self.unreachable(broker, f"no report for {now - view.at:.0f} s", now)
            elif view.stats is None and view.error is None and now - since > after:
                said += self.unreachable(broker, "has not reported", now)
        return said

    def health_changes(self, now: float) -> list[LogEntry]:
        """Units whose health changed since the last call (a partition inside one shows as
        ``split``), logged; the first call only takes note of how each unit stands."""
        said: list[LogEntry] = []
        first = not self.unit_health
        for path, u in self.units.items():
            health = self.health(u)
            before = self.unit_health.get(path)
            self.unit_health[path] = health
            if first or before == health or before is None:
                continue
            worse = HEALTH_RANK[health] > HEALTH_RANK[before]
            name = u.name and "/".join(path) or f"network {self.topology.name}"
            said.append(
                LogEntry(now, "warning" if worse else "info", f"{name}: {before} -> {health}")
            )
        self._log(said)
        return said

    def note(self, level: str, text: str, now: float) -> LogEntry:
        """A line of the watcher's own (where it watches through, a connection lost)."""
        entry = LogEntry(now, level, text)
        self._log([entry])
        return entry

    def _log(self, said: list[LogEntry]) -> None:
        self.log.extend(said)
        self.logged += len(said)

    def _relink(self, broker: str, now: float) -> list[LogEntry]:
        said = []
        for peer in self.topology.neighbours[broker]:
            key = (broker, peer) if (broker, peer) in self._links else (peer, broker)
            state = self._link_state(*key)
            before = self._links[key]
            if state == before:
                continue
            self._links[key] = state
            if before == LINK_UNKNOWN and state == LINK_UP:
                continue  # first seen up: nothing happened
            level = "info" if state == LINK_UP else "warning"
            said.append(LogEntry(now, level, f"link {key[0]}–{key[1]} {state}"))
        return said

    def _link_state(self, a: str, b: str) -> str:
        sa, sb = self.brokers[a].stats, self.brokers[b].stats
        if sa is None and sb is None:
            return LINK_UNKNOWN
        if (sa is not None and b in sa.links_cut) or (sb is not None and a in sb.links_cut):
            return LINK_CUT
        ups = [peer in s.links_up for s, peer in ((sa, b), (sb, a)) if s is not None]
        if all(ups):
            return LINK_UP
        return LINK_HALF if any(ups) else LINK_DOWN

    # -- reading ---------------------------------------------------------------------------------

    def links(self) -> list[LinkState]:
        return [
            LinkState(a, b, self.topology.link_level(a, b), state)
            for (a, b), state in self._links.items()
        ]

    def unit_brokers(self, unit: Unit) -> list[str]:
        return unit.members

    def health(self, unit: Unit) -> str:
        """``ok``; ``links down`` (inside it, still connected); ``some down`` (brokers that do
        not answer); ``split`` (its answering brokers not connected by its links that are up);
        ``unreachable`` (none answers)."""
        members = unit.members
        answering = [b for b in members if self.brokers[b].answering]
        if not answering:
            return UNREACHABLE
        adjacency: dict[str, list[str]] = {b: [] for b in answering}
        some_link_down = False
        for a, b in unit.links:
            if self._links[a, b] == LINK_UP:
                if a in adjacency and b in adjacency:
                    adjacency[a].append(b)
                    adjacency[b].append(a)
            else:
                some_link_down = True
        reached = {answering[0]}
        frontier = [answering[0]]
        while frontier:
            for nxt in adjacency[frontier.pop()]:
                if nxt not in reached:
                    reached.add(nxt)
                    frontier.append(nxt)
        if len(reached) < len(answering):
            return SPLIT
        if len(answering) < len(members):
            return SOME_DOWN
        return LINKS_DOWN if some_link_down else OK

    def totals(self, unit: Unit) -> dict:
        """A unit's brokers added up: answering, clients, sessions, rates; and the longest
        any of their event loops ran between two waits for I/O (µs, in the last 10 s)."""
        views = [self.brokers[b] for b in self.unit_brokers(unit)]
        live = [v for v in views if v.stats is not None]
        return {
            "members": len(views),
            "answering": len(live),
            "clients": sum(v.stats.clients for v in live),
            "sessions": sum(v.stats.sessions for v in live),
            "rate_in": sum(v.rate_in for v in live),
            "rate_out": sum(v.rate_out for v in live),
            "rate_delivered": sum(v.rate_delivered for v in live),
            "restarts": sum(v.restarts for v in views),
            "loop_longest_us": max((v.loop_longest_us for v in live), default=0),
        }

    def snapshot(self) -> dict:
        """Everything as one JSON-ready object (``ges monitor --once --json``)."""

        def unit(u: Unit) -> dict:
            return {
                "unit": "/".join(u.path),
                "health": self.health(u),
                **self.totals(u),
                "units": [unit(inner) for inner in u.units],
                "brokers": [broker(b) for b in u.brokers],
            }

        def broker(b: str) -> dict:
            v = self.brokers[b]
            out: dict = {"broker": b, "answering": v.answering, "restarts": v.restarts}
            if v.error is not None:
                out["error"] = v.error
            if v.stats is not None:
                s = v.stats
                out |= {
                    "incarnation": s.incarnation,
                    "pid": s.pid,
                    "clients": s.clients,
                    "subscriptions": s.subscriptions,
                    "sessions": s.sessions,
                    "links_up": sorted(s.links_up),
                    "links_cut": sorted(s.links_cut),
                    "events_in": s.events_in,
                    "events_out": s.events_out,
                    "delivered": s.delivered,
                    "rate_in": round(v.rate_in, 1),
                    "rate_out": round(v.rate_out, 1),
                    "rate_delivered": round(v.rate_delivered, 1),
                    "slow_consumers": s.slow_consumers,
                    "log_held": s.log_held,
                    "log_released": s.log_released,
                    "log_epochs": s.log_epochs,
                    "log_bytes": s.log_bytes,
                    "queued_clients": s.queued_clients,
                    "queued_links": s.queued_links,
                    "nacks_sent": s.nacks_sent,
                    "nacks_answered": s.nacks_answered,
                    "recovered": s.recovered,
                    "lost": s.lost,
                    "session_events": s.session_events,
                    "session_epoch": s.session_epoch,
                    "latency_p50_us": s.latency_p50_us,
                    "latency_p99_us": s.latency_p99_us,
                    "loop_longest_us": s.loop_longest_us,
                    "loop_busy_us": s.loop_busy_us,
                    "loop_busy_percent": round(100 * v.loop_busy, 1),
                }
            return out

        return {
            "topology": self.topology.name,
            "network": unit(self.root),
            "links": [attrs.asdict(link) for link in self.links()],
            "log": [attrs.asdict(e) for e in self.log],
        }


def worst(healths) -> str:
    """The worst of some unit healths."""
    return max(healths, key=HEALTH_RANK.__getitem__, default=OK)


def _unit_tree(topology: Topology, order: list[str]) -> dict[tuple[str, ...], Unit]:
    """Every unit by its path, each with its members and the links inside it."""
    index: dict[tuple[str, ...], Unit] = {(): Unit(())}
    for b in order:
        path = tuple(topology.brokers[b].unit)
        for depth in range(len(path) + 1):
            prefix = path[:depth]
            if prefix not in index:
                node = index[prefix] = Unit(prefix)
                index[path[: depth - 1]].units.append(node)
            index[prefix].members.append(b)
        index[path].brokers.append(b)
    for link in topology.links:
        ua, ub = topology.brokers[link.a].unit, topology.brokers[link.b].unit
        shared = 0
        while shared < len(ua) and ua[shared] == ub[shared]:
            shared += 1
        for depth in range(shared + 1):  # every unit holding both ends
            index[tuple(ua[:depth])].links.append(link.key)
    return index
