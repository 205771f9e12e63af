"""BrokerCore driven directly: handshake, publish, flood with duplicate suppression, deliver,
timers; then several flooding cores over a fake network."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import attrs
import pytest

from ges.connectivity import LinkReport, express, visible_to
from ges.core import (
    BrokerConfig,
    BrokerCore,
    DropPeer,
    Notice,
    ProtocolError,
    ToClient,
    ToPeer,
)
from ges.topology import Topology
from ges.wire import messages as m
from ges.wire.messages import hello_for
from tests.simnet import Net

# b1 - b2
#  |    |
# b3 - b4      every broker has two disjoint paths to every other one
#   \  /
#    b5
ROOT = Path(__file__).resolve().parents[2]
TOPO = Topology.from_dict(
    {
        "name": "t",
        "brokers": {
            "b1": {"unit": "A/c1", "port": 7001},
            "b2": {"unit": "A/c1", "port": 7002},
            "b3": {"unit": "A/c2", "port": 7003},
            "b4": {"unit": "A/c2", "port": 7004},
            "b5": {"unit": "A/c3", "port": 7005},
        },
        "links": [
            ["b1", "b2"],
            ["b1", "b3"],
            ["b2", "b4"],
            ["b3", "b4"],
            ["b3", "b5"],
            ["b4", "b5"],
        ],
    }
)

INTERVAL, TIMEOUT = 1.0, 4.0


def make(
    broker_id: str = "b3",
    *,
    topology: Topology = TOPO,
    incarnation: int = 1,
    routing: str = "flood",
    config: BrokerConfig | None = None,
) -> BrokerCore:
    """A core that floods (this file tests flooding, the handshake, links and clients; content
    routing has its own tests in tests/routing)."""
    return BrokerCore(
        topology,
        broker_id,
        incarnation=incarnation,
        routing=routing,
        config=attrs.evolve(
            config or BrokerConfig(), heartbeat_every=INTERVAL, suspect_after=TIMEOUT
        ),
    )


def ev(**attributes) -> m.Event:
    return m.Event(attributes)


def items(*ticks: int, hops: int = 2, prev: int | None = None) -> list[m.EventItem]:
    """Items of pubend b2 as a neighbour of b3 forwards them (two hops from b2): consecutive
    prevs, ``n`` = tick as an attribute."""
    out = []
    last = ticks[0] - 1 if prev is None else prev
    for t in ticks:
        out.append(m.EventItem(t, last, hops, ev(n=t)))
        last = t
    return out


def to_client(outputs: list, conn: int) -> list:
    return [o.msg for o in outputs if type(o) is ToClient and o.conn == conn]


def peers(outputs: list) -> dict:
    """{peer: the one Events message sent to it}."""
    out = {}
    for o in outputs:
        if type(o) is ToPeer and type(o.msg) is m.Events:
            assert o.peer not in out, f"two Events to {o.peer} for one input"
            out[o.peer] = o.msg
    return out


def ticks_of(msgs) -> list[int]:
    return [it.tick for msg in msgs for it in msg.items]


def with_client(core: BrokerCore, conn: int = 1, *subs: tuple[int, list[m.Constraint]]) -> None:
    core.client_open(conn, f"client-{conn}")
    for sub_id, where in subs:
        out = core.client_message(conn, m.Subscribe(sub_id, [where]), 0.0)
        assert out == [ToClient(conn, m.SubAck(sub_id))]


# -- construction and handshake ------------------------------------------------------------------


def test_unknown_broker_id():
    with pytest.raises(ValueError, match="unknown broker"):
        BrokerCore(TOPO, "b9", incarnation=1)


def test_pubend_names_broker_and_incarnation():
    core = make("b2", incarnation=17)
    assert core.pubend == "b2~17"
    assert core.neighbours == {"b1", "b4"}


def test_hello_client_accepted():
    core = make("b3", incarnation=5)
    assert core.hello(m.Hello("client", "c1", "t")) == m.Welcome(broker="b3", incarnation="5")


def test_hello_client_with_empty_topology_accepted():
    assert type(make().hello(m.Hello("client", "c1", ""))) is m.Welcome


def test_hello_broker_with_empty_topology_refused():
    got = make("b3").hello(m.Hello("broker", "b1", ""))
    assert type(got) is m.Refuse
    assert "topology" in got.reason


@pytest.mark.parametrize("role", ["client", "broker"])
def test_hello_wrong_topology_refused(role):
    got = make("b3").hello(m.Hello(role, "b1", "other"))
    assert type(got) is m.Refuse
    assert "'other'" in got.reason and "'t'" in got.reason


def test_hello_bad_proto_refused():
    got = make().hello(m.Hello("client", "c1", "t", proto=m.PROTOCOL_VERSION + 1))
    assert type(got) is m.Refuse
    assert f"protocol {m.PROTOCOL_VERSION + 1}" in got.reason


def test_hello_unknown_role_refused():
    got = make().hello(m.Hello("monitor", "x", "t"))
    assert type(got) is m.Refuse
    assert "unknown role 'monitor'" in got.reason


@pytest.mark.parametrize(("me", "caller"), [("b5", "b1"), ("b1", "b4"), ("b1", "b1"), ("b1", "zz")])
def test_hello_from_a_broker_that_is_not_a_neighbour_refused(me, caller):
    got = make(me).hello(m.Hello("broker", caller, "t", digest=TOPO.digest))
    assert type(got) is m.Refuse
    assert "not a neighbour" in got.reason


def test_lower_id_dials():
    # b1 < b3: b1 dials b3, so b3 accepts b1's hello and b1 refuses b3's
    assert type(make("b3").hello(m.Hello("broker", "b1", "t", digest=TOPO.digest))) is m.Welcome
    got = make("b1").hello(m.Hello("broker", "b3", "t", digest=TOPO.digest))
    assert type(got) is m.Refuse
    assert "lower id dials" in got.reason


def test_lower_id_is_natural_order():
    topo = Topology.from_dict(
        {
            "name": "n",
            "brokers": {"b9": {"unit": "A/c1", "port": 1}, "b10": {"unit": "A/c1", "port": 2}},
            "links": [["b9", "b10"]],
        }
    )
    hello = hello_for(topo, "broker", "b9")
    assert type(make("b10", topology=topo).hello(hello)) is m.Welcome
    assert type(make("b9", topology=topo).hello(hello_for(topo, "broker", "b10"))) is m.Refuse


def test_a_hello_from_another_network_of_the_same_name_is_refused():
    """A network is its content, not its name (issue 17, finding 6)."""
    other = Topology.from_dict(
        {**TOPO.to_dict(), "links": [link for link in TOPO.to_dict()["links"][:-1]]},
        source="other.yaml",
    )
    assert other.name == TOPO.name and other.digest != TOPO.digest
    for role in ("broker", "client"):
        got = make("b3").hello(hello_for(other, role, "b1"))
        assert type(got) is m.Refuse
        assert "not the same network" in got.reason and "other.yaml" in got.reason
        assert TOPO.short_digest in got.reason and other.digest[:16] in got.reason
    # a broker must say which network it runs; an anonymous client need not
    assert type(make("b3").hello(m.Hello("broker", "b1", "t"))) is m.Refuse
    assert type(make("b3").hello(hello_for(TOPO, "client", "c"))) is m.Welcome
    assert type(make("b3").hello(hello_for(None, "client", "c"))) is m.Welcome


def test_a_refusal_names_the_peers_file_by_its_end_however_deep():
    """A path under a deep directory is quoted whole up to SHOWN_PATH characters, and beyond
    that cut from the front: its end names the file."""
    for length, whole in ((200, True), (1000, False)):
        source = "/" + "d" * (length - len("/x/other.yaml")) + "/x/other.yaml"
        other = Topology.from_dict(
            {**TOPO.to_dict(), "links": TOPO.to_dict()["links"][:-1]}, source=source
        )
        got = make("b3").hello(hello_for(other, "broker", "b1"))
        assert type(got) is m.Refuse and "x/other.yaml'" in got.reason
        assert (source in got.reason) is whole
        assert len(got.reason) < 500


# -- publish and local delivery ------------------------------------------------------------------


def test_publish_assigns_consecutive_ticks_and_acks():
    core = make("b1")
    core.client_open(1, "pub")
    out = core.client_message(1, m.Publish(7, [ev(a=1), ev(a=2), ev(a=3)]), 0.0)
    assert out == [ToClient(1, m.PubAck(7, "b1~1", 1, 3))]  # no links, no subscribers
    out = core.client_message(1, m.Publish(8, [ev(a=4), ev(a=5)]), 0.0)
    assert out == [ToClient(1, m.PubAck(8, "b1~1", 4, 5))]


def test_ticks_are_per_broker_not_per_client():
    core = make("b1")
    core.client_open(1, "p1")
    core.client_open(2, "p2")
    a = core.client_message(1, m.Publish(1, [ev(a=1)]), 0.0)[0].msg
    b = core.client_message(2, m.Publish(1, [ev(a=1), ev(a=2)]), 0.0)[0].msg
    assert (a.first_tick, a.last_tick, b.first_tick, b.last_tick) == (1, 1, 2, 3)


def test_empty_publish_acks_an_empty_range_and_uses_no_tick():
    core = make("b1")
    core.client_open(1, "pub")
    with_client(core, 2, (1, []))
    core.link_up("b2", 0.0)
    out = core.client_message(1, m.Publish(1, []), 0.0)
    assert len(out) == 1
    ack = out[0].msg
    assert ack.first_tick == ack.last_tick + 1
    out = core.client_message(1, m.Publish(2, [ev()]), 0.0)
    ack = out[-1].msg
    assert (ack.first_tick, ack.last_tick) == (1, 1)


def test_a_best_effort_publish_is_sent_on_before_its_publisher_hears_it_is_published():
    """The subscribers wait for the event; the publisher only for room in its window: what
    goes on (deliveries, a link) is written first, the acknowledgement last."""
    core = make("b1")
    core.client_open(1, "pub")
    with_client(core, 2, (1, []))
    core.link_up("b2", 0.0)
    out = core.client_message(1, m.Publish(1, [ev()]), 0.0)
    kinds = [(type(o).__name__, type(o.msg).__name__) for o in out]
    assert kinds[-1] == ("ToClient", "PubAck") and out[-1].conn == 1
    assert ("ToClient", "Deliver") in kinds[:-1], kinds


def test_local_delivery_to_matching_subscribers_only():
    core = make("b1")
    with_client(core, 1, (10, [m.Constraint("sym", "=", "IBM")]))
    with_client(core, 2, (20, [m.Constraint("price", ">", 100)]))
    with_client(core, 3, (30, []))
    with_client(core, 4, (40, [m.Constraint("sym", "=", "HP")]))
    core.client_open(5, "publisher")
    e1, e2, e3 = ev(sym="IBM", price=50), ev(sym="HP", price=150), ev(sym="IBM", price=200)
    out = core.client_message(5, m.Publish(1, [e1, e2, e3]), 0.0)
    assert to_client(out, 5) == [m.PubAck(1, "b1~1", 1, 3)]
    (d1,) = to_client(out, 1)
    assert (d1.sub_id, d1.pubend) == (10, "b1~1")
    assert [(it.tick, it.event) for it in d1.items] == [(1, e1), (3, e3)]
    (d2,) = to_client(out, 2)
    assert [(it.tick, it.event) for it in d2.items] == [(2, e2), (3, e3)]
    (d3,) = to_client(out, 3)
    assert [it.tick for it in d3.items] == [1, 2, 3]
    assert [it.hops for it in d3.items] == [0, 0, 0]
    (d4,) = to_client(out, 4)
    assert [it.tick for it in d4.items] == [2]
    assert len(out) == 5


def test_no_deliver_when_nothing_matches():
    core = make("b1")
    with_client(core, 1, (1, [m.Constraint("sym", "=", "IBM")]))
    core.client_open(2, "pub")
    out = core.client_message(2, m.Publish(1, [ev(sym="HP"), ev(other=1)]), 0.0)
    assert to_client(out, 1) == []


def test_one_client_with_two_subscriptions_gets_one_deliver_each():
    core = make("b1")
    with_client(core, 1, (1, []), (2, [m.Constraint("a", ">", 1)]))
    core.client_open(2, "pub")
    out = core.client_message(2, m.Publish(1, [ev(a=1), ev(a=2)]), 0.0)
    got = {d.sub_id: [it.tick for it in d.items] for d in to_client(out, 1)}
    assert got == {1: [1, 2], 2: [2]}


def test_same_sub_id_on_two_connections_with_different_filters():
    # deliveries are shared between subscribers with the same result; different results must not
    # be mixed up even when the sub ids coincide
    core = make("b1")
    with_client(core, 1, (1, [m.Constraint("a", "=", 1)]))
    with_client(core, 2, (1, [m.Constraint("a", "=", 2)]))
    with_client(core, 3, (1, []))
    with_client(core, 4, (1, []))
    core.client_open(9, "pub")
    out = core.client_message(9, m.Publish(1, [ev(a=1), ev(a=2), ev(a=3)]), 0.0)
    assert ticks_of(to_client(out, 1)) == [1]
    assert ticks_of(to_client(out, 2)) == [2]
    assert ticks_of(to_client(out, 3)) == [1, 2, 3]
    assert ticks_of(to_client(out, 4)) == [1, 2, 3]


def test_resubscribe_replaces_the_filter():
    core = make("b1")
    with_client(core, 1, (1, [m.Constraint("a", "=", 1)]), (1, [m.Constraint("a", "=", 2)]))
    core.client_open(2, "pub")
    out = core.client_message(2, m.Publish(1, [ev(a=1), ev(a=2)]), 0.0)
    assert ticks_of(to_client(out, 1)) == [2]
    assert core.stats().subscriptions == 1


def test_unsubscribe_stops_delivery():
    core = make("b1")
    with_client(core, 1, (1, []), (2, []))
    core.client_open(2, "pub")
    assert core.client_message(1, m.Unsubscribe(1), 0.0) == [ToClient(1, m.SubAck(1))]
    out = core.client_message(2, m.Publish(1, [ev()]), 0.0)
    assert [d.sub_id for d in to_client(out, 1)] == [2]
    # unsubscribing twice, or an unknown id, is acknowledged and harmless
    assert core.client_message(1, m.Unsubscribe(1), 0.0) == [ToClient(1, m.SubAck(1))]
    assert core.client_message(1, m.Unsubscribe(99), 0.0) == [ToClient(1, m.SubAck(99))]
    core.client_message(1, m.Unsubscribe(2), 0.0)
    out = core.client_message(2, m.Publish(2, [ev()]), 0.0)
    assert to_client(out, 1) == []


def test_client_closed_removes_its_subscriptions():
    core = make("b1")
    with_client(core, 1, (1, []))
    with_client(core, 2, (1, []))
    core.client_open(3, "pub")
    assert core.stats().subscriptions == 2
    core.client_closed(1, 0.0)
    assert core.stats().subscriptions == 1
    assert core.stats().clients == 2
    out = core.client_message(3, m.Publish(1, [ev()]), 0.0)
    assert to_client(out, 1) == []
    assert ticks_of(to_client(out, 2)) == [1]
    core.client_closed(1, 0.0)  # twice is fine
    core.client_closed(42, 0.0)


def test_subscribe_with_unknown_operator_is_an_error_not_a_subscription():
    core = make("b1")
    core.client_open(1, "c")
    out = core.client_message(1, m.Subscribe(5, [[m.Constraint("a", "like", "x")]]), 0.0)
    assert len(out) == 1
    (answer,) = out
    assert type(answer) is ToClient and answer.conn == 1 and type(answer.msg) is m.Error
    assert "subscription 5" in answer.msg.reason
    assert core.stats().subscriptions == 0


def test_subscribe_canonicalises_double_equals():
    core = make("b1")
    with_client(core, 1, (1, [m.Constraint("a", "==", 1)]))
    core.client_open(2, "pub")
    out = core.client_message(2, m.Publish(1, [ev(a=1), ev(a=2)]), 0.0)
    assert ticks_of(to_client(out, 1)) == [1]


def test_subscription_limit_per_client():
    core = make("b1", config=BrokerConfig(max_subscriptions_per_client=2))
    with_client(core, 1, (1, []), (2, []))
    out = core.client_message(1, m.Subscribe(3, []), 0.0)
    assert type(out[0].msg) is m.Error
    # replacing an existing subscription is still allowed at the limit
    assert core.client_message(1, m.Subscribe(2, []), 0.0) == [ToClient(1, m.SubAck(2))]
    # the limit is per client
    with_client(core, 2, (1, []), (2, []))
    assert core.stats().subscriptions == 4


def test_publish_batch_limit():
    core = make("b1", config=BrokerConfig(max_publish_batch=2))
    core.client_open(1, "pub")
    out = core.client_message(1, m.Publish(1, [ev(), ev(), ev()]), 0.0)
    assert [type(x.msg) for x in out] == [m.Error]
    ack = core.client_message(1, m.Publish(2, [ev(), ev()]), 0.0)[0].msg
    assert (ack.first_tick, ack.last_tick) == (1, 2)  # the refused batch used no ticks
    assert core.stats().published == 2


def test_unexpected_messages_are_protocol_errors():
    core = make("b3")
    core.link_up("b1", 0.0)
    core.client_open(1, "c")
    with pytest.raises(ProtocolError):
        core.peer_message("b1", m.Publish(1, []), 0.0)
    with pytest.raises(ProtocolError):
        core.peer_message("b1", m.Hello("broker", "b1", "t"), 0.0)
    with pytest.raises(ProtocolError):
        core.client_message(1, m.Events("b1~1", []), 0.0)
    with pytest.raises(ProtocolError):
        core.client_message(1, m.Welcome("b3", "1"), 0.0)
    assert core.client_message(1, m.Heartbeat(), 0.0) == []  # a client's keepalive


# -- flooding ----------------------------------------------------------------------------------


def b3_with_links(*links: str, config: BrokerConfig | None = None) -> BrokerCore:
    core = make("b3", config=config)
    for p in links:
        core.link_up(p, 0.0)
    return core


def test_publish_floods_to_every_up_link():
    core = b3_with_links("b1", "b4", "b5")
    core.client_open(1, "pub")
    out = core.client_message(1, m.Publish(1, [ev(n=1), ev(n=2)]), 0.0)
    sent = peers(out)
    assert set(sent) == {"b1", "b4", "b5"}
    for msg in sent.values():
        assert msg.pubend == "b3~1"
        assert [(it.tick, it.prev, it.hops) for it in msg.items] == [(1, 0, 1), (2, 1, 1)]
        assert [it.event for it in msg.items] == [ev(n=1), ev(n=2)]


def test_publish_without_links_goes_nowhere():
    core = make("b3")
    core.client_open(1, "pub")
    assert peers(core.client_message(1, m.Publish(1, [ev()]), 0.0)) == {}


def test_events_are_forwarded_to_every_up_link_except_the_sender():
    core = b3_with_links("b1", "b4", "b5")
    out = core.peer_message("b1", m.Events("b1~1", items(1, 2)), 0.0)
    sent = peers(out)
    assert set(sent) == {"b4", "b5"}
    for msg in sent.values():
        assert msg.pubend == "b1~1"
        assert ticks_of([msg]) == [1, 2]


def test_hops_increment_on_each_link():
    core = b3_with_links("b1", "b4")
    with_client(core, 1, (1, []))
    out = core.peer_message("b1", m.Events("b2~1", items(1, hops=2)), 0.0)
    assert [it.hops for it in peers(out)["b4"].items] == [3]
    # local subscribers see how far the event came
    assert [it.hops for d in to_client(out, 1) for it in d.items] == [2]


def test_same_events_from_two_peers_forwarded_and_delivered_once():
    core = b3_with_links("b1", "b4", "b5")
    with_client(core, 1, (1, []))
    first = core.peer_message("b1", m.Events("b2~1", items(1, 2, hops=2)), 0.0)
    assert ticks_of(to_client(first, 1)) == [1, 2]
    assert set(peers(first)) == {"b4", "b5"}
    again = core.peer_message("b4", m.Events("b2~1", items(1, 2, hops=2)), 0.0)
    assert again == []
    assert core.stats().duplicates == 2


def test_overlapping_batches_forward_only_the_new_ticks():
    core = b3_with_links("b1", "b4")
    with_client(core, 1, (1, []))
    core.peer_message("b1", m.Events("b2~1", items(1, 2)), 0.0)
    out = core.peer_message("b4", m.Events("b2~1", items(2, 3, 4)), 0.0)
    assert ticks_of(to_client(out, 1)) == [3, 4]
    assert ticks_of([peers(out)["b1"]]) == [3, 4]
    assert "b4" not in peers(out)
    assert core.stats().duplicates == 1


def test_reordered_ticks_are_each_delivered_once():
    core = b3_with_links("b1", "b4")
    with_client(core, 1, (1, []))
    got = []
    for peer, ticks in [("b1", (3,)), ("b4", (1,)), ("b4", (3,)), ("b1", (2,)), ("b1", (1, 2, 3))]:
        out = core.peer_message(peer, m.Events("b2~1", items(*ticks)), 0.0)
        got += ticks_of(to_client(out, 1))
    assert sorted(got) == [1, 2, 3]
    assert got == [3, 1, 2]  # in the order they first arrived


def test_own_events_echoed_back_are_dropped():
    core = b3_with_links("b1", "b4")
    with_client(core, 1, (1, []))
    core.client_open(2, "pub")
    core.client_message(2, m.Publish(1, [ev(), ev()]), 0.0)
    echo = core.peer_message("b4", m.Events("b3~1", items(1, 2, hops=3)), 0.0)
    assert echo == []


def test_events_from_several_pubends_are_independent():
    core = b3_with_links("b1", "b4")
    with_client(core, 1, (1, []))
    a = core.peer_message("b1", m.Events("b1~1", items(1)), 0.0)
    b = core.peer_message("b1", m.Events("b2~1", items(1)), 0.0)
    c = core.peer_message("b1", m.Events("b2~2", items(1)), 0.0)  # a new incarnation of b2
    for out, pubend in [(a, "b1~1"), (b, "b2~1"), (c, "b2~2")]:
        (d,) = to_client(out, 1)
        assert (d.pubend, ticks_of([d])) == (pubend, [1])


def test_prev_is_the_previous_tick_sent_on_that_link():
    core = b3_with_links("b1", "b4")
    core.client_open(1, "pub")
    core.client_message(1, m.Publish(1, [ev(), ev()]), 0.0)  # ticks 1, 2 on b1 and b4
    core.link_up("b5", 0.0)
    sent = peers(core.client_message(1, m.Publish(2, [ev()]), 0.0))  # tick 3
    assert [(it.tick, it.prev) for it in sent["b1"].items] == [(3, 2)]
    assert [(it.tick, it.prev) for it in sent["b4"].items] == [(3, 2)]
    # b5 saw nothing of this pubend before: its path starts at 0
    assert [(it.tick, it.prev) for it in sent["b5"].items] == [(3, 0)]


def test_prev_counts_only_ticks_sent_on_that_link():
    # b3 relays b2's pubend: ticks 1, 2 come from b1 (so are sent only to b4), tick 3 comes from
    # b4 (so is sent only to b1), tick 4 from b1 again. Each link's prev chain skips the rest.
    core = b3_with_links("b1", "b4")
    out = core.peer_message("b1", m.Events("b2~1", items(1, 2)), 0.0)
    assert [(it.tick, it.prev) for it in peers(out)["b4"].items] == [(1, 0), (2, 1)]
    out = core.peer_message("b4", m.Events("b2~1", items(3, prev=2)), 0.0)
    assert [(it.tick, it.prev) for it in peers(out)["b1"].items] == [(3, 0)]
    out = core.peer_message("b1", m.Events("b2~1", items(4, prev=3)), 0.0)
    assert [(it.tick, it.prev) for it in peers(out)["b4"].items] == [(4, 2)]


def test_prev_resets_after_link_down():
    core = b3_with_links("b1", "b4")
    core.client_open(1, "pub")
    core.client_message(1, m.Publish(1, [ev(), ev()]), 0.0)
    core.link_down("b1", 1.0)
    sent = peers(core.client_message(1, m.Publish(2, [ev()]), 1.0))
    assert set(sent) == {"b4"}
    core.link_up("b1", 2.0)
    sent = peers(core.client_message(1, m.Publish(3, [ev(), ev()]), 2.0))
    assert [(it.tick, it.prev) for it in sent["b1"].items] == [(4, 0), (5, 4)]
    assert [(it.tick, it.prev) for it in sent["b4"].items] == [(4, 3), (5, 4)]


def test_link_down_stops_flooding_to_that_peer():
    core = b3_with_links("b1", "b4", "b5")
    core.link_down("b4", 1.0)
    out = core.peer_message("b1", m.Events("b2~1", items(1)), 1.0)
    assert set(peers(out)) == {"b5"}
    assert core.stats().links_up == ["b1", "b5"]


def test_pubend_windows_are_bounded():
    core = b3_with_links("b1", config=BrokerConfig(max_pubends=3))
    for i in range(10):
        core.peer_message("b1", m.Events(f"x{i}~1", items(1)), 0.0)
        assert len(core.forwarding.windows) <= 3
    # a recently seen pubend is kept: its duplicates are still recognised
    assert core.peer_message("b1", m.Events("x9~1", items(1)), 0.0) == []


def test_a_pubend_first_heard_mid_stream_never_delivers_a_tick_twice():
    # A broker that first hears a pubend at tick > 1 (it joined late, or the link came up after
    # the first publications) must still recognise a copy arriving over a redundant path, even
    # with a tiny window.
    core = b3_with_links("b1", "b4", config=BrokerConfig(window_limit=4))
    with_client(core, 1, (1, []))
    got = []
    for t in (3, 4, 5, 6, 7):
        got += ticks_of(to_client(core.peer_message("b1", m.Events("b2~1", items(t)), 0.0), 1))
    assert got == [3, 4, 5, 6, 7]
    # the same tick 6 over the other path
    again = core.peer_message("b4", m.Events("b2~1", items(6, hops=2)), 0.0)
    assert to_client(again, 1) == []


# -- time --------------------------------------------------------------------------------------


def test_heartbeat_for_idle_links():
    core = b3_with_links("b1", "b4")
    assert core.next_deadline() == INTERVAL
    assert core.on_timer(0.5) == []
    out = core.on_timer(1.0)
    assert sorted(out, key=str) == [ToPeer("b1", m.Heartbeat()), ToPeer("b4", m.Heartbeat())]
    assert core.on_timer(1.5) == []


def test_note_sent_defers_the_heartbeat():
    core = b3_with_links("b1", "b4")
    core.note_sent("b1", 0.75)
    assert core.on_timer(1.0) == [ToPeer("b4", m.Heartbeat())]
    assert core.on_timer(1.75) == [ToPeer("b1", m.Heartbeat())]


def test_silent_link_is_dropped():
    core = b3_with_links("b1", "b4")
    core.peer_message("b4", m.Heartbeat(), 3.0)
    assert core.next_deadline() == 1.0
    for t in (1.0, 2.0, 3.0):
        core.on_timer(t)
    assert core.next_deadline() == TIMEOUT
    out = core.on_timer(TIMEOUT)
    drops = [(o.peer, o.reason) for o in out if type(o) is DropPeer]
    assert [d for d, _ in drops] == ["b1"]
    assert "b1" in drops[0][1]
    assert core.links_up == {"b4"}
    # no heartbeat for a dropped link
    assert not [o for o in out if type(o) is ToPeer and o.peer == "b1"]
    # and it is no longer flooded to
    core.client_open(1, "pub")
    assert set(peers(core.client_message(1, m.Publish(1, [ev()]), 4.0))) == {"b4"}


def test_any_frame_from_the_peer_keeps_the_link():
    core = b3_with_links("b1")
    core.peer_message("b1", m.Events("b2~1", items(1)), 3.5)
    assert [type(o) for o in core.on_timer(4.0)] == [ToPeer]  # a heartbeat, not a drop
    assert core.links_up == {"b1"}
    # dropped, and since it was b3's only link the connectivity graph reports a partition
    assert [type(o) for o in core.on_timer(7.5)] == [DropPeer, Notice]


def test_no_links_no_deadline():
    core = make()
    assert core.next_deadline() == float("inf")
    assert core.on_timer(100.0) == []


def test_link_down_forgets_the_timers():
    core = b3_with_links("b1")
    core.link_down("b1", 0.5)
    assert core.next_deadline() == float("inf")
    assert core.on_timer(100.0) == []


# -- stats -------------------------------------------------------------------------------------


def test_stats_counters():
    core = b3_with_links("b1", "b4")
    core.pid = 1234
    with_client(core, 1, (1, []), (2, [m.Constraint("n", "=", 1)]))
    core.client_open(2, "pub")
    core.client_message(2, m.Publish(1, [ev(n=1), ev(n=2)]), 0.0)
    # published 2; forwarded 2 x 2 links; delivered 2 (sub 1) + 1 (sub 2)
    core.peer_message("b1", m.Events("b2~1", items(1, 2, 3)), 0.0)
    # 3 new; forwarded 3 to b4; delivered 3 (sub 1) + 1 (sub 2)
    core.peer_message("b4", m.Events("b2~1", items(3, 4)), 0.0)
    # 1 duplicate, 1 new; forwarded 1 to b1; delivered 1 (sub 1)
    s = core.client_message(2, m.StatsRequest(), 0.0)[0].msg
    assert type(s) is m.Stats
    assert (s.broker, s.incarnation, s.pid) == ("b3", "1", 1234)
    assert (s.clients, s.subscriptions) == (2, 2)
    assert (s.links_up, s.links_expected) == (["b1", "b4"], 3)
    assert s.published == 2
    assert s.events_in == 2 + 3 + 1
    assert s.duplicates == 1
    assert s.delivered == 3 + 4 + 1
    assert s.events_out == (4 + 3 + 1) + (3 + 4 + 1)
    assert (s.frames_in, s.frames_out) == (0, 0)  # the driver counts frames
    assert s == core.stats()


# -- several cores over a fake network -----------------------------------------------------------


def flooding(topology: Topology, seed: int = 0) -> Net:
    """The topology's cores flooding, on the simulator (tests/simnet.py)."""
    return Net(topology, seed, routing="flood")


