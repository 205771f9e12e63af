"""``ges monitor``'s interactive view driven headless by Textual's pilot against real brokers
(over TCP, in a thread of the test): keys expand and collapse a unit and select a broker, a link
cut with ``ges link down`` shows as cut in the detail and in the event log, a broker stopped
shows down, a client roaming shows in the event log, and sort, filter and pause do what they
say."""

from __future__ import annotations

import asyncio
import time

import trio
import yaml
from textual.widgets import RichLog, Static, Tree
from typer.testing import CliRunner

from cli.main import app as ges_app
from ges.client import DurableSession
from ges.monitor.app import MonitorApp, broker_detail, broker_line, unit_detail, unit_line
from ges.monitor.live import Batch, Monitor
from ges.monitor.model import NetworkModel
from ges.topology import Topology
from tests.cli.test_link import running
from tests.conftest import DIAMOND, on_free_ports
from tests.monitor.test_live import SMALL, stats
from tests.runtime.test_sessions import EVERYTHING, REPLICATED, publish


def diamond(tmp_path):
    path = tmp_path / "diamond.yaml"
    path.write_text(yaml.safe_dump(on_free_ports(DIAMOND)))
    return path


def detail(app: MonitorApp) -> str:
    return str(app.query_one("#detail", Static).render())


def log_text(app: MonitorApp) -> str:
    return "\n".join(line.text for line in app.query_one(RichLog).lines)


def cursor(app: MonitorApp):
    return app.query_one(Tree).cursor_node.data


async def until(pilot, what, predicate, within: float = 15.0) -> None:
    end = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < end, f"not within {within}s: {what}"
        await pilot.pause(0.05)


def yellow(text) -> list[str]:
    return [str(text)[span.start : span.end] for span in text.spans if span.style == "yellow"]


def test_a_brokers_loop_is_in_its_detail_and_its_line_and_units_say_when_it_ran_over_10_ms():
    model = NetworkModel(Topology.from_dict(SMALL))
    c1 = model.units[("SSC-A", "SC-1", "c1")]
    model.observe("b1", stats("b1", loop_busy_us=1_000_000, loop_longest_us=800), 0.0)
    model.observe("b1", stats("b1", loop_busy_us=1_100_000, loop_longest_us=34_000), 1.0)
    detail = broker_detail(model, "b1", time.time())
    assert "loop     longest 34ms  busy 10%" in str(detail)
    assert "34ms" in yellow(detail)
    assert str(broker_line(model, "b1")).endswith(" loop 34ms")
    assert str(unit_line(model, c1)).endswith(" loop 34ms")
    assert "loop     longest 34ms (b1)" in str(unit_detail(model, c1))

    model.observe("b1", stats("b1", loop_busy_us=1_150_000, loop_longest_us=800), 2.0)
    detail = broker_detail(model, "b1", time.time())
    assert "loop     longest 0.8ms  busy 5%" in str(detail) and yellow(detail) == []
    assert "loop" not in str(broker_line(model, "b1")) and "loop" not in str(unit_line(model, c1))
    model.observe("b2", stats("b2"), 2.0)  # a broker that does not measure its loop
    assert "loop" not in str(broker_detail(model, "b2", time.time()))


def test_a_brokers_detail_says_how_many_earlier_epochs_its_log_still_holds():
    model = NetworkModel(Topology.from_dict(SMALL))
    model.observe("b1", stats("b1", log_held=7, log_epochs=2), 0.0)
    model.observe("b2", stats("b2", log_held=7), 0.0)
    line = next(
        x for x in str(broker_detail(model, "b1", time.time())).splitlines() if x.startswith("log ")
    )
    assert line.startswith("log      held 7 ") and line.endswith("  earlier epochs 2")
    assert "earlier" not in str(broker_detail(model, "b2", time.time()))  # none: not shown


def test_keys_open_a_unit_select_a_broker_and_a_cut_link_shows_as_cut(tmp_path):
    path = diamond(tmp_path)
    topology = Topology.from_yaml(path)

    async def scenario() -> None:
        app = MonitorApp(Monitor(topology, refresh=0.2))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, "two rounds", lambda: app.rounds >= 2)
            c1 = app.nodes[("unit", ("S", "c1"))]
            assert c1.is_expanded  # a small network starts all open
            await pilot.press("down", "down")  # network → S → c1
            assert cursor(app) == ("unit", ("S", "c1"))
            assert "S/c1" in detail(app) and "brokers  2/2 answering" in detail(app)
            await pilot.press("space")
            assert c1.is_collapsed
            await pilot.press("space", "down")  # open again, then the first broker, a
            assert c1.is_expanded and cursor(app) == ("broker", "a")
            assert "a  S/c1" in detail(app) and "c        level 1  up" in detail(app)
            assert "loop     longest " in detail(app)  # its process's event loop

            result = await asyncio.to_thread(
                CliRunner().invoke, ges_app, ["link", "down", str(path), "a", "c", "--insecure"]
            )
            assert result.exit_code == 0, result.stderr
            await until(pilot, "the cut shown", lambda: "level 1  cut" in detail(app))
            await until(pilot, "the cut logged", lambda: "link a–c cut" in log_text(app))
            assert "a 1/2" in str(app.nodes[("broker", "a")].label)

    with running(path):
        asyncio.run(scenario())


