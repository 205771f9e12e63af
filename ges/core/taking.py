"""Taking a durable session over from another replicator: the target's half of a hand-over
(ges.core.handover has the theory of operation, seed 004 §4).

The target enters the session's subscriptions; once their SubAcks are complete it reads each
pubend's log after the source's cut, holding the session's live events of a pubend until it is
read, and for a while reads every pubend it hears of for the first time from its start. Once
all of it is committed it answers ``taken``.
"""

from __future__ import annotations

from ges.core.handover import HANDOVER_WATCH, MAX_CUTS, Hand
from ges.core.readback import MAX_HELD_BYTES, Replay
from ges.durable import session_name_problem
from ges.durable.profiles import subs_problem
from ges.durable.store import SessionState
from ges.wire import messages as m
from ges.wire.messages import held_size


class Taking:
    """The target's half of :class:`ges.core.handover.HandOver` (state: ``self._hands``)."""

    def on_handover(self, msg: m.Handover, now: float) -> list:
        """Replicator ``msg.source`` hands session ``msg.name`` over to this one."""
        why = session_name_problem(msg.name) or subs_problem(msg.subs)
        if why is None and len(msg.cuts) > MAX_CUTS:
            why = f"{len(msg.cuts)} pubend cuts, over {MAX_CUTS}"
        if why is not None:
            return self._note(msg.source, msg.hid, msg.name[:128], "refused", why)
        if self._restoring or self._replays:
            return []  # still reading back after a restart: the source asks again
        live = self.sessions.get(msg.name)
        out: list = []
        if live is not None and live.state.handover and live.state.handover.get("phase") == "moved":
            # its tombstone, from when it was handed over away: it comes back
            self._hands.pop(msg.name, None)
            out += self._end(live, now)
            live = None
        if live is not None:
            h = live.state.handover
            if h is not None and h["dir"] == "in" and h["hid"] == msg.hid:
                if h["phase"] == "taken":  # said again, once that is durable (as it first was)
                    return self._once_kept(self._note(msg.source, msg.hid, msg.name, "taken"))
                return []  # being taken
            why = f"replicator {self.id} holds a durable session {msg.name!r} already"
            return self._note(msg.source, msg.hid, msg.name, "refused", why)
        if len(self.sessions) >= self.max_sessions:
            why = f"replicator {self.id} holds {self.max_sessions} durable sessions, the most"
            return self._note(msg.source, msg.hid, msg.name, "refused", why)
        state = SessionState(msg.name, msg.owner, self._next_key, {}, msg.created)
        state.max_events, state.max_age, state.expiry = msg.max_events, msg.max_age, msg.expiry
        # the PUBRELs owed are by the source's epochs: negative, never one of this one's
        state.qos2, state.rel = set(msg.qos2), {-abs(e) for e in msg.rel if e}
        state.handover = {
            "dir": "in",
            "from": msg.source,
            "hid": msg.hid,
            "cuts": dict(msg.cuts),
            "phase": "taking",
        }
        live = self._add(state, now)
        hand = self._hands[msg.name] = Hand(now, now, cuts=dict(msg.cuts))
        subs = {s.sub_id: (s.profile_id, s.conjunctions) for s in msg.subs}
        out += self._subscribe(live, subs, {}, hand.waiting)
        state.subs = subs
        self.store.save_session(state)
        return out + self._taking_subscribed(live, now)

    def _taking_answered(self, live, msg, now: float) -> list | None:
        """What a session being taken here makes of its own subscriptions' answer (None: it
        is not being taken): once all are in place its pubends are read; one refused refuses
        the hand-over."""
        hand = self._hands.get(live.state.name)
        h = live.state.handover
        if hand is None or h is None or h["dir"] != "in" or h["phase"] != "taking":
            return None
        if type(msg) is m.Error:
            self._hands.pop(live.state.name, None)
            why = f"its profile is refused at {self.id}: {msg.reason}"
            out = self._note(h["from"], h["hid"], live.state.name, "refused", why)
            return out + self._end(live, now)
        if type(msg) is not m.SubAck or msg.req not in hand.waiting or not msg.complete:
            # an incomplete SubAck (a keeper not reached yet) is followed by a complete one:
            # only then is the subscription's starting point known to be behind what the log
            # has, so that reading up to its last commit leaves nothing between the two
            return []
        hand.waiting.discard(msg.req)
        return self._taking_subscribed(live, now)

    def _taking_subscribed(self, live, now: float) -> list:
        """A taken session's subscriptions are in place: read each pubend after its cut — every
        one known here now, and for a while each heard of later (a pubend the source had not
        heard of when it cut is read from its start)."""
        hand = self._hands.get(live.state.name)
        if hand is None or hand.waiting or hand.replays is not None:
            return []
        cuts = hand.cuts
        # (and those a restart's read-back is reading: read here for this session, not there;
        # and this broker's own pubend, which no subend follows here)
        known = set(cuts) | self._known_pubends() | set(self._replays)
        if self.log is not None:
            known.add(self.pubend)
        live.state.floors = {p: cuts[p] for p in known if cuts.get(p, 0) > 0}
        live.state.reading = {p: cuts.get(p, 0) for p in known}
        self.store.save_session(live.state)
        hand.replays = {}
        hand.watch_until = now + HANDOVER_WATCH
        for pubend in known:  # all in place before any is read (its own log answers at once)
            hand.seen.add(pubend)
            hand.replays[pubend] = Replay(cuts.get(pubend, 0) + 1)
        out: list = []
        for pubend in sorted(known):
            out += self._taking_ask(live, pubend, now)
        return out + self._taking_done(live, now)

    def _read(self, live, hand: Hand, pubend: str, now: float) -> list:
        """Read ``pubend`` for the session from its cut on."""
        hand.seen.add(pubend)
        hand.replays[pubend] = Replay(hand.cuts.get(pubend, 0) + 1)
        live.state.reading[pubend] = hand.cuts.get(pubend, 0)
        self.store.save_session(live.state)
        return self._taking_ask(live, pubend, now)

    def _taking_ask(self, live, pubend: str, now: float) -> list:
        hand = self._hands[live.state.name]
        rp = hand.replays.get(pubend)
        if rp is None:
            return []
        return self._ask_log(pubend, rp, now, lambda a: self._taking_page(live, rp, a, now))

    def taking_replayed(self, msg: m.Recovered, now: float) -> tuple[list, bool]:
        """A page of a pubend's log for sessions being taken here; the outputs, and whether it
        was one (else it is the read-back's)."""
        out: list = []
        took = False
        for name, hand in list(self._hands.items()):
            rp = None if hand.replays is None else hand.replays.get(msg.pubend)
            if rp is None or rp.next != msg.lo:
                continue
            live = self.sessions.get(name)
            if live is None:  # it ended meanwhile
                continue
            took = True
            got, more = self._taking_page(live, rp, msg, now)
            out += got
            if more:
                out += self._taking_ask(live, msg.pubend, now)
        return out, took

    def _taking_page(self, live, rp: Replay, msg: m.Recovered, now: float) -> tuple[list, bool]:
        """Store what the session wants of one page; whether there is more to read."""
        state = live.state
        hand = self._hands[state.name]
        pubend = msg.pubend
        key = state.key
        top = state.floors.get(pubend, 0)
        if msg.lost and msg.hi >= msg.lo:
            why = "gone from the pubend's log before its hand-over read it"
            gap = m.EventItem(msg.lo, 0, 0, m.Event({}))
            self._append(pubend, gap, {key: []}, msg.hi, why)
            hand.last = self.store.last
        else:
            match = self.subscriptions.profiles.match
            first = self.store.last + 1
            for it in msg.items:
                if it.tick <= top:
                    continue
                subs = sorted(sub for conn, sub in match(it.event.attributes) if conn == -key)
                if subs:
                    self._append(pubend, m.EventItem(it.tick, 0, it.hops, it.event), {key: subs})
                    hand.last = self.store.last
            if self.store.last >= first:  # none of it acknowledged before it is committed
                self._pending(pubend, msg.lo, first)
        if msg.hi >= msg.lo:
            # (saved with what it stored: a crash keeps both or neither, and a read-back after
            # it stores nothing of this page twice)
            state.floors[pubend] = max(top, msg.hi)
            self.store.save_session(state)
            rp.next = msg.hi + 1
            return self._committed_now(), True
        if rp.next - 1 < rp.let_go:  # live events were let go beyond what was read: read on
            return [], True
        del hand.replays[pubend]  # read up to the last commit: live events from here on
        state.reading.pop(pubend, None)
        self.store.save_session(state)
        out = self._taking_flush(live, pubend, rp.held)
        return out + self._taking_done(live, now), False

    def _taking_flush(self, live, pubend: str, held: list) -> list:
        """The live events held while the pubend was read, after what was read."""
        hand = self._hands[live.state.name]
        key = live.state.key
        top = live.state.floors.get(pubend, 0)
        per_tick: dict[int, tuple[m.EventItem, list[int]]] = {}
        for (_, sub_id), items in held:
            for it in items:
                if it.tick > top:
                    per_tick.setdefault(it.tick, (it, []))[1].append(sub_id)
        first = self.store.last + 1
        for tick in sorted(per_tick):
            it, subs = per_tick[tick]
            self._append(pubend, m.EventItem(it.tick, 0, it.hops, it.event), {key: sorted(subs)})
            hand.last = self.store.last
        if per_tick:
            self._pending(pubend, min(per_tick), first)
            live.state.floors[pubend] = max(per_tick)
            self.store.save_session(live.state)
        return self._committed_now()

    def taking_hold(self, pubend: str, matched: list, now: float) -> tuple[list, list]:
        """Of the live ``matched`` (``[((conn, sub_id), items)]``), what goes on to be stored,
        and the outputs: a session being taken here holds its events of a pubend being read
        (before its subscriptions are all in, the read gets them: they go), and a pubend heard
        of for the first time while it watches is read from its cut first."""
        kept: list = []
        out: list = []
        for entry in matched:
            live = self._by_key.get(-entry[0][0])
            hand = None if live is None else self._hands.get(live.state.name)
            h = None if live is None else live.state.handover
            if hand is None or (h is not None and h["dir"] == "out"):
                kept.append(entry)
                continue
            if hand.replays is None:
                continue
            rp = hand.replays.get(pubend)
            if rp is None and hand.watch_until and pubend not in hand.seen:
                out += self._read(live, hand, pubend, now)
                rp = hand.replays.get(pubend)
            if rp is None:  # read already: stored as it comes
                kept.append(entry)
                continue
            size = sum(held_size(it) for it in entry[1])
            if rp.held_bytes + size > MAX_HELD_BYTES:  # let go: the read gets them too
                rp.let_go = max([rp.let_go, *(it.tick for it in entry[1])])
                continue
            rp.held.append(entry)
            rp.held_bytes += size
        return kept, out

    def _taking_done(self, live, now: float) -> list:
        """Every pubend read and committed: the session is taken."""
        state = live.state
        hand = self._hands.get(state.name)
        h = state.handover
        if hand is None or hand.replays is None or hand.replays:
            return []
        if h is None or h["dir"] != "in" or h["phase"] != "taking":
            return []
        if self.store.committed < hand.last:
            return []  # on_committed looks again
        state.handover = {**h, "phase": "taken"}
        self.store.save_session(state)
        hand.asked = now
        return self._once_kept(self._note(h["from"], h["hid"], state.name, "taken"))
