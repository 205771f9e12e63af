"""YAML → :class:`Topology`, with validation that names the file, the line and the problem.

Every rejection is one ``UserInputError`` line of the form ``FILE:LINE: WHAT: PROBLEM``, for
example ``demo.yaml:14: link [b1, b9]: unknown broker 'b9'``. YAML nodes keep their line numbers
through a small loader subclass, so a mistake deep in a large generated file is easy to find.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import yaml

from ges.errors import UserInputError
from ges.topology.specs import (
    DEFAULT_BLOCK_LIMIT,
    DEFAULT_HOST,
    PORT_KEYS,
    BrokerSpec,
    LinkCostMatrix,
    LinkSpec,
    MqttSettings,
    ReplicatorSpec,
    SessionLimits,
    broker_order_key,
    connected_components,
    link_key,
    unit_name,
)

#: A topology file larger than this is refused before parsing: a 64^3-broker system in YAML is
#: ~30 MB, so this leaves room while keeping a stray multi-GB file from eating memory.
MAX_TOPOLOGY_BYTES = 64 * 1024 * 1024

_TOP_KEYS = {
    "name",
    "block_limit",
    "brokers",
    "links",
    "replicators",
    "link_costs",
    "description",
    "sessions",
    "mqtt",
}
_BROKER_KEYS = {"unit", "host", "port", *PORT_KEYS}

#: the class a loaded topology is made as (ges.topology.model.Topology)
T = TypeVar("T")


class _LineDict(dict):
    """A mapping that remembers the line of each key (1-based)."""

    lines: dict
    line: int


class _LineList(list):
    """A sequence that remembers the line of each item (1-based)."""

    lines: list
    line: int


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences carry line numbers; no custom tags."""

    def construct_mapping(self, node, deep=False):
        mapping = super().construct_mapping(node, deep=True)
        out = _LineDict(mapping)
        out.line = node.start_mark.line + 1
        out.lines = {}
        for key_node, _ in node.value:
            try:
                key = self.construct_object(key_node, deep=True)
                out.lines[key] = key_node.start_mark.line + 1
            except Exception:  # unhashable keys are reported by SafeLoader itself
                pass
        return out

    def construct_sequence(self, node, deep=False):
        out = _LineList(super().construct_sequence(node, deep=True))
        out.line = node.start_mark.line + 1
        out.lines = [item.start_mark.line + 1 for item in node.value]
        return out


_LineLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping
)
_LineLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence
)


