"""``ges monitor``'s interactive view: a Textual application over the network's model.

The unit tree on the left (expand and collapse units, move with the arrows), the selected unit
or broker in detail on the right, the event log below. Keys: ``s`` sorts members by name,
events in per second or health; ``/`` filters by unit or broker name; ``p`` pauses; ``e`` and
``c`` expand and collapse everything; ``?`` shows the keys; ``q`` quits.

Textual runs on asyncio; the brokers are asked on a trio thread (a Textual thread worker running
``trio.run``), which hands each round's answers to the application's thread
(``App.call_from_thread``), where they are fed to the model: the model is only ever touched on
the application's thread.
"""

from __future__ import annotations

import contextlib
import time

import trio
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.widgets import Footer, Input, RichLog, Static, Tree
from textual.worker import get_current_worker

from ges.errors import OperationError
from ges.monitor.live import Monitor
from ges.monitor.model import HEALTH_RANK, LINK_UP, LOOP_HELD_US, OK, NetworkModel, Unit
from ges.monitor.tree import HEALTH_STYLE, loop_ms, rate

#: Networks of at most this many brokers start with every unit open; larger ones start with
#: the top units open, and any unit that is not healthy.
OPEN_ALL_BROKERS = 64
#: Sort orders of a unit's members, in the order ``s`` goes through them.
SORTS = ("name", "rate", "health")
#: What handing the application a batch raises once it has stopped, or is stopping (its
#: widgets gone: the screen was taken down while the batch was on its way).
STOPPED = (RuntimeError, NoMatches)

HELP = (
    "↑↓ move · space/enter expand or collapse · s sort (name, rate, health) · / filter · "
    "esc clear the filter · p pause · e expand all · c collapse all · q quit"
)


def unit_line(model: NetworkModel, unit: Unit) -> Text:
    """A unit on one short line: name, health, brokers answering, events in per second."""
    health = model.health(unit)
    t = model.totals(unit)
    # each span ends with its space: a Tree label loses the whitespace a span starts with
    line = Text((unit.name or f"network {model.topology.name}") + " ", style="bold")
    line.append(health + " ", style=HEALTH_STYLE[health])
    line.append(f"{t['answering']}/{t['members']} in {rate(t['rate_in'])}")
    if t["loop_longest_us"] > LOOP_HELD_US:
        line.append(f" loop {loop_ms(t['loop_longest_us'])}", style="yellow")
    return line


def broker_line(model: NetworkModel, broker: str) -> Text:
    """A broker on one short line: id, links up, clients, events in and delivered per second."""
    v = model.brokers[broker]
    # each span ends with its space: a Tree label loses the whitespace a span starts with
    line = Text(broker + " ", style="bold")
    if v.stats is None:
        return line.append("down", style="red")
    s = v.stats
    ok = len(s.links_up) == s.links_expected
    line.append(f"{len(s.links_up)}/{s.links_expected} ", style="green" if ok else "yellow")
    line.append(f"cl {rate(s.clients)} in {rate(v.rate_in)} dlv {rate(v.rate_delivered)}")
    if v.restarts:
        line.append(f" ↻{v.restarts}", style="yellow")
    if s.loop_longest_us > LOOP_HELD_US:
        line.append(f" loop {loop_ms(s.loop_longest_us)}", style="yellow")
    return line


