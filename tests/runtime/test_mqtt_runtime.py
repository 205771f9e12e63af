"""MQTT clients of brokers in this process over real TCP (ges.runtime.mqtt): what a raw client
sends is what the network gets, whatever the order of the answers inside the broker."""

from __future__ import annotations

import socket

import pytest
import trio

from ges.client import connect
from ges.matching.model import Constraint
from ges.mqtt import packets as p
from ges.mqtt import v5
from ges.mqtt.frames import PacketReader
from ges.runtime import BrokerServer, retained_asks
from ges.runtime.up import wait_ready
from ges.transport import connection
from ges.wire import encode
from ges.wire import messages as m
from tests.conftest import DIAMOND, free_ports, receive, topology_on_free_ports

#: the diamond, broker a with an MQTT port; its one replicator (the default) is a
WITH_MQTT = {**DIAMOND, "brokers": {**DIAMOND["brokers"], "a": {**DIAMOND["brokers"]["a"], "mqtt_port": 1}}}  # fmt: skip


async def packets(stream, n: int, within: float = 10.0, version: int = 4) -> list:
    reader, got = PacketReader(version=version), []
    with trio.fail_after(within):
        while len(got) < n:
            data = await stream.receive_some(65536)
            assert data, f"closed after {got}"
            reader.feed(data)
            got += [p.decode(x, version) for x in reader.packets()]
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


async def test_retained_messages_are_kept_when_only_the_command_line_names_an_mqtt_port(
    tmp_path,
):
    """``ges broker --mqtt-port`` serves MQTT at a broker whose topology entry names no port:
    the replicator (a, the diamond's default) is told of it by nobody, and must keep what is
    retained all the same, for a later subscriber to get with RETAIN set."""
    topology = topology_on_free_ports(DIAMOND)
    assert not any(spec.mqtt_port for spec in topology.brokers.values())
    (port,) = free_ports(1)
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            server = BrokerServer(
                topology, bid, data_dir=tmp_path / bid, mqtt_port=port if bid == "d" else None
            )
            await nursery.start(server.run)
        await wait_ready(topology, timeout=10)
        host = topology.brokers["d"].host
        publisher = await trio.open_tcp_stream(host, port)
        kept = p.Publish("config/d", b"on", 1, retain=True, packet_id=1)
        await publisher.send_all(p.encode(p.Connect("pub", keepalive=30)) + p.encode(kept))
        assert await packets(publisher, 2) == [p.ConnAck(p.ACCEPTED, False), p.PubAck(1)]
        with trio.fail_after(10):
            while True:  # until the retained event has reached the replicator at a
                later = await trio.open_tcp_stream(host, port)
                hello = p.encode(p.Connect("later", keepalive=30))
                await later.send_all(hello + p.encode(p.Subscribe(1, (("config/#", 1),))))
                got = await packets(later, 2)
                assert [type(x) for x in got] == [p.ConnAck, p.SubAck]
                with trio.move_on_after(0.5):
                    (retained,) = await packets(later, 1)
                    break
                await later.aclose()
        assert (retained.topic, retained.payload, retained.retain) == ("config/d", b"on", True)
        nursery.cancel_scope.cancel()


#: one broker with an MQTT port
ONE_MQTT = {"name": "one", "brokers": {"b1": {"unit": "S/c1", "port": 1, "mqtt_port": 1}}, "links": []}  # fmt: skip


async def one_broker(nursery, tmp_path, frame_deadline: float | None = None, **more):
    """The broker of ONE_MQTT (and ``more`` top-level settings), running; its spec."""
    topology = topology_on_free_ports({**ONE_MQTT, **more})
    server = BrokerServer(topology, "b1", data_dir=tmp_path / "b1")
    if frame_deadline is not None:
        server.frame_deadline = frame_deadline
    await nursery.start(server.run)
    return topology.brokers["b1"]


async def watching(spec, topic_filter: str):
    """A 3.1.1 client subscribed to ``topic_filter`` at QoS 0."""
    watcher = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
    hello = p.encode(p.Connect("watcher", keepalive=60))
    await watcher.send_all(hello + p.encode(p.Subscribe(1, ((topic_filter, 0),))))
    assert [type(x) for x in await packets(watcher, 2)] == [p.ConnAck, p.SubAck]
    return watcher


async def until_closed(stream, got: list, version: int = 5) -> list:
    """The packets the broker sends until it closes the connection, after ``got``."""
    reader = PacketReader(version=version)
    with trio.fail_after(10):
        while data := await stream.receive_some(65536):
            reader.feed(data)
            got += [p.decode(x, version) for x in reader.packets()]
    return got


#: the diamond, with MQTT ports at a (its one replicator's broker) and d (following it)
A_AND_D_MQTT = {
    **DIAMOND,
    "brokers": {
        **DIAMOND["brokers"],
        "a": {**DIAMOND["brokers"]["a"], "mqtt_port": 1},
        "d": {**DIAMOND["brokers"]["d"], "mqtt_port": 1},
    },
}


async def connect5(spec, client_id: str, clean: bool = False, will=None, props=()):
    """A 5.0 client connected at broker ``spec`` (its CONNACK a success); the stream and the
    CONNACK."""
    stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
    hello = p.Connect(client_id, clean, 60, will=will, props=props, level=5)
    await stream.send_all(p.encode(hello, 5))
    reader = PacketReader(version=5)
    with trio.fail_after(15):
        while not (got := [p.decode(x, 5) for x in reader.packets()]):
            reader.feed(await stream.receive_some(65536))
    assert type(got[0]) is p.ConnAck and got[0].code == p.SUCCESS, got
    return stream, got[0]


