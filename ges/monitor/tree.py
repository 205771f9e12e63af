"""The network as a rich tree: units with their health and totals, brokers with theirs, links
that are not up, and the latest events (``ges monitor --once``, and the live view of ``ges
monitor`` until its interactive view lands)."""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ges.monitor.model import (
    HEALTH_RANK,
    LINK_UP,
    LINKS_DOWN,
    LOOP_HELD_US,
    OK,
    SOME_DOWN,
    SPLIT,
    UNREACHABLE,
    NetworkModel,
    Unit,
)

HEALTH_STYLE = {
    OK: "green",
    LINKS_DOWN: "yellow",
    SOME_DOWN: "yellow",
    SPLIT: "red",
    UNREACHABLE: "red",
}

#: Brokers shown per cluster, units per unit, before "… n more" (the busiest and unhealthy first).
MAX_CHILDREN = 12
#: Links not up listed at most, and log entries shown.
MAX_LINKS = 12
LOG_LINES = 8


def rate(value: float) -> str:
    """A count or rate in at most 5 characters: 999, 4.3k, 99k, 1.2M."""
    if value <= 0 or math.isnan(value):
        return "0"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            v = value / scale
            return f"{v:.1f}{suffix}" if v < 10 else f"{v:,.0f}{suffix}"
    return f"{value:,.0f}"


def loop_ms(us: int) -> str:
    """A stretch of the event loop in milliseconds: 0.4ms, 9.9ms, 34ms, 1,204ms."""
    return f"{us / 1000:.1f}ms" if us < 9_950 else f"{us / 1000:,.0f}ms"


def unit_label(model: NetworkModel, unit: Unit) -> Text:
    health = model.health(unit)
    t = model.totals(unit)
    label = Text()
    label.append(unit.name or f"network {model.topology.name}", style="bold")
    label.append(f"  {health}", style=HEALTH_STYLE[health])
    label.append(
        f"  brokers {t['answering']}/{t['members']}  clients {rate(t['clients'])}  "
        f"in {rate(t['rate_in'])}  dlv {rate(t['rate_delivered'])}",
        style="dim" if health == OK else "",
    )
    if t["sessions"]:
        label.append(f"  sessions {rate(t['sessions'])}")
    if t["restarts"]:
        label.append(f"  restarts {t['restarts']}", style="yellow")
    if t["loop_longest_us"] > LOOP_HELD_US:  # a broker inside it held its loop
        label.append(f"  loop {loop_ms(t['loop_longest_us'])}", style="yellow")
    return label


def broker_label(model: NetworkModel, broker: str) -> Text:
    v = model.brokers[broker]
    label = Text(broker, style="bold")
    if v.stats is None:
        label.append(f"  down: {v.error or 'no report yet'}", style="red")
        return label
    s = v.stats
    links = f"{len(s.links_up)}/{s.links_expected}"
    label.append(
        f"  links {links}", style="green" if len(s.links_up) == s.links_expected else "yellow"
    )
    label.append(
        f"  clients {rate(s.clients)}  subs {rate(s.subscriptions)}  in {rate(v.rate_in)}  "
        f"out {rate(v.rate_out)}  dlv {rate(v.rate_delivered)}"
    )
    if s.sessions:
        label.append(f"  sessions {rate(s.sessions)}")
    if s.slow_consumers:
        label.append(f"  slow {s.slow_consumers}", style="yellow")
    if v.restarts:
        label.append(f"  restarts {v.restarts}", style="yellow")
    if s.loop_longest_us > LOOP_HELD_US:
        label.append(f"  loop {loop_ms(s.loop_longest_us)}", style="yellow")
    return label


#: What the rates in the labels are.
LEGEND = (
    "per second: in = events the broker received (from its clients and from other brokers), "
    "out = sent on to other brokers, dlv = delivered to its clients"
)


def _busy_first(model: NetworkModel, units: list[Unit]) -> list[Unit]:
    return sorted(
        units,
        key=lambda u: (-HEALTH_RANK[model.health(u)], -model.totals(u)["rate_in"]),
    )


