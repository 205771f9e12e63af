"""Every way a topology file can be wrong: exit 2, one line naming the file, the place, the problem.

These go through the real CLI (``ges topology check``), so they also pin the rule that bad input
never shows a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ges.topology import Topology

GOOD = """\
name: small
brokers:
  b1: {unit: SSC-A/SC-1/c1, port: 7001}
  b2: {unit: SSC-A/SC-1/c1, port: 7002}
  b3: {unit: SSC-A/SC-2/c2, port: 7003}
  b4: {unit: SSC-B/SC-3/c3, port: 7004}
links:
  - [b1, b2]
  - [b2, b3]
  - [b3, b4]
replicators:
  - {unit: SSC-A, broker: b1}
"""


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the first line containing ``needle``."""
    for i, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in text")


def assert_one_line_error(result, path, *fragments: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == ""
    message = result.stderr.strip()
    assert "\n" not in message, message
    assert "Traceback" not in result.output
    assert message.startswith("error: ")
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def test_good_file_passes(ges, write):
    path = write(GOOD)
    result = ges("topology", "check", path)
    assert result.exit_code == 0, result.output
    assert f"{path}: ok" in result.stdout
    assert "4 brokers, 3 links, depth 3" in result.stdout
    assert result.stderr == ""


def test_malformed_yaml_names_the_line(ges, write):
    text = GOOD.replace("port: 7003}", "port: 7003")  # an unclosed flow mapping
    path = write(text)
    msg = assert_one_line_error(ges("topology", "check", path), path, "malformed YAML")
    # the parser notices on the line after the unclosed brace; either is a useful pointer
    lines = {line_of(text, "b3: {"), line_of(text, "b3: {") + 1}
    assert any(f"{path}:{n}:" in msg for n in lines), msg


def test_unknown_broker_in_a_link(ges, write):
    text = GOOD.replace("  - [b3, b4]", "  - [b3, b9]")
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        f"{path}:{line_of(text, '[b3, b9]')}:",
        "link [b3, b9]",
        "unknown broker 'b9'",
    )


def test_mixed_depths(ges, write):
    text = GOOD.replace("unit: SSC-B/SC-3/c3", "unit: SC-3/c3")
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        f"{path}:{line_of(text, 'unit: SC-3/c3')}:",
        "broker b4",
        "mixed depths",
    )


def test_unit_over_the_block_limit(ges, write):
    text = "block_limit: 2\n" + GOOD.replace("SSC-A/SC-2/c2", "SSC-A/SC-1/c1")
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        "unit SSC-A/SC-1/c1",
        "3 members, over the block limit of 2",
    )


def test_cluster_of_65_brokers_is_over_the_default_block_limit(ges, write):
    brokers = "".join(f"  b{i}: {{unit: A/c1, port: {7000 + i}}}\n" for i in range(1, 66))
    links = "".join(f"  - [b{i}, b{i + 1}]\n" for i in range(1, 65))
    path = write(f"name: big\nbrokers:\n{brokers}links:\n{links}")
    assert_one_line_error(
        ges("topology", "check", path), path, "unit A/c1", "65 members, over the block limit of 64"
    )


def test_duplicate_host_and_port(ges, write):
    text = GOOD.replace(
        "b4: {unit: SSC-B/SC-3/c3, port: 7004}", "b4: {unit: SSC-B/SC-3/c3, port: 7002}"
    )
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        f"{path}:{line_of(text, 'b4: {')}:",
        "broker b4",
        "duplicate address 127.0.0.1:7002",
        "also broker b2",
    )


def test_same_port_on_different_hosts_is_fine(ges, write):
    text = GOOD.replace(
        "b4: {unit: SSC-B/SC-3/c3, port: 7004}",
        "b4: {unit: SSC-B/SC-3/c3, host: 10.0.0.2, port: 7002}",
    )
    assert ges("topology", "check", write(text)).exit_code == 0


def test_self_link(ges, write):
    text = GOOD.replace("  - [b3, b4]", "  - [b3, b4]\n  - [b2, b2]")
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        f"{path}:{line_of(text, '[b2, b2]')}:",
        "link [b2, b2]",
        "self-link",
    )


@pytest.mark.parametrize("again", ["[b2, b1]", "[b1, b2]"])
def test_duplicate_link_either_way_round(ges, write, again):
    text = GOOD.replace("  - [b3, b4]", f"  - [b3, b4]\n  - {again}")
    path = write(text)
    first = line_of(text, "[b1, b2]")
    dup = len(text.splitlines()[: line_of(text, "[b3, b4]")]) + 1
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        f"{path}:{dup}:",
        f"link {again}",
        f"duplicate link (first at line {first})",
    )


