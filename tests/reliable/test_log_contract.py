"""The pubend log contract: the same tests against :class:`MemoryLog`, :class:`SqliteLog` and
the simulator's :class:`EpochGroupLog` (which must behave as the runtime's does).

The broker core is given a :class:`PubendLog` and must not care which. Each test here runs
against both through a small adapter that does what each log's driver does: a
:class:`MemoryLog` kept across a restart goes on in one epoch, committing and releasing at once
(the core's own default; the simulator's logs open a new epoch at each restart, as the
runtime's do: ges/sim/commits.py); the trio runtime's log task (ges/runtime/broker.py) commits a
:class:`SqliteLog`'s appends as one group (``take_group`` / ``write_group`` /
``committed_to``), deletes released and trimmed rows afterwards (``apply_release``, ``trim``),
and a restart opens the file again.

Where the two legitimately differ — when a group becomes durable, what a restart does to the
epoch, how a bound or a release drops events — the contract states what both satisfy, and each
log's own test file pins its side (see the end of this file).
"""

from __future__ import annotations

import ast
import inspect
import tempfile
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ges.reliable.log import MAX_PROMISED_EPOCHS, MAX_READ, MemoryLog, PubendLog
from ges.runtime.pubend_log import TRIM_EVERY, LogBounds, SqliteLog
from ges.sim.commits import EpochGroupLog
from ges.wire import messages as m

#: a tick above any a nack can ask for: the core answers ticks below ``lowest`` as lost
NOWHERE = 1 << 62


def ev(n: int) -> m.Event:
    return m.Event({"n": n}, b"x" * (n % 7), 5)


def evs(first: int, n: int) -> list[m.Event]:
    return [ev(t) for t in range(first, first + n)]


class Memory:
    """A :class:`MemoryLog` kept across a restart: its stable storage is the object."""

    def __init__(self, path: Path):
        self.log = MemoryLog()

    def commit(self) -> None:
        """Durable at once (``committed`` is ``last``): nothing to do."""

    def settle(self) -> None:
        """A release drops at once: nothing to do."""

    def restart(self, max_publishers: int | None = None) -> MemoryLog:
        """The same object goes to the restarted core (configured anew)."""
        if max_publishers is not None:
            self.log.max_publishers = max_publishers
        return self.log

    def bounded(self, max_events: int | None = None, max_publishers: int | None = None):
        """A new log that holds at most ``max_events`` events and remembers at most
        ``max_publishers`` publishers (call before appending)."""
        kw = {"max_events": max_events, "max_publishers": max_publishers}
        self.log = MemoryLog(**{k: v for k, v in kw.items() if v is not None})
        return self.log

    def close(self) -> None:
        pass


class Sqlite:
    """A :class:`SqliteLog` in a real file, driven as the runtime's log task drives it."""

    def __init__(self, path: Path):
        self.path = path / "b1.pubend.db"
        self.bounds = LogBounds()
        self.log = SqliteLog(self.path)

    def commit(self) -> None:
        """One group commit: everything appended so far, in one transaction (the log task
        writes it inline or from a worker thread, the same call either way)."""
        log = self.log
        group = log.take_group()
        log.committed_to(log.write_group(group))

    def settle(self) -> None:
        """What the log task does between groups: delete what was released, trim to the bound."""
        log = self.log
        while log.release_pending:
            log.apply_release()
        while log.trim_pending:
            log.trim()

    def restart(self, max_publishers: int | None = None) -> SqliteLog:
        """The broker process stops and starts again on the same file (configured anew)."""
        self.log.close()
        if max_publishers is not None:
            self.bounds = attrs.evolve(self.bounds, max_publishers=max_publishers)
        self.log = SqliteLog(self.path, bounds=self.bounds)
        return self.log

    def bounded(self, max_events: int | None = None, max_publishers: int | None = None):
        """A new file whose bounds are ``max_events`` events (looked at after every group) and
        ``max_publishers`` publishers (call before appending)."""
        kw = {"max_events": max_events, "max_publishers": max_publishers}
        kw = {k: v for k, v in kw.items() if v is not None}
        self.bounds = LogBounds(**kw, trim_every=1 if max_events is not None else TRIM_EVERY)
        self.log.close()
        self.path = self.path.with_name("bounded.db")
        self.log = SqliteLog(self.path, bounds=self.bounds)
        return self.log

    def close(self) -> None:
        self.log.close()


