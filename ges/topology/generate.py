"""Deterministic generation of hierarchical broker topologies, and writing any topology as YAML.

Seed 004 §2 organises brokers into clusters, clusters into super-clusters and so on, each unit with
at most ``block_limit`` (64) members, and asks for "multiple links connecting a single cluster to
several other clusters" so that a failed link or broker leaves another route. The generator builds
exactly that shape from a handful of numbers:

* ``levels`` unit levels (3 = super-super-cluster / super-cluster / cluster) with ``members`` per
  unit, top first: ``(2, 4, 8, 8)`` is 2 super-super-clusters of 4 super-clusters of 8 clusters of
  8 brokers, 512 brokers in all.
* Inside each cluster a ring of its brokers plus random chords (level-0 links).
* Inside each unit, its child units form a ring plus random chords too; every pair of children
  joined in that graph gets ``links_per_pair`` links (gateways), whose ends are spread over
  ``redundancy`` distinct gatekeeper brokers on each side where the units are big enough.

Since every cluster is connected and every sibling graph is connected, the broker graph and every
unit inside it are connected, so the result never carries a warning. The randomness comes from one
``random.Random(seed)``: the same parameters give the same topology, link for link. (Randomness is
fine here — the generator is a tool, not a protocol core, and it takes its seed as an argument.)

Names are readable at a glance: unit paths like ``SSC-1/SC-1-2/c1-2-3`` (cluster 3 of super-cluster
2 of super-super-cluster 1), brokers ``b1`` … ``bN`` numbered cluster by cluster, ports from
``base_port`` upward in the same order.
"""

from __future__ import annotations

import os
import random
import shlex
from collections.abc import Sequence
from pathlib import Path

import attrs
import yaml

from ges.errors import UserInputError
from ges.topology.model import Topology
from ges.topology.specs import DEFAULT_BLOCK_LIMIT, DEFAULT_HOST, UnitPath, link_key, unit_name

#: One host has at most ~64k ports and every broker needs its own; past that the validation of the
#: per-unit connectivity (units × brokers) also stops being instant. Bigger systems need several
#: hosts, which is a job for a hand-written or post-processed file, not this generator.
MAX_GENERATED_BROKERS = 65_536

#: Seed 004 sizes an N-level system at up to 64^(N+1) brokers; past a handful of levels every unit
#: has one member. The cap keeps a typo like ``--levels 1000`` a clear error, not a deep recursion.
MAX_LEVELS = 16

#: Default share of extra random chords added to each ring (of brokers in a cluster, or of sibling
#: units): a ring alone has a path length of n/4 on average; a quarter of n chords brings it close
#: to logarithmic (the "small world" of seed 004 §2.1) while clusters stay sparse.
DEFAULT_CHORDS = 0.25