def subscribe_everywhere(net: Net, conn: int = 1, where=()) -> None:
    for b in net.cores:
        net.sim.client(b, conn, m.Subscribe(1, [list(where)]))


def publish(net: Net, broker: str, n: int, **attributes) -> m.PubAck:
    return net.publish(broker, [{"i": i, **attributes} for i in range(n)])


@pytest.mark.parametrize("seed", range(8))
def test_every_subscriber_gets_each_event_exactly_once(seed):
    net = flooding(TOPO, seed)
    pe = {b: core.pubend for b, core in net.cores.items()}
    net.connect_all()
    subscribe_everywhere(net)
    ack = publish(net, "b1", 5)
    net.run()
    expected = [(pe["b1"], t) for t in range(ack.first_tick, ack.last_tick + 1)]
    for b in TOPO.brokers:
        assert sorted(net.delivered[(b, 1)]) == expected, b
    dups = sum(c.stats().duplicates for c in net.cores.values())
    assert dups > 0  # the redundant paths did carry copies


@pytest.mark.parametrize("seed", range(8))
def test_concurrent_publishers_with_filters(seed):
    net = flooding(TOPO, seed)
    pe = {b: core.pubend for b, core in net.cores.items()}
    net.connect_all()
    subscribe_everywhere(net, 1)
    subscribe_everywhere(net, 2, [m.Constraint("color", "=", "red")])
    for b, color in [("b1", "red"), ("b5", "blue"), ("b3", "red"), ("b5", "red")]:
        publish(net, b, 3, color=color)
        if seed % 2:
            net.run_some(7)  # interleave delivery with publishing
    net.run()
    everything = sorted(
        [(pe["b1"], t) for t in (1, 2, 3)]
        + [(pe["b3"], t) for t in (1, 2, 3)]
        + [(pe["b5"], t) for t in range(1, 7)]
    )
    red = sorted(
        [(pe["b1"], t) for t in (1, 2, 3)]
        + [(pe["b3"], t) for t in (1, 2, 3)]
        + [(pe["b5"], t) for t in (4, 5, 6)]
    )
    for b in TOPO.brokers:
        assert sorted(net.delivered[(b, 1)]) == everything, b
        assert sorted(net.delivered[(b, 2)]) == red, b


