"""One ConnectivityGraph driven directly with reports: counts, costs, versions, partitions,
suspicion and routes (seed 004 §2 connectivity graph, §3 routing)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ges.connectivity import ConnectivityError, ConnectivityGraph, GraphNode, LinkReport
from ges.topology import LinkCostMatrix

A = ("SSC-A", "SC-1", "a")
B = ("SSC-A", "SC-1", "b")
C = ("SSC-A", "SC-1", "c")
E = ("SSC-A", "SC-2", "e")
H = ("SSC-A", "SC-3", "h")

UNITS = {"1": A, "4": C, "5": C, "6": C, "7": B, "8": B, "9": B}
UNITS |= {"13": E, "14": E, "15": E, "23": H}

N4, N5, N6 = (GraphNode(0, (*C, x)) for x in "456")
NB = GraphNode(1, B)
NC = GraphNode(1, C)
SC2 = GraphNode(2, ("SSC-A", "SC-2"))
SC3 = GraphNode(2, ("SSC-A", "SC-3"))

_clock = itertools.count()


def report(x: str, y: str, *, by: str, up: bool = True, cost=None, version=None) -> LinkReport:
    """``by``'s report on link x–y; versions grow by default so each call is newer."""
    other = y if by == x else x
    return LinkReport.observe(
        by, UNITS[by], other, UNITS[other], up=up, cost=cost, version=version or (0, next(_clock))
    )


def both_up(graph: ConnectivityGraph, x: str, y: str, cost=None) -> None:
    for by in (x, y):
        graph.receive(report(x, y, by=by, cost=cost))


def vertex(v: str = "6", **kw) -> ConnectivityGraph:
    return ConnectivityGraph(v, UNITS[v], **kw)


# -- link counts -----------------------------------------------------------------------------------


def test_another_link_between_connected_units_increments_the_count():
    g = vertex("6")
    both_up(g, "5", "13")
    assert g.edge(N5, SC2).count == 1
    both_up(g, "5", "14")  # a second link from 5 into SC-2
    edge = g.edge(SC2, N5)  # either order
    assert edge.count == 2 and edge.links == (("5", "13"), ("5", "14"))
    both_up(g, "6", "15")  # from another broker of c: a different edge at vertex 6
    assert g.edge(N6, SC2).count == 1 and g.edge(N5, SC2).count == 2

    # in cluster b all three are the one edge c—SC-2 (seed 004: "incremented by one every time a
    # new connection is established between two units that were already connected")
    gb = vertex("7")
    for x, y in (("5", "13"), ("5", "14"), ("6", "15")):
        both_up(gb, x, y)
    assert gb.edge(NC, SC2).count == 3 and len(gb.edges) == 1


def test_a_link_with_one_report_is_up_and_down_links_leave_the_edges_view():
    g = vertex("6")
    g.receive(report("5", "13", by="13"))
    assert g.edge(N5, SC2).count == 1 and g.link_up("5", "13") is True
    g.receive(report("5", "13", by="13", up=False))
    assert g.edge(N5, SC2) is None and g.link_up("5", "13") is False
    assert {N5, SC2} <= g.nodes  # nodes stay known
    assert g.link_up("5", "14") is None


# -- costs -----------------------------------------------------------------------------------------


def test_costs_come_from_the_matrix_by_direction():
    g = vertex("6")
    both_up(g, "5", "6")
    both_up(g, "5", "13")
    m = LinkCostMatrix()
    assert g.edge(N5, N6).cost_from(N5) == m.cost(0, 0) == 1.0
    e = g.edge(N5, SC2)
    assert (e.cost_from(N5), e.cost_from(SC2)) == (m.cost(0, 2), m.cost(2, 2)) == (3.0, 5.0)
    with pytest.raises(ValueError):
        e.cost_from(N6)
    assert g.distance(SC2) == 1.0 + 3.0

    g.set_costs(LinkCostMatrix(rows=((1.0, 2.0, 10.0), (1.0, 2.0, 3.0), (1.0, 1.0, 7.0))))
    e = g.edge(N5, SC2)
    assert (e.cost_u, e.cost_w) == (10.0, 7.0)
    assert g.distance(SC2) == 11.0


