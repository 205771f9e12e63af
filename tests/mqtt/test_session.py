"""An MQTT client's connection as GES requests (ges.mqtt.session), without a broker: the
messages it asks the broker for, and the packets it answers with what the broker says."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from ges.matching.model import RETAIN_ATTR, TOPIC_ATTR, conjunction_from_wire
from ges.mqtt import packets as p
from ges.mqtt import v5
from ges.mqtt.delivering import NO_SUB
from ges.mqtt.filtering import RETAINED_STEP, SUB_ID
from ges.mqtt.frames import Malformed, PacketReader
from ges.mqtt.session import QOS_ATTR, MqttSession, session_name
from ges.wire import messages as m


def opened(connect: p.Connect, **options) -> MqttSession:
    """A clean session past its CONNACK."""
    session = MqttSession(connect, **options)
    (discard,) = session.start()
    assert discard == m.SessionControl("discard", session_name(connect.client_id), req=discard.req)
    assert packets_of(session) == []  # once its persistent session is no more
    session.from_broker(m.SessionList([], req=discard.req))
    assert packets_of(session) == [p.ConnAck(p.ACCEPTED, False)]
    return session


def packets_of(session: MqttSession) -> list:
    reader = PacketReader()
    reader.feed(session.data_to_send())
    return [p.decode(x) for x in reader.packets()]


def send(session: MqttSession, *values, wall_ns: int = 0) -> list:
    return session.receive_data(b"".join(p.encode(v) for v in values), wall_ns)


def deliver(*events: tuple[str, int | None]) -> m.Deliver:
    items = []
    for i, (topic, qos) in enumerate(events):
        attributes = {TOPIC_ATTR: topic} if qos is None else {TOPIC_ATTR: topic, QOS_ATTR: qos}
        items.append(m.EventItem(i + 1, i, 0, m.Event(attributes, f"e{i}".encode())))
    return m.Deliver(SUB_ID, "b", items)


def test_a_publish_is_an_event_with_its_topic_and_qos():
    s = opened(p.Connect("c"))
    (msg,) = send(s, p.Publish("a/b", b"hi", 0), wall_ns=123)
    assert isinstance(msg, m.Publish)
    (event,) = msg.events
    assert event.attributes == {TOPIC_ATTR: "a/b", QOS_ATTR: 0}
    assert event.payload == b"hi" and event.published_at == 123
    s.from_broker(m.PubAck(msg.seq, "b", 1, 1))
    assert packets_of(s) == []  # QoS 0: nothing to answer


def test_qos1_is_acknowledged_once_the_pubend_has_it_even_when_acks_are_joined():
    s = opened(p.Connect("c"))
    a, b = send(s, p.Publish("t", b"1", 1, packet_id=10), p.Publish("t", b"2", 1, packet_id=11))
    assert packets_of(s) == []  # not before the log has them
    s.from_broker(m.PubAck(b.seq, "b", 1, 2, seqs=2))
    assert packets_of(s) == [p.PubAck(10), p.PubAck(11)]


def test_qos2_is_published_once_however_often_it_is_sent():
    s = opened(p.Connect("c"))
    (msg,) = send(s, p.Publish("t", b"x", 2, packet_id=5))
    assert send(s, p.Publish("t", b"x", 2, dup=True, packet_id=5)) == []
    assert packets_of(s) == []  # PUBREC only once it is in the log
    s.from_broker(m.PubAck(msg.seq, "b", 1, 1))
    assert packets_of(s) == [p.PubRec(5)]
    assert send(s, p.Publish("t", b"x", 2, dup=True, packet_id=5)) == []
    assert packets_of(s) == [p.PubRec(5)]
    send(s, p.PubRel(5))
    assert packets_of(s) == [p.PubComp(5)]
    (again,) = send(s, p.Publish("t", b"y", 2, packet_id=5))  # released: a new message
    assert again.events[0].payload == b"y"


def test_a_publish_between_two_subscribes_of_one_read_goes_between_their_requests():
    """The filters' changes of one read are one request, but not across a PUBLISH: what the
    client published before a SUBSCRIBE must not be matched against it (the broker handles
    requests in order)."""
    s = opened(p.Connect("c"))
    out = send(s, p.Subscribe(1, (("x/a", 0),)), p.Publish("x/b", b"before", 0),
               p.Subscribe(2, (("x/b", 0),)), p.Subscribe(3, (("x/c", 0),)))  # fmt: skip
    assert [type(x) for x in out] == [m.Subscribe, m.Publish, m.Subscribe]
    first, _, second = out
    assert [c[0].value for c in first.conjunctions] == ["x/a"]
    assert [c[0].value for c in second.conjunctions] == ["x/a", "x/b", "x/c"]
    s.from_broker(m.SubAck(SUB_ID, True, req=first.req))
    s.from_broker(m.SubAck(SUB_ID, True, req=second.req))
    assert packets_of(s) == [p.SubAck(1, (0,)), p.SubAck(2, (0,)), p.SubAck(3, (0,))]


def test_filters_are_one_subscription_replaced_as_a_whole():
    s = opened(p.Connect("c"))
    (sub,) = send(s, p.Subscribe(1, (("a/+", 1), ("b/#", 0))))
    assert sub.sub_id == SUB_ID
    assert [c[0].value for c in sub.conjunctions] == ["a/+", "b/#"]
    assert all(c[0].attr == TOPIC_ATTR and c[0].op == "topic" for c in sub.conjunctions)
    assert packets_of(s) == []  # SUBACK once the network has it
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    assert packets_of(s) == [p.SubAck(1, (1, 0))]
    assert [type(x) for x in s.take_pending()] == [m.RetainedAsk]  # the runtime takes it
    (sub2,) = send(s, p.Subscribe(2, (("a/+", 2),)))  # the same filter: replaced
    assert [c[0].value for c in sub2.conjunctions] == ["a/+", "b/#"]
    assert s.filters == {"a/+": 2, "b/#": 0}
    (unsub,) = send(s, p.Unsubscribe(3, ("a/+", "b/#")))
    assert isinstance(unsub, m.Unsubscribe)
    s.from_broker(m.SubAck(SUB_ID, True, req=unsub.req))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub2.req))
    assert packets_of(s) == [p.UnsubAck(3), p.SubAck(2, (2,))]


def test_a_refused_subscribe_is_0x80_and_the_filters_stay_as_they_were():
    s = opened(p.Connect("c"))
    (sub,) = send(s, p.Subscribe(1, (("a", 1),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    s.take_pending()
    (sub2,) = send(s, p.Subscribe(2, (("secret/#", 1), ("b", 0))))
    s.from_broker(m.Error("not allowed", denied=True, req=sub2.req))
    assert s.take_pending() == []  # nothing retained is asked for what is refused
    assert packets_of(s) == [p.SubAck(1, (1,)), p.SubAck(2, (0x80, 0x80))]
    assert s.filters == {"a": 1}


def test_filters_over_the_bound_get_0x80():
    s = opened(p.Connect("c"), max_filters=2)
    (sub,) = send(s, p.Subscribe(1, (("a", 0), ("b", 1), ("c", 2))))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    assert packets_of(s) == [p.SubAck(1, (0, 1, 0x80))]


def test_a_delivery_goes_once_at_the_highest_qos_its_filters_allow():
    s = opened(p.Connect("c"))
    send(s, p.Subscribe(1, (("a/+", 0), ("a/#", 1), ("x", 2))))
    s.data_to_send()
    s.from_broker(deliver(("a/b", 2), ("a/b", 0), ("x", None)))
    got = packets_of(s)
    assert [(x.topic, x.qos, x.payload) for x in got] == [
        ("a/b", 1, b"e0"),
        ("a/b", 0, b"e1"),
        ("x", 2, b"e2"),  # published by a GES client: the filter's QoS
    ]
    assert got[0].packet_id and got[2].packet_id and got[0].packet_id != got[2].packet_id


def test_deliveries_past_the_window_wait_for_acknowledgements():
    s = opened(p.Connect("c"), max_inflight=2)
    send(s, p.Subscribe(1, (("#", 2),)))
    s.data_to_send()
    s.from_broker(deliver(("a", 1), ("b", 2), ("c", 1), ("d", 0)))
    first = packets_of(s)
    assert [x.topic for x in first] == ["a", "b"]  # QoS 0 waits behind them too: order
    assert s.waiting_bytes > 0
    send(s, p.PubAck(first[0].packet_id))
    assert [x.topic for x in packets_of(s)] == ["c", "d"]  # d (QoS 0) needs no identifier
    assert s.waiting_bytes == 0
    send(s, p.PubRec(first[1].packet_id))
    assert packets_of(s) == [p.PubRel(first[1].packet_id)]
    assert s.inflight == 2  # b until its PUBCOMP, and c
    send(s, p.PubComp(first[1].packet_id))
    assert s.inflight == 1


def test_ping_disconnect_and_a_second_connect():
    s = opened(p.Connect("c"))
    send(s, p.PingReq())
    assert packets_of(s) == [p.PingResp()]
    send(s, p.Disconnect())
    assert s.closed == "disconnected"
    with pytest.raises(Malformed, match="CONNECT from a client that is connected"):
        send(opened(p.Connect("c")), p.Connect("c"))


def test_a_refused_publish_is_acknowledged_and_dropped():
    s = opened(p.Connect("c"))
    one, two = send(
        s, p.Publish("no/t", b"1", 1, packet_id=3), p.Publish("no/t", b"2", 2, packet_id=4)
    )
    s.from_broker(m.Error("may not publish this event", denied=True, req=one.seq))
    s.from_broker(m.Error("may not publish this event", denied=True, req=two.seq))
    assert packets_of(s) == [p.PubAck(3), p.PubRec(4)]


def test_the_will_goes_once_as_a_publish():
    s = opened(p.Connect("c", will=p.Will("status/c", b"gone", 1)))
    (will,) = s.will(7)
    assert will.events[0].attributes == {TOPIC_ATTR: "status/c", QOS_ATTR: 1}
    assert will.events[0].payload == b"gone"
    assert s.will(8) == []


# -- persistent sessions (clean session 0): a GES durable session --------------------------

C = m.Constraint


def stored(epoch: int, topic: str, qos: int, subs=(2,)) -> m.SessionItem:
    event = m.Event({TOPIC_ATTR: topic, QOS_ATTR: qos}, f"e{epoch}".encode())
    return m.SessionItem(epoch, "b1", m.EventItem(epoch, 0, 0, event), list(subs))


def test_a_persistent_session_is_opened_before_the_connack_and_holds_early_packets():
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    # made if it is new, with a subscription that matches nothing: it exists from the start
    (placeholder,) = opening.fallback
    assert (opening.name, opening.subs, placeholder.sub_id) == ("mqtt.car-7", None, NO_SUB)
    assert not any(
        conjunction_from_wire(c).matches({TOPIC_ATTR: t})
        for c in placeholder.conjunctions
        for t in ("", "a")
    )
    assert packets_of(s) == []  # the CONNACK waits for the replicator
    assert send(s, p.Subscribe(1, (("a/+", 1),))) == []  # held, not refused
    s.from_broker(
        m.SessionOpened(
            "mqtt.car-7", "b1", "s", True, 0, 0, [(NO_SUB, "mqtt-none")], opening.req,
            [placeholder.conjunctions],
        )
    )  # fmt: skip
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, False)]
    assert s.filters == {}
    assert s.take_pending() == []  # (that holds acks only)
    (change,) = s.release_early()  # the held SUBSCRIBE changes its subscriptions
    assert change.name == "mqtt.car-7"
    assert change.subs == [m.SessionSub(2, "mqtt-qos1", [[C(TOPIC_ATTR, "topic", "a/+")]])]
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b1", "s", False, 0, 0, [(2, "mqtt-qos1")], change.req)
    )
    assert packets_of(s) == [p.SubAck(1, (1,))]


def test_a_persistent_session_its_replicator_did_not_make_is_made_by_the_first_filter():
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    s.from_broker(m.Error("replicator b1 holds 10000 durable sessions, the most", req=opening.req))
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, False)]
    (change,) = send(s, p.Subscribe(1, (("a/+", 1),)))
    assert change.subs == [m.SessionSub(2, "mqtt-qos1", [[C(TOPIC_ATTR, "topic", "a/+")]])]


def test_a_resumed_session_says_so_redelivers_with_dup_and_acks_in_epoch_order():
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    profiles = [[[C(TOPIC_ATTR, "topic", "a/+")]], [[C(TOPIC_ATTR, "topic", "z")]]]
    s.from_broker(
        m.SessionOpened(
            "mqtt.car-7", "b1", "s", False, 5, 2, [(2, "mqtt-qos1"), (1, "mqtt-qos0")],
            opening.req, profiles, last=7,
        )
    )  # fmt: skip
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, True)]
    assert s.filters == {"a/+": 1, "z": 0}
    s.from_broker(m.SessionEvents("mqtt.car-7", [stored(6, "a/x", 2), stored(7, "a/y", 1)]))
    s.from_broker(m.SessionEvents("mqtt.car-7", [stored(8, "a/z", 1), stored(6, "a/x", 2)]))
    got = packets_of(s)
    assert [(x.topic, x.qos, x.dup, x.packet_id) for x in got] == [
        ("a/x", 1, True, 7),  # stored before the open: may have been delivered before
        ("a/y", 1, True, 8),
        ("a/z", 1, False, 9),  # the identifier follows the epoch: the same at any broker
    ]  # and epoch 6 again (a second open) is not sent twice
    assert send(s, p.PubAck(8)) == []  # epoch 7: 6 is not acknowledged yet
    assert send(s, p.PubAck(7)) == [m.SessionAck("mqtt.car-7", 7)]
    assert send(s, p.PubAck(9)) == [m.SessionAck("mqtt.car-7", 8)]


def test_the_pubacks_of_one_read_are_one_session_ack_after_what_came_between():
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    s.from_broker(
        m.SessionOpened(
            "mqtt.car-7", "b1", "s", False, 0, 0, [(3, "mqtt-qos2")], opening.req,
            [[[C(TOPIC_ATTR, "topic", "#")]]], last=0,
        )
    )  # fmt: skip
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, True)]
    s.from_broker(
        m.SessionEvents("mqtt.car-7", [stored(e, "a", 1 + (e == 3), (3,)) for e in range(1, 6)])
    )
    got = packets_of(s)
    assert [(x.packet_id, x.qos) for x in got] == [(2, 1), (3, 1), (4, 2), (5, 1), (6, 1)]
    # epochs 1 and 2 acknowledged, 3's PUBREC (its identifier told to the replicator), 4 and
    # 5: the ack before the change stays before it, those after it wait for 3
    out = send(s, p.PubAck(2), p.PubAck(3), p.PubRec(4), p.PubAck(5), p.PubAck(6))
    assert [type(x) for x in out] == [m.SessionAck, m.SessionQos2]
    assert out[0] == m.SessionAck("mqtt.car-7", 2)
    s.from_broker(m.SessionKept("mqtt.car-7", req=out[1].req))
    assert packets_of(s) == [p.PubRel(4)]
    assert m.SessionAck("mqtt.car-7", 5) in send(s, p.PubComp(4))


def test_qos0_deliveries_of_a_session_are_acknowledged_as_they_go():
    s = MqttSession(p.Connect("c", clean_session=False))
    (opening,) = s.start()
    s.from_broker(
        m.SessionOpened(
            "mqtt.c",
            "b1",
            "s",
            False,
            0,
            0,
            [(1, "mqtt-qos0")],
            opening.req,
            [[[C(TOPIC_ATTR, "topic", "#")]]],
        )
    )
    s.data_to_send()
    s.from_broker(
        m.SessionEvents("mqtt.c", [stored(1, "t", 1, subs=(1,)), stored(2, "t", 0, subs=(1,))])
    )
    assert [x.qos for x in packets_of(s)] == [0, 0]
    # one ack for the batch (SessionAck is cumulative)
    assert s.take_pending() == [m.SessionAck("mqtt.c", 2)]


def test_a_session_refused_or_taken_over_ends_the_connection():
    s = MqttSession(p.Connect("c", clean_session=False))
    (opening,) = s.start()
    s.from_broker(
        m.Error("durable session 'mqtt.c' belongs to 'bob'", denied=True, req=opening.req)
    )
    assert packets_of(s) == [p.ConnAck(p.NOT_AUTHORIZED)]
    assert "belongs to" in s.closed
    s = MqttSession(p.Connect("c", clean_session=False))
    s.start()
    s.from_broker(m.SessionClosed("mqtt.c", "replicator b1 is unreachable", retry=True))
    assert packets_of(s) == [p.ConnAck(p.UNAVAILABLE)]
    s = MqttSession(p.Connect("c", clean_session=False))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.c", "b1", "s", True, 0, 0, [], opening.req))
    s.from_broker(m.SessionClosed("mqtt.c", "taken over at b7"))
    assert s.closed == "durable session mqtt.c: taken over at b7"


def test_client_ids_that_cannot_name_a_session_are_hashed():
    assert session_name("sensor-1.a") == "mqtt.sensor-1.a"
    odd = session_name("a b/c")
    assert odd.startswith("mqtt.h") and odd != session_name("a b/d")


def test_an_open_left_unanswered_is_connack_3():
    s = MqttSession(p.Connect("c", clean_session=False))
    s.start()
    s.open_timed_out()
    assert packets_of(s) == [p.ConnAck(p.UNAVAILABLE)]
    assert "not opened in time" in s.closed
    s.open_timed_out()  # once
    assert packets_of(s) == []


def test_a_refused_subscribe_undoes_only_its_own_filters_and_one_read_is_one_request():
    s = opened(p.Connect("c"))
    out = send(s, p.Subscribe(1, (("admin/#", 1),)), p.Subscribe(2, (("sensors/#", 0),)))
    (sub,) = out  # the two SUBSCRIBEs of one read: one profile asked for
    assert [c[0].value for c in sub.conjunctions] == ["admin/#", "sensors/#"]
    s.from_broker(m.Error("may not subscribe to admin/#", denied=True, req=sub.req))
    assert packets_of(s) == [p.SubAck(1, (0x80,)), p.SubAck(2, (0x80,))]
    assert s.filters == {}
    (again,) = send(s, p.Subscribe(3, (("sensors/#", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=again.req))
    assert packets_of(s) == [p.SubAck(3, (0,))]
    assert s.filters == {"sensors/#": 0}


def test_what_mqtt_cannot_carry_is_not_sent():
    s = opened(p.Connect("c"))
    send(s, p.Subscribe(1, (("#", 1),)))
    s.data_to_send()
    bad = [("a/+", 1), ("x" * 70000, 1), ("ok", -1)]
    items = [
        m.EventItem(i, 0, 0, m.Event({TOPIC_ATTR: t, QOS_ATTR: q}, b""))
        for i, (t, q) in enumerate(bad)
    ]
    s.from_broker(m.Deliver(SUB_ID, "b", items))
    assert [(x.topic, x.qos) for x in packets_of(s)] == [("ok", 1)]  # a bad QoS is the filter's
    # the same at QoS 0 (written straight as bytes), short topics and long ones alike
    send(s, p.Subscribe(2, (("#", 0),)))
    s.data_to_send()
    topics = ["a/+", "ok", "x" * 70000, "y" * 300, "é" * 300, "a/+"]
    items = [m.EventItem(i, 0, 0, m.Event({TOPIC_ATTR: t}, b"p")) for i, t in enumerate(topics)]
    s.from_broker(m.Deliver(SUB_ID, "b", items))
    got = packets_of(s)
    assert [(x.topic, x.qos, x.payload) for x in got] == [
        ("ok", 0, b"p"),
        ("y" * 300, 0, b"p"),
        ("é" * 300, 0, b"p"),
    ]


def test_a_filter_removed_gets_nothing_while_its_removal_is_unanswered():
    """Every filter at one QoS needs no match for a delivery's QoS — but not while a change
    is on its way to the broker, whose deliveries may still be for the old filters."""
    s = opened(p.Connect("c"))
    (sub,) = send(s, p.Subscribe(1, (("a/#", 0), ("b/#", 0))))
    s.from_broker(m.SubAck(SUB_ID, req=sub.req))
    s.data_to_send()
    s.from_broker(deliver(("b/x", 0)))
    assert [x.topic for x in packets_of(s)] == ["b/x"]
    (unsub,) = [x for x in send(s, p.Unsubscribe(2, ("b/#",))) if type(x) is m.Subscribe]
    s.from_broker(deliver(("b/x", 0), ("a/x", 0)))
    assert [x.topic for x in packets_of(s)] == ["a/x"]
    s.from_broker(m.SubAck(SUB_ID, req=unsub.req))
    assert packets_of(s) == [p.UnsubAck(2)]
    s.from_broker(deliver(("a/y", 0)))
    assert [x.topic for x in packets_of(s)] == ["a/y"]


def test_many_filters_match_through_a_tree():
    s = opened(p.Connect("c"))
    send(s, p.Subscribe(1, tuple((f"miss/{i}/+", 2) for i in range(1000)) + (("hit/#", 1),)))
    s.data_to_send()
    s.from_broker(deliver(("hit/a", 2)))
    assert [(x.topic, x.qos) for x in packets_of(s)] == [("hit/a", 1)]


def test_a_retained_publish_carries_retain_and_what_is_retained_follows_a_suback():
    s = opened(p.Connect("c"))
    (msg,) = send(s, p.Publish("a/b", b"20", 1, retain=True, packet_id=4))
    assert msg.events[0].attributes[RETAIN_ATTR] == 1
    (sub,) = send(s, p.Subscribe(1, (("a/+", 1), ("x", 0), ("a/#", 2))))
    assert s.take_pending() == []  # not before the SUBACK
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    (ask,) = s.take_pending()
    assert ask == m.RetainedAsk(["a/+", "x", "a/#"], req=ask.req)
    assert packets_of(s) == [p.SubAck(1, (1, 0, 2))]
    retained = [
        m.Event({TOPIC_ATTR: "a/b", QOS_ATTR: 1, RETAIN_ATTR: 1}, b"20"),
        m.Event({TOPIC_ATTR: "x", QOS_ATTR: 2, RETAIN_ATTR: 1}, b"x"),
    ]
    s.from_broker(m.Retained(retained, req=ask.req))
    got = packets_of(s)
    assert [(x.topic, x.qos, x.retain, x.payload) for x in got] == [
        ("a/b", 1, True, b"20"),  # the highest of its filters, the publisher's lower
        ("x", 0, True, b"x"),
    ]
    s.from_broker(m.Retained(retained, req=ask.req))  # answered once only
    s.from_broker(deliver(("a/b", 1)))  # live: RETAIN 0 whatever it was published with
    (live,) = packets_of(s)
    assert not live.retain


def test_a_large_retained_answer_becomes_publishes_a_step_at_a_time_in_order():
    """An answer of thousands of retained messages: RETAINED_STEP of them become PUBLISHes at
    once, the rest a step per call of the driver (``retained_more``), in the answer's order."""
    s = opened(p.Connect("c"))
    (sub,) = send(s, p.Subscribe(1, (("r/#", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    (ask,) = s.take_pending()
    s.data_to_send()
    n = RETAINED_STEP * 3 + 5
    kept = [m.Event({TOPIC_ATTR: f"r/{i}", RETAIN_ATTR: 1}, b"%d" % i) for i in range(n)]
    s.from_broker(m.Retained(kept, req=ask.req))
    got = packets_of(s)
    assert len(got) == RETAINED_STEP and s.retained_more
    steps = 0
    while s.retained_more:
        s.retained_step()
        steps += 1
        got += packets_of(s)
    assert steps == 3 and [x.payload for x in got] == [b"%d" % i for i in range(n)]
    assert all(x.retain for x in got)


def test_a_live_message_is_not_followed_by_the_older_retained_one_nor_an_unsubscribed_filter():
    """While what is retained is asked or sent, a live message on a topic makes the answer's
    (older) message for it go no more — the client would keep the older; after an UNSUBACK
    nothing retained goes on the filters it removed (§3.10.4)."""
    s = opened(p.Connect("c"))
    (sub,) = send(s, p.Subscribe(1, (("r/#", 0), ("q/#", 0))))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    (ask,) = s.take_pending()
    s.from_broker(deliver(("r/0", 0)))  # live before the answer came
    s.data_to_send()
    n = RETAINED_STEP + 10
    kept = [m.Event({TOPIC_ATTR: f"r/{i}", RETAIN_ATTR: 1}, b"old") for i in range(n)]
    kept += [m.Event({TOPIC_ATTR: f"q/{i}", RETAIN_ATTR: 1}, b"old") for i in range(n)]
    s.from_broker(m.Retained(kept, req=ask.req))
    first = packets_of(s)
    assert [x.topic for x in first] == [f"r/{i}" for i in range(1, RETAINED_STEP)]  # not r/0
    s.from_broker(deliver(("r/300", 0)))  # live while the answer is being sent
    (unsub,) = send(s, p.Unsubscribe(2, ("q/#",)))
    s.from_broker(m.SubAck(SUB_ID, True, req=unsub.req))
    assert [type(x) for x in packets_of(s)] == [p.Publish, p.UnsubAck]
    while s.retained_more:
        s.retained_step()
    rest = [x.topic for x in packets_of(s)]
    assert rest == [f"r/{i}" for i in range(RETAINED_STEP, n) if i != 300]  # no q/
    s.from_broker(deliver(("r/5", 0)))  # nothing in hand: nothing to remember
    assert s._live is None


def test_a_live_message_keeps_the_older_retained_one_from_earlier_asks_only():
    """A live message suppresses the retained message of the asks sent before it, not of one
    sent after it (a later SUBSCRIBE is owed what is retained on its filters: §3.3.1.3)."""
    s = opened(p.Connect("c"))
    (sub,) = send(s, p.Subscribe(1, (("a/#", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    (first,) = s.take_pending()
    s.from_broker(m.Retained([], req=first.req))
    (sub2,) = send(s, p.Subscribe(2, (("r/#", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub2.req))
    (second,) = s.take_pending()
    s.from_broker(deliver(("a/1", 0)))  # live, while the ask for r/# is in hand
    (sub3,) = send(s, p.Subscribe(3, (("a/+", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub3.req))
    assert s.take_pending() == []  # one ask at a time
    s.from_broker(
        m.Retained([m.Event({TOPIC_ATTR: "a/1", RETAIN_ATTR: 1}, b"old")], req=second.req)
    )
    (third,) = s.take_pending()
    assert third.filters == ["a/+"]
    s.data_to_send()
    s.from_broker(
        m.Retained([m.Event({TOPIC_ATTR: "a/1", RETAIN_ATTR: 1}, b"kept")], req=third.req)
    )
    assert [(x.topic, x.payload, x.retain) for x in packets_of(s)] == [("a/1", b"kept", True)]


def test_a_resubscribe_asks_again_and_an_unanswerable_ask_sends_nothing():
    s = opened(p.Connect("c"))
    (sub,) = send(s, p.Subscribe(1, (("t", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    (first,) = s.take_pending()
    (sub2,) = send(s, p.Subscribe(2, (("t", 0), ("t", 0))))  # §3.8.4: again for a filter it had
    s.from_broker(m.SubAck(SUB_ID, True, req=sub2.req))
    assert s.take_pending() == []  # one ask at a time: it waits for the first's answer
    s.from_broker(m.Retained([], req=first.req))
    (second,) = s.take_pending()
    assert second.filters == ["t"] and second.req != first.req
    s.from_broker(m.Error("replicator b1 unreachable", req=second.req))
    (unsub,) = send(s, p.Unsubscribe(3, ("t",)))
    s.from_broker(m.SubAck(SUB_ID, True, req=unsub.req))
    assert s.take_pending() == []  # an UNSUBSCRIBE asks nothing
    s.data_to_send()
    s.from_broker(m.Retained([m.Event({TOPIC_ATTR: "t", RETAIN_ATTR: 1}, b"x")], req=first.req))
    assert packets_of(s) == []  # answered already (and its filter is gone)


def test_a_clean_session_connects_whether_or_not_a_persistent_one_was_discarded():
    s = MqttSession(p.Connect("c"))
    (discard,) = s.start()
    s.from_broker(
        m.Error("durable session 'mqtt.c' belongs to 'bob'", denied=True, req=discard.req)
    )
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, False)] and s.closed is None
    s.from_broker(m.SessionList([], req=discard.req))  # answered once only
    assert packets_of(s) == []


def test_a_retained_will_is_retained():
    s = opened(p.Connect("c", will=p.Will("last", b"gone", 1, True)))
    (msg,) = s.will()
    assert msg.events[0].attributes == {TOPIC_ATTR: "last", QOS_ATTR: 1, RETAIN_ATTR: 1}


def test_a_persistent_sessions_qos2_publishes_are_kept_by_it_before_pubrec():
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    profile = [[[C(TOPIC_ATTR, "topic", "a")]]]
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b1", "s", False, 0, 0, [(2, "mqtt-qos1")], opening.req,
                        profile, qos2=[7])
    )  # fmt: skip
    packets_of(s)
    # 7 was published on an earlier connection, maybe at another broker: not again
    assert send(s, p.Publish("t", b"again", 2, dup=True, packet_id=7)) == []
    assert packets_of(s) == [p.PubRec(7)]
    a, b = send(s, p.Publish("t", b"1", 2, packet_id=8), p.Publish("t", b"2", 2, packet_id=9))
    s.from_broker(m.PubAck(b.seq, "b", 1, 2, seqs=2))
    assert packets_of(s) == []  # not before the session keeps them
    (keep,) = s.take_pending()
    assert keep == m.SessionQos2("mqtt.car-7", add=[8, 9], req=keep.req)
    assert send(s, p.Publish("t", b"1", 2, dup=True, packet_id=8)) == []  # still waiting
    s.from_broker(m.SessionKept("mqtt.car-7", req=keep.req))
    assert packets_of(s) == [p.PubRec(8), p.PubRec(9)]
    (drop,) = send(s, p.PubRel(7), p.PubRel(8))
    assert drop == m.SessionQos2("mqtt.car-7", drop=[7, 8], req=drop.req)
    assert packets_of(s) == []  # not before the session lets go of them
    s.from_broker(m.SessionKept("mqtt.car-7", req=drop.req))
    assert packets_of(s) == [p.PubComp(7), p.PubComp(8)]
    assert send(s, p.PubRel(99)) == [] and packets_of(s) == [p.PubComp(99)]  # unknown: at once
    (c,) = send(s, p.Publish("t", b"new", 2, packet_id=7))  # released: a new message
    assert c.events[0].payload == b"new"


def test_a_persistent_sessions_qos2_deliveries_owe_pubrel_wherever_the_client_comes_back():
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    profile = [[[C(TOPIC_ATTR, "topic", "a/+")]]]
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b1", "s", False, 3, 2, [(3, "mqtt-qos2")], opening.req,
                        profile, last=4, rel=[4])
    )  # fmt: skip
    # epoch 4 was PUBREC'd on an earlier connection, maybe at another broker: PUBREL again
    # (its identifier, 5), and the message not again when it is replayed
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, True), p.PubRel(5)]
    later = 65539  # an epoch with the same identifier, 5: it waits for PUBCOMP 5
    s.from_broker(
        m.SessionEvents(
            "mqtt.car-7", [stored(4, "a/x", 2, subs=(3,)), stored(later, "a/y", 2, subs=(3,))]
        )
    )
    assert packets_of(s) == []
    ack, paid = send(s, p.PubComp(5))
    assert ack == m.SessionAck("mqtt.car-7", 4)
    assert paid == m.SessionQos2("mqtt.car-7", rel_drop=[4], req=paid.req)
    (sent,) = packets_of(s)
    assert (sent.topic, sent.qos, sent.packet_id, sent.dup) == ("a/y", 2, 5, False)
    # PUBREC'd: PUBREL once the session owes it, and then its epoch is taken
    (owe,) = send(s, p.PubRec(5))
    assert owe == m.SessionQos2("mqtt.car-7", rel_add=[later], req=owe.req)
    assert packets_of(s) == []
    s.from_broker(m.SessionKept("mqtt.car-7", req=owe.req))
    assert packets_of(s) == [p.PubRel(5)]
    assert s.take_pending() == [m.SessionAck("mqtt.car-7", later)]
    (paid,) = send(s, p.PubComp(5))
    assert paid == m.SessionQos2("mqtt.car-7", rel_drop=[later], req=paid.req)


def test_a_session_handed_over_to_another_replicator_is_opened_there_and_stays_connected():
    """seed 004 §4: the old replicator sends the session on once the client has everything it
    had; the client, connected as it was, gets the new one's epochs from its start on."""
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    profile = [[[C(TOPIC_ATTR, "topic", "a/+")]]]
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b18", "s18", False, 900, 0, [(2, "mqtt-qos1")],
                        opening.req, profile, qos2=[7], rel=[3])
    )  # fmt: skip
    s.from_broker(m.SessionEvents("mqtt.car-7", [stored(901, "a/x", 1)]))
    # the PUBREL owed for epoch 3 (identifier 4) since an earlier connection; then 901
    assert [(type(x), x.packet_id) for x in packets_of(s)[1:]] == [(p.PubRel, 4), (p.Publish, 902)]
    assert send(s, p.PubAck(902)) == [m.SessionAck("mqtt.car-7", 901)]
    (a,) = send(s, p.Publish("t", b"1", 2, packet_id=8))  # a QoS 2 publish as it moves
    s.from_broker(m.PubAck(a.seq, "b", 1, 1))
    (keep,) = s.take_pending()
    assert keep.add == [8]
    note = "handed over to replicator b1 (its client's unit)"
    s.from_broker(m.SessionClosed("mqtt.car-7", note, retry=True, replicator="b1"))
    assert s.closed is None and s.reopen_after == 0.0  # at once, and it stays connected
    (again,) = s.reopen()
    assert again == m.SessionOpen("mqtt.car-7", None, replicator="b1", req=again.req, expiry=0.0)
    assert s.moving and s.move_id == 1
    # the new replicator is still taking it: asked to wait, it is tried again after a pause
    s.from_broker(m.SessionClosed("mqtt.car-7", "being handed over: a moment", retry=True))
    assert s.closed is None and s.reopen_after > 0
    (again,) = s.reopen()
    assert again.replicator == "b1"
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b1", "s1", False, 2, 1, [(2, "mqtt-qos1")], again.req,
                        profile, last=3)
    )  # fmt: skip
    assert not s.moving and packets_of(s) == []  # no second CONNACK
    # the QoS 2 identifiers it holds go whole (the old replicator never answered for 8), and
    # the PUBREL it is owed under the old one's epoch 3: negative, never one of the new one's
    (whole,) = s.take_pending()
    assert (whole.add, whole.whole, whole.rel_add) == ([7, 8], True, [-3])
    s.from_broker(m.SessionKept("mqtt.car-7", req=whole.req))
    assert packets_of(s) == [p.PubRec(8)]
    # the new one's epochs, counted from its start (below those of the old one); its epoch 3
    # is not taken for the old one's, and waits for identifier 4's PUBCOMP
    s.from_broker(m.SessionEvents("mqtt.car-7", [stored(3, "a/y", 1), stored(4, "a/z", 1)]))
    assert packets_of(s) == []
    (paid,) = send(s, p.PubComp(4))
    assert paid == m.SessionQos2("mqtt.car-7", rel_drop=[-3], req=paid.req)
    got = packets_of(s)
    assert [(x.topic, x.packet_id, x.dup) for x in got] == [("a/y", 4, True), ("a/z", 5, False)]
    acks = send(s, p.PubAck(4), p.PubAck(5))
    assert acks == [m.SessionAck("mqtt.car-7", 4)]  # one for the read's PUBACKs
    # a broker it reconnects at sends the PUBREL of an old epoch again, and replays the new
    # replicator's same-numbered epoch
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b1", "s1", False, 2, 1, [(2, "mqtt-qos1")],
                        opening.req, profile, last=3, rel=[-3])
    )  # fmt: skip
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, True), p.PubRel(4)]
    s.from_broker(m.SessionEvents("mqtt.car-7", [stored(3, "a/y", 1)]))
    s.from_broker(m.SessionKept("mqtt.car-7", req=0))
    send(s, p.PubComp(4))
    assert [x.packet_id for x in packets_of(s)] == [4]


