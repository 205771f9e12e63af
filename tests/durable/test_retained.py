"""Retained messages (ges.durable.retained): each topic's last by the publishers' order, clears
that stay cleared, the bounds, what a filter finds; kept in both stores; and a replicator core
(ges.core.retaining) subscribed to them, answering what is retained on a subscriber's filters."""

from __future__ import annotations

import itertools
import random

import pytest

from ges.core.retaining import MAX_WAITING_BYTES, RETAINED_CONN, RETAINED_WEIGHT, Undurable
from ges.durable.retained import OVERHEAD, Kept, RetainedSet
from ges.durable.store import MemorySessionStore
from ges.matching.model import RETAIN_ATTR, TOPIC_ATTR
from ges.matching.topics import TopicIndex, matches
from ges.wire import messages as m
from tests.durable.test_replicator_core import PUB, SOLO, Rig, to


def ev(topic: str, payload: bytes = b"x", at: int = 0, retain=1) -> m.Event:
    attributes = {TOPIC_ATTR: topic}
    if retain is not None:
        attributes[RETAIN_ATTR] = retain
    return m.Event(attributes, payload, at)


def payloads(events: list) -> list[bytes]:
    return [e.payload for e in events]


# -- the index of topics ----------------------------------------------------------------------


def test_the_index_finds_what_matches_says_and_nothing_else():
    rng = random.Random(7)
    levels = ["a", "b", "$s", "c"]
    topics = {
        "/".join(rng.choice(levels) for _ in range(rng.randint(1, 4))) for _ in range(200)
    } | {"a", "$s", "a/", "/a", "/"}
    index = TopicIndex()
    for t in topics:
        index.set(t, t)
    assert len(index) == len(topics)
    filters = ["#", "+", "a/#", "+/+", "a/+/b", "$s/#", "+/a", "/#", "a/", "+/#", "c/b/a/$s"]
    filters += ["/".join(x) for x in itertools.product(["a", "+", "$s"], repeat=2)]
    for f in filters:
        found = sorted(index.find(f))
        assert found == sorted(t for t in topics if matches(f, t)), f
    for t in list(topics)[::2]:
        assert index.pop(t) == t
        topics.discard(t)
    assert index.pop("no/such") is None
    assert len(index) == len(topics)
    assert sorted(index.find("#")) == sorted(t for t in topics if not t.startswith("$"))


# -- the set ----------------------------------------------------------------------------------


def test_each_topic_keeps_its_last_message_by_time_then_pubend_then_tick():
    r = RetainedSet()
    assert r.offer("p", 1, ev("t", b"1", at=10)) is not None
    assert r.offer("q", 1, ev("t", b"old", at=5)) is None  # published before: not kept
    assert r.offer("p", 2, ev("t", b"2", at=10)) is not None  # same time, later tick
    assert r.offer("a", 9, ev("t", b"tie", at=10)) is None  # same time, lower pubend
    assert payloads(r.find(["t"])[0]) == [b"2"]
    # replicators that see the same events in any order keep the same one
    events = [("p", i, ev("u", str(i).encode(), at=i % 3)) for i in range(1, 9)]
    kept = set()
    for _ in range(5):
        random.Random(len(kept)).shuffle(events)
        other = RetainedSet()
        for pubend, tick, e in events:
            other.offer(pubend, tick, e)
        kept.add(other.get("u").event.payload)
    assert kept == {b"8"}


def test_an_empty_message_clears_its_topic_and_an_older_one_does_not_come_back():
    r = RetainedSet()
    r.offer("p", 1, ev("t", b"1", at=1))
    assert r.offer("p", 2, ev("t", b"", at=2)).event is None
    assert r.find(["t", "#"]) == ([], True)
    assert r.offer("q", 1, ev("t", b"late", at=1)) is None
    assert r.offer("q", 2, ev("t", b"new", at=3)) is not None
    assert payloads(r.find(["#"])[0]) == [b"new"]


def test_only_retained_events_with_a_topic_mqtt_can_carry_are_kept():
    r = RetainedSet()
    for e in [
        ev("t", retain=None),
        ev("t", retain=0),
        ev("a/+"),
        ev(""),
        m.Event({RETAIN_ATTR: 1}),
    ]:
        assert r.offer("p", 1, e) is None
    assert len(r) == 0


