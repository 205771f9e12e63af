"""Publishing: the pubend numbers events, logs them, acknowledges, and keeps silence (seed 002 §2).

Theory of operation
-------------------
Events are published into the broker's *pubend* (one ordered stream per broker incarnation or
log epoch, ``"<broker>~<epoch>"``), which numbers them with consecutive ticks. With reliable
delivery the pubend's log is the only place an event must be stored before it counts as
published: a batch is appended, and acknowledged and sent on only once the log has committed it
(:meth:`Publishing.on_logged`) — about ``config.logged_slice`` deliveries of a committed group
at once, the rest a slice at a time as the core's own job (ges.core.work), so a group that
fans out to many subscribers does not hold the event loop for long. Until its events are
handed on, nothing counts them as published here: a release round asks about the ticks handed
on (``routed``), not those committed (a broker with no subscriber would otherwise promise
ticks a subscription it makes meanwhile still needs), and a new subscription's starting point
on this pubend is the tick handed on last. An idempotent publisher numbers its events; the pubend
publishes each number once, across the publisher's reconnects and the broker's restarts (the
log keeps the numbers), and acknowledges the duplicates once what they duplicate is durable.
An idle pubend sends silence on its routes (seed 002 §2.2) so a lost last event is found out;
after a restart it announces its last tick, and the earlier epochs' the log names (until
their release rounds have released them to their end: ges.core.release).
"""

from __future__ import annotations

import attrs

from ges.core.outputs import ToClient
from ges.core.part import Part
from ges.reliable.log import remember
from ges.wire import messages as m

#: Characters of an idempotent publisher's id.
MAX_PUBLISHER_ID = 256
#: Events of one publish handed on together at most (a GES publish may carry 65,536): the
#: chunks are sized by the fan-out seen lately (one event while none was seen), so a slice
#: stays near its bound — at most a chunk over it when the fan-out rises at once.
CHUNK = 32


