"""Nacks and their answers: repairing a gap from the nearest copy (seed 002 §2.3, seed 001 §3).

Theory of operation
-------------------
A subend whose doubt horizon stays stuck on a gap sends a ``Nack`` towards the pubend's broker
(ges.core.unicast). Each broker on the way that keeps a unit around the nacker answers what its
cache holds — ranges it knows whole for that unit, because it routed them as a keeper
(ges.reliable.claims) — and passes the rest on, unless a nack it passed on just now asked for the
same ticks (the :class:`~ges.reliable.repair.NackBoard` consolidates them; an answer then goes to
every origin waiting on it, each getting the part it asked for). The pubend's broker answers
from its log: ticks released have nothing for anyone (every other broker acknowledged them,
ges.core.release), ticks the log's bound dropped are answered as *lost* (never passed off as
silence), the rest as events. An older epoch of this broker's pubend is answered from the log
if it kept it, else as lost. Every answer is bounded in events and bytes; the nacker asks again
for the rest. An answer for this broker goes to the delivery side (``here``).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ges.core.outputs import ProtocolError, hop
from ges.core.unicast import Unicast
from ges.reliable.log import MAX_READ, NO_END, PubendLog, epoch_of
from ges.reliable.repair import EventCache, NackBoard
from ges.reliable.subend import MAX_NACK_RANGES
from ges.topology import Topology
from ges.wire import messages as m
from ges.wire.messages import held_size

#: Bytes of events one answer to a nack carries at most (besides MAX_READ events): the
#: subend asks again for the rest.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class NackRepair:
    """Answering and passing on nacks, and passing answers on."""

    def __init__(
        self,
        broker_id: str,
        pubend: str,
        topology: Topology,
        log: PubendLog,
        claims,
        unicast: Unicast,
        counters: dict[str, int],
        here: Callable[[m.Recovered, float], list],
        replayed: Callable[[m.Recovered, float], list] = lambda msg, now: [],
    ):
        self.id = broker_id
        self.pubend = pubend
        self.topology = topology
        self.log = log
        self.claims = claims
        self.router = unicast.router
        self._unicast = unicast
        self.counters = counters
        self._here = here
        self._replayed = replayed
        #: recent events this keeper routed, and nacks held back
        self.cache = EventCache()
        self.board = NackBoard()

    def on_nack(self, msg: m.Nack, now: float) -> list:
        """Curiosity for ``msg.pubend``: answer from the log if it is this broker's; else answer
        what this keeper's cache can and relay the rest towards the pubend's broker, unless a
        nack sent on just now asked for it already."""
        broker = msg.pubend.partition("~")[0]
        self._unicast.check(msg.origin, msg.detour)
        if len(msg.ranges) > MAX_NACK_RANGES:
            raise ProtocolError(f"nack with over {MAX_NACK_RANGES} ranges from {msg.origin}")
        if msg.origin == self.id:
            return []
        if broker != self.id and msg.replay:  # only the log answers a replay
            return self._unicast.relay(broker, msg.detour, msg.hops, lambda h, d: hop(msg, h, d))
        if broker != self.id:
            answers, rest = self._answer_from_cache(msg.pubend, msg.origin, msg.ranges)
            out = self._send_answers(answers)
            rest = self.board.ask(msg.pubend, msg.origin, rest, now)
            if rest:
                out += self._unicast.relay(
                    broker,
                    msg.detour,
                    msg.hops,
                    lambda h, d: m.Nack(msg.pubend, msg.origin, rest, h, d),
                )
            return out
        self.counters["nacks_answered"] += 1
        return self._send_answers(self.from_log(msg))

    def from_log(self, msg: m.Nack) -> list[m.Recovered]:
        """The answers this broker's log gives ``msg`` (a nack for one of its own pubends) —
        also for its own replicator, which reads the log here rather than nacking itself."""
        log = self.log
        if msg.pubend != self.pubend:
            # an older epoch of this broker's pubend: answered from the log if it kept it
            # (a durable log does), else its ticks are lost, and saying so lets the subend go
            # on; a reader is answered past any tick of it at once
            end = NO_END
            answers = self._old_epoch_answers(msg)
        else:
            end = log.committed
            answers = _log_answers(msg, end, log.released(), log.lowest(), log.read)
        if msg.replay:
            # a range past the last commit (of an older epoch: past any tick, where its first
            # answer ended) is answered with nothing, up to it: the reader is done
            answers += [
                m.Recovered(msg.pubend, msg.origin, lo, lo - 1, [])
                for lo, _ in msg.ranges
                if lo > end
            ]
            answers = [msgspec.structs.replace(a, replay=True) for a in answers]
        return answers

    def _answer_from_cache(self, pubend: str, origin: str, ranges) -> tuple[list, list]:
        """The answers this broker can give a nack from ``origin`` out of its cache — for a range
        it knows whole for a unit it keeps around ``origin`` — and the ranges left."""
        kept = self.router.kept
        if not kept:
            return [], list(ranges)
        contains = self.router.h.contains
        # the widest first: its answer may serve more of the origins waiting on it
        units = sorted((u for u in kept if contains(u, origin)), key=len)
        knows = self.claims.knows
        answers, rest = [], []
        for lo, hi in ranges:
            items = unit = None
            if lo <= hi:
                unit = next((u for u in units if knows(pubend, u, lo, hi)), None)
            if unit is not None:
                items = self.cache.read(pubend, lo, hi)
            if items is None:
                rest.append((lo, hi))
                continue
            bounded, _ = within_bytes(items[:MAX_READ], held_size)
            if len(bounded) < len(items):  # one bounded answer; the rest is asked for again
                items = bounded
                rest.append((items[-1].tick + 1, hi))
                hi = items[-1].tick
            items = [m.EventItem(it.tick, 0, 0, it.event) for it in items]
            answers.append(m.Recovered(pubend, origin, lo, hi, items, unit=unit))
        if answers:
            self.counters["nacks_answered_from_cache"] += len(answers)
        return answers, rest

    def _send_answers(self, answers: list) -> list:
        """Answers on their way, each also to the origins waiting on a nack it answers."""
        out = []
        for a in answers:
            a = msgspec.structs.replace(a, by=self.id)  # who answered: provenance
            out += self._relay_answer(a)
            if not a.replay:
                out += self._to_waiters(a)
        return out

    def _relay_answer(self, a: m.Recovered) -> list:
        """An answer one hop further towards ``a.to`` (along its detour, if any)."""
        return self._unicast.relay(a.to, a.detour, a.hops, lambda h, d: hop(a, h, d))

    def _to_waiters(self, a: m.Recovered) -> list:
        """Copies of an answer for every origin waiting on a nack it answers (each gets the part
        it asked for) — those in the unit the answer is whole for. A copy goes on counting the
        hops from the broker that answered (ges.core.provenance)."""
        out = []
        contains = self.router.h.contains
        for origin, lo, hi in self.board.answered(
            a.pubend, a.lo, a.hi, a.to, lambda o: contains(a.unit, o)
        ):
            if origin == self.id:
                continue
            items = [it for it in a.items if lo <= it.tick <= hi]
            copy = msgspec.structs.replace(
                a, to=origin, lo=lo, hi=hi, items=items, hops=a.hops, detour=[]
            )
            out += self._relay_answer(copy)
        self.counters["nack_answers_shared"] += len(out)
        return out

    def _old_epoch_answers(self, msg: m.Nack) -> list[m.Recovered]:
        n = epoch_of(msg.pubend)
        log = self.log
        if n < 0:  # a pubend name with no epoch: nothing logged under it
            return [
                m.Recovered(msg.pubend, msg.origin, lo, hi, [], lost=True)
                for lo, hi in msg.ranges
                if lo <= hi
            ]
        # ticks past the epoch's end were never published: silence (a log that kept no
        # other epoch reads nothing of it: its ticks are answered as lost)
        return _log_answers(
            msg,
            NO_END,
            log.released(n),
            log.lowest(n),
            lambda lo, hi, limit: log.read_epoch(n, lo, hi, limit),
        )

    def on_recovered(self, msg: m.Recovered, now: float) -> list:
        self._unicast.check(msg.to, msg.detour)
        if msg.unit and msg.unit not in self.topology.units:
            raise ProtocolError(f"answer for unknown unit {'/'.join(msg.unit)!r}")
        shared = self._to_waiters(msg) if msg.lo <= msg.hi and not msg.replay else []
        if msg.to != self.id:
            return shared + self._relay_answer(msg)
        if msg.replay:
            return self._replayed(msg, now)
        return shared + self._here(msg, now)


def _log_answers(msg: m.Nack, last: int, released: int, lowest: int, read) -> list[m.Recovered]:
    """One bounded answer per range of ``msg`` from a log holding ``lowest..last`` (the subend
    asks again for the rest). Ticks up to ``released`` have nothing for the nacker: every other
    broker acknowledged them, so they precede anything its subscriptions need. Ticks between
    that and ``lowest`` are answered as lost — the log's bound dropped them, and passing them
    off as silence would hide the loss."""
    answers = []
    for lo, hi in msg.ranges:
        lo, hi = max(lo, 1), min(hi, last)
        if lo > hi:
            continue
        if lo <= released:
            done = min(hi, released)
            answers.append(m.Recovered(msg.pubend, msg.origin, lo, done, []))
            lo = done + 1
            if lo > hi:
                continue
        if lo < lowest:
            gone = min(hi, lowest - 1)
            answers.append(m.Recovered(msg.pubend, msg.origin, lo, gone, [], lost=True))
            lo = gone + 1
            if lo > hi:
                continue
        got, cut = within_bytes(read(lo, hi, MAX_READ), lambda te: held_size(te[1]))
        if len(got) >= MAX_READ or cut:
            hi = got[-1][0]
        items = [m.EventItem(t, 0, 0, ev) for t, ev in got]
        answers.append(m.Recovered(msg.pubend, msg.origin, lo, hi, items))
    return answers


def within_bytes(items: list, size) -> tuple[list, bool]:
    """The leading ``items`` within MAX_ANSWER_BYTES (at least one), and whether some were
    left out (the rest is asked for again)."""
    total = 0
    for i, item in enumerate(items):
        total += size(item)
        if total > MAX_ANSWER_BYTES and i:
            return items[:i], True
    return items, False
