"""``ges certs init|client|show``: the network's CA and its brokers' and clients' certificates."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import typer
from cryptography import x509

from cli._common import (
    ADMIN,
    OneLineUsageGroup,
    command,
    default_certs_dir,
    init_certs,
    load_topology,
    one_line_errors,
    out,
)
from ges.errors import OperationError, UserInputError
from ges.security.certs import CertDir, Identity, identity_of

app = typer.Typer(
    help="Make the network's certificate authority and certificates for its brokers and clients.",
    no_args_is_help=True,
    cls=OneLineUsageGroup,
)

TOPOLOGY = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY")
OUT = typer.Option(
    None, "--out", "-o", help="Certificate directory (default: .ges/NAME/certs).", metavar="DIR"
)


def cert_dir(topology_name: str, out_dir: Path | None) -> CertDir:
    return CertDir(out_dir or default_certs_dir(topology_name))


@command(app)
def init(topology_file: Path = TOPOLOGY, out_dir: Path = OUT) -> None:
    """Make the network's CA and a certificate for each of its brokers.

    Nothing existing is replaced: run again after adding brokers to the topology, and only
    their certificates are made. Keys are written with mode 0600.
    """
    one_line_errors(_init)(topology_file, out_dir)


def _init(topology_file: Path, out_dir: Path | None) -> None:
    topology = load_topology(topology_file)
    where = cert_dir(topology.name, out_dir)
    written = init_certs(topology, where.root)
    certs = [p for p in written if p.suffix == ".crt" and p.parent.name == "brokers"]
    ca = "made" if where.ca_cert in written else "kept"
    admin = "made" if where.cert("client", ADMIN) in written else "kept"
    out.print(
        f"{where.root}: CA {ca}; {len(certs)} broker certificate(s) made, "
        f"{len(topology.brokers) - len(certs)} already there; client {ADMIN} (operator) {admin}"
    )


@command(app)
def client(
    topology_file: Path = TOPOLOGY,
    name: str = typer.Argument(..., help="The client's name (its identity).", metavar="NAME"),
    roles: list[str] = typer.Option(
        [], "--role", "-r", help="A role its permissions are looked up by (repeatable)."
    ),
    out_dir: Path = OUT,
) -> None:
    """Make a certificate for client NAME, signed by the network's CA (`ges certs init` first)."""
    one_line_errors(_client)(topology_file, name, tuple(roles), out_dir)


def _client(topology_file: Path, name: str, roles: tuple[str, ...], out_dir: Path | None) -> None:
    topology = load_topology(topology_file)
    where = cert_dir(topology.name, out_dir)
    if where.ca_cert.exists() and where.network() != topology.name:
        raise OperationError(f"{where.ca_cert}: the CA of network {where.network()!r}")
    written = where.add(Identity("client", name, roles))
    if not written:
        raise UserInputError(
            f"{where.cert('client', name)}: client {name!r} has a certificate already"
        )
    out.print(f"{where.cert('client', name)} and its key: client {name}" + _roles(roles))


def _roles(roles: tuple[str, ...]) -> str:
    return f", roles {', '.join(roles)}" if roles else ""


@command(app)
def show(
    cert_file: Path = typer.Argument(..., help="A certificate (PEM).", metavar="FILE"),
) -> None:
    """Say who a certificate names, who issued it and until when it is valid."""
    one_line_errors(_show)(cert_file)


def _show(cert_file: Path) -> None:
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except FileNotFoundError:
        raise UserInputError(f"{cert_file}: no such file") from None
    except ValueError:
        raise UserInputError(f"{cert_file}: not a PEM certificate") from None
    who = identity_of(cert)
    issuer = cert.issuer.rfc4514_string()
    until = cert.not_valid_after_utc
    left = until - dt.datetime.now(dt.UTC)
    state = f"expires in {left.days} days" if left.total_seconds() > 0 else "EXPIRED"
    name = "a CA" if who is None else str(who) + _roles(who.roles)
    out.print(f"{cert_file}: {name}; issued by {issuer}; valid until {until:%Y-%m-%d} ({state})")
