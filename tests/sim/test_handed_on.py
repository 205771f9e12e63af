"""What a pubend's log committed is handed on a slice at a time (ges.core.publishing), with
frames, timers and release rounds in between: a large publish to a network that releases its
logs eagerly, and a subscription made at another broker while the publish is still being
handed on, gets every event after its start. A release round that asked about the ticks
committed rather than those handed on let a broker with no subscriber acknowledge ticks it had
not seen, and the log let them go before the new subscription could get them."""

from __future__ import annotations

import pytest

from ges.core import BrokerConfig
from ges.sim import Faults
from ges.sim.scenario import run_seed
from ges.wire import messages as m
from tests.core.test_reliable_core import World
from tests.sim.test_simulator import topology

#: one delivery a step (each event its own slice), release rounds every 50 ms
SLICED = BrokerConfig(ack_every=0.05, logged_slice=1)
EVENTS = 400


def test_a_subscription_made_while_a_publish_is_handed_on_gets_everything_after_its_start():
    world = World(config=SLICED, work_slice=1)
    sim = world.sim
    batch = [{"sym": "IBM", "n": i} for i in range(EVENTS)]
    sim.run_until(0.5)
    world.pending[("b1", 2000, 1)] = batch
    sim.client("b1", 2000, m.Publish(1, [m.Event(e) for e in batch]))
    sim.run_until(0.65)
    b1 = sim.cores["b1"]
    assert b1.logged_pending  # still handing it on, a slice a millisecond
    assert sim.logs["b1"].released() <= b1.publishing.routed  # nothing let go unrouted
    key = world.subscribe("b20", 1000)
    sim.run_until(20.0)
    assert not b1.logged_pending
    world.checker.finish(sim.now, start_by=0.5)
    assert world.checker.ok, [str(v) for v in world.checker.violations][:3]
    got = world.checker.subs[key].got
    assert 0 < len(got) < EVENTS  # it started mid-publish, and got the rest


@pytest.mark.parametrize("name", ["demo", "figure2"])
def test_every_guarantee_holds_with_what_the_logs_commit_handed_on_a_delivery_a_step(name):
    """Every fault, durable clients roaming, eager release rounds: a slice per delivery."""
    handed = 0
    for seed in range(4):
        o = run_seed(topology(name), seed, faults=Faults(), durable=2, config=SLICED, work_slice=1)
        assert o.ok, f"{name} seed {seed}: " + "; ".join(o.violations[:3])
        handed += o.slices
    assert handed > 500  # the hand-on did go in slices, the world moving in between
