"""A restarted broker's pubend is a new epoch, in the simulator as in the runtime
(ges.sim.commits.EpochLog): the durable sessions' replicators must still get every event of
the epochs before.

The simulator's logs went on in one epoch across restarts until this was modelled. The first
soak with epochs found these; each seed below failed before its fix, on the code right
before it:

* a replicator that restarted read back only the pubends it knew then or got an event of
  later. An earlier epoch of a restarted publisher has no more events, only its end
  announced, so its last events never reached the sessions (the read-back now looks for
  pubends heard of each second, as the retained catch-up does);
* a replicator's own broker's earlier epochs were known to nothing: no subend follows a
  broker's own pubend. A session handed over to it, or restored there, never had the last
  events its broker logged before it restarted.

* (found by the soak of earlier epochs' release, a timing it brought about) a session taken
  over by a replicator and handed on to a third before a pubend heard of since was read for
  it: that pubend's cut was what the replicator had stored for its other sessions, and the
  session never had the ticks below it.

Since earlier epochs are released too (ges.core.release), these seeds also show that they are.
"""

from __future__ import annotations

import attrs
import pytest

from ges.sim import Faults
from ges.sim.scenario import run_seed
from tests.sim.test_simulator import topology

CRASHES = attrs.evolve(Faults(), crash_rate=4.0)


@pytest.mark.parametrize(
    ("name", "seed", "faults", "publishers"),
    [
        ("generated", 120034, Faults(), 4),  # the read-back's look
        ("demo", 130006, CRASHES, 8),  # the read-back's look
        ("demo", 130058, CRASHES, 8),  # its own earlier epoch, handed over to it
        ("figure2", 130015, CRASHES, 8),  # its own earlier epoch
        ("demo", 340027, CRASHES, 8),  # handed on before a pubend heard of since was read
    ],
)
def test_sessions_get_the_earlier_epochs_of_restarted_publishers(name, seed, faults, publishers):
    o = run_seed(
        topology(name),
        seed,
        faults=faults,
        publishers=publishers,
        commit_ms=300,
        own=6,
        durable=3,
        retained=8,
    )
    assert o.ok, "; ".join(o.violations[:3])
    # and the earlier epochs go through release rounds: most are released within the run
    assert o.ended > 0 and o.ended_held < o.ended