def _members_tuple(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise UserInputError(
            f"generate: members must be a number or a list of numbers, got {value!r}"
        )
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        raise UserInputError(f"generate: members must be numbers, got {value!r}")
    try:
        out = tuple(value)
    except TypeError:
        raise UserInputError(
            f"generate: members must be a number or a list, got {value!r}"
        ) from None
    if not out or any(isinstance(m, bool) or not isinstance(m, int) for m in out):
        raise UserInputError(f"generate: members must be whole numbers, got {value!r}")
    return out


def _levels_tuple(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise UserInputError(
            f"generate: replicator levels must be numbers, got {value!r}"
        ) from None


def _int_field(lo: int, default: int):
    def check(instance, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserInputError(
                f"generate: {attribute.name} must be a whole number, got {value!r}"
            )
        if value < lo:
            raise UserInputError(f"generate: {attribute.name} must be at least {lo}, got {value}")

    return attrs.field(default=default, validator=check)


@attrs.frozen(kw_only=True)
class GeneratorSpec:
    """The parameters of one generated topology; :meth:`build` turns them into a ``Topology``.

    Invalid parameters raise ``UserInputError`` with one line when the spec is made, so a spec
    that exists can be built. See :func:`generate` for what each parameter means.
    """

    levels: int = _int_field(1, 3)
    members: tuple[int, ...] = attrs.field(default=(4,), converter=_members_tuple)
    links_per_pair: int = _int_field(1, 2)
    redundancy: int = _int_field(1, 2)
    chords: float = DEFAULT_CHORDS
    replicator_levels: tuple[int, ...] = attrs.field(default=(), converter=_levels_tuple)
    seed: int = _int_field(-(2**63), 0)
    name: str | None = None
    base_port: int = _int_field(1, 7000)
    host: str = DEFAULT_HOST
    block_limit: int = _int_field(1, DEFAULT_BLOCK_LIMIT)

    def __attrs_post_init__(self) -> None:
        if self.levels > MAX_LEVELS:
            raise UserInputError(
                f"generate: levels must be at most {MAX_LEVELS}, got {self.levels}"
            )
        if len(self.members) == 1:
            if not 1 <= self.members[0] <= self.block_limit:
                raise UserInputError(
                    f"generate: members must be in 1..{self.block_limit} (the block limit), "
                    f"got {self.members[0]}"
                )
            object.__setattr__(self, "members", self.members * (self.levels + 1))
        if len(self.members) != self.levels + 1:
            raise UserInputError(
                f"generate: members needs 1 or levels+1 = {self.levels + 1} numbers (top-level "
                f"units, then members per unit down to brokers per cluster), got {len(self.members)}"
            )
        for i, m in enumerate(self.members):
            what = (
                "top-level units"
                if i == 0
                else "brokers per cluster"
                if i == self.levels
                else f"members per level-{self.levels - i + 1} unit"
            )
            if not 1 <= m <= self.block_limit:
                raise UserInputError(
                    f"generate: {what} must be in 1..{self.block_limit} (the block limit), got {m}"
                )
        if isinstance(self.chords, bool) or not isinstance(self.chords, int | float):
            raise UserInputError(f"generate: chords must be a number, got {self.chords!r}")
        if not 0 <= self.chords <= 64:
            raise UserInputError(
                f"generate: chords must be in 0..64 (per ring member), got {self.chords}"
            )
        for lv in self.replicator_levels:
            if isinstance(lv, bool) or not isinstance(lv, int) or not 1 <= lv <= self.levels:
                raise UserInputError(
                    f"generate: replicator level must be in 1..{self.levels}, got {lv!r}"
                )
        if len(set(self.replicator_levels)) != len(self.replicator_levels):
            raise UserInputError(
                f"generate: replicator levels repeat: {list(self.replicator_levels)}"
            )
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise UserInputError(f"generate: name must be a non-empty string, got {self.name!r}")
        if (
            not isinstance(self.host, str)
            or not self.host.strip()
            or any(c.isspace() for c in self.host)
        ):
            raise UserInputError(
                f"generate: host must be a host name or address, got {self.host!r}"
            )
        n = self.broker_count
        if n > MAX_GENERATED_BROKERS:
            raise UserInputError(
                f"generate: {n} brokers is over the generator's limit of {MAX_GENERATED_BROKERS}"
            )
        if self.base_port + n - 1 > 65535:
            raise UserInputError(
                f"generate: {n} brokers from base port {self.base_port} need ports up to "
                f"{self.base_port + n - 1}, past 65535"
            )

    @property
    def broker_count(self) -> int:
        n = 1
        for m in self.members:
            n *= m
        return n

    @property
    def topology_name(self) -> str:
        if self.name is not None:
            return self.name.strip()
        shape = "x".join(str(m) for m in self.members)
        return f"generated-{shape}-s{self.seed}"

    def command(self, output: str | os.PathLike | None = None) -> str:
        """The ``ges topology generate`` command line that reproduces this spec."""
        args = [
            "ges", "topology", "generate",
            "--levels", str(self.levels),
            "--members", ",".join(str(m) for m in self.members),
            "--links-per-pair", str(self.links_per_pair),
            "--redundancy", str(self.redundancy),
            "--chords", f"{self.chords:g}",
        ]  # fmt: skip
        if self.replicator_levels:
            args += ["--replicators", ",".join(str(lv) for lv in self.replicator_levels)]
        args += ["--seed", str(self.seed)]
        if self.name is not None:
            args += ["--name", self.name]
        args += ["--base-port", str(self.base_port)]
        if self.host != DEFAULT_HOST:
            args += ["--host", self.host]
        if self.block_limit != DEFAULT_BLOCK_LIMIT:
            args += ["--block-limit", str(self.block_limit)]
        if output is not None:
            args += ["-o", os.fspath(output)]
        return shlex.join(args)

    def build(self) -> Topology:
        """Generate the topology; it goes through ``Topology.from_dict``, so it is validated."""
        return Topology.from_dict(self.to_dict(), source=f"<generated {self.topology_name}>")

    def to_dict(self) -> dict:
        """The YAML form of the generated topology (what :meth:`build` validates)."""
        return _Builder(self).run()


def generate(
    *,
    levels: int = 3,
    members: int | Sequence[int] = 4,
    links_per_pair: int = 2,
    redundancy: int = 2,
    chords: float = DEFAULT_CHORDS,
    replicator_levels: Sequence[int] = (),
    seed: int = 0,
    name: str | None = None,
    base_port: int = 7000,
    host: str = DEFAULT_HOST,
    block_limit: int = DEFAULT_BLOCK_LIMIT,
) -> Topology:
    """Generate a validated hierarchical topology, the same one for the same arguments.

    Args:
        levels: unit levels above the brokers (1 = clusters only, 3 = SSC/SC/cluster).
        members: members per unit, top first: ``levels + 1`` numbers (top-level units, then the
            members of each unit level down to brokers per cluster), or one number for all. Each is
            at most ``block_limit``.
        links_per_pair: links between two sibling units joined in their parent's unit graph
            (capped at the number of distinct broker pairs between them).
        redundancy: distinct gatekeeper brokers wanted on each side of such a pair (capped by
            ``links_per_pair`` and by the units' sizes); 2 or more gives redundant gateways.
        chords: extra random edges per ring member, in each cluster's ring of brokers and each
            unit's ring of child units (0 = plain rings).
        replicator_levels: unit levels that get one replicator per unit, hosted by the unit's
            first broker (``(2,)`` = one per super-cluster when ``levels`` is 3).
        seed: seeds the one ``random.Random`` that picks chords and gatekeepers.
        name: the topology's name (default ``generated-<members>-s<seed>``).
        base_port: port of ``b1``; ``bN`` listens on ``base_port + N - 1``.
        host: the host every broker listens on.
        block_limit: the topology's block limit (seed 004: 64).

    Returns:
        A ``Topology`` that passed validation, with no warnings.

    Error handling:
        Parameters that cannot give a valid topology (``levels < 1``, a member count over the block
        limit, ports past 65535, …) raise ``UserInputError`` with one line.
    """
    return GeneratorSpec(
        levels=levels,
        members=members,
        links_per_pair=links_per_pair,
        redundancy=redundancy,
        chords=chords,
        replicator_levels=replicator_levels,
        seed=seed,
        name=name,
        base_port=base_port,
        host=host,
        block_limit=block_limit,
    ).build()


# -- building -------------------------------------------------------------------------------------


def _unit_label(level: int, index: tuple[int, ...]) -> str:
    """``c1-2-3`` for a cluster, ``SC-1-2`` for a super-cluster, ``SSC-1`` above, and so on."""
    digits = "-".join(str(i) for i in index)
    if level == 1:
        return f"c{digits}"
    return "S" * (level - 1) + "C-" + digits


@attrs.define(eq=False)
class _Unit:
    path: UnitPath
    level: int
    children: list[_Unit] = attrs.Factory(list)
    brokers: list[str] = attrs.Factory(list)  # every broker inside, in id order


class _Builder:
    def __init__(self, spec: GeneratorSpec):
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.brokers: dict[str, dict] = {}
        self.links: list[tuple[str, str]] = []
        self.link_set: set[tuple[str, str]] = set()

    def run(self) -> dict:
        spec = self.spec
        root = _Unit(path=(), level=spec.levels + 1)
        self._grow(root, index=())
        self._wire(root)
        depth = spec.levels
        # Group links by level so the YAML reads level by level; stable, so still deterministic.
        levels = {b: self.brokers[b]["_path"] for b in self.brokers}

        def link_level(link: tuple[str, str]) -> int:
            pa, pb = levels[link[0]], levels[link[1]]
            shared = 0
            for x, y in zip(pa, pb, strict=True):
                if x != y:
                    break
                shared += 1
            return depth - shared

        self.links.sort(key=link_level)
        brokers = {
            b: {"unit": unit_name(v["_path"]), "host": spec.host, "port": v["port"]}
            for b, v in self.brokers.items()
        }
        out: dict = {
            "name": spec.topology_name,
            "block_limit": spec.block_limit,
            "brokers": brokers,
            "links": [list(link) for link in self.links],
        }
        replicators = []
        for lv in sorted(spec.replicator_levels, reverse=True):
            for unit in self._units_at(root, lv):
                replicators.append({"unit": unit_name(unit.path), "broker": unit.brokers[0]})
        if replicators:
            out["replicators"] = replicators
        return out

    def _grow(self, unit: _Unit, index: tuple[int, ...]) -> None:
        """Create the unit tree depth first and number the brokers cluster by cluster."""
        spec = self.spec
        count = spec.members[spec.levels + 1 - unit.level]
        if unit.level == 1:
            for _ in range(count):
                n = len(self.brokers) + 1
                bid = f"b{n}"
                self.brokers[bid] = {"_path": unit.path, "port": spec.base_port + n - 1}
                unit.brokers.append(bid)
            return
        for i in range(1, count + 1):
            child_index = (*index, i)
            label = _unit_label(unit.level - 1, child_index)
            child = _Unit(path=(*unit.path, label), level=unit.level - 1)
            self._grow(child, child_index)
            unit.children.append(child)
            unit.brokers.extend(child.brokers)

    def _units_at(self, unit: _Unit, level: int) -> list[_Unit]:
        if unit.level == level:
            return [unit]
        return [u for child in unit.children for u in self._units_at(child, level)]

    def _wire(self, unit: _Unit) -> None:
        if unit.level == 1:
            for a, b in self._ring_with_chords(len(unit.brokers)):
                self._add(unit.brokers[a], unit.brokers[b])
            return
        for child in unit.children:
            self._wire(child)
        for a, b in self._ring_with_chords(len(unit.children)):
            self._join(unit.children[a], unit.children[b])

    def _ring_with_chords(self, n: int) -> list[tuple[int, int]]:
        """A ring over 0..n-1 (a single edge for n = 2) plus ``chords * n`` random extra edges."""
        if n < 2:
            return []
        if n == 2:
            return [(0, 1)]
        ring = [(i, (i + 1) % n) for i in range(n)]
        present = {(min(a, b), max(a, b)) for a, b in ring}
        others = [(a, b) for a in range(n) for b in range(a + 1, n) if (a, b) not in present]
        wanted = min(round(self.spec.chords * n), len(others))
        return ring + self.rng.sample(others, wanted)

    def _join(self, ua: _Unit, ub: _Unit) -> None:
        """``links_per_pair`` links between two sibling units over distinct gatekeepers."""
        spec = self.spec
        side_a, side_b = ua.brokers, ub.brokers
        k = min(spec.links_per_pair, len(side_a) * len(side_b))
        ends_a = self._gatekeepers(side_a, k)
        ends_b = self._gatekeepers(side_b, k)
        used: set[tuple[str, str]] = set()
        for a, b in zip(ends_a, ends_b, strict=True):
            if (a, b) in used:
                a, b = self._free_pair(side_a, side_b, used, prefer=a)
            used.add((a, b))
            self._add(a, b)

    def _gatekeepers(self, side: list[str], k: int) -> list[str]:
        """k link ends in ``side``: the first ``redundancy`` distinct, the rest any broker."""
        distinct = min(self.spec.redundancy, k, len(side))
        ends = self.rng.sample(side, distinct)
        ends += [self.rng.choice(side) for _ in range(k - distinct)]
        return ends

    def _free_pair(self, side_a, side_b, used, *, prefer: str) -> tuple[str, str]:
        """An unused (a, b) pair, keeping ``prefer`` on side a when it still has a free partner."""
        for b in self.rng.sample(side_b, len(side_b)):
            if (prefer, b) not in used:
                return prefer, b
        free = [(a, b) for a in side_a for b in side_b if (a, b) not in used]
        return self.rng.choice(free)  # k ≤ |a|·|b| guarantees one is left

    def _add(self, a: str, b: str) -> None:
        key = link_key(a, b)
        if key in self.link_set:  # cannot happen between distinct unit pairs; kept as a guard
            return
        self.link_set.add(key)
        self.links.append(key)


# -- writing --------------------------------------------------------------------------------------

_FLOW = {"default_flow_style": True, "sort_keys": False, "width": 1 << 30, "allow_unicode": True}


def _flow(value) -> str:
    """One YAML flow node on one line, quoted where YAML needs it (``'1'``, ``'::1'``)."""
    text = yaml.safe_dump(value, **_FLOW)
    return text.removesuffix("\n...\n").strip()  # a lone plain scalar ends its document


def to_yaml_text(topology: Topology, *, header: Sequence[str] = ()) -> str:
    """The topology as YAML: one line per broker grouped by cluster, links grouped by level.

    ``header`` lines become ``#`` comments at the top. ``Topology.from_yaml_text`` of the result
    equals ``topology``.
    """
    lines = [f"# {h}" if h else "#" for h in header]
    lines.append(f"name: {_flow(topology.name)}")
    lines.append(f"block_limit: {topology.block_limit}")
    lines.append("brokers:")
    current: UnitPath | None = None
    for b in topology.brokers.values():
        if b.unit != current:
            current = b.unit
            lines.append(f"  # {unit_name(current)}")
        spec = {b.id: {"unit": unit_name(b.unit), "host": b.host, "port": b.port}}
        lines.append("  " + _flow(spec)[1:-1])
    lines.append("links:")
    level: int | None = None
    for link in topology.links:
        lv = topology.link_level(link.a, link.b)
        if lv != level:
            level = lv
            what = "inside clusters" if lv == 0 else f"gateways between level-{lv} units"
            lines.append(f"  # level-{lv} links, {what}")
        item = [link.a, link.b] if link.cost is None else [link.a, link.b, {"cost": link.cost}]
        lines.append("  - " + _flow(item))
    if not topology.links:
        lines[-1] = "links: []"
    if topology.replicators:
        lines.append("replicators:")
        for r in topology.replicators:
            lines.append("  - " + _flow({"unit": unit_name(r.unit), "broker": r.broker}))
    if topology.link_costs.rows:
        lines.append("link_costs: " + _flow([list(row) for row in topology.link_costs.rows]))
    return "\n".join(lines) + "\n"


def summary(topology: Topology) -> str:
    """One line: brokers, units per level, links per level, replicators."""
    depth = topology.depth
    units = [
        sum(1 for u in topology.units if u and topology.unit_level(u) == lv)
        for lv in range(depth, 0, -1)
    ]
    per_level = [0] * (depth + 1)
    for link in topology.links:
        per_level[topology.link_level(link.a, link.b)] += 1
    return (
        f"{len(topology.brokers)} brokers in {'/'.join(map(str, units))} units (top down), "
        f"{len(topology.links)} links ("
        + ", ".join(f"L{lv} {n}" for lv, n in enumerate(per_level))
        + f"), {len(topology.replicators)} replicators"
    )


def dump_yaml(
    topology: Topology,
    path: str | os.PathLike | None = None,
    *,
    spec: GeneratorSpec | None = None,
    header: Sequence[str] = (),
) -> str:
    """Write ``topology`` as YAML to ``path`` (if given) and return the text.

    The comment header names the topology and its size and, when ``spec`` is given, the exact
    ``ges topology generate`` command that reproduces the file; ``header`` adds further lines.
    """
    head = [f"GES topology {topology.name!r}: {summary(topology)}."]
    if spec is not None:
        head += [
            "Generated by ges.topology.generate (deterministic: same command, same file):",
            "  " + spec.command(output=path),
        ]
    head += list(header)
    text = to_yaml_text(topology, header=head)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text
