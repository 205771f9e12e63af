"""``ges subscribe`` says why its subscription ended (issue 17, finding 2: it said "broker
closed the subscription" and hid that the broker had sent a frame over the limit)."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading

import trio
import yaml

from ges.wire import encode
from ges.wire import messages as m
from tests.conftest import on_free_ports

ONE = {"name": "one", "brokers": {"b1": {"unit": "S/c1", "port": 1}}, "links": []}


def fake_broker(port: int, ready: threading.Event) -> None:
    """Welcomes one client, acknowledges its subscription, then announces a 64 MB frame."""

    async def serve(stream):
        await stream.receive_some(65536)  # Hello
        await stream.send_all(encode(m.Welcome("b1", "1")))
        await stream.receive_some(65536)  # Subscribe
        await stream.send_all(encode(m.SubAck(1, req=1)))
        await trio.sleep(0.5)  # the subscription is in place, and then:
        await stream.send_all(struct.pack(">IB", 64 << 20, 4) + b"\x00" * 1000)
        await trio.sleep(5)

    async def main():
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        ready.set()
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, serve, listeners)
            await trio.sleep(20)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_the_reason_a_subscription_ended_is_in_the_error_line(tmp_path):
    data = on_free_ports(ONE)
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(data))
    ready = threading.Event()
    threading.Thread(
        target=fake_broker, args=(data["brokers"]["b1"]["port"], ready), daemon=True
    ).start()
    assert ready.wait(10)
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "subscribe", str(path), "--broker", "b1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: broker b1 closed the subscription after 0 events:")
    assert "exceeds the 16777216-byte limit" in last
