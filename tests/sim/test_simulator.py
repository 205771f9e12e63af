"""The deterministic fault simulator: its checker catches what it must, and reliable delivery
passes it on several topologies with every fault kind on (issue 5's CI batch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from typer.testing import CliRunner

from cli import simulate
from cli.main import app
from ges.matching.model import Conjunction, Profile, profile_to_wire
from ges.matching.syntax import parse_where
from ges.sim import Checker, Faults, Sim, run_seed
from ges.sim import pool as pool_module
from ges.sim.pool import default_jobs, run_seeds, seed_pool
from ges.topology import Topology
from ges.wire import messages as m

ROOT = Path(__file__).resolve().parents[2]

TOPOLOGIES = {
    "demo": lambda: Topology.from_yaml(ROOT / "topologies/demo.yaml"),
    "ges-paper": lambda: Topology.from_yaml(ROOT / "topologies/ges-paper.yaml"),
    "figure2": lambda: Topology.from_yaml(ROOT / "topologies/figure2.yaml"),
    # three levels, two gateways between every linked pair of units (`ges topology generate`,
    # command in its header)
    "generated": lambda: Topology.from_yaml(ROOT / "topologies/redundant-24.yaml"),
}
_cache: dict[str, Topology] = {}


def topology(name: str) -> Topology:
    if name not in _cache:
        _cache[name] = TOPOLOGIES[name]()
    return _cache[name]


# 200 seeded runs in all, every fault kind on, two durable clients roaming in each (issue 20):
# (topology, first seed, seeds)
BATCHES = [
    *[("demo", s, 10) for s in range(0, 60, 10)],
    *[("generated", s, 10) for s in range(0, 60, 10)],
    *[("ges-paper", s, 10) for s in range(0, 50, 10)],
    *[("figure2", s, 10) for s in range(0, 30, 10)],
]


@pytest.fixture(scope="module")
def pool():
    """Worker processes for the batches' seeds, one per core (the suite's other tests use one)."""
    with seed_pool(default_jobs()) as p:
        yield p


@pytest.mark.parametrize(("name", "first", "n"), BATCHES)
def test_reliable_delivery_survives_every_fault(name, first, n, pool):
    t = topology(name)
    injected = dict.fromkeys(("dropped", "duplicated", "link_failures", "crashes"), 0)
    moves = 0
    for o in run_seeds(
        t,
        range(first, first + n),
        jobs=default_jobs(),
        pool=pool,
        faults=Faults(),
        durable=2,
        roams=4,
    ):
        seed = o.seed
        assert o.ok, f"{name} seed {seed}: " + "; ".join(o.violations[:5])
        assert o.published > 0 and o.delivered > 0
        for k in injected:
            injected[k] += o.faults[k]
        moves += o.moves
    # the faults did happen, and the clients moved (a batch where none did would prove nothing)
    assert all(v > 0 for v in injected.values()), injected
    assert moves > n, moves


# Crash-heavy runs (4 broker crashes a second, 8 publishers, group commits up to 300 ms late,
# publishers' own subscriptions, three roaming durable clients, retained messages): the mix
# that found the earlier-epoch faults (tests/sim/test_epochs.py), 12 seeds per topology.
CRASH_HEAVY = dict(
    faults=attrs.evolve(Faults(), crash_rate=4.0),
    publishers=8,
    commit_ms=300,
    own=6,
    durable=3,
    retained=8,
)


@pytest.mark.parametrize("name", ["demo", "generated", "ges-paper", "figure2"])
def test_reliable_delivery_survives_crash_heavy_runs(name, pool):
    crashes = ended = released = 0
    for o in run_seeds(
        topology(name), range(500000, 500012), jobs=default_jobs(), pool=pool, **CRASH_HEAVY
    ):
        assert o.ok, f"{name} seed {o.seed}: " + "; ".join(o.violations[:5])
        crashes += o.faults["crashes"]
        ended += o.ended
        released += o.ended - o.ended_held
    # brokers did crash, publishers among them, and their earlier epochs were released
    assert crashes > 12 and ended > 0 and released > 0, (crashes, ended, released)


def test_a_seed_replays_identically():
    t = topology("demo")
    a = run_seed(t, 7, faults=Faults())
    b = run_seed(t, 7, faults=Faults())
    assert (a.published, a.delivered, a.frames, a.faults, a.violations) == (
        b.published,
        b.delivered,
        b.frames,
        b.faults,
        b.violations,
    )


def test_a_seed_replays_identically_in_another_process():
    """String hashing differs between processes; the run must not."""
    results = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli.main",
                "simulate",
                str(ROOT / "topologies/demo.yaml"),
                "--seed",
                "3",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=False,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        got.pop("wall_seconds")
        results.append(got)
    assert results[0] == results[1]
    # the frames by type add up to the frames, and the release rounds are among them
    by_type = results[0]["frames_by_type"]
    assert sum(by_type.values()) == results[0]["frames"] and by_type["AckAsk"] > 0


def test_the_sufficiency_rule_is_what_keeps_partitions_safe():
    """Seed 000 §3.1: a keeper that filters on a profile set it does not know is complete makes
    subscribers miss events. With the rule off some seeds lose events; with it on none do."""
    t = topology("demo")
    off = []
    for s in range(20):  # until two seeds fail without the rule (three of these 20 do)
        if not run_seed(t, s, faults=Faults(), sufficiency=False).ok:
            off.append(s)
            if len(off) == 2:
                break
    assert off, "no seed failed without the sufficiency rule: the comparison shows nothing"
    assert all(run_seed(t, s, faults=Faults()).ok for s in off)


def test_best_effort_delivery_fails_the_checker_under_drops():
    """The checker is not vacuous: without reliable delivery, dropped frames are lost events."""
    t = topology("demo")
    outcomes = [run_seed(t, s, faults=Faults.parse("drop"), reliable=False) for s in range(3)]
    assert any(not o.ok for o in outcomes)
    assert any("gap" in v or "never delivered" in v for o in outcomes for v in o.violations)


def test_reliable_delivery_without_faults_delivers_everything_matching():
    t = topology("ges-paper")
    o = run_seed(t, 1, faults=Faults.parse("none"))
    assert o.ok and o.published == 200 and o.delivered > 0


# -- the failure detector on simulated time ----------------------------------------------------------


def _pair() -> tuple[Sim, list]:
    """Two brokers of demo.yaml's cluster c1 linked, a subscriber at b2 to everything."""
    t = topology("demo")
    got: list = []
    sim = Sim(
        t,
        seed=1,
        faults=Faults.parse("none"),
        reliable=False,
        on_deliver=lambda b, conn, msg, now: got.extend((now, it.tick) for it in msg.items),
    )
    everything = Profile("all", (Conjunction(()),))
    sim.client("b2", 1, m.Subscribe(1, profile_to_wire(everything), "all"))
    sim.run_until(1.0)
    return sim, got


