"""One seeded simulator run: subscribers, publishers and faults on a topology, then the verdict.

The run (all times simulated):

1. every subscription is made at time 0 (profiles over ``bucket`` 0–99, a symbol ``sym`` and
   ``n``, drawn per seed) at random brokers, and the network settles for :data:`SETTLE` s;
2. publishers at random brokers publish ``events`` events in small batches spread over
   :data:`PUBLISH_FOR` s while the faults are injected, and ``churn`` times in that window a
   client subscribes anew, changes a profile, unsubscribes, or subscribes again at a broker
   that crashed and came back (its subscriptions went with the crash);
3. every fault heals and the network is left quiet for :data:`QUIET` s, so nacks and silence can
   repair what was lost; then the checker's end-of-run checks run.
"""

from __future__ import annotations

import itertools
import random
import time

import attrs

from ges.core import BrokerConfig
from ges.matching.model import RETAIN_ATTR, TOPIC_ATTR, Conjunction, Profile, profile_to_wire
from ges.matching.syntax import parse_where
from ges.sim.checker import Checker
from ges.sim.faults import Faults
from ges.sim.invariants import replicator_problems, told_problem
from ges.sim.network import Sim
from ges.sim.roaming import Roaming
from ges.topology import Topology
from ges.wire import messages as m

SETTLE = 0.5
PUBLISH_FOR = 2.0
QUIET = 15.0
#: Seconds a durable client stays in another replicator's unit before its session is handed
#: over there (ges.core.handover), in a run.
HANDOVER_AFTER = 0.2
SYMBOLS = ("IBM", "HPQ", "MSFT", "T", "ORCL")
#: Topics the retained events of a run are published on, and the share of them that clear
#: their topic (an empty payload).
RETAINED_TOPICS = 4
CLEARS = 0.2
#: Seconds a publisher's clock (which stamps its retained events) is off by, at most.
CLOCK_SKEW = 0.5


@attrs.frozen
class Outcome:
    seed: int
    ok: bool
    violations: tuple[str, ...]
    published: int
    delivered: int
    frames: int
    sim_seconds: float
    wall_seconds: float
    faults: dict
    #: pubend log entries released (every other broker acknowledged them) and still held
    released: int = 0
    held: int = 0
    #: frames delivered, by message type name
    frame_types: dict = attrs.field(factory=dict)
    #: slices of large requests run apart from the request (with a work_slice)
    slices: int = 0
    #: durable clients' moves (away and back, taken over, redirected, a new process)
    moves: int = 0
    #: durable sessions handed over between replicators as their clients moved
    handovers: int = 0
    #: events a log had written when its broker crashed, their acknowledgements lost
    #: (``commit_ms``): the checker requires them all the same
    unacked: int = 0
    #: session stores' groups lost at a crash (``commit_ms``): what they held was never
    #: streamed nor acknowledged, and the replicator reads it back
    lost: int = 0
    #: pubend logs' groups lost at a crash (``commit_ms``): their events were never
    #: acknowledged nor sent, and the restarted pubend's new epoch never uses their ticks
    lost_log: int = 0
    #: earlier epochs of pubend logs that logged events (their brokers restarted), and those
    #: of them not released to their end when the run ended
    ended: int = 0
    ended_held: int = 0

    def replay(
        self,
        topology_path: str,
        faults: str,
        events: int,
        subscribers: int,
        publishers: int,
        churn: int,
    ) -> str:
        return (
            f"ges simulate {topology_path} --seed {self.seed} --faults {faults} "
            f"--events {events} --subscribers {subscribers} --publishers {publishers} "
            f"--churn {churn}"
        )


def _profile(rng: random.Random, i: int) -> Profile:
    kind = rng.randrange(4)
    if kind == 0:
        where = [f"bucket < {rng.randrange(5, 100)}"]
    elif kind == 1:
        where = [f"sym = {rng.choice(SYMBOLS)}"]
    elif kind == 2:
        lo = rng.randrange(0, 80)
        where = [f"bucket >= {lo}", f"bucket < {lo + rng.randrange(5, 20)}"]
    else:
        where = [f"sym = {rng.choice(SYMBOLS)}", f"bucket < {rng.randrange(20, 100)}"]
    return Profile(f"p{i}", (Conjunction(tuple(parse_where(w) for w in where)),))


