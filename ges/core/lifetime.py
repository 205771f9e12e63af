"""How long a replicator keeps what it holds for a durable session nobody takes events from
(seed 001 §4.2's stable storage, bounded): its events by the retention limits, the session
itself by its expiry. A part of :class:`ges.core.replicator.Replicator`.

Retention: once every :data:`RETENTION_EVERY` seconds the oldest events of a session over its
limits (``max_events`` held, none older than ``max_age``: its own, else the topology's
``sessions:``) are let go, :data:`TRIM_CHUNK` at a time, and its client is told first in its
stream (a gap notice per pubend with the ticks and why). Retention never ends a session.

Expiry: a session whose client has been away longer than it outlives it — its own expiry (an
MQTT 5.0 client's Session Expiry Interval, §3.1.2.11.2), at most the topology's
``sessions.expire_after`` — is ended, with a line saying why. Away counts from its client
leaving, a failed open, a restart, or a broker's lookup for its client connecting; never while
it is being opened or handed over. The next end due is kept (``_expiry_due``) so the check
runs only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ges.core.outputs import Notice
from ges.durable.store import SessionState
from ges.wire import messages as m

if TYPE_CHECKING:
    from ges.core.replicator import Live

#: Seconds between two looks at the sessions' retention limits, and the events one look lets
#: go of at most per session (the rest at the next).
RETENTION_EVERY = 1.0
TRIM_CHUNK = 10_000


class Lifetime:
    """Retention and expiry of :class:`ges.core.replicator.Replicator`'s sessions."""

    def _away(self, live: Live, now: float) -> None:
        """The session's client is away from now on (its expiry counts from now)."""
        live.since = now
        self._arm(live)

    def _arm(self, live: Live) -> None:
        """The end of the away session by its expiry, among those due (``_expire``)."""
        away = max(live.since, live.looked)
        self._expiry_due = min(self._expiry_due, away + self._outlives(live.state))

    def _outlives(self, state: SessionState) -> float:
        """How long the session outlives its client's leaving (inf: for good): its own expiry
        (an MQTT 5.0 client's Session Expiry Interval), at most the topology's
        ``sessions.expire_after``."""
        bound = self.topology.session_limits.expire_after
        return min(state.expiry, bound) if state.expiry > 0 else bound

    def _expire(self, now: float) -> list:
        """End the sessions whose client has been away longer than they outlive it (an MQTT 5.0
        client's Session Expiry Interval, §3.1.2.11.2, else the topology's
        ``sessions.expire_after``); when the next one is due."""
        out: list = []
        due = float("inf")
        for live in list(self.sessions.values()):
            state = live.state
            expiry = self._outlives(state)
            if expiry == float("inf") or live.follower is not None:
                continue
            if live.opening is not None or state.handover is not None or state.name in self._hands:
                due = min(due, now + expiry)  # being opened or moved: it is not away
                continue
            away = max(live.since, live.looked)
            if now - away < expiry:
                due = min(due, away + expiry)
                continue
            why = f"its client was away for longer than its expiry of {expiry:,.0f} s"
            out += self._end(live, now, why)
        self._expiry_due = due
        return out

    # -- wills held ------------------------------------------------------------------------

    def _arm_will(self, live: Live, now: float) -> None:
        """The session's will (``state.will``) goes ``state.will_delay`` seconds from now."""
        live.will_left = now
        live.will_due = now + max(0.0, live.state.will_delay)  # (NaN: at once)
        self._will_due = min(self._will_due, live.will_due)
        self._willing.add(live.state.name)

    def _drop_will(self, live: Live) -> None:
        live.state.will = None
        live.will_due = float("inf")
        self._willing.discard(live.state.name)

    def _wills(self, now: float) -> list:
        """Publish the wills whose delay has passed; when the next one is due."""
        out: list = []
        due = float("inf")
        for name in sorted(self._willing):
            live = self.sessions.get(name)
            if live is None or live.state.will is None:  # (gone some other way)
                self._willing.discard(name)
                continue
            if now < live.will_due:
                due = min(due, live.will_due)
                continue
            out += self._publish_will(live, now)
        self._will_due = due
        return out

    def _publish_will(self, live: Live, now: float) -> list:
        """Publish the will the session holds, if any, from this broker's pubend (its client's
        broker checked that it may). Its publish time moves on by how long it was held, so its
        Message Expiry Interval counts from now (§3.1.3.2.4)."""
        will = live.state.will
        if will is None:
            return []
        self._drop_will(live)
        self.store.save_session(live.state)
        if will.published_at > 0:
            held = int(max(0.0, now - live.will_left) * 1_000_000_000)
            will = m.Event(will.attributes, will.payload, will.published_at + held)
        return self._publish(live.state.name, will, now)

    def _publish(self, name: str, will: m.Event, now: float) -> list:
        """Publish session ``name``'s will from this broker's pubend (no client to answer)."""
        text = f"durable session {name}: its client's will is published"
        return [Notice("info", text), *self.publishing.on_publish(None, m.Publish(0, [will]), now)]

    def _retention(self, now: float) -> list:
        """Let go of the oldest events of sessions over their limits, a chunk at a time; the
        client is told which ticks per pubend it may have missed (a gap notice first in its
        stream)."""
        out: list = []
        limits = self.topology.session_limits
        cut_by_age: dict[float, int] = {}
        for live in self.sessions.values():
            state = live.state
            max_events = state.max_events or limits.max_events
            max_age = state.max_age or limits.max_age
            after = max(state.acked, state.trimmed)
            cut = after
            if live.held > max_events:
                cut = self.store.nth(state.key, after, min(live.held - max_events, TRIM_CHUNK))
                why = f"over the session's limit of {max_events:,} events held"
            if max_age not in cut_by_age:
                cut_by_age[max_age] = self.store.stored_before(max_age)
            if cut_by_age[max_age] > cut:
                cut = self.store.nth(state.key, after, TRIM_CHUNK)
                cut = min(cut, cut_by_age[max_age])
                why = f"older than the session's limit of {max_age:,.0f} s"
            if cut <= after:
                continue
            unsent = max(after, live.sent if live.follower is not None else after)
            for pubend, (lo, hi) in self.store.ticks(state.key, unsent, cut).items():
                old = state.gaps.get(pubend)
                state.gaps[pubend] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            gone = self.store.count(state.key, after, cut)
            state.dropped += gone
            live.held = max(0, live.held - gone)
            state.trimmed = cut
            state.gap_why = why
            self.store.release(state.key, cut)
            self.store.save_session(state)
            out.append(
                Notice("warning", f"durable session {state.name}: {gone:,} events let go, {why}")
            )
            out += self._pump(live)
        return out