def network_tree(
    model: NetworkModel, *, max_children: int = MAX_CHILDREN, max_lines: int | None = None
) -> Tree:
    """The unit tree; past ``max_children`` members a unit lists its busiest and unhealthy
    ones and says how many more it holds. With ``max_lines`` (a terminal's height), the tree
    is cut at the deepest level that fits — healthy units below it closed ("… n brokers"),
    units that are not healthy still open."""
    depth = _depth_that_fits(model, max_children, max_lines)

    def grow(node: Tree, unit: Unit) -> None:
        if len(unit.path) >= depth and model.health(unit) == OK and unit.path:
            node.add(Text(f"… {len(model.unit_brokers(unit))} brokers, all ok", style="dim"))
            return
        if unit.brokers:
            brokers = unit.brokers
            if len(brokers) > max_children:
                brokers = sorted(
                    brokers,
                    key=lambda b: (model.brokers[b].answering, -model.brokers[b].rate_in),
                )[:max_children]
            for b in brokers:
                node.add(broker_label(model, b))
            if len(unit.brokers) > len(brokers):
                node.add(Text(f"… {len(unit.brokers) - len(brokers)} more brokers", style="dim"))
        units = unit.units
        shown = units if len(units) <= max_children else _busy_first(model, units)[:max_children]
        for inner in shown:
            grow(node.add(unit_label(model, inner)), inner)
        if len(units) > len(shown):
            node.add(Text(f"… {len(units) - len(shown)} more units", style="dim"))

    tree = Tree(unit_label(model, model.root))
    grow(tree, model.root)
    return tree


def _depth_that_fits(model: NetworkModel, max_children: int, max_lines: int | None) -> int:
    """The deepest unit level whose tree (as network_tree draws it) has at most
    ``max_lines`` lines; 1 (top units only) if none does."""
    full = model.topology.depth + 1
    if max_lines is None:
        return full

    def lines(unit: Unit, depth: int) -> int:
        if len(unit.path) >= depth and model.health(unit) == OK and unit.path:
            return 1
        n = min(len(unit.brokers), max_children) + (len(unit.brokers) > max_children)
        shown = unit.units[:max_children]
        n += len(unit.units) > max_children
        return n + sum(1 + lines(u, depth) for u in shown)

    for depth in range(full, 0, -1):
        if 1 + lines(model.root, depth) <= max_lines:
            return depth
    return 1


def links_table(model: NetworkModel, *, limit: int = MAX_LINKS) -> Table | Text:
    bad = [link for link in model.links() if link.state != LINK_UP]
    if not bad:
        return Text(f"all {len(model.links())} links up", style="green")
    table = Table(title=f"links not up ({len(bad)} of {len(model.links())})", title_justify="left")
    for col in ("link", "level", "state"):
        table.add_column(col)
    for link in sorted(bad, key=lambda x: (-x.level, x.a, x.b))[:limit]:
        style = "yellow" if link.state in ("half", "unknown") else "red"
        table.add_row(f"{link.a}–{link.b}", str(link.level), Text(link.state, style=style))
    if len(bad) > limit:
        table.add_row(f"… {len(bad) - limit} more", "", "")
    return table


def log_lines(model: NetworkModel, started: float, *, lines: int = LOG_LINES) -> Text:
    text = Text()
    for entry in list(model.log)[-lines:]:
        text.append(f"{entry.at - started:8.1f}s  ", style="dim")
        text.append(entry.text + "\n", style="yellow" if entry.level == "warning" else "")
    return text


def overview(
    model: NetworkModel, started: float, *, height: int | None = None, source: str = ""
) -> Group:
    """The tree, the legend, the links not up and the latest events; with ``height`` (a
    terminal's), the tree is closed down to what leaves room for the rest."""
    bad = sum(link.state != LINK_UP for link in model.links())
    rest = 1 + (1 if not bad else 4 + min(bad, MAX_LINKS)) + min(len(model.log), LOG_LINES) + 1
    rest += 1 if source else 0
    tree_lines = None if height is None else max(4, height - rest)
    parts = [
        network_tree(model, max_lines=tree_lines),
        Text(LEGEND, style="dim"),
        *([Text(f"watching {source}", style="dim")] if source else []),
        links_table(model),
    ]
    if model.log:
        parts.append(log_lines(model, started))
    return Group(*parts)
