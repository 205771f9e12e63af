"""Content routing over whole networks of broker cores (seed 004 §3), on demo.yaml,
ges-paper.yaml and a generated 3-level topology with redundant gateways.

The properties, checked for every published event:

(a) every subscription whose profile matches receives it, once; no other subscription does;
(b) no dead ends: a broker that receives the event has a matching subscription, or passes the
    event on, or was asked as a keeper for a unit's destinations (seed 004 §3.3: "a gatekeeper …
    computes the units within its context the event must be routed to") — an event enters a
    unit only for a subscriber inside it, to cross it, or to have a keeper of one of the
    publisher's own units decide where it goes;
(c) a broker with a matching subscription receives the event exactly once as a destination,
    although the topologies have redundant gateways between every pair of linked units (another
    copy may cross it in transit when the publisher had to ask a keeper beyond it).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ges.core import BrokerConfig
from ges.matching.model import Conjunction, Constraint, Profile
from ges.topology import Topology
from ges.topology.generate import generate
from ges.wire import messages as m
from tests.simnet import Net

ROOT = Path(__file__).resolve().parents[2]

TOPOLOGIES = {
    "demo": Topology.from_yaml(ROOT / "topologies" / "demo.yaml"),
    "ges-paper": Topology.from_yaml(ROOT / "topologies" / "ges-paper.yaml"),
    "generated": generate(levels=3, members=(2, 2, 2, 3), links_per_pair=2, redundancy=2, seed=4),
}


def bucket_below(limit: int, pid: str = "p") -> Profile:
    return Profile(pid, (Conjunction((Constraint("bucket", "lt", limit),)),))


def random_profile(rng: random.Random, pid: str) -> Profile:
    kind = rng.randrange(4)
    if kind == 0:
        return bucket_below(rng.choice((1, 5, 10, 50, 100)), pid)
    if kind == 1:
        return Profile(pid, (Conjunction((Constraint("sym", "eq", rng.choice("ABCDE")),)),))
    if kind == 2:  # a disjunction
        return Profile(
            pid,
            (
                Conjunction((Constraint("sym", "eq", rng.choice("ABCDE")),)),
                Conjunction((Constraint("bucket", "ge", rng.randrange(90, 100)),)),
            ),
        )
    lo = rng.randrange(0, 90)
    return Profile(
        pid,
        (Conjunction((Constraint("bucket", "ge", lo), Constraint("bucket", "lt", lo + 10))),),
    )


def random_event(rng: random.Random) -> dict:
    return {"bucket": rng.randrange(100), "sym": rng.choice("ABCDEFGH")}


def ready(topology: Topology, seed: int = 0, routing: str = "content") -> Net:
    net = Net(topology, seed, routing)
    net.connect_all()
    net.run()
    return net


def publish_all(net: Net, broker: str, events: list[dict], published: dict) -> None:
    ack = net.publish(broker, events)
    for tick, attrs in zip(range(ack.first_tick, ack.last_tick + 1), events, strict=True):
        published[(ack.pubend, tick)] = (broker, attrs)


def check_properties(net: Net, published: dict, *, exact: bool = True) -> None:
    """(a), (b) and (c) for every published event. With ``exact=False`` (events that were in
    flight when a broker died) (a) is relaxed to "at most once, and only if it matches"."""
    got: dict[tuple[str, int], dict] = {}
    for sub, keys in net.delivered.items():
        assert len(keys) == len(set(keys)), f"{sub} got an event twice"
        for key in keys:
            got.setdefault(key, {})[sub] = got.get(key, {}).get(sub, 0) + 1
    for key, (_, attrs) in published.items():
        want = net.matching(attrs)
        have = set(got.get(key, {}))
        if exact:
            assert have == want, f"{key} {attrs}: missing {want - have}, extra {have - want}"
        else:
            assert have <= want, f"{key} {attrs}: extra {have - want}"
        matching_brokers = {b for b, _ in want}
        for b in net.cores:
            n = net.received.get((b, *key), 0)
            if n == 0:
                continue
            # (b) no dead ends (while a failure spreads, a broker may have nowhere to send)
            asked = any(_asked(b, routes, net) for _, routes in net.trace[(b, *key)])
            assert not exact or b in matching_brokers or asked or net.sent.get((b, *key), 0) > 0, (
                f"{key} {attrs} reached {b}, which wants it not and passed it on to nobody"
            )
            # (c) once per destination broker: at most one copy is addressed to it (or to a unit
            # around it); any other copy only crossed it, on the way to or back from a keeper
            # the publisher asked (and was delivered there on the way, so none is sent back)
            if b in matching_brokers and n > 1:
                addressed = [src for src, routes in net.trace[(b, *key)] if _for(b, routes, net)]
                assert len(addressed) <= 1, f"{key} reached destination {b} {n} times"


def _asked(broker: str, routes, net: Net) -> bool:
    """Whether a copy asked ``broker``, as a keeper, for the destinations of a unit around it."""
    unit = net.topology.brokers[broker].unit
    keepers = net.hierarchy.keepers
    return any(
        len(r.unit) <= len(unit)
        and unit[: len(r.unit)] == r.unit
        and (r.via in ("", broker) or broker in keepers[r.unit])  # a keeper on the way answers
        for r in routes
    )


def _for(broker: str, routes, net: Net) -> bool:
    """Whether a copy's routes make ``broker`` a destination (not just a hop on the way)."""
    unit = net.topology.brokers[broker].unit
    for r in routes:
        if len(r.unit) > len(unit):
            if r.unit[-1] == broker:
                return True
        elif (
            unit[: len(r.unit)] == r.unit
            and r.via in ("", broker)
            and net.hierarchy.child_of(r.unit, broker) != r.skip
        ):
            return True
    return False


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("seed", range(3))
def test_random_profiles_get_exactly_what_matches(name, seed):
    topology = TOPOLOGIES[name]
    rng = random.Random(seed)
    net = ready(topology, seed)
    brokers = sorted(topology.brokers)
    for i, b in enumerate(rng.sample(brokers, len(brokers) // 3)):
        net.subscribe(b, 1, 1, random_profile(rng, f"p{i}"))
    net.run()
    assert all(acks == [1] for acks in net.subacks.values())
    assert len(net.subacks) == len(brokers) // 3
    published: dict = {}
    for _ in range(4):
        publish_all(net, rng.choice(brokers), [random_event(rng) for _ in range(25)], published)
        net.run_some(rng.randrange(50))
    net.run()
    check_properties(net, published)


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_with_no_subscriber_events_go_only_to_the_keepers_asked(name):
    net = ready(TOPOLOGIES[name])
    publisher = sorted(net.cores)[0]
    published: dict = {}
    publish_all(net, publisher, [{"bucket": 1}] * 10, published)
    net.run()
    assert not net.delivered
    check_properties(net, published)
    h = net.hierarchy
    asked = {k for u in h.chain(publisher) for k in h.keepers[u]}
    assert {b for b, *_ in net.received} - asked <= {b for b, *_ in net.sent}


def test_the_checks_fail_on_a_dead_end_and_on_a_second_addressed_copy():
    net = ready(TOPOLOGIES["ges-paper"])
    net.subscribe("10", 1, 1, bucket_below(100))
    net.run()
    published: dict = {}
    publish_all(net, "22", [{"bucket": 5}], published)
    net.run()
    check_properties(net, published)
    (key,) = published
    # as if 3 (far from 22 -> 10, no subscriber, no keeper asked) had got it in transit
    net.received[("3", *key)] = 1
    net.trace[("3", *key)] = [("2", (m.Route(("SSC-A", "SC-2")),))]
    with pytest.raises(AssertionError, match="passed it on to nobody"):
        check_properties(net, published)
    del net.received[("3", *key)]
    net.received[("10", *key)] += 1
    net.trace[("10", *key)].append(net.trace[("10", *key)][0])
    with pytest.raises(AssertionError, match="reached destination 10 2 times"):
        check_properties(net, published)


def test_ten_percent_matching_costs_a_fraction_of_flooding():
    """Seed 004's workload in miniature: 22 -> 10 plus one subscriber at every other broker."""
    frames = {}
    for routing in ("flood", "content"):
        net = ready(TOPOLOGIES["ges-paper"], routing=routing)
        for b in net.cores:
            if b != "22":
                net.subscribe(b, 1, 1, bucket_below(10))
        net.run()
        before = sum(net.sent.values())
        net.publish("22", [{"bucket": i % 100} for i in range(100)])
        net.run()
        frames[routing] = sum(net.sent.values()) - before  # event copies between brokers
        delivered = sum(len(v) for v in net.delivered.values())
        assert delivered == 10 * (len(net.cores) - 1)
    assert frames["content"] <= 0.2 * frames["flood"]  # the aim, in event copies


GATEWAY_CASES = {
    # publisher, subscribers, the gateway to kill (on the best route, with a detour)
    "demo": ("b1", ["b16", "b20", "b9"], "b6"),
    "ges-paper": ("22", ["10", "3", "14"], "17"),
}


def _generated_case() -> tuple[str, list[str], str]:
    t = TOPOLOGIES["generated"]
    brokers = sorted(t.brokers)
    pub = brokers[0]
    subs = [b for b in brokers if t.brokers[b].unit[0] != t.brokers[pub].unit[0]][:3]
    gateway = next(g for g in t.gatekeepers(3) if g not in (pub, *subs))
    return pub, subs, gateway


GATEWAY_CASES["generated"] = _generated_case()


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("seed", range(2))
def test_a_gateway_killed_mid_stream(name, seed):
    topology = TOPOLOGIES[name]
    pub, subs, gateway = GATEWAY_CASES[name]
    rng = random.Random(seed)
    net = ready(topology, seed)
    for i, b in enumerate(subs):
        net.subscribe(b, 1, 1, bucket_below(50 if i else 100, f"s{i}"))
    others = [b for b in topology.brokers if b not in (pub, gateway, *subs)]
    for i, b in enumerate(rng.sample(others, 4)):
        net.subscribe(b, 1, 1, random_profile(rng, f"o{i}"))
    net.run()
    entries_before = net.cores[gateway].router.entries
    assert entries_before > 0  # the gateway keeps snapshots

    settled: dict = {}
    publish_all(net, pub, [random_event(rng) for _ in range(20)], settled)
    net.run()
    check_properties(net, settled)

    # mid-stream: events in flight when the gateway dies, more published while the news spreads
    in_flight: dict = {}
    for i in range(20):
        publish_all(net, pub, [random_event(rng)], in_flight)
        net.run_some(rng.randrange(1, 6))
        if i == 8:
            net.kill(gateway)
    net.run()
    check_properties(net, {**settled, **in_flight}, exact=False)
    assert any(received for (b, *_), received in net.received.items() if b == gateway)

    # once the failure is known everywhere, the traffic takes the alternate gateway, all of it
    after: dict = {}
    publish_all(net, pub, [random_event(rng) for _ in range(20)], after)
    net.run()
    check_properties(net, after)
    assert not any(net.received.get((gateway, *key)) for key in after)
    assert sum(len(v) for v in net.delivered.values()) > 0

    # the gateway comes back with no state and gets the profile state it keeps
    net.restart(gateway)
    net.run()
    assert net.cores[gateway].router.entries == entries_before
    back: dict = {}
    publish_all(net, pub, [random_event(rng) for _ in range(20)], back)
    net.run()
    check_properties(net, back)


def expected_entries(net: Net, keeper: str) -> int:
    h = net.hierarchy
    return sum(
        len(core.router.exporter) for origin, core in net.cores.items() if h.keeps(keeper, origin)
    )


@pytest.mark.parametrize("name", ["demo", "generated"])
@pytest.mark.parametrize("seed", range(3))
def test_subscription_churn_while_events_flow_leaves_nothing_behind(name, seed):
    topology = TOPOLOGIES[name]
    rng = random.Random(seed)
    net = ready(topology, seed)
    brokers = sorted(topology.brokers)
    # one subscriber that stays put and must get exactly what matches throughout
    steady, steady_profile = brokers[-1], bucket_below(30, "steady")
    net.subscribe(steady, 1, 1, steady_profile)
    net.run()
    published: dict = {}
    live: set[tuple[str, int]] = set()
    conn = 10
    for _ in range(120):
        action = rng.random()
        if action < 0.35:  # a new subscription
            conn += 1
            b = rng.choice(brokers)
            net.subscribe(b, conn, 1, random_profile(rng, f"c{conn}"))
            live.add((b, conn))
        elif action < 0.55 and live:  # a changed profile
            b, c = rng.choice(sorted(live))
            net.subscribe(b, c, 1, random_profile(rng, f"c{c}'"))
        elif action < 0.75 and live:  # unsubscribe, or the client goes away
            b, c = rng.choice(sorted(live))
            live.discard((b, c))
            if rng.random() < 0.5:
                net.unsubscribe(b, c, 1)
            else:
                net.close_client(b, c)
        else:
            publish_all(net, rng.choice(brokers), [random_event(rng) for _ in range(3)], published)
        net.run_some(rng.randrange(30))
    net.run()
    # the steady subscriber got exactly its events
    want = sorted(k for k, (_, a) in published.items() if steady_profile.matches(a))
    assert sorted(net.delivered.get((steady, 1), [])) == want
    # every keeper holds exactly the origins' aggregated profiles
    for b in brokers:
        assert net.cores[b].router.entries == expected_entries(net, b), b
    for b, c in sorted(live):
        net.close_client(b, c)
    net.unsubscribe(steady, 1, 1)
    net.run()
    assert net.routing_state_empty() == {}
    assert all(not core.profiles for core in net.cores.values())


def test_subscribe_is_acknowledged_once_the_keepers_have_the_profile():
    net = ready(TOPOLOGIES["demo"])
    net.subscribe("b20", 1, 7, bucket_below(10))
    assert net.subacks == {}  # the keepers have not seen it yet
    net.run()
    assert net.subacks == {("b20", 1): [7]}
    # an event published anywhere now reaches it
    published: dict = {}
    publish_all(net, "b1", [{"bucket": 3}], published)
    net.run()
    assert net.delivered[("b20", 1)] == list(published)


def test_subscribe_is_acknowledged_after_a_while_when_a_keeper_never_answers():
    SUBACK_WAIT = BrokerConfig().suback_wait

    net = ready(TOPOLOGIES["demo"])
    # no keeper ever hears of b20's profile (its resends are lost too)
    net.sim.blocked = lambda src, dst, msg: src == "b20" and type(msg) is m.Profiles
    net.subscribe("b20", 1, 7, bucket_below(10))
    t0 = net.now
    net.sim.run_until(t0 + SUBACK_WAIT - 0.001)
    assert net.subacks == {}
    net.sim.run_until(t0 + SUBACK_WAIT)
    assert net.subacks == {("b20", 1): [7]}


def test_a_changed_profile_moves_the_routes():
    net = ready(TOPOLOGIES["ges-paper"])
    net.subscribe("10", 1, 1, bucket_below(10))
    net.run()
    net.subscribe("10", 1, 1, Profile("p", (Conjunction((Constraint("bucket", "ge", 90),)),)))
    net.run()
    published: dict = {}
    publish_all(net, "22", [{"bucket": 5}, {"bucket": 95}], published)
    net.run()
    assert [t for _, t in net.delivered[("10", 1)]] == [2]
    check_properties(net, published)
    assert net.cores["8"].router.entries == 1  # the old conjunction is gone upstream too
