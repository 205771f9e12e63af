"""The ``ges`` command itself: bad --log-level."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "topologies" / "demo.yaml"


def ges(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


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
