"""What the pubend's log commits is handed on a slice at a time (ges.core.publishing): about
``config.logged_slice`` deliveries at once, the rest as the core's own job, in tick order,
each event once to each subscriber, a large publish split into chunks sized by its fan-out —
and nothing not yet handed on counts as published to the release rounds or to the starting
point of a subscription made meanwhile."""

from __future__ import annotations

from ges.core import BrokerConfig, BrokerCore, ToClient
from ges.reliable.log import MemoryLog
from ges.topology import Topology
from ges.wire import messages as m

ONE = {
    "name": "one",
    "brokers": {"b1": {"unit": "S/c1", "port": 1}, "b2": {"unit": "S/c1", "port": 2}},
    "links": [["b1", "b2"]],
}
PUB, SUBS = 9, (1, 2, 3)
EVENTS = 100
BUDGET = 30


class LazyLog(MemoryLog):
    """A log that commits when told (as the runtime's group commit does, later)."""

    def __init__(self):
        super().__init__(epoch=1)
        self.upto = 0

    @property
    def committed(self) -> int:
        return self.upto


def core_with_lazy_log(config: BrokerConfig | None = None) -> tuple[LazyLog, BrokerCore]:
    log = LazyLog()
    core = BrokerCore(
        Topology.from_dict(ONE, source="<t>"),
        "b1",
        incarnation=1,
        reliable=True,
        log=log,
        config=config or BrokerConfig(logged_slice=BUDGET),
    )
    return log, core


def subscribed_to_all() -> tuple[LazyLog, BrokerCore]:
    """A core with a lazy log, the publisher PUB and SUBS subscribed to everything."""
    log, core = core_with_lazy_log()
    for conn in (PUB, *SUBS):
        core.client_open(conn, f"c{conn}")
    for conn in SUBS:
        core.client_message(conn, m.Subscribe(1, [[]], "all"), 0.0)
    while core.has_work:
        core.work(0.0)
    return log, core


def delivered(outs: list) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    for o in outs:
        if type(o) is ToClient and type(o.msg) is m.Deliver:
            got.setdefault(o.conn, []).extend(it.tick for it in o.msg.items)
    return got


def test_a_committed_publish_goes_on_a_slice_at_a_time_in_order_once():
    log, core = subscribed_to_all()
    first_tick = core.publishing.next_tick
    outs = core.client_message(PUB, m.Publish(1, [m.Event({"n": i}) for i in range(EVENTS)]), 0.0)
    assert delivered(outs) == {} and not core.logged_pending  # appended, not committed
    log.upto = log.last
    slices = [core.on_logged(0.0)]
    assert core.logged_pending and core.has_work
    (ack,) = [o.msg for o in slices[0] if type(o.msg) is m.PubAck]
    assert (ack.first_tick, ack.last_tick) == (first_tick, first_tick + EVENTS - 1)
    # nothing not handed on is asked about by a release round, nor is a new subscription's start
    routed = core.publishing.routed
    assert routed < log.committed and core.release._top() == routed
    assert core.publishing.handed_on == routed  # a subscription's start on this pubend
    while core.has_work:
        slices.append(core.work(0.0))
    assert not core.logged_pending and core.publishing.routed == log.committed
    got = delivered([o for s in slices for o in s])
    ticks = list(range(first_tick, first_tick + EVENTS))
    assert got == {conn: ticks for conn in SUBS}  # all of it, in order, once each
    per_slice = [len(delivered(s).get(1, [])) for s in slices]
    # the first chunk is sized before the fan-out is known; each later slice by it: about
    # BUDGET deliveries to the three subscribers (one event more at most)
    assert per_slice[0] < EVENTS and all(3 * n <= BUDGET + 3 for n in per_slice[1:]), per_slice