def test_a_move_that_goes_on_too_long_or_is_refused_ends_the_connection():
    s = MqttSession(p.Connect("c", clean_session=False))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.c", "b1", "s", False, 0, 0, [], opening.req))
    packets_of(s)
    for _ in range(8):  # replicators that send it on and on
        s.from_broker(m.SessionClosed("mqtt.c", "handed over", retry=True, replicator="b2"))
        assert s.closed is None
        s.reopen()
    s.from_broker(m.SessionClosed("mqtt.c", "handed over", retry=True, replicator="b2"))
    assert s.closed == "durable session mqtt.c: handed over"
    # an open sent on before the CONNACK is made there, and the CONNACK waits for it
    s = MqttSession(p.Connect("c", clean_session=False))
    s.start()
    s.from_broker(m.SessionClosed("mqtt.c", "resume there", retry=True, replicator="b3"))
    (there,) = s.reopen()
    assert there.replicator == "b3" and packets_of(s) == []
    s.from_broker(m.SessionOpened("mqtt.c", "b3", "s3", False, 0, 0, [], there.req))
    assert packets_of(s) == [p.ConnAck(p.ACCEPTED, True)]
    # an unreachable replicator (no move on) still disconnects; a move unanswered too
    s.from_broker(m.SessionClosed("mqtt.c", "replicator b3 unreachable", retry=True))
    assert s.closed is not None
    s = MqttSession(p.Connect("c", clean_session=False))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.c", "b1", "s", False, 0, 0, [], opening.req))
    s.from_broker(m.SessionClosed("mqtt.c", "handed over", retry=True, replicator="b2"))
    s.reopen()
    s.move_timed_out(s.move_id - 1)  # an earlier move's deadline: not this one's
    assert s.closed is None
    s.move_timed_out(s.move_id)
    assert "not opened again in time" in s.closed
    # where it moved, it may not be opened: at once
    s = MqttSession(p.Connect("c", clean_session=False))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.c", "b1", "s", False, 0, 0, [], opening.req))
    s.from_broker(m.SessionClosed("mqtt.c", "handed over", retry=True, replicator="b2"))
    (there,) = s.reopen()
    s.from_broker(m.Error("replicator b2 holds 10000 durable sessions", req=there.req))
    assert "10000" in s.closed