def test_delivery_continues_around_a_broker_whose_links_are_down():
    net = flooding(TOPO, seed=1)
    pe = {b: core.pubend for b, core in net.cores.items()}
    net.connect_all()
    subscribe_everywhere(net)
    publish(net, "b1", 2)
    net.run()
    for n in TOPO.neighbours["b3"]:
        net.link("b3", n, up=False)
    assert net.cores["b3"].links_up == set()
    publish(net, "b1", 3)
    publish(net, "b5", 2)
    net.run()
    for b in ("b1", "b2", "b4", "b5"):
        assert Counter(net.delivered[(b, 1)]) == Counter(
            [(pe["b1"], t) for t in range(1, 6)] + [(pe["b5"], 1), (pe["b5"], 2)]
        ), b
    # the cut-off broker got only what came before, once
    assert sorted(net.delivered[("b3", 1)]) == [(pe["b1"], 1), (pe["b1"], 2)]
    # and its own publications stay local
    publish(net, "b3", 1)
    net.run()
    assert all((pe["b3"], 1) not in net.delivered[(b, 1)] for b in ("b1", "b2", "b4", "b5"))
    assert (pe["b3"], 1) in net.delivered[("b3", 1)]


def test_link_back_up_resumes_flooding_with_a_fresh_path():
    net = flooding(TOPO, seed=2)
    pe = {b: core.pubend for b, core in net.cores.items()}
    net.connect_all()
    subscribe_everywhere(net)
    net.link("b1", "b2", up=False)
    net.link("b1", "b3", up=False)
    publish(net, "b1", 2)  # b1 is isolated: nobody else hears ticks 1, 2
    net.run()
    assert net.delivered.get(("b2", 1), []) == []
    net.link("b1", "b3", up=True)
    net.run()  # connection information settles first
    publish(net, "b1", 1)
    events = {
        (a, b): [msg for msg in net.in_flight(a, b) if type(msg) is m.Events]
        for link in TOPO.links
        for a, b in ((link.a, link.b), (link.b, link.a))
    }
    events = {k: v for k, v in events.items() if v}
    assert list(events) == [("b1", "b3")]
    ((msg,),) = events.values()
    (item,) = msg.items
    assert (item.tick, item.prev) == (3, 0)
    net.run()
    for b in ("b2", "b3", "b4", "b5"):
        assert net.delivered[(b, 1)] == [(pe["b1"], 3)], b