async def test_a_silent_client_is_closed_after_one_and_a_half_keepalives_and_its_will_goes(
    tmp_path,
):
    """§3.1.2.10: no packet for 1.5 × its keepalive and the server closes the connection (not
    before); the connection ended without DISCONNECT, so its will is published (§3.1.2.5).
    The deadline is the broker's watchdog's, as for its own clients' reads."""
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        watcher = await watching(spec, "w/#")
        sleepy = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        will = p.Will("w/sleepy", b"gone quiet")
        await sleepy.send_all(p.encode(p.Connect("sleepy", keepalive=1, will=will)))
        assert await packets(sleepy, 1) == [p.ConnAck(p.ACCEPTED, False)]
        quiet_since = trio.current_time()
        with trio.fail_after(10):
            assert await sleepy.receive_some(100) == b""  # closed by the broker
        assert trio.current_time() - quiet_since >= 1.5
        assert await packets(watcher, 1) == [p.Publish("w/sleepy", b"gone quiet")]
        nursery.cancel_scope.cancel()


async def test_a_keepalive_over_the_topologys_bound_is_held_to_it_or_refused(tmp_path):
    """``mqtt.max_keepalive``: a 5.0 client asking for more, or for none, is told the bound in
    its CONNACK (Server Keep Alive) and closed once silent for one and a half of it; a 3.1.1
    client, which cannot be told, is refused (identifier rejected); one within it is served."""
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path, mqtt={"max_keepalive": 1})
        for keepalive in (0, 120):
            stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
            await stream.send_all(p.encode(p.Connect(f"c{keepalive}", True, keepalive, level=5), 5))
            (ack,) = await packets(stream, 1, version=5)
            assert ack.code == p.SUCCESS and p.prop(ack.props, p.SERVER_KEEP_ALIVE) == 1
            quiet_since = trio.current_time()
            await until_closed(stream, [])
            assert trio.current_time() - quiet_since >= 1.5
        for keepalive, code in ((0, p.BAD_CLIENT_ID), (60, p.BAD_CLIENT_ID), (1, p.ACCEPTED)):
            stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
            await stream.send_all(p.encode(p.Connect(f"old{keepalive}", True, keepalive)))
            assert await packets(stream, 1) == [p.ConnAck(code, False)]
        nursery.cancel_scope.cancel()


async def test_a_packet_not_whole_within_the_frame_deadline_closes_its_connection(tmp_path):
    """A client that sends the start of a PUBLISH and then nothing holds no buffer for long:
    after the broker's frame deadline the packet counts as malformed, and a 5.0 client is
    told so (DISCONNECT 0x81, §4.13) before the connection closes."""
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path, frame_deadline=0.5)
        stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        hello = p.encode(p.Connect("halting", keepalive=60, level=p.LEVEL_5), 5)
        await stream.send_all(hello + b"\x30\x20\x00")  # a PUBLISH of 32 bytes: 1 of them sent
        got = await until_closed(stream, [])
        assert type(got[0]) is p.ConnAck and got[0].code == p.SUCCESS
        bye = got[1]
        assert type(bye) is p.Disconnect and bye.reason == 0x81, got
        assert "not complete 0.5s after it began" in p.prop(bye.props, p.REASON_STRING)
        nursery.cancel_scope.cancel()


async def test_a_client_over_the_receive_maximum_reads_why_though_it_went_on_sending(
    tmp_path, monkeypatch
):
    """One QoS 2 PUBLISH over the CONNACK's Receive Maximum: DISCONNECT 0x93 saying so
    (§4.9), and the client reads it though it went on sending after the broker closed —
    PUBRELs, as a client answering PUBRECs does. The broker reads and drops what comes after
    its last packet for a while before it closes its socket: closed with bytes unread, the
    connection would be reset and the client's reads and writes fail before the DISCONNECT."""
    monkeypatch.setattr(v5, "RECEIVE_MAX", 8)
    monkeypatch.setattr(connection, "LINGER_SECONDS", 5.0)  # (a margin for a slow machine)
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        stream, connack = await connect5(spec, "eager", clean=True)
        assert p.prop(connack.props, p.RECEIVE_MAXIMUM) == 8
        pubs = [p.Publish("t/eager", b"x", 2, packet_id=i) for i in range(1, 10)]
        await stream.send_all(b"".join(p.encode(x, 5) for x in pubs))
        await trio.sleep(0.2)  # the broker has answered and closed by now
        for _ in range(3):
            await stream.send_all(b"".join(p.encode(p.PubRel(i), 5) for i in range(1, 9)))
            await trio.sleep(0.05)
        got = await until_closed(stream, [])
        bye = got[-1]
        assert type(bye) is p.Disconnect and bye.reason == p.RECEIVE_MAXIMUM_EXCEEDED, got
        assert "Receive Maximum" in p.prop(bye.props, p.REASON_STRING)
        nursery.cancel_scope.cancel()


async def test_a_refused_client_that_went_on_sending_reads_its_connack(tmp_path, monkeypatch):
    """A CONNECT the broker refuses, followed at once by packets (a client may send them
    before the CONNACK), and more sent after the broker closed: the client reads the CONNACK
    that says why (0x8C here), not a reset connection."""
    monkeypatch.setattr(connection, "LINGER_SECONDS", 5.0)
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        hello = p.Connect("auth", True, 60, props=((p.AUTH_METHOD, "SCRAM"),), level=5)
        pubs = b"".join(
            p.encode(p.Publish("t/auth", b"x" * 100, 1, packet_id=i), 5) for i in range(1, 200)
        )
        await stream.send_all(p.encode(hello, 5) + pubs)
        await trio.sleep(0.2)  # refused and closed by now
        for _ in range(3):
            await stream.send_all(pubs)
            await trio.sleep(0.05)
        got = await until_closed(stream, [])
        assert [(type(x), x.code) for x in got] == [(p.ConnAck, p.BAD_AUTH_METHOD)]
        nursery.cancel_scope.cancel()


