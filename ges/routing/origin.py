"""The origin side: this broker's own profile, sent to its keepers until each has it (seed 004 §3.2).

Theory of operation
-------------------
The broker's local subscriptions enter an :class:`~ges.routing.export.Exporter`, which keeps the
aggregated (covering-reduced) set of conjunctions the rest of the system must know; each export
or retraction is a ``ProfileChange`` sent to the keepers of the broker's cluster. Keepers
acknowledge adds and removals; the :class:`~ges.routing.acks.AckBook` says what each change is
still owed, and a subscription's ``SubAck`` waits on a ticket until every reachable keeper has
it (with reliable delivery, every keeper, until it is given up after ``MAX_RESENDS``). Messages
are lost when a link drops or a keeper restarts, so the origin is the authority for its own
profile: whenever the route to one of its keepers changes, or a link of that keeper comes up,
it sends that keeper a *sync* — its complete live set — plus its live adds; a keeper that owes
acks for ``RESEND_AFTER`` seconds gets a sync again, waiting twice as long each time up to
``RESEND_MAX``. A keeper that finds this broker's profile behind an event's V_m asks for a sync
(``ProfileWant``; seed 000 §4).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple

from ges.matching.model import Conjunction, conjunction_to_wire
from ges.routing.acks import PENDING, REMOVING, WAIVED, AckBook, Ticket
from ges.routing.base import (
    MAX_REPLACED,
    MAX_RESENDS,
    MAX_TICKS_PER_ACK,
    RESEND_AFTER,
    RESEND_MAX,
    SYNC,
    RouterPart,
)
from ges.routing.export import ADD, REMOVE, Exporter
from ges.topology import broker_order_key
from ges.wire import messages as m


class Resend(NamedTuple):
    """When to look again at a keeper that owes this broker acknowledgements."""

    due: float
    #: the wait before this look (doubling from RESEND_AFTER up to RESEND_MAX)
    wait: float
    #: resends so far
    tries: int


class OriginProfiles(RouterPart):
    """This broker's own profile: exports, what keepers owe, resends and syncs."""

    def __init__(self, router):
        super().__init__(router)
        self.exporter = Exporter()
        #: the acknowledgements this broker's changes are owed, and the subscriptions waiting
        #: on them (:mod:`ges.routing.acks`)
        self.book = AckBook()
        #: reliable delivery: an add is owed by *every* keeper, reachable or not, until it acks
        #: or is given up after MAX_RESENDS rounds (the subscription starts only then). A
        #: keeper this broker cannot reach may still be reached by publishers and route with
        #: the old profile — and a view from outside a unit cannot see it split, so that keeper
        #: may take this broker for reachable and synced.
        self.wait_for_all = False
        self.starts: dict[int, dict[str, int]] = {}
        #: keepers given up and not heard from since: what they owe is waived, not pending
        self._silent: set[str] = set()
        #: an add removed, still unacknowledged, because a new one covers it: seq -> the new
        #: adds (a subscription waiting for the old one waits for these instead; bounded)
        self._replaced: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        #: when each seq in pending or _removing was first sent
        self._sent_at: dict[int, float] = {}
        #: keeper -> when to look again, while it owes acks
        self._retry: dict[str, Resend] = {}
        self._keepers = self.h.all_keepers(self.id)
        #: keeper -> when a ProfileWant last made this broker send it a sync
        self._wanted: dict[str, float] = {}

    @property
    def pending(self) -> dict[int, set[str]]:
        """Adds of this broker not yet acknowledged: seq -> keepers still to ack."""
        return self.book.tables[PENDING]

    @property
    def waived(self) -> dict[int, set[str]]:
        """wait_for_all: adds a keeper was given up on before it acknowledged them (seq ->
        keepers); it is still sent a sync every RESEND_MAX seconds until it does, and only
        then is the subscription complete."""
        return self.book.tables[WAIVED]

    @property
    def _removing(self) -> dict[int, set[str]]:
        """Removals of this broker not yet acknowledged: seq -> keepers still to ack."""
        return self.book.tables[REMOVING]

    def local_change(
        self, add: Iterable[Conjunction], remove: Iterable[Conjunction], now: float
    ) -> tuple[list, frozenset[int]]:
        """Local conjunctions added and removed at time ``now`` (adds first, so a replaced
        profile never leaves a gap upstream). Returns the sends and the seqs of adds to wait for
        acks on. A removal may leave work for :meth:`background`."""
        exporter = self.exporter
        ops: list[tuple[int, int, Conjunction]] = []
        add = list(add)
        for conj in add:
            ops += exporter.add(conj)
        for conj in remove:
            ops += exporter.remove(conj)
        # an add that an exported conjunction covers starts where that one started, and waits
        # for its acks if still owed
        waits = {seq for seq in map(exporter.seq_for, add) if seq is not None}
        return self._exported(ops, waits, now)

    @property
    def busy(self) -> bool:
        """A removal still has conjunctions to export again, or a closed ticket registrations
        to take out (:meth:`background`)."""
        return self.exporter.pending or self.book.busy

    def background(self, now: float, budget: int) -> list:
        """About ``budget`` work of what removals left (:meth:`Exporter.step`) and of closing
        large tickets (:meth:`AckBook.step`): the sends."""
        budget -= self.book.step(budget)
        if budget <= 0 or not self.exporter.pending:
            return []
        sends, _ = self._exported(self.exporter.step(budget), set(), now)
        return sends

    def _exported(self, ops: list, waits: set[int], now: float) -> tuple[list, frozenset[int]]:
        """Tell the keepers about the exporter's ``ops``; ``waits`` grows by the adds to wait
        for."""
        if not ops:
            return [], frozenset(waits)
        # the adds go first: the changes may go in several messages, and a keeper routes
        # events between them — a covering add must be in before what it replaces goes
        ops = sorted(ops, key=lambda op: op[0] != ADD)
        changes = [
            m.ProfileChange(self.id, self.inc, seq, op, conjunction_to_wire(conj))
            for op, seq, conj in ops
        ]
        if self.keeper.placements(self.id):  # this broker keeps a unit around itself
            self.keeper.incs[self.id] = self.inc
            for op, seq, conj in ops:
                if op == ADD:
                    self.keeper.apply_add(self.id, self.inc, seq, conj)
                else:
                    self.keeper.apply_remove(self.id, self.inc, seq)
            self.keeper.advance(self.id)
        expect = {k for k in self._keepers if self.paths.path_to(k) is not None}
        owe = set(self._keepers) if self.wait_for_all else expect
        book = self.book
        for op, seq, _ in ops:
            if op == ADD:
                if owe:
                    book.owe(PENDING, seq, sorted(owe - self._silent))
                    book.owe(WAIVED, seq, sorted(owe & self._silent))
                    waits.add(seq)
            else:
                replaced = self.exporter.replaced.pop(seq, ())
                if (seq in self.pending or seq in self.waived) and replaced:
                    self._replaced[seq] = replaced
                    if len(self._replaced) > MAX_REPLACED:
                        self._replaced.popitem(last=False)
                    book.replace(seq, self.waited(replaced))
                book.drop(PENDING, seq)
                book.drop(WAIVED, seq)
                self.starts.pop(seq, None)
                if expect:
                    book.owe(REMOVING, seq, sorted(expect))
            if expect:
                self._sent_at[seq] = now
            else:
                self._sent_at.pop(seq, None)
        for k in owe if any(op == ADD for op, _, _ in ops) else expect:
            # an unreachable keeper too: its rounds count towards giving it up
            self._retry.setdefault(k, Resend(now + RESEND_AFTER, RESEND_AFTER, 0))
        targets = self.h.next_targets(self.id, self.id)
        return self.paths.send(targets, changes), frozenset(waits)

    def waited(self, seqs: Iterable[int]) -> set[int]:
        """The adds that subscriptions waiting for ``seqs`` wait for now: each one replaced by
        a covering add stands for that add's seqs."""
        out: set[int] = set()
        todo = list(seqs)
        while todo:
            seq = todo.pop()
            if seq in out:
                continue
            out.add(seq)
            todo += self._replaced.get(seq, ())
        return out

    def ticket(self, seqs: Iterable[int]) -> Ticket:
        """A :class:`Ticket` for a subscription waiting on the adds ``seqs`` (and those that
        replaced them): which keepers still owe it, kept up to date. Close it with
        :meth:`AckBook.close` when the subscription no longer waits."""
        return self.book.ticket(self.waited(seqs))

    def acked(self, seqs: Iterable[int]) -> bool:
        return not any(s in self.pending for s in self.waited(seqs))

    def clock(self) -> tuple[int, int]:
        """This broker's virtual clock (seed 000 §3.3): its newest exported add."""
        return self.inc, self.exporter.last_seq

    def on_ack(self, msg: m.ProfileAck) -> list:
        if msg.origin not in self.h.topology.brokers:
            raise ValueError(f"profile ack for unknown broker {msg.origin!r}")
        relayed = self.paths.to_origin(
            msg,
            lambda hops, detour: m.ProfileAck(
                msg.origin, msg.keeper, msg.inc, msg.seqs, hops, msg.removed, detour, msg.ticks
            ),
        )
        if relayed is not None:
            return relayed
        if msg.inc == self.inc:
            keeper = msg.keeper
            if msg.ticks:
                for seq in msg.seqs:
                    if seq in self.pending or seq in self.waived or seq in self.starts:
                        got = self.starts.setdefault(seq, {})
                        for pubend, tick in msg.ticks[:MAX_TICKS_PER_ACK]:
                            if got.get(pubend, 0) < tick:
                                got[pubend] = tick
            for which, seqs in (
                (PENDING, msg.seqs),
                (WAIVED, msg.seqs),
                (REMOVING, msg.removed),
            ):
                for seq in seqs:
                    self._settle(which, seq, keeper)
            self._silent.discard(keeper)  # heard from again: waited for like any other
            if keeper in self._retry and not self.book.owes(keeper):
                del self._retry[keeper]
        return []

    def _settle(self, which: int, seq: int, keeper: str) -> None:
        """``keeper`` owes nothing more for ``seq`` in table ``which`` (PENDING, WAIVED or
        REMOVING)."""
        last = self.book.settle(which, seq, keeper)
        if last and seq not in self.pending and seq not in self._removing:
            self._sent_at.pop(seq, None)

    def _waive(self, keeper: str, now: float) -> None:
        """wait_for_all: stop holding subscriptions back for ``keeper`` (it has not acknowledged
        through MAX_RESENDS rounds); its adds stay owed (:attr:`waived`) and it is sent a sync
        every RESEND_MAX seconds until it acknowledges them."""
        book = self.book
        for seq in sorted(book.seqs_of(PENDING, keeper)):
            book.owe(WAIVED, seq, (keeper,))
            self._settle(PENDING, seq, keeper)
        for seq in sorted(book.seqs_of(REMOVING, keeper)):
            self._settle(REMOVING, seq, keeper)
        self._retry[keeper] = Resend(now + RESEND_MAX, RESEND_MAX, MAX_RESENDS)
        self._silent.add(keeper)

    def connectivity_changed(
        self, up_ends: Iterable[str], now: float, *, downs: bool = True
    ) -> list:
        """The connectivity graph changed: forget cached hops and send a sync to every keeper of
        this broker's profile whose route changed or that has a link just up. ``downs``: some
        link or node went down (only then can a broker have become unreachable)."""
        self.paths.hops.clear()
        self.paths.unit_hops.clear()
        self.paths.nearest.clear()
        self.keeper.complete.clear()
        self.keeper.unsynced.clear()
        self.paths.detours.clear()
        # a broker this one cannot reach must sync again before its units count as complete
        # (when a partition heals, events flood its units until its sync arrives)
        if downs:
            for b in [
                b for b in self.keeper.synced if b != self.id and self.paths.path_to(b) is None
            ]:
                self.keeper.synced.discard(b)
        up = set(up_ends)
        targets = []
        for k in sorted(self._keepers, key=broker_order_key):
            hop = self.paths.path_to(k)
            if hop is None:
                if self.wait_for_all:  # unreachable: its adds stay owed until it gives up
                    if self.book.owes(k):
                        self._retry.setdefault(k, Resend(now + RESEND_AFTER, RESEND_AFTER, 0))
                else:
                    self._forget_keeper(k)  # unreachable: do not wait for it
            elif hop != self.paths.sync_hops.get(k) or k in up:
                targets.append(k)
            self.paths.sync_hops[k] = hop
        return self._resync(targets, now)

    def _resync(self, keepers: list[str], now: float) -> list:
        """Send ``keepers`` a sync and expect their acks for every live add."""
        if not keepers:
            return []
        live = self.exporter.exported.values()
        silent = self._silent.intersection(keepers)
        heard = set(keepers) - silent
        book = self.book
        heard_keepers, silent_keepers = sorted(heard), sorted(silent)
        for seq in live:
            book.owe(PENDING, seq, heard_keepers)
            book.owe(WAIVED, seq, silent_keepers)
            self._sent_at.setdefault(seq, now)
        for k in keepers:
            self._retry.setdefault(k, Resend(now + RESEND_AFTER, RESEND_AFTER, 0))
        return self.paths.send(keepers, self._resync_changes(), resend=True)

    def _forget_keeper(self, keeper: str) -> None:
        """Stop waiting for ``keeper`` (unreachable, or silent too long): what it owes is
        settled; it gets a sync when a route to it appears."""
        for which in (PENDING, REMOVING):
            for seq in sorted(self.book.seqs_of(which, keeper)):
                self._settle(which, seq, keeper)
        self._retry.pop(keeper, None)

    def on_timer(self, now: float) -> tuple[list, list[str]]:
        """Send a sync to every keeper that owes an ack for a change sent ``wait`` ago; returns
        the sends and the keepers given up now (the core logs them)."""
        targets = []
        given_up: list[str] = []
        for k, (due, wait, tries) in list(self._retry.items()):
            if due > now:
                continue
            owed = self.book.owed_by(k)
            if not owed:
                del self._retry[k]
            elif self.wait_for_all and tries >= MAX_RESENDS:
                if self.book.seqs_of(PENDING, k):
                    self.counters["keepers_given_up"] += 1
                    self._waive(k, now)
                    given_up.append(k)
                else:
                    self._retry[k] = Resend(now + RESEND_MAX, RESEND_MAX, tries)
                if self.paths.path_to(k) is not None:
                    targets.append(k)  # it may be alive and out of date: try it again
            elif tries >= MAX_RESENDS or (self.paths.path_to(k) is None and not self.wait_for_all):
                self.counters["keepers_given_up"] += tries >= MAX_RESENDS
                self._forget_keeper(k)
            elif self.paths.path_to(k) is None:
                # wait_for_all: an unreachable keeper is waited for through the same rounds as
                # a silent one (about two minutes), then given up — a subscription must start
                # even when a keeper is gone for good
                wait = min(2 * wait, RESEND_MAX)
                self._retry[k] = Resend(now + wait, wait, tries + 1)
            else:
                oldest = min(self._sent_at.get(s, now) for s in owed)
                if oldest + wait > now:  # acks are coming in; only recent changes are owed
                    self._retry[k] = Resend(oldest + wait, wait, tries)
                    continue
                wait = min(2 * wait, RESEND_MAX)
                self._retry[k] = Resend(now + wait, wait, tries + 1)
                targets.append(k)
        self.counters["resyncs"] += len(targets)
        return self._resync(sorted(targets, key=broker_order_key), now), given_up

    def next_deadline(self) -> float:
        return min((r.due for r in self._retry.values()), default=float("inf"))

    def _resync_changes(self) -> list[m.ProfileChange]:
        """This broker's complete profile: every live add, then every removal still to be
        acknowledged, then the sync that retires the rest. In that order, because the changes
        may go in several messages and a keeper routes events between them: what is wanted is
        in before anything it replaces goes."""
        live = self.exporter.exported
        out = [
            m.ProfileChange(self.id, self.inc, seq, ADD, conjunction_to_wire(conj))
            for conj, seq in live.items()
        ]
        out += [m.ProfileChange(self.id, self.inc, seq, REMOVE) for seq in self._removing]
        out.append(
            m.ProfileChange(
                self.id, self.inc, self.exporter.last_seq, SYNC, seqs=sorted(live.values())
            )
        )
        return out

    def on_want(self, msg: m.ProfileWant, now: float) -> list:
        """Relay a :class:`ProfileWant` towards its origin; at the origin, send the keeper a
        sync (at most once per RESEND_AFTER)."""
        brokers = self.h.topology.brokers
        if msg.origin not in brokers or msg.keeper not in brokers:
            raise ValueError("profile want names an unknown broker")
        relayed = self.paths.to_origin(
            msg, lambda hops, detour: m.ProfileWant(msg.origin, msg.keeper, hops, detour)
        )
        if relayed is not None:
            return relayed
        keeper = msg.keeper
        if keeper not in self._keepers or now < self._wanted.get(keeper, -RESEND_AFTER) + (
            RESEND_AFTER
        ):
            return []
        self._wanted[keeper] = now
        self.counters["resyncs"] += 1
        return self._resync([keeper], now)
