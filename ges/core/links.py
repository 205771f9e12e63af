"""Links and connection information: who may connect, and what each broker knows of the network.

Theory of operation
-------------------
A connection's first frame is a ``Hello``; :meth:`Links.hello` accepts it or says in one line
why not: another protocol version, another network (the topology's digest, not only its name:
a different file of the same name is refused, naming the file each side runs), a broker that is
not a neighbour, or a neighbour that should have waited to be dialled (the lower id dials).

Links that come up or go down are observed into the broker's connectivity graph, and the
resulting connection information is disseminated to neighbours inside its context only (seed
004 §2.2): each report goes to the up neighbours it is visible to, and a neighbour whose link
just came up gets every report visible to it. Reports from neighbours are received the same way
and passed on. A lost last link between two units is a partition, logged as a warning when it
leaves units unreachable and as info when a detour exists; a neighbour that said ``Bye`` first
stopped on purpose, so its link going down is no alarm.
"""

from __future__ import annotations

from ges.connectivity import ConnectivityError, ConnectivityGraph, LinkReport, Update
from ges.core.outputs import Notice, ProtocolError, ToPeer
from ges.topology import Topology, broker_order_key
from ges.wire import messages as m

#: Characters of a string a peer chose that a reason shows.
SHOWN = 80
#: ... and the most of a file path quoted (a path under a deep directory is longer)
SHOWN_PATH = 240