class Epochs:
    """The simulator's log (:class:`EpochGroupLog`): committed a group at a time, a new epoch
    at each restart (what was not committed is lost then, as a crash may lose it)."""

    def __init__(self, path: Path):
        self.log = EpochGroupLog()

    def commit(self) -> None:
        self.log.commit()

    def settle(self) -> None:
        """A release drops at once: nothing to do."""

    def restart(self, max_publishers: int | None = None) -> EpochGroupLog:
        self.log.lose()
        self.log = self.log.reopen()
        if max_publishers is not None:
            self.log.max_publishers = max_publishers
        return self.log

    def bounded(self, max_events: int | None = None, max_publishers: int | None = None):
        kw = {"max_events": max_events, "max_publishers": max_publishers}
        self.log = EpochGroupLog(**{k: v for k, v in kw.items() if v is not None})
        return self.log

    def close(self) -> None:
        pass


KINDS = {"memory": Memory, "sqlite": Sqlite, "epochs": Epochs}


@pytest.fixture(params=sorted(KINDS))
def store(request, tmp_path):
    s = KINDS[request.param](tmp_path)
    yield s
    s.close()


def append_committed(store, first: int, events: list) -> None:
    store.log.append(first, events)
    store.commit()


# -- the interface itself ---------------------------------------------------------------------


def protocol_members() -> dict[str, object]:
    """PubendLog's members: its annotated attributes (as None) and its methods and properties."""
    members: dict[str, object] = dict.fromkeys(PubendLog.__annotations__)
    for name, value in vars(PubendLog).items():
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
            members[name] = value
    return members


