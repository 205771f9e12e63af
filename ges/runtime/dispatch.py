"""What a broker's core asks for, done: its outputs (ges.core.outputs) written to clients and
links, and the bounds on what waits to be written — the outputs half of
:class:`ges.runtime.broker.BrokerServer`.

Messages to one destination are joined (ges.core.coalesce) and go in one write. A client's
frames are queued without waiting, each connection within its own bound and all of them within
MAX_CLIENT_QUEUES_BYTES: a client over either is cut as a slow consumer (backpressure for
clients is the publishers' flow control, ges.runtime.broker). A link's frames wait for room
(backpressure between brokers). During a slice of the core's work a client's connection holds
what it is sent, for at most HOLD_SECONDS, so that the deliveries of several slices go in one
write.
"""

from __future__ import annotations

import logging
import time

import trio

from ges.core import DropPeer, Notice, ToClient, ToPeer
from ges.core.coalesce import coalesce
from ges.transport.connection import Connection, ConnectionClosed
from ges.wire import FrameTooLarge, encode, encode_frames
from ges.wire import messages as m

#: Bytes queued towards all clients together; over it, the client with the most queued is
#: disconnected as a slow consumer (each client also has its own bound, MAX_QUEUED_BYTES).
MAX_CLIENT_QUEUES_BYTES = 1024 * 1024 * 1024
#: Seconds a client's connection holds what slices of the core's work sent it before writing
#: it (``BrokerServer._to_client``), at most: the delay a fan-out's deliveries may take to
#: go in fewer, larger writes.
HOLD_SECONDS = 0.01


