"""Delivery records as ``ges stats latency`` reads them: the inputs, one DataFrame, bad records.

Inputs are named files and directories (:func:`record_sources`): JSON lines, Parquet files, or
directories searched for both, checked before Spark starts so that a missing path costs no JVM.
:func:`read_records` reads every source into one DataFrame with the record schema
(``ges.records.spark_schema``) plus two columns: ``_corrupt_record``, the text of a JSON
line Spark could not parse, and :data:`FILE_COLUMN`, the file each row came from. Parquet columns
are cast to the schema, or refused with one line when they cannot be.

Records are not validated row by row in Python: :func:`why_bad` is a column that names the first
thing wrong with a record (null for a good one), which the job aggregates with everything else.
Only once Spark has counted bad records does :func:`bad_record_error` turn them into one
``UserInputError``: it re-reads the first flagged JSON lines file with
``ges.records.parse_record`` to name the line and what is wrong with it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import reduce
from pathlib import Path
from urllib.parse import unquote, urlparse

import attrs

from ges import records
from ges.errors import UserInputError
from ges.stats.spark import failure_reason

#: File names read as JSON lines when found in a directory (any named file that does not end in
#: .parquet is read as JSON lines).
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
#: The column holding the text of a JSON line Spark could not parse (null for Parquet rows).
_CORRUPT = "_corrupt_record"
#: The column holding the file a record came from (``input_file_name``).
FILE_COLUMN = "_file"


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


def open_text(path: Path):
    if path.name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - a context manager


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
        *columns, F.lit(None).cast("string").alias(_CORRUPT), F.input_file_name().alias(FILE_COLUMN)
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
    return df.withColumn(FILE_COLUMN, F.input_file_name())


def read_records(spark, sources: list[RecordSource]):
    """Every record of every source, with the record schema plus ``_corrupt_record`` and ``_file``."""
    schema = records.spark_schema()
    json_paths = [s.path for s in sources if s.format == "json"]
    frames = [_json_frame(spark, json_paths, schema)] if json_paths else []
    frames += [_parquet_frame(spark, s.path, schema) for s in sources if s.format == "parquet"]
    return reduce(lambda a, b: a.unionByName(b), frames)


def why_bad():
    """A column naming what is wrong with a record (first problem), null for a good record."""
    from pyspark.sql import functions as F

    checks = [(F.col(_CORRUPT).isNotNull(), "not a valid record")]
    checks += [(F.col(name).isNull(), f"no {name}") for name in records.REQUIRED]
    checks += [(F.col(name) < 0, f"{name} is negative") for name in records.NON_NEGATIVE]
    return F.coalesce(*(F.when(cond, F.lit(why)) for cond, why in checks))


def _uri_path(uri: str) -> Path:
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme in ("", "file") else Path(uri)


def bad_record_error(sources: list[RecordSource], bad: list[tuple[str, str, int]]) -> Exception:
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
        with open_text(source.path) as lines:
            for number, line in enumerate(lines, 1):
                try:
                    records.parse_record(line)
                except records.RecordError as exc:
                    return UserInputError(f"{source.path}:{number}: {exc}{more}")
        return UserInputError(f"{source.path}: {flagged[root]} (a line Spark rejects){more}")
    uri, why, _ = bad[0]
    return UserInputError(f"{_uri_path(uri) if uri else 'RECORDS'}: a record with {why}{more}")
