"""What only the in-memory log does. The contract it shares with SqliteLog (appends, reads,
release, the bound, epochs, promises, publishers, clocks) is tested against both in
test_log_contract.py; here is MemoryLog's side of where the two differ, and its length."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ges.reliable.log import MemoryLog
from ges.wire import messages as m
from ges.wire.messages import held_size


def ev(n: int) -> m.Event:
    return m.Event({"n": n}, b"x" * 100)


def test_the_epoch_is_kept():
    assert MemoryLog(7).epoch == 7
    assert MemoryLog(epoch=3).epoch == 3


def test_a_memory_log_is_durable_as_soon_as_appended():
    # the simulator has no disk to wait for: an append is committed as it is made (SqliteLog's
    # commit waits for its group to be written)
    log = MemoryLog()
    log.append(1, ["a", "b", "c"])
    assert log.last == 3 and log.committed == 3 and len(log) == 3
    log.append(4, ["d"])
    assert log.last == 4 and log.committed == 4


def test_the_simulator_opens_a_new_epoch_at_each_restart_as_the_runtime_does():
    # the restarted core is given the broker's log file at its next epoch: ticks from 1 again,
    # the epoch before named (its last tick announced) and still read for nacks
    from ges.sim import Sim
    from tests.sim.test_simulator import topology

    sim = Sim(topology("demo"), seed=1)
    broker = sorted(sim.cores)[0]
    before = sim.cores[broker]
    before.log.append(1, [ev(1), ev(2)])
    before.log.release(1)
    sim.crash(broker, 0.5)
    sim.run_until(1.0)
    after = sim.cores[broker]
    assert after is not before and after.incarnation != before.incarnation
    assert after.log is sim.logs[broker] and after.log is not before.log
    assert after.pubend == f"{broker}~2" and after.log.previous == (1, 2)
    assert after.log.last == 0 and after.log.read_epoch(1, 1, 10) == [(2, ev(2))]
    assert after.log.released(1) == 1 and after.log.lowest(1) == 2 and after.log.ended(1) == 2
    sim.crash(broker, 0.5)  # an epoch with nothing committed: nothing to announce
    sim.run_until(2.0)
    log = sim.cores[broker].log
    assert log.epoch == 3 and log.previous is None and log.ended(2) == 0
    assert log.read_epoch(1, 1, 10) == [(2, ev(2))] and log.ended(1) == 2


def test_the_bounds_drop_single_events_oldest_first_even_inside_a_batch():
    # no batches in memory: beyond either bound exactly the oldest events go (SqliteLog's
    # bound deletes whole batches)
    log = MemoryLog(max_events=3)
    log.append(1, [ev(1), ev(2)])
    log.append(3, [ev(3), ev(4)])
    assert len(log) == 3 and log.lowest() == 2
    assert log.read(1, 10) == [(t, ev(t)) for t in range(2, 5)]
    by_bytes = MemoryLog(max_bytes=3 * held_size(ev(1)))
    by_bytes.append(1, [ev(t) for t in range(1, 6)])
    assert len(by_bytes) == 3 and by_bytes.lowest() == 3
    assert by_bytes.released() == 0  # dropped, not released: a nack for them is answered lost
    # an event larger than the whole bound is not kept either
    by_bytes.append(6, [m.Event({"n": 6}, b"x" * (4 * held_size(ev(1))))])
    assert len(by_bytes) == 0 and by_bytes.lowest() == 7 and by_bytes.last == 6


def test_a_release_drops_single_events_even_inside_a_batch():
    # (SqliteLog deletes the batches wholly released and keeps the rest)
    log = MemoryLog()
    log.append(1, [ev(t) for t in range(1, 4)])
    log.append(4, [ev(t) for t in range(4, 7)])
    log.release(5)
    assert log.lowest() == 6 and len(log) == 1


def test_len_counts_the_events_held():
    log = MemoryLog()
    assert len(log) == 0
    log.append(3, ["c", "d"])
    log.append(10, ["j"])
    assert len(log) == 3  # ticks skipped are not held
    with pytest.raises(ValueError):
        log.append(10, ["x"])
    log.append(11, [])
    assert len(log) == 3  # a refused append and an empty batch add nothing
    log.release(3)
    assert len(log) == 2


batches = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 5)),  # (skip from last + 1, size)
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(batches)
def test_len_and_committed_agree_with_a_dict_of_ticks(script):
    log = MemoryLog()
    model: dict[int, object] = {}
    for skip, size in script:
        first = log.last + skip
        events = [(first, i) for i in range(size)]
        log.append(first, events)
        for i, e in enumerate(events):
            model[first + i] = e
        assert log.last == max(model, default=0) == log.committed
        assert len(log) == len(model)
