"""Durable sessions' profiles: what an open may ask for, and how ``ges clients`` shows it."""

from __future__ import annotations

from ges.matching.covering import analyse
from ges.matching.model import (
    MAX_CONJUNCTIONS,
    MAX_PROFILE_WEIGHT,
    conjunction_from_wire,
    weight,
)

#: Subscriptions one session holds at most.
MAX_SESSION_SUBS = 16


def subs_problem(subs) -> str | None:
    if subs is None:
        return None
    if not subs:
        return "a durable session needs at least one subscription"
    if len(subs) > MAX_SESSION_SUBS:
        return f"a durable session holds at most {MAX_SESSION_SUBS} subscriptions"
    if len({s.sub_id for s in subs}) != len(subs):
        return "a durable session's subscriptions repeat a number"
    total = 0
    for s in subs:
        if len(s.conjunctions) > MAX_CONJUNCTIONS:
            return f"subscription {s.sub_id}: over {MAX_CONJUNCTIONS} conjunctions"
        try:  # what the broker's own subscription would refuse, refused at once
            for items in s.conjunctions:
                total += weight(conjunction_from_wire(items))
        except ValueError as exc:
            return f"subscription {s.sub_id}: {exc}"
        if total > MAX_PROFILE_WEIGHT:
            return f"a durable session's profiles weigh over {MAX_PROFILE_WEIGHT}"
    return None


def describe(conjunctions: list) -> str:
    """A profile's conjunctions in one line (for ``ges clients``), as the CLI writes them;
    those that match no event are left out ("nothing" if that is all of them: a persistent
    MQTT session with no filters)."""
    head = [conjunction_from_wire(conj) for conj in conjunctions[:8]]  # (a line: no more)
    shown = [conj for conj in head if analyse(conj).members is not None]
    rest = len(conjunctions) - len(head) + max(0, len(shown) - 4)
    if not shown:
        return f"… ({rest} more)" if rest else "nothing"
    parts = [str(conj) or "everything" for conj in shown[:4]]
    more = f" or … ({rest} more)" if rest else ""
    return " or ".join(parts) + more
