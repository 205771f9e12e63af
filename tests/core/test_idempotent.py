"""Idempotent publishing (issue 17, finding 5): a publisher numbers its events; the pubend
publishes each number once, across the publisher's reconnects and the broker's restarts, and
acknowledges a duplicate only once what it duplicates is durable."""

from __future__ import annotations

from pathlib import Path

import pytest

from ges.core import BrokerCore, ToClient
from ges.reliable.log import MemoryLog
from ges.runtime.pubend_log import LogBounds, SqliteLog
from ges.topology import Topology
from ges.wire import messages as m

ROOT = Path(__file__).resolve().parents[2]
DEMO = Topology.from_yaml(ROOT / "topologies/demo.yaml")


def core(log=None, reliable=True) -> BrokerCore:
    c = BrokerCore(DEMO, "b1", incarnation=1, reliable=reliable, log=log)
    c.client_open(1, "P")
    return c


def events(*ns: int) -> list[m.Event]:
    return [m.Event({"n": n}) for n in ns]


def publish(c, seq, first, ns, publisher="P"):
    out = c.client_message(1, m.Publish(seq, events(*ns), publisher, first), 0.0)
    return [o.msg for o in out if type(o) is ToClient and type(o.msg) is m.PubAck]


@pytest.mark.parametrize("reliable", [True, False])
def test_each_number_is_published_once(reliable):
    c = core(reliable=reliable)
    (ack,) = publish(c, 1, 1, range(10))
    assert (ack.first_tick, ack.last_tick, ack.duplicates) == (1, 10, 0)
    # 6..15 again: 6..10 were published, 11..15 are new
    (ack,) = publish(c, 2, 6, range(5, 15))
    assert (ack.first_tick, ack.last_tick, ack.duplicates) == (11, 15, 5)
    # all of them known: nothing published, all acknowledged
    (ack,) = publish(c, 3, 1, range(3))
    assert ack.last_tick < ack.first_tick and ack.duplicates == 3
    assert c.counters["published"] == 15 and c.counters["duplicates_published"] == 8
    # another publisher, or none, is not affected
    (ack,) = publish(c, 4, 1, range(2), publisher="Q")
    assert ack.duplicates == 0
    ack = c.client_message(1, m.Publish(5, events(1)), 0.0)[0].msg
    assert ack.duplicates == 0


def test_numbers_survive_a_restart_of_the_broker():
    log = MemoryLog()
    c = core(log)
    publish(c, 1, 1, range(100))
    again = core(log)  # the same stable storage, a new incarnation
    (ack,) = publish(again, 1, 50, range(49, 120))
    assert ack.duplicates == 51 and ack.last_tick - ack.first_tick + 1 == 20


def test_a_duplicate_is_acknowledged_only_once_its_original_is_durable(tmp_path):
    log = SqliteLog(tmp_path / "b1.pubend.db")
    c = core(log)
    assert publish(c, 1, 1, range(5)) == []  # in the log, not yet committed
    assert publish(c, 2, 1, range(5)) == []  # its resend waits too
    log.committed_to(log.write_group(log.take_group()))
    acks = [o.msg for o in c.on_logged(0.0) if type(o) is ToClient and type(o.msg) is m.PubAck]
    assert [(a.seq, a.duplicates) for a in acks] == [(1, 0), (2, 5)]
    log.close()
    # and after a restart (a new epoch), from the file
    log = SqliteLog(tmp_path / "b1.pubend.db")
    assert log.publishers()["P"][0] == 5
    c = core(log)
    assert publish(c, 3, 4, range(3, 8)) == []  # 6..8 are new: acknowledged once committed
    log.committed_to(log.write_group(log.take_group()))
    (ack,) = [o.msg for o in c.on_logged(0.0) if type(o) is ToClient and type(o.msg) is m.PubAck]
    assert ack.duplicates == 2 and (ack.first_tick, ack.last_tick) == (1, 3)
    log.close()


def test_the_publishers_remembered_are_bounded():
    log = MemoryLog(max_publishers=3)
    c = core(log)
    for p in "ABCD":
        publish(c, 1, 1, [0], publisher=p)
    assert list(log.publishers()) == ["B", "C", "D"]  # A, the least recent, is forgotten


def test_a_bad_idempotent_publish_is_refused():
    c = core()
    out = c.client_message(1, m.Publish(1, events(1), "P", 0), 0.0)
    assert type(out[0].msg) is m.Error and "numbers from 1" in out[0].msg.reason
    out = c.client_message(1, m.Publish(1, events(1), "x" * 300, 1), 0.0)
    assert type(out[0].msg) is m.Error


def test_a_publisher_forgotten_and_back_before_the_commit_is_kept(tmp_path):
    bounds = LogBounds(max_publishers=2)
    log = SqliteLog(tmp_path / "b1.pubend.db", bounds=bounds)
    for tick, p in enumerate("ABCA", start=1):  # A forgotten by C, then active again
        log.append(tick, events(tick), (p, tick))
    log.committed_to(log.write_group(log.take_group()))
    log.close()
    log = SqliteLog(tmp_path / "b1.pubend.db", bounds=bounds)
    assert {p: s[0] for p, s in log.publishers().items()} == {"C": 3, "A": 4}
    log.close()
