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
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import reduce
from pathlib import Path
from urllib.parse import unquote, urlparse

import attrs

from ges import records
from ges.errors import GesError, OperationError, UserInputError
from ges.stats.spark import failure_reason

#: The statistics of a group, in the order tables and CSV show them (latencies in µs).
STATS = ("count", "mean", "stddev", "variance", "min", "p50", "p95", "p99", "max", "negative")
#: The percentiles reported, in percent.
PERCENTILES = (50, 95, 99)
#: Records hold nanoseconds; results are microseconds (variance: µs²).
NS_PER_US = 1000
#: Significant bits a histogram bucket keeps: buckets span < 1/127 of their values, and a group
#: spanning k octaves of latency has at most about 2**MANTISSA_BITS · k buckets.
MANTISSA_BITS = 8
#: ``--by`` aliases: a name that reads the first of these tags a record has. Seed 004's "publish
#: rate" is tagged ``rate`` by bench/routing.py; other tools may say ``publish_rate``.
TAG_ALIASES = {"rate": ("rate", "publish_rate")}
#: Characters of JSON lines (bytes, for ASCII) read before Spark starts to find the tags a bare
#: ``--by`` name means: the scan stops at the first record with each such tag (at once, for
#: records that share their tags), and only a name no record has reads this much; beyond it (or
#: with Parquet inputs) the first Spark pass decides.
TAG_SCAN_BYTES = 32 * 1024 * 1024
#: Tag names an error lists before "…".
TAGS_LISTED = 12
#: File names read as JSON lines when found in a directory (any named file that does not end in
#: .parquet is read as JSON lines).
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")

_CORRUPT = "_corrupt_record"
_FILE = "_file"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")

Stage = Callable[[str], AbstractContextManager]


@attrs.frozen
class GroupKey:
    """One ``--by`` name: a record field, or the first present of one or more tags.

    Resolution: ``tags.NAME`` is the tag NAME; a record field's name (``hops``, ``size``,
    ``client``, ``subscriber_broker``, …) is that field; ``rate`` is the tag ``rate`` or, in a
    record without it, ``publish_rate``; any other name is the tag of that name (so
    ``matching_rate`` is ``tags.matching_rate``; write ``tags.size`` for a tag that shares a
    field's name).

    A bare name read as a tag (``implied``) must be a tag some record has: otherwise it is more
    likely a misspelt field than a wish for one group of nulls, and :func:`check_tags` refuses
    it. ``tags.NAME`` is taken as written, present or not.
    """

    name: str
    field: str | None = None
    tags: tuple[str, ...] = ()
    implied: bool = False

    @classmethod
    def parse(cls, name: str) -> GroupKey:
        name = name.strip()
        if name.startswith("tags."):
            tag = name.removeprefix("tags.")
            if not tag:
                raise UserInputError("--by tags.: name a tag after the dot (tags.matching_rate)")
            return cls(name, tags=(tag,))
        if not name or name == "tags":
            raise UserInputError(f"--by {name!r}: name a field or a tag (e.g. hops, matching_rate)")
        if name in STATS:
            raise UserInputError(
                f"--by {name}: that is a statistic's column; write tags.{name} for the tag"
            )
        if name in records.FIELD_NAMES:
            return cls(name, field=name)
        return cls(name, tags=TAG_ALIASES.get(name, (name,)), implied=True)

    def column(self):
        from pyspark.sql import functions as F

        if self.field is not None:
            return F.col(self.field)
        found = [F.col("tags")[tag] for tag in self.tags]
        return found[0] if len(found) == 1 else F.coalesce(*found)

    def present(self, raw):
        """A key as results show it: fields as they are, tag text that is a number as one."""
        if self.field is not None or raw is None:
            return raw
        return tag_value(raw)


def tag_value(text: str) -> int | float | str:
    """A tag's text as a value: a JSON number becomes an int or float, anything else stays text."""
    match = _NUMBER.fullmatch(text)
    if match is None:
        return text
    return float(text) if match.group(1) or match.group(2) else int(text)


