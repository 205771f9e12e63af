"""A restarted replicator reads back what it missed (seed 004 §4: a replicator that fails
recovers from the pubends' logs, which keep what it has not acknowledged).

Part of :class:`ges.core.replicator.Replicator`, whose state it uses: once the restored
sessions' subscriptions are in place, every pubend known here is read back from its log after
what the store holds, up to the log's last commit — past every tick a subscription's starting
point can be — with a replay nack only the log answers; others as they are heard of. (The
retained messages read the logs back on their own: ges.core.retaining.) Live
events of a pubend being read back wait until it is done, and this broker acknowledges no
tick of it above what was stored meanwhile.
"""

from __future__ import annotations

import attrs

from ges.reliable.log import NO_END, epoch_of
from ges.wire import messages as m
from ges.wire.messages import held_size

#: Seconds before a replay request with no answer is sent again.
REPLAY_RESEND = 1.0
#: Pages of its own pubend's log a replicator reads at once, at most, and the events after
#: which it stops (the rest at its next timer): eight pages of 512 held a broker's event loop
#: about 40 ms a step, and a retained catch-up reading a burst back stalled its deliveries
#: (p99 70 ms at 1,000/s: bench/README.md, websocket.py).
LOCAL_PAGES = 8
LOCAL_EVENTS = 512
#: Bytes of live events one recovering pubend holds back until its replay is done (beyond,
#: they are let go: the replay reads them from the pubend's log too).
MAX_HELD_BYTES = 16 * 1024 * 1024
#: "up to the last committed tick", in a replay request (an old epoch's log answers up to it,
#: which is why the two are one number)
ALL_TICKS = NO_END
#: Seconds between two looks for pubends heard of and not read back yet (after a restart;
#: the retained catch-up looks as often: ges.core.retaining).
LOOK_EVERY = 1.0


@attrs.define(eq=False)
class Replay:
    """A pubend whose events a restarted replicator reads back from the pubend's log: the tick
    asked for next, when, the live events held back meanwhile, and the highest tick let go."""

    next: int
    asked: float | None = None
    held: list = attrs.Factory(list)
    held_bytes: int = 0
    let_go: int = 0


