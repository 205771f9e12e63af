"""The profile graph (seed 004 §3.1): predicate counts along edges, and agreement with the naive
evaluator after any sequence of adds and removes."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

from ges.matching.graph import ProfileGraph
from ges.matching.model import TOPIC_ATTR, TYPE_ATTR, Conjunction, Constraint, Profile


def C(attr, op, value=None):
    return Constraint(attr, op, value)


def P(*conjs, id="p", event_type=None):
    return Profile(id, tuple(Conjunction(c) for c in conjs), event_type)


# -- the structure seed 004 describes -----------------------------------------------------------


def edge(g: ProfileGraph, *path):
    for p, dests, ends in g.edges():
        if p == path:
            return dests, ends
    return None


def test_shared_prefixes_share_edges_and_count_predicates_per_destination():
    g = ProfileGraph()
    ibm = ("sym", "eq", "IBM")
    g.add(P([C("sym", "eq", "IBM"), C("price", "lt", 100)]), "u1")
    g.add(P([C("sym", "eq", "IBM"), C("price", "gt", 50)]), "u1")
    g.add(P([C("sym", "eq", "IBM")]), "u2")
    # the edge into sym=IBM is traversed by two predicates of u1 and one of u2
    assert edge(g, ibm) == ({"u1": 2, "u2": 1}, {"u2": 1})
    assert edge(g, ibm, ("price", "lt", 100)) == ({"u1": 1}, {"u1": 1})
    assert edge(g, ibm, ("price", "gt", 50)) == ({"u1": 1}, {"u1": 1})
    nodes = g.node_count
    g.add(P([C("sym", "eq", "IBM"), C("price", "lt", 100)]), "u1")  # again: counts only
    assert g.node_count == nodes
    assert edge(g, ibm) == ({"u1": 3, "u2": 1}, {"u2": 1})
    assert edge(g, ibm, ("price", "lt", 100)) == ({"u1": 2}, {"u1": 2})
    # removal decrements; zero drops the destination, then the edge
    g.remove(P([C("sym", "eq", "IBM"), C("price", "lt", 100)]), "u1")
    g.remove(P([C("sym", "eq", "IBM"), C("price", "lt", 100)]), "u1")
    assert edge(g, ibm, ("price", "lt", 100)) is None
    assert edge(g, ibm) == ({"u1": 1, "u2": 1}, {"u2": 1})
    g.remove(P([C("sym", "eq", "IBM")]), "u2")
    assert edge(g, ibm) == ({"u1": 1}, {})
    g.remove(P([C("sym", "eq", "IBM"), C("price", "gt", 50)]), "u1")
    assert list(g.edges()) == []
    assert g.node_count == 1 and len(g) == 0 and not g


def test_attribute_order_is_global_not_the_profile_writers():
    g = ProfileGraph()
    g.add(P([C("sym", "eq", "IBM"), C("price", "lt", 100)]), "a")
    g.add(P([C("price", "lt", 100), C("sym", "eq", "IBM")]), "b")
    # written in either order, both conjunctions are one path
    assert edge(g, ("sym", "eq", "IBM"), ("price", "lt", 100)) == (
        {"a": 1, "b": 1},
        {"a": 1, "b": 1},
    )
    assert g.node_count == 3


def test_unconstrained_attributes_are_skipped_not_required():
    g = ProfileGraph()
    g.add(P([C("a", "eq", 1), C("c", "eq", 3)]), "ac")
    g.add(P([C("a", "eq", 1), C("b", "eq", 2), C("c", "eq", 3)]), "abc")
    assert g.match({"a": 1, "c": 3}) == {"ac"}
    assert g.match({"a": 1, "b": 2, "c": 3}) == {"ac", "abc"}
    assert g.match({"a": 1, "b": 9, "c": 3}) == {"ac"}


def test_remove_of_something_never_added_changes_nothing():
    g = ProfileGraph()
    p = P([C("a", "eq", 1)], [C("b", "eq", 2)])
    g.add(P([C("a", "eq", 1)]), "d")
    before = sorted(map(repr, g.edges()))
    with pytest.raises(KeyError):
        g.remove(p, "d")  # its second conjunction was never added
    with pytest.raises(KeyError):
        g.remove(P([C("a", "eq", 1)]), "other")
    with pytest.raises(KeyError):
        g.remove(P([C("zz", "eq", 1)]), "d")
    assert sorted(map(repr, g.edges())) == before
    # a profile repeating one conjunction needs it stored twice
    with pytest.raises(KeyError):
        g.remove(P([C("a", "eq", 1)], [C("a", "eq", 1)]), "d")
    assert g.match({"a": 1}) == {"d"}


def test_kinds_never_meet():
    g = ProfileGraph()
    g.add(P([C("x", "eq", 1)]), "one")
    g.add(P([C("x", "eq", True)]), "true")
    g.add(P([C("x", "in", ("1", "2"))]), "strs")
    g.add(P([C("x", "ne", 1)]), "not-one")
    g.add(P([C("x", "lt", "b")]), "lt-b")
    assert g.match({"x": 1}) == {"one"}
    assert g.match({"x": 1.0}) == {"one"}
    assert g.match({"x": True}) == {"true"}
    assert g.match({"x": "1"}) == {"strs", "lt-b"}
    assert g.match({"x": 2}) == {"not-one"}


def test_nan_satisfies_only_ne_and_exists():
    g = ProfileGraph()
    for i, c in enumerate(
        [C("x", "lt", 1), C("x", "le", 1), C("x", "gt", 1), C("x", "ge", 1), C("x", "eq", 1)]
    ):
        g.add(P([c]), i)
    g.add(P([C("x", "ne", 1)]), "ne")
    g.add(P([C("x", "exists")]), "exists")
    g.add(P([C("x", "in", (1, 2))]), "in")
    assert g.match({"x": math.nan}) == {"ne", "exists"}


def test_event_type_is_one_more_equality():
    g = ProfileGraph()
    g.add(P([C("sym", "eq", "IBM")], event_type="quote"), "quotes")
    g.add(P([C("sym", "eq", "IBM")]), "any")
    assert g.match({"sym": "IBM", TYPE_ATTR: "quote"}) == {"quotes", "any"}
    assert g.match({"sym": "IBM", TYPE_ATTR: "trade"}) == {"any"}
    assert g.match({"sym": "IBM"}) == {"any"}


def test_the_empty_conjunction_matches_everything():
    g = ProfileGraph()
    g.add(Profile("all"), "all")
    g.add(P([C("a", "eq", 1)]), "a")
    assert g.match({}) == {"all"}
    assert g.match({"a": 1}) == {"all", "a"}
    g.remove(Profile("all"), "all")
    assert g.match({"a": 2}) == set()


def test_prefixes_of_every_length_and_the_empty_prefix():
    g = ProfileGraph()
    for p in ["", "N", "NY", "NYS", "NYSE", "NA"]:
        g.add(P([C("ex", "prefix", p)]), p)
    assert g.match({"ex": "NYSE"}) == {"", "N", "NY", "NYS", "NYSE"}
    assert g.match({"ex": "NAS"}) == {"", "N", "NA"}
    assert g.match({"ex": ""}) == {""}
    g.remove(P([C("ex", "prefix", "NY")]), "NY")
    assert g.match({"ex": "NYSE"}) == {"", "N", "NYS", "NYSE"}


def test_ranges_are_exact_at_their_thresholds():
    g = ProfileGraph()
    for op in ("lt", "le", "gt", "ge"):
        for t in (1, 2, 3):
            g.add(P([C("x", op, t)]), (op, t))
    assert g.match({"x": 2}) == {
        ("lt", 3),
        ("le", 2),
        ("le", 3),
        ("gt", 1),
        ("ge", 1),
        ("ge", 2),
    }
    assert g.match({"x": 2.5}) == {("lt", 3), ("le", 3), ("gt", 1), ("gt", 2), ("ge", 1), ("ge", 2)}
    assert g.match({"x": math.inf}) == {("gt", t) for t in (1, 2, 3)} | {
        ("ge", t) for t in (1, 2, 3)
    }


def test_pruning_does_not_lose_destinations_behind_a_matched_one():
    g = ProfileGraph()
    g.add(P([C("a", "eq", 1)]), "x")
    g.add(P([C("a", "eq", 1), C("b", "eq", 2)]), "x")
    g.add(P([C("a", "eq", 1), C("b", "eq", 2), C("c", "eq", 3)]), "y")
    assert g.match({"a": 1, "b": 2, "c": 3}) == {"x", "y"}


# -- against the naive evaluator ----------------------------------------------------------------

ATTRS = ["a", "b", "c", TYPE_ATTR, TOPIC_ATTR]
TOPIC_LEVELS = ["a", "b", "$s", "", "+"]
FILTERS = st.tuples(st.lists(st.sampled_from(TOPIC_LEVELS), max_size=3), st.booleans()).map(
    lambda t: "/".join([*t[0], "#"] if t[1] or not t[0] else t[0]) or "+"
)
TOPICS = st.lists(st.sampled_from(["a", "b", "$s", "", "c"]), min_size=1, max_size=4).map("/".join)
STRINGS = ["", "a", "ab", "abc", "b", "ba", "ab\x00", "\U0010ffff"]
NUMBERS = [-2, -1, 0, 0.5, 1, 1.0, 1.5, 2, 3, math.inf, -math.inf]
BOOLS = [True, False]


@st.composite
def constraints(draw):
    attr = draw(st.sampled_from(ATTRS))
    if attr == TOPIC_ATTR:
        op = draw(st.sampled_from(["topic", "topic", "topic", "eq", "ne", "in", "exists"]))
        if op == "topic":
            return Constraint(attr, op, draw(FILTERS))
        if op == "in":
            return Constraint(attr, op, tuple(draw(st.lists(TOPICS, min_size=1, max_size=3))))
        return Constraint(attr, op) if op == "exists" else Constraint(attr, op, draw(TOPICS))
    op = draw(st.sampled_from(["eq", "ne", "lt", "le", "gt", "ge", "prefix", "exists", "in"]))
    if op == "exists":
        return Constraint(attr, op)
    if op == "prefix":
        return Constraint(attr, op, draw(st.sampled_from(STRINGS)))
    pools = [STRINGS, NUMBERS] if op in ("lt", "le", "gt", "ge") else [STRINGS, NUMBERS, BOOLS]
    pool = draw(st.sampled_from(pools))
    if op == "in":
        return Constraint(
            attr, op, tuple(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4)))
        )
    return Constraint(attr, op, draw(st.sampled_from(pool)))


profiles = st.builds(
    lambda conjs, et: Profile("p", tuple(Conjunction(c) for c in conjs), et),
    st.lists(st.lists(constraints(), max_size=4), min_size=1, max_size=3),
    st.one_of(st.none(), st.sampled_from(["quote", "trade"])),
)

event_values = st.one_of(
    st.sampled_from(STRINGS + NUMBERS + BOOLS + ["abd", "c", 2.0, 0, math.nan, 10**20]),
    st.text(alphabet="ab\x00", max_size=4),
    st.floats(allow_nan=True),
    st.integers(-3, 3),
)
events = st.dictionaries(
    st.sampled_from(ATTRS), st.one_of(event_values, TOPICS, TOPICS, TOPICS), max_size=4
)


def naive(stored, attributes) -> set:
    return {dest for profile, dest in stored if profile.matches(attributes)}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(profiles, st.integers(0, 5))), st.lists(events, max_size=20))
def test_match_equals_naive_after_adds(stored, evs):
    g = ProfileGraph()
    for profile, dest in stored:
        g.add(profile, dest)
    for e in evs:
        assert g.match(e) == naive(stored, e), e


class AddRemove(RuleBasedStateMachine):
    """Any interleaving of adds, removes and matches agrees with the naive evaluator."""

    stored = Bundle("stored")

    def __init__(self):
        super().__init__()
        self.graph = ProfileGraph()
        self.live: list[tuple[Profile, int]] = []

    @rule(target=stored, profile=profiles, dest=st.integers(0, 4))
    def add(self, profile, dest):
        self.graph.add(profile, dest)
        self.live.append((profile, dest))
        return (profile, dest)

    @rule(item=consumes(stored))
    def remove(self, item):
        profile, dest = item
        self.graph.remove(profile, dest)
        self.live.remove(item)

    @rule(profile=profiles, dest=st.integers(0, 4))
    def remove_absent(self, profile, dest):
        if any(d == dest for _, d in self.live):
            return  # an equal conjunction may be stored under another profile of dest
        before = self.graph.node_count
        with pytest.raises(KeyError):
            self.graph.remove(profile, dest)
        assert self.graph.node_count == before

    @rule(event=events)
    def match(self, event):
        assert self.graph.match(event) == naive(self.live, event)

    @invariant()
    def empty_when_nothing_is_stored(self):
        if not self.live:
            assert self.graph.node_count == 1
            assert len(self.graph) == 0
            assert list(self.graph.edges()) == []
            assert self.graph._rank == {TYPE_ATTR: -1}
        else:
            assert len(self.graph) == sum(len(p.conjunctions) for p, _ in self.live)


# 75 runs of 40 steps: removing a path's ends, pruning, the attribute ranks and uses broken
# each failed every run, as with 150 (a table emptied and refilled has its own tests below)
AddRemove.TestCase.settings = settings(
    max_examples=75,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAddRemove = AddRemove.TestCase


def test_a_lower_and_upper_bound_on_one_attribute_is_one_range_node():
    g = ProfileGraph()
    g.add(P([C("p", "ge", 10), C("p", "lt", 20)]), "half-open")
    g.add(P([C("p", "gt", 10), C("p", "le", 20)]), "open-closed")
    g.add(P([C("p", "ge", 10), C("p", "le", 10)]), "point")
    g.add(P([C("s", "ge", "b"), C("s", "lt", "c")]), "b-words")
    assert g.node_count == 1 + 4  # one node per range, no chain of bounds
    assert g.match({"p": 10}) == {"half-open", "point"}
    assert g.match({"p": 10.5}) == {"half-open", "open-closed"}
    assert g.match({"p": 20}) == {"open-closed"}
    assert g.match({"p": 20.0001}) == set()
    assert g.match({"p": math.nan}) == set()
    assert g.match({"p": "15"}) == set()  # kinds never meet
    assert g.match({"s": "bz"}) == {"b-words"}
    assert g.match({"s": "c"}) == set()
    g.remove(P([C("p", "ge", 10), C("p", "lt", 20)]), "half-open")
    assert g.match({"p": 10}) == {"point"}
    g.remove(P([C("p", "le", 20), C("p", "gt", 10)]), "open-closed")  # any writing order
    assert g.match({"p": 15}) == set()


def test_a_range_of_mixed_kinds_stays_two_bounds_and_never_matches():
    g = ProfileGraph()
    g.add(P([C("p", "ge", 1), C("p", "lt", "z")]), "never")
    assert g.match({"p": 5}) == set() and g.match({"p": "a"}) == set()
    assert g.node_count == 3


def test_a_short_in_list_shares_the_equality_subtrees():
    g = ProfileGraph()
    g.add(P([C("sym", "eq", "IBM"), C("ex", "eq", "NYSE")]), "ibm")
    nodes = g.node_count
    g.add(P([C("sym", "in", ("IBM", "HPQ")), C("ex", "eq", "NYSE")]), "tech")
    assert g.node_count == nodes + 2  # only sym=HPQ → ex=NYSE is new
    assert g.match({"sym": "IBM", "ex": "NYSE"}) == {"ibm", "tech"}
    assert g.match({"sym": "HPQ", "ex": "NYSE"}) == {"tech"}
    # a long list stays one hashed `in` node
    many = tuple(f"S{i}" for i in range(100))
    g.add(P([C("sym", "in", many)]), "many")
    assert g.match({"sym": "S42"}) == {"many"}
    g.remove(P([C("sym", "in", many)]), "many")
    g.remove(P([C("sym", "in", ("IBM", "HPQ")), C("ex", "eq", "NYSE")]), "tech")
    assert g.node_count == nodes
    assert g.match({"sym": "HPQ", "ex": "NYSE"}) == set()


@pytest.mark.parametrize(
    ("gone", "stays", "again", "event"),
    [
        (C("x", "eq", 1), C("x", "gt", 5), C("x", "eq", 2), {"x": 2}),
        (
            C("x", "in", tuple(range(20))),
            C("x", "gt", 50),
            C("x", "in", tuple(range(20, 40))),
            {"x": 30},
        ),
        (C("s", "prefix", "ab"), C("s", "eq", "zz"), C("s", "prefix", "cd"), {"s": "cde"}),
        (C("x", "ne", 1), C("x", "eq", 7), C("x", "ne", 2), {"x": 3}),
        (C("x", "gt", 1), C("x", "eq", 7), C("x", "gt", 2), {"x": 3}),
        (C("x", "exists"), C("x", "eq", 7), C("x", "exists"), {"x": 3}),
    ],
)
def test_a_table_emptied_and_refilled_is_matched_again(gone, stays, again, event):
    """Regression: the last test of one operator removed beside another operator on the same
    attribute, then a new one added — the new one must be reachable."""
    g = ProfileGraph()
    g.add(P([gone]), "A")
    g.add(P([stays]), "B")
    g.remove(P([gone]), "A")
    g.add(P([again]), "C")
    assert g.match(event) == {"C"}


def test_remove_must_name_a_stored_conjunction_not_a_part_of_one():
    """Regression: removing ``x = 1`` after adding ``x in (1, 2)`` must fail and change nothing,
    though the expanded ``in`` does store an ``x = 1`` path."""
    g = ProfileGraph()
    g.add(P([C("x", "in", (1, 2))]), "A")
    with pytest.raises(KeyError):
        g.remove(P([C("x", "eq", 1)]), "A")
    assert len(g) == 1 and g.match({"x": 1}) == {"A"} and g.match({"x": 2}) == {"A"}
    g.remove(P([C("x", "in", (2, 1))]), "A")  # the same conjunction, values in another order
    assert g.node_count == 1 and len(g) == 0 and g.match({"x": 2}) == set()
