"""Broker cores over a simulated network with seeded faults.

:class:`Sim` runs the same :class:`~ges.core.BrokerCore` the trio runtime drives, on simulated
time: a heap of timed happenings (a frame arriving, a core's timer, a fault), taken in time
order, ties broken by insertion order, every random choice drawn from one ``random.Random(seed)``
— so a seed replays identically. Frames go through the real codec.

Faults (:class:`Faults`, each on or off and with its rate):

* ``drop`` — a frame is lost; ``dup`` — it arrives twice; ``delay`` — it takes up to
  ``max_delay`` longer; ``reorder`` — frames on one link may overtake each other (without it each
  direction of a link is FIFO, as TCP is);
* ``link`` — a link goes down for a while (both ends see it go, frames on it are lost) and comes
  back;
* ``crash`` — a broker crashes, losing its soft state and its clients, and restarts after a
  while with the same stable storage (its pubend log, which opens the pubend's next epoch, as
  the runtime's does: ges.sim.commits);
* ``partition`` — every link between two halves of a unit goes down at once, and heals;
* ``silent`` — a link stops carrying frames for a while without either end being told (a cable
  pulled with no reset, a peer stalled): what is sent meanwhile arrives when it carries frames
  again, as TCP retransmits it — unless a failure detector suspects the link first (silences
  last up to ``silent_for``, beyond the detector's timeout); then the link closes, what was on it
  is lost, and it is dialled again every :data:`REDIAL` s until it answers.

With ``commit_after``, the pubend logs and session stores commit a group at a time, later
(ges.sim.commits), and a client's change of subscriptions waits for what it published before,
as in the runtime (``BrokerCore.waits_for_publishes``).

The cores run with their failure detectors on: an idle link carries heartbeats, and a
``DropPeer`` closes the link (both ends see it go) and redials, as the runtime does.

Data-plane frames (events, silence, nacks, answers) suffer drops, duplicates, delays and
reordering; control frames (connectivity, profiles and their acks) suffer delays and
duplicates but are not dropped or reordered while their link stays up, as over TCP — the
routing layer repairs what a *failed* link loses, not silent loss on a live one.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable

import attrs

from ges.core import BrokerConfig, BrokerCore, DropPeer, Notice, ToClient, ToPeer
from ges.core.coalesce import coalesce
from ges.durable import replicators
from ges.durable.store import MemorySessionStore
from ges.routing import Hierarchy
from ges.sim.commits import EpochGroupLog, EpochLog, GroupSessionStore
from ges.sim.faults import Faults
from ges.sim.links import SimLinks, _key
from ges.topology import Topology
from ges.wire import messages as m

#: Simulated seconds between two slices of a core's large requests (Sim.work_slice).
SLICE_GAP = 0.001
#: What a replicator tells its sessions' clients.
_SESSION_MESSAGES = frozenset(
    {m.SessionOpened, m.SessionEvents, m.SessionClosed, m.SessionList, m.SessionKept, m.Error}
)


class Sim(SimLinks):
    """N broker cores, their links and their clients, on simulated time."""

    def __init__(
        self,
        topology: Topology,
        *,
        seed: int,
        faults: Faults | None = None,
        reliable: bool = True,
        routing: str = "content",
        sufficiency: bool = True,
        linked: bool = True,
        on_deliver: Callable | None = None,
        on_puback: Callable | None = None,
        on_suback: Callable | None = None,
        on_crash: Callable | None = None,
        on_notice: Callable | None = None,
        on_send: Callable | None = None,
        on_arrive: Callable | None = None,
        work_slice: int | None = None,
        config: BrokerConfig | None = None,
        on_session: Callable | None = None,
        on_report: Callable | None = None,
        commit_after: tuple[float, float] | None = None,
        on_unacked: Callable | None = None,
        on_step: Callable | None = None,
        replicate: bool = False,
    ):
        self.topology = topology
        self.hierarchy = Hierarchy(topology)
        self.rng = random.Random(seed)
        self.faults = faults or Faults(kinds=frozenset())
        self.reliable = reliable
        self.routing = routing
        self.sufficiency = sufficiency
        self.on_deliver = on_deliver
        self.on_puback = on_puback
        self.on_suback = on_suback
        self.on_crash = on_crash
        #: ``on_notice(broker, notice)``: a line the broker would log
        self.on_notice = on_notice
        #: ``on_send(src, dst, message)`` as a core sends it (before any fault),
        #: ``on_arrive(src, dst, message)`` as it reaches ``dst`` (before ``dst`` handles it)
        self.on_send = on_send
        self.on_arrive = on_arrive
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self._inc = itertools.count(1)
        self.cores: dict[str, BrokerCore] = {}
        #: with ``commit_after=(lo, hi)``, a log or session store commits what was appended a
        #: group at a time, ``lo``-``hi`` s after the group's first append, and only then is it
        #: acknowledged and matched, or streamed (ges.sim.commits), as the runtime's are;
        #: without it, at once
        self.commit_after = commit_after
        #: each broker's stable storage: its pubend log survives crashes, and opens the
        #: pubend's next epoch at each restart as the runtime's does (ges.sim.commits)
        log = EpochLog if commit_after is None else EpochGroupLog
        self.logs: dict[str, EpochLog] = {b: log(epoch=1) for b in topology.brokers}
        #: the groups on their way: (broker, "log" or "sessions") -> the core they are for
        self._commit_at: dict[tuple[str, str], BrokerCore] = {}
        #: ``on_unacked(broker, pubend, [(tick, event), …], now)``: a crash came between a
        #: group's commit and its acknowledgement; these events are in the log for good
        self.on_unacked = on_unacked
        #: ``on_step(broker, core)``: after each step of a broker's core, once it handled what
        #: the step gave (to check what its state keeps true: ges.sim.invariants)
        self.on_step = on_step
        #: events so written at a crash, in all
        self.unacked = 0
        #: session stores' groups lost at a crash (drawn apart: other draws stay as they were)
        self._lost_groups = random.Random(f"lost groups {seed}")
        self.lost_groups = 0
        #: pubend logs' groups lost at a crash (their publishers were never acknowledged)
        self._lost_log_groups = random.Random(f"lost log groups {seed}")
        self.lost_log_groups = 0
        #: how often a group in flight at a crash is lost rather than written (tests pin it)
        self.lose_at_crash = 0.5
        #: ``on_session(broker, conn, msg, now)``: a durable-session message to a client; with
        #: it (or ``replicate``: for retained messages only), the topology's replicators run,
        #: keeping their sessions and retained messages, which survive crashes as the logs do
        self.on_session = on_session
        #: ``on_report(broker, conn, report, now)``: a watcher's report (ges.core.watch)
        self.on_report = on_report
        store = MemorySessionStore if commit_after is None else GroupSessionStore
        self.session_stores = (
            {r.broker: store(r.broker) for r in replicators(topology)}
            if (on_session is not None or replicate) and reliable
            else {}
        )
        self._init_links()
        self._timer_at: dict[str, float] = {}
        #: large requests (ges.core.work): None runs them to the end at the moment they come;
        #: a number of work units makes every core run them that much at a time, SLICE_GAP
        #: apart, with frames, timers and faults in between, and holds a busy client's next
        #: message back until its request is done — as the trio runtime does
        self.work_slice = work_slice
        #: every core's settings (a work_slice given replaces the config's)
        self.config = config or BrokerConfig()
        if work_slice is not None:
            self.config = attrs.evolve(self.config, work_slice=work_slice)
        self._held_msgs: dict[tuple[str, int], list] = {}
        self.slices = 0  # slices run apart from the request that started them
        self._work_at: dict[str, BrokerCore] = {}
        self.stats = dict.fromkeys(
            ("dropped", "duplicated", "link_failures", "crashes", "partitions", "silences"), 0
        )
        #: links a failure detector dropped
        self.stats["suspected"] = 0
        for b in topology.brokers:
            self._start(b)
        if linked:
            self.connect_all()

    # -- brokers ---------------------------------------------------------------------------------

    def _start(self, broker: str) -> None:
        core = BrokerCore(
            self.topology,
            broker,
            incarnation=next(self._inc),
            routing=self.routing,
            hierarchy=self.hierarchy,
            reliable=self.reliable,
            log=self.logs[broker] if self.reliable else None,
            config=self.config,
            sessions=self.session_stores.get(broker),
        )
        if core.router is not None:
            core.router.sufficiency = self.sufficiency
        self.cores[broker] = core
        for key in [k for k in self._held_msgs if k[0] == broker]:
            del self._held_msgs[key]  # the clients went with the crash
        self._timer_at.pop(broker, None)
        if core.replicator is not None:
            self._feed(broker, lambda c: c.replicator.restore(self.now))

    def kill(self, broker: str) -> None:
        """``broker`` dies: its links close (frames on them are lost), its soft state and its
        clients are gone; its stable storage stays for :meth:`restart`."""
        if broker not in self.cores:
            return
        for n in self.topology.neighbours[broker]:
            self._link_down(broker, n)
        core = self.cores.pop(broker)
        if self._commit_at.pop((broker, "sessions"), None) is not None:
            # the group in flight was written, or lost: half the time each (ges.sim.commits)
            store = self.session_stores[broker]
            if self._lost_groups.random() < self.lose_at_crash:
                store.lose()
                self.lost_groups += 1
            else:
                store.commit()
        if self._commit_at.pop((broker, "log"), None) is not None:
            # the group in flight was written (its acks never went), or lost: half the time each
            log = self.logs[broker]
            if self._lost_log_groups.random() < self.lose_at_crash:
                log.lose()
                self.lost_log_groups += 1
            else:
                first = log.committed + 1
                log.commit()
                written = log.read(first, log.last, limit=log.last)
                self.unacked += len(written)
                if self.on_unacked:
                    self.on_unacked(broker, core.pubend, written, self.now)
        if self.on_crash:
            self.on_crash(broker)

    def crash(self, broker: str, down_for: float) -> None:
        if broker not in self.cores:
            return
        self.stats["crashes"] += 1
        self.kill(broker)
        self.at(self.now + down_for, self.restart, broker)

    def restart(self, broker: str) -> None:
        if broker in self.cores:
            return
        self.logs[broker] = self.logs[broker].reopen()
        self._start(broker)
        for n in self.topology.neighbours[broker]:
            if n in self.cores and _key(broker, n) not in self._down_links:
                self._link_up(broker, n)

    # -- clients -----------------------------------------------------------------------------------

    def client(self, broker: str, conn: int, msg) -> bool:
        """A client message to ``broker`` (False if it is down); one for a client whose request
        is still in progress waits for it, as the runtime holds it back, and so does a change
        of its subscriptions made before what it published is matched (with the messages
        after either)."""
        core = self.cores.get(broker)
        if core is None:
            return False
        if not core.connected(conn):
            core.client_open(conn, f"client-{conn}")
        held = self._held_msgs.get((broker, conn))
        if held is not None or _waits(core, conn, msg):
            self._held_msgs.setdefault((broker, conn), []).append(msg)
            return True
        self._feed(broker, lambda c: self._client_message(c, conn, msg))
        return True

    def close_client(self, broker: str, conn: int) -> None:
        """The client's connection to ``broker`` closes (what it still had queued is lost)."""
        self._held_msgs.pop((broker, conn), None)
        if broker in self.cores:
            self._feed(broker, lambda core: core.client_closed(conn, self.now))

    def _client_message(self, core: BrokerCore, conn: int, msg) -> list:
        change = type(msg) is m.Subscribe and core.subscribed(conn, msg.sub_id)
        out = core.client_message(conn, msg, self.now)
        if change and self.work_slice is not None:
            # a change takes effect (for the checker, when the message is sent) once its new
            # profile starts to go in: its parsing and indexing run now, the rest in slices
            while core.busy(conn) and not core.changing(conn, msg.sub_id):
                out += core.work_of(conn, self.now)  # (its own: not the core's other jobs)
        return out

    # -- the clock ---------------------------------------------------------------------------------

    def at(self, when: float, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), fn, args))

    def run_until(self, until: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            self.step()
        self.now = max(self.now, until)

    def step(self) -> bool:
        """Take the next happening (a frame arriving, a timer, a fault); False if none is left."""
        if not self._heap:
            return False
        when, _, fn, args = heapq.heappop(self._heap)
        self.now = max(self.now, when)
        fn(*args)
        return True

    def settle(self, max_steps: int = 1_000_000) -> int:
        """Run until no frame is on its way (timers that come due meanwhile fire); returns
        the happenings taken."""
        steps = 0
        while self._live_frames:
            self.step()
            steps += 1
            if steps >= max_steps:
                raise RuntimeError(f"the network did not settle in {max_steps} steps")
        return steps

    def _timer(self, broker: str, when: float) -> None:
        if self._timer_at.get(broker) != when or broker not in self.cores:
            return  # superseded, or the broker crashed
        del self._timer_at[broker]
        self._feed(broker, lambda core: core.on_timer(self.now))

    def _feed(self, broker: str, fn: Callable) -> None:
        core = self.cores[broker]
        self._handle(broker, fn(core))
        if self.work_slice is None:
            while core.has_work:  # a large request's slices, at the same simulated moment
                self._handle(broker, core.work(self.now))
        elif core.has_work and self._work_at.get(broker) is not core:
            self._work_at[broker] = core
            self.at(self.now + SLICE_GAP, self._work, broker, core)
        if self.commit_after is not None:
            stores = (("log", self.logs[broker]), ("sessions", self.session_stores.get(broker)))
            for kind, store in stores:
                if store is not None and store.pending and (broker, kind) not in self._commit_at:
                    self._commit_at[(broker, kind)] = core  # what is appended until it commits
                    when = self.now + self.rng.uniform(*self.commit_after)
                    self.at(when, self._commit, broker, kind)
        deadline = core.next_deadline()
        if deadline < float("inf"):
            deadline = max(deadline, self.now)
            if self._timer_at.get(broker, float("inf")) > deadline:
                self._timer_at[broker] = deadline
                self.at(deadline, self._timer, broker, deadline)
        if self.on_step is not None:
            self.on_step(broker, core)

    def _work(self, broker: str, core: BrokerCore) -> None:
        """One slice of what ``broker``'s core has in progress; then the messages of clients
        no longer busy."""
        if self._work_at.get(broker) is core:
            del self._work_at[broker]
        if self.cores.get(broker) is not core:
            return  # it crashed meanwhile
        self.slices += 1
        self._feed(broker, lambda c: c.work(self.now))
        self._release_held(broker, core)

    def _commit(self, broker: str, kind: str) -> None:
        """``broker``'s log commits its group (the core acknowledges and matches it), or its
        session store does (the replicator streams it and may acknowledge it)."""
        core = self._commit_at.pop((broker, kind), None)
        if core is None or self.cores.get(broker) is not core:
            return  # it crashed meanwhile (and the group was written then)
        if kind == "log":
            self.logs[broker].commit()
            self._feed(broker, lambda c: c.on_logged(self.now))
        else:
            self.session_stores[broker].commit()
            self._feed(broker, lambda c: c.replicator.on_committed())
        self._release_held(broker, core)

    def _release_held(self, broker: str, core: BrokerCore) -> None:
        """The messages held back for clients of ``broker`` no longer waiting go in."""
        for key in [k for k in self._held_msgs if k[0] == broker]:
            conn, queue = key[1], self._held_msgs.get(key, [])
            while queue and not _waits(core, conn, queue[0]):
                msg = queue.pop(0)
                self._feed(broker, lambda c, m_=msg, c_=conn: self._client_message(c, c_, m_))
            if not queue:
                self._held_msgs.pop(key, None)

    # -- outputs -----------------------------------------------------------------------------------

    def _handle(self, src: str, outputs: list) -> None:
        # the cores emit their outputs in an order that depends on nothing but the inputs (no
        # iteration over a set of names decides it), so a run is the same in every process;
        # joined per destination as the trio runtime joins them
        for out in coalesce(outputs):
            kind = type(out)
            if kind is ToPeer:
                self._send(src, out.peer, out.msg)
            elif kind is ToClient:
                msg = out.msg
                t = type(msg)
                if out.conn < 0:  # a durable session's own subscription (ges.core.replicator)
                    core = self.cores[src]
                    self._handle(src, core.replicator.own(out.conn, msg, self.now))
                elif t in _SESSION_MESSAGES:
                    if self.on_session:
                        self.on_session(src, out.conn, msg, self.now)
                elif t is m.Deliver and self.on_deliver:
                    self.on_deliver(src, out.conn, msg, self.now)
                elif t is m.PubAck and self.on_puback:
                    self.on_puback(src, out.conn, msg, self.now)
                elif t is m.SubAck and self.on_suback:
                    self.on_suback(src, out.conn, msg, self.now)
                elif t is m.Report and self.on_report:
                    self.on_report(src, out.conn, msg, self.now)
            elif kind is DropPeer:
                # the runtime closes the connection after handling what came with it
                self.at(self.now, self._dropped, src, out.peer)
            elif kind is Notice:
                if self.on_notice:
                    self.on_notice(src, out)
            else:
                raise TypeError(f"not a broker core output: {out!r}")

    # -- faults ------------------------------------------------------------------------------------

    def schedule_faults(self, start: float, end: float) -> None:
        """Draw the run's link failures, crashes and partitions between ``start`` and ``end``."""
        f, rng = self.faults, self.rng
        links = [(link.a, link.b) for link in self.topology.links]
        brokers = sorted(self.topology.brokers)
        units = [u for u, members in self.topology.units.items() if len(members) > 1 and u]
        for kind, rate in (
            ("link", f.link_rate),
            ("crash", f.crash_rate),
            ("partition", f.partition_rate),
            ("silent", f.silent_rate),
        ):
            if not f.on(kind) or rate <= 0:
                continue
            t = start
            while True:
                t += rng.expovariate(rate)
                if t >= end:
                    break
                down = rng.uniform(*f.down_for)
                if kind == "link":
                    self.at(t, self.fail_link, *rng.choice(links), down)
                elif kind == "crash":
                    self.at(t, self.crash, rng.choice(brokers), down)
                elif kind == "silent":
                    self.at(t, self.silence, *rng.choice(links), rng.uniform(*f.silent_for))
                elif units:
                    self.at(t, self.partition, rng.choice(units), down)


def _waits(core: BrokerCore, conn: int, msg) -> bool:
    """Client ``conn``'s ``msg`` waits: a request of the client's is still in progress, or
    it changes the client's subscriptions before what it published is matched."""
    return core.busy(conn) or core.waits_for_publishes(conn, msg)
