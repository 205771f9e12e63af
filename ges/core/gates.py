"""Delivery starts: where each subscription's delivery begins on each stream (seed 000 §3–5).

Theory of operation
-------------------
With reliable delivery a new or changed subscription delivers nothing new until its starting
point on each pubend is known, level by level: a *level* ``i`` is the set of pubends whose
events reach this broker through the keepers of its units up to ``chain[i - 1]`` (0: its own
pubend). Once every deciding keeper of a level has the profile, each pubend of that level
starts after the last tick any of them had routed before applying it, after anything this
broker routed as a keeper, and after what its subend already knows — every later tick is
routed with the subscription in place. A keeper given up before it acknowledged routes with an
old profile: there each pubend starts only at the first frame whose V_m has this broker's clock
at the subscription's vst (seed 000 §3.6), from where that keeper floods. A changing
subscription goes on getting what its old profiles all match until the new one's starting
point. A gate is dropped once every level is open and the streams are past it. The log
release rounds ask this part how far the broker may acknowledge a pubend (:meth:`Gates.needed`).
"""

from __future__ import annotations

import attrs

from ges.core.part import Part
from ges.core.work import JobBody, indexed
from ges.matching.model import (
    Profile,
)
from ges.reliable.log import epoch_of
from ges.routing.acks import Ticket
from ges.wire import messages as m

#: Epochs of one broker's pubend a subscription waiting for its V_m start keeps started on
#: (a restarted pubend's older epoch may still have ticks on their way; the oldest goes).
MAX_STARTED_EPOCHS = 4


@attrs.define(eq=False)
class Gate:
    """Where one subscription's delivery starts, for as long as it does not deliver from the
    start of every stream (reliable delivery): made when it is subscribed or changed, dropped
    when every level is open and the streams are past it, or when it goes."""

    #: per *level* (see :meth:`Gates.level`) None until the starting point of its pubends is
    #: known, then {pubend: last tick not for it}
    levels: list[dict[str, int] | None]
    #: a started subscription whose profile is changing: (the profiles it had, the old
    #: starting point still ahead, the levels it had started on). Until the new profile's
    #: starting point, and up to it, it gets the events every one of them matches (such an
    #: event is routed to it whichever profile a keeper holds while the change spreads). Each
    #: profile but the last comes with the starting point of the one that replaced it, per
    #: level (None: not known then): above it, it is not needed any more.
    changing: tuple[tuple, dict[str, int], set] | None = None
    #: changing, where its old profile had a level waiting for its V_m start: {level: the
    #: pubends it had started on there}
    vchanging: dict[int, frozenset[str]] | None = None
    #: levels started where a keeper was given up before it had the profile: {level: (vst,
    #: {broker: the pubends started on, oldest epoch first})} — a broker's new epoch starts
    #: while its older one's last ticks may still be on their way (at most
    #: :data:`MAX_STARTED_EPOCHS` a broker: the oldest goes)
    vm: dict[int, tuple[tuple[int, int], dict[str, list[str]]]] | None = None


