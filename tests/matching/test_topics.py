"""MQTT topic filters (ges.matching.topics): the spec's examples, then intersection, the
candidates covering relies on, and the filter tree, each against brute force on small
universes of topics."""

from __future__ import annotations

import gc
import itertools
import weakref

import pytest

from ges.matching import topics
from ges.matching.topics import TopicTree, candidates, check_filter, intersect, matches

# MQTT 3.1.1 §4.7.1 and 5.0 §4.7.1-4.7.2
SPEC = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/broker", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/broker", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/", False),
]


@pytest.mark.parametrize(("f", "t", "expected"), SPEC)
def test_the_specs_examples(f, t, expected):
    assert matches(f, t) is expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("a/#/b", "last level"),
        ("sport/tennis#", "whole level"),
        ("a+", "whole level"),
        ("a\x00b", "U+0000"),
    ],
)
def test_bad_filters_say_why(text, why):
    assert why in check_filter(text)


@pytest.mark.parametrize("text", ["#", "+", "+/+", "/", "a//b", "$SYS/#", "a/+/#"])
def test_good_filters(text):
    assert check_filter(text) is None


def test_topics_a_client_may_publish():
    assert topics.check_topic("a/b") is None
    assert "wildcards" in topics.check_topic("a/+")
    assert "empty" in topics.check_topic("")


LEVELS = ["a", "b", "$s", ""]
FILTERS = sorted(
    {
        "/".join([*ls, "#"] if many else ls) or "#"
        for n in range(0, 4)
        for ls in itertools.product([*LEVELS, "+"], repeat=n)
        for many in (False, True)
        if (n or many) and "/".join(ls) != ""
    }
    | {"#"}
)
#: every topic of up to five levels over a small alphabet: deep enough for the filters above
#: (candidates go one level past a filter), small enough to check every pair in seconds
UNIVERSE = ["/".join(ls) for n in range(1, 6) for ls in itertools.product([*LEVELS, "c"], repeat=n)]


def test_intersection_is_a_filter_of_exactly_the_common_topics():
    for a, b in itertools.product(FILTERS[::13], FILTERS[::7]):
        both = {t for t in UNIVERSE if matches(a, t) and matches(b, t)}
        f = intersect(a, b)
        if f is None:
            assert not both, (a, b)
        else:
            assert check_filter(f) is None
            assert {t for t in UNIVERSE if matches(f, t)} == both, (a, b, f)


def test_candidates_find_a_topic_inside_one_filter_and_outside_another():
    found = 0
    for within, escape in itertools.product([None, *FILTERS[::11]], FILTERS[::5]):
        inside = [t for t in UNIVERSE if (within is None or matches(within, t))]
        outside = [t for t in inside if not matches(escape, t)]
        got = [t for t in candidates(within, escape, 1) if not matches(escape, t)]
        assert all(within is None or matches(within, t) for t in candidates(within, escape, 1))
        assert bool(got) == bool(outside), (within, escape)
        found += bool(got)
    assert found > 50


def test_candidates_give_distinct_variants_past_excluded_topics():
    got = list(candidates("a/+", "a/b", 3))
    assert len(set(got)) == 3 and not any(matches("a/b", t) for t in got)


def test_the_tree_finds_what_brute_force_finds_and_prunes_on_removal():
    tree = TopicTree()
    for f in FILTERS:
        tree.add(f, f)
    assert len(tree) == len(FILTERS)

    def check(live):
        for t in UNIVERSE:
            out: list = []
            tree.match(t, out)
            assert sorted(out) == sorted(f for f in live if matches(f, t)), t

    check(FILTERS)
    for f in FILTERS[::2]:
        tree.remove(f)
    check(FILTERS[1::2])
    for f in FILTERS[1::2]:
        tree.remove(f)
    assert len(tree) == 0
    assert not tree._root.children and tree._root.many is None


@pytest.mark.parametrize("bound", [3, 4096])
def test_what_the_tree_remembers_follows_every_change_of_filters(monkeypatch, bound):
    """Matched topics are remembered (a bound of 3 forgets at almost every topic): a filter
    added or removed after a topic matched is seen at its next match, and a long topic is
    matched afresh each time."""
    monkeypatch.setattr(topics, "MATCHED", bound)
    topics._forget_matched()
    tree, other = TopicTree(), TopicTree()  # the other's memories share the bound
    other.add("#", "all")
    live: list[str] = []
    long_topic = "a/" + "b" * 300
    for f in dict.fromkeys([*FILTERS[::10], "a/+"]):
        tree.add(f, f)
        live.append(f)
        for t in [*UNIVERSE[::40], "a/b", long_topic]:
            for _ in range(2):  # the second from memory (when it fits)
                out: list = []
                tree.match(t, out)
                assert sorted(out) == sorted(g for g in live if matches(g, t)), (t, live)
                out = []
                other.match(t, out)
                assert out == ([] if t.startswith("$") else ["all"])
            assert topics._matched_size <= bound
            held = sum(t._matched_size for t in topics._remembering)
            assert topics._matched_size == held
    for f in list(live):
        tree.remove(f)
        live.remove(f)
        out = []
        tree.match("a/b", out)
        assert sorted(out) == sorted(g for g in live if matches(g, "a/b"))


def test_a_tree_let_go_is_not_kept_by_what_it_remembers():
    """The memory of matches holds its trees weakly (a connection's tree goes with it), and a
    tree made for one answer remembers nothing."""
    topics._forget_matched()
    tree = TopicTree()
    tree.add("a/#", 1)
    tree.match("a/b", [])
    gone = weakref.ref(tree)
    del tree
    gc.collect()
    assert gone() is None and not list(topics._remembering)
    once = TopicTree(remember=False)
    once.add("a/#", 1)
    out: list = []
    once.match("a/b", out)
    assert out == [1] and not once._matched and not list(topics._remembering)
