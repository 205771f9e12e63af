"""The simulator's links: their state, the frames on them, and the faults that hit both.

Theory of operation
-------------------
A link between two live brokers is up under a *generation*; frames sent on it are put on the
clock to arrive ``LATENCY`` (plus a drawn delay) later, FIFO per direction unless reordering is
on, and are lost when the link goes down before they arrive. A link may be *held down* (a
failure, a partition, an operator) until it heals, or *silent* — up for both ends, carrying
nothing until the silence ends, when what was sent meanwhile arrives, as TCP would retransmit
it; a failure detector that suspects a silent link makes the core drop it, and the link is
dialled again every :data:`REDIAL` s until it answers. Data-plane frames (events, silence,
nacks, answers) may be dropped, duplicated, delayed and reordered; control frames only
duplicated and delayed (ges.sim.network's docstring says why).

:class:`SimLinks` is the part of :class:`ges.sim.Sim` that does this; it relies on the
simulator's clock (``at``, ``now``), random generator, cores and ``_feed``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs

from ges.wire import messages as m
from ges.wire.frames import HEADER_SIZE

_DATA = (m.Events, m.Silence, m.Nack, m.Recovered, m.AckAsk, m.Ack)

LATENCY = 0.001  # one link, one way
#: Seconds between a dropped link and the next attempt to dial it (the runtime backs off from
#: 0.05 s, ges.runtime.links).
REDIAL = 0.1


@attrs.define(eq=False)
class _Frame:
    """One frame on its way from ``src`` to ``dst`` (``lost`` once its link went down, or a
    test lost it)."""

    src: str
    dst: str
    body: bytes
    lost: bool = False


class SimLinks:
    """Links, frames in flight and their faults (a part of :class:`ges.sim.Sim`)."""

    def _init_links(self) -> None:
        #: links up: (a, b) with a < b by name -> the sequence number it came up under (a link
        #: going down loses what is on it: _link_down marks those frames lost)
        self._gen: dict[tuple[str, str], int] = {}
        #: links held down (a fault, a partition, or :meth:`link_down`) until they heal
        self._down_links: set[tuple[str, str]] = set()
        #: links that carry nothing, unknown to their ends, until when (the ``silent`` fault)
        self._silent: dict[tuple[str, str], float] = {}
        #: frames on their way, per direction, in the order they were sent
        self._flight: dict[tuple[str, str], list[_Frame]] = {}
        self._live_frames = 0
        self._last_arrival: dict[tuple[str, str], float] = {}
        #: crafted faults (tests): a frame ``blocked(src, dst, message)`` returns True for is
        #: lost, whatever its kind
        self.blocked: Callable[[str, str, object], bool] | None = None
        self.frames = 0
        self.data_frames = 0
        #: frames delivered, by message type name
        self.frame_types: Counter[str] = Counter()

    def connect_all(self) -> None:
        """Every link of the topology not held down comes up."""
        for link in self.topology.links:
            if _key(link.a, link.b) not in self._down_links:
                self._link_up(link.a, link.b)

    def link_down(self, a: str, b: str) -> None:
        """The link a–b goes down (as ``ges link down`` does) until :meth:`link_up`."""
        self._down_links.add(_key(a, b))
        self._link_down(a, b)

    def link_up(self, a: str, b: str) -> None:
        self._heal_link(a, b)

    def _link_up(self, a: str, b: str) -> None:
        key = _key(a, b)
        if key in self._gen or a not in self.cores or b not in self.cores:
            return
        self._gen[key] = next(self._seq)
        for x, y in ((a, b), (b, a)):
            self._feed(x, lambda core, y=y: core.link_up(y, self.now))

    def _link_down(self, a: str, b: str) -> None:
        if self._gen.pop(_key(a, b), None) is None:
            return
        for direction in ((a, b), (b, a)):  # frames in flight on a closed connection are lost
            for frame in self._flight.pop(direction, ()):
                if not frame.lost:
                    frame.lost = True
                    self._live_frames -= 1
        for x, y in ((a, b), (b, a)):
            if x in self.cores:
                self._feed(x, lambda core, y=y: core.link_down(y, self.now))

    def fail_link(self, a: str, b: str, down_for: float) -> None:
        key = _key(a, b)
        if key in self._down_links:
            return
        self.stats["link_failures"] += 1
        self._down_links.add(key)
        self._link_down(a, b)
        self.at(self.now + down_for, self._heal_link, a, b)

    def _heal_link(self, a: str, b: str) -> None:
        self._down_links.discard(_key(a, b))
        self._link_up(a, b)

    def silence(self, a: str, b: str, down_for: float) -> None:
        """The link a–b carries nothing for ``down_for`` s; neither end is told."""
        key = _key(a, b)
        if key in self._silent:
            return
        self.stats["silences"] += 1
        self._silent[key] = self.now + down_for
        self.at(self.now + down_for, self._silent.pop, key, None)

    def _dropped(self, a: str, b: str) -> None:
        """``a``'s failure detector gave up on ``b``: the connection closes, and is dialled
        again (a silent link answers once it carries frames again)."""
        key = _key(a, b)
        if key not in self._gen:
            return
        self.stats["suspected"] += 1
        self._link_down(a, b)
        self.at(self.now + REDIAL, self._redial, a, b)

    def _redial(self, a: str, b: str) -> None:
        key = _key(a, b)
        if key in self._gen or key in self._down_links or a not in self.cores:
            return
        if key in self._silent or b not in self.cores:
            self.at(self.now + REDIAL, self._redial, a, b)
            return
        self._link_up(a, b)

    def partition(self, unit: tuple, down_for: float) -> None:
        """Cut every link between two halves of ``unit``'s members (each half keeps its links
        to the rest of the network, so messages may go round the split)."""
        members = sorted(self.topology.units[unit])
        if len(members) < 2:
            return
        self.rng.shuffle(members)
        half = set(members[: len(members) // 2])
        cut = [
            (link.a, link.b)
            for link in self.topology.links
            if link.a in members
            and link.b in members
            and (link.a in half) != (link.b in half)
            and _key(link.a, link.b) not in self._down_links
        ]
        if not cut:
            return
        self.stats["partitions"] += 1
        for a, b in cut:
            self._down_links.add(_key(a, b))
            self._link_down(a, b)
        self.at(self.now + down_for, self._heal_partition, cut)

    def _heal_partition(self, cut: list) -> None:
        for a, b in cut:
            self._heal_link(a, b)

    # -- frames ------------------------------------------------------------------------------------

    def _send(self, src: str, dst: str, msg) -> None:
        key = _key(src, dst)
        if key not in self._gen:
            return
        self.cores[src].note_sent(dst, self.now)  # as the runtime does on every write
        if self.on_send is not None:
            self.on_send(src, dst, msg)
        if self.blocked is not None and self.blocked(src, dst, msg):
            self.stats["dropped"] += 1
            return
        frames = [frame[HEADER_SIZE:] for frame in m.encode_frames(msg)]
        f, rng = self.faults, self.rng
        data = isinstance(msg, _DATA)
        if data and f.on("drop") and rng.random() < f.drop:
            self.stats["dropped"] += 1
            return
        copies = 2 if f.on("dup") and rng.random() < f.dup else 1
        if copies == 2:
            self.stats["duplicated"] += 1
        for _ in range(copies):
            delay = LATENCY
            if f.on("delay"):
                delay += rng.random() * f.max_delay
            when = max(self.now, self._silent.get(key, 0.0)) + delay
            if not (data and f.on("reorder")):  # FIFO per direction
                when = max(when, self._last_arrival.get((src, dst), 0.0))
                self._last_arrival[(src, dst)] = when
            for body in frames:  # a message over the frame limit goes as several
                self._put(when, _Frame(src, dst, body))

    def _put(self, when: float, frame: _Frame) -> None:
        self._flight.setdefault((frame.src, frame.dst), []).append(frame)
        self._live_frames += 1
        self.at(when, self._arrive, frame)

    def send_at(self, when: float, src: str, dst: str, msg) -> None:
        """``msg`` arrives from ``src`` at ``dst`` at ``when``, over the link as it is now (a
        test holds a frame back with :attr:`blocked` and lets it arrive late with this)."""
        if _key(src, dst) in self._gen:
            for frame in m.encode_frames(msg):
                self._put(when, _Frame(src, dst, frame[HEADER_SIZE:]))

    def _arrive(self, frame: _Frame) -> None:
        if frame.lost:
            return  # its link went down meanwhile, or a test lost it
        src, dst = frame.src, frame.dst
        self._flight[(src, dst)].remove(frame)
        frame.lost = True
        self._live_frames -= 1
        msg = m.decode(frame.body)
        if self.on_arrive is not None:
            self.on_arrive(src, dst, msg)
        self.frames += 1
        self.frame_types[type(msg).__name__] += 1
        if isinstance(msg, _DATA):
            self.data_frames += 1
        self._feed(dst, lambda core: core.peer_message(src, msg, self.now))

    @property
    def in_transit(self) -> int:
        """Frames on their way (not yet arrived, not lost)."""
        return self._live_frames

    def in_flight(self, src: str, dst: str) -> list:
        """The messages on their way from ``src`` to ``dst``, in the order they were sent."""
        return [m.decode(f.body) for f in self._flight.get((src, dst), ()) if not f.lost]

    def lose(self, lost: Callable[[str, str, object], bool]) -> int:
        """Lose every frame on its way for which ``lost(src, dst, message)`` holds (tests);
        returns how many."""
        n = 0
        for flight in self._flight.values():
            keep = []
            for frame in flight:
                if lost(frame.src, frame.dst, m.decode(frame.body)):
                    frame.lost = True
                    n += 1
                else:
                    keep.append(frame)
            flight[:] = keep
        self._live_frames -= n
        return n

    def reachable(self, broker: str) -> set[str]:
        """The brokers ``broker`` reaches over links that are up (itself included)."""
        seen, todo = {broker}, [broker]
        while todo:
            a = todo.pop()
            for b in self.topology.neighbours[a]:
                if _key(a, b) in self._gen and b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)
