"""Durable sessions over real TCP: resume at another broker, take over, survive the client."""

from __future__ import annotations

import time

import trio

from ges.client import DurableSession, SessionEnded, SessionStream, Token, connect
from ges.errors import OperationError
from ges.runtime import BrokerServer
from ges.runtime.session_store import SqliteSessionStore
from ges.runtime.up import wait_ready
from ges.wire import messages as m
from tests.conftest import DIAMOND, topology_on_free_ports

#: the diamond with a replicator in each cluster: a (S/c1) and c (S/c2)
REPLICATED = {
    **DIAMOND,
    "replicators": [{"unit": "S/c1", "broker": "a"}, {"unit": "S/c2", "broker": "c"}],
}
EVERYTHING = [m.SessionSub(1, "all", [[m.Constraint("n", "exists")]])]


async def start(nursery, topology, data_dir):
    servers = {}
    for bid in topology.brokers:
        servers[bid] = await nursery.start(BrokerServer(topology, bid, data_dir=data_dir / bid).run)
    await wait_ready(topology, timeout=10)
    return servers


async def publish(topology, broker, first, n):
    spec = topology.brokers[broker]
    async with connect(spec.host, spec.port, topology=topology) as c:
        await c.publish([m.Event({"n": first + i}, b"", time.time_ns()) for i in range(n)])


async def take(session, n, within=10.0):
    got = []
    with trio.fail_after(within):
        async with session.running():
            async for batch in session.batches():
                got += [d.event.attributes["n"] for d in batch]
                if len(got) >= n:
                    break
    return got


async def test_a_session_resumes_at_another_broker_with_exactly_what_it_missed(tmp_path):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        moves = []
        first = trio.Event()

        def moved(move):
            moves.append(move)
            first.set()

        s = DurableSession(topology, "alice", "d", EVERYTHING, on_move=moved)

        async def publisher():
            await first.wait()
            await publish(topology, "a", 0, 20)

        nursery.start_soon(publisher)
        got = await take(s, 20)
        assert got == list(range(20))
        assert moves[0].to == "d" and moves[0].created
        # away: what is published meanwhile is kept for it
        await publish(topology, "a", 20, 30)
        token = s.token
        again = DurableSession(
            topology, "alice", "b", None, token=Token(token.replicator, token.store, token.epoch)
        )
        assert await take(again, 30) == list(range(20, 50))
        assert again.moves[0].replayed == 30 and not again.moves[0].created
        # a new process without the token finds it by name, after what was acknowledged
        await publish(topology, "a", 50, 5)
        fresh = DurableSession(topology, "alice", "a", None)
        assert await take(fresh, 5) == list(range(50, 55))
        nursery.cancel_scope.cancel()


async def test_a_second_connection_takes_the_session_over(tmp_path):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        s1 = DurableSession(topology, "bob", "b", EVERYTHING)
        got1, ended = [], []

        async def first_one():
            try:
                async with s1.running():
                    async for batch in s1.batches():
                        got1.extend(d.event.attributes["n"] for d in batch)
            except SessionEnded as exc:
                ended.append(str(exc))

        nursery.start_soon(first_one)
        with trio.fail_after(5):
            while not s1.moves:
                await trio.sleep(0.02)
        await publish(topology, "c", 0, 5)
        with trio.fail_after(5):
            while len(got1) < 5:
                await trio.sleep(0.02)
        opened = trio.Event()
        s2 = DurableSession(topology, "bob", "d", None, on_move=lambda move: opened.set())

        async def publish_when_open():
            await opened.wait()
            await publish(topology, "c", 5, 5)

        nursery.start_soon(publish_when_open)
        assert await take(s2, 5) == list(range(5, 10))
        with trio.fail_after(5):
            while not ended:
                await trio.sleep(0.02)
        assert "taken over at d" in ended[0]
        assert got1 == list(range(5))
        nursery.cancel_scope.cancel()