def test_no_echo_storm_on_a_triangle():
    # b3, b4, b5 form a triangle: each broker forwards each event at most once per link
    net = flooding(TOPO, seed=3)
    net.connect_all()
    net.run()  # connection information settles first
    subscribe_everywhere(net)
    before = net.event_frames
    publish(net, "b5", 10)
    net.run()
    links = len(TOPO.links)
    assert net.event_frames - before <= 2 * links  # at most one per direction of each link
    outs = sum(c.stats().events_out - c.stats().delivered for c in net.cores.values())
    assert outs <= 10 * 2 * links


# -- connection information through the cores --------------------------------------------------


def expected_edges(topology: Topology, vertex: str) -> set[frozenset]:
    """Seed 004 §2.2 stated directly: every link visible to the vertex, re-expressed for it."""
    unit = topology.brokers[vertex].unit
    edges = set()
    for link in topology.links:
        a, b = topology.brokers[link.a], topology.brokers[link.b]
        report = LinkReport(a.id, b.id, a.unit, b.unit, None, a.id, (0, 0), True)
        if not visible_to(report, unit):
            continue
        ends = frozenset({express(unit, a.id, a.unit), express(unit, b.id, b.unit)})
        if len(ends) == 2:
            edges.add(ends)
    return edges


@pytest.mark.parametrize("seed", range(4))
def test_cores_disseminate_connection_information_within_its_context(seed):
    topology = Topology.from_yaml(ROOT / "topologies" / "demo.yaml")
    net = flooding(topology, seed)
    net.connect_all()
    net.run()
    for bid, core in net.cores.items():
        assert {frozenset(pair) for pair in core.graph.edges} == expected_edges(topology, bid), bid
    # b6's level-3 gateway to b14 is known in all of SSC-A and SSC-B as a unit-unit edge; the
    # cluster link b1-b2 is known only inside cluster c1
    assert frozenset({"b1", "b2"}) not in {
        frozenset(map(str, p)) for p in net.cores["b4"].graph.edges
    }


