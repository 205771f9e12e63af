"""The sans-I/O replicator (ges.core.replicator) inside a broker core, with no network: durable
sessions opened, streamed within their window, acknowledged, taken over, resumed, listed,
roamed, ended.

The core's messages to a negative connection are a session's own subscriptions' answers: the
driver (:meth:`Rig.feed`, as ges.runtime.broker does) hands them back to the replicator."""

from __future__ import annotations

import pytest

from ges.core import BrokerCore, Notice, ToClient
from ges.core.streaming import PUMP_BYTES, WINDOW_BYTES
from ges.durable.profiles import MAX_SESSION_SUBS
from ges.durable.store import MemorySessionStore
from ges.topology import Topology
from ges.wire import messages as m

#: one broker hosting its cluster's replicator
SOLO = {
    "name": "solo",
    "brokers": {"r": {"unit": "S/c1", "port": 1}},
    "links": [],
    "replicators": [{"unit": "S/c1", "broker": "r"}],
}
#: the replicator's broker and one more (for roam); the link stays down
PAIR = {
    "name": "pair",
    "brokers": {"r": {"unit": "S/c1", "port": 1}, "x": {"unit": "S/c1", "port": 2}},
    "links": [["r", "x"]],
    "replicators": [{"unit": "S/c1", "broker": "r"}],
}