def test_bounds_refuse_new_topics_and_a_held_topic_is_always_replaced():
    r = RetainedSet(max_topics=2)
    assert r.offer("p", 1, ev("a")) and r.offer("p", 2, ev("b"))
    assert r.offer("p", 3, ev("c")) is None and r.refused == 1
    assert r.offer("p", 4, ev("a", b"again")) is not None
    small = OVERHEAD * 3
    r = RetainedSet(max_bytes=small)
    assert r.offer("p", 1, ev("a")) is not None
    assert r.offer("p", 2, ev("b", b"y" * small)) is None and r.refused == 1
    # too big for what is left: the topic is cleared rather than left holding an older one
    assert r.offer("p", 3, ev("a", b"y" * small)).event is None
    assert r.bytes <= small and r.find(["a"]) == ([], True)


def test_clearings_give_their_room_to_new_topics_oldest_first():
    r = RetainedSet(max_topics=3)
    assert r.offer("p", 1, ev("never", b"")).event is None  # kept: nothing older comes back
    for i, t in enumerate("abc"):
        r.offer("p", i + 1, ev(t))
    assert r.forgotten == ["never"]  # its room went first
    r.offer("p", 4, ev("a", b"", at=1))
    r.offer("p", 5, ev("b", b"", at=1))
    assert r.offer("p", 6, ev("d")) is not None and r.forgotten == ["never", "a"]
    assert r.offer("p", 7, ev("e")) is not None and r.forgotten == ["never", "a", "b"]
    assert r.offer("p", 8, ev("f")) is None and r.refused == 1  # no clearing left
    assert sorted(payloads(r.find(["#"])[0])) == [b"x"] * 3


@pytest.mark.parametrize("seed", range(20))
def test_replicators_seeing_the_changes_in_any_order_keep_the_same(seed):
    """A last-writer-wins register: two publishers' streams interleaved differently (and
    changes read back late) leave every replicator with the same message per topic — a
    clearing included, even one that comes before the older message it clears."""
    rng = random.Random(seed)
    changes = [
        (f"p{rng.randrange(3)}", tick, ev(f"t/{rng.randrange(3)}", rng.choice([b"", b"v"]), rng.randrange(50)))
        for tick in range(1, 30)
    ]  # fmt: skip
    kept = []
    for _ in range(4):
        r = RetainedSet()
        for change in rng.sample(changes, len(changes)):
            r.offer(*change)
        kept.append({t: r.get(t) for t in ("t/0", "t/1", "t/2")})
    assert all(k == kept[0] for k in kept)
    for topic, got in kept[0].items():
        last = max((c for c in changes if c[2].attributes[TOPIC_ATTR] == topic),
                   key=lambda c: (c[2].published_at, c[0], c[1]), default=None)  # fmt: skip
        if last is None:
            assert got is None
        else:
            assert (got.pubend, got.tick) == (last[0], last[1])
            assert (got.event is None) == (last[2].payload == b"")


def test_an_ask_walks_a_bounded_part_of_the_index():
    r = RetainedSet()
    for i in range(300):
        r.offer("p", i + 1, ev(f"t/{i}"))
    events, complete = r.find(["#"] * 1000 + ["+/#", "t/+"])  # the same filter once
    assert complete and len(events) == 300
    events, complete = r.find(["#"], max_visits=100)
    assert not complete and len(events) < 100


def test_finding_walks_in_pieces_and_finds_what_find_does():
    """An ask's walk in pieces of about ``pause`` levels (a message found counts its bytes too),
    also when each of many filters matches nothing; the same answer as at once."""
    r = RetainedSet()
    for i in range(5000):
        r.offer("p", i + 1, ev(f"s/{i % 50}/d/{i}"))
    for filters in (["#"], ["s/+/d/+"], [f"+/+/+/x{k}" for k in range(1024)], ["s/7/d/7"]):
        at_once = r.find(filters)
        answer: list = []
        pieces = list(r.finding(filters, answer, pause=1000))
        assert tuple(answer) == at_once
        assert all(p < 1000 + 128 for p in pieces), pieces  # + a node's children (100 here)
        if filters != ["s/7/d/7"]:
            assert len(pieces) >= 5, (filters[0], pieces)


