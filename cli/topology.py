"""``ges topology check|show|generate``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.text import Text
from rich.tree import Tree

from cli._common import OneLineUsageGroup, command, err, load_topology, one_line_errors, out
from ges.errors import UserInputError
from ges.topology import Topology, UnitPath, broker_order_key
from ges.topology.generate import DEFAULT_CHORDS, GeneratorSpec, dump_yaml, summary

#: Above this many brokers ``show`` stops at the clusters unless ``--depth`` asks for more: a tree
#: of a few hundred lines is still read, one of thousands is only scrolled.
SHOW_BROKERS_LIMIT = 200
#: Ids listed per gatekeeper level or gateway list before ``… +N``: a unit line stays one line.
SHOW_LIST_LIMIT = 6
#: Gateways listed end to end per level before they are summarised as counts per unit.
SHOW_ENDS_LIMIT = 4


app = typer.Typer(
    help="Validate, draw and generate broker topologies.",
    no_args_is_help=True,
    cls=OneLineUsageGroup,
)


def _command(fn):
    return command(app)(fn)


# -- check ----------------------------------------------------------------------------------------


@_command
@one_line_errors
def check(
    files: list[Path] = typer.Argument(..., help="Topology YAML files to validate."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print one JSON object on stdout: per file ok/brokers/links/…/digest/error.",
    ),
) -> None:
    """Validate topology files.

    Every file is checked; a bad one gets one line naming the file, the line, the broker, unit or
    link and the problem, and the exit code is 2. Warnings (a unit not connected inside itself)
    go to stderr and do not fail the check. Each good file's line ends with the first 16 hex
    digits of its digest: a SHA-256 of the network's content (brokers, links, costs,
    replicators), the same however the file is written.
    """
    results = []
    for path in files:
        try:
            t = load_topology(path, show_warnings=not as_json)
        except UserInputError as exc:
            results.append({"file": str(path), "ok": False, "error": str(exc)})
            if not as_json:
                err.print(Text.assemble(("error: ", "bold red"), str(exc)), soft_wrap=True)
            continue
        results.append(
            {
                "file": str(path),
                "ok": True,
                "name": t.name,
                "brokers": len(t.brokers),
                "links": len(t.links),
                "gateways": len(t.gateways()),
                "depth": t.depth,
                "units": sum(1 for u in t.units if u),
                "replicators": len(t.replicators),
                "warnings": list(t.warnings),
                "digest": t.digest,
            }
        )
        if not as_json:
            out.print(
                f"{path}: ok — {len(t.brokers)} brokers, {len(t.links)} links, depth {t.depth}, "
                f"{len(t.gateways())} gateways"
                + (f", {len(t.warnings)} warnings" if t.warnings else "")
                + f", digest {t.short_digest}",
                soft_wrap=True,
            )
    ok = all(r["ok"] for r in results)
    if as_json:
        typer.echo(json.dumps({"ok": ok, "files": results}))
    if not ok:
        raise typer.Exit(2)


# -- show -----------------------------------------------------------------------------------------


def _ids(items, limit: int = SHOW_LIST_LIMIT, sep: str = " ") -> str:
    items = list(items)
    shown = sep.join(items[:limit])
    return shown + (f" … +{len(items) - limit}" if len(items) > limit else "")


def _short(unit: UnitPath) -> str:
    return unit[-1] if unit else "/"


def _unit_label(t: Topology, unit: UnitPath) -> Text:
    level = t.unit_level(unit)
    kind = {1: "cluster", 2: "super-cluster", 3: "super-super-cluster"}.get(level, f"level-{level}")
    members = t.members(unit)
    label = Text.assemble(
        (_short(unit), "bold cyan"),
        f"  {kind} · {len(members)} members · {len(t.units[unit])} brokers",
    )
    for r in t.replicators_in(unit):
        label.append("  ⟳ replicator at ", style="magenta")
        label.append(r.broker, style="bold magenta")

    inside = set(t.units[unit])
    by_level: dict[int, list[tuple[str, str]]] = {}  # gateway level -> (inner, outer) ends
    for b in t.units[unit]:
        for n in t.neighbours[b]:
            if n not in inside:
                by_level.setdefault(t.link_level(b, n), []).append((b, n))
    for lv, ends in sorted(by_level.items()):
        keepers = sorted({b for b, _ in ends}, key=broker_order_key)
        towards: dict[str, list[str]] = {}
        for b, n in ends:
            towards.setdefault(_short(t.context(n, lv)), []).append(f"{b}–{n}")
        if len(ends) <= SHOW_ENDS_LIMIT:
            gateways = "; ".join(f"{u}: {', '.join(links)}" for u, links in towards.items())
        else:
            gateways = _ids((f"{u} ×{len(links)}" for u, links in towards.items()), sep=", ")
        label.append(f"\n  L{lv} ", style="yellow")
        label.append("gatekeepers ", style="dim")
        label.append(_ids(keepers))
        label.append(" · gateways → ", style="dim")
        label.append(gateways)
    return label


def _broker_label(t: Topology, bid: str, replicated: dict[str, list[str]]) -> Text:
    spec = t.brokers[bid]
    label = Text.assemble((bid, "bold"), f"  {spec.host}:{spec.port}")
    levels = t.gatekeeper_levels(bid)
    if levels:
        label.append("  gatekeeper " + " ".join(f"L{lv}" for lv in levels), style="yellow")
    for unit in replicated.get(bid, []):
        label.append(f"  ⟳ replicator for {unit}", style="magenta")
    return label


def _grow(tree: Tree, t: Topology, unit: UnitPath, remaining: int, replicated) -> None:
    if remaining <= 0:
        return
    for member in t.members(unit):
        if isinstance(member, str):
            tree.add(_broker_label(t, member, replicated))
        else:
            _grow(tree.add(_unit_label(t, member)), t, member, remaining - 1, replicated)


@_command
@one_line_errors
def show(
    file: Path = typer.Argument(..., help="Topology YAML file to draw."),
    depth: int | None = typer.Option(
        None,
        "--depth",
        "-d",
        min=1,
        help="Levels to draw below the system: 1 = top-level units only, depth+1 = down to "
        f"brokers. Default: everything, or down to clusters above {SHOW_BROKERS_LIMIT} brokers.",
    ),
) -> None:
    """Draw the unit tree: units from the top down to clusters and brokers.

    Each unit shows its members, its gatekeepers per gateway level (L1 = cluster gateways, L2 =
    super-cluster gateways, …), the gateways leaving it with the unit at their other end, and its
    replicator. Each broker shows its address, the levels it is a gatekeeper at and the units it
    replicates. A summary line follows the tree.
    """
    t = load_topology(file)
    full = t.depth + 1
    note = ""
    if depth is None:
        depth = full
        if len(t.brokers) > SHOW_BROKERS_LIMIT:
            depth = t.depth
            note = f" · brokers not drawn ({len(t.brokers)}); --depth {full} draws them"
    depth = min(depth, full)
    replicated: dict[str, list[str]] = {}
    for r in t.replicators:
        replicated.setdefault(r.broker, []).append(_short(r.unit))
    root = Tree(Text.assemble((t.name, "bold"), f"  ({file})"), guide_style="dim")
    _grow(root, t, (), depth, replicated)
    out.print(root)
    drawn = f"drawn to depth {depth} of {full}" if depth < full else "drawn in full"
    out.print(
        Text(
            f"{summary(t)} · {len(t.warnings)} warnings · digest {t.short_digest} · {drawn}{note}"
        ),
        soft_wrap=True,
    )


# -- generate -------------------------------------------------------------------------------------


def _numbers(flag: str, raw: str) -> tuple[int, ...]:
    parts = [p.strip() for p in raw.split(",")] if raw.strip() else []
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise UserInputError(
            f"{flag}: expected whole numbers separated by commas, got {raw!r}"
        ) from None


@_command
@one_line_errors
def generate(
    levels: int = typer.Option(
        3, "--levels", "-l", help="Unit levels above brokers (3 = SSC/SC/cluster)."
    ),
    members: str = typer.Option(
        "4",
        "--members",
        "-m",
        help="Members per unit, top first: levels+1 numbers (top-level units, …, brokers per "
        "cluster) like 2,4,8,8, or one number for all. Each at most the block limit.",
    ),
    links_per_pair: int = typer.Option(
        2, "--links-per-pair", "-k", help="Links between two sibling units that are joined."
    ),
    redundancy: int = typer.Option(
        2,
        "--redundancy",
        "-r",
        help="Distinct gatekeepers wanted on each side of a joined unit pair (≥2: redundant gateways).",
    ),
    chords: float = typer.Option(
        DEFAULT_CHORDS,
        "--chords",
        help="Extra random edges per ring member (clusters and unit rings).",
    ),
    replicators: str = typer.Option(
        "", "--replicators", help="Unit levels that get one replicator per unit, e.g. 2 or 2,3."
    ),
    seed: int = typer.Option(
        0, "--seed", "-s", help="Random seed: the same seed gives the same file."
    ),
    name: str | None = typer.Option(None, "--name", help="Topology name (default from the shape)."),
    base_port: int = typer.Option(7000, "--base-port", help="Port of b1; bN gets base+N-1."),
    host: str = typer.Option("127.0.0.1", "--host", help="Host every broker listens on."),
    block_limit: int = typer.Option(
        64, "--block-limit", help="Most members per unit (seed 004: 64)."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the YAML here (default: stdout)."
    ),
) -> None:
    """Generate a valid hierarchical topology, deterministically from --seed.

    Clusters are rings of brokers with random chords; the child units of every unit form a ring
    with chords too, and each joined pair gets --links-per-pair gateways over --redundancy
    distinct gatekeepers per side where the units are big enough. The YAML starts with a comment
    giving the command that reproduces it; a one-line summary goes to stderr.
    """
    spec = GeneratorSpec(
        levels=levels,
        members=_numbers("--members", members),
        links_per_pair=links_per_pair,
        redundancy=redundancy,
        chords=chords,
        replicator_levels=_numbers("--replicators", replicators),
        seed=seed,
        name=name,
        base_port=base_port,
        host=host,
        block_limit=block_limit,
    )
    t = spec.build()
    if output is None:
        typer.echo(dump_yaml(t, spec=spec), nl=False)
    else:
        try:
            dump_yaml(t, output, spec=spec)
        except OSError as exc:
            raise UserInputError(f"{output}: cannot write: {exc.strerror}") from None
    where = output if output is not None else "stdout"
    err.print(f"{t.name}: {summary(t)} → {where}", soft_wrap=True, markup=False)
