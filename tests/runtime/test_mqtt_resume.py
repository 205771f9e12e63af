"""MQTT 5.0 sessions resumed without Clean Start and with no Session Expiry Interval (paho's
default reconnect): resumed wherever they are, ended as the connection closes however it closes,
kept through a takeover, and never a reason to refuse a client (§3.1.2.4, §3.1.2.11.2, §3.1.4)."""

from __future__ import annotations

import trio

from ges.mqtt import packets as p
from ges.mqtt.frames import PacketReader
from ges.runtime import BrokerServer
from tests.conftest import topology_on_free_ports
from tests.runtime.test_mqtt_runtime import (
    A_AND_D_MQTT,
    connect5,
    packets,
    start,
    until_closed,
    watching,
)

LASTING = ((p.SESSION_EXPIRY, 600),)


async def made(spec, cid: str) -> None:
    """A persistent session for ``cid`` (600 s) with a filter t/<cid>, its client gone."""
    stream, _ = await connect5(spec, cid, props=LASTING)
    await stream.send_all(p.encode(p.Subscribe(1, ((f"t/{cid}", 1),)), 5))
    assert [type(x) for x in await packets(stream, 1)] == [p.SubAck]
    await stream.send_all(p.encode(p.Disconnect(p.SUCCESS), 5))
    assert await until_closed(stream, []) == []


async def test_a_resumed_session_ends_when_its_client_is_cut_because_the_follow_link_failed(
    tmp_path,
):
    """The client is at d, its session at a's replicator, and the follow connection d -> a
    fails: d can tell a nothing more, and closes the client; the session, opened to end with
    its client, ends at a all the same (``SessionOpen.ends``) rather than keep its 600 s."""
    topology = topology_on_free_ports(A_AND_D_MQTT)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        d = topology.brokers["d"]
        await made(d, "car")
        stream, ack = await connect5(d, "car")  # resume only
        assert ack.session_present
        a = servers["a"]
        (follower,) = a._followers  # d's follow connection, at a
        a._clients[follower].close("cut for the test")  # as a network failure would
        got = await until_closed(stream, [])
        assert got and type(got[-1]) is p.Disconnect  # the client was told to go
        await trio.sleep(1.0)
        assert "mqtt.car" not in servers["a"].core.replicator.sessions  # ended with it
        again, ack = await connect5(d, "car")
        assert not ack.session_present
        nursery.cancel_scope.cancel()


async def test_a_takeover_of_a_resumed_session_keeps_it_for_the_new_connection_wherever(
    tmp_path,
):
    """A resume-only connection (Clean Start 0, no interval) holds the session; a new one with
    the same client id and Clean Start 0 takes it over (§3.1.4): it is given the session
    (Session Present 1) and keeps it — the old connection's leaving does not end it, also when
    both share their broker's follow connection to the replicator (y4)."""
    topology = topology_on_free_ports(A_AND_D_MQTT)
    # (client id, where the session is made and the old connection is, where the new one is)
    cases = [("y1", "a", "a"), ("y2", "d", "a"), ("y3", "a", "d"), ("y4", "d", "d")]
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, topology, tmp_path)
        at = topology.brokers
        outcome = {}
        for cid, old_at, new_at in cases:
            await made(at[old_at], cid)
            old, ack = await connect5(at[old_at], cid)
            assert ack.session_present
            new, ack = await connect5(at[new_at], cid)
            await until_closed(old, [])
            await trio.sleep(0.5)
            outcome[cid] = (
                ack.session_present,
                f"mqtt.{cid}" in servers["a"].core.replicator.sessions,
            )
        assert outcome == {cid: (True, True) for cid, _, _ in cases}, outcome
        nursery.cancel_scope.cancel()


#: an MQTT broker m and three replicators elsewhere (r1-r3), which do not answer
SILENT = {
    "name": "silent",
    "brokers": {
        "m": {"unit": "S/c0", "port": 1, "mqtt_port": 1},
        "r1": {"unit": "S/c1", "port": 2},
        "r2": {"unit": "S/c2", "port": 3},
        "r3": {"unit": "S/c3", "port": 4},
    },
    "links": [["m", "r1"], ["m", "r2"], ["m", "r3"]],
    "replicators": [
        {"unit": "S/c1", "broker": "r1"},
        {"unit": "S/c2", "broker": "r2"},
        {"unit": "S/c3", "broker": "r3"},
    ],
}


async def test_no_clean_start_and_no_interval_connects_without_a_session_when_replicators_are_silent(
    tmp_path,
):
    """Replicators that accept TCP and never answer (a hung broker, a partition that drops
    packets): the lookup of a session the client would only resume waits no longer than a
    clean session's discard does (DISCARD_WAIT), and the client connects without one — where
    each silent replicator alone would hold it 5 s, and three past the open's 15 s."""
    topology = topology_on_free_ports(SILENT)

    async def silent(stream):
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for bid in ("r1", "r2", "r3"):
            spec = topology.brokers[bid]
            listeners = await trio.open_tcp_listeners(spec.port, host=spec.host)
            nursery.start_soon(trio.serve_listeners, silent, listeners)
        await nursery.start(BrokerServer(topology, "m", data_dir=tmp_path / "m").run)
        m = topology.brokers["m"]
        stream = await trio.open_tcp_stream(m.host, m.mqtt_port)
        await stream.send_all(p.encode(p.Connect("car", False, 60, level=5), 5))
        began = trio.current_time()
        reader = PacketReader(version=5)
        with trio.fail_after(20):
            while not (got := [p.decode(x, 5) for x in reader.packets()]):
                reader.feed(await stream.receive_some(65536))
        (ack,) = got
        waited = trio.current_time() - began
        assert ack.code == p.SUCCESS and not ack.session_present, (ack, waited)
        assert waited < 3.0, waited
        nursery.cancel_scope.cancel()


async def test_a_takeover_that_resumes_the_session_never_sends_a_delayed_will(tmp_path):
    """[MQTT-3.1.3-9]: a new connection to the session before the Will Delay Interval has
    passed, and the will must not go. The old connection resumed its session (Clean Start 0,
    no interval) with a will delayed 2 s; a new one with Clean Start 0 takes it over and is
    given the session: it did not end, so its will is not published, wherever each is."""
    topology = topology_on_free_ports(A_AND_D_MQTT)
    cases = [("z1", "a", "a"), ("z2", "d", "a"), ("z3", "a", "d"), ("z4", "d", "d")]
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        at = topology.brokers
        watcher = await watching(at["a"], "w/#")
        present = {}
        for cid, old_at, new_at in cases:
            await made(at[old_at], cid)
            will = p.Will(f"w/{cid}", cid.encode(), props=((p.WILL_DELAY, 2),))
            old, ack = await connect5(at[old_at], cid, False, will)
            assert ack.session_present
            new, ack = await connect5(at[new_at], cid)
            present[cid] = ack.session_present
        wills = []
        with trio.move_on_after(3.5):
            while True:
                wills += [x.topic for x in await packets(watcher, 1)]
        assert (present, wills) == ({c: True for c, _, _ in cases}, [])
        nursery.cancel_scope.cancel()
