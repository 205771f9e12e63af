"""The figures of ``ges.stats.latency`` computed again in plain Python: one process, no Spark.

An independent computation of the same statistics, by their definitions rather than by the
histogram method of the Spark job: every latency of a group is kept, sorted and ranked, and the
mean and variance are exact rational numbers rounded once. Tests compare every figure of the
Spark job with it; ``bench/stats_latency.py`` times it as the single-process baseline. It reads
JSON lines only (Parquet would need Spark or pyarrow) and holds every latency in memory.
"""

from __future__ import annotations

import gzip
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path

from ges.errors import UserInputError
from ges.records import FIELD_NAMES, RecordError, parse_record
from ges.stats.latency_results import LatencyGroup, LatencyStats

_ALIASES = {"rate": ("rate", "publish_rate")}
_US = 1000
_JSON_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _files(paths: Sequence[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_file():
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            for name in sorted(files):
                plain = name.removesuffix(".gz")
                if not name.startswith(("_", ".")) and plain.endswith(
                    (".jsonl", ".json", ".ndjson")
                ):
                    yield Path(root, name)


def _lookup(name: str):
    """A function giving a record's value for one ``--by`` name, and whether it is a tag."""
    if name.startswith("tags."):
        tags = (name[5:],)
    elif name in FIELD_NAMES:
        return (lambda record: record[name]), False
    else:
        tags = _ALIASES.get(name, (name,))

    def tag(record):
        for t in tags:
            value = record["tags"].get(t)
            if value is not None:
                return value
        return None

    return tag, True


def _as_value(text: str | None):
    """Tag text as results show it: a JSON number as int or float, other text as it is."""
    if text is None or _JSON_NUMBER.fullmatch(text) is None:
        return text
    return int(text) if _JSON_INT.fullmatch(text) else float(text)


def _order(keys: tuple) -> tuple:
    return tuple(
        (0, 0, "") if v is None else (2, 0, v) if isinstance(v, str) else (1, v, "") for v in keys
    )


def reference_latency(paths: Sequence[Path], by: Sequence[str] = ()) -> LatencyStats:
    """The latency statistics of the JSON lines records under ``paths``, grouped by ``by``.

    Raises UserInputError naming the file and line of the first bad record.
    """
    lookups = [_lookup(name) for name in by]
    latencies: dict[tuple, list[int]] = defaultdict(list)
    for path in _files(paths):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                try:
                    record = parse_record(line)
                except RecordError as exc:
                    raise UserInputError(f"{path}:{number}: {exc}") from None
                if record is None:
                    continue
                key = tuple(get(record) for get, _ in lookups)
                latencies[key].append(record["received_at"] - record["published_at"])
    if not latencies:
        raise UserInputError(f"{', '.join(map(str, paths))}: no delivery records")
    groups = []
    for key, values in latencies.items():
        values.sort()
        n = len(values)
        total = sum(values)
        squares = sum(v * v for v in values)
        variance = Fraction(n * squares - total * total, n * n)  # ns², exact
        picks = {p: values[max(1, math.ceil(Fraction(p * n, 100))) - 1] for p in (50, 95, 99)}
        groups.append(
            LatencyGroup(
                keys=tuple(
                    _as_value(v) if is_tag else v
                    for v, (_, is_tag) in zip(key, lookups, strict=True)
                ),
                count=n,
                mean=float(Fraction(total, n * _US)),
                stddev=math.sqrt(variance) / _US,
                variance=float(variance / _US**2),
                min=values[0] / _US,
                p50=picks[50] / _US,
                p95=picks[95] / _US,
                p99=picks[99] / _US,
                max=values[-1] / _US,
                negative=sum(1 for v in values if v < 0),
            )
        )
    groups.sort(key=lambda g: _order(g.keys))
    return LatencyStats(by=tuple(by), groups=tuple(groups), exact=True)
