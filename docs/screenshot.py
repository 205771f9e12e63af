"""Make docs/monitor.svg (and docs/monitor.png with librsvg's ``rsvg-convert``, Debian's
``librsvg2-bin``): ``ges monitor``'s
interactive view of the demo topology, live, 100×30.

    python docs/screenshot.py

The 20 brokers of ``topologies/demo.yaml`` run in this process on free ports (``--insecure``);
a client publishes 200 events/s at b1 to a subscriber at b20, the link b6–b14 is cut as
``ges link down`` does, and the view, with b6 selected, is saved by Textual's own screenshot.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import trio
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ges.client import connect  # noqa: E402
from ges.monitor.app import MonitorApp  # noqa: E402
from ges.monitor.live import Monitor  # noqa: E402
from ges.runtime import BrokerServer  # noqa: E402
from ges.runtime.ports import free_ports  # noqa: E402
from ges.runtime.up import wait_ready  # noqa: E402
from ges.topology import Topology  # noqa: E402
from ges.wire import messages as m  # noqa: E402


def demo() -> Topology:
    data = yaml.safe_load((ROOT / "topologies" / "demo.yaml").read_text())
    for spec, port in zip(data["brokers"].values(), free_ports(len(data["brokers"])), strict=True):
        spec["port"] = port
    return Topology.from_dict(data)


#: set by the screenshot's side once the view is up: the network then cuts b6–b14, so the cut
#: comes to the event log in the brokers' reports
CUT = threading.Event()


def run_network(topology: Topology, ready: threading.Event, stop: threading.Event) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            servers = {}
            for bid in topology.brokers:
                servers[bid] = await nursery.start(BrokerServer(topology, bid).run)
            await wait_ready(topology, timeout=60)
            b1, b20 = topology.brokers["b1"], topology.brokers["b20"]
            async with (
                connect(b20.host, b20.port, topology=topology) as sub_client,
                connect(b1.host, b1.port, topology=topology) as pub_client,
            ):
                await sub_client.subscribe([])
                ready.set()
                n = 0
                cut = False
                while not stop.is_set():
                    if CUT.is_set() and not cut:
                        cut = True
                        for at, peer in (("b6", "b14"), ("b14", "b6")):  # as ges link down does
                            spec = topology.brokers[at]
                            async with connect(spec.host, spec.port, topology=topology) as operator:
                                await operator.link(peer, up=False)
                    await pub_client.publish([m.Event({"n": n + i}) for i in range(20)])
                    n += 20
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    trio.run(main)


async def shoot(topology: Topology, out: Path) -> None:
    app = MonitorApp(Monitor(topology, refresh=0.5))
    async with app.run_test(size=(100, 30)) as pilot:
        while app.rounds < 4:
            await pilot.pause(0.1)
        CUT.set()
        while not any("cut by an operator" in e.text for e in app.model.log):
            await pilot.pause(0.1)
        while app.rounds < 10:
            await pilot.pause(0.1)
        node = app.nodes[("broker", "b6")]
        app.query_one("Tree").move_cursor(node)
        await pilot.pause(0.3)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    topology = demo()
    ready, stop = threading.Event(), threading.Event()
    network = threading.Thread(target=run_network, args=(topology, ready, stop), daemon=True)
    network.start()
    if not ready.wait(90):
        sys.exit("the demo network did not start")
    svg = ROOT / "docs" / "monitor.svg"
    try:
        asyncio.run(shoot(topology, svg))
    finally:
        stop.set()
        network.join(10)
    print(f"wrote {svg}")
    if shutil.which("rsvg-convert"):
        png = svg.with_suffix(".png")
        subprocess.run(["rsvg-convert", "-z", "1.2", "-o", str(png), str(svg)], check=True)
        print(f"wrote {png}")
    else:
        print("no rsvg-convert (apt-get install librsvg2-bin): no PNG")


if __name__ == "__main__":
    main()
