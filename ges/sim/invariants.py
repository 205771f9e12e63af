"""What a replicator's state keeps true between any two of its steps, written down and checked.

The simulator (``ges simulate``) checks deliveries at the clients (ges.sim.checker); a state
that is wrong inside a replicator shows there only once some later fault or move acts on it,
seeds later. These are the rules its durable sessions' bookkeeping follows — the indexes, the
stream, what is held, a restart's waits, hand-overs, wills and expiry — so the simulator can
check them after every step of a broker that hosts one (:func:`replicator_problems`), and a
broken rule is caught at the step that broke it.

Each rule, with the names in ges.core.replicator and its parts:

1. *Index.* ``sessions`` and ``_by_key`` hold the same sessions, each under its own name
   and key; ``_dirty`` names only sessions held.
2. *Saved.* The store holds each session as it is in memory (a change acted on is saved in
   the same step, so a crash cannot undo it after it was acted on) and no session more.
3. *Stream.* A session with no follower has nothing in flight. With one: what is in flight is
   batches after what its client acknowledged, in epoch order, the last at most ``sent``, and
   ``inflight_bytes`` is their bytes; nothing beyond the store's commit was sent; a session
   being handed over away is sent nothing after its cut epoch, and once moved it has no
   follower and holds nothing.
4. *Held.* ``held`` is what the store holds for the session after what its client has (or
   retention let go), and ``last`` is no later than the store's last epoch.
5. *Restart's waits.* ``_restoring`` is exactly the reqs in ``_restoring_of``, each waited for
   by one subscription of one session held, one the broker has entered for it (not one
   changed, taken out, or gone with a hand-over); it waits only after a restart.
6. *Opens.* An open waiting waits for at least one of its subscriptions or for the save that
   made its session to be durable (then the session is among ``_unkept``, which a commit
   looks at); earlier opens answered with it (``also``) exist only while it waits.
7. *Wills.* A session holding a will is in ``_willing`` and due no earlier than
   ``_will_due``; one holding none is due never.
8. *Expiry.* A session whose client is away (no follower, not being opened or handed over) is
   due to end no earlier than ``_expiry_due``.
9. *Hand-overs.* A session being handed over away and still asked about has its
   :class:`ges.core.handover.Hand`; one in its tail whose client has everything up to the
   tail's last epoch has been sent on (moved); each pubend a taken session's hand still reads
   for it is in its ``reading`` (so a restart reads on from there).
10. *Commits.* The groups not yet committed (``_uncommitted``) are after the store's commit,
    in order (pages read back with nothing stored share an epoch), none empty.
11. *Subscriptions.* Once no request of it is in progress, the broker has exactly the
    session's subscriptions under its own connection (``-key``), with their profiles — none
    once it has been handed over away (its tail, or moved) — and none of a session not held.

One more rule is about what a replicator says rather than what it holds (:func:`told_problem`,
checked on each message it sends):

12. *Told once durable.* What it tells a client or another replicator is already in its
    store's last commit, so no crash can take it back after it was acted on: a client told
    its session is open (``SessionOpened``) has a session that survives a crash; a source
    told ``taken`` has a target whose commit holds the session as taken (or served there, or
    handed on); one told ``done``, a target whose commit holds it served there (or handed
    on).
"""

from __future__ import annotations

from ges.core.retaining import RETAINED_CONN
from ges.sim.commits import GroupSessionStore
from ges.wire import messages as m


