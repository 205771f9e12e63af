"""The simulator (ges.sim) with the books the routing and flooding tests read, driven a step
at a time.

``Net`` starts with every link down (``connect_all`` brings them up), frames take 1–21 ms on a
link (FIFO per direction, as TCP is), so which link's frame comes next depends on the seed, and
the cores' timers — heartbeats, resends, SubAck waits — fire as simulated time passes. ``run``
goes on until no frame is on its way; ``advance(s)`` lets ``s`` seconds pass first. It records
what each broker delivered to each client, and every event item sent and received between
brokers, with the routes it carried.
"""

from __future__ import annotations

import itertools

from ges.core import BrokerConfig, BrokerCore
from ges.matching.model import Profile, profile_to_wire
from ges.routing import Hierarchy
from ges.sim import Faults, Sim
from ges.topology import Topology
from ges.wire import messages as m

#: frames take LATENCY plus up to this much: which link delivers next depends on the seed
DELAYS = Faults(kinds=frozenset({"delay"}))


class Net:
    def __init__(
        self,
        topology: Topology,
        seed: int = 0,
        routing: str = "content",
        *,
        config: BrokerConfig | None = None,
    ):
        self.topology = topology
        #: (broker, conn) -> [(pubend, tick)] delivered, in order
        self.delivered: dict[tuple[str, int], list[tuple[str, int]]] = {}
        #: (broker, pubend, tick) -> times an Events item for it arrived at that broker
        self.received: dict[tuple[str, str, int], int] = {}
        #: (broker, pubend, tick) -> times that broker sent an item for it on
        self.sent: dict[tuple[str, str, int], int] = {}
        #: (broker, pubend, tick) -> [(from, routes)] for every copy received
        self.trace: dict[tuple[str, str, int], list] = {}
        #: (broker, conn) -> [sub_id] of every SubAck, in order
        self.subacks: dict[tuple[str, int], list[int]] = {}
        #: live subscriptions: (broker, conn, sub_id) -> profile
        self.profiles: dict[tuple[str, int, int], Profile] = {}
        #: (broker, "level: text") of every notice
        self.notices: list[tuple[str, str]] = []
        #: Events frames that arrived
        self.event_frames = 0
        self._acks: list[m.PubAck] = []
        self._seq = itertools.count(1)
        self.sim = Sim(
            topology,
            seed=seed,
            faults=DELAYS,
            reliable=False,
            routing=routing,
            linked=False,
            on_deliver=self._deliver,
            on_puback=lambda b, conn, msg, now: self._acks.append(msg),
            on_suback=self._suback,
            on_notice=lambda b, n: self.notices.append((b, f"{n.level}: {n.text}")),
            on_send=self._sent,
            on_arrive=self._arrived,
            config=config,
        )

    # -- the books ---------------------------------------------------------------------------------

    def _deliver(self, broker, conn, msg, now):
        got = self.delivered.setdefault((broker, conn), [])
        got += [(msg.pubend, it.tick) for it in msg.items]

    def _suback(self, broker, conn, msg, now):
        self.subacks.setdefault((broker, conn), []).append(msg.sub_id)

    def _sent(self, src, dst, msg):
        if type(msg) is m.Events:
            for it in msg.items:
                key = (src, msg.pubend, it.tick)
                self.sent[key] = self.sent.get(key, 0) + 1

    def _arrived(self, src, dst, msg):
        if type(msg) is m.Events:
            self.event_frames += 1
            for it in msg.items:
                key = (dst, msg.pubend, it.tick)
                self.received[key] = self.received.get(key, 0) + 1
                self.trace.setdefault(key, []).append((src, it.to))

    # -- brokers and links ---------------------------------------------------------------------------

    @property
    def cores(self) -> dict[str, BrokerCore]:
        return self.sim.cores

    @property
    def hierarchy(self) -> Hierarchy:
        return self.sim.hierarchy

    @property
    def now(self) -> float:
        return self.sim.now

    def connect_all(self) -> None:
        self.sim.connect_all()

    def link(self, a: str, b: str, *, up: bool) -> None:
        if up:
            self.sim.link_up(a, b)
        else:
            self.sim.link_down(a, b)  # frames on it are lost

    def kill(self, broker: str) -> None:
        """The broker dies (its state and its clients' subscriptions with it)."""
        self.sim.kill(broker)
        for key in [k for k in self.profiles if k[0] == broker]:
            del self.profiles[key]

    def restart(self, broker: str) -> None:
        self.sim.restart(broker)

    # -- clients -------------------------------------------------------------------------------------

    def subscribe(self, broker: str, conn: int, sub_id: int, profile: Profile) -> None:
        self.profiles[(broker, conn, sub_id)] = profile
        self.sim.client(broker, conn, m.Subscribe(sub_id, profile_to_wire(profile), profile.id))

    def unsubscribe(self, broker: str, conn: int, sub_id: int) -> None:
        self.profiles.pop((broker, conn, sub_id), None)
        self.sim.client(broker, conn, m.Unsubscribe(sub_id))

    def close_client(self, broker: str, conn: int) -> None:
        for key in [k for k in self.profiles if k[:2] == (broker, conn)]:
            del self.profiles[key]
        self.sim.close_client(broker, conn)

    def publish(self, broker: str, events: list[dict], conn: int = 999) -> m.PubAck:
        self._acks.clear()
        self.sim.client(broker, conn, m.Publish(next(self._seq), [m.Event(a) for a in events]))
        (ack,) = self._acks
        return ack

    # -- time and frames -------------------------------------------------------------------------------

    def run(self) -> int:
        """Until no frame is on its way; returns the happenings taken."""
        return self.sim.settle()

    def run_some(self, n: int) -> None:
        """Up to ``n`` happenings, while frames are on their way."""
        for _ in range(n):
            if not self.sim.in_transit:
                return
            self.sim.step()

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass (every timer due meanwhile fires), then run."""
        self.sim.run_until(self.now + seconds)
        self.run()

    def in_flight(self, src: str, dst: str) -> list:
        return self.sim.in_flight(src, dst)

    def lose(self, kind: type) -> int:
        """Lose every frame on its way that carries a ``kind``; returns how many."""
        return self.sim.lose(lambda src, dst, msg: type(msg) is kind)

    # -- what should have happened -------------------------------------------------------------------

    def matching(self, attributes: dict) -> set[tuple[str, int]]:
        """(broker, conn) of every live subscription whose profile matches, by the naive rule."""
        return {(b, c) for (b, c, _), p in self.profiles.items() if p.matches(attributes)}

    def routing_state_empty(self) -> dict[str, int]:
        """Brokers whose router still holds anything, with their entry counts."""
        return {b: c.router.entries for b, c in self.cores.items() if not c.router.is_empty()}
