"""Client sessions and their subscriptions: requests in slices, weights, and local delivery.

Theory of operation
-------------------
A client's subscription enters the broker's profile graph (local matching, seed 004 §3.1) and,
exported, the graphs of the units this broker keeps (ges.routing): both a chunk at a time, as
a job of ges.core.work, so no request holds the event loop — the driver runs :meth:`work` in
slices and holds the client's next request until its job is done. A changed profile is entered
before the old one is taken out, and while both are in the graph an event is delivered only if
the new one matches it too (the new profile's test, indexed for a large one). A client's and the
broker's subscriptions are bounded by weight (constraints plus ``in`` values): what they cost in
memory and matching time. A ``SubAck`` waits until every reachable keeper has the profile (at
most ``suback_wait`` seconds); reliable delivery also waits, level by level, for the starting
point of each pubend (ges.core.gates). :meth:`Subscriptions.deliver` matches a batch of events
once per event and sends each subscription its matching events, in order, as one ``Deliver``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from itertools import chain

import attrs

from ges.core.outputs import ToClient
from ges.core.part import Part
from ges.core.work import COST_PER_WEIGHT, Job, JobBody, Jobs, indexed
from ges.matching.graph import ProfileGraph
from ges.matching.model import (
    MAX_CONJUNCTIONS,
    MAX_PROFILE_WEIGHT,
    Conjunction,
    Profile,
    conjunction_from_wire,
    weight,
)
from ges.routing.acks import Ticket
from ges.wire import messages as m


@attrs.define(eq=False)
class SubAckWait:
    """A subscription whose ``SubAck`` waits for its keepers' acknowledgements."""

    conn: int
    sub_id: int
    #: the profile changes every reachable keeper must acknowledge
    ticket: Ticket
    #: when the client is answered anyway, as incomplete (None: it has been; reliable delivery
    #: still waits for the keepers to start it)
    deadline: float | None
    #: the request's ``req``, echoed in the answer
    req: int


