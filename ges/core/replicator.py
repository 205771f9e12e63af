"""A replicator: durable sessions, the events stored for them, and their streams (seed 004 §4).

Theory of operation
-------------------
A broker that hosts a unit's replicator holds the durable sessions homed there. Each session's
subscriptions are this broker's own — entered, exported and started like a client's, under the
connection number ``-key`` — so content routing brings every event they match into the unit
whether or not the session's client is connected, and the subend delivers each exactly once,
in order per pubend. :meth:`Replicator.stored` takes those deliveries (from
``Subscriptions.deliver``) and appends each event once to the store with the sessions and
subscriptions it matched (seed 001 §4.2), numbered by the replicator's epochs. This broker
acknowledges no tick of a pubend to its log release rounds above what the store has made
durable (:meth:`floor`), so whatever a crash loses is still in the pubend's log.

A session's *follower* is the connection its events stream to: its client's, when the client
is connected here, or the link-like connection of the broker the client is at
(ges.runtime.sessions), which passes them on. A session streams in epoch order what is
committed after its resume point, within a window beyond what its client acknowledged
(ges.core.streaming): catch-up and live are the same stream, read from the store a page at a
time, so the seam between them is one number. Opening a session where another connection follows it
takes it over: the old follower is told (``SessionClosed``) before the new one is answered,
and the new one resumes after the epoch its client presents or the session's acknowledged
one, whichever is later — nothing that either connection acknowledged is delivered again.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import attrs
import msgspec

from ges.core.handover import HandOver
from ges.core.lifetime import RETENTION_EVERY, Lifetime
from ges.core.outputs import Notice, ToClient
from ges.core.part import Part
from ges.core.readback import ReadBack, Replay
from ges.core.retaining import RETAINED_CONN, Retaining, Undurable
from ges.core.streaming import Streaming
from ges.core.taking import Taking
from ges.durable import session_name_problem
from ges.durable.profiles import describe, subs_problem
from ges.durable.retained import RetainedSet
from ges.durable.store import SessionState, SessionStore
from ges.wire import messages as m

#: Durable sessions one replicator holds at most.
MAX_SESSIONS = 10_000
#: Seconds a restarted replicator waits for its sessions' subscriptions to be complete (every
#: keeper has them) before it reads the logs back anyway.
RESTORE_WAIT = 60.0


@attrs.define(eq=False)
class Live:
    """A session held here, with its stream."""

    state: SessionState
    #: the connection its events go to (None: its client is not connected anywhere)
    follower: int | None = None
    #: the broker its client is at, and since when it is there (or disconnected)
    at: str = ""
    since: float = 0.0
    #: when a broker its client connects at last looked it up (its expiry counts from then
    #: too: the client is on its way back)
    looked: float = 0.0
    #: where its client was last connected (for the line a move logs)
    last_at: str = ""
    #: the last epoch sent to the follower, and what is in flight beyond the acknowledgement:
    #: per batch sent, (its last epoch, its bytes, the epochs of its events)
    sent: int = 0
    inflight: deque = attrs.Factory(deque)
    inflight_bytes: int = 0
    #: an open waiting for its subscriptions to start: (conn, the SessionOpen, the reqs left —
    #: and, < 0, the mark of the save that made the session while that is not durable —,
    #: whether it made the session, the subscriptions it had before)
    opening: tuple | None = None
    #: the reqs of earlier opens on the same connection that this open took over while their
    #: subscriptions went in (an MQTT client's SUBSCRIBEs in quick succession): answered with
    #: it, first
    also: list = attrs.Factory(list)
    #: events held for it after what its client acknowledged (kept up to date here, so
    #: retention needs no count of the store), and the last epoch stored for it
    held: int = 0
    last: int = 0
    #: not handed over to another replicator before this time (one was refused or given up)
    backoff: float = 0.0
    #: when the will it holds (``state.will``) was left with it, and is due to go
    will_left: float = 0.0
    will_due: float = float("inf")
    #: it ends as the client it streams to leaves (``SessionOpen.ends``)
    ends: bool = False
    #: the mark of the save that made it, while that may not be durable (0: it is)
    made: int = 0


class Replicator(Lifetime, Streaming, HandOver, Taking, ReadBack, Retaining, Part):
    """The durable sessions of this broker's replicator (see the module docstring; reading back
    after a restart: ges.core.readback; handing a session over to another replicator:
    ges.core.handover and ges.core.taking; retained messages: ges.core.retaining)."""

    def __init__(self, core, store: SessionStore):
        super().__init__(core)
        self.store = store
        self.sessions: dict[str, Live] = {}
        self._by_key: dict[int, Live] = {}
        #: sessions with events appended since the last commit was streamed
        self._dirty: set[int] = set()
        #: per pubend, (epoch, tick) of the first of each group of its events stored and not
        #: yet committed, in order
        self._uncommitted: dict[str, deque] = {}
        self._reqs = 0
        self._next_key = 1
        #: per pubend, the tick up to which everything its sessions want is stored (kept)
        self._top: dict[str, int] = store.tops()
        #: after a restart with sessions: their subscriptions' SubAcks still to come, whether
        #: they are all in place, the pubends read back (or not needing it), and those being
        self._restarted = False
        self._restoring: set[int] = set()
        #: per session key still restoring, the req waited for per subscription
        self._restoring_of: dict[int, dict[int, int]] = {}
        self._restore_by = float("inf")
        #: the next look for pubends heard of since the read-back began (ges.core.readback)
        self._look_due = float("inf")
        self._retention_due = 0.0
        #: when the first session whose client is away is due to end (inf: none is)
        self._expiry_due = float("inf")
        #: when the first will held is due to go (inf: none is), and the sessions holding one
        self._will_due = float("inf")
        self._willing: set[str] = set()
        self._live: set[str] = set()
        self._replays: dict[str, Replay] = {}
        #: hand-overs in progress here, by session name, and each broker's home replicator
        #: (ges.core.handover)
        self._hands: dict = {}
        self._homes: dict[str, str] = {}
        #: outputs waiting for a save of a session to be durable: (its mark, outputs)
        self._after_kept: list[tuple[int, list]] = []
        #: sessions whose open waits for the save that made the session to be durable
        self._unkept: set[str] = set()
        self.max_sessions = MAX_SESSIONS
        self.retained = RetainedSet()
        #: retained messages (ges.core.retaining): the standing subscription's req while the
        #: catch-up waits for it (0: none), the pubends being read for it (None: no catch-up)
        #: and those read, and per pubend (the store's save mark, tick) of each retained change
        #: not yet durable
        self._retained_req = 0
        self._catching: dict[str, Replay] | None = None
        self._caught: set[str] = set()
        self._catch_due = float("inf")  # the next look for pubends heard of since
        self._retaining: dict[str, Undurable] = {}
        #: asks of what is retained waiting, per connection (round robin: [(ask, bytes), …],
        #: bytes in all), and in all; whether the job answering them is under way
        self._asks: OrderedDict[int, list] = OrderedDict()
        self._asks_bytes = 0
        self._asking = False
        self._walking: int | None = None  # the connection whose ask is being walked

    # -- starting ---------------------------------------------------------------------------

    def restore(self, now: float) -> list:
        """Enter the stored sessions' subscriptions (a restarted replicator) and the
        subscription to retained messages; the outputs."""
        out: list = self._retained_start()
        for _, state in sorted(self.store.sessions().items()):
            live = self._add(state, now)
            live.held, live.last = self.store.held(state.key, state.acked)
            self._away(live, now)  # (restarted: its client is away from now at least)
            if state.will is not None:  # its delay counts anew
                self._arm_will(live, now)
            enter = self._restore_handover(live, now)
            if enter is None:  # it was being taken here: forgotten (the source asks again)
                out += self._end(live, now)
                continue
            if not enter:  # given away: its subscriptions went
                continue
            restoring = self._restoring_of[state.key] = {}
            out += self._subscribe(live, state.subs, {}, set(), restoring)
        self._restarted = bool(self._restoring)
        self._restore_by = now + RESTORE_WAIT
        return out

    def _add(self, state: SessionState, now: float) -> Live:
        live = Live(state, since=now, sent=state.acked)
        self.sessions[state.name] = live
        self._by_key[state.key] = live
        self._next_key = max(self._next_key, state.key + 1)
        self.subscriptions.client_open(-state.key, f"session {state.name}")
        return live

    def _subscribe(
        self, live: Live, subs: dict, old: dict, waiting: set[int], restoring: dict | None = None
    ) -> list:
        """Enter ``subs`` (new or changed against ``old``) and take out what ``old`` has that
        ``subs`` does not, as the session's own subscriptions; the reqs to wait for go into
        ``waiting``. ``restoring``: a restarted replicator's, whose read-back waits for these
        (their complete SubAcks) too. One whose read-back waits for a subscription changed
        or taken out here waits for the change instead, or no more."""
        out: list = []
        key = live.state.key
        now = self.subscriptions.now
        waits = self._restoring_of.get(key) if restoring is None else restoring
        for sub_id, (profile_id, conjunctions) in subs.items():
            if old.get(sub_id) == (profile_id, conjunctions):
                continue
            self._reqs += 1
            waiting.add(self._reqs)
            if waits is not None and (restoring is not None or sub_id in waits):
                self._rewait(waits, sub_id, self._reqs)
            msg = m.Subscribe(sub_id, conjunctions, profile_id, req=self._reqs)
            out += self.subscriptions.on_subscribe(-key, msg, now)
        for sub_id in old:
            if sub_id not in subs:
                self._reqs += 1
                waiting.add(self._reqs)
                if waits is not None and sub_id in waits:
                    out += self._waited(key, waits[sub_id], now)
                msg = m.Unsubscribe(sub_id, req=self._reqs)
                out += self.subscriptions.on_unsubscribe(-key, msg, now)
        return out

    def _waited(self, key: int, req: int, now: float) -> list:
        """A restarted replicator's read-back waits for ``req`` of session ``key`` no more
        (complete, refused, or taken out); once it waits for none, the logs are read back."""
        if req not in self._restoring:
            return []
        waits = self._restoring_of.get(key, {})
        for sub_id in [s for s, r in waits.items() if r == req]:
            self._rewait(waits, sub_id, None)
        self._restoring.discard(req)
        return [] if self._restoring else self._replay_all(now)

    def _rewait(self, waits: dict, sub_id: int, req: int | None) -> None:
        """The read-back waits for ``req`` for subscription ``sub_id`` (None: for nothing)."""
        old = waits.pop(sub_id, None)
        if old is not None:
            self._restoring.discard(old)
        if req is not None:
            waits[sub_id] = req
            self._restoring.add(req)

    # -- what the session's own subscriptions answer (the driver hands them over) ------------

    def own(self, conn: int, msg, now: float) -> list:
        """A message the core addressed to a session's own connection ``conn`` (< 0): the
        ``SubAck`` an open waits for; the outputs."""
        if conn == RETAINED_CONN:
            return self._retained_answered(msg, now)
        live = self._by_key.get(-conn)
        if live is None:
            return []
        taking = self._taking_answered(live, msg, now) if self._hands else None
        if taking is not None:
            return taking
        key = live.state.key
        if type(msg) is m.Error:  # a subscription refused: the open fails, in one line
            if live.opening is None or msg.req not in live.opening[2]:
                restored = msg.req in self._restoring
                out = self._waited(key, msg.req, now)  # (it never starts: not waited for)
                if not restored:
                    return out
                # a stored profile this broker no longer takes: said, not waited for
                text = f"durable session {live.state.name}: its stored profile is refused: {msg.reason}"
                return [Notice("warning", text), *out]
            follower, open_msg, _, created, before = live.opening
            live.opening = None
            reqs, live.also = [*live.also, open_msg.req], []
            out = [ToClient(follower, m.Error(msg.reason, req=req)) for req in reqs]
            if created:
                return out + self._end(live, now)
            live.state.subs = before  # the change is refused: the session keeps what it had
            self.store.save_session(live.state)
            out += self._subscribe(live, before, {}, set())  # (a restart's wait: for this now)
            return out + self._waited(key, msg.req, now)
        if type(msg) is not m.SubAck:
            return []
        # (an incomplete one: a keeper not reached yet, the subscription starts only once it has
        # it, maybe after what the logs hold now — a read-back waits for the complete one)
        out = self._waited(key, msg.req, now) if msg.complete else []
        if live.opening is None:  # (a change made while restoring is its open's too)
            return out
        follower, open_msg, waiting, created, _ = live.opening
        waiting.discard(msg.req)
        if waiting:
            return out
        live.opening = None
        return out + self._opened(live, follower, open_msg, created, now)

    # -- requests ---------------------------------------------------------------------------

    def find(self, name: str, now: float, lookup: bool = False) -> m.SessionList:
        """The session ``name`` if it is here; ``lookup``: a broker asks, for a client that
        is connecting (its expiry counts from now)."""
        live = self.sessions.get(name)
        if live is not None and lookup and live.follower is None:
            live.looked = now
            self._arm(live)
        return m.SessionList([] if live is None else [self._info(live, now)])

    def open(self, conn: int, msg: m.SessionOpen, now: float, wall: float = 0.0) -> list:
        """Open, resume or take over session ``msg.name`` for connection ``conn`` (``wall``:
        the time of day, kept as its creation time)."""
        why = session_name_problem(msg.name) or subs_problem(msg.subs)
        if why is not None:
            return [ToClient(conn, m.Error(why, req=msg.req))]
        live = self.sessions.get(msg.name)
        created = False
        if live is None:
            if not msg.create:
                return [
                    ToClient(conn, m.Error(f"no durable session {msg.name!r} here", req=msg.req))
                ]
            if msg.subs is None and msg.fallback_refused:
                return [ToClient(conn, m.Error(msg.fallback_refused, denied=True, req=msg.req))]
            if msg.subs is None and msg.fallback:
                why = subs_problem(msg.fallback)
                if why is not None:
                    return [ToClient(conn, m.Error(why, req=msg.req))]
                msg = msgspec.structs.replace(msg, subs=msg.fallback)
            if msg.subs is None:
                reason = f"durable session {msg.name!r} does not exist: give its subscriptions"
                return [ToClient(conn, m.Error(reason, req=msg.req))]
            if len(self.sessions) >= self.max_sessions:
                reason = (
                    f"replicator {self.id} holds {self.max_sessions} durable sessions, the most"
                )
                return [ToClient(conn, m.Error(reason, req=msg.req))]
            live = self._add(SessionState(msg.name, msg.owner, self._next_key, {}, wall), now)
            created = True
        elif live.state.owner and msg.owner != live.state.owner and not msg.operator:
            reason = f"durable session {msg.name!r} belongs to {live.state.owner!r}"
            return [ToClient(conn, m.Error(reason, denied=True, req=msg.req))]
        elif (redirect := self._redirect(live, conn, msg)) is not None:
            return redirect
        elif live.state.handover is not None and msg.subs is not None:
            subs = {s.sub_id: (s.profile_id, s.conjunctions) for s in msg.subs}
            if subs != live.state.subs:  # its profile changes once it is handed over
                why = f"being handed over to replicator {live.state.handover['to']}: try again"
                return [ToClient(conn, m.SessionClosed(msg.name, why, retry=True, req=msg.req))]
        elif live.opening is not None:  # taken over while its subscriptions go in: wait too
            old_conn, old_msg, waiting, created, before = live.opening
            live.opening = None
            if old_conn == conn:  # the same connection again: no takeover, answered together
                live.also.append(old_msg.req)
                return self._open(live, conn, msg, created, now, waiting, before)
            live.also = []  # (the old connection is told it was taken over: that answers it)
            note = m.SessionClosed(msg.name, f"taken over at {msg.at or self.id}", req=old_msg.req)
            out = [ToClient(old_conn, note)]
            return out + self._open(live, conn, msg, created, now, waiting, before)
        return self._open(live, conn, msg, created, now)

    def _open(
        self,
        live: Live,
        conn: int,
        msg: m.SessionOpen,
        created: bool,
        now: float,
        waiting: set[int] | None = None,
        before: dict | None = None,
    ) -> list:
        out: list = []
        before = dict(live.state.subs) if before is None else before
        if live.state.will is not None:  # its client is back before its will went: it never does
            self._drop_will(live)
            self.store.save_session(live.state)
        if live.follower is not None:
            if live.follower != conn:  # the same connection opening it again is no takeover
                reason = f"taken over at {msg.at or self.id}"
                out.append(ToClient(live.follower, m.SessionClosed(msg.name, reason)))
            self._detach(live, now)
        waiting = set() if waiting is None else waiting
        if msg.max_events or msg.max_age:  # its own retention limits, from now on
            live.state.max_events, live.state.max_age = msg.max_events, msg.max_age
            self.store.save_session(live.state)
        if msg.expiry is not None and msg.expiry >= 0 and msg.expiry != live.state.expiry:
            live.state.expiry = msg.expiry
            self.store.save_session(live.state)
            if live.follower is None:  # (an open that fails leaves it away, by this expiry)
                self._arm(live)
        if msg.subs is not None:
            subs = {s.sub_id: (s.profile_id, s.conjunctions) for s in msg.subs}
            out += self._subscribe(live, subs, live.state.subs, waiting)
            live.state.subs = subs
            self.store.save_session(live.state)
        if created:
            live.made = self.store.saved
        if live.made and not self.store.durable(live.made):
            # a crash before the save that made it is durable would leave no session behind
            # an answer: every open waits for that too, this one or one after it (a mark, < 0
            # among the reqs it waits for: _kept_now)
            waiting.add(-live.made)
            self._unkept.add(live.state.name)
        else:
            live.made = 0
        if waiting:
            live.opening = (conn, msg, waiting, created, before)
            return out
        return out + self._opened(live, conn, msg, created, now)

    def _opened(self, live: Live, conn: int, msg: m.SessionOpen, created: bool, now: float) -> list:
        """The session's subscriptions are in place: it streams to ``conn`` from its resume
        point."""
        state = live.state
        start = state.acked
        if msg.epoch >= 0 and msg.store == self.store.id:
            start = max(start, min(msg.epoch, self.store.committed))
        if start > state.acked:  # counted from what is in flight, while a follower has it
            held = None  # (else in the store: at most a window's worth, but for a restart)
            if live.follower is not None and start <= live.sent:
                held = self._sent_upto(live, start)
            self._acked(live, start, held)
        was = live.at or live.last_at
        sent_before = max(live.sent, start)
        live.follower = conn
        live.ends = msg.ends
        live.at = msg.at or self.id
        live.since = now
        live.sent = start
        live.inflight.clear()
        live.inflight_bytes = 0
        # what it holds is counted as it changes (not in the store: a count there reads every
        # event held, a million for a client away long, on the broker's event loop); what is
        # not committed yet cannot have reached a client before (DUP up to ``last``)
        backlog, last = live.held, min(live.last, self.store.committed)
        ordered = sorted(state.subs.items())
        subs = [(sub_id, profile_id) for sub_id, (profile_id, _) in ordered]
        opened = m.SessionOpened(
            state.name,
            self.id,
            self.store.id,
            created,
            start,
            backlog,
            subs,
            req=msg.req,
            profiles=[list(conjunctions) for _, (_, conjunctions) in ordered],
            last=last,
            qos2=sorted(state.qos2),
            rel=sorted(state.rel),
            sent=sent_before,
        )
        moved = f"{was} -> {live.at}" if was else f"opened at {live.at}"
        text = f"durable session {state.name}: {moved}, {backlog:,} to replay"
        earlier, live.also = live.also, []
        out = [ToClient(conn, msgspec.structs.replace(opened, req=req)) for req in earlier]
        out += [ToClient(conn, opened), Notice("info", text), *self._pump(live)]
        # (back with all it had from here: a hand-over waiting for that sends it on now)
        return out + self._tail_done(live, now)

    def ack(self, conn: int, msg: m.SessionAck) -> list:
        """The follower's client has the session up to ``msg.epoch``; with ``msg.req``, it is
        told once that is durable (``SessionKept``: a crash meanwhile could lose the save, and
        a client back without its token would get those events again)."""
        live = self.sessions.get(msg.name)
        if live is None or live.follower != conn:
            return []  # (not this session's client now: it is not kept, nor said to be)
        epoch = min(msg.epoch, live.sent)
        moved = epoch > live.state.acked
        if moved:
            self._acked(live, epoch, self._sent_upto(live, epoch))
        # (told before what the ack sets off: the end of a hand-over's tail sends it on)
        out = (
            self._once_kept([ToClient(conn, m.SessionKept(msg.name, req=msg.req))])
            if msg.req
            else []
        )
        if moved:
            out += self._pump(live) + self._tail_done(live, self.subscriptions.now)
        return out

    def qos2(self, conn: int, msg: m.SessionQos2) -> list:
        """The QoS 2 identifiers session ``msg.name``'s client holds, changed (from its
        follower only); answered once durable, if asked."""
        live = self.sessions.get(msg.name)
        if live is None or live.follower != conn:
            return []  # taken over meanwhile: its client never hears PUBREC, and sends again
        state = live.state
        if msg.whole:  # all it holds: its epochs owed may be the replicator's it came from
            state.qos2 = {pid for pid in msg.add if 0 < pid < 65536}
            # < 0: owed by another replicator's epochs (a hand-over); its own, if sent
            state.rel = {e for e in msg.rel_add if e < 0 or 0 < e <= live.sent}
        state.qos2.difference_update(msg.drop)
        state.qos2.update(pid for pid in msg.add if 0 < pid < 65536)
        state.rel.difference_update(msg.rel_drop)
        state.rel.update(epoch for epoch in msg.rel_add if 0 < epoch <= live.sent)
        if len(state.rel) > 65535:  # no client holds more identifiers: a lying broker's
            state.rel = set(sorted(state.rel)[-65535:])
        self.store.save_session(live.state)
        if not msg.req:
            return []
        return self._once_kept([ToClient(conn, m.SessionKept(msg.name, req=msg.req))])

    def _acked(self, live: Live, epoch: int, held: int | None = None) -> None:
        """The client has what was stored for it up to ``epoch``: ``held`` of the events held
        for it (None: counted in the store)."""
        if held is None:
            held = self.store.count(
                live.state.key, max(live.state.acked, live.state.trimmed), epoch
            )
        live.held = max(0, live.held - held)
        live.state.acked = epoch
        if epoch >= live.state.trimmed:  # it has been told of what retention let go
            live.state.gaps.clear()
        self.store.release(live.state.key, epoch)
        self.store.save_session(live.state)

    def leave(self, conn: int, msg: m.SessionLeave, now: float) -> list:
        """The client of session ``msg.name`` left the broker that follows it on ``conn``; the
        session outlives it by ``msg.expiry`` from now on (None: as it did), or ends with
        ``msg.end``; its ``will`` is published ``will_delay`` seconds from now unless the
        session is opened first (at once if it ends first)."""
        name = msg.name
        live = self.sessions.get(name)
        if live is None:  # it ended meanwhile (a Clean Start, an operator): its will goes now
            return [] if msg.will is None else self._publish(name, msg.will, now)
        other = live.follower if live.follower is not None else (live.opening or (None,))[0]
        if other is not None and other != conn:
            return []  # taken over meanwhile: its client is back, and its will never goes
        if msg.will is not None:
            live.state.will, live.state.will_delay = msg.will, msg.will_delay
            self._arm_will(live, now)
        if msg.back:  # its client is back on another connection of that broker: not ended
            live.ends = False
        if msg.end or (live.ends and live.follower == conn):
            return self._end(
                live, now, "its client left saying it ends (Session Expiry Interval 0)"
            )
        if msg.expiry is not None and msg.expiry >= 0:  # (not NaN)
            live.state.expiry = msg.expiry
        self.store.save_session(live.state)
        if live.follower == conn:  # (else already away: moved, or being opened again)
            self._detach(live, now)
        if live.state.handover is not None:  # being handed over: held only where it stays
            return self._publish_will(live, now)
        return []

    def follower_closed(self, conn: int, now: float) -> list:
        """Connection ``conn`` ended: every session following it is disconnected, and those
        opened to end as their client leaves end (its broker can tell this replicator no
        more: the client is cut); the outputs."""
        out: list = []
        self._drop_asks(conn)
        for live in list(self.sessions.values()):
            if live.follower == conn and live.ends:
                why = "the connection its client was followed on was lost (it was to end then)"
                out += self._end(live, now, why)
                continue
            if live.follower == conn:
                self._detach(live, now)
            if live.opening is not None and live.opening[0] == conn:
                live.opening = None
                live.also = []
                if live.follower is None:
                    self._away(live, now)
        return out

    def _detach(self, live: Live, now: float) -> None:
        live.follower = None
        live.last_at = live.at or live.last_at
        live.at = ""
        live.inflight.clear()
        live.inflight_bytes = 0
        self._away(live, now)

    def control(
        self, conn: int, msg: m.SessionControl, who: str, operator: bool, now: float
    ) -> list:
        """An operator's (or a session owner's) list, end or roam."""
        if msg.action == "list":
            found = [
                self._info(live, now)
                for name, live in sorted(self.sessions.items())
                if (not msg.name or name == msg.name)
                and (operator or live.state.owner in ("", who))
                and self._listed(live)
            ]
            return [ToClient(conn, m.SessionList(found, req=msg.req))]
        if msg.action not in ("end", "roam"):
            return [ToClient(conn, m.Error(f"unknown session action {msg.action!r}", req=msg.req))]
        live = self.sessions.get(msg.name)
        if live is None:
            return [ToClient(conn, m.Error(f"no durable session {msg.name!r} here", req=msg.req))]
        if live.state.owner not in ("", who) and not operator:
            reason = f"durable session {msg.name!r} belongs to {live.state.owner!r}"
            return [ToClient(conn, m.Error(reason, denied=True, req=msg.req))]
        info = self._info(live, now)
        out: list = []
        if msg.action == "roam":
            if msg.to not in self.topology.brokers:
                return [ToClient(conn, m.Error(f"unknown broker {msg.to!r}", req=msg.req))]
            if live.follower is None:
                reason = f"durable session {msg.name!r} is not connected: it resumes where its client connects"
                return [ToClient(conn, m.Error(reason, req=msg.req))]
            note = m.SessionClosed(msg.name, f"moved to {msg.to} by an operator", to=msg.to)
            out.append(ToClient(live.follower, note))
            self._detach(live, now)
        else:
            note = m.SessionClosed(msg.name, "ended by an operator", ended=True)
            for told in (live.follower, live.opening[0] if live.opening else None):
                if told is not None:
                    out.append(ToClient(told, note))
            out += self._end(live, now)
        return [*out, ToClient(conn, m.SessionList([info], req=msg.req))]

    def _end(self, live: Live, now: float, why: str = "") -> list:
        """The session ends (logged with ``why``, if given) and frees what it holds."""
        out = [Notice("info", f"durable session {live.state.name} ended: {why}")] if why else []
        out += self._publish_will(live, now)  # the session ends before its will's delay
        state = live.state
        del self.sessions[state.name]
        del self._by_key[state.key]
        self._hands.pop(state.name, None)  # (a read for it may still be answered: left alone)
        self._dirty.discard(state.key)
        self.store.drop_session(state)
        out += self.subscriptions.client_closed(-state.key, now)
        return out + self._unwaited(state.key, now)

    def _unwaited(self, key: int, now: float) -> list:
        """Session ``key`` ended: its restored subscriptions are not waited for any more; once
        no other is, the logs are read back (ges.core.readback). (One subscription at a time:
        :meth:`_waited`.)"""
        restoring = self._restoring_of.pop(key, None)
        if not restoring:
            return []
        self._restoring.difference_update(restoring.values())
        return [] if self._restoring else self._replay_all(now)

    def _info(self, live: Live, now: float) -> m.SessionInfo:
        state = live.state
        max_age = state.max_age or self.topology.session_limits.max_age
        subs = [
            (sub_id, profile_id, describe(conjunctions))
            for sub_id, (profile_id, conjunctions) in sorted(state.subs.items())
        ]
        return m.SessionInfo(
            state.name,
            state.owner,
            self.id,
            live.at,
            max(0.0, now - live.since),
            subs,
            state.acked,
            max(live.last, state.acked),
            live.held,
            state.created,
            state.dropped,
            live.follower is None and now - live.since > max_age,
            self._handing(live),
        )

    # -- storing and streaming --------------------------------------------------------------

    def stored(self, pubend: str, matched: list) -> list:
        """Events of ``pubend`` the sessions' own subscriptions got: ``matched`` is
        ``[((conn, sub_id), items)]``. Each event is stored once with the sessions and
        subscriptions it is for, in tick order (retained events: ges.core.retaining)."""
        notes: list = []
        for i, ((conn, _), items) in enumerate(matched):
            if conn == RETAINED_CONN:
                notes = self._retain(pubend, items)
                matched = matched[:i] + matched[i + 1 :]
                break
        if not matched:
            return notes
        return notes + self._stored(pubend, matched)

    def _stored(self, pubend: str, matched: list) -> list:
        if self._restarted and pubend not in self._live:
            return self._hold(pubend, matched)
        asks: list = []
        if self._hands:  # sessions being taken here hold theirs (ges.core.handover)
            matched, asks = self.taking_hold(pubend, matched, self.subscriptions.now)
        top = self._top.get(pubend, 0)
        per_tick: dict[int, tuple[m.EventItem, dict[int, list[int]]]] = {}
        for (conn, sub_id), items in matched:
            key = -conn
            live = self._by_key.get(key)
            if live is None:
                continue
            floor = max(top, live.state.floors.get(pubend, 0)) if live.state.floors else top
            for it in items:
                if it.tick <= floor:  # stored already (read back, or handed over)
                    continue
                got = per_tick.get(it.tick)
                if got is None:
                    per_tick[it.tick] = (it, {key: [sub_id]})
                else:
                    got[1].setdefault(key, []).append(sub_id)
        if not per_tick:
            return asks
        store = self.store
        first_epoch = store.last + 1
        for tick in sorted(per_tick):
            item, wants = per_tick[tick]
            self._append(pubend, _stored_item(item), wants)
        self._top[pubend] = last = max(per_tick)
        store.set_top(pubend, last)
        self._pending(pubend, min(per_tick), first_epoch)
        return asks + self._committed_now()

    def _append(
        self,
        pubend: str,
        item: m.EventItem,
        wants: dict[int, list[int]],
        gap_to: int = 0,
        why: str = "",
    ) -> None:
        """Store ``item`` (or a gap notice up to ``gap_to``, saying ``why``) once for the
        sessions ``wants`` names ({key: sub_ids}), held for each of them."""
        epoch = self.store.append(pubend, item, sorted(wants.items()), gap_to=gap_to, why=why)
        self._dirty.update(wants)
        for key in wants:
            live = self._by_key[key]
            live.held += 1
            live.last = epoch

    def _pending(self, pubend: str, tick: int, epoch: int) -> None:
        """Ticks of ``pubend`` from ``tick`` on are stored from ``epoch`` on, not committed."""
        q = self._uncommitted.get(pubend)
        if q is None:
            q = self._uncommitted[pubend] = deque()
        q.append((epoch, tick))

    @property
    def held_total(self) -> int:
        """Events held for the sessions, each counted once per session it is held for."""
        return sum(live.held for live in self.sessions.values())

    def floor(self, pubend: str) -> int | None:
        """The highest tick of ``pubend`` this broker may acknowledge for its sessions and
        retained messages (None: any): below what the store has not committed yet, and —
        after a restart, until the pubend is read back — what it had stored (the pubend's log
        keeps the rest)."""
        pin = self.pinned(pubend) if self._hands else None  # hand-overs (ges.core.handover)
        if self._restarted and pubend not in self._live:
            self._begin(pubend)
            got = self._horizon(pubend)
        else:
            q = self._uncommitted.get(pubend)
            got = q[0][1] - 1 if q else None
        if self._retaining or self._catching is not None:
            kept = self._retained_cap(pubend)
            if kept is not None:
                got = kept if got is None else min(got, kept)
        if pin is None:
            return got
        return pin if got is None else min(got, pin)

    def _committed_now(self) -> list:
        """A store that commits at once (in memory) has committed what was just appended."""
        store = self.store
        return self.on_committed() if store.committed >= store.last else []

    def on_timer(self, now: float) -> list:
        """Replay requests with no answer go again; retention's look comes due, and the end
        of sessions past their expiry."""
        out: list = []
        if now >= self._will_due:
            out += self._wills(now)
        if now >= self._expiry_due:
            out += self._expire(now)
        if now >= self._retention_due:
            self._retention_due = now + RETENTION_EVERY
            out += self._retention(now)
            out += self._consider_handovers(now)
        if self._hands:
            out += self._handover_timer(now)
        if self._restoring and now >= self._restore_by:  # a keeper still not reached
            text = (
                f"replicator {self.id}: {len(self._restoring)} restored subscriptions still "
                f"incomplete after {RESTORE_WAIT:.0f} s; reading the logs back now (events "
                "published before they start, if any, may be missed)"
            )
            self._restoring.clear()
            self._restoring_of.clear()
            out += [Notice("warning", text), *self._replay_all(now)]
        if not self._restoring:
            out += self._asks_due(self._replays, now, self._ask)
            if now >= self._look_due:
                out += self._replay_new(now)
        if self._retained_req or self._catching is not None:
            out += self._retained_timer(now)
        return out

    def next_deadline(self) -> float:
        due = min(
            self._retention_due if self.sessions else float("inf"),
            self._expiry_due,
            self._will_due,
        )
        if self._restoring:
            due = min(due, self._restore_by)
        if self._hands:
            due = min(due, self._handover_deadline())
        if self._retained_req or self._catching is not None:
            due = min(due, self._retained_deadline())
        if self._restoring:
            return due
        return min(due, self._look_due, self._asks_deadline(self._replays))

    def on_committed(self) -> list:
        """The store committed a group: what it holds may be acknowledged, and is streamed
        (appends made meanwhile wait for the next group; one append is never split)."""
        committed = self.store.committed
        for pubend in list(self._uncommitted):
            q = self._uncommitted[pubend]
            while q and q[0][0] <= committed:
                q.popleft()
            if not q:
                del self._uncommitted[pubend]
        for pubend in list(self._retaining):
            self._retained_floor(pubend)  # what is durable now is let go of
        out: list = []
        dirty = self._dirty
        if committed >= self.store.last:
            self._dirty = set()
        for key in sorted(dirty):
            live = self._by_key.get(key)
            if live is not None:
                out += self._pump(live)
        out += self._kept_now()
        for name in list(self._hands):  # hand-overs waiting for their reads to be committed
            live = self.sessions.get(name)
            if live is not None:
                out += self._taking_done(live, self.subscriptions.now)
        return out


def _stored_item(item: m.EventItem) -> m.EventItem:
    """What is kept of a delivered event item: its tick, hops and event (no routes)."""
    if not item.to and not item.path:
        return item
    return m.EventItem(item.tick, 0, item.hops, item.event)
