"""Seed 004 Figures 2 and 3 reproduced by flooding reports over topologies/figure2.yaml.

Every broker's graph starts with its own links' reports from both ends; new reports flood to
neighbours they are visible to (see conftest.Network). The assertions quote the paper.
"""

from __future__ import annotations

import pytest

from ges.topology import Topology

FIGURE3_NODES = {"4", "5", "6", "a", "b", "d", "SC-2", "SC-3", "SSC-B"}
FIGURE3_EDGES = {
    # level 0: cluster c
    "4—5",
    "4—6",
    "5—6",
    # level 1: inside SC-1 ("the cluster gateway to cluster b" is node 4's)
    "4—b",
    "a—b",
    "a—d",
    "b—d",
    # level 2: inside SSC-A ("disseminated as one between node 5 and SC-2")
    "5—SC-2",
    "b—SC-3",
    "SC-2—SC-3",
    # level 3: the super-super-cluster gateways of cluster a, SC-2 and SC-3
    "a—SSC-B",
    "SC-2—SSC-B",
    "SC-3—SSC-B",
}


def test_figure3_view_at_vertex_6(net, node, edges_of):
    g = net.graph("6")
    assert {str(n) for n in g.nodes} == FIGURE3_NODES
    assert {n.level for n in g.nodes if str(n) in {"4", "5", "6"}} == {0}
    assert (node(g, "a").level, node(g, "SC-2").level, node(g, "SSC-B").level) == (1, 2, 3)
    assert edges_of(g) == FIGURE3_EDGES
    assert all(e.count == 1 for e in g.edges.values())
    assert {e.level for e in g.edges.values() if str(e) == "5—SC-2"} == {2}
    # every broker of cluster c holds the same abbreviated view
    for other in ("4", "5"):
        assert dict(net.graph(other).edges) == dict(g.edges)


def test_the_sc1_sc2_connection_is_re_expressed_on_the_way_out(net, edges_of):
    # at 6 (and 4, 5): "disseminated as one between node 5 and SC-2"
    assert "5—SC-2" in edges_of(net.graph("6"))
    # "When this information is received at 4, it is sent over as a connection between the
    # cluster c and SC-2" — and not updated again beyond cluster b
    for broker in ("7", "8", "9", "1", "10"):
        assert "c—SC-2" in edges_of(net.graph(broker)), broker
    # in SC-3, the connection is between the two super-clusters
    for broker in ("19", "23"):
        assert "SC-1—SC-2" in edges_of(net.graph(broker)), broker
    # in SC-2 itself, the SC-2 end is concrete and the far end is SC-1
    assert "13—SC-1" in edges_of(net.graph("13"))
    assert "e—SC-1" in edges_of(net.graph("16"))


def test_the_sc1_sc2_connection_never_leaves_ssc_a(net, node):
    for broker in ("25", "28", "31", "32"):
        g = net.graph(broker)
        assert all(("5", "13") not in e.links for e in g.edges.values())
        assert not any(r.key == ("5", "13") for r in g.reports())
        assert {str(n) for n in g.nodes if n.level == 3} == {"SSC-A"}
        assert not any(str(n) in {"SC-1", "SC-2", "SC-3"} for n in g.nodes)
    # what SSC-B does see of SSC-A: its three level-3 gateways, all as edges to SSC-A
    g = net.graph("25")
    ssc_a = node(g, "SSC-A")
    assert sum(e.count for e in g.edges.values() if ssc_a in e.pair) == 3


def test_dissemination_respects_every_scope(net):
    topo = net.topology
    for b, g in net.graphs.items():
        known = {r.key for r in g.reports()}
        expected = {
            link.key
            for link in topo.links
            if topo.brokers[b].unit[: topo.depth - topo.link_level(link.a, link.b)]
            == topo.brokers[link.a].unit[: topo.depth - topo.link_level(link.a, link.b)]
        }
        assert known == expected, b


