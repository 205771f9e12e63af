"""The client library's publish window over a real socket (``ges.client``): a publisher keeps
at most ``window`` Publish frames unacknowledged. While the broker does not acknowledge, the
next publish waits — nothing piles up in the client or on the wire — and it goes on as
acknowledgements come. The broker here is a fake on a real TCP socket that acknowledges only
when the test says so."""

from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from ges.client import connect
from ges.errors import OperationError
from ges.wire import FrameDecoder, decode, encode, event_size
from ges.wire import messages as m
from tests.waiting import WAIT, wait_until

WINDOW = 4
BATCHES = 10


class FakeBroker:
    """Welcomes one client and records the Publish frames it reads; acknowledges them only when
    told (:meth:`ack`) or, once ``auto_ack`` is set, as they come."""

    def __init__(self) -> None:
        self.port = 0
        self.publishes: list[m.Publish] = []
        self.acked = 0
        self.auto_ack = False
        self._stream: trio.SocketStream | None = None
        self._sending = trio.Lock()
        self._tick = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        decoder = FrameDecoder()
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await stream.receive_some(65536):
                decoder.feed(data)
                for body in decoder.frames():
                    msg = decode(body)
                    if type(msg) is m.Hello:
                        await self._send(m.Welcome("b1", "1"))
                    elif type(msg) is m.Publish:
                        self.publishes.append(msg)
                        if self.auto_ack:
                            await self.ack(len(self.publishes) - self.acked)

    async def ack(self, n: int, *, joined: bool = False) -> None:
        """Acknowledge the next ``n`` Publish frames read and not yet acknowledged — with
        ``joined``, in one PubAck covering them all (as a broker's natural batching does)."""
        assert self.acked + n <= len(self.publishes), "acknowledging what was not sent"
        # taken before the first await: the reader task may acknowledge too (auto_ack)
        batch = self.publishes[self.acked : self.acked + n]
        self.acked += n
        if joined:
            first = self._tick + 1
            self._tick += sum(len(p.events) for p in batch)
            await self._send(m.PubAck(batch[-1].seq, "b1~1", first, self._tick, seqs=n))
            return
        for publish in batch:
            first = self._tick + 1
            self._tick += len(publish.events)
            await self._send(m.PubAck(publish.seq, "b1~1", first, self._tick))

    async def close(self) -> None:
        assert self._stream is not None
        await self._stream.aclose()

    async def _send(self, msg) -> None:
        async with self._sending:
            await self._stream.send_all(encode(msg))


@asynccontextmanager
async def fake_broker():
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        broker.port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, broker.serve, listeners)
        yield broker
        nursery.cancel_scope.cancel()


async def settled() -> None:
    """Every task waits: whatever the client could send has been sent and read."""
    await trio.testing.wait_all_tasks_blocked()


async def test_the_publisher_stops_at_its_window_and_goes_on_as_acks_come():
    async with (
        fake_broker() as broker,
        connect("127.0.0.1", broker.port, window=WINDOW) as client,
        trio.open_nursery() as nursery,
    ):
        returned = 0

        async def publish_all():
            nonlocal returned
            for i in range(BATCHES):
                await client.publish_nowait([m.Event({"n": i})])
                returned += 1

        nursery.start_soon(publish_all)
        await wait_until(lambda: len(broker.publishes) >= WINDOW, "a window of publishes")
        await settled()
        # the broker acknowledges nothing: the window's worth is out, the next one waits
        assert len(broker.publishes) == WINDOW and returned == WINDOW
        assert client.conn.queued == 0  # and nothing is held back in the client either
        assert client.acknowledged == 0

        await broker.ack(2)  # two acknowledgements let exactly two more go
        await wait_until(lambda: len(broker.publishes) >= WINDOW + 2, "two more publishes")
        await settled()
        assert len(broker.publishes) == WINDOW + 2 and returned == WINDOW + 2
        assert client.acknowledged == 2

        broker.auto_ack = True  # from now on as they come: the rest go through
        await broker.ack(len(broker.publishes) - broker.acked)
        await wait_until(lambda: returned == BATCHES, "every batch to be published")
        with trio.fail_after(WAIT):
            await client.flush()
        assert client.acknowledged == BATCHES
        assert [p.events[0].attributes["n"] for p in broker.publishes] == list(range(BATCHES))
        assert [p.seq for p in broker.publishes] == list(range(1, BATCHES + 1))


