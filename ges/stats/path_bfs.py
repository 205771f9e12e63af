"""The Spark side of ``ges stats paths``: a run's topologies as tables, the BFS and clustering.

``ges.stats.paths`` defines the figures and prepares a run (which brokers are sources, in which
batches); this module computes them. :class:`Network` holds the topologies of one run as Spark
tables and runs the jobs: :meth:`Network.clustering` once, :meth:`Network.bfs` once per batch of
sources, each adding its pair counts into one :class:`Totals` per topology.

How Spark computes the counts. Brokers become integers; the links a small table of both directions
(with each link's level), broadcast to every task. Several topologies go together as disjoint parts
of one graph, each row tagged with its topology (``ges.stats.paths.path_stats_many``). The BFS runs
from all sources at once (in batches of sources when the pair count would pass
``ges.stats.paths.BATCH_PAIRS``): a layer holds (topology, source, broker, must, may, top) for the
brokers at distance d; joined with the links it gives the candidates at distance d+1, grouped per
(source, broker) with ``bit_and``, ``bit_or`` and ``min``. In an undirected graph a neighbour of a
broker at distance d is at d-1, d or d+1, so removing the brokers of the last two layers (not
everything visited) leaves exactly those first reached at d+1. That anti-join is a union into the
same aggregation: the two layers' rows come flagged as seen and a group with a seen row is dropped.
Every layer is hash-partitioned on the source, which the broadcast join and (on Spark 4) the union
keep, so no BFS step shuffles or sorts; each step is one Spark job, whose fixed cost (~0.3 s on two
cores) is what small topologies pay. Each layer is ``localCheckpoint``-ed — lazily, so the one pass
that sums its pairs per distance and level also stores it — which cuts the lineage (each layer
depends on the two before it, so the plan would otherwise double with every step); the two layers
still needed are kept, older ones freed. Clustering counts triangles with joins: pairs of
neighbours of each broker (x < y) semi-joined with the links.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from ges.stats.paths import Part

#: Partitions of the BFS state per core Spark has: a couple per core keeps both busy while one
#: partition's task runs late, and few enough that a layer's per-task overhead stays small.
STATE_PARTITIONS_PER_CORE = 2


@attrs.define
class Totals:
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


class Network:
    """The topologies of a run as Spark tables (one graph of disjoint parts), and the jobs."""

    def __init__(self, spark, parts: Sequence[Part]):
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
        totals: list[Totals],
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
