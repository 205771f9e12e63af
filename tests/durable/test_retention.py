"""Retention: a session nobody takes events from keeps at most its limits, and is told what
went (a gap notice first in its stream); never a silent loss."""

from __future__ import annotations

import pytest

from ges.core import BrokerCore
from ges.core.readback import Replay
from ges.errors import UserInputError
from ges.runtime.session_store import SqliteSessionStore
from ges.topology import Topology
from ges.wire import messages as m
from tests.durable.test_replicator_core import PAIR, PUB, SOLO, Rig, opened, to


def items(outs: list, conn: int) -> list[m.SessionItem]:
    return [it for msg in to(outs, conn) if type(msg) is m.SessionEvents for it in msg.items]


def away_with_limits(rig: Rig, **limits) -> None:
    """alice opens with her own limits, has nothing yet, and leaves."""
    rig.open(1, max_events=limits.get("max_events", 0), max_age=limits.get("max_age", 0.0))
    rig.rep.follower_closed(1, rig.now)


def test_over_its_event_limit_the_oldest_go_and_the_resume_begins_with_a_gap_notice():
    rig = Rig()
    away_with_limits(rig, max_events=3)
    rig.publish(10)
    rig.now += 1.5
    rig.feed(rig.core.on_timer(rig.now))
    assert any("7 events let go" in text for text in rig.notices)
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert (info.held, info.dropped) == (3, 7)
    outs = rig.open(2, subs=None)
    got = items(outs, 2)
    gaps = [it for it in got if it.gap_to]
    assert len(gaps) == 1 and "limit of 3 events" in gaps[0].why
    (gap,) = gaps
    assert (gap.item.tick, gap.gap_to) == (1, 7)  # the ticks of the events let go
    assert got[0] is gap  # before the rest
    assert [it.item.event.attributes["n"] for it in got if not it.gap_to] == [7, 8, 9]
    assert opened(outs, 2).start == 0


def test_events_older_than_the_age_limit_go_too():
    clock = [1000.0]
    rig = Rig()
    rig.store.clock = lambda: clock[0]
    away_with_limits(rig, max_age=60.0)
    rig.publish(4)
    clock[0] += 61
    rig.publish(2)
    rig.now += 1.5
    rig.feed(rig.core.on_timer(rig.now))
    outs = rig.open(2, subs=None)
    got = items(outs, 2)
    assert [it.gap_to for it in got if it.gap_to] == [4]
    assert [it.item.event.attributes["n"] for it in got if not it.gap_to] == [0, 1]


def test_the_topologys_limits_apply_to_a_session_without_its_own():
    rig = Rig({**SOLO, "sessions": {"max_events": 2}})
    away_with_limits(rig)
    rig.publish(5)
    rig.now += 1.5
    rig.feed(rig.core.on_timer(rig.now))
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert (info.held, info.dropped) == (2, 3)


def test_a_connected_client_keeping_up_loses_nothing():
    rig = Rig({**SOLO, "sessions": {"max_events": 2}})
    rig.open(1)
    for _ in range(3):
        outs = rig.publish(2)
        epochs = [it.epoch for it in items(outs, 1)]
        rig.ack(1, epochs[-1])
        rig.now += 1.5
        rig.feed(rig.core.on_timer(rig.now))
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert (info.held, info.dropped, info.acked) == (0, 0, 6)


def test_an_acknowledged_gap_is_not_told_again_and_a_session_away_too_long_is_stale():
    rig = Rig({**SOLO, "sessions": {"max_events": 1, "max_age": 30}})
    away_with_limits(rig)
    rig.publish(3)
    rig.now += 1.5
    rig.feed(rig.core.on_timer(rig.now))
    outs = rig.open(2, subs=None)
    last = items(outs, 2)[-1].epoch
    rig.ack(2, last)
    rig.rep.follower_closed(2, rig.now)
    again = items(rig.open(3, subs=None), 3)
    assert again == []  # nothing new, and the gap was had
    rig.rep.follower_closed(3, rig.now)
    rig.now += 31
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert info.stale and info.at == ""


