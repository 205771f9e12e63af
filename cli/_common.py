"""Helpers every command shares: one-line errors, consoles, topology loading."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path

import attrs
import typer
from rich.console import Console, ConsoleDimensions
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from ges.errors import GesError, UserInputError, find_ges_error
from ges.topology import Topology

try:  # recent typer releases carry their own copy of click; older ones use click itself
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import UsageError

#: Width of results written to a file or a pipe: wide enough that no table is folded (a folded
#: number is unreadable and splits a row over lines a script cannot join); tables still take only
#: the width their cells need.
FILE_WIDTH = 10_000


class ResultConsole(Console):
    """A console that wraps to the terminal on a terminal and never wraps in a file or a pipe.

    Rich takes the terminal's width even when stdout is redirected (it asks stdin and stderr),
    or 80 columns, and folds tables to fit: ``ges stats latency > file`` split numbers across
    lines.
    """

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        if self.is_terminal:
            return size
        return ConsoleDimensions(max(size.width, FILE_WIDTH), size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


#: Results (tables, JSON) go to stdout; progress, logs and errors to stderr.
out = ResultConsole(highlight=False)
err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one error line on stderr and return the Exit to raise."""
    err.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    return typer.Exit(code)


def write_out(stream, text: str) -> None:
    """Write ``text`` to ``stream`` whole and flush it.

    ``TextIOWrapper.write`` cannot be trusted with a signal: when one (a ^C, which trio turns
    into a later exception) interrupts a blocking write to a full pipe, the buffered layer
    writes what it could and the text layer reports every character written — the rest is
    silently dropped (CPython 3.11, 64 KiB of 285 KiB written). The binary layer's count is
    honest, so loop on it."""
    stream.flush()
    raw = getattr(stream, "buffer", None)
    if raw is None:  # a StringIO and the like
        stream.write(text)
        return
    view = memoryview(text.encode(stream.encoding or "utf-8", "replace"))
    while view:
        view = view[raw.write(view) :]
    raw.flush()


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
            if found is not None:
                raise fail(str(found), found.exit_code) from None
            if group.split(KeyboardInterrupt)[1] is None:
                # a second ^C while a network stops (trio's own handler is back by then, and
                # raises it inside whatever task was closing): stopped all the same
                raise typer.Exit(130) from None
            raise

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


#: Options every ``ges stats`` command shares: where Spark runs, and settings passed through.
SPARK_MASTER = typer.Option(
    "local[*]",
    "--master",
    help="Spark master: local[*] (every core here), local[N], spark://HOST:7077, yarn, …",
)
SPARK_CONF = typer.Option(
    [],
    "--conf",
    metavar="KEY=VALUE",
    help="A Spark setting, passed through (repeatable), e.g. spark.driver.memory=8g.",
)