def load_yaml_file(path, make: type[T]) -> T:
    path = Path(path)
    source = os.fspath(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UserInputError(f"{source}: no such topology file") from None
    except OSError as exc:
        raise UserInputError(f"{source}: cannot read: {exc.strerror}") from None
    if path.is_dir():
        raise UserInputError(f"{source}: is a directory, expected a topology YAML file")
    if size > MAX_TOPOLOGY_BYTES:
        raise UserInputError(
            f"{source}: file is {size} bytes, over the {MAX_TOPOLOGY_BYTES}-byte topology limit"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserInputError(f"{source}: cannot read: {exc.strerror}") from None
    return load_yaml_text(text, make, source=source)


def load_yaml_text(text: str, make: type[T], *, source: str) -> T:
    return build(parse_yaml(text, source, _LineLoader), make, source=source, lines=True)


def parse_yaml(text: str | bytes, source: str, loader=yaml.SafeLoader):
    """The data in a YAML document (safe loading); malformed YAML is one UserInputError naming
    ``source``, the line and the column."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - SafeLoader or a subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = (exc.problem or exc.context or "malformed YAML").strip()
        raise UserInputError(f"{where}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserInputError(f"{source}: malformed YAML: {exc}") from None


class _Where:
    """Formats ``FILE:LINE`` prefixes from the line-carrying containers."""

    def __init__(self, source: str, lines: bool | None):
        self.source = source
        self.lines = lines

    def at(self, container=None, key=None) -> str:
        if not self.lines or container is None:
            return self.source
        line = None
        if key is not None and hasattr(container, "lines"):
            lines = container.lines
            if isinstance(lines, dict):
                line = lines.get(key)
            elif isinstance(key, int) and 0 <= key < len(lines):
                line = lines[key]
        if line is None:
            line = getattr(container, "line", None)
        return f"{self.source}:{line}" if line else self.source

    def fail(self, message: str, container=None, key=None):
        raise UserInputError(f"{self.at(container, key)}: {message}")


def _parse_unit(raw, what: str, w: _Where, container, key) -> tuple[str, ...]:
    if not isinstance(raw, str) or not raw.strip():
        w.fail(f"{what}: unit must be a path like 'SSC-A/SC-1/c1', got {raw!r}", container, key)
    parts = tuple(p.strip() for p in raw.strip().strip("/").split("/"))
    if any(not p for p in parts):
        w.fail(f"{what}: unit {raw!r} has an empty component", container, key)
    return parts


def build(data, make: type[T], *, source: str, lines: bool | None) -> T:
    """Validate the YAML form and build a :class:`Topology` (see module docstring)."""
    w = _Where(source, lines)
    if data is None:
        w.fail("empty topology file")
    if not isinstance(data, Mapping):
        w.fail(
            f"top level must be a mapping with 'name', 'brokers', 'links', got {type(data).__name__}"
        )
    for key in data:
        if key not in _TOP_KEYS:
            w.fail(
                f"unknown key {key!r} (expected one of {', '.join(sorted(_TOP_KEYS))})", data, key
            )

    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        w.fail("'name' must be a non-empty string", data, "name")

    block_limit = data.get("block_limit", DEFAULT_BLOCK_LIMIT)
    if isinstance(block_limit, bool) or not isinstance(block_limit, int) or block_limit < 1:
        w.fail(
            f"'block_limit' must be a positive integer, got {block_limit!r}", data, "block_limit"
        )

    brokers = _parse_brokers(data, w)
    links = _parse_links(data, brokers, w)
    replicators = _parse_replicators(data, brokers, w)
    link_costs = _parse_link_costs(data, w)
    session_limits = _parse_session_limits(data, w)
    mqtt = _parse_mqtt(data, w)

    warnings = _check_structure(data, brokers, links, block_limit, w)
    return make(
        name=name.strip(),
        block_limit=block_limit,
        brokers=brokers,
        links=tuple(links),
        replicators=tuple(replicators),
        link_costs=link_costs,
        session_limits=session_limits,
        mqtt=mqtt,
        warnings=tuple(warnings),
        source=source,
    )


def _parse_brokers(data, w: _Where) -> dict[str, BrokerSpec]:
    raw = data.get("brokers")
    if not isinstance(raw, Mapping) or not raw:
        w.fail(
            "'brokers' must be a non-empty mapping of broker id to {unit, host, port}",
            data,
            "brokers",
        )
    brokers: dict[str, BrokerSpec] = {}
    addresses: dict[tuple[str, int], str] = {}
    entries: dict[str, Mapping] = {}  # broker id -> its YAML entry
    depth: tuple[int, str] | None = None
    for key, spec in raw.items():
        bid = str(key)
        what = f"broker {bid}"
        if isinstance(key, bool) or not bid.strip() or any(c.isspace() for c in bid):
            w.fail(f"{what}: broker id must be a non-empty word", raw, key)
        if bid in brokers:
            w.fail(f"{what}: duplicate broker id", raw, key)
        if not isinstance(spec, Mapping):
            w.fail(f"{what}: must be a mapping like {{unit: SSC-A/SC-1/c1, port: 7101}}", raw, key)
        for k in spec:
            if k not in _BROKER_KEYS:
                w.fail(
                    f"{what}: unknown key {k!r} (expected unit, host, port, metrics_port, "
                    "mqtt_port, mqtt_ws_port)",
                    spec,
                    k,
                )
        if "unit" not in spec:
            w.fail(f"{what}: missing 'unit'", raw, key)
        unit = _parse_unit(spec["unit"], what, w, spec, "unit")
        if depth is None:
            depth = (len(unit), bid)
        elif len(unit) != depth[0]:
            w.fail(
                f"{what}: unit {unit_name(unit)} has depth {len(unit)} but broker {depth[1]} "
                f"has depth {depth[0]} (mixed depths; all brokers need the same number of levels)",
                spec,
                "unit",
            )
        host = spec.get("host", DEFAULT_HOST)
        if not isinstance(host, str) or not host.strip():
            w.fail(f"{what}: host must be a non-empty string, got {host!r}", spec, "host")
        port = spec.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            w.fail(
                f"{what}: port must be an integer in 1..65535, got {port!r}",
                spec,
                "port" if "port" in spec else None,
            )
        addr = (host.strip(), port)
        if addr in addresses:
            w.fail(
                f"{what}: duplicate address {addr[0]}:{addr[1]} (also broker {addresses[addr]})",
                raw,
                key,
            )
        addresses[addr] = bid
        extra = {}
        for name in PORT_KEYS:
            value = extra[name] = spec.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535
            ):
                w.fail(f"{what}: {name} must be an integer in 1..65535, got {value!r}", spec, name)
        brokers[bid] = BrokerSpec(id=bid, unit=unit, host=addr[0], port=port, **extra)
        entries[bid] = spec
    taken = {addr: f"broker {b}'s port" for addr, b in addresses.items()}
    for bid, b in brokers.items():
        for name in PORT_KEYS:
            value = getattr(b, name)
            if value is None:
                continue
            addr = (b.host, value)
            if addr in taken:
                w.fail(
                    f"broker {bid}: {name} {value} on {b.host} is also {taken[addr]}",
                    entries[bid],
                    name,
                )
            taken[addr] = f"broker {bid}'s {name}"
    return brokers


def _parse_links(data, brokers, w: _Where) -> list[LinkSpec]:
    raw = data.get("links", [])
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        w.fail("'links' must be a list of [a, b] or [a, b, {cost: C}]", data, "links")
    seen: dict[tuple[str, str], int] = {}
    links: list[LinkSpec] = []
    for i, item in enumerate(raw):
        if not isinstance(item, list) or len(item) not in (2, 3):
            w.fail(f"link #{i + 1}: must be [a, b] or [a, b, {{cost: C}}], got {item!r}", raw, i)
        a, b = str(item[0]), str(item[1])
        what = f"link [{a}, {b}]"
        for end in (a, b):
            if end not in brokers:
                w.fail(f"{what}: unknown broker {end!r}", raw, i)
        if a == b:
            w.fail(f"{what}: self-link (a broker cannot link to itself)", raw, i)
        cost = None
        if len(item) == 3:
            opts = item[2]
            if not isinstance(opts, Mapping) or set(opts) - {"cost"}:
                w.fail(f"{what}: options must be {{cost: C}}, got {opts!r}", raw, i)
            cost = opts.get("cost")
            if isinstance(cost, bool) or not isinstance(cost, int | float) or cost <= 0:
                w.fail(f"{what}: cost must be a positive number, got {cost!r}", raw, i)
            cost = float(cost)
        key = link_key(a, b)
        if key in seen:
            line = getattr(raw, "lines", [None] * len(raw))
            prev = f" (first at line {line[seen[key]]})" if w.lines and line[seen[key]] else ""
            w.fail(f"{what}: duplicate link{prev}", raw, i)
        seen[key] = i
        links.append(LinkSpec(a=key[0], b=key[1], cost=cost))
    return links


def _parse_replicators(data, brokers, w: _Where) -> list[ReplicatorSpec]:
    raw = data.get("replicators", []) or []
    if not isinstance(raw, list):
        w.fail("'replicators' must be a list of {unit, broker}", data, "replicators")
    known_units = {b.unit[:n] for b in brokers.values() for n in range(1, len(b.unit) + 1)}
    out: list[ReplicatorSpec] = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or set(item) != {"unit", "broker"}:
            w.fail(f"replicator #{i + 1}: must be {{unit: U, broker: B}}, got {item!r}", raw, i)
        unit = _parse_unit(item["unit"], f"replicator #{i + 1}", w, raw, i)
        bid = str(item["broker"])
        what = f"replicator {unit_name(unit)} at {bid}"
        if unit not in known_units:
            w.fail(f"{what}: unknown unit {unit_name(unit)}", raw, i)
        if bid not in brokers:
            w.fail(f"{what}: unknown broker {bid!r}", raw, i)
        if brokers[bid].unit[: len(unit)] != unit:
            w.fail(
                f"{what}: broker {bid} is in {unit_name(brokers[bid].unit)}, outside unit {unit_name(unit)}",
                raw,
                i,
            )
        out.append(ReplicatorSpec(unit=unit, broker=bid))
    return out


_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value) -> float | None:
    """Seconds from a number or ``30s``, ``15m``, ``12h``, ``7d``; None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    text = str(value).strip()
    unit = _SECONDS.get(text[-1:])
    try:
        number = float(text[:-1] if unit else text)
    except ValueError:
        return None
    seconds = number * (unit or 1)
    return seconds if 0 < seconds < 1e12 else None


def _parse_session_limits(data, w: _Where) -> SessionLimits:
    raw = data.get("sessions")
    if raw is None:
        return SessionLimits()
    keys = {"max_events", "max_age", "handover_after", "expire_after"}
    if not isinstance(raw, Mapping) or not set(raw) <= keys:
        w.fail(
            "'sessions' must be {max_events: N, max_age: AGE, handover_after: AGE or never, "
            f"expire_after: AGE or never}}, got {raw!r}",
            data,
            "sessions",
        )
    limits = SessionLimits()
    n = raw.get("max_events", limits.max_events)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10**12:
        w.fail(f"sessions.max_events must be a positive integer, got {n!r}", raw, "max_events")
    age = parse_duration(raw.get("max_age", limits.max_age))
    if age is None:
        w.fail(
            f"sessions.max_age must be seconds or like 30s, 15m, 12h, 7d, got {raw['max_age']!r}",
            raw,
            "max_age",
        )
    after = _duration_or_never(raw, "handover_after", limits.handover_after, "like 30s or 15m", w)
    gone = _duration_or_never(raw, "expire_after", "never", "like 1h or 30d", w)
    return SessionLimits(n, age, after, gone)


def _parse_mqtt(data, w: _Where) -> MqttSettings:
    raw = data.get("mqtt")
    if raw is None:
        return MqttSettings()
    if not isinstance(raw, Mapping) or not set(raw) <= {"max_keepalive"}:
        w.fail(f"'mqtt' must be {{max_keepalive: SECONDS}}, got {raw!r}", data, "mqtt")
    n = raw.get("max_keepalive")
    if n is None:
        return MqttSettings()
    seconds = parse_duration(n) if isinstance(n, str) else n
    number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not number or not 1 <= seconds <= 65535 or seconds != int(seconds):  # (inf, nan too)
        w.fail(
            f"mqtt.max_keepalive must be whole seconds from 1 to 65535 (or like 60s, 5m), "
            f"got {n!r}",
            raw,
            "max_keepalive",
        )
    return MqttSettings(int(seconds))


def _duration_or_never(raw, key: str, default, like: str, w: _Where) -> float:
    """``sessions.KEY``: seconds, a duration, or ``never`` (inf)."""
    value = raw.get(key, default)
    seconds = float("inf") if value == "never" else parse_duration(value)
    if seconds is None:
        w.fail(f"sessions.{key} must be seconds, {like}, or never, got {raw[key]!r}", raw, key)
    return seconds


def _parse_link_costs(data, w: _Where) -> LinkCostMatrix:
    raw = data.get("link_costs")
    if raw is None:
        return LinkCostMatrix()
    if not isinstance(raw, list) or not all(isinstance(r, list) for r in raw):
        w.fail(
            "'link_costs' must be a list of rows: link_costs[x][l] = cost of a level-l link from a level-x unit",
            data,
            "link_costs",
        )
    rows = []
    for x, row in enumerate(raw):
        for lv, c in enumerate(row):
            if isinstance(c, bool) or not isinstance(c, int | float) or c <= 0:
                w.fail(f"link_costs[{x}][{lv}]: must be a positive number, got {c!r}", raw, x)
        rows.append(tuple(float(c) for c in row))
    return LinkCostMatrix(rows=tuple(rows))


def _check_structure(data, brokers, links, block_limit, w: _Where) -> list[str]:
    """Block limits, whole-graph connectivity (error) and per-unit connectivity (warning)."""
    raw_brokers = data["brokers"]
    # members per unit: brokers for clusters, child units above
    members: dict[tuple[str, ...], set] = {}
    first_broker: dict[tuple[str, ...], str] = {}
    for b in brokers.values():
        path = b.unit
        members.setdefault(path, set()).add(b.id)
        first_broker.setdefault(path, b.id)
        for n in range(len(path)):
            members.setdefault(path[:n], set()).add(path[: n + 1])
            first_broker.setdefault(path[:n], b.id)
    for unit, ms in sorted(members.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if len(ms) > block_limit:
            label = "the top level" if not unit else f"unit {unit_name(unit)}"
            w.fail(
                f"{label}: {len(ms)} members, over the block limit of {block_limit}",
                raw_brokers,
                first_broker[unit],
            )

    edges = [(link.a, link.b) for link in links]
    parts = connected_components(sorted(brokers, key=broker_order_key), edges)
    if len(parts) > 1:
        stray = sorted(parts[1], key=broker_order_key)
        shown = ", ".join(stray[:5]) + (", …" if len(stray) > 5 else "")
        w.fail(
            f"broker graph is not connected: {len(parts)} components; "
            f"brokers {shown} cannot reach broker {sorted(parts[0], key=broker_order_key)[0]}",
            data,
            "links",
        )

    warnings = []
    for unit in sorted(members, key=lambda u: (len(u), u)):
        if not unit:
            continue
        inside = [b for b in brokers if brokers[b].unit[: len(unit)] == unit]
        if len(inside) < 2:
            continue
        sub = connected_components(inside, edges)
        if len(sub) > 1:
            warnings.append(
                f"{w.source}: unit {unit_name(unit)}: its {len(inside)} brokers are not connected "
                f"inside it ({len(sub)} parts); traffic between them leaves the unit"
            )
    return warnings