def test_replicator_on_an_unknown_unit(ges, write):
    text = GOOD.replace("{unit: SSC-A, broker: b1}", "{unit: SSC-Z, broker: b1}")
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        f"{path}:{line_of(text, 'SSC-Z')}:",
        "replicator SSC-Z at b1",
        "unknown unit SSC-Z",
    )


def test_replicator_on_a_broker_outside_its_unit(ges, write):
    text = GOOD.replace("{unit: SSC-A, broker: b1}", "{unit: SSC-A, broker: b4}")
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        "replicator SSC-A at b4",
        "broker b4 is in SSC-B/SC-3/c3, outside unit SSC-A",
    )


def test_replicator_on_an_unknown_broker(ges, write):
    text = GOOD.replace("{unit: SSC-A, broker: b1}", "{unit: SSC-A, broker: b99}")
    path = write(text)
    assert_one_line_error(ges("topology", "check", path), path, "unknown broker 'b99'")


def test_broker_graph_not_connected(ges, write):
    text = GOOD.replace("  - [b3, b4]\n", "")
    path = write(text)
    assert_one_line_error(
        ges("topology", "check", path),
        path,
        "broker graph is not connected: 2 components",
        "b4 cannot reach broker b1",
    )


def test_unit_not_connected_inside_itself_is_a_warning(ges, write):
    # b1 and b2 share cluster c1 but meet only through b3, which is in the next cluster
    text = GOOD.replace("  - [b1, b2]\n  - [b2, b3]", "  - [b1, b3]\n  - [b2, b3]")
    text = text.replace("SSC-A/SC-2/c2", "SSC-A/SC-1/c2")
    path = write(text)
    result = ges("topology", "check", path)
    assert result.exit_code == 0, result.output
    assert f"{path}: ok" in result.stdout
    assert "1 warnings" in result.stdout
    warning = result.stderr.strip()
    assert "\n" not in warning
    assert warning.startswith("warning: ")
    assert "unit SSC-A/SC-1/c1" in warning and "not connected inside it" in warning


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty topology file"),
        ("- just a list\n", "top level must be a mapping"),
        (GOOD.replace("name: small", "name: small\ncolour: blue"), "unknown key 'colour'"),
        (GOOD.replace("port: 7001", "port: 70001"), "port must be an integer in 1..65535"),
        (GOOD.replace("port: 7001}", "port: 7001, rack: 3}"), "unknown key 'rack'"),
        (
            GOOD.replace("  - [b3, b4]", "  - [b3, b4, {cost: -1}]"),
            "cost must be a positive number",
        ),
        (
            GOOD.replace("port: 7001}", "port: 7001, metrics_port: 0}"),
            "metrics_port must be an integer in 1..65535, got 0",
        ),
        (
            GOOD.replace("port: 7001}", "port: 7001, metrics_port: 7004}"),
            "broker b1: metrics_port 7004 on 127.0.0.1 is also broker b4's port",
        ),
        (
            GOOD.replace("port: 7001}", "port: 7001, metrics_port: 9100}").replace(
                "port: 7002}", "port: 7002, metrics_port: 9100}"
            ),
            "broker b2: metrics_port 9100 on 127.0.0.1 is also broker b1's metrics_port",
        ),
        (
            GOOD.replace("port: 7001}", "port: 7001, mqtt_ws_port: true}"),
            "mqtt_ws_port must be an integer in 1..65535, got True",
        ),
        (
            GOOD.replace("port: 7001}", "port: 7001, mqtt_port: 1883, mqtt_ws_port: 1883}"),
            "broker b1: mqtt_ws_port 1883 on 127.0.0.1 is also broker b1's mqtt_port",
        ),
        (
            GOOD.replace("name: small", "name: small\nmqtt: {max_keepalive: 0}"),
            "mqtt.max_keepalive must be whole seconds from 1 to 65535 (or like 60s, 5m), got 0",
        ),
        (
            GOOD.replace("name: small", "name: small\nmqtt: {keepalive: 60}"),
            "'mqtt' must be {max_keepalive: SECONDS}",
        ),
        (
            GOOD.replace("name: small", "name: small\nmqtt: {max_keepalive: .inf}"),
            "mqtt.max_keepalive must be whole seconds from 1 to 65535 (or like 60s, 5m), got inf",
        ),
        (
            GOOD.replace("name: small", "name: small\nmqtt: {max_keepalive: .nan}"),
            "mqtt.max_keepalive must be whole seconds from 1 to 65535 (or like 60s, 5m), got nan",
        ),
    ],
)
def test_other_rejections_are_one_line_too(ges, write, text, fragment):
    path = write(text)
    assert_one_line_error(ges("topology", "check", path), path, fragment)