def test_the_protocol_lists_what_the_core_asks_of_a_log():
    # a sanity check on protocol_members(): an empty or partial list would pass the tests below
    assert {"epoch", "clocks", "previous", "read", "read_epoch", "release", "promise"} <= set(
        protocol_members()
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_log_has_every_member_of_the_protocol_in_its_shape(kind, tmp_path):
    """A member added to PubendLog and to only one log fails here for the other."""
    s = KINDS[kind](tmp_path)
    cls = type(s.log)
    try:
        for name, member in protocol_members().items():
            assert hasattr(s.log, name), f"{cls.__name__} has no {name}"
            got = inspect.getattr_static(s.log, name)
            if inspect.isfunction(member):
                # a method: called with the same parameters, in the same order, same defaults
                assert inspect.isfunction(got), f"{cls.__name__}.{name} is not a method"
                want = list(inspect.signature(member).parameters.values())
                have = list(inspect.signature(got).parameters.values())
                assert [(p.name, p.kind, p.default) for p in have] == [
                    (p.name, p.kind, p.default) for p in want
                ], f"{cls.__name__}.{name}{inspect.signature(got)}"
            else:
                # an attribute or property: read as a value, never called
                assert not inspect.isfunction(got), f"{cls.__name__}.{name} is a method"
    finally:
        s.close()


def _log_uses(tree: ast.AST) -> set[str]:
    """The attributes read of ``self.log`` and of a local ``log`` in a module."""
    used = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        inner = node.value
        if (isinstance(inner, ast.Name) and inner.id == "log") or (
            isinstance(inner, ast.Attribute)
            and inner.attr == "log"
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "self"
        ):
            used.add(node.attr)
    return used


def test_the_core_uses_only_protocol_members_of_its_log_and_no_getattr():
    """The core must not reach past the interface: a member it needs goes into PubendLog (and
    so, by the test above, into both logs), not into a ``getattr(self.log, ..., default)``."""
    core = Path(__file__).parents[2] / "ges" / "core"
    used: set[str] = set()
    for path in sorted(core.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        used |= _log_uses(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "getattr",
                "hasattr",
            ):
                target = ast.unparse(node.args[0]) if node.args else ""
                assert target not in ("self.log", "log"), f"{path}: {ast.unparse(node)}"
    # found at all (the scan is not blind), and nothing outside the protocol
    assert {"append", "committed", "read_epoch", "earlier", "clocks"} <= used
    assert used <= set(protocol_members()), used - set(protocol_members())


# -- appending and committing -----------------------------------------------------------------


def test_an_empty_log(store):
    log = store.log
    assert log.epoch == 1
    assert (log.last, log.committed, log.previous) == (0, 0, None)
    assert log.read(1, 100) == [] and log.read_epoch(log.epoch, 1, 100) == []
    assert log.lowest() == 1 and log.released() == 0
    assert log.promised() == {} and log.publishers() == {}
    assert log.clocks == (0, {})


def test_appends_are_read_only_once_committed_and_a_commit_covers_every_append_before_it(
    store,
):
    log = store.log
    log.append(1, evs(1, 2))
    log.append(3, evs(3, 1))  # two publishes before one commit
    assert log.last == 3
    assert log.committed in (0, 3)  # either all of it is durable already, or none yet
    assert log.read(1, 10) == [(t, ev(t)) for t in range(1, log.committed + 1)]
    store.commit()
    assert (log.last, log.committed) == (3, 3)
    assert log.read(1, 3) == [(1, ev(1)), (2, ev(2)), (3, ev(3))]
    log.append(4, evs(4, 1))
    assert log.committed in (3, 4)  # never goes back
    store.commit()
    assert (log.last, log.committed) == (4, 4)
    assert log.read(1, 4) == [(t, ev(t)) for t in range(1, 5)]


def test_read_is_bounded_by_lo_and_hi_inclusive(store):
    append_committed(store, 1, evs(1, 6))
    log = store.log
    assert log.read(2, 4) == [(2, ev(2)), (3, ev(3)), (4, ev(4))]  # inside one batch
    assert log.read(3, 3) == [(3, ev(3))]
    assert log.read(0, 2) == [(1, ev(1)), (2, ev(2))]
    assert log.read(5, 100) == [(5, ev(5)), (6, ev(6))]
    assert log.read(7, 9) == []
    assert log.read(4, 3) == []  # an empty range


def test_read_returns_at_most_limit_from_lo(store):
    append_committed(store, 1, evs(1, 6))
    log = store.log
    assert log.read(2, 6, limit=2) == [(2, ev(2)), (3, ev(3))]
    assert log.read(1, 6, limit=6) == log.read(1, 6)
    assert log.read(1, 6, limit=0) == []


def test_read_defaults_to_max_read(store):
    append_committed(store, 1, evs(1, MAX_READ + 10))
    got = store.log.read(1, MAX_READ + 10)
    assert len(got) == MAX_READ
    assert got[0] == (1, ev(1)) and got[-1] == (MAX_READ, ev(MAX_READ))


def test_read_skips_ticks_not_held(store):
    log = store.log
    log.append(3, evs(3, 2))
    log.append(10, evs(10, 1))
    store.commit()
    assert log.last == 10
    assert log.read(1, 20) == [(3, ev(3)), (4, ev(4)), (10, ev(10))]
    assert log.read(5, 9) == []
    assert log.read(4, 10, limit=1) == [(4, ev(4))]


@pytest.mark.parametrize("first", [1, 2, 3])
def test_appending_at_or_below_last_raises(store, first):
    log = store.log
    log.append(1, evs(1, 3))
    with pytest.raises(ValueError):
        log.append(first, [ev(99)])
    store.commit()  # and nothing was appended
    assert log.last == 3 and log.read(1, 10) == [(1, ev(1)), (2, ev(2)), (3, ev(3))]


def test_tick_zero_cannot_be_appended(store):
    with pytest.raises(ValueError):
        store.log.append(0, [ev(0)])


def test_an_empty_batch_is_nothing(store):
    log = store.log
    log.append(1, [ev(1)])
    log.append(1, [])  # appends no tick: not a step back
    log.append(5, [])
    assert log.last == 1
    log.append(2, [ev(2)])
    store.commit()
    assert log.read(1, 5) == [(1, ev(1)), (2, ev(2))]


batches = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 5), st.booleans()),  # skip, size, commit
    max_size=20,
)


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=100, deadline=None)
@given(script=batches, lo=st.integers(0, 60), hi=st.integers(0, 60), limit=st.integers(0, 20))
def test_the_log_agrees_with_a_dict_of_committed_ticks(kind, script, lo, hi, limit):
    with tempfile.TemporaryDirectory() as tmp:
        s = KINDS[kind](Path(tmp))
        log = s.log
        model: dict[int, object] = {}
        durable: dict[int, object] = {}
        try:
            for skip, size, commit in script:
                first = log.last + skip
                events = [ev(first + i) for i in range(size)]
                log.append(first, events)
                model.update((first + i, e) for i, e in enumerate(events))
                if commit:
                    s.commit()
                    durable = dict(model)
                assert log.last == max(model, default=0)
                assert max(durable, default=0) <= log.committed <= log.last
                held = {t: e for t, e in model.items() if t <= log.committed}
                want = [(t, held[t]) for t in sorted(held) if lo <= t <= hi][:limit]
                assert log.read(lo, hi, limit) == want
                assert log.read_epoch(log.epoch, lo, hi, limit) == want
        finally:
            s.close()


