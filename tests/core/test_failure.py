"""FailureDetector: heartbeats owed after ``interval`` idle, suspicion after ``timeout`` silent."""

from __future__ import annotations

import math

import pytest

from ges.core.failure import HEARTBEAT_INTERVAL, SUSPECT_AFTER, FailureDetector

# binary-exact times so the >= comparisons are not at the mercy of rounding
INTERVAL = 1.0
TIMEOUT = 4.0


@pytest.fixture
def fd() -> FailureDetector:
    return FailureDetector(interval=INTERVAL, timeout=TIMEOUT)


def test_defaults():
    d = FailureDetector()
    assert (d.interval, d.timeout) == (HEARTBEAT_INTERVAL, SUSPECT_AFTER)
    assert 0 < HEARTBEAT_INTERVAL < SUSPECT_AFTER


@pytest.mark.parametrize(
    ("interval", "timeout"), [(0, 1), (-1, 1), (1, 1), (2, 1), (1, 0), (math.nan, 1), (1, math.nan)]
)
def test_invalid_parameters(interval, timeout):
    with pytest.raises(ValueError):
        FailureDetector(interval=interval, timeout=timeout)


def test_no_links_nothing_to_do(fd):
    assert fd.next_deadline() == math.inf
    assert fd.poll(1e9) == ([], [])


def test_heartbeat_owed_after_interval(fd):
    fd.up("b2", 10.0)
    assert fd.poll(10.5) == ([], [])
    assert fd.poll(11.0) == (["b2"], [])
    # owing resets the send clock: the next one is owed an interval later
    assert fd.poll(11.5) == ([], [])
    assert fd.poll(12.0) == (["b2"], [])


def test_sent_postpones_the_heartbeat(fd):
    fd.up("b2", 0.0)
    fd.sent("b2", 0.75)
    assert fd.poll(1.0) == ([], [])
    assert fd.poll(1.75) == (["b2"], [])


def test_suspected_after_timeout_and_forgotten(fd):
    fd.up("b2", 0.0)
    fd.up("b3", 0.0)
    fd.heard("b3", 2.0)
    owed, suspected = fd.poll(4.0)
    assert suspected == ["b2"]
    # a suspected peer is not owed a heartbeat as well
    assert owed == ["b3"]
    assert fd.poll(100.0)[1] == ["b3"]
    assert fd.poll(1000.0) == ([], [])
    assert fd.next_deadline() == math.inf


def test_heard_resets_suspicion(fd):
    fd.up("b2", 0.0)
    fd.heard("b2", 3.5)
    assert fd.poll(4.0)[1] == []
    assert fd.poll(7.25)[1] == []
    assert fd.poll(7.5)[1] == ["b2"]


def test_sending_does_not_count_as_hearing(fd):
    fd.up("b2", 0.0)
    for t in (1.0, 2.0, 3.0):
        fd.sent("b2", t)
    assert fd.poll(4.0)[1] == ["b2"]


def test_next_deadline(fd):
    fd.up("b2", 0.0)
    assert fd.next_deadline() == 1.0  # a heartbeat is owed first
    fd.sent("b2", 0.5)
    assert fd.next_deadline() == 1.5
    fd.sent("b2", 3.5)
    assert fd.next_deadline() == 4.0  # now silence from b2 comes first
    fd.heard("b2", 3.75)
    assert fd.next_deadline() == 4.5
    fd.up("b3", 0.25)
    assert fd.next_deadline() == 1.25


def test_next_deadline_is_when_poll_has_work(fd):
    fd.up("b2", 0.0)
    fd.up("b3", 0.25)
    steps = 0
    while (t := fd.next_deadline()) < math.inf:
        assert fd.poll(t - 0.125) == ([], [])
        owed, suspected = fd.poll(t)
        assert owed or suspected
        steps += 1
    # heartbeats at 1, 1.25, 2, 2.25, 3, 3.25; b2 suspected at 4 (with b3 owed), b3 at 4.25
    assert steps == 8


def test_down_forgets(fd):
    fd.up("b2", 0.0)
    fd.down("b2")
    assert fd.next_deadline() == math.inf
    assert fd.poll(100.0) == ([], [])
    fd.down("b2")  # twice is fine
    fd.down("never-up")


def test_heard_and_sent_for_unknown_peers_are_ignored(fd):
    fd.heard("b9", 1.0)
    fd.sent("b9", 1.0)
    assert fd.next_deadline() == math.inf
    assert fd.poll(100.0) == ([], [])


def test_up_again_restarts_both_clocks(fd):
    fd.up("b2", 0.0)
    fd.poll(4.0)
    fd.up("b2", 10.0)
    assert fd.next_deadline() == 11.0
    assert fd.poll(13.5)[1] == []
    assert fd.poll(14.0)[1] == ["b2"]