def test_find_gives_each_topic_once_and_stops_at_its_bytes():
    r = RetainedSet()
    for i in range(10):
        r.offer("p", i + 1, ev(f"s/{i}", b"z" * 100))
    events, complete = r.find(["s/+", "s/#", "s/3"])
    assert complete and sorted(e.attributes[TOPIC_ATTR] for e in events) == [
        f"s/{i}" for i in range(10)
    ]
    events, complete = r.find(["#"], max_bytes=450)
    assert not complete and 1 <= len(events) < 10


# -- a replicator -----------------------------------------------------------------------------


def retained_publish(rig: Rig, *events: m.Event) -> None:
    rig.seq += 1
    outs = rig.core.client_message(PUB, m.Publish(rig.seq, list(events)), rig.now)
    rig.feed(outs + rig.core.on_logged(rig.now))


SOLO_MQTT = {**SOLO, "brokers": {"r": {"unit": "S/c1", "port": 1, "mqtt_port": 2}}}


def test_a_replicator_keeps_what_is_retained_and_answers_asks_for_it():
    rig = Rig(SOLO_MQTT)
    rig.feed(rig.rep.restore(rig.now))
    assert RETAINED_CONN in rig.core.subscriptions.clients
    retained_publish(rig, ev("home/kitchen", b"20", at=1), ev("home/hall", b"18", at=1))
    retained_publish(rig, ev("home/kitchen", b"21", at=2), ev("home/attic", b"x", retain=None))
    retained_publish(rig, ev("home/hall", b"", at=3))  # cleared
    outs = rig.feed(rig.rep.retained_ask(5, m.RetainedAsk(["home/#"], req=3)))
    (answer,) = to(outs, 5)
    assert answer.req == 3 and answer.complete and payloads(answer.events) == [b"21"]
    assert len(rig.store.retained()) == 2  # kitchen, and hall's clearing
    (refused,) = to(rig.feed(rig.rep.retained_ask(5, m.RetainedAsk(["a/#/b"], req=4))), 5)
    assert type(refused) is m.Error and "'#' must be the last level" in refused.reason
    # a restarted replicator has them from its store
    again = Rig(SOLO_MQTT)
    again.store = rig.store
    again.rep.store = rig.store
    again.feed(again.rep.restore(again.now))
    (answer,) = to(again.feed(again.rep.retained_ask(5, m.RetainedAsk(["+/kitchen"]))), 5)
    assert payloads(answer.events) == [b"21"]


def test_asks_are_answered_in_slices_of_the_cores_work_one_walk_at_a_time_in_turn():
    """Walking 200,000 levels of the index for one SUBSCRIBE held a broker ~30 ms: asks go in
    slices of the core's work (ges.core.work) — a small one when nothing waits is done in its
    first —, one walk at a time, each connection's next in turn; a connection's asks waiting
    are bounded in bytes (past them: an Error), and go with it."""
    rig = Rig(SOLO_MQTT)
    rig.feed(rig.rep.restore(rig.now))
    for i in range(20_000):
        rig.rep.retained.offer("p", i + 1, ev(f"s/{i % 100}/d/{i}", at=i))
    (small,) = to(rig.rep.retained_ask(6, m.RetainedAsk(["s/3/d/3"], req=1)), 6)
    assert payloads(small.events) == [b"x"] and small.complete  # nothing waits: at once
    whole = rig.rep.retained.find(["#"])
    assert to(rig.rep.retained_ask(5, m.RetainedAsk(["#"], req=1)), 5) == []  # not yet
    assert rig.rep.retained_ask(5, m.RetainedAsk(["s/+/d/7"], req=2)) == []
    assert rig.rep.retained_ask(6, m.RetainedAsk(["s/3/d/3"], req=2)) == []
    assert rig.rep.retained_ask(5, m.RetainedAsk(["s/+/d/8"], req=3)) == []
    assert rig.rep.retained_ask(7, m.RetainedAsk(["s/4/d/4"], req=1)) == []
    rig.core.client_closed(7, rig.now)  # its ask waiting goes with it
    big = "s/+/d/" + "x" * (MAX_WAITING_BYTES - 100)
    (refused,) = to(rig.rep.retained_ask(6, m.RetainedAsk([big], req=3)), 6)
    assert type(refused) is m.Error and "too many asks waiting" in refused.reason
    slices, answers = 0, []
    while rig.core.has_work:
        slices += 1
        outs = rig.core.work(rig.now)
        got = [(o.conn, o.msg) for o in outs if type(o.msg) is m.Retained]
        answers += [(conn, msg.req) for conn, msg in got]
        for conn, msg in got:
            if (conn, msg.req) == (5, 1):
                assert (msg.events, msg.complete) == whole
    assert slices >= 10
    assert answers == [(5, 1), (5, 2), (6, 2), (5, 3)]  # each connection's next in turn; 7: none
    assert to(rig.rep.retained_ask(8, m.RetainedAsk(["#"], req=1)), 8) == []
    rig.core.work(rig.now)
    rig.core.client_closed(8, rig.now)  # its walk ends at its next piece, unanswered
    assert [o for o in rig.core.work(rig.now) if type(o.msg) is m.Retained] == []
    assert not rig.core.has_work


