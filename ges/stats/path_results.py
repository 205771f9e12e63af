"""What ``ges stats paths`` reports about one topology, and seed 004 §3's reference curves.

A :class:`PathStats` holds the pair counts the job found (per hop count, and per link level in a
:class:`LevelCounts`) and derives the rest from them: the average path length, the diameter, the
mean degree k, each count's share of the pairs, and its JSON form. ``ges.stats.paths`` defines
what each count counts. :func:`regular_reference` and :func:`random_reference` are the two curves
seed 004 §3 sets a small world between: a regular graph's path length n / 2k and a random
graph's log n / log k, for n brokers and k links per broker.
"""

from __future__ import annotations

import math

import attrs


@attrs.frozen
class LevelCounts:
    """Pairs per link level ℓ (0 = inside clusters, ≥ 1 = gateways); see the module docstring."""

    level: int
    links: int
    must_cross: int
    may_cross: int
    top_level: int
    common_unit: int


@attrs.frozen
class PathStats:
    """The path figures of one topology (counts exact for the sources used)."""

    topology: str
    brokers: int
    links: int
    sources: int
    exact: bool
    seed: int | None
    pairs: int
    unreachable_pairs: int
    #: hop count d → ordered pairs d hops apart
    hops: dict[int, int]
    levels: tuple[LevelCounts, ...]
    clustering_coefficient: float
    #: of the Spark run that computed it (one run for all the topologies of path_stats_many)
    wall_seconds: float
    file: str | None = None

    @property
    def mode(self) -> str:
        return "exact" if self.exact else "sampled"

    @property
    def avg_path_length(self) -> float | None:
        if not self.pairs:
            return None
        return sum(d * c for d, c in self.hops.items()) / self.pairs

    @property
    def diameter(self) -> int | None:
        return max(self.hops) if self.hops else None

    @property
    def mean_degree(self) -> float:
        """k: links per broker (each link counts at both ends)."""
        return 2 * self.links / self.brokers if self.brokers else 0.0

    @property
    def regular_path_length(self) -> float | None:
        """Seed 004 §3: a regular graph's path length, n / 2k."""
        return regular_reference(self.brokers, self.mean_degree)

    @property
    def random_path_length(self) -> float | None:
        """Seed 004 §3: a random graph's path length, log n / log k."""
        return random_reference(self.brokers, self.mean_degree)

    def share(self, count: int) -> float | None:
        return count / self.pairs if self.pairs else None

    def to_dict(self) -> dict:
        """The JSON form: ``brokers``, ``avg_path_length``, ``diameter``, … (README)."""
        return {
            "topology": self.topology,
            "file": self.file,
            "brokers": self.brokers,
            "links": self.links,
            "mean_degree": _round(self.mean_degree),
            "mode": self.mode,
            "sources": self.sources,
            "seed": self.seed,
            "pairs": self.pairs,
            "unreachable_pairs": self.unreachable_pairs,
            "avg_path_length": _round(self.avg_path_length),
            "diameter": self.diameter,
            "diameter_is_lower_bound": not self.exact,
            "clustering_coefficient": _round(self.clustering_coefficient),
            "hops": {str(d): c for d, c in sorted(self.hops.items())},
            "hop_shares": {str(d): _round(self.share(c)) for d, c in sorted(self.hops.items())},
            "gateway_levels": [
                {
                    "level": lv.level,
                    "links": lv.links,
                    "must_cross": _round(self.share(lv.must_cross)),
                    "may_cross": _round(self.share(lv.may_cross)),
                    "top_level": _round(self.share(lv.top_level)),
                    "common_unit": _round(self.share(lv.common_unit)),
                    "pairs": {
                        "must_cross": lv.must_cross,
                        "may_cross": lv.may_cross,
                        "top_level": lv.top_level,
                        "common_unit": lv.common_unit,
                    },
                }
                for lv in self.levels
            ],
            "reference": {
                "regular_n_over_2k": _round(self.regular_path_length),
                "random_log_n_over_log_k": _round(self.random_path_length),
            },
            "wall_seconds": round(self.wall_seconds, 3),
        }


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def regular_reference(n: float, k: float) -> float | None:
    """n / 2k: seed 004 §3's path length of a regular graph (each node linked to k nearest)."""
    return n / (2 * k) if k > 0 else None


def random_reference(n: float, k: float) -> float | None:
    """log n / log k: seed 004 §3's path length of a random graph (undefined for k ≤ 1)."""
    return math.log(n) / math.log(k) if k > 1 and n > 1 else None
