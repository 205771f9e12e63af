"""Helpers of bench/reliable.py: latency by hop count and delivery-start latency (seed 000 §5,
Figure 5) on a generated topology under ``ges up --processes``.

Not a benchmark itself; ``bench/reliable.py`` drives it. Every client runs in the bench process,
so publish and receive times come from one clock.
"""

from __future__ import annotations

import collections
import random
import subprocess
import time
from collections import Counter

import trio
import yaml
from _reliable_net import Network
from throughput import GES, ROOT, BenchError, CpuWindow, log, paced

from ges.client import connect
from ges.errors import OperationError
from ges.matching import parse_where
from ges.matching.model import Conjunction, conjunction_to_wire
from ges.sim import Faults, Sim
from ges.topology import Topology, broker_order_key
from ges.wire import messages as m

#: The hop counts of seed 000's Figure 5.
HOPS = (1, 4, 7)
#: ``ges topology generate`` arguments of the hop-count network: two super-clusters of two
#: clusters of four brokers, clusters plain rings (no chords), one link between joined units:
#: 16 brokers, 19 links, diameter 7 (seed 004's network, ges-paper.yaml, has diameter 6).
GENERATE = [
    "--levels", "2", "--members", "2,2,4", "--chords", "0", "--links-per-pair", "1",
    "--redundancy", "1", "--seed", "0", "--name", "bench-hops",
]  # fmt: skip
#: Events carry ``topic`` = n % 2. The steady subscriber (the latency sampler) and every covered
#: new subscription want topic 0; an uncovered one wants topic 1, which nothing at the
#: subscriber's broker wanted before, so it must reach the keepers of every unit.
STEADY = [parse_where("topic == 0")]
COVERED = [parse_where("topic == 0"), parse_where("n >= 0")]  # covered by STEADY
UNCOVERED = [parse_where("topic == 1")]
#: Seconds a new subscription may wait for its first event before the attempt counts as failed.
START_TIMEOUT = 5.0
#: Seconds without a delivery to the steady subscriber, after the last publish, before the run
#: stops waiting for missing events.
IDLE_TIMEOUT = 5.0


