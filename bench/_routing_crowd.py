"""The crowd of bench/routing.py: N subscribing clients per broker in one trio process.

    python bench/_routing_crowd.py --topology FILE [--per-broker 5] [--exclude 22,10]

Connects ``--per-broker`` GES clients to every broker of the topology except ``--exclude``
(seed 004 §5: 5 clients at each of the 20 other brokers = 100), prints ``ready N`` (N clients)
on stdout, then obeys one command per line on stdin, answering each with one line on stdout:

``subscribe R``
    every client drops its subscription (all of them first, waiting for every broker's
    acknowledgement) and then subscribes with ``bucket < R``; answers ``subscribed R`` once every
    ``subscribe`` has returned (the profile reached the routing keepers).
``cell LO HI R``
    starts counting a new cell: events with ``n`` in ``[LO, HI)``, of which those with
    ``bucket < R`` match; answers ``ok``.
``counts``
    answers one JSON object: per client ``unique`` (distinct events of the cell received),
    ``duplicates``, ``unexpected`` (``n`` outside the cell), ``wrong`` (``bucket >= R``), and
    ``error``; ``idle_s`` (seconds since any client received anything) and ``cpu_seconds`` (this
    process so far).
``quit`` (or end of input)
    disconnects every client and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import trio

from ges.client import connect
from ges.errors import OperationError
from ges.matching import parse_where
from ges.topology import Topology, broker_order_key


class Member:
    """One subscribing client and what it received in the current cell."""

    def __init__(self, crowd: Crowd, name: str, client) -> None:
        self.crowd = crowd
        self.name = name
        self.client = client
        self.sub = None
        self.seen: set[int] = set()
        self.duplicates = 0
        self.unexpected = 0
        self.wrong = 0
        self.error: str | None = None

    def reset(self) -> None:
        self.seen = set()
        self.duplicates = self.unexpected = self.wrong = 0

    async def unsubscribe(self) -> None:
        if self.sub is not None:
            sub, self.sub = self.sub, None
            await self.client.unsubscribe(sub)

    async def subscribe(self, rate: int, nursery: trio.Nursery) -> None:
        self.sub = await self.client.subscribe([parse_where(f"bucket < {rate}")])
        nursery.start_soon(self.consume, self.sub)

    async def consume(self, sub) -> None:
        crowd = self.crowd
        async for batch in sub.batches():
            crowd.last_activity = time.monotonic()
            lo, hi, rate = crowd.cell
            seen = self.seen
            for d in batch:
                attrs = d.event.attributes
                n = attrs.get("n")
                if not isinstance(n, int) or not lo <= n < hi:
                    self.unexpected += 1
                elif n in seen:
                    self.duplicates += 1
                else:
                    seen.add(n)
                if attrs.get("bucket", rate) >= rate:
                    self.wrong += 1
        if sub is self.sub:  # closed by the broker, not by our unsubscribe
            self.error = self.error or "subscription closed by the broker"

    def counts(self) -> dict:
        return {
            "unique": len(self.seen),
            "duplicates": self.duplicates,
            "unexpected": self.unexpected,
            "wrong": self.wrong,
            "error": self.error,
        }


class Crowd:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.members: list[Member] = []
        self.cell = (0, 0, 0)
        self.last_activity = time.monotonic()

    async def run(self) -> None:
        args = self.args
        topology = Topology.from_yaml(args.topology)
        exclude = {b.strip() for b in args.exclude.split(",") if b.strip()}
        brokers = [b for b in sorted(topology.brokers, key=broker_order_key) if b not in exclude]
        async with trio.open_nursery() as nursery, contextlib.AsyncExitStack() as stack:
            for bid in brokers:
                spec = topology.brokers[bid]
                for i in range(args.per_broker):
                    name = f"crowd-{bid}-{i}-{os.getpid()}"
                    client = await stack.enter_async_context(
                        connect(
                            spec.host,
                            spec.port,
                            topology=topology.name,
                            client_id=name,
                            timeout=args.connect_timeout,
                        )
                    )
                    self.members.append(Member(self, name, client))
            reply(f"ready {len(self.members)}")
            stdin = trio.wrap_file(sys.stdin)
            while True:
                line = await stdin.readline()
                words = line.split()
                if not words or words[0] == "quit":
                    break
                await self.command(words, nursery)
            nursery.cancel_scope.cancel()

    async def command(self, words: list[str], nursery: trio.Nursery) -> None:
        cmd = words[0]
        if cmd == "subscribe":
            rate = int(words[1])
            for step in ("unsubscribe", "subscribe"):  # every old profile gone before any new one
                async with trio.open_nursery() as inner:
                    for member in self.members:
                        if step == "unsubscribe":
                            inner.start_soon(member.unsubscribe)
                        else:
                            inner.start_soon(member.subscribe, rate, nursery)
            reply(f"subscribed {rate}")
        elif cmd == "cell":
            self.cell = (int(words[1]), int(words[2]), int(words[3]))
            for member in self.members:
                member.reset()
            self.last_activity = time.monotonic()
            reply("ok")
        elif cmd == "counts":
            t = os.times()
            out = {
                "clients": [m.counts() for m in self.members],
                "idle_s": round(time.monotonic() - self.last_activity, 3),
                "cpu_seconds": t.user + t.system,
            }
            reply(json.dumps(out, separators=(",", ":")))
        else:
            reply(f"error unknown command {cmd!r}")


def reply(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", required=True, help="topology YAML (ports as running)")
    parser.add_argument("--per-broker", type=int, default=5)
    parser.add_argument("--exclude", default="", help="comma-separated broker ids to skip")
    parser.add_argument("--connect-timeout", type=float, default=10.0, help="per client")
    args = parser.parse_args()
    try:
        trio.run(Crowd(args).run)
    except OperationError as exc:
        sys.exit(f"crowd: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
