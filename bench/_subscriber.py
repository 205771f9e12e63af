"""The subscriber side of bench/throughput.py: N clients in one trio process, counting deliveries.

    python bench/_subscriber.py --proto ges|raw --port P [--clients N] [--expect E] [--latency]
                                [--certs DIR] [--ports P1,P2,…]

``--proto ges`` connects N GES clients (``ges.client.connect``) and subscribes each to
everything — over TLS with ``--certs DIR`` (the network's certificate directory: each client
checks the broker's certificate against ``DIR/ca.crt`` and presents ``DIR/clients/admin``), else
over plain TCP to an ``--insecure`` broker; ``--proto raw`` connects N subscribers to
``_relay.py`` and parses its length-prefixed records. ``--ports`` (GES): one client per port
listed, in that order, instead of ``--clients`` at ``--port``. Prints ``ready`` on stdout once every client is subscribed, then, when
every client has received ``--expect`` events (or nothing arrived for ``--idle`` seconds, or
``--timeout`` passed), one JSON object: per client the count, the first and last receive times
(time.time_ns) and the size of the first batch; with ``--latency`` also every event's
received_at − published_at in ns, in arrival order (and for GES the hop counts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import trio
from _relay import READ_SIZE, RECORD_HEADER, REGISTERED, ROLE_SUBSCRIBER

from cli._common import ADMIN, client_auth
from ges.client import connect
from ges.errors import OperationError
from ges.security.certs import CertDir

#: The client certificate presented with --certs (``ges certs init`` makes it, role operator).
TLS_CLIENT = ADMIN


class ClientStats:
    def __init__(self) -> None:
        self.count = 0
        self.first_ns: int | None = None
        self.first_n = 0
        self.last_ns: int | None = None
        self.latencies: list[int] = []
        self.hops: Counter = Counter()
        self.error: str | None = None

    def as_json(self, latency: bool) -> dict:
        out = {
            "count": self.count,
            "first_ns": self.first_ns,
            "first_n": self.first_n,
            "last_ns": self.last_ns,
            "error": self.error,
        }
        if latency:
            out["latencies_ns"] = self.latencies
            out["hops"] = {str(k): v for k, v in sorted(self.hops.items())}
        return out


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stats = [ClientStats() for _ in range(args.clients)]
        self.subscribed: set[int] = set()
        self.all_subscribed = trio.Event()
        self.finished = 0
        self.last_activity = time.monotonic()
        #: one TLS context shared by every client (None: plain TCP)
        self.tls = client_auth(CertDir(Path(args.certs))).tls if args.certs else None

    def _subscribed(self, i: int) -> None:
        self.subscribed.add(i)
        if len(self.subscribed) == self.args.clients:
            self.all_subscribed.set()

    async def ges_client(self, i: int) -> None:
        args, st = self.args, self.stats[i]
        latency, expect = args.latency, args.expect
        client_id = f"bench-sub-{os.getpid()}-{i}"
        port = args.ports[i] if args.ports else args.port
        async with connect(
            args.host, port, topology=args.topology, client_id=client_id, tls=self.tls
        ) as c:
            sub = await c.subscribe([])
            self._subscribed(i)
            async for batch in sub.batches():
                if st.first_ns is None:
                    st.first_ns = batch[0].received_at
                    st.first_n = len(batch)
                st.last_ns = batch[-1].received_at
                st.count += len(batch)
                self.last_activity = time.monotonic()
                if latency:
                    st.latencies += [d.received_at - d.event.published_at for d in batch]
                    st.hops.update(d.hops for d in batch)
                if st.count >= expect:
                    return
            st.error = "subscription closed by the broker"

    async def raw_client(self, i: int) -> None:
        args, st = self.args, self.stats[i]
        latency, expect = args.latency, args.expect
        unpack, header = RECORD_HEADER.unpack_from, RECORD_HEADER.size
        stream = await trio.open_tcp_stream(args.host, args.port)
        async with stream:
            await stream.send_all(ROLE_SUBSCRIBER)
            if await stream.receive_some(1) != REGISTERED:
                raise OperationError("relay did not register the subscriber")
            self._subscribed(i)
            buf = bytearray()
            while st.count < expect:
                data = await stream.receive_some(READ_SIZE)
                now = time.time_ns()
                if not data:
                    st.error = "closed by the relay"
                    return
                buf += data
                pos, end, n = 0, len(buf), 0
                while end - pos >= header:  # every record is at least a header
                    length, published_at, _seq = unpack(buf, pos)
                    stop = pos + 4 + length
                    if stop > end:
                        break
                    if latency:
                        st.latencies.append(now - published_at)
                    n += 1
                    pos = stop
                del buf[:pos]
                if n:
                    if st.first_ns is None:
                        st.first_ns = now
                        st.first_n = n
                    st.last_ns = now
                    st.count += n
                    self.last_activity = time.monotonic()

    async def client(self, i: int) -> None:
        try:
            if self.args.proto == "ges":
                await self.ges_client(i)
            else:
                await self.raw_client(i)
        except (OperationError, OSError, trio.BrokenResourceError, ExceptionGroup) as exc:
            self.stats[i].error = str(exc)
            self._subscribed(i)  # do not hold up the harness; the error is reported
        finally:
            self.finished += 1

    async def main(self) -> dict:
        args = self.args
        async with trio.open_nursery() as nursery:
            for i in range(args.clients):
                nursery.start_soon(self.client, i)
            with trio.fail_after(args.connect_timeout):
                await self.all_subscribed.wait()
            print("ready", flush=True)
            cpu_before = os.times()
            started = time.monotonic()
            self.last_activity = started
            while self.finished < args.clients:
                await trio.sleep(0.05)
                now = time.monotonic()
                if now - started > args.timeout:
                    break
                if any(s.count for s in self.stats) and now - self.last_activity > args.idle:
                    break
            nursery.cancel_scope.cancel()
        cpu_after = os.times()
        return {
            "proto": args.proto,
            "cpu_seconds": (cpu_after.user + cpu_after.system)
            - (cpu_before.user + cpu_before.system),
            "clients": [s.as_json(args.latency) for s in self.stats],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto", choices=("ges", "raw"), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--topology", default="", help="GES topology name for the handshake")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument(
        "--ports", default="", help="GES: one client per port of this comma-separated list"
    )
    parser.add_argument("--expect", type=int, default=0, help="events per client")
    parser.add_argument("--latency", action="store_true", help="report every event's latency")
    parser.add_argument(
        "--certs",
        default="",
        help=f"GES over TLS: the network's certificate directory (presents clients/{TLS_CLIENT})",
    )
    parser.add_argument("--idle", type=float, default=5.0, help="give up after S idle seconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after S seconds")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    args = parser.parse_args()
    args.ports = [int(p) for p in args.ports.split(",") if p]
    if args.ports:
        args.clients = len(args.ports)
    try:
        result = trio.run(Run(args).main)
    except trio.TooSlowError:
        sys.exit(f"subscriber: clients not subscribed within {args.connect_timeout:g}s")
    except KeyboardInterrupt:
        sys.exit(130)
    sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
