"""Large work in slices: no single request holds a broker for more than a moment.

A subscription of thousands of conjunctions, its removal, or a closed client's subscriptions
cost time in proportion to their size — parsing each conjunction, entering it in the profile
graph, exporting it to the keepers. Done at once, a 4,096-conjunction ``Subscribe`` held a
broker's event loop for seconds, long enough for its neighbours to suspect it. So such a request
becomes a :class:`Job`: a generator that does one small piece at a time and yields what that
piece cost (in *work units*: roughly a constraint handled). The core runs jobs
:data:`WORK_SLICE` units at a time, round robin (:meth:`Jobs.run`), and the driver interleaves
the slices with everything else it serves. A client whose request is still running is *busy*:
its driver holds its next message back until the job is done, so a client's requests still take
effect in order.

The unit is deterministic (no clock in the core); :data:`WORK_SLICE` is calibrated so that a
slice takes about a millisecond on the development machine (``bench/matching.py`` shows slices
of the largest requests).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable

from ges.matching.graph import ProfileGraph
from ges.matching.model import Profile, weight

#: Work units one slice may do (about a millisecond): a constraint parsed, entered in a profile
#: graph or exported costs a few units, a covering comparison its weight.
WORK_SLICE = 256

#: A job yields the cost of each piece it did; it returns when done. Its outputs go into the
#: list it was given.
JobBody = Generator[int, None, None]


class Job:
    """One request in progress: its generator, where its outputs go, and what to do if its
    client goes away before it is done (``cancel``)."""

    __slots__ = ("key", "body", "out", "cancel", "conn", "keeps")

    def __init__(
        self,
        key: Hashable,
        body: JobBody,
        out: list,
        *,
        conn: int | None = None,
        cancel: Callable[[], None] | None = None,
        keeps: bool = True,
    ) -> None:
        self.key = key
        self.body = body
        self.out = out
        self.conn = conn
        self.cancel = cancel
        #: what it makes stays alive (a profile entered), not only passes through (a stream)
        self.keeps = keeps


class Jobs:
    """The jobs a core has in progress, in the order they get slices."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[Hashable, Job] = OrderedDict()
        #: client -> its jobs in progress (a client's next message waits while it has one)
        self._busy: dict[int, int] = {}
        #: the job of the last slice run made what stays alive (Job.keeps)
        self.kept = False

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._jobs

    def busy(self, conn: int) -> bool:
        """A job of client ``conn`` is in progress."""
        return conn in self._busy

    def of(self, conn: int) -> list[Job]:
        return [job for job in self._jobs.values() if job.conn == conn]

    def start(self, job: Job, budget: int = WORK_SLICE) -> list:
        """Run a new job's first slice now (a small request finishes in it); the rest later."""
        self._jobs[job.key] = job
        if job.conn is not None:
            self._busy[job.conn] = self._busy.get(job.conn, 0) + 1
        return self._slice(job, budget)[1]

    def drop(self, job: Job) -> None:
        """Abandon a job (its client went away); its ``cancel`` undoes what it half did."""
        if self._forget(job):
            job.body.close()
            if job.cancel is not None:
                job.cancel()

    def run(self, budget: int = WORK_SLICE) -> tuple[list, int]:
        """One slice of the job whose turn it is; returns its outputs and the work left of
        ``budget`` (the caller may spend it elsewhere)."""
        if not self._jobs:
            return [], budget
        job = next(iter(self._jobs.values()))
        self._jobs.move_to_end(job.key)  # round robin: the next slice is another job's
        self.kept = job.keeps
        used, out = self._slice(job, budget)
        return out, budget - used

    def run_of(self, conn: int, budget: int = WORK_SLICE) -> list:
        """One slice of client ``conn``'s first job (none: nothing); its outputs."""
        for job in self._jobs.values():
            if job.conn == conn:
                self.kept = job.keeps
                return self._slice(job, budget)[1]
        return []

    def _slice(self, job: Job, budget: int) -> tuple[int, list]:
        used = 0
        try:
            while used < budget:
                used += next(job.body)
        except StopIteration:
            self._forget(job)
        out, job.out[:] = list(job.out), []
        return used, out

    def _forget(self, job: Job) -> bool:
        if self._jobs.pop(job.key, None) is None:
            return False
        if job.conn is not None:
            n = self._busy[job.conn] - 1
            if n:
                self._busy[job.conn] = n
            else:
                del self._busy[job.conn]
        return True


#: Work units per unit of weight of a conjunction entered in or taken out of a profile graph
#: (and the exporter: ges.core.subscriptions).
COST_PER_WEIGHT = 4


class Indexed:
    """A profile in a graph of its own, for testing events against while it changes (see
    :func:`indexed`)."""

    __slots__ = ("graph",)

    def __init__(self) -> None:
        self.graph = ProfileGraph()

    def matches(self, attributes) -> bool:
        return bool(self.graph.match(attributes))


def indexed(
    profile: Profile, slice_units: int, small: int
) -> Generator[int, None, Profile | Indexed]:
    """Something with ``matches(attributes)`` for ``profile``: the profile itself when it is
    small, else the profile indexed in a graph of its own (built a slice at a time), so that
    testing an event costs a match, not a test of every conjunction."""
    if len(profile.effective) <= small:
        return profile
    indexed = Indexed()
    cost = 0
    for conj in profile.effective:
        indexed.graph.add(conj, 0)
        cost += COST_PER_WEIGHT * weight(conj)
        if cost >= slice_units:
            yield cost
            cost = 0
    yield cost
    return indexed
