"""``ges topology check|show|generate``."""

from __future__ import annotations

from pathlib import Path

import typer

from cli._common import err, load_topology, one_line_errors, out

app = typer.Typer(help="Validate, draw and generate broker topologies.", no_args_is_help=True)


@app.command()
@one_line_errors
def check(
    files: list[Path] = typer.Argument(..., help="Topology YAML files to validate."),
) -> None:
    """Validate topology files; exit 2 with one line naming the file, place and problem."""
    for path in files:
        t = load_topology(path)
        out.print(
            f"{path}: ok — {len(t.brokers)} brokers, {len(t.links)} links, depth {t.depth}, "
            f"{len(t.gateways())} gateways"
        )
    _ = err