def key_values(pairs, option: str, example: str) -> dict[str, str]:
    """Repeated ``OPTION KEY=VALUE`` options as a dict; a pair without ``=`` is one error line."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserInputError(f"{option} {pair!r}: expected KEY=VALUE (e.g. {example})")
        out[key.strip()] = value
    return out


def parse_tags(pairs) -> dict[str, str]:
    """``--tag KEY=VALUE`` options (delivery records' experiment tags)."""
    return key_values(pairs, "--tag", "rate=1000")


def parse_spark_conf(pairs) -> dict[str, str]:
    """``--conf KEY=VALUE`` options (Spark settings passed through)."""
    return key_values(pairs, "--conf", "spark.executor.memory=2g")


def is_tty() -> bool:
    return sys.stderr.isatty()


def _usage_line(exc: UsageError, info_name: str) -> typer.Exit:
    # a group given nothing shows its help (typer prints it; without rich it is the message)
    # and exits 2 like click, with no empty error line after it
    if type(exc).__name__ == "NoArgsIsHelpError":
        if exc.format_message().strip():
            typer.echo(exc.format_message())
        return typer.Exit(2)
    where = exc.ctx.command_path if exc.ctx is not None else info_name
    return fail(f"{where}: {exc.format_message()}", 2)


class OneLineUsageCommand(TyperCommand):
    """Report a bad flag or argument as one ``error:`` line with exit code 2, like bad input."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as exc:
            raise _usage_line(exc, info_name) from None


class OneLineUsageGroup(TyperGroup):
    """The same for a command group: an unknown command or a bad group flag is one line."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as exc:
            raise _usage_line(exc, info_name) from None

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except UsageError as exc:
            raise _usage_line(exc, ctx.command_path) from None


def command(app: typer.Typer, name: str | None = None):
    """Register a command with one-line usage errors and its docstring's paragraphs reflowed.

    Typer keeps a docstring's source line breaks, which read badly once the terminal rewraps them.
    """

    def register(fn):
        doc = inspect.cleandoc(fn.__doc__ or "")
        paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
        return app.command(name, cls=OneLineUsageCommand, help="\n\n".join(paragraphs))(fn)

    return register


#: ``--certs DIR``: the network's certificate directory (``ges certs init``).
CERTS = typer.Option(
    None,
    "--certs",
    help="The network's certificate directory (default: .ges/NAME/certs, where `ges up` makes "
    "it on its first start).",
    metavar="DIR",
)
#: ``--insecure``: plain TCP, no identities, no permissions.
INSECURE = typer.Option(
    False,
    "--insecure",
    help="Plain TCP: no TLS, no identities, no permissions — anyone who can reach a broker's "
    "port may do anything. For tests and benchmarks on a trusted host.",
)
#: ``--client NAME`` of a command that only connects: who it is over TLS.
CLIENT_AS = typer.Option(
    None,
    "--client",
    help="Connect as client NAME: its certificate (clients/NAME.crt of the certificate "
    "directory) or the token in GES_TOKEN. Default: the admin certificate if the directory "
    "has it.",
    metavar="NAME",
)
#: The client certificate ``ges certs init`` makes with the operator role: what commands on
#: the host that made the network act as when they are given no identity of their own.
ADMIN = "admin"


def default_data_dir(topology_name: str) -> Path:
    return Path(".ges") / topology_name


def default_certs_dir(topology_name: str, data_dir: Path | None = None) -> Path:
    """Where a network's certificates (and access file) are unless ``--certs`` says."""
    return (data_dir or default_data_dir(topology_name)) / "certs"


def network_certs(
    topology: Topology,
    certs_dir: Path | None,
    insecure: bool,
    *,
    data_dir: Path | None = None,
    make: bool = False,
):
    """The network's certificate directory (a CertDir), or None under ``--insecure``.

    Without ``--certs`` it is DIR/certs of the data directory (``.ges/NAME`` by default);
    ``make``: ``ges up`` makes the CA and the certificates there if there are none yet, as
    ``ges certs init`` would. Anything else without certificates is one error line."""
    from ges.security.certs import CertDir

    if insecure:
        if certs_dir is not None:
            raise UserInputError("--insecure and --certs: give one or the other")
        return None
    root = certs_dir or default_certs_dir(topology.name, data_dir)
    certs = CertDir(root)
    first = not certs.ca_cert.exists()
    if first and not make:
        raise UserInputError(
            f"{root}: no certificates of network {topology.name} (`ges up` makes them on "
            "its first start, `ges certs init` anywhere; --certs DIR names another "
            "directory; --insecure runs without TLS)"
        )
    if make and (first or certs.ca_key.exists()):
        # the first start makes them all; later ones, those of brokers added since
        made = [p for p in init_certs(topology, root) if p.suffix == ".crt"]
        if first:
            err.print(
                f"{root}: made the network's certificates ({len(topology.brokers)} brokers, "
                f"client {ADMIN} with the operator role)",
                highlight=False,
            )
        elif made:
            err.print(f"{root}: made {len(made)} certificate(s) for brokers added", highlight=False)
    return certs


@attrs.frozen
class ClientAuth:
    """How a client command connects: its TLS context (None: plain TCP), the token it
    presents, and the client id it connects as (None: its own choice)."""

    tls: object = None
    token: str | None = None
    client_id: str | None = None

    def connect_args(self) -> dict:
        return {"tls": self.tls, "token": self.token}


def client_auth(certs, client: str | None = None) -> ClientAuth:
    """How a client command proves who it is, in this order: the certificate of ``client``
    (``--client NAME``) if the directory has it; a token in ``GES_TOKEN`` (for ``--client``);
    the ``admin`` certificate if the directory has it (the host that made the network); none."""
    if certs is None:
        return ClientAuth(client_id=client)
    from ges.security.certs import Identity
    from ges.security.tls import context

    token = os.environ.get("GES_TOKEN") or None
    if client and certs.cert("client", client).exists():
        me, token = Identity("client", client), None
    elif client and token:
        me = None
    elif certs.cert("client", ADMIN).exists():
        me, token = Identity("client", ADMIN), None
    else:
        me, token = None, None
    return ClientAuth(context(certs, me, server=False), token, client)


def init_certs(topology: Topology, certs_dir: Path) -> list[Path]:
    """The network's CA, a certificate per broker of ``topology`` and the operator's client
    certificate (``admin``) in ``certs_dir`` (only what is missing is made); the files
    written."""
    from ges.security.certs import CertDir, Identity

    certs = CertDir(certs_dir)
    brokers = {b: (spec.host,) for b, spec in topology.brokers.items()}
    written = certs.init(topology.name, brokers)
    return written + certs.add(Identity("client", ADMIN, ("operator",)))