async def test_two_clients_of_one_broker_opening_a_session_at_once_leave_one_holder(tmp_path):
    """Two clients at d open session bob (its replicator c) at the same moment. The replicator
    sees one follow connection, on which the later open takes the earlier one's place; d
    tells the earlier opener it was taken over, and the later one gets the session's events.
    (Both were answered as opened, and the earlier got nothing from then on, unaware.)"""
    topology = topology_on_free_ports(REPLICATED)
    spec = topology.brokers["d"]
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        async with (
            connect(spec.host, spec.port, topology=topology) as c1,
            connect(spec.host, spec.port, topology=topology) as c2,
        ):
            answers = {}

            async def open_at_once(client):
                answers[client] = await client.open_session("bob", EVERYTHING, replicator="c")

            async with trio.open_nursery() as both:
                both.start_soon(open_at_once, c1)
                both.start_soon(open_at_once, c2)
            (winner,) = [c for c, (a, _) in answers.items() if type(a) is m.SessionOpened]
            (loser,) = [c for c, (a, _) in answers.items() if type(a) is m.SessionClosed]
            assert "taken over at d" in answers[loser][0].reason
            await publish(topology, "a", 0, 3)
            got = []
            with trio.fail_after(10):
                async for item in answers[winner][1]:
                    got.append(item.event.attributes["n"])
                    if len(got) == 3:
                        break
            assert got == [0, 1, 2]
        nursery.cancel_scope.cancel()


