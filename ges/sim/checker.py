"""The checker: what every subscriber received, against what was published.

A subscription's *starting point* on a pubend is the first tick delivered to it from that
pubend. From there on its deliveries must be exactly the published events of that pubend that
its profile matches — in tick order, none twice, none missing, none altered. The checker looks
at every delivery as it happens (an out-of-order, repeated, unmatched, unpublished or altered
event, or a matching one skipped, is a violation at once) and, at the end of a run, checks that
every live subscription has every matching event after its starting point, that it has had a
*complete* ``SubAck`` (the broker's word that every keeper has the profile), and that it started
no later than the first matching event published after that — or, with ``start_by``, after that
time, whichever is later.

A changed profile (``Subscribe`` again with the same id) starts a new subscription under the
same key; the old one ends when the change is sent. One that ends (unsubscribed, or its broker
crashed) is checked no further.

A subscription may also be given ticks it must never have (:meth:`Checker.not_for`): a
publisher's own subscription, none of what that client published before it subscribed.
"""

from __future__ import annotations

import attrs

from ges.matching.model import Profile


@attrs.frozen
class Violation:
    time: float
    sub: str
    pubend: str
    what: str

    def __str__(self) -> str:
        return f"t={self.time:.3f}s {self.sub} {self.pubend}: {self.what}"


@attrs.define
class _Sub:
    name: str
    profile: Profile
    #: when its complete SubAck came (None: not yet, or only an incomplete one)
    acked_at: float | None = None
    #: a changed profile: the profiles it replaced, and the last tick of each pubend delivered
    #: before the change — what all of them match must go on arriving across the change
    before: tuple[Profile, ...] = ()
    floor: dict[str, int] = attrs.Factory(dict)
    #: when the subscription it changed had its complete SubAck: every event published after
    #: that which every profile matches must arrive, across the change
    since: float | None = None
    alive: bool = True
    #: pubend -> ticks delivered, in order
    got: dict[str, list[int]] = attrs.Factory(dict)
    #: pubend -> tick -> why it must never be delivered to this subscription
    never: dict[str, dict[int, str]] = attrs.Factory(dict)


