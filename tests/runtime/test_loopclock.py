"""The event loop's busy stretches (ges.runtime.loopclock): the window, the histogram and the
hooks' order driven by hand with a fake time source; then installed in a real trio run, where a
task that holds the loop shows, and every broker of the run reports the same clock."""

from __future__ import annotations

import time

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from ges.runtime import BrokerServer
from ges.runtime.loopclock import BOUNDS, WINDOW_SECONDS, LoopClock, installed


class FakeTime:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def stretch(clock: LoopClock, at: FakeTime, start: float, seconds: float) -> float:
    """The loop wakes at ``start`` and is busy for ``seconds``; the stretch as the clock
    reckons it (the same seconds, up to rounding)."""
    at.t = start
    clock.after_io_wait(0.0)
    at.t = start + seconds
    clock.before_io_wait(0.0)
    return at.t - start


def test_a_30_ms_stretch_is_the_longest_for_10_seconds_and_then_drops_out():
    at = FakeTime(100.0)
    clock = LoopClock(at)
    assert clock.longest() == 0.0
    stretch(clock, at, 100.2, 0.030)  # ends at 100.23
    t = 100.5
    while t < 110.23:  # the loop goes on with short stretches, twice a second
        stretch(clock, at, t, 0.0004)
        assert clock.longest() == pytest.approx(0.030), t
        t += 0.5
    stretch(clock, at, 111.0, 0.0004)
    assert clock.longest() == pytest.approx(0.0004)
    assert clock.busy == pytest.approx(0.030 + 0.0004 * (clock.stretches - 1))


def test_a_loop_that_ends_no_stretch_shows_none_once_the_window_has_passed():
    at = FakeTime(100.0)
    clock = LoopClock(at)
    stretch(clock, at, 100.0, 0.050)
    assert clock.longest(105.0) == pytest.approx(0.050)
    assert clock.longest(100.0 + WINDOW_SECONDS + 0.9) == pytest.approx(0.050)
    assert clock.longest(100.0 + WINDOW_SECONDS + 1.0) == 0.0  # read, not rotated: still gone


def test_the_longer_of_two_stretches_shows_until_it_goes_then_the_shorter_until_it_does():
    at = FakeTime(100.0)
    clock = LoopClock(at)
    stretch(clock, at, 100.1, 0.050)
    stretch(clock, at, 103.1, 0.020)
    assert clock.longest(104.0) == pytest.approx(0.050)
    assert clock.longest(111.5) == pytest.approx(0.020)
    assert clock.longest(114.0) == 0.0


def test_the_histogram_counts_each_stretch_once_in_its_bucket_a_bound_in_its_own():
    at = FakeTime(0.0)
    clock = LoopClock(at)
    # the first from 0.0: it is 1 ms exactly, no rounding
    for i, seconds in enumerate((0.001, 0.0005, 0.003, 0.02, 0.02, 2.0)):
        stretch(clock, at, 3.0 * i, seconds)
    assert clock.stretches == 6
    assert clock.busy == pytest.approx(0.0005 + 0.001 + 0.003 + 0.04 + 2.0)
    assert clock.buckets() == [
        (0.001, 2),
        (0.005, 3),
        (0.01, 3),
        (0.05, 5),
        (0.1, 5),
        (1.0, 5),
        (float("inf"), 6),
    ]
    assert [bound for bound, _ in clock.buckets()][:-1] == list(BOUNDS)


def test_hooks_out_of_order_count_no_stretch_that_did_not_happen():
    at = FakeTime(100.0)
    clock = LoopClock(at)
    at.t = 100.5
    clock.before_io_wait(0.0)  # installed mid-batch: no wake was seen
    assert clock.stretches == 0 and clock.busy == 0.0
    clock.after_io_wait(0.0)
    at.t = 101.0
    clock.after_io_wait(0.0)  # a second wake: the stretch is from this one
    at.t = 101.002
    clock.before_io_wait(0.0)
    at.t = 105.0
    clock.before_io_wait(1.0)  # a second wait: no stretch ended here
    assert clock.stretches == 1
    assert clock.busy == pytest.approx(0.002)
    assert clock.longest() == pytest.approx(0.002)


@given(
    st.lists(
        st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 0.2)),  # (gap before, busy)
        max_size=60,
    )
)
def test_the_longest_is_that_of_the_stretches_ended_in_the_window_whatever_the_pattern(pattern):
    """Against a reference that keeps every stretch: the ring of per-second maxima gives the
    same answer after any sequence of waits and stretches, read as each ends and every
    quarter second for 12 s after the last, and it keeps no more than its size."""
    at = FakeTime(1000.0)
    clock = LoopClock(at)
    ended: list[tuple[float, float]] = []

    def want(now: float) -> float:
        return max((b for e, b in ended if int(e) >= int(now) - WINDOW_SECONDS), default=0.0)

    t = at.t
    for gap, busy in pattern:
        t += gap
        ended.append((t + busy, stretch(clock, at, t, busy)))
        t += busy
        assert clock.longest() == want(at.t)
    for quarter in range(48):
        assert clock.longest(t + quarter / 4) == want(t + quarter / 4)
    assert len(clock._maxima) == len(clock._seconds) == WINDOW_SECONDS


async def test_a_task_holding_the_loop_shows_as_a_stretch_at_least_that_long():
    clock = installed()
    assert installed() is clock  # one per run
    await trio.sleep(0)  # the batch it was installed in ends; the next one is seen whole
    time.sleep(0.03)  # holds the loop: nothing else runs
    await trio.sleep(0)
    assert clock.longest() >= 0.03
    assert clock.busy >= 0.03
    over_10ms = clock.stretches - dict(clock.buckets())[0.01]
    assert over_10ms >= 1


async def test_every_broker_of_a_run_reports_the_runs_loop(chain3):
    async with trio.open_nursery() as nursery:
        b1 = await nursery.start(BrokerServer(chain3, "b1").run)
        b2 = await nursery.start(BrokerServer(chain3, "b2").run)
        assert b1.loop_clock is b2.loop_clock is installed()
        await trio.sleep(0)
        time.sleep(0.03)
        await trio.sleep(0)
        for server in (b1, b2):
            stats = server.stats()
            assert stats.loop_longest_us >= 30_000
            assert stats.loop_busy_us >= 30_000
        nursery.cancel_scope.cancel()


def test_a_broker_not_yet_running_reports_no_loop(chain3):
    stats = BrokerServer(chain3, "b1").stats()
    assert stats.loop_longest_us == 0 and stats.loop_busy_us == 0