def test_gateways_match_the_profile_propagation_sentences(net):
    # "any level-0 changes at any of the nodes within cluster c, need to be routed to node 4"
    for broker in ("4", "5", "6"):
        assert [(str(gw.inner), str(gw.outer)) for gw in net.graph(broker).gateways(1)] == [
            ("4", "b")
        ]
    # "Any level-1 changes at node 4 need to be routed to node 5, and also to a node in cluster b"
    assert [(str(gw.inner), str(gw.outer)) for gw in net.graph("4").gateways(2)] == [
        ("5", "SC-2"),
        ("b", "SC-3"),
    ]
    # "level-2 changes at node 5 needs to be routed to the level-3 gatekeeper in cluster a and
    # superclusters SC-3, SC-2"
    gws = net.graph("5").gateways(3)
    assert {str(gw.inner) for gw in gws} == {"a", "SC-2", "SC-3"}
    assert {str(gw.outer) for gw in gws} == {"SSC-B"}
    assert {gw.links for gw in gws} == {(("1", "25"),), (("18", "32"),), (("19", "29"),)}
    # and from cluster b the same SC-1 level-2 gateways look like this
    assert [(str(gw.inner), str(gw.outer)) for gw in net.graph("8").gateways(2)] == [
        ("9", "SC-3"),
        ("c", "SC-2"),
    ]


@pytest.mark.parametrize(
    ("source", "target", "hop"),
    [
        ("6", "4", "4"),
        ("6", "13", "5"),  # via the SC-1–SC-2 gateway at 5
        ("5", "13", "13"),  # 5 holds that gateway: the far end
        ("6", "1", "4"),  # via cluster c's only cluster gateway
        ("4", "8", "7"),
        ("7", "15", "4"),  # b reaches SC-2 through c
        ("9", "22", "23"),
        ("25", "5", "1"),  # from SSC-B, straight over cluster a's gateway
    ],
)
def test_next_hops(net, source, target, hop):
    assert net.graph(source).next_hop(target, net.unit(target)) == hop


def test_route_decides_level_by_level(net, node):
    g = net.graph("6")
    ssc_b = node(g, "SSC-B")
    # flat: the cheapest path in 6's view leaves through SC-2 (1 + 3 + 6) ...
    assert [str(n) for n in g.shortest_path(ssc_b)] == ["6", "5", "SC-2", "SSC-B"]
    # ... but SSC-A's decision is "SSC-A → SSC-B", then SC-1's own exit is cluster a's gateway
    # (cost 6 from SC-1, against 5 + 6 through SC-2), reached through b: every broker of SC-1
    # agrees on that, which is what keeps hop-by-hop forwarding loop-free
    assert [str(n) for n in g.route(ssc_b)] == ["6", "4", "b", "a", "SSC-B"]
    assert g.next_hop("25", net.unit("25")) == "4"


def test_hop_by_hop_forwarding_reaches_every_broker(net):
    """Every broker routes on its own abbreviated view; the hops still chain to the target."""
    for source in net.topology.brokers:
        for target in net.topology.brokers:
            at, seen = source, [source]
            while at != target:
                at = net.graph(at).next_hop(target, net.unit(target))
                assert at is not None and at not in seen, f"{source}->{target}: {seen + [at]}"
                seen.append(at)


