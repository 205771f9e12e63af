"""What a replicator's SQLite session store costs per persistent delivery, with and without its
memory of the events it appended last (``ges.durable.recent``).

    python bench/session_store.py [--quick] [--json] [--sessions 1,10,100]

For each number of sessions: events (100-byte payloads, an MQTT topic and QoS) are appended for
every session in groups of 20, each group written and committed as the broker's session task
does, then every session reads what is new for it and releases it, as a replicator streaming to
clients that keep up does. Timed separately: the appends (per event), the group writes (per
event), and the reads with their releases (per delivery: one event to one session). The store
without a cache (``recent_bytes=0``, every read from the file) is the baseline, measured in the
same process, interleaved, and each mode's median of three runs (one with --quick) is shown
with its ratio to the baseline. Nothing here asserts a timing; exit code 0 when every run
read back every event.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ges.runtime.session_store import RECENT_BYTES, SqliteSessionStore
from ges.wire import messages as m

GROUP = 20


def run(recent: int, sessions: int, groups: int) -> dict:
    """One run: ``groups`` groups of GROUP events, each held for every one of ``sessions``."""
    where = Path(tempfile.mkdtemp(prefix="ges-bench-store-"))
    store = SqliteSessionStore(where / "s.db", recent_bytes=recent)
    event = m.Event({"@topic": "bench/x", "@qos": 1}, b"x" * 100, time.time_ns())
    wants = [(key, [9]) for key in range(1, sessions + 1)]
    append = write = read = 0.0
    delivered = 0
    try:
        for g in range(groups):
            t0 = time.perf_counter()
            for i in range(GROUP):
                tick = g * GROUP + i + 1
                store.append("b1~bench", m.EventItem(tick, tick - 1, 0, event), wants)
            t1 = time.perf_counter()
            store.committed_to(store.write_group(store.take_group()))
            t2 = time.perf_counter()
            for key in range(1, sessions + 1):
                items = store.read(key, g * GROUP)
                delivered += len(items)
                store.release(key, items[-1].epoch)
            t3 = time.perf_counter()
            append, write, read = append + t1 - t0, write + t2 - t1, read + t3 - t2
    finally:
        store.close()
    events = groups * GROUP
    return {
        "complete": delivered == events * sessions,
        "append_us_per_event": append / events * 1e6,
        "write_us_per_event": write / events * 1e6,
        "read_us_per_delivery": read / (events * sessions) * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run per mode, fewer events")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--sessions", default="1,10,100", help="comma-separated session counts")
    args = parser.parse_args()
    try:
        counts = [int(x) for x in args.sessions.split(",")]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--sessions: positive integers separated by commas, got {args.sessions!r}")
    repeats = 1 if args.quick else 3
    modes = {"file only (baseline)": 0, "with recent cache": RECENT_BYTES}
    report: dict = {"group": GROUP, "recent_bytes": RECENT_BYTES, "results": {}}
    ok = True
    for sessions in counts:
        groups = max(10, (200 if args.quick else 1000) // sessions)
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for _ in range(repeats):
            for mode, recent in modes.items():  # interleaved
                got = run(recent, sessions, groups)
                ok = ok and got["complete"]
                runs[mode].append(got)
        medians = {
            mode: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "complete"}
            for mode, rs in runs.items()
        }
        base = medians["file only (baseline)"]
        report["results"][str(sessions)] = {
            "medians": medians,
            "ratios": {k: medians["with recent cache"][k] / base[k] for k in base},
        }
    console = Console(stderr=args.json)
    table = Table(title=f"session store per persistent delivery (groups of {GROUP}, µs)")
    for col in ("sessions", "mode", "append/event", "write/event", "read+release/delivery"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for sessions, r in report["results"].items():
        for mode, med in r["medians"].items():
            cells = [f"{med[k]:.2f}" for k in med]
            if mode != "file only (baseline)":
                cells = [f"{c} ({r['ratios'][k]:.2f}×)" for c, k in zip(cells, med, strict=True)]
            table.add_row(sessions, mode, *cells)
    console.print(table)
    console.print("Ratios: with the cache ÷ file only, same process, interleaved.")
    if args.json:
        print(json.dumps(report))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