def test_cost_rises_with_link_level_and_unit_level_by_default():
    m = LinkCostMatrix()
    assert m.cost(0, 0) < m.cost(0, 1) < m.cost(0, 2) < m.cost(0, 3)
    assert m.cost(0, 2) < m.cost(1, 2) < m.cost(2, 2)


def test_per_link_override_and_min_over_links():
    g = vertex("6")
    both_up(g, "5", "13", cost=9.0)
    e = g.edge(N5, SC2)
    assert (e.cost_u, e.cost_w) == (9.0, 9.0)  # an override is the same both ways
    both_up(g, "5", "14")  # matrix link: 3 from 5, 5 from SC-2
    e = g.edge(N5, SC2)
    assert (e.count, e.cost_u, e.cost_w) == (2, 3.0, 5.0)
    both_up(g, "5", "15", cost=0.5)
    assert g.edge(N5, SC2).cost_u == 0.5


def test_ends_that_disagree_on_an_override_use_the_higher():
    g = vertex("6")
    g.receive(report("5", "13", by="5", cost=2.0))
    g.receive(report("5", "13", by="13", cost=4.0))
    assert g.edge(N5, SC2).cost_u == 4.0
    update = g.receive(report("5", "13", by="13"))  # 13 drops its override
    assert update.changed and g.edge(N5, SC2).cost_u == 2.0
    update = g.receive(report("5", "13", by="5"))
    assert g.edge(N5, SC2).cost_u == 3.0  # back to the matrix


# -- versions ----------------------------------------------------------------------------------------


def test_redelivery_is_idempotent():
    g = vertex("6")
    r = report("5", "13", by="5")
    first = g.receive(r)
    before = (dict(g.edges), g.nodes)
    again = g.receive(r)
    assert first.new and first.changed
    assert not again.new and not again.changed and not again.partitions
    assert (dict(g.edges), g.nodes) == before
    older = report("5", "13", by="5", up=False, version=(0, 0))
    assert not g.receive(older).new and g.link_up("5", "13")


def test_a_newer_report_that_changes_nothing_is_new_but_not_a_change():
    g = vertex("6")
    g.receive(report("5", "13", by="5"))
    update = g.receive(report("5", "13", by="5"))
    assert update.new and not update.changed


def test_crashed_endpoint_stale_up_is_overridden_by_the_live_end():
    g = vertex("7")
    g.receive(report("5", "13", by="5", version=(0, 10)))
    g.receive(report("5", "13", by="13", version=(0, 4)))
    assert g.link_up("5", "13")
    # 5 crashes: its last word was "up", but 13 saw the link drop
    update = g.receive(report("5", "13", by="13", up=False, version=(0, 5)))
    assert not g.link_up("5", "13") and update.partitions
    # 5 restarts with a higher incarnation and a fresh seq; 13 has not re-reported yet
    g.receive(report("5", "13", by="5", version=(1, 0)))
    assert not g.link_up("5", "13")
    update = g.receive(report("5", "13", by="13", version=(0, 6)))
    assert g.link_up("5", "13") and update.healed


def test_observe_issues_growing_versions_and_forgets_a_previous_life():
    g = vertex("5", incarnation=3)
    r1, u1 = g.observe("13", E, up=True)
    r2, _ = g.observe("13", E, up=True, cost=2.0)
    assert (r1.reporter, r1.version, r2.version) == ("5", (3, 0), (3, 1))
    assert u1.new and u1.changed and g.edge(g.vertex_node, SC2).cost_u == 2.0
    # our own report from incarnation 2, relayed back by a neighbour, is ignored
    old = LinkReport.observe("5", C, "14", E, up=True, version=(2, 99))
    assert not g.receive(old).new and g.link_up("5", "14") is None
    # one from the future (we were started with a stale incarnation): ours now come after it
    g.receive(LinkReport.observe("5", C, "14", E, up=True, version=(4, 7)))
    r3, _ = g.observe("14", E, up=False)
    assert r3.version == (4, 8) and not g.link_up("5", "14")


