"""Messages: every type round-trips through encode/decode; bad bodies raise FrameError only."""

from __future__ import annotations

import contextlib
import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ges.wire import messages as m
from ges.wire.frames import HEADER_SIZE, PROTOCOL_VERSION, FrameDecoder, FrameError

EVENT = m.Event({"sym": "IBM", "price": 101, "ratio": 0.5, "live": True}, b"\x00payload", 123)
ITEM = m.EventItem(tick=7, prev=5, hops=2, event=EVENT)

#: One instance of every message type, with non-default values where there are defaults.
EXAMPLES = [
    m.Hello(role="broker", id="b1", topology="demo", proto=PROTOCOL_VERSION),
    m.Hello(role="client", id="c-1", topology=""),
    m.Hello("broker", "b1", "demo", digest="ab" * 32, source="topologies/demo.yaml"),
    m.Welcome(broker="b1", incarnation="42"),
    m.Refuse(reason="no"),
    m.Heartbeat(),
    m.Bye(),
    m.Bye(reason="an operator stopped it"),
    m.Connectivity(
        reports=[
            m.LinkState(
                a="b1",
                b="b2",
                a_unit=["A", "c1"],
                b_unit=["A", "c2"],
                cost=2.5,
                reporter="b1",
                version=(3, 4),
                up=False,
            ),
            m.LinkState("b1", "b3", ["A", "c1"], ["A", "c1"], None, "b3", (1, 0), True),
        ]
    ),
    m.Events(pubend="b1~1", items=[ITEM, m.EventItem(8, 7, 2, m.Event({}))]),
    m.Events(pubend="b1~1", items=[]),
    m.Events(pubend="b1~1", items=[ITEM], vm=3),
    m.Events(
        pubend="b1~1",
        items=[
            m.EventItem(
                9,
                8,
                1,
                m.Event({"x": 1}),
                (m.Route(("A", "c1", "b2")), m.Route(("A",), "c1", "b4")),
            )
        ],
    ),
    m.Profiles(
        to=["b2", "b4"],
        changes=[
            m.ProfileChange("b1", 7, 3, 1, [m.Constraint("x", "gt", 1)]),
            m.ProfileChange("b1", 7, 2, 2),
            m.ProfileChange("b1", 7, 3, 0, seqs=[1, 3]),
        ],
    ),
    m.ProfileAck(origin="b1", keeper="b4", inc=7, seqs=[1, 3]),
    m.ProfileAck(origin="b1", keeper="b4", inc=7, seqs=[1], ticks=[("b2~1", 40)]),
    m.Silence(pubend="b1~1", tick=9, to=[m.Route(("c1",), prev=4)], hops=2),
    m.Nack(pubend="b1~1", origin="b7", ranges=[(3, 5), (8, 8)]),
    m.Recovered(pubend="b1~1", to="b7", lo=3, hi=5, items=[ITEM], hops=1, detour=["b3"]),
    m.Recovered(pubend="b1~1", to="b7", lo=3, hi=5, items=[], lost=True, unit=("SSC-A", "SC-1")),
    m.AckAsk(pubend="b1~1", to=["b7", "b9"], tick=40, hops=2),
    m.Ack(pubend="b1~1", acks=[("b7", 38), ("b9", 40)], asked=40, detour=["b3"]),
    m.Clocks(clocks=[("b20", 7, 3), ("b4", 2, 11)]),
    m.Vector(pubend="b1~1", digest=4, clocks=[("b20", 7, 3, 120)]),
    m.ProfileWant(origin="b20", keeper="b6", hops=1, detour=["b3"]),
    m.Silence(pubend="b1~1", tick=9, to=[m.Route(("c1",), prev=4)], vm=4),
    m.Subscribe(
        sub_id=3,
        conjunctions=[
            [
                m.Constraint("price", "gt", 10),
                m.Constraint("sym", "eq", "IBM"),
                m.Constraint("ratio", "le", 0.25),
                m.Constraint("live", "eq", False),
                m.Constraint("sym", "exists"),
            ],
            [m.Constraint("sym", "in", ["IBM", "HPQ"]), m.Constraint("@type", "eq", "quote")],
            [],
        ],
        profile_id="cheap-ibm",
        req=4,
    ),
    m.SubAck(sub_id=3),
    m.SubAck(sub_id=3, complete=False, req=4),
    m.Unsubscribe(sub_id=3, req=5),
    m.Publish(seq=9, events=[EVENT, m.Event({"n": -1})]),
    m.PubAck(seq=9, pubend="b1~1", first_tick=1, last_tick=2),
    m.Publish(10, [EVENT], publisher="P", first=41),
    m.PubAck(10, "b1~1", 3, 2, duplicates=1),
    m.Deliver(sub_id=3, pubend="b1~1", items=[ITEM]),
    m.StatsRequest(),
    m.Stats(
        broker="b1",
        incarnation="1",
        clients=2,
        subscriptions=3,
        links_up=["b2", "b3"],
        links_expected=3,
        events_in=10,
        events_out=20,
        frames_in=5,
        frames_out=6,
        published=7,
        delivered=8,
        duplicates=1,
        pid=4321,
        links_cut=["b3"],
    ),
    m.Error(reason="bad"),
    m.LinkControl(peer="b2", up=False),
    m.LinkControlled(peer="b2", up=False, changed=True),
    m.SessionOpen(
        "alice",
        [m.SessionSub(1, "p", [[m.Constraint("n", ">", 1)]])],
        replicator="b18",
        store="ab12",
        epoch=7,
        req=3,
    ),
    m.SessionOpened("alice", "b18", "ab12", True, 7, 12, [(1, "p")], req=3),
    m.SessionEvents(
        "alice", [m.SessionItem(8, "b1~1", m.EventItem(4, 0, 2, m.Event({"n": 2})), [1])]
    ),
    m.SessionAck("alice", 8),
    m.SessionLeave("alice"),
    m.SessionClosed("alice", "moved to b19 by an operator", to="b19"),
    m.SessionClosed("alice", "handed over to replicator b12", retry=True, replicator="b12"),
    m.Handover(
        "b12",
        "b1",
        "b1/ab12/3/4000",
        "alice",
        "alice@example",
        1.5e9,
        [m.SessionSub(1, "p1", [[m.Constraint("sym", "eq", "IBM")]])],
        {"b3~1": 1200, "b1~2": 77},
        max_events=1000,
        hops=2,
        detour=["b7"],
    ),
    m.HandoverNote("b1", "b12", "b1/ab12/3/4000", "alice", "refused", "no room", hops=1),
    m.RetainedAsk(["home/+/temp", "#"], req=4),
    m.SessionQos2("mqtt.car-7", add=[7, 8], drop=[3], req=5, rel_add=[9], rel_drop=[1]),
    m.SessionKept("mqtt.car-7", req=5),
    m.Retained([m.Event({"@topic": "home/k/temp", "@retain": 1}, b"21", 5)], False, req=4),
    m.SessionControl("roam", "alice", "b19", req=4),
    m.Watch(1.0),
    m.WatchLease("b3", 1_700_000_000_000_000_000, 7, 1.0, 6.0, hops=2),
    m.Report(
        "b3",
        [
            m.carry(
                m.Reported(
                    m.Stats("b7", "12", 0, 0, ["b6"], 2, 1, 2, 3, 4, 5, 6, 0),
                    [m.LogLine(1_700_000_000.5, "info", "link b8 up")],
                    missed=2,
                )
            ),
            m.carry(m.Reported(m.Stats("b8", "13", 0, 0, ["b7"], 1, 1, 2, 3, 4, 5, 6, 0))),
        ],
        hops=3,
        detour=["b5"],
    ),
    m.SessionList(
        [m.SessionInfo("alice", "alice", "b18", "b20", 1.5, [(1, "p", "n > 1")], 8, 9, 1, 1.0)],
        req=4,
    ),
]


