"""The topology generator: deterministic by seed, always valid, redundant gateways when asked."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ges.errors import UserInputError
from ges.topology import Topology
from ges.topology.generate import GeneratorSpec, dump_yaml, generate


def pair_links(t: Topology) -> dict[tuple, list[tuple[str, str]]]:
    """Gateways grouped by the pair of sibling units they join: (unit A, unit B) -> [(a, b)]."""
    out: dict[tuple, list[tuple[str, str]]] = defaultdict(list)
    for link in t.gateways():
        lv = t.link_level(link.a, link.b)
        ua, ub = t.context(link.a, lv), t.context(link.b, lv)
        if ua > ub:
            ua, ub = ub, ua
            a, b = link.b, link.a
        else:
            a, b = link.a, link.b
        out[(ua, ub)].append((a, b))
    return out


def test_same_seed_same_topology():
    kw = dict(levels=3, members=(2, 3, 4, 5), links_per_pair=3, redundancy=2, seed=7)
    assert generate(**kw).to_dict() == generate(**kw).to_dict()
    assert generate(**kw) == generate(**kw)


def test_other_seed_other_links():
    kw = dict(levels=3, members=(2, 3, 4, 5), links_per_pair=3, redundancy=2)
    a, b = generate(seed=1, **kw), generate(seed=2, **kw)
    assert list(a.brokers) == list(b.brokers)  # the shape is the parameters'
    assert a.links != b.links  # the wiring is the seed's


def test_shape_names_and_ports():
    t = generate(levels=3, members=(2, 2, 3, 4), base_port=9000, name="shape", seed=3)
    assert t.name == "shape"
    assert len(t.brokers) == 2 * 2 * 3 * 4
    assert list(t.brokers)[:5] == ["b1", "b2", "b3", "b4", "b5"]
    assert t.broker("b1").unit == ("SSC-1", "SC-1-1", "c1-1-1")
    assert t.broker("b5").unit == ("SSC-1", "SC-1-1", "c1-1-2")
    assert t.broker("b48").unit == ("SSC-2", "SC-2-2", "c2-2-3")
    assert [t.broker(b).port for b in t.brokers] == list(range(9000, 9048))
    assert t.depth == 3
    assert t.warnings == ()


def test_one_number_means_every_level():
    t = generate(levels=2, members=3, seed=0)
    assert len(t.brokers) == 27
    assert len([u for u in t.units if len(u) == 1]) == 3


def test_names_for_deeper_hierarchies():
    t = generate(levels=4, members=2, seed=0)
    assert t.broker("b1").unit == ("SSSC-1", "SSC-1-1", "SC-1-1-1", "c1-1-1-1")


@pytest.mark.parametrize(
    "kw",
    [
        dict(levels=1, members=1),
        dict(levels=1, members=(1, 5)),
        dict(levels=1, members=(5, 1), links_per_pair=4),  # pairs of 1-broker clusters: 1 link each
        dict(levels=2, members=(3, 2, 2), links_per_pair=1, redundancy=1),
        dict(levels=3, members=(2, 2, 2, 2), links_per_pair=2, redundancy=2),
        dict(levels=3, members=(1, 1, 1, 64)),
        dict(levels=2, members=(64, 1, 1), chords=0),
        dict(levels=3, members=(2, 3, 4, 5), links_per_pair=5, redundancy=5, chords=2),
        dict(levels=2, members=(4, 4, 4), replicator_levels=(1, 2)),
    ],
)
def test_valid_for_parameter_sets(kw):
    t = generate(seed=11, **kw)
    assert t.warnings == ()
    assert Topology.from_dict(t.to_dict()) == t


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    levels=st.integers(1, 3),
    sizes=st.lists(st.integers(1, 5), min_size=4, max_size=4),
    links_per_pair=st.integers(1, 4),
    redundancy=st.integers(1, 4),
    chords=st.sampled_from([0, 0.25, 1.0]),
    seed=st.integers(0, 2**32),
)
def test_always_valid_and_pairs_have_their_links(
    levels, sizes, links_per_pair, redundancy, chords, seed
):
    members = tuple(sizes[: levels + 1])
    t = generate(
        levels=levels,
        members=members,
        links_per_pair=links_per_pair,
        redundancy=redundancy,
        chords=chords,
        seed=seed,
    )
    assert t.warnings == ()  # every unit connected inside itself
    for (ua, ub), links in pair_links(t).items():
        side_a, side_b = len(t.units[ua]), len(t.units[ub])
        assert len(links) == min(links_per_pair, side_a * side_b)
        k = len(links)
        assert len({a for a, _ in links}) >= min(redundancy, k, side_a)
        assert len({b for _, b in links}) >= min(redundancy, k, side_b)


def test_redundancy_two_gives_distinct_gatekeepers_on_both_sides():
    t = generate(levels=3, members=(2, 3, 3, 4), links_per_pair=2, redundancy=2, seed=5)
    pairs = pair_links(t)
    assert pairs
    for (ua, ub), links in pairs.items():
        assert len(links) == 2, (ua, ub)
        (a1, b1), (a2, b2) = links
        assert a1 != a2 and b1 != b2, (ua, ub, links)


def test_redundancy_one_allows_a_shared_gatekeeper():
    # with one gatekeeper allowed, some pair somewhere reuses a broker (seeded, so stable)
    t = generate(levels=2, members=(4, 4, 4), links_per_pair=3, redundancy=1, seed=2)
    shared = [
        links
        for links in pair_links(t).values()
        if len({a for a, _ in links}) < len(links) or len({b for _, b in links}) < len(links)
    ]
    assert shared


def test_replicators_one_per_unit_at_its_first_broker():
    t = generate(levels=3, members=(2, 2, 2, 3), replicator_levels=(2,), seed=0)
    assert len(t.replicators) == 4
    for r in t.replicators:
        assert len(r.unit) == 2
        assert r.broker == t.units[r.unit][0]


def test_generated_file_round_trips(tmp_path):
    spec = GeneratorSpec(levels=3, members=(2, 2, 3, 4), replicator_levels=(2, 3), seed=9)
    t = spec.build()
    path = tmp_path / "g.yaml"
    text = dump_yaml(t, path, spec=spec)
    assert path.read_text() == text
    assert Topology.from_yaml(path) == t
    assert spec.command(output=path) in text
    assert text.startswith("# GES topology")


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        (dict(levels=0), "levels must be at least 1"),
        (dict(levels=1000, members=1), "levels must be at most 16"),
        (dict(levels=1, members=65), "members must be in 1..64"),
        (dict(levels=2, members=(2, 3, 70)), "brokers per cluster must be in 1..64"),
        (dict(levels=2, members=(65, 3, 2)), "top-level units must be in 1..64"),
        (dict(levels=2, members=(2, 3)), "needs 1 or levels+1 = 3 numbers"),
        (dict(levels=1, members=(2, 3), links_per_pair=0), "links_per_pair must be at least 1"),
        (dict(levels=1, members=(2, 3), redundancy=0), "redundancy must be at least 1"),
        (dict(levels=1, members=(2, 3), chords=-1), "chords must be in"),
        (dict(levels=2, members=2, replicator_levels=(3,)), "replicator level must be in 1..2"),
        (dict(levels=3, members=64, base_port=7000), "over the generator's limit"),
        (dict(levels=2, members=8, base_port=65500), "past 65535"),
        (dict(levels=1, members=2, name=" "), "name must be a non-empty string"),
        (dict(levels=1, members=2, block_limit=3, links_per_pair=1), None),
    ],
)
def test_bad_parameters_are_user_errors(kw, fragment):
    if fragment is None:  # a smaller block limit is fine while the members fit
        generate(**kw)
        return
    with pytest.raises(UserInputError, match=re.escape(fragment)):
        generate(**kw)


# -- through the CLI ------------------------------------------------------------------------------


def test_cli_generate_to_file(ges, tmp_path):
    path = tmp_path / "g.yaml"
    result = ges(
        "topology", "generate", "--levels", "2", "--members", "3,3,4", "--links-per-pair", "2",
        "--redundancy", "2", "--replicators", "2", "--seed", "4", "--name", "g", "--base-port",
        "30000", "-o", path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "36 brokers" in result.stderr and str(path) in result.stderr
    t = Topology.from_yaml(path)
    assert t.name == "g" and len(t.brokers) == 36 and len(t.replicators) == 3
    assert t.broker("b1").port == 30000
    assert ges("topology", "check", path).exit_code == 0


def test_cli_generate_to_stdout_is_deterministic(ges):
    args = ["topology", "generate", "--levels", "2", "--members", "2,3,3", "--seed", "8"]
    first, second = ges(*args), ges(*args)
    assert first.exit_code == 0
    assert first.stdout == second.stdout
    t = Topology.from_yaml_text(first.stdout)
    assert len(t.brokers) == 18
    assert "stdout" in first.stderr


def test_cli_header_command_reproduces_the_file(ges, tmp_path):
    path = tmp_path / "g.yaml"
    ges("topology", "generate", "--levels", "2", "--members", "2,2,3", "--seed", "5", "-o", path)
    text = path.read_text()
    command = next(line for line in text.splitlines() if "ges topology generate" in line)
    args = command.split()[1:]  # drop the leading "#"
    assert args[:3] == ["ges", "topology", "generate"]
    again = tmp_path / "again.yaml"
    args = [str(again) if a == str(path) else a for a in args[1:]]
    assert ges(*args).exit_code == 0
    assert again.read_text() == text.replace(str(path), str(again))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--levels", "0"], "levels must be at least 1"),
        (["--members", "65"], "block limit"),
        (["--members", "2,x"], "--members: expected whole numbers"),
        (["--replicators", "two"], "--replicators: expected whole numbers"),
        (["--levels", "2", "--members", "2,2"], "levels+1 = 3 numbers"),
        (["--base-port", "65535", "--members", "2"], "past 65535"),
        (["--members", "2", "-o", "/nonexistent-dir/x.yaml"], "cannot write"),
    ],
)
def test_cli_bad_parameters_are_one_line_exit_2(ges, args, fragment):
    result = ges("topology", "generate", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    message = result.stderr.strip()
    assert "\n" not in message and message.startswith("error: ")
    assert fragment in message
