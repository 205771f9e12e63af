"""Latency statistics of delivery records on Spark (seed 004 §4, Figure 7 and Table 2).

Seed 004 measures how the latency of a delivery (``received_at − published_at``) depends on the
matching rate, the event size, the publish rate and the hop count. :func:`latency_stats` reads
delivery records (``ges.records``: JSON lines and/or Parquet), groups them by any record
field or experiment tag, and gives per group the count, mean, population variance and standard
deviation, min, the nearest-rank p50, p95 and p99, and max, in microseconds.

Theory of operation. Exact percentiles are what Spark does slowly: its ``percentile`` functions
keep a hash map of every distinct value per group (10 M nanosecond latencies in 12 groups: over
100 s on a 2-core machine; this job takes 7 s from Parquet). Two passes of plain hash
aggregation do it instead:

1. **Histogram.** Each latency falls in a *bucket* holding its sign, its bit length and its top
   ``MANTISSA_BITS`` bits, so a bucket spans under 1/127 of its values and the bucket number grows
   with the latency. Grouping by (group keys, bucket) gives per bucket the count, mean, variance,
   min and max — at most 128 rows per group and octave of latency, whatever the record count.
   The driver merges them into each group's figures (Chan et al.'s pairwise variance update) and
   walks the cumulative counts to the bucket that holds each percentile's rank.
2. **Selection.** The records in those buckets (a semi-join with the wanted buckets) are
   counted per distinct latency and collected; the driver counts through them to the exact
   rank. A bucket whose min equals its max needs no second look, and ``exact=False`` skips the
   pass and interpolates within the bucket by rank instead (off by less than 0.8 % of the
   value). Pass 2 reads Parquet inputs again but takes JSON lines from Spark's cache of pass 1:
   parsing JSON is most of the work.

Bad records stop the job: the first pass also counts them, a small job names the files that hold
them, and the driver re-reads the first of those with ``ges.records.parse_record`` to
name its first bad line.

This module is the job. What it reads, and how a bad record is named, is
``ges.stats.record_input``; what a ``--by`` name means, ``ges.stats.group_keys``; what it
returns, ``ges.stats.latency_results``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import reduce
from pathlib import Path

import attrs

from ges.errors import GesError, OperationError, UserInputError
from ges.stats.group_keys import GroupKey, check_tags
from ges.stats.latency_results import (
    PERCENTILES,
    LatencyGroup,
    LatencyStats,
    key_order,
    nearest_rank,
)
from ges.stats.record_input import (
    FILE_COLUMN,
    RecordSource,
    bad_record_error,
    read_records,
    record_sources,
    why_bad,
)
from ges.stats.spark import failure_reason

#: Records hold nanoseconds; results are microseconds (variance: µs²).
NS_PER_US = 1000
#: Significant bits a histogram bucket keeps: buckets span < 1/127 of their values, and a group
#: spanning k octaves of latency has at most about 2**MANTISSA_BITS · k buckets.
MANTISSA_BITS = 8
#: What ``latency_stats`` calls around each Spark job: a description in, a context manager out.
Stage = Callable[[str], AbstractContextManager]


def _bucket(latency: str):
    """The histogram bucket of the latency column named ``latency``: monotone in the latency.

    ``shift`` is about the bit length of |latency| less MANTISSA_BITS, from log2 of a double:
    Java's ``StrictMath.log`` is semi-monotonic, as is every other step, so ``shift`` never falls
    as |latency| grows, and (shift << 16) + (|latency| >> shift) — the second term stays below
    2**9 — orders buckets as their latencies; the sign makes negative latencies sort first.
    """
    from pyspark.sql import functions as F

    bits = f"CAST(floor(log2(CAST(abs({latency}) AS DOUBLE) + 1.0)) AS INT) + 1"
    shift = f"greatest({bits} - {MANTISSA_BITS}, 0)"
    return F.expr(
        f"CAST(signum({latency}) AS BIGINT) * "
        f"(shiftleft(CAST({shift} AS BIGINT), 16) + shiftright(abs({latency}), {shift}))"
    )


@attrs.frozen
class _Bucket:
    """One histogram row: the latencies of one group in one bucket (ns)."""

    bucket: int
    count: int
    mean: float
    variance: float
    low: int
    high: int


def _merge(buckets: list[_Bucket]) -> tuple[int, float, float]:
    """Count, mean and population variance (ns, ns²) of a group from its buckets (Chan et al.)."""
    n = sum(b.count for b in buckets)
    mean = math.fsum(b.count * b.mean for b in buckets) / n
    m2 = math.fsum(b.count * b.variance for b in buckets)
    m2 += math.fsum(b.count * (b.mean - mean) ** 2 for b in buckets)
    return n, mean, max(m2 / n, 0.0)


def _locate(buckets: list[_Bucket], rank: int) -> tuple[_Bucket, int]:
    """The bucket holding the ``rank``-th smallest latency, and the rank within that bucket."""
    before = 0
    for b in buckets:
        if before + b.count >= rank:
            return b, rank - before
        before += b.count
    raise AssertionError(f"rank {rank} beyond {before} latencies")


def _spark_action(stage: Stage, description: str, action):
    """Run one Spark action under the progress display; a failed job is one line."""
    with stage(description):
        try:
            return action()
        except (UserInputError, OperationError):
            raise
        except Exception as exc:  # Py4J/Spark errors carry a JVM stack: keep its first line
            raise OperationError(f"Spark job failed: {failure_reason(exc)}") from None


def latency_stats(
    spark,
    paths: Sequence[Path],
    *,
    by: Sequence[GroupKey] = (),
    exact: bool = True,
    stage: Stage | None = None,
) -> LatencyStats:
    """Latency statistics per group of the delivery records under ``paths``.

    Args:
        spark: a SparkSession (``ges.stats.spark.session``).
        paths: record files and directories (see :func:`record_sources`).
        by: group keys (:func:`parse_by`); none gives one group of every record.
        exact: exact nearest-rank percentiles (two passes); False interpolates within the
            histogram bucket (one pass, within 0.8 % of the exact value).
        stage: called with a description around each Spark job; returns a context manager
            (a progress display).

    Returns:
        LatencyStats with one LatencyGroup per distinct key tuple, in key order.

    Error handling:
        UserInputError (exit 2) for a missing path, an input that is not delivery records (the
        file and line of the first bad record), or no records at all; OperationError when a
        Spark job fails.
    """
    try:
        return _latency_stats(spark, paths, by, exact, stage or (lambda _: nullcontext()))
    except GesError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark refusing a setting or a plan: one line
        raise OperationError(f"Spark failed: {failure_reason(exc)}") from None


def _latency_stats(spark, paths, by, exact, stage) -> LatencyStats:
    from pyspark.sql import functions as F

    sources = record_sources(paths)
    keys = tuple(by)
    names = [f"_k{i}" for i in range(len(keys))]
    records_frame = read_records(spark, sources)
    group_keys = [k.column().alias(n) for k, n in zip(keys, names, strict=True)]
    why = why_bad()
    frame = records_frame.select(
        *group_keys,
        why.alias("_why"),
        F.when(why.isNotNull(), F.col(FILE_COLUMN)).alias(FILE_COLUMN),
        F.when(why.isNull(), F.col("received_at") - F.col("published_at")).alias("_lat"),
    ).withColumn("_bucket", _bucket("_lat"))
    # Parsing JSON is the dear part of reading: keep what pass 1 parsed for pass 2. Parquet is
    # cheaper to read again than to cache, and pass 2 then reads only the columns it needs: pass
    # 1 found every record good.
    cache = exact and any(s.format == "json" for s in sources)
    if cache:
        from pyspark import StorageLevel

        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        again = frame
    else:
        latency = (F.col("received_at") - F.col("published_at")).alias("_lat")
        again = records_frame.select(*group_keys, latency).withColumn("_bucket", _bucket("_lat"))
    try:
        groups = _histograms(frame, names, sources, stage)
        if not groups:
            raise UserInputError(f"{', '.join(str(p) for p in paths)}: no delivery records")
        _check_implied_tags(records_frame, keys, groups, stage)
        values = _percentiles(spark, again, names, groups, exact=exact, stage=stage)
    finally:
        if cache:
            frame.unpersist()

    result = []
    for key, buckets in groups.items():
        n, mean, variance = _merge(buckets)
        result.append(
            LatencyGroup(
                keys=tuple(k.present(v) for k, v in zip(keys, key, strict=True)),
                count=n,
                mean=mean / NS_PER_US,
                stddev=math.sqrt(variance) / NS_PER_US,
                variance=variance / NS_PER_US**2,
                min=buckets[0].low / NS_PER_US,
                p50=values[key, 50] / NS_PER_US,
                p95=values[key, 95] / NS_PER_US,
                p99=values[key, 99] / NS_PER_US,
                max=buckets[-1].high / NS_PER_US,
                negative=sum(b.count for b in buckets if b.bucket < 0),
            )
        )
    result.sort(key=lambda g: key_order(g.keys))
    return LatencyStats(by=tuple(k.name for k in keys), groups=tuple(result), exact=exact)


def _histograms(
    frame, names: list[str], sources: list[RecordSource], stage: Stage
) -> dict[tuple, list[_Bucket]]:
    """Pass 1: each group's buckets in latency order; a UserInputError for bad records.

    Every aggregate here has a fixed-width buffer, so Spark aggregates in its hash map: one
    string aggregate (say, the file of a bad record) would send it to a sort-based aggregation,
    several times slower. Which file holds a bad record is asked only once there is one.
    """
    from pyspark.sql import functions as F

    histogram = frame.groupBy(*names, "_bucket").agg(
        F.count(F.lit(1)).alias("n"),
        F.avg("_lat").alias("mean"),
        F.var_pop("_lat").alias("var"),
        F.min("_lat").alias("low"),
        F.max("_lat").alias("high"),
    )
    rows = _spark_action(stage, "latency: reading records", histogram.collect)
    groups: dict[tuple, list[_Bucket]] = defaultdict(list)
    bad = False
    for row in rows:
        if row["_bucket"] is None:  # only a bad record has no latency
            bad = True
            continue
        groups[tuple(row[n] for n in names)].append(
            _Bucket(row["_bucket"], row["n"], row["mean"], row["var"], row["low"], row["high"])
        )
    if bad:
        where = frame.where(F.col("_bucket").isNull()).groupBy(FILE_COLUMN)
        found = _spark_action(
            stage,
            "latency: finding bad records",
            where.agg(F.min("_why").alias("why"), F.count(F.lit(1)).alias("n")).collect,
        )
        raise bad_record_error(sources, [(r[FILE_COLUMN], r["why"], r["n"]) for r in found])
    for buckets in groups.values():
        buckets.sort(key=lambda b: b.bucket)
    return dict(groups)


def _check_implied_tags(records_frame, keys, groups: dict, stage: Stage) -> None:
    """:func:`check_tags` on what pass 1 found: a bare name's tag null in every group may be
    absent from every record; only then does a small job list the tags there are."""
    from pyspark.sql import functions as F

    suspect = [
        k for i, k in enumerate(keys) if k.implied and all(group[i] is None for group in groups)
    ]
    if not suspect:
        return
    names = records_frame.select(F.explode(F.map_keys("tags")).alias("tag")).distinct()
    rows = _spark_action(stage, "latency: listing tags", names.collect)
    check_tags(suspect, (row["tag"] for row in rows))


def _percentiles(
    spark, frame, names: list[str], groups: dict, *, exact: bool, stage: Stage
) -> dict[tuple[tuple, int], float]:
    """Each group's percentiles (ns) by key and percent; pass 2 where a bucket must be opened."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    wanted: dict[tuple[tuple, int], tuple[_Bucket, int]] = {}
    values: dict[tuple[tuple, int], float] = {}
    for key, buckets in groups.items():
        n = sum(b.count for b in buckets)
        for p in PERCENTILES:
            b, offset = _locate(buckets, nearest_rank(p, n))
            if b.low == b.high:  # one distinct value: no need to look inside
                values[key, p] = b.low
            elif not exact:
                values[key, p] = b.low + (b.high - b.low) * (offset - 1) / (b.count - 1)
            else:
                wanted[key, p] = (b, offset)
    if not wanted:
        return values

    targets = sorted({(key, b.bucket) for (key, _), (b, _) in wanted.items()}, key=repr)
    schema = T.StructType(
        [T.StructField(f"_t{i}", frame.schema[n].dataType, True) for i, n in enumerate(names)]
        + [T.StructField("_tb", T.LongType(), False)]
    )
    chosen = spark.createDataFrame([(*key, b) for key, b in targets], schema=schema)
    on = [frame[n].eqNullSafe(chosen[f"_t{i}"]) for i, n in enumerate(names)]
    on.append(frame["_bucket"] == chosen["_tb"])
    selected = (
        frame.join(F.broadcast(chosen), on=reduce(lambda a, b: a & b, on), how="semi")
        .groupBy(*names, "_bucket", "_lat")
        .count()
    )
    rows = _spark_action(stage, "latency: exact percentiles", selected.collect)
    inside: dict[tuple[tuple, int], list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        inside[tuple(row[n] for n in names), row["_bucket"]].append((row["_lat"], row["count"]))
    for (key, p), (b, offset) in wanted.items():
        seen = 0
        for value, count in sorted(inside[key, b.bucket]):
            seen += count
            if seen >= offset:
                values[key, p] = value
                break
        else:
            raise OperationError(
                f"latency: the records changed while being read (a bucket of group {key} held "
                f"{b.count:,} records in pass 1 and {seen:,} in pass 2)"
            )
    return values