def replicator_problems(core) -> list[str]:
    """What of the rules in the module docstring ``core``'s replicator breaks now, one line
    each (none: all hold, or it hosts no replicator)."""
    rep = core.replicator
    if rep is None:
        return []
    out: list[str] = []
    store = rep.store
    saved = store.sessions()
    subs_of = rep.subscriptions.clients
    # 1. index
    if len(rep._by_key) != len(rep.sessions):
        out.append(f"{len(rep.sessions)} sessions but {len(rep._by_key)} keys")
    for key in sorted(rep._dirty - set(rep._by_key)):
        out.append(f"key {key} is dirty but no session has it")
    for key in sorted(set(subs_of)):
        orphan = key < 0 and -key not in rep._by_key and key != RETAINED_CONN
        if orphan and subs_of[key] and not rep.subscriptions.busy(key):
            out.append(f"connection {key} has subscriptions but no session has its key")
    for name, live in sorted(rep.sessions.items()):
        state = live.state
        where = f"session {name}"
        if state.name != name:
            out.append(f"{where} is named {state.name!r}")
        if rep._by_key.get(state.key) is not live:
            out.append(f"{where}: key {state.key} is not its own")
        # 2. saved
        kept = saved.get(name)
        if kept is None:
            out.append(f"{where} is not in the store")
        elif kept != state:
            diff = [f for f in _fields(state) if getattr(kept, f) != getattr(state, f)]
            out.append(f"{where}: the store has another {', '.join(diff)}")
        out += [f"{where}: {p}" for p in _stream_problems(rep, live)]
        # 4. held
        held, _ = store.held(state.key, max(state.acked, state.trimmed))
        if held != live.held:
            out.append(f"{where} holds {held} events, its count says {live.held}")
        if live.last > store.last:
            out.append(f"{where}: its last epoch {live.last} is after the store's {store.last}")
        # 6. opens
        if live.opening is not None and not live.opening[2]:
            out.append(f"{where} is being opened but waits for no subscription")
        unkept = live.opening is not None and any(r < 0 for r in live.opening[2])
        if unkept and name not in rep._unkept:
            out.append(f"{where} waits for the save that made it, unlooked at")
        if live.also and live.opening is None:
            out.append(f"{where} has opens to answer ({live.also}) but none is waiting")
        # 7. wills
        if state.will is not None:
            if name not in rep._willing:
                out.append(f"{where} holds a will but is not among those willing")
            if live.will_due < rep._will_due:
                out.append(f"{where}: its will is due at {live.will_due}, before {rep._will_due}")
        elif live.will_due != float("inf"):
            out.append(f"{where} holds no will but one is due at {live.will_due}")
        # 8. expiry
        h = state.handover
        away = live.follower is None and live.opening is None and h is None
        if away and name not in rep._hands:
            due = max(live.since, live.looked) + rep._outlives(state)
            if due < rep._expiry_due:
                out.append(
                    f"{where} is due to end at {due}, before {rep._expiry_due} (its end is late)"
                )
        # 9. hand-overs
        asking = h is not None and h["dir"] == "out" and h["phase"] == "asking"
        if asking and name not in rep._hands:
            out.append(f"{where} is being handed over to {h['to']} with no hand")
        hand = rep._hands.get(name)
        if hand is not None and hand.replays and (h is None or h["dir"] == "in"):
            for pubend in sorted(set(hand.replays) - set(state.reading)):
                out.append(f"{where} is being read {pubend} for, not kept as reading it")
        tail = h is not None and h["dir"] == "out" and h["phase"] == "tail"
        if tail and max(state.acked, state.trimmed) >= h["tail_last"]:
            has = max(state.acked, state.trimmed)
            out.append(f"{where} has its tail up to epoch {h['tail_last']} ({has}) but stays")
        # 11. subscriptions
        gone = h is not None and h["dir"] == "out" and h["phase"] in ("tail", "moved")
        entered = {} if gone else state.subs
        for sub_id, req in sorted(rep._restoring_of.get(state.key, {}).items()):
            if sub_id not in entered:
                out.append(f"{where}: a restart waits for its subscription {sub_id} (req {req})")
        if not rep.subscriptions.busy(-state.key):
            want = {s: p for s, (p, _) in entered.items()}
            have = {s: p.id for s, p in subs_of.get(-state.key, {}).items()}
            if have != want:
                out.append(f"{where}: the broker has subscriptions {have}, the session {want}")
    # 5. restart's waits
    reqs = [r for waits in rep._restoring_of.values() for r in waits.values()]
    if len(reqs) != len(set(reqs)) or set(reqs) != rep._restoring:
        out.append(f"waits for reqs {sorted(rep._restoring)}, its sessions for {sorted(reqs)}")
    for key in sorted(set(rep._restoring_of) - set(rep._by_key)):
        out.append(f"a restart waits for key {key}, which no session has")
    if rep._restoring and not rep._restarted:
        out.append("waits for restored subscriptions without a restart")
    # 10. commits
    for pubend, q in sorted(rep._uncommitted.items()):
        epochs = [e for e, _ in q]
        if not q or epochs != sorted(epochs) or epochs[0] <= store.committed:
            out.append(
                f"uncommitted groups of {pubend} at epochs {epochs}, committed {store.committed}"
            )
    return out


def _stream_problems(rep, live) -> list[str]:
    """Rule 3 for one session."""
    out: list[str] = []
    state = live.state
    h = state.handover
    if live.follower is None:
        if live.inflight or live.inflight_bytes:
            out.append(f"nothing follows it but {len(live.inflight)} batches are in flight")
        return out
    if h is not None and h["dir"] == "out" and h["phase"] == "moved":
        out.append(f"it was handed over to {h['to']} but still streams to {live.follower}")
    if live.sent > rep.store.committed:
        out.append(f"sent up to epoch {live.sent}, beyond the store's commit {rep.store.committed}")
    if h is not None and h["dir"] == "out" and live.sent > h["cut_epoch"]:
        out.append(f"sent up to epoch {live.sent} while handed over at {h['cut_epoch']}")
    lasts = [b[0] for b in live.inflight]
    if lasts != sorted(set(lasts)):
        out.append(f"batches in flight out of order: {lasts}")
    if lasts and (lasts[0] <= state.acked or lasts[-1] > live.sent):
        out.append(f"batches in flight up to {lasts}, acked {state.acked}, sent {live.sent}")
    size = sum(b[1] for b in live.inflight)
    if size != live.inflight_bytes:
        out.append(f"{size} bytes in flight, its count says {live.inflight_bytes}")
    return out


def told_problem(store, msg) -> str | None:
    """Rule 12 for ``msg``, which the replicator whose store is ``store`` sends first (to a
    client, or a hand-over's note to another replicator): what breaks it, or None. What it
    says must hold in the store's last commit when it holds in the store now (a step said
    once durable may go after the session ended meanwhile: stale, not this rule's concern)."""
    kept = store.kept_sessions() if isinstance(store, GroupSessionStore) else store.sessions()
    if _holds(kept, msg) or not _holds(store.sessions(), msg):
        return None
    if type(msg) is m.SessionOpened:
        return f"told a client session {msg.name} is open before a commit kept it"
    h = getattr(kept.get(msg.name), "handover", None)
    return f"said {msg.what!r} of session {msg.name} before a commit kept it ({h})"


def _holds(sessions: dict, msg) -> bool:
    """What ``msg`` says holds of ``sessions`` (True for what rule 12 does not look at): its
    session is there — for a hand-over's ``taken``, taken there or a later step (served there,
    or handed on: a step said again may wait for the commit of one after it); for ``done``,
    served there or handed on."""
    t = type(msg)
    if t is m.SessionOpened:
        return msg.name in sessions
    if t is not m.HandoverNote or msg.what not in ("taken", "done"):
        return True
    state = sessions.get(msg.name)
    if state is None:
        return False
    h = state.handover
    if h is None or h["dir"] != "in":
        return True
    return msg.what == "taken" and h["phase"] == "taken"


def _fields(state) -> list[str]:
    return [a.name for a in type(state).__attrs_attrs__]
