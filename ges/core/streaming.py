"""A durable session's stream to its follower (seed 001 §4.2): what is committed after its
resume point, in epoch order, read from the store a page at a time, at most
:data:`WINDOW_BYTES` beyond what its client acknowledged — and of that, :data:`PUMP_BYTES` in
one go, the rest a page per slice of the core's work (ges.core.work), so that a window of
small events (thousands) does not hold the broker. A part of
:class:`ges.core.replicator.Replicator`.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from ges.core.outputs import ToClient
from ges.core.work import WORK_SLICE
from ges.wire import messages as m
from ges.wire.messages import event_size

if TYPE_CHECKING:
    from ges.core.replicator import Live

#: Bytes of a session's events streamed beyond what its client acknowledged.
WINDOW_BYTES = 1 << 20
#: Bytes of them sent at once (the rest of a window goes in slices of the core's work, each
#: costing PUMP_COST units): a window of 100-byte events is thousands, some ms each thousand.
PUMP_BYTES = 64 * 1024
PUMP_COST = WORK_SLICE


class Streaming:
    """The window of each session's stream (a part of the replicator)."""

    @staticmethod
    def _sent_upto(live: Live, epoch: int) -> int:
        """How many of the events sent after what was acknowledged (and what retention let go)
        are at or before ``epoch`` (≤ ``live.sent``); the batches wholly at or before it leave
        the window."""
        floor = max(live.state.acked, live.state.trimmed)
        inflight = live.inflight
        n = 0
        while inflight and inflight[0][0] <= epoch:
            _, size, epochs = inflight.popleft()
            live.inflight_bytes -= size
            n += len(epochs) - bisect_right(epochs, floor)
        if inflight:  # acknowledged part of the way
            epochs = inflight[0][2]
            n += max(0, bisect_right(epochs, epoch) - bisect_right(epochs, floor))
        return n

    def _pump(self, live: Live) -> list:
        """Send the follower what is committed after what it was sent, within the window: up
        to PUMP_BYTES now, the rest a page per slice of the core's work (ges.core.work), so a
        window of small events — thousands — does not hold the broker in one go."""
        out, more = self._pump_some(live)
        if more:
            pumped: list = []
            job = self._pumping(live, pumped)
            self.subscriptions.defer(("pump", live.state.key), job, pumped, keeps=False)
        return out

    def _pumping(self, live: Live, out: list):
        """The rest of a pump, in slices, to whichever follower the session has then (one
        that came meanwhile finds the job in progress, and it carries on for it)."""
        more = True
        while more and self._by_key.get(live.state.key) is live:
            got, more = self._pump_some(live)
            out += got
            yield PUMP_COST

    def _pump_some(self, live: Live) -> tuple[list, bool]:
        """Up to about PUMP_BYTES of the pump, and whether there is more it may send now."""
        if live.follower is None or live.opening is not None:
            return [], False
        out: list = []
        key = live.state.key
        state = live.state
        cap = self.stream_cap(live) if state.handover is not None else None
        if cap is not None and cap < 0:
            return [], False  # handed over: nothing streams from here
        if live.sent < state.trimmed:  # retention let go of some: the client is told first
            gaps = [
                m.SessionItem(
                    state.trimmed,
                    pubend,
                    m.EventItem(lo, 0, 0, m.Event({})),
                    [],
                    hi,
                    state.gap_why or "let go by retention",
                )
                for pubend, (lo, hi) in sorted(state.gaps.items())
            ]
            live.sent = state.trimmed
            if gaps:
                live.inflight.append((live.sent, 0, ()))
                out.append(ToClient(live.follower, m.SessionEvents(state.name, gaps)))
        upto = self.store.committed if cap is None else min(cap, self.store.committed)
        budget = PUMP_BYTES
        while live.inflight_bytes < WINDOW_BYTES and live.sent < upto:
            if budget <= 0:
                return out, True
            room = min(budget, WINDOW_BYTES - live.inflight_bytes)
            items = self.store.read(key, live.sent, max_bytes=room)
            if cap is not None:
                items = [it for it in items if it.epoch <= cap]
            if not items:
                live.sent = upto
                break
            size = sum(event_size(it.item.event) for it in items)
            live.sent = items[-1].epoch
            live.inflight.append((live.sent, size, [it.epoch for it in items]))
            live.inflight_bytes += size
            budget -= size
            out.append(ToClient(live.follower, m.SessionEvents(live.state.name, items)))
        return out, False
