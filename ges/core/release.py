"""Log release rounds: when a pubend may drop what it logged (seed 002 §1–2).

Theory of operation
-------------------
The pubend's broker releases a tick once every other broker of the topology has acknowledged
it. While its log holds unreleased entries it runs a round every ``ack_every`` seconds: it asks
(``AckAsk``) every broker behind the last commit, one ask per next hop naming the brokers
beyond it. A broker that passes an ask on gathers the answers from beyond it for a while
(``ack_gather``, less ``gather_step`` per hop so the furthest give up first) and sends them back
as one ``Ack`` the way the ask came: the answers travel a tree, whatever the shortest paths back
are. A broker acknowledges up to the tick it is asked about (published before it was asked) but
no further than its subscriptions need (:meth:`ReleaseRounds.needed`, given by the delivery
side: the doubt horizon of its subend, or the starting point of a subscription that has none
yet); while a subscription here waits for its starting point on that pubend's level it does
not answer at all. So a released tick was, for every subscription anywhere, either had or not
for it, or published before the subscription was made — a nack for it is answered "nothing for
you" (ges.core.repair). The membership is the topology's: a broker that never answers (down for
good) holds the release back, and the log's bound still applies.

Before answering, a broker keeps its acknowledgement in stable storage (:meth:`promise`): a
subend made later, even after a crash, starts above it.

A pubend's earlier epochs (its broker restarted and its log opened a new one, ticks from 1:
``PubendLog.earlier``) go through rounds of their own until they are released to their last
tick; then the log stops naming them, and they are no longer announced. Their last ticks
may never have been routed: they reach a subscriber only by nacks, once it has heard the
epoch's end announced, which makes its subend. Until then a broker with subscriptions answers
0 for that pubend, as for any it follows no subend of (its subscriptions started before it
was routed: ges.core.gates ``start_floor``). A broker keeps its acknowledgements per pubend;
each ask says the oldest epoch its broker still holds (``AckAsk.oldest``), and those of older
epochs are forgotten: that broker neither asks about them nor announces them any more. Against
a broker that never says, at most ``ges.reliable.log.MAX_PROMISED_EPOCHS`` epochs of each are
kept, the newest; an older epoch's acknowledgement is not given.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ges.core.config import BrokerConfig
from ges.core.outputs import ToPeer
from ges.core.unicast import Unicast
from ges.reliable.log import PubendLog, epoch_of
from ges.topology import broker_order_key
from ges.wire import messages as m


class Gather:
    """Answers to one round of another pubend's asks that this broker passed on: the tick
    asked, the brokers beyond it still to answer, the ``(origin, tick)`` answers so far, when
    it stops waiting, and the neighbour the ask came from."""

    __slots__ = ("asked", "waiting", "got", "due", "parent")

    def __init__(self, asked: int, waiting: set[str], got: list, due: float, parent: str):
        self.asked = asked
        self.waiting = waiting
        self.got = got
        self.due = due
        self.parent = parent


class Round:
    """The rounds of one pubend of this broker's: each other broker's acknowledged tick, the
    tick the last round asked about (``end``: the last there is, of an earlier epoch), and the
    brokers that have not acknowledged it."""

    __slots__ = ("acked", "asked", "behind", "end")

    def __init__(self, end: int | None = None):
        self.acked: dict[str, int] = {}
        self.asked = 0
        self.behind: set[str] = set()
        self.end = end


class ReleaseRounds:
    """This broker's part in log release: its own pubend's rounds, and the asks of others."""

    def __init__(
        self,
        broker_id: str,
        pubend: str,
        log: PubendLog,
        others: frozenset[str],
        unicast: Unicast,
        config: BrokerConfig,
        needed: Callable[[str, int], int | None],
    ):
        self.id = broker_id
        self.pubend = pubend
        self.log = log
        self.config = config
        self._unicast = unicast
        self._needed = needed
        self._others = others
        #: the tick of this broker's own pubend its log may release up to at most, by this
        #: broker's own needs (None: any) — a replicator handing a session over keeps what is
        #: after its cut (ges.core.handover)
        self.pinned: Callable[[str], int | None] = lambda pubend: None
        #: the last tick of this pubend handed on (ges.core.publishing; the core sets it)
        self.routed: Callable[[], int] = lambda: log.committed
        #: this pubend's rounds, and its earlier epochs' until they are released to their end
        self.current = Round()
        self.ended = {f"{broker_id}~{epoch}": Round(last) for epoch, last in log.earlier}
        unreleased = log.committed > log.released() or self.ended
        self.due = 0.0 if unreleased else float("inf")
        #: other pubends' rounds whose asks this broker passed on: the answers it gathers
        self.gathers: OrderedDict[str, Gather] = OrderedDict()
        #: no gather is due before this (it may be earlier than every one: then a look finds
        #: none due and sets it again)
        self._gather_due = float("inf")

    # -- this pubend's rounds ---------------------------------------------------------------

    def published(self, now: float) -> None:
        """This pubend published: a round comes due if none is."""
        if self.due == float("inf"):
            self.due = now + self.config.ack_every

    @property
    def behind(self) -> set[str]:
        """The brokers that have not acknowledged what this pubend's last round asked."""
        return self.current.behind

    def _round(self, now: float) -> list:
        """Release what every other broker acknowledged; ask those behind the last tick
        committed and handed on — and, of each earlier epoch, behind its end."""
        out, again = self._round_of(self.pubend, self.current, self._top())
        for pubend, r in list(self.ended.items()):
            asks, more = self._round_of(pubend, r, r.end)
            out += asks
            if more:
                again = True
            else:  # released to its end
                del self.ended[pubend]
        # until the next publish (or, pinned, a look again later)
        self.due = now + self.config.ack_every if again else float("inf")
        return out

    def _round_of(self, pubend: str, r: Round, tick: int) -> tuple[list, bool]:
        """One round of ``pubend`` up to ``tick``: its asks, and whether another comes due
        (False: released up to ``tick``)."""
        acked = r.acked
        floor = min((acked.get(b, 0) for b in self._others), default=tick)
        release = self._release(pubend, floor)
        if floor >= tick:
            return [], release < floor
        r.asked = tick
        r.behind = {b for b in self._others if acked.get(b, 0) < tick}
        to = sorted(r.behind, key=broker_order_key)
        out, _ = self._pass_ask(pubend, to, tick, 0, (), self._oldest())
        return out, True

    def _oldest(self) -> int:
        """The oldest epoch of this pubend that its log still holds."""
        return min(map(epoch_of, self.ended), default=epoch_of(self.pubend))

    def _top(self) -> int:
        """The last tick other brokers may be asked about: committed and handed on (one
        committed and not yet routed would be promised by a broker with no subscriber, and
        a subscription it makes meanwhile would never get it)."""
        return min(self.log.committed, self.routed())

    def _release(self, pubend: str, tick: int) -> int:
        """Release ``pubend`` (this one or an earlier epoch) up to ``tick``, or to where this
        broker's own needs pin it; the tick released up to."""
        pin = self.pinned(pubend)
        upto = tick if pin is None else min(tick, pin)
        epoch = None if pubend == self.pubend else epoch_of(pubend)
        if upto > self.log.released(epoch):
            self.log.release(upto, epoch)
        return upto

    def _pass_ask(
        self, pubend: str, to: list[str], tick: int, hops: int, detour, oldest: int
    ) -> tuple:
        """The AckAsks for ``to``, one per next hop, and the brokers they went towards."""
        out = []
        passed: list[str] = []
        up = self._unicast.links_up
        for (hop, path), group in self._unicast.router.steps(to, detour, hops).items():
            if hop in up:
                ask = m.AckAsk(pubend, group, tick, hops + 1, list(path), oldest)
                out.append(ToPeer(hop, ask))
                passed += group
        return out, passed

    # -- asks and answers ---------------------------------------------------------------------

    def on_ack_ask(self, peer: str, msg: m.AckAsk, now: float) -> list:
        broker = msg.pubend.partition("~")[0]
        self._unicast.check(broker, msg.detour)
        self._unicast.check_brokers(msg.to)
        g = self.gathers.get(msg.pubend)
        if g is not None and g.asked == msg.tick and g.parent == peer:
            return []  # a copy of the ask this broker passed on and gathers the answers to
        others = [b for b in msg.to if b != self.id]
        oldest = min(msg.oldest, epoch_of(msg.pubend))  # (no ask says its own epoch is gone)
        out, passed = self._pass_ask(msg.pubend, others, msg.tick, msg.hops, msg.detour, oldest)
        answer = None
        if len(others) < len(msg.to) and broker != self.id:
            if oldest > 0:
                self.log.forget_promises(broker, oldest)
            need = self._needed(msg.pubend, msg.tick)
            if need is not None and self.promise(msg.pubend, need):
                answer = (self.id, need)
        got = [] if answer is None else [answer]
        if passed and broker != self.id:  # the answers from beyond go back as one
            c = self.config
            due = now + max(c.ack_gather - msg.hops * c.gather_step, c.gather_min)
            return out + self._gather(msg.pubend, Gather(msg.tick, set(passed), got, due, peer))
        if got:
            out += self._answer(msg.pubend, got, msg.tick, peer)
        return out

    def _gather(self, pubend: str, g: Gather) -> list:
        """Wait until ``g.due`` for the answers of ``g.waiting`` to this round of ``pubend``."""
        gathers = self.gathers
        self._gather_due = min(self._gather_due, g.due)
        old = gathers.pop(pubend, None)
        out = [] if old is None else self._gathered(pubend, old)  # an older round's, as it is
        gathers[pubend] = g
        if len(gathers) > self.config.max_gathers:
            out += self._gathered(*gathers.popitem(last=False))
        return out

    def _gathered(self, pubend: str, g: Gather) -> list:
        return self._answer(pubend, g.got, g.asked, g.parent) if g.got else []

    def _answer(self, pubend: str, acks: list, asked: int, parent: str) -> list:
        """Answers back to the broker the round's ask came from (which gathers them in turn),
        or relayed to the pubend's broker if that link is down."""
        if parent in self._unicast.links_up:
            return [ToPeer(parent, m.Ack(pubend, acks, asked, 1))]
        return self._send_acks(pubend, acks, asked)

    def _send_acks(self, pubend: str, acks: list, asked: int, hops: int = 0, detour=()) -> list:
        broker = pubend.partition("~")[0]
        return self._unicast.relay(
            broker, detour, hops, lambda h, d: m.Ack(pubend, acks, asked, h, d)
        )

    def promise(self, pubend: str, tick: int) -> bool:
        """Keep, in stable storage, that this broker acknowledged ``pubend`` up to ``tick``: a
        subend made here later — for a subscription made after the answer, even after a crash
        — starts above it, so it never gets part of what may be released (a tick still on its
        way to a keeper would otherwise reach the new subscription, and its copy lost on the
        way be answered "nothing for you"). Of each publishing broker the newest
        ``ges.reliable.log.MAX_PROMISED_EPOCHS`` epochs' are kept: an older epoch's answer
        is not given. False if not kept (then no answer)."""
        if tick <= self.log.promised().get(pubend, 0):
            return True  # (0, or no further than before: nothing to keep)
        return self.log.promise(pubend, tick)

    def promised(self, pubend: str) -> int:
        """The tick of ``pubend`` up to which this broker acknowledged it needs nothing (0)."""
        return self.log.promised().get(pubend, 0)

    def on_ack(self, msg: m.Ack) -> list:
        broker = msg.pubend.partition("~")[0]
        self._unicast.check(broker, msg.detour)
        self._unicast.check_brokers([origin for origin, _ in msg.acks])
        if broker != self.id:
            acks, out = msg.acks, []
            g = self.gathers.get(msg.pubend)
            if g is not None and g.asked == msg.asked:
                acks = []
                for a in msg.acks:
                    if a[0] in g.waiting:
                        g.waiting.discard(a[0])
                        g.got.append(a)
                    else:
                        acks.append(a)
                if not g.waiting:  # everyone beyond this broker answered
                    out = self._gathered(msg.pubend, self.gathers.pop(msg.pubend))
            if acks:
                out += self._send_acks(msg.pubend, acks, msg.asked, msg.hops, msg.detour)
            return out
        r = self.current if msg.pubend == self.pubend else self.ended.get(msg.pubend)
        if r is None:
            return []
        top = self._top() if r.end is None else r.end
        behind, acked = r.behind, r.acked
        for origin, tick in msg.acks:
            if origin == self.id:
                continue
            tick = min(tick, top)
            if acked.get(origin, 0) < tick:
                acked[origin] = tick
            if tick >= r.asked and origin in behind:
                behind.discard(origin)
                if not behind:  # the last one: what the round asked about goes now
                    self._release(msg.pubend, r.asked)
        return []

    # -- time ---------------------------------------------------------------------------------

    def on_timer(self, now: float) -> list:
        out: list = []
        if now >= self.due:
            out += self._round(now)
        if now >= self._gather_due:
            gathers = self.gathers
            for pubend in [p for p, g in gathers.items() if g.due <= now]:
                out += self._gathered(pubend, gathers.pop(pubend))
            self._gather_due = min((g.due for g in gathers.values()), default=float("inf"))
        return out

    def next_deadline(self) -> float:
        return min(self.due, self._gather_due)
