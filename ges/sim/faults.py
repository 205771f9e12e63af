"""What the simulator injects: the fault kinds, their rates, and how long each lasts.

A :class:`Faults` value says which kinds are on (``--faults``) and how often each happens; the
simulator draws them from its seeded generator (ges.sim.network, ges.sim.links).
"""

from __future__ import annotations

import attrs

FAULT_KINDS = ("drop", "dup", "delay", "reorder", "link", "crash", "partition", "silent")


@attrs.frozen
class Faults:
    """Which faults a run injects, and how often."""

    kinds: frozenset[str] = frozenset(FAULT_KINDS)
    drop: float = 0.02
    dup: float = 0.02
    max_delay: float = 0.02
    #: link failures, crashes and partitions per simulated second, over the whole network
    link_rate: float = 2.0
    crash_rate: float = 0.5
    partition_rate: float = 0.3
    silent_rate: float = 0.3
    silent_for: tuple[float, float] = (0.5, 4.0)
    #: how long a failed link, crashed broker or partition stays down (seconds, uniform)
    down_for: tuple[float, float] = (0.1, 1.0)

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """``all``, ``none``, or a comma list of :data:`FAULT_KINDS`."""
        spec = spec.strip()
        if spec == "all":
            return cls()
        if spec in ("", "none"):
            return cls(kinds=frozenset())
        kinds = {k.strip() for k in spec.split(",") if k.strip()}
        unknown = kinds - set(FAULT_KINDS)
        if unknown:
            raise ValueError(
                f"unknown fault {sorted(unknown)[0]!r} (use all, none or any of "
                f"{', '.join(FAULT_KINDS)})"
            )
        return cls(kinds=frozenset(kinds))

    def on(self, kind: str) -> bool:
        return kind in self.kinds