async def test_what_a_client_published_before_it_subscribed_does_not_match_that_subscription(
    tmp_path,
):
    """One connection's packets are handled in the order it sent them: PUBLISHes (each QoS)
    and then a SUBSCRIBE to their topic in one write get no delivery of those messages —
    the broker matches a publish once its log has it, so the SUBSCRIBE waits until they are
    matched — while a PUBLISH after the SUBSCRIBE is delivered; a persistent session's
    filters (its durable session's subscriptions) the same."""
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        for level, clean in ((p.LEVEL_311, True), (p.LEVEL_5, True), (p.LEVEL_311, False)):
            stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
            topic = f"order/{level}/{clean}"
            hello = p.Connect(f"order{level}{clean}", clean, 60, level=level)
            await stream.send_all(p.encode(hello, level))
            before = [p.Publish(topic, b"before", q, packet_id=q) for q in (0, 1, 2)]
            after = p.Publish(topic, b"after", 1, packet_id=9)
            sub = p.Subscribe(5, ((topic, 1),))
            other = p.Subscribe(4, ((f"{topic}/other", 0),))  # (a change of the same read)
            sent = (other, *before, sub, after)
            await stream.send_all(b"".join(p.encode(x, level) for x in sent))
            reader, got = PacketReader(version=level), []
            with trio.fail_after(10):  # CONNACK, 2 SUBACKs, PUBACK, PUBREC, PUBACK, a delivery
                while len(got) < 7:
                    reader.feed(await stream.receive_some(65536))
                    got += [p.decode(x, level) for x in reader.packets()]
            with trio.move_on_after(0.3):  # (and nothing more comes)
                while data := await stream.receive_some(65536):
                    reader.feed(data)
                    got += [p.decode(x, level) for x in reader.packets()]
            delivered = [x.payload for x in got if type(x) is p.Publish]
            assert delivered == [b"after"], got
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_persistent_publisher_without_filters_keeps_its_qos2_identifiers_across_reconnects(
    tmp_path,
):
    """§4.3.3: a QoS 2 message goes once until its PUBREL, also when the client sends it again
    on a new connection of its persistent session — one that never subscribed to anything
    (a publisher only) included: its session is a durable session like any other."""
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        watcher = await watching(spec, "q2/#")
        once = p.Publish("q2/x", b"once", 2, packet_id=7)
        hello = p.encode(p.Connect("pub-only", clean_session=False, keepalive=60))
        first = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await first.send_all(hello + p.encode(once))
        assert await packets(first, 2) == [p.ConnAck(p.ACCEPTED, False), p.PubRec(7)]
        await first.aclose()  # gone before its PUBREL: the PUBLISH may come again, with DUP
        again = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        dup = p.Publish("q2/x", b"once", 2, dup=True, packet_id=7)
        await again.send_all(hello + p.encode(dup))
        assert await packets(again, 2) == [p.ConnAck(p.ACCEPTED, True), p.PubRec(7)]
        await again.send_all(p.encode(p.PubRel(7)) + p.encode(p.Publish("q2/end", b"end")))
        assert await packets(again, 1) == [p.PubComp(7)]
        got = await packets(watcher, 2)
        assert [(x.topic, x.payload) for x in got] == [("q2/x", b"once"), ("q2/end", b"end")]
        nursery.cancel_scope.cancel()


async def test_a_will_whose_properties_cannot_be_an_event_is_refused_at_connect(tmp_path):
    """A 5.0 will's properties become its event's when it goes, long after the CONNECT: one
    that could not (a response topic with a wildcard) is refused then, and the broker serves
    on."""
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        will = p.Will("w", b"bye", props=((p.RESPONSE_TOPIC, "r/+"),))
        bad = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await bad.send_all(p.encode(p.Connect("bad-will", keepalive=60, will=will, level=5), 5))
        got = await until_closed(bad, [])
        assert [(type(x), x.code) for x in got] == [(p.ConnAck, p.PROTOCOL_ERROR)]
        ok = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await ok.send_all(p.encode(p.Connect("fine", keepalive=60)))
        assert await packets(ok, 1) == [p.ConnAck(p.ACCEPTED, False)]
        nursery.cancel_scope.cancel()


async def test_a_steady_stream_whose_reads_end_mid_packet_is_not_cut_by_the_frame_deadline(
    tmp_path,
):
    """The frame deadline is for one packet: a client whose every read ends inside a packet,
    but which completes one after another, is not cut (the watchdog counts whole packets)."""
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path, frame_deadline=0.5)
        stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await stream.send_all(p.encode(p.Connect("steady", keepalive=60)))
        assert await packets(stream, 1) == [p.ConnAck(p.ACCEPTED, False)]
        packet = len(p.encode(p.Publish("s/x", b"00")))
        wire = b"".join(p.encode(p.Publish("s/x", b"%02d" % i)) for i in range(12))
        cuts = [0] + [k * packet + packet // 2 for k in range(12)] + [len(wire)]
        for start, end in zip(cuts, cuts[1:], strict=False):  # each read ends mid-packet
            await stream.send_all(wire[start:end])
            await trio.sleep(0.25)  # 3 s in all, six times the deadline
        await stream.send_all(p.encode(p.PingReq()))
        assert await packets(stream, 1) == [p.PingResp()]  # still connected
        nursery.cancel_scope.cancel()


async def test_a_disconnects_session_expiry_reaches_the_replicator_near_or_far(tmp_path):
    """§3.14.2.2.2 over the wire, at the replicator's own broker (a) and at one that follows
    it (d): a DISCONNECT's Session Expiry Interval is the session's from then on — 1 s, and the
    session is gone when its client is back 3 s later; 0, and it is gone at once — while one
    that says nothing leaves the CONNECT's 600 s."""
    topology = topology_on_free_ports(A_AND_D_MQTT)
    kept = ((p.SESSION_EXPIRY, 600),)

    async def visit(at: str, client_id: str, bye_props: tuple) -> bool:
        """Connect (persistent, 600 s), say whether the session was there, and leave with a
        DISCONNECT carrying ``bye_props``."""
        stream, ack = await connect5(topology.brokers[at], client_id, props=kept)
        await stream.send_all(p.encode(p.Disconnect(p.SUCCESS, bye_props), 5))
        assert await until_closed(stream, []) == []
        return ack.session_present

    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp_path / bid).run)
        await wait_ready(topology, timeout=10)
        for at in ("a", "d"):
            for cid, bye in (("short", ((p.SESSION_EXPIRY, 1),)), ("long", ()), ("ended", ((p.SESSION_EXPIRY, 0),))):  # fmt: skip
                assert not await visit(at, f"{cid}-{at}", bye)
        assert not await visit("a", "ended-a", ())  # gone at once
        assert not await visit("d", "ended-d", ())
        await trio.sleep(3)
        assert [await visit(at, f"{cid}-{at}", ()) for at in "ad" for cid in ("short", "long")] == [
            False,
            True,
            False,
            True,
        ]
        nursery.cancel_scope.cancel()


