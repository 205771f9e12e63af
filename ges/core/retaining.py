"""A replicator's retained messages: its standing subscription to them, keeping the last per
topic, and answering what is retained on a subscriber's filters (ges.durable.retained has the
theory of operation).

A restarted replicator catches up on what was retained while it was down from the pubends'
logs, as it does for its sessions (ges.core.readback, seed 004 §4) but on its own: once its
standing subscription is in place, every pubend known here is read from its log after the tick
this broker acknowledged to its release rounds (others as they are heard of), and each page is
offered to the retained set only. Meanwhile this broker acknowledges no tick of a pubend above
what was read, and never one whose retained change its store has not made durable — so the
pubends' logs keep whatever a crash could lose. Offering is idempotent and the set is a
last-writer-wins register, so events read, live ones and those of other pubends may come in any
order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

from ges.core.outputs import Notice, ToClient
from ges.core.readback import ALL_TICKS, LOOK_EVERY, Replay
from ges.core.work import WORK_SLICE
from ges.durable.retained import RETAINED_PROFILE, RetainedSet
from ges.matching.topics import check_filter
from ges.wire import messages as m

#: The connection number of the replicator's own subscription to retained events (a session's
#: own are ``-key``; no session has this key).
RETAINED_CONN = -(1 << 40)
#: What keeping a retained message costs in a hand-on of what the log committed, in ordinary
#: deliveries (ges.core.publishing's slices): kept, counted and stored, ~30 µs against ~1.5 —
#: 1,024 of them in one slice held a broker ~30 ms.
RETAINED_WEIGHT = 16
#: Filters one ask may name (an MQTT SUBSCRIBE's, whose filters a client holds at most 1,024).
MAX_ASK_FILTERS = 1024
#: An ask's walk of the index goes in slices of the core's work (ges.core.work): a level
#: walked costs 1/LEVELS_PER_UNIT of a unit, so a slice walks ASK_PIECE levels (2,048: about
#: 1 ms in a broker holding 100,000 topics); an ask walking its MAX_VISITS at once held the
#: broker ~30 ms, and ~100 ms with the PUBLISHes of its answer (ges.mqtt.filtering).
LEVELS_PER_UNIT = 8
ASK_PIECE = WORK_SLICE * LEVELS_PER_UNIT
#: Bytes of filters one connection's asks waiting to be answered may hold (a follow
#: connection carries one ask at a time for each MQTT client of its broker), and all
#: connections' together; what a waiting ask costs beyond its filters.
MAX_WAITING_BYTES = 4 << 20
MAX_ALL_WAITING_BYTES = 16 << 20
ASK_OVERHEAD = 64


def ask_size(msg: m.RetainedAsk) -> int:
    """What an ask counts against the bounds on asks waiting (MAX_WAITING_BYTES)."""
    return ASK_OVERHEAD + sum(len(f) for f in msg.filters)


class Undurable:
    """A pubend's retained changes not yet durable, in the order made — (the store's save
    mark, tick) each — and the lowest of their ticks at any time (the ticks of live events
    and of a page read back interleave): a queue kept with its running minimum. Letting go of
    what a commit made durable is a binary search and one cut, and the floor is read at
    once, whatever is in flight (the minimum scanned again, and the changes let go of one by
    one, held the event loop 5-15 ms after commits of thousands of changes)."""

    __slots__ = ("_changes", "_lows")

    def __init__(self) -> None:
        self._changes: list[tuple[int, int]] = []
        #: ticks rising from the lowest: each the lowest of the changes from it on
        self._lows: list[tuple[int, int]] = []

    def __bool__(self) -> bool:
        return bool(self._changes)

    def add(self, mark: int, tick: int) -> None:
        self._changes.append((mark, tick))
        lows = self._lows
        while lows and lows[-1][1] >= tick:
            lows.pop()
        lows.append((mark, tick))

    def let_go(self, durable) -> None:
        """Drop the changes ``durable(mark)`` says are durable: the oldest, up to a mark."""
        changes = self._changes
        lo, hi = 0, len(changes)  # the first not durable (marks rise, and so does durability)
        while lo < hi:
            mid = (lo + hi) // 2
            if durable(changes[mid][0]):
                lo = mid + 1
            else:
                hi = mid
        if lo:
            last = changes[lo - 1][0]
            del changes[:lo]
            del self._lows[: bisect_right(self._lows, last, key=_mark)]

    @property
    def lowest(self) -> int:
        """The lowest tick of the changes held (some must be)."""
        return self._lows[0][1]


def _mark(change: tuple[int, int]) -> int:
    return change[0]


class Retaining:
    """The retained messages of :class:`ges.core.replicator.Replicator` (``self.retained``)."""

    def _retained_start(self) -> list:
        """Read the kept messages back and enter the standing subscription; the outputs. The
        replicator catches up once the subscription is in place (the module docstring) —
        every time it starts: one that crashed before it kept anything or acknowledged a
        tick leaves no trace of having run, and missed what was retained while it was down
        all the same. (On a new network the logs hold little; each is read once.)"""
        self.retained = RetainedSet()
        for kept in self.store.retained():
            self.retained.load(kept)
        self.subscriptions.client_open(RETAINED_CONN, "retained messages")
        self.subscriptions.weights[RETAINED_CONN] = RETAINED_WEIGHT
        self._reqs += 1
        if self.log is not None:
            self._retained_req = self._reqs
            self._catching = {}
            self._catch_due = 0.0
        msg = m.Subscribe(1, RETAINED_PROFILE, "mqtt-retained", req=self._reqs)
        return self.subscriptions.on_subscribe(RETAINED_CONN, msg, self.subscriptions.now)

    def _retained_answered(self, msg, now: float) -> list:
        """The standing subscription's answer: once it is in place everywhere (or refused, or
        not complete after RESTORE_WAIT: ``_retained_timer``), the catch-up begins."""
        if not self._retained_req or msg.req != self._retained_req:
            return []
        out: list = []
        if type(msg) is m.Error:
            out.append(Notice("warning", f"retained messages: not subscribed: {msg.reason}"))
        elif type(msg) is not m.SubAck or not msg.complete:
            return []  # a keeper not reached yet (see Replicator.own)
        return out + self._catch_up(now)

    def _catch_up(self, now: float) -> list:
        """The catch-up begins: the pubends begun by ``floor`` meanwhile are read, and every
        other one known now."""
        self._retained_req = 0
        return self._asks_due(self._catching, now, self._catch_ask) + self._catch_new(now)

    def _catch_new(self, now: float) -> list:
        """Read every pubend known here and neither read nor being read."""
        out: list = []
        for pubend in self._unread(self._caught | set(self._catching)):
            out += self._catch_ask(pubend, self._catch_begin(pubend), now)
        return out

    def _catch_begin(self, pubend: str) -> Replay:
        rp = self._catching.get(pubend)
        if rp is None:  # (its own pubend: released once its retained changes were durable)
            rp = self._catching[pubend] = Replay(self._let_go(pubend) + 1)
        return rp

    def _catch_ask(self, pubend: str, rp: Replay, now: float) -> list:
        return self._ask_log(pubend, rp, now, lambda a: self._caught_page(rp, a))

    def retained_replayed(self, msg: m.Recovered, now: float) -> list:
        """A page of a pubend's log read for the catch-up (ges.core.readback's answers)."""
        rp = self._catching.get(msg.pubend) if self._catching else None
        if rp is None or msg.lo != rp.next:
            return []  # not asked for here, an old answer, or one already had
        got, more = self._caught_page(rp, msg)
        return got + (self._catch_ask(msg.pubend, rp, now) if more else [])

    def _caught_page(self, rp: Replay, msg: m.Recovered) -> tuple[list, bool]:
        """Offer one page to the retained set; its outputs, and whether there is more."""
        pubend = msg.pubend
        out: list = []
        if msg.lost and msg.hi >= msg.lo:
            text = (
                f"retained messages: ticks {msg.lo}-{msg.hi} of {pubend} were gone from its "
                "log (its bound) before this replicator read them; what was retained in them "
                "is not here"
            )
            out.append(Notice("warning", text))
        else:
            out += self._retain(pubend, msg.items)
        if msg.lo <= msg.hi < ALL_TICKS:
            rp.next = msg.hi + 1
            return out, True
        # read up to the last commit (or an old epoch to its end): live from here on
        del self._catching[pubend]
        self._caught.add(pubend)
        return out, False

    def _retained_cap(self, pubend: str) -> int | None:
        """The highest tick of ``pubend`` this broker may acknowledge for its retained
        messages (None: any): what was read of it while catching up, and below any change
        not yet durable."""
        cap = None
        if self._catching is not None and pubend not in self._caught:
            cap = self._catch_begin(pubend).next - 1
        if self._retaining:
            kept = self._retained_floor(pubend)
            if kept is not None:
                cap = kept if cap is None else min(cap, kept)
        return cap

    def _retained_timer(self, now: float) -> list:
        """The catch-up's asks without an answer go again; a subscription still incomplete
        after RESTORE_WAIT does not hold it up longer; and every LOOK_EVERY the pubends
        heard of since are read too (waiting for this broker to be asked to acknowledge one
        could wait for good: the simulator found a replicator that never had a message
        published before its subscription reached the pubend, heard of after its catch-up)."""
        if self._retained_req:
            if now < self._restore_by:
                return []
            return self._catch_up(now)
        out = self._asks_due(self._catching, now, self._catch_ask)
        if now >= self._catch_due:
            self._catch_due = now + LOOK_EVERY
            out += self._catch_new(now)
        return out

    def _retained_deadline(self) -> float:
        if self._retained_req:
            return self._restore_by
        return min(self._asks_deadline(self._catching), self._catch_due)

    def _retain(self, pubend: str, items: list) -> list:
        """Retained events the standing subscription got, or a page read back: each topic's
        last is kept, and this broker acknowledges none of their ticks before the store has
        made the change durable (:meth:`_retained_floor`)."""
        retained = self.retained
        refused = retained.refused
        store = self.store
        for it in items:
            kept = retained.offer(pubend, it.tick, it.event)
            if kept is not None:
                for topic in retained.forgotten:
                    store.forget(topic)
                retained.forgotten.clear()
                store.retain(kept)
                mark = store.saved
                if not store.durable(mark):
                    q = self._retaining.get(pubend)
                    if q is None:
                        q = self._retaining[pubend] = Undurable()
                    q.add(mark, it.tick)
        if retained.refused != refused and refused % 1000 == 0:
            text = (
                f"retained messages: {retained.refused:,} new topics not kept, the "
                f"{retained.max_topics:,} topics or {retained.max_bytes:,} bytes held are full"
            )
            return [Notice("warning", text)]
        return []

    def _retained_floor(self, pubend: str) -> int | None:
        """The highest tick of ``pubend`` whose retained changes are all durable (None: any).
        The changes are in the order made, not always of their ticks (live ones and a page
        read back interleave): below the lowest tick of those not durable."""
        q = self._retaining.get(pubend)
        if q is None:
            return None
        q.let_go(self.store.durable)
        if not q:
            del self._retaining[pubend]
            return None
        return q.lowest - 1

    def retained_ask(self, conn: int, msg: m.RetainedAsk) -> list:
        """What is retained on ``msg.filters``, answered to ``conn``."""
        if len(msg.filters) > MAX_ASK_FILTERS:
            why = f"retained messages: {len(msg.filters)} topic filters, over {MAX_ASK_FILTERS}"
            return [ToClient(conn, m.Error(why, req=msg.req))]
        size = ask_size(msg)
        waiting = self._asks.get(conn)
        held = 0 if waiting is None else waiting[1]
        if held + size > MAX_WAITING_BYTES:  # (this connection's own: final)
            why = "retained messages: too many asks waiting to be answered from this connection"
            return [ToClient(conn, m.Error(why, req=msg.req))]
        if self._asks_bytes + size > MAX_ALL_WAITING_BYTES:  # everyone's: for now
            why = "retained messages: too many asks waiting to be answered; ask again later"
            retry = size <= MAX_ALL_WAITING_BYTES
            return [ToClient(conn, m.Error(why, req=msg.req, retry=retry))]
        for f in msg.filters:  # (after the bounds: a refusal for them checks no filter)
            why = check_filter(f)
            if why is not None:
                return [ToClient(conn, m.Error(f"retained messages: {why}", req=msg.req))]
        if waiting is None:
            waiting = self._asks[conn] = [deque(), 0]
        waiting[0].append((msg, size))
        waiting[1] += size
        self._asks_bytes += size
        if self._asking:
            return []  # the job under way answers it in its turn
        self._asking = True
        out: list = []
        return self.subscriptions.begin(("retained asks",), self._answering(out), out)

    def _answering(self, out: list):
        """The job answering the asks waiting: one at a time, each connection's next in turn,
        its walk of the index in pieces (``ASK_PIECE`` levels a slice). One walk at a time
        holds what a walk holds (the nodes still to visit) once; a connection's asks wait
        within MAX_WAITING_BYTES."""
        try:
            while self._asks:
                conn, waiting = next(iter(self._asks.items()))
                msg, size = waiting[0].popleft()
                waiting[1] -= size
                self._asks_bytes -= size
                if waiting[0]:
                    self._asks.move_to_end(conn)
                else:
                    del self._asks[conn]
                answer: list = []
                self._walking = conn
                for levels in self.retained.finding(msg.filters, answer, pause=ASK_PIECE):
                    yield max(1, levels // LEVELS_PER_UNIT)
                    if self._walking is None:  # its connection went
                        break
                else:
                    out.append(ToClient(conn, m.Retained(answer[0], answer[1], req=msg.req)))
                    yield 1
        finally:
            self._asking = False
            self._walking = None

    def _drop_asks(self, conn: int) -> None:
        """Connection ``conn`` is gone: its asks waiting go, and the walk for one of them ends."""
        if self._walking == conn:
            self._walking = None
        waiting = self._asks.pop(conn, None)
        if waiting is not None:
            self._asks_bytes -= waiting[1]