def test_a_broker_not_running_shows_down_and_sort_filter_and_pause_do_what_they_say(tmp_path):
    path = diamond(tmp_path)
    topology = Topology.from_yaml(path)

    async def scenario() -> None:
        app = MonitorApp(Monitor(topology, refresh=0.2))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, "two rounds", lambda: app.rounds >= 2)
            assert str(app.nodes[("broker", "d")].label) == "d down"
            c2 = str(app.nodes[("unit", ("S", "c2"))].label)
            assert c2.startswith("c2 some down 1/2")
            # no report from it: after three intervals (at least 3 s) it counts as not answering,
            # either as silent or, asked directly meanwhile, with why it could not be reached
            said = "d does not answer: "
            await until(pilot, "d silent", lambda: said in log_text(app))
            why = log_text(app).split(said, 1)[1].splitlines()[0]
            assert why == "has not reported" or why.startswith("cannot reach broker at "), why

            await pilot.press("s", "s")  # name → rate → health: the unhealthy unit first
            assert app.sort == "health"
            s_node = app.nodes[("unit", ("S",))]
            assert [str(n.label).split()[0] for n in s_node.children] == ["c2", "c1"]
            assert [str(n.label).split()[0] for n in app.nodes[("unit", ("S", "c2"))].children] == [
                "d",
                "c",
            ]

            await pilot.press("slash", *"b", "enter")  # only what has a "b" in its name
            assert app.filter == "b"
            assert ("broker", "b") in app.nodes and ("broker", "a") not in app.nodes
            assert ("unit", ("S", "c2")) not in app.nodes
            await pilot.press("escape")
            assert app.filter == "" and ("broker", "a") in app.nodes

            await pilot.press("p")
            assert app.paused and "paused" in app.sub_title
            before = str(app.nodes[("broker", "a")].label)
            rounds = app.rounds
            await until(pilot, "more rounds while paused", lambda: app.rounds >= rounds + 2)
            assert str(app.nodes[("broker", "a")].label) == before
            await pilot.press("p")
            assert not app.paused

    with running(path, only=["a", "b", "c"]):
        asyncio.run(scenario())


def test_the_event_log_pane_goes_on_after_the_models_log_is_full(tmp_path):
    """The model keeps its last few entries; the pane still shows each new one."""
    topology = Topology.from_yaml(diamond(tmp_path))
    monitor = Monitor(topology, poll=True)
    monitor.model = NetworkModel(topology, log_entries=3)

    async def scenario() -> None:
        app = MonitorApp(monitor, poll=False)
        async with app.run_test(size=(100, 30)) as pilot:
            for i in range(10):  # a broker going away and coming back: two entries a round
                app.take(Batch(2.0 * i, [("a", "refused", 2.0 * i)]))
                up = list(topology.neighbours["a"])
                answer = stats("a", links_up=up, links_expected=len(up))
                app.take(Batch(2 * i + 1.0, [("a", answer, 2 * i + 1.0)]))
                await pilot.pause()
            shown = log_text(app).splitlines()
            assert len(shown) == app.model.logged > 20  # every entry, not only the last 3
            assert shown[-1].endswith("a answers again")

    asyncio.run(scenario())


def test_a_client_roaming_between_brokers_shows_in_the_event_log(tmp_path):
    """Durable session alice opens at d, leaves, misses events and resumes at b: the line its
    replicator logs comes to the view in that broker's report."""
    path = tmp_path / "replicated.yaml"
    path.write_text(yaml.safe_dump(on_free_ports(REPLICATED)))
    topology = Topology.from_yaml(path)

    async def roam() -> None:
        s = DurableSession(topology, "alice", "d", EVERYTHING)
        async with s.running():
            with trio.fail_after(10):
                while not s.moves:
                    await trio.sleep(0.02)
        await publish(topology, "a", 0, 12)
        again = DurableSession(topology, "alice", "b", None)
        async with again.running():
            with trio.fail_after(10):
                while not again.moves:
                    await trio.sleep(0.02)

    async def scenario() -> None:
        app = MonitorApp(Monitor(topology, refresh=0.2))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, "two rounds", lambda: app.rounds >= 2)
            await asyncio.to_thread(trio.run, roam)
            said = "c: durable session alice: d -> b, 12 to replay"
            await until(pilot, "the roam in the log pane", lambda: said in log_text(app))

    with running(path):
        asyncio.run(scenario())