async def test_a_wills_delay_is_kept_by_the_replicator_and_a_return_anywhere_cancels_it(tmp_path):
    """§3.1.3.2.2 over the wire: a persistent 5.0 session's will with a Will Delay Interval of
    2 s, its connection cut. "van" (at a, the replicator's broker) stays away: its will comes
    2 s later, not before. "car" (at d, following the replicator) is back within a second at
    the other broker: its will never comes. A clean session's goes at once."""
    topology = topology_on_free_ports(A_AND_D_MQTT)

    def will_of(name: str) -> p.Will:
        return p.Will(f"w/{name}", name.encode(), props=((p.WILL_DELAY, 2),))

    lasting = ((p.SESSION_EXPIRY, 600),)
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp_path / bid).run)
        await wait_ready(topology, timeout=10)
        watcher = await watching(topology.brokers["a"], "w/#")
        at = topology.brokers
        van, _ = await connect5(at["a"], "van", False, will_of("van"), lasting)
        car, _ = await connect5(at["d"], "car", False, will_of("car"), lasting)
        bike, _ = await connect5(at["d"], "bike", False, will_of("bike"))  # clean: no delay
        for stream in (van, car, bike):
            await stream.aclose()  # cut: no DISCONNECT
        left = trio.current_time()
        assert await packets(watcher, 1) == [p.Publish("w/bike", b"bike")]
        await trio.sleep(0.5)
        back, _ = await connect5(at["a"], "car", props=lasting)  # the other broker, in time
        got = await packets(watcher, 1, within=10)
        assert got == [p.Publish("w/van", b"van")] and trio.current_time() - left >= 2
        with trio.move_on_after(3):  # car's would have come by now
            more = await packets(watcher, 1)
            raise AssertionError(f"a will after its client came back: {more}")
        await back.aclose()
        nursery.cancel_scope.cancel()


async def test_a_takeover_keeps_a_delayed_will_back_unless_it_ends_the_session(tmp_path):
    """A takeover with Clean Start 0 is the client back within its Will Delay Interval: the will
    never goes, whichever brokers the old and new connections are at. With Clean Start 1 the
    session ends, and the will goes at once — also when the new connection asks for a
    persistent session of the same name (Session Expiry over 0)."""
    topology = topology_on_free_ports(A_AND_D_MQTT)
    lasting = ((p.SESSION_EXPIRY, 600),)

    # (client id, where the old connection is, where the new one is, Clean Start)
    cases = [("x1", "d", "a", False), ("x2", "a", "a", False), ("x3", "a", "d", True), ("x4", "d", "d", True), ("x5", "a", "a", "lasting"), ("x6", "d", "a", "lasting")]  # fmt: skip
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp_path / bid).run)
        await wait_ready(topology, timeout=10)
        watcher = await watching(topology.brokers["a"], "w/#")
        kept = []
        for cid, old_at, new_at, clean in cases:
            will = p.Will(f"w/{cid}", cid.encode(), props=((p.WILL_DELAY, 1),))
            at = topology.brokers
            kept.append(await connect5(at[old_at], cid, False, will, lasting))  # until taken over
            props = () if clean is True else lasting
            kept.append(await connect5(at[new_at], cid, bool(clean), props=props))
        got = await packets(watcher, 4, within=5)
        assert sorted(x.topic for x in got) == ["w/x3", "w/x4", "w/x5", "w/x6"]
        with trio.move_on_after(2.5):  # x1's and x2's would have come by now
            more = await packets(watcher, 1)
            raise AssertionError(f"a will after its client came back: {more}")
        nursery.cancel_scope.cancel()


#: Linux's TCP_REPAIR: a socket closed in repair mode goes without a FIN or a reset
TCP_REPAIR = 19


async def test_a_client_whose_host_vanished_is_closed_by_tcp_keepalive_though_it_asked_for_none(
    tmp_path,
):
    """A client with keepalive 0 (no MQTT keepalive: §3.1.2.10) whose host vanishes without a
    word — powered off, or behind a NAT that forgot it — is found gone by the kernel's keepalive
    probes on every accepted connection, and its will goes; before, it held its slot until a
    write to it failed, which for a subscriber to nothing is never."""
    async with trio.open_nursery() as nursery:
        topology = topology_on_free_ports(ONE_MQTT)
        server = BrokerServer(topology, "b1", data_dir=tmp_path / "b1")
        server.tcp_keepalive = (1, 1, 2)  # silent 1 s, then 2 probes a second apart
        await nursery.start(server.run)
        spec = topology.brokers["b1"]
        watcher = await watching(spec, "w/#")
        gone = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        will = p.Will("w/gone", b"vanished")
        await gone.send_all(p.encode(p.Connect("gone", keepalive=0, will=will)))
        assert await packets(gone, 1) == [p.ConnAck(p.ACCEPTED, False)]
        try:
            gone.socket.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
        except PermissionError:
            pytest.skip("vanishing without a FIN needs CAP_NET_ADMIN (TCP_REPAIR)")
        gone.socket.close()  # nothing reaches the broker: only its probes find it gone
        started = trio.current_time()
        assert await packets(watcher, 1) == [p.Publish("w/gone", b"vanished")]
        assert 1 <= trio.current_time() - started < 8
        assert "gone" not in server.mqtt.connected
        nursery.cancel_scope.cancel()