def moved_session(**opened) -> tuple[MqttSession, m.SessionOpen]:
    """A persistent session at b18 (store s18) on its way to b1, its reopen sent."""
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    profile = [[[C(TOPIC_ATTR, "topic", "a/+")]]]
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b18", "s18", False, 900, 0, [(3, "mqtt-qos2")],
                        opening.req, profile, **opened)
    )  # fmt: skip
    packets_of(s)
    return s


def test_a_move_answered_by_another_open_counts_epochs_anew_and_owes_what_was_pending():
    s = moved_session()
    s.from_broker(m.SessionEvents("mqtt.car-7", [stored(901, "a/x", 2, subs=(3,))]))
    (sent,) = packets_of(s)
    assert sent.packet_id == 902
    (owe,) = send(s, p.PubRec(902))  # PUBREC'd: its PUBREL waits for the replicator to keep it
    assert owe.rel_add == [901]
    (pub,) = send(s, p.Publish("t", b"q", 2, packet_id=30))  # not acknowledged by the pubend
    s.from_broker(m.SessionClosed("mqtt.car-7", "handed over", retry=True, replicator="b1"))
    (first,) = s.reopen()
    s.from_broker(m.SessionClosed("mqtt.car-7", "a moment", retry=True))
    (second,) = s.reopen()
    # a SUBSCRIBE's open (or the first reopen) is answered first, by the new replicator
    s.from_broker(m.SessionOpened("mqtt.car-7", "b1", "s1", False, 5, 0, [(3, "mqtt-qos2")],
                                  first.req))  # fmt: skip
    assert not s.moving
    (whole,) = s.take_pending()
    # 30 is not in the log yet: not held; the PUBREL owed by the old one's epoch 901 goes
    # with it (negative) and is sent once the new one keeps it
    assert (whole.whole, whole.add, whole.rel_add) == (True, [], [-901])
    # changes meanwhile wait for the whole to be kept (else they could arrive before it)
    s.from_broker(m.PubAck(pub.seq, "b", 1, 1))
    assert s.take_pending() == []
    s.from_broker(m.SessionKept("mqtt.car-7", req=whole.req))
    assert packets_of(s) == [p.PubRel(902)]
    (keep,) = s.take_pending()
    assert (keep.add, keep.whole) == ([30], False)
    # the new one's epochs from its start, whichever answer came first
    s.from_broker(m.SessionOpened("mqtt.car-7", "b1", "s1", False, 5, 0, [(3, "mqtt-qos2")],
                                  second.req))  # fmt: skip
    s.from_broker(m.SessionEvents("mqtt.car-7", [stored(6, "a/y", 1, subs=(3,))]))
    (new,) = [x for x in packets_of(s) if type(x) is p.Publish]
    assert new.packet_id == 7
    assert send(s, p.PubAck(7)) == [m.SessionAck("mqtt.car-7", 6)]
    (paid,) = send(s, p.PubComp(902))
    assert paid.rel_drop == [-901]