def test_reports_outside_the_vertex_context_are_refused():
    g = vertex("6")
    inside_b = report("7", "8", by="7")
    with pytest.raises(ConnectivityError, match="outside its scope"):
        g.receive(inside_b)
    assert g.link_up("7", "8") is None
    assert g.report_visible_to(inside_b, B) and not g.report_visible_to(inside_b, C)


def test_reports_for_filters_by_the_receiver():
    g = vertex("6")
    both_up(g, "5", "6")
    both_up(g, "5", "13")
    both_up(g, "4", "7")
    to_c = g.reports_for(C)
    to_b = g.reports_for(B)
    assert {r.key for r in to_c} == {("5", "6"), ("5", "13"), ("4", "7")}
    assert {r.key for r in to_b} == {("5", "13"), ("4", "7")}
    assert len(to_c) == 6 and to_c == list(g.reports())  # latest per link and reporter
    assert g.reports_for(("SSC-B", "SC-4", "i")) == []


# -- partitions ---------------------------------------------------------------------------------------


def _cluster_c_with_exits() -> ConnectivityGraph:
    g = vertex("6")
    for x, y in (("4", "5"), ("5", "6"), ("4", "6"), ("5", "13"), ("4", "7")):
        both_up(g, x, y)
    return g


def test_losing_the_last_link_between_two_units_reports_a_partition():
    g = _cluster_c_with_exits()
    update = g.receive(report("5", "13", by="5", up=False))
    (p,) = update.partitions
    assert p.pair == (N5, SC2) and p.unreachable == {SC2}
    assert g.shortest_path(SC2) is None and g.next_hop("13", E) is None


def test_no_partition_while_a_redundant_link_remains():
    g = _cluster_c_with_exits()
    both_up(g, "5", "14")
    update = g.receive(report("5", "13", by="13", up=False))
    assert update.changed and update.partitions == ()
    assert g.edge(N5, SC2).count == 1
    (p,) = g.receive(report("5", "14", by="14", up=False)).partitions
    assert p.unreachable == {SC2}


def test_partition_of_an_edge_with_a_detour_has_nothing_unreachable():
    g = _cluster_c_with_exits()
    both_up(g, "9", "23")  # b—SC-3
    g.receive(LinkReport.observe("17", ("SSC-A", "SC-2", "f"), "24", H, up=True, version=(0, 0)))
    (p,) = g.receive(report("5", "13", by="5", up=False)).partitions
    assert p.pair == (N5, SC2) and p.unreachable == frozenset()
    assert g.shortest_path(SC2) == [N6, N4, NB, SC3, SC2]


def test_heal_reports_what_became_reachable():
    g = _cluster_c_with_exits()
    g.receive(report("5", "13", by="5", up=False))
    update = g.receive(report("5", "13", by="5"))
    (h,) = update.healed
    assert h.pair == (N5, SC2) and h.reachable == {SC2}
    assert g.next_hop("13", E) == "5"


def test_losing_an_inner_link_can_cut_off_a_broker_and_everything_behind_it():
    g = _cluster_c_with_exits()
    g.receive(report("5", "6", by="6", up=False))
    assert g.receive(report("4", "6", by="6", up=False)).partitions[0].unreachable == {
        N4,
        N5,
        NB,
        SC2,
    }


# -- suspicion and routes -----------------------------------------------------------------------------


