"""Forwarding events with best effort: flooding, or along content routes (seed 004 §3.3).

Theory of operation
-------------------
With ``routing="flood"`` (the baseline the benchmarks compare against) a published event goes
over every up link and each broker forwards and delivers only the first copy of each tick: a
:class:`~ges.core.dedup.TickWindow` per pubend recognises the copies. With content routing and
best-effort delivery the :class:`~ges.routing.ContentRouter` says, for every event, which
routes go to which neighbour; every copy passing through is offered to the local subscriptions
once per tick. Either way every forwarded item carries ``prev``, the previous tick sent on that
link for that pubend, and items that went round more than ``max_hops`` are dropped (only views
that disagree for a moment can make a route go round). Reliable delivery routes with claims
instead (ges.core.subends) but checks what it receives here too.
"""

from __future__ import annotations

from collections import OrderedDict

from ges.core.dedup import TickWindow
from ges.core.outputs import ProtocolError, ToPeer
from ges.core.part import Part
from ges.wire import messages as m


class Forwarding(Part):
    """Best-effort forwarding: per-pubend duplicate windows and the previous tick per link."""

    def __init__(self, core):
        super().__init__(core)
        #: per pubend the ticks seen (least recently seen forgotten first), per (link, pubend)
        #: the last tick sent on it
        self.windows: OrderedDict[str, TickWindow] = OrderedDict()
        self._path_prev: dict[tuple[str, str], int] = {}

    def link_down(self, peer: str) -> None:
        """The link to ``peer`` went: the flood paths through it start again."""
        for key in [k for k in self._path_prev if k[0] == peer]:
            del self._path_prev[key]

    def route(self, pubend: str, todo: list) -> list:
        """Route ``(item, routes)`` pairs: the Events to send on."""
        route = self.router.route_event
        per_hop: dict[str, list] = {}
        last_attrs = last_routes = None
        hops: dict = {}
        for it, routes in todo:
            attrs = it.event.attributes
            # a batch of events with the same attributes and routes is routed once
            if routes is not last_routes or attrs != last_attrs:
                hops = {hop: tuple(rs) for hop, rs in route(attrs, routes, it.path).items()}
                last_attrs, last_routes = attrs, routes
            for hop, rs in hops.items():
                per_hop.setdefault(hop, []).append((it, rs))
        out = []
        item_type = m.EventItem
        me = self.id
        for peer, pairs in per_hop.items():
            if peer not in self.links_up:
                continue
            key = (peer, pubend)
            prev = self._path_prev.get(key, 0)
            hop = []
            for it, rs in pairs:
                hop.append(item_type(it.tick, prev, it.hops + 1, it.event, rs, (*it.path, me)))
                prev = it.tick
            self._path_prev[key] = prev
            out.append(ToPeer(peer, m.Events(pubend, hop)))
            self.counters["events_out"] += len(hop)
        self.counters["event_frames"] += len(out)
        return out

    def checked(self, peer: str, items: list) -> list:
        """``(item, routes)`` for the received items within the hop limit; a bad route is a
        protocol error."""
        check = self.router.check_routes
        todo = []
        for it in items:
            if it.hops >= self.config.max_hops:
                self.counters["hop_limit"] += 1
                continue
            try:
                check(it.to)
            except ValueError as exc:
                raise ProtocolError(f"bad event route from {peer}: {exc}") from None
            todo.append((it, it.to))
        self.counters["events_in"] += len(items)
        return todo

    def on_routed(self, peer: str, pubend: str, items: list) -> list:
        todo = self.checked(peer, items)
        out = self.route(pubend, todo)
        # every copy passing through is offered to the local subscriptions, once per tick
        if todo and self.subscriptions.profiles:
            add = self.window(pubend).add
            fresh = [it for it, _ in todo if add(it.tick)]
            self.counters["duplicates"] += len(todo) - len(fresh)
            if fresh:
                out += self.subscriptions.deliver(pubend, fresh)
        return out

    def window(self, pubend: str) -> TickWindow:
        window = self.windows.get(pubend)
        if window is None:
            window = self.windows[pubend] = TickWindow(limit=self.config.window_limit)
            if len(self.windows) > self.config.max_pubends:
                self.windows.popitem(last=False)
        else:
            self.windows.move_to_end(pubend)
        return window

    def on_flooded(self, peer: str, pubend: str, items: list) -> list:
        window = self.window(pubend)
        add = window.add
        fresh = [it for it in items if add(it.tick)]
        self.counters["events_in"] += len(fresh)
        self.counters["duplicates"] += len(items) - len(fresh)
        if not fresh:
            return []
        return self.forward(pubend, fresh, exclude=peer) + self.subscriptions.deliver(pubend, fresh)

    def forward(self, pubend: str, items: list, *, exclude: str | None) -> list:
        out = []
        item_type = m.EventItem
        for peer in self.links_up:
            if peer == exclude:
                continue
            key = (peer, pubend)
            prev = self._path_prev.get(key, 0)
            hop = []
            for it in items:
                hop.append(item_type(it.tick, prev, it.hops + 1, it.event))
                prev = it.tick
            self._path_prev[key] = prev
            out.append(ToPeer(peer, m.Events(pubend, hop)))
            self.counters["events_out"] += len(hop)
        self.counters["event_frames"] += len(out)
        return out
