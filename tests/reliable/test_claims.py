"""Claims along content routes: the known ranges, the publisher's and the keepers' claims, and
their bounds — against naive models that keep one entry per tick."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ges.reliable.claims import Claims, Known, Resolved

TOP = 60
U = ("u",)
V = ("v",)


def runs(ticks: set[int]) -> list[tuple[int, int]]:
    """The maximal runs of consecutive ticks of a set, lowest first."""
    out: list[tuple[int, int]] = []
    for t in sorted(ticks):
        if out and out[-1][1] == t - 1:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


def naive_run_start(ticks: set[int], tick: int) -> int:
    if tick not in ticks:
        return tick + 1
    s = tick
    while s - 1 in ticks:
        s -= 1
    return s


# -- Known --------------------------------------------------------------------------------------


def test_known_merges_touching_ranges_added_in_any_order():
    k = Known()
    k.add(5, 6)
    k.add(1, 2)
    assert k.ranges() == [(1, 2), (5, 6)]
    k.add(3, 4)  # touches both neighbours: one range
    assert k.ranges() == [(1, 6)]
    k.add(8, 9)  # one tick apart: not touching
    assert k.ranges() == [(1, 6), (8, 9)]
    k.add(7, 7)
    assert k.ranges() == [(1, 9)]


def test_known_merges_overlapping_ranges():
    k = Known()
    k.add(10, 12)
    k.add(20, 22)
    k.add(30, 32)
    k.add(11, 21)  # overlaps the first two, not the third
    assert k.ranges() == [(10, 22), (30, 32)]
    k.add(1, 40)  # swallows everything
    assert k.ranges() == [(1, 40)]
    k.add(5, 6)  # inside: no change
    assert k.ranges() == [(1, 40)]
    k.add(38, 45)  # extends the last
    assert k.ranges() == [(1, 45)]
    k.add(46, 50)  # touches the end of the last
    assert k.ranges() == [(1, 50)]


def test_known_ignores_an_empty_range():
    k = Known()
    k.add(5, 4)
    assert k.ranges() == []
    k.add(1, 3)
    k.add(9, 2)
    assert k.ranges() == [(1, 3)]


def test_run_start_of_an_unknown_tick_is_the_tick_after_it():
    k = Known()
    assert k.run_start(7) == 8
    k.add(3, 5)
    k.add(9, 12)
    assert k.run_start(2) == 3
    assert k.run_start(6) == 7
    assert k.run_start(8) == 9
    assert k.run_start(13) == 14


def test_run_start_of_a_known_tick_is_the_start_of_its_run():
    k = Known()
    k.add(3, 5)
    k.add(9, 12)
    assert [k.run_start(t) for t in (3, 4, 5)] == [3, 3, 3]
    assert [k.run_start(t) for t in (9, 10, 11, 12)] == [9, 9, 9, 9]
    k.add(6, 8)  # joins the runs
    assert k.run_start(12) == 3


def test_the_bound_forgets_the_lowest_range():
    k = Known(max_ranges=2)
    k.add(1, 1)
    k.add(3, 3)
    assert k.ranges() == [(1, 1), (3, 3)]
    k.add(5, 5)
    assert k.ranges() == [(3, 3), (5, 5)]
    assert k.run_start(1) == 2  # forgotten: unknown again
    k.add(2, 2)  # a merge does not grow it: nothing forgotten
    assert k.ranges() == [(2, 3), (5, 5)]
    k.add(10, 10)
    assert k.ranges() == [(5, 5), (10, 10)]


def test_the_bound_forgets_a_new_range_below_all_others():
    k = Known(max_ranges=2)
    k.add(5, 5)
    k.add(3, 3)
    k.add(1, 1)  # the new one is the lowest: it goes
    assert k.ranges() == [(3, 3), (5, 5)]


ranges_st = st.lists(
    st.tuples(st.integers(1, TOP), st.integers(-1, 6)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranges_st, st.integers(1, 6))
def test_known_agrees_with_a_set_of_ticks_that_forgets_its_lowest_run(adds, bound):
    model: set[int] = set()
    k = Known(max_ranges=bound)
    for lo, hi in adds:
        k.add(lo, hi)
        model.update(range(lo, hi + 1))
        rs = runs(model)
        if len(rs) > bound:
            lo0, hi0 = rs[0]
            model.difference_update(range(lo0, hi0 + 1))
        assert k.ranges() == runs(model)
        assert len(k.ranges()) <= bound
        for t in range(0, TOP + 10):
            assert k.run_start(t) == naive_run_start(model, t), t


@settings(max_examples=200, deadline=None)
@given(ranges_st, st.randoms(use_true_random=False))
def test_known_does_not_depend_on_the_order_of_adds(adds, rnd):
    a, b = Known(), Known()
    for lo, hi in adds:
        a.add(lo, hi)
    shuffled = list(adds)
    rnd.shuffle(shuffled)
    for lo, hi in shuffled:
        b.add(lo, hi)
    # at most TOP/2 disjoint ranges fit under TOP + 6: well under the bound, nothing forgotten
    assert a.ranges() == b.ranges()


# -- the publisher's claims -----------------------------------------------------------------------


def test_the_first_root_claim_claims_nothing():
    c = Claims()
    assert c.root("p", U, 5) == 4  # (4, 5): no tick strictly between


def test_root_claims_back_to_the_last_route_made_for_that_unit():
    c = Claims()
    c.root("p", U, 5)
    assert c.root("p", U, 9) == 5
    assert c.root("p", U, 12) == 9
    # other units and other pubends have their own chains
    assert c.root("p", V, 12) == 11
    assert c.root("q", U, 12) == 11
    assert c.root("p", V, 20) == 12
    assert c.root("p", U, 20) == 12


def test_a_reordered_root_claim_is_empty_and_does_not_lower_the_chain():
    c = Claims()
    c.root("p", U, 5)
    c.root("p", U, 12)
    assert c.root("p", U, 7) >= 7  # older than the last route made: claims nothing
    assert c.root("p", U, 12) >= 12  # the same tick again: nothing either
    assert c.root("p", U, 15) == 12


# -- a keeper's claims ---------------------------------------------------------------------------


def test_a_child_claim_reaches_back_over_known_ticks():
    c = Claims()
    st_ = c.learn("p", U, 0, 5)  # nothing for U in 1..4, data at 5
    assert st_.known.ranges() == [(1, 5)]
    assert Claims.claim(st_, "a", 5) == 0


def test_a_child_claim_never_reaches_back_over_a_hole():
    c = Claims()
    st_ = c.learn("p", U, 0, 5)
    Claims.claim(st_, "a", 5)
    # another keeper took 6 and 7 (the route claims only 8): this one does not know them
    st_ = c.learn("p", U, 7, 9)
    assert st_.known.ranges() == [(1, 5), (8, 9)]
    assert Claims.claim(st_, "b", 9) == 7  # a child never routed to: back to the hole
    assert Claims.claim(st_, "a", 9) == 7  # routed to at 5, but 6 and 7 are unknown


def test_a_child_claim_never_reaches_back_over_its_last_route():
    c = Claims()
    st_ = c.learn("p", U, 0, 5)
    assert Claims.claim(st_, "a", 5) == 0
    st_ = c.learn("p", U, 5, 9)
    assert st_.known.ranges() == [(1, 9)]
    assert Claims.claim(st_, "a", 9) == 5  # not back over the route made for it at 5
    assert Claims.claim(st_, "b", 9) == 0  # b had none: back over all it knows
    st_ = c.learn("p", U, 9, 12)
    assert Claims.claim(st_, "a", 12) == 9
    assert Claims.claim(st_, "b", 12) == 9


def test_a_silence_claim_counts_as_a_route_made():
    c = Claims()
    st_ = c.learn("p", U, 0, 10)  # silence over 1..10
    assert Claims.claim(st_, "a", 10) == 0
    st_ = c.learn("p", U, 10, 15)
    assert Claims.claim(st_, "a", 15) == 10


def test_a_claim_for_an_unknown_tick_is_empty():
    c = Claims()
    st_ = c.learn("p", U, 0, 5)
    assert Claims.claim(st_, "a", 20) >= 20
    assert Claims.claim(st_, "b", 20) >= 20


def test_a_reordered_claim_is_empty():
    c = Claims()
    st_ = c.learn("p", U, 10, 12)
    assert Claims.claim(st_, "a", 12) == 10
    st_ = c.learn("p", U, 5, 8)  # a late route for an older tick
    assert st_.known.ranges() == [(6, 8), (11, 12)]
    assert Claims.claim(st_, "a", 8) >= 8  # a route was made for a at 12: claims nothing
    assert st_.last["a"] == 12  # and the chain is not lowered
    st_ = c.learn("p", U, 12, 14)
    assert Claims.claim(st_, "a", 14) == 12


def test_a_reordered_route_with_an_empty_claim_adds_no_knowledge():
    c = Claims()
    c.learn("p", U, 0, 10)
    st_ = c.learn("p", U, 12, 11)  # prev >= tick: claims nothing
    assert st_.known.ranges() == [(1, 10)]


ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("learn"), st.integers(0, TOP), st.integers(-3, 8)),
        st.tuples(st.just("claim"), st.sampled_from("abc"), st.integers(1, TOP + 8), st.booleans()),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops_st)
def test_claims_agree_with_a_naive_keeper(script):
    """A keeper with a set of known ticks and each child's last route: every claim reaches back
    exactly to the later of the child's last route and the last unknown tick."""
    c = Claims()
    known: set[int] = set()
    last: dict[str, int] = {}
    for op in script:
        if op[0] == "learn":
            _, prev, span = op
            tick = prev + span
            c.learn("p", U, prev, tick)
            known.update(range(prev + 1, tick + 1))
            continue
        _, kid, tick, data = op
        st_ = c.state("p", U)
        before = last.get(kid, 0)
        prev = Claims.claim(st_, kid, tick)
        assert prev == max(before, naive_run_start(known, tick) - 1)
        assert prev >= before  # never back over the last route made for it
        covered = range(prev + 1, tick if data else tick + 1)
        assert all(t in known for t in covered)  # never back over an unknown tick
        last[kid] = max(before, tick)
    assert c.state("p", U).last == {k: v for k, v in last.items()}


