"""The trio shell around :class:`BrokerCore`: serve clients, dispatch outputs, keep time.

Theory of operation
-------------------
One nursery per broker. Tasks: the TCP listener (ges.runtime.admission: the handshake and the
bounds on connections), one dialler per link this broker dials (ges.runtime.links: backoff,
operator cuts), one reader and one writer per connection, a timer that feeds the core's
failure detector and rounds, a worker that runs large requests in slices (ges.core.work), and
with a data directory the SQLite log's group-commit task. The core is synchronous, so the
reader calls it directly and then awaits the sends its outputs ask for; that await is where
backpressure from a slow link reaches the connection that produced the traffic. Towards
clients nothing waits: a client that does not keep up is cut as a slow consumer and told why,
and while the clients' queues together hold a lot, no more publishes are read from clients.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import trio

from ges.core import (
    BrokerConfig,
    BrokerCore,
    ProtocolError,
    ToClient,
)
from ges.durable import replicators
from ges.durable.store import MemorySessionStore
from ges.errors import OperationError
from ges.matching.model import TOPIC_ATTR
from ges.runtime.access import INLINE_COVER_TESTS, INLINE_MATCHES, AccessControl, Admitted
from ges.runtime.admission import MAX_OPENING, Admission
from ges.runtime.commits import commit_alone, deletes_due, log_task, sessions_task
from ges.runtime.dispatch import Dispatching
from ges.runtime.links import BACKOFF_FIRST, BACKOFF_MAX, Links
from ges.runtime.loglines import BrokerLog, Lines
from ges.runtime.loopclock import LoopClock, installed
from ges.runtime.mqtt import MqttListener
from ges.runtime.notes import RateLimitedLog
from ges.runtime.pubend_log import LogBounds, SqliteLog, size_on_disk
from ges.runtime.recording import BrokerRecorder
from ges.runtime.session_store import RECENT_BYTES, SqliteSessionStore
from ges.runtime.sessions import SESSION_REQUESTS, SessionDesk
from ges.security.certs import CertDir, Identity
from ges.security.tls import context
from ges.topology import Topology, broker_order_key
from ges.transport.connection import (
    FRAME_DEADLINE,
    MAX_QUEUED_BYTES,
    TCP_KEEPALIVE,
    Budget,
    Connection,
    Watchdog,
)
from ges.wire import FrameError, encode
from ges.wire import messages as m

#: The timer task wakes at least this often even when the core has no deadline.
TIMER_MAX_SLEEP = 0.25
#: Seconds a closed client's profile retraction may wait for room on peer links.
CLOSE_SEND_WAIT = 1.0
#: Seconds of handling one connection's messages before the event loop serves others.
SLICE_SECONDS = 0.002
#: Flow control: while the clients' queues together hold more than this, the broker reads no
#: more publishes from its clients until they have drained to RESUME_PUBLISHING_BYTES — fast
#: publishers go at the pace of their subscribers instead of filling the broker's memory (and
#: a subscriber that stops reading is cut by its write deadline, so the pause ends).
PAUSE_PUBLISHING_BYTES = 256 * 1024 * 1024
RESUME_PUBLISHING_BYTES = 128 * 1024 * 1024
#: Flow control for the pubend log: while this many bytes of published events wait for their
#: commit, the broker reads no more publishes (a publisher that pipelines without a window
#: goes at the pace of the disk, instead of piling events up in memory behind a slow commit).
PAUSE_LOG_BYTES = 16 * 1024 * 1024
#: ... and for the replicator's session store: while this many bytes of events appended for
#: durable sessions wait for their commit (counted as the store's memory of what it appended
#: last counts them, ges.durable.recent: encoded, and the objects holding them), the broker
#: reads no more publishes from clients, nor events from its links. Half that memory, so that
#: a session that keeps up is streamed from it: unbounded, the groups grew while each was
#: written (to 74,000 events in bench/peers.py's reliable row), the subscriber fell that far
#: behind, and each delivery was read back from the file. (A link waits at most a quarter of
#: the failure detector's suspicion time for it, then is read anyway.)
PAUSE_SESSIONS_BYTES = RECENT_BYTES // 2
#: Retained messages the replicator takes (ges.core.BrokerCore.kept) after which the broker
#: freezes its heap (freeze_heap): they live as long as their topics' messages stand, and with
#: 100,000 retained topics each of the garbage collector's full passes took 12-47 ms (finding
#: nothing to free), inside whichever step allocated last — most often a hand-on slice.
FREEZE_KEPT = 10_000
#: Seconds a client cut as a slow consumer has to take the Error saying so (after what the
#: writer is writing), with nothing written meanwhile, before its connection closes anyway.
LAST_FRAME_WAIT = 2.0
#: Seconds a client's writer may go without getting any byte into the kernel while it has
#: something to send before the client counts as a slow consumer.
CLIENT_WRITE_DEADLINE = 10.0
#: Seconds a client may send nothing at all before it is disconnected as idle; the client
#: library sends a keepalive every ges.client.KEEPALIVE seconds (a third of this).
CLIENT_IDLE_TIMEOUT = 30.0
#: Clients one broker serves at once (``--max-clients``); one more is refused with a reason.
#: Each costs a connection, two tasks and its buffers (about 20 KB idle).
MAX_CLIENTS = 4_096


class BrokerServer(Dispatching):
    """Runs one broker of a topology on trio. ``await run(task_status=...)`` in a nursery."""

    def __init__(
        self,
        topology: Topology,
        broker_id: str,
        *,
        incarnation: int | None = None,
        listen_host: str | None = None,
        routing: str = "content",
        hierarchy=None,
        reliable: bool | None = None,
        data_dir: Path | None = None,
        strict_log: bool = False,
        log_bounds: LogBounds | None = None,
        record_dir: Path | None = None,
        record_tags: dict | None = None,
        max_clients: int = MAX_CLIENTS,
        config: BrokerConfig | None = None,
        certs: CertDir | None = None,
        access: Path | None = None,
        mqtt_port: int | None = None,
        mqtt_ws_port: int | None = None,
    ):
        self.topology = topology
        self.spec = topology.brokers[broker_id]
        self.id = broker_id
        # reliable delivery comes with content routing unless asked otherwise; the pubend log
        # is a SQLite file in the data directory (in memory without one: a restarted broker
        # then starts a new pubend)
        reliable = (routing == "content") if reliable is None else reliable
        self.pubend_log = (
            SqliteLog(
                Path(data_dir) / f"{broker_id}.pubend.db", strict=strict_log, bounds=log_bounds
            )
            if reliable and data_dir is not None
            else None
        )
        self._log_wakeup = trio.Event()
        #: set after each group commit (publishes paused for the log wait for it)
        self._log_room = trio.Event()
        self._kept_frozen = 0  # core.kept when the heap was last frozen for it
        #: the read deadlines of every connection on a plain socket (ges.transport.connection)
        self.watchdog = Watchdog()
        #: the log task is writing, checkpointing, releasing or trimming (commits.commit_alone)
        self._log_busy = False
        #: a replicator's store of durable sessions (ges.core.replicator): a SQLite file in the
        #: data directory (in memory without one: sessions then end with the broker)
        self.session_store = None
        if reliable and broker_id in {r.broker for r in replicators(topology)}:
            self.session_store = (
                SqliteSessionStore(Path(data_dir) / f"{broker_id}.sessions.db")
                if data_dir is not None
                else MemorySessionStore(os.urandom(8).hex())
            )
        self._sessions_wakeup = trio.Event()
        #: the store commits in groups (a task does it; a memory store commits at once)
        self._session_commits = isinstance(self.session_store, SqliteSessionStore)
        #: ``--record DIR``: delivery records of this broker's local clients
        self.recorder = (
            BrokerRecorder(record_dir, broker_id, tags=record_tags)
            if record_dir is not None
            else None
        )
        self.core = BrokerCore(
            topology,
            broker_id,
            incarnation=incarnation if incarnation is not None else time.time_ns(),
            routing=routing,
            hierarchy=hierarchy,
            reliable=reliable,
            log=self.pubend_log,
            config=config,
            sessions=self.session_store,
        )
        self.core.pid = os.getpid()
        #: TLS (None: plain TCP): the contexts this broker accepts and dials with, from the
        #: network's certificate directory (ges.security)
        me = Identity("broker", broker_id)
        self.tls_accept = None if certs is None else context(certs, me, server=True)
        self.tls_dial = None if certs is None else context(certs, me, server=False)
        self.listen_host = listen_host or self.spec.host
        #: what it logs at info and above is also kept for the network's watchers
        self.lines = Lines()
        self.log = BrokerLog(logging.getLogger(f"ges.broker.{broker_id}"), self.lines)
        self.core.watching.stats = self.stats
        self.core.watching.lines = self.lines.take
        #: who clients are and what they may do (None: plain TCP, everyone may do everything);
        #: the access file is ``access`` or the certificate directory's access.yaml
        self.access = (
            None if certs is None else AccessControl(access or certs.root / "access.yaml", self.log)
        )
        self._peers: dict[str, Connection] = {}
        self._clients: dict[int, Connection] = {}
        self._next_conn = 1
        self._nursery: trio.Nursery | None = None
        # neighbours whose link an operator cut -> set when it is restored (wakes the dialler);
        # only neighbours get in, so it is bounded by the topology
        self._cut: dict[str, trio.Event] = {}
        #: the loop's clock (run() puts the clock's own method here)
        self._now: Callable[[], float] = trio.current_time
        #: set when the core has large work in progress (ges.core.work): wakes the worker
        self._work_wakeup = trio.Event()
        #: clients whose next message waits for their request in progress -> set when done
        self._waiting: dict[int, trio.Event] = {}
        #: clients' connections holding what slices of work sent them, until _flush_at
        self._holding: set[Connection] = set()
        self._flush_at = 0.0
        #: large subscription checks run in a worker thread, one at a time
        self._checking = trio.CapacityLimiter(1)
        #: bytes queued towards all clients together
        self._client_budget = Budget()
        self.max_clients = max_clients
        self.max_opening = MAX_OPENING
        #: per-client bounds (the constants above; tests and --max-clients change them)
        self.client_queue_bytes = MAX_QUEUED_BYTES
        self.client_idle_timeout = CLIENT_IDLE_TIMEOUT
        #: seconds a link's dialler waits after a failed attempt: the first, and the most it
        #: doubles to (ges.runtime.links)
        self.backoff = (BACKOFF_FIRST, BACKOFF_MAX)
        self.client_write_deadline = CLIENT_WRITE_DEADLINE
        self.frame_deadline = FRAME_DEADLINE
        #: TCP keepalive of accepted connections: seconds silent, between probes, and probes
        self.tcp_keepalive = TCP_KEEPALIVE
        #: flow control and slow consumers (the constants above)
        self.pause_publishing_bytes = PAUSE_PUBLISHING_BYTES
        self.resume_publishing_bytes = RESUME_PUBLISHING_BYTES
        self.last_frame_wait = LAST_FRAME_WAIT
        #: connections accepted that have not completed their handshake, and clients admitted
        self._opening = 0
        self._admitted = 0
        #: warnings that may repeat, each cause logged once and then summarised
        self.notes = RateLimitedLog(self.log)
        #: what the runtime itself counts (Stats)
        self.counters = {"slow_consumers": 0, "clients_refused": 0, "requests_refused": 0}
        #: accepting connections, and the links to neighbours
        self.admission = Admission(self)
        #: MQTT clients (ges.runtime.mqtt): the port given, else the topology's, else none
        self.mqtt_port = mqtt_port if mqtt_port is not None else self.spec.mqtt_port
        #: ... and over WebSocket (ges.transport.websocket), the same way
        self.mqtt_ws_port = mqtt_ws_port if mqtt_ws_port is not None else self.spec.mqtt_ws_port
        self.mqtt = MqttListener(self)
        #: clients whose connection takes messages rather than frames (MQTT's)
        self._message_clients: set[int] = set()
        self._mqtt_listeners: list = []
        self.links = Links(self)
        #: durable sessions of this broker's clients, wherever their replicator is
        self.sessions = SessionDesk(self)
        #: connections of brokers following sessions of this replicator (Hello role "sessions")
        self._followers: set[int] = set()
        #: the event loop's busy stretches (ges.runtime.loopclock): the run's, shared with
        #: every other broker of this process; None until the broker runs
        self.loop_clock: LoopClock | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen, dial the links this broker owns, serve until cancelled."""
        self.loop_clock = installed()
        # trio.current_time() without its two wrappers: the clock's own method (it is read
        # a few times on the path of every message)
        self._now = trio.lowlevel.current_clock().current_time
        self.admission.fit_descriptors()
        try:
            listeners = await trio.open_tcp_listeners(self.spec.port, host=self.listen_host)
        except OSError as exc:
            raise OperationError(self.admission.listen_error(exc)) from None
        mqtt: list = []
        for port, over, handle in (
            (self.mqtt_port, "", self.mqtt.handle),
            (self.mqtt_ws_port, " over WebSocket", self.mqtt.handle_ws),
        ):
            if port is None:
                continue
            try:
                opened = await trio.open_tcp_listeners(port, host=self.listen_host)
            except OSError as exc:
                for listener in listeners + [lis for lis, _ in mqtt]:
                    await listener.aclose()
                raise OperationError(
                    f"broker {self.id}: cannot listen for MQTT{over} on {self.listen_host}:"
                    f"{port}: {exc.strerror or exc}"
                ) from None
            mqtt += [(listener, handle) for listener in opened]
        self._mqtt_listeners = mqtt
        try:
            async with trio.open_nursery() as nursery:
                await self._serve(nursery, listeners, task_status)
        finally:
            if self.recorder is not None:
                self.recorder.close()

    async def _serve(self, nursery: trio.Nursery, listeners, task_status) -> None:
        self._nursery = nursery
        for listener in listeners:
            nursery.start_soon(self.admission.serve_listener, listener)
        for listener, handle in self._mqtt_listeners:
            nursery.start_soon(self.admission.serve_listener, listener, handle, self.mqtt.dismiss)
        nursery.start_soon(self._timer)
        nursery.start_soon(self.watchdog.run)
        nursery.start_soon(self._worker)
        if self.pubend_log is not None:
            nursery.start_soon(log_task, self)
        if self._session_commits:
            nursery.start_soon(sessions_task, self)
        if self.core.replicator is not None:
            await self._dispatch(self.core.replicator.restore(trio.current_time()))
        for peer in self.core.neighbours:
            if broker_order_key(self.id) < broker_order_key(peer):
                nursery.start_soon(self.links.dial_forever, peer)
        self.log.info("listening on %s:%d", self.listen_host, self.spec.port)
        if self.mqtt_port is not None:
            self.log.info("MQTT on %s:%d", self.listen_host, self.mqtt_port)
        if self.mqtt_ws_port is not None:
            self.log.info("MQTT over WebSocket on %s:%d", self.listen_host, self.mqtt_ws_port)
        task_status.started(self)

    # -- time --------------------------------------------------------------------------------

    async def _timer(self) -> None:
        while True:
            deadline = self.core.next_deadline()
            now = trio.current_time()
            await trio.sleep(max(0.0, min(deadline - now, TIMER_MAX_SLEEP)))
            outs = self.core.on_timer(trio.current_time())
            self._logged_later()  # an ack round may have released log entries
            if self.access is not None:  # a changed access file applies within a second
                await self.access.reload_if_changed()
                for conn_id, why in self.access.take_changed():
                    conn = self._clients.get(conn_id)
                    if conn is not None:
                        self.log.warning("%s: %s", conn.label, why)
                        conn.close_after(
                            encode(m.Error(why, denied=True)), why, self.last_frame_wait
                        )
            if outs:
                await self._dispatch(outs)

    def _log_full(self, log) -> bool:
        """No more publishes are read while the log has PAUSE_LOG_BYTES to commit, or has
        committed publishes not yet handed on (a slice at a time: a fan-out's backlog) — the
        core's log in memory too (reliable delivery with no data directory) — or while the
        session store has PAUSE_SESSIONS_BYTES to commit."""
        if log is not None and log.uncommitted > PAUSE_LOG_BYTES:
            return True
        if self._sessions_full():
            return True
        return self.core.reliable and self.core.logged_pending

    def _sessions_full(self) -> bool:
        """The session store has PAUSE_SESSIONS_BYTES of events to commit."""
        return self._session_commits and self.session_store.uncommitted > PAUSE_SESSIONS_BYTES

    async def _room_for(self, full) -> None:
        """Wait until ``full()`` is false (a commit, or a hand-on slice, wakes it)."""
        while full():
            self._logged_later()  # (what is to be committed has its task awake)
            if self._log_room.is_set():
                self._log_room = trio.Event()
            await self._log_room.wait()

    async def _worker(self) -> None:
        """Large requests in slices (ges.core.work): one slice, then everything else that is
        ready runs before the next."""
        core = self.core
        while True:
            await self._work_wakeup.wait()
            self._work_wakeup = trio.Event()
            while core.has_work:
                if core.logged_pending and self._sessions_full():
                    # the hand-on of publishes appends to the session store: it waits for
                    # its commits as the reading of publishes does (what it held back for
                    # clients goes first)
                    self._flush_held()
                    await self._room_for(self._sessions_full)
                outs = core.work(trio.current_time())
                self._freeze_kept(core.work_kept)
                self._log_room.set()  # (a hand-on slice: publishes paused may go on)
                self._logged_later()
                if outs:
                    await self._dispatch(outs, hold=True)
                if self._holding and trio.current_time() >= self._flush_at:
                    self._flush_held()
                for conn_id, done in list(self._waiting.items()):
                    if not core.busy(conn_id):
                        del self._waiting[conn_id]
                        done.set()
                await trio.sleep(0)
            self._flush_held()

    async def _wait_for_work(self, conn_id: int) -> None:
        """Hold a client's next message until its request in progress is done."""
        if not self.core.busy(conn_id):
            return
        done = self._waiting.setdefault(conn_id, trio.Event())
        self._work_wakeup.set()
        await done.wait()

    def is_client(self, conn_id: int) -> bool:
        """Connection ``conn_id`` is a client still connected here."""
        return conn_id in self._clients

    def is_mqtt(self, conn_id: int) -> bool:
        """Connection ``conn_id`` is an MQTT client still connected here."""
        return conn_id in self._message_clients

    def is_follower(self, conn_id: int) -> bool:
        """Connection ``conn_id`` is a broker following sessions of this replicator."""
        return conn_id in self._followers

    def _logged_later(self) -> None:
        """A client message may have appended to the log or the session store: wake the task
        that commits it (ges.runtime.commits)."""
        if self._session_commits and self.session_store.pending:
            self._sessions_wakeup.set()
        log = self.pubend_log
        if log is not None and (log.pending or log.backfill_due or deletes_due(log)):
            self._log_wakeup.set()

    # -- links -------------------------------------------------------------------------------

    def _client_message(self, conn_id: int, msg, now: float) -> list:
        """What the runtime answers itself (link control, stats with its cut links); the rest
        goes to the core."""
        conn = self._clients.get(conn_id)
        if conn is not None and conn.closing:  # cut (a slow consumer): what it sends goes unread
            return []
        kind = type(msg)
        if kind is m.LinkControl:
            return self.links.link_control(conn_id, msg, now)
        if kind is m.StatsRequest:
            return [ToClient(conn_id, self.stats())]
        return self.core.client_message(conn_id, msg, now)

    def stats(self) -> m.Stats:
        """The core's counters with the runtime's own (cut links, refusals, slow consumers):
        what a ``StatsRequest`` is answered, and what the metrics read (ges.runtime.metrics)."""
        p50, p99 = (0, 0) if self.recorder is None else self.recorder.latency_us()
        clock = self.loop_clock
        return msgspec.structs.replace(
            self.core.stats(),
            links_cut=sorted(self._cut),
            slow_consumers=self.counters["slow_consumers"],
            clients_refused=self.counters["clients_refused"],
            requests_refused=self.counters["requests_refused"],
            queued_clients=self._client_budget.used,
            queued_links=sum(c.queued for c in self._peers.values()),
            log_bytes=0 if self.pubend_log is None else size_on_disk(self.pubend_log.path),
            latency_p50_us=p50,
            latency_p99_us=p99,
            loop_longest_us=0 if clock is None else round(clock.longest() * 1e6),
            loop_busy_us=0 if clock is None else round(clock.busy * 1e6),
        )

    async def _pump(self, conn: Connection, handle, client: int | None = None) -> None:
        """Feed every message read from ``conn`` to ``handle(msg, now)`` and perform its outputs.

        Messages read together are handled together — a client's consecutive publishes in one
        go (natural batching: ges.core.publishing's ``on_publishes``) — but not for longer than
        :data:`SLICE_SECONDS` before what is ready elsewhere gets its turn; a client's message
        that started a large request (ges.core.work) holds its next one back until the request
        is done. A bad frame or a protocol violation closes this one connection with a logged
        reason.
        """
        counters = self.core.counters
        core = self.core
        budget = self._client_budget
        access = self.access if client is not None else None
        try:
            async for batch in conn.read_messages():
                counters["frames_in"] += len(batch)
                log = self.pubend_log
                over_budget = budget.used > self.pause_publishing_bytes
                if (
                    client is not None
                    and (over_budget or self._log_full(log))
                    and any(type(msg) is m.Publish for msg in batch)
                ):  # flow control: the clients' queues, the log's commits and their hand-on
                    if over_budget:
                        await budget.below(self.resume_publishing_bytes)
                    await self._room_for(functools.partial(self._log_full, log))
                elif (
                    client is None
                    and self._sessions_full()
                    and any(type(msg) is m.Events for msg in batch)
                ):  # a link's events wait for the session store's commits as publishes do,
                    # for a while: a link not read is a neighbour that seems gone (its
                    # heartbeats unread), and the store's commit may itself be waiting to
                    # write to that neighbour
                    with trio.move_on_after(self.core.config.suspect_after / 4):
                        await self._room_for(self._sessions_full)
                started = self._now()
                outs: list = []
                run: list = []  # a client's publishes read together: handled together
                for msg in batch:
                    if access is not None and type(msg) in _CHECKED:
                        why = await self._refusal(client, msg)
                        if why is not None:
                            if run:
                                outs += self._client_publishes(client, run)
                                run = []
                            outs.append(
                                ToClient(
                                    client,
                                    m.Error(why, denied=True, req=_request_number(msg)),
                                )
                            )
                            continue
                    if client is not None and type(msg) is m.Publish:
                        run.append(msg)
                        continue
                    if run:
                        outs += self._client_publishes(client, run)
                        run = []
                    if client is not None and core.waits_for_publishes(client, msg):
                        # what it published before is matched first, as it sent them
                        await self._flush(outs)
                        outs = []
                        await self._room_for(functools.partial(core.publishes_unsent, client))
                    now = self._now()
                    if client is not None and type(msg) in SESSION_REQUESTS:
                        await self._flush(outs)  # a lookup may wait for replicators
                        # its answer goes at once: a session's stream may go on from the
                        # core's work (ges.core.replicator), which must not overtake it
                        await self._flush(await self.sessions.request(client, msg))
                        outs = []
                        if type(msg) is m.SessionOpen:  # what it sends next waits for the answer
                            await self.sessions.answered(client)
                        continue
                    outs += handle(msg, now)
                    busy = client is not None and core.busy(client)
                    if busy or now - started > SLICE_SECONDS:
                        await self._flush(outs)
                        outs = []
                        if busy:
                            await self._wait_for_work(client)
                        else:
                            await trio.lowlevel.checkpoint()
                        started = self._now()
                if run:
                    outs += self._client_publishes(client, run)
                await self._flush(outs)
        except (FrameError, ProtocolError) as exc:
            self.log.warning("closing %s: %s", conn.label, exc)
            conn.close(str(exc))

    def _client_publishes(self, conn_id: int, msgs: list) -> list:
        conn = self._clients.get(conn_id)
        if conn is not None and conn.closing:  # cut (a slow consumer): what it sends goes unread
            return []
        return self.core.client_publishes(conn_id, msgs, self._now())

    async def _refusal(self, conn_id: int, msg) -> str | None:
        """Why a client may not make this request (None: it may); a refusal is logged once per
        client and kind, then summarised (ges.runtime.notes)."""
        kind = type(msg)
        if kind is m.SessionOpen:
            if conn_id in self._followers:
                return None  # a broker vouches for its client
            for sub in msg.subs or ():  # each subscription as a Subscribe would be
                why = await self._refusal(conn_id, m.Subscribe(sub.sub_id, sub.conjunctions))
                if why is not None:
                    return why
            for sub in msg.fallback or ():  # used only if the session is new: said then
                why = await self._refusal(conn_id, m.Subscribe(sub.sub_id, sub.conjunctions))
                if why is not None:
                    msg.fallback, msg.fallback_refused = None, why
                    break
            return None
        if kind is m.RetainedAsk:  # what is retained is read as a subscription would be
            if conn_id in self._followers:
                return None
            conjunctions = [[m.Constraint(TOPIC_ATTR, "topic", f)] for f in msg.filters]
            return await self._refusal(conn_id, m.Subscribe(0, conjunctions))
        grant = self.access.grant(conn_id)
        if isinstance(grant, str):
            why = grant
        elif kind is m.Publish:
            if grant.publish_cost(msg.events) <= INLINE_MATCHES:
                why = grant.publish_refusal(msg.events, msg.publisher)
            else:  # a large batch against many allowed conjunctions leaves the loop
                why = await trio.to_thread.run_sync(
                    grant.publish_refusal, msg.events, msg.publisher, limiter=self._checking
                )
        elif kind is m.LinkControl:
            why = grant.operator_refusal(f"{'restore' if msg.up else 'cut'} a link")
        elif kind is m.Watch:
            why = grant.operator_refusal("watch the network")
        elif grant.subscribe_cost(msg.conjunctions) <= INLINE_COVER_TESTS:
            why = grant.subscribe_refusal(msg.conjunctions)
        else:  # covering tests take ~20 us each: a large profile's check leaves the loop
            why = await trio.to_thread.run_sync(
                grant.subscribe_refusal, msg.conjunctions, limiter=self._checking
            )
        if why is None:
            return None
        self.counters["requests_refused"] += 1
        who = self.access.who(conn_id)
        self.notes.warning(
            f"refused {kind.__name__} {who}", "refused a %s of %s: %s", kind.__name__, who, why
        )
        return why

    def _freeze_kept(self, job_kept: bool = False) -> None:
        """Freeze the heap (:func:`freeze_heap`) after a job's slice that kept objects
        (``job_kept``: ``core.work_kept``), or once the core has kept FREEZE_KEPT more retained
        messages since it last did."""
        kept = self.core.kept
        if job_kept or kept - self._kept_frozen >= FREEZE_KEPT:
            self._kept_frozen = kept
            freeze_heap()

    async def _flush(self, outs: list) -> None:
        logged = commit_alone(self)  # a lone publish goes out now, not after a hop to log_task
        self._logged_later()
        if outs:
            self.core.counters["frames_out"] += len(outs)
        if logged:
            outs = outs + logged if outs else logged
        if outs:
            await self._dispatch(outs)  # (which wakes the worker if the core has work)
        elif self.core.has_work:
            self._work_wakeup.set()
        self._freeze_kept()  # (a retained catch-up's page, read back from a log)

    # -- clients -----------------------------------------------------------------------------

    async def _run_client(
        self,
        client_id: str,
        conn: Connection,
        admitted: Admitted | None = None,
        *,
        follower: bool = False,
    ) -> None:
        conn_id = self._next_conn
        self._next_conn += 1
        if follower:
            self._followers.add(conn_id)
        if admitted is not None:
            self.access.opened(conn_id, admitted)
        conn.label = f"client {client_id}#{conn_id}"
        conn.conn_id = conn_id
        self._clients[conn_id] = conn
        if hasattr(conn, "send_messages"):
            self._message_clients.add(conn_id)
        self.core.client_open(conn_id, client_id)
        self.log.debug("%s connected", conn.label)
        try:
            with conn.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.writer)
                    await self._pump(
                        conn, functools.partial(self._client_message, conn_id), conn_id
                    )
                    nursery.cancel_scope.cancel()
        finally:
            if (conn.close_reason or "").startswith("slow consumer: nothing written"):
                self.counters["slow_consumers"] += 1
                self.log.warning("%s: %s, disconnected", conn.label, conn.close_reason)
            del self._clients[conn_id]
            self._message_clients.discard(conn_id)
            last_words = getattr(conn, "last_words", None)
            if last_words is not None:  # an MQTT will the broker's cut left unsaid
                try:
                    will = last_words()
                except Exception as exc:  # one client's will never takes the broker down
                    self.log.error("%s: its will is not published: %s", conn.label, exc)
                    will = []
                with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_SEND_WAIT):
                    await self._last_words(conn_id, will)
            if self.access is not None:
                self.access.closed(conn_id)
            # the client's profile leaves with it; a slow peer cannot hold up shutdown for
            # longer than this (a retraction that does not go now is resent by the router)
            self._waiting.pop(conn_id, None)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_SEND_WAIT):
                now = trio.current_time()
                await self._dispatch(self.sessions.client_closed(conn_id, now))
                self._followers.discard(conn_id)
                await self._dispatch(self.core.client_closed(conn_id, now))
            if self.core.has_work:  # the rest of a large profile's removal
                self._work_wakeup.set()
            self.log.debug("%s gone: %s", conn.label, conn.close_reason or "cancelled")

    async def _last_words(self, conn_id: int, msgs: list) -> None:
        """Publish what a client leaves behind (an MQTT will, once the broker closed its
        connection: a slow consumer's, one taken over), as its publishes would be; a will with
        a delay goes to the replicator of the session it leaves (``SessionLeave``), checked
        here as a publish (published now if that replicator cannot be told: the client holds
        no such session here, or the follow connection to it is down)."""
        for msg in msgs:
            if type(msg) is m.SessionLeave:
                will = None if msg.will is None else m.Publish(0, [msg.will])
                check = will is not None and self.access is not None
                if check and await self._refusal(conn_id, will) is not None:
                    msg, will = msgspec.structs.replace(msg, will=None), None
                if self.sessions.reaches(conn_id, msg.name):
                    await self._dispatch(self.sessions.leave(conn_id, msg, trio.current_time()))
                    self._logged_later()  # a will its replicator here published at once
                    continue
                if will is None:
                    continue
                msg = will
            elif self.access is not None and await self._refusal(conn_id, msg) is not None:
                continue
            await self._dispatch(self.core.client_publishes(conn_id, [msg], trio.current_time()))