async def stoppable_network(nursery, topology, tmp_path, name: str):
    """Every broker in a cancel scope of its own (cancelling one stops it, as a crash does,
    and ``run`` starts it again), and durable session ``name`` opened at d with what it gets:
    ``(run, scopes, got)``."""
    scopes = {}

    async def run(bid, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            scopes[bid] = scope
            server = BrokerServer(topology, bid, data_dir=tmp_path / bid)
            await server.run(task_status=task_status)

    for bid in topology.brokers:
        await nursery.start(run, bid)
    await wait_ready(topology, timeout=10)
    opened = trio.Event()
    s = DurableSession(topology, name, "d", EVERYTHING, on_move=lambda mv: opened.set())
    got: list = []

    async def consume():
        async with s.running():
            async for batch in s.batches():
                got.extend(d.event.attributes["n"] for d in batch)

    nursery.start_soon(consume)
    with trio.fail_after(5):
        await opened.wait()
    return run, scopes, got


async def test_a_replicator_that_crashes_reads_back_what_was_published_meanwhile(tmp_path):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        run, scopes, got = await stoppable_network(nursery, topology, tmp_path, "carol")
        await publish(topology, "a", 0, 10)
        with trio.fail_after(5):
            while len(got) < 10:
                await trio.sleep(0.02)
        scopes["c"].cancel()  # the session's replicator stops, as on a crash
        await trio.sleep(2.5)  # its neighbours see it gone
        await publish(topology, "a", 10, 10)  # kept by a's log: c has not acknowledged them
        await trio.sleep(1)
        await nursery.start(run, "c")
        await publish(topology, "a", 20, 5)
        with trio.fail_after(20):
            while len(got) < 25:
                await trio.sleep(0.05)
        await trio.sleep(0.5)
        assert got == list(range(25))
        nursery.cancel_scope.cancel()


async def test_a_replicator_reads_back_its_own_pubends_log_after_a_crash(tmp_path, monkeypatch):
    """Events published at the replicator's own broker up to the moment it stops: those its
    session store had not committed yet (here its commits are held back from the 500th event
    on, as a slow disk would) are read back from its own log after the restart — kept for it:
    its own log releases nothing above what the store committed — so the session has every
    one the publisher had acknowledged, once."""
    held = {"on": False}
    real_pending = SqliteSessionStore.pending

    def pending(store):
        if held["on"] and store.path.parent.name == "c":
            return False
        return real_pending.fget(store)

    monkeypatch.setattr(SqliteSessionStore, "pending", property(pending))
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        run, scopes, got = await stoppable_network(nursery, topology, tmp_path, "dave")
        acked: list[int] = []
        spec = topology.brokers["c"]

        async def publisher():
            async with connect(spec.host, spec.port, topology=topology) as pub:
                n = 0
                try:
                    while True:
                        await pub.publish([m.Event({"n": n + i}, b"x" * 200) for i in range(50)])
                        acked.extend(range(n, n + 50))
                        n += 50
                except OperationError:
                    return  # its broker stopped

        nursery.start_soon(publisher)
        with trio.fail_after(10):
            while len(acked) < 500:
                await trio.sleep(0.001)
            held["on"] = True
            while len(acked) < 1_000:
                await trio.sleep(0.001)
        scopes["c"].cancel()  # the replicator stops mid-stream, as on a crash
        await trio.sleep(1)
        held["on"] = False
        await nursery.start(run, "c")
        with trio.fail_after(20):
            while len(got) < len(acked):
                await trio.sleep(0.05)
        await trio.sleep(0.5)
        assert len(got) == len(set(got))
        assert got[: len(acked)] == acked  # in order, every acknowledged one
        nursery.cancel_scope.cancel()


async def test_an_application_that_stops_part_way_through_a_batch_resumes_after_what_it_took(
    tmp_path,
):
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        opened = trio.Event()
        s = DurableSession(topology, "dave", "b", EVERYTHING, on_move=lambda mv: opened.set())
        took = []

        async def publisher():
            await opened.wait()
            await publish(topology, "c", 0, 10)

        nursery.start_soon(publisher)
        with trio.fail_after(10):
            async with s.running():
                async for batch in s.batches():
                    took += batch
                    if len(took) >= 3:
                        break
                await s.ack(took[2].epoch)  # it used three; the block's end acknowledges no more
        assert [d.event.attributes["n"] for d in took[:3]] == [0, 1, 2]
        again = DurableSession(topology, "dave", "d", None)
        assert await take(again, 7) == list(range(3, 10))
        nursery.cancel_scope.cancel()


async def test_a_session_follows_its_client_to_its_units_replicator_over_real_links(tmp_path):
    """Opened at d (homed at c, S/c2's replicator), the client moves to b: half a second
    later c hands the session over to a (S/c1's) across a real broker link, the library opens
    it again at a through b, and every event published at a and at c throughout arrives
    once, in order per publisher."""
    topology = topology_on_free_ports({**REPLICATED, "sessions": {"handover_after": 0.5}})
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        s = DurableSession(topology, "alice", "d", EVERYTHING)
        async with s.running():  # made (at c), and left
            with trio.fail_after(10):
                while not s.moves:
                    await trio.sleep(0.02)
        published = {"a": [], "c": []}
        stop = trio.Event()

        async def publisher(broker, first):
            spec = topology.brokers[broker]
            async with connect(spec.host, spec.port, topology=topology) as pub:
                n = first
                while not stop.is_set():
                    await pub.publish([m.Event({"n": n}, b"", time.time_ns())])
                    published[broker].append(n)
                    n += 1
                    await trio.sleep(0.01)

        nursery.start_soon(publisher, "a", 0)
        nursery.start_soon(publisher, "c", 1_000_000)
        moves = []
        roamed = DurableSession(
            topology,
            "alice",
            "b",
            None,
            token=Token(s.token.replicator, s.token.store, s.token.epoch),
            on_move=moves.append,
        )
        got = []
        with trio.fail_after(30):
            async with roamed.running():
                async for batch in roamed.batches():
                    got += [d.event.attributes["n"] for d in batch]
                    if roamed.token.replicator == "a" and not stop.is_set():
                        await trio.sleep(0.5)  # a while longer at the new replicator
                        stop.set()
                    if stop.is_set() and len(got) >= sum(map(len, published.values())):
                        break
        assert [m.why for m in moves][1:] == ["handed over to replicator a (its client's unit)"]
        assert roamed.token.replicator == "a"
        assert len(got) == len(set(got))
        assert sorted(got) == sorted(published["a"] + published["c"])
        for mine in published.values():
            assert [n for n in got if n in set(mine)] == mine
        nursery.cancel_scope.cancel()


def desk_with(holder: int | None, asks: dict):
    """A SessionDesk at d with a follow connection to c: ``holder`` holds session x there,
    and ``asks`` are its opens on their way."""
    from ges.runtime.sessions import Follow, SessionDesk

    class Server:
        topology, id = None, "d"

        def is_client(self, conn):
            return type(conn) is int

    desk = SessionDesk.__new__(SessionDesk)
    desk.server, desk._follows, desk._held, desk._answers = Server(), {}, {}, trio.Event()
    desk._ask_answered = lambda follow, msg: None  # (no ask of what is retained here)
    follow = desk._follows["c"] = Follow("c")
    if holder is not None:
        follow.sessions["x"], desk._held[holder] = holder, {"x": "c"}
    follow.asks.update(asks)
    return desk, follow


async def test_a_session_closed_while_its_clients_change_is_on_its_way_leaves_no_wait(
    autojump_clock,
):
    """A client at d holds session x (its replicator c) and has changed its subscriptions:
    an open sent on, unanswered. The replicator closes the session instead (being handed
    over: try again). The client is told once, and nothing it sends later waits for an answer
    that will not come (it waited ASK_WAIT, 5 s, each time)."""
    desk, follow = desk_with(7, {42: [7, 3, None, "x"]})
    why = "being handed over to replicator b: try again"
    out = desk._from_replicator(follow, m.SessionClosed("x", why, retry=True, req=42))
    assert [(o.conn, o.msg.reason, o.msg.req) for o in out] == [(7, why, 3)]  # its own req
    assert not follow.asks and not desk.opening(7)
    assert follow.sessions["x"] == 7  # (the change was refused; the session streams on)
    began = trio.current_time()
    await desk.answered(7)
    assert trio.current_time() == began


def test_a_holder_taken_over_elsewhere_keeps_its_change_on_the_way():
    """7 holds x at d and has a change on its way; a client at e takes x over first, then
    7's change takes it back: its answer still reaches 7, which holds x again (a review
    found the takeover note dropped the change's ask, and the replicator streamed x to d
    with nobody there holding it)."""
    desk, follow = desk_with(7, {42: [7, 3, None, "x"]})
    out = desk._from_replicator(follow, m.SessionClosed("x", "taken over at e"))
    assert [(o.conn, o.msg.reason) for o in out] == [(7, "taken over at e")]
    opened = m.SessionOpened("x", "c", "c", False, 0, 0, [], req=42)
    out = desk._from_replicator(follow, opened)
    assert [(o.conn, type(o.msg), o.msg.req) for o in out] == [(7, m.SessionOpened, 3)]
    assert follow.sessions["x"] == 7


async def test_a_holder_with_a_change_on_its_way_is_told_it_was_taken_over_once(monkeypatch):
    import ges.runtime.sessions as sessions

    desk, follow = desk_with(7, {42: [7, 3, None, "x"]})
    follow.conn = object()
    monkeypatch.setattr(sessions, "replicator_brokers", lambda topology, me: ["c"])

    async def known(rep):
        return follow

    desk._follow, desk._send, desk._reqs = known, lambda f, msg: None, iter(range(100, 200))
    desk._who = lambda conn: ("", False)
    desk.topology, desk.id = None, "d"
    out = await desk._open(8, m.SessionOpen("x", None, replicator="c"), 0.0)
    assert [(o.conn, o.msg.reason) for o in out] == [(7, "taken over at d")]
    assert follow.asks[42][0] == "taken" and not desk.opening(7)


async def test_an_acknowledgement_to_be_kept_is_confirmed_through_the_clients_broker(tmp_path):
    """``ack(kept=True)``: the replicator (a, through the follow connection of the client's
    broker b) answers once the acknowledgement is durable, and a new process without the
    token resumes after it; a process that is not the session's client is never told so."""
    topology = topology_on_free_ports(REPLICATED)
    async with trio.open_nursery() as nursery:
        await start(nursery, topology, tmp_path)
        opened = trio.Event()
        s = DurableSession(topology, "erin", "b", EVERYTHING, on_move=lambda mv: opened.set())
        took = []

        async def publisher():
            await opened.wait()
            await publish(topology, "c", 0, 5)

        nursery.start_soon(publisher)
        with trio.fail_after(10):
            async with s.running():
                async for batch in s.batches():
                    took += batch
                    if len(took) >= 5:
                        break
                assert await s.ack(kept=True) is True
                assert await s.ack(kept=True) is True  # (again, nothing new: still kept)
        assert s.token.replicator == "a"  # the premise: kept at a, asked at b
        spec = topology.brokers["b"]
        async with connect(spec.host, spec.port, topology=topology) as other:
            stranger = SessionStream(other, "erin")  # a connection holding no session
            with trio.move_on_after(0.5) as waited:
                await stranger.ack(5, kept=True)
            assert waited.cancelled_caught  # never told it was kept
        await publish(topology, "c", 5, 3)
        fresh = DurableSession(topology, "erin", "d", None)
        assert await take(fresh, 3) == [5, 6, 7]
        nursery.cancel_scope.cancel()


def test_a_kept_answer_goes_back_to_the_client_that_asked_and_to_no_other():
    """(A review's find.) Client 7 asked for an acknowledgement (or QoS 2 change) to be kept,
    then client 9 took the session over at this broker: the answer is 7's, never 9's (an
    MQTT client 9 would take it for its own change of the same number and answer early)."""
    from ges.core.outputs import ToClient

    desk, follow = desk_with(9, {})
    follow.keeping[("x", 5)] = 7
    kept = m.SessionKept("x", req=5)
    assert desk._from_replicator(follow, kept) == [ToClient(7, kept)]
    assert desk._from_replicator(follow, kept) == []  # (once)
    assert desk._from_replicator(follow, m.SessionKept("x", req=6)) == []  # not asked here