def test_a_move_tells_the_new_replicator_even_that_the_client_holds_nothing():
    """The hand-over carried identifier 9; the client released it at the old replicator
    after the hand-over began: the new one must not keep it."""
    s = moved_session(qos2=[9])
    (drop,) = send(s, p.PubRel(9))
    s.from_broker(m.SessionKept("mqtt.car-7", req=drop.req))
    assert packets_of(s) == [p.PubComp(9)]
    s.from_broker(m.SessionClosed("mqtt.car-7", "handed over", retry=True, replicator="b1"))
    (again,) = s.reopen()
    s.from_broker(m.SessionOpened("mqtt.car-7", "b1", "s1", False, 0, 0, [], again.req))
    (whole,) = s.take_pending()
    assert (whole.whole, whole.add, whole.rel_add) == (True, [], [])


# -- MQTT 5.0 -----------------------------------------------------------------------------------


def packets5(session: MqttSession) -> list:
    reader = PacketReader(version=5)
    reader.feed(session.data_to_send())
    return [p.decode(x, 5) for x in reader.packets()]


def send5(session: MqttSession, *values) -> list:
    return session.receive_data(b"".join(p.encode(v, 5) for v in values), 0)


def opened5(client_id: str = "c", props=(), **options) -> MqttSession:
    s = MqttSession(p.Connect(client_id, True, 30, level=5, props=props), **options)
    s.origin = "me"
    (discard,) = s.start()
    s.from_broker(m.SessionList([], req=discard.req))
    (ack,) = packets5(s)
    assert ack.code == 0 and not ack.session_present
    assert p.prop(ack.props, p.SUBSCRIPTION_IDS_AVAILABLE) is None  # (available: 1)
    assert p.prop(ack.props, p.SHARED_AVAILABLE) == 0
    assert p.prop(ack.props, p.TOPIC_ALIAS_MAXIMUM) == 64
    return s


def test_mqtt5_session_expiry_makes_a_persistent_session_and_clean_start_discards_first():
    s = MqttSession(p.Connect("car", True, 30, level=5, props=((p.SESSION_EXPIRY, 60),)))
    (discard,) = s.start()
    assert discard.action == "discard" and s.persistent
    s.from_broker(m.SessionList([], req=discard.req))
    (opening,) = s.take_pending()  # then a new one
    assert (opening.name, opening.subs, opening.fallback[0].sub_id) == ("mqtt.car", None, NO_SUB)
    assert opening.expiry == 60  # the replicator ends it 60 s after the client left
    s.from_broker(m.Error("no durable session 'mqtt.car' here", req=opening.req))
    assert [type(x) for x in packets5(s)] == [p.ConnAck]
    never = ((p.SESSION_EXPIRY, 0xFFFFFFFF),)
    again = MqttSession(p.Connect("car", False, 30, level=5, props=never))
    (resume,) = again.start()  # resumed, no discard
    assert type(resume) is m.SessionOpen and resume.expiry == 0  # never: retention only
    (old,) = MqttSession(p.Connect("car", False)).start()
    assert old.expiry == 0  # 3.1.1 has no expiry: the topology's sessions.expire_after


