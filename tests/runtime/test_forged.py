"""Pubends cannot be spoofed (issue 19, item 4), over real TLS sockets.

b0 is a broker of the network — it holds the network's certificate for b0 — that lies: linked
to b3, it sends events, silence and a nack answer of b1's pubend as if they came straight from
b1. b3 drops
them (counted, logged), so when b1 publishes its real event at that tick the subscriber at b3
gets the real one — the forged event does not shadow it as a duplicate.
"""

from __future__ import annotations

import logging

import pytest
import trio

from ges.client import connect
from ges.runtime.broker import BrokerServer
from ges.security.certs import CertDir, Identity
from ges.security.tls import context
from ges.topology import Topology
from ges.wire import encode
from ges.wire import messages as m
from ges.wire.messages import hello_for
from tests.conftest import on_free_ports, receive
from tests.runtime.test_limits import read_one

FORGE = {
    "name": "forge",
    "brokers": {
        "b0": {"unit": "A/c0", "port": 1},
        "b1": {"unit": "A/c1", "port": 2},
        "b2": {"unit": "A/c1", "port": 3},
        "b3": {"unit": "A/c2", "port": 4},
    },
    "links": [["b1", "b2"], ["b2", "b3"], ["b0", "b3"]],
}


@pytest.fixture
def forge(tmp_path) -> tuple[Topology, CertDir]:
    topology = Topology.from_dict(on_free_ports(FORGE), source="<test>")
    certs = CertDir(tmp_path / "certs")
    certs.init(topology.name, {b: () for b in topology.brokers})
    certs.add(Identity("client", "admin", ("operator",)))
    return topology, certs


async def linked(server: BrokerServer, peer: str) -> None:
    with trio.fail_after(10):
        while peer not in server.core.links_up:
            await trio.sleep(0.05)


async def test_a_forged_event_cannot_shadow_the_owners_real_tick(forge, caplog):
    topology, certs = forge
    caplog.set_level(logging.WARNING, logger="ges.broker.b3")
    admin = context(certs, Identity("client", "admin"), server=False)
    s1, s3 = topology.brokers["b1"], topology.brokers["b3"]
    async with trio.open_nursery() as nursery:
        servers = {}
        for bid in ("b1", "b2", "b3"):
            servers[bid] = BrokerServer(topology, bid, certs=certs)
            await nursery.start(servers[bid].run)
        # the real b0 runs until the network has settled, then stops; its impostor comes later
        b0_scope = trio.CancelScope()

        async def real_b0(task_status=trio.TASK_STATUS_IGNORED):
            with b0_scope:
                await BrokerServer(topology, "b0", certs=certs).run(task_status=task_status)

        await nursery.start(real_b0)
        await linked(servers["b3"], "b2")
        await linked(servers["b1"], "b2")
        await linked(servers["b3"], "b0")
        async with (
            connect(s3.host, s3.port, topology=topology, tls=admin) as sub_client,
            connect(s1.host, s1.port, topology=topology, tls=admin) as pub_client,
        ):
            sub = await sub_client.subscribe()
            # publish until the subscription is in place everywhere: the first delivered
            tick = None
            with trio.fail_after(20):
                while tick is None:
                    ack = await pub_client.publish([m.Event({"n": 0})])
                    with trio.move_on_after(0.5):
                        (got,) = await receive(sub, 1)
                        tick = got.tick
            assert tick == ack.last_tick
            pubend = ack.pubend
            b0_scope.cancel()
            with trio.fail_after(10):
                while "b0" in servers["b3"].core.links_up:
                    await trio.sleep(0.05)
            # b0, with its own certificate, links to b3 and lies about b1's pubend
            tcp = await trio.open_tcp_stream(s3.host, s3.port)
            b0 = trio.SSLStream(tcp, context(certs, Identity("broker", "b0"), server=False))
            await b0.send_all(encode(hello_for(topology, "broker", "b0")))
            assert type(await read_one(b0)) is m.Welcome
            await linked(servers["b3"], "b0")
            to_b3 = (m.Route(("A", "c2", "b3"), prev=tick),)
            forged = m.EventItem(tick + 1, tick, 1, m.Event({"n": 666}), to_b3, ("b1",))
            relayed = m.EventItem(tick + 1, tick, 2, m.Event({"n": 667}), to_b3, ("b1", "b0"))
            await b0.send_all(
                encode(m.Events(pubend, [forged]))
                + encode(m.Events(pubend, [relayed]))
                + encode(m.Silence(pubend, tick + 5, list(to_b3), hops=1))
                # an answer "from b1's log", one hop away — from b0
                + encode(m.Recovered(pubend, "b3", tick + 1, tick + 1, [forged], 1, by="b1"))
            )
            with trio.fail_after(10):
                while servers["b3"].core.stats().forged < 4:
                    await trio.sleep(0.05)
            # the owner's real event at that tick is delivered, once, and nothing forged
            real = await pub_client.publish([m.Event({"n": 1})])
            assert real.last_tick == tick + 1
            (got,) = await receive(sub, 1)
            assert (got.tick, got.event.attributes["n"]) == (tick + 1, 1)
            with trio.move_on_after(0.5):
                extra = await receive(sub, 1)
                raise AssertionError(f"delivered more: {extra}")
            assert (await sub_client.stats()).forged == 4
            await trio.aclose_forcefully(b0)
        lines = [r.getMessage() for r in caplog.records if "forged" in r.getMessage()]
        assert lines[0].startswith(f"dropped a forged Events of pubend {pubend} from b0: ")
        assert "its path ['b1'] does not end at b0, which sent it" in lines[0]
        assert len(lines) == 1  # the first from each peer, then every 1,000th
        nursery.cancel_scope.cancel()
