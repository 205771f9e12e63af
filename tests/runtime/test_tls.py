"""TLS between brokers and to clients, over real sockets (issue 19, first step: opt-in through
``BrokerServer(certs=…)`` and ``connect(tls=…)``).

A broker accepts a link only from the broker its certificate names; one that claims to be a
neighbour without it is refused and logged with its address and the id it claimed. A broker
dials a neighbour only if the server there proves to be that neighbour.
"""

from __future__ import annotations

import logging

import pytest
import trio

from ges.client import connect
from ges.errors import OperationError
from ges.runtime.broker import BrokerServer
from ges.runtime.up import wait_ready
from ges.security.certs import CertDir, Identity
from ges.security.tls import context
from ges.wire import encode
from ges.wire import messages as m
from ges.wire.messages import hello_for
from tests.conftest import receive
from tests.runtime.test_limits import read_one


@pytest.fixture
def certs(chain3, tmp_path) -> CertDir:
    where = CertDir(tmp_path / "certs")
    where.init(chain3.name, {b: () for b in chain3.brokers})
    where.add(Identity("client", "alice"))
    return where


async def start(nursery, topology, certs, only=None) -> dict[str, BrokerServer]:
    servers = {}
    for bid in only or topology.brokers:
        servers[bid] = BrokerServer(topology, bid, certs=certs)
        await nursery.start(servers[bid].run)
    return servers


async def test_brokers_link_and_deliver_over_tls(chain3, certs):
    ctx = context(certs, Identity("client", "alice"), server=False)
    async with trio.open_nursery() as nursery:
        await start(nursery, chain3, certs)
        await wait_ready(chain3, timeout=10, tls=ctx)
        s1, s3 = chain3.brokers["b1"], chain3.brokers["b3"]
        async with (
            connect(s3.host, s3.port, topology=chain3, tls=ctx) as sub_client,
            connect(s1.host, s1.port, topology=chain3, tls=ctx) as pub_client,
        ):
            sub = await sub_client.subscribe([m.Constraint("n", ">=", 0)])
            await pub_client.publish([m.Event({"n": 1})])
            (got,) = await receive(sub, 1)
            assert dict(got.event.attributes) == {"n": 1} and got.hops == 2
        nursery.cancel_scope.cancel()


async def test_a_neighbour_without_its_certificate_is_refused_and_logged(chain3, certs, caplog):
    caplog.set_level(logging.WARNING)
    anonymous = context(certs, None, server=False)
    alice = context(certs, Identity("client", "alice"), server=False)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, chain3, certs)
        await wait_ready(chain3, timeout=10, tls=alice)
        spec = chain3.brokers["b2"]
        for who, ctx in (("no certificate", anonymous), ("client alice", alice)):
            # TLS with the network's CA, then Hello as b2's neighbour b1
            tcp = await trio.open_tcp_stream(spec.host, spec.port)
            stream = trio.SSLStream(tcp, ctx, server_side=False)
            await stream.send_all(encode(hello_for(chain3, "broker", "b1")))
            reply = await read_one(stream)
            assert type(reply) is m.Refuse, reply
            assert (
                f"claiming to be broker b1 presented {'the certificate of ' * (who != 'no certificate')}{who}"
                in reply.reason
            )
            await trio.aclose_forcefully(stream)
        lines = [
            r.getMessage() for r in caplog.records if "claiming to be broker b1" in r.getMessage()
        ]
        assert lines and "127.0.0.1:" in lines[0]  # its address
        assert "b1" in servers["b2"].core.links_up  # the real b1 is still linked
        nursery.cancel_scope.cancel()


async def test_plain_tcp_to_a_tls_broker_gets_nowhere(chain3, certs):
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, chain3, certs, only=["b1"])
        spec = chain3.brokers["b1"]
        with pytest.raises(OperationError):
            async with connect(spec.host, spec.port, topology=chain3, timeout=3):
                pass
        assert servers["b1"].core.stats().clients == 0
        nursery.cancel_scope.cancel()


