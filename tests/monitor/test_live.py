"""The live view (``ges.monitor``): the unit tree it draws from brokers' Stats, the rates it
computes between two polls, the busiest members of a large unit, and what fits in 80 columns.
The view is rendered to a recording rich Console and read as text."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio
from rich.console import Console

from ges.errors import OperationError
from ges.monitor import Monitor
from ges.monitor import live as live_module
from ges.monitor import tree as tree_module
from ges.topology import Topology
from ges.wire import messages as m
from tests.conftest import ten_events_through
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

#: Three brokers in two clusters of one super-cluster.
SMALL = {
    "name": "small",
    "brokers": {
        "b1": {"unit": "SSC-A/SC-1/c1", "port": 7001},
        "b2": {"unit": "SSC-A/SC-1/c1", "port": 7002},
        "b3": {"unit": "SSC-A/SC-1/c2", "port": 7003},
    },
    "links": [["b1", "b2"], ["b2", "b3"]],
}


def stats(broker: str, **values) -> m.Stats:
    base = {
        "broker": broker,
        "incarnation": "1",
        "clients": 1,  # the monitor's own connection
        "subscriptions": 0,
        "links_up": [],
        "links_expected": 0,
        "events_in": 0,
        "events_out": 0,
        "frames_in": 0,
        "frames_out": 0,
        "published": 0,
        "delivered": 0,
        "duplicates": 0,
    }
    return m.Stats(**{**base, **values})


def rendered(monitor: Monitor, width: int) -> str:
    """The view as a terminal ``width`` columns wide shows it, as text."""
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(monitor.render())
    return console.export_text()


def lines(text: str) -> dict[str, str]:
    """Each broker's or unit's line, by its name, the tree's guides left out."""
    out = {}
    for line in text.splitlines():
        words = line.lstrip("│├└─ ").split()
        if words:
            out.setdefault(words[0], " ".join(words))
    return out


def feed(monitor: Monitor, broker: str, now: float, **values) -> None:
    monitor.model.observe(broker, stats(broker, **values), now)


def small_monitor() -> Monitor:
    monitor = Monitor(Topology.from_dict(SMALL))
    feed(monitor, "b1", 0.0, clients=2, subscriptions=2, links_up=["b2"], links_expected=1)
    feed(
        monitor,
        "b1",
        1.0,
        clients=2,
        subscriptions=2,
        links_up=["b2"],
        links_expected=1,
        events_in=1234,
        events_out=12_345,
        delivered=57,
    )
    feed(monitor, "b2", 1.0, clients=0, links_up=["b1"], links_expected=2, delivered=1_234_567)
    monitor.model.unreachable("b3", "cannot reach broker at 127.0.0.1:7003: refused", 1.0)
    return monitor


def test_each_unit_and_broker_is_a_line_with_its_figures_and_one_that_is_down_says_why():
    got = lines(rendered(small_monitor(), 120))
    assert got["network"] == "network small some down brokers 2/3 clients 2 in 1.2k dlv 57"
    assert got["c1"] == "c1 ok brokers 2/2 clients 2 in 1.2k dlv 57"
    assert got["c2"].startswith("c2 unreachable brokers 0/1")
    assert got["b1"] == "b1 links 1/1 clients 2 subs 2 in 1.2k out 12k dlv 57"
    assert got["b2"] == "b2 links 1/2 clients 0 subs 0 in 0 out 0 dlv 0"
    assert got["b3"] == "b3 down: cannot reach broker at 127.0.0.1:7003: refused"
    text = rendered(small_monitor(), 120)
    assert text.index("b1") < text.index("b2") < text.index("b3")  # in broker order
    assert "link b2–b3" in text and "down" in text


def test_links_and_health_read_green_when_all_is_well_yellow_when_not_and_red_when_down():
    console = Console(width=120, file=io.StringIO(), color_system="standard")
    colours = {
        seg.text.strip(): seg.style.color.name
        for seg in console.render(small_monitor().render())
        if seg.style is not None and seg.style.color is not None
    }
    assert colours["links 1/1"] == "green"
    assert colours["links 1/2"] == "yellow"
    assert colours["ok"] == "green" and colours["unreachable"] == "red"
    assert colours["down: cannot reach broker at 127.0.0.1:7003: refused"] == "red"