def test_a_silence_shorter_than_the_detectors_timeout_delays_frames_and_loses_none():
    sim, got = _pair()
    sim.silence("b1", "b2", 1.0)
    for i in range(5):
        sim.at(1.1 + i * 0.1, sim.client, "b1", 9, m.Publish(i + 1, [m.Event({"i": i})]))
    sim.run_until(4.0)
    assert [t for _, t in got] == [1, 2, 3, 4, 5]
    assert all(2.0 <= at < 2.01 for at, _ in got)  # held until the link carried frames again
    assert sim.stats["suspected"] == 0


def test_a_link_silent_past_the_timeout_is_dropped_by_the_detector_and_redialled():
    sim, got = _pair()
    config = sim.config
    sim.silence("b1", "b2", 5.0)
    sim.at(1.1, sim.client, "b1", 9, m.Publish(1, [m.Event({"i": 0})]))
    sim.run_until(1.0 + config.suspect_after + 0.1)
    assert sim.stats["suspected"] == 1  # one end suspected it and closed it
    assert "b2" not in sim.cores["b1"].links_up and "b1" not in sim.cores["b2"].links_up
    sim.run_until(5.9)
    assert "b2" not in sim.cores["b1"].links_up  # dialled every REDIAL s, unanswered
    sim.run_until(6.5)
    assert "b2" in sim.cores["b1"].links_up  # the silence ended: the dial got through
    sim.client("b1", 9, m.Publish(2, [m.Event({"i": 1})]))
    sim.run_until(7.0)
    # best effort: the event sent into the silent link went with it; the next one arrives
    assert [t for _, t in got] == [2]


# -- the checker itself -----------------------------------------------------------------------------


def _checker(where: str = "bucket < 50") -> tuple[Checker, tuple]:
    c = Checker()
    key = ("b1", 1, 1)
    c.subscribe(key, Profile("p", (Conjunction((parse_where(where),)),)))
    c.subscribed(key, 0.0)
    c.publish("b2~1", 1, [{"bucket": b} for b in (10, 60, 20, 30, 40)], 0.5)
    return c, key


def test_checker_accepts_exactly_the_matching_ticks_in_order():
    c, key = _checker()
    c.deliver(key, "b2~1", [(1, {"bucket": 10}), (3, {"bucket": 20})], 1.0)
    c.deliver(key, "b2~1", [(4, {"bucket": 30}), (5, {"bucket": 40})], 1.1)
    c.finish(2.0, start_by=0.0)
    assert c.ok and c.delivered == 4