class Publishing(Part):
    """This broker's pubend: ticks, the log, acknowledgements, idempotent publishers, silence."""

    def __init__(self, core):
        super().__init__(core)
        self.next_tick = 1 if self.log is None else self.log.last + 1
        #: the last tick of this pubend routed (a clock heard now is stamped from the next)
        self.routed = self.next_tick - 1
        #: publishes waiting for their log commit and to be handed on (reliable delivery),
        #: and the deliveries per event handed on lately (the fan-out chunks are sized by)
        self.held: list[Held] = []
        self._fanout = 0
        #: the leading entries of ``held`` acknowledged (committed; some still being handed on)
        self._acked = 0
        #: per client, the last tick of its latest publish held for the log: until that is
        #: handed on, its next change of subscriptions waits (:meth:`publishes_unsent`)
        self._held_last: dict[int, int] = {}
        #: idempotent publishing: per publisher its last event number published (the log's,
        #: which keeps it across restarts; in memory with best-effort delivery)
        self._publishers: dict = self.log.publishers() if self.log is not None else {}
        self._last_publish = float("-inf")
        # a pubend restarting with a log announces its last tick: events logged (and
        # acknowledged) just before a crash may never have left this broker
        restarted = self.log is not None and self.log.last > 0
        # a log that opens a new epoch at each start names the earlier ones whose last ticks
        # may not have reached every broker: those are announced too, and nacks for them are
        # answered from the log (the epoch before may have been too short to announce its
        # own predecessor's)
        restarted = restarted or (self.log is not None and bool(self.log.earlier))
        self._silence_due = 0.0 if restarted else float("inf")
        #: seconds from the next silence round to the one after
        self._silence_gap = self.config.silence_every
        #: quiet silence rounds in a row (no publish since the round before)
        self._silence_idle = 0
        self._published_since_round = False

    def on_publishes(self, conn: int, msgs: list[m.Publish], now: float) -> list:
        """Consecutive publishes that one read brought from one client (natural batching):
        each run of plain publishes with consecutive seqs is published as one batch — one log
        append, one match, one acknowledgement covering their seqs (``PubAck.seqs``);
        idempotent ones go one by one. The same ticks, acknowledgements and deliveries as one
        at a time, in fewer messages."""
        out: list = []
        limit = self.config.max_publish_batch
        i, n = 0, len(msgs)
        while i < n:
            msg = msgs[i]
            j = i + 1
            if not msg.publisher:
                size = len(msg.events)
                while j < n:
                    later = msgs[j]
                    if later.publisher or later.seq != msgs[j - 1].seq + 1:
                        break
                    size += len(later.events)
                    if size > limit:
                        break
                    j += 1
            if j - i == 1:
                out += self.on_publish(conn, msg, now)
            else:
                events = [event for one in msgs[i:j] for event in one.events]
                out += self.on_publish(conn, m.Publish(msgs[j - 1].seq, events), now, j - i)
            i = j
        return out

    def on_publish(self, conn: int | None, msg: m.Publish, now: float, seqs: int = 1) -> list:
        """A publish; ``seqs``: it stands for that many publishes, ``msg.seq - seqs + 1`` to
        ``msg.seq`` (:meth:`on_publishes`). ``conn`` None: no client is acknowledged."""
        events = msg.events
        if len(events) > self.config.max_publish_batch:
            reason = f"publish batch over {self.config.max_publish_batch} events"
            return [ToClient(conn, m.Error(reason))]
        duplicates, wait = 0, 0
        if msg.publisher:
            if len(msg.publisher) > MAX_PUBLISHER_ID or msg.first < 1:
                reason = (
                    f"publisher id of at most {MAX_PUBLISHER_ID} characters, with event "
                    "numbers from 1"
                )
                return [ToClient(conn, m.Error(f"idempotent publish needs a {reason}"))]
            duplicates, wait = self._published_before(msg)
            events = events[duplicates:]
        if self.reliable:
            return self._publish_logged(conn, msg, events, duplicates, wait, now, seqs)
        first = self.next_tick
        items = [m.EventItem(first + i, first + i - 1, 0, ev) for i, ev in enumerate(events)]
        self.next_tick = first + len(events)
        if msg.publisher and events:
            remember(self._publishers, msg.publisher, (msg.first + len(msg.events) - 1, 0, 0))
        self.counters["published"] += len(events)
        self.counters["events_in"] += len(events)
        self.counters["duplicates_published"] += duplicates
        ack = m.PubAck(msg.seq, self.pubend, first, self.next_tick - 1, duplicates, seqs)
        out: list = []
        if items:
            self.forwarding.window(self.pubend).add_range(first, self.next_tick - 1)
            if self.router is None:
                out += self.forwarding.forward(self.pubend, items, exclude=None)
            else:
                initial = self.router.initial_routes
                if initial:  # a one-broker system has nowhere else to send
                    out += self.forwarding.route(self.pubend, [(it, initial) for it in items])
            out += self.subscriptions.deliver(self.pubend, items)
        if conn is not None:  # (None: a replicator's publish of a will, ges.core.lifetime)
            out.append(ToClient(conn, ack))  # after what is sent on: the subscribers wait for that
        return out

    def _published_before(self, msg: m.Publish) -> tuple[int, int]:
        """Idempotent publishing: how many leading events of ``msg`` its publisher published
        before (their numbers are at or below the highest the pubend published for it), and
        the tick of this epoch the acknowledgement must wait for (0: none — they are durable)."""
        state = self._publishers.get(msg.publisher)
        if state is None:
            return 0, 0
        seq, epoch, tick = state
        duplicates = min(max(seq - msg.first + 1, 0), len(msg.events))
        log = self.log
        wait = tick if duplicates and log is not None and epoch == log.epoch else 0
        return duplicates, wait

    def _publish_logged(
        self,
        conn: int,
        msg: m.Publish,
        events: list,
        duplicates: int,
        wait: int,
        now: float,
        seqs: int,
    ) -> list:
        """Give the events the next ticks and append them to the pubend's log; they are
        acknowledged and sent on once the log has committed them (:meth:`on_logged`) — and
        the duplicates of an idempotent publish once what they duplicate is committed."""
        first = self.next_tick
        self.next_tick = first + len(events)
        if events:
            publisher = None
            if msg.publisher:
                publisher = (msg.publisher, msg.first + len(msg.events) - 1)
            self.log.append(first, events, publisher)
        last = self.next_tick - 1
        held = Held(conn, msg.seq, first, last, events, max(last, wait), duplicates, seqs)
        self.held.append(held)
        if conn is not None:
            self._held_last[conn] = last
        self._last_publish = now
        if held.wait > self.log.committed or self.held[0] is not held:
            return []  # the log task hands it on once committed, or the hand-on in progress
        return self.on_logged(now)  # a log that commits at once, or duplicates already durable

    @property
    def logged_pending(self) -> bool:
        """The log has committed publishes not yet sent on (each is acknowledged at once)."""
        held = self.held
        return bool(held) and held[0].wait <= self.log.committed

    def publishes_unsent(self, conn: int) -> bool:
        """Client ``conn`` has publishes waiting for the log or being handed on: a change of
        its subscriptions must wait until they are matched, or an event it published before
        subscribing would be matched against the subscription (reliable delivery matches
        once the log has an event)."""
        tick = self._held_last.get(conn)
        if tick is None:
            return False
        if tick <= self.routed:
            del self._held_last[conn]
            return False
        return True

    def forget(self, conn: int) -> None:
        """Client ``conn`` has gone."""
        self._held_last.pop(conn, None)

    @property
    def handed_on(self) -> int:
        """The last tick of this pubend handed on (to its subscribers, routes and silence):
        ``routed`` with reliable delivery, else every tick given (nothing waits)."""
        return self.routed if self.reliable else self.next_tick - 1

    def on_logged(self, now: float) -> list:
        """The log committed more: acknowledge and send on the publishes it now holds, about
        ``config.logged_slice`` deliveries now and the rest as the core's own job."""
        out = self._hand_on(now)
        if self.logged_pending:
            rest: list = []
            self.subscriptions.defer(("logged",), self._handing_on(rest), rest, keeps=False)
        return out

    def _handing_on(self, out: list):
        while self.logged_pending:
            out += self._hand_on(self.subscriptions.now)
            yield self.work_slice  # one slice of hand-on per slice of work

    def _hand_on(self, now: float) -> list:
        """Acknowledge every publish the log committed (durable: its publisher need not wait
        for the hand-on), then send on what it committed, in order, up to about
        ``config.logged_slice`` deliveries: a publish's events in chunks sized by the
        fan-out seen lately (at least one event)."""
        out: list = []
        committed = self.log.committed
        held = self.held
        clients = self.subscriptions.clients
        while self._acked < len(held) and held[self._acked].wait <= committed:
            h = held[self._acked]
            self._acked += 1
            if h.conn in clients:
                ack = m.PubAck(h.seq, self.pubend, h.first, h.last, h.duplicates, h.seqs)
                out.append(ToClient(h.conn, ack))
            self.counters["duplicates_published"] += h.duplicates
        budget = self.config.logged_slice
        budget_bytes = self.config.logged_slice_bytes
        n = 0
        passed = 0
        subscriptions = self.subscriptions
        while n < self._acked and budget > 0 and budget_bytes > 0:
            h = held[n]
            events = h.events
            if not events:
                n += 1
                continue
            left = len(events) - h.sent
            fanout = self._fanout
            k = min(left, CHUNK, max(1, budget // (1 + fanout))) if fanout else 1
            for i in range(h.sent, h.sent + k):  # ... and of at most the bytes left
                budget_bytes -= m.event_size(events[i]) * (1 + fanout)
                if budget_bytes <= 0:
                    k = i - h.sent + 1
                    break
            first = h.first + h.sent
            chunk = events if k == len(events) else events[h.sent : h.sent + k]
            items = [m.EventItem(first + i, 0, 0, ev) for i, ev in enumerate(chunk)]
            h.sent += k
            if h.sent == len(events):
                n += 1
            passed = self.routed = first + k - 1
            self.counters["published"] += k
            self.counters["events_in"] += k
            before = len(out)
            if self.router.initial_routes:  # a one-broker system has nowhere else to send
                out += self.subends.route_claimed(
                    self.pubend, [(it, None) for it in items], now, self.vt.digest
                )
            made = k * (len(out) - before)  # the chunk to each next hop
            out += subscriptions.deliver(self.pubend, items)
            made += subscriptions.pairs  # (event, subscription) pairs, durable sessions' too
            budget -= k + made
            # per event, the most lately: a chunk after one that reached few is not sized
            # by it alone
            self._fanout = max(-(-made // k), self._fanout * 7 // 8)
            if self._silence_due == float("inf") or self._silence_idle:
                # the first event after a quiet round: silence follows it soon
                self._silence_due = min(self._silence_due, now + self.config.silence_after)
            self._silence_idle = 0
            self._silence_gap = self.config.silence_every
            self._published_since_round = True
            self.release.published(now)
        if passed and self.gates.gate:  # own events past a starting point: none below it comes
            self.gates.pass_gates(self.pubend, passed)
        if n:
            del held[:n]
            self._acked -= n
        return out

    def root_routes(self, tick: int) -> list[m.Route]:
        root = self.claims.root
        pubend = self.pubend
        return [
            m.Route(r.unit, r.skip, prev=root(pubend, r.unit, tick))
            for r in self.router.initial_routes
        ]

    def silence_round(self, now: float) -> list:
        """Silence on this pubend's routes (seed 002 §2.2: idle pubends advance silence), when
        due: up to the last tick published, and the earlier epochs' last ticks after a
        restart; the rounds space out while the pubend stays idle."""
        if now < self._silence_due:
            return []
        tick = self.handed_on
        out = self.subends.silence(
            self.pubend, tick, self._root_silence(tick), 0, now, self.vt.digest
        )
        for epoch, last in [] if self.log is None else self.log.earlier:
            old = f"{self.id}~{epoch}"
            routes = [m.Route(r.unit, r.skip, prev=last) for r in self.router.initial_routes]
            out += self.subends.silence(old, last, routes, 0, now)
        self._silence_due = now + self._silence_gap
        if self._published_since_round:
            self._published_since_round = False
        else:
            self._silence_idle += 1
            if self._silence_idle >= self.config.silence_steady:
                self._silence_gap = min(2 * self._silence_gap, self.config.silence_max)
        return out

    def silence_deadline(self) -> float:
        return self._silence_due

    def _root_silence(self, tick: int) -> list[m.Route]:
        """The publisher's routes for silence up to ``tick``: each claims back to the last tick
        it made that route for."""
        silence = self.claims.root_silence
        return [
            m.Route(r.unit, r.skip, prev=silence(self.pubend, r.unit, tick))
            for r in self.router.initial_routes
        ]


@attrs.define(eq=False)
class Held:
    """A publish waiting for the log: acknowledged once the log has committed up to ``wait``
    (its last tick, or the earlier one its duplicates went in)."""

    conn: int
    seq: int
    first: int
    last: int
    events: list
    wait: int
    duplicates: int
    #: the publishes it stands for (``seq - seqs + 1`` to ``seq``; Publishing.on_publishes)
    seqs: int = 1
    #: its events handed on so far (a large one goes in chunks: Publishing._hand_on)
    sent: int = 0