def parse_by(specs: Iterable[str]) -> tuple[GroupKey, ...]:
    """``--by`` options (each a comma list) as group keys; a name given twice is an error."""
    keys = [GroupKey.parse(n) for spec in specs for n in spec.split(",") if n.strip()]
    names = [k.name for k in keys]
    for name in names:
        if names.count(name) > 1:
            raise UserInputError(f"--by {name}: given twice")
    return tuple(keys)


def check_tags(keys: Sequence[GroupKey], present: Iterable[str]) -> None:
    """Refuse a bare ``--by`` name none of whose tags is in ``present`` (every record's tags).

    Raises:
        UserInputError: naming the key, the record fields, the tags there are, and ``tags.NAME``.
    """
    present = set(present)
    for key in keys:
        if key.implied and not present.intersection(key.tags):
            raise _no_such_key(key, present)


def _no_such_key(key: GroupKey, present: set[str]) -> UserInputError:
    tags = " or ".join(repr(t) for t in key.tags)
    fields = ", ".join(n for n in records.FIELD_NAMES if n != "tags")
    names = sorted(present)
    if names:
        shown = ", ".join(names[:TAGS_LISTED]) + (", …" if len(names) > TAGS_LISTED else "")
        have = f"tags in these records: {shown}"
    else:
        have = "these records have no tags"
    return UserInputError(
        f"--by {key.name}: not a record field, and no record has the tag {tags} "
        f"(fields: {fields}; {have}; tags.NAME groups by a tag even where no record has it)"
    )


def scan_tags(
    keys: Sequence[GroupKey], sources: Sequence[RecordSource], *, limit: int = TAG_SCAN_BYTES
) -> set[str] | None:
    """The tag names of the records, read before Spark starts, as far as ``keys`` need them.

    Only bare names read as tags need them. Reading stops once each of those has a tag found
    (the tags seen so far are returned); it reads every record only to show that one has none,
    and gives up — returns None, leaving it to :func:`latency_stats` — past ``limit`` characters or
    at a Parquet input. Lines that are not JSON objects are skipped: the Spark pass names them.
    """
    wanted = [k for k in keys if k.implied]
    seen: set[str] = set()
    if not wanted:
        return seen
    if any(s.format != "json" for s in sources):
        return None
    budget = limit
    for source in sources:  # JSON sources are files (record_sources lists a directory's)
        with _open_text(source.path) as stream:
            for line in stream:
                budget -= len(line)
                if budget < 0:
                    return None
                if '"tags"' not in line:
                    continue
                try:
                    tags = json.loads(line).get("tags")
                except (ValueError, AttributeError):
                    continue
                if isinstance(tags, dict) and not tags.keys() <= seen:
                    seen.update(tags)
                    if all(seen.intersection(k.tags) for k in wanted):
                        return seen
    return seen


@attrs.frozen
class LatencyGroup:
    """The latency figures of one group of records, in µs (variance in µs²).

    ``variance`` is the population variance Σ(x − mean)²/n — the records are every delivery of a
    run, not a sample of them — and ``stddev`` its square root (both 0 for a single record).
    ``p50``/``p95``/``p99`` are nearest-rank percentiles: pP is the smallest latency L with at
    least P % of the group's latencies ≤ L, i.e. the value at rank ⌈P·n/100⌉ in ascending order
    (SQL ``PERCENTILE_DISC(P/100)``); always a measured latency. ``negative`` counts the records
    received before they were published (clock skew between hosts); they count as negative
    latencies in every figure.
    """

    keys: tuple
    count: int
    mean: float
    stddev: float
    variance: float
    min: float
    p50: float
    p95: float
    p99: float
    max: float
    negative: int


