"""``ges``: the Grid Event Service command line."""

from __future__ import annotations

import typer

from cli import link, network, profile, pubsub, simulate, stats
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
command(app)(network.up)
command(app)(network.broker)
command(app)(pubsub.publish)
command(app)(pubsub.subscribe)
command(app)(simulate.simulate)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