# -- release and the bound --------------------------------------------------------------------


def test_a_release_counts_at_once_drops_what_it_names_and_never_goes_back(store):
    log = store.log
    for t in range(1, 6):
        append_committed(store, t, [ev(t)])
    log.release(3)
    assert log.released() == 3  # nobody needs them any more, whether or not they are gone yet
    store.settle()
    assert log.lowest() == 4 and log.read(1, 10) == [(4, ev(4)), (5, ev(5))]
    log.release(2)
    store.settle()
    assert log.released() == 3 and log.lowest() == 4  # never back
    assert log.released(log.epoch + 1) == 0  # an epoch never opened: nothing released of it
    log.release(5)
    store.settle()
    # nothing held: lowest is past the last committed tick (those below were released)
    assert log.released() == 5 and log.read(1, 10) == [] and log.lowest() == 6


def test_a_release_never_passes_what_is_committed(store):
    log = store.log
    append_committed(store, 1, evs(1, 3))
    log.append(4, evs(4, 2))
    log.release(99)
    released = log.released()
    assert released == log.committed  # 5 if the appends are durable at once, else 3
    store.settle()
    store.commit()
    assert log.released() == released  # a later commit does not extend the release
    assert log.read(1, 10) == [(t, ev(t)) for t in range(released + 1, 6)]


def test_a_release_inside_a_batch_keeps_every_tick_after_it(store):
    log = store.log
    append_committed(store, 1, evs(1, 3))
    append_committed(store, 4, evs(4, 3))
    log.release(5)
    store.settle()
    assert log.released() == 5
    assert log.read(6, 10) == [(6, ev(6))]
    # what is below lowest went; a log may keep a released tick a while (see the tests below)
    assert 4 <= log.lowest() <= 6
    assert [t for t, _ in log.read(1, 10)] == list(range(log.lowest(), 7))


def test_a_bounded_log_keeps_the_newest_events_and_says_where_it_starts(store):
    log = store.bounded(5)
    for t in range(1, 9):  # single events: both logs drop them one by one
        append_committed(store, t, [ev(t)])
        store.settle()
    assert log.lowest() == 4 and log.read(1, 10) == [(t, ev(t)) for t in range(4, 9)]
    # dropped by the bound, not released: a nack for 1..3 is answered as lost, not as silence
    assert log.released() == 0


# -- epochs and restarts ----------------------------------------------------------------------