def unit_detail(model: NetworkModel, unit: Unit) -> Text:
    t = model.totals(unit)
    health = model.health(unit)
    out = Text()
    out.append(("/".join(unit.path) or f"network {model.topology.name}") + "\n", style="bold")
    out.append("health   ")
    out.append(health + "\n", style=HEALTH_STYLE[health])
    out.append(
        f"brokers  {t['answering']}/{t['members']} answering\n"
        f"clients  {t['clients']:,}\nsessions {t['sessions']:,}\n"
        f"per s    in {rate(t['rate_in'])}  out {rate(t['rate_out'])}  "
        f"dlv {rate(t['rate_delivered'])}\nrestarts {t['restarts']}\n"
    )
    longest = t["loop_longest_us"]
    if longest:
        held = max(unit.members, key=lambda b: model.brokers[b].loop_longest_us)
        out.append("loop     longest ")
        out.append(loop_ms(longest), style="yellow" if longest > LOOP_HELD_US else "")
        out.append(f" ({held})\n")
    inside = set(unit.members)
    links = model.links()
    bad = [x for x in links if x.a in inside and x.b in inside and x.state != LINK_UP]
    leaving = [x for x in links if (x.a in inside) != (x.b in inside)]
    out.append(f"links inside not up: {len(bad)}\n")
    for x in bad[:8]:
        out.append(f"  {x.a}–{x.b} ", style="")
        out.append(f"{x.state}\n", style="red" if x.state in ("down", "cut") else "yellow")
    if leaving:
        down = sum(x.state != LINK_UP for x in leaving)
        out.append(f"gateways out: {len(leaving)}, {down} not up\n")
    return out