async def test_a_server_that_is_not_the_neighbour_it_should_be_is_not_linked(chain3, certs, caplog):
    """b2's port is served by a broker holding b3's certificate: b1 will not link with it."""
    caplog.set_level(logging.WARNING)
    wrong = chain3.brokers["b2"]
    async with trio.open_nursery() as nursery:
        b1 = BrokerServer(chain3, "b1", certs=certs)
        await nursery.start(b1.run)
        # an impostor answering on b2's port with b3's certificate
        impostor_ctx = context(certs, Identity("broker", "b3"), server=True)

        async def impostor(stream):
            tls = trio.SSLStream(stream, impostor_ctx, server_side=True)
            try:
                await tls.do_handshake()
                await read_one(tls)
            except (trio.BrokenResourceError, trio.TooSlowError):
                pass

        listeners = await trio.open_tcp_listeners(wrong.port, host=wrong.host)
        nursery.start_soon(trio.serve_listeners, impostor, listeners)
        with trio.fail_after(10):
            while not any(
                "presented broker b3, not b2's" in r.getMessage() for r in caplog.records
            ):
                await trio.sleep(0.05)
        assert b1.core.links_up == set()
        nursery.cancel_scope.cancel()


async def test_a_client_checks_the_broker_is_who_it_says(chain3, certs, tmp_path):
    """A client with another network's CA refuses the broker at the handshake."""
    other = CertDir(tmp_path / "other")
    other.init(chain3.name, {"b1": ()})
    async with trio.open_nursery() as nursery:
        await start(nursery, chain3, certs, only=["b1"])
        spec = chain3.brokers["b1"]
        with pytest.raises(OperationError, match="TLS failed"):
            async with connect(spec.host, spec.port, tls=context(other, None, server=False)):
                pass
        nursery.cancel_scope.cancel()


async def test_a_handshake_that_never_comes_or_is_garbage_is_bounded_in_time(chain3, certs):
    """TLS does not open a way round the admission bounds: a connection that sends nothing is
    closed after the handshake timeout, one that sends garbage at once; the broker serves on."""
    from ges.transport.connection import HANDSHAKE_TIMEOUT

    async with trio.open_nursery() as nursery:
        servers = await start(nursery, chain3, certs, only=["b1"])
        spec = chain3.brokers["b1"]
        silent = await trio.open_tcp_stream(spec.host, spec.port)
        garbage = await trio.open_tcp_stream(spec.host, spec.port)
        await garbage.send_all(b"\x16\x03\x01" + b"\xff" * 5000)
        started = trio.current_time()
        with trio.fail_after(2):  # garbage: closed at once (perhaps after a TLS alert)
            while await garbage.receive_some(65536):
                pass
        with trio.fail_after(HANDSHAKE_TIMEOUT + 3):
            while await silent.receive_some(65536):
                pass  # a TLS alert may come first; then the close
        assert trio.current_time() - started >= HANDSHAKE_TIMEOUT - 0.5
        assert servers["b1"]._opening == 0
        alice = context(certs, Identity("client", "alice"), server=False)
        async with connect(spec.host, spec.port, topology=chain3, tls=alice) as client:
            assert (await client.stats()).broker == "b1"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
async def test_a_connection_reset_before_its_connect_is_logged_with_its_address(
    tmp_path, caplog, tls
):
    """A client that gives up in the middle of its handshake, resetting the connection (as
    one that refuses the broker's certificate may), or before its CONNECT: the socket no
    longer says who it was, and the address logged is the one it had when it came."""
    import socket
    import struct

    from tests.conftest import topology_on_free_ports
    from tests.runtime.test_mqtt_runtime import ONE_MQTT

    caplog.set_level(logging.WARNING)
    topology = topology_on_free_ports(ONE_MQTT)
    where = None
    if tls:
        where = CertDir(tmp_path / "certs")
        where.init(topology.name, {"b1": ()})
    async with trio.open_nursery() as nursery:
        server = BrokerServer(topology, "b1", certs=where)
        await nursery.start(server.run)
        spec = topology.brokers["b1"]
        quitter = await trio.open_tcp_stream(spec.host, spec.mqtt_port)
        host, port, *_ = quitter.socket.getsockname()
        # a TLS record header, or a CONNECT's first byte: the rest to come
        await quitter.send_all(b"\x16\x03\x01\x02\x00" if tls else b"\x10")
        with trio.fail_after(5):
            while not server._opening:  # accepted, and reading what came
                await trio.sleep(0.01)
        quitter.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        quitter.socket.close()  # a reset
        with trio.fail_after(5):
            while not (
                said := [
                    r.getMessage()
                    for r in caplog.records
                    if "refused an MQTT connection" in r.getMessage()
                ]
            ):
                await trio.sleep(0.02)
        assert f"from {host}:{port}:" in said[0], said
        nursery.cancel_scope.cancel()
