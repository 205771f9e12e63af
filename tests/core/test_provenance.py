"""Provenance checks (ges.core.provenance): what a frame of a pubend must look like to have
come from that pubend's broker over the link it arrived on."""

from __future__ import annotations

from ges.core.provenance import NOTICE_EVERY, Provenance
from ges.wire import messages as m
from tests.core.test_broker_core import TOPO  # b1-b2, b1-b3, b2-b4, b3-b4, b3-b5, b4-b5


def item(tick: int, hops: int, path=()) -> m.EventItem:
    return m.EventItem(tick, tick - 1, hops, m.Event({"n": tick}), (), tuple(path))


def at(me: str = "b3") -> Provenance:
    return Provenance(TOPO, me, {})


def test_a_routed_copy_must_have_come_along_links_from_the_owner():
    p = at("b3")
    ok = [item(1, 1, ["b1"]), item(2, 3, ["b2", "b4", "b5"]), item(3, 2, ["b2", "b1"])]
    assert p.events_refusal("b1", "b1~7", ok[:1], routed=True) is None
    assert p.events_refusal("b5", "b2~7", ok[1:2], routed=True) is None
    assert p.events_refusal("b1", "b2~7", ok[2:], routed=True) is None
    # a path through here already is fine: a keeper may route an event back the way it came
    assert p.events_refusal("b4", "b1~7", [item(4, 3, ["b1", "b3", "b4"])], routed=True) is None
    bad = {
        "does not start at the pubend's broker b2": ("b1", "b2~7", item(1, 1, ["b1"])),
        "does not end at b4, which sent it": ("b4", "b1~7", item(1, 1, ["b1"])),
        "steps from b2 to b5, which are not linked": ("b5", "b2~7", item(1, 2, ["b2", "b5"])),
        "does not fit its 1 hop(s)": ("b4", "b2~7", item(1, 1, ["b2", "b4"])),
        "does not start": ("b1", "b1~7", item(1, 0, [])),
    }
    for needle, (peer, pubend, it) in bad.items():
        why = p.events_refusal(peer, pubend, [it], routed=True)
        assert why is not None and needle in why and why.startswith("tick 1: "), (needle, why)


def test_a_flooded_frame_or_silence_must_be_far_enough_from_its_owner():
    p = at("b3")
    assert p.origin_refusal("b1", "b1", 1) is None
    assert p.origin_refusal("b1", "b2", 2) is None  # b2 -> b1 -> b3
    assert "claims to come straight from b2" in p.origin_refusal("b1", "b2", 1)
    assert "claims 2 hop(s) from b5, and b1 is 2 away" in p.origin_refusal("b1", "b5", 2)
    assert "not in the topology" in p.origin_refusal("b1", "b9", 4)
    assert p.origin_refusal("b1", "b3", 1) is None  # about this broker's own pubend
    assert "claims to come straight" in p.events_refusal("b1", "b2~1", [item(1, 1)], routed=False)


def test_forged_frames_are_counted_and_noticed_sparingly():
    counters: dict = {}
    p = Provenance(TOPO, "b3", counters)
    msg = m.Events("b2~1", [item(1, 1)])
    notices = [n for _ in range(NOTICE_EVERY) for n in p.dropped("b1", msg, "why")]
    assert counters["forged"] == NOTICE_EVERY
    assert [n.text for n in notices] == [
        "dropped a forged Events of pubend b2~1 from b1: why",
        f"dropped a forged Events of pubend b2~1 from b1: why ({NOTICE_EVERY} from b1 so far)",
    ]
    assert len(p.dropped("b4", msg, "other")) == 1  # each peer's first


def test_an_answer_must_be_made_by_the_pubends_broker_or_a_keeper_of_its_unit():
    p = Provenance(TOPO, "b3", {}, kept_by={"b4": (("A",),), "b1": ()})
    log = m.Recovered("b2~1", "b3", 1, 2, [], hops=2, by="b2")  # b2 -> b1 -> b3
    assert p.answer_refusal("b1", log) is None
    cached = m.Recovered("b2~1", "b3", 1, 2, [], hops=1, unit=("A",), by="b4")
    assert p.answer_refusal("b4", cached) is None
    assert "does not say" in p.answer_refusal("b1", m.Recovered("b2~1", "b3", 1, 2, [], 2))
    liar = m.Recovered("b2~1", "b3", 1, 2, [], hops=1, unit=("A",), by="b1")
    assert "b1 is neither the pubend's broker nor a keeper of A" in p.answer_refusal("b1", liar)
    near = m.Recovered("b2~1", "b3", 1, 2, [], hops=1, by="b2")
    assert "claims to come straight from b2" in p.answer_refusal("b1", near)
