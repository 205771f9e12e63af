"""Reliable delivery's costs (issue 5), each beside best effort measured in the same run.

    python bench/reliable.py [--quick] [--json]

The variants are broker flags: ``--delivery reliable`` (the pubend appends each event to its
SQLite log — WAL, group commit from a writer thread — before it acknowledges the publish and
sends the event on), the same with ``--strict-log`` (an fsync at every group commit), and
``--delivery best-effort``, the baseline every ratio is taken against. Each runs ``--insecure``
(plain TCP, no identities or permission checks), except ``reliable, TLS``: ``--delivery
reliable`` with ``--certs`` instead — TLS 1.3 on every client connection and (22 → 10) every
link, with certificates made for the run's topology in the temp directory; the bench's clients
present the operator's ``clients/admin``. Runs of the variants alternate, so a busy neighbour
slows all of them alike; every network start is fresh (an empty log). Events carry a 100-byte
payload.

1. **1 → 1 through one broker** (``ges broker``, own process): the publisher (this process)
   sends ``publish_nowait`` batches of 256 as fast as it can; a subscriber process counts
   events/s from its first to its last receive. Median of three runs per variant (one with
   ``--quick``).
2. **22 → 10 on seed 004's network** (``topologies/ges-paper.yaml``, ``ges up --processes``: 22
   broker processes; the route is 5 hops, 22 → 20 → 17 → 8 → 11 → 10). Per network start: a
   latency run — single events, one per Publish, at 200/s from this process at broker 22 with
   ``published_at = time.time_ns()``, received by a subscriber process at broker 10 subscribed to
   everything, ``received_at = time.time_ns()`` when its client reads the frame (one host clock);
   the first 0.5 s are warm-up — then a throughput run as in 1. Five rounds of one start per
   variant, back to back (one round with ``--quick``); latency samples are pooled per variant,
   throughput is the median run. The *added p50 per path* is reliable p50 − best-effort p50
   (aim ≤ 300 µs), from the pooled samples and as the median over rounds of each round's
   difference (which cancels the machine's drift between rounds).
3. **Latency by hop count** 1, 4 and 7 (seed 000 §5, Figure 5 "DLat"). ges-paper.yaml's diameter
   is 6, so this runs on a topology made by ``ges topology generate --levels 2 --members 2,2,4
   --chords 0 --links-per-pair 1 --redundancy 1 --seed 0`` in the temp directory (16 brokers in
   2 super-clusters × 2 clusters, diameter 7). Per hop count h, the first broker pair (in broker
   order) whose shortest path *and* event route both have h hops — content routing hands the
   events of a broker that keeps no snapshot of a unit around the subscriber to its cluster's
   keeper first (seed 004 §3.2), so a neighbour can be 3 hops away; the route is found with the
   simulator, which drives the same broker cores, and the hop count of every delivery is
   reported. The publisher (this process) publishes single events at 400/s, ``topic``
   alternating 0 and 1; a steady subscriber (this process) at the other broker wants topic 0, so
   200 events/s cross the path, and measures their latency as in 2 (first 0.5 s dropped), and
   checks it got every one of them once. Reliable and best effort, alternating network starts
   (two each in the full run), samples pooled.
4. **Delivery-start latency** (seed 000 Figure 5 "DSLat", local vs global), on the same pairs
   right after each latency run, while the publisher keeps publishing at 400/s: a new
   subscription on another client at the subscriber's broker, alternately *covered* (``topic ==
   0 and n >= 0``: the steady subscription at the same broker covers it, so no profile change
   leaves the broker and it acknowledges at once) and *uncovered* (``topic == 1``: nothing at
   that broker wanted it, so the change must reach the keepers of every unit around the broker
   and each must acknowledge it — and, with reliable delivery, say from which tick it routes with
   it — before the SubAck). Measured from just before ``Client.subscribe`` is called: to its
   return (the SubAck reached the client), and to ``received_at`` of its first delivered event.
   Also reported: when that first event was *published*, relative to the call — the wait for the
   next matching event (either profile matches 200 events/s, so 2.5 ms on average: seed 000's
   "time (5)", which it kept small the same way) plus where the starting point fell; negative
   when an event already in flight was delivered. Each subscription is unsubscribed after its
   first event; the next comes 0.1–0.3 s later. Medians, per hop count and variant.
5. **TLS against --insecure** (issue 19), from the runs of 1 and 2: ``reliable, TLS`` beside
   ``reliable``, both measured in this run — throughput TLS/--insecure (1 → 1 and 22 → 10), and
   the p50 TLS adds on 22 → 10, per path (pooled, and the median of each round's difference)
   and per hop (÷ the route's 5 hops; the path's two client legs are in it too). Aims (issue
   19): TLS costs at most 15 % of throughput and 50 µs of p50 per hop.
6. **Simulator speed**: simulated broker-to-broker frames per wall second of the deterministic
   simulator (``ges.sim``) on ``topologies/generated-512.yaml`` (512 brokers), without faults
   and with every fault on (the checker's verdict is part of the result).

Anchors, not measured here: Gryphon took 50 ms end to end over 5 hops, 44 ms of it logging
(seed 001); seed 000 measured DLat 3/6/9 ms at 1/4/7 hops, local DSLat ~17 ms and global
26.5/36/45 ms; on this machine NATS JetStream (file store, acked durable consumer) ~117,000
msgs/s and mosquitto QoS 1 with persistence ~71,000/s. Aims (issue 5): reliable ≥ 120,000
events/s 1 → 1 with nothing lost, ≥ 70 % of best effort, ≤ 300 µs added p50 per path.

Prints tables (to stderr with ``--json``, which prints one JSON object on stdout with every
figure and ratio). Also reported per run: CPU of the brokers and *other* — what processes outside
the run used meanwhile (above a quarter of a core, a warning: those figures are pessimistic).
Nothing here asserts a timing. Exit code 0 when every run completed and delivered everything
exactly once (and the simulator's checker found no violation), 1 otherwise, 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput as tp  # noqa: E402
from _reliable_hops import GENERATE, HOPS, generate, pick_pairs, run_hops  # noqa: E402
from _reliable_net import latency_summary, run_paper_path  # noqa: E402

from ges.sim import Faults, run_seed  # noqa: E402
from ges.topology import Topology  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: the broker's flags per variant (the pubend log is SQLite in the broker's data directory)
VARIANTS = {
    "reliable": ("--delivery", "reliable"),
    "reliable, TLS": ("--delivery", "reliable"),
    "reliable, strict log": ("--delivery", "reliable", "--strict-log"),
    "best-effort": ("--delivery", "best-effort"),
}
BASELINE = "best-effort"
#: the variants whose brokers and clients run TLS (``--certs``; every other runs
#: ``--insecure``), each with the --insecure variant of the same flags it is compared with
TLS = {"reliable, TLS": "reliable"}
#: hop counts and delivery starts: the strict log only adds an fsync per group commit at the
#: publisher's broker, which the 22 → 10 runs already show
HOP_VARIANTS = ("reliable", "best-effort")
PLANS = {
    "quick": {
        "events_1to1": 50_000,
        "repeats_1to1": 1,
        "path_rounds": 1,
        "path_rate": 200.0,
        "path_latency_seconds": 3.0,
        "path_warmup_seconds": 0.5,
        "path_throughput_events": 30_000,
        "hop_rounds": 1,
        "hop_rate": 400.0,
        "hop_latency_seconds": 2.5,
        "hop_warmup_seconds": 0.5,
        "start_repeats": 4,
        "sim_seeds": 1,
        "sim_size": {"events": 50, "subscribers": 10, "publishers": 2},
    },
    "full": {
        "events_1to1": 300_000,
        "repeats_1to1": 3,
        "path_rounds": 5,
        "path_rate": 200.0,
        "path_latency_seconds": 6.0,
        "path_warmup_seconds": 0.5,
        "path_throughput_events": 60_000,
        "hop_rounds": 2,
        "hop_rate": 400.0,
        "hop_latency_seconds": 6.0,
        "hop_warmup_seconds": 0.5,
        "start_repeats": 8,
        "sim_seeds": 2,
        "sim_size": {"events": 200, "subscribers": 40, "publishers": 8},
    },
}
AIMS = {
    "reliable_1to1_events_per_s_min": 120_000,
    "reliable_over_best_effort_min": 0.70,
    "added_p50_us_per_path_max": 300,
    # TLS against --insecure (issue 19)
    "tls_throughput_cost_max": 0.15,
    "tls_added_p50_us_per_hop_max": 50,
}
ANCHORS = {
    "gryphon_5_hops_ms (seed 001)": 50,
    "gryphon_5_hops_logging_ms (seed 001)": 44,
    "seed000_dlat_ms_by_hops": {"1": 3, "4": 6, "7": 9},
    "seed000_local_dslat_ms": 17,
    "seed000_global_dslat_ms_by_hops": {"1": 26.5, "4": 36, "7": 45},
    "nats_jetstream_file_acked_msgs_per_s (this machine)": 117_000,
    "mosquitto_qos1_persistent_msgs_per_s (this machine)": 71_000,
}
#: hops of the 22 → 10 route (22 → 20 → 17 → 8 → 11 → 10), should no delivery report its own
PAPER_ROUTE_HOPS = 5
#: above this share of a core used by processes outside a run, its figures are pessimistic
BUSY_NEIGHBOUR = 25.0


def _ratio(a, b, digits: int = 3) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, digits)


def _paired_added(runs: list[dict], base_runs: list[dict]) -> float | None:
    """The median over rounds of a run's p50 minus the best-effort p50 of the same round (the
    runs of a round are back to back): the machine's drift between rounds, which moves the
    pooled p50s of both by hundreds of µs on a shared 2-core host, cancels out."""
    diffs = [
        r["latency_p50_us"] - b["latency_p50_us"]
        for r, b in zip(runs, base_runs, strict=False)
        if r["latency_p50_us"] is not None and b["latency_p50_us"] is not None
    ]
    return round(statistics.median(diffs), 1) if diffs else None


def _minus(a, b) -> float | None:
    return None if a is None or b is None else round(a - b, 1)


# -- 1 → 1 through one broker --------------------------------------------------------------------


def throughput(kids: tp.Children, plan: dict, errors: list[str]) -> dict:
    n, repeats = plan["events_1to1"], plan["repeats_1to1"]
    args = argparse.Namespace(batch=256)
    size = tp.record_size()
    runs: dict[str, list] = {d: [] for d in VARIANTS}
    for _ in range(repeats):  # alternate, so a busy neighbour hits all alike
        for name, flags in VARIANTS.items():
            try:
                runs[name].append(
                    tp.run_throughput(kids, "ges", 1, n, args, size, flags=flags, tls=name in TLS)
                )
            except tp.BenchError as exc:
                errors.append(f"1→1 {name}: {exc}")
    out: dict = {"events": n, "runs_per_variant": repeats}
    for d, r in runs.items():
        out[d] = tp.median_run(r) if r else {}
        for f in r:
            if f.get("lost"):
                errors.append(f"1→1 {d}: {f['lost']} of {n} events not delivered")
            errors += [f"1→1 {d}: {e}" for e in f.get("errors", [])]
    be = out[BASELINE].get("deliveries_per_s")
    out["ratio_to_best_effort"] = {
        d: _ratio(out[d].get("deliveries_per_s"), be) for d in VARIANTS if d != BASELINE
    }
    out["tls_vs_insecure"] = {}
    for d, plain in TLS.items():
        ratio = _ratio(out[d].get("deliveries_per_s"), out[plain].get("deliveries_per_s"))
        out["tls_vs_insecure"][d] = {
            "compared_with": plain,
            "throughput_ratio": ratio,
            "throughput_cost": None if ratio is None else round(1 - ratio, 3),
            "publish_ratio": _ratio(
                out[d].get("publish_events_per_s"), out[plain].get("publish_events_per_s")
            ),
        }
    return out


# -- 22 → 10 on ges-paper.yaml -------------------------------------------------------------------


def paper_path(kids: tp.Children, plan: dict, errors: list[str]) -> dict:
    rate = plan["path_rate"]
    run_plan = dict(
        plan,
        path_latency_events=int(
            rate * (plan["path_latency_seconds"] + plan["path_warmup_seconds"])
        ),
    )
    runs: dict[str, list] = {d: [] for d in VARIANTS}
    for _ in range(plan["path_rounds"]):
        for name, flags in VARIANTS.items():
            try:
                run = run_paper_path(kids, name, flags, run_plan, tls=name in TLS)
            except tp.BenchError as exc:
                errors.append(f"22→10 {name}: {exc}")
                continue
            errors += run["errors"]
            lat = run["latency"]
            if lat["lost"]:
                errors.append(f"22→10 {name} latency run: {lat['lost']} events not delivered")
            if run["throughput"].get("lost"):
                errors.append(
                    f"22→10 {name} throughput run: {run['throughput']['lost']} of"
                    f" {plan['path_throughput_events']} events not delivered"
                )
            runs[name].append(run)
    out: dict = {
        "topology": "topologies/ges-paper.yaml",
        "publisher_broker": tp.PAPER_PUBLISHER,
        "subscriber_broker": tp.PAPER_SUBSCRIBER,
        "latency_rate_per_s": rate,
        "latency_events_per_run": run_plan["path_latency_events"],
        "throughput_events_per_run": plan["path_throughput_events"],
        "network_starts_per_variant": plan["path_rounds"],
    }
    for d, rs in runs.items():
        pooled = [s for r in rs for s in r["latency"]["samples_ns"]]
        hops: Counter = Counter()
        for r in rs:
            hops.update(r["latency"]["hops"])
        out[d] = {
            "latency": latency_summary(pooled),
            "latency_hops": dict(sorted(hops.items())),
            "latency_lost": sum(r["latency"]["lost"] for r in rs),
            "throughput": tp.median_run([r["throughput"] for r in rs]) if rs else {},
            "runs": [
                {
                    "latency_rate_per_s": r["latency"]["rate_per_s"],
                    "latency_p50_us": latency_summary(r["latency"]["samples_ns"]).get("p50_us"),
                    "latency_p99_us": latency_summary(r["latency"]["samples_ns"]).get("p99_us"),
                    "latency_lost": r["latency"]["lost"],
                    "latency_cpu_percent": r["latency"]["cpu_percent"],
                    "deliveries_per_s": r["throughput"].get("deliveries_per_s"),
                    "publish_events_per_s": r["throughput"].get("publish_events_per_s"),
                    "throughput_lost": r["throughput"].get("lost"),
                    "throughput_cpu_percent": r["throughput"].get("cpu_percent"),
                }
                for r in rs
            ],
        }
    base = out[BASELINE]
    out["vs_best_effort"] = {}
    for d in VARIANTS:
        if d == BASELINE:
            continue
        mine = out[d]
        out["vs_best_effort"][d] = {
            "throughput_ratio": _ratio(
                mine["throughput"].get("deliveries_per_s"),
                base["throughput"].get("deliveries_per_s"),
            ),
            "added_p50_us": _minus(mine["latency"].get("p50_us"), base["latency"].get("p50_us")),
            "added_p50_us_paired": _paired_added(mine["runs"], base["runs"]),
            "added_p99_us": _minus(mine["latency"].get("p99_us"), base["latency"].get("p99_us")),
            "p50_ratio": _ratio(mine["latency"].get("p50_us"), base["latency"].get("p50_us")),
            "p99_ratio": _ratio(mine["latency"].get("p99_us"), base["latency"].get("p99_us")),
        }
    out["tls_vs_insecure"] = {}
    for d, plain in TLS.items():
        mine, base = out[d], out[plain]
        ratio = _ratio(
            mine["throughput"].get("deliveries_per_s"), base["throughput"].get("deliveries_per_s")
        )
        added = _minus(mine["latency"].get("p50_us"), base["latency"].get("p50_us"))
        paired = _paired_added(mine["runs"], base["runs"])
        hops = _route_hops(mine["latency_hops"])
        out["tls_vs_insecure"][d] = {
            "compared_with": plain,
            "throughput_ratio": ratio,
            "throughput_cost": None if ratio is None else round(1 - ratio, 3),
            "added_p50_us": added,
            "added_p50_us_paired": paired,
            "added_p99_us": _minus(mine["latency"].get("p99_us"), base["latency"].get("p99_us")),
            "p50_ratio": _ratio(mine["latency"].get("p50_us"), base["latency"].get("p50_us")),
            "route_hops": hops,
            "added_p50_us_per_hop": None if added is None else round(added / hops, 1),
            "added_p50_us_per_hop_paired": None if paired is None else round(paired / hops, 1),
        }
    return out


def _route_hops(delivered_hops: dict) -> int:
    """The hop count most deliveries had (5 on 22 → 10, the route's length)."""
    if not delivered_hops:
        return PAPER_ROUTE_HOPS
    return max(1, int(max(delivered_hops.items(), key=lambda kv: kv[1])[0]))


# -- hop counts and delivery starts --------------------------------------------------------------


def hop_counts(kids: tp.Children, plan: dict, errors: list[str]) -> dict:
    data = generate(kids.tmp)
    topology = Topology.from_yaml(kids.tmp / "bench-hops.yaml")
    pairs = pick_pairs(topology)
    tp.log(
        "hop-count pairs (publisher → subscriber): "
        + ", ".join(f"{h}: {pb} → {sb}" for h, (pb, sb) in pairs.items())
    )
    runs: dict[str, list] = {d: [] for d in HOP_VARIANTS}
    for i in range(plan["hop_rounds"]):
        for name in HOP_VARIANTS:
            try:
                run = run_hops(kids, data, pairs, name, VARIANTS[name], plan, i + 1)
            except tp.BenchError as exc:
                errors.append(f"hops {name}: {exc}")
                continue
            errors += run["errors"]
            runs[name].append(run)
    out: dict = {
        "topology": {
            "generated_by": "ges topology generate " + " ".join(GENERATE),
            "brokers": len(topology.brokers),
            "links": len(topology.links),
        },
        "pairs": {str(h): {"publisher": pb, "subscriber": sb} for h, (pb, sb) in pairs.items()},
        "publish_rate_per_s": plan["hop_rate"],
        "measured_events_per_s": plan["hop_rate"] / 2,
        "latency_seconds_per_run": plan["hop_latency_seconds"],
        "new_subscriptions_per_kind_per_run": plan["start_repeats"],
        "network_starts_per_variant": plan["hop_rounds"],
        "by_hops": {},
    }
    for h in HOPS:
        row: dict = {}
        for d in HOP_VARIANTS:
            mine = [p for r in runs[d] for p in r["pairs"] if p["hops"] == h]
            delivered: Counter = Counter()
            for p in mine:
                delivered.update(p["delivered_hops"])
            row[d] = {
                "latency": latency_summary([s for p in mine for s in p["samples_ns"]]),
                "delivered_hops": dict(sorted(delivered.items())),
                "steady_missing": sum(p["steady"]["missing"] for p in mine),
                "steady_duplicates": sum(p["steady"]["duplicates"] for p in mine),
                "starts": {
                    kind: starts_summary(
                        [s for p in mine for s in p["starts"] if s["kind"] == kind]
                    )
                    for kind in ("covered", "uncovered")
                },
                "other_cpu_percent": [p["cpu_percent"].get("other") for p in mine],
            }
            st = row[d]["starts"]
            row[d]["uncovered_minus_covered_first_ms"] = _minus3(
                st["uncovered"].get("first_ms_p50"), st["covered"].get("first_ms_p50")
            )
        rel, be = row["reliable"], row[BASELINE]
        row["reliable_vs_best_effort"] = {
            "added_p50_us": _minus(rel["latency"].get("p50_us"), be["latency"].get("p50_us")),
            "p50_ratio": _ratio(rel["latency"].get("p50_us"), be["latency"].get("p50_us")),
            "p99_ratio": _ratio(rel["latency"].get("p99_us"), be["latency"].get("p99_us")),
            **{
                f"{kind}_first_ms_ratio": _ratio(
                    rel["starts"][kind].get("first_ms_p50"), be["starts"][kind].get("first_ms_p50")
                )
                for kind in ("covered", "uncovered")
            },
        }
        out["by_hops"][str(h)] = row
    return out


def starts_summary(starts: list[dict]) -> dict:
    """Medians (and the 90th percentile of the time to the first event) of new subscriptions."""
    ok = [s for s in starts if "first_ms" in s]
    out = {"attempts": len(starts), "started": len(ok)}
    if not ok:
        return out

    def med(key):
        return round(statistics.median(s[key] for s in ok), 2)

    firsts = sorted(s["first_ms"] for s in ok)
    out |= {
        "suback_ms_p50": med("suback_ms"),
        "first_ms_p50": med("first_ms"),
        "first_ms_p90": round(firsts[max(0, math.ceil(0.9 * len(firsts)) - 1)], 2),
        "first_published_ms_p50": med("start_lag_ms"),
        "first_latency_ms_p50": med("first_latency_ms"),
        "first_hops": dict(sorted(Counter(str(s["first_hops"]) for s in ok).items())),
    }
    return out


def _minus3(a, b) -> float | None:
    return None if a is None or b is None else round(a - b, 2)


# -- the simulator -------------------------------------------------------------------------------


def simulator(plan: dict) -> dict:
    topology = Topology.from_yaml(ROOT / "topologies/generated-512.yaml")
    out = {"brokers": len(topology.brokers)}
    seeds, size = plan["sim_seeds"], plan["sim_size"]
    out["run"] = size
    for name, faults in (("no faults", Faults.parse("none")), ("all faults", Faults())):
        tp.log(f"simulator: {seeds} run(s) on generated-512.yaml, {name} …")
        frames = wall = sim = 0.0
        ok = True
        for seed in range(seeds):
            started = time.perf_counter()
            o = run_seed(topology, seed, faults=faults, **size)
            wall += time.perf_counter() - started
            frames += o.frames
            sim += o.sim_seconds
            ok &= o.ok
        out[name] = {
            "runs": seeds,
            "ok": ok,
            "frames": int(frames),
            "wall_seconds": round(wall, 2),
            "frames_per_s": round(frames / wall, 1),
            "sim_seconds_per_wall_second": round(sim / wall, 2),
        }
    return out


# -- report --------------------------------------------------------------------------------------


def _n(value, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def _us(value) -> str:
    return "—" if value is None else f"{value:,.0f} µs"


def _ms(value) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.2f}"


def _x(value) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _signed_us(value) -> str:
    return "—" if value is None else f"{value:+,.0f} µs"


def warnings(report: dict) -> list[str]:
    """Parts during which processes outside the runs used more than BUSY_NEIGHBOUR % of a core."""
    found: dict[str, list[float]] = {}

    def note(part, cpu):
        other = (cpu or {}).get("other")
        if other is not None:
            found.setdefault(part, []).append(other)

    tput = report.get("throughput_1to1", {})
    for d in VARIANTS:
        note("1→1", tput.get(d, {}).get("cpu_percent"))
    path = report.get("paper_path_22_to_10", {})
    for d in VARIANTS:
        for r in path.get(d, {}).get("runs", []):
            note("22→10", r["latency_cpu_percent"])
            note("22→10", r["throughput_cpu_percent"])
    for row in report.get("hop_counts", {}).get("by_hops", {}).values():
        for d in HOP_VARIANTS:
            for other in row.get(d, {}).get("other_cpu_percent", []):
                note("hop counts", {"other": other})
    out = []
    for part, values in found.items():
        busy = [v for v in values if v > BUSY_NEIGHBOUR]
        if busy:
            out.append(
                f"{part}: other processes used more than {BUSY_NEIGHBOUR:.0f} % of a core in"
                f" {len(busy)} of {len(values)} runs (up to {max(busy):.0f} %, median"
                f" {statistics.median(values):.0f} %); those figures are pessimistic"
            )
    return out


def render(report: dict, out: Console) -> None:
    tput = report.get("throughput_1to1")
    if tput:
        t = Table(
            title=f"1 → 1 through one broker, 100 B events (median of {tput['runs_per_variant']})",
            caption="ratio = ÷ best effort (measured in this run); aims: reliable ≥ 120,000/s,"
            " ≥ 0.70 of best effort. NATS JetStream ~117,000/s, mosquitto QoS 1 ~71,000/s"
            " (issue, not measured here).",
            caption_justify="left",
        )
        for col in ("delivery", "events/s", "ratio", "lost", "publish events/s", "all runs"):
            t.add_column(col, justify="right")
        for d in VARIANTS:
            f = tput.get(d, {})
            t.add_row(
                d,
                _n(f.get("deliveries_per_s")),
                _x(tput["ratio_to_best_effort"].get(d)) if d != BASELINE else "baseline",
                _n(f.get("lost")),
                _n(f.get("publish_events_per_s")),
                " ".join(f"{(r['deliveries_per_s'] or 0) / 1e3:,.0f}k" for r in f.get("runs", [])),
            )
        out.print(t)

    path = report.get("paper_path_22_to_10")
    if path:
        t = Table(
            title="22 → 10 on ges-paper.yaml (22 broker processes, 5 hops)",
            caption=f"latency: single events at {path['latency_rate_per_s']:,.0f}/s, samples"
            f" pooled over {path['network_starts_per_variant']} network start(s) per variant;"
            " throughput: median run. added p50 = p50 − best effort's p50 (aim ≤ 300 µs per"
            " path), pooled · the median of each round's difference.\nAnchor: Gryphon 50 ms over 5 hops, 44 ms of it logging (seed 001).",
            caption_justify="left",
        )
        for col in (
            "delivery",
            "events/s",
            "÷ BE",
            "p50",
            "p99",
            "added p50",
            "p50 ÷ BE",
            "p50 first→last 10 %",
            "samples",
            "lost",
            "hops",
        ):
            t.add_column(col, justify="right")
        for d in VARIANTS:
            f = path.get(d, {})
            lat, th = f.get("latency", {}), f.get("throughput", {})
            vs = path["vs_best_effort"].get(d, {})
            t.add_row(
                d,
                _n(th.get("deliveries_per_s")),
                _x(vs.get("throughput_ratio")) if d != BASELINE else "baseline",
                _us(lat.get("p50_us")),
                _us(lat.get("p99_us")),
                (
                    f"{_signed_us(vs.get('added_p50_us'))} ·"
                    f" {_signed_us(vs.get('added_p50_us_paired'))}"
                )
                if d != BASELINE
                else "",
                _x(vs.get("p50_ratio")) if d != BASELINE else "",
                f"{_us(lat.get('p50_first_10pct_us'))} → {_us(lat.get('p50_last_10pct_us'))}",
                _n(lat.get("samples")),
                f"{_n(f.get('latency_lost'))} · {_n(th.get('lost'))}",
                " ".join(f"{k}:{v}" for k, v in f.get("latency_hops", {}).items()),
            )
        out.print(t)

    hops = report.get("hop_counts")
    if hops:
        pairs = hops["pairs"]
        t = Table(
            title="Latency by hop count and delivery start (seed 000 Figure 5), generated"
            f" {hops['topology']['brokers']}-broker topology",
            caption=f"publisher {hops['publish_rate_per_s']:,.0f} events/s, topic 0/1"
            f" alternating; latency of the {hops['measured_events_per_s']:,.0f}/s topic-0 events"
            " at a steady subscriber. New subscriptions (medians, ms from the subscribe call):"
            " SubAck = subscribe returned, 1st = first event received, pub = that event's"
            " publish time.\ncovered = topic == 0 ∧ n ≥ 0 (the steady subscription covers it);"
            " uncovered = topic == 1 (must reach every unit's keepers). Seed 000: DLat"
            " 3/6/9 ms, local DSLat ~17 ms, global 26.5/36/45 ms.",
            caption_justify="left",
        )
        for col in (
            "hops",
            "pair",
            "delivery",
            "p50",
            "p99",
            "added p50",
            "covered SubAck · 1st · pub",
            "uncovered SubAck · 1st · pub",
            "unc. − cov. 1st",
            "routed hops",
        ):
            t.add_column(col, justify="right")
        for h in HOPS:
            row = hops["by_hops"][str(h)]
            pair = pairs[str(h)]
            for d in HOP_VARIANTS:
                f = row[d]
                lat = f["latency"]
                cov, unc = f["starts"]["covered"], f["starts"]["uncovered"]
                t.add_row(
                    str(h) if d == HOP_VARIANTS[0] else "",
                    f"{pair['publisher']} → {pair['subscriber']}" if d == HOP_VARIANTS[0] else "",
                    d,
                    _us(lat.get("p50_us")),
                    _us(lat.get("p99_us")),
                    _signed_us(row["reliable_vs_best_effort"]["added_p50_us"])
                    if d == "reliable"
                    else "",
                    _starts(cov),
                    _starts(unc),
                    _ms(f["uncovered_minus_covered_first_ms"]),
                    " ".join(f"{k}:{v}" for k, v in f["delivered_hops"].items()),
                    end_section=d == HOP_VARIANTS[-1],
                )
        out.print(t)

    if report.get("tls_meets_aims"):
        out.print(render_tls(report))

    s = report.get("simulator")
    if s:
        t = Table(title=f"simulator speed, {s['brokers']} brokers (generated-512)")
        for col in ("faults", "runs", "ok", "frames", "wall", "frames/s", "sim s per wall s"):
            t.add_column(col, justify="right")
        for name in ("no faults", "all faults"):
            f = s[name]
            t.add_row(
                name,
                str(f["runs"]),
                str(f["ok"]),
                f"{f['frames']:,}",
                f"{f['wall_seconds']} s",
                f"{f['frames_per_s']:,.0f}",
                str(f["sim_seconds_per_wall_second"]),
            )
        out.print(t)
    for line in summary_lines(report):
        out.print(line, soft_wrap=True)
    for w in report["warnings"]:
        out.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)