def test_mqtt5_a_session_expiry_over_the_topologys_bound_is_bounded_and_the_connack_says_so():
    """§3.2.2.3.2: the server may keep the session for less than the client asked (the
    topology's ``sessions.expire_after``), and then says how long in its CONNACK."""
    for asked, kept, said in ((0xFFFFFFFF, 3600, 3600), (7200, 3600, 3600), (60, 60, None)):
        connect = p.Connect("car", False, 30, level=5, props=((p.SESSION_EXPIRY, asked),))
        s = MqttSession(connect, max_expiry=3600.0)
        (opening,) = s.start()
        assert opening.expiry == kept
        s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", True, 0, 0, [], opening.req))
        (ack,) = packets5(s)
        assert p.prop(ack.props, p.SESSION_EXPIRY) == said, asked
    neither = MqttSession(p.Connect("", False, 30, level=5))
    assert neither.start() == [] and neither.connected  # no expiry, no clean start: at once


def test_mqtt5_a_keepalive_the_server_holds_the_client_to_is_said_in_the_connack():
    """§3.2.2.3.14: a server that holds the client to another keepalive than its own says
    which (the runtime decides: the topology's ``mqtt.max_keepalive``); else nothing."""
    for held, said in ((60, 60), (None, None)):
        s = MqttSession(p.Connect("", False, 0, level=5), keepalive=held)
        assert s.start() == [] and s.connected  # no session to open: answered at once
        (ack,) = packets5(s)
        assert type(ack) is p.ConnAck and p.prop(ack.props, p.SERVER_KEEP_ALIVE) == said


def test_mqtt5_a_disconnects_session_expiry_is_the_sessions_from_then_on():
    """§3.14.2.2.2: a DISCONNECT may change the Session Expiry Interval — bounded as at
    CONNECT, 0 ending the session as the connection closes — but not from a CONNECT's 0."""
    for said, leave in (
        (30, m.SessionLeave("mqtt.car", expiry=30.0)),
        (7200, m.SessionLeave("mqtt.car", expiry=3600.0)),  # the topology's bound
        (0xFFFFFFFF, m.SessionLeave("mqtt.car", expiry=3600.0)),
        (0, m.SessionLeave("mqtt.car", end=True)),
        (None, None),  # no interval: as it was
    ):
        connect = p.Connect("car", False, 30, level=5, props=((p.SESSION_EXPIRY, 60),))
        s = MqttSession(connect, max_expiry=3600.0)
        (opening,) = s.start()
        s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", True, 0, 0, [], opening.req))
        props = () if said is None else ((p.SESSION_EXPIRY, said),)
        out = send5(s, p.Disconnect(p.SUCCESS, props))
        assert out == ([] if leave is None else [leave]), said
        assert s.closed == "disconnected"  # its will does not go
    never = MqttSession(p.Connect("car", False, 30, level=5, props=((p.SESSION_EXPIRY, 60),)))
    (opening,) = never.start()
    never.from_broker(m.SessionOpened("mqtt.car", "b1", "s", True, 0, 0, [], opening.req))
    (leave,) = send5(never, p.Disconnect(p.SUCCESS, ((p.SESSION_EXPIRY, 0xFFFFFFFF),)))
    assert leave == m.SessionLeave("mqtt.car", expiry=0.0)  # as the topology says: never
    clean = opened5()
    assert send5(clean, p.Disconnect(p.SUCCESS, ((p.SESSION_EXPIRY, 0),))) == []
    clean = opened5()
    with pytest.raises(Malformed) as err:
        send5(clean, p.Disconnect(p.SUCCESS, ((p.SESSION_EXPIRY, 10),)))
    assert err.value.code == p.PROTOCOL_ERROR and clean.closed is None  # not a DISCONNECT


def test_mqtt5_without_clean_start_or_expiry_a_session_is_resumed_if_it_exists_and_ends_after():
    """§3.1.2.4, §3.1.2.11.2: Clean Start 0 resumes the session the client id has, and an
    absent Session Expiry Interval (0) ends it as the connection closes — the reconnect paho
    makes by default after a first Clean Start. No session is made when there is none."""
    resumed = MqttSession(p.Connect("car", False, 30, level=5))
    (opening,) = resumed.start()
    assert (opening.name, opening.create, opening.ends, opening.expiry, opening.fallback) == (
        "mqtt.car", False, True, None, None
    )  # fmt: skip
    assert packets5(resumed) == []  # the CONNACK waits for the answer
    stored_before = m.SessionOpened("mqtt.car", "b1", "s", False, 4, 2, [(2, "mqtt-qos1")], opening.req)  # fmt: skip
    resumed.from_broker(stored_before)
    (ack,) = packets5(resumed)
    assert ack.session_present and resumed.persistent
    # it ends as the client leaves, however it leaves: its replicator was told so at the open
    # (test_a_resumed_session_opened_to_end_with_its_client_ends_however_it_leaves), and a
    # DISCONNECT's interval of 0 says nothing more; one over 0 is a protocol error
    assert opening.ends and resumed.will(7) == []
    for props in ((), ((p.SESSION_EXPIRY, 0),)):
        s = MqttSession(p.Connect("car", False, 30, level=5))
        (opening,) = s.start()
        s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, [], opening.req))
        assert send5(s, p.Disconnect(p.SUCCESS, props)) == [] and s.closed == "disconnected"
    s = MqttSession(p.Connect("car", False, 30, level=5))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, [], opening.req))
    with pytest.raises(Malformed) as err:
        send5(s, p.Disconnect(p.SUCCESS, ((p.SESSION_EXPIRY, 10),)))
    assert err.value.code == p.PROTOCOL_ERROR
    # none to resume, or none that can be found now: connected without one, as a clean one
    for answer in (
        m.Error("no durable session 'mqtt.car' here", req=opening.req),
        m.SessionClosed("mqtt.car", "cannot tell whether durable session exists", retry=True),
    ):
        s = MqttSession(p.Connect("car", False, 30, level=5))
        (opening,) = s.start()
        if type(answer) is m.Error:
            answer = msgspec.structs.replace(answer, req=opening.req)
        s.from_broker(answer)
        (ack,) = packets5(s)
        assert ack.code == 0 and not ack.session_present, answer
        assert not s.persistent and s.name == "" and s.closed is None
        assert s.will(7) == []
        (sub,) = send5(s, p.Subscribe(1, (("t/#", 1),)))
        assert type(sub) is m.Subscribe  # a plain subscription, no session
    # one the client may not have (another's) is refused, as a persistent one is
    s = MqttSession(p.Connect("car", False, 30, level=5))
    (opening,) = s.start()
    s.from_broker(m.Error("not yours", denied=True, req=opening.req))
    (ack,) = packets5(s)
    assert ack.code == p.CONNACK_5[p.NOT_AUTHORIZED] and s.closed


def test_mqtt5_an_assigned_client_id_has_no_session_to_resume():
    """§3.2.2.3.7: a client id the server made up just now names no session: Clean Start 0
    with no interval connects at once, with no lookup across the replicators."""
    cid = "mqtt-b1-0123456789abcdef"
    s = MqttSession(p.Connect(cid, False, 30, level=5), assigned=cid)
    assert s.start() == [] and s.connected


def test_mqtt5_a_session_only_resumed_is_never_made_by_a_reopen_after_a_move():
    """Handed over while connected, with a SUBSCRIBE unanswered: the reopen at the replicator it
    went to carries the filters, and still makes no session if it is gone there."""
    s = MqttSession(p.Connect("car", False, 30, level=5))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, [], opening.req))
    s.receive_data(p.encode(p.Subscribe(1, (("t/#", 1),)), 5))  # unanswered
    s.from_broker(m.SessionClosed("mqtt.car", "handed over", retry=True, replicator="b2"))
    (reopen,) = s.reopen()
    assert reopen.subs and (reopen.create, reopen.ends) == (False, True)