PUB = 9  # the publisher's connection
WALL = 1_700_000_000.0  # the time of day a session is created at
SUB = m.SessionSub(1, "p", [[m.Constraint("n", "exists")]])
BIG = b"x" * (WINDOW_BYTES // 4)  # four events fill the window


class Rig:
    """A reliable broker core hosting a replicator, a publisher connected to it, and a driver
    feeding the sessions' own answers back."""

    def __init__(self, data: dict = SOLO):
        topology = Topology.from_dict(data, source="<t>")
        self.store = MemorySessionStore()
        self.core = BrokerCore(topology, "r", incarnation=1, reliable=True, sessions=self.store)
        self.rep = self.core.replicator
        self.now = 0.0
        #: the lines the core logged
        self.notices: list[str] = []
        self.seq = 0
        self.core.client_open(PUB, "pub")

    def feed(self, outs: list) -> list:
        """Perform the core's outputs: those to a session's own connection go back to the
        replicator (and the core's work is run), the rest are returned in order."""
        rest: list = []
        queue = list(outs)
        while queue or self.core.has_work:
            if not queue:
                queue = self.core.work(self.now)
                continue
            out = queue.pop(0)
            if type(out) is ToClient and out.conn < 0:
                queue += self.rep.own(out.conn, out.msg, self.now)
            elif type(out) is Notice:
                self.notices.append(out.text)
            else:
                rest.append(out)
        return rest

    def open(self, conn: int, name: str = "alice", subs=(SUB,), owner: str = "alice", **kw):
        msg = m.SessionOpen(name, None if subs is None else list(subs), owner=owner, at="r", **kw)
        return self.feed(self.rep.open(conn, msg, self.now, WALL))

    def publish(self, k: int, payload: bytes = b"", attr: str = "n") -> list:
        """``k`` events from the publisher, logged; the outputs but the PubAck."""
        self.seq += 1
        events = [m.Event({attr: i}, payload) for i in range(k)]
        outs = self.core.client_message(PUB, m.Publish(self.seq, events), self.now)
        outs += self.core.on_logged(self.now)
        rest = self.feed(outs)
        acks = [o for o in rest if o.conn == PUB]
        assert [type(o.msg) for o in acks] == [m.PubAck]
        return [o for o in rest if o.conn != PUB]

    def ack(self, conn: int, epoch: int, name: str = "alice") -> list:
        return self.feed(self.rep.ack(conn, m.SessionAck(name, epoch)))

    def control(self, action: str, name: str = "alice", *, who="op", operator=True, **kw):
        msg = m.SessionControl(action, name, **kw)
        return self.feed(self.rep.control(77, msg, who, operator, self.now))

    def key(self, name: str = "alice") -> int:
        return self.rep.sessions[name].state.key


def to(outs: list, conn: int) -> list:
    """The messages to connection ``conn``, in order."""
    return [o.msg for o in outs if getattr(o, "conn", None) == conn]


def sent_epochs(outs: list, conn: int) -> list[int]:
    return [it.epoch for msg in to(outs, conn) if type(msg) is m.SessionEvents for it in msg.items]


def opened(outs: list, conn: int) -> m.SessionOpened:
    (msg,) = [msg for msg in to(outs, conn) if type(msg) is m.SessionOpened]
    return msg


@pytest.fixture
def rig() -> Rig:
    return Rig()


# -- opening and streaming --------------------------------------------------------------------


def test_the_solo_topology_loads_with_its_replicator(rig):
    assert rig.rep is not None and rig.rep.store is rig.store
    assert [(r.unit, r.broker) for r in rig.core.topology.replicators] == [(("S", "c1"), "r")]


def test_opening_a_new_session_answers_session_opened(rig):
    outs = rig.open(1, req=5)
    (opened,) = to(outs, 1)
    assert opened == m.SessionOpened(
        "alice", "r", "memory", True, 0, 0, [(1, "p")], req=5, profiles=[SUB.conjunctions]
    )  # the profiles come back (an MQTT persistent session keeps no copy of its own)
    assert [o.conn for o in outs] == [1]
    (state,) = rig.store.sessions().values()
    assert (state.name, state.owner, state.created, state.acked) == ("alice", "alice", WALL, 0)
    assert state.subs == {1: ("p", [[m.Constraint("n", "exists")]])}


def test_events_stream_to_the_follower_in_epoch_order(rig):
    rig.open(1)
    outs = rig.publish(3) + rig.publish(2)
    assert sent_epochs(outs, 1) == [1, 2, 3, 4, 5]
    items = [it for msg in to(outs, 1) for it in msg.items]
    assert [it.item.event.attributes["n"] for it in items] == [0, 1, 2, 0, 1]
    assert [it.item.tick for it in items] == [1, 2, 3, 4, 5]
    assert {it.pubend for it in items} == {rig.core.pubend}
    assert all(it.subs == [1] for it in items)
    assert all(msg.name == "alice" for msg in to(outs, 1))


def test_an_event_no_subscription_matches_is_not_stored(rig):
    rig.open(1)
    assert rig.publish(2, attr="other") == []
    assert rig.store.last == 0


def test_an_event_two_sessions_want_is_stored_once_and_sent_to_both(rig):
    rig.open(1, "alice")
    rig.open(2, "bob", owner="bob")
    outs = rig.publish(1)
    assert sent_epochs(outs, 1) == sent_epochs(outs, 2) == [1]
    assert rig.store.last == 1


def test_not_more_than_the_window_is_sent_before_an_ack(rig):
    rig.open(1)
    outs = rig.publish(12, BIG)
    first = sent_epochs(outs, 1)
    assert first == list(range(1, len(first) + 1))
    assert 0 < len(first) < 12
    size = m.event_size(m.Event({"n": 0}, BIG))
    # at most one event's worth beyond the window
    assert (len(first) - 1) * size < WINDOW_BYTES
    assert rig.publish(1) == []  # the window is full: nothing more goes, not even small ones


def test_an_ack_opens_the_window_and_the_rest_follows_in_order(rig):
    rig.open(1)
    got = sent_epochs(rig.publish(12, BIG), 1)
    while len(got) < 12:
        more = sent_epochs(rig.ack(1, got[-1]), 1)
        assert more, "an ack of everything sent lets more go"
        got += more
    assert got == list(range(1, 13))
    assert sent_epochs(rig.ack(1, 12), 1) == []


def answered(rig: Rig, queue: list) -> list:
    """The messages to clients of outputs, the session's own subscriptions' answers handed
    back to the replicator — but no slice of the core's work run (unlike Rig.feed)."""
    outs = []
    while queue:
        out = queue.pop(0)
        if type(out) is ToClient and out.conn < 0:
            queue += rig.rep.own(out.conn, out.msg, rig.now)
        elif type(out) is ToClient:
            outs.append(out)
    return outs


def away_with_a_backlog(rig: Rig) -> tuple[m.SessionOpen, int]:
    """alice's client went away and 3,000 events of 500 bytes were kept for her: the open
    that brings her back, and an event's size."""
    rig.open(1)
    rig.rep.follower_closed(1, rig.now)
    payload = b"x" * 500
    rig.publish(3_000, payload)
    opening = m.SessionOpen("alice", [SUB], owner="alice", at="r")
    return opening, m.event_size(m.Event({"n": 0}, payload))


def test_a_takeover_while_a_window_is_on_its_way_gets_a_whole_window(rig):
    """The rest of a window goes on from the core's work; a client that takes the session
    over meanwhile (another connection) gets its own window filled all the same."""
    opening, size = away_with_a_backlog(rig)
    answered(rig, rig.rep.open(2, opening, rig.now, WALL))
    answered(rig, rig.core.work(rig.now))  # one slice of the rest, to connection 2
    got = sent_epochs(answered(rig, rig.rep.open(3, opening, rig.now, WALL)), 3)
    while rig.core.has_work:
        got += sent_epochs(answered(rig, rig.core.work(rig.now)), 3)
    assert got == list(range(1, len(got) + 1))  # from the acknowledged point, in order
    assert (len(got) + 1) * size >= WINDOW_BYTES


def test_a_window_of_small_events_goes_a_slice_at_a_time(rig):
    """A client back to a backlog of small events: its window is thousands of them, too many
    to send in one go; the open sends about PUMP_BYTES of them, the core's work the rest a
    page per slice — in order, each slice bounded, until the window is full."""
    opening, size = away_with_a_backlog(rig)
    got = sent_epochs(answered(rig, rig.rep.open(2, opening, rig.now, WALL)), 2)
    assert len(got) > 0 and (len(got) - 1) * size < PUMP_BYTES
    slices = []
    while rig.core.has_work:
        more = sent_epochs(answered(rig, rig.core.work(rig.now)), 2)
        if more:
            slices.append(len(more))
        got += more
    assert len(slices) > 2 and max(slices) * size <= PUMP_BYTES + size
    assert got == list(range(1, len(got) + 1))
    assert (len(got) - 1) * size < WINDOW_BYTES <= (len(got) + 1) * size  # the window, full
    more = sent_epochs(rig.ack(2, got[-1]), 2)  # acknowledged: the next window, in slices
    assert more and more[0] == got[-1] + 1


def test_what_is_sent_beyond_the_acknowledged_epoch_stays_within_the_window(rig):
    rig.open(1)
    size = m.event_size(m.Event({"n": 0}, BIG))
    got = sent_epochs(rig.publish(12, BIG), 1)
    acked = 0
    while len(got) < 12:
        # part of what was sent, then all of it
        for epoch in (max(acked + 1, got[-1] - 1), got[-1]):
            acked = epoch
            got += sent_epochs(rig.ack(1, epoch), 1)
            assert (got[-1] - acked - 1) * size < WINDOW_BYTES
    assert got == list(range(1, 13))


def test_an_ack_releases_what_it_covers(rig):
    rig.open(1)
    rig.publish(5)
    assert rig.store.held(rig.key(), 0) == (5, 5)
    rig.ack(1, 3)
    assert rig.rep.sessions["alice"].state.acked == 3
    assert rig.store.held(rig.key(), 0) == (2, 5)
    assert rig.store.sessions()["alice"].acked == 3


def test_an_ack_counts_only_up_to_what_was_sent(rig):
    rig.open(1)
    rig.publish(12, BIG)
    sent = rig.rep.sessions["alice"].sent
    assert sent < 12
    rig.ack(1, 1000)
    assert rig.rep.sessions["alice"].state.acked == sent


def test_an_ack_from_a_connection_that_does_not_follow_is_ignored(rig):
    rig.open(1)
    rig.publish(3)
    assert rig.ack(2, 3) == []
    assert rig.rep.sessions["alice"].state.acked == 0
    assert rig.store.held(rig.key(), 0) == (3, 3)


# -- taking over and resuming -----------------------------------------------------------------


def test_a_second_open_takes_the_session_over_and_tells_the_first(rig):
    rig.open(1)
    outs = rig.open(2)
    (closed,) = to(outs, 1)
    assert type(closed) is m.SessionClosed and closed.name == "alice"
    assert "taken over" in closed.reason and not closed.ended and closed.to == ""
    assert opened(outs, 2).created is False
    # the first is told before the second is answered
    assert [o.conn for o in outs][:2] == [1, 2]


def test_opens_in_quick_succession_on_one_connection_take_nothing_over(rig):
    """An MQTT client's SUBSCRIBEs one after another on a persistent session: each is an open
    on the same connection, the next coming before the last one's subscriptions are in. No
    takeover (it was told it was taken over, and cut); both are answered, in order."""
    rig.open(1)
    changed = [
        m.SessionSub(1, "p", [[m.Constraint("n", "exists")], [m.Constraint("k", "exists")]]),
        m.SessionSub(2, "q", [[m.Constraint("k", "exists")]]),
    ]
    outs = []
    for req, subs in ((7, changed[:1]), (8, changed)):
        ask = m.SessionOpen("alice", subs, owner="alice", at="r", req=req)
        outs += rig.rep.open(1, ask, rig.now, WALL)  # (its SubAcks not handed back yet)
    told = to(rig.feed(outs), 1)
    assert [type(x) for x in told if type(x) is not m.SessionEvents] == [m.SessionOpened] * 2
    assert [x.req for x in told if type(x) is m.SessionOpened] == [7, 8]
    assert sorted(rig.rep.sessions["alice"].state.subs) == [1, 2]
    assert rig.rep.sessions["alice"].follower == 1


def test_a_resumed_session_opened_to_end_with_its_client_ends_however_it_leaves(rig):
    """``SessionOpen.ends`` (an MQTT 5.0 client resuming without Clean Start or an interval,
    §3.1.2.11.2): any leave of its follower ends it, and so does the loss of the connection
    it follows on; a leave saying the client is back here (``back``, a takeover on the same
    follow connection) does not, nor does a later open without it, nor anyone else's leave."""
    for how in ("leave", "lost"):
        rig.open(1)
        outs = rig.open(1, subs=None, create=False, ends=True)
        assert opened(outs, 1).created is False
        if how == "leave":
            rig.feed(rig.rep.leave(1, m.SessionLeave("alice"), rig.now))
        else:
            rig.feed(rig.rep.follower_closed(1, rig.now))
        assert "alice" not in rig.rep.sessions and not rig.store.sessions(), how
        assert "durable session alice ended" in rig.notices[-1]
    rig.open(1, subs=None if "alice" in rig.rep.sessions else (SUB,))
    rig.open(1, subs=None, create=False, ends=True)
    rig.feed(rig.rep.leave(2, m.SessionLeave("alice"), rig.now))  # not its follower
    rig.feed(rig.rep.leave(1, m.SessionLeave("alice", back=True), rig.now))
    assert "alice" in rig.rep.sessions  # its client is back on another connection
    rig.open(1, subs=None, create=False, ends=True)
    rig.open(1, subs=None)  # a persistent open after it: it outlives its client again
    rig.feed(rig.rep.follower_closed(1, rig.now))
    assert "alice" in rig.rep.sessions and rig.rep.sessions["alice"].follower is None


def test_after_a_takeover_events_go_only_to_the_new_follower(rig):
    rig.open(1)
    rig.open(2)
    outs = rig.publish(2)
    assert to(outs, 1) == []
    assert sent_epochs(outs, 2) == [1, 2]
    assert rig.ack(1, 2) == [] and rig.rep.sessions["alice"].state.acked == 0


def test_a_takeover_resumes_after_the_acknowledged_epoch(rig):
    rig.open(1)
    assert sent_epochs(rig.publish(5), 1) == [1, 2, 3, 4, 5]
    rig.ack(1, 2)
    outs = rig.open(2)
    got = opened(outs, 2)
    assert (got.start, got.backlog) == (2, 3)
    # nothing acknowledged is sent again; what was sent but not acknowledged is
    assert sent_epochs(outs, 2) == [3, 4, 5]


def test_each_open_logs_where_the_client_is_and_what_it_has_to_catch_up(rig):
    """The line a watcher sees (ges monitor's event log): a move names both brokers."""
    rig.open(1)
    assert rig.notices[-1] == "durable session alice: opened at r, 0 to replay"
    rig.publish(3)
    rig.ack(1, 3)
    rig.rep.follower_closed(1, rig.now)
    rig.publish(1200)
    msg = m.SessionOpen("alice", None, owner="alice", at="b19")
    rig.feed(rig.rep.open(2, msg, rig.now, WALL))
    assert rig.notices[-1] == "durable session alice: r -> b19, 1,200 to replay"


def test_a_client_presenting_its_epoch_and_the_stores_id_resumes_after_it(rig):
    rig.open(1)
    rig.publish(5)
    outs = rig.open(2, epoch=4, store=rig.store.id)
    assert opened(outs, 2).start == 4
    assert sent_epochs(outs, 2) == [5]
    # what it presented counts as acknowledged
    assert rig.rep.sessions["alice"].state.acked == 4
    assert rig.store.held(rig.key(), 0) == (1, 5)


def test_an_epoch_presented_with_another_stores_id_is_not_trusted(rig):
    rig.open(1)
    rig.publish(5)
    rig.ack(1, 1)
    outs = rig.open(2, epoch=4, store="another-store")
    assert opened(outs, 2).start == 1
    assert sent_epochs(outs, 2) == [2, 3, 4, 5]


def test_an_epoch_beyond_what_is_stored_resumes_at_the_last_stored(rig):
    rig.open(1)
    rig.publish(3)
    outs = rig.open(2, epoch=99, store=rig.store.id)
    assert opened(outs, 2).start == 3
    assert sent_epochs(outs, 2) == []
    assert sent_epochs(rig.publish(1), 2) == [4]


def test_an_epoch_below_the_acknowledged_one_sends_nothing_again(rig):
    rig.open(1)
    rig.publish(4)
    rig.ack(1, 3)
    outs = rig.open(2, epoch=1, store=rig.store.id)
    assert opened(outs, 2).start == 3
    assert sent_epochs(outs, 2) == [4]


def test_another_owner_is_denied(rig):
    rig.open(1)
    outs = rig.open(2, owner="mallory", req=8)
    (err,) = to(outs, 2)
    assert type(err) is m.Error and err.denied and err.req == 8
    assert to(outs, 1) == []  # the session's follower is not disturbed
    assert sent_epochs(rig.publish(1), 1) == [1]


def test_an_operator_may_open_another_owners_session(rig):
    rig.open(1)
    outs = rig.open(2, owner="root", operator=True)
    assert opened(outs, 2).name == "alice"
    assert type(to(outs, 1)[0]) is m.SessionClosed
    assert rig.rep.sessions["alice"].state.owner == "alice"


def test_resuming_without_subscriptions_keeps_the_stored_ones(rig):
    rig.open(1)
    outs = rig.open(2, subs=None)
    assert opened(outs, 2).subs == [(1, "p")]
    assert sent_epochs(rig.publish(1), 2) == [1]


def test_resuming_with_new_subscriptions_replaces_the_stored_ones(rig):
    rig.open(1)
    new = m.SessionSub(2, "q", [[m.Constraint("k", "exists")]])
    outs = rig.open(2, subs=[new])
    assert opened(outs, 2).subs == [(2, "q")]
    assert rig.store.sessions()["alice"].subs == {2: ("q", [[m.Constraint("k", "exists")]])}
    assert rig.publish(1, attr="n") == []  # the old profile is gone
    outs = rig.publish(1, attr="k")
    (msg,) = to(outs, 2)
    assert [it.subs for it in msg.items] == [[2]]


def test_opening_a_session_that_does_not_exist_without_subscriptions_is_an_error(rig):
    (err,) = to(rig.open(1, subs=None, req=3), 1)
    assert type(err) is m.Error and err.req == 3 and not err.denied
    assert rig.rep.sessions == {}


def test_opening_a_session_that_does_not_exist_without_create_is_an_error(rig):
    (err,) = to(rig.open(1, create=False), 1)
    assert type(err) is m.Error and "no durable session" in err.reason
    assert rig.rep.sessions == {}


def test_find_names_the_session_or_nothing(rig):
    rig.open(1)
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert (info.name, info.replicator, info.at) == ("alice", "r", "r")
    assert rig.rep.find("bob", rig.now).sessions == []


# -- bad requests -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "x" * 129])
def test_a_bad_name_is_one_error(rig, name):
    outs = rig.open(1, name=name, req=4)
    assert len(outs) == 1
    (err,) = to(outs, 1)
    assert type(err) is m.Error and err.req == 4 and "session name" in err.reason
    assert rig.rep.sessions == {} and rig.store.sessions() == {}


def test_too_many_subscriptions_is_one_error(rig):
    subs = [m.SessionSub(i, f"p{i}", [[m.Constraint("n", "exists")]]) for i in range(17)]
    assert len(subs) > MAX_SESSION_SUBS
    outs = rig.open(1, subs=subs, req=6)
    assert len(outs) == 1
    (err,) = to(outs, 1)
    assert type(err) is m.Error and err.req == 6 and str(MAX_SESSION_SUBS) in err.reason
    assert rig.rep.sessions == {}


def test_the_most_subscriptions_a_session_may_hold_are_accepted(rig):
    subs = [m.SessionSub(i, f"p{i}", [[m.Constraint("n", "exists")]]) for i in range(16)]
    assert opened(rig.open(1, subs=subs), 1).subs == [(i, f"p{i}") for i in range(16)]


@pytest.mark.parametrize(
    "subs",
    [[], [SUB, m.SessionSub(1, "q", [[m.Constraint("k", "exists")]])]],
    ids=["none", "repeated-number"],
)
def test_no_subscriptions_or_a_repeated_number_is_one_error(rig, subs):
    outs = rig.open(1, subs=subs)
    assert len(outs) == 1 and type(to(outs, 1)[0]) is m.Error
    assert rig.rep.sessions == {}


def test_an_open_with_a_bad_profile_is_answered_with_an_error(rig):
    """A constraint the broker cannot parse: the opener is told (it is not left waiting for a
    subscription that never starts)."""
    bad = m.SessionSub(1, "p", [[m.Constraint("n", "bogus")]])
    outs = rig.open(1, subs=[bad], req=2)
    assert [type(msg) for msg in to(outs, 1)] == [m.Error]
    assert to(outs, 1)[0].req == 2


# -- operators: list, roam, end ---------------------------------------------------------------


def test_list_shows_the_session_with_its_held_count(rig):
    rig.open(1)
    rig.publish(3)
    rig.ack(1, 1)
    outs = rig.control("list", "", req=11)
    (answer,) = to(outs, 77)
    assert type(answer) is m.SessionList and answer.req == 11
    (info,) = answer.sessions
    assert (info.name, info.owner, info.replicator, info.at) == ("alice", "alice", "r", "r")
    assert (info.acked, info.last, info.held) == (1, 3, 2)
    assert info.subs == [(1, "p", "n exists")]
    assert info.created == WALL


def test_list_shows_other_owners_sessions_only_to_an_operator(rig):
    rig.open(1, "alice", owner="alice")
    rig.open(2, "bob", owner="bob")
    (mine,) = to(rig.control("list", "", who="alice", operator=False), 77)
    assert [s.name for s in mine.sessions] == ["alice"]
    (every,) = to(rig.control("list", "", who="alice", operator=True), 77)
    assert [s.name for s in every.sessions] == ["alice", "bob"]
    (one,) = to(rig.control("list", "bob"), 77)
    assert [s.name for s in one.sessions] == ["bob"]


def test_an_unknown_action_is_an_error(rig):
    rig.open(1)
    (err,) = to(rig.control("explode"), 77)
    assert type(err) is m.Error


def test_roam_tells_the_follower_which_broker_to_resume_at():
    rig = Rig(PAIR)
    assert rig.open(1) == []  # the subscription waits for keeper x (the link is down)
    rig.now = 10.0
    outs = rig.feed(rig.core.on_timer(rig.now))
    assert opened(outs, 1).name == "alice"
    outs = rig.control("roam", to="x", req=12)
    (closed,) = to(outs, 1)
    assert type(closed) is m.SessionClosed and closed.to == "x" and not closed.ended
    (answer,) = to(outs, 77)
    assert type(answer) is m.SessionList and answer.req == 12
    assert [s.name for s in answer.sessions] == ["alice"]
    # detached: what is published now is kept for the next open
    assert rig.rep.sessions["alice"].follower is None
    assert rig.publish(2) == []
    assert rig.store.held(rig.key(), 0) == (2, 2)


def test_roam_to_an_unknown_broker_is_an_error(rig):
    rig.open(1)
    outs = rig.control("roam", to="nowhere")
    assert to(outs, 1) == [] and type(to(outs, 77)[0]) is m.Error
    assert rig.rep.sessions["alice"].follower == 1


def test_roam_of_a_session_nobody_follows_is_an_error(rig):
    rig.open(1)
    rig.rep.follower_closed(1, rig.now)
    (err,) = to(rig.control("roam", to="r"), 77)
    assert type(err) is m.Error and "not connected" in err.reason


def test_end_drops_the_session_and_frees_its_storage(rig):
    rig.open(1)
    rig.publish(3)
    key = rig.key()
    outs = rig.control("end", req=13)
    (closed,) = to(outs, 1)
    assert type(closed) is m.SessionClosed and closed.ended
    (answer,) = to(outs, 77)
    assert type(answer) is m.SessionList and [s.name for s in answer.sessions] == ["alice"]
    assert rig.rep.sessions == {}
    assert rig.store.sessions() == {}
    assert rig.store.held(key, 0) == (0, 0) and rig.store.read(key, 0) == []
    assert rig.store._events == {}
    # its subscriptions are gone: nothing more is stored for it
    assert not rig.core.connected(-key)
    assert rig.publish(2) == [] and rig.store.last == 3


def test_an_ended_session_can_be_opened_again_afresh(rig):
    rig.open(1)
    rig.publish(2)
    rig.control("end")
    got = opened(rig.open(2), 2)
    assert (got.created, got.start, got.backlog) == (True, 0, 0)
    assert sent_epochs(rig.publish(1), 2) == [3]


def test_end_by_another_owner_is_denied(rig):
    rig.open(1)
    (err,) = to(rig.control("end", who="mallory", operator=False), 77)
    assert type(err) is m.Error and err.denied
    assert "alice" in rig.rep.sessions


def test_its_owner_may_end_a_session(rig):
    rig.open(1)
    rig.control("end", who="alice", operator=False)
    assert rig.rep.sessions == {}


def test_end_of_an_unknown_session_is_an_error(rig):
    (err,) = to(rig.control("end", "nobody"), 77)
    assert type(err) is m.Error and "no durable session" in err.reason


# -- followers that go ------------------------------------------------------------------------


def test_a_closed_follower_is_detached_and_later_events_are_kept(rig):
    rig.open(1)
    rig.publish(2)
    rig.ack(1, 2)
    rig.rep.follower_closed(1, rig.now)
    assert rig.rep.sessions["alice"].follower is None
    assert rig.publish(3) == []
    assert rig.store.held(rig.key(), 2) == (3, 5)
    assert rig.publish(1) == []
    assert rig.store.held(rig.key(), 2) == (4, 6)
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert (info.at, info.held, info.acked, info.last) == ("", 4, 2, 6)


def test_what_was_kept_is_delivered_on_the_next_open(rig):
    rig.open(1)
    rig.publish(2)
    rig.ack(1, 2)
    rig.rep.follower_closed(1, rig.now)
    rig.publish(3)
    outs = rig.open(2, subs=None)
    got = opened(outs, 2)
    assert (got.created, got.start, got.backlog) == (False, 2, 3)
    assert sent_epochs(outs, 2) == [3, 4, 5]
    assert sent_epochs(rig.publish(1), 2) == [6]  # and live ones after them


def test_what_was_sent_but_not_acknowledged_is_sent_again_after_a_close(rig):
    rig.open(1)
    rig.publish(3)
    rig.ack(1, 1)
    rig.rep.follower_closed(1, rig.now)
    assert sent_epochs(rig.open(2), 2) == [2, 3]


def test_a_follower_closing_detaches_only_its_own_sessions(rig):
    rig.open(1, "alice")
    rig.open(2, "bob", owner="bob")
    rig.rep.follower_closed(1, rig.now)
    outs = rig.publish(1)
    assert to(outs, 1) == [] and sent_epochs(outs, 2) == [1]


def test_leave_detaches_the_named_session_of_that_follower_only(rig):
    rig.open(1, "alice")
    rig.open(1, "bob", owner="bob")
    rig.rep.leave(2, m.SessionLeave("alice"), rig.now)  # not its follower: nothing happens
    rig.rep.leave(1, m.SessionLeave("alice"), rig.now)
    outs = rig.publish(1)
    assert sent_epochs(outs, 1) == [1]
    assert [msg.name for msg in to(outs, 1)] == ["bob"]
    assert rig.store.held(rig.key("alice"), 0) == (1, 1)


# -- opens while the subscriptions go in -------------------------------------------------------


def test_an_open_waits_for_its_subscriptions_to_start():
    rig = Rig(PAIR)
    assert rig.open(1) == []
    assert rig.rep.sessions["alice"].opening is not None
    rig.now = 10.0
    outs = rig.feed(rig.core.on_timer(rig.now))
    assert opened(outs, 1).created is True


def test_a_takeover_while_the_subscriptions_go_in_waits_for_them_too():
    """The first open is waiting for its subscription's SubAck; a second open takes it over
    (the first is told) and is answered only once the subscription is in place, and as the
    open that created the session."""
    rig = Rig(PAIR)
    assert rig.open(1) == []
    outs = rig.open(2)
    (closed,) = to(outs, 1)
    assert type(closed) is m.SessionClosed and "taken over" in closed.reason
    assert to(outs, 2) == [], "answered before the session's subscription started"
    rig.now = 10.0
    outs = rig.feed(rig.core.on_timer(rig.now))
    assert opened(outs, 2).created is True


def test_a_follower_closing_while_its_open_waits_cancels_the_open():
    rig = Rig(PAIR)
    rig.open(1)
    rig.rep.follower_closed(1, rig.now)
    assert rig.rep.sessions["alice"].opening is None
    rig.now = 10.0
    assert to(rig.feed(rig.core.on_timer(rig.now)), 1) == []


def test_ending_a_session_whose_open_waits_tells_the_opener():
    rig = Rig(PAIR)
    assert rig.open(1) == []
    outs = rig.control("end")
    assert rig.rep.sessions == {}
    assert [type(msg) for msg in to(outs, 1)] == [m.SessionClosed], "the opener is left waiting"
    assert to(outs, 1)[0].ended


def test_a_sessions_qos2_identifiers_are_kept_for_whichever_connection_opens_it_next(rig):
    rig.open(1)
    rig.publish(5)  # epochs 1-5 sent to it
    outs = rig.feed(rig.rep.qos2(1, m.SessionQos2("alice", add=[5, 6, 70000], req=4)))
    assert to(outs, 1) == [m.SessionKept("alice", req=4)]  # the memory store keeps at once
    assert rig.feed(rig.rep.qos2(2, m.SessionQos2("alice", add=[9]))) == []  # not its follower
    rig.feed(rig.rep.qos2(1, m.SessionQos2("alice", drop=[5], rel_add=[3, 4, 9])))  # 9: not sent
    rig.feed(rig.rep.qos2(1, m.SessionQos2("alice", rel_drop=[3])))
    assert (rig.store.sessions()["alice"].qos2, rig.store.sessions()["alice"].rel) == ({6}, {4})
    (again,) = [x for x in to(rig.open(3, subs=None), 3) if type(x) is m.SessionOpened]
    # taken over: the new connection knows what not to publish again, and what PUBREL it owes
    assert (again.qos2, again.rel) == ([6], [4])
    # told whole (opened where a hand-over took it): what it had goes; its epochs owed may be
    # another replicator's (negative), its own only if sent (4000 was not)
    whole = m.SessionQos2("alice", add=[8, 0], rel_add=[4000, -3, 0, 5], whole=True)
    rig.feed(rig.rep.qos2(3, whole))
    assert (rig.store.sessions()["alice"].qos2, rig.store.sessions()["alice"].rel) == (
        {8},
        {-3, 5},
    )


def test_a_profile_that_matches_nothing_is_listed_as_nothing():
    """A persistent MQTT session with no filters holds a subscription that matches no event:
    ``ges clients`` says so, not its two contradicting constraints."""
    rig = Rig()
    nothing = [[m.Constraint("@topic", "eq", ""), m.Constraint("@topic", "ne", "")]]
    rig.open(1, subs=(m.SessionSub(9, "mqtt-none", nothing),))
    (info,) = rig.rep.find("alice", rig.now).sessions
    assert info.subs == [(9, "mqtt-none", "nothing")]


def test_an_acknowledgement_to_be_kept_is_answered_once_it_is_durable():
    """``SessionAck.req``: answered with ``SessionKept`` once the store made the session's new
    resume point durable (a process that stops and forgets its token relies on it); from a
    connection that does not follow the session, neither kept nor answered."""
    rig, store = kept_rig()
    epochs = streaming_three(rig, store)
    assert to(rig.feed(rig.rep.ack(1, m.SessionAck("alice", epochs[-1], req=5))), 1) == []
    assert rig.rep.sessions["alice"].state.acked == epochs[-1] and store.pending
    store.commit()
    assert to(rig.feed(rig.rep.on_committed()), 1) == [m.SessionKept("alice", req=5)]
    again = rig.feed(rig.rep.ack(1, m.SessionAck("alice", epochs[-1], req=6)))  # nothing new
    assert to(again, 1) == [m.SessionKept("alice", req=6)]
    assert rig.feed(rig.rep.ack(2, m.SessionAck("alice", epochs[-1], req=7))) == []


def kept_rig() -> tuple[Rig, object]:
    """A rig whose store commits only when told (ges.sim.commits), and its hand-over notes
    recorded as ("note", what) instead of relayed."""
    from ges.sim.commits import GroupSessionStore

    rig = Rig()
    rig.store = rig.rep.store = store = GroupSessionStore("g")
    rig.rep._note = lambda to, hid, name, what, why="": [("note", what)]
    return rig, store


def streaming_three(rig: Rig, store) -> list[int]:
    """alice's session open on connection 1, durable, and three events sent to it; their
    epochs."""
    rig.open(1)
    store.commit()
    rig.feed(rig.rep.on_committed())
    rig.publish(3)
    store.commit()
    epochs = sent_epochs(rig.feed(rig.rep.on_committed()), 1)
    assert len(epochs) == 3
    return epochs


def test_an_open_that_makes_a_session_is_answered_once_the_session_is_durable():
    """Answered before, a crash losing the store's group left the client with a session that
    did not exist (the simulator's lost groups found it: demo seed 96008 at 1,000 ms)."""
    rig, store = kept_rig()
    assert to(rig.open(1), 1) == []  # its subscription is in; the save is not durable
    assert rig.rep.sessions["alice"].opening is not None
    store.commit()
    (answer,) = to(rig.feed(rig.rep.on_committed()), 1)
    assert type(answer) is m.SessionOpened and answer.created
    assert rig.rep.sessions["alice"].follower == 1 and not rig.rep._unkept
    assert type(to(rig.open(2), 2)[0]) is m.SessionOpened  # it exists: answered at once


def test_a_hand_over_taken_or_released_is_said_again_only_once_it_is_durable():
    """A source asking again (its ask crossed the answer) is told ``taken`` — and a target
    released again ``done`` — once that step is durable, as the first time: told before, a
    crash losing it left the source moving the client to a target that forgot the session."""
    rig, store = kept_rig()
    sub = m.SessionSub(1, "p", [[m.Constraint("n", "exists")]])
    ask = m.Handover("r", "x", "h1", "bob", "", WALL, [sub], {})
    rig.feed(rig.rep.on_handover(ask, rig.now))
    assert rig.rep.sessions["bob"].state.handover["phase"] == "taken"
    assert ("note", "taken") not in rig.feed(rig.rep.on_handover(ask, rig.now))  # not yet
    store.commit()
    assert rig.feed(rig.rep.on_committed()).count(("note", "taken")) == 2
    released = m.HandoverNote("r", "x", "h1", "bob", "released")
    assert rig.feed(rig.rep.on_note(released, rig.now)) == []  # "done" once that is durable
    assert rig.feed(rig.rep.on_note(released, rig.now)) == []  # said again: not before either
    store.commit()
    assert rig.feed(rig.rep.on_committed()).count(("note", "done")) == 2


def test_an_open_after_the_one_that_made_the_session_waits_for_it_to_be_durable_too():
    """(A review's find.) The first open's connection went before the commit; a retry must
    not be answered while the session it would resume may still be lost."""
    rig, store = kept_rig()
    assert to(rig.open(1), 1) == []
    rig.feed(rig.rep.follower_closed(1, rig.now))
    assert to(rig.open(2), 2) == [] and not store.durable(store.saved)
    store.commit()
    (answer,) = to(rig.feed(rig.rep.on_committed()), 2)
    assert type(answer) is m.SessionOpened and rig.rep.sessions["alice"].made == 0
    assert type(to(rig.open(3), 3)[0]) is m.SessionOpened  # durable: at once from now on


def test_an_acknowledgement_that_ends_a_hand_overs_tail_is_said_kept_before_the_move():
    """(A review's find.) The client hears SessionKept before the SessionClosed that sends it
    on; the other way round its broker forgets the session first and drops the answer."""
    rig, store = kept_rig()
    epochs = streaming_three(rig, store)
    live = rig.rep.sessions["alice"]
    live.state.handover = {"dir": "out", "to": "x", "hid": "h", "cuts": {},
                           "cut_epoch": epochs[-1], "tail_last": epochs[-1], "phase": "tail"}  # fmt: skip
    store.save_session(live.state)
    store.commit()
    rig.feed(rig.rep.on_committed())
    assert to(rig.feed(rig.rep.ack(1, m.SessionAck("alice", epochs[-1], req=5))), 1) == []
    store.commit()
    got = [type(msg) for msg in to(rig.feed(rig.rep.on_committed()), 1)]
    assert got == [m.SessionKept, m.SessionClosed]


def test_a_page_read_for_a_taken_session_that_ended_meanwhile_is_let_go():
    """(A review's find.) The session's hand read a remote pubend; the session ended before
    the page came: nothing to store it for, and nothing breaks."""
    rig = Rig()
    rig.rep._note = lambda to, hid, name, what, why="": [("note", what)]
    sub = m.SessionSub(1, "p", [[m.Constraint("n", "exists")]])
    rig.feed(rig.rep.on_handover(m.Handover("r", "x", "h1", "bob", "", WALL, [sub], {"x~1": 5}), 0))
    assert rig.rep.sessions["bob"].state.reading == {"x~1": 5}
    rig.control("end", "bob")
    assert "bob" not in rig.rep.sessions and "bob" not in rig.rep._hands
    page = m.Recovered("x~1", "r", 6, 7, [], replay=True, by="x")
    assert rig.feed(rig.rep.replayed(page, rig.now)) == []
