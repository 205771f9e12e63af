"""Durable clients in the simulator: sessions that go away, come back, are taken over and moved
while every fault is on — each gets every matching event once, in order (issue 20)."""

from __future__ import annotations

from ges.core.replicator import Replicator
from ges.sim import Faults, run_seed
from tests.sim.test_simulator import topology


def test_the_roaming_runs_move_clients_and_crash_their_replicators():
    """The batches below prove something: clients do move, and replicators holding sessions
    do crash and come back, within a few seeds."""
    t = topology("demo")
    moves = crashed_replicators = 0
    for seed in range(6):
        o = run_seed(t, seed, faults=Faults(), durable=3, roams=4)
        assert o.ok, f"seed {seed}: " + "; ".join(o.violations[:5])
        moves += o.moves
        crashed_replicators += o.faults["crashes"]
    assert moves >= 40 and crashed_replicators > 0


def test_a_replicator_that_skips_what_a_session_missed_fails_the_checker(monkeypatch):
    """The checker is not vacuous for sessions: a replicator that resumes every session at its
    newest event (dropping what was kept while its client was away) loses events, and the
    checker says so."""
    real = Replicator._opened

    def skipping(self, live, conn, msg, created, now):
        live.state.acked = max(live.state.acked, self.store.committed)
        return real(self, live, conn, msg, created, now)

    monkeypatch.setattr(Replicator, "_opened", skipping)
    t = topology("demo")
    outcomes = [run_seed(t, s, faults=Faults.parse("none"), durable=3, roams=4) for s in range(3)]
    assert any("gap" in v or "never delivered" in v for o in outcomes for v in o.violations)


def test_a_replicator_whose_count_of_what_it_holds_drifts_fails_the_checker(monkeypatch):
    """Opening a session reports (and retention limits) the events it holds by the
    replicator's own count, never a count of the store; the simulator checks the count against
    the store at the end of every run. A replicator that miscounts acknowledged events is
    caught."""
    real = Replicator._sent_upto

    def miscounting(live, epoch):
        return max(0, real(live, epoch) - 1)

    monkeypatch.setattr(Replicator, "_sent_upto", staticmethod(miscounting))
    t = topology("demo")
    outcomes = [run_seed(t, s, faults=Faults.parse("none"), durable=3, roams=4) for s in range(2)]
    assert any("its count says" in v for o in outcomes for v in o.violations)
