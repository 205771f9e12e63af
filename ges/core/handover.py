"""Handing a durable session over to the replicator of its client's unit (seed 004 §4).

Theory of operation
-------------------
A session is homed where it was made (ges.durable). Once its client has stayed connected for
``handover_after`` seconds (the topology's ``sessions:``) at a broker whose home replicator is
another one —
it roamed into a finer replicator's sub-unit, or out of this replicator's unit — this
replicator, the *source*, hands the session over to that one, the *target*: seed 004 §4
delegates the retrieval of a client's events to the stable storage that serves the client's
present context, and the coarser one answers only for a client whose last broker it served.

1. The source *cuts*: per pubend, the tick up to which it holds everything the session wants
   (what it stored, or acknowledged — ges.core.readback's horizon), and the last epoch it had
   stored then. It streams the session no further than that epoch, and acknowledges no tick of
   any pubend above its cut (:meth:`HandOver.pinned`: the pubends' logs keep the rest, its own
   pubend's log too) until the hand-over is taken or given up. It goes on storing for the
   session meanwhile, in case the hand-over is given up.
2. The target enters the session's subscriptions as its own. Once they are in place it reads
   from each pubend's log everything after the cut, up to the log's last commit — past every
   tick its subscriptions' starting points can be — and stores what the session wants (a
   replay nack, as a restarted replicator reads back; its own pubend's log it reads here). The
   session's live events of a pubend wait until that pubend is read. Once all of it is
   committed the target answers ``taken``.
3. The source lets the session's subscriptions go, streams the rest up to its cut epoch and,
   once the client has acknowledged it, tells the client to open the session again at the
   target (``SessionClosed(replicator=…)``) and the target that it may serve it
   (``released``). A tombstone sends late openers on until the target confirms (``done``).
4. Until ``released`` the target sends an opener to the source, which has the events before
   the cut. Per pubend, the client has every tick up to the cut from the source and every
   later one from the target: the seam is exact as each side's stream is.

The messages are relayed hop by hop and may be lost: the source sends the hand-over again every
:data:`HANDOVER_RESEND` until it is taken or refused and gives it up after
:data:`HANDOVER_GIVE_UP` (a target told ``abandon``, or answered so when it polls, ends its
copy); the target polls until it is released. Each side keeps its step in its store, so either
may crash and go on; a target that crashes before ``taken`` forgets its copy, and the source's
next ask starts it again (the logs still hold everything after the cuts).
"""

from __future__ import annotations

import attrs

from ges.core.outputs import Notice, ToClient
from ges.core.readback import REPLAY_RESEND, Replay
from ges.durable import home_replicator
from ges.wire import messages as m

#: Seconds before an unanswered step of a hand-over is sent again.
HANDOVER_RESEND = 1.0
#: Seconds a source waits for its hand-over to be taken before it gives it up (it keeps the
#: session, and streams on).
HANDOVER_GIVE_UP = 60.0
#: Seconds a session whose hand-over was refused or given up stays before it is tried again.
HANDOVER_BACKOFF = 60.0
#: Seconds a handed-over session's tombstone stays once the target serves it (it sends on
#: openers that the target sent to it just before).
TOMBSTONE_KEEP = 60.0
#: Seconds a target reads each pubend it hears of for the first time from its cut after
#: taking a session (every publisher's silence reaches it well within this: ges.core.config's
#: silence_max); a publisher first heard later than this is not read back (see the README).
HANDOVER_WATCH = 120.0
#: Pubends a hand-over may name cuts for (as many as a broker follows).
MAX_CUTS = 16_384

#: The steps a note may name.
NOTES = frozenset({"taken", "refused", "poll", "released", "done", "abandon"})


