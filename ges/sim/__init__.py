"""The deterministic fault simulator: broker cores over an in-memory network (issue 5)."""

from ges.sim.checker import Checker, Violation
from ges.sim.faults import FAULT_KINDS, Faults
from ges.sim.network import Sim
from ges.sim.scenario import Outcome, run_seed

__all__ = ["FAULT_KINDS", "Checker", "Faults", "Outcome", "Sim", "Violation", "run_seed"]
