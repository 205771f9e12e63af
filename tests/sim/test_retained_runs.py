"""``ges simulate --retained N``: runs that publish retained messages (MQTT's RETAIN) on a few
topics, some clearing theirs, from publishers whose clocks disagree, while replicators crash;
at the end every replicator must keep the last of each topic (ges.sim.scenario's
``_check_retained``)."""

from __future__ import annotations

import json

from ges.durable.retained import RetainedSet
from ges.sim import Faults
from ges.sim.scenario import run_seed
from tests.sim.test_simulator import simulate_cli, topology


def test_every_replicator_keeps_the_last_of_each_topic_through_crashes():
    for seed in range(3):
        o = run_seed(topology("ges-paper"), seed, faults=Faults(), retained=8, commit_ms=50)
        assert o.ok, o.violations[:3]


def test_a_replicator_that_keeps_nothing_is_seen(monkeypatch):
    monkeypatch.setattr(RetainedSet, "offer", lambda self, pubend, tick, event: None)
    o = run_seed(topology("demo"), 1, faults=Faults(kinds=frozenset()), retained=8)
    assert not o.ok
    assert all("retains nothing on r/" in v for v in o.violations), o.violations[:3]


def test_a_replicator_that_keeps_the_first_and_not_the_last_is_seen(monkeypatch):
    offer = RetainedSet.offer

    def first_only(self, pubend, tick, event):
        topic = event.attributes.get("@topic")
        if topic is not None and self.get(topic) is not None:
            return None
        return offer(self, pubend, tick, event)

    monkeypatch.setattr(RetainedSet, "offer", first_only)
    o = run_seed(topology("demo"), 1, faults=Faults(kinds=frozenset()), retained=12)
    assert not o.ok
    assert any("the last published was" in v for v in o.violations), o.violations[:3]


def test_retained_runs_from_the_cli(monkeypatch):
    """``--retained N``: in the JSON and the table; a failed seed's replay line carries it; a
    bad count is one line."""
    done = simulate_cli("--faults", "none", "--json", "--retained", "8")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["retained"] == 8
    table = simulate_cli("--faults", "none", "--retained", "8")
    assert "retained messages: 8 a seed on 4 topics" in table.stdout
    monkeypatch.setattr(RetainedSet, "offer", lambda self, pubend, tick, event: None)
    failed = simulate_cli("--faults", "none", "--json", "--retained", "8")
    assert failed.exit_code == 1
    (example,) = json.loads(failed.stdout)["examples"]
    assert example["replay"].endswith(" --retained 8")
    bad = simulate_cli("--retained", "-1")
    assert bad.exit_code == 2 and "--retained: must be at least 0, not -1" in bad.output
    assert "Traceback" not in bad.output


def test_crash_heavy_runs_from_the_cli(monkeypatch):
    """``--crash-rate R``: more brokers crash (what found a replicator that never caught up on
    a pubend it heard of late); a failed seed's replay line carries it; a bad rate is one
    line."""
    seeds = ("--seed", "3", "--seeds", "2", "--json")
    calm = json.loads(simulate_cli(*seeds, "--crash-rate", "0").stdout)
    heavy = simulate_cli(*seeds, "--crash-rate", "6")
    assert heavy.exit_code == 0, heavy.output
    summary = json.loads(heavy.stdout)
    assert summary["crash_rate"] == 6.0 and summary["faults"]["crashes"] > 0
    assert calm["faults"]["crashes"] == 0
    monkeypatch.setattr(RetainedSet, "offer", lambda self, pubend, tick, event: None)
    failed = simulate_cli(*seeds, "--crash-rate", "6", "--retained", "4")
    (example, *_) = json.loads(failed.stdout)["examples"]
    assert example["replay"].endswith(" --retained 4 --crash-rate 6")
    bad = simulate_cli("--crash-rate", "nan")
    assert bad.exit_code == 2 and "--crash-rate: must be 0 to 20 a second, not nan" in bad.output