async def test_the_publisher_stops_at_its_window_of_bytes_too():
    """A window of frames is no bound on what they hold: publishes of 1 MiB events stop once
    WINDOW_BYTES of them are unacknowledged, however many frames that is."""
    from ges.client._client import WINDOW_BYTES

    big = b"x" * (1 << 20)
    fit = WINDOW_BYTES // event_size(m.Event({"n": 0}, big))
    async with (
        fake_broker() as broker,
        connect("127.0.0.1", broker.port, window=100) as client,
        trio.open_nursery() as nursery,
    ):
        returned = 0

        async def publish_all():
            nonlocal returned
            for i in range(fit + 3):
                await client.publish_nowait([m.Event({"n": i}, big)])
                returned += 1

        nursery.start_soon(publish_all)
        await wait_until(lambda: len(broker.publishes) >= fit, "a window of bytes")
        await settled()
        assert len(broker.publishes) == returned == fit
        await broker.ack(1)  # room for one more
        await wait_until(lambda: len(broker.publishes) >= fit + 1, "one more publish")
        await settled()
        assert len(broker.publishes) == returned == fit + 1
        broker.auto_ack = True
        await broker.ack(len(broker.publishes) - broker.acked)
        with trio.fail_after(WAIT):
            await wait_until(lambda: returned == fit + 3, "the rest")
            await client.flush()
        assert client.acknowledged == fit + 3


async def test_publish_returns_only_once_the_broker_acknowledged_the_batch():
    async with (
        fake_broker() as broker,
        connect("127.0.0.1", broker.port, window=WINDOW) as client,
        trio.open_nursery() as nursery,
    ):
        acks: list[m.PubAck] = []

        async def publish_three():
            acks.append(await client.publish([m.Event({"n": i}) for i in range(3)]))

        nursery.start_soon(publish_three)
        await wait_until(lambda: broker.publishes, "the batch to reach the broker")
        await settled()
        assert acks == []  # sent, not acknowledged: publish still waits
        await broker.ack(1)
        await wait_until(lambda: acks, "publish to return")
        assert (acks[0].pubend, acks[0].first_tick, acks[0].last_tick) == ("b1~1", 1, 3)
        assert client.acknowledged == 3


async def test_one_acknowledgement_covering_several_publishes_answers_each_with_its_ticks():
    async with (
        fake_broker() as broker,
        connect("127.0.0.1", broker.port, window=WINDOW) as client,
        trio.open_nursery() as nursery,
    ):
        acks: dict[int, m.PubAck] = {}

        async def publish(i: int, size: int) -> None:
            acks[i] = await client.publish([m.Event({"n": i})] * size)

        for i, size in enumerate((2, 1, 3)):
            nursery.start_soon(publish, i, size)
            await wait_until(lambda i=i: len(broker.publishes) > i, "the publish to go")
        await broker.ack(3, joined=True)
        await wait_until(lambda: len(acks) == 3, "every publish to return")
        ticks = [(acks[i].first_tick, acks[i].last_tick) for i in range(3)]
        assert ticks == [(1, 2), (3, 3), (4, 6)]
        assert client.acknowledged == 6
        with trio.fail_after(WAIT):  # the window is whole again
            await client.flush()


async def test_a_publisher_waiting_at_its_window_fails_when_the_broker_goes():
    """The broker acknowledges one of a window and closes the connection: the publisher that
    waits for room is freed with an error saying what happened, not left waiting, and the
    client says how many events were acknowledged."""
    async with (
        fake_broker() as broker,
        connect("127.0.0.1", broker.port, window=WINDOW) as client,
        trio.open_nursery() as nursery,
    ):
        errors: list[OperationError] = []

        async def publish_all():
            try:
                for i in range(BATCHES):
                    await client.publish_nowait([m.Event({"n": i})])
            except OperationError as exc:
                errors.append(exc)

        nursery.start_soon(publish_all)
        await wait_until(lambda: len(broker.publishes) >= WINDOW, "a window of publishes")
        await broker.ack(1)
        await wait_until(lambda: len(broker.publishes) >= WINDOW + 1, "one more publish")
        await settled()
        assert len(broker.publishes) == WINDOW + 1
        await broker.close()
        await wait_until(lambda: errors, "the waiting publisher to fail")
        assert str(errors[0]).startswith("connection to broker b1 lost: ")
        assert client.acknowledged == 1
        with pytest.raises(OperationError, match="connection to broker b1 lost"):
            await client.publish([m.Event({"n": -1})])
