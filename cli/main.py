"""``ges``: the Grid Event Service command line."""

from __future__ import annotations

from importlib import metadata

import typer

from cli import certs, clients, link, monitor, network, profile, pubsub, simulate, stats, users
from cli import topology as topology_cmd
from cli._common import OneLineUsageGroup, command

app = typer.Typer(
    name="ges",
    help="GES, the Grid Event Service: content-based publish/subscribe over a hierarchy of brokers.",
    no_args_is_help=True,
    add_completion=False,
    cls=OneLineUsageGroup,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(topology_cmd.app, name="topology")
app.add_typer(profile.app, name="profile")
app.add_typer(link.app, name="link")
app.add_typer(stats.app, name="stats")
app.add_typer(certs.app, name="certs")
app.add_typer(users.app, name="users")
app.add_typer(clients.app, name="clients")
command(app)(network.up)
command(app)(network.broker)
command(app)(pubsub.publish)
command(app)(pubsub.subscribe)
command(app)(clients.roam)
command(app)(monitor.monitor)
command(app)(simulate.simulate)


def _version() -> str:
    try:
        return metadata.version("ges")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ges {_version()}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version of ges and exit.",
    ),
) -> None:
    """GES, the Grid Event Service: content-based publish/subscribe over a hierarchy of brokers."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