def test_link_loss_reports_a_partition_only_where_a_unit_pair_loses_its_last_link(net, node):
    g6 = net.graph("6")
    sc2, ssc_b = node(g6, "SC-2"), node(g6, "SSC-B")
    # 5–13 is the only SC-1–SC-2 link, but SC-3 offers a detour
    hits = dict(net.link_down("5", "13"))
    (p,) = hits["6"].partitions
    assert p.pair == (node(g6, "5"), sc2) and p.unreachable == frozenset()
    assert "19" in hits and "25" not in hits  # SC-3 saw SC-1—SC-2 go; SSC-B never knew of it
    assert g6.next_hop("13", net.unit("13")) == "4"  # round through b and SC-3
    # each further loss empties one more edge; SC-2 stays reachable while any way remains
    for a, b, pair in (("17", "24", "SC-2—SC-3"), ("1", "25", "a—SSC-B")):
        (p,) = dict(net.link_down(a, b))["6"].partitions
        assert f"{p.pair[0]}—{p.pair[1]}" == pair and p.unreachable == frozenset()
    # SSC-A is now split inside: no route stays in SSC-A; the flat shortest path leaves SSC-A
    # and comes back in from SSC-B, and forwarding may fall back to it
    assert g6.route(sc2) is None and g6.next_hop("13", net.unit("13")) is None
    assert [str(n) for n in g6.shortest_path(sc2)] == [*("6", "4", "b", "SC-3", "SSC-B", "SC-2")]
    assert g6.next_hop("13", net.unit("13"), fallback=True) == "4"
    # the last way out to SC-2 and SSC-B goes: both are cut off from cluster c
    (p,) = dict(net.link_down("19", "29"))["6"].partitions
    assert p.unreachable == {sc2, ssc_b}
    assert g6.shortest_path(sc2) is None
    assert g6.next_hop("13", net.unit("13"), fallback=True) is None
    # and heals when a link comes back
    (h,) = dict(net.link_up("5", "13"))["6"].healed
    assert h.pair == (node(g6, "5"), sc2) and h.reachable == {sc2, ssc_b}
    assert g6.next_hop("13", net.unit("13")) == "5"


def test_redundant_link_keeps_the_unit_pair_connected(figure2, make_network, node):
    data = figure2.to_dict()
    data["links"].append(["6", "14"])  # a second link from cluster c into SC-2
    data["links"].append(["8", "15"])  # and one from cluster b
    net = make_network(Topology.from_dict(data))
    g7, g19 = net.graph("7"), net.graph("19")
    c_sc2 = (node(g7, "c"), node(g7, "SC-2"))
    assert g7.edge(*c_sc2).count == 2
    assert g19.edge(node(g19, "SC-1"), node(g19, "SC-2")).count == 3
    hits = dict(net.link_down("5", "13"))
    # at 6, edge 5—SC-2 lost its last link (6—SC-2 remains): a partition of that pair, nothing cut
    assert hits["6"].partitions[0].unreachable == frozenset()
    # in b and in SC-3 the unit pair still has links: no partition reported at all
    assert "7" not in hits and "19" not in hits
    assert g7.edge(*c_sc2).count == 1
    assert g19.edge(node(g19, "SC-1"), node(g19, "SC-2")).count == 2


def test_crash_and_restart_of_a_gatekeeper(net, node):
    g19 = net.graph("19")
    sc1, sc2 = node(g19, "SC-1"), node(g19, "SC-2")
    net.crash("5")  # its last reports said every link was up
    assert net.graph("19").edge(sc1, sc2) is None  # 13's "down" overrides 5's stale "up"
    assert net.graph("6").link_up("5", "13") is False
    assert net.graph("4").shortest_path(node(net.graph("4"), "5")) is None
    net.restart("5")
    assert net.graph("5").incarnation == 1
    assert g19.edge(sc1, sc2).count == 1
    assert dict(net.graph("5").edges) == dict(net.graph("6").edges)
    # the restarted broker ignores its previous life's reports relayed back to it
    mine = [r for r in net.graph("5").reports() if r.reporter == "5"]
    assert mine and all(r.version[0] == 1 for r in mine)


def test_suspected_gatekeeper_is_routed_around(net, node):
    g = net.graph("6")
    g.suspect(node(g, "5"))
    assert g.next_hop("13", net.unit("13")) == "4"
    assert [str(n) for n in g.shortest_path(node(g, "SC-2"))] == ["6", "4", "b", "SC-3", "SC-2"]
    g.suspect_link("4", "7")
    assert g.next_hop("13", net.unit("13")) is None
    g.clear_link_suspicion("7", "4")
    g.clear_suspicion(node(g, "5"))
    assert g.next_hop("13", net.unit("13")) == "5"
