"""``ges users add|remove|list``: clients that prove who they are by a token (issue 19).

The users live in the network's access file (``access.yaml`` in its certificate directory),
beside the roles that say what each may do; brokers read it again within a second of a change.
A token is made here, shown once, and stored only as its scrypt hash.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import typer
import yaml

from cli._common import (
    CERTS,
    OneLineUsageGroup,
    command,
    default_certs_dir,
    load_topology,
    one_line_errors,
    out,
)
from ges.errors import OperationError, UserInputError
from ges.runtime.access import load_policy
from ges.security.access import Policy, hash_secret
from ges.security.certs import NAME

app = typer.Typer(
    help="Clients that prove who they are by a token, and their roles (the access file).",
    no_args_is_help=True,
    cls=OneLineUsageGroup,
)

TOPOLOGY = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY")
USER = typer.Argument(..., help="The user's name: the client id it connects as.", metavar="NAME")


def access_file(topology_file: Path, certs: Path | None) -> Path:
    topology = load_topology(topology_file, show_warnings=False)
    return (certs or default_certs_dir(topology.name)) / "access.yaml"


def _read(path: Path) -> dict:
    load_policy(path)  # refuse to edit a file brokers could not read
    if not path.exists():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def _write(path: Path, data: dict) -> None:
    """Replace the access file at once (brokers never read half of one); mode 0600."""
    Policy.from_dict(data, str(path))  # what is written must parse
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(data, f, sort_keys=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise OperationError(f"{path}: cannot write it: {exc.strerror or exc}") from None


@command(app)
def add(
    topology_file: Path = TOPOLOGY,
    name: str = USER,
    roles: list[str] = typer.Option(
        [], "--role", "-r", help="A role of the access file (or operator, client); repeatable."
    ),
    certs: Path = CERTS,
) -> None:
    """Add user NAME with a new token, printed once (or give NAME a new one).

    The client connects with `--client NAME` and the token in the environment variable
    GES_TOKEN. Only the token's hash is kept.
    """
    one_line_errors(_add)(topology_file, name, tuple(roles), certs)


def _add(topology_file: Path, name: str, roles: tuple[str, ...], certs: Path | None) -> None:
    if not NAME.fullmatch(name):
        raise UserInputError(f"{name!r}: not a user name (letters, digits, . _ -; up to 64)")
    path = access_file(topology_file, certs)
    data = _read(path)
    users = data.setdefault("users", {}) or {}
    data["users"] = users
    token = secrets.token_urlsafe(32)
    old = users.get(name) or {}
    users[name] = {
        "roles": list(roles) or list(old.get("roles", [])),
        "secret": hash_secret(token, os.urandom(16)),
    }
    _write(path, data)
    out.print(f"{path}: user {name}" + (" (new token)" if old else ""), highlight=False)
    out.print(f"GES_TOKEN={token}", highlight=False)


@command(app)
def remove(topology_file: Path = TOPOLOGY, name: str = USER, certs: Path = CERTS) -> None:
    """Remove user NAME: its token stops working, and its open connections are closed."""
    one_line_errors(_remove)(topology_file, name, certs)


def _remove(topology_file: Path, name: str, certs: Path | None) -> None:
    path = access_file(topology_file, certs)
    data = _read(path)
    if name not in (data.get("users") or {}):
        raise UserInputError(f"{path}: no user {name!r}")
    del data["users"][name]
    _write(path, data)
    out.print(f"{path}: user {name} removed", highlight=False)


@command(app, "list")
def list_(topology_file: Path = TOPOLOGY, certs: Path = CERTS) -> None:
    """The users and roles of the access file, and what each role allows."""
    one_line_errors(_list)(topology_file, certs)


def _list(topology_file: Path, certs: Path | None) -> None:
    path = access_file(topology_file, certs)
    policy = load_policy(path)
    state = "" if path.exists() else " (no file: the built-in roles)"
    out.print(f"{path}{state}", highlight=False)
    for name, role in policy.roles.items():
        op = ", operator" if role.operator else ""
        out.print(
            f"  role {name}: publish {role.publish}; subscribe {role.subscribe}{op}",
            highlight=False,
        )
    for name, user in policy.users.items():
        how = "token" if user.secret else "certificate"
        roles = ", ".join(user.roles) or "client"
        out.print(f"  user {name}: roles {roles} ({how})", highlight=False)