def tls_meets_aims(report: dict) -> dict:
    """Per TLS variant and part, whether the issue's aims for TLS are met (None: no figure)."""
    out = {}
    cost_max, per_hop_max = AIMS["tls_throughput_cost_max"], AIMS["tls_added_p50_us_per_hop_max"]

    def meets(value, ok):
        return None if value is None else ok(value)

    for d in TLS:
        one = report.get("throughput_1to1", {}).get("tls_vs_insecure", {}).get(d, {})
        path = report.get("paper_path_22_to_10", {}).get("tls_vs_insecure", {}).get(d, {})
        out[d] = {
            "1to1_throughput_cost": meets(one.get("throughput_cost"), lambda v: v <= cost_max),
            "22to10_throughput_cost": meets(path.get("throughput_cost"), lambda v: v <= cost_max),
            "22to10_added_p50_us_per_hop": meets(
                path.get("added_p50_us_per_hop"), lambda v: v <= per_hop_max
            ),
        }
    return out


def render_tls(report: dict) -> Table:
    """Each TLS variant beside the --insecure variant of the same flags, from this run."""
    t = Table(
        title="TLS against --insecure (issue 19), measured in this run",
        caption="TLS: every broker started with --certs (TLS 1.3, the run's own CA; on 22 → 10"
        " every link too), the bench's clients presenting clients/admin; --insecure: plain TCP."
        "\nadded p50 = TLS p50 − --insecure p50, pooled · the median of each round's difference;"
        " per hop ÷ the route's hops (the two client legs are in it too). Aims: TLS costs ≤ 15 %"
        " of throughput, ≤ 50 µs p50 per hop.",
        caption_justify="left",
    )
    for col in ("measure", "--insecure", "TLS", "TLS ÷ --insecure", "TLS adds", "aim (TLS)"):
        t.add_column(col, justify="right" if col != "measure" else "left")
    meets = report.get("tls_meets_aims", {})

    def mark(ok):
        return "" if ok is None else (" [green]✓[/green]" if ok else " [red]✗[/red]")

    def cost(vs):
        c = vs.get("throughput_cost")
        return "—" if c is None else f"{100 * c:.0f} % cost"

    cost_aim = f"cost ≤ {100 * AIMS['tls_throughput_cost_max']:.0f} %"
    tput = report.get("throughput_1to1", {})
    path = report.get("paper_path_22_to_10", {})
    for d, plain in TLS.items():
        ok = meets.get(d, {})
        vs = tput.get("tls_vs_insecure", {}).get(d)
        if vs:
            t.add_row(
                f"1 → 1 {plain} events/s",
                _n(tput[plain].get("deliveries_per_s")),
                _n(tput[d].get("deliveries_per_s")),
                _x(vs["throughput_ratio"]),
                cost(vs),
                cost_aim + mark(ok.get("1to1_throughput_cost")),
                end_section=True,
            )
        vs = path.get("tls_vs_insecure", {}).get(d)
        if vs:
            mine, base = path[d], path[plain]
            t.add_row(
                f"22 → 10 {plain} events/s",
                _n(base["throughput"].get("deliveries_per_s")),
                _n(mine["throughput"].get("deliveries_per_s")),
                _x(vs["throughput_ratio"]),
                cost(vs),
                cost_aim + mark(ok.get("22to10_throughput_cost")),
            )
            t.add_row(
                f"22 → 10 {plain} latency p50",
                _us(base["latency"].get("p50_us")),
                _us(mine["latency"].get("p50_us")),
                _x(vs["p50_ratio"]),
                f"{_signed_us(vs['added_p50_us'])} · {_signed_us(vs['added_p50_us_paired'])}",
            )
            t.add_row(
                f"22 → 10 {plain} latency p50, per hop ({vs['route_hops']})",
                "",
                "",
                "",
                f"{_signed_us(vs['added_p50_us_per_hop'])} ·"
                f" {_signed_us(vs['added_p50_us_per_hop_paired'])}",
                f"≤ {AIMS['tls_added_p50_us_per_hop_max']} µs"
                + mark(ok.get("22to10_added_p50_us_per_hop")),
            )
            t.add_row(
                f"22 → 10 {plain} latency p99",
                _us(base["latency"].get("p99_us")),
                _us(mine["latency"].get("p99_us")),
                "",
                _signed_us(vs["added_p99_us"]),
            )
    return t


