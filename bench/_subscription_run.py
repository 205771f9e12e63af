"""One measurement of subscribing and unsubscribing a large profile, in a process of its own.

Run by ``bench/matching.py`` (not a benchmark itself), which reads its output and stops it when a
phase runs over its time limit::

    python bench/_subscription_run.py exporter {new,old} {distinct,covering} N
    python bench/_subscription_run.py core {distinct,covering} N {gc,nogc}

The profile (``profile_wire``): ``distinct`` is N conjunctions ``sym = S<i> and price > <i>``
(i = 0 … N−1; each pins its own symbol, so none covers another); ``covering`` is ``price > -1``
followed by the first N−1 of those, which it all covers.

``exporter``: an ``Exporter`` — ``ges.routing.export`` (``new``) or the pre-issue-17 all-pairs one
in ``_baseline_export`` (``old``) — is given every conjunction (``add``), then all of them are
removed in the same order (``remove``); for the new one, ``step(WORK_SLICE)`` is called until
nothing is ``pending`` after each phase, and that work is part of the phase's time. The garbage
collector runs as usual.

``core``: a ``BrokerCore`` for b3 of ``topologies/demo.yaml`` (incarnation 1, reliable delivery),
one client open; ``client_message(Subscribe(1, profile))`` and ``work()`` while ``has_work``, then
the same for ``Unsubscribe(1)``. Each call is a slice (the first is in ``client_message``) and is
timed. With ``nogc`` the garbage collector is disabled during each timed phase (after a
``gc.collect()``), with ``gc`` it runs as usual and every pass is timed through ``gc.callbacks``.

Output: JSON lines on stdout — ``{"start": phase, "unit": …, "of": …}`` just before a phase's
clock starts (what its progress counts: conjunctions, of how many, or slices), a
``{"progress": phase, "done": k}`` line at most every half second, ``{"phase": phase, …}`` with
its figures, and ``{"end": …}`` (peak RSS, CPU seconds). Exit 1 if the state at the end of a
phase is not what it must be (then ``{"error": reason}``).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from ges.core import BrokerCore, ToClient  # noqa: E402
from ges.core.work import WORK_SLICE  # noqa: E402
from ges.matching.model import conjunction_from_wire  # noqa: E402
from ges.runtime.broker import freeze_heap  # noqa: E402
from ges.topology import Topology  # noqa: E402
from ges.wire import messages as m  # noqa: E402

SHAPES = ("distinct", "covering")
#: Seconds between two progress lines.
PROGRESS_EVERY = 0.5


def profile_wire(shape: str, n: int) -> list[list[m.Constraint]]:
    """The profile's conjunctions as a Subscribe carries them."""
    narrow = [
        [m.Constraint("sym", "eq", f"S{i}"), m.Constraint("price", "gt", float(i))]
        for i in range(n)
    ]
    if shape == "distinct":
        return narrow
    if shape == "covering":
        return [[m.Constraint("price", "gt", -1.0)], *narrow[: n - 1]]
    raise ValueError(f"unknown shape {shape!r}")