# -- latest, silence, bounds ---------------------------------------------------------------------


def test_latest_reports_the_highest_tick_per_pubend_most_recent_first():
    c = Claims()
    assert c.latest() == []
    c.learn("p1", U, 0, 5)
    c.learn("p2", U, 0, 3)
    c.learn("p1", U, 5, 8)
    assert c.latest() == [("p1", 8), ("p2", 3)]
    c.learn("p2", V, 0, 2)  # lower than p2's highest: no change, not more recent
    assert c.latest() == [("p1", 8), ("p2", 3)]
    c.learn("p2", V, 2, 9)  # any unit of the pubend counts
    assert c.latest() == [("p2", 9), ("p1", 8)]
    c.learn("p1", U, 3, 4)  # late
    assert c.latest() == [("p2", 9), ("p1", 8)]


def test_latest_is_capped_by_limit():
    c = Claims()
    for i in range(1, 6):
        c.learn(f"p{i}", U, 0, i)
    assert c.latest(limit=2) == [("p5", 5), ("p4", 4)]
    assert c.latest(limit=1) == [("p5", 5)]
    assert len(c.latest()) == 5


def test_latest_with_limit_zero_reports_nothing():
    c = Claims()
    c.learn("p", U, 0, 5)
    assert c.latest(limit=0) == []