class Gates(Part):
    """Per subscription, per level, where delivery starts; and the changes in progress."""

    def __init__(self, core):
        super().__init__(core)
        #: subscriptions not delivering from the start of every stream: (conn, sub_id) -> gate
        self.gate: dict[tuple[int, int], Gate] = {}
        #: the gates waiting for a V_m start on some level (their ``vm`` is set)
        self.vm_waiting: dict[tuple[int, int], Gate] = {}
        #: pubend's broker -> its level here (cached)
        self._levels: dict[str, int] = {}
        #: this broker's units, its cluster first; per level the keepers that decide whether
        #: that level's pubends reach it
        self.chain: tuple = ()
        self._deciders: list[frozenset[str]] = [frozenset()]
        if self.router is not None and self.reliable:
            h = self.router.h
            self.chain = h.chain(self.id)
            self._deciders += [
                frozenset(k for u in self.chain[:i] for k in h.keepers[u]) - {self.id}
                for i in range(1, len(self.chain) + 1)
            ]

    def vm_observe(self, pubend: str, digest: int) -> None:
        """A frame of ``pubend`` stamped with ``digest`` arrived: a subscription waiting for its
        V_m start on this pubend starts at the first tick stamped with this broker's clock
        once that clock is at its vst (seed 000 §3.6) — never below what this broker already
        knows or has promised of the pubend. Ticks between that one and this frame that were
        lost are asked for like any other."""
        got = self.vt.lower(pubend, digest, self.id)
        if got is None:
            return
        clock, since = got
        level = self.level(pubend)
        floor = since - 1
        broker = pubend.partition("~")[0]
        if broker not in self.topology.brokers:
            return
        sub = self.subends.streams.get(pubend)
        if sub is not None:
            floor = max(floor, sub.stream.known_to)
        floor = max(floor, self.release.promised(pubend))
        for g in self.vm_waiting.values():
            waiting = g.vm.get(level)
            if waiting is None or clock < waiting[0]:
                continue
            started = waiting[1].setdefault(broker, [])
            if pubend in started:
                continue
            started.append(pubend)
            started.sort(key=epoch_of)
            del started[:-MAX_STARTED_EPOCHS]
            start = g.levels[level]
            at = max(floor, start.get(pubend, 0))
            if at > 0:
                start[pubend] = at

    def _held_back(self, dest: tuple[int, int], level: int, pubend: str) -> bool:
        """``dest`` waits for its V_m start on ``pubend`` (see :attr:`Gate.vm`)."""
        g = self.vm_waiting.get(dest)
        if g is None:
            return False
        waiting = g.vm.get(level)
        return waiting is not None and pubend not in waiting[1].get(pubend.partition("~")[0], ())

    def open(self, dest: tuple[int, int], change: tuple | None = None) -> None:
        """A new gate for ``dest``, just subscribed or changed (``change``: what
        :meth:`change` returned): nothing new is delivered until its starting points are
        known."""
        self.vm_waiting.pop(dest, None)
        changing, vchanging = change or (None, None)
        self.gate[dest] = Gate([None] * (len(self.chain) + 1), changing, vchanging)

    def drop(self, dest: tuple[int, int]) -> None:
        """``dest`` went: its gate with it."""
        self.gate.pop(dest, None)
        self.vm_waiting.pop(dest, None)

    def change(self, dest: tuple[int, int], profile: Profile) -> JobBody:
        """``dest``'s profile is replaced: it goes on getting what the old one (and any before
        it still changing) matches too, unless it had not started. A large old profile is
        indexed first (in slices), so that testing an event against it costs a match, not a
        test of every conjunction. Returns the ``(changing, vchanging)`` its next gate opens
        with (:meth:`open`)."""
        old = yield from indexed(profile, self.work_slice, self.config.index_old_profiles)
        g = self.gate.get(dest)
        changing = None if g is None else g.changing
        levels = None if g is None else g.levels
        # on a level waiting for its V_m start, ``old`` started only on the pubends whose V_m
        # start came (:attr:`Gate.vchanging`); where it is not known, its replaced profile is
        # needed without a limit
        vgate = (None if g is None else g.vm) or {}
        held = {i: frozenset(p for ps in w[1].values() for p in ps) for i, w in vgate.items()}
        if changing is not None:
            # the profile before ``old`` is needed only up to where ``old`` started; the newest
            # config.max_changing profiles are kept (beyond that, what the oldest matched is no longer
            # held back)
            *earlier, (last, _) = changing[0]
            upto = [
                None if start is None or i in held else dict(start)
                for i, start in enumerate(levels)
            ]
            olds = (*earlier, (last, upto), (old, None))[-self.config.max_changing :]
            # where ``old`` started and the ones before it had not, it goes on from its start
            ahead, started = dict(changing[1]), set(changing[2])
            vchanging = dict(g.vchanging or {})
            for i, start in enumerate(levels):
                if start is not None and i not in started:
                    started.add(i)
                    ahead.update(start)
                    if i in held:
                        vchanging[i] = held[i]
            return (olds, ahead, started), vchanging or None
        if levels is None:  # it had started everywhere
            return (((old, None),), {}, set(range(len(self.chain) + 1))), None
        started = {i for i, start in enumerate(levels) if start is not None}
        if started:
            ahead = {p: t for i in started for p, t in levels[i].items()}
            vchanging = {i: p for i, p in held.items() if i in started}
            return (((old, None),), ahead, started), vchanging or None
        return None, None

    @staticmethod
    def _old_started(g: Gate, level: int, pubend: str) -> bool:
        """The profiles ``g``'s subscription is changing from had started on ``pubend`` (its
        level is among the started ones)."""
        held = g.vchanging
        return held is None or level not in held or pubend in held[level]

    def level(self, pubend: str) -> int:
        """Which keepers decide whether a pubend's events come here: the level ``i`` such that
        the keepers of this broker's units up to ``self.chain[i - 1]`` — the smallest unit
        holding the pubend's broker too — route them here (seed 004 §3.3); 0 for this broker's
        own pubends, which need no keeper."""
        broker = pubend.partition("~")[0]
        level = self._levels.get(broker)
        if level is None:
            chain = self.chain
            level = len(chain)
            if broker == self.id:
                level = 0
            elif broker in self.topology.brokers:
                contains = self.router.h.contains
                level = next(i + 1 for i, u in enumerate(chain) if contains(u, broker))
            if len(self._levels) < len(self.topology.brokers):
                self._levels[broker] = level
        return level

    def start(self, dest: tuple[int, int], ticket: Ticket) -> list:
        """Open a subscription's gate on every level whose deciding keepers all have its
        profile (reliable delivery): its pubends there start after the last tick any of its
        keepers had routed before applying it (their acks say), after anything this broker
        routed as a keeper, and after what its subend already knows — every later tick is
        routed with the subscription in place. Until then it gets nothing from them. So a
        subscription starts at once on its own broker's pubend, and on its cluster's pubends
        as soon as the cluster's keepers have it, even while a keeper further off is cut off.

        A keeper given up before it acknowledged (:meth:`ContentRouter._waive`) routes with
        an old profile: on its level each pubend starts only where its V_m has this broker's
        clock at the subscription's vst (seed 000 §3.6), from where that keeper fails the
        sufficiency test and floods. This broker's clock is flooded for it. Once the keeper
        acknowledges, the pubends not started yet start after its last tick too, as usual."""
        g = self.gate.get(dest)
        if g is None:
            return []
        levels = g.levels
        router = self.router
        vgate = g.vm
        start = None
        out: list = []
        for i, got in enumerate(levels):
            if got is not None:
                if vgate is not None and i in vgate and not ticket.waived_by(self._deciders[i]):
                    # the keeper came back with the profile: the rest start as usual
                    if start is None:
                        start = self._start_map(ticket)
                    started = {p for ps in vgate.pop(i)[1].values() for p in ps}
                    level = self.level
                    got.update(
                        (p, t) for p, t in start.items() if level(p) == i and p not in started
                    )
                continue
            if not ticket.settled(self._deciders[i]):
                continue
            if start is None:
                start = self._start_map(ticket)
            level = self.level
            levels[i] = {p: t for p, t in start.items() if level(p) == i}
            if ticket.waived_by(self._deciders[i]):
                vst = (router.inc, max(ticket.seqs))
                if vgate is None:
                    vgate = g.vm = {}
                    self.vm_waiting[dest] = g
                vgate[i] = (vst, {})
                if self.vt.table.get(self.id, (0, 0)) < vst:
                    out += self.subends.on_clocks(None, [(self.id, *router.clock())])
        if vgate is not None and not vgate:
            g.vm = None
            del self.vm_waiting[dest]
        self._gate_passed(dest, g)
        return out

    def pass_gates(self, pubend: str, floor: int) -> None:
        """Every tick of ``pubend`` up to ``floor`` is final at its subend (delivered or not
        wanted): starting points up to it are behind every subscription."""
        level = self.level(pubend)
        for dest, g in list(self.gate.items()):
            start = g.levels[level]
            if start is not None and start.get(pubend, floor + 1) <= floor:
                del start[pubend]
                if not start:
                    self._gate_passed(dest, g)

    def _gate_passed(self, dest: tuple[int, int], g: Gate) -> None:
        """Drop the gate once every level is open and past its starting point."""
        if g.vm is None and all(start is not None and not start for start in g.levels):
            del self.gate[dest]

    def _start_map(self, ticket: Ticket) -> dict[str, int]:
        """Every pubend's starting point for a subscription waiting on ``ticket`` (its own
        adds, or the covering ones), as of now."""
        start: dict[str, int] = {}
        starts = self.router.starts
        for seq in ticket.seqs:
            for pubend, tick in starts.get(seq, {}).items():
                if start.get(pubend, 0) < tick:
                    start[pubend] = tick
        for pubend, tick in self.claims.latest():
            if start.get(pubend, 0) < tick:
                start[pubend] = tick
        for pubend, sub in self.subends.streams.items():
            known = sub.stream.known_to
            if start.get(pubend, 0) < known:
                start[pubend] = known
        # this broker's own pubend: from its next event (local delivery needs no keeper)
        own = self.publishing.handed_on
        if own > 0:
            start[self.pubend] = max(start.get(self.pubend, 0), own)
        return start

    def start_floor(self, pubend: str) -> int | None:
        """The earliest starting point on ``pubend`` of a started subscription here (None:
        none has started on its level): 0 for one that started before this pubend was routed
        anywhere (it wants the whole stream)."""
        level = self.level(pubend)
        held = self._held_back
        started = [
            0 if g is None else g.levels[level].get(pubend, 0)
            for d in self._started_dests(level)
            if not held(d, level, pubend)
            for g in (self.gate.get(d),)
        ]
        # a changing subscription still gets what its old profiles match from their start
        started += [
            g.changing[1].get(pubend, 0)
            for g in self.gate.values()
            if g.changing is not None
            and level in g.changing[2]
            and self._old_started(g, level, pubend)
        ]
        return min(started) if started else None

    def _started_dests(self, level: int):
        """The subscriptions started on the pubends of ``level``."""
        gate = self.gate
        for conn, subs in self.subscriptions.clients.items():
            for sub_id in subs:
                dest = (conn, sub_id)
                if dest not in gate or gate[dest].levels[level] is not None:
                    yield dest

    def needed(self, pubend: str, tick: int) -> int | None:
        """How far this broker acknowledges ``pubend``'s ticks when asked about those up to
        ``tick``; None while a subscription here waits for its starting point on the
        pubend's level (it may need ticks from before the answer)."""
        if self.replicator is not None:  # nothing above what durable sessions have stored
            floor = self.replicator.floor(pubend)
            if floor is not None:
                tick = min(tick, floor)
        if (
            not self.subscriptions.profiles
        ):  # no subscription here: a later one starts after the answer
            return tick
        level = self.level(pubend)
        if any(g.levels[level] is None for g in self.gate.values()):
            return None
        sub = self.subends.streams.get(pubend)
        if sub is not None:
            return min(tick, sub.stream.floor)
        start = self.start_floor(pubend)
        return tick if start is None else min(tick, start)

    def filter_gated(self, pubend: str, per: dict) -> None:
        """Drop what gated subscriptions must not get: everything before their starting point
        is known, and the ticks of ``pubend`` up to it after — except, for a changing one, the
        events its old profile matches too."""
        gate = self.gate
        level = self.level(pubend)
        vgate = self.vm_waiting
        for dest in [d for d in per if d in gate]:
            g = gate[dest]
            start = g.levels[level]
            if vgate and self._held_back(dest, level, pubend):
                start = None  # not started on this pubend yet
            first = None if start is None else start.get(pubend)
            if start is not None and first is None:
                continue
            was = g.changing
            if was is not None and (level not in was[2] or not self._old_started(g, level, pubend)):
                was = None  # the old profile had not started here either
            if first is None:
                items = [] if was is None else per[dest]
                first = float("inf")
            else:
                items = per[dest]
            if was is None:
                items = [it for it in items if it.tick > first]
            else:
                olds, before, _ = was
                floor = before.get(pubend, 0)
                items = [
                    it
                    for it in items
                    if it.tick > first or (it.tick > floor and _old_match(olds, level, pubend, it))
                ]
            if start is not None and items and items[-1].tick > first:
                del start[pubend]  # the stream is past it
                if not start:
                    self._gate_passed(dest, g)
            if items:
                per[dest] = items
            else:
                del per[dest]


def _old_match(olds: tuple, level: int, pubend: str, it: m.EventItem) -> bool:
    """A changing subscription's old profiles all match ``it`` — each where it is still needed
    (up to the starting point of the profile that replaced it, when that was known)."""
    attributes = it.event.attributes
    for profile, upto in olds:
        if upto is not None:
            start = upto[level]
            if start is not None and it.tick > start.get(pubend, 0):
                continue
        if not profile.matches(attributes):
            return False
    return True