def test_shortest_paths_avoid_suspected_nodes_and_links():
    g = _cluster_c_with_exits()
    both_up(g, "6", "15")  # a second, direct way into SC-2 from the vertex
    both_up(g, "9", "23")
    assert g.shortest_path(SC2) == [N6, SC2]
    assert g.next_hop("13", E) == "15"  # the vertex holds the gateway: the far end
    g.suspect_link("15", "6")
    assert g.shortest_path(SC2) == [N6, N5, SC2] and g.next_hop("14", E) == "5"
    g.suspect(N5)
    assert g.shortest_path(SC2) is None  # b has no known way on to SC-2
    assert g.shortest_path(N5) is None and g.next_hop("5", C) is None
    assert g.shortest_path(SC3) == [N6, N4, NB, SC3]
    g.clear_suspicion(N5)
    g.clear_link_suspicion("6", "15")
    assert g.shortest_path(SC2) == [N6, SC2]
    assert g.suspected == frozenset() and g.suspected_links == frozenset()
    with pytest.raises(ValueError):
        g.suspect(g.vertex_node)


def test_suspicion_does_not_hide_edges_or_fake_partitions():
    g = _cluster_c_with_exits()
    g.suspect(N5)
    assert g.edge(N5, SC2) is not None and SC2 in g.reachable_nodes()


def test_route_stays_inside_the_common_unit_where_the_flat_path_would_leave():
    g = vertex("6")
    both_up(g, "5", "6", cost=10.0)
    both_up(g, "4", "5")
    both_up(g, "6", "7")
    both_up(g, "4", "7")
    # flat: out to cluster b and back in (2 + 3) beats the costly inner link (10 + 1) ...
    assert g.shortest_path(N4) == [N6, NB, N4] and g.distance(N4) == 5.0
    # ... but a route to a broker of the cluster stays in the cluster
    assert g.route(N4) == [N6, N5, N4]
    assert g.next_hop("4", C) == "5"
    assert g.route(g.vertex_node) == [g.vertex_node]
    g.receive(report("5", "6", by="5", up=False))
    assert g.route(N4) is None and g.next_hop("4", C) is None  # c is split inside
    assert g.next_hop("4", C, fallback=True) == "7"


def test_next_hop_picks_the_cheapest_unsuspected_link_of_a_gateway_edge():
    g = vertex("5")
    both_up(g, "5", "14")
    both_up(g, "5", "13", cost=0.5)
    assert g.next_hop("15", E) == "13"
    g.suspect_link("5", "13")
    assert g.next_hop("15", E) == "14"
    assert g.next_hop("5", C) is None  # the vertex itself
    assert g.shortest_path(g.vertex_node) == [g.vertex_node]


def test_node_for_and_context():
    g = vertex("6")
    assert g.node_for("6", C) is None
    assert g.node_for("4", C) == N4 and g.node_for("8", B) == NB
    assert g.node_for_unit(("SSC-A", "SC-2")) == SC2 and g.node_for_unit(C) is None
    assert g.context(1) == C and g.context(2) == ("SSC-A", "SC-1") and g.context(4) == ()
    with pytest.raises(ValueError):
        g.context(0)
    with pytest.raises(ValueError):
        g.gateways(0)


# -- order independence (the graph is a function of the reports, not of their arrival) --------------

LINKS = [("4", "5"), ("5", "6"), ("4", "6"), ("5", "13"), ("5", "14"), ("6", "15"), ("4", "7")]
LINKS += [("9", "23"), ("1", "13")]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_arrival_order_gives_the_same_graph_and_routes(data):
    reports = []
    for x, y in LINKS:
        for by in (x, y):
            for seq, up in enumerate(data.draw(st.lists(st.booleans(), min_size=1, max_size=3))):
                reports.append(report(x, y, by=by, up=up, version=(0, seq)))
    shuffled = data.draw(st.permutations(reports))
    g1, g2 = vertex("6"), vertex("6")
    for r in reports:
        g1.receive(r)
    for r in shuffled:
        g2.receive(r)
    assert dict(g1.edges) == dict(g2.edges) and g1.nodes == g2.nodes
    assert list(g1.reports()) == list(g2.reports())
    for target in g1.nodes:
        assert g1.shortest_path(target) == g2.shortest_path(target)
        assert g1.route(target) == g2.route(target)