def run_seed(
    topology: Topology,
    seed: int,
    *,
    faults: Faults,
    events: int = 200,
    subscribers: int = 12,
    publishers: int = 4,
    churn: int = 6,
    reliable: bool = True,
    sufficiency: bool = True,
    work_slice: int | None = None,
    config: BrokerConfig | None = None,
    durable: int = 0,
    roams: int = 4,
    commit_ms: float = 0.0,
    own: int = 0,
    retained: int = 0,
) -> Outcome:
    """One run (the module's docstring). ``commit_ms`` > 0: each log and session store
    commits a group at a time, up to that many ms after its first append, and only then is it
    acknowledged and matched, or streamed (ges.sim.commits), as in the runtime. ``own``: that
    many times a publisher publishes and, in the same instant, subscribes to everything; that
    subscription must get none of the events its own client published before it (their match
    waits for their commit; the Subscribe waits for them: ``BrokerCore.waits_for_publishes``)."""
    started = time.perf_counter()
    rng = random.Random(seed)
    checker = Checker()
    pending: dict[tuple, list[dict]] = {}
    #: live subscriptions, and those that went with their broker's crash
    subs: dict[tuple, Profile] = {}
    crashed: dict[tuple, Profile] = {}
    #: a publisher's own subscriptions: the publishes (broker, conn, seq) it sent before each,
    #: and the ticks each publish was acknowledged with
    own_before: dict[tuple, list[tuple]] = {}
    acked: dict[tuple, tuple[str, list[int]]] = {}
    #: the retained events published: their "n" -> (topic, publish time in ns, payload), and
    #: (topic, (time, pubend, tick), payload) of each acknowledged or written at a crash
    retains: dict[int, tuple[str, int, bytes]] = {}
    retained_out: list[tuple[str, tuple, bytes]] = []

    def note_retained(pubend, tick, attributes):
        got = retains.get(attributes.get("n"))
        if got is not None:
            topic, wall_ns, payload = got
            retained_out.append((topic, (wall_ns, pubend, tick), payload))

    def on_deliver(broker, conn, msg: m.Deliver, now):
        key = (broker, conn, msg.sub_id)
        checker.deliver(
            key, msg.pubend, [(it.tick, dict(it.event.attributes)) for it in msg.items], now
        )

    def on_notice(broker, notice):
        # every broker here is honest: a frame dropped as forged is a false alarm
        if notice.text.startswith("dropped a forged"):
            checker.broker_fault(sim.now, broker, notice.text)

    def on_puback(broker, conn, msg: m.PubAck, now):
        tick = msg.first_tick  # one ack may cover several publishes (ges.core.coalesce)
        for seq in range(msg.seq - msg.seqs + 1, msg.seq + 1):
            batch = pending.pop((broker, conn, seq), None)
            if batch is None:  # its broker crashed meanwhile: the ticks are not told
                break
            checker.publish(msg.pubend, tick, batch, now)
            acked[(broker, conn, seq)] = (msg.pubend, list(range(tick, tick + len(batch))))
            for i, attributes in enumerate(batch):
                note_retained(msg.pubend, tick + i, attributes)
            tick += len(batch)

    def on_unacked(broker, pubend, written, now):
        for tick, event in written:
            checker.publish(pubend, tick, [dict(event.attributes)], now)
            note_retained(pubend, tick, event.attributes)

    def on_suback(broker, conn, msg: m.SubAck, now):
        checker.subscribed((broker, conn, msg.sub_id), now, complete=msg.complete)

    broken: set[tuple[str, str]] = set()  # (each broken rule said once per broker)

    def on_step(broker, core):
        for what in replicator_problems(core):
            _broke(broker, what)

    def _broke(broker, what):
        if (broker, what) not in broken:
            broken.add((broker, what))
            checker.broker_fault(sim.now, broker, what)

    def told(broker, msg):
        store = sim.session_stores.get(broker)
        what = None if store is None else told_problem(store, msg)
        if what is not None:
            _broke(broker, what)

    def on_session(broker, conn, msg, now):
        told(broker, msg)
        roaming.on_session(broker, conn, msg, now)

    def on_send(src, dst, msg):
        if type(msg) is m.HandoverNote and msg.source == src:  # (not when relayed)
            told(src, msg)

    def on_crash(broker):
        if roaming is not None:
            roaming.on_crash(broker)
        for key in [k for k in subs if k[0] == broker]:
            checker.gone(key)
            crashed[key] = subs.pop(key)
        for key in [k for k in pending if k[0] == broker]:
            del pending[key]

    if config is None and durable:  # sessions are handed over within the run
        config = BrokerConfig(handover_after=HANDOVER_AFTER)
    sim = Sim(
        topology,
        seed=rng.randrange(2**32),
        faults=faults,
        reliable=reliable,
        sufficiency=sufficiency,
        on_deliver=on_deliver,
        on_puback=on_puback,
        on_suback=on_suback,
        on_crash=on_crash,
        on_notice=on_notice,
        work_slice=work_slice,
        config=config,
        on_session=on_session if durable and reliable else None,
        on_send=on_send if durable and reliable else None,
        commit_after=(0.0, commit_ms / 1000) if commit_ms > 0 else None,
        on_unacked=on_unacked,
        on_step=on_step if (durable or retained) and reliable else None,
        replicate=bool(retained),
    )
    roaming = None
    if durable and reliable:
        roaming = Roaming(sim, rng, checker, [_profile(rng, 500 + i) for i in range(durable)])
    brokers = sorted(topology.brokers)
    for i in range(subscribers):
        broker = rng.choice(brokers)
        key = (broker, 1000 + i, 1)
        profile = _profile(rng, i)
        subs[key] = profile
        checker.subscribe(key, profile)
        sim.client(broker, key[1], m.Subscribe(1, profile_to_wire(profile), profile.id))
    if roaming is not None:
        roaming.start()
    sim.run_until(SETTLE)

    pubs = [rng.choice(brokers) for _ in range(publishers)]
    #: per publisher, the seqs of the publishes it sent so far
    sent: dict[tuple, list[int]] = {(pubs[w], 2000 + w): [] for w in range(publishers)}
    seqs = dict.fromkeys(range(publishers), 0)
    n = 0
    while n < events:
        k = min(events - n, rng.randrange(1, 6))
        who = rng.randrange(publishers)
        when = SETTLE + rng.random() * PUBLISH_FOR
        batch = [
            {"sym": rng.choice(SYMBOLS), "bucket": rng.randrange(100), "n": n + j} for j in range(k)
        ]
        seqs[who] += 1
        sim.at(when, _publish, sim, pending, sent, pubs[who], 2000 + who, seqs[who], batch)
        n += k
    for i in range(own):
        who = rng.randrange(publishers)
        when = SETTLE + rng.random() * PUBLISH_FOR
        seqs[who] += 1
        batch = [{"sym": rng.choice(SYMBOLS), "bucket": rng.randrange(100), "n": -1 - i}]
        sim.at(when, _publish, sim, pending, sent, pubs[who], 2000 + who, seqs[who], batch)
        sim.at(when, _own, sim, checker, subs, own_before, sent, pubs[who], 2000 + who, 100 + i)
    rrng = random.Random(f"retained {seed}")  # (its own: runs without them draw as before)
    # each publisher's clock is off by up to CLOCK_SKEW s: the order the stamps give is not
    # the order the events arrive in
    skews = [rrng.uniform(-CLOCK_SKEW, CLOCK_SKEW) for _ in range(publishers)]
    for i in range(retained):
        who = rrng.randrange(publishers)
        when = SETTLE + rrng.random() * PUBLISH_FOR
        n_ = -10_000 - i
        topic = f"r/{rrng.randrange(RETAINED_TOPICS)}"
        payload = b"" if rrng.random() < CLEARS else f"v{i}".encode()
        retains[n_] = (topic, int((when + skews[who]) * 1e9) + i, payload)  # (all differ)
        attributes = {"sym": rrng.choice(SYMBOLS), "bucket": rrng.randrange(100), "n": n_}
        batch = [{**attributes, RETAIN_ATTR: 1, TOPIC_ATTR: topic}]
        seqs[who] += 1
        pub = (pubs[who], 2000 + who, seqs[who], batch, retains)
        sim.at(when, _publish, sim, pending, sent, *pub)
    conns = itertools.count(1000 + subscribers)
    for i in range(churn):
        when = SETTLE + rng.random() * PUBLISH_FOR
        sim.at(when, _churn, sim, rng, checker, subs, crashed, conns, subscribers + i)
    if roaming is not None:
        for d in roaming.clients.values():
            for _ in range(roams):
                sim.at(SETTLE + rng.random() * PUBLISH_FOR, roaming.roam, d)
    sim.schedule_faults(SETTLE, SETTLE + PUBLISH_FOR)
    end = SETTLE + PUBLISH_FOR + max(faults.down_for[1], faults.silent_for[1]) + QUIET
    sim.run_until(end)
    for key, before in own_before.items():
        for pubend, ticks in filter(None, map(acked.get, before)):
            checker.not_for(key, pubend, ticks, "its own client published it before subscribing")
    checker.finish(sim.now, start_by=SETTLE)
    _check_retained(sim, checker, retained_out)
    return Outcome(
        seed=seed,
        ok=checker.ok,
        violations=tuple(map(str, checker.violations)),
        published=sum(len(t) for t in checker.published.values()),
        delivered=checker.delivered,
        frames=sim.frames,
        sim_seconds=sim.now,
        wall_seconds=time.perf_counter() - started,
        faults=dict(sim.stats),
        released=sum(log.released() for log in sim.logs.values()),
        held=sum(len(log) for log in sim.logs.values()),
        frame_types=dict(sim.frame_types),
        slices=sim.slices,
        moves=0 if roaming is None else roaming.moves,
        handovers=0 if roaming is None else roaming.handovers,
        unacked=sim.unacked,
        lost=sim.lost_groups,
        lost_log=sim.lost_log_groups,
        ended=sum(log.epochs_ended()[0] for log in sim.logs.values()),
        ended_held=sum(log.epochs_ended()[1] for log in sim.logs.values()),
    )