def emit(**record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def rss_mib(field: str = "VmRSS") -> float | None:
    """Resident set size now (``VmRSS``) or its peak (``VmHWM``: unlike ``ru_maxrss``, not
    inherited from the process this one was forked from), MiB (Linux /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        pass
    return None


def growth(base: float | None) -> float | None:
    now = rss_mib()
    return None if now is None or base is None else round(now - base, 1)


def fail(reason: str) -> None:
    emit(error=reason)
    sys.exit(1)


class Progress:
    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.last = time.perf_counter()

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last >= PROGRESS_EVERY:
            self.last = now
            emit(progress=self.phase, done=done)


def run_exporter(which: str, shape: str, n: int) -> None:
    if which == "new":
        from ges.routing.export import Exporter
    else:
        from _baseline_export import Exporter
    alone = shape == "alone"
    conjs = [conjunction_from_wire(w) for w in profile_wire("covering" if alone else shape, n)]
    e = Exporter()
    if alone:  # the wide conjunction leaves, the n - 1 it covers stay
        phases = [("subscribe", "add", conjs, 1), ("remove_wide", "remove", conjs[:1], n - 1)]
    else:
        phases = [("subscribe", "add", conjs, None), ("unsubscribe", "remove", conjs, 0)]
    base = rss_mib()
    for phase, method, todo, expect in phases:
        gc.collect()
        progress = Progress(phase)
        emit(start=phase, unit="conjunctions", of=len(todo))
        ops = steps = 0
        t0 = time.perf_counter()
        change = getattr(e, method)
        for i, conj in enumerate(todo):
            ops += len(change(conj))
            progress(i + 1)
        while which == "new" and e.pending:
            ops += len(e.step(WORK_SLICE))
            steps += 1
        seconds = time.perf_counter() - t0
        exported = len(e)
        if expect is not None and exported != expect:
            fail(f"{phase}: {exported} conjunctions exported, not {expect}")
        if expect is None and not 1 <= exported <= n:
            fail(f"{phase}: {exported} conjunctions exported for {n}")
        emit(
            phase=phase,
            seconds=seconds,
            ops=ops,
            steps=steps,
            exported=exported,
            rss_growth_mib=growth(base),
        )


def run_core(shape: str, n: int, collect: bool, freeze: bool = False) -> None:
    core = BrokerCore(
        Topology.from_yaml(ROOT / "topologies/demo.yaml"), "b3", incarnation=1, reliable=True
    )
    core.client_open(1, "bench")
    conn, now = 1, 1.0
    requests = {
        "subscribe": m.Subscribe(1, profile_wire(shape, n)),
        "unsubscribe": m.Unsubscribe(1),
    }
    passes: list[float] = []  # every GC pass during a timed phase, seconds
    started = [0.0]

    def on_gc(what: str, info: dict) -> None:
        if what == "start":
            started[0] = time.perf_counter()
        else:
            passes.append((time.perf_counter() - started[0], info["generation"]))

    base = rss_mib()
    for phase, msg in requests.items():
        gc.collect()
        passes.clear()
        if collect:
            gc.callbacks.append(on_gc)
        else:
            gc.disable()
        progress = Progress(phase)
        emit(start=phase, unit="slices")
        slices: list[float] = []
        # what a slice sends to clients is kept (to check it); what it sends to other brokers is
        # dropped, as a broker's driver does once it has written it
        answers: list = []
        t0 = time.perf_counter()
        out = core.client_message(conn, msg, now)
        slices.append(time.perf_counter() - t0)
        answers += [o.msg for o in out if type(o) is ToClient]
        while core.has_work:
            s0 = time.perf_counter()
            out = core.work(now)
            if freeze:  # what the trio runtime does after each slice of a large request
                freeze_heap()
            slices.append(time.perf_counter() - s0)
            answers += [o.msg for o in out if type(o) is ToClient]
            progress(len(slices))
        del out
        seconds = time.perf_counter() - t0
        if collect:
            gc.callbacks.remove(on_gc)
        else:
            gc.enable()
        errors = [r.reason for r in answers if type(r) is m.Error]
        if errors:
            fail(f"{phase}: {errors[0]}")
        answered = any(type(r) is m.SubAck for r in answers)
        subs = core.stats().subscriptions
        if subs != (1 if phase == "subscribe" else 0):
            fail(f"{phase}: the broker has {subs} subscriptions")
        if phase == "unsubscribe" and not answered:
            fail("unsubscribe: no SubAck")
        longest = max(range(len(slices)), key=slices.__getitem__)
        full = [s for s, generation in passes if generation == 2]
        emit(
            phase=phase,
            seconds=seconds,
            slices=len(slices),
            slice_max_ms=slices[longest] * 1e3,
            slice_max_index=longest,
            slice_median_ms=statistics.median(slices) * 1e3,
            slice_p90_ms=sorted(slices)[int(0.9 * (len(slices) - 1))] * 1e3,
            # a reliable broker answers a Subscribe once the keepers have acknowledged it (they
            # are not connected here): the SubAck comes from a timer later, not from a slice
            suback_in_slices=answered,
            exported=len(core.router.exporter),
            gc_passes=len(passes),
            gc_max_ms=max((s for s, _ in passes), default=0.0) * 1e3,
            gc_full_passes=len(full),
            gc_full_max_ms=max(full, default=0.0) * 1e3,
            rss_growth_mib=growth(base),
        )


def main() -> int:
    args = sys.argv[1:]
    if len(args) == 4 and args[0] == "exporter" and args[1] in ("new", "old"):
        run_exporter(args[1], args[2], int(args[3]))
    elif len(args) == 4 and args[0] == "core" and args[3] in ("gc", "nogc", "freeze"):
        run_core(args[1], int(args[2]), args[3] != "nogc", args[3] == "freeze")
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    t = os.times()
    emit(
        end=True,
        max_rss_mib=round(rss_mib("VmHWM") or 0.0, 1) or None,
        cpu_seconds=round(t.user + t.system, 3),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
