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

How Spark computes them. Brokers become integers; the links a small table of both directions
(with each link's level), broadcast to every task. Several topologies go together as disjoint
parts of one graph, each row tagged with its topology (:func:`path_stats_many`). The BFS runs
from all sources at once (in batches of sources when the pair count would pass
:data:`BATCH_PAIRS`): a layer holds (topology, source, broker, must, may, top) for the brokers at
distance d; joined with the links it gives the
candidates at distance d+1, grouped per (source, broker) with ``bit_and``, ``bit_or`` and
``min``. In an undirected graph a neighbour of a broker at distance d is at d-1, d or d+1, so
removing the brokers of the last two layers (not everything visited) leaves exactly those first
reached at d+1. That anti-join is a union into the same aggregation: the two layers' rows come
flagged as seen and a group with a seen row is dropped. Every layer is hash-partitioned on the
source, which the broadcast join and (on Spark 4) the union keep, so no BFS step shuffles or
sorts; each step is one Spark job, whose fixed cost (~0.3 s on two cores) is what small
topologies pay. Each layer
is ``localCheckpoint``-ed — lazily, so the one pass that sums its pairs per distance and level
also stores it — which cuts the lineage (each layer depends on the two before it, so the plan
would otherwise double with every step); the two layers still needed are kept, older ones
freed. Clustering counts triangles with joins: pairs of neighbours of each broker (x < y)
semi-joined with the links.

Exact up to :data:`EXACT_UP_TO` brokers (all n sources); beyond, from ``sample`` sources drawn at
random with ``seed`` (:func:`pick_sources`) — the result says which (``mode``, ``sources``).
``ges.stats._paths_reference`` computes the same figures in plain Python, for the tests and as
the baseline of ``bench/stats_paths.py``.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs

from ges.errors import UserInputError
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
#: Partitions of the BFS state per core Spark has: a couple per core keeps both busy while one
#: partition's task runs late, and few enough that a layer's per-task overhead stays small.
STATE_PARTITIONS_PER_CORE = 2
#: Runtime SQL settings while the BFS runs (the previous values come back after). Adaptive
#: execution re-plans every layer and, on Spark 4.3, adds a shuffle the source-partitioned plan
#: does not need: the layers got about 1.7× slower with it on.
BFS_SQL_CONF = {"spark.sql.adaptive.enabled": "false"}


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
    parts: list[_Part] = []
    offset = 0
    for i, topology in enumerate(topologies):
        wanted = sources[i] if sources is not None else None
        part = _Part.of(i, topology, offset, wanted, exact_up_to, sample, seed)
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
    totals = [_Totals(part.topology.depth + 1) for part in parts]
    with _runtime_conf(spark, BFS_SQL_CONF if sql_conf is None else sql_conf):
        network = _Network(spark, parts)
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
class _Part:
    """One topology of a run: its brokers' integer ids (from ``offset``) and its sources."""

    graph: int
    topology: Topology
    offset: int
    ids: tuple[str, ...]
    index: Mapping[str, int]
    sources: tuple[str, ...]
    seed: int | None

    @classmethod
    def of(cls, graph, topology, offset, wanted, exact_up_to, sample, seed) -> _Part:
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

    def result(self, totals: _Totals, clustering: float, wall: float, files) -> PathStats:
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


@attrs.define
class _Totals:
    """Pair counts summed over BFS layers and batches of sources."""

    levels: int
    pairs: int = 0
    hops: dict[int, int] = attrs.Factory(dict)
    must: list[int] = attrs.Factory(list)
    may: list[int] = attrs.Factory(list)
    top: list[int] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        for counts in (self.must, self.may, self.top):
            counts.extend([0] * self.levels)


class _Network:
    """The topologies of a run as Spark tables (one graph of disjoint parts), and the jobs."""

    def __init__(self, spark, parts: Sequence[_Part]):
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        self.spark, self.F, self.T = spark, F, T
        self.levels = max(part.topology.depth for part in parts) + 1
        arcs, owners = [], []
        for part in parts:
            topology = part.topology
            for link in topology.links:
                a = part.offset + part.index[link.a]
                b = part.offset + part.index[link.b]
                level = topology.link_level(link.a, link.b)
                arcs += [(a, b, level, 1 << level), (b, a, level, 1 << level)]
            owners += [(part.offset + i, part.graph) for i in range(len(part.ids))]
        ints = T.IntegerType()
        #: both directions of every link: (a, b, level, bit = 2^level)
        self.arcs = spark.createDataFrame(
            arcs, T.StructType([T.StructField(c, ints, False) for c in ("a", "b", "level", "bit")])
        ).cache()
        #: which topology each broker belongs to: (v, g)
        self.owners = spark.createDataFrame(
            owners, T.StructType([T.StructField(c, ints, False) for c in ("v", "g")])
        ).cache()

    def release(self) -> None:
        self.arcs.unpersist()
        self.owners.unpersist()

    # -- clustering: triangles by joins ---------------------------------------------------------

    def clustering(self) -> dict[int, float]:
        """Per topology, the mean local clustering coefficient of its brokers."""
        F = self.F
        arcs = self.arcs.select("a", "b")
        wedges = (
            arcs.alias("p")
            .join(arcs.alias("q"), (F.col("p.a") == F.col("q.a")) & (F.col("p.b") < F.col("q.b")))
            .select(F.col("p.a").alias("v"), F.col("p.b").alias("x"), F.col("q.b").alias("y"))
        )
        closed = wedges.join(
            arcs.withColumnRenamed("a", "x").withColumnRenamed("b", "y"), ["x", "y"], "left_semi"
        )
        triangles = closed.groupBy("v").agg(F.count("*").alias("t"))
        degree = arcs.groupBy(F.col("a").alias("v")).agg(F.count("*").alias("k"))
        local = (
            self.owners.join(degree, "v", "left")
            .join(triangles, "v", "left")
            .select(
                "g",
                F.when(
                    F.col("k") >= 2,
                    2 * F.coalesce(F.col("t"), F.lit(0)) / (F.col("k") * (F.col("k") - 1)),
                )
                .otherwise(F.lit(0.0))
                .alias("c"),
            )
        )
        return {
            row["g"]: float(row["c"])
            for row in local.groupBy("g").agg(F.avg("c").alias("c")).collect()
        }

    # -- breadth-first search from many sources at once -----------------------------------------

    def bfs(
        self,
        sources: list[tuple[int, int]],
        totals: list[_Totals],
        on_distance: Callable[[int], None],
    ) -> None:
        """Add the pairs of every BFS layer from ``sources`` ((topology, broker) ids) to totals."""
        F, T = self.F, self.T
        schema = T.StructType(
            [
                T.StructField(c, T.IntegerType(), False)
                for c in ("g", "src", "node", "must", "may", "top")
            ]
        )
        keys = ["g", "src", "node"]
        # Every layer is hash-partitioned on the source alone: the broadcast join keeps that, and
        # (source, broker) groups never span partitions, so no step of the BFS shuffles.
        parts = max(2, STATE_PARTITIONS_PER_CORE * self.spark.sparkContext.defaultParallelism)
        start = self.spark.createDataFrame([(g, s, s, 0, 0, -1) for g, s in sources], schema)
        frontier = start.repartition(parts, "src").localCheckpoint(eager=True)
        before = None  # the layer at distance d-1
        arcs = F.broadcast(self.arcs)
        d = 0
        while True:
            d += 1
            on_distance(d)
            bit = F.col("bit")
            candidates = frontier.join(arcs, frontier["node"] == arcs["a"]).select(
                "g",
                "src",
                F.col("b").alias("node"),
                F.col("must").bitwiseOR(bit).alias("must"),
                F.col("may").bitwiseOR(bit).alias("may"),
                F.greatest(F.col("top"), F.col("level")).alias("top"),
                F.lit(0).alias("seen"),
            )
            # The anti-join with the last two layers, as a union in the same aggregation: a
            # (source, broker) seen there has max(seen) = 1 and is dropped. Unlike a join this
            # needs neither a shuffle nor a sort, and the aggregates skip the seen rows' nulls.
            for old in (frontier, before):
                if old is not None:
                    candidates = candidates.unionByName(
                        old.select(
                            *keys,
                            *(F.lit(None).cast("int").alias(c) for c in ("must", "may", "top")),
                            F.lit(1).alias("seen"),
                        )
                    )
            reached = (
                candidates.groupBy(*keys)
                .agg(
                    F.bit_and("must").alias("must"),
                    F.bit_or("may").alias("may"),
                    F.min("top").alias("top"),
                    F.max("seen").alias("seen"),
                )
                .where(F.col("seen") == 0)
                .drop("seen")
            )
            # lazy: the counting pass below computes the layer once and keeps it for the next step
            layer = reached.localCheckpoint(eager=False)
            counts = self._layer_counts(layer)
            self._free(before)
            before, frontier = frontier, layer
            if not counts:
                break
            for g, row in counts.items():
                into = totals[g]
                into.pairs += row["pairs"]
                into.hops[d] = into.hops.get(d, 0) + row["pairs"]
                for lv in range(into.levels):
                    into.must[lv] += row[f"must{lv}"]
                    into.may[lv] += row[f"may{lv}"]
                    into.top[lv] += row[f"top{lv}"]
        self._free(before)
        self._free(frontier)

    def _layer_counts(self, layer) -> dict[int, dict[str, int]]:
        """One pass over a layer: per topology its pairs, and per level the pairs of each kind."""
        F = self.F

        def count_if(condition):
            return F.sum(F.when(condition, 1).otherwise(0)).cast("long")

        aggregates = [F.count("*").alias("pairs")]
        for lv in range(self.levels):
            bit = 1 << lv
            aggregates += [
                count_if(F.col("must").bitwiseAND(bit) != 0).alias(f"must{lv}"),
                count_if(F.col("may").bitwiseAND(bit) != 0).alias(f"may{lv}"),
                count_if(F.col("top") == lv).alias(f"top{lv}"),
            ]
        rows = layer.groupBy("g").agg(*aggregates).collect()
        return {row["g"]: {k: int(v or 0) for k, v in row.asDict().items()} for row in rows}

    @staticmethod
    def _free(df) -> None:
        """Drop a checkpointed layer's blocks now, not whenever the JVM's GC gets to them."""
        if df is None:
            return
        # only a memory hint (Spark frees it when the JVM collects it anyway), so any failure of
        # this reach into Spark's internals is ignored
        with contextlib.suppress(Exception):
            df._jdf.queryExecution().analyzed().rdd().unpersist(False)