def _churn(sim: Sim, rng, checker: Checker, subs: dict, crashed: dict, conns, i: int) -> None:
    """One change of the subscriptions: anew, changed, removed, or again after a crash."""
    kind = rng.choice(("subscribe", "change", "unsubscribe", "again"))
    # (a publisher's own subscriptions, made by _own, are left as they are)
    live = [k for k in sorted(subs) if k[0] in sim.cores and k[1] < 2000]
    back = [k for k in sorted(crashed) if k[0] in sim.cores]
    if kind == "again" and back:
        old = rng.choice(back)
        profile = crashed.pop(old)
        key = (old[0], next(conns), 1)
    elif kind == "change" and live:
        key = rng.choice(live)
        profile = _profile(rng, i)
    elif kind == "unsubscribe" and live:
        key = rng.choice(live)
        del subs[key]
        checker.gone(key)
        sim.client(key[0], key[1], m.Unsubscribe(key[2]))
        return
    else:
        up = sorted(sim.cores)
        if not up:
            return
        key = (rng.choice(up), next(conns), 1)
        profile = _profile(rng, i)
    subs[key] = profile
    checker.subscribe(key, profile)
    sim.client(key[0], key[1], m.Subscribe(key[2], profile_to_wire(profile), profile.id))


def _own(sim, checker, subs, own_before, sent, broker: str, conn: int, sub_id: int) -> None:
    """Publisher ``conn`` subscribes to everything, right after what it published (unless
    its broker is down)."""
    if broker not in sim.cores:
        return
    key = (broker, conn, sub_id)
    profile = Profile(f"own{sub_id}", (Conjunction((parse_where("bucket >= 0"),)),))
    subs[key] = profile
    checker.subscribe(key, profile)
    own_before[key] = [(broker, conn, seq) for seq in sent[(broker, conn)]]
    sim.client(broker, conn, m.Subscribe(sub_id, profile_to_wire(profile), profile.id))


