"""``ges subscribe`` says why its subscription ended (issue 17, finding 2: it said "broker
closed the subscription" and hid that the broker had sent a frame over the limit)."""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
import threading

import trio
import yaml

from ges.wire import encode
from ges.wire import messages as m
from tests.conftest import on_free_ports
from tests.waiting import WAIT

ONE = {"name": "one", "brokers": {"b1": {"unit": "S/c1", "port": 1}}, "links": []}


def fake_broker(
    port: int, ready: threading.Event, strike: threading.Event, stop: threading.Event
) -> None:
    """Welcomes one client and acknowledges its subscription; once ``strike`` is set, announces
    a 64 MB frame, and keeps the connection until the client closes it. Runs until ``stop``."""

    async def serve(stream):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.receive_some(65536)  # Hello
            await stream.send_all(encode(m.Welcome("b1", "1")))
            await stream.receive_some(65536)  # Subscribe
            await stream.send_all(encode(m.SubAck(1, req=1)))
            await trio.to_thread.run_sync(strike.wait, WAIT)  # the subscription is in place:
            await stream.send_all(struct.pack(">IB", 64 << 20, 4) + b"\x00" * 1000)
            while await stream.receive_some(65536):
                pass

    async def main():
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        ready.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, serve, listeners)
            await trio.to_thread.run_sync(stop.wait, WAIT + 60)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_the_reason_a_subscription_ended_is_in_the_error_line(tmp_path):
    data = on_free_ports(ONE)
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(data))
    ready, strike, stop = threading.Event(), threading.Event(), threading.Event()
    broker = threading.Thread(
        target=fake_broker,
        args=(data["brokers"]["b1"]["port"], ready, strike, stop),
        daemon=True,
    )
    broker.start()
    assert ready.wait(WAIT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "subscribe", str(path), "--broker", "b1", "--insecure"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stderr.readline()
        assert first.startswith("subscribed at b1"), first + proc.stderr.read()
        strike.set()
        _, rest = proc.communicate(timeout=60)
    finally:
        strike.set()
        if proc.poll() is None:
            proc.kill()
        stop.set()
        broker.join(WAIT)
    assert proc.returncode == 1
    last = rest.strip().splitlines()[-1]
    assert last.startswith("error: broker b1 closed the subscription after 0 events:")
    assert "exceeds the 16777216-byte limit" in last