def test_a_broker_whose_loop_ran_over_10_ms_at_once_says_so_in_yellow_and_so_does_its_unit():
    monitor = small_monitor()
    b1 = dict(clients=2, subscriptions=2, links_up=["b2"], links_expected=1)
    feed(monitor, "b1", 2.0, **b1, loop_longest_us=34_000, loop_busy_us=1)
    feed(monitor, "b2", 2.0, clients=0, links_up=["b1"], links_expected=2, loop_longest_us=10_000)
    got = lines(rendered(monitor, 120))
    assert got["b1"] == "b1 links 1/1 clients 2 subs 2 in 0 out 0 dlv 0 loop 34ms"
    assert got["b2"] == "b2 links 1/2 clients 0 subs 0 in 0 out 0 dlv 0"  # 10 ms: not over
    assert got["c1"].endswith(" loop 34ms") and got["network"].endswith(" loop 34ms")
    assert "loop" not in got["c2"]
    console = Console(width=120, file=io.StringIO(), color_system="standard")
    colours = {
        seg.text.strip(): seg.style.color.name
        for seg in console.render(monitor.render())
        if seg.style is not None and seg.style.color is not None
    }
    assert colours["loop 34ms"] == "yellow"
    feed(monitor, "b1", 13.0, **b1, loop_longest_us=900, loop_busy_us=2)  # 10 s later
    assert "loop" not in lines(rendered(monitor, 120))["b1"]


@pytest.fixture
def answers(monkeypatch):
    """What each broker answers the monitor's next poll: Stats, or an error."""
    by_port: dict[int, m.Stats | OperationError] = {}

    async def broker_stats(host, port, **_):
        answer = by_port[port]
        if isinstance(answer, OperationError):
            raise answer
        return answer

    monkeypatch.setattr(live_module, "broker_stats", broker_stats)
    return by_port


async def test_rates_are_the_counters_difference_over_the_time_between_polls(answers, mock_clock):
    topology = Topology.from_dict(SMALL)
    port = {b: spec.port for b, spec in topology.brokers.items()}
    monitor = Monitor(topology)
    views = monitor.model.brokers

    answers[port["b1"]] = stats("b1", events_in=1_000, events_out=500)
    answers[port["b2"]] = stats("b2", events_in=7, events_out=7)
    answers[port["b3"]] = OperationError("cannot reach broker at 127.0.0.1:7003")
    await monitor.poll_once()
    b1, b2, b3 = views["b1"], views["b2"], views["b3"]
    assert (b1.rate_in, b1.rate_out) == (0, 0)  # one poll: no rate yet
    assert b3.stats is None and b3.error.startswith("cannot reach")
    assert b1.stats.clients == 0  # the monitor's own connection is not a client

    mock_clock.jump(2.0)
    answers[port["b1"]] = stats("b1", events_in=3_000, events_out=4_500)
    answers[port["b3"]] = stats("b3", events_in=50)  # back
    await monitor.poll_once()
    assert (b1.rate_in, b1.rate_out) == (1_000, 2_000)
    assert (b2.rate_in, b2.rate_out) == (0, 0)
    assert b3.error is None and (b3.rate_in, b3.rate_out) == (0, 0)
    text = rendered(monitor, 120)
    assert "in 1.0k out 2.0k" in lines(text)["b1"]
    assert lines(text)["network"].startswith("network small")
    assert "b3 answers again" in text

    # b1 restarted: its counters start over; that is no negative rate, and it is told
    mock_clock.jump(2.0)
    answers[port["b1"]] = stats("b1", incarnation="2", events_in=10, events_out=10)
    await monitor.poll_once()
    assert b1.rate_in >= 0 and b1.rate_out >= 0 and b1.restarts == 1
    mock_clock.jump(1.0)
    answers[port["b1"]] = stats("b1", incarnation="2", events_in=310, events_out=10)
    await monitor.poll_once()
    assert (b1.rate_in, b1.rate_out) == (300, 0)
    assert "b1 restarted" in rendered(monitor, 120)

    # a broker that stops answering shows as down, with no rate
    answers[port["b1"]] = OperationError("cannot reach broker at 127.0.0.1:7001")
    await monitor.poll_once()
    assert (b1.rate_in, b1.rate_out) == (0, 0)
    assert lines(rendered(monitor, 120))["b1"].startswith("b1 down: cannot reach")