def test_losing_the_last_link_between_units_is_reported_as_a_partition():
    topology = Topology.from_yaml(ROOT / "topologies" / "demo.yaml")
    net = flooding(topology, 0)
    net.connect_all()
    net.run()
    net.notices.clear()
    net.link("b6", "b14", up=False)  # SSC-A and SSC-B still have b10-b11
    net.run()
    assert not any("unreachable: SSC" in text for _, text in net.notices)
    assert all(text.startswith("info:") for _, text in net.notices)  # a detour: no alarm
    net.link("b10", "b11", up=False)  # the last level-3 gateway
    net.run()
    at_b1 = [text for b, text in net.notices if b == "b1"]
    assert any(
        t.startswith("warning:") and "lost its last link" in t and "unreachable: SSC-B" in t
        for t in at_b1
    ), at_b1
    net.link("b10", "b11", up=True)
    net.run()
    assert any(b == "b1" and "live link again" in t for b, t in net.notices)


def test_an_invalid_profile_replacing_a_subscription_keeps_the_old_one():
    core = make("b1")
    with_client(core, 1, (1, [m.Constraint("a", "eq", 1)]))
    bad = m.Subscribe(1, [[m.Constraint("a", "lt", True)]])  # booleans are not ordered
    out = core.client_message(1, bad, 0.0)
    assert [type(o.msg) for o in out] == [m.Error]
    assert core.stats().subscriptions == 1
    core.client_open(2, "pub")
    out = core.client_message(2, m.Publish(1, [ev(a=1), ev(a=2)]), 0.0)
    assert ticks_of(to_client(out, 1)) == [1]
    # a valid replacement takes over, and unsubscribing leaves no routing state behind
    core.client_message(1, m.Subscribe(1, [[m.Constraint("a", "eq", 2)]]), 0.0)
    out = core.client_message(2, m.Publish(2, [ev(a=1), ev(a=2)]), 0.0)
    assert ticks_of(to_client(out, 1)) == [4]
    core.client_message(1, m.Unsubscribe(1), 0.0)
    assert not core.profiles and core.profiles.node_count == 1
