"""Reliable delivery's costs (issue 5), each beside its baseline run in the same process.

1. Throughput 1 → 1 through one broker process: ``--delivery reliable`` (the pubend logs each
   event to SQLite — WAL, group commit — before it is acknowledged and sent on), the same with
   ``--strict-log`` (an fsync per group commit), and ``--delivery best-effort``, alternating
   runs, the median of each; the ratios to best effort are the figures.
2. Simulator speed: simulated frames per wall second of ``ges simulate`` on the 512-broker
   generated topology (``topologies/generated-512.yaml``), with every fault on and with none.

``python bench/reliable.py [--quick] [--json]``. Prints a table, and with ``--json`` one JSON
object with the same figures and the ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput as tp  # noqa: E402

from ges.sim import Faults, run_seed  # noqa: E402
from ges.topology import Topology  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: the broker's flags per variant (the pubend log is SQLite in the broker's data directory)
VARIANTS = {
    "reliable": ("--delivery", "reliable"),
    "reliable, strict log": ("--delivery", "reliable", "--strict-log"),
    "best-effort": ("--delivery", "best-effort"),
}


def throughput(quick: bool) -> dict:
    n = 50_000 if quick else 300_000
    repeats = 1 if quick else 3
    args = argparse.Namespace(batch=256)
    size = tp.record_size()
    tmp = Path(tempfile.mkdtemp(prefix="ges-bench-rel-"))
    kids = tp.Children(tmp)
    runs: dict[str, list] = {d: [] for d in VARIANTS}
    try:
        for _ in range(repeats):  # alternate, so a busy neighbour hits all alike
            for name, flags in VARIANTS.items():
                runs[name].append(tp.run_throughput(kids, "ges", 1, n, args, size, flags=flags))
    finally:
        kids.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {d: tp.median_run(r) for d, r in runs.items()}
    be = out["best-effort"].get("deliveries_per_s")
    out["ratio"] = {
        d: round(out[d]["deliveries_per_s"] / be, 3)
        if be and out[d].get("deliveries_per_s")
        else None
        for d in VARIANTS
        if d != "best-effort"
    }
    return out


def simulator(quick: bool) -> dict:
    topology = Topology.from_yaml(ROOT / "topologies/generated-512.yaml")
    out = {"brokers": len(topology.brokers)}
    seeds = 1 if quick else 2
    size = (
        dict(events=50, subscribers=10, publishers=2)
        if quick
        else dict(events=200, subscribers=40, publishers=8)
    )
    out["run"] = size
    for name, faults in (("no faults", Faults.parse("none")), ("all faults", Faults())):
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    started = time.perf_counter()
    report = {"throughput_1to1": throughput(args.quick), "simulator": simulator(args.quick)}
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    console = Console(stderr=args.json, highlight=False)
    t = Table(title="reliable vs best-effort, 1 → 1 through one broker (100 B events)")
    for col in ("delivery", "deliveries/s", "lost", "publish events/s"):
        t.add_column(col, justify="right")
    tput = report["throughput_1to1"]
    for d in VARIANTS:
        f = tput[d]
        t.add_row(
            d,
            f"{f.get('deliveries_per_s', 0):,.0f}",
            str(f.get("lost")),
            f"{f.get('publish_events_per_s', 0):,.0f}",
        )
    console.print(t)
    for d, r in tput["ratio"].items():
        console.print(f"{d} ÷ best-effort: {r}")
    s = report["simulator"]
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
    console.print(t)
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    lost = any(tput[d].get("lost") for d in VARIANTS)
    return 1 if lost or not all(s[n]["ok"] for n in ("no faults", "all faults")) else 0


if __name__ == "__main__":
    sys.exit(main())