def test_every_committed_publish_is_acknowledged_at_once_and_a_slice_holds_when_fan_out_jumps():
    """Publishes committed together are all acknowledged in the first step, whatever is still
    to hand on (a crash before their acknowledgement would have a publisher send them again);
    events nobody wants, then events every subscriber wants: no step goes far over its bound."""
    log, core = core_with_lazy_log()
    many = range(100, 140)  # 40 subscribers of "a"
    for conn in (PUB, PUB + 1, *many):
        core.client_open(conn, f"c{conn}")
    for conn in many:
        core.client_message(conn, m.Subscribe(1, [[m.Constraint("t", "eq", "a")]], "a"), 0.0)
    while core.has_work:
        core.work(0.0)
    nobody = [m.Event({"t": "b"}) for _ in range(50)]
    wanted = [m.Event({"t": "a"}) for _ in range(50)]
    core.client_message(PUB, m.Publish(1, nobody + wanted), 0.0)
    core.client_message(PUB + 1, m.Publish(1, [m.Event({"t": "b"})]), 0.0)
    log.upto = log.last
    steps = [core.on_logged(0.0)]
    acks = {o.conn for o in steps[0] if type(o.msg) is m.PubAck}
    assert acks == {PUB, PUB + 1} and core.logged_pending
    while core.has_work:
        steps.append(core.work(0.0))
    per_step = [sum(len(t) for t in delivered(s).values()) for s in steps]
    assert sum(per_step) == 50 * len(many)  # all of it, once
    assert max(per_step) <= BUDGET + 2 * len(many), per_step  # a chunk over at most


def test_a_slice_of_large_events_is_bounded_in_bytes_too():
    """Events of 100 KiB, few enough for the deliveries' bound to take them all in one step:
    each step hands on about ``logged_slice_bytes`` of them (an event's bytes once per
    destination), all of them in the end, in order."""
    log, core = core_with_lazy_log(BrokerConfig(logged_slice=1024, logged_slice_bytes=1 << 20))
    core.client_open(PUB, "pub")
    core.client_open(1, "sub")
    core.client_message(1, m.Subscribe(1, [[]], "all"), 0.0)
    while core.has_work:
        core.work(0.0)
    big = b"x" * (100 * 1024)
    for seq in range(1, 9):  # publishes of 4 events each: 32 events, 3.2 MiB
        core.client_message(PUB, m.Publish(seq, [m.Event({"n": i}, big) for i in range(4)]), 0.0)
    log.upto = log.last
    steps = [core.on_logged(0.0)]
    while core.has_work:
        steps.append(core.work(0.0))
    per_step = [len(delivered(s).get(1, [])) for s in steps]
    assert sum(per_step) == 32 and delivered([o for s in steps for o in s])[1] == sorted(
        delivered([o for s in steps for o in s])[1]
    )
    # each event counts twice (to the one subscriber, and itself: its fan-out), ~200 KiB:
    # a step takes five and the one that crosses the bound, where the deliveries' bound
    # alone would hand all 32 on at once
    assert all(n <= 6 for n in per_step), per_step
    assert len(per_step) >= 5, per_step


def test_a_client_s_publishes_count_as_unsent_until_handed_on_whole():
    """What the driver holds a client's next change of subscriptions back for (its earlier
    publishes are matched first): from the append to the log until the last slice of their
    hand-on; no other client's, and nothing once it has gone."""
    log, core = subscribed_to_all()
    assert not core.publishes_unsent(PUB)
    core.client_message(PUB, m.Publish(1, [m.Event({"n": i}) for i in range(EVENTS)]), 0.0)
    assert core.publishes_unsent(PUB) and not core.publishes_unsent(SUBS[0])
    log.upto = log.last
    core.on_logged(0.0)  # a slice of BUDGET deliveries: the rest still to go
    assert core.publishes_unsent(PUB)
    while core.has_work:
        core.work(0.0)
    assert not core.publishes_unsent(PUB)
    core.client_message(PUB, m.Publish(2, [m.Event({"n": -1})]), 0.0)
    assert core.publishes_unsent(PUB)
    core.client_closed(PUB, 0.0)
    assert not core.publishes_unsent(PUB)