class Subscriptions(Part):
    """Every local client's subscriptions, the jobs that enter them, and delivery to them."""

    def __init__(self, core):
        super().__init__(core)
        #: the time of the slice running now (a job's slices run at different times)
        self.now = 0.0
        #: (event, subscription) pairs the last :meth:`deliver` matched, each counted as its
        #: connection's weight if it has one (what handing it on costs against an ordinary
        #: delivery: a replicator's retained messages, ges.core.retaining)
        self.pairs = 0
        self.weights: dict[int, int] = {}
        # conn_id -> {sub_id: Profile}
        self.clients: dict[int, dict[int, Profile]] = {}
        self._client_names: dict[int, str] = {}
        #: SubAcks waiting for keepers
        self.waits: list[SubAckWait] = []
        #: large requests in progress (ges.core.work), and how many closed clients had jobs
        self._jobs = Jobs()
        self._closings = 0
        #: changing subscriptions whose new profile is being entered: the new profile's test
        self._entering: dict[tuple[int, int], object] = {}
        #: per subscription, the conjunctions the profile graph and the exporter hold for it
        #: (while a job runs, more or other than its profile's), with their copies
        self._entered: dict[tuple[int, int], dict[Conjunction, int]] = {}
        #: units this broker keeps around itself (its exported conjunctions go into each)
        self._kept_here = 0 if self.router is None else len(self.router.own_units())
        #: the weight of each client's subscriptions, and of all of them
        self._weights: dict[int, int] = {}
        self._local_weight = 0
        #: every local subscription's profile, destination (conn, sub_id) (seed 004 §3.1)
        self.profiles = ProfileGraph()
        #: local subscriptions
        self.count = 0

    def client_open(self, conn: int, client_id: str) -> None:
        self.clients[conn] = {}
        self._client_names[conn] = client_id
        self._weights[conn] = 0

    def client_closed(self, conn: int, now: float) -> list:
        """A client connection ended: its subscriptions go — a job, whose profile changes come
        out of this call and of :meth:`work`."""
        self.now = now
        for job in self._jobs.of(conn):
            self._jobs.drop(job)  # what it entered so far is in _entered, and goes below
        subs = self.clients.pop(conn, {})
        self.count -= len(subs)
        self._local_weight -= self._weights.pop(conn, 0)
        self._client_names.pop(conn, None)
        self._drop_waits(lambda w: w.conn == conn)
        for dest in [d for d in self.gates.gate if d[0] == conn]:
            self.gates.drop(dest)
        for dest in [d for d in self._entering if d[0] == conn]:
            del self._entering[dest]
        held = [(d, self._entered.pop(d)) for d in [d for d in self._entered if d[0] == conn]]
        if not held:
            return []
        out: list = []
        self._closings += 1

        def body() -> JobBody:
            while held:  # each let go of as it is taken out (see _copies)
                dest, counts = held.pop()
                yield from self._apply(dest, (), _copies(counts), out, held=counts)

        return self._jobs.start(Job(("closed", conn, self._closings), body(), out), self.work_slice)

    def _local_change(self, add, remove, now: float) -> tuple[list, frozenset[int]]:
        if self.router is None:
            return [], frozenset()
        sends, waits = self.router.local_change(add, remove, now)
        return self.core.to_peers(sends), waits

    def defer(self, key: Hashable, body: JobBody, out: list, *, keeps: bool = True) -> None:
        """A job of the core's own (no client waits on it), from the driver's next slice on;
        nothing if one with ``key`` is in progress already (``keeps``: see Job)."""
        if key not in self._jobs:
            self._jobs.start(Job(key, body, out, keeps=keeps), 0)

    def begin(self, key: Hashable, body: JobBody, out: list) -> list:
        """A job of the core's own whose first slice runs now (a small one is done in it):
        that slice's outputs; the rest in the driver's next slices. ``key`` must be new."""
        return self._jobs.start(Job(key, body, out, keeps=False), self.work_slice)

    @property
    def work_kept(self) -> bool:
        """The last slice of work made objects that stay alive (a profile entered)."""
        return self._jobs.kept

    def client_name(self, conn: int) -> str:
        """The id a connected client gave (its connection number if it has gone)."""
        return self._client_names.get(conn, str(conn))

    @property
    def has_work(self) -> bool:
        """A job or a removal's steps are in progress: the driver calls :meth:`work`."""
        return bool(self._jobs) or (self.router is not None and self.router.busy)

    def busy(self, conn: int) -> bool:
        """A request of client ``conn`` is still in progress: its next message must wait."""
        return self._jobs.busy(conn)

    def changing(self, conn: int, sub_id: int) -> bool:
        """Subscription ``(conn, sub_id)`` is being changed and its new profile is going in:
        from now on it gets only what the new profile matches too."""
        return (conn, sub_id) in self._entering

    def work(self, now: float) -> list:
        """One slice (:data:`WORK_SLICE` units) of what is in progress; the outputs."""
        self.now = now
        out, left = self._jobs.run(self.work_slice)
        router = self.router
        if router is not None and router.busy and left > 0:
            out += self.core.to_peers(router.background(now, left))
        return out + self.release_waits(now)

    def work_of(self, conn: int, now: float) -> list:
        """One slice of client ``conn``'s request in progress only (the simulator's: it runs a
        change of subscription up to where it takes effect, and nothing else with it)."""
        self.now = now
        return self._jobs.run_of(conn, self.work_slice)

    def _apply(self, dest, add, remove, out: list, ticket=None, held=None) -> JobBody:
        """Enter ``add`` and take out ``remove`` (conjunctions) for ``dest``, in the profile
        graph (local matching) and the exporter (the keepers) alike, a chunk at a time; each
        chunk's profile changes go to ``out``, and the adds to wait for into ``ticket``. Yields
        the work of each chunk; between chunks the graph and the exporter agree, and
        ``self._entered`` says what they hold for ``dest`` (``held``: a count taken out of it,
        of a client gone, kept up to date instead)."""
        if held is None:
            held = self._entered.setdefault(dest, {})
        graph = self.profiles
        router = self.router
        work = router.exporter.work if router is not None else 0
        # a conjunction goes into the local graph and, exported, into the graph of every unit
        # this broker keeps around itself
        per_weight = COST_PER_WEIGHT * (1 + self._kept_here)
        chunk_add: list = []
        chunk_remove: list = []
        cost = 0
        todo = chain(((True, c) for c in add), ((False, c) for c in remove))
        for adding, conj in chain(todo, ((None, None),)):  # a last, empty one flushes
            if adding is None:
                if not chunk_add and not chunk_remove:
                    break
            elif adding:
                graph.add(conj, dest)
                held[conj] = held.get(conj, 0) + 1
                chunk_add.append(conj)
            else:
                graph.remove(conj, dest)
                n = held.get(conj, 0) - 1
                if n > 0:
                    held[conj] = n
                else:
                    held.pop(conj, None)
                chunk_remove.append(conj)
            if adding is not None:
                cost += per_weight * weight(conj)
            if cost >= self.work_slice or adding is None:
                if router is not None:
                    # a slice may run well after the request came: it stamps its own time
                    sends, added = self._local_change(chunk_add, chunk_remove, self.now)
                    out += sends
                    if ticket is not None:
                        router.book.extend(ticket, router.waited(added))
                    cost += router.exporter.work - work
                    work = router.exporter.work
                chunk_add, chunk_remove = [], []
                yield cost
                cost = 0
        if not held and self._entered.get(dest) is held:
            del self._entered[dest]

    def on_unsubscribe(self, conn: int, msg: m.Unsubscribe, now: float) -> list:
        profile = self.clients[conn].pop(msg.sub_id, None)
        out = self._supersede(conn, msg.sub_id)
        done = ToClient(conn, m.SubAck(msg.sub_id, req=msg.req))
        if profile is None:
            return [*out, done]
        dest = (conn, msg.sub_id)
        self.gates.drop(dest)
        self.count -= 1
        self._set_weight(conn, -profile.weight)
        held = _copies(self._entered.get(dest, {}))

        def body() -> JobBody:
            yield from self._apply(dest, (), held, out)
            out.append(done)

        job = Job(("sub", conn, msg.sub_id), body(), out, conn=conn)
        return self._jobs.start(job, self.work_slice)

    def on_subscribe(self, conn: int, msg: m.Subscribe, now: float) -> list:
        subs = self.clients[conn]
        if msg.sub_id not in subs and len(subs) >= self.config.max_subscriptions_per_client:
            reason = f"over {self.config.max_subscriptions_per_client} subscriptions"
            return [ToClient(conn, m.Error(reason, req=msg.req))]
        if len(msg.conjunctions) > MAX_CONJUNCTIONS:
            reason = f"subscription {msg.sub_id}: over {MAX_CONJUNCTIONS} conjunctions"
            return [ToClient(conn, m.Error(reason, req=msg.req))]
        out: list = []
        tickets: list[Ticket] = []  # the one it opens, closed if the job is dropped
        body = self._subscribe(conn, msg, out, now, tickets)
        book = self.router.book if self.router is not None else None
        cancel = None if book is None else lambda: [book.close(t) for t in tickets]
        job = Job(("sub", conn, msg.sub_id), body, out, conn=conn, cancel=cancel)
        return self._jobs.start(job, self.work_slice)

    def _subscribe(
        self, conn: int, msg: m.Subscribe, out: list, now: float, tickets: list
    ) -> JobBody:
        """A new or changed subscription, in slices: parse the profile, enter it (the old one
        goes on delivering meanwhile), take out the old one, then answer."""
        conjunctions = []
        total = 0
        cost = 0
        try:
            for items in msg.conjunctions:
                conj = conjunction_from_wire(items)
                total += weight(conj)
                if total > MAX_PROFILE_WEIGHT:
                    raise ValueError(
                        f"weight over {MAX_PROFILE_WEIGHT} (constraints plus in-values)"
                    )
                conjunctions.append(conj)
                cost += weight(conj)
                if cost >= self.work_slice:
                    yield cost
                    cost = 0
        except ValueError as exc:
            out.append(ToClient(conn, m.Error(f"subscription {msg.sub_id}: {exc}", req=msg.req)))
            return
        profile = Profile.parsed(msg.profile_id, tuple(conjunctions) or (Conjunction(),), total)
        dest = (conn, msg.sub_id)
        subs = self.clients[conn]
        old = subs.get(msg.sub_id)
        grow = profile.weight - (old.weight if old is not None else 0)
        refusal = self._over_weight(conn, grow)
        if refusal is not None:
            out.append(
                ToClient(conn, m.Error(f"subscription {msg.sub_id}: {refusal}", req=msg.req))
            )
            return
        self._set_weight(conn, grow)
        out += self._supersede(conn, msg.sub_id)
        change = None
        if old is not None:
            # while the new profile is entered (and the old taken out) the graph holds some of
            # both: what it matches is delivered only if the new profile matches it too
            entering = yield from indexed(profile, self.work_slice, self.config.index_old_profiles)
            if self.reliable:
                change = yield from self.gates.change(dest, old)
            self._entering[dest] = entering
        if self.reliable:
            # nothing new delivered until its starting point is known, level by level
            self.gates.open(dest, change)
        # what it waits for, kept up to date as acknowledgements come while it is entered
        ticket = self.router.ticket(()) if self.router is not None else None
        if ticket is not None:
            tickets.append(ticket)
        old_held = _copies(self._entered.get(dest, {}))  # the old profile goes after the new is in
        yield from self._apply(dest, profile.effective, old_held, out, ticket)
        self._entering.pop(dest, None)
        if old is None:
            self.count += 1
        subs[msg.sub_id] = profile
        if self.reliable:
            out += self.gates.start(dest, ticket)
        if ticket is not None and not ticket.confirmed():
            deadline = self.now + self.config.suback_wait
            self.waits.append(SubAckWait(conn, msg.sub_id, ticket, deadline, msg.req))
            return
        if ticket is not None:
            self.router.book.close(ticket)
        out.insert(0, ToClient(conn, m.SubAck(msg.sub_id, req=msg.req)))

    def _over_weight(self, conn: int, grow: int) -> str | None:
        """Why a client may not grow its subscriptions by ``grow`` weight (None: it may)."""
        if grow <= 0:
            return None
        if self._weights.get(conn, 0) + grow > self.config.max_client_weight:
            return (
                f"the client's subscriptions would weigh over {self.config.max_client_weight} "
                "(constraints plus in-values)"
            )
        if self._local_weight + grow > self.config.max_local_weight:
            return (
                f"this broker's subscriptions would weigh over {self.config.max_local_weight} "
                "(constraints plus in-values)"
            )
        return None

    def _set_weight(self, conn: int, grow: int) -> None:
        if conn in self._weights:
            self._weights[conn] += grow
        self._local_weight += grow

    def _supersede(self, conn: int, sub_id: int) -> list:
        """A new request for a subscription ends the wait of an earlier one still waiting for
        its keepers: it is answered now, as incomplete (only the newest one starts delivery)."""
        return [
            ToClient(conn, m.SubAck(sub_id, complete=False, req=w.req))
            for w in self._drop_waits(lambda w: w.conn == conn and w.sub_id == sub_id)
            if w.deadline is not None  # its client has not had its SubAck yet
        ]

    def _drop_waits(self, which) -> list:
        """Stop waiting for the keepers on the SubAcks ``which(w)`` picks; returns them."""
        gone = [w for w in self.waits if which(w)]
        if gone:
            self.waits = [w for w in self.waits if not which(w)]
            for w in gone:
                self.router.book.close(w.ticket)
        return gone

    def release_waits(self, now: float) -> list:
        """SubAcks whose profile every reachable keeper has acknowledged (or that waited long
        enough)."""
        if not self.waits:
            return []
        out, keep = [], []
        for w in self.waits:
            out += self.gates.start((w.conn, w.sub_id), w.ticket)
            if w.ticket.confirmed():
                # complete; a client told it was not gets a second SubAck saying it now is
                out.append(ToClient(w.conn, m.SubAck(w.sub_id, req=w.req)))
                self.router.book.close(w.ticket)
            else:
                if w.deadline is not None and now >= w.deadline:
                    # the client is told; reliable delivery still starts only once every
                    # keeper has the profile (resends go on until then)
                    out.append(ToClient(w.conn, m.SubAck(w.sub_id, complete=False, req=w.req)))
                    if self.reliable:
                        w.deadline = None
                    else:
                        self.router.book.close(w.ticket)  # best effort waits no longer
                        continue
                keep.append(w)
        self.waits = keep
        return out

    def deliver(self, pubend: str, items: list) -> list:
        """Match each event against the local profiles (one profile-graph walk per event) and
        send each subscription its matching events, in order, as one ``Deliver``
        (:attr:`pairs`: how many (event, subscription) pairs that was, the work of it)."""
        self.pairs = 0
        if not self.profiles or not items:
            return []
        match = self.profiles.match
        results = [match(it.event.attributes) for it in items]
        first = results[0]
        if all(r == first for r in results):
            # the common case (same interests for the whole batch): one shared message per
            # subscription id, which the driver encodes once
            per = dict.fromkeys(first, items)
            self.pairs = len(first) * len(items)
        else:
            self.pairs = sum(len(r) for r in results)
            per = {}
            for it, dests in zip(items, results, strict=True):
                for dest in dests:
                    got = per.get(dest)
                    if got is None:
                        per[dest] = [it]
                    else:
                        got.append(it)
        if self.gates.gate:
            self.gates.filter_gated(pubend, per)
        if self._entering:
            for dest in [d for d in per if d in self._entering]:
                test = self._entering[dest].matches
                kept = [it for it in per[dest] if test(it.event.attributes)]
                if kept:
                    per[dest] = kept
                else:
                    del per[dest]
        out = []
        shared: dict[tuple[int, int], m.Deliver] = {}
        delivered = 0
        clients = self.clients
        durable = None
        for (conn, sub_id), matched in per.items():
            subs = clients.get(conn)
            if subs is None or sub_id not in subs:
                continue  # a subscription still being entered, or one going away
            if conn < 0:  # a durable session's own (ges.core.replicator)
                if durable is None:
                    durable = []
                durable.append(((conn, sub_id), matched))
                weight = self.weights.get(conn)
                if weight is not None:
                    self.pairs += (weight - 1) * len(matched)
                continue
            key = (sub_id, id(matched))
            msg = shared.get(key)
            if msg is None:
                msg = shared[key] = m.Deliver(sub_id, pubend, matched)
            out.append(ToClient(conn, msg))
            delivered += len(matched)
        self.counters["delivered"] += delivered
        self.counters["events_out"] += delivered
        if durable is not None:
            out += self.replicator.stored(pubend, durable)
        return out


def _copies(counts: dict) -> Iterator[Conjunction]:
    """The conjunctions of a ``{conjunction: copies}`` count as it is now, each as often as it
    is held (the count is copied here: it changes while they are taken out). The copy lets go
    of each as it is handed out, so a large profile is freed a chunk at a time as it is taken
    out, not all at once when the last chunk is done (16,384 conjunctions took 18 ms to free)."""
    items = list(counts.items())
    items.reverse()

    def handed_out() -> Iterator[Conjunction]:
        while items:
            conj, n = items.pop()
            for _ in range(n):
                yield conj

    return handed_out()
