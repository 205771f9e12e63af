"""``ges monitor`` watching through one broker, against real brokers over TCP: every broker's
report comes through it, what brokers log (a session's client roaming) reaches the event log,
the monitor moves to another broker when its own goes, and what the reports cannot say (a broker
cut off from the one watched through) is asked directly."""

from __future__ import annotations

import trio

from ges.client import DurableSession, connect
from ges.monitor.live import Monitor
from ges.runtime import BrokerServer
from ges.runtime.up import wait_ready
from ges.wire import messages as m
from tests.conftest import receive, topology_on_free_ports
from tests.runtime.test_sessions import EVERYTHING, REPLICATED, publish, start, stoppable_network


async def watching(monitor: Monitor, nursery) -> list:
    """Feed ``monitor`` in the background; the batches it took."""
    batches: list = []

    def take(batch) -> None:
        batches.append(batch)
        monitor.apply(batch)

    nursery.start_soon(monitor.feed, take)
    return batches


async def until(what: str, predicate, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while not predicate():
            await trio.sleep(0.05)


def log(monitor: Monitor) -> list[str]:
    return [e.text for e in monitor.model.log]


async def test_one_connection_brings_every_brokers_report_and_a_roam_is_logged(tmp_path):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        monitor = Monitor(topology, refresh=0.2, broker="b")
        await watching(monitor, nursery)
        every_twice = lambda: len(monitor.heard) == 4 and min(monitor.heard.values()) >= 2  # noqa: E731
        await until("every broker heard twice", every_twice)
        assert set(monitor.heard) == set(topology.brokers) and monitor.via == "b"
        assert monitor.model.health(monitor.model.root) == "ok"
        assert monitor.model.brokers["b"].stats.clients == 0  # the monitor is not counted

        # alice's client opens at d, leaves, misses 30 events and comes back at b
        s = DurableSession(topology, "alice", "d", EVERYTHING)
        async with s.running():
            await until("open at d", lambda: bool(s.moves))
            await until("d's client seen", lambda: monitor.model.brokers["d"].stats.clients == 1)
        await publish(topology, "a", 0, 30)
        again = DurableSession(topology, "alice", "b", None)
        async with again.running():
            await until("open at b", lambda: bool(again.moves))
        # the replicator (c, d's cluster's) logged it; its report carried the line to b
        said = "c: durable session alice: d -> b, 30 to replay"
        await until("the roam in the log", lambda: said in log(monitor))
        assert "c: durable session alice: opened at d, 0 to replay" in log(monitor)
        nursery.cancel_scope.cancel()


async def test_when_the_broker_watched_through_goes_the_monitor_moves_to_the_next(tmp_path):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        run, scopes, _ = await stoppable_network(nursery, topology, tmp_path, "bob")
        monitor = Monitor(topology, refresh=0.2)
        await watching(monitor, nursery)
        await until("watching through a", lambda: monitor.via == "a" and len(monitor.heard) == 4)
        scopes["a"].cancel()
        await until("through b", lambda: monitor.via == "b")
        assert any(t.startswith("lost a:") for t in log(monitor))
        # a is seen not to answer: asked directly once its reports stop
        await until("a down", lambda: not monitor.model.brokers["a"].answering)
        reached = lambda: "cannot reach broker" in (monitor.model.brokers["a"].error or "")  # noqa: E731
        await until("why a does not answer", reached)
        await nursery.start(run, "a")
        await until("a back", lambda: monitor.model.brokers["a"].answering, within=15)
        assert "a answers again" in log(monitor)
        nursery.cancel_scope.cancel()


async def test_a_broker_cut_off_from_the_one_watched_through_is_asked_directly(tmp_path):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        await stoppable_network(nursery, topology, tmp_path, "carol")
        for x, y in (("a", "c"), ("c", "a"), ("c", "d"), ("d", "c")):  # c alone
            spec = topology.brokers[x]
            async with connect(spec.host, spec.port, topology=topology) as client:
                await client.link(y, up=False)
        monitor = Monitor(topology, refresh=0.2, broker="a")
        await watching(monitor, nursery)
        await until("c asked directly", lambda: monitor.model.brokers["c"].answering, within=15)
        links = {(link.a, link.b): link.state for link in monitor.model.links()}
        assert links[("a", "c")] == links[("c", "d")] == "cut"
        assert monitor.model.health(monitor.model.units[("S",)]) == "split"
        nursery.cancel_scope.cancel()


async def test_reports_carry_delivery_latency_with_records_on_and_queue_and_repair_counters(
    tmp_path,
):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            server = BrokerServer(topology, bid, data_dir=tmp_path / bid, record_dir=tmp_path)
            await nursery.start(server.run)
        await wait_ready(topology, timeout=10)
        spec = topology.brokers["d"]
        async with connect(spec.host, spec.port, topology=topology) as client:
            sub = await client.subscribe([m.Constraint("n", "exists")])
            await publish(topology, "a", 0, 50)
            await receive(sub, 50)
            stats = await client.stats()
        assert 0 < stats.latency_p50_us <= stats.latency_p99_us < 5_000_000
        assert stats.queued_clients == stats.queued_links == 0
        assert stats.nacks_sent == stats.lost == 0
        spec = topology.brokers["a"]
        async with connect(spec.host, spec.port, topology=topology) as client:
            a = await client.stats()
        assert a.log_bytes > 0 and a.log_held + a.log_released == 50
        assert a.latency_p50_us == 0  # no client of a
        nursery.cancel_scope.cancel()