def body(msg) -> bytes:
    return m.encode(msg)[HEADER_SIZE:]


def test_examples_cover_every_message_type():
    assert {type(x) for x in EXAMPLES} == set(m.Message.__args__)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip(msg):
    got = m.decode(body(msg))
    assert type(got) is type(msg)
    assert got == msg


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip_through_frame_decoder(msg):
    dec = FrameDecoder()
    dec.feed(m.encode(msg))
    (got,) = dec.frames()
    assert m.decode(got) == msg


def test_stream_of_every_message_decodes_in_order_bytewise():
    data = b"".join(m.encode(x) for x in EXAMPLES)
    dec = FrameDecoder()
    out = []
    for i in range(len(data)):
        dec.feed(data[i : i + 1])
        out += [m.decode(b) for b in dec.frames()]
    assert out == EXAMPLES


def test_encode_is_one_frame_with_the_right_length():
    data = m.encode(m.Heartbeat())
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert data[4] == PROTOCOL_VERSION


def test_hello_proto_defaults_to_this_version():
    assert m.decode(body(m.Hello("client", "c", "t"))).proto == PROTOCOL_VERSION


def test_linkstate_version_is_a_tuple_after_decode():
    (connectivity,) = [e for e in EXAMPLES if type(e) is m.Connectivity]
    (got, _) = m.decode(body(connectivity)).reports
    assert got.version == (3, 4)
    assert isinstance(got.version, tuple)