class ReadBack:
    """The read-back half of :class:`ges.core.replicator.Replicator`."""

    def _horizon(self, pubend: str) -> int:
        """The tick of ``pubend`` up to which everything the sessions want is stored: what was
        stored, or what was let go of it (:meth:`_let_go`)."""
        return max(self._top.get(pubend, 0), self._let_go(pubend))

    def _let_go(self, pubend: str) -> int:
        """The tick of ``pubend`` up to which this broker needs nothing more: what it
        acknowledged to the release rounds (never above what was stored or kept —
        :meth:`floor`), or, of its own pubend, what its log released (which the same needs
        pin)."""
        done = self.release.promised(pubend) if self.release is not None else 0
        if self.log is not None and self._local(pubend):
            done = max(done, self.log.released(epoch_of(pubend)))
        return done

    def _reads_back(self, live, pubend: str, tick: int) -> bool:
        """Whether ``tick`` of ``pubend``, read back, is stored for session ``live``: not if it
        came from elsewhere (its floors), or the session is being handed over here and reads
        this pubend itself, or will (ges.core.taking). A pubend its hand-over does not read
        is read back for it, and its watch for new publishers leaves that one alone: read by
        both, from floors of their own, its events were stored twice."""
        state = live.state
        if state.floors and tick <= state.floors.get(pubend, 0):
            return False
        h = state.handover
        hand = self._hands.get(state.name)
        # taken here, its subscriptions all in (its hand watches on a while once it is served)
        if hand is not None and hand.replays is not None and (h is None or h["dir"] == "in"):
            if pubend in hand.replays:
                return False
            hand.seen.add(pubend)
            return True
        return h is None or h["dir"] != "in" or h["phase"] != "taking"

    def _local(self, pubend: str) -> bool:
        """A pubend of this broker (its log is read here, not asked with a nack)."""
        return pubend.partition("~")[0] == self.id

    def _begin(self, pubend: str) -> Replay:
        rp = self._replays.get(pubend)
        if rp is None:
            rp = self._replays[pubend] = Replay(self._horizon(pubend) + 1)
        return rp

    def _replay_all(self, now: float) -> list:
        """The restored subscriptions are all in place: every pubend known here is read back
        from its log after what was stored — up to its last commit, past every tick a
        subscription's starting point can be — and others as they are heard of: at their
        first event, or at the next look (:meth:`_replay_new`)."""
        for pubend in sorted(self._known_pubends()):
            self._begin(pubend)
        out: list = []
        for pubend, rp in sorted(self._replays.items()):
            out += self._ask(pubend, rp, now)
        self._look_due = now + LOOK_EVERY
        return out

    def _replay_new(self, now: float) -> list:
        """Each LOOK_EVERY after a restart, the pubends heard of since and neither read back
        nor being read are read too. Waiting for an event of each would wait for good for an
        earlier epoch of a restarted publisher, which has no more: only its end is announced
        (the simulator found a restarted replicator whose sessions never had the last
        events a publisher logged before it restarted)."""
        self._look_due = now + LOOK_EVERY
        out: list = []
        for pubend in self._unread(self._live | set(self._replays)):
            out += self._ask(pubend, self._begin(pubend), now)
        return out

    def _unread(self, read: set[str]) -> list[str]:
        """The pubends known here and not in ``read``, in order."""
        return sorted(self._known_pubends() - read)

    def _known_pubends(self) -> set[str]:
        """The pubends known here: stored from, heard from, or acknowledged to — and this
        broker's own earlier epochs that its log still holds (no subend follows those)."""
        known = set(self._top) | set(self.subends.streams)
        if self.log is not None:
            known |= set(self.log.promised())
            known |= {f"{self.id}~{epoch}" for epoch, _ in self.log.earlier}
        return known

    @staticmethod
    def _asks_due(replays: dict, now: float, ask) -> list:
        """The asks of ``replays`` (pubend -> Replay) not made yet or unanswered for
        REPLAY_RESEND, made again with ``ask(pubend, rp, now)``."""
        out: list = []
        for pubend, rp in sorted(replays.items()):
            if rp.asked is None or now >= rp.asked + REPLAY_RESEND:
                out += ask(pubend, rp, now)
        return out

    @staticmethod
    def _asks_deadline(replays: dict) -> float:
        """When the first of ``replays``' asks comes due again (inf: none is in progress)."""
        return min(
            ((rp.asked or 0.0) + REPLAY_RESEND for rp in replays.values()), default=float("inf")
        )

    def _ask(self, pubend: str, rp: Replay, now: float) -> list:
        return self._ask_log(pubend, rp, now, lambda a: self._read_back(rp, a, now))

    def _ask_log(self, pubend: str, rp: Replay, now: float, page) -> list:
        """Ask ``pubend``'s log for everything from ``rp.next`` on, up to its last commit: a
        replay nack to the pubend's broker, or — a pubend of this broker — its own log read
        here, a few pages at a time (``page(answer)`` takes each: its outputs, and whether
        there is more; the rest at the next timer)."""
        rp.asked = now
        if not self._local(pubend):
            ranges = [(rp.next, ALL_TICKS)]
            return self.unicast.relay(
                pubend.partition("~")[0],
                [],
                0,
                lambda h, d: m.Nack(pubend, self.id, ranges, h, d, replay=True),
            )
        if self.repair is None:
            return []
        out: list = []
        read = 0
        for _ in range(LOCAL_PAGES):
            more = False
            for a in self.repair.from_log(
                m.Nack(pubend, self.id, [(rp.next, ALL_TICKS)], replay=True)
            ):
                got, more = page(a)
                out += got
                read += len(a.items)
            if not more:
                return out
            if read >= LOCAL_EVENTS:
                break
        rp.asked = now - REPLAY_RESEND  # the rest at the next timer
        return out

    def _hold(self, pubend: str, matched: list) -> list:
        """Live events of a pubend being read back: held until it is done."""
        rp = self._begin(pubend)
        size = sum(held_size(it) for _, items in matched for it in items)
        if rp.held_bytes + size > MAX_HELD_BYTES:  # let go: the replay reads them too
            ticks = [it.tick for h in [*rp.held, matched] for _, items in h for it in items]
            rp.let_go = max(rp.let_go, *ticks)
            rp.held, rp.held_bytes = [], 0
            return []
        rp.held.append(matched)
        rp.held_bytes += size
        if rp.asked is None and not self._restoring:
            return self._ask(pubend, rp, self.subscriptions.now)
        return []

    def replayed(self, msg: m.Recovered, now: float) -> list:
        """A page of a pubend's log read back: stored for the sessions its events match (a
        range the log no longer holds is a gap notice for every session)."""
        taking: list = []
        if self._catching:  # a page for the retained messages' catch-up (ges.core.retaining)
            taking = self.retained_replayed(msg, now)
        if self._hands:  # a page for a session being handed over here (ges.core.handover)
            got, took = self.taking_replayed(msg, now)
            taking += got
            if took and msg.pubend not in self._replays:
                return taking
        rp = self._replays.get(msg.pubend)
        if rp is None or msg.lo != rp.next:
            return taking  # an old answer, or one already had
        got, more = self._read_back(rp, msg, now)
        return taking + got + (self._ask(msg.pubend, rp, now) if more else [])

    def _read_back(self, rp: Replay, msg: m.Recovered, now: float) -> tuple[list, bool]:
        """Store what one page holds for the sessions; its outputs, and whether there is more
        to read."""
        pubend = msg.pubend
        store = self.store
        top = self._top.get(pubend, 0)
        if msg.lost and msg.hi >= msg.lo:
            why = "gone from the pubend's log (its bound) while this replicator was down"
            if self._by_key:
                gap = m.EventItem(msg.lo, 0, 0, m.Event({}))
                self._append(pubend, gap, dict.fromkeys(self._by_key, []), msg.hi, why)
        else:
            match = self.subscriptions.profiles.match
            for it in msg.items:
                if it.tick <= top:
                    continue
                wants: dict[int, list[int]] = {}
                for conn, sub_id in match(it.event.attributes):
                    live = self._by_key.get(-conn) if conn < 0 else None
                    if live is not None and self._reads_back(live, pubend, it.tick):
                        wants.setdefault(-conn, []).append(sub_id)
                if wants:
                    self._append(pubend, it, wants)
        if msg.hi >= msg.lo:
            self._top[pubend] = max(top, msg.hi)
            store.set_top(pubend, self._top[pubend])
            self._pending(pubend, msg.lo, store.last)
            rp.next = msg.hi + 1
            return self._committed_now(), True
        if rp.next - 1 < rp.let_go:  # an answer older than what was let go
            return [], True
        # read back up to the last commit: from here the live subscription has everything
        del self._replays[pubend]
        self._live.add(pubend)
        out: list = []
        for matched in rp.held:
            out += self.stored(pubend, matched)
        return out + self._committed_now(), False