def generate(tmp) -> dict:
    """The hop-count topology, written by ``ges topology generate`` into the bench's temp dir."""
    path = tmp / "bench-hops.yaml"
    cmd = [*GES, "topology", "generate", *GENERATE, "-o", path]
    done = subprocess.run(
        [str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"ges topology generate failed: {done.stderr.strip()}")
    return yaml.safe_load(path.read_text())


def pick_pairs(topology: Topology) -> dict[int, tuple[str, str]]:
    """Per hop count h, the first (publisher's broker, subscriber's broker) pair in broker order
    whose shortest path has exactly h hops and whose event route does too.

    Content routing does not always take a shortest path: a broker that keeps no snapshot of a
    unit around the subscriber hands its events to its cluster's keeper first (seed 004 §3.2),
    so b → its neighbour can cost 3 hops. The route is found with the simulator, which drives
    the same broker cores as ``ges up`` (``ges.sim.Sim``, no faults): one subscription at the
    subscriber's broker, one event from the publisher's.
    """
    order = sorted(topology.brokers, key=broker_order_key)
    dist = {b: _distances(topology, b) for b in order}
    out = {}
    for h in HOPS:
        for pb in order:
            found = next(
                (sb for sb in order if dist[pb].get(sb) == h and route_hops(topology, pb, sb) == h),
                None,
            )
            if found is not None:
                out[h] = (pb, found)
                break
        else:
            raise BenchError(f"{topology.name}: no two brokers whose event route has {h} hops")
    return out


def route_hops(topology: Topology, publisher: str, subscriber: str) -> int | None:
    """Hops of an event from ``publisher``'s broker to a STEADY subscription at
    ``subscriber``'s, in the simulator (None if it is not delivered)."""
    hops: list[int] = []

    def on_deliver(_broker, _conn, msg, _now):
        hops.extend(it.hops for it in msg.items)

    sim = Sim(topology, seed=0, faults=Faults.parse("none"), reliable=False, on_deliver=on_deliver)
    sim.client(subscriber, 1, m.Subscribe(1, [conjunction_to_wire(Conjunction(STEADY))], ""))
    sim.run_until(1.0)
    sim.client(publisher, 2, m.Publish(1, [m.Event({"n": 0, "topic": 0}, b"", 0)]))
    sim.run_until(2.0)
    return hops[0] if len(hops) == 1 else None


def _distances(topology: Topology, src: str) -> dict[str, int]:
    dist = {src: 0}
    frontier = collections.deque([src])
    while frontier:
        node = frontier.popleft()
        for peer in topology.neighbours[node]:
            if peer not in dist:
                dist[peer] = dist[node] + 1
                frontier.append(peer)
    return dist


class HopRun:
    """One network start: per hop count, the latency phase and then the delivery-start phase,
    each pair with its own clients (publisher, steady subscriber, new subscriptions)."""

    def __init__(self, net: Network, pairs: dict[int, tuple[str, str]], plan: dict):
        self.net = net
        self.pairs = pairs
        self.plan = plan
        self.rng = random.Random(5)
        self.next_n = 0
        self.counts: Counter = Counter()  # n -> deliveries to the steady subscriber
        self.expected: set[int] = set()  # topic-0 events published
        self.sampling: tuple[int, int] | None = None  # n range whose latencies are kept
        self.samples: list[int] = []
        self.sample_hops: Counter = Counter()
        self.unexpected = 0
        self.last_delivery = time.monotonic()

    async def run(self) -> dict:
        out = {"pairs": [], "errors": []}
        for h, (pb, sb) in self.pairs.items():
            pair = {"hops": h, "publisher": pb, "subscriber": sb}
            self.counts, self.expected, self.unexpected = Counter(), set(), 0
            cpu = CpuWindow({"broker": self.net.pids})
            async with trio.open_nursery() as nursery:
                pub = await nursery.start(self._hold, pb, f"bench-hops-pub-{h}")
                steady_client = await nursery.start(self._hold, sb, f"bench-hops-steady-{h}")
                dyn = await nursery.start(self._hold, sb, f"bench-hops-new-{h}")
                steady = await steady_client.subscribe(STEADY)
                nursery.start_soon(self._consume, steady)
                pair |= await self._latency_phase(pub)
                pair["starts"] = await self._start_phase(pub, dyn)
                self.last_delivery = time.monotonic()
                await self._wait_for(self.next_n)
                nursery.cancel_scope.cancel()
            pair["cpu_percent"] = cpu.finish()
            pair["steady"] = self._steady(out["errors"], f"{self.net.label}: {h} hop(s)")
            out["pairs"].append(pair)
            log(
                f"{self.net.label}: {h} hop(s) {pb} → {sb}: {len(pair['samples_ns'])} latency"
                f" samples, {sum(1 for s in pair['starts'] if 'first_ms' in s)}"
                f"/{len(pair['starts'])} new subscriptions started"
            )
            for s in [s for s in pair["starts"] if "error" in s][:3]:
                out["errors"].append(f"{self.net.label}: {h} hop(s): {s['error']}")
        out["errors"] += self.net.alive()
        return out

    def _steady(self, errors: list[str], label: str) -> dict:
        """Exactly once: every topic-0 event published during the pair's run, nothing else."""
        got = set(self.counts)
        missing = len(self.expected - got)
        dups = sum(c - 1 for c in self.counts.values() if c > 1)
        extra = len(got - self.expected) + self.unexpected
        if missing:
            errors.append(
                f"{label}: the steady subscriber missed {missing} of {len(self.expected)} events"
            )
        if dups:
            errors.append(f"{label}: {dups} duplicate deliveries to the steady subscriber")
        if extra:
            errors.append(f"{label}: {extra} events the steady subscriber did not subscribe to")
        return {
            "expected": len(self.expected),
            "received": len(self.expected & got),
            "missing": missing,
            "duplicates": dups,
            "unexpected": extra,
        }

    async def _hold(self, broker: str, client_id: str, task_status=trio.TASK_STATUS_IGNORED):
        spec = self.net.topology.brokers[broker]
        async with connect(
            spec.host, spec.port, topology=self.net.topology.name, client_id=client_id
        ) as c:
            task_status.started(c)
            await trio.sleep_forever()

    async def _consume(self, sub) -> None:
        async for batch in sub.batches():
            self.last_delivery = time.monotonic()
            rng = self.sampling
            for d in batch:
                attrs = d.event.attributes
                n = attrs.get("n")
                if not isinstance(n, int) or attrs.get("topic") != 0:
                    self.unexpected += 1
                    continue
                self.counts[n] += 1
                if rng is not None and rng[0] <= n < rng[1] and self.counts[n] == 1:
                    self.samples.append(d.received_at - d.event.published_at)
                    self.sample_hops[d.hops] += 1

    async def _publish(self, pub, count: int) -> float:
        """``count`` single events at the plan's rate, topic alternating 0, 1."""
        payload = b"x" * 100
        event = m.Event
        expected = self.expected

        async def send_one(_i: int) -> None:
            n = self.next_n
            self.next_n += 1
            topic = n % 2
            # shielded: a publish cut short by the end of a phase would count as lost
            with trio.CancelScope(shield=True):
                await pub.publish_nowait([event({"n": n, "topic": topic}, payload, time.time_ns())])
            if topic == 0:
                expected.add(n)

        elapsed = await paced(send_one, self.plan["hop_rate"], count)
        await pub.flush()
        return elapsed

    async def _latency_phase(self, pub) -> dict:
        rate = self.plan["hop_rate"]
        warm = int(rate * self.plan["hop_warmup_seconds"])
        count = warm + int(rate * self.plan["hop_latency_seconds"])
        self.samples, self.sample_hops = [], Counter()
        self.sampling = (self.next_n + warm, self.next_n + count)
        elapsed = await self._publish(pub, count)
        await self._wait_for(self.sampling[1])
        self.sampling = None
        return {
            "published": count,
            "warmup_events_dropped": warm,
            "rate_per_s": round((count - 1) / elapsed, 1) if elapsed > 0 else None,
            "samples_ns": self.samples,
            "delivered_hops": {str(k): v for k, v in sorted(self.sample_hops.items())},
        }

    async def _wait_for(self, upto: int) -> None:
        """Until the steady subscriber has every topic-0 event below ``upto`` (or is idle)."""
        while any(n not in self.counts for n in self.expected if n < upto):
            if time.monotonic() - self.last_delivery > IDLE_TIMEOUT:
                return
            await trio.sleep(0.02)

    async def _start_phase(self, pub, dyn) -> list[dict]:
        """New subscriptions at the subscriber's broker while the publisher publishes at the
        plan's rate: covered and uncovered alternately, each unsubscribed after its first
        event, with a random pause between (so each lands at a random point of the stream)."""
        reps = self.plan["start_repeats"]
        starts = []
        async with trio.open_nursery() as nursery:
            publishing = trio.CancelScope()

            async def publish_until_cancelled():
                with publishing:
                    await self._publish(pub, 10**9)

            nursery.start_soon(publish_until_cancelled)
            await trio.sleep(0.3)
            for i in range(2 * reps):
                kind = "covered" if i % 2 == 0 else "uncovered"
                starts.append(await self._one_start(dyn, kind))
                await trio.sleep(self.rng.uniform(0.1, 0.3))
            publishing.cancel()
        self.last_delivery = time.monotonic()
        await self._wait_for(self.next_n)
        return starts

    async def _one_start(self, dyn, kind: str) -> dict:
        profile = COVERED if kind == "covered" else UNCOVERED
        out: dict = {"kind": kind}
        t0 = time.time_ns()
        try:
            sub = await dyn.subscribe(profile)
        except OperationError as exc:
            return out | {"error": f"{kind} subscribe failed: {exc}"}
        out["suback_ms"] = round((time.time_ns() - t0) / 1e6, 3)
        first = None
        with trio.move_on_after(START_TIMEOUT):
            first = await sub.__anext__()
        if first is None:
            out["error"] = f"{kind} subscription: no event within {START_TIMEOUT:g} s"
        else:
            out["first_ms"] = round((first.received_at - t0) / 1e6, 3)
            # when the first delivered event was published, relative to the subscribe call: the
            # wait for a matching event plus where the starting point fell
            out["start_lag_ms"] = round((first.event.published_at - t0) / 1e6, 3)
            out["first_latency_ms"] = round((first.received_at - first.event.published_at) / 1e6, 3)
            out["first_hops"] = first.hops
        await dyn.unsubscribe(sub)
        return out


def run_hops(
    kids,
    data: dict,
    pairs: dict[int, tuple[str, str]],
    variant: str,
    flags: tuple[str, ...],
    plan: dict,
    round_no: int,
) -> dict:
    label = f"hops {variant} #{round_no}"
    log(f"{label}: starting ges up --processes on {data['name']} …")
    net = Network(kids, data, label, flags)
    try:
        run = HopRun(net, pairs, plan)
        try:
            out = trio.run(run.run)
        except (OperationError, trio.TooSlowError) as exc:
            raise BenchError(f"{label}: {exc}") from None
        except BaseExceptionGroup as group:
            leaves = _leaves(group)
            if any(isinstance(e, KeyboardInterrupt) for e in leaves):
                raise KeyboardInterrupt from None
            known = [e for e in leaves if isinstance(e, OperationError | trio.TooSlowError)]
            if not known:
                raise
            raise BenchError(f"{label}: {'; '.join(map(str, known))}") from None
    finally:
        kids.stop(net.child)
    out["variant"] = variant
    return out


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]
