"""The covering exporter under random changes, and its cost with thousands of conjunctions.

Whatever the order of adds, removals and steps, what the keepers were told (the ops replayed)
is exactly the exported set, every local conjunction is covered by an exported one at every
moment, and once every removal has finished its steps no exported conjunction covers another.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ges.matching.cover_index import MAX_VERIFY, CoverIndex
from ges.matching.covering import analyse, covers
from ges.matching.model import Conjunction, Constraint
from ges.routing.export import ADD, REMOVE, Exporter

CONSTRAINTS = st.one_of(
    st.builds(
        Constraint,
        st.sampled_from("xy"),
        st.sampled_from(["eq", "gt", "lt", "ge"]),
        st.integers(0, 4),
    ),
    st.builds(
        Constraint,
        st.sampled_from("xy"),
        st.just("in"),
        st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple),
    ),
    st.builds(Constraint, st.sampled_from("xyz"), st.just("exists")),
)
CONJUNCTIONS = st.lists(CONSTRAINTS, max_size=3).map(Conjunction)
ACTIONS = st.lists(
    st.tuples(st.sampled_from(["add", "add", "remove", "step"]), CONJUNCTIONS, st.integers(1, 40)),
    max_size=60,
)


class Upstream:
    """What the keepers know: the ops replayed."""

    def __init__(self) -> None:
        self.live: dict[int, Conjunction] = {}

    def apply(self, ops) -> None:
        for op, seq, conj in ops:
            if op == ADD:
                assert seq not in self.live
                self.live[seq] = conj
            else:
                assert op == REMOVE and self.live.pop(seq) == conj


def check(e: Exporter, up: Upstream, local: dict, *, settled: bool) -> None:
    assert {c: s for s, c in up.live.items()} == e.exported
    for conj in local:
        seq = e.seq_for(conj)
        if analyse(conj).members is None:
            assert seq is None  # matches nothing: not exported, stands under nothing
            continue
        assert seq is not None and covers(up.live[seq], conj), str(conj)
    if settled:
        assert not e.pending
        assert set(e.exported) <= set(local)
        exported = list(e.exported)
        for a in exported:
            for b in exported:
                assert a is b or not covers(a, b), (str(a), str(b))


def as_sent(ops) -> list:
    """The order the router sends an op list in: adds first (OriginProfiles._exported)."""
    return sorted(ops, key=lambda op: op[0] != ADD)


def covered_throughout(up: Upstream, ops, keep) -> None:
    """Applied one change at a time — a keeper may route events between the messages a list
    is split into — every conjunction local before and after the call stays covered."""
    for op in as_sent(ops):
        up.apply([op])
        for conj in keep:
            if analyse(conj).members is not None:
                assert any(covers(c, conj) for c in up.live.values()), str(conj)


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_no_conjunction_is_uncovered_between_the_changes_of_one_call(actions):
    e, up, local = Exporter(), Upstream(), {}
    for action, conj, budget in actions:
        before = set(local)
        if action == "add":
            ops = e.add(conj)
            local[conj] = local.get(conj, 0) + 1
        elif action == "remove" and local:
            victim = conj if conj in local else next(iter(local))
            ops = e.remove(victim)
            local[victim] -= 1
            if not local[victim]:
                del local[victim]
        else:
            ops = e.step(budget)
        covered_throughout(up, ops, before & set(local))
    while e.pending:
        covered_throughout(up, e.step(3), set(local))


X0 = Constraint("x", "eq", 0)
X_EXISTS = Constraint("x", "exists")


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
@example(  # the first leaves, "everything" goes up, the first comes back under it
    [
        ("add", Conjunction((X0, X0, X_EXISTS)), 1),
        ("add", Conjunction((X0,)), 1),
        ("remove", Conjunction(()), 1),
        ("add", Conjunction(()), 1),
        ("add", Conjunction((X0, X0, X_EXISTS)), 1),
    ]
)
def test_the_exporter_keeps_the_keepers_covering_every_local_conjunction(actions):
    e, up, local = Exporter(), Upstream(), {}
    for action, conj, budget in actions:
        if action == "add":
            up.apply(e.add(conj))
            local[conj] = local.get(conj, 0) + 1
        elif action == "remove" and local:
            victim = conj if conj in local else next(iter(local))
            up.apply(e.remove(victim))
            local[victim] -= 1
            if not local[victim]:
                del local[victim]
        else:
            up.apply(e.step(budget))
        check(e, up, local, settled=False)
        e.replaced.clear()
    while e.pending:
        up.apply(e.step(10))
        check(e, up, local, settled=False)
    check(e, up, local, settled=True)


def test_a_conjunction_back_before_it_left_stands_under_one_exported_meanwhile():
    """While it leaves it is out of the index, so a wider conjunction exported then does not
    retract it; added back, it is retracted at once and stands under that one with its own."""
    e = Exporter()
    wide, narrow, everything = Conjunction((X_EXISTS,)), Conjunction((X0,)), Conjunction(())
    assert e.add(wide) == [(ADD, 1, wide)]
    assert e.add(narrow) == []  # under wide
    assert e.remove(wide) == []  # leaves in steps: still exported, standing for narrow
    assert e.add(everything) == [(ADD, 2, everything)]
    assert e.add(wide) == [(REMOVE, 1, wide)]
    assert e.replaced == {1: (2,)}
    assert e.exported == {everything: 2} and not e.pending
    assert e.seq_for(wide) == e.seq_for(narrow) == 2
    assert e.remove(everything) == []  # both stand under it: they go up again, the wider first
    ops = []
    while e.pending:
        ops += e.step(10)
    assert ops == [(ADD, 3, wide), (REMOVE, 2, everything)]
    assert e.seq_for(narrow) == 3


def quote(i: int) -> Conjunction:
    return Conjunction((Constraint("sym", "eq", f"S{i}"), Constraint("price", "gt", float(i))))


def test_thousands_of_conjunctions_cost_a_bounded_amount_each():
    """The work of the index per conjunction stays the same whether 10 or 4,096 are stored:
    no query compares a conjunction with every stored one."""
    e = Exporter()
    costs = []
    for i in range(4096):
        before = e.work
        assert e.add(quote(i)) == [(ADD, i + 1, quote(i))]
        costs.append(e.work - before)
    assert max(costs) == max(costs[:10])
    wide = Conjunction((Constraint("price", "gt", -1.0),))
    ops = e.add(wide)  # covers them all: retracts as many as one query finds
    assert ops[-1] == (ADD, 4097, wide)
    assert 0 < len(ops) - 1 <= MAX_VERIFY
    before = e.work
    for i in range(4096):
        e.remove(quote(i))
    assert (e.work - before) / 4096 <= max(costs)


def test_removing_a_wide_conjunction_places_what_it_stood_for_in_bounded_steps():
    e = Exporter()
    wide = Conjunction((Constraint("price", "gt", -1.0),))
    e.add(wide)
    for i in range(2000):
        assert e.add(quote(i)) == []  # all under wide
    assert e.remove(wide) == []
    steps = 0
    ops = []
    while e.pending:
        before = e.work
        ops += e.step(200)
        assert e.work - before < 200 + 100  # one more placement at most
        steps += 1
    assert steps > 10
    assert ops[-1][0] == REMOVE and ops[-1][2] == wide
    assert {c for op, _, c in ops if op == ADD} == {quote(i) for i in range(2000)}


def test_the_index_finds_covers_through_pins_and_attributes():
    idx = CoverIndex()
    for i in range(100):
        idx.add(analyse(quote(i)))
    everything = Conjunction(())
    idx.add(analyse(everything))
    narrow = Conjunction((*quote(7).constraints, Constraint("volume", "gt", 5)))
    assert idx.coverer(analyse(narrow)) in (quote(7), everything)
    assert idx.coverer(analyse(narrow), strict=True, exclude=everything) == quote(7)
    assert idx.covered(analyse(Conjunction((Constraint("sym", "eq", "S3"),)))) == [quote(3)]
    assert set(idx.covered(analyse(everything))) >= {quote(0)}
    idx.remove(quote(7))
    assert idx.coverer(analyse(narrow)) == everything
