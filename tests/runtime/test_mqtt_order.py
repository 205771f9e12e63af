"""One MQTT connection's PUBLISHes, SUBSCRIBEs and UNSUBSCRIBEs in a random order, over real
TCP, against a model that matches each publish at once against the filters held when it
was sent (ges.runtime's ordering of a client's requests: a change of subscriptions waits
until what the client published before is matched)."""

from __future__ import annotations

import random

import pytest
import trio

from ges.matching.topics import TopicTree
from ges.mqtt import packets as p
from ges.mqtt.frames import PacketReader
from ges.runtime import BrokerServer
from ges.runtime.up import wait_ready
from tests.conftest import topology_on_free_ports
from tests.runtime.test_mqtt_runtime import A_AND_D_MQTT, one_broker

TOPICS = ("o/a", "o/b", "o/c/d")
FILTERS = ("o/a", "o/b", "o/+", "o/#", "o/c/+")
END = "o/end"


def script(rng: random.Random, n: int) -> list:
    """``n`` packets: publishes (QoS 0 or 1, each its own payload), subscribes and
    unsubscribes of FILTERS."""
    ops: list = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.55:
            qos = rng.choice((0, 1))
            topic = rng.choice(TOPICS)
            ops.append(p.Publish(topic, f"m{i}".encode(), qos, packet_id=i + 1 if qos else 0))
        elif kind < 0.8:
            ops.append(p.Subscribe(i + 1, ((rng.choice(FILTERS), 1),)))
        else:
            ops.append(p.Unsubscribe(i + 1, (rng.choice(FILTERS),)))
    return ops


def expected(ops: list) -> tuple[list[bytes], set[bytes]]:
    """What must come back, in order, and what may: a publish that matches a filter held
    when it was sent may come; it must, unless every such filter is unsubscribed later
    (§3.10.4: the session stops delivering on a filter as it reads the UNSUBSCRIBE)."""
    held: set[str] = set()
    must, may = [], set()
    for i, op in enumerate(ops):
        if type(op) is p.Subscribe:
            held.add(op.filters[0][0])
        elif type(op) is p.Unsubscribe:
            held.discard(op.filters[0])
        elif type(op) is p.Publish:
            matching = [f for f in held if _matches(f, op.topic)]
            if not matching:
                continue
            may.add(op.payload)
            later = ops[i + 1 :]
            removed = {x.filters[0] for x in later if type(x) is p.Unsubscribe}
            if any(f not in removed for f in matching):
                must.append(op.payload)
    return must, may


def _matches(topic_filter: str, topic: str) -> bool:
    tree = TopicTree(remember=False)
    tree.add(topic_filter, 1)
    found: list = []
    tree.match(topic, found)
    return bool(found)


@pytest.mark.parametrize("seed", range(1, 9))
async def test_one_connection_s_publishes_and_subscriptions_keep_their_order(tmp_path, seed):
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        await check_order(spec, f"order{seed}", True, random.Random(seed))
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", range(1, 25))
async def test_a_persistent_session_s_order_holds_at_its_replicator_and_away_from_it(
    tmp_path, seed
):
    """The same for a persistent session (its subscriptions are a durable session's), at the
    replicator's own broker (a) and at one that follows it over a link (d)."""
    topology = topology_on_free_ports(A_AND_D_MQTT)
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp_path / bid).run)
        await wait_ready(topology, timeout=10)
        for at in ("a", "d"):
            rng = random.Random(f"{seed}{at}")
            await check_order(topology.brokers[at], f"kept{seed}{at}", False, rng)
        nursery.cancel_scope.cancel()


async def check_order(spec, client_id: str, clean: bool, rng: random.Random) -> None:
    """A 3.1.1 client sends 80 packets of :func:`script` in writes of 1 to 8; what comes back
    is what :func:`expected` says, in publish order (each QoS 1 delivery acknowledged)."""
    ops = script(rng, 80)
    must, may = expected(ops)
    stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
    await stream.send_all(p.encode(p.Connect(client_id, clean, 60)))
    at = 0
    while at < len(ops):  # in writes of 1 to 8 packets, some a moment apart
        n = rng.randint(1, 8)
        await stream.send_all(b"".join(p.encode(x) for x in ops[at : at + n]))
        at += n
        if rng.random() < 0.3:
            await trio.sleep(rng.choice((0, 0.001, 0.005)))
    marker = p.Publish(END, b"end", 1, packet_id=999)
    await stream.send_all(p.encode(p.Subscribe(998, ((END, 1),))) + p.encode(marker))
    reader, got = PacketReader(), []
    with trio.fail_after(15):
        while not any(type(x) is p.Publish and x.topic == END for x in got):
            data = await stream.receive_some(65536)
            assert data, f"closed after {got}"
            reader.feed(data)
            fresh = [p.decode(x) for x in reader.packets()]
            acks = [p.PubAck(x.packet_id) for x in fresh if type(x) is p.Publish and x.qos]
            if acks:
                await stream.send_all(b"".join(map(p.encode, acks)))
            got += fresh
    await stream.aclose()
    delivered = [x.payload for x in got if type(x) is p.Publish and x.topic != END]
    assert len(delivered) == len(set(delivered)), delivered  # each at most once
    assert set(delivered) <= may, sorted(set(delivered) - may)  # none it had no filter for
    assert [x for x in delivered if x in must] == must, (
        delivered,
        must,
    )  # every one it must, in order
    assert delivered == sorted(delivered, key=lambda x: int(x[1:]))  # in publish order
