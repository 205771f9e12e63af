"""``ges link down|up``: cut or restore one broker-to-broker link of a running deployment."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio
import typer
from rich.text import Text

from cli._common import (
    CERTS,
    CLIENT_AS,
    INSECURE,
    ClientAuth,
    OneLineUsageGroup,
    client_auth,
    command,
    err,
    load_topology,
    network_certs,
    one_line_errors,
    out,
    resolve_broker,
)
from ges.client import connect
from ges.errors import BrokerUnreachable, OperationError, UserInputError
from ges.topology import Topology, broker_order_key

#: Seconds each end has to accept the connection and answer.
DEFAULT_TIMEOUT = 5.0

app = typer.Typer(
    help="Cut or restore one broker-to-broker link of a running deployment (soft: a broker "
    "that restarts has all its links again).",
    no_args_is_help=True,
    cls=OneLineUsageGroup,
)

TOPOLOGY = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY")
END_A = typer.Argument(..., help="One end of the link (a broker id).", metavar="A")
END_B = typer.Argument(..., help="The other end (a neighbour of A).", metavar="B")
TIMEOUT = typer.Option(DEFAULT_TIMEOUT, "--timeout", "-t", help="Seconds each end has to answer.")


@command(app)
def down(
    topology_file: Path = TOPOLOGY,
    a: str = END_A,
    b: str = END_B,
    timeout: float = TIMEOUT,
    client: str = CLIENT_AS,
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Cut the link between brokers A and B, at both ends.

    Each end closes its connection to the other (the brokers see the link fail, as on a TCP
    failure, and route round it), and until `ges link up` neither dials the other nor accepts
    it. If one end is unreachable the other is still cut, with a warning. The cut is forgotten
    when a broker restarts.
    """
    one_line_errors(_link)(topology_file, a, b, False, timeout, certs, insecure, client)


@command(app)
def up(
    topology_file: Path = TOPOLOGY,
    a: str = END_A,
    b: str = END_B,
    timeout: float = TIMEOUT,
    client: str = CLIENT_AS,
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Restore the link between brokers A and B, at both ends.

    The lower id of the two redials the other at once; the link is up again within a round
    trip. If one end is unreachable the other is still restored, with a warning.
    """
    one_line_errors(_link)(topology_file, a, b, True, timeout, certs, insecure, client)


@attrs.frozen
class _End:
    """What one end of the link said: ``changed`` if it answered, else why not."""

    broker: str
    changed: bool | None = None
    error: str = ""
    unreachable: bool = False


def _link(
    topology_file: Path,
    a: str,
    b: str,
    up_: bool,
    timeout: float,
    certs: Path | None = None,
    insecure: bool = False,
    client: str | None = None,
) -> None:
    if not timeout > 0:
        raise UserInputError(f"--timeout {timeout}: must be > 0")
    topology = load_topology(topology_file)
    resolve_broker(topology, a)
    resolve_broker(topology, b)
    if a == b or topology.link_between(a, b) is None:
        raise UserInputError(
            f"{topology.source}: {a} and {b} are not neighbours (no link {a}–{b} in "
            f"{topology.name})"
        )
    auth = client_auth(network_certs(topology, certs, insecure), client)
    dialler, acceptor = sorted((a, b), key=broker_order_key)
    # cut the dialling end first and restore it last, so it never dials the other end while
    # that one refuses it
    order = (acceptor, dialler) if up_ else (dialler, acceptor)
    ends = trio.run(_control_both, topology, order, up_, timeout, auth)
    _report((a, b), ends, up_)


async def _control_both(
    topology: Topology, order, up_: bool, timeout: float, auth: ClientAuth
) -> dict:
    first, second = order
    return {
        first: await _control(topology, first, second, up_, timeout, auth),
        second: await _control(topology, second, first, up_, timeout, auth),
    }


async def _control(
    topology: Topology, broker: str, peer: str, up_: bool, timeout: float, auth: ClientAuth
) -> _End:
    spec = topology.brokers[broker]
    try:
        # connect's own timeout tells an unreachable broker from one that does not answer
        async with connect(
            spec.host,
            spec.port,
            topology=topology,
            client_id=auth.client_id or f"link-{broker}-{peer}",
            timeout=timeout,
            **auth.connect_args(),
        ) as client:
            with trio.fail_after(timeout):
                changed = await client.link(peer, up=up_)
    except trio.TooSlowError:
        return _End(broker, error=f"broker {broker} did not answer within {timeout:g}s")
    except BrokerUnreachable as exc:
        return _End(broker, error=str(exc), unreachable=True)
    except OperationError as exc:
        return _End(broker, error=str(exc))
    return _End(broker, changed=changed)


def _report(pair: tuple[str, str], ends: dict, up_: bool) -> None:
    name = f"link {pair[0]}–{pair[1]}"
    done = [e for e in ends.values() if not e.error]
    failed = [e for e in ends.values() if e.error]
    verb, already = ("restored", "already up") if up_ else ("cut", "already cut")
    if not done:
        why = "; ".join(f"{e.broker}: {e.error}" for e in failed)
        raise OperationError(f"{name}: {verb} at neither end ({why})")
    said = ", ".join(f"{verb if e.changed else already} at {e.broker}" for e in done)
    for e in failed:
        if not e.unreachable:  # it answered, and not as asked: the operation failed
            raise OperationError(f"{name}: {said}, but {e.broker} failed: {e.error}")
        (other,) = done
        if up_:
            then = f"restored at {other.broker} only ({e.broker} forgets a cut when it restarts)"
        else:
            then = f"cut at {other.broker} only, which neither dials {e.broker} nor accepts it"
        err.print(
            Text.assemble(("warning: ", "yellow"), f"{e.broker}: {e.error}; {then}"),
            soft_wrap=True,
        )
    out.print(f"{name} {'up' if up_ else 'down'}: {said}", highlight=False, soft_wrap=True)