def test_a_large_cluster_lists_brokers_that_are_down_then_the_busiest_and_how_many_more():
    n = tree_module.MAX_CHILDREN + 5
    topology = Topology.from_dict(
        {
            "name": "wide",
            "brokers": {f"b{i}": {"unit": "S/c1", "port": 7000 + i} for i in range(1, n + 1)},
            "links": [[f"b{i}", f"b{i + 1}"] for i in range(1, n)],
        }
    )
    monitor = Monitor(topology)
    for i in range(1, n + 1):
        b = f"b{i}"
        if i == 7:
            monitor.model.unreachable(b, "cannot reach", 1.0)
            continue
        feed(monitor, b, 0.0)
        feed(monitor, b, 1.0, events_in=i * 10)  # b17 busiest, b1 quietest
    text = rendered(monitor, 120)
    shown = [name for name in lines(text) if name[0] == "b" and name[1:].isdigit()]
    busiest = [f"b{i}" for i in range(n, 0, -1) if i != 7][: tree_module.MAX_CHILDREN - 1]
    assert shown == ["b7", *busiest]
    assert f"… {n - tree_module.MAX_CHILDREN} more brokers" in text
    # the chain of brokers is broken at b7: what answers is in two pieces
    assert lines(text)["c1"].startswith(f"c1 split brokers {n - 1}/{n}")


def demo_monitor(delivered: int) -> Monitor:
    topology = Topology.from_yaml(ROOT / "topologies" / "demo.yaml")
    monitor = Monitor(topology)
    for b in monitor.model.brokers:
        ups = list(topology.neighbours[b])
        for now, k in ((0.0, 0), (1.0, 1)):
            feed(
                monitor,
                b,
                now,
                clients=4,
                subscriptions=12,
                links_up=ups,
                links_expected=len(ups),
                events_in=98_765 * k,
                events_out=4_321 * k,
                delivered=delivered * k,
            )
    return monitor


def test_at_80_columns_the_demo_is_one_line_per_unit_and_broker_with_nothing_cut():
    """The demo topology (``ges up topologies/demo.yaml``) in an 80-column terminal: every
    unit and broker on one line of at most 80 columns, each figure whole."""
    text = rendered(demo_monitor(delivered=123_456_789), 80)
    tree = text.split("per second:")[0].splitlines()
    assert max(map(len, text.splitlines())) <= 80
    assert len(tree) == 1 + 2 + 4 + 8 + 20  # network, SSCs, SCs, clusters, brokers
    got = lines(text)
    for i in range(1, 21):
        assert got[f"b{i}"].endswith("clients 4 subs 12 in 99k out 4.3k dlv 123M"), got[f"b{i}"]
    assert got["network"] == "network demo ok brokers 20/20 clients 80 in 2.0M dlv 2.5G"
    assert "all 30 links up" in text


async def test_a_running_network_is_drawn_from_what_its_brokers_answer(chain3):
    """Over real TCP: a subscriber at b3 and a publisher at b1, ten events delivered."""
    async with trio.open_nursery() as nursery:
        async with ten_events_through(chain3, nursery):
            monitor = Monitor(chain3)
            # clients (the monitor's own left out), subscriptions and links up
            want = {
                "b1": "b1 links 1/1 clients 1 subs 0",
                "b2": "b2 links 2/2 clients 0 subs 0",
                "b3": "b3 links 1/1 clients 1 subs 1",
            }

            async def drawn():
                # polled until the brokers have seen wait_ready's connections close
                await monitor.poll_once()
                got = lines(rendered(monitor, 120))
                return all(got[b].startswith(line) for b, line in want.items())

            await wait_until(drawn, f"the view to show {want}")
            assert monitor.model.brokers["b3"].stats.delivered == 10
        nursery.cancel_scope.cancel()


def test_a_view_taller_than_the_terminal_closes_healthy_units_and_keeps_sick_ones_open():
    monitor = demo_monitor(delivered=1_000)
    monitor.model.unreachable("b7", "cannot reach broker at 127.0.0.1:7107", 2.0)
    console = Console(width=100, height=30, record=True, color_system=None, file=io.StringIO())
    console.print(monitor.render(height=30))
    text = console.export_text()
    assert len(text.splitlines()) <= 30
    got = lines(text)
    assert "b7" in got and got["b7"].startswith("b7 down")  # its cluster is not healthy: open
    assert "b1" not in got and "… 3 brokers, all ok" in text  # healthy clusters closed
    assert "b7 does not answer" in text  # the event log still has its room
    # without a height (a file, --once): everything
    assert "b1" in lines(rendered(monitor, 100))