def _request_number(msg) -> int:
    """What a refusal names the request it refuses by: its ``req``, a Publish's ``seq``."""
    return msg.seq if type(msg) is m.Publish else getattr(msg, "req", 0)


#: Client requests held against the client's grant (ges.security.access).
_CHECKED = frozenset({m.Publish, m.Subscribe, m.LinkControl, m.SessionOpen, m.Watch, m.RetainedAsk})


def freeze_heap() -> None:
    """Move what is alive out of the garbage collector's sight (``gc.freeze``): its full
    passes traverse every object it tracks, and a broker holds many that live as long as it
    does. Called after each slice of a large request (a 4,096-conjunction profile adds
    hundreds of thousands of objects: a full pass took 76 ms with one such profile, 330 ms
    with four, inside a slice meant to take a millisecond; with this the longest slice stayed
    under 8 ms), and by ``ges broker`` and ``ges up`` once their brokers have started (the
    objects of the imports and of the state restored: 65,000, a full pass of 30-40 ms on the
    development machine each time a quarter as many new ones had survived). The young
    generations are collected first, so the only garbage frozen for good is what formed
    cycles after surviving two collections and was not yet found — a few objects a closed
    connection leaves, if any. A broker's own state holds no reference cycles; what it frees,
    reference counting frees, frozen or not."""
    gc.collect(1)
    gc.freeze()
