"""The packages stay layered: imports go only downward, with no cycles and no private reach-ins.

The layers, lowest first (DESIGN.md's shape, as the code has it). A module may import its own
package and any package of a lower layer, never one of its own layer or above; so no two
packages can import each other and the package graph has no cycle. ``cli`` is above everything
and nothing in ``ges`` imports it. A module whose name starts with ``_`` is private to its
package: another package (or ``cli``) imports the package's public modules instead. Inside a
package, modules import each other without a cycle, lazy (function-level) imports included.

Checked from the code's own imports (``ast``), every form the sans-I/O test sees.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ges

ROOT = Path(ges.__file__).parent.parent

#: Lowest first; packages on one line are one layer and must not import each other.
LAYERS: list[set[str]] = [
    {"errors", "wire"},
    {"topology", "matching", "records"},
    {"connectivity", "reliable", "security", "durable"},
    {"routing", "mqtt"},
    {"core"},
    {"transport"},
    {"sim", "client"},
    {"runtime"},
    {"monitor", "stats"},
    {"cli"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def imports_of(source: str, *, typing_only: bool = True) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, module, names)`` for every absolute import in ``source``, at any depth:
    ``from a.b import c, d`` gives ``("a.b", ("c", "d"))`` (each name may be a module).
    ``typing_only=False`` leaves out those under ``if TYPE_CHECKING:`` (never run)."""
    found = []
    tree = ast.parse(source)
    skip = set()
    if not typing_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, tuple(a.name for a in node.names)))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            found.append((node.lineno, node.args[0].value, ()))
    return found


def package_of(module: str) -> str | None:
    """The layered package a dotted module name is in (``ges.core.broker`` → ``core``,
    ``ges.errors`` → ``errors``, ``cli.main`` → ``cli``); None outside the project."""
    parts = module.split(".")
    if parts[0] == "cli":
        return "cli"
    if parts[0] == "ges" and len(parts) > 1:
        return parts[1]
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(modules: dict[str, str]) -> list[str]:
    """Every upward, sideways or private import among ``modules`` (name → source), one line
    each."""
    bad = []
    for name, source in sorted(modules.items()):
        here = package_of(name)
        for line, module, names in imports_of(source):
            target = ".".join((module, *names[:1])) if len(names) == 1 else module
            there = package_of(module)
            if there is None or there == here:
                continue
            where = f"{name}:{line} imports {target}"
            if there not in LAYER:
                bad.append(f"{where}: {there} is in no layer (add it to LAYERS)")
            elif here not in LAYER:
                bad.append(f"{where}: {here} is in no layer (add it to LAYERS)")
            elif LAYER[there] >= LAYER[here]:
                way = "sideways" if LAYER[there] == LAYER[here] else "upward"
                bad.append(
                    f"{where}: {way} ({here} is layer {LAYER[here]}, {there} {LAYER[there]})"
                )
            elif any(
                p.startswith("_") for n in names or ("",) for p in f"{module}.{n}".split(".")[1:]
            ):
                bad.append(f"{where}: a private module of {there}")
    return bad


def cycles(modules: dict[str, str]) -> list[list[str]]:
    """Import cycles among ``modules`` (each as the list of modules round it); an import only
    type checkers see (``if TYPE_CHECKING:``) makes none."""

    def targets(src: str) -> set[str]:
        out = set()
        for _, module, names in imports_of(src, typing_only=False):
            subs = {f"{module}.{n}" for n in names} & modules.keys()
            # ``from pkg import mod``: the module; ``from mod import name``: mod itself
            out |= subs if subs else {module} & modules.keys()
        return out

    edges = {name: sorted(targets(src) - {name}) for name, src in modules.items()}
    found, state = [], {}
    for start in sorted(edges):
        stack = [(start, iter(edges[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, kids = stack[-1]
            for kid in kids:
                if state.get(kid) == 1:  # on the path: a cycle
                    found.append(path[path.index(kid) :] + [kid])
                elif kid not in state:
                    state[kid] = 1
                    stack.append((kid, iter(edges[kid])))
                    path.append(kid)
                    break
            else:
                stack.pop()
                state[path.pop()] = 2
    return found


def project_modules() -> dict[str, str]:
    paths = [*(ROOT / "ges").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]
    return {module_name(p): p.read_text(encoding="utf-8") for p in paths}


def test_every_package_is_in_a_layer():
    packages = {package_of(name) for name in project_modules()}
    assert packages - {"__init__"} <= set(LAYER) | {None}, packages - set(LAYER)
    # and every layer names something that exists (a removed package leaves no stale entry)
    assert set(LAYER) - packages <= set(), set(LAYER) - packages


def test_imports_go_only_downward():
    assert violations(project_modules()) == []


def test_no_import_cycles():
    assert cycles(project_modules()) == []


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        # an upward import: the wire codec reaching into the broker core
        ({"ges.wire.x": "from ges.core import broker"}, "upward (wire is layer 0, core 4)"),
        # a lazy one inside a function counts the same
        ({"ges.reliable.x": "def f():\n    import ges.routing.table\n"}, "upward"),
        ({"ges.client.x": "from ges.sim import network"}, "sideways"),
        ({"ges.core.x": "from ges.wire import frames"}, None),
        ({"ges.core.x": "from ges.core.work import Jobs"}, None),
        # a private module of another package
        (
            {"ges.runtime.x": "from ges.client._client import f", "ges.client._client": ""},
            "a private module of client",
        ),
        (
            {"cli.x": "from ges.connectivity._graph import G", "ges.connectivity._graph": ""},
            "private",
        ),
        ({"ges.stats.x": "from cli import main"}, "upward"),
        ({"ges.newpkg.x": "from ges.wire import frames"}, "newpkg is in no layer"),
    ],
)
def test_the_checker_refuses_what_it_should(modules, expected):
    found = violations(modules)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0], found


def test_a_type_checking_import_makes_no_cycle():
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ges.a.x import T\n"
    assert cycles({"ges.a.x": "import ges.a.y", "ges.a.y": typed, "ges.a": ""}) == []


def test_the_checker_finds_a_cycle():
    modules = {
        "ges.a.x": "import ges.a.y",
        "ges.a.y": "from ges.a.z import f",
        "ges.a.z": "def g():\n    from ges.a import x\n",
        "ges.a": "",
    }
    assert cycles(modules) == [["ges.a.x", "ges.a.y", "ges.a.z", "ges.a.x"]]
    assert cycles({"ges.a.x": "import ges.a.y", "ges.a.y": "", "ges.a": ""}) == []


# -- the broker core's parts ---------------------------------------------------------------------

#: The names by which a part of the core (ges/core/part.py) reaches the core and its siblings.
PARTS = {
    "core", "links", "subscriptions", "gates", "publishing", "subends", "forwarding",
    "release", "repair", "unicast", "router", "claims", "vt", "log",
}  # fmt: skip


def private_reach_ins(source: str) -> list[str]:
    """``self.<part>._<name>`` in ``source``: a part (or the core) using another's private
    state instead of its interface."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in PARTS
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        ):
            found.append(f"{node.lineno}: self.{node.value.attr}.{node.attr}")
    return found


def test_the_cores_parts_use_each_others_interfaces_not_their_private_state():
    bad = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / "ges" / "core").glob("*.py"))
        if (hits := private_reach_ins(path.read_text()))
    }
    assert bad == {}


def test_the_reach_in_check_sees_one():
    assert private_reach_ins("def f(self):\n    return self.gates._levels\n") == [
        "2: self.gates._levels"
    ]
    assert private_reach_ins("def f(self):\n    return self._levels, other.gates._x\n") == []