def test_after_a_restart_every_committed_event_is_still_read_by_its_epoch(store):
    log = store.log
    append_committed(store, 1, evs(1, 2))
    append_committed(store, 3, evs(3, 2))
    log.release(2)
    store.settle()
    old, committed = log.epoch, log.committed
    before = log.read(1, 100)
    again = store.restart()
    if again.epoch == old:  # the stream goes on: its ticks after the last
        assert again.previous is None and again.earlier == []
        assert again.last == again.committed == committed
        assert again.read(1, 100) == before
    else:  # a new stream: ticks from 1, and the old epoch named so the core announces its end
        assert again.epoch > old
        assert again.last == again.committed == 0 and again.read(1, 100) == []
        assert again.previous == (old, committed) and again.earlier == [(old, committed)]
        assert again.ended(old) == committed and again.ended(again.epoch) == 0
        assert again.read_epoch(again.epoch, 1, 100) == []
    assert again.read_epoch(old, 1, 100) == before
    assert again.read_epoch(old, 3, 100, limit=1) == [(3, ev(3))]
    assert again.released(old) == 2 and again.lowest(old) == 3
    # appending goes on at the current epoch's next tick
    first = again.last + 1
    append_committed(store, first, [ev(50)])
    assert again.read(first, first) == [(first, ev(50))]


def test_an_epoch_never_held_has_nothing_and_every_tick_of_it_is_lost(store):
    log = store.log
    append_committed(store, 1, evs(1, 3))
    for epoch in (log.epoch + 1, log.epoch + 7, 0):
        assert log.read_epoch(epoch, 1, 100) == []
        assert log.lowest(epoch) >= NOWHERE  # so the core answers any nack for it as lost
        assert log.released(epoch) == 0


def test_read_epoch_of_this_epoch_is_read(store):
    log = store.log
    log.append(1, evs(1, 4))
    assert log.read_epoch(log.epoch, 1, 10) == log.read(1, 10)  # before the commit too
    store.commit()
    log.append(5, evs(5, 1))
    for lo, hi, limit in ((1, 10, MAX_READ), (2, 3, MAX_READ), (1, 10, 2), (5, 5, 1)):
        assert log.read_epoch(log.epoch, lo, hi, limit) == log.read(lo, hi, limit)
    assert log.committed >= 4  # and tick 5 is read only if it is committed too
    assert log.read_epoch(log.epoch, 1, 10) == [(t, ev(t)) for t in range(1, log.committed + 1)]


def test_clocks_are_kept_while_the_stream_goes_on_and_start_empty_with_a_new_one(store):
    log = store.log
    clocks = (7, {"b2": (3, 11)})
    log.clocks = clocks  # what the core stores after each change of V_m
    assert log.clocks == clocks
    append_committed(store, 1, evs(1, 1))
    old = log.epoch
    again = store.restart()
    # V_m must not shrink within a stream; a new stream's starts empty
    assert again.clocks == (clocks if again.epoch == old else (0, {}))


# -- promises and idempotent publishers -------------------------------------------------------


def test_acknowledgements_given_are_kept_across_restarts(store):
    log = store.log
    assert log.promised() == {}
    promised = log.promised()
    assert log.promise("b1~1", 40) and log.promise("b7~3", 5)
    assert log.promise("b1~2", 3)  # a newer epoch of b1's pubend: the older is kept too
    assert log.promise("b1~1", 45)
    assert promised == {"b1~1": 45, "b1~2": 3, "b7~3": 5}  # the live dict
    again = store.restart()
    assert again.promised() == {"b1~1": 45, "b1~2": 3, "b7~3": 5}


def test_acknowledgements_are_kept_for_the_newest_epochs_of_each_broker(store):
    log = store.log
    n = MAX_PROMISED_EPOCHS
    for epoch in range(3, 3 + n):
        assert log.promise(f"b1~{epoch}", epoch)
    assert log.promise("b2~1", 1)
    assert not log.promise("b1~2", 9)  # older than every one kept: not kept, not given
    assert log.promise(f"b1~{3 + n}", 1)  # a newer one: the oldest goes
    want = {f"b1~{e}": e for e in range(4, 3 + n)} | {f"b1~{3 + n}": 1, "b2~1": 1}
    assert log.promised() == want
    assert store.restart().promised() == want