async def publish_retained(spec, n: int) -> None:
    """``n`` retained QoS 1 messages on ``r/0`` … (payload the number), each acknowledged."""
    publisher = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
    kept = b"".join(
        p.encode(p.Publish(f"r/{i}", b"%d" % i, 1, retain=True, packet_id=i + 1)) for i in range(n)
    )
    await publisher.send_all(p.encode(p.Connect("pub", keepalive=30)) + kept)
    assert len(await packets(publisher, n + 1)) == n + 1  # the CONNACK, a PUBACK each
    await publisher.aclose()


async def test_the_heap_is_frozen_as_retained_messages_are_kept(tmp_path, monkeypatch):
    """Retained messages live as long as their topics' messages stand: the broker takes them
    out of the garbage collector's full passes (freeze_heap) every FREEZE_KEPT kept, as it
    does a large profile's objects (with 100,000 retained topics a full pass took 47 ms)."""
    from ges.runtime import broker as runtime_broker

    frozen = []
    monkeypatch.setattr(runtime_broker, "FREEZE_KEPT", 100)
    monkeypatch.setattr(runtime_broker, "freeze_heap", lambda: frozen.append(1))
    n = 350
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        before = len(frozen)  # (a subscription's job may freeze too: not this test's)
        await publish_retained(spec, n)
        with trio.fail_after(10):
            while len(frozen) - before < 3:  # once the replicator has kept them
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        # one every 100 kept (and one a job of the standing subscription may have made)
        assert n // 100 <= len(frozen) - before <= n // 100 + 1
        nursery.cancel_scope.cancel()


async def test_thousands_retained_on_a_subscribe_all_arrive_sent_a_step_a_turn(tmp_path):
    """A SUBSCRIBE whose filter has 1,000 retained messages: the answer's PUBLISHes go a step
    a turn of the loop (ges.mqtt.filtering's RETAINED_STEP), every one of them once, with
    RETAIN set."""
    n = 1000
    async with trio.open_nursery() as nursery:
        spec = await one_broker(nursery, tmp_path)
        await publish_retained(spec, n)
        with trio.fail_after(20):
            while True:  # until every one has reached the replicator
                later = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
                hello = p.encode(p.Connect("later", keepalive=30))
                await later.send_all(hello + p.encode(p.Subscribe(1, (("r/#", 0),))))
                reader, got = PacketReader(), []
                with trio.move_on_after(1):
                    while len(got) < n + 2:
                        reader.feed(await later.receive_some(65536))
                        got += [p.decode(x) for x in reader.packets()]
                await later.aclose()
                if len(got) == n + 2 and all(x.retain for x in got[2:]):
                    break  # (else some came live: the hand-on of the burst was not done)
        assert [type(x) for x in got[:2]] == [p.ConnAck, p.SubAck]
        assert sorted((x.payload, x.retain) for x in got[2:]) == sorted(
            (b"%d" % i, True) for i in range(n)
        )
        nursery.cancel_scope.cancel()


async def test_asks_of_what_is_retained_from_a_following_broker_all_get_their_answer(
    tmp_path, monkeypatch, caplog
):
    """A follow connection carries the asks of every MQTT client of its broker, and the
    replicator lets one connection have only so many bytes of asks waiting
    (MAX_WAITING_BYTES, made small here: one ask's worth): six clients at d subscribing at
    once each get every retained message — d sends the asks in turn, one answered before the
    next, instead of some being refused and their SUBSCRIBEs getting nothing retained. 3,000
    topics: each walk takes more than one slice of the replicator's work, so asks wait."""
    import ges.core.retaining as retaining

    monkeypatch.setattr(retaining, "MAX_WAITING_BYTES", 300)
    monkeypatch.setattr(retained_asks, "MAX_WAITING_BYTES", 300)
    topology = topology_on_free_ports(A_AND_D_MQTT)
    filters = (("r/#", 0), ("x/" + "y" * 200, 0))  # 269 bytes as an ask
    async with trio.open_nursery() as nursery:
        for bid in topology.brokers:
            await nursery.start(BrokerServer(topology, bid, data_dir=tmp_path / bid).run)
        await wait_ready(topology, timeout=10)
        n = 3000
        spec = await retained_kept(topology, filters, n)
        await six_subscribe_at_once(spec, filters, n)
        # a client of d's own protocol asks twice at once: the second waits its turn no more
        # than an MQTT client's would (one ask at a time a client), it is refused
        from tests.runtime.test_limits import raw, read_one

        ges_client, _ = await raw(spec, topology, "asker")
        await ges_client.send_all(
            encode(m.RetainedAsk(["r/#"], req=1)) + encode(m.RetainedAsk(["r/#"], req=2))
        )
        answers = {}
        with trio.fail_after(10):
            while len(answers) < 2:
                got = await read_one(ges_client)
                answers[got.req] = got
        assert type(answers[1]) is m.Retained and len(answers[1].events) == n
        assert type(answers[2]) is m.Error and "one ask at a time" in answers[2].reason
        # (an MQTT client cannot be told: the broker logs it)
        assert any(
            "client asker: nothing retained sent for its SUBSCRIBE: retained messages: one ask"
            in r.getMessage()
            for r in caplog.records
        )
        nursery.cancel_scope.cancel()


