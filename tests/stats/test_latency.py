"""``ges stats latency``: every figure of the Spark job against the pure-Python reference.

Small seeded record sets (ties, single-record groups, negative and sub-256 ns latencies, records
without tags or with ``publish_rate`` instead of ``rate``) go through Spark in local mode, as
JSON lines, as Parquet and mixed; counts, min, max and percentiles must be equal, means and
variances equal to 1e-9. Then bad inputs (file and line, exit 2) and the CLI's outputs.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import stats_latency
from cli._common import command
from ges import records
from ges.errors import UserInputError
from ges.stats._latency_reference import reference_latency
from ges.stats.group_keys import GroupKey, check_tags, parse_by, scan_tags, tag_value
from ges.stats.latency import MANTISSA_BITS, latency_stats
from ges.stats.latency_results import nearest_rank
from ges.stats.record_input import record_sources

T0 = 1_700_000_000_000_000_000  # ns: late 2023


def _latency(rng: random.Random) -> int:
    """ns: mostly 50 µs – 20 ms (histogram buckets with many values), plus ties, tiny, negative."""
    roll = rng.random()
    if roll < 0.45:
        return rng.randint(50_000, 20_000_000)
    if roll < 0.65:
        return rng.choice((100_000, 250_000, 1_000_000, 1_000_001))
    if roll < 0.75:
        return rng.randint(0, 300)
    if roll < 0.78:
        return -rng.randint(1, 200_000)
    return int(rng.expovariate(1 / 3_000_000))


def make_records(seed: int, n: int, *, small_groups: bool = False) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pubend = f"b{rng.randint(1, 3)}~{seed}"
        published = T0 + i * 997
        size = rng.choice((30, 500))
        tags: dict | None = {
            "matching_rate": rng.choice((10, 50, 100)),
            "rate" if rng.random() < 0.9 else "publish_rate": rng.choice((1, 10, 100, 1000)),
            "size": size,
            "routing": rng.choice(("content", "flood")),
        }
        if rng.random() < 0.03:
            tags = None  # no tags at all: null keys
        record = {
            "event_id": f"{pubend}:{i}",
            "pubend": pubend,
            "tick": i,
            "publisher_broker": pubend.split("~")[0],
            "subscriber_broker": rng.choice(("b10", "b11")),
            "client": f"c{rng.randint(0, 3)}",
            "published_at": published,
            "received_at": published + _latency(rng),
            "size": size,
            "hops": rng.randint(1, 6),
        }
        if tags is not None:
            record["tags"] = tags
        out.append(record)
    if small_groups:
        out[7]["client"] = "lonely"  # a group of one
        out[8]["client"] = out[9]["client"] = "pair"  # a group of two equal latencies
        tie = out[8]["received_at"] - out[8]["published_at"]
        out[9]["received_at"] = out[9]["published_at"] + tie
    return out


def write_jsonl(path: Path, rows: list[dict], *, blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def to_parquet(spark, src: Path, dst: Path) -> Path:
    spark.read.schema(records.spark_schema()).json(str(src)).write.parquet(str(dst))
    return dst


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("latency")
    a = write_jsonl(root / "a.jsonl", make_records(1, 2500, small_groups=True), blank_after=100)
    b = write_jsonl(root / "b.jsonl", make_records(2, 1500))
    return {"a": a, "b": b, "b_parquet": to_parquet(spark, b, root / "b.parquet"), "root": root}


def assert_same(got, want) -> None:
    """Every group and figure equal: exactly, except mean/variance/stddev (rel 1e-9)."""
    assert got.by == want.by
    assert [g.keys for g in got.groups] == [g.keys for g in want.groups]
    for g, w in zip(got.groups, want.groups, strict=True):
        where = f"group {g.keys}"
        for name in ("count", "min", "p50", "p95", "p99", "max", "negative"):
            assert getattr(g, name) == getattr(w, name), f"{where}: {name}"
        for name in ("mean", "variance", "stddev"):
            assert math.isclose(getattr(g, name), getattr(w, name), rel_tol=1e-9, abs_tol=1e-9), (
                f"{where}: {name} {getattr(g, name)} != {getattr(w, name)}"
            )


# --- definitions ---------------------------------------------------------------------------


def test_nearest_rank():
    assert nearest_rank(50, 1) == nearest_rank(99, 1) == 1
    assert nearest_rank(50, 4) == 2
    assert nearest_rank(50, 5) == 3
    assert nearest_rank(95, 20) == 19
    assert nearest_rank(95, 21) == 20
    assert nearest_rank(99, 100) == 99
    assert nearest_rank(99, 101) == 100


def test_group_keys():
    assert GroupKey.parse("hops").field == "hops"
    assert GroupKey.parse("size").field == "size"
    assert GroupKey.parse("tags.size").tags == ("size",)
    assert GroupKey.parse("matching_rate").tags == ("matching_rate",)
    assert GroupKey.parse("rate").tags == ("rate", "publish_rate")
    assert [k.name for k in parse_by(["matching_rate,rate", "hops"])] == [
        "matching_rate",
        "rate",
        "hops",
    ]
    for bad in (["count"], ["hops,hops"], ["tags."], ["tags"]):
        with pytest.raises(UserInputError):
            parse_by(bad)
    assert tag_value("100") == 100 and tag_value("0.50") == 0.5 and tag_value("1e3") == 1000.0
    assert tag_value("01") == "01" and tag_value("content") == "content"


# --- --by names that are neither fields nor tags ---------------------------------------------


def test_bare_names_are_implied_tags_that_must_exist(tmp_path):
    assert GroupKey.parse("matching_rate").implied and GroupKey.parse("rate").implied
    assert not GroupKey.parse("tags.nosuch").implied and not GroupKey.parse("hops").implied
    rows = make_records(5, 30)
    for row in rows:
        row.pop("tags", None)
    rows[20]["tags"] = {"matching_rate": 50, "publish_rate": 10}
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    sources = record_sources([path])
    keys = parse_by(["matching_rate,rate,tags.nosuch,hops"])
    assert scan_tags(keys, sources) == {"matching_rate", "publish_rate"}
    check_tags(keys, {"matching_rate", "publish_rate"})  # rate is publish_rate here
    with pytest.raises(UserInputError) as caught:
        check_tags(parse_by(["hop"]), scan_tags(parse_by(["hop"]), sources))
    assert str(caught.value) == (
        "--by hop: not a record field, and no record has the tag 'hop' (fields: event_id, "
        "pubend, tick, publisher_broker, subscriber_broker, client, published_at, received_at, "
        "size, hops; tags in these records: matching_rate, publish_rate; tags.NAME groups by a "
        "tag even where no record has it)"
    )
    with pytest.raises(UserInputError, match="'rate' or 'publish_rate'.*have no tags"):
        check_tags(parse_by(["rate"]), set())


def test_scan_tags_stops_early_and_gives_up_where_spark_must_decide(tmp_path, inputs):
    keys = parse_by(["matching_rate"])
    rows = make_records(6, 40)
    path = tmp_path / "r.jsonl"
    # a broken line after the first record: found before it, so never read
    path.write_text(json.dumps(rows[0]) + "\n{broken\n", encoding="utf-8")
    assert "matching_rate" in scan_tags(keys, record_sources([path]))
    assert scan_tags(parse_by(["hops"]), record_sources([path])) == set()  # nothing to look for
    big = write_jsonl(tmp_path / "big.jsonl", rows)
    assert scan_tags(parse_by(["nosuch"]), record_sources([big]), limit=1000) is None
    assert scan_tags(keys, record_sources([inputs["b_parquet"]])) is None


def test_cli_unknown_by_name_is_one_error_before_spark(inputs, monkeypatch):
    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started for a --by name the records could have refused")

    monkeypatch.setattr(stats_latency.sparkjob, "session", no_spark)
    result = run(inputs["a"], "--by", "hops,nosuchfield")
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: --by nosuchfield: not a record field, and no record has")
    assert "fields: event_id, pubend" in line and "tags.NAME" in line
    assert "tags in these records: matching_rate, publish_rate, rate, routing, size" in line
    assert result.stdout == ""


def test_spark_refuses_an_unknown_by_name_in_parquet(spark, inputs):
    with pytest.raises(UserInputError) as caught:
        latency_stats(spark, [inputs["b_parquet"]], by=parse_by(["hops,nosuchfield"]))
    message = str(caught.value)
    assert message.startswith("--by nosuchfield: not a record field, and no record has")
    assert "tags in these records: matching_rate, publish_rate, rate, routing, size" in message


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"event_id": "x"}', "no pubend"),
        ("tick", "not JSON"),
    ],
)
def test_parse_record_says_why(line, why):
    with pytest.raises(records.RecordError, match=why):
        records.parse_record(line)


def test_parse_record_types():
    good = make_records(0, 1)[0]
    assert records.parse_record(json.dumps(good))["tags"]["matching_rate"] == str(
        good["tags"]["matching_rate"]
    )
    assert records.parse_record("  ") is None
    for field, value, why in (
        ("tick", "5", "must be an integer"),
        ("tick", 1.0, "must be an integer"),
        ("hops", True, "must be an integer"),
        ("published_at", -1, "must not be negative"),
        ("size", 2**63, "outside the 64-bit"),
        ("tags", [1], "tags must be an object"),
        ("received_at", None, "received_at is null"),
    ):
        with pytest.raises(records.RecordError, match=why):
            records.parse_record(json.dumps({**good, field: value}))
    assert records.parse_record(json.dumps({**good, "client": 7}))["client"] == "7"


def test_hand_computed(spark, tmp_path):
    """Latencies 1, 2, 2, 9 µs: mean 3.5, population variance 10.25, p50 2, p95 = p99 = 9."""
    rows = make_records(0, 4)
    for row, lat in zip(rows, (1000, 2000, 2000, 9000), strict=True):
        row["received_at"] = row["published_at"] + lat
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    for stats in (latency_stats(spark, [path]), reference_latency([path])):
        (g,) = stats.groups
        assert (g.count, g.min, g.p50, g.p95, g.p99, g.max) == (4, 1.0, 2.0, 9.0, 9.0, 9.0)
        assert g.mean == pytest.approx(3.5) and g.variance == pytest.approx(10.25)
        assert g.stddev == pytest.approx(10.25**0.5)


# --- Spark against the reference -------------------------------------------------------------


@pytest.mark.parametrize(
    "by",
    [
        [],
        ["matching_rate,rate"],
        ["hops", "size"],
        ["subscriber_broker,tags.size,routing"],
        ["client"],
        ["publisher_broker,pubend,hops,rate"],
    ],
)
def test_jsonl_matches_reference(spark, inputs, by):
    keys = parse_by(by)
    paths = [inputs["a"], inputs["b"]]
    got = latency_stats(spark, paths, by=keys)
    want = reference_latency(paths, by=[k.name for k in keys])
    assert_same(got, want)
    assert got.records == 4000
    if "client" in got.by:
        counts = {g.keys: g.count for g in got.groups}
        assert counts[("lonely",)] == 1 and counts[("pair",)] == 2
    if not by:
        # the mix really exercises both passes and every sign of latency
        (g,) = got.groups
        assert g.negative > 0 and g.min < 0 < g.p50 and g.max > 10_000  # µs


def test_parquet_and_mixed_inputs(spark, inputs):
    keys = parse_by(["matching_rate,rate,hops"])
    names = [k.name for k in keys]
    only_b = latency_stats(spark, [inputs["b_parquet"]], by=keys)
    assert_same(only_b, reference_latency([inputs["b"]], by=names))
    mixed = latency_stats(spark, [inputs["a"], inputs["b_parquet"]], by=keys)
    assert_same(mixed, reference_latency([inputs["a"], inputs["b"]], by=names))
    # a directory holding a.jsonl, b.jsonl and b.parquet/: all three are read
    assert_same(
        latency_stats(spark, [inputs["root"]], by=parse_by(["rate"])),
        reference_latency([inputs["a"], inputs["b"], inputs["b"]], by=["rate"]),
    )


def test_approx_within_a_bucket(spark, inputs):
    keys = parse_by(["matching_rate"])
    exact = latency_stats(spark, [inputs["a"]], by=keys)
    approx = latency_stats(spark, [inputs["a"]], by=keys, exact=False)
    assert not approx.exact and approx.to_json()["percentiles"].startswith("bucket")
    for e, a in zip(exact.groups, approx.groups, strict=True):
        assert (a.keys, a.count, a.min, a.max) == (e.keys, e.count, e.min, e.max)
        for name in ("p50", "p95", "p99"):
            want = getattr(e, name)
            bound = abs(want) / (2 ** (MANTISSA_BITS - 1) - 1) + 1e-9
            assert abs(getattr(a, name) - want) <= bound, (a.keys, name)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda r: json.dumps(r)[:-3], "not JSON"),
        (lambda r: json.dumps({**r, "tick": "x"}), "tick must be an integer"),
        (
            lambda r: json.dumps({k: v for k, v in r.items() if k != "received_at"}),
            "no received_at",
        ),
        (lambda r: json.dumps({**r, "published_at": -5}), "published_at must not be negative"),
    ],
)
def test_bad_record_names_file_and_line(spark, tmp_path, change, why):
    rows = make_records(3, 50)
    lines = [json.dumps(r) for r in rows]
    lines[36] = change(rows[36])
    good = write_jsonl(tmp_path / "good.jsonl", rows[:10])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserInputError) as caught:
        latency_stats(spark, [good, bad], by=parse_by(["hops"]))
    message = str(caught.value)
    assert message.startswith(f"{bad}:37: "), message
    assert why in message and "\n" not in message
    with pytest.raises(UserInputError, match=f"{bad}:37: "):
        reference_latency([good, bad])


def test_bad_parquet(spark, tmp_path, inputs):
    frame = spark.read.parquet(str(inputs["b_parquet"]))
    no_hops = tmp_path / "no_hops.parquet"
    frame.drop("hops").write.parquet(str(no_hops))
    with pytest.raises(UserInputError, match="no column 'hops'"):
        latency_stats(spark, [no_hops])
    from pyspark.sql import functions as F

    null_size = tmp_path / "null_size.parquet"
    frame.withColumn("size", F.lit(None).cast("long")).write.parquet(str(null_size))
    with pytest.raises(UserInputError, match=r"null_size\.parquet.*: a record with no size"):
        latency_stats(spark, [null_size])


def test_missing_and_empty_inputs(spark, tmp_path):
    with pytest.raises(UserInputError, match="no such file or directory"):
        latency_stats(spark, [tmp_path / "nope.jsonl"])
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserInputError, match="no delivery records"):
        latency_stats(spark, [tmp_path / "empty.jsonl"])
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.txt").write_text("x", encoding="utf-8")
    with pytest.raises(UserInputError, match="no .jsonl, .json or .parquet files"):
        latency_stats(spark, [tmp_path / "dir"])


# --- the command ------------------------------------------------------------------------------

app = typer.Typer()
command(app, "latency")(stats_latency.latency)


@app.callback()
def _group() -> None:
    """A group, so the command is called by name as under ``ges stats``."""


def run(*args) -> object:
    return CliRunner().invoke(app, ["latency", *map(str, args), "--master", "local[2]"])


def test_cli_json_csv_parquet_plot(spark, inputs, tmp_path):
    csv_path, png, pq = tmp_path / "s.csv", tmp_path / "s.png", tmp_path / "s.parquet"
    result = run(
        inputs["a"],
        "--by",
        "matching_rate,rate",
        "--by",
        "size",
        "--json",
        "--csv",
        csv_path,
        "--plot",
        png,
        "--parquet",
        pq,
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["by"] == ["matching_rate", "rate", "size"] and doc["unit"] == "us"
    assert doc["records"] == 2500 and doc["variance"] == "population"
    want = reference_latency([inputs["a"]], by=["matching_rate", "rate", "size"])
    assert len(doc["groups"]) == len(want.groups)
    for group, w in zip(doc["groups"], want.rows(), strict=True):
        assert set(group) == set(w)
        for name in ("matching_rate", "rate", "size", "count", "p50", "p95", "p99", "max", "min"):
            assert group[name] == w[name], name
        assert math.isclose(group["mean"], w["mean"], rel_tol=1e-9)
        assert math.isclose(group["variance"], w["variance"], rel_tol=1e-9)
    assert "negative" in result.stderr and "warning:" in result.stderr

    with open(csv_path, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == len(doc["groups"])
    for row, group in zip(rows, doc["groups"], strict=True):
        assert {k: (json.loads(v) if v else None) for k, v in row.items()} == group

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    back = spark.read.parquet(str(pq)).collect()
    assert sorted(map(repr, map(tuple, back))) == sorted(
        repr(tuple(g.values())) for g in doc["groups"]
    )


def test_cli_table_and_plot_without_tags(inputs, tmp_path):
    png = tmp_path / "hops.png"
    result = run(inputs["b"], "--by", "hops", "--plot", png)
    assert result.exit_code == 0, result.output
    assert "latency in µs" in result.stdout and "p99" in result.stdout
    assert png.exists()
    # one line per group, every cell whole: no column folds when output is a pipe
    rows = [ln for ln in result.stdout.splitlines() if re.match(r"│ *\d+ *│", ln)]
    assert [int(r.split("│")[1]) for r in rows] == [1, 2, 3, 4, 5, 6]
    header = next(ln for ln in result.stdout.splitlines() if "p99" in ln)
    names = [c.strip() for c in header.split("┃")[1:-1]]
    whole = re.compile(r"-?\d{1,3}(,\d{3})*\.\d")  # a folded "1,234,5" / "67.8" is not
    for r in rows:
        cells = dict(zip(names, (c.strip() for c in r.split("│")[1:-1]), strict=True))
        for name in ("mean", "stddev", "min", "p50", "p95", "p99", "max"):
            assert whole.fullmatch(cells[name]), (name, r)


def test_cli_malformed_line_is_one_error(tmp_path):
    rows = make_records(4, 20)
    lines = [json.dumps(r) for r in rows]
    lines[4] = json.dumps({**rows[4], "hops": "three"})
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run(path)
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith(f"error: {path}:5: ") and "hops" in line
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no such file or directory"),
        (["{a}", "--plot", "{tmp}/x.png"], "--plot: nothing to plot against"),
        (["{a}", "--by", "max"], "statistic's column"),
        (["{a}", "--conf", "nonsense"], "--conf"),
        (["{a}", "--parquet", "{tmp}"], "not Spark output"),
    ],
)
def test_cli_usage_errors_before_spark(inputs, tmp_path, args, message):
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    subst = {"missing": tmp_path / "missing.jsonl", "a": inputs["a"], "tmp": tmp_path}
    result = run(*(a.format(**subst) for a in args))
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert (tmp_path / "keep.txt").exists()


def test_cli_without_java_is_one_line(inputs, monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    result = run(inputs["a"])
    assert result.exit_code == 1, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "Java not found" in line
