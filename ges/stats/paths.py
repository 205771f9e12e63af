"""Path lengths of a broker network on Spark: seed 004 §3's small-world question, measured.

Seed 004 §3 conjectures that a GES broker network has logarithmic path lengths: clusters wired
densely inside and joined by a few gateways make a *small world* (Watts & Strogatz), whose path
length is near a random graph's ``log n / log k`` while its clustering stays near a regular
graph's, whose path length is ``n / 2k`` (n brokers, k links per broker). :func:`path_stats`
measures a topology's figures so ``ges stats paths`` can set them beside those two curves.

The broker graph is the topology's links, undirected and unweighted (a path's length is its hop
count). The figures, over the ordered pairs (s, t), s ≠ t, of a source s and a broker t reachable
from it (every broker is a source unless sampled, see below):

* **hops** — how many pairs are d hops apart, for each d ≥ 1 (ordered pairs: each unordered pair
  counts twice when both ends are sources); ``avg_path_length`` is their mean, ``diameter`` the
  largest d (with sampled sources, the largest eccentricity among them: a lower bound).
* **gateway levels** — a link whose lowest common unit is level ℓ+1 is a level-ℓ link; ℓ ≥ 1 are
  gateways (``Topology.link_level``). A pair may have several shortest paths, so per level ℓ:

  - ``must_cross``: pairs *every* shortest path of which uses a level-ℓ link;
  - ``may_cross``: pairs *some* shortest path of which uses one;
  - ``top_level``: pairs whose shortest paths must climb to ℓ and no higher — the lowest, over
    their shortest paths, of the highest link level on the path (these sum to all pairs);
  - ``common_unit``: pairs whose lowest common unit is level ℓ+1 — what the hierarchy alone says
    a path must climb to. ``top_level`` is never below it; where it is above, shortest paths leave
    the common unit and come back (a unit badly connected inside). This one is arithmetic on the
    hierarchy, not a BFS figure.

  All four are exact, computed as the BFS goes: a broker t first reached at distance d+1 takes,
  over its neighbours u at distance d, the AND (must) and the OR (may) of u's level sets with the
  level of the link u–t added, and the minimum of max(u's top level, link level).
* **clustering coefficient** — the mean over all brokers of the share of a broker's neighbour
  pairs that are linked to each other; a broker with fewer than two neighbours counts as 0.
* pairs no path joins would be counted apart (``unreachable_pairs``) and left out of the
  figures; a valid topology is connected (``Topology`` refuses others), so this stays 0.

Exact up to :data:`EXACT_UP_TO` brokers (all n sources); beyond, from ``sample`` sources drawn at
random with ``seed`` (:func:`pick_sources`) — the result says which (``mode``, ``sources``).
``ges.stats._paths_reference`` computes the same figures in plain Python, for the tests and as
the baseline of ``bench/stats_paths.py``.

This module prepares a run and turns its counts into results: which brokers are sources,
their batches, and the arithmetic on the hierarchy. How Spark computes the counts is
``ges.stats.path_bfs``; the result values and the reference curves are
``ges.stats.path_results``.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs

from ges.errors import UserInputError
from ges.stats.path_bfs import Network, Totals
from ges.stats.path_results import LevelCounts, PathStats
from ges.topology import Topology, broker_order_key

#: All n sources (exact figures) up to this many brokers: 5,000² ordered pairs is ~25 M rows of
#: BFS state over the whole run, a few minutes of a 2-core machine.
EXACT_UP_TO = 5_000
#: Sources drawn beyond EXACT_UP_TO: the mean path length's standard error shrinks as
#: 1/sqrt(sources · n), so a thousand sources give it to a few thousandths of a hop.
DEFAULT_SAMPLE = 1_000
#: Most (source, broker) pairs one BFS run holds: the sources go in batches of BATCH_PAIRS // n,
#: so no layer of the frontier outgrows a single machine's memory (4,096² fits in one batch).
BATCH_PAIRS = 1 << 24
#: Runtime SQL settings while the BFS runs (the previous values come back after). Adaptive
#: execution re-plans every layer and, on Spark 4.3, adds a shuffle the source-partitioned plan
#: does not need: the layers got about 1.7× slower with it on.
BFS_SQL_CONF = {"spark.sql.adaptive.enabled": "false"}


def pick_sources(topology: Topology, sample: int, seed: int) -> list[str]:
    """``sample`` distinct brokers drawn with ``random.Random(seed)``, in broker order."""
    ids = sorted(topology.brokers, key=broker_order_key)
    if sample >= len(ids):
        return ids
    chosen = set(random.Random(seed).sample(ids, sample))
    return [b for b in ids if b in chosen]


def path_stats(spark, topology: Topology, *, file: str | None = None, **options) -> PathStats:
    """The figures of one topology: :func:`path_stats_many` of ``[topology]``.

    ``sources`` (if given) is the one topology's list of source brokers; the other options are
    :func:`path_stats_many`'s.
    """
    sources = options.pop("sources", None)
    return path_stats_many(
        spark,
        [topology],
        files=[file],
        sources=None if sources is None else [sources],
        **options,
    )[0]


def path_stats_many(
    spark,
    topologies: Sequence[Topology],
    *,
    exact_up_to: int = EXACT_UP_TO,
    sample: int = DEFAULT_SAMPLE,
    seed: int = 0,
    sources: Sequence[Sequence[str] | None] | None = None,
    batch_pairs: int = BATCH_PAIRS,
    sql_conf: Mapping[str, str] | None = None,
    on_step: Callable[[str], None] | None = None,
    files: Sequence[str | None] | None = None,
) -> list[PathStats]:
    """Path lengths, hop distribution, gateway-level shares and clustering of each topology.

    The topologies go through Spark together, as one graph of disjoint parts: the BFS takes as
    many steps as the largest diameter, not the sum of them, which is what several topologies of
    growing size cost on a few cores (each step is a Spark job).

    Args:
        spark: the SparkSession to run on (``ges.stats.spark.session``).
        topologies: the broker networks.
        exact_up_to: every broker is a source (exact figures) in a topology of up to this many
            brokers.
        sample: beyond that, how many sources are drawn (with ``seed``).
        seed: seeds the draw of sampled sources (:func:`pick_sources`).
        sources: per topology, its source brokers or None; a list overrides the two above (the
            figures count as exact only when it holds every broker).
        batch_pairs: most (source, broker) pairs in one BFS run; sources go in batches.
        sql_conf: runtime SQL settings while Spark runs (default :data:`BFS_SQL_CONF`; ``{}``
            keeps the session's).
        on_step: called with a short description as the BFS advances (for a progress display).
        files: per topology, the file it came from, carried into its result.

    Returns:
        A :class:`PathStats` per topology, in order (see the module docstring for what each
        figure counts); ``wall_seconds`` is the time of the whole run.

    Error handling:
        ``sample`` or ``batch_pairs`` below 1, or a source that is no broker, raise
        ``UserInputError``; Spark's own failures propagate.
    """
    started = time.perf_counter()
    if not topologies:
        return []
    if sample < 1:
        raise UserInputError(f"--sample: must be at least 1, not {sample}")
    if batch_pairs < 1:
        raise UserInputError(f"batch_pairs: must be at least 1, not {batch_pairs}")
    step = on_step or (lambda _text: None)
    parts: list[Part] = []
    offset = 0
    for i, topology in enumerate(topologies):
        wanted = sources[i] if sources is not None else None
        part = Part.of(i, topology, offset, wanted, exact_up_to, sample, seed)
        parts.append(part)
        offset += len(part.ids)

    # sources of all topologies, in batches of at most batch_pairs (source, broker) pairs
    batches: list[list[tuple[int, int]]] = [[]]
    held = 0
    for part in parts:
        for b in part.sources:
            if batches[-1] and held + len(part.ids) > batch_pairs:
                batches.append([])
                held = 0
            batches[-1].append((part.graph, part.offset + part.index[b]))
            held += len(part.ids)
    totals = [Totals(part.topology.depth + 1) for part in parts]
    with _runtime_conf(spark, BFS_SQL_CONF if sql_conf is None else sql_conf):
        network = Network(spark, parts)
        try:
            step("clustering")
            clustering = network.clustering()
            for i, batch in enumerate(batches):
                label = f"sources {i + 1}/{len(batches)}, " if len(batches) > 1 else ""
                network.bfs(batch, totals, lambda d, label=label: step(f"{label}distance {d}"))
        finally:
            network.release()
    wall = time.perf_counter() - started
    return [
        part.result(totals[part.graph], clustering.get(part.graph, 0.0), wall, files)
        for part in parts
    ]


@attrs.frozen
class Part:
    """One topology of a run: its brokers' integer ids (from ``offset``) and its sources."""

    graph: int
    topology: Topology
    offset: int
    ids: tuple[str, ...]
    index: Mapping[str, int]
    sources: tuple[str, ...]
    seed: int | None

    @classmethod
    def of(cls, graph, topology, offset, wanted, exact_up_to, sample, seed) -> Part:
        ids = tuple(sorted(topology.brokers, key=broker_order_key))
        index = {b: i for i, b in enumerate(ids)}
        used_seed = None
        if wanted is not None:
            unknown = [s for s in wanted if s not in index]
            if unknown:
                raise UserInputError(f"{topology.source}: unknown source broker {unknown[0]!r}")
            chosen = sorted(set(wanted), key=broker_order_key)
        elif len(ids) <= exact_up_to:
            chosen = list(ids)
        else:
            chosen = pick_sources(topology, sample, seed)
            used_seed = seed if len(chosen) < len(ids) else None
        return cls(graph, topology, offset, ids, index, tuple(chosen), used_seed)

    def result(self, totals: Totals, clustering: float, wall: float, files) -> PathStats:
        topology, n = self.topology, len(self.ids)
        common = _common_unit_pairs(topology, self.sources)
        link_levels = [0] * (topology.depth + 1)
        for link in topology.links:
            link_levels[topology.link_level(link.a, link.b)] += 1
        return PathStats(
            topology=topology.name,
            brokers=n,
            links=len(topology.links),
            sources=len(self.sources),
            exact=len(self.sources) == n,
            seed=self.seed,
            pairs=totals.pairs,
            unreachable_pairs=len(self.sources) * (n - 1) - totals.pairs,
            hops=dict(sorted(totals.hops.items())),
            levels=tuple(
                LevelCounts(
                    level=lv,
                    links=link_levels[lv],
                    must_cross=totals.must[lv],
                    may_cross=totals.may[lv],
                    top_level=totals.top[lv],
                    common_unit=common[lv],
                )
                for lv in range(topology.depth + 1)
            ),
            clustering_coefficient=clustering,
            wall_seconds=wall,
            file=files[self.graph] if files is not None else None,
        )


@contextlib.contextmanager
def _runtime_conf(spark, settings: Mapping[str, str]) -> Iterator[None]:
    """Set runtime SQL settings for the body, then put the previous values back."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _common_unit_pairs(topology: Topology, sources: Sequence[str]) -> list[int]:
    """Per level ℓ, the pairs (s, t) whose lowest common unit is level ℓ+1.

    Arithmetic on the hierarchy, no BFS (a topology is connected, so every t is reachable): the
    brokers of s's level-(ℓ+1) unit minus those of its level-ℓ unit (level 0 is s alone).
    """
    depth = topology.depth
    inside = {unit: len(brokers) for unit, brokers in topology.units.items()}
    counts = [0] * (depth + 1)
    for s in sources:
        unit = topology.brokers[s].unit
        below = 1  # s itself
        for lv in range(1, depth + 2):
            here = inside[unit[: depth - lv + 1]]
            counts[lv - 1] += here - below
            below = here
    return counts
