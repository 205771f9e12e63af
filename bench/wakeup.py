"""What one wake-up costs a Python event loop on this machine: the floor under GES's latency.

    python bench/wakeup.py [--quick] [--json] [--messages N]

A sender process writes one 100-byte message every millisecond over a TCP connection on
loopback and waits for a one-byte answer, the way a paced latency run feeds a broker. The
receiver — this process — answers each message, read and written by one of:

- ``blocking``: ``recv`` and ``send`` on a blocking socket (the baseline: no event loop);
- ``selectors``: the standard library's epoll selector, then ``recv`` and ``send``;
- ``asyncio``: ``loop.sock_recv`` / ``loop.sock_sendall``;
- ``trio socket``: ``trio.socket`` ``recv`` / ``send``;
- ``trio stream``: ``trio.SocketStream`` with a ``move_on_after`` deadline around each read —
  what ``ges.transport.Connection`` does for a read of a TLS stream;
- ``trio direct``: ``trio.lowlevel.wait_readable`` then ``os.read``, the answer by
  ``os.write`` — what it does for every read and direct write on a plain socket (GES and MQTT
  clients, links), the deadlines left to one watchdog task.

Per mode: the receiver's CPU per message (``os.times`` of this process over the run) and the
sender's round-trip p50/p99 (it stamps each message, ``time.perf_counter_ns`` in its own
process). Ratios are against ``blocking`` measured in the same run. The modes run interleaved,
twice each (once with --quick), and the median of the runs is shown.

The point: at one message per millisecond every message finds the receiver asleep, so what it
costs is a wake-up with cold caches, not the steady-state cost of a loop that is kept busy. The
README's "Latency: where the time goes" quotes this bench. Nothing here asserts a timing; exit
code 0 when every run completed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

MODES = ("blocking", "selectors", "asyncio", "trio socket", "trio stream", "trio direct")
MESSAGE = b"x" * 100


def sender(port: int, n: int) -> None:
    """The paced sender (a child process): one message per ms, each answer awaited; prints
    the round trips in ns as one JSON list."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    trips = []
    next_at = time.perf_counter()
    for _ in range(n):
        next_at += 0.001
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = time.perf_counter_ns()
        s.sendall(MESSAGE)
        if not s.recv(16):
            break
        trips.append(time.perf_counter_ns() - t)
    print(json.dumps(trips), flush=True)


def receive(mode: str, c: socket.socket, n: int) -> None:
    """Answer ``n`` messages on connection ``c`` the ``mode`` way."""
    if mode == "blocking":
        for _ in range(n):
            c.recv(65536)
            c.send(b"y")
    elif mode == "selectors":
        import selectors

        sel = selectors.DefaultSelector()
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ)
        for _ in range(n):
            sel.select()
            c.recv(65536)
            c.send(b"y")
    elif mode == "asyncio":
        import asyncio

        async def main() -> None:
            loop = asyncio.get_running_loop()
            c.setblocking(False)
            for _ in range(n):
                await loop.sock_recv(c, 65536)
                await loop.sock_sendall(c, b"y")

        asyncio.run(main())
    else:
        import trio

        async def main() -> None:
            sock = trio.socket.from_stdlib_socket(c)
            if mode == "trio direct":
                fd = sock.fileno()
                for _ in range(n):
                    await trio.lowlevel.wait_readable(fd)
                    os.read(fd, 65536)
                    os.write(fd, b"y")
                return
            if mode == "trio socket":
                for _ in range(n):
                    await sock.recv(65536)
                    await sock.send(b"y")
                return
            stream = trio.SocketStream(sock)
            for _ in range(n):
                with trio.move_on_after(30):
                    await stream.receive_some(65536)
                await stream.send_all(b"y")

        trio.run(main)


def run(mode: str, n: int) -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    child = subprocess.Popen(
        [sys.executable, __file__, "--sender", str(port), "--messages", str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    c, _ = listener.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.close()
    before = os.times()
    receive(mode, c, n)
    after = os.times()
    out, _ = child.communicate(timeout=60)
    c.close()
    trips = sorted(json.loads(out))
    cpu = (after.user + after.system) - (before.user + before.system)
    return {
        "cpu_us_per_message": round(cpu / n * 1e6, 1),
        "round_trip_p50_us": round(trips[len(trips) // 2] / 1e3, 1),
        "round_trip_p99_us": round(trips[int(len(trips) * 0.99)] / 1e3, 1),
        "messages": len(trips),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run per mode, fewer messages")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--messages", type=int, default=0, help="messages per run")
    parser.add_argument("--sender", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = args.messages or (1000 if args.quick else 3000)
    if args.sender:
        sender(args.sender, n)
        return 0
    repeats = 1 if args.quick else 2
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for mode in MODES:
            runs[mode].append(run(mode, n))
    figures = {}
    for mode, rs in runs.items():
        figures[mode] = {
            key: statistics.median(r[key] for r in rs)
            for key in ("cpu_us_per_message", "round_trip_p50_us", "round_trip_p99_us")
        }
        figures[mode]["runs"] = rs
    base = figures["blocking"]
    for mode in MODES:
        f = figures[mode]
        f["cpu_ratio"] = round(f["cpu_us_per_message"] / base["cpu_us_per_message"], 2)
        f["p50_ratio"] = round(f["round_trip_p50_us"] / base["round_trip_p50_us"], 2)
    report = {"messages_per_run": n, "repeats": repeats, "modes": figures}
    console = Console(stderr=args.json)
    table = Table(
        title=f"One wake-up per message: {n:,} messages at 1,000/s, median of {repeats}",
        caption="receiver CPU per message (this process) and the sender's round trip; "
        "ratios against blocking, measured in the same run",
    )
    for col in ("receiver", "CPU/message", "×", "round trip p50", "×", "p99"):
        table.add_column(col, justify="left" if col == "receiver" else "right")
    for mode in MODES:
        f = figures[mode]
        table.add_row(
            mode,
            f"{f['cpu_us_per_message']:,.0f} µs",
            f"{f['cpu_ratio']:.2f}",
            f"{f['round_trip_p50_us']:,.0f} µs",
            f"{f['p50_ratio']:.2f}",
            f"{f['round_trip_p99_us']:,.0f} µs",
        )
    console.print(table)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