def test_mqtt5_user_properties_are_attributes_both_ways():
    s = opened5()
    props = ((p.USER_PROPERTY, ("site", "north")), (p.USER_PROPERTY, ("bad name", "x")),
             (p.CONTENT_TYPE, "text/plain"), (p.CORRELATION_DATA, b"\x01\x02"),
             (p.RESPONSE_TOPIC, "replies/1"), (p.PAYLOAD_FORMAT, 1))  # fmt: skip
    (msg,) = send5(s, p.Publish("a", b"x", 0, props=props))
    assert msg.events[0].attributes == {
        TOPIC_ATTR: "a", QOS_ATTR: 0, "site": "north", "@content_type": "text/plain",
        "@correlation": "0102", "@response_topic": "replies/1", "@payload_format": 1,
        "@origin": "me",
    }  # fmt: skip
    (msg,) = send5(s, p.Publish("a", b"x", 0, props=((p.PAYLOAD_FORMAT, 0),)))
    assert "@payload_format" not in msg.events[0].attributes  # unspecified: the default
    with pytest.raises(Malformed, match="Payload Format Indicator of 237") as bad:
        send5(opened5(), p.Publish("a", b"x", 0, props=((p.PAYLOAD_FORMAT, 0xED),)))
    assert bad.value.code == p.PROTOCOL_ERROR  # 0 and 1 are all there are (§3.3.2.3.2)
    (sub,) = send5(s, p.Subscribe(1, (("a", 1),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    event = m.Event(
        {TOPIC_ATTR: "a", "n": 3, "ok": True, "@correlation": "0102", "@payload_format": 1}, b"y"
    )
    s.from_broker(m.Deliver(SUB_ID, "b", [m.EventItem(1, 0, 0, event)]))
    (out,) = packets5(s)
    assert out.props == (
        (p.USER_PROPERTY, ("n", "3")), (p.USER_PROPERTY, ("ok", "true")),
        (p.CORRELATION_DATA, b"\x01\x02"), (p.PAYLOAD_FORMAT, 1),
    )  # fmt: skip


def test_mqtt5_topic_aliases_are_set_and_used_per_connection():
    """§3.3.2.3.4: a topic name with an alias sets it; an empty name takes it; an alias set
    again names another topic; one never set on this connection is a protocol error."""
    s = opened5()
    alias = ((p.TOPIC_ALIAS, 7),)
    (a,) = send5(s, p.Publish("sensors/k1/temp", b"21", 0, props=alias))
    (b,) = send5(s, p.Publish("", b"22", 0, props=alias))
    (c,) = send5(s, p.Publish("sensors/k2/temp", b"5", 0, props=alias))
    (d,) = send5(s, p.Publish("", b"6", 1, packet_id=1, props=alias))
    topics = [x.events[0].attributes[TOPIC_ATTR] for x in (a, b, c, d)]
    assert topics == ["sensors/k1/temp"] * 2 + ["sensors/k2/temp"] * 2
    assert d.events[0].attributes == {TOPIC_ATTR: "sensors/k2/temp", QOS_ATTR: 1, "@origin": "me"}
    again = opened5()  # another connection: its own aliases
    with pytest.raises(Malformed, match="topic alias 7 was not set") as unset:
        send5(again, p.Publish("", b"x", 0, props=alias))
    assert unset.value.code == 0x82
    with pytest.raises(Malformed, match="topic alias of 0") as zero:
        send5(opened5(), p.Publish("t", b"x", 0, props=((p.TOPIC_ALIAS, 0),)))
    assert zero.value.code == 0x94


def test_mqtt5_a_pubrec_that_refuses_ends_the_delivery_without_a_pubrel():
    """§4.3.3: the sender sends PUBREL for a PUBREC under 0x80; one of 0x80 or more ends the
    exchange (the client will not have it): its identifier is free, and what waited goes."""
    s = opened5(props=((p.RECEIVE_MAXIMUM, 1),))
    (sub,) = send5(s, p.Subscribe(1, (("a", 2),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    s.take_pending()
    s.from_broker(deliver(("a", 2), ("a", 2)))
    (first,) = packets5(s)  # the second waits: one at a time
    assert send5(s, p.PubRec(first.packet_id, 0x80)) == []
    (second,) = packets5(s)  # no PUBREL for the first; the second goes
    assert type(second) is p.Publish and second.payload == b"e1"
    send5(s, p.PubRec(second.packet_id))
    assert packets5(s) == [p.PubRel(second.packet_id)]


def test_mqtt5_the_server_sets_topic_aliases_on_its_deliveries_as_the_client_allows():
    """§3.3.2.3.4 the other way: with a Topic Alias Maximum in its CONNECT, the client's
    deliveries carry aliases — a topic's first with its name and the alias, the next with the
    alias alone; all taken, the least recently used one names the next topic. Each delivery
    read as the client resolves aliases is the topic it was; none without a maximum, and
    none for a topic as short as an alias."""

    def deliveries(s, topics):
        s.from_broker(m.Deliver(SUB_ID, "b", [
            m.EventItem(i + 1, i, 0, m.Event({TOPIC_ATTR: t}, b"x")) for i, t in enumerate(topics)
        ]))  # fmt: skip
        return packets5(s)

    s = opened5(props=((p.TOPIC_ALIAS_MAXIMUM, 2),))
    (sub,) = send5(s, p.Subscribe(1, (("#", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    topics = ["s/a", "s/b", "s/a", "s/c", "s/b", "x", "s/c"]
    got = deliveries(s, topics)
    said = [(x.topic, p.prop(x.props, p.TOPIC_ALIAS)) for x in got]
    assert said == [("s/a", 1), ("s/b", 2), ("", 1), ("s/c", 2), ("s/b", 1), ("x", None), ("", 2)]
    known: dict[int, str] = {}  # the client's side, in order
    for x, topic in zip(got, topics, strict=True):
        alias = p.prop(x.props, p.TOPIC_ALIAS)
        if x.topic and alias:
            known[alias] = x.topic
        assert (x.topic or known[alias]) == topic

    many = opened5(props=((p.TOPIC_ALIAS_MAXIMUM, 65535),))  # at most the server's own bound
    (sub,) = send5(many, p.Subscribe(1, (("#", 0),)))
    many.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(many)
    got = deliveries(many, [f"t/{i}" for i in range(v5.ALIASES_OUT + 1)])
    assert max(p.prop(x.props, p.TOPIC_ALIAS) for x in got) == v5.ALIASES_OUT
    # a new alias adds a property: not given where the packet would then be over the client's
    # Maximum Packet Size (it goes by name, as it fits; 5.0 §3.1.2.11.4)
    whole = bytearray()
    p.write_publish(whole, p.topic_field("sensors/room/1"), b"x", 0, False, False, 0, (), True)
    tight = opened5(props=((p.TOPIC_ALIAS_MAXIMUM, 10), (p.MAXIMUM_PACKET_SIZE, len(whole))))
    (sub,) = send5(tight, p.Subscribe(1, (("#", 0),)))
    tight.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(tight)
    out = deliveries(tight, ["sensors/room/1"])
    assert [(x.topic, x.props) for x in out] == [("sensors/room/1", ())]
    none = opened5()
    (sub,) = send5(none, p.Subscribe(1, (("#", 0),)))
    none.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(none)
    assert all(not x.props for x in deliveries(none, ["s/a", "s/a"]))


def test_mqtt5_what_the_connack_said_is_not_there_breaks_the_protocol():
    s = opened5()
    with pytest.raises(Malformed, match="topic alias of 65") as alias:
        send5(s, p.Publish("a", b"x", 0, props=((p.TOPIC_ALIAS, 65),)))
    assert alias.value.code == 0x94  # over the Topic Alias Maximum the CONNACK gave
    for props in (((p.SUBSCRIPTION_ID, 0),), ((p.SUBSCRIPTION_ID, 4), (p.SUBSCRIPTION_ID, 5))):
        with pytest.raises(Malformed, match="subscription identifier") as sub_id:
            send5(opened5(), p.Subscribe(1, (("a", 0),), props))
        assert sub_id.value.code == p.PROTOCOL_ERROR  # 0, or two (§3.8.2.1.2)


def test_mqtt5_subscribe_options_and_reason_codes():
    s = opened5(max_filters=2)
    (sub,) = send5(s, p.Subscribe(1, (("$share/g/a", 1), ("own", 1 | 4), ("r", 1 | 8 | 32),
                                      ("x", 0))))  # fmt: skip
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    (ack,) = packets5(s)
    assert ack.codes == (p.SHARED_NOT_SUPPORTED, 1, 1, p.QUOTA_EXCEEDED)
    (ask,) = s.take_pending()
    assert ask.filters == ["own"]  # Retain Handling 2: nothing retained for 'r'
    mine = m.Event({TOPIC_ATTR: "own", "@origin": "me"}, b"mine")
    theirs = m.Event({TOPIC_ATTR: "own", "@origin": "else"}, b"theirs")
    kept = m.Event({TOPIC_ATTR: "r", RETAIN_ATTR: 1}, b"kept")
    items = [m.EventItem(i + 1, i, 0, e) for i, e in enumerate((mine, theirs, kept))]
    s.from_broker(m.Deliver(SUB_ID, "b", items))
    got = packets5(s)
    assert [(x.payload, x.retain) for x in got] == [(b"theirs", False), (b"kept", True)]
    (unsub,) = send5(s, p.Unsubscribe(2, ("own", "never")))
    s.from_broker(m.SubAck(SUB_ID, True, req=unsub.req))
    assert packets5(s) == [p.UnsubAck(2, (p.SUCCESS, p.NO_SUBSCRIPTION))]


def test_mqtt5_refusals_and_the_client_limits():
    s = opened5(props=((p.RECEIVE_MAXIMUM, 1), (p.MAXIMUM_PACKET_SIZE, 64)))
    assert s.max_inflight == 1
    (pub,) = send5(s, p.Publish("t", b"x", 1, packet_id=3))
    s.from_broker(m.Error("not allowed", denied=True, req=pub.seq))
    assert packets5(s) == [p.PubAck(3, p.NOT_AUTHORIZED_5)]
    (sub,) = send5(s, p.Subscribe(1, (("a", 1),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    s.take_pending()
    big, small = m.Event({TOPIC_ATTR: "a"}, b"z" * 100), m.Event({TOPIC_ATTR: "a"}, b"ok")
    s.from_broker(m.Deliver(SUB_ID, "b", [m.EventItem(1, 0, 0, big), m.EventItem(2, 1, 0, small)]))
    assert [x.payload for x in packets5(s)] == [b"ok"]  # over 64 bytes: not sent
    assert send5(s, p.Disconnect(p.DISCONNECT_WITH_WILL)) == []
    assert s.closed == "disconnected with its will"


def test_mqtt5_a_client_over_the_server_s_receive_maximum_is_disconnected_with_0x93(monkeypatch):
    """§3.2.2.3.3, §4.9: the CONNACK says how many QoS 1 and 2 PUBLISHes the client may have
    unanswered — a QoS 1 one until its PUBACK, a QoS 2 one until its PUBREL — and one more
    is a protocol error with 0x93. QoS 0 and a QoS 2 one sent again do not count; a 3.1.1
    client, which has no such property, is not bound by it."""
    monkeypatch.setattr(v5, "RECEIVE_MAX", 3)
    s = MqttSession(p.Connect("c", True, 30, level=5))
    (discard,) = s.start()
    s.from_broker(m.SessionList([], req=discard.req))
    (ack,) = packets5(s)
    assert p.prop(ack.props, p.RECEIVE_MAXIMUM) == 3
    one, two = send5(s, p.Publish("t", b"1", 1, packet_id=1), p.Publish("t", b"2", 2, packet_id=2))
    assert send5(s, p.Publish("t", b"2", 2, dup=True, packet_id=2)) == []  # the same one
    assert len(send5(s, *[p.Publish("t", b"0", 0)] * 5)) == 5  # QoS 0: not counted
    (three,) = send5(s, p.Publish("t", b"3", 1, packet_id=3))
    s.from_broker(m.PubAck(two.seq, "b", 1, 2))  # PUBREC: still unanswered until its PUBREL
    assert packets5(s) == [p.PubRec(2)]
    with pytest.raises(Malformed) as over:
        send5(s, p.Publish("t", b"4", 1, packet_id=4))
    assert over.value.code == p.RECEIVE_MAXIMUM_EXCEEDED and "Receive Maximum" in str(over.value)

    s = opened5()  # again, with room made each way
    one, two, three = send5(s, *(p.Publish("t", b"x", 2 - i % 2, packet_id=i) for i in (1, 2, 3)))
    s.from_broker(m.PubAck(one.seq, "b", 1, 1))  # PUBACK: room for one
    (four,) = send5(s, p.Publish("t", b"4", 2, packet_id=4))
    s.from_broker(m.PubAck(two.seq, "b", 1, 2))
    assert packets5(s) == [p.PubAck(1), p.PubRec(2)]
    send5(s, p.PubRel(2))  # released: room for one
    assert len(send5(s, p.Publish("t", b"5", 1, packet_id=5))) == 1
    with pytest.raises(Malformed):
        send5(s, p.Publish("t", b"6", 2, packet_id=6))

    s = opened5()  # a refused QoS 2 PUBLISH is answered (PUBREC 0x87): its room is back
    refused, two = send5(
        s, p.Publish("t", b"1", 2, packet_id=1), p.Publish("t", b"2", 2, packet_id=2)
    )
    s.from_broker(m.Error("not allowed", denied=True, req=refused.seq))
    assert packets5(s) == [p.PubRec(1, p.NOT_AUTHORIZED_5)]
    assert (
        len(send5(s, p.Publish("t", b"3", 2, packet_id=3), p.Publish("t", b"4", 2, packet_id=4)))
        == 2
    )
    with pytest.raises(Malformed):
        send5(s, p.Publish("t", b"5", 2, packet_id=5))

    old = opened(p.Connect("c"))  # 3.1.1
    assert len(send(old, *(p.Publish("t", b"x", 1 + i % 2, packet_id=i) for i in range(1, 9)))) == 8

    # sent before the CONNACK said it (§3.1.4: such a client does not know it yet): not counted
    early = MqttSession(p.Connect("c", True, 30, level=5))
    (discard,) = early.start()
    ahead = b"".join(p.encode(p.Publish("t", b"x", 1, packet_id=i), 5) for i in range(1, 9))
    assert early.receive_data(ahead, 0) == []  # held until the CONNACK
    early.from_broker(m.SessionList([], req=discard.req))
    assert len(early.release_early()) == 8


def expiring(topic: str, seconds: int, wall_ns: int, qos: int = 1) -> m.Event:
    return m.Event({TOPIC_ATTR: topic, QOS_ATTR: qos, "@expiry": seconds}, b"x", wall_ns)


S = 1_000_000_000


def test_mqtt5_message_expiry_travels_as_an_attribute_and_goes_out_as_what_is_left():
    """§3.3.2.3.3: the interval is counted from the publish; what goes carries what is left
    (rounded up), and what has expired before it could go is not sent, to either version."""
    s = opened5()
    (msg,) = send5(s, p.Publish("a", b"x", 1, packet_id=1, props=((p.MESSAGE_EXPIRY, 30),)))
    assert msg.events[0].attributes["@expiry"] == 30
    (sub,) = send5(s, p.Subscribe(1, (("a", 1),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    fresh, stale = expiring("a", 30, 100 * S), expiring("a", 30, 50 * S)
    items = [m.EventItem(1, 0, 0, fresh), m.EventItem(2, 1, 0, stale)]
    s.from_broker(m.Deliver(SUB_ID, "b", items), wall_ns=110 * S + 1)  # 20 s left, and none
    (out,) = packets5(s)
    assert p.prop(out.props, p.MESSAGE_EXPIRY) == 20
    assert "@expiry" not in [v[0] for pid, v in out.props if pid == p.USER_PROPERTY]
    old = opened(p.Connect("c3"))
    (sub,) = send(old, p.Subscribe(1, (("a", 1),)))
    old.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets_of(old)
    old.from_broker(m.Deliver(SUB_ID, "b", items), wall_ns=110 * S)
    assert [x.payload for x in packets_of(old)] == [b"x"]  # the fresh one only
    assert old.delivered == 1


def test_mqtt5_a_delivery_that_expires_while_it_waits_is_not_sent():
    s = opened5(max_inflight=1)
    (sub,) = send5(s, p.Subscribe(1, (("#", 1),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    first, waits = expiring("a", 60, 100 * S), expiring("b", 5, 100 * S)
    later = expiring("c", 60, 100 * S)
    items = [m.EventItem(i + 1, i, 0, e) for i, e in enumerate((first, waits, later))]
    s.from_broker(m.Deliver(SUB_ID, "b", items), wall_ns=101 * S)
    (out,) = packets5(s)  # the window holds one: the others wait
    assert out.topic == "a" and s.waiting_bytes > 0
    s.receive_data(p.encode(p.PubAck(out.packet_id), 5), 106 * S)  # b's 5 s are over
    (out,) = packets5(s)
    assert out.topic == "c" and p.prop(out.props, p.MESSAGE_EXPIRY) == 54
    assert s.waiting_bytes == 0


def test_an_expired_message_of_a_persistent_session_is_taken_without_being_sent():
    s = MqttSession(p.Connect("car-7", clean_session=False))
    (opening,) = s.start()
    s.from_broker(
        m.SessionOpened("mqtt.car-7", "b1", "s", False, 0, 0, [(2, "mqtt-qos1")], opening.req)
    )
    packets_of(s)
    gone, kept = expiring("a/x", 10, 100 * S), expiring("a/y", 100, 100 * S)
    items = [
        m.SessionItem(1, "b1", m.EventItem(1, 0, 0, gone), [2]),
        m.SessionItem(2, "b1", m.EventItem(2, 1, 0, kept), [2]),
    ]
    s.from_broker(m.SessionEvents("mqtt.car-7", items), wall_ns=150 * S)
    (out,) = packets_of(s)
    assert out.topic == "a/y"
    assert s.take_pending() == [m.SessionAck("mqtt.car-7", 1)]  # epoch 1 is done with
    assert send(s, p.PubAck(out.packet_id), wall_ns=151 * S) == [m.SessionAck("mqtt.car-7", 2)]


def test_mqtt5_a_wills_properties_are_its_events():
    will = p.Will("w", b"bye", props=((p.MESSAGE_EXPIRY, 9), (p.USER_PROPERTY, ("k", "v"))))
    s = MqttSession(p.Connect("c", True, 30, will=will, level=5))
    (discard,) = s.start()
    s.from_broker(m.SessionList([], req=discard.req))
    (publish,) = s.will(7)
    assert publish.events[0].attributes == {TOPIC_ATTR: "w", QOS_ATTR: 0, "@expiry": 9, "k": "v"}


def test_mqtt5_a_will_with_a_delay_is_left_with_the_persistent_sessions_replicator():
    """§3.1.3.2.2: a persistent session's will with a Will Delay Interval goes to its
    replicator (SessionLeave), which publishes it later unless the session is opened again; a
    clean session's, or one whose session ends as the client goes, is published now."""
    will = p.Will("w/car", b"gone", props=((p.WILL_DELAY, 30),))
    lasting = ((p.SESSION_EXPIRY, 600),)

    def connected(props=lasting, client_id: str = "car") -> MqttSession:
        s = MqttSession(p.Connect(client_id, False, 30, will=will, level=5, props=props))
        (opening,) = s.start()
        if props:
            s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", True, 0, 0, [], opening.req))
        else:  # no session to resume
            s.from_broker(m.Error("no durable session 'mqtt.car' here", req=opening.req))
        assert s.connected
        return s

    (leave,) = connected().will(7)
    assert (type(leave), leave.name, leave.will_delay, leave.expiry, leave.end) == (
        m.SessionLeave, "mqtt.car", 30.0, None, False
    )  # fmt: skip
    assert leave.will.attributes == {TOPIC_ATTR: "w/car", QOS_ATTR: 0}
    assert leave.will.payload == b"gone" and leave.will.published_at == 7
    (publish,) = connected(props=()).will(7)  # clean: its session ends now
    assert type(publish) is m.Publish and publish.events[0].payload == b"gone"
    # DISCONNECT with its will and an expiry: they leave together
    s = connected()
    assert send5(s, p.Disconnect(p.DISCONNECT_WITH_WILL, ((p.SESSION_EXPIRY, 60),))) == []
    (leave,) = s.will(7)
    assert (leave.expiry, leave.will_delay, leave.will.payload) == (60.0, 30.0, b"gone")
    # ... and with 0 the session ends: the will goes now, then the session ends
    s = connected()
    assert send5(s, p.Disconnect(p.DISCONNECT_WITH_WILL, ((p.SESSION_EXPIRY, 0),))) == []
    publish, leave = s.will(7)
    assert type(publish) is m.Publish and leave == m.SessionLeave("mqtt.car", end=True)
    # a DISCONNECT with reason 0 and no will to go: the expiry leaves at once
    s = connected()
    assert send5(s, p.Disconnect(p.SUCCESS, ((p.SESSION_EXPIRY, 60),))) == [
        m.SessionLeave("mqtt.car", expiry=60.0)
    ]


def test_a_wild_expiry_or_a_clock_ahead_is_no_longer_than_its_interval():
    """A GES publisher's @expiry out of MQTT's range is no expiry; its clock ahead of this one's
    does not lengthen what is left."""
    s = opened5()
    (sub,) = send5(s, p.Subscribe(1, (("a", 0),)))
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    wild = m.Event({TOPIC_ATTR: "a", "@expiry": 2**40}, b"w", 100 * S)
    ahead = m.Event({TOPIC_ATTR: "a", "@expiry": 30}, b"f", 500 * S)
    items = [m.EventItem(1, 0, 0, wild), m.EventItem(2, 1, 0, ahead)]
    s.from_broker(m.Deliver(SUB_ID, "b", items), wall_ns=110 * S)
    first, second = packets5(s)
    assert p.prop(first.props, p.MESSAGE_EXPIRY) is None
    assert p.prop(second.props, p.MESSAGE_EXPIRY) == 30


def test_a_delivery_begun_before_the_client_left_goes_again_however_old():
    """§3.3.2.3.3 drops only what has not begun: what the replicator streamed to the client
    before (SessionOpened.sent) is sent again, DUP, with an interval of at least 1 s."""
    s = MqttSession(p.Connect("car-7", True, 30, level=5, props=((p.SESSION_EXPIRY, 600),)))
    s.from_broker(m.SessionList([], req=s.start()[0].req))
    (opening,) = s.take_pending()
    s.from_broker(
        m.SessionOpened(
            "mqtt.car-7", "b1", "s", False, 0, 2, [(2, "mqtt-qos1")], opening.req, last=2, sent=1
        )
    )
    packets5(s)
    old = [
        m.SessionItem(e, "b1", m.EventItem(e, 0, 0, expiring("a", 10, 100 * S)), [2])
        for e in (1, 2)
    ]
    s.from_broker(m.SessionEvents("mqtt.car-7", old), wall_ns=200 * S)
    (again,) = packets5(s)  # epoch 1 had begun; epoch 2 had not, and is over
    assert (again.packet_id, again.dup, p.prop(again.props, p.MESSAGE_EXPIRY)) == (2, True, 1)


def test_mqtt5_a_persistent_session_keeps_no_local_and_retain_as_published_where_it_resumes():
    """The options are the session's (§4.1), and No Local is by client id (§3.8.3.1): what the
    client published on an earlier connection is its own after it resumes, at any broker."""
    expiry = ((p.SESSION_EXPIRY, 3600),)
    s = MqttSession(p.Connect("car", False, 30, level=5, props=expiry))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", True, 0, 0, [], opening.req))
    packets5(s)
    (change,) = send5(s, p.Subscribe(1, (("own", 1 | 4), ("r", 1 | 8), ("x", 2))))
    # one subscription per QoS and options: 1 + QoS, 16 more for No Local, 32 for RAP
    assert [(x.sub_id, x.profile_id) for x in change.subs] == [
        (3, "mqtt-qos2"),
        (18, "mqtt-qos1-nolocal"),
        (34, "mqtt-qos1-rap"),
    ]
    (published,) = send5(s, p.Publish("own", b"mine", 0))
    origin = published.events[0].attributes["@origin"]
    # the client comes back on a new connection (another broker), the session with it
    again = MqttSession(p.Connect("car", False, 30, level=5, props=expiry))
    assert again.origin == origin
    (resume,) = again.start()
    subs = [(x.sub_id, x.profile_id) for x in change.subs]
    profiles = [x.conjunctions for x in change.subs]
    again.from_broker(
        m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, subs, resume.req, profiles)
    )
    (ack,) = packets5(again)
    assert ack.session_present and again.filters == {"own": 1, "r": 1, "x": 2}
    mine = m.Event({TOPIC_ATTR: "own", QOS_ATTR: 1, "@origin": origin}, b"mine")
    theirs = m.Event({TOPIC_ATTR: "own", QOS_ATTR: 1, "@origin": "else"}, b"theirs")
    kept = m.Event({TOPIC_ATTR: "r", QOS_ATTR: 1, RETAIN_ATTR: 1}, b"kept")
    items = [
        m.SessionItem(i + 1, "b1", m.EventItem(i + 1, 0, 0, e), [sub])
        for i, (e, sub) in enumerate(((mine, 18), (theirs, 18), (kept, 34)))
    ]
    again.from_broker(m.SessionEvents("mqtt.car", items))
    got = packets5(again)
    assert [(x.payload, x.retain) for x in got] == [(b"theirs", False), (b"kept", True)]
    # a 3.1.1 connection of the same session has neither option (3.1.1 has none)
    old = MqttSession(p.Connect("car", False))
    (resume,) = old.start()
    old.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, subs, resume.req, profiles))
    assert old.filters == {"own": 1, "r": 1, "x": 2} and old._options == {}
    # it applies neither, but a change of its filters keeps them for the session: a 5.0
    # connection coming back later still has them (a filter it subscribes again has none)
    (change,) = send(old, p.Subscribe(1, (("r", 1), ("y", 0))))
    assert [(x.sub_id, x.profile_id) for x in change.subs] == [
        (1, "mqtt-qos0"),
        (2, "mqtt-qos1"),
        (3, "mqtt-qos2"),
        (18, "mqtt-qos1-nolocal"),
    ]


def ids_of(packet) -> list[int]:
    return [value for pid, value in packet.props if pid == p.SUBSCRIPTION_ID]


def test_mqtt5_a_delivery_carries_the_subscription_identifiers_of_the_filters_it_matched():
    """§3.3.4: each matching filter's identifier, once; none for a filter subscribed without
    one; what is retained on a filter carries it too; a refused change takes its away."""
    s = opened5()
    (sub,) = send5(
        s,
        p.Subscribe(1, (("a/+", 1), ("b", 0)), ((p.SUBSCRIPTION_ID, 4),)),
        p.Subscribe(2, (("a/b", 0),), ((p.SUBSCRIPTION_ID, 268_435_455),)),
        p.Subscribe(3, (("c", 0), ("b/#", 0)), ((p.SUBSCRIPTION_ID, 4),)),
        p.Subscribe(4, (("c", 0),)),  # subscribed again, without one
    )
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    assert [x.codes for x in packets5(s)] == [(1, 0), (0,), (0, 0), (0,)]
    kept = [m.Event({TOPIC_ATTR: "a/b", RETAIN_ATTR: 1}, b"r")]
    (ask,) = s.take_pending()  # the first SUBSCRIBE's filters; the rest's asked next
    s.from_broker(m.Retained(kept, req=ask.req))
    (retained,) = packets5(s)
    assert ask.filters == ["a/+", "b"] and retained.retain and ids_of(retained) == [4]
    (ask,) = s.take_pending()
    s.from_broker(m.Retained(kept, req=ask.req))
    (retained,) = packets5(s)
    assert ask.filters == ["a/b", "c", "b/#"] and ids_of(retained) == [268_435_455]
    s.from_broker(deliver(("a/b", 1), ("a/x", 1), ("b", 0), ("c", 0)))
    got = packets5(s)
    assert [(x.topic, x.qos, ids_of(x)) for x in got] == [
        ("a/b", 1, [4, 268_435_455]),  # two filters, two identifiers
        ("a/x", 1, [4]),
        ("b", 0, [4]),  # 'b' and 'b/#' both have 4: once
        ("c", 0, []),
    ]
    (unsub,) = send5(s, p.Unsubscribe(5, ("a/+",)))
    s.from_broker(m.SubAck(SUB_ID, True, req=unsub.req))
    packets5(s)
    s.from_broker(deliver(("a/b", 1)))
    (only,) = packets5(s)
    assert (only.qos, ids_of(only)) == (0, [268_435_455])
    # a change the broker refuses is undone with its identifiers
    (refused,) = send5(s, p.Subscribe(6, (("a/b", 0), ("d", 0)), ((p.SUBSCRIPTION_ID, 9),)))
    s.from_broker(m.Error("no", req=refused.req))
    assert packets5(s)[0].codes == (p.SUBSCRIBE_FAILED, p.SUBSCRIBE_FAILED)
    s.from_broker(deliver(("a/b", 1)))
    (again,) = packets5(s)
    assert ids_of(again) == [268_435_455] and "d" not in s.filters


def test_a_persistent_session_keeps_subscription_identifiers_and_holds_at_most_16_kinds():
    expiry = ((p.SESSION_EXPIRY, 3600),)
    s = MqttSession(p.Connect("car", False, 30, level=5, props=expiry))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", True, 0, 0, [], opening.req))
    packets5(s)
    subscribes = [p.Subscribe(i, ((f"t/{i}", 1), (f"u/{i}", 1)), ((p.SUBSCRIPTION_ID, i),))
                  for i in range(1, 17)]  # fmt: skip
    (change,) = send5(s, *subscribes, p.Subscribe(17, (("t/1", 1),)))
    # one subscription a QoS, options and identifier: 16 of them; the last SUBSCRIBE would
    # make a 17th ('t/1' with none, 'u/1' keeping identifier 1's): over the bound
    assert len(change.subs) == 16
    assert ("mqtt-qos1-id7") in [x.profile_id for x in change.subs]
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, [], change.req))
    codes = [x.codes for x in packets5(s)]
    assert codes[:16] == [(1, 1)] * 16 and codes[16] == (p.QUOTA_EXCEEDED,)
    assert s._options["t/1"] == 1 << 8  # as it was
    # the client comes back (another broker): the identifiers are the session's
    again = MqttSession(p.Connect("car", False, 30, level=5, props=expiry))
    (resume,) = again.start()
    subs = [(x.sub_id, x.profile_id) for x in change.subs]
    profiles = [x.conjunctions for x in change.subs]
    again.from_broker(
        m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, subs, resume.req, profiles)
    )
    packets5(again)
    seven = next(x.sub_id for x in change.subs if x.profile_id == "mqtt-qos1-id7")
    item = m.SessionItem(1, "b1", m.EventItem(1, 0, 0, m.Event({TOPIC_ATTR: "u/7"}, b"x")), [seven])
    again.from_broker(m.SessionEvents("mqtt.car", [item]))
    (got,) = packets5(again)
    assert (got.topic, got.qos, ids_of(got)) == ("u/7", 1, [7])
    # a filter moved to a kind another has frees its own: 't/16' and 'u/16' to 15's
    (more,) = send5(again, p.Subscribe(18, (("t/16", 1), ("u/16", 1)), ((p.SUBSCRIPTION_ID, 15),)),
                    p.Subscribe(19, (("v", 0),)))  # fmt: skip
    again.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, [], more.req))
    assert [x.codes for x in packets5(again)] == [(1, 1), (0,)]
    assert len(more.subs) == 16 and "mqtt-qos0" in [x.profile_id for x in more.subs]
    less, *_ = send5(again, p.Unsubscribe(20, ("t/15", "u/15", "t/16")))  # (retained asks)
    assert sorted(again._kinds) == [x.sub_id for x in less.subs]  # as counted anew
    assert Counter(again._kinds.values()) == {2: 14, 1: 2}  # 'u/16' alone of 15's, and 'v'


def test_a_refusal_never_brings_a_persistent_session_back_over_16_kinds():
    """A change still unanswered may be refused, and its undo brings back the kinds it freed:
    until it is answered they count as held (another change may not take their place)."""
    expiry = ((p.SESSION_EXPIRY, 3600),)
    s = MqttSession(p.Connect("car", False, 30, level=5, props=expiry))
    (opening,) = s.start()
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", True, 0, 0, [], opening.req))
    packets5(s)
    full = [p.Subscribe(i, ((f"t/{i}", 0),), ((p.SUBSCRIPTION_ID, i),)) for i in range(1, 17)]
    (change,) = send5(s, *full)
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, [], change.req))
    packets5(s)
    # 't/1' to identifier 2's kind frees identifier 1's: in one batch, another may take it
    moved, *_ = send5(s, p.Subscribe(20, (("t/1", 0),), ((p.SUBSCRIPTION_ID, 2),)))
    # ... but while that change is unanswered, a new kind would be a 17th if it is refused
    after, *_ = send5(s, p.Subscribe(21, (("x", 0),), ((p.SUBSCRIPTION_ID, 100),)))
    s.from_broker(m.Error("no", req=moved.req))
    s.from_broker(m.SessionOpened("mqtt.car", "b1", "s", False, 0, 0, [], after.req))
    codes = [x.codes for x in packets5(s) if type(x) is p.SubAck]
    assert codes == [(p.SUBSCRIBE_FAILED,), (p.QUOTA_EXCEEDED,)]
    assert len(after.subs) == 15 and len(s._kinds_counted()) == 16
    # once every change is answered, a kind freed may be taken
    again, *_ = send5(
        s,
        p.Subscribe(22, (("t/1", 0),), ((p.SUBSCRIPTION_ID, 2),)),
        p.Subscribe(23, (("x", 0),), ((p.SUBSCRIPTION_ID, 100),)),
    )
    assert len(again.subs) == 16 and "mqtt-qos0-id100" in [x.profile_id for x in again.subs]


def test_deliveries_waiting_count_their_identifiers_and_share_them_by_topic():
    """What waits for room in the client's window counts its identifiers' bytes, and a
    topic's identifiers are worked out once and shared by its deliveries."""
    s = opened5(props=((p.RECEIVE_MAXIMUM, 1),))
    filters = ["#", "a/#", "a/b", "a/+", "+/b", "+/+", "+/#", "a/b/#", "+/b/#", "a/+/#", "+/+/#"]
    subscribes = [
        p.Subscribe(i + 1, ((f, 1),), ((p.SUBSCRIPTION_ID, 100 + i),))
        for i, f in enumerate(filters)
    ]
    (sub,) = send5(s, *subscribes)
    s.from_broker(m.SubAck(SUB_ID, True, req=sub.req))
    packets5(s)
    s.from_broker(deliver(("a/b", 1), ("a/b", 1), ("a/b", 1)))
    (first,) = packets5(s)  # the others wait: a window of 1
    assert ids_of(first) == list(range(100, 111))
    waiting = list(s._waiting)
    assert len(waiting) == 2 and waiting[0][5][-1][1] is waiting[1][5][-1][1]  # one, shared
    plain = sum(len(w[0]) + len(w[1]) + 256 for w in waiting)
    assert s.waiting_bytes == plain + 2 * 11 * 2  # 11 identifiers of 2 bytes each
    send5(s, p.PubAck(first.packet_id))
    (second,) = packets5(s)
    assert ids_of(second) == list(range(100, 111)) and s.waiting_bytes == plain // 2 + 22