@pytest.mark.parametrize(
    ("deliveries", "what"),
    [
        ([(1, {"bucket": 10}), (4, {"bucket": 30})], "gap: 3 skipped"),
        ([(1, {"bucket": 10}), (1, {"bucket": 10})], "again"),
        ([(3, {"bucket": 20}), (1, {"bucket": 10})], "out of order"),
        ([(2, {"bucket": 60})], "does not match"),
        ([(1, {"bucket": 11})], "altered"),
        ([(9, {"bucket": 1})], "never published"),
        ([(1, {"bucket": 10}), (3, {"bucket": 20})], "never delivered: 4, 5"),
        ([(3, {"bucket": 20}), (4, {"bucket": 30}), (5, {"bucket": 40})], "started late"),
    ],
)
def test_checker_catches(deliveries, what):
    c, key = _checker()
    c.deliver(key, "b2~1", deliveries, 1.0)
    c.finish(2.0, start_by=0.0)
    assert not c.ok
    assert any(what in str(v) for v in c.violations), c.violations


def test_checker_ignores_a_subscription_that_ended():
    c, key = _checker()
    c.deliver(key, "b2~1", [(1, {"bucket": 10})], 1.0)
    c.gone(key)
    c.finish(2.0, start_by=0.0)
    assert c.ok


def _changed(c: Checker, key: tuple, where: str, now: float) -> None:
    c.subscribe(key, Profile("q", (Conjunction((parse_where(where),)),)))
    c.subscribed(key, now)


def test_checker_requires_a_subscription_to_complete():
    c = Checker()
    c.subscribe(("b1", 1, 1), Profile("p", (Conjunction((parse_where("bucket < 50"),)),)))
    c.subscribed(("b1", 1, 1), 0.1, complete=False)
    c.finish(2.0)
    assert any("never completed" in str(v) for v in c.violations), c.violations


def test_checker_flags_what_a_change_loses_on_a_pubend_the_old_profile_got_nothing_from():
    """The old profile completed at 0.0 and got nothing from b2~1; the new one (bucket < 30)
    gets only tick 4: ticks 1 and 3, which both match and were published after the old one's
    SubAck, were lost across the change."""
    c, key = _checker()
    _changed(c, key, "bucket < 35", 0.6)
    c.deliver(key, "b2~1", [(4, {"bucket": 30})], 1.0)
    c.finish(2.0)
    assert any("lost across the change: 1, 3" in str(v) for v in c.violations), c.violations


def test_checker_flags_a_tick_delivered_again_across_a_change():
    c, key = _checker()
    c.deliver(key, "b2~1", [(1, {"bucket": 10}), (3, {"bucket": 20})], 1.0)
    _changed(c, key, "bucket < 35", 1.1)
    c.deliver(key, "b2~1", [(3, {"bucket": 20}), (4, {"bucket": 30})], 1.2)
    c.finish(2.0)
    assert any("at or before 3" in str(v) for v in c.violations), c.violations


def test_checker_accepts_a_change_that_lost_nothing():
    c, key = _checker()
    c.deliver(key, "b2~1", [(1, {"bucket": 10})], 1.0)
    _changed(c, key, "bucket < 35", 1.1)
    c.deliver(key, "b2~1", [(3, {"bucket": 20}), (4, {"bucket": 30})], 1.2)
    c.finish(2.0)
    assert c.ok, c.violations


# -- ges simulate's progress on stderr --------------------------------------------------------


def simulate_cli(*args: str):
    topology_file = ROOT / "topologies/figure2.yaml"
    return CliRunner().invoke(app, ["simulate", str(topology_file), "--events", "20", *args])


def progress_lines(result) -> list[str]:
    return [ln for ln in result.stderr.splitlines() if ln.startswith("seed ")]


def test_simulate_json_shows_progress_on_stderr_and_one_object_on_stdout(monkeypatch):
    monkeypatch.setattr(simulate, "PROGRESS_LINE_EVERY", 0.0)  # a line for every seed
    result = simulate_cli("--seed", "5", "--seeds", "3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["seeds"] == 3  # stdout: the one JSON object, nothing else
    lines = progress_lines(result)
    assert [ln.split(" · ")[0] for ln in lines] == ["seed 5 ok", "seed 6 ok", "seed 7 ok"]
    assert lines[-1].split(" · ")[1].startswith("3/3 seeds, 0 failed, ")


def test_simulate_progress_lines_are_sparse_but_name_every_failed_seed(monkeypatch):
    real = pool_module.run_seed

    def seed_6_fails(topology, seed, **options):
        outcome = real(topology, seed, **options)
        if seed == 6:
            return attrs.evolve(outcome, ok=False, violations=("made up for the test",))
        return outcome

    monkeypatch.setattr(pool_module, "run_seed", seed_6_fails)
    result = simulate_cli("--seed", "5", "--seeds", "4", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["failed_seeds"] == [6]
    # the first seed, the failed one and the last; the others fall within 10 s of a line
    assert [ln.split(" · ")[0] for ln in progress_lines(result)] == [
        "seed 5 ok",
        "seed 6 FAILED (1 violation)",
        "seed 8 ok",
    ]