async def test_an_ask_the_replicator_refused_for_now_is_asked_again(tmp_path, monkeypatch, caplog):
    """The replicator bounds the asks of what is retained waiting from all connections
    together (MAX_ALL_WAITING_BYTES: many brokers' clients subscribing at once, as after a
    restart), and refuses one past it for now (``Error.retry``): the following broker asks it
    again a little later, in the order asked, and every client's SUBSCRIBE gets everything
    retained — the bound made one ask's worth here (and taken for a while at first), and d
    let send three at once. Before, such a refusal was final:
    those SUBSCRIBEs got nothing retained (and the log said so)."""
    import ges.runtime.sessions as sessions

    filters = small_ask_bounds(monkeypatch, again_after=0.05)
    topology = topology_on_free_ports(A_AND_D_MQTT)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        n = 2000
        spec = await retained_kept(topology, filters, n)
        asked_again = []
        ask_again = sessions.SessionDesk._ask_again

        def counted(desk, follow, req, *rest):
            asked_again.append(req)
            return ask_again(desk, follow, req, *rest)

        answered = []
        from_replicator = sessions.SessionDesk._from_replicator

        def seen(desk, follow, msg):
            if type(msg) is m.Retained:
                answered.append(msg.req)
            return from_replicator(desk, follow, msg)

        monkeypatch.setattr(sessions.SessionDesk, "_ask_again", counted)
        monkeypatch.setattr(sessions.SessionDesk, "_from_replicator", seen)
        replicator = servers["a"].core.replicator
        replicator._asks_bytes = 300  # no room at first: the asks d sent are all refused

        async def room_later():
            await trio.sleep(0.3)
            replicator._asks_bytes = 0

        nursery.start_soon(room_later)
        await six_subscribe_at_once(spec, filters, n)
        assert len(set(asked_again)) >= 3  # those d had sent at once, refused for now
        assert answered == sorted(answered)  # and then asked again in the order asked
        refused = [r for r in caplog.records if "nothing retained sent" in r.getMessage()]
        assert not refused, refused[0].getMessage()
        follows = servers["d"].sessions._follows.values()
        assert not any(f.asking or f.sent or f.waiting or f.refused_since for f in follows)
        nursery.cancel_scope.cancel()


async def test_asks_of_what_is_retained_keep_their_books_as_clients_come_and_go(
    tmp_path, monkeypatch
):
    """Clients at d (following the replicator at a) subscribe at once and some go at random
    moments — while their asks wait at d, are in flight, or were refused for now — with the
    replicator's bounds small: d's books of asks agree with themselves after every step (the
    bytes sent and held back are those of the asks listed, every ask listed has its client's
    entry, those held back are in the order asked), a client that stays gets everything
    retained, and once everyone has gone d holds nothing for anyone."""
    import random

    filters = small_ask_bounds(monkeypatch, again_after=0.02)
    topology = topology_on_free_ports(A_AND_D_MQTT)
    rng = random.Random(23)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        n = 1500
        spec = await retained_kept(topology, filters, n)
        follows = servers["d"].sessions._follows.values()

        def check() -> None:
            for f in follows:
                assert f.ask_bytes == sum(size for _, size in f.sent.values())
                assert f.waiting_bytes == sum(size for _, _, size in f.waiting)
                assert all(f.asks.get(req) is entry for req, entry in f.asking.items())
                assert set(f.refused_since) <= set(f.asking)
                assert not set(f.sent) & {req for req, _, _ in f.waiting}
                reqs = [req for req, _, _ in f.waiting]  # in the order asked, refused or not
                assert reqs == sorted(reqs)

        for round_ in range(8):
            streams = await subscribing_at_once(spec, filters, [f"c{round_}-{i}" for i in range(8)])
            staying = []
            for stream in streams:
                await trio.sleep(rng.random() * 0.01)
                if rng.random() < 0.5:
                    await stream.aclose()  # gone, its ask wherever it was
                else:
                    staying.append(stream)
                check()
            for stream in staying:
                got = await packets(stream, 1 + n)
                assert sorted(x.payload for x in got[1:]) == sorted(b"%d" % i for i in range(n))
                await stream.aclose()
                check()
        with trio.fail_after(10):
            while any(
                f.asking or f.sent or f.waiting or f.refused_since or f.pausing for f in follows
            ):
                await trio.sleep(0.02)
        check()
        assert all(f.ask_bytes == 0 and f.waiting_bytes == 0 for f in follows)
        nursery.cancel_scope.cancel()


def small_ask_bounds(monkeypatch, again_after: float) -> tuple:
    """The replicator's bounds on retained asks waiting made small — one ask's worth from
    everyone, three from one connection (a following broker sends three at once) — and
    asks refused for now asked again after ``again_after``; the filters of such an ask."""
    import ges.core.retaining as retaining

    monkeypatch.setattr(retaining, "MAX_ALL_WAITING_BYTES", 300)
    monkeypatch.setattr(retaining, "MAX_WAITING_BYTES", 1000)
    monkeypatch.setattr(retained_asks, "MAX_WAITING_BYTES", 1000)
    monkeypatch.setattr(retained_asks, "ASK_AGAIN_AFTER", again_after)
    return (("r/#", 0), ("x/" + "y" * 200, 0))  # 269 bytes as an ask


async def start(nursery, topology, tmp_path) -> dict[str, BrokerServer]:
    """Every broker of ``topology``, each with its data directory under ``tmp_path``, once
    all are ready."""
    servers = {}
    for bid in topology.brokers:
        servers[bid] = BrokerServer(topology, bid, data_dir=tmp_path / bid)
        await nursery.start(servers[bid].run)
    await wait_ready(topology, timeout=10)
    return servers


async def retained_kept(topology, filters, n: int):
    """``n`` retained messages published at a, once d's clients get them all (asked alone);
    d's spec."""
    await publish_retained(topology.brokers["a"], n)
    spec = topology.brokers["d"]
    with trio.fail_after(20):
        while len(await retained_at(spec, "probe", filters, n)) < n:
            await trio.sleep(0.05)
    return spec


async def subscribing_at_once(spec, filters, client_ids: list[str]) -> list:
    """A client at ``spec`` for each id, connected, then all subscribing to ``filters`` at
    once; their streams, each with its SUBACK and what follows still to read."""
    clients = []
    for client_id in client_ids:
        stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await stream.send_all(p.encode(p.Connect(client_id, keepalive=30)))
        assert [type(x) for x in await packets(stream, 1)] == [p.ConnAck]
        clients.append(stream)
    for stream in clients:
        await stream.send_all(p.encode(p.Subscribe(1, filters)))
    return clients