# -- attribute types ---------------------------------------------------------------------------


def test_event_attribute_types_survive():
    ev = m.Event({"i": 1, "f": 1.0, "b": True, "s": "1", "z": 0, "fz": 0.0, "bf": False})
    (got,) = m.decode(body(m.Publish(1, [ev]))).events
    assert got == ev
    for name, value in ev.attributes.items():
        assert type(got.attributes[name]) is type(value), name


values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)


@given(
    st.dictionaries(st.text(max_size=10), values, max_size=8),
    st.binary(max_size=50),
    st.integers(min_value=0, max_value=2**63 - 1),
)
def test_event_round_trip_keeps_values_and_types(attributes, payload, published_at):
    ev = m.Event(attributes, payload, published_at)
    (item,) = m.decode(body(m.Events("p~1", [m.EventItem(1, 0, 0, ev)]))).items
    got = item.event
    assert got.payload == payload
    assert got.published_at == published_at
    assert got.attributes.keys() == attributes.keys()
    for name, value in attributes.items():
        assert type(got.attributes[name]) is type(value)
        assert got.attributes[name] == value


def test_nan_and_infinity_stay_floats():
    ev = m.Event({"n": math.nan, "i": math.inf})
    (got,) = m.decode(body(m.Publish(1, [ev]))).events
    assert math.isnan(got.attributes["n"])
    assert got.attributes["i"] == math.inf


# -- bad bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used in msgpack
        b"\x93",  # truncated array
        b"garbage",
        msgspec.msgpack.encode(["NoSuchMessage"]),
        msgspec.msgpack.encode({"type": "Hello"}),
        msgspec.msgpack.encode(["Hello", "broker"]),  # missing fields
        msgspec.msgpack.encode(["Hello", "broker", 1, "t"]),  # id is an int
        msgspec.msgpack.encode(["SubAck", "3"]),  # sub_id is a str
        msgspec.msgpack.encode(["SubAck", 1.5]),
        msgspec.msgpack.encode(["Publish", 1, [["not a dict"]]]),
        msgspec.msgpack.encode(["Publish", 1, [[{"a": [1, 2]}]]]),  # list attribute value
        msgspec.msgpack.encode(["Publish", 1, [[{"a": None}]]]),  # null attribute value
        msgspec.msgpack.encode(["Publish", 1, [[{"a": 1}, "not bytes"]]]),
        msgspec.msgpack.encode(["Events", "p", [[1, 0, 0]]]),  # item without event
        msgspec.msgpack.encode(["Connectivity", [["a", "b", [], [], 1.0, "a", [1], True]]]),
        msgspec.msgpack.encode(["Stats", "b1"]),
        msgspec.msgpack.encode(["Heartbeat"]) + b"trailing",
        b"\xc7\x01\x05a",  # an extension type
        b"\x91" * 100_000,  # nested far too deep
    ],
)
def test_undecodable_bodies_raise_frame_error(data):
    with pytest.raises(FrameError, match="undecodable frame"):
        m.decode(data)


def test_invalid_utf8_in_a_string_raises_frame_error():
    # BUG: msgspec raises UnicodeDecodeError for a str that is not UTF-8, and decode() only
    # converts DecodeError/ValidationError, so a peer can crash the connection handler (which
    # catches FrameError only) with a 4-byte body: ["Error", <str 0x9e>].
    data = b"\x92\xa5Error\xa1\x9e"
    with pytest.raises(FrameError):
        m.decode(data)


def mutations(examples):
    return st.tuples(
        st.sampled_from([body(x) for x in examples]),
        st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4),
    )


@given(mutations(EXAMPLES))
@settings(max_examples=500)
def test_fuzz_mutated_messages_only_raise_frame_error(case):
    # a valid body with a few bytes changed explores far more of the decoder than random bytes
    data, changes = case
    data = bytearray(data)
    for pos, byte in changes:
        data[pos % len(data)] = byte
    with contextlib.suppress(FrameError):
        m.decode(bytes(data))
