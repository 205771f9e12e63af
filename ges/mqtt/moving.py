"""A persistent MQTT session's moves between replicators and its QoS 2 identifiers there:
sans-I/O, a part of :class:`ges.mqtt.session.MqttSession` (the connection's state is the
session's).

A replicator may hand the session over to another (seed 004 §4: the replicator of the unit the
client is in now): the old one sends it on with ``SessionClosed`` naming the new one, and the
session is opened there while the client stays connected (``reopen``, which the runtime calls
once ``reopen_after`` has passed; a replicator still taking it asks for a moment, up to
:data:`MAX_MOVES` opens). The new replicator's epochs are its own, so the count of them starts
again from what it says (``_new_store``), and the QoS 2 identifiers the client holds are told
to it whole (``_qos2_whole``): the old one may have changed them after it began handing over.
In between, the identifiers published and released, and the PUBRELs owed, go to the
replicator in one ``SessionQos2`` per batch (``_qos2_changes``).
"""

from __future__ import annotations

from collections import deque

from ges.mqtt import packets as p
from ges.mqtt.delivering import epoch_packet_id
from ges.wire import messages as m

#: Opens one move of a persistent session to another replicator may take (each replicator
#: that is asked may send it on, or ask it to wait), before the client is disconnected.
MAX_MOVES = 8
#: Seconds before an open that was asked to wait (the new replicator is still taking the
#: session) is tried again; doubled each time.
MOVE_PAUSE = 0.1


class Moving:
    """The moves half of :class:`ges.mqtt.session.MqttSession` (see the module docstring)."""

    def _qos2_changes(self) -> None:
        """A persistent session's QoS 2 identifiers published and released, told to its
        replicator in one request each way (a read's, a PubAck's); after a move, once the
        whole of them is kept there."""
        if self._whole is not None:
            return
        if self._to_keep or self._to_owe or self._to_drop or self._to_paid:
            self._req += 1
            self._keeping[self._req] = (self._to_keep, self._to_owe, self._to_drop)
            change = m.SessionQos2(
                self.name, self._to_keep, self._to_drop, self._req, self._to_owe, self._to_paid
            )
            self._pending.append(change)
            self._to_keep, self._to_owe, self._to_drop, self._to_paid = [], [], [], []

    def _closed(self, msg: m.SessionClosed) -> None:
        """The session's stream ended here. Handed over to another replicator (or on its way
        to one): opened there (``reopen``), the client connected as it was. Else the client
        is told (CONNACK 3 if it waits for one) and disconnected."""
        moving = msg.retry and not msg.ended and bool(msg.replicator or self._moving)
        if self._resume_only and not self.connected and not moving:  # none found to resume
            self._without_session()
            return
        if msg.ended:  # a will goes now: the session it would wait in is no more
            self.session_ended = True
        elif not (msg.retry or msg.to):  # taken over: its client is back
            self.taken_over = True
        if not moving or self._moves >= MAX_MOVES or self.closed is not None:
            self._lost(msg.reason, msg.retry)
            return
        if not self._moving:
            self.move_id += 1
        self._moves += 1
        if msg.replicator:  # there, at once
            self._moving = msg.replicator
            self.reopen_after = 0.0
        else:  # the replicator it was sent to is still taking it: a moment
            self.reopen_after = MOVE_PAUSE * 2 ** min(self._moves, 5)

    def reopen(self) -> list:
        """The open of a moving session at the replicator it was sent to (the runtime asks
        once ``reopen_after`` has passed)."""
        self.reopen_after = None
        if self.closed is not None or not self._moving:
            return []
        self._req += 1
        if self.connected:
            self._reopening.add(self._req)
        else:  # the CONNACK's open was sent on
            self._opening = self._req
        subs = self._session_subs() if self._changes else None  # with what is not answered
        return [self._open(subs, replicator=self._moving)]

    @property
    def moving(self) -> bool:
        """A move of the session to another replicator is under way (``move_id`` counts them)."""
        return bool(self._moving)

    def move_timed_out(self, move_id: int) -> None:
        """Move ``move_id`` did not end in time: the client is disconnected, and connects
        again."""
        if self._moving and self.move_id == move_id and self.closed is None:
            self._lost("not opened again in time at its new replicator", True)

    def _new_store(self, msg: m.SessionOpened) -> None:
        """Opened, connected, at a replicator whose epochs are another's: counted from its
        start; what is in flight is done with the old one; the PUBRELs owed by the old one's
        epochs are negative, never one of the new one's."""
        self._store = msg.store
        self._acked = self._sent_epoch = msg.start
        self._replayed_to = msg.last
        self._started_to = msg.sent
        self._epochs.clear()
        self._done_epochs.clear()
        self._pid_epoch.clear()
        self._had.clear()
        self._waiting = deque((*w[:6], None, w[7]) for w in self._waiting)
        self._owed = {pid: -abs(e) for pid, e in self._owed.items()}
        self._qos2_whole(new_store=True)

    def _moved(self, msg: m.SessionOpened, whole: bool) -> None:
        """Opened again while connected, at the replicator it moved to (``whole``: and the
        QoS 2 identifiers told to it whole already)."""
        self._reopening.clear()
        self._moving, self._moves = "", 0
        for req in sorted(r for r in self._changes if r < msg.req):  # the open had them
            for answer, _, retained in self._changes.pop(req):
                self._answer(answer, retained)
        if not whole:
            self._qos2_whole(new_store=False)

    def _qos2_whole(self, new_store: bool) -> None:
        """The QoS 2 identifiers the client holds, told whole to the replicator the session
        moved to: what the old one was told after the hand-over began, or was asked and never
        answered, the new one does not have (and what it was told of the client, it must not
        keep if the client let go of it since). The answers those asks awaited go once it
        keeps them; other changes wait for that (``_qos2_changes``)."""
        kept, owed, dropped = list(self._to_keep), list(self._to_owe), list(self._to_drop)
        for k, o, d in self._keeping.values():
            kept += k
            owed += o
            dropped += d
        if new_store:  # deliveries PUBREC'd under the old one's epochs: owed by them
            owed = [-abs(e) for e in owed]
            for e in owed:
                if epoch_packet_id(e) in self._released:
                    self._owed[epoch_packet_id(e)] = e
        self._keeping.clear()
        self._to_keep, self._to_owe, self._to_drop, self._to_paid = [], [], [], []
        self._req += 1
        self._whole = self._req
        self._keeping[self._req] = (kept, owed, dropped)
        # held: acknowledged by the pubend (PUBREC'd, or waiting to be kept), not before
        held = sorted({pid for pid, acked in self._received.items() if acked} | set(kept))
        rel = sorted(set(self._owed.values()) | set(owed))
        msg = m.SessionQos2(self.name, held, [], self._req, rel, whole=True)
        self._pending.append(msg)

    def open_timed_out(self) -> None:
        """The session's open went unanswered for too long (its replicator was lost while it
        was asked, say): CONNACK 3, server unavailable — the client connects again."""
        if self._resume_only and not self.connected:  # none it could resume: without one
            self._without_session()
        elif not self.connected and self.closed is None:
            self._lost("not opened in time (its replicator did not answer)", True)

    def _lost(self, reason: str, retry: bool) -> None:
        """The session cannot be opened here now (``retry``), or went elsewhere."""
        if not self.connected:
            self._send(self._connack(p.UNAVAILABLE if retry else p.NOT_AUTHORIZED))
        self.closed = f"durable session {self.name}: {reason}"
