"""The floor of bench/peers.py: the least an MQTT broker written in Python can do per message.

    python bench/_mqtt_relay.py --port P --loop selectors|trio [--upstream PORT]

It speaks just enough MQTT 3.1.1 for the load generator (``_peers_load.py``) at QoS 0: CONNECT
gets a CONNACK, SUBSCRIBE a SUBACK granting QoS 0 (and makes the connection a subscriber),
PINGREQ a PINGRESP, DISCONNECT closes. Every PUBLISH read is copied, unchanged, to every
subscriber: no topic matching, no sessions, no QoS, no bounds, no logging — the packets of one
read are joined into one write per subscriber. ``--upstream PORT``: it also subscribes to ``#``
at the relay on PORT and copies what that sends it (the two-broker latency row).

Two event loops run the same work:

- ``selectors``: one thread, ``selectors.EpollSelector``, blocking sends (a full subscriber
  socket holds the relay: backpressure, as the brokers have). The floor of Python itself.
- ``trio``: a task per connection on trio, as GES's runtime uses it: trio waits for a socket
  to be readable (or writable), and the socket is read and written directly. The floor of
  the runtime GES is built on.

What GES (MQTT) spends above the trio row is GES's own work per message; what the rows spend
above mosquitto is the interpreter's and the loop's.
"""

from __future__ import annotations

import argparse
import contextlib
import selectors
import socket

CONNACK = b"\x20\x02\x00\x00"
PINGRESP = b"\xd0\x00"
CONNECT, PUBLISH, SUBSCRIBE, PINGREQ, DISCONNECT = 1, 3, 8, 12, 14
READ_BYTES = 65536


def connect_packet(client_id: bytes) -> bytes:
    body = b"\x00\x04MQTT\x04\x02\x00\x00" + len(client_id).to_bytes(2, "big") + client_id
    return bytes([CONNECT << 4, len(body)]) + body


#: SUBSCRIBE packet id 1, filter "#", QoS 0
SUBSCRIBE_ALL = b"\x82\x06\x00\x01\x00\x01#\x00"


