"""Cutting and restoring one link of a running network (``LinkControl``) over real TCP."""

from __future__ import annotations

import pytest
import trio

from ges.client import connect
from ges.core import ToClient, ToPeer
from ges.errors import OperationError
from ges.runtime.up import wait_ready
from ges.wire import FrameDecoder, decode, encode
from ges.wire import messages as m
from ges.wire.messages import hello_for
from tests.conftest import DIAMOND, topology_on_free_ports
from tests.runtime.test_broker_runtime import start_all, stats_of
from tests.waiting import wait_until

#: Dial attempts a dialler makes at a cut end before the test believes it keeps being refused.
REFUSALS = 3
#: A backoff no test waits out: set once a dialler is parked, it shows that what the dialler
#: does next (redial on restore) does not go through a backoff.
NEVER = 3600.0


@pytest.fixture
def diamond():
    """a - b, a - c, b - d, c - d: cutting a - c leaves a route a - b - d - c."""
    return topology_on_free_ports(DIAMOND)


def client_at(topology, bid):
    spec = topology.brokers[bid]
    return connect(spec.host, spec.port, topology=topology.name)


def waits_for_restore(server, peer) -> bool:
    """``server``'s dialler to ``peer`` is parked until an operator restores the link: it makes
    no attempt until then, so a link cut at this end (the one that dials) stays down."""
    restored = server._cut.get(peer)
    return restored is not None and restored.statistics().tasks_waiting == 1


def both_down(a, c) -> bool:
    return "c" not in a.links_up and "a" not in c.links_up


def both_up(a, c) -> bool:
    return "c" in a.links_up and "a" in c.links_up


async def hello_reply(topology, to, sender):
    spec = topology.brokers[to]
    stream = await trio.open_tcp_stream(spec.host, spec.port)
    async with stream:
        await stream.send_all(encode(hello_for(topology, "broker", sender)))
        dec = FrameDecoder()
        with trio.fail_after(5):
            while not (frames := dec.frames()):
                dec.feed(await stream.receive_some(1024))
    return decode(frames[0])


async def test_a_cut_link_is_down_in_both_cores_until_restored(diamond):
    async with trio.open_nursery() as nursery:
        servers = await start_all(nursery, diamond)
        await wait_ready(diamond, timeout=10)
        a, c = servers["a"].core, servers["c"].core
        async with client_at(diamond, "a") as at_a, client_at(diamond, "c") as at_c:
            assert await at_a.link("c", up=False) is True
            # the answer comes after the core has seen the link go down
            assert "c" not in a.links_up
            # the other end sees the connection close, as on a TCP failure
            await wait_until(lambda: "a" not in c.links_up, "c to see the link to a go down")
            assert await at_c.link("a", up=False) is True
            assert await at_a.link("c", up=False) is False  # already cut
            assert (await at_a.stats()).links_cut == ["c"]
            assert (await at_c.stats()).links_cut == ["a"]
            # a (the lower id) is the only end that dials, and it waits for the restore
            await wait_until(lambda: waits_for_restore(servers["a"], "c"), "a to stop dialling c")
            assert both_down(a, c)
            assert (await stats_of(diamond, "a")).links_up == ["b"]

            # events route round the cut link
            async with client_at(diamond, "c") as sub_client:
                sub = await sub_client.subscribe([])
                await at_a.publish([m.Event({"n": i}) for i in range(20)])
                got = []
                with trio.fail_after(5):
                    async for d in sub:
                        got.append(d)
                        if len(got) == 20:
                            break
                assert [d.event.attributes["n"] for d in got] == list(range(20))
                assert {d.hops for d in got} == {3}  # a - b - d - c, not a - c

            # restoring lets the lower id redial as usual
            assert await at_c.link("a", up=True) is True
            assert await at_a.link("c", up=True) is True
            assert await at_a.link("c", up=True) is False
            await wait_until(lambda: both_up(a, c), "the restored link a - c to come up")
            assert (await at_a.stats()).links_cut == []
        nursery.cancel_scope.cancel()


