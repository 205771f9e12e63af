"""Many seeds on several cores: each seed is a separate deterministic run, so they can run in
worker processes and come back in seed order, the same outcomes as one after the other."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

from ges.sim.scenario import Outcome, run_seed
from ges.topology import Topology


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def seed_pool(jobs: int) -> ProcessPoolExecutor:
    """Worker processes for :func:`run_seeds`, started from a fork server where the platform
    has one (forking the caller, which may run threads, could deadlock)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["ges.sim.scenario"])
    else:
        ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)


def run_seeds(
    topology: Topology,
    seeds: Iterable[int],
    *,
    jobs: int = 1,
    pool: ProcessPoolExecutor | None = None,
    **kwargs,
) -> Iterator[Outcome]:
    """Yield :func:`run_seed`'s outcome for every seed, in the order given.

    With ``jobs`` > 1 the seeds run in that many worker processes (:func:`seed_pool`, or the
    ``pool`` given, which is left running for the next call); at most ``2 * jobs`` seeds are
    submitted ahead of the one being yielded, so a long run holds a bounded number of outcomes.
    """
    seeds = list(seeds)
    if pool is None and (jobs <= 1 or len(seeds) <= 1):
        for s in seeds:
            yield run_seed(topology, s, **kwargs)
        return
    with contextlib.ExitStack() as stack:
        if pool is None:
            pool = stack.enter_context(seed_pool(min(jobs, len(seeds))))
        ahead = 2 * max(jobs, 1)
        futures = [pool.submit(run_seed, topology, s, **kwargs) for s in seeds[:ahead]]
        nxt = len(futures)
        for i in range(len(seeds)):
            outcome = futures[i].result()
            futures[i] = None  # type: ignore[call-overload]
            if nxt < len(seeds):
                futures.append(pool.submit(run_seed, topology, seeds[nxt], **kwargs))
                nxt += 1
            yield outcome