def test_only_the_bound_on_everyone_s_asks_refuses_for_now(monkeypatch):
    """An ask past the bytes of asks waiting from all connections together is refused for
    now (``retry``: a following broker asks it again later); one past its connection's own
    bound, or one that could never fit the bound on all, is refused for good — asked again,
    it would only hold back the asks behind it."""
    from ges.core import retaining

    rig = Rig(SOLO_MQTT)
    rig.feed(rig.rep.restore(rig.now))
    monkeypatch.setattr(retaining, "MAX_WAITING_BYTES", 1000)
    monkeypatch.setattr(retaining, "MAX_ALL_WAITING_BYTES", 2000)
    rig.rep._asks_bytes = 1990  # (others' asks waiting)
    (refused,) = to(rig.rep.retained_ask(5, m.RetainedAsk(["a/#"], req=1)), 5)
    assert type(refused) is m.Error and refused.retry
    rig.rep._asks_bytes = 0
    over_own = "a/" + "x" * 1500
    (refused,) = to(rig.rep.retained_ask(5, m.RetainedAsk([over_own], req=2)), 5)
    assert type(refused) is m.Error and not refused.retry
    monkeypatch.setattr(retaining, "MAX_WAITING_BYTES", 10_000)
    over_all = "a/" + "x" * 2500
    (refused,) = to(rig.rep.retained_ask(5, m.RetainedAsk([over_all], req=3)), 5)
    assert type(refused) is m.Error and not refused.retry