def _starts(f: dict) -> str:
    if not f.get("started"):
        return f"none of {f.get('attempts', 0)}"
    text = (
        f"{_ms(f['suback_ms_p50'])} · {_ms(f['first_ms_p50'])} · {_ms(f['first_published_ms_p50'])}"
    )
    if f["started"] < f["attempts"]:
        text += f" ({f['started']}/{f['attempts']})"
    return text


def summary_lines(report: dict) -> list[str]:
    out = []
    tput = report.get("throughput_1to1", {})
    rel = tput.get("reliable", {}).get("deliveries_per_s")
    ratio = tput.get("ratio_to_best_effort", {}).get("reliable")
    if rel is not None:
        out.append(
            f"aim 1→1: reliable {rel:,.0f} events/s (aim ≥ 120,000), {_x(ratio)} best effort"
            " (aim ≥ 0.70×)"
        )
    added = report.get("paper_path_22_to_10", {}).get("vs_best_effort", {})
    if added.get("reliable", {}).get("added_p50_us") is not None:
        parts = [
            f"{d} {_signed_us(v['added_p50_us'])} pooled,"
            f" {_signed_us(v['added_p50_us_paired'])} median of rounds"
            for d, v in added.items()
            if v["added_p50_us"] and d not in TLS  # TLS against --insecure: its own line
        ]
        out.append(f"added p50 on 22 → 10 (aim ≤ 300 µs per path): {', '.join(parts)}")
    hops = report.get("hop_counts", {}).get("by_hops", {})
    if hops:
        parts = [
            f"{h} hops {_signed_us(row['reliable_vs_best_effort']['added_p50_us'])}"
            for h, row in hops.items()
        ]
        out.append(f"added p50 by hop count (reliable − best effort): {', '.join(parts)}")
    for d, plain in TLS.items():
        one = tput.get("tls_vs_insecure", {}).get(d, {})
        path = report.get("paper_path_22_to_10", {}).get("tls_vs_insecure", {}).get(d, {})
        if one or path:
            out.append(
                f"aim TLS ({d} ÷ {plain} --insecure; cost ≤ 15 %, ≤ 50 µs p50 per hop): 1→1"
                f" {_x(one.get('throughput_ratio'))}, 22 → 10 {_x(path.get('throughput_ratio'))},"
                f" p50 {_signed_us(path.get('added_p50_us'))} per path ="
                f" {_signed_us(path.get('added_p50_us_per_hop'))} per hop"
                f" ({_signed_us(path.get('added_p50_us_per_hop_paired'))} median of rounds)"
            )
    return out


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    plan = PLANS["quick" if args.quick else "full"]
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="ges-bench-rel-"))
    kids = tp.Children(tmp)
    terminated = []

    def on_sigterm(*_):
        terminated.append(True)
        signal.raise_signal(signal.SIGINT)

    # SIGTERM becomes a KeyboardInterrupt, so every child is stopped as on Ctrl-C
    signal.signal(signal.SIGTERM, on_sigterm)
    errors: list[str] = []
    report: dict = {"bench": "reliable", "mode": "quick" if args.quick else "full"}
    try:
        report["throughput_1to1"] = throughput(kids, plan, errors)
        report["paper_path_22_to_10"] = paper_path(kids, plan, errors)
        try:
            report["hop_counts"] = hop_counts(kids, plan, errors)
        except tp.BenchError as exc:
            errors.append(f"hop counts: {exc}")
        kids.stop_all()
        report["simulator"] = simulator(plan)
    except KeyboardInterrupt:
        tp.console.print("[bold red]interrupted[/bold red]")
        return 143 if terminated else 130
    finally:
        kids.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    for name in ("no faults", "all faults"):
        if not report["simulator"][name]["ok"]:
            errors.append(f"simulator ({name}): the checker found violations")
    report["config"] = {
        "plan": plan,
        "variants": {
            d: [*f, *(("--certs", "DIR") if d in TLS else ("--insecure",))]
            for d, f in VARIANTS.items()
        },
        "tls_compared_with": TLS,
        "baseline": BASELINE,
        "payload_bytes": tp.PAYLOAD_BYTES,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    report["aims"] = AIMS
    report["tls_meets_aims"] = tls_meets_aims(report)
    report["anchors_not_measured_here"] = ANCHORS
    report["warnings"] = warnings(report)
    report["errors"] = errors
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    return tp.finish(report, errors, render, args.json)


if __name__ == "__main__":
    sys.exit(main())