@attrs.frozen
class LatencyStats:
    """The result of :func:`latency_stats`: groups in key order (null first, numbers, text)."""

    by: tuple[str, ...]
    groups: tuple[LatencyGroup, ...]
    exact: bool = True

    @property
    def records(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def negative(self) -> int:
        return sum(g.negative for g in self.groups)

    def rows(self) -> list[dict]:
        """One flat dict per group: its keys under their ``--by`` names, then every statistic."""
        return [
            {**dict(zip(self.by, g.keys, strict=True)), **{s: getattr(g, s) for s in STATS}}
            for g in self.groups
        ]

    def to_json(self) -> dict:
        return {
            "by": list(self.by),
            "unit": "us",
            "records": self.records,
            "negative_latencies": self.negative,
            "percentiles": "nearest-rank" if self.exact else "bucket-interpolated (approx)",
            "variance": "population",
            "groups": self.rows(),
        }


def key_order(keys: tuple) -> tuple:
    """Sort order of group keys: null first, then numbers by value, then text."""
    return tuple(
        (0, 0, "")
        if v is None
        else (1, v, "")
        if isinstance(v, int | float) and not isinstance(v, bool)
        else (2, 0, str(v))
        for v in keys
    )


def nearest_rank(percent: int, count: int) -> int:
    """The 1-based rank of the nearest-rank ``percent``-th percentile of ``count`` values."""
    return max(1, -(-percent * count // 100))


# --- inputs -----------------------------------------------------------------------------------


@attrs.frozen
class RecordSource:
    """One input the job reads: a JSON lines file, or a Parquet file or directory."""

    path: Path
    format: str  # "json" or "parquet"


def _is_json_name(name: str) -> bool:
    name = name.removesuffix(".gz")
    return name.endswith(JSON_SUFFIXES)


def record_sources(paths: Sequence[Path]) -> list[RecordSource]:
    """The files and Parquet directories to read, in the order given.

    A named file is Parquet if it ends in ``.parquet`` and JSON lines otherwise. A directory is
    searched (recursively, skipping names that start with ``_`` or ``.``, like Spark's
    ``_SUCCESS`` and ``.crc`` files) for ``.parquet``, ``.jsonl``, ``.json`` and ``.ndjson``
    files (``.gz`` too); a directory of Parquet files only is read as one Parquet dataset.
    """
    if not paths:
        raise UserInputError("no RECORDS given: name delivery record files or directories")
    sources: list[RecordSource] = []
    for path in paths:
        if path.is_file():
            kind = "parquet" if path.name.endswith(".parquet") else "json"
            sources.append(RecordSource(path, kind))
            continue
        if not path.is_dir():
            raise UserInputError(f"{path}: no such file or directory")
        found: list[RecordSource] = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            for name in sorted(files):
                if name.startswith(("_", ".")):
                    continue
                if name.endswith(".parquet"):
                    found.append(RecordSource(Path(root, name), "parquet"))
                elif _is_json_name(name):
                    found.append(RecordSource(Path(root, name), "json"))
        if not found:
            raise UserInputError(f"{path}: no .jsonl, .json or .parquet files in this directory")
        if all(s.format == "parquet" for s in found):
            sources.append(RecordSource(path, "parquet"))
        else:
            sources.extend(found)
    return sources


def _castable(have, want) -> bool:
    from pyspark.sql import types as T

    if isinstance(want, T.StringType):
        return isinstance(have, T.StringType | T.NumericType | T.BooleanType)
    if isinstance(want, T.LongType):
        return isinstance(have, T.IntegralType)
    return (
        isinstance(have, T.MapType)
        and isinstance(have.keyType, T.StringType)
        and isinstance(have.valueType, T.StringType | T.NumericType | T.BooleanType)
    )


def _parquet_frame(spark, path: Path, schema):
    from pyspark.sql import functions as F

    try:
        df = spark.read.parquet(str(path))
    except Exception as exc:  # AnalysisException and friends: not Parquet, unreadable
        raise UserInputError(f"{path}: cannot read as Parquet ({failure_reason(exc)})") from None
    have = {f.name: f.dataType for f in df.schema.fields}
    columns = []
    for field in schema.fields:
        kind = have.get(field.name)
        if kind is None and field.name == "tags":
            columns.append(F.lit(None).cast(field.dataType).alias("tags"))
        elif kind is None:
            raise UserInputError(
                f"{path}: no column {field.name!r} "
                f"(delivery records have {', '.join(records.FIELD_NAMES)})"
            )
        elif not _castable(kind, field.dataType):
            raise UserInputError(
                f"{path}: column {field.name} is {kind.simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
        else:
            columns.append(F.col(field.name).cast(field.dataType).alias(field.name))
    return df.select(
        *columns, F.lit(None).cast("string").alias(_CORRUPT), F.input_file_name().alias(_FILE)
    )


def _json_frame(spark, paths: list[Path], schema):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    with_corrupt = T.StructType([*schema.fields, T.StructField(_CORRUPT, T.StringType(), True)])
    reader = (
        spark.read.schema(with_corrupt)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", _CORRUPT)
    )
    df = reader.json([str(p) for p in paths])
    # input_file_name per source, before the union: Spark refuses it above one.
    return df.withColumn(_FILE, F.input_file_name())


def _records_frame(spark, sources: list[RecordSource]):
    """Every record of every source, with the record schema plus ``_corrupt_record`` and ``_file``."""
    schema = records.spark_schema()
    json_paths = [s.path for s in sources if s.format == "json"]
    frames = [_json_frame(spark, json_paths, schema)] if json_paths else []
    frames += [_parquet_frame(spark, s.path, schema) for s in sources if s.format == "parquet"]
    return reduce(lambda a, b: a.unionByName(b), frames)


def _why_bad():
    """A column naming what is wrong with a record (first problem), null for a good record."""
    from pyspark.sql import functions as F

    checks = [(F.col(_CORRUPT).isNotNull(), "not a valid record")]
    checks += [(F.col(name).isNull(), f"no {name}") for name in records.REQUIRED]
    checks += [(F.col(name) < 0, f"{name} is negative") for name in records.NON_NEGATIVE]
    return F.coalesce(*(F.when(cond, F.lit(why)) for cond, why in checks))


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


# --- the job -----------------------------------------------------------------------------------


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


def _uri_path(uri: str) -> Path:
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme in ("", "file") else Path(uri)


def _bad_record_error(sources: list[RecordSource], bad: list[tuple[str, str, int]]) -> Exception:
    """One UserInputError for the bad records Spark counted: file and line of the first one.

    ``bad`` holds (file URI, what is wrong, how many) per file with bad records. Of the files
    named there, the first in input order is re-read with ``records.parse_record`` (JSON lines)
    to name its first bad line; a Parquet file has no lines, so the message names the file.
    """
    total = sum(n for _, _, n in bad)
    more = f" ({total:,} bad records in all)" if total > 1 else ""
    flagged = {_uri_path(uri).resolve(): why for uri, why, _ in bad if uri}
    for source in sources:
        root = source.path.resolve()
        hits = sorted(p for p in flagged if p == root or root in p.parents)
        if not hits:
            continue
        if source.format == "parquet":
            return UserInputError(f"{hits[0]}: a record with {flagged[hits[0]]}{more}")
        with _open_text(source.path) as lines:
            for number, line in enumerate(lines, 1):
                try:
                    records.parse_record(line)
                except records.RecordError as exc:
                    return UserInputError(f"{source.path}:{number}: {exc}{more}")
        return UserInputError(f"{source.path}: {flagged[root]} (a line Spark rejects){more}")
    uri, why, _ = bad[0]
    return UserInputError(f"{_uri_path(uri) if uri else 'RECORDS'}: a record with {why}{more}")


def _open_text(path: Path):
    if path.name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - a context manager


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
    records_frame = _records_frame(spark, sources)
    group_keys = [k.column().alias(n) for k, n in zip(keys, names, strict=True)]
    why = _why_bad()
    frame = records_frame.select(
        *group_keys,
        why.alias("_why"),
        F.when(why.isNotNull(), F.col(_FILE)).alias(_FILE),
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
        where = frame.where(F.col("_bucket").isNull()).groupBy(_FILE)
        found = _spark_action(
            stage,
            "latency: finding bad records",
            where.agg(F.min("_why").alias("why"), F.count(F.lit(1)).alias("n")).collect,
        )
        raise _bad_record_error(sources, [(r[_FILE], r["why"], r["n"]) for r in found])
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