def test_keeping_retained_messages_weighs_on_the_hand_on_slices():
    """Keeping a retained message (kept, counted, stored) costs ~20 ordinary deliveries: a
    burst of them is handed on in slices sized by that weight (RETAINED_WEIGHT), so that one
    slice does not hold the broker ~30 ms; all of them are kept in the end."""
    rig = Rig(SOLO_MQTT)
    rig.feed(rig.rep.restore(rig.now))
    rig.seq += 1
    burst = [ev(f"b/{i}", at=i) for i in range(2000)]
    outs = rig.core.client_message(PUB, m.Publish(rig.seq, burst), rig.now)
    outs += rig.core.on_logged(rig.now)  # the first slice, in the committing turn
    # two slices so far (the publish's own turn commits it alone, and this one), each of
    # about logged_slice / (RETAINED_WEIGHT + 1) events: unweighted, ~1,000 in all
    assert 0 < len(rig.rep.retained) <= 2 * (rig.core.config.logged_slice // RETAINED_WEIGHT)
    assert len(rig.rep.retained) < rig.core.config.logged_slice // 4
    rig.feed(outs)  # (and the rest, a slice at a time)
    assert len(rig.rep.retained) == 2000


def test_a_topology_that_names_no_mqtt_port_keeps_retained_messages_too():
    """Brokers given ``--mqtt-port`` serve MQTT without the topology saying so, and GES clients
    publish ``@retain`` events: a replicator cannot tell a network that serves no MQTT."""
    rig = Rig(SOLO)
    rig.feed(rig.rep.restore(rig.now))
    assert RETAINED_CONN in rig.core.subscriptions.clients
    retained_publish(rig, ev("t", b"x"))
    (answer,) = to(rig.feed(rig.rep.retained_ask(5, m.RetainedAsk(["#"]))), 5)
    assert payloads(answer.events) == [b"x"]


class CommittingStore(MemorySessionStore):
    """A store whose retained messages are durable only once a group is committed."""

    def __init__(self):
        super().__init__()
        self.marks = self.durable_to = 0

    @property
    def saved(self) -> int:
        return self.marks

    def durable(self, saved: int) -> bool:
        return saved <= self.durable_to

    def retain(self, kept) -> None:
        self.marks += 1
        super().retain(kept)


def test_no_tick_is_acknowledged_before_its_retained_message_is_durable():
    """A crash loses no retained message: the pubend's log keeps every tick whose change the
    store has not committed, for the read-back after the restart."""
    rig = Rig(SOLO_MQTT)
    rig.store = rig.rep.store = store = CommittingStore()
    rig.feed(rig.rep.restore(rig.now))
    retained_publish(rig, ev("home/kitchen", b"20", at=1))
    kept = rig.rep.retained.get("home/kitchen")
    retained_publish(rig, ev("home/hall", b"18", at=2))
    assert rig.rep.floor(kept.pubend) == kept.tick - 1
    rig.now += 1.0  # its catch-up reads the pubend, first heard of now, at its next timer
    rig.feed(rig.rep.on_timer(rig.now))
    assert "r~1" in rig.rep._caught
    assert rig.rep.floor(kept.pubend) == kept.tick - 1
    store.durable_to = 1  # the first change is committed, not the second
    rig.feed(rig.rep.on_committed())
    assert rig.rep.floor(kept.pubend) == rig.rep.retained.get("home/hall").tick - 1
    store.durable_to = store.marks
    rig.feed(rig.rep.on_committed())
    assert rig.rep.floor(kept.pubend) is None


PAIR_MQTT = {
    "name": "pair",
    "brokers": {
        "r": {"unit": "S/c1", "port": 1, "mqtt_port": 3},
        "x": {"unit": "S/c1", "port": 2},
    },
    "links": [["r", "x"]],
    "replicators": [{"unit": "S/c1", "broker": "r"}],
}


def test_a_restarted_replicator_reads_the_logs_for_its_retained_messages_only():
    """It ran before (it kept something): once its standing subscription is in place it reads
    each pubend's log after what its broker acknowledged, offers the pages to its retained
    set only (no session is held back or given old events), and acknowledges nothing it has
    not read, nor a tick whose change is not durable — a live change of a later tick made
    first included."""
    rig = Rig(PAIR_MQTT)
    store = CommittingStore()
    store.retain(Kept("old/t", 1, "x~1", 5, ev("old/t", b"o", 1)))
    store.durable_to = store.marks
    rig.store = rig.rep.store = store
    rep = rig.rep
    rig.feed(rep.restore(rig.now))
    assert rep._retained_req and not rep._restarted  # its sessions (none) are not held up
    assert rep.floor("x~1") == 0  # nothing read yet: nothing acknowledged
    rig.feed(rep.own(RETAINED_CONN, m.SubAck(1, req=rep._retained_req, complete=True), rig.now))
    assert rep.floor("x~1") == 0  # asked for from tick 1 (the link to x is down here)
    live = m.EventItem(1000, 0, 0, ev("a", b"live", at=100))
    rig.feed(rep.stored("x~1", [((RETAINED_CONN, 1), [live])]))
    page = [m.EventItem(200, 0, 0, ev("b", b"read", at=50))]
    rig.feed(rep.replayed(m.Recovered("x~1", "r", 1, 300, page, replay=True), rig.now))
    assert rep.floor("x~1") == 199  # read to 300, but tick 200's change is not durable
    rig.feed(rep.replayed(m.Recovered("x~1", "r", 301, 300, [], replay=True), rig.now))
    assert rep.floor("x~1") == 199  # read to the end (live from here): still not durable
    store.durable_to = store.marks
    rig.feed(rep.on_committed())
    assert rep.floor("x~1") is None
    events, _ = rep.retained.find(["#"])
    assert sorted(e.payload for e in events) == [b"live", b"o", b"read"]


def test_the_changes_not_yet_durable_give_their_lowest_tick_as_they_come_and_go():
    """Against the minimum worked out again each time: changes made with ticks out of order
    (a page read back and live events interleaved), let go of oldest first as groups
    commit."""
    rng = random.Random(7)
    q, model = Undurable(), []
    mark = durable_to = 0
    for _ in range(5_000):
        if rng.random() < 0.6:
            mark += 1
            tick = rng.randrange(1_000)
            q.add(mark, tick)
            model.append((mark, tick))
        else:
            durable_to = rng.randint(durable_to, mark)
            q.let_go(lambda m_, d=durable_to: m_ <= d)
            model = [(m_, t) for m_, t in model if m_ > durable_to]
        assert bool(q) == bool(model)
        if model:
            assert q.lowest == min(t for _, t in model)