@attrs.define(eq=False)
class Hand:
    """A hand-over in progress for one session, as this replicator runs it (what is kept of it
    is the session's ``handover``)."""

    #: when it began here, when its last message went
    started: float
    asked: float = 0.0
    #: target: the SubAcks still to come; the source's cuts; per pubend being read its replay
    #: (None: not begun — the tick up to which each was read is the session's ``floors``); the
    #: pubends read or being read; the last epoch stored for the session meanwhile
    waiting: set[int] = attrs.Factory(set)
    cuts: dict[str, int] = attrs.Factory(dict)
    replays: dict[str, Replay] | None = None
    seen: set[str] = attrs.Factory(set)
    last: int = 0
    #: target: until when a pubend heard of for the first time is read from its cut (and
    #: this broker acknowledges none it has not heard of), and when it last looked for them
    watch_until: float = 0.0
    looked: float = 0.0


class HandOver:
    """The hand-over half of :class:`ges.core.replicator.Replicator` (see the module
    docstring). Its state: ``self._hands`` (session name -> :class:`Hand`) and, per session,
    ``state.handover`` — replaced, never changed in place: {"dir": "out", "to", "hid", "cuts",
    "cut_epoch", "tail_last", "phase": "asking" | "tail" | "moved"} at the source, {"dir":
    "in", "from", "hid", "cuts", "phase": "taking" | "taken"} at the target."""

    # -- the source ---------------------------------------------------------------------------

    def _consider_handovers(self, now: float) -> list:
        """Hand over the sessions whose clients have stayed in another replicator's unit."""
        after = self.config.handover_after
        if after is None:
            after = self.topology.session_limits.handover_after
        if after == float("inf") or self._restoring or self._replays:
            return []
        out: list = []
        for live in list(self.sessions.values()):
            hand = self._hands.get(live.state.name)
            if hand is not None and (hand.waiting or hand.replays):
                continue  # still reading what it was handed (its cuts would skip that)
            if hand is not None and hand.watch_until and self._unread(hand.seen):
                continue  # a pubend heard of since it was taken, not read for it yet (its
                # cut would be what was stored for the others: the look reads it first)
            if (
                live.follower is None
                or live.opening is not None
                or live.state.handover is not None
                or now < live.since + after
                or now < live.backoff
                or live.at not in self.topology.brokers
            ):
                continue
            target = self._homes.get(live.at)
            if target is None:
                target = self._homes[live.at] = home_replicator(self.topology, live.at)
            if target != self.id:
                out += self._hand_over(live, target, now)
        return out

    def _hand_over(self, live, target: str, now: float) -> list:
        state = live.state
        known = self._known_pubends() | set(state.floors)
        # what it holds: all it wants up to what this replicator stored or acknowledged, and
        # up to what came to it from elsewhere (an earlier hand-over)
        cuts = {p: t for p in sorted(known) if (t := max(self._horizon(p), state.floors.get(p, 0)))}
        if len(cuts) > MAX_CUTS:
            return []
        hid = f"{self.id}/{self.store.id}/{state.key}/{self.store.last}"
        state.handover = {
            "dir": "out",
            "to": target,
            "hid": hid,
            "cuts": cuts,
            "cut_epoch": self.store.last,
            "tail_last": live.last,
            "phase": "asking",
        }
        self.store.save_session(state)
        self._hands[state.name] = Hand(now)
        text = f"durable session {state.name}: handing it over to replicator {target}"
        return [Notice("info", text), *self._ask_handover(live, now)]

    def _ask_handover(self, live, now: float) -> list:
        state = live.state
        h = state.handover
        self._hands[state.name].asked = now
        subs = [
            m.SessionSub(sub_id, profile_id, conjunctions)
            for sub_id, (profile_id, conjunctions) in sorted(state.subs.items())
        ]
        return self.unicast.relay(
            h["to"],
            [],
            0,
            lambda hops, detour: m.Handover(
                h["to"],
                self.id,
                h["hid"],
                state.name,
                state.owner,
                state.created,
                subs,
                h["cuts"],
                state.max_events,
                state.max_age,
                hops,
                detour,
                sorted(state.qos2),
                sorted(state.rel),
                state.expiry,
            ),
        )

    def _once_kept(self, outs: list) -> list:
        """``outs`` now if what was just saved of sessions is durable, else once it is (a step
        told before it is kept could be undone by a crash after it was acted on)."""
        store = self.store
        if store.durable(store.saved):
            return outs
        self._after_kept.append((store.saved, outs))
        return []

    def _kept_now(self) -> list:
        """What waited for its save to be durable and now may go (on_committed), and the
        opens that waited for the save that made their session (and their SubAcks)."""
        out: list = []
        store = self.store
        while self._after_kept and store.durable(self._after_kept[0][0]):
            out += self._after_kept.pop(0)[1]
        for name in sorted(self._unkept):  # opens waiting for the save that made the session
            live = self.sessions.get(name)
            opening = None if live is None else live.opening
            if opening is None:
                self._unkept.discard(name)
                continue
            waiting = opening[2]
            waiting.difference_update([r for r in waiting if r < 0 and store.durable(-r)])
            if min(waiting, default=0) < 0:
                continue
            self._unkept.discard(name)
            live.made = 0
            if not waiting:
                live.opening = None
                conn, msg, _, created, _ = opening
                out += self._opened(live, conn, msg, created, self.subscriptions.now)
        return out

    def _note(self, to: str, hid: str, name: str, what: str, why: str = "") -> list:
        return self.unicast.relay(
            to,
            [],
            0,
            lambda hops, detour: m.HandoverNote(to, self.id, hid, name, what, why, hops, detour),
        )

    def pinned(self, pubend: str) -> int | None:
        """The highest tick of ``pubend`` this broker may acknowledge while it hands sessions
        over or takes them (None: any), so the pubend's log keeps what a target reads: at a
        source, none above a pending hand-over's cut; at a target, none above what it read of
        a pubend being read, and — while it watches for pubends not heard of yet — none of
        those."""
        pin = None
        for name, hand in self._hands.items():
            live = self.sessions.get(name)
            h = None if live is None else live.state.handover
            cut = None
            if h is not None and h["dir"] == "out":
                if h["phase"] == "asking":
                    cut = h["cuts"].get(pubend, 0)
            elif hand.replays is not None:
                rp = hand.replays.get(pubend)
                if rp is not None:
                    cut = rp.next - 1
                elif hand.watch_until and pubend not in hand.seen:
                    cut = 0
            if cut is not None:
                pin = cut if pin is None else min(pin, cut)
        return pin

    def stream_cap(self, live) -> int | None:
        """The last epoch a session being handed over away streams (None: no cap)."""
        h = live.state.handover
        if h is None or h["dir"] != "out":
            return None
        return h["cut_epoch"] if h["phase"] != "moved" else -1

    def _give_up(self, live, why: str, now: float) -> list:
        """The hand-over failed: the session stays here, and streams on."""
        state = live.state
        h = state.handover
        state.handover = None
        self.store.save_session(state)
        self._hands.pop(state.name, None)
        live.backoff = now + HANDOVER_BACKOFF
        text = f"durable session {state.name}: not handed over to {h['to']}: {why}; it stays here"
        return [Notice("warning", text), *self._pump(live)]

    def _taken(self, live, now: float) -> list:
        """The target stores everything after the cuts: the session's subscriptions go, the
        rest up to the cut epoch streams, then the client is sent on."""
        state = live.state
        state.handover = {**state.handover, "phase": "tail"}
        self.store.save_session(state)
        self._hands.pop(state.name, None)
        # (restored after a restart mid-ask, they may not have started: not waited for now)
        out = self._subscribe(live, {}, state.subs, set())
        return out + self._tail_done(live, now)

    def _tail_done(self, live, now: float) -> list:
        """Once the client has what the source kept (up to the cut epoch), it is sent on, and
        the target may serve the session."""
        state = live.state
        h = state.handover
        if h is None or h["dir"] != "out" or h["phase"] != "tail":
            return []
        if max(state.acked, state.trimmed) < h["tail_last"]:
            return []
        state.handover = {**h, "phase": "moved"}
        self.store.release(state.key, self.store.last)
        live.held = 0
        self.store.save_session(state)
        self._hands[state.name] = Hand(now, now)  # sends ``released`` until ``done``
        out: list = []
        if live.follower is not None:
            note = m.SessionClosed(
                state.name,
                f"handed over to replicator {h['to']} (its client's unit)",
                retry=True,
                replicator=h["to"],
            )
            out.append(ToClient(live.follower, note))
            self._detach(live, now)
        text = f"durable session {state.name}: handed over to replicator {h['to']}"
        out.append(Notice("info", text))
        return self._once_kept(out + self._note(h["to"], h["hid"], state.name, "released"))

    def _redirect(self, live, conn: int, msg: m.SessionOpen) -> list | None:
        """An open of a session being handed over that must go elsewhere (None: it opens
        here): to the target once it is moved, to the source while the target takes it."""
        h = live.state.handover
        if h is None:
            return None
        if h["dir"] == "out" and h["phase"] == "moved":
            to, why = h["to"], f"handed over to replicator {h['to']}"
        elif h["dir"] == "in" and msg.replicator == self.id:  # sent here by the source
            to, why = "", f"being handed over to replicator {self.id}: a moment"
        elif h["dir"] == "in":
            to, why = h["from"], f"being handed over from replicator {h['from']}: resume there"
        else:
            return None
        note = m.SessionClosed(msg.name, why, retry=True, replicator=to, req=msg.req)
        return [ToClient(conn, note)]

    def _handing(self, live) -> str:
        """The session's hand-over, as ``ges clients`` shows it ('' for none)."""
        h = live.state.handover
        if h is None:
            return ""
        if h["dir"] == "in":
            return f"from {h['from']}"
        return f"moved to {h['to']}" if h["phase"] == "moved" else f"to {h['to']}"

    def _listed(self, live) -> bool:
        """Whether ``ges clients`` lists the session here: at the source until it is handed
        over, at the target from then on (so it is listed once)."""
        h = live.state.handover
        if h is None:
            return True
        return h["dir"] == "out" and h["phase"] != "moved"

    # -- notes --------------------------------------------------------------------------------

    def on_note(self, msg: m.HandoverNote, now: float) -> list:
        if msg.what not in NOTES:
            return []
        live = self.sessions.get(msg.name)
        h = None if live is None else live.state.handover
        mine = h is not None and h["hid"] == msg.hid
        what = msg.what
        # the source's side
        if what in ("taken", "refused", "poll", "done"):
            if what == "poll":  # may the target serve it? (it asks until released)
                if mine and h["dir"] == "out":
                    if h["phase"] == "moved":
                        return self._note(msg.source, msg.hid, msg.name, "released")
                    return []
                return self._note(msg.source, msg.hid, msg.name, "abandon")
            if not mine or h["dir"] != "out":
                return []
            if what == "taken" and h["phase"] == "asking":
                return self._taken(live, now)
            if what == "taken" and h["phase"] == "moved":
                return self._note(msg.source, msg.hid, msg.name, "released")
            if what == "refused" and h["phase"] == "asking":
                return self._give_up(live, f"refused: {msg.why}", now)
            if what == "done" and h["phase"] == "moved" and not h.get("done"):
                # the tombstone stays a while for openers the target sent here just before
                live.state.handover = {**h, "done": True}
                self.store.save_session(live.state)
                self._hands[msg.name] = Hand(now, now)
            return []
        # the target's side
        if what == "released":
            if mine and h["dir"] == "in" and h["phase"] == "taken":
                live.state.handover = None  # served here now (its hand watches on a while)
                self.store.save_session(live.state)
                if live.follower is None:  # its client comes from its last broker: not away
                    self._away(live, now)
                text = f"durable session {msg.name}: taken over from replicator {msg.source}"
                done = self._note(msg.source, msg.hid, msg.name, "done")
                return self._once_kept([Notice("info", text), *done])
            if live is not None and h is None:  # released before: said again, once durable
                return self._once_kept(self._note(msg.source, msg.hid, msg.name, "done"))
            return []
        if what == "abandon" and mine and h["dir"] == "in":
            self._hands.pop(msg.name, None)
            return self._end(live, now)
        return []

    # -- time ---------------------------------------------------------------------------------

    def _handover_timer(self, now: float) -> list:
        out: list = []
        for name, hand in list(self._hands.items()):
            live = self.sessions.get(name)
            if live is None:
                self._hands.pop(name, None)
                continue
            h = live.state.handover
            if h is not None and h.get("done"):
                if now >= hand.started + TOMBSTONE_KEEP:
                    self._hands.pop(name, None)
                    out += self._end(live, now)
            elif h is not None and h["dir"] == "out" and h["phase"] == "asking":
                if now >= hand.started + HANDOVER_GIVE_UP:
                    out += self._note(h["to"], h["hid"], name, "abandon")
                    out += self._give_up(live, f"not taken within {HANDOVER_GIVE_UP:.0f} s", now)
                elif now >= hand.asked + HANDOVER_RESEND:
                    out += self._ask_handover(live, now)
            elif h is not None and h["dir"] == "out" and h["phase"] == "moved":
                if now >= hand.asked + HANDOVER_RESEND:
                    hand.asked = now
                    out += self._note(h["to"], h["hid"], name, "released")
            elif h is None or h["dir"] == "in":
                if h is not None and h["phase"] == "taken" and now >= hand.asked + HANDOVER_RESEND:
                    hand.asked = now
                    out += self._note(h["from"], h["hid"], name, "poll")
                # (restarted: its reads wait for the restored subscriptions, as the read-back
                # does, or what comes before they start would be missed)
                if hand.replays is None or self._restoring:
                    continue
                for pubend, rp in sorted(hand.replays.items()):
                    if rp.asked is None or now >= rp.asked + REPLAY_RESEND:
                        out += self._taking_ask(live, pubend, now)
                if hand.watch_until and now >= hand.watch_until:
                    hand.watch_until = 0.0
                elif hand.watch_until and now >= hand.looked + HANDOVER_RESEND:
                    hand.looked = now  # pubends heard of since (silence too): read them
                    for pubend in self._unread(hand.seen):
                        out += self._read(live, hand, pubend, now)
                if h is None and not hand.watch_until and not hand.replays:
                    del self._hands[name]  # taken, and watched long enough
        return out

    def _handover_deadline(self) -> float:
        due = float("inf")
        for name, hand in self._hands.items():
            live = self.sessions.get(name)
            if live is None:
                return 0.0  # the timer forgets it
            h = live.state.handover
            if h is not None and h.get("done"):
                due = min(due, hand.started + TOMBSTONE_KEEP)
            elif h is not None and h["dir"] == "out" and h["phase"] == "asking":
                due = min(due, hand.asked + HANDOVER_RESEND, hand.started + HANDOVER_GIVE_UP)
            elif h is not None and h["phase"] in ("moved", "taken"):
                due = min(due, hand.asked + HANDOVER_RESEND)
            if (h is None or h["dir"] == "in") and hand.replays is not None and not self._restoring:
                for rp in hand.replays.values():
                    due = min(due, (rp.asked or 0.0) + REPLAY_RESEND)
                if hand.watch_until:  # a look for pubends heard of each second, and its end
                    due = min(due, hand.looked + HANDOVER_RESEND, hand.watch_until)
        return due

    def _restore_handover(self, live, now: float) -> bool | None:
        """A restarted replicator goes on with a hand-over it kept; whether the session's
        subscriptions are entered again (None: it was being taken here, and is forgotten — the
        source asks again; False: it has been given away)."""
        state = live.state
        h = state.handover
        name = state.name
        if h is not None and ((h["dir"] == "in" and h["phase"] == "taking") or h.get("done")):
            return None
        if h is None and not state.reading:
            return True
        hand = self._hands[name] = Hand(now, now - HANDOVER_RESEND)
        if h is None or h["dir"] == "in":  # taken: a restart reads back the rest …
            hand.replays = {}
            hand.cuts = {} if h is None else dict(h["cuts"])
            # … but for the pubends its own reads were still reading: they go on, from what
            # they had stored (the other sessions may have more of those: ``_top`` is theirs)
            for pubend, cut in sorted(state.reading.items()):
                hand.seen.add(pubend)
                hand.replays[pubend] = Replay(max(cut, state.floors.get(pubend, 0)) + 1)
        return h is None or h["dir"] == "in" or h["phase"] == "asking"
