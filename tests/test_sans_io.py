"""The protocol packages stay sans-I/O: no clock, no randomness, no sockets, no storage, no trio.

Only ``ges/runtime`` (and the CLI) may await, read the clock or touch the network; the cores
get ``now`` passed in, so the simulator can drive them deterministically (STYLE.md, h11).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ges
from tests.test_layers import imports_of

GES = Path(ges.__file__).parent
PACKAGES = ["core", "connectivity", "matching", "routing", "reliable", "durable", "wire", "mqtt"]
#: Single sans-I/O modules of packages that also hold I/O (the monitor's model of a network).
MODULES = ["monitor/model.py"]
FORBIDDEN = {"trio", "time", "random", "socket", "sqlite3", "sqlite_utils", "asyncio"}


def imported_modules(source: str) -> set[str]:
    """Top-level names of every module imported anywhere in ``source`` (absolute imports), with
    the import forms tests/test_layers.py reads."""
    return {module.split(".")[0] for _, module, _ in imports_of(source)}


def protocol_modules() -> list[Path]:
    return sorted(
        [path for name in PACKAGES if (GES / name).is_dir() for path in (GES / name).rglob("*.py")]
        + [GES / name for name in MODULES]
    )


def test_there_are_modules_to_check():
    names = {p.relative_to(GES).parts[0] for p in protocol_modules()}
    assert {"core", "matching", "wire"} <= names


@pytest.mark.parametrize("path", protocol_modules(), ids=lambda p: str(p.relative_to(GES)))
def test_no_io_imports(path):
    bad = imported_modules(path.read_text(encoding="utf-8")) & FORBIDDEN
    assert not bad, f"{path.relative_to(GES.parent)} imports {sorted(bad)}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time", {"time"}),
        ("import os, trio.lowlevel", {"os", "trio"}),
        ("from random import Random", {"random"}),
        ("from sqlite_utils.db import Database", {"sqlite_utils"}),
        ("def f():\n    import socket\n", {"socket"}),
        ("if TYPE_CHECKING:\n    import asyncio\n", {"asyncio"}),
        ("import importlib\nimportlib.import_module('sqlite3')", {"importlib", "sqlite3"}),
        ("__import__('time')", {"time"}),
        ("from . import time", set()),  # a sibling module that happens to share the name
        ("from .time import x", set()),
        ("timeout = 1\nrandomised = True", set()),
    ],
)
def test_the_checker_sees_every_import_form(source, expected):
    assert imported_modules(source) == expected