def test_state_is_per_pubend_and_unit_and_kept():
    c = Claims()
    a = c.state("p", U)
    assert isinstance(a, Resolved)
    assert c.state("p", U) is a
    assert c.learn("p", U, 0, 1) is a
    assert c.state("p", V) is not a
    assert c.state("q", U) is not a


def test_the_state_bound_forgets_the_least_recently_used():
    c = Claims(max_states=2)
    a = c.state("p", U)
    b = c.state("p", V)
    assert c.state("p", U) is a  # a is now the most recently used
    w = c.state("p", ("w",))  # over the bound: b goes
    assert c.state("p", U) is a
    assert c.state("p", ("w",)) is w
    assert c.state("p", V) is not b


def test_learn_counts_as_a_use_of_the_state():
    c = Claims(max_states=2)
    a = c.learn("p", U, 0, 1)
    b = c.learn("p", V, 0, 1)
    c.learn("p", U, 1, 2)
    c.learn("q", U, 0, 1)  # b goes, not a
    assert c.state("p", U) is a
    assert c.state("p", V) is not b


def test_a_forgotten_state_only_shortens_claims():
    c = Claims(max_states=1)
    st_ = c.learn("p", U, 0, 5)
    assert Claims.claim(st_, "a", 5) == 0
    c.learn("p", V, 0, 1)  # U's state goes
    st_ = c.learn("p", U, 5, 9)
    assert st_.known.ranges() == [(6, 9)]
    # the route made for a at 5 is forgotten, and so is what was known below 6: the claim
    # still stops at 5, since 5 is not known any more
    assert Claims.claim(st_, "a", 9) == 5


def test_latest_is_bounded_by_max_states():
    c = Claims(max_states=2)
    for i in range(1, 5):
        c.learn(f"p{i}", U, 0, i)
    assert c.latest() == [("p4", 4), ("p3", 3)]
