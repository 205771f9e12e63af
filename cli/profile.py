"""``ges profile check``: validate XML profiles and events and draw them as trees."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.text import Text
from rich.tree import Tree

from cli._common import OneLineUsageGroup, command, err, one_line_errors, out
from ges.errors import UserInputError
from ges.matching.model import Profile
from ges.matching.xml import EventDocument, load_document

app = typer.Typer(
    help="Validate XML profiles and events against schemas/*.xsd.",
    no_args_is_help=True,
    cls=OneLineUsageGroup,
)

#: Payload characters shown in the tree before "…".
PAYLOAD_PREVIEW = 60


@command(app)
def check(
    files: list[Path] = typer.Argument(..., help="XML profiles and/or events.", metavar="FILE..."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing when all are valid."),
) -> None:
    """Validate each file (a profile or an event); print it as a tree. Exit 2 at the first bad one."""
    one_line_errors(_check)(files, as_json, quiet)


def _check(files: list[Path], as_json: bool, quiet: bool) -> None:
    docs = [(path, load_document(path)) for path in files]
    if as_json:
        out.print_json(json.dumps({"documents": [_to_json(p, d) for p, d in docs]}))
        return
    if quiet:
        return
    for path, doc in docs:
        out.print(
            profile_tree(doc, str(path)) if isinstance(doc, Profile) else event_tree(doc, str(path))
        )
    err.print(f"{len(docs)} valid document{'s' if len(docs) != 1 else ''}", highlight=False)


def profile_tree(profile: Profile, label: str) -> Tree:
    head = Text.assemble((label, "bold"), ": profile ", (profile.id, "cyan"))
    if profile.event_type:
        head.append(f" for events of type {profile.event_type}")
    tree = Tree(head)
    for i, conj in enumerate(profile.conjunctions, 1):
        branch = tree.add(
            Text(f"all #{i}" if len(profile.conjunctions) > 1 else "all of", style="yellow")
        )
        if not conj.constraints:
            branch.add(Text("(no constraints: every event)", style="dim"))
        for c in conj.constraints:
            branch.add(Text(str(c)))
    return tree


def event_tree(doc: EventDocument, label: str) -> Tree:
    tree = Tree(Text.assemble((label, "bold"), ": event of type ", (doc.type, "cyan")))
    attrs_ = tree.add(Text("attributes", style="yellow"))
    for name, value in doc.attributes.items():
        attrs_.add(Text(f"{name} = {value!r}"))
    if doc.payload_encoding is not None:
        preview = (
            doc.payload.decode("utf-8", "replace")
            if doc.payload_encoding == "text"
            else doc.payload[:PAYLOAD_PREVIEW].hex()
        )
        if len(preview) > PAYLOAD_PREVIEW:
            preview = preview[:PAYLOAD_PREVIEW] + "…"
        tree.add(Text(f"payload ({len(doc.payload)} bytes, {doc.payload_encoding}): {preview!r}"))
    return tree


def _to_json(path: Path, doc) -> dict:
    if isinstance(doc, Profile):
        return {
            "file": str(path),
            "kind": "profile",
            "id": doc.id,
            "event_type": doc.event_type,
            "conjunctions": [
                [
                    {
                        "attr": c.attr,
                        "op": c.op,
                        "value": list(c.value) if c.op == "in" else c.value,
                    }
                    for c in conj.constraints
                ]
                for conj in doc.conjunctions
            ],
        }
    if isinstance(doc, EventDocument):
        return {
            "file": str(path),
            "kind": "event",
            "type": doc.type,
            "attributes": doc.attributes,
            "payload_bytes": len(doc.payload),
            "payload_encoding": doc.payload_encoding,
        }
    raise UserInputError(f"{path}: not a profile or an event")