class Links:
    """The handshake, and the connectivity graph's inputs and dissemination."""

    def __init__(self, topology: Topology, broker_id: str, incarnation: int, links_up: set[str]):
        self.topology = topology
        self.id = broker_id
        self.incarnation = incarnation
        self.neighbours = frozenset(topology.neighbours[broker_id])
        self.unit = topology.brokers[broker_id].unit
        self.graph = ConnectivityGraph(
            broker_id, self.unit, costs=topology.link_costs, incarnation=incarnation
        )
        #: the core's live set of up links
        self.links_up = links_up
        #: neighbours that said they are stopping (m.Bye): their link going down is no alarm
        self.stopped: set[str] = set()

    def hello(self, hello: m.Hello) -> m.Welcome | m.Refuse:
        """Decide whether to accept a connection from its first frame."""
        # what the peer chose is quoted and cut short in a reason: the log keys its rate limit
        # on the reason with the quoted parts left out (ges.runtime.notes)
        if hello.proto != m.PROTOCOL_VERSION:
            return m.Refuse(
                f"protocol {hello.proto} not supported (this broker speaks {m.PROTOCOL_VERSION})"
            )
        mine = self.topology
        if hello.topology != mine.name and not (hello.role == "client" and not hello.topology):
            return m.Refuse(
                f"topology {_shown(hello.topology)} does not match this broker's {mine.name!r} "
                f"({_runs(mine.source, mine.short_digest)})"
            )
        # the network is its content, not its name: brokers always say which they run, and a
        # client that names one must run the same (an anonymous client names none)
        if (hello.digest or hello.role == "broker") and hello.digest != mine.digest:
            yours = f"{_shown_path(hello.source or 'a file not named')} (digest {_shown(hello.digest[:16] or 'none')})"
            return m.Refuse(
                f"not the same network: {self.id} runs {mine.name} from "
                f"{_runs(mine.source, mine.short_digest)}, this connection {yours}"
            )
        if hello.role == "broker":
            if hello.id not in self.neighbours:
                return m.Refuse(f"broker {_shown(hello.id)} is not a neighbour of {self.id}")
            if broker_order_key(hello.id) > broker_order_key(self.id):
                return m.Refuse(
                    f"broker {hello.id} should wait for {self.id} to dial (lower id dials)"
                )
        elif hello.role == "sessions":  # a broker following its clients' durable sessions
            if hello.id not in self.topology.brokers:
                return m.Refuse(f"broker {_shown(hello.id)} is not in the topology")
        elif hello.role != "client":
            return m.Refuse(f"unknown role {_shown(hello.role)}")
        return m.Welcome(broker=self.id, incarnation=str(self.incarnation))

    def up(self, peer: str) -> tuple[list, list]:
        """``peer``'s link came up (the core has added it to the up links): the reports for the
        other neighbours and everything ``peer`` may see; and the notices."""
        self.stopped.discard(peer)
        report, update = self._observe(peer, up=True)
        out = self._disseminate([report], exclude=peer)
        # the new neighbour gets everything we know that it may see (itself included)
        known = self.graph.reports_for(self.topology.brokers[peer].unit)
        if known:
            out.append(ToPeer(peer, m.Connectivity([_to_wire(r) for r in known])))
        return out, self.notices(update)

    def down(self, peer: str) -> list:
        """``peer``'s link, which was up, went down: the reports and the notices."""
        report, update = self._observe(peer, up=False)
        notices = self.notices(update)
        if peer in self.stopped:  # it said it was stopping: an operator's doing, no alarm
            self.stopped.discard(peer)
            notices = [Notice("info", f"{peer} stopped: {n.text}") for n in notices]
        return self._disseminate([report], exclude=peer) + notices

    def on_connectivity(self, peer: str, states: list) -> tuple[list, list, set[str], bool]:
        """Reports from ``peer``: the reports passed on, the notices, the ends of links that
        came up and whether any news was of a link going down (for the router)."""
        fresh: list[LinkReport] = []
        notices: list = []
        up_ends: set[str] = set()
        for state in states:
            try:
                report = _from_wire(state)
                update = self.graph.receive(report)
            except (ConnectivityError, ValueError) as exc:
                raise ProtocolError(f"bad connection information from {peer}: {exc}") from None
            if update.new:
                fresh.append(report)
                notices += self.notices(update)
                if report.up:
                    up_ends.update((report.a, report.b))
        downs = bool(fresh) and not all(r.up for r in fresh)
        return self._disseminate(fresh, exclude=peer), notices, up_ends, downs

    def _observe(self, peer: str, *, up: bool) -> tuple[LinkReport, Update]:
        link = self.topology.link_between(self.id, peer)
        return self.graph.observe(
            peer, self.topology.brokers[peer].unit, up=up, cost=link.cost if link else None
        )

    def _disseminate(self, reports: list[LinkReport], *, exclude: str | None) -> list:
        """Send each report to the up neighbours inside its context (never beyond it)."""
        if not reports:
            return []
        out = []
        brokers = self.topology.brokers
        for peer in sorted(self.links_up):
            if peer == exclude:
                continue
            unit = brokers[peer].unit
            visible = [_to_wire(r) for r in reports if self.graph.report_visible_to(r, unit)]
            if visible:
                out.append(ToPeer(peer, m.Connectivity(visible)))
        return out

    @staticmethod
    def notices(update: Update) -> list:
        out = []
        for p in update.partitions:
            lost = ", ".join(sorted(map(str, p.unreachable))) or "none (a detour exists)"
            level = "warning" if p.unreachable else "info"
            text = f"{p.pair[0]}–{p.pair[1]} lost its last link; unreachable: {lost}"
            out.append(Notice(level, text))
        for h in update.healed:
            level = "warning" if h.reachable else "info"
            out.append(Notice(level, f"{h.pair[0]}–{h.pair[1]} has a live link again"))
        return out


def _runs(source: str, digest: str) -> str:
    return f"{source} (digest {digest})"


def _shown(text: str) -> str:
    """A peer's string in a reason: quoted, and cut short."""
    return repr(text if len(text) <= SHOWN else text[: SHOWN - 1] + "…")


def _shown_path(path: str) -> str:
    """A peer's file path in a reason: quoted, and cut short from the front (its end names the
    file)."""
    return repr(path if len(path) <= SHOWN_PATH else "…" + path[1 - SHOWN_PATH :])


def _to_wire(r: LinkReport) -> m.LinkState:
    return m.LinkState(
        r.a, r.b, list(r.a_unit), list(r.b_unit), r.cost, r.reporter, r.version, r.up
    )


def _from_wire(s: m.LinkState) -> LinkReport:
    return LinkReport(
        s.a, s.b, tuple(s.a_unit), tuple(s.b_unit), s.cost, s.reporter, s.version, s.up
    )
