"""MQTT clients of brokers in this process over real TCP (ges.runtime.mqtt): what a raw client
sends is what the network gets, whatever the order of the answers inside the broker."""

from __future__ import annotations

import trio

from ges.client import connect
from ges.matching.model import Constraint
from ges.mqtt import packets as p
from ges.mqtt.frames import PacketReader
from ges.runtime import BrokerServer
from ges.runtime.up import wait_ready
from tests.conftest import DIAMOND, receive, topology_on_free_ports

#: the diamond, broker a with an MQTT port; its one replicator (the default) is a
WITH_MQTT = {**DIAMOND, "brokers": {**DIAMOND["brokers"], "a": {**DIAMOND["brokers"]["a"], "mqtt_port": 1}}}  # fmt: skip


async def packets(stream, n: int, within: float = 10.0) -> list:
    reader, got = PacketReader(), []
    with trio.fail_after(within):
        while len(got) < n:
            data = await stream.receive_some(65536)
            assert data, f"closed after {got}"
            reader.feed(data)
            got += [p.decode(x) for x in reader.packets()]
    return got


async def test_publishes_sent_with_the_connect_are_published_when_the_answer_comes_at_once(
    tmp_path,
):
    """A clean session with a client id waits for the discard of its persistent session
    (§3.1.2.4) before its CONNACK. At the replicator's own broker that answer comes while the
    broker still handles the request, before the connection reads on: the PUBLISHes the
    client sent without waiting for the CONNACK (as paho does) must still go out."""
    topology = topology_on_free_ports(WITH_MQTT)
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp_path / bid).run)
        await wait_ready(topology, timeout=10)
        d = topology.brokers["d"]
        async with connect(d.host, d.port, topology=topology) as sub_client:
            sub = await sub_client.subscribe([Constraint("@topic", "topic", "t/#")])
            a = topology.brokers["a"]
            stream = await trio.open_tcp_stream(a.host, a.mqtt_port)
            hello = p.encode(p.Connect("early", keepalive=30))
            pubs = [p.Publish(f"t/{i}", str(i).encode(), 1, packet_id=i + 1) for i in range(5)]
            await stream.send_all(hello + b"".join(p.encode(x) for x in pubs))
            answers = await packets(stream, 6)
            assert answers[0] == p.ConnAck(p.ACCEPTED, False)
            assert sorted(x.packet_id for x in answers[1:]) == [1, 2, 3, 4, 5]
            got = await receive(sub, 5)
            assert [d.event.payload for d in got] == [str(i).encode() for i in range(5)]
            await stream.aclose()
        nursery.cancel_scope.cancel()