def _publish(
    sim: Sim,
    pending: dict,
    sent: dict,
    broker: str,
    conn: int,
    seq: int,
    batch: list,
    retains: dict | None = None,
) -> None:
    pending[(broker, conn, seq)] = batch
    sent[(broker, conn)].append(seq)
    events = [
        m.Event(a) if retains is None else m.Event(a, retains[a["n"]][2], retains[a["n"]][1])
        for a in batch
    ]
    if not sim.client(broker, conn, m.Publish(seq, events)):
        pending.pop((broker, conn, seq), None)


def _check_retained(sim: Sim, checker: Checker, published: list) -> None:
    """Every replicator keeps, per topic, the last retained event published on it — last by
    (publish time, pubend, tick), ges.durable.retained — or nothing, if that one cleared it
    (an empty payload)."""
    last: dict[str, tuple[tuple, bytes]] = {}
    for topic, order, payload in published:
        if topic not in last or order > last[topic][0]:
            last[topic] = (order, payload)
    for broker, core in sorted(sim.cores.items()):
        rep = core.replicator
        if rep is None:
            continue
        for topic, (order, payload) in sorted(last.items()):
            kept = rep.retained.get(topic)
            if payload:
                ok = kept is not None and kept.event is not None and kept.order == order
            else:
                ok = kept is None or kept.event is None
            if not ok:
                has = (
                    "nothing"
                    if kept is None
                    else f"{kept.order}" + (" (cleared)" if kept.event is None else "")
                )
                want = f"{order}" + ("" if payload else " (cleared)")
                what = f"retains {has} on {topic}; the last published was {want}"
                checker.broker_fault(sim.now, broker, what)
