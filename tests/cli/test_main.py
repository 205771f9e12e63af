"""The ``ges`` command itself: --version, bad --log-level, no arguments."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "topologies" / "demo.yaml"


def ges(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_version_prints_the_installed_version():
    result = ges("--version")
    assert result.exit_code == 0
    assert result.stdout == f"ges {metadata.version('ges')}\n"
    assert result.stderr == ""


@pytest.mark.parametrize(
    "args",
    [
        ["up", DEMO, "--no-live", "--log-level", "loud"],
        ["broker", DEMO, "--id", "b1", "--log-level", "loud"],
    ],
    ids=["up", "broker"],
)
def test_bad_log_level_is_one_error_line(args):
    result = ges(*args)
    assert result.exit_code == 2
    assert result.stderr == "error: --log-level: 'loud' is not one of debug, info, warning, error\n"
    assert result.stdout == ""


@pytest.mark.parametrize("flag", ["--mqtt-port", "--mqtt-ws-port"])
@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_broker_mqtt_port_out_of_range_is_one_error_line(flag, port):
    result = ges("broker", DEMO, "--id", "b1", "--insecure", flag, port)
    assert result.exit_code == 2
    assert result.stderr == f"error: {flag} {port}: must be in 1..65535\n"


def test_no_arguments_show_help_without_an_error_line():
    for args in ([], ["topology"]):
        result = ges(*args)
        assert result.exit_code == 2
        assert "Usage:" in result.stdout
        assert "error:" not in result.output
