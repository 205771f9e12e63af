"""Fixtures of the CLI tests."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import DIAMOND, on_free_ports


@pytest.fixture
def diamond_file(tmp_path):
    """The diamond topology (tests.conftest) on free ports, as a file."""
    path = tmp_path / "diamond.yaml"
    path.write_text(yaml.safe_dump(on_free_ports(DIAMOND)))
    return path
