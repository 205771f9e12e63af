"""Receiving reliably: routing with claims, subends that deliver in order, VT clocks (seed 002).

Theory of operation
-------------------
With reliable delivery every route a keeper makes carries its claim (ges.reliable.claims): the
previous tick it routed there, so the ticks in between are known to be silence on that path.
Events and silence for this broker feed the *subend* of their pubend (ges.reliable.subend), a
knowledge stream of tick ranges that delivers data ticks in order as its doubt horizon advances
and turns a gap that persists into a nack (ges.core.repair). A subend is made when a local
subscription exists, never below what this broker acknowledged in a release round, and the
subends together hold a bounded number of bytes beyond their horizons. Frames are stamped with
their pubend's V_m digest (seed 000 §3–5, ges.reliable.vt): a neighbour gets the vector before
the first frame that needs it, leaf clocks heard go on to every other neighbour, and an origin
whose profile is found behind an event's V_m is asked for a sync.
"""

from __future__ import annotations

from collections import OrderedDict

from ges.core.outputs import Notice, ProtocolError, ToPeer
from ges.core.part import Part
from ges.reliable.knowledge import HeldBytes
from ges.reliable.subend import Subend
from ges.wire import messages as m


class Subends(Part):
    """The subends of the pubends this broker follows, and what feeds them."""

    def __init__(self, core):
        super().__init__(core)
        self.streams: OrderedDict[str, Subend] = OrderedDict()
        #: the bytes of events all subends hold beyond their doubt horizons, and their bound
        self._held_bytes = HeldBytes(self.config.max_held_bytes)
        #: pubends whose subend has a gap (a nack may come due): the timer looks only at these
        self._doubtful: set[str] = set()

    def on_clocks(self, peer: str | None, clocks) -> list:
        """Leaf clocks heard (from ``peer``, or this broker's own): the news go on to every
        other neighbour, and into this pubend's V_m."""
        if len(clocks) > len(self.topology.brokers):
            raise ValueError("more clocks than brokers")
        news = self.vt.merge(clocks, self.publishing.routed + 1)
        if not news:
            return []
        if self.log is not None:
            self.log.clocks = self.vt.snapshot()
        return [ToPeer(p, m.Clocks(news)) for p in sorted(self.links_up) if p != peer]

    def want_profiles(self, now: float) -> list:
        """Ask each origin whose profile was found behind an event's V_m for a sync (seed 000
        §4, non-leaf liveness), at most once per RESEND_AFTER."""
        out: list = []
        for origin in self.router.take_lagging(now):
            out += self.unicast.relay(
                origin, [], 0, lambda h, d, o=origin: m.ProfileWant(o, self.id, h, d)
            )
        return out

    def stamped(self, peer: str, pubend: str, vm: int, frame) -> list:
        """``frame`` (of ``pubend``, V_m digest ``vm``) for ``peer``, after the vector the link
        has not had yet (:meth:`VirtualTime.before`)."""
        vector = self.vt.before(peer, pubend, vm) if vm else None
        if vector is None:
            return [ToPeer(peer, frame)]
        return [ToPeer(peer, vector), ToPeer(peer, frame)]

    def route_claimed(self, pubend: str, todo: list, now: float, vm: int = 0) -> list:
        """Route ``(item, routes)`` pairs one tick at a time, each route the claims make carrying
        its own (routes None: the publisher's own); routes to this broker feed its subend.
        ``vm``: the digest of the V_m the pubend stamped them with; it goes on with them."""
        route = self.router.route_event
        claims = self.claims
        vt = self.vt
        bound = vt.upper(pubend, vm)
        routed_before = claims.highest(pubend)
        per_hop: dict[str, list] = {}
        item_type = m.EventItem
        me = self.id
        mine: list = []
        local = []
        for it, routes in todo:
            tick = it.tick
            if routes is None:
                routes = self.publishing.root_routes(tick)
            hops = route(
                it.event.attributes,
                routes,
                claims=claims,
                pubend=pubend,
                tick=tick,
                mine=mine,
                vm=bound,
            )
            if mine:
                local.append((it, mine))
                mine = []
            for hop, rs in hops.items():
                fwd = item_type(tick, 0, it.hops + 1, it.event, tuple(rs), (*it.path, me))
                got = per_hop.get(hop)
                if got is None:
                    per_hop[hop] = [fwd]
                else:
                    got.append(fwd)
        out = []
        up = self.links_up
        frames = 0
        for peer, items in per_hop.items():
            if peer in up:
                out += self.stamped(peer, pubend, vm, m.Events(pubend, items, vm))
                self.counters["events_out"] += len(items)
                frames += 1
        self.counters["event_frames"] += frames
        if self.router.lagging:
            out += self.want_profiles(now)
        if self.router.kept and pubend != self.pubend:
            self.repair.cache.add(pubend, [it for it, _ in todo], routed_before=routed_before)
        if local and pubend != self.pubend:
            sub = self.subend(pubend, min(r.prev for _, rs in local for r in rs))
            if sub is not None:
                match = self.subscriptions.profiles.match
                for it, rs in local:
                    prev = min(r.prev for r in rs)
                    sub.data(prev, it.tick, it, bool(match(it.event.attributes)))
                out += self.drain(pubend, sub, now)
        return out

    def drain(self, pubend: str, sub: Subend, now: float) -> list:
        """Deliver what ``sub`` can deliver now; remember it while a nack may come due."""
        out = self.subscriptions.deliver(pubend, [it for _, it in sub.deliverable(now)])
        if self.gates.gate:
            self.gates.pass_gates(pubend, sub.stream.floor)
        if sub.next_nack < float("inf"):
            self._doubtful.add(pubend)
        else:
            self._doubtful.discard(pubend)
        return out

    def subend(self, pubend: str, floor: int) -> Subend | None:
        """The subend of ``pubend`` here (made, starting above ``floor``, if a local
        subscription exists)."""
        sub = self.streams.get(pubend)
        if sub is None:
            if not self.subscriptions.profiles:
                return None
            start = self.gates.start_floor(pubend)
            if start is not None:
                floor = min(floor, start)
            # never below what this broker acknowledged (see :meth:`_promise`)
            floor = max(floor, self.release.promised(pubend))
            sub = self.streams[pubend] = Subend(
                floor,
                self._held_bytes,
                nack_after=self.config.nack_after,
                nack_max=self.config.nack_max,
            )
            if len(self.streams) > self.config.max_subends:
                gone, old = self.streams.popitem(last=False)
                old.stream.release()
                self._doubtful.discard(gone)
        else:
            self.streams.move_to_end(pubend)
        return sub

    def on_reliable_events(
        self, peer: str, pubend: str, items: list, now: float, vm: int = 0
    ) -> list:
        todo = self.forwarding.checked(peer, items)
        if vm and self.gates.vm_waiting:
            self.gates.vm_observe(pubend, vm)
        return self.route_claimed(pubend, todo, now, vm)

    def on_silence(self, peer: str, msg: m.Silence, now: float) -> list:
        if msg.hops >= self.config.max_hops:
            return []
        try:
            self.router.check_routes(msg.to)
        except ValueError as exc:
            raise ProtocolError(f"bad silence route from {peer}: {exc}") from None
        if msg.vm and self.gates.vm_waiting:
            self.gates.vm_observe(msg.pubend, msg.vm)
        return self.silence(msg.pubend, msg.tick, msg.to, msg.hops, now, msg.vm)

    def silence(self, pubend: str, tick: int, routes, hops: int, now: float, vm: int = 0) -> list:
        mine: list = []
        vt = self.vt
        per_hop = self.router.route_event(
            None,
            routes,
            claims=self.claims,
            pubend=pubend,
            tick=tick,
            mine=mine,
            vm=vt.upper(pubend, vm),
        )
        out: list = []
        for peer, rs in per_hop.items():
            if peer in self.links_up:
                out += self.stamped(peer, pubend, vm, m.Silence(pubend, tick, rs, hops + 1, vm))
                self.counters["silences"] += 1
        if self.router.lagging:
            out += self.want_profiles(now)
        if mine and pubend != self.pubend:
            prev = min(r.prev for r in mine)
            sub = self.subend(pubend, min(prev, tick))
            if sub is not None:
                sub.silence(prev, tick)
                out += self.drain(pubend, sub, now)
        return out

    def on_recovered_here(self, msg: m.Recovered, now: float) -> list:
        sub = self.streams.get(msg.pubend)
        if sub is None or msg.lo > msg.hi or msg.hi > sub.top:
            return []  # nothing asked for here, or an answer past anything heard of
        match = self.subscriptions.profiles.match
        wanted = [
            (it.tick, it)
            for it in msg.items
            if msg.lo <= it.tick <= msg.hi and match(it.event.attributes)
        ]
        sub.recovered(msg.lo, msg.hi, wanted, now)
        self.counters["recovered"] += len(wanted)
        if msg.lost:
            self.counters["lost"] += msg.hi - msg.lo + 1
            text = (
                f"{msg.pubend} ticks {msg.lo}..{msg.hi} are lost: that pubend's log no longer "
                "holds them (its broker restarted with a log in memory, or its bound dropped them)"
            )
            return [
                Notice("warning", text),
                *self.drain(msg.pubend, sub, now),
            ]
        return self.drain(msg.pubend, sub, now)

    def nack_round(self, now: float) -> list:
        """A nack towards the pubend's broker for each subend whose gap came due."""
        out: list = []
        for pubend in sorted(self._doubtful):
            sub = self.streams[pubend]
            if sub.next_nack == float("inf"):
                self._doubtful.discard(pubend)
            elif now >= sub.next_nack:
                ranges = sub.nack(now)
                if ranges:
                    self.counters["nacks_sent"] += 1
                    broker = pubend.partition("~")[0]
                    out += self.unicast.relay(
                        broker, [], 0, lambda h, d, p=pubend, r=ranges: m.Nack(p, self.id, r, h, d)
                    )
        return out

    def nack_deadline(self) -> float:
        deadline = float("inf")
        subends = self.streams
        for pubend in self._doubtful:
            nack = subends[pubend].next_nack
            if nack < deadline:
                deadline = nack
        return deadline