async def test_a_link_cut_at_the_accepting_end_refuses_the_dialler(diamond):
    """Cut at c only: a (the lower id, which dials) keeps dialling and is refused; restoring
    c lets a's next attempt in."""
    async with trio.open_nursery() as nursery:
        servers = await start_all(nursery, diamond)
        await wait_ready(diamond, timeout=10)
        a, c = servers["a"].core, servers["c"].core
        async with client_at(diamond, "c") as at_c:
            assert await at_c.link("a", up=False) is True
            assert "a" not in c.links_up
            await wait_until(lambda: "c" not in a.links_up, "a to see the link to c go down")
            reply = await hello_reply(diamond, "c", "a")
            assert isinstance(reply, m.Refuse) and "link cut" in reply.reason
            # a keeps dialling (nothing is cut at its end) and c refuses every attempt
            refused = (await at_c.stats()).clients_refused

            async def refused_again():
                return (await at_c.stats()).clients_refused >= refused + REFUSALS

            await wait_until(refused_again, f"c to refuse {REFUSALS} more of a's attempts")
            assert both_down(a, c)
            assert await at_c.link("a", up=True) is True
        await wait_until(lambda: both_up(a, c), "a's next attempt to bring the link up")
        nursery.cancel_scope.cancel()


async def test_a_link_cut_at_the_dialling_end_is_not_redialled(diamond):
    async with trio.open_nursery() as nursery:
        servers = await start_all(nursery, diamond)
        await wait_ready(diamond, timeout=10)
        a, c = servers["a"].core, servers["c"].core
        async with client_at(diamond, "a") as at_a:
            assert await at_a.link("c", up=False) is True
            await wait_until(lambda: "a" not in c.links_up, "c to see the link to a go down")
            await wait_until(lambda: waits_for_restore(servers["a"], "c"), "a to stop dialling c")
            assert both_down(a, c)
            # from now on a backoff lasts an hour: the link comes back within the wait only if
            # the restore redials at once, not after a backoff grown while the link was cut
            servers["a"].backoff = (NEVER, NEVER)
            assert await at_a.link("c", up=True) is True
            await wait_until(lambda: both_up(a, c), "the restore to redial c")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("peer", "why"),
    [("d", "d is not a neighbour of a"), ("a", "a is not a neighbour of a"), ("zz", "unknown")],
)
async def test_a_link_to_a_non_neighbour_is_one_clear_error(diamond, peer, why):
    async with trio.open_nursery() as nursery:
        servers = await start_all(nursery, diamond, only=["a"])
        with pytest.raises(OperationError) as info:
            async with client_at(diamond, "a") as at_a:
                await at_a.link(peer, up=False)
        assert str(info.value).startswith("broker a: link control at a: ")
        assert why in str(info.value) and "\n" not in str(info.value)
        assert servers["a"]._cut == {}
        nursery.cancel_scope.cancel()


async def test_the_answer_to_a_cut_comes_after_the_cores_link_down(diamond):
    """The cut is one synchronous step: the connection is closed, the core has the link down
    and its outputs (the news for the rest of the unit) go before the answer."""
    async with trio.open_nursery() as nursery:
        servers = await start_all(nursery, diamond)
        await wait_ready(diamond, timeout=10)
        server = servers["a"]
        conn = server._peers["c"]
        outs = server._client_message(0, m.LinkControl("c", False), trio.current_time())
        assert conn.close_reason == "link cut by an operator"
        assert "c" not in server.core.links_up
        *news, answer = outs
        assert answer == ToClient(0, m.LinkControlled("c", False, True))
        connectivity = [
            o.msg for o in news if type(o) is ToPeer and isinstance(o.msg, m.Connectivity)
        ]
        reports = [r for msg in connectivity for r in msg.reports]
        assert any({r.a, r.b} == {"a", "c"} and not r.up for r in reports)
        nursery.cancel_scope.cancel()