class Reader:
    """Whole packets out of a byte stream: ``feed(data)`` returns ``(publishes, answers,
    subscribe, closed)`` — the PUBLISH packets joined, the bytes to answer this connection,
    whether it subscribed, whether it sent DISCONNECT."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> tuple[bytes, bytes, bool, bool]:
        buf = self.buf
        buf += data
        publishes, answers = bytearray(), bytearray()
        subscribed = closed = False
        start, end = 0, len(buf)
        while end - start >= 2:
            size, mult, i = 0, 1, start + 1
            while i < end:
                byte = buf[i]
                size += (byte & 127) * mult
                mult <<= 7
                i += 1
                if not byte & 128:
                    break
            else:
                break  # the length is not all here yet
            if end < i + size:
                break
            kind = buf[start] >> 4
            if kind == PUBLISH:
                publishes += buf[start : i + size]
            elif kind == CONNECT:
                answers += CONNACK
            elif kind == SUBSCRIBE:
                answers += b"\x90\x03" + buf[i : i + 2] + b"\x00"
                subscribed = True
            elif kind == PINGREQ:
                answers += PINGRESP
            elif kind == DISCONNECT:
                closed = True
            start = i + size
        del buf[:start]
        return bytes(publishes), bytes(answers), subscribed, closed


def nodelay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# -- selectors ---------------------------------------------------------------------------------


def run_selectors(port: int, upstream: int | None) -> None:
    sel = selectors.EpollSelector()
    listener = socket.create_server(("127.0.0.1", port))
    sel.register(listener, selectors.EVENT_READ)
    readers: dict[socket.socket, Reader] = {}
    subscribers: list[socket.socket] = []
    if upstream is not None:
        up = socket.create_connection(("127.0.0.1", upstream))
        nodelay(up)
        up.sendall(connect_packet(b"relay-upstream") + SUBSCRIBE_ALL)
        readers[up] = Reader()
        sel.register(up, selectors.EVENT_READ)

    def drop(sock: socket.socket) -> None:
        sel.unregister(sock)
        readers.pop(sock, None)
        if sock in subscribers:
            subscribers.remove(sock)
        sock.close()

    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                nodelay(conn)
                readers[conn] = Reader()
                sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(READ_BYTES)
            except OSError:
                data = b""
            if not data:
                drop(sock)
                continue
            publishes, answers, subscribed, closed = readers[sock].feed(data)
            if subscribed and sock not in subscribers:
                subscribers.append(sock)
            sends = (
                [(sock, answers)] if answers and not (upstream is not None and sock is up) else []
            )
            sends += [(sub, publishes) for sub in subscribers] if publishes else []
            for target, data in sends:
                try:  # noqa: SIM105
                    target.sendall(data)
                except OSError:  # gone: its own read sees the end
                    pass
            if closed:
                drop(sock)


# -- trio --------------------------------------------------------------------------------------


def run_trio(port: int, upstream: int | None) -> None:
    """A task per connection on trio, used the way GES's runtime uses it
    (ges.transport.connection): trio waits until a socket is readable (or writable, when a
    write did not all go), and the socket is read and written directly — no
    ``SocketStream``, whose every read and write is a turn of the scheduler besides."""
    import trio

    listener = socket.create_server(("127.0.0.1", port))
    listener.setblocking(False)
    subscribers: list[socket.socket] = []
    #: sockets a write waits on (full), and what the next writer to them waits for: one
    #: writer at a time per socket, and no turn of the scheduler when the kernel takes it all
    writing: dict[socket.socket, trio.Event] = {}

    async def send(sock: socket.socket, data: bytes) -> None:
        while sock in writing:
            await writing[sock].wait()
        view = memoryview(data)
        # no context manager on the path of every message: the floor stays a floor
        try:  # noqa: SIM105
            view = view[sock.send(view) :]
        except BlockingIOError:
            pass
        if not view:
            return
        writing[sock] = done = trio.Event()
        try:
            while view:
                await trio.lowlevel.wait_writable(sock)
                with contextlib.suppress(BlockingIOError):
                    view = view[sock.send(view) :]
        finally:
            del writing[sock]
            done.set()

    async def serve(sock: socket.socket, answer: bool = True) -> None:
        sock.setblocking(False)
        nodelay(sock)
        reader = Reader()
        try:
            while True:
                await trio.lowlevel.wait_readable(sock)
                data = sock.recv(READ_BYTES)
                if not data:
                    break
                publishes, answers, subscribed, closed = reader.feed(data)
                if answers and answer:
                    await send(sock, answers)
                if subscribed and sock not in subscribers:
                    subscribers.append(sock)
                for sub in list(subscribers) if publishes else ():
                    try:  # noqa: SIM105
                        await send(sub, publishes)
                    except (OSError, trio.ClosedResourceError):  # gone
                        pass
                if closed:
                    break
        except (OSError, trio.ClosedResourceError):
            pass
        finally:
            if sock in subscribers:
                subscribers.remove(sock)
            trio.lowlevel.notify_closing(sock)  # a write waiting on it ends
            sock.close()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if upstream is not None:
                up = socket.create_connection(("127.0.0.1", upstream))
                up.sendall(connect_packet(b"relay-upstream") + SUBSCRIBE_ALL)
                nursery.start_soon(serve, up, False)
            while True:
                await trio.lowlevel.wait_readable(listener)
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                nursery.start_soon(serve, conn)

    trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loop", choices=("selectors", "trio"), required=True)
    parser.add_argument("--upstream", type=int, default=None)
    args = parser.parse_args()
    run = run_selectors if args.loop == "selectors" else run_trio
    with contextlib.suppress(KeyboardInterrupt):
        run(args.port, args.upstream)


if __name__ == "__main__":
    main()
