"""The simulator with every request in slices (ges.core.work): one work unit per slice, a
millisecond apart, frames, timers and faults in between, a busy client's next message held
back, and changing profiles indexed in graphs of their own — the checker follows every delivery
as in the other simulator tests. (Elsewhere the simulator runs a request to its end at the
moment it comes, which no interleaving can upset.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ges.core import BrokerConfig
from ges.sim import Faults
from ges.sim.scenario import run_seed
from ges.topology import Topology

ROOT = Path(__file__).resolve().parents[2]


# Seeds enough that each topology catches a client's next request run while its previous one
# is still going in (demo: seed 8; redundant-24: seeds 2 and 4) and an old profile's index that
# matches nothing while it changes (most seeds); 20 and 15 caught nothing more.
@pytest.mark.parametrize(("name", "seeds"), [("demo.yaml", 10), ("redundant-24.yaml", 6)])
def test_requests_in_slices_keep_every_guarantee(name, seeds):
    every_change_indexed = BrokerConfig(index_old_profiles=0)  # every change uses _Indexed
    topology = Topology.from_yaml(ROOT / "topologies" / name)
    sliced = 0
    for seed in range(seeds):
        outcome = run_seed(
            topology,
            seed,
            faults=Faults.parse("all"),
            churn=16,
            work_slice=1,
            config=every_change_indexed,
        )
        assert outcome.ok, (seed, outcome.violations[:3])
        sliced += outcome.slices
    assert sliced > 50 * seeds  # requests did go in slices, with the world moving in between
