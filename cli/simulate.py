"""``ges simulate``: the deterministic fault simulator and its checker, from the command line."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import attrs
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli._common import err, is_tty, load_topology, one_line_errors, out
from ges.errors import UserInputError
from ges.sim import FAULT_KINDS, Faults
from ges.sim.pool import default_jobs, run_seeds
from ges.sim.scenario import RETAINED_TOPICS

#: Seconds between progress lines on stderr when it is not a terminal (a log file, CI): a line
#: per seed would swamp the log of a thousand-seed run, none would leave it silent for minutes.
#: The first seed, every failed seed and the last seed get a line regardless.
PROGRESS_LINE_EVERY = 10.0
#: The longest --commit-ms: a commit later than a second would outlast the failure detector's
#: patience with the links, which a real log's commit does not hold up.
MAX_COMMIT_MS = 1000.0
#: The most broker crashes a second --crash-rate takes (each is down 0.1-1 s: beyond, the
#: network is mostly down and a run says little).
MAX_CRASH_RATE = 20.0
#: The simulator's own rate when --crash-rate is not given.
DEFAULT_CRASH_RATE = Faults().crash_rate


def simulate(
    topology_file: Path = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY"),
    seed: int = typer.Option(0, "--seed", help="The first seed."),
    seeds: int = typer.Option(1, "--seeds", help="How many seeds to run: SEED, SEED+1, …"),
    faults: str = typer.Option(
        "all", "--faults", help=f"all, none, or a comma list of: {', '.join(FAULT_KINDS)}."
    ),
    events: int = typer.Option(200, "--events", help="Events published per run."),
    subscribers: int = typer.Option(12, "--subscribers", help="Subscriptions per run."),
    publishers: int = typer.Option(4, "--publishers", help="Publishing clients per run."),
    churn: int = typer.Option(
        6,
        "--churn",
        help="Subscriptions made, changed, removed or remade after a crash while publishing.",
    ),
    durable: int = typer.Option(
        0,
        "--durable",
        help="Durable clients per run: sessions at the topology's replicators that go away and "
        "come back, are taken over and moved while it publishes (--roams times each), their "
        "replicators crashing with the rest.",
    ),
    roams: int = typer.Option(4, "--roams", help="Moves per durable client."),
    commit_ms: float = typer.Option(
        0.0,
        "--commit-ms",
        help="Each broker's log and session store commit a group at a time, up to this many "
        "ms after its first append, and only then acknowledge and match it (the log) or "
        "stream it (the store), as a running broker does (0: at once).",
    ),
    own: int = typer.Option(
        0,
        "--own",
        help="Times a publisher publishes and at once subscribes to everything: that "
        "subscription must get nothing its own client published before it.",
    ),
    crash_rate: float = typer.Option(
        DEFAULT_CRASH_RATE,
        "--crash-rate",
        help="Broker crashes per simulated second over the whole network while it publishes "
        f"(with the crash fault; at most {MAX_CRASH_RATE:g}).",
    ),
    retained: int = typer.Option(
        0,
        "--retained",
        help="Events published as retained messages (MQTT's RETAIN) on a few topics, some "
        "clearing theirs: at the end every replicator must keep the last of each topic.",
    ),
    no_sufficiency: bool = typer.Option(
        False,
        "--no-sufficiency",
        help="Switch off the rule that a keeper sends every event to a child whose profile it "
        "lacks — not synced since it started, or behind the event's V_m (seed 000's "
        "sufficiency test) — to see what it prevents.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object: ok, seeds, violations, published, …"
    ),
    jobs: int = typer.Option(
        1,
        "--jobs",
        "-j",
        help="Run seeds in this many worker processes (0: one per core); the outcomes are the "
        "same as one after the other.",
    ),
) -> None:
    """Run broker cores over a simulated network with seeded faults and check every delivery.

    Each seed subscribes, publishes and injects faults (dropped, duplicated, delayed and
    reordered frames; failed links; crashed brokers; partitions; silent links) while subscriptions come, change
    and go, heals, waits, and checks that
    every subscription got exactly the matching events after its starting point, in order, once
    each. Exits 1 if any seed has a violation, printing the command that replays it.

    Progress goes to stderr, also with --json: a bar on a terminal; otherwise a line for the
    first seed, each failed seed, the last seed, and one every 10 s in between.
    """
    one_line_errors(_simulate)(
        topology_file,
        seed,
        seeds,
        faults,
        events,
        subscribers,
        publishers,
        churn,
        no_sufficiency,
        as_json,
        durable,
        roams,
        jobs,
        commit_ms=commit_ms,
        own=own,
        retained=retained,
        crash_rate=crash_rate,
    )


def _simulate(
    topology_file,
    seed,
    seeds,
    faults_spec,
    events,
    subscribers,
    publishers,
    churn,
    no_sufficiency,
    as_json,
    durable=0,
    roams=4,
    jobs=1,
    *,
    commit_ms=0.0,
    own=0,
    retained=0,
    crash_rate=DEFAULT_CRASH_RATE,
) -> None:
    for name, value, low in (
        ("--seeds", seeds, 1),
        ("--events", events, 0),
        ("--subscribers", subscribers, 0),
        ("--publishers", publishers, 1),
        ("--churn", churn, 0),
        ("--durable", durable, 0),
        ("--roams", roams, 0),
        ("--jobs", jobs, 0),
        ("--own", own, 0),
        ("--retained", retained, 0),
    ):
        if value < low:
            raise UserInputError(f"{name}: must be at least {low}, not {value}")
    if seed < 0:
        raise UserInputError(f"--seed: must not be negative, not {seed}")
    if not 0 <= commit_ms <= MAX_COMMIT_MS:  # (NaN is neither)
        raise UserInputError(f"--commit-ms: must be 0 to {MAX_COMMIT_MS:g}, not {commit_ms:g}")
    if not 0 <= crash_rate <= MAX_CRASH_RATE:  # (NaN is neither)
        raise UserInputError(
            f"--crash-rate: must be 0 to {MAX_CRASH_RATE:g} a second, not {crash_rate:g}"
        )
    try:
        faults = attrs.evolve(Faults.parse(faults_spec), crash_rate=crash_rate)
    except ValueError as exc:
        raise UserInputError(f"--faults: {exc}") from None
    topology = load_topology(topology_file, show_warnings=not as_json)
    outcomes = []
    progress = Progress(
        TextColumn("simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("seeds · {task.fields[bad]} failed"),
        TimeElapsedColumn(),
        console=err,
        disable=not is_tty(),
        transient=True,
    )
    lines = None if is_tty() else _ProgressLines(seeds)
    started = time.perf_counter()
    with progress:
        task = progress.add_task("seeds", total=seeds, bad=0)
        bad = 0
        for o in run_seeds(
            topology,
            range(seed, seed + seeds),
            jobs=jobs or default_jobs(),
            faults=faults,
            events=events,
            subscribers=subscribers,
            publishers=publishers,
            churn=churn,
            sufficiency=not no_sufficiency,
            durable=durable,
            roams=roams,
            commit_ms=commit_ms,
            own=own,
            retained=retained,
        ):
            outcomes.append(o)
            bad += not o.ok
            progress.update(task, advance=1, bad=bad)
            if lines is not None:
                lines.seed_done(o)
    failed = [o for o in outcomes if not o.ok]
    extra = " --no-sufficiency" if no_sufficiency else ""
    if durable:
        extra += f" --durable {durable} --roams {roams}"
    if commit_ms:
        extra += f" --commit-ms {commit_ms:g}"
    if own:
        extra += f" --own {own}"
    if retained:
        extra += f" --retained {retained}"
    if crash_rate != DEFAULT_CRASH_RATE:
        extra += f" --crash-rate {crash_rate:g}"
    replay = {
        o.seed: o.replay(str(topology_file), faults_spec, events, subscribers, publishers, churn)
        + extra
        for o in failed
    }
    summary = {
        "ok": not failed,
        "seeds": seeds,
        "first_seed": seed,
        "failed_seeds": [o.seed for o in failed],
        "violations": sum(len(o.violations) for o in outcomes),
        "published": sum(o.published for o in outcomes),
        "delivered": sum(o.delivered for o in outcomes),
        "log_released": sum(o.released for o in outcomes),
        "log_held": sum(o.held for o in outcomes),
        "frames": sum(o.frames for o in outcomes),
        "frames_by_type": dict(
            sorted(sum((Counter(o.frame_types) for o in outcomes), Counter()).items())
        ),
        "faults": {k: sum(o.faults[k] for o in outcomes) for k in outcomes[0].faults},
        "sufficiency": not no_sufficiency,
        "durable": durable,
        "commit_ms": commit_ms,
        "unacked_at_crash": sum(o.unacked for o in outcomes),
        "groups_lost_at_crash": sum(o.lost for o in outcomes),
        "log_groups_lost_at_crash": sum(o.lost_log for o in outcomes),
        "earlier_epochs": sum(o.ended for o in outcomes),
        "earlier_epochs_held": sum(o.ended_held for o in outcomes),
        "own": own,
        "retained": retained,
        "crash_rate": crash_rate,
        "moves": sum(o.moves for o in outcomes),
        "handovers": sum(o.handovers for o in outcomes),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "examples": [
            {"seed": o.seed, "replay": replay[o.seed], "violations": list(o.violations[:5])}
            for o in failed[:10]
        ],
    }
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        _render(summary, topology, faults_spec)
    if failed:
        raise typer.Exit(1)


class _ProgressLines:
    """Progress on a stderr that is not a terminal: a line for the first seed, each failed seed,
    the last seed, and otherwise at most one every PROGRESS_LINE_EVERY seconds."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.failed = 0
        self.started = time.monotonic()
        self.last_line: float | None = None

    def seed_done(self, outcome) -> None:
        self.done += 1
        self.failed += not outcome.ok
        now = time.monotonic()
        due = self.last_line is None or now - self.last_line >= PROGRESS_LINE_EVERY
        if not (due or not outcome.ok or self.done == self.total):
            return
        self.last_line = now
        n = len(outcome.violations)
        verdict = "ok" if outcome.ok else f"FAILED ({n} violation{'' if n == 1 else 's'})"
        err.print(
            f"seed {outcome.seed} {verdict} · {self.done}/{self.total} seeds, "
            f"{self.failed} failed, {now - self.started:.1f} s",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _render(summary: dict, topology, faults_spec: str) -> None:
    table = Table(
        title=f"ges simulate {topology.name} · faults {faults_spec}", title_justify="left"
    )
    for col in ("seeds", "failed", "published", "delivered", "frames", "wall"):
        table.add_column(col, justify="right")
    table.add_row(
        str(summary["seeds"]),
        str(len(summary["failed_seeds"])),
        f"{summary['published']:,}",
        f"{summary['delivered']:,}",
        f"{summary['frames']:,}",
        f"{summary['wall_seconds']:.1f} s",
    )
    out.print(table)
    f = summary["faults"]
    out.print("faults injected: " + ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in f.items()))
    if summary["durable"]:
        out.print(
            f"durable clients: {summary['moves']:,} moves, "
            f"{summary['handovers']:,} sessions handed over between replicators"
        )
    if summary["commit_ms"]:
        out.print(
            f"group commits: up to {summary['commit_ms']:g} ms late; "
            f"{summary['unacked_at_crash']:,} events written at a crash, never acknowledged; "
            f"{summary['log_groups_lost_at_crash']:,} log groups and "
            f"{summary['groups_lost_at_crash']:,} session-store groups lost at a crash"
        )
    if summary["earlier_epochs"]:
        out.print(
            f"pubend logs: {summary['earlier_epochs']:,} earlier epochs (a broker restarted), "
            f"{summary['earlier_epochs_held']:,} of them not yet released to their end"
        )
    if summary["retained"]:
        out.print(
            f"retained messages: {summary['retained']:,} a seed on {RETAINED_TOPICS} topics; every "
            "replicator must keep the last of each"
        )
    for ex in summary["examples"]:
        out.print(f"[red]seed {ex['seed']} failed[/red]:")
        for v in ex["violations"]:
            out.print(f"  {v}", markup=False, soft_wrap=True)
        out.print(f"  replay: {ex['replay']}", markup=False, soft_wrap=True)
    if summary["ok"]:
        out.print(f"ok: {summary['seeds']} seeds, no violations")
    else:
        out.print(
            f"FAILED: {len(summary['failed_seeds'])} of {summary['seeds']} seeds had violations"
        )