class Dispatching:
    """The outputs of :class:`ges.runtime.broker.BrokerServer` (its ``core``, connections,
    ``recorder``, budget and log)."""

    def _flush_held(self) -> None:
        """What the clients' connections held during slices of work goes (see _to_client)."""
        holding, self._holding = self._holding, set()
        for conn in holding:
            conn.flush_held()

    async def _dispatch(self, outs: list, *, hold: bool = False) -> None:
        """Perform a core's outputs: messages joined per destination (ges.core.coalesce), each
        destination's frames in one write, in their order."""
        outs = coalesce(outs)  # a session's own answers lead to more, added on the way
        encoded: dict[int, list[bytes]] = {}
        to_peers: dict[str, list[bytes]] = {}
        to_clients: dict[int, list[bytes]] = {}
        to_messages: dict[int, list] = {}
        now = None  # (read when first needed: most dispatches need no time)
        recorder = self.recorder
        # delivery records: the broker's clock before it hands anything on
        wall = time.time_ns() if recorder is not None else 0
        for out in outs:
            kind = type(out)
            if kind is ToPeer:
                pending = to_peers.get(out.peer)
                if pending is None:
                    pending = to_peers[out.peer] = []
            elif kind is ToClient:
                dest = out.conn
                if dest < 0:  # to a durable session's own subscriptions (ges.core.replicator)
                    now = self._now() if now is None else now
                    outs.extend(self.core.replicator.own(dest, out.msg, now))
                    continue
                if recorder is not None and type(out.msg) is m.Deliver:
                    recorder.deliver(self.core.client_name(dest), out.msg, wall)
                if dest in self._message_clients:  # MQTT: messages, not frames to decode
                    to_messages.setdefault(dest, []).append(out.msg)
                    continue
                pending = to_clients.get(dest)
                if pending is None:
                    pending = to_clients[dest] = []
            elif kind is Notice:
                level = logging.WARNING if out.level == "warning" else logging.INFO
                self.log.log(level, "%s", out.text)
                continue
            elif kind is DropPeer:
                conn = self._peers.get(out.peer)
                if conn is not None:
                    self._flush_held()
                    now = self._now() if now is None else now
                    await self._to_peer(out.peer, to_peers.pop(out.peer, ()), now)
                    self.log.warning("link %s suspected: %s", out.peer, out.reason)
                    conn.close(out.reason)
                continue
            else:
                raise TypeError(f"not a broker core output: {out!r}")
            msg = out.msg
            frames = encoded.get(id(msg))
            if frames is None:
                try:
                    frames = encoded[id(msg)] = encode_frames(msg)
                except FrameTooLarge as exc:  # a bound missed somewhere: say so, drop it
                    self.log.error("dropped a message: %s", exc)
                    frames = encoded[id(msg)] = []
            pending += frames
        for conn_id, frames in to_clients.items():
            self._to_client(conn_id, frames, hold=hold)
        for conn_id, msgs in to_messages.items():
            self._to_client(conn_id, msgs, messages=True, hold=hold)
        if self.core.has_work:  # (e.g. the rest of a session's window: ges.core.replicator)
            self._work_wakeup.set()
        if self._holding and any(  # what the clients were sent does not wait for a link
            peer in self._peers and self._peers[peer].would_wait(sum(map(len, frames)))
            for peer, frames in to_peers.items()
        ):
            self._flush_held()
        for peer, frames in to_peers.items():
            now = self._now() if now is None else now
            await self._to_peer(peer, frames, now)
        if recorder is not None:
            recorder.flush()

    def _to_client(
        self, conn_id: int, frames: list, *, messages: bool = False, hold: bool = False
    ) -> None:
        """Queue ``frames`` (encoded; ``messages``: the messages themselves, for a connection
        that takes them as they are — an MQTT client's) towards a client, cutting it as a slow
        consumer when they do not fit. ``hold``: a slice of the core's work (a fan-out's
        hand-on, a session's window): the connection holds what it is sent until the work is
        done or HOLD_SECONDS have passed, so the deliveries of several slices go in one write
        where each slice would take one per client."""
        conn = self._clients.get(conn_id)
        if conn is None or not frames:
            return
        if hold and not self._holding:
            self._flush_at = trio.current_time() + HOLD_SECONDS
        try:
            if messages:
                fits = conn.send_messages(frames, hold=hold)
            else:
                data = frames[0] if len(frames) == 1 else b"".join(frames)
                fits = conn.send_nowait(data, hold=hold)
            if hold and conn.holding:
                self._holding.add(conn)
            self._queued(conn, fits)
        except ConnectionClosed:
            pass

    def _queued(self, conn: Connection, fits: bool) -> None:
        """What was sent ``conn`` is queued (``fits``: within its bound): a client over its
        bound is a slow consumer, and over the bound of all clients' the largest is."""
        if not fits:
            self._slow_consumer(conn, f"over {conn.max_queued} bytes queued")
        elif self._client_budget.used > MAX_CLIENT_QUEUES_BYTES:
            self._over_budget()

    async def _to_peer(self, peer: str, frames, now: float) -> None:
        conn = self._peers.get(peer)
        if conn is None or not frames:
            return
        try:
            await conn.send(frames[0] if len(frames) == 1 else b"".join(frames))
        except ConnectionClosed:
            return
        self.core.note_sent(peer, now)

    def _slow_consumer(self, conn: Connection, why: str) -> None:
        """Disconnect a client that does not keep up, telling it why: what it had queued is
        dropped and an Error saying so goes last (the client library fails with that reason)."""
        self.counters["slow_consumers"] += 1
        self.log.warning("%s: slow consumer (%s), disconnecting", conn.label, why)
        reason = f"slow consumer: {why}"
        conn.close_after(encode(m.Error(reason)), reason, self.last_frame_wait)

    def _over_budget(self) -> None:
        """The clients' queues together are over MAX_CLIENT_QUEUES_BYTES: the largest goes."""
        open_ = [c for c in self._clients.values() if not c.closing]  # (gone: gave theirs back)
        if not open_:
            return
        largest = max(open_, key=lambda c: c.queued)
        self._slow_consumer(
            largest,
            f"{largest.queued} bytes queued, the most of any client while all of them had over "
            f"{MAX_CLIENT_QUEUES_BYTES}",
        )
