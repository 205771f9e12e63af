"""Helpers every command shares: one-line errors, consoles, topology loading."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from ges.errors import GesError, UserInputError, find_ges_error
from ges.topology import Topology

#: Results (tables, JSON) go to stdout; progress, logs and errors to stderr.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one error line on stderr and return the Exit to raise."""
    err.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    return typer.Exit(code)


def one_line_errors(fn):
    """Turn GesError (and stray OSErrors) into one line and the documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GesError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BaseExceptionGroup as group:
            found = find_ges_error(group)
            if found is None:
                raise
            raise fail(str(found), found.exit_code) from None

    return wrapper


def load_topology(path: Path, *, show_warnings: bool = True) -> Topology:
    topology = Topology.from_yaml(path)
    if show_warnings:
        for warning in topology.warnings:
            err.print(Text.assemble(("warning: ", "yellow"), warning), soft_wrap=True)
    return topology


def resolve_broker(topology: Topology, broker_id: str) -> str:
    if broker_id not in topology.brokers:
        known = ", ".join(list(topology.brokers)[:8])
        more = ", …" if len(topology.brokers) > 8 else ""
        raise UserInputError(
            f"{topology.source}: unknown broker {broker_id!r} (brokers: {known}{more})"
        )
    return broker_id


def is_tty() -> bool:
    return sys.stderr.isatty()
