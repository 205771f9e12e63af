"""The baseline for bench/throughput.py: a minimal raw trio TCP relay with no GES protocol.

    python bench/_relay.py --port P [--upstream HOST:PORT]

A connection's first byte names its role: ``P`` (publisher) or ``S`` (subscriber; the relay
answers one ``K`` byte once the subscriber is registered, so a harness knows it will see
everything published afterwards). Every chunk read from a publisher, or from the upstream relay
with ``--upstream``, is copied unchanged to every subscriber: no parsing, no per-event work.
Each subscriber has a bounded chunk queue drained by a writer task that joins what is queued into
one ``send_all`` — the same queue-and-batching-writer shape as ``ges.transport.connection``, minus
frames and codecs. A full queue makes the relay wait (backpressure reaches the publisher).

Records on the wire (built by the harness, parsed by ``_subscriber.py --proto raw``) are
length-prefixed: ``u32 BE length | i64 published_at (ns) | i64 n | filler``.

Prints ``ready`` on stdout once it listens (and, with --upstream, is registered upstream);
exits when its parent process goes away.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import struct
import sys

import trio

ROLE_PUBLISHER = b"P"
ROLE_SUBSCRIBER = b"S"
REGISTERED = b"K"
#: Length prefix and the two fixed fields of a record; the rest of a record is filler.
RECORD_HEADER = struct.Struct(">Iqq")
#: The same read size and write batching as ges.transport.connection.
READ_SIZE = 1 << 18
WRITE_BATCH_BYTES = 1 << 20
MAX_QUEUED_CHUNKS = 4_096


class Relay:
    def __init__(self) -> None:
        self.subscribers: list[trio.MemorySendChannel] = []

    async def pump(self, stream: trio.abc.Stream) -> None:
        """Copy every chunk read from ``stream`` to every subscriber until EOF."""
        while True:
            try:
                chunk = await stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not chunk:
                return
            for channel in self.subscribers:
                try:
                    channel.send_nowait(chunk)
                except trio.WouldBlock:
                    await channel.send(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def serve_subscriber(self, stream: trio.abc.Stream) -> None:
        send, queue = trio.open_memory_channel[bytes](MAX_QUEUED_CHUNKS)
        self.subscribers.append(send)
        try:
            await stream.send_all(REGISTERED)
            async for first in queue:
                chunks = [first]
                size = len(first)
                while size < WRITE_BATCH_BYTES:
                    try:
                        data = queue.receive_nowait()
                    except trio.WouldBlock:
                        break
                    chunks.append(data)
                    size += len(data)
                await stream.send_all(first if len(chunks) == 1 else b"".join(chunks))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.subscribers.remove(send)
            queue.close()

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                role = await stream.receive_some(1)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if role == ROLE_PUBLISHER:
                await self.pump(stream)
            elif role == ROLE_SUBSCRIBER:
                await self.serve_subscriber(stream)


async def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        await trio.sleep(0.5)
    os._exit(0)


async def main(port: int, upstream: str | None) -> None:
    relay = Relay()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_parent, os.getppid())
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, relay.handle, listeners)
        if upstream:
            host, _, up_port = upstream.rpartition(":")
            stream = await trio.open_tcp_stream(host, int(up_port))
            await stream.send_all(ROLE_SUBSCRIBER)
            if await stream.receive_some(1) != REGISTERED:
                sys.exit(f"relay :{port}: upstream {upstream} did not register it")
            nursery.start_soon(relay.pump, stream)
        print("ready", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", help="HOST:PORT of the relay to subscribe to")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, args.port, args.upstream)
