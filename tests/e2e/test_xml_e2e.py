"""XML profiles and events through the CLI: ``ges profile check``, ``ges subscribe --profile``,
``ges publish --event`` over a running demo network, and hostile XML refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.test_up_e2e import ROOT, Up, demo_on_free_ports, ges, start_subscriber

EXAMPLES = ROOT / "schemas" / "examples"


def test_profile_check_draws_every_example_and_json_lists_them():
    files = sorted(EXAMPLES.glob("*.xml"))
    result = ges("profile", "check", *files)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich wraps long lines when not on a terminal
    assert "profile ibm-cheap for events of type quote" in text
    assert "symbol in ('IBM', 'HPQ', 'SUNW')" in text
    assert f"{len(files)} valid documents" in result.stderr
    as_json = ges("profile", "check", "--json", *files)
    assert as_json.returncode == 0, as_json.stderr
    docs = json.loads(as_json.stdout)["documents"]
    assert [d["file"] for d in docs] == [str(f) for f in files]
    ibm = next(d for d in docs if d.get("id") == "ibm-cheap")
    assert ibm["event_type"] == "quote"
    assert ibm["conjunctions"] == [
        [
            {"attr": "symbol", "op": "eq", "value": "IBM"},
            {"attr": "price", "op": "lt", "value": 120.0},
        ]
    ]


def _hostile(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    lol = "".join(
        f'<!ENTITY l{i} "{"&l" + str(i - 1) + ";" if i else "lol"}{("&l" + str(i - 1) + ";") * 9 if i else ""}">'
        for i in range(10)
    )
    cases = {
        "xxe": (
            '<?xml version="1.0"?>\n<!DOCTYPE p [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
            '<profile xmlns="urn:ges:profile:1" id="x"><eq attr="a" type="string">&x;</eq>'
            "</profile>",
            "DTD",
        ),
        "billion-laughs": (
            f'<?xml version="1.0"?>\n<!DOCTYPE p [{lol}]>\n'
            '<profile xmlns="urn:ges:profile:1" id="x"><eq attr="a" type="string">&l9;</eq>'
            "</profile>",
            "DTD",
        ),
        "deep": (
            '<profile xmlns="urn:ges:profile:1" id="x">'
            + "<all>" * 10_000
            + "</all>" * 10_000
            + "</profile>",
            "deeper",
        ),
        "malformed": (
            '<profile xmlns="urn:ges:profile:1" id="x">\n<eq attr="a">\n',
            "malformed XML",
        ),
        "invalid": (
            '<profile xmlns="urn:ges:profile:1" id="x">\n<like attr="a" type="string">b</like>'
            "\n</profile>",
            "like",
        ),
    }
    out = {}
    for name, (text, needle) in cases.items():
        path = tmp_path / f"{name}.xml"
        path.write_text(text)
        out[name] = (path, needle)
    big = tmp_path / "huge.xml"
    with open(big, "wb") as f:
        f.truncate(100 * 1024 * 1024)  # 100 MB (sparse)
    out["100MB"] = (big, "limit")
    return out


def test_hostile_xml_is_refused_in_one_line_each(tmp_path):
    for name, (path, needle) in _hostile(tmp_path).items():
        for args in (
            ["profile", "check", path],
            ["subscribe", ROOT / "topologies" / "demo.yaml", "--broker", "b1", "--profile", path],
        ):
            result = ges(*args, timeout=30)
            lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
            assert result.returncode == 2, (name, args, result.stderr[-500:])
            assert len(lines) == 1, (name, result.stderr[-2000:])
            assert str(path) in lines[0] and needle in lines[0], (name, lines[0])
            assert "Traceback" not in result.stderr
            assert "root:" not in result.stderr + result.stdout  # no /etc/passwd content


def test_wrong_document_kind_is_a_usage_error(tmp_path):
    topology = ROOT / "topologies" / "demo.yaml"
    result = ges("publish", topology, "--broker", "b1", "--event", EXAMPLES / "quote-ibm.xml")
    assert result.returncode == 2
    assert "quote-ibm.xml" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = ges("subscribe", topology, "--broker", "b1", "--profile", EXAMPLES / "quote-event.xml")
    assert result.returncode == 2
    assert "quote-event.xml" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_profiles_and_xml_events_end_to_end(tmp_path):
    """Across super-clusters: only the events a profile matches reach its subscriber."""
    topology = demo_on_free_ports(tmp_path)
    up = Up(topology, tmp_path / "run")
    try:
        cheap_ibm = start_subscriber(
            topology, "b20", "--profile", EXAMPLES / "quote-ibm.xml", "--count", "4",
            "--timeout", "60", *up.auth,
        )  # fmt: skip
        dear_or_trade = tmp_path / "dear-or-batch3.xml"
        dear_or_trade.write_text(
            '<profile xmlns="urn:ges:profile:1" id="dear-or-batch3">\n'
            '  <all><ge attr="price" type="float">140</ge></all>\n'
            '  <all><eq attr="batch" type="int">3</eq></all>\n'
            "</profile>\n"
        )
        other = start_subscriber(
            topology, "b16", "--profile", dear_or_trade, "--where", "symbol = IBM",
            "--count", "2", "--timeout", "60", *up.auth,
        )  # fmt: skip
        event = EXAMPLES / "quote-event.xml"  # IBM 119.5 on NYSE, type quote, volume 300
        publishes = [
            ["--event", event, "--attr", "batch=1", "--count", "3"],  # cheap IBM quotes
            ["--event", event, "--attr", "batch=2", "--attr", "price=150.0"],  # too dear
            ["--event", event, "--attr", "batch=3", "--type", "trade"],  # not a quote
            ["--event", event, "--attr", "batch=4"],  # cheap again
        ]
        for args in publishes:
            pub = ges("publish", topology, "--broker", "b1", *args, *up.auth)
            assert pub.returncode == 0, pub.stderr
        stdout, stderr = cheap_ibm.communicate(timeout=90)
        assert cheap_ibm.returncode == 0, stderr
        got = [json.loads(line) for line in stdout.splitlines()]
        assert [(r["attributes"]["batch"], r["attributes"]["n"]) for r in got] == [
            (1, 0),
            (1, 1),
            (1, 2),
            (4, 0),
        ]
        first = got[0]
        assert first["attributes"]["@type"] == "quote"
        assert first["attributes"]["symbol"] == "IBM"
        assert first["payload"] == "IBM 119.50 x 300 on NYSE"
        stdout, stderr = other.communicate(timeout=90)
        assert other.returncode == 0, stderr
        got = [json.loads(line)["attributes"] for line in stdout.splitlines()]
        assert [(a["batch"], a["price"], a["@type"]) for a in got] == [
            (2, 150.0, "quote"),
            (3, 119.5, "trade"),
        ]
    finally:
        code = up.stop()
    assert code == 0
