"""ges.core.coalesce: a turn's outputs joined per destination (natural batching)."""

from __future__ import annotations

import pytest

from ges.core import BrokerCore, DropPeer, Notice, ToClient, ToPeer
from ges.core.coalesce import JOIN_BYTES, coalesce
from ges.reliable.log import MemoryLog
from ges.wire import messages as m
from ges.wire.messages import event_size
from tests.core.test_idempotent import DEMO


def item(tick: int, size: int = 10) -> m.EventItem:
    return m.EventItem(tick, tick - 1, 0, m.Event({"n": tick}, b"x" * size))


def deliver(sub: int, *ticks: int, pubend: str = "b1~1") -> m.Deliver:
    return m.Deliver(sub, pubend, [item(t) for t in ticks])


def ack(seq: int, first: int, last: int, duplicates: int = 0) -> m.PubAck:
    return m.PubAck(seq, "b1~1", first, last, duplicates)


def ticks(msg) -> list[int]:
    return [it.tick for it in msg.items]


def test_each_destinations_run_becomes_one_message_in_the_place_of_its_first():
    outs = [
        ToClient(1, ack(1, 1, 1)),
        ToClient(2, deliver(1, 1)),
        ToPeer("b2", m.Events("b1~1", [item(1)])),
        ToClient(1, ack(2, 2, 2)),
        ToClient(2, deliver(1, 2)),
        ToPeer("b2", m.Events("b1~1", [item(2)])),
        ToClient(1, ack(3, 3, 4)),
        ToClient(2, deliver(1, 3, 4)),
    ]
    got = coalesce(outs)
    assert [type(o) for o in got] == [ToClient, ToClient, ToPeer]
    assert got[0] == ToClient(1, m.PubAck(3, "b1~1", 1, 4, 0, seqs=3))
    assert got[1].conn == 2 and ticks(got[1].msg) == [1, 2, 3, 4]
    assert got[2].peer == "b2" and ticks(got[2].msg) == [1, 2]


def test_nothing_is_joined_across_another_message_to_the_same_destination():
    outs = [
        ToClient(2, deliver(1, 1)),
        ToClient(2, m.SubAck(5)),
        ToClient(2, deliver(1, 2)),
        ToClient(2, deliver(7, 3)),  # another subscription
        ToClient(2, deliver(7, 4, pubend="b9~1")),  # another pubend
    ]
    assert coalesce(outs) == outs


def test_acknowledgements_join_only_when_seqs_and_ticks_follow_on_without_duplicates():
    cases = [
        ([ack(1, 1, 2), ack(3, 3, 3)], False),  # seq 2 missing
        ([ack(1, 1, 2), ack(2, 4, 4)], False),  # tick 3 between them
        ([ack(1, 1, 2), ack(2, 3, 3, duplicates=1)], False),
        ([ack(1, 1, 0, duplicates=1), ack(2, 1, 1)], False),  # all duplicates: no ticks
        ([m.PubAck(1, "b1~1", 1, 1), m.PubAck(2, "b2~1", 2, 2)], False),
        ([ack(1, 1, 2), ack(2, 3, 3)], True),
    ]
    for acks, joined in cases:
        got = coalesce([ToClient(1, a) for a in acks])
        assert (len(got) == 1) is joined, acks
    (one,) = coalesce([ToClient(1, ack(1, 1, 2)), ToClient(1, ack(2, 3, 3))])
    (again,) = coalesce([one, ToClient(1, ack(3, 4, 5))])  # a joined one joins on
    assert again.msg == m.PubAck(3, "b1~1", 1, 5, 0, seqs=3)


def test_a_message_shared_by_several_subscribers_stays_shared_when_joined():
    first, second = deliver(1, 1), deliver(1, 2)
    outs = [ToClient(c, d) for d in (first, second) for c in (10, 11, 12)]
    got = coalesce(outs)
    assert [o.conn for o in got] == [10, 11, 12]
    assert got[0].msg is got[1].msg is got[2].msg and ticks(got[0].msg) == [1, 2]


def test_a_joined_message_carries_at_most_join_bytes_of_events():
    size = event_size(item(1, 1000).event)
    n = 3 * JOIN_BYTES // size
    got = coalesce([ToClient(1, m.Deliver(1, "b1~1", [item(t, 1000)])) for t in range(1, n + 1)])
    assert len(got) >= 3
    assert all(sum(event_size(it.event) for it in o.msg.items) <= JOIN_BYTES for o in got)
    assert [t for o in got for t in ticks(o.msg)] == list(range(1, n + 1))


def test_a_dropped_link_ends_its_run_and_other_outputs_keep_their_places():
    outs = [
        ToPeer("b2", m.Events("b1~1", [item(1)])),
        Notice("info", "x"),
        ToClient(-3, deliver(1, 1)),  # a durable session's own: the driver hands it on
        DropPeer("b2", "suspected"),
        ToPeer("b2", m.Events("b1~1", [item(2)])),
    ]
    assert coalesce(outs) == outs


# -- a client's publishes read together (Publishing.on_publishes) --------------------------------


def _core(reliable: bool):
    core = BrokerCore(DEMO, "b1", incarnation=1, reliable=reliable, log=MemoryLog())
    core.client_open(1, "P")
    core.client_open(2, "S")
    core.client_message(2, m.Subscribe(1, [[m.Constraint("n", "exists")]]), 0.0)
    return core


def _publishes(*seqs: int, publisher: str = "") -> list[m.Publish]:
    return [
        m.Publish(seq, [m.Event({"n": seq})], publisher, seq if publisher else 0) for seq in seqs
    ]


def _acks_and_ticks(core, out) -> tuple[list, list]:
    out = list(out)
    if core.reliable:
        out += core.on_logged(0.0)
    acks = [o.msg for o in out if type(o) is ToClient and o.conn == 1]
    got = [(it.tick, it.event.attributes["n"]) for o in out if o.conn == 2 for it in o.msg.items]
    return acks, got


@pytest.mark.parametrize("reliable", [True, False])
def test_publishes_read_together_are_one_batch_with_one_acknowledgement(reliable):
    one_by_one, together = _core(reliable), _core(reliable)
    singly = [o for p in _publishes(1, 2, 3, 4) for o in one_by_one.client_message(1, p, 0.0)]
    acks, got = _acks_and_ticks(one_by_one, singly)
    assert len(acks) == 4
    joined_acks, joined_got = _acks_and_ticks(
        together, together.client_publishes(1, _publishes(1, 2, 3, 4), 0.0)
    )
    assert joined_acks == [m.PubAck(4, "b1~1", 1, 4, 0, seqs=4)]
    assert joined_got == got == [(t, t) for t in range(1, 5)]


def test_idempotent_publishes_and_a_gap_in_seqs_end_a_run():
    core = _core(False)
    msgs = [*_publishes(1, 2), *_publishes(3, publisher="Q"), *_publishes(4, 6, 7)]
    acks, got = _acks_and_ticks(core, core.client_publishes(1, msgs, 0.0))
    assert [(a.seq, a.seqs, a.first_tick, a.last_tick) for a in acks] == [
        (2, 2, 1, 2),
        (3, 1, 3, 3),
        (4, 1, 4, 4),
        (7, 2, 5, 6),
    ]
    assert [n for _, n in got] == [1, 2, 3, 4, 6, 7]
