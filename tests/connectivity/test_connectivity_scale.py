"""Full dissemination over 512-broker networks (2 × 4 × 8 × 8): the shipped
topologies/generated-512.yaml and networks generated here with random costs. Every broker's graph
is built by flooding, holds exactly the links its contexts allow, and hop-by-hop forwarding on
those abbreviated views reaches every target without loops, also after gateways fail."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ges.topology import Topology
from ges.topology.specs import connected_components

SEED = 4004  # any seed works; printed in failure messages so a failure replays


def _generated(seed: int, shape=(2, 4, 8, 8), *, costs=None) -> Topology:
    """A connected network of ``shape`` (SSCs, SCs per SSC, clusters per SC, brokers per
    cluster) where every unit is connected inside; ``costs`` (a Random) adds link overrides and a
    random cost matrix."""
    rng = random.Random(seed)
    n_ssc, n_sc, n_cl, n_br = shape
    brokers: dict[str, dict] = {}
    links: set[tuple[str, str]] = set()
    clusters: dict[tuple, list[str]] = {}
    for s in range(n_ssc):
        for c in range(n_sc):
            for k in range(n_cl):
                unit = (f"SSC-{s}", f"SC-{c}", f"c{k}")
                members = []
                for _ in range(n_br):
                    bid = f"b{len(brokers) + 1}"
                    brokers[bid] = {"unit": "/".join(unit), "port": 20000 + len(brokers)}
                    members.append(bid)
                clusters[unit] = members
                for i in range(n_br):  # a ring and two chords
                    links.add((members[i], members[(i + 1) % n_br]))
                for _ in range(2):
                    links.add(tuple(rng.sample(members, 2)))

    def bridge(units_a, units_b, count):
        for _ in range(count):
            ua, ub = rng.choice(units_a), rng.choice(units_b)
            links.add((rng.choice(clusters[ua]), rng.choice(clusters[ub])))

    def inside(*prefix):
        return [u for u in clusters if u[: len(prefix)] == prefix]

    for s in range(n_ssc):
        for c in range(n_sc):
            cls = [(f"SSC-{s}", f"SC-{c}", f"c{k}") for k in range(n_cl)]
            for k in range(n_cl):  # clusters in a ring, two links per neighbour pair
                bridge([cls[k]], [cls[(k + 1) % n_cl]], 2)
        for c in range(n_sc):  # super-clusters in a ring, two links per pair
            bridge(inside(f"SSC-{s}", f"SC-{c}"), inside(f"SSC-{s}", f"SC-{(c + 1) % n_sc}"), 2)
    bridge(inside("SSC-0"), inside("SSC-1"), 3)
    unique = {tuple(sorted(pair)) for pair in links if pair[0] != pair[1]}
    data: dict = {"name": f"gen-{seed}", "brokers": brokers, "links": []}
    for a, b in sorted(unique):
        if costs is not None and costs.random() < 0.3:
            data["links"].append([a, b, {"cost": costs.choice([0.5, 1, 2, 4, 8, 16])}])
        else:
            data["links"].append([a, b])
    if costs is not None:
        data["link_costs"] = [[costs.uniform(0.5, 10) for _ in range(4)] for _ in range(4)]
    return Topology.from_dict(data)


def _expected_keys(topo: Topology, broker: str) -> set:
    out = set()
    for link in topo.links:
        scope = topo.depth - topo.link_level(link.a, link.b)
        if topo.brokers[broker].unit[:scope] == topo.brokers[link.a].unit[:scope]:
            out.add(link.key)
    return out


def _walk(net, source: str, target: str, seed: int = SEED, hops: dict | None = None) -> list[str]:
    """Forward hop by hop on each broker's own view; no loops, no leaving lcu(source, target).
    ``hops`` keeps each broker's answer for a target, to walk many pairs of a network that does
    not change meanwhile (a broker's next hop depends on its graph and the target alone)."""
    topo = net.topology
    scope = topo.context(source, topo.common_level(source, target))
    at, seen = source, [source]
    while at != target:
        if hops is None:
            at = net.graph(at).next_hop(target, net.unit(target))
        else:
            key = (at, target)
            if key not in hops:
                hops[key] = net.graph(at).next_hop(target, net.unit(target))
            at = hops[key]
        where = f"seed {seed}: {source}->{target}: {seen + [at]}"
        assert at is not None and at not in seen, where
        assert at in net.live_neighbours(seen[-1]), f"hop over a dead link, {where}"
        assert net.unit(at)[: len(scope)] == scope, f"left {scope}, {where}"
        seen.append(at)
    return seen


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.from_yaml(Path(__file__).resolve().parents[2] / "topologies/generated-512.yaml")


def test_full_dissemination_over_512_brokers(topo, make_network):
    assert len(topo.brokers) == 512 and not topo.warnings
    net = make_network(topo)
    for b in topo.brokers:
        g = net.graph(b)
        assert {r.key for r in g.reports()} == _expected_keys(topo, b), f"seed {SEED}: {b}"
        # abbreviated: 8 brokers + 7 clusters + 3 super-clusters + 1 super-super-cluster
        assert len(g.nodes) == 19
    rng = random.Random(SEED)
    names = sorted(topo.brokers)
    for _ in range(1500):
        _walk(net, *rng.sample(names, 2))


def _internally_connected(topo: Topology, live: set) -> bool:
    edges = [k for k in (link.key for link in topo.links) if k in live]
    for members in topo.units.values():
        if len(members) > 1 and len(connected_components(members, edges)) > 1:
            return False
    return True


def test_routes_survive_gateway_failures(topo, make_network):
    net = make_network(topo)
    rng = random.Random(SEED + 1)
    gateways = [link.key for link in topo.gateways()]
    rng.shuffle(gateways)
    dropped = 0
    for key in gateways:
        trial = net.live - {key}
        if _internally_connected(topo, trial):  # hierarchical routing needs connected units
            net.link_down(*key)
            dropped += 1
            if dropped == 25:
                break
    assert dropped == 25
    for b in topo.brokers:
        g = net.graph(b)
        assert all(k in net.live for e in g.edges.values() for k in e.links), b
    names = sorted(topo.brokers)
    for _ in range(1500):
        _walk(net, *rng.sample(names, 2))


@pytest.mark.parametrize("seed", [1, 2])
def test_forwarding_never_loops_on_other_networks(seed, make_network):
    net = make_network(_generated(seed))
    rng = random.Random(seed)
    names = sorted(net.topology.brokers)
    for _ in range(500):
        _walk(net, *rng.sample(names, 2), seed=seed)


# make_network is a stateless factory, so sharing it across examples is safe.
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), drops=st.integers(0, 12))
def test_forwarding_is_loop_free_for_any_costs_while_units_stay_connected(
    seed, drops, make_network
):
    """Any positive matrix, any overrides, any gateway failures that leave units connected
    inside: every pair is reached, without loops, inside its lowest common unit."""
    topo = _generated(seed, (2, 3, 3, 3), costs=random.Random(seed))
    net = make_network(topo)
    rng = random.Random(seed)
    gateways = [link.key for link in topo.gateways()]
    rng.shuffle(gateways)
    for key in gateways[:drops]:
        if _internally_connected(topo, net.live - {key}):
            net.link_down(*key)
    hops: dict = {}  # every pair's walk asks each broker once per target
    for source in topo.brokers:
        for target in topo.brokers:
            _walk(net, source, target, seed=seed, hops=hops)