def test_missing_file(ges, tmp_path):
    path = tmp_path / "nope.yaml"
    assert_one_line_error(ges("topology", "check", path), path, "no such topology file")


def test_check_reports_every_file_and_fails_if_any_is_bad(ges, write):
    good = write(GOOD, "good.yaml")
    bad = write(GOOD.replace("  - [b3, b4]", "  - [b3, b9]"), "bad.yaml")
    result = ges("topology", "check", good, bad)
    assert result.exit_code == 2
    assert f"{good}: ok" in result.stdout
    assert result.stderr.count("\n") == 1 and f"{bad}:" in result.stderr


def test_check_json(ges, write):
    good = write(GOOD, "good.yaml")
    warned = write(
        GOOD.replace("  - [b1, b2]\n  - [b2, b3]", "  - [b1, b3]\n  - [b2, b3]").replace(
            "SSC-A/SC-2/c2", "SSC-A/SC-1/c2"
        ),
        "warned.yaml",
    )
    bad = write(GOOD.replace("  - [b3, b4]", "  - [b3, b9]"), "bad.yaml")

    result = ges("topology", "check", "--json", good, warned)
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["ok"] is True
    first, second = report["files"]
    assert first == {
        "file": str(good),
        "ok": True,
        "name": "small",
        "brokers": 4,
        "links": 3,
        "gateways": 2,
        "depth": 3,
        "units": 8,
        "replicators": 1,
        "warnings": [],
        "digest": Topology.from_yaml(good).digest,
    }
    assert len(second["warnings"]) == 1 and "SSC-A/SC-1/c1" in second["warnings"][0]

    result = ges("topology", "check", "--json", good, bad)
    assert result.exit_code == 2
    report = json.loads(result.stdout)  # stdout is still exactly one JSON object
    assert report["ok"] is False
    assert report["files"][1]["ok"] is False
    assert "unknown broker 'b9'" in report["files"][1]["error"]


@pytest.mark.parametrize(
    "args",
    [
        ["topology", "check"],
        ["topology", "check", "--bogus", "x.yaml"],
        ["topology", "show"],
        ["topology", "show", "x.yaml", "--depth", "0"],
        ["topology", "generate", "--levels", "many"],
    ],
)
def test_bad_flags_are_one_line_with_exit_2(ges, args):
    result = ges(*args)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert "\n" not in message, message
    assert message.startswith("error: ges topology ")


def test_real_process_bad_file(tmp_path):
    """Once through a real interpreter: exit status 2, one stderr line, no traceback."""
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(GOOD).replace("  - [b3, b4]", "  - [b3, b3]"))
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "topology", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "self-link" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["check", "show", "generate"])
def test_every_command_has_help(ges, command):
    result = ges("topology", command, "--help")
    assert result.exit_code == 0
    assert "Usage" in result.stdout
    assert len(result.stdout.strip().splitlines()) > 3


@pytest.mark.parametrize("key", ["metrics_port", "mqtt_port", "mqtt_ws_port"])
def test_a_brokers_other_ports_are_kept_but_are_not_part_of_the_networks_identity(key):
    with_port = Topology.from_yaml_text(GOOD.replace("port: 7001}", f"port: 7001, {key}: 9100}}"))
    plain = Topology.from_yaml_text(GOOD)
    assert (
        getattr(with_port.brokers["b1"], key) == 9100 and getattr(plain.brokers["b1"], key) is None
    )
    assert with_port.digest == plain.digest
    assert Topology.from_dict(with_port.to_dict()) == with_port


def test_an_mqtt_keepalive_bound_reads_back_and_leaves_the_digest_alone():
    base = Topology.from_yaml_text(GOOD)
    bounded = Topology.from_yaml_text(
        GOOD.replace("name: small", "name: small\nmqtt:\n  max_keepalive: 2m")
    )
    assert base.mqtt.max_keepalive is None and bounded.mqtt.max_keepalive == 120
    assert Topology.from_dict(bounded.to_dict()) == bounded and "mqtt" not in base.to_dict()
    assert bounded.digest == base.digest  # how brokers serve MQTT is not the network's identity