def test_acknowledgements_of_epochs_their_broker_holds_no_more_are_forgotten(store):
    log = store.log
    for pubend in ("b1~1", "b1~3", "b1~4", "b2~2"):
        assert log.promise(pubend, 5)
    log.forget_promises("b1", 4)  # b1 holds epochs from 4 on
    log.forget_promises("b9", 4)  # (none of b9's: nothing)
    assert log.promised() == {"b1~4": 5, "b2~2": 5}
    assert store.restart().promised() == {"b1~4": 5, "b2~2": 5}


def test_an_earlier_epoch_is_released_to_its_end_and_no_longer_named(store):
    log = store.log
    append_committed(store, 1, evs(1, 3))
    append_committed(store, 4, evs(4, 3))
    old = log.epoch
    again = store.restart()
    if again.epoch == old:
        return  # one stream: no earlier epoch (its own release is tested above)
    assert again.earlier == [(old, 6)]
    again.release(4, old)  # what every other broker acknowledged of it so far
    store.settle()
    assert again.released(old) == 4 and again.released() == 0
    # a log may keep the rest of a batch a release cuts into (released: nothing for anyone)
    assert [(t, e) for t, e in again.read_epoch(old, 1, 100) if t > 4] == [(5, ev(5)), (6, ev(6))]
    assert again.earlier == [(old, 6)]  # ticks past the release: still named
    again.release(99, old)  # at most its end
    store.settle()
    assert again.released(old) == 6 and again.read_epoch(old, 1, 100) == []
    assert again.earlier == [] and again.ended(old) == 6
    again.release(3, old)  # never goes back
    assert again.released(old) == 6
    newest = store.restart()  # and it stays released: not named after the next start
    assert newest.released(old) == 6 and newest.ended(old) == 6
    assert old not in [e for e, _ in newest.earlier]


def test_publishers_are_kept_with_their_events_the_most_recent_last(store):
    log = store.log
    publishers = log.publishers()  # the core holds on to this dict
    log.append(1, evs(1, 3), ("P", 3))
    log.append(4, evs(4, 2), ("Q", 7))
    log.append(6, evs(6, 1))  # no publisher: nothing changes
    log.append(7, evs(7, 2), ("P", 5))
    epoch = log.epoch
    assert publishers is log.publishers()
    assert list(publishers.items()) == [("Q", (7, epoch, 5)), ("P", (5, epoch, 8))]
    store.commit()
    again = store.restart()
    # the epoch and tick they went in, whatever epoch the log is at now
    assert list(again.publishers().items()) == [("Q", (7, epoch, 5)), ("P", (5, epoch, 8))]


def test_the_publishers_remembered_are_bounded_and_the_forgotten_stay_forgotten(store):
    log = store.bounded(max_publishers=2)
    for t, p in enumerate("ABC", start=1):
        log.append(t, [ev(t)], (p, t))
        store.commit()  # a group each: A's state is on disk when C makes it go
    assert list(log.publishers()) == ["B", "C"]  # A, the least recently active, is forgotten
    # with room for A again, it does not come back: it was forgotten, not just left out
    again = store.restart(max_publishers=3)
    assert {p: s[0] for p, s in again.publishers().items()} == {"B": 2, "C": 3}


# -- where the two differ ---------------------------------------------------------------------
#
# The contract leaves these open, and the core copes with either side; each log's own tests pin
# its side. MemoryLog (tests/reliable/test_log.py): durable as soon as appended; kept across a
# simulated crash, so its epoch and ticks go on; its bounds and releases drop single events.
# SqliteLog (tests/runtime/test_pubend_log.py): durable once its group is written and
# committed_to; a new epoch at each start, the uncommitted tail forgotten; its bound and
# releases delete whole batches.
