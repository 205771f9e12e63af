"""Who still owes this broker an acknowledgement of its profile changes, and the subscriptions
waiting on them (seed 004 §3.2: a subscription is complete once every keeper has it).

An origin sends each add and removal of its exported profile to the keepers of its units and
waits for each keeper's :class:`~ges.wire.messages.ProfileAck`. :class:`AckBook` keeps three
tables of ``seq -> keepers still to acknowledge``: *pending* adds, adds *waived* (the keeper was
given up; it is still sent syncs) and *removing* (removals), each also indexed by keeper, so
"what does this keeper owe" is a lookup, not a scan of every change.

A subscription waits on the adds that stand for its conjunctions — thousands for a large
profile. Asking, at every acknowledgement, whether each of them is settled would cost the size
of every waiting profile per acknowledgement. So a waiting subscription holds a :class:`Ticket`:
per keeper, how many of its (add, keeper) pairs are still pending and how many waived, kept up
to date by the book as acknowledgements arrive, as keepers are given up, as a resync makes
every add owed again, and as an add is replaced by one covering it (the ticket then waits for
that one). Whether a subscription may start on a level — no keeper deciding that level owes it
anything — is then a look at a few counters.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from contextlib import suppress

PENDING, WAIVED, REMOVING = 0, 1, 2
#: A closed ticket waiting on at most this many adds is taken out at once; a larger one a
#: step at a time (closing the ticket of a 16,384-conjunction profile took 12 ms at once).
CLOSE_AT_ONCE = 256


class Ticket:
    """What one subscription waits for: ``seqs`` (the adds standing for its conjunctions,
    following replacements), and per keeper the number of those it has still to acknowledge
    (``owing``) or was given up on before it did (``waiving``)."""

    __slots__ = ("seqs", "owing", "waiving", "open")

    def __init__(self) -> None:
        self.seqs: set[int] = set()
        self.owing: dict[str, int] = {}
        self.waiving: dict[str, int] = {}
        self.open = True

    def settled(self, keepers: Iterable[str]) -> bool:
        """None of ``keepers`` owes an acknowledgement for these adds."""
        owing = self.owing
        return not any(k in owing for k in keepers)

    def confirmed(self) -> bool:
        """Every keeper has acknowledged them (none was given up on)."""
        return not self.owing and not self.waiving

    def waived_by(self, keepers: Iterable[str]) -> bool:
        """Some of ``keepers`` was given up on before it acknowledged them."""
        waiving = self.waiving
        return any(k in waiving for k in keepers)


class AckBook:
    """The acknowledgements owed for this broker's changes (see the module docstring)."""

    def __init__(self) -> None:
        #: PENDING, WAIVED, REMOVING: seq -> keepers still to acknowledge
        self.tables: tuple[dict[int, set[str]], ...] = ({}, {}, {})
        #: the same by keeper: keeper -> seqs
        self._by_keeper: tuple[dict[str, set[int]], ...] = ({}, {}, {})
        #: seq -> the open tickets waiting on it
        self._tickets: dict[int, list[Ticket]] = {}
        #: large tickets closed whose registrations are still being taken out (:meth:`step`)
        self._closing: deque[Ticket] = deque()

    # -- owing and settling -----------------------------------------------------------------

    def owe(self, which: int, seq: int, keepers: Iterable[str]) -> None:
        """``keepers`` owe an acknowledgement for ``seq`` in table ``which``."""
        table, by_keeper = self.tables[which], self._by_keeper[which]
        owed = table.get(seq)
        tickets = self._tickets.get(seq, ()) if which != REMOVING else ()
        tickets = [t for t in tickets if t.open]
        for k in keepers:
            if owed is None:
                owed = table[seq] = set()
            if k in owed:
                continue
            owed.add(k)
            by_keeper.setdefault(k, set()).add(seq)
            for t in tickets:
                _count(t.owing if which == PENDING else t.waiving, k, 1)

    def settle(self, which: int, seq: int, keeper: str) -> bool:
        """``keeper`` owes nothing more for ``seq`` in table ``which``; True if that was the
        last keeper owing it there."""
        table = self.tables[which]
        owed = table.get(seq)
        if owed is None or keeper not in owed:
            return False
        owed.discard(keeper)
        _discard(self._by_keeper[which], keeper, seq)
        if which != REMOVING:
            for t in self._tickets.get(seq, ()):
                if t.open:
                    _count(t.owing if which == PENDING else t.waiving, keeper, -1)
        if owed:
            return False
        del table[seq]
        return True

    def drop(self, which: int, seq: int) -> None:
        """Nobody owes anything for ``seq`` in table ``which`` any more (it was retracted)."""
        for k in list(self.tables[which].get(seq, ())):
            self.settle(which, seq, k)

    def seqs_of(self, which: int, keeper: str) -> list[int]:
        """The seqs ``keeper`` owes in table ``which``."""
        return list(self._by_keeper[which].get(keeper, ()))

    def owes(self, keeper: str) -> bool:
        """``keeper`` owes an acknowledgement for anything."""
        return any(keeper in by_keeper for by_keeper in self._by_keeper)

    def owed_by(self, keeper: str) -> list[int]:
        """Every seq ``keeper`` owes an acknowledgement for, in any table."""
        return [s for by_keeper in self._by_keeper for s in by_keeper.get(keeper, ())]

    # -- tickets ----------------------------------------------------------------------------

    def ticket(self, seqs: Iterable[int]) -> Ticket:
        """A ticket waiting on ``seqs`` (already expanded through replacements)."""
        t = Ticket()
        self._extend(t, seqs)
        return t

    def extend(self, ticket: Ticket, seqs: Iterable[int]) -> None:
        """The subscription waits on ``seqs`` too (a large one's adds come a chunk at a time)."""
        self._extend(ticket, seqs)

    def replace(self, seq: int, by: Iterable[int]) -> None:
        """``seq`` was retracted for adds ``by`` covering it: tickets waiting on it wait on
        those too (call before dropping ``seq``)."""
        for t in list(self._tickets.get(seq, ())):
            if t.open:
                self._extend(t, by)

    def close(self, ticket: Ticket) -> None:
        """The subscription no longer waits: the ticket stops being kept up to date. A large
        one's registrations go a bounded number at a time (:meth:`step`)."""
        if not ticket.open:
            return
        ticket.open = False
        if len(ticket.seqs) <= CLOSE_AT_ONCE:
            self._unregister(ticket, len(ticket.seqs))
        else:
            self._closing.append(ticket)

    @property
    def busy(self) -> bool:
        """Closed tickets still have registrations to take out."""
        return bool(self._closing)

    def step(self, budget: int) -> int:
        """Take out about ``budget`` registrations of closed tickets; returns how many."""
        done = 0
        while self._closing and done < budget:
            ticket = self._closing[0]
            done += self._unregister(ticket, budget - done)
            if not ticket.seqs:
                self._closing.popleft()
        return done

    def _unregister(self, ticket: Ticket, most: int) -> int:
        seqs = ticket.seqs
        n = 0
        while seqs and n < most:
            seq = seqs.pop()
            n += 1
            waiting = self._tickets.get(seq)
            if waiting is not None:
                with suppress(ValueError):
                    waiting.remove(ticket)
                if not waiting:
                    del self._tickets[seq]
        return n

    def _extend(self, t: Ticket, seqs: Iterable[int]) -> None:
        pending, waived = self.tables[PENDING], self.tables[WAIVED]
        for seq in seqs:
            if seq in t.seqs:
                continue
            t.seqs.add(seq)
            self._tickets.setdefault(seq, []).append(t)
            for k in pending.get(seq, ()):
                _count(t.owing, k, 1)
            for k in waived.get(seq, ()):
                _count(t.waiving, k, 1)


def _count(counts: dict[str, int], keeper: str, by: int) -> None:
    n = counts.get(keeper, 0) + by
    if n:
        counts[keeper] = n
    else:
        del counts[keeper]


def _discard(table: dict, key, value) -> None:
    values = table.get(key)
    if values is not None:
        values.discard(value)
        if not values:
            del table[key]