async def six_subscribe_at_once(spec, filters, n: int) -> None:
    """Six clients subscribe to ``filters`` at ``spec`` at once: each gets the ``n``
    retained messages of :func:`publish_retained`."""
    clients = await subscribing_at_once(spec, filters, [f"c{i}" for i in range(6)])
    for stream in clients:
        got = await packets(stream, 1 + n)
        assert type(got[0]) is p.SubAck
        assert sorted(x.payload for x in got[1:]) == sorted(b"%d" % i for i in range(n))


async def retained_at(spec, client_id: str, filters, n: int) -> list:
    """The retained PUBLISHes a new client subscribing to ``filters`` gets: ``n``, or what
    came within 3 s."""
    stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
    await stream.send_all(
        p.encode(p.Connect(client_id, keepalive=30)) + p.encode(p.Subscribe(1, filters))
    )
    reader, got = PacketReader(), []
    with trio.move_on_after(3):
        while sum(type(x) is p.Publish for x in got) < n:
            data = await stream.receive_some(65536)
            if not data:
                break
            reader.feed(data)
            got += [p.decode(x) for x in reader.packets()]
    await stream.aclose()
    return [x for x in got if type(x) is p.Publish]


async def test_a_refused_ask_of_what_is_retained_is_logged_at_the_subscriber_s_broker(
    tmp_path, monkeypatch, caplog
):
    """MQTT cannot tell a client that its SUBSCRIBE got nothing retained: the broker it is
    at (d, following the replicator at a) asks again what the replicator refused for now
    (its bound on everyone's asks taken, here by hand), for ASK_AGAIN_FOR, then logs the
    refusal, and leaves no ask of it in progress: its next, once there is room, is answered."""
    import ges.core.retaining as retaining

    monkeypatch.setattr(retaining, "MAX_ALL_WAITING_BYTES", 1000)
    monkeypatch.setattr(retained_asks, "ASK_AGAIN_AFTER", 0.05)
    monkeypatch.setattr(retained_asks, "ASK_AGAIN_FOR", 0.3)
    topology = topology_on_free_ports(A_AND_D_MQTT)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        await publish_retained(topology.brokers["a"], 3)
        replicator = servers["a"].core.replicator
        replicator._asks_bytes = 1000  # everyone's asks: no room for now
        spec = topology.brokers["d"]
        stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await stream.send_all(p.encode(p.Connect("sub", keepalive=30)))
        assert [type(x) for x in await packets(stream, 1)] == [p.ConnAck]

        def refusals() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if "client sub: nothing retained sent" in r.getMessage()
            ]

        await stream.send_all(p.encode(p.Subscribe(1, (("r/#", 0),))))
        assert [type(x) for x in await packets(stream, 1)] == [p.SubAck]
        with trio.fail_after(5):
            while not refusals():
                await trio.sleep(0.02)
        assert "too many asks waiting" in refusals()[0], refusals()
        assert "(refused for 0.3s)" in refusals()[0], refusals()
        follows = servers["d"].sessions._follows.values()
        assert not any(f.asking or f.sent or f.waiting or f.refused_since for f in follows)
        replicator._asks_bytes = 0
        await stream.send_all(p.encode(p.Subscribe(2, (("r/+", 0),))))
        got = await packets(stream, 4)
        assert [type(x) for x in got] == [p.SubAck] + [p.Publish] * 3
        assert len(refusals()) == 1, refusals()
        nursery.cancel_scope.cancel()


async def test_while_refusals_last_a_following_broker_asks_one_at_a_time_after_a_pause(
    tmp_path, monkeypatch
):
    """Asked again, the asks the replicator refused for now go one at a time while refusals
    last, and not before ASK_AGAIN_AFTER has passed (each round resent up to 4 MiB of asks,
    and a refusal asked again at once makes a loop between the brokers)."""
    import ges.runtime.sessions as sessions

    after = 0.2
    filters = small_ask_bounds(monkeypatch, again_after=after)
    topology = topology_on_free_ports(A_AND_D_MQTT)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        n = 200
        spec = await retained_kept(topology, filters, n)
        sends, refusals = [], []
        send, from_replicator = sessions.SessionDesk._send, sessions.SessionDesk._from_replicator

        def sending(desk, follow, msg):
            if type(msg) is m.RetainedAsk:
                sends.append((trio.current_time(), len(follow.sent), bool(follow.refused_since)))
            return send(desk, follow, msg)

        def answered(desk, follow, msg):
            if type(msg) is m.Error and msg.retry:
                refusals.append(trio.current_time())
            return from_replicator(desk, follow, msg)

        monkeypatch.setattr(sessions.SessionDesk, "_send", sending)
        monkeypatch.setattr(sessions.SessionDesk, "_from_replicator", answered)
        replicator = servers["a"].core.replicator
        replicator._asks_bytes = 300  # no room for a while

        async def room_later():
            await trio.sleep(1.0)
            replicator._asks_bytes = 0

        nursery.start_soon(room_later)
        await six_subscribe_at_once(spec, filters, n)
        assert refusals
        assert all(in_flight == 1 for _, in_flight, refused in sends if refused), sends
        later = [at for at, _, _ in sends if at > refusals[0]]
        assert later and later[0] - refusals[0] >= after * 0.9, later[0] - refusals[0]
        nursery.cancel_scope.cancel()


