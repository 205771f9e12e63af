"""What ``ges stats latency`` reports: the latency figures of each group of delivery records.

A :class:`LatencyStats` is the whole answer — the ``--by`` names, one :class:`LatencyGroup` per
distinct key tuple, and whether the percentiles are exact — and every output (the table, CSV,
Parquet, JSON, the plot) is drawn from it. The definitions live here, next to the values they
define: latencies are in µs (variance in µs²); the variance is the population variance; pP is the
nearest-rank percentile (:func:`nearest_rank`), always a measured latency; groups sort by
:func:`key_order`, null first, then numbers by value, then text. ``ges.stats.latency`` computes
them on Spark, ``ges.stats._latency_reference`` again in plain Python, both into these classes.
"""

from __future__ import annotations

import attrs

#: The statistics of a group, in the order tables and CSV show them (latencies in µs).
STATS = ("count", "mean", "stddev", "variance", "min", "p50", "p95", "p99", "max", "negative")
#: The percentiles reported, in percent.
PERCENTILES = (50, 95, 99)


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