def broker_detail(model: NetworkModel, broker: str, now_unix: float) -> Text:
    v = model.brokers[broker]
    out = Text()
    out.append(f"{broker}  ", style="bold")
    out.append("/".join(v.unit) + "\n", style="dim")
    if v.stats is None:
        out.append(f"down: {v.error or 'no report yet'}\n", style="red")
        out.append(f"restarts seen {v.restarts}\n")
        return out
    s = v.stats
    started = int(s.incarnation) / 1e9 if s.incarnation.isdigit() else 0.0
    if started > 1e9:
        out.append(f"up       {_duration(now_unix - started)} (pid {s.pid})\n")
    out.append(
        f"restarts {v.restarts} seen\n"
        f"clients  {s.clients:,}  subs {s.subscriptions:,}  sessions {s.sessions:,}\n"
        f"per s    in {rate(v.rate_in)}  out {rate(v.rate_out)}  dlv {rate(v.rate_delivered)}\n"
        f"totals   in {s.events_in:,}  dlv {s.delivered:,}  dup {s.duplicates:,}\n"
        f"queued   clients {_bytes(s.queued_clients)}  links {_bytes(s.queued_links)}\n"
        f"slow consumers {s.slow_consumers}   refused {s.clients_refused}\n"
        f"log      held {s.log_held:,}  released {s.log_released:,}  {_bytes(s.log_bytes)}"
        f"{f'  earlier epochs {s.log_epochs}' if s.log_epochs else ''}\n"
        f"nacks    sent {s.nacks_sent:,}  answered {s.nacks_answered:,}\n"
        f"repaired {s.recovered:,} events  lost {s.lost:,} ticks\n"
        f"profiles {s.profile_entries:,} entries\n"
    )
    if s.sessions or s.session_epoch:
        out.append(
            f"replica  {s.sessions:,} sessions  {s.session_events:,} held"
            f"  epoch {s.session_epoch:,}\n"
        )
    if s.latency_p50_us:
        out.append(f"latency  p50 {s.latency_p50_us:,} µs  p99 {s.latency_p99_us:,} µs\n")
    if s.loop_busy_us:  # 0: a broker that does not measure its loop
        out.append("loop     longest ")
        held = s.loop_longest_us > LOOP_HELD_US
        out.append(loop_ms(s.loop_longest_us), style="yellow" if held else "")
        out.append(f"  busy {100 * v.loop_busy:.0f}%\n")
    out.append("links\n")
    for peer in model.topology.neighbours[broker]:
        state = "cut" if peer in s.links_cut else "up" if peer in s.links_up else "down"
        level = model.topology.link_level(broker, peer)
        out.append(f"  {peer:<8} level {level}  ")
        out.append(state + "\n", style="green" if state == "up" else "red")
    return out


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class MonitorApp(App):
    """The interactive view (see the module)."""

    TITLE = "GES monitor"
    CSS = """
    #main { height: 1fr; }
    #tree { width: 1fr; min-width: 30; }
    #detail { width: 38; padding: 0 1; border-left: solid $primary; }
    #log { height: 6; border-top: solid $primary; }
    #filter { dock: bottom; display: none; }
    #filter.shown { display: block; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("s", "sort", "sort"),
        Binding("slash", "filter", "filter"),
        Binding("escape", "clear_filter", "clear", show=False),
        Binding("p", "pause", "pause"),
        Binding("e", "expand_all", "expand"),
        Binding("c", "collapse_all", "collapse"),
        Binding("question_mark", "help", "help"),
    ]

    def __init__(self, monitor: Monitor, *, poll: bool = True) -> None:
        super().__init__()
        self.monitor = monitor
        self.model = monitor.model
        self.poll = poll
        self.sort = "name"
        self.filter = ""
        self.paused = False
        self.rounds = 0
        self.nodes: dict = {}  # ("unit", path) or ("broker", id) -> its TreeNode
        self._opened: set = set()  # the units the user has open
        self._logged = 0  # the model's entries shown (NetworkModel.logged)
        self._sick_opened: set = set()  # units opened because they were not healthy

    # -- layout ----------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield Tree(unit_line(self.model, self.model.root), id="tree")
            yield Static(id="detail")
        yield RichLog(id="log", max_lines=500, wrap=False)
        yield Input(placeholder="filter: part of a unit or broker name", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self._title()
        small = len(self.model.brokers) <= OPEN_ALL_BROKERS
        self._opened = {u.path for u in self.model.units.values() if small or len(u.path) <= 1}
        self._rebuild()
        self.query_one(Tree).focus()
        if self.poll:
            self.run_worker(self._poll_thread, thread=True, exclusive=True, name="poll")

    # -- the tree --------------------------------------------------------------------------------

    def _members(self, unit: Unit) -> tuple[list[Unit], list[str]]:
        units, brokers = list(unit.units), list(unit.brokers)
        model = self.model
        if self.filter:
            units = [u for u in units if self._matches(u)]
            brokers = [b for b in brokers if self.filter in b or self.filter in "/".join(unit.path)]
        if self.sort == "rate":
            units.sort(key=lambda u: -model.totals(u)["rate_in"])
            brokers.sort(key=lambda b: -model.brokers[b].rate_in)
        elif self.sort == "health":
            units.sort(key=lambda u: -HEALTH_RANK[model.health(u)])
            brokers.sort(key=lambda b: model.brokers[b].answering)
        return units, brokers

    def _matches(self, unit: Unit) -> bool:
        if self.filter in "/".join(unit.path):
            return True
        return any(self.filter in b for b in unit.brokers) or any(
            self._matches(u) for u in unit.units
        )

    def _rebuild(self) -> None:
        """The tree made again from the model (after a sort or a filter), keeping which units
        are open and where the cursor is."""
        tree = self.query_one(Tree)
        at = tree.cursor_node.data if tree.cursor_node is not None else None
        tree.clear()
        tree.root.data = ("unit", ())
        self.nodes = {("unit", ()): tree.root}

        def grow(node, unit: Unit) -> None:
            units, brokers = self._members(unit)
            for inner in units:
                child = node.add(unit_line(self.model, inner), data=("unit", inner.path))
                self.nodes[("unit", inner.path)] = child
                grow(child, inner)
                if inner.path in self._opened or self.filter:
                    child.expand()
            for b in brokers:
                self.nodes[("broker", b)] = node.add_leaf(
                    broker_line(self.model, b), data=("broker", b)
                )

        grow(tree.root, self.model.root)
        tree.root.expand()
        if at in self.nodes:
            tree.move_cursor(self.nodes[at])
        self._show_detail()

    def _relabel(self) -> None:
        for (kind, key), node in self.nodes.items():
            if kind == "unit":
                node.set_label(unit_line(self.model, self.model.units[key]))
            else:
                node.set_label(broker_line(self.model, key))
        self._show_detail()

    def _show_detail(self) -> None:
        node = self.query_one(Tree).cursor_node
        data = node.data if node is not None else ("unit", ())
        kind, key = data or ("unit", ())
        text = (
            unit_detail(self.model, self.model.units[key])
            if kind == "unit"
            else broker_detail(self.model, key, time.time())
        )
        self.query_one("#detail", Static).update(text)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        self._show_detail()

    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        if event.node.data and event.node.data[0] == "unit":
            self._opened.add(event.node.data[1])

    def on_tree_node_collapsed(self, event: Tree.NodeCollapsed) -> None:
        if event.node.data and event.node.data[0] == "unit":
            self._opened.discard(event.node.data[1])

    # -- reports ---------------------------------------------------------------------------------

    def _poll_thread(self) -> None:
        """The worker thread: trio, feeding what the brokers say to the application's thread
        in batches (Monitor.feed)."""
        worker = get_current_worker()

        async def main() -> None:
            async with trio.open_nursery() as nursery:

                def hand_over(batch) -> None:
                    if worker.is_cancelled:
                        nursery.cancel_scope.cancel()
                        return
                    try:
                        self.call_from_thread(self.take, batch)
                    except STOPPED:  # the application has stopped meanwhile
                        nursery.cancel_scope.cancel()

                async def feed() -> None:
                    try:
                        await self.monitor.feed(hand_over)
                    except OperationError as exc:  # refused: said, and the view stays
                        with contextlib.suppress(*STOPPED):
                            self.call_from_thread(self.failed, str(exc))
                    nursery.cancel_scope.cancel()

                nursery.start_soon(feed)
                while not worker.is_cancelled:  # the app quitting stops it within 0.1 s
                    await trio.sleep(0.1)
                nursery.cancel_scope.cancel()

        trio.run(main)

    def failed(self, why: str) -> None:
        """The monitor cannot watch (on the application's thread)."""
        self.model.note("warning", f"error: {why}", self.model.log[-1].at if self.model.log else 0)
        self.sub_title = f"{self.model.topology.name} — {why}"
        self._write_log()

    def take(self, batch) -> None:
        """A batch of what the brokers said (on the application's thread)."""
        self.monitor.apply(batch)
        if batch.answers:
            self.rounds += 1
        if len(self.model.brokers) > OPEN_ALL_BROKERS:
            # a large network: open the units that are not healthy, once (as the model found
            # them once every broker was heard of)
            for path, health in self.model.unit_health.items():
                if health != OK and path not in self._sick_opened:
                    self._sick_opened.add(path)
                    self._opened.add(path)
                    node = self.nodes.get(("unit", path))
                    if node is not None:
                        node.expand()
        if self.paused:
            return
        self.sub_title = self._title()
        self._relabel()
        self._write_log()

    def _title(self) -> str:
        return f"{self.model.topology.name} — {self.monitor.source}" + (
            " — paused" if self.paused else ""
        )

    def _write_log(self) -> None:
        """The entries logged since the last call (the 50 newest, if more)."""
        new = self.model.logged - self._logged
        self._logged = self.model.logged
        if not new:
            return
        log = self.query_one(RichLog)
        started = self.monitor.started or 0.0
        for entry in list(self.model.log)[-min(new, 50) :]:
            line = Text(f"{entry.at - started:7.1f}s ", style="dim")
            line.append(entry.text, style="yellow" if entry.level == "warning" else "")
            log.write(line)

    # -- keys ------------------------------------------------------------------------------------

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.notify(f"sorted by {self.sort}", timeout=2)
        self._rebuild()

    def action_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.add_class("shown")
        field.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter = event.value.strip()
        event.input.remove_class("shown")
        self._rebuild()
        self.query_one(Tree).focus()

    def action_clear_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.value = ""
        field.remove_class("shown")
        if self.filter:
            self.filter = ""
            self._rebuild()
        self.query_one(Tree).focus()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.sub_title = self._title()
        if not self.paused:
            self._relabel()
            self._write_log()

    def action_expand_all(self) -> None:
        self.query_one(Tree).root.expand_all()
        self._opened = {u.path for u in self.model.units.values()}

    def action_collapse_all(self) -> None:
        tree = self.query_one(Tree)
        for node in tree.root.children:
            node.collapse_all()
        self._opened = set()

    def action_help(self) -> None:
        self.notify(HELP, title="keys", timeout=10)