class Checker:
    #: violations kept (a broken run can produce one per delivery)
    MAX_VIOLATIONS = 100

    def __init__(self):
        #: pubend -> tick -> attributes, as acknowledged to the publisher
        self.published: dict[str, dict[int, dict]] = {}
        self.published_at: dict[str, dict[int, float]] = {}
        self.subs: dict[tuple, _Sub] = {}
        #: subscriptions replaced by a changed profile
        self.ended: list[_Sub] = []
        self.violations: list[Violation] = []
        self.n_violations = 0
        self.delivered = 0

    # -- inputs ------------------------------------------------------------------------------------

    def publish(self, pubend: str, first: int, events: list[dict], now: float) -> None:
        ticks = self.published.setdefault(pubend, {})
        at = self.published_at.setdefault(pubend, {})
        for i, attributes in enumerate(events):
            ticks[first + i] = attributes
            at[first + i] = now

    def subscribe(self, key: tuple, profile: Profile) -> None:
        """A subscription is made, or (same key) its profile changed."""
        old = self.subs.get(key)
        sub = _Sub(f"{key[0]}/{key[1]}/{key[2]}", profile)
        if old is not None:
            if old.alive:
                sub.before = (old.profile, *old.before)
                sub.floor = dict(old.floor)
                sub.floor.update((p, got[-1]) for p, got in old.got.items() if got)
                sub.since = old.acked_at if old.acked_at is not None else old.since
            old.alive = False
            self.ended.append(old)
            sub.name = f"{old.name}'"
        self.subs[key] = sub

    def not_for(self, key: tuple, pubend: str, ticks: list[int], why: str) -> None:
        """Subscription ``key`` (as it is now) must never be delivered these ticks."""
        sub = self.subs.get(key)
        if sub is not None:
            sub.never.setdefault(pubend, {}).update(dict.fromkeys(ticks, why))

    def subscribed(self, key: tuple, now: float, *, complete: bool = True) -> None:
        sub = self.subs.get(key)
        if sub is not None and sub.alive and complete and sub.acked_at is None:
            sub.acked_at = now

    def gone(self, key: tuple) -> None:
        """The subscription ended (its broker crashed, or it unsubscribed)."""
        sub = self.subs.get(key)
        if sub is not None:
            sub.alive = False

    def deliver(self, key: tuple, pubend: str, ticks: list[tuple[int, dict]], now: float) -> None:
        sub = self.subs.get(key)
        if sub is None or not sub.alive:
            return
        published = self.published.get(pubend, {})
        got = sub.got.setdefault(pubend, [])
        for tick, attributes in ticks:
            self.delivered += 1
            last = got[-1] if got else sub.floor.get(pubend)
            if last is not None and tick <= last:
                if not got:
                    what = f"at or before {last}, the last before the change"
                else:
                    what = "again" if tick in got else f"after {last} (out of order)"
                self._violate(now, sub, pubend, f"tick {tick} delivered {what}")
                continue
            if tick not in published:
                self._violate(now, sub, pubend, f"tick {tick} delivered but never published")
            elif published[tick] != attributes:
                self._violate(now, sub, pubend, f"tick {tick} delivered altered")
            elif not sub.profile.matches(attributes):
                self._violate(now, sub, pubend, f"tick {tick} delivered but does not match")
            if last is not None:
                missed = self._matching(sub, pubend, last + 1, tick - 1)
                if missed:
                    self._violate(now, sub, pubend, f"gap: {_ticks(missed)} skipped before {tick}")
            got.append(tick)

    # -- the end -------------------------------------------------------------------------------------

    def finish(self, now: float, *, start_by: float = 0.0) -> None:
        """End-of-run checks; every subscription with a complete SubAck must have started by
        the first matching event published after the later of its SubAck and ``start_by``;
        none, live or ended, may have a tick it was never to have (:meth:`not_for`)."""
        for sub in [*self.ended, *self.subs.values()]:
            for pubend, never in sub.never.items():
                for tick in sub.got.get(pubend, []):
                    if tick in never:
                        self._violate(now, sub, pubend, f"tick {tick} delivered: {never[tick]}")
        for sub in self.subs.values():
            if not sub.alive:
                continue
            if sub.acked_at is None:
                self._violate(now, sub, "-", "never completed: no complete SubAck by the end")
            for pubend, ticks in self.published.items():
                got = sub.got.get(pubend, [])
                top = max(ticks)
                if got:
                    missed = self._matching(sub, pubend, got[-1] + 1, top)
                    if missed:
                        self._violate(now, sub, pubend, f"never delivered: {_ticks(missed)}")
                if sub.since is not None:
                    self._bridged(now, sub, pubend, got)
                if sub.acked_at is None:
                    continue
                since = max(sub.acked_at, start_by)
                at = self.published_at[pubend]
                due = [t for t in sorted(ticks) if at[t] > since and sub.profile.matches(ticks[t])]
                if due and (not got or got[0] > due[0]):
                    first = got[0] if got else "nothing"
                    self._violate(
                        now, sub, pubend, f"started late: first delivered {first}, due {due[0]}"
                    )

    def _bridged(self, now: float, sub: _Sub, pubend: str, got: list[int]) -> None:
        """A changed subscription must have every event published after the old one's complete
        SubAck that every profile matches, from the last one the old one got on."""
        ticks = self.published[pubend]
        at = self.published_at[pubend]
        floor = sub.floor.get(pubend, 0)
        both = [
            t
            for t in sorted(ticks)
            if t > floor
            and at[t] > sub.since
            and sub.profile.matches(ticks[t])
            and all(p.matches(ticks[t]) for p in sub.before)
        ]
        lost = [t for t in both if not got or t < got[0]]
        if lost:
            self._violate(now, sub, pubend, f"lost across the change: {_ticks(lost)}")

    @property
    def ok(self) -> bool:
        return not self.n_violations

    # -- helpers -------------------------------------------------------------------------------------

    def _matching(self, sub: _Sub, pubend: str, lo: int, hi: int) -> list[int]:
        """The ticks in ``lo..hi`` ``sub`` must have: those its profile matches — and, for a
        changed one, that every profile it replaced matches too, or that were published after
        its complete SubAck."""
        ticks = self.published.get(pubend, {})
        matches = sub.profile.matches
        out = [t for t in range(lo, hi + 1) if t in ticks and matches(ticks[t])]
        if sub.before:
            at = self.published_at[pubend]
            since = float("inf") if sub.acked_at is None else sub.acked_at
            out = [t for t in out if at[t] > since or all(p.matches(ticks[t]) for p in sub.before)]
        return out

    def broker_fault(self, now: float, broker: str, what: str) -> None:
        """A broker did what no broker of an honest network may (drop a frame as forged)."""
        self.n_violations += 1
        if len(self.violations) < self.MAX_VIOLATIONS:
            self.violations.append(Violation(now, f"broker {broker}", "-", what))

    def _violate(self, now: float, sub: _Sub, pubend: str, what: str) -> None:
        self.n_violations += 1
        if len(self.violations) < self.MAX_VIOLATIONS:
            self.violations.append(Violation(now, sub.name, pubend, what))


def _ticks(ticks: list[int]) -> str:
    shown = ", ".join(map(str, ticks[:8]))
    return shown + (f" … ({len(ticks)} ticks)" if len(ticks) > 8 else "")
