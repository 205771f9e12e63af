"""Shared fixtures for the topology tests: the real CLI in-process, YAML files in a temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app


@pytest.fixture
def ges():
    """Run ``ges ARGS…`` in-process; returns the result with stdout and stderr apart."""
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return run


@pytest.fixture
def write(tmp_path):
    """Write YAML text to a file in tmp_path and return its path."""

    def _write(text: str, name: str = "t.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write
