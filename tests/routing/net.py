"""Content-routing broker cores over an in-memory network, for the routing tests.

Frames go through the real codec. Each direction of a link is FIFO (as TCP is); which link's next
frame is delivered is chosen by a seeded generator. Closing a link loses the frames on it.
"""

from __future__ import annotations

import itertools
import random
from collections import deque

from ges.core import BrokerCore, Notice, ToClient, ToPeer
from ges.core.failure import FailureDetector
from ges.matching.model import Profile, profile_to_wire
from ges.routing import Hierarchy
from ges.topology import Topology
from ges.wire import messages as m
from ges.wire.frames import HEADER_SIZE


class Net:
    def __init__(self, topology: Topology, seed: int = 0, routing: str = "content"):
        self.topology = topology
        self.routing = routing
        self.hierarchy = Hierarchy(topology)
        self.rng = random.Random(seed)
        self._inc = itertools.count(1)
        self.cores: dict[str, BrokerCore] = {}
        self.queues: dict[tuple[str, str], deque] = {}
        self.up: set[tuple[str, str]] = set()
        #: (broker, conn) -> [(pubend, tick)] delivered, in order
        self.delivered: dict[tuple[str, int], list[tuple[str, int]]] = {}
        #: (broker, pubend, tick) -> times an Events item for it arrived at that broker
        self.received: dict[tuple[str, str, int], int] = {}
        #: (broker, pubend, tick) -> times that broker sent an item for it on
        self.sent: dict[tuple[str, str, int], int] = {}
        self.subacks: dict[tuple[str, int], list[int]] = {}
        self.profiles: dict[tuple[str, int, int], Profile] = {}
        self.frames = 0
        #: (broker, pubend, tick) -> [(from, routes)] for every copy received
        self.trace: dict[tuple[str, str, int], list] = {}
        self.now = 0.0
        for b in topology.brokers:
            self.start(b)

    # -- brokers and links ---------------------------------------------------------------------

    def start(self, broker: str) -> BrokerCore:
        core = BrokerCore(
            self.topology,
            broker,
            incarnation=next(self._inc),
            detector=FailureDetector(interval=1e8, timeout=1e9),
            routing=self.routing,
            hierarchy=self.hierarchy,
        )
        self.cores[broker] = core
        return core

    def connect_all(self) -> None:
        for link in self.topology.links:
            if link.a in self.cores and link.b in self.cores:
                self.link(link.a, link.b, up=True)

    def link(self, a: str, b: str, *, up: bool) -> None:
        for x, y in ((a, b), (b, a)):
            if up:
                self.up.add((x, y))
                self.queues[(x, y)] = deque()
            else:
                self.up.discard((x, y))
                self.queues.pop((x, y), None)  # frames in flight are lost
        for x, y in ((a, b), (b, a)):
            core = self.cores.get(x)
            if core is not None:
                self.handle(x, core.link_up(y, self.now) if up else core.link_down(y, self.now))

    def kill(self, broker: str) -> None:
        """The broker dies: its links close (frames on them are lost), its state is gone."""
        for n in self.topology.neighbours[broker]:
            if (broker, n) in self.up:
                self.link(broker, n, up=False)
        del self.cores[broker]

    def restart(self, broker: str) -> None:
        self.start(broker)
        for n in self.topology.neighbours[broker]:
            if n in self.cores:
                self.link(broker, n, up=True)

    # -- clients ---------------------------------------------------------------------------------

    def subscribe(self, broker: str, conn: int, sub_id: int, profile: Profile) -> None:
        core = self.cores[broker]
        if not core.connected(conn):
            core.client_open(conn, f"client-{conn}")
        self.profiles[(broker, conn, sub_id)] = profile
        msg = m.Subscribe(sub_id, profile_to_wire(profile), profile.id)
        self.handle(broker, core.client_message(conn, msg, self.now))

    def unsubscribe(self, broker: str, conn: int, sub_id: int) -> None:
        self.profiles.pop((broker, conn, sub_id), None)
        self.handle(
            broker, self.cores[broker].client_message(conn, m.Unsubscribe(sub_id), self.now)
        )

    def close_client(self, broker: str, conn: int) -> None:
        for key in [k for k in self.profiles if k[:2] == (broker, conn)]:
            del self.profiles[key]
        self.handle(broker, self.cores[broker].client_closed(conn, self.now))

    def publish(self, broker: str, events: list[dict], conn: int = 999) -> m.PubAck:
        core = self.cores[broker]
        if not core.connected(conn):
            core.client_open(conn, "publisher")
        out = core.client_message(conn, m.Publish(1, [m.Event(a) for a in events]), self.now)
        self.handle(broker, out)
        ack = next(o.msg for o in out if type(o) is ToClient and type(o.msg) is m.PubAck)
        return ack

    # -- the network -------------------------------------------------------------------------------

    def handle(self, src: str, outputs: list) -> None:
        self._handle(src, outputs)
        core = self.cores.get(src)
        while core is not None and core.has_work:  # large requests finish before the next step
            self._handle(src, core.work(self.now))

    def _handle(self, src: str, outputs: list) -> None:
        for out in outputs:
            if type(out) is ToPeer:
                dest, msg = out.peer, out.msg
                assert dest in self.cores[src].links_up, (src, dest)
                if type(msg) is m.Events:
                    for it in msg.items:
                        key = (src, msg.pubend, it.tick)
                        self.sent[key] = self.sent.get(key, 0) + 1
                q = self.queues.get((src, dest))
                if q is not None:
                    q.append(m.encode(msg)[HEADER_SIZE:])
            elif type(out) is ToClient:
                msg = out.msg
                if type(msg) is m.Deliver:
                    got = self.delivered.setdefault((src, out.conn), [])
                    got += [(msg.pubend, it.tick) for it in msg.items]
                elif type(msg) is m.SubAck:
                    self.subacks.setdefault((src, out.conn), []).append(msg.sub_id)
            else:
                assert type(out) is Notice, out

    def step(self) -> bool:
        busy = [k for k, q in self.queues.items() if q]
        if not busy:
            return False
        src, dst = busy[self.rng.randrange(len(busy))]
        msg = m.decode(self.queues[(src, dst)].popleft())
        self.frames += 1
        if type(msg) is m.Events:
            for it in msg.items:
                key = (dst, msg.pubend, it.tick)
                self.received[key] = self.received.get(key, 0) + 1
                self.trace.setdefault(key, []).append((src, it.to))
        self.handle(dst, self.cores[dst].peer_message(src, msg, self.now))
        return True

    def run(self, max_steps: int = 1_000_000) -> int:
        steps = 0
        while self.step():
            steps += 1
            assert steps < max_steps, "the network did not quiesce"
        return steps

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: every core's timers fire, then the network quiesces."""
        self.now += seconds
        for broker, core in list(self.cores.items()):
            self.handle(broker, core.on_timer(self.now))
        self.run()

    def drop_frames(self, kind: type) -> int:
        """Lose every queued frame carrying a message of ``kind``; returns how many."""
        lost = 0
        for key, q in self.queues.items():
            keep = deque(f for f in q if type(m.decode(f)) is not kind)
            lost += len(q) - len(keep)
            self.queues[key] = keep
        return lost

    def live_reach(self, broker: str) -> set[str]:
        """Brokers ``broker`` can reach over live links."""
        seen, todo = {broker}, [broker]
        while todo:
            a = todo.pop()
            for b in self.topology.neighbours[a]:
                if (a, b) in self.up and b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    def run_some(self, n: int) -> None:
        for _ in range(n):
            if not self.step():
                return

    # -- what should have happened -------------------------------------------------------------------

    def matching(self, attributes: dict) -> set[tuple[str, int]]:
        """(broker, conn) of every live subscription whose profile matches, by the naive rule."""
        return {(b, c) for (b, c, _), p in self.profiles.items() if p.matches(attributes)}

    def routing_state_empty(self) -> dict[str, int]:
        """Brokers whose router still holds anything, with their entry counts."""
        return {b: c.router.entries for b, c in self.cores.items() if not c.router.is_empty()}