async def test_an_ask_whose_client_went_while_its_broker_opened_the_follow_is_not_asked(
    tmp_path, monkeypatch
):
    """A client's ask waits while its broker opens its follow connection to the replicator
    (up to FOLLOW_CONNECT_WAIT, as after a restart); a client gone meanwhile leaves no ask
    in d's books — one left there was asked again for ASK_AGAIN_FOR while the replicator
    refused for now, ahead of the asks of clients still there."""
    import ges.runtime.sessions as sessions

    monkeypatch.setattr(retained_asks, "ASK_AGAIN_AFTER", 0.05)
    topology = topology_on_free_ports(A_AND_D_MQTT)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        await publish_retained(topology.brokers["a"], 3)
        spec = topology.brokers["d"]
        follow_, slow = sessions.SessionDesk._follow, []

        async def follow(desk, rep):  # a follow connection being opened takes a while
            if slow:
                await trio.sleep(0.3)
            return await follow_(desk, rep)

        monkeypatch.setattr(sessions.SessionDesk, "_follow", follow)
        stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await stream.send_all(p.encode(p.Connect("sub", keepalive=30)))
        await packets(stream, 1)
        await stream.send_all(  # the second ask goes once the first is answered
            p.encode(p.Subscribe(1, (("r/#", 0),))) + p.encode(p.Subscribe(2, (("r/+", 0),)))
        )
        await packets(stream, 2)
        slow.append(1)
        await trio.sleep(0.05)
        await stream.aclose()
        servers["a"].core.replicator._asks_bytes = 1 << 30  # refused for now from here on
        await trio.sleep(1.0)
        (f,) = servers["d"].sessions._follows.values()
        assert not f.asking, f.asking
        nursery.cancel_scope.cancel()


async def test_an_mqtt_client_at_the_replicator_s_own_broker_is_asked_for_again(
    tmp_path, monkeypatch, caplog
):
    """An MQTT client of the replicator's own broker (a), its ask of what is retained
    refused for now (the bound on everyone's asks taken, here by hand), is asked for again
    until there is room: its SUBSCRIBE gets what is retained, a little later, and nothing is
    logged. An ask larger than a replicator takes from one connection is refused at once,
    at the broker the client is at (d), without holding anyone's back."""
    import ges.core.retaining as retaining

    monkeypatch.setattr(retaining, "MAX_ALL_WAITING_BYTES", 1000)
    monkeypatch.setattr(retained_asks, "ASK_AGAIN_AFTER", 0.05)
    topology = topology_on_free_ports(A_AND_D_MQTT)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        spec = topology.brokers["a"]
        await publish_retained(spec, 3)
        replicator = servers["a"].core.replicator
        replicator._asks_bytes = 1000
        stream = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await stream.send_all(
            p.encode(p.Connect("sub", keepalive=30)) + p.encode(p.Subscribe(1, (("r/#", 0),)))
        )
        assert [type(x) for x in await packets(stream, 2)] == [p.ConnAck, p.SubAck]
        with trio.move_on_after(0.3):  # nothing while there is no room
            got = await packets(stream, 1, within=1)
            raise AssertionError(f"retained sent with no room: {got}")
        replicator._asks_bytes = 0
        got = await packets(stream, 3)
        assert sorted(x.payload for x in got) == [b"0", b"1", b"2"]
        assert not [r for r in caplog.records if "nothing retained sent" in r.getMessage()]
        # no room for longer than ASK_AGAIN_FOR: refused, and logged
        monkeypatch.setattr(retained_asks, "ASK_AGAIN_FOR", 0.2)
        replicator._asks_bytes = 1000
        late = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await late.send_all(
            p.encode(p.Connect("late", keepalive=30)) + p.encode(p.Subscribe(1, (("r/#", 0),)))
        )
        assert [type(x) for x in await packets(late, 2)] == [p.ConnAck, p.SubAck]
        with trio.fail_after(5):
            while not any(
                "client late: nothing retained sent" in r.getMessage()
                and "(refused for 0.2s)" in r.getMessage()
                for r in caplog.records
            ):
                await trio.sleep(0.02)
        replicator._asks_bytes = 0
        # at d: an ask over what a replicator takes from one connection, then a small one
        monkeypatch.setattr(retaining, "MAX_WAITING_BYTES", 300)
        monkeypatch.setattr(retained_asks, "MAX_WAITING_BYTES", 300)
        spec = topology.brokers["d"]
        big, small = await trio.open_tcp_stream(spec.host, spec.mqtt_port), None
        await big.send_all(
            p.encode(p.Connect("big", keepalive=30))
            + p.encode(p.Subscribe(1, (("r/#", 0), ("x/" + "y" * 400, 0))))
        )
        assert [type(x) for x in await packets(big, 2)] == [p.ConnAck, p.SubAck]
        small = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        await small.send_all(
            p.encode(p.Connect("small", keepalive=30)) + p.encode(p.Subscribe(1, (("r/#", 0),)))
        )
        got = await packets(small, 5, within=2)  # (not after the big one's retries)
        assert [type(x) for x in got] == [p.ConnAck, p.SubAck] + [p.Publish] * 3
        assert any(
            "client big: nothing retained sent" in r.getMessage()
            and "over the 300 a replicator takes" in r.getMessage()
            for r in caplog.records
        )
        nursery.cancel_scope.cancel()


async def test_a_request_no_header_may_hold_is_refused_and_the_broker_serves_on(tmp_path):
    """A review's find: one HTTP request with a byte no header may hold, sent to the MQTT
    WebSocket port, raised out of the listener and stopped the broker."""
    ws = {"b1": {**ONE_MQTT["brokers"]["b1"], "mqtt_ws_port": 1}}
    topology = topology_on_free_ports({**ONE_MQTT, "brokers": ws})
    spec = topology.brokers["b1"]
    async with trio.open_nursery() as nursery:
        await nursery.start(BrokerServer(topology, "b1", data_dir=tmp_path / "b1").run)
        for request in (b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n", b"\x10\x0c\x00\x04MQTT"):
            stream = await trio.open_tcp_stream(spec.host, spec.mqtt_ws_port)
            await stream.send_all(request)
            with trio.fail_after(10):
                answer = await stream.receive_some(4096)
            assert answer.startswith(b"HTTP/1.1 400 Bad Request")
            await stream.aclose()
        watcher = await watching(spec, "t/#")  # and it serves on
        await watcher.aclose()
        nursery.cancel_scope.cancel()