def test_retention_survives_a_restart_of_the_store(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.db")

    def commit():
        store.committed_to(store.write_group(store.take_group()))

    rig = Rig.__new__(Rig)
    topology = Topology.from_dict({**SOLO, "sessions": {"max_events": 2}}, source="<t>")
    rig.store = store
    rig.core = BrokerCore(topology, "r", incarnation=1, reliable=True, sessions=store)
    rig.rep, rig.now, rig.seq, rig.notices = rig.core.replicator, 0.0, 0, []
    rig.core.client_open(PUB, "pub")
    away_with_limits(rig)
    commit()
    rig.publish(5)
    commit()
    rig.now += 1.5
    rig.feed(rig.core.on_timer(rig.now))
    commit()
    store.close()
    state = SqliteSessionStore(tmp_path / "s.db").sessions()["alice"]
    assert (state.dropped, state.max_events) == (3, 0)
    assert state.gaps and state.trimmed > 0 and "limit of 2 events" in state.gap_why


def test_what_is_held_stays_the_stores_count_through_partial_acks_and_retention_in_flight():
    """The held count an ack takes off comes from the batches in flight: an ack in the middle
    of a batch, and events retention let go while they were in flight, are counted once."""
    rig = Rig({**SOLO, "sessions": {"max_events": 3}})
    rig.open(1)
    outs = rig.publish(10)  # sent, none acknowledged
    epochs = [it.epoch for it in items(outs, 1)]
    assert len(epochs) == 10

    def held() -> int:
        (info,) = rig.rep.find("alice", rig.now).sessions
        assert info.held == rig.store.held(rig.key(), info.acked)[0]
        return info.held

    rig.ack(1, epochs[1])
    assert held() == 8
    rig.now += 1.5
    rig.feed(rig.core.on_timer(rig.now))  # 5 of the 8 in flight let go
    assert held() == 3
    rig.ack(1, epochs[8])  # past what went: only 9's own counts
    assert held() == 1
    rig.ack(1, epochs[9])
    assert held() == 0


def test_a_gap_read_back_counts_as_held_like_any_stored_event():
    """A range the pubend's log no longer has, read back after a restart, is a gap notice
    stored for every session: it is held for them as an event is (retention counts it, an
    ack of it takes it off)."""
    rig = Rig()
    rig.open(1)
    outs = rig.publish(2)
    rig.rep._replays["elsewhere"] = Replay(1)  # a pubend being read back
    outs += rig.feed(rig.rep.replayed(m.Recovered("elsewhere", "r", 1, 5, [], lost=True), rig.now))
    outs += rig.feed(rig.core.work(rig.now))
    got = items(outs, 1)
    assert [it.gap_to for it in got] == [0, 0, 5]
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert info.held == rig.store.held(rig.key(), info.acked)[0] == 3
    assert info.last == got[-1].epoch
    rig.ack(1, got[-1].epoch)
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert info.held == 0


def test_a_session_whose_client_stays_away_past_its_expiry_ends_and_one_back_in_time_does_not():
    """An MQTT 5.0 client's Session Expiry Interval: counted from when its client left, and
    anew each time it leaves; ended then, with a line saying why; kept by the store."""
    rig = Rig()
    rig.open(1, expiry=10.0)
    rig.open(3, name="bob", owner="bob", expiry=10.0)
    rig.open(4, name="carol", owner="carol")  # none: retention only
    for conn in (1, 3, 4):
        rig.rep.follower_closed(conn, rig.now)
    left = rig.now
    rig.now = left + 6
    rig.open(5, subs=None)  # alice is back in time, and leaves again at +8
    rig.now = left + 8
    rig.rep.follower_closed(5, rig.now)
    rig.now = left + 10.5
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == ["alice", "carol"]
    assert any("durable session bob ended" in t and "expiry of 10 s" in t for t in rig.notices)
    rig.now = left + 18.5
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == ["carol"]
    rig.now += 3600
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == ["carol"]


def test_a_client_leaving_with_an_expiry_sets_it_and_one_leaving_with_end_ends_the_session():
    """An MQTT 5.0 DISCONNECT's Session Expiry Interval (``SessionLeave``): the session's
    expiry from then on, kept by the store; 0 ends it as its client goes. Only the session's
    follower is heard."""
    rig = Rig()
    rig.open(1, expiry=600.0)
    rig.open(3, name="bob", owner="bob", expiry=600.0)
    rig.open(4, name="carol", owner="carol", expiry=600.0)
    assert rig.core.client_message(9, m.SessionLeave("alice", end=True), rig.now) == []
    assert rig.rep.sessions["alice"].follower == 1  # not its follower: nothing
    rig.feed(rig.core.client_message(1, m.SessionLeave("alice", expiry=5.0), rig.now))
    rig.feed(rig.core.client_message(3, m.SessionLeave("bob", end=True), rig.now))
    rig.feed(rig.core.client_message(4, m.SessionLeave("carol"), rig.now))  # as it was
    assert sorted(rig.rep.sessions) == ["alice", "carol"]
    assert any("bob ended" in t and "Session Expiry Interval 0" in t for t in rig.notices)
    assert rig.rep.sessions["alice"].follower is None
    assert rig.rep.sessions["alice"].state.expiry == 5.0
    assert rig.rep.store.sessions()["alice"].expiry == 5.0
    assert "bob" not in rig.rep.store.sessions()
    rig.now += 5.5
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == ["carol"]
    rig.now += 600
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == []


def test_a_lookup_of_a_session_by_a_broker_its_client_connects_at_counts_as_its_client_back():
    """The broker a client reconnects at finds its session's replicator first (a lookup), then
    opens it: the expiry counts from the lookup, so the time the lookup takes is not held
    against the client."""
    rig = Rig()
    rig.open(1, expiry=10.0)
    rig.rep.follower_closed(1, rig.now)
    left = rig.now
    rig.now = left + 9
    assert [s.name for s in rig.rep.find("alice", rig.now, lookup=True).sessions] == ["alice"]
    rig.now = left + 12
    rig.feed(rig.core.on_timer(rig.now))
    assert "alice" in rig.rep.sessions
    rig.now = left + 19.5
    rig.feed(rig.core.on_timer(rig.now))
    assert "alice" not in rig.rep.sessions


def test_the_topologys_expire_after_ends_sessions_without_an_expiry_of_their_own():
    """``sessions.expire_after``: how long a session whose client has gone is kept (what
    bounds the sessions of clients that never come back); one with a shorter expiry of its
    own (an MQTT 5.0 client's Session Expiry Interval) keeps that, a longer one is bounded."""
    rig = Rig({**SOLO, "sessions": {"expire_after": "1m"}})
    rig.open(1)
    rig.open(3, name="bob", owner="bob", expiry=30.0)
    rig.open(4, name="carol", owner="carol", expiry=600.0)
    for conn in (1, 3, 4):
        rig.rep.follower_closed(conn, rig.now)
    rig.now += 31
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == ["alice", "carol"]
    rig.now += 28
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == ["alice", "carol"]
    rig.now += 2
    rig.feed(rig.core.on_timer(rig.now))
    assert sorted(rig.rep.sessions) == []
    assert any("alice ended" in t and "expiry of 60 s" in t for t in rig.notices)


@pytest.mark.parametrize("bad", ["soon", 0, -5, True])
def test_expire_after_is_a_duration_or_never_and_a_bad_one_is_one_line(bad):
    never = Topology.from_dict({**SOLO, "sessions": {"expire_after": "never"}}, source="<t>")
    assert never.session_limits.expire_after == float("inf")
    assert never.digest == Topology.from_dict(SOLO, source="<t>").digest  # the default
    month = Topology.from_dict({**SOLO, "sessions": {"expire_after": "30d"}}, source="<t>")
    assert month.session_limits.expire_after == 30 * 86400.0
    again = Topology.from_dict(month.to_dict(), source="<again>")
    assert again.session_limits == month.session_limits and again.digest == month.digest
    other = Topology.from_dict({**SOLO, "sessions": {"max_events": 5}}, source="<t>")
    assert "expire_after" not in other.to_dict()["sessions"]  # (the default: as before)
    with pytest.raises(UserInputError) as e:
        Topology.from_dict({**SOLO, "sessions": {"expire_after": bad}}, source="<t>")
    assert "sessions.expire_after must be" in str(e.value) and "\n" not in str(e.value)


def published(rig: Rig, outs: list, conn: int = 5) -> list[m.Event]:
    """The events a session streaming to ``conn`` was sent, once the log took what was
    published (the core's timer and log commit run)."""
    outs = rig.feed(outs + rig.core.on_logged(rig.now))
    return [it.item.event for msg in to(outs, conn) if type(msg) is m.SessionEvents for it in msg.items]  # fmt: skip


def test_a_held_will_goes_after_its_delay_unless_its_session_is_opened_first_or_ends_first():
    """MQTT 5.0's Will Delay Interval (§3.1.3.2.2) held by the replicator: published once the
    delay has passed, its publish time moved on by it (its Message Expiry counts from then);
    never if the session is opened again first, at any broker; at once if the session ends
    first. Kept by the store meanwhile."""
    rig = Rig()
    rig.open(5, name="bob", owner="bob")  # sees every event with an n
    will = m.Event({"n": 99}, b"alice's will", 1_000)
    rig.open(1)
    rig.feed(
        rig.core.client_message(1, m.SessionLeave("alice", will=will, will_delay=10.0), rig.now)
    )
    assert rig.store.sessions()["alice"].will == will
    assert rig.core.next_deadline() <= rig.now + 10
    rig.now += 9
    assert published(rig, rig.core.on_timer(rig.now)) == []
    rig.now += 1.5
    (went,) = published(rig, rig.core.on_timer(rig.now))
    assert (went.payload, went.published_at) == (b"alice's will", 1_000 + 10_500_000_000)
    assert rig.store.sessions()["alice"].will is None
    # back before its delay: it never goes
    rig.open(2, subs=None)
    rig.feed(
        rig.core.client_message(2, m.SessionLeave("alice", will=will, will_delay=10.0), rig.now)
    )
    rig.now += 5
    rig.open(3, subs=None)
    assert rig.store.sessions()["alice"].will is None
    rig.now += 60
    assert published(rig, rig.core.on_timer(rig.now)) == []
    # the session ends first (its expiry, or a DISCONNECT's 0): at once
    rig.open(4, name="carol", owner="carol", expiry=5.0)
    leave = m.SessionLeave("carol", will=m.Event({"n": 1}, b"carol's"), will_delay=60.0)
    rig.feed(rig.core.client_message(4, leave, rig.now))
    rig.now += 5.5
    assert [e.payload for e in published(rig, rig.core.on_timer(rig.now))] == [b"carol's"]
    assert "carol" not in rig.rep.sessions
    leave = m.SessionLeave(
        "alice", end=True, will=m.Event({"n": 2}, b"alice ends"), will_delay=60.0
    )
    assert [e.payload for e in published(rig, rig.core.client_message(3, leave, rig.now))] == [
        b"alice ends"
    ]
    assert sum("will is published" in t for t in rig.notices) == 3


def test_a_will_held_by_a_replicator_that_restarts_goes_its_delay_after_the_restart():
    rig = Rig()
    rig.open(1)
    will = m.Event({"n": 99}, b"will")
    rig.feed(
        rig.core.client_message(1, m.SessionLeave("alice", will=will, will_delay=10.0), rig.now)
    )
    again = Rig()
    again.store = rig.store
    again.core = BrokerCore(
        rig.core.topology, "r", incarnation=2, reliable=True, sessions=rig.store
    )
    again.rep = again.core.replicator
    again.now = 100.0
    again.feed(again.rep.restore(again.now))
    again.now += 9
    again.feed(again.core.on_timer(again.now))
    assert again.store.sessions()["alice"].will == will
    again.now += 1.5
    again.feed(again.core.on_timer(again.now) + again.core.on_logged(again.now))
    assert again.store.sessions()["alice"].will is None
    assert any("alice: its client's will is published" in t for t in again.notices)


def test_a_will_left_by_a_client_moved_away_is_held_and_one_taken_over_is_not():
    """The leave of a client whose session no connection has now (moved by ``ges roam``) holds
    its will for the delay; the leave of one whose session another connection has (a takeover:
    its client is back) drops it; so does the leave of one whose session another connection
    is opening."""
    rig = Rig(PAIR)
    will = m.Event({"n": 1}, b"w")
    rig.open(1)
    rig.control("roam", to="x")
    assert rig.rep.sessions["alice"].follower is None
    rig.feed(
        rig.core.client_message(1, m.SessionLeave("alice", will=will, will_delay=9.0), rig.now)
    )
    assert rig.rep.sessions["alice"].state.will == will
    rig.open(2, subs=None)  # back: it never goes
    assert rig.rep.sessions["alice"].state.will is None
    rig.feed(
        rig.core.client_message(1, m.SessionLeave("alice", will=will, will_delay=9.0), rig.now)
    )
    live = rig.rep.sessions["alice"]
    assert live.state.will is None
    assert 2 in (live.follower, live.opening and live.opening[0])  # its, or being opened for it
