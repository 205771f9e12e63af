"""Watching a network through one broker (ges.core.watch), on the simulator: leases flood,
every broker reports to the root, reports stop when nobody watches, bounds hold."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import msgspec
import pytest

from ges.core import ProtocolError, ToClient
from ges.core.watch import MAX_LINE_CHARS, MAX_LINES, MAX_WATCHERS, MIN_INTERVAL
from ges.sim import Sim
from ges.topology import Topology
from ges.wire import FrameError
from ges.wire import messages as m

ROOT = Path(__file__).resolve().parents[2]


class Watched:
    """The demo topology on the simulator, with the reports each watcher got and the watch
    frames every broker sent."""

    def __init__(self, routing: str = "content"):
        self.topology = Topology.from_yaml(ROOT / "topologies/demo.yaml")
        #: per watcher: (when, one broker's report), and the Report frames it got
        self.reports: dict[tuple[str, int], list[tuple[float, m.Reported]]] = defaultdict(list)
        self.batches: dict[tuple[str, int], list[m.Report]] = defaultdict(list)
        self.frames: Counter = Counter()
        self.sim = Sim(
            self.topology,
            seed=1,
            routing=routing,
            reliable=routing == "content",
            on_report=self._report,
            on_send=self._sent,
        )
        self.sim.run_until(1.0)

    def _report(self, broker, conn, msg, now):
        self.reports[(broker, conn)] += [(now, m.opened(item)) for item in msg.items]
        self.batches[(broker, conn)].append(msg)

    def _sent(self, src, dst, msg):
        if type(msg) in (m.WatchLease, m.Report):
            self.frames[type(msg).__name__] += 1

    def reporters(self, key, since: float = 0.0) -> Counter:
        return Counter(r.stats.broker for at, r in self.reports[key] if at >= since)


def test_one_watcher_gets_every_brokers_report_each_interval():
    w = Watched()
    w.sim.client("b1", 7, m.Watch(1.0))
    w.sim.run_until(1.01)
    assert w.reporters(("b1", 7))["b2"] == 1  # a neighbour's first report comes at once
    w.sim.run_until(1.6)  # the others' within about half an interval (b20 is 5 hops away)
    assert set(w.reporters(("b1", 7))) == set(w.topology.brokers)
    w.sim.run_until(11.5)
    per_broker = w.reporters(("b1", 7), since=1.5)
    assert set(per_broker) == set(w.topology.brokers)
    assert all(9 <= n <= 11 for n in per_broker.values()), per_broker
    # a report arrives as it left its broker, with that broker's counters
    last = w.batches[("b1", 7)][-1]
    assert last.to == "b1" and last.hops == 0 and last.detour == []
    for item in map(m.opened, last.items):
        assert item.stats.links_expected == len(w.topology.neighbours[item.stats.broker])


def test_reports_are_gathered_on_their_way_one_frame_per_broker_and_interval():
    """After the first round each broker sends about one Report per interval, with what came to
    it from farther out (TAG's schedule; a report whose path is not the lease's goes on a slot
    later, in a frame of its own): not one frame per report per hop."""
    w = Watched()
    w.sim.client("b20", 1, m.Watch(1.0))
    w.sim.run_until(3.0)
    before = w.frames["Report"]
    w.sim.run_until(13.0)
    per_interval = (w.frames["Report"] - before) / 10
    relayed_one_by_one = sum(c.watching.leases["b20"].distance for c in w.sim.cores.values())
    assert per_interval <= 1.5 * len(w.topology.brokers) < relayed_one_by_one / 2, per_interval
    # and the root gets every broker's report within about half an interval of its turn
    arrived = [at for at, r in w.reports[("b20", 1)] if 5.0 <= at < 6.0]
    assert len(arrived) == len(w.topology.brokers)
    assert max(arrived) - min(arrived) < 0.6


def test_nothing_is_sent_while_nobody_watches_and_reports_stop_after_the_watcher_goes():
    w = Watched()
    w.sim.run_until(20.0)
    assert w.frames == Counter()  # an unwatched network pays nothing
    w.sim.client("b9", 1, m.Watch(0.5))
    w.sim.run_until(25.0)
    assert w.frames["Report"] > 0 and w.frames["WatchLease"] > 0
    w.sim.close_client("b9", 1)
    w.sim.run_until(40.0)  # the lease (6 s) runs out
    before = dict(w.frames)
    w.sim.run_until(60.0)
    assert dict(w.frames) == before


def test_a_lease_is_flooded_once_per_link_not_per_path():
    w = Watched()
    w.sim.client("b1", 1, m.Watch(60.0))  # reports rare: what is sent is the lease
    w.sim.run_until(1.2)
    links = sum(len(n) for n in w.topology.neighbours.values()) // 2
    assert w.frames["WatchLease"] <= 2 * links


def test_a_killed_broker_stops_reporting_and_reports_again_once_restarted():
    w = Watched()
    w.sim.client("b1", 1, m.Watch(1.0))
    w.sim.run_until(3.0)
    w.sim.kill("b14")
    w.sim.run_until(8.0)
    assert "b14" not in w.reporters(("b1", 1), since=3.5)
    w.sim.restart("b14")  # it learns of the lease from its neighbours as its links come up
    w.sim.run_until(10.0)
    assert w.reporters(("b1", 1), since=8.0)["b14"] >= 1
    incarnations = {r.stats.incarnation for _, r in w.reports[("b1", 1)] if r.stats.broker == "b14"}
    assert len(incarnations) == 2


def test_two_roots_each_get_every_report_at_the_interval_it_asked_for():
    w = Watched()
    w.sim.client("b1", 1, m.Watch(2.0))
    w.sim.client("b20", 1, m.Watch(0.5))
    w.sim.run_until(11.0)
    assert set(w.reporters(("b1", 1), since=1.0)) == set(w.topology.brokers)
    assert set(w.reporters(("b20", 1), since=1.0)) == set(w.topology.brokers)
    assert 4 <= w.reporters(("b1", 1), since=2.0)["b10"] <= 5
    assert 17 <= w.reporters(("b20", 1), since=2.0)["b10"] <= 19


def test_a_root_that_restarts_is_reported_to_again_at_once():
    """Its new lease counts from 1 again: its incarnation makes it newer than the old one."""
    w = Watched()
    w.sim.client("b5", 1, m.Watch(1.0))
    w.sim.run_until(3.0)
    w.sim.kill("b5")
    w.sim.restart("b5")
    w.sim.run_until(3.5)
    w.sim.client("b5", 2, m.Watch(1.0))
    w.sim.run_until(5.0)
    assert set(w.reporters(("b5", 2))) == set(w.topology.brokers)


def test_lines_are_bounded_in_number_and_length():
    w = Watched()
    core = w.sim.cores["b3"]
    pending = [m.LogLine(1.0, "info", "x" * (MAX_LINE_CHARS + 50))] * (MAX_LINES + 5)
    core.watching.lines = lambda: (pending, 2)
    w.sim.client("b1", 1, m.Watch(1.0))
    w.sim.run_until(1.6)
    (report,) = [r for _, r in w.reports[("b1", 1)] if r.stats.broker == "b3"][:1]
    assert len(report.lines) == MAX_LINES and report.missed == 7
    assert all(len(ln.text) == MAX_LINE_CHARS + 1 for ln in report.lines)


def test_bad_leases_reports_and_watches():
    w = Watched()
    core = w.sim.cores["b2"]
    with pytest.raises(ProtocolError, match="unknown broker"):
        core.peer_message("b1", m.WatchLease("nobody", 1, 1, 1.0, 6.0), 2.0)
    stats = core.stats()
    with pytest.raises(ProtocolError, match="unknown broker"):
        core.peer_message("b1", m.Report("nowhere", [m.carry(m.Reported(stats))]), 2.0)
    with pytest.raises(ProtocolError, match="unknown broker"):
        core.peer_message(
            "b1",
            m.Report("b1", [m.carry(m.Reported(m.Stats("ghost", "1", *[0] * 3, *[0] * 8)))]),
            2.0,
        )
    # an absurd interval and time to live are clamped
    core.peer_message("b1", m.WatchLease("b1", 1, 1, float("nan"), float("inf")), 2.0)
    lease = core.watching.leases["b1"]
    assert lease.interval >= MIN_INTERVAL and lease.expires == 2.0
    out = core.client_message(5, m.Watch(0.0), 2.0)
    assert core.watching.watchers[5] == MIN_INTERVAL and out
    for conn in range(100, 100 + MAX_WATCHERS):
        core.client_message(conn, m.Watch(1.0), 2.0)
    (refused,) = core.client_message(999, m.Watch(1.0), 2.0)
    assert refused == ToClient(999, m.Error(f"{MAX_WATCHERS} clients watch here already"))


def test_a_report_carried_under_another_name_or_undecodable_is_refused_where_it_is_opened():
    stats = m.Stats("b4", "1", 0, 0, [], 0, 0, 0, 0, 0, 0, 0, 0)
    forged = m.Carried("b3", m.carry(m.Reported(stats)).body)
    with pytest.raises(FrameError, match="carried as 'b3'"):
        m.opened(forged)
    with pytest.raises(FrameError, match="bad report"):
        m.opened(m.Carried("b3", msgspec.Raw(b"\xc1")))


def test_a_flooding_network_cannot_be_watched_through_a_broker():
    w = Watched(routing="flood")
    (out,) = w.sim.cores["b1"].client_message(1, m.Watch(1.0), 1.0)
    assert type(out.msg) is m.Error and "--poll" in out.msg.reason
    with pytest.raises(ProtocolError, match="floods"):
        w.sim.cores["b2"].peer_message("b1", m.WatchLease("b1", 1, 1, 1.0, 6.0), 1.0)
