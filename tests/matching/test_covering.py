"""Covering between conjunctions (seed 000 §3.3, Definition 1): hand cases, then soundness and
completeness against the reference evaluator (``Conjunction.matches``)."""

from __future__ import annotations

import math
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ges.matching import topics
from ges.matching.covering import covers, witness
from ges.matching.model import OPS, TOPIC_ATTR, Conjunction, Constraint
from ges.matching.model import test as reference_test
from ges.matching.topics import check_topic

INF = math.inf
NAN = math.nan
MAX_FLOAT = sys.float_info.max
TOP = chr(0x10FFFF)


def J(*constraints) -> Conjunction:
    """A conjunction from ``(attr, op[, value])`` tuples."""
    return Conjunction(tuple(Constraint(*c) for c in constraints))


def check(c1: Conjunction, c2: Conjunction) -> bool:
    """covers(), with witness() checked against it and against the reference evaluator."""
    result = covers(c1, c2)
    w = witness(c1, c2)
    if result:
        assert w is None, (str(c1), str(c2), w)
    else:
        assert w is not None, (str(c1), str(c2))
        assert c2.matches(w), (str(c1), str(c2), w)
        assert not c1.matches(w), (str(c1), str(c2), w)
    return result


# -- hand cases ---------------------------------------------------------------------------------

# (c1, c2, does c1 cover c2?)
CASES = [
    # seed 000 Example 3: stock = nyse covers stock = nyse and t&p > 19
    (J(("stock", "eq", "nyse")), J(("stock", "eq", "nyse"), ("tp", "gt", 19)), True),
    (J(("stock", "eq", "nyse"), ("tp", "gt", 19)), J(("stock", "eq", "nyse")), False),
    (J(("stock", "eq", "nyse")), J(("stock", "eq", "nasdaq"), ("tp", "gt", 19)), False),
    # eq / in
    (J(("x", "in", (1, 2, 3))), J(("x", "eq", 2)), True),
    (J(("x", "eq", 2)), J(("x", "in", (1, 2, 3))), False),
    (J(("x", "eq", 2)), J(("x", "in", (2,))), True),
    (J(("x", "in", (1, 2, 3))), J(("x", "in", (3, 1))), True),
    (J(("x", "in", (1, 2))), J(("x", "in", (2, 3))), False),
    (J(("x", "in", (1, 2))), J(("x", "in", (2, 3)), ("x", "le", 2)), True),
    (J(("x", "in", (1, 2, 3))), J(("x", "ge", 1), ("x", "le", 3)), False),  # 1.5 is a number
    (J(("x", "eq", "a")), J(("x", "in", ("a", "b")), ("x", "ne", "b")), True),
    # numeric ranges: nested, overlapping, touching, open/closed ends
    (J(("x", "lt", 10)), J(("x", "lt", 5)), True),
    (J(("x", "lt", 5)), J(("x", "lt", 10)), False),
    (J(("x", "lt", 5)), J(("x", "le", 5)), False),
    (J(("x", "le", 5)), J(("x", "lt", 5)), True),
    (J(("x", "le", 5)), J(("x", "le", 5.0)), True),
    (J(("x", "ge", 0), ("x", "le", 10)), J(("x", "gt", 2), ("x", "lt", 8)), True),
    (J(("x", "gt", 0), ("x", "lt", 10)), J(("x", "ge", 0), ("x", "lt", 8)), False),
    (J(("x", "gt", 0), ("x", "lt", 10)), J(("x", "gt", 0), ("x", "le", 10)), False),
    (J(("x", "gt", 0), ("x", "lt", 10)), J(("x", "gt", 0), ("x", "lt", 10)), True),
    (J(("x", "ge", 0), ("x", "le", 5)), J(("x", "ge", 5), ("x", "le", 10)), False),  # overlap
    (J(("x", "ge", 0), ("x", "le", 5)), J(("x", "ge", 5), ("x", "le", 5)), True),  # touch: {5}
    (J(("x", "eq", 5)), J(("x", "ge", 5), ("x", "le", 5)), True),
    (J(("x", "ge", 5), ("x", "le", 5)), J(("x", "eq", 5)), True),
    (J(("x", "lt", 0)), J(("x", "gt", 5)), False),
    (J(("x", "ge", -INF)), J(("x", "exists")), False),  # NaN and other kinds
    (J(("x", "ge", -INF)), J(("x", "ne", 1), ("x", "ne", 2)), False),  # NaN
    (J(("x", "ge", -INF)), J(("x", "lt", 3)), True),
    (J(("x", "gt", -INF)), J(("x", "lt", 3)), False),  # -inf
    (J(("x", "lt", INF)), J(("x", "le", INF)), False),
    (J(("x", "lt", INF)), J(("x", "le", MAX_FLOAT)), True),
    (J(("x", "le", MAX_FLOAT)), J(("x", "lt", INF)), False),  # ints above the largest float
    # numbers are every int and float: exact at float gaps and for huge ints
    (J(("x", "eq", 3)), J(("x", "gt", 1.0), ("x", "lt", math.nextafter(1.0, 2))), True),
    (J(("x", "ge", 2**53 + 1)), J(("x", "gt", 2**53)), True),
    (J(("x", "ge", 2**53 + 2)), J(("x", "gt", 2**53), ("x", "ne", 2**53 + 1)), True),
    (J(("x", "ge", 2**53 + 2)), J(("x", "gt", float(2**53))), False),
    (J(("x", "gt", 2**63 - 1)), J(("x", "ge", 2**63 - 1)), False),
    (J(("x", "lt", -(2**62))), J(("x", "lt", -(2**63))), True),
    # ne
    (J(("x", "ne", 5)), J(("x", "lt", 5)), True),
    (J(("x", "ne", 5)), J(("x", "le", 5)), False),
    (J(("x", "ne", 5)), J(("x", "le", 5), ("x", "ne", 5)), True),
    (J(("x", "lt", 10), ("x", "ne", 3)), J(("x", "lt", 5)), False),
    (J(("x", "lt", 5)), J(("x", "lt", 10), ("x", "ne", 3)), False),
    (J(("x", "lt", 10), ("x", "ne", 3)), J(("x", "lt", 3)), True),
    (J(("x", "lt", 10), ("x", "ne", 3)), J(("x", "lt", 5), ("x", "ne", 3)), True),
    (J(("x", "ne", 5)), J(("x", "ne", 5)), True),
    (J(("x", "ne", 5)), J(("x", "ne", 6)), False),
    (J(("x", "ne", 5)), J(("x", "eq", 6)), True),
    (J(("x", "ne", 5)), J(("x", "exists")), False),  # strings, booleans
    (J(("x", "ne", 5)), J(("x", "ne", "a")), False),  # ne keeps to its kind
    (J(("x", "ne", "a")), J(("x", "prefix", "b")), True),
    (J(("x", "ne", "a")), J(("x", "prefix", "a")), False),
    (J(("x", "ne", "a")), J(("x", "prefix", "a"), ("x", "ne", "a")), True),
    (J(("x", "lt", "a\x00")), J(("x", "le", "a"), ("x", "ne", "a")), True),
    (J(("x", "lt", "a")), J(("x", "lt", "a\x00"), ("x", "ne", "a")), True),
    (J(("x", "lt", "a")), J(("x", "lt", "a\x00\x00"), ("x", "ne", "a")), False),
    (J(("b", "ne", True)), J(("b", "eq", False)), True),
    (J(("b", "eq", False)), J(("b", "ne", True)), True),
    (J(("b", "in", (True, False))), J(("b", "ne", True), ("b", "ne", False)), True),  # empty c2
    (J(("b", "in", (True, False))), J(("b", "exists")), False),
    # kinds never cross
    (J(("x", "eq", 1)), J(("x", "eq", True)), False),
    (J(("x", "eq", True)), J(("x", "eq", 1)), False),
    (J(("x", "eq", 1)), J(("x", "eq", 1.0)), True),
    (J(("x", "eq", 1.0)), J(("x", "in", (1,))), True),
    (J(("x", "eq", "1")), J(("x", "eq", 1)), False),
    (J(("x", "ge", 0)), J(("x", "ge", "0")), False),
    # prefix vs prefix, prefix vs range
    (J(("s", "prefix", "ab")), J(("s", "prefix", "abc")), True),
    (J(("s", "prefix", "abc")), J(("s", "prefix", "ab")), False),
    (J(("s", "prefix", "")), J(("s", "ge", "")), True),
    (J(("s", "ge", "")), J(("s", "prefix", "")), True),
    (J(("s", "prefix", "")), J(("s", "exists")), False),
    (J(("s", "prefix", "ab")), J(("s", "ge", "ab"), ("s", "lt", "ac")), True),
    (J(("s", "ge", "ab"), ("s", "lt", "ac")), J(("s", "prefix", "ab")), True),
    (J(("s", "ge", "ab"), ("s", "le", "ac")), J(("s", "prefix", "ab")), True),
    (J(("s", "prefix", "ab")), J(("s", "ge", "ab"), ("s", "le", "ac")), False),
    (J(("s", "prefix", "ab")), J(("s", "gt", "ab"), ("s", "lt", "ac")), True),
    (J(("s", "prefix", "ab")), J(("s", "gt", "aa"), ("s", "lt", "ac")), False),
    (J(("s", "prefix", "a" + TOP)), J(("s", "ge", "a" + TOP), ("s", "lt", "b")), True),
    (J(("s", "ge", "a" + TOP), ("s", "lt", "b")), J(("s", "prefix", "a" + TOP)), True),
    (J(("s", "prefix", TOP)), J(("s", "ge", TOP)), True),
    (J(("s", "prefix", TOP + TOP)), J(("s", "gt", TOP)), False),
    (J(("s", "prefix", "ab")), J(("s", "eq", "abz")), True),
    (J(("s", "prefix", "ab")), J(("s", "in", ("abz", "a"))), False),
    (J(("s", "lt", "b")), J(("s", "prefix", "a")), True),
    (J(("s", "lt", "b")), J(("s", "prefix", "b")), False),
    # string successor edges
    (J(("s", "gt", "a")), J(("s", "ge", "a\x00")), True),
    (J(("s", "ge", "a\x00")), J(("s", "gt", "a")), True),
    (J(("s", "le", "a")), J(("s", "lt", "a\x00")), True),
    (J(("s", "lt", "a\x00")), J(("s", "le", "a")), True),
    (J(("s", "eq", "a")), J(("s", "ge", "a"), ("s", "lt", "a\x00")), True),
    (J(("s", "in", ("a", "a\x00"))), J(("s", "ge", "a"), ("s", "lt", "a\x00\x00")), True),
    (J(("s", "in", ("a", "a\x00"))), J(("s", "ge", "a"), ("s", "le", "a\x00\x00")), False),
    (J(("s", "gt", "a")), J(("s", "ge", "a\x00\x00")), True),
    (J(("s", "ge", "a\x00\x00")), J(("s", "gt", "a")), False),
    (J(("s", "gt", "a")), J(("s", "gt", "a"), ("s", "lt", "a\x00")), True),  # c2 empty
    # exists vs everything
    (J(("x", "exists")), J(("x", "eq", 1)), True),
    (J(("x", "exists")), J(("x", "ne", "q")), True),
    (J(("x", "exists")), J(("x", "exists")), True),
    (J(("x", "exists")), J(("x", "exists"), ("x", "exists")), True),
    (J(("x", "eq", 1)), J(("x", "exists")), False),
    (J(("x", "exists")), J(("y", "exists")), False),
    (J(("x", "exists"), ("y", "eq", 1)), J(("y", "eq", 1), ("x", "prefix", "")), True),
    # an attribute missing from c2
    (J(("x", "eq", 1), ("y", "eq", 2)), J(("x", "eq", 1)), False),
    (J(("x", "eq", 1)), J(("x", "eq", 1), ("y", "eq", 2)), True),
    # unsatisfiable c2: covered by anything
    (J(("x", "eq", 1)), J(("y", "lt", 0), ("y", "gt", 0)), True),
    (J(("z", "eq", "never")), J(("y", "eq", 1), ("y", "eq", "1")), True),
    (J(("z", "eq", "never")), J(("y", "in", (1, 2)), ("y", "in", (3, 4))), True),
    (J(("z", "eq", "never")), J(("y", "prefix", "a"), ("y", "prefix", "b")), True),
    (J(("z", "eq", "never")), J(("y", "eq", True), ("y", "ne", True)), True),
    (J(("z", "eq", 1), ("z", "eq", 2)), J(("y", "exists")), False),  # c1 empty, c2 not
    # the empty conjunction covers everything, and is covered only by its equivalents
    (J(), J(("x", "eq", 1)), True),
    (J(), J(), True),
    (J(), J(("x", "lt", 0), ("x", "gt", 0)), True),
    (J(("x", "exists")), J(), False),
    (J(("x", "ne", 1)), J(), False),
    (J(("x", "lt", 0), ("x", "gt", 0)), J(), False),
    # the reserved type attribute is one more attribute
    (J(("@type", "eq", "quote")), J(("@type", "eq", "quote"), ("p", "gt", 1)), True),
    (J(("@type", "eq", "quote")), J(("p", "gt", 1)), False),
]


@pytest.mark.parametrize(("c1", "c2", "expected"), CASES, ids=lambda v: str(v))
def test_hand_cases(c1, c2, expected):
    assert check(c1, c2) is expected


def test_witnesses_are_explicit():
    assert witness(J(("x", "ne", 5)), J(("x", "le", 5))) == {"x": 5}
    assert witness(J(("x", "eq", 1), ("y", "eq", 2)), J(("x", "eq", 1))) == {"x": 1}
    assert witness(J(("s", "prefix", "abc")), J(("s", "prefix", "ab"))) == {"s": "ab"}
    w = witness(J(("x", "ge", -INF)), J(("x", "ne", 1)))
    assert math.isnan(w["x"])
    assert witness(J(("x", "exists")), J()) == {}
    assert witness(J(), J(("x", "eq", 1))) is None


# -- generated conjunctions ---------------------------------------------------------------------

ATTRS = ("x", "y", "z", TOPIC_ATTR)
HOME_KIND = {"x": "number", "y": "string", "z": "bool", TOPIC_ATTR: "string"}
#: Levels of topics and filters: '$' first levels, empty levels, and wildcards.
LEVELS = ["a", "b", "$s", ""]
TOPICS = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3).map("/".join)
FILTERS = st.tuples(st.lists(st.sampled_from([*LEVELS, "+", "+"]), max_size=3), st.booleans()).map(
    lambda t: "/".join([*t[0], "#"] if t[1] or not t[0] else t[0]) or "+"
)
#: What @topic takes (no ordered tests, no prefix).
TOPIC_OPS = ("eq", "ne", "in", "exists", "topic", "topic")
NICE = [*range(-3, 4), *(i / 2 for i in range(-7, 8, 2)), 2.0, -1.0]
WILD = [
    *NICE,
    INF,
    -INF,
    MAX_FLOAT,
    -MAX_FLOAT,
    2**53,
    2**53 + 1,
    float(2**53),
    2**63 - 1,
    -(2**63),
    5e-324,
    -0.0,
    math.nextafter(1.0, 2),
    math.nextafter(1.0, 0),
]
STRINGS = st.text(alphabet=["a", "b", "\x00", TOP], max_size=3)


def values(kind: str, numbers: list):
    if kind == "number":
        return st.sampled_from(numbers)
    if kind == "string":
        return STRINGS
    return st.booleans()


@st.composite
def constraints(draw, numbers: list, attrs=ATTRS):
    attr = draw(st.sampled_from(attrs))
    op = draw(st.sampled_from(TOPIC_OPS if attr == TOPIC_ATTR else OPS))
    if op == "topic":
        return Constraint(TOPIC_ATTR, op, draw(FILTERS))
    if attr == TOPIC_ATTR and op != "exists" and draw(st.integers(0, 3)) < 3:
        if op == "in":
            return Constraint(attr, op, tuple(draw(st.lists(TOPICS, min_size=1, max_size=3))))
        return Constraint(attr, op, draw(TOPICS))
    if op == "exists":
        return Constraint(attr, op)
    if op == "prefix":
        kinds = ["string"]
    elif op in ("lt", "le", "gt", "ge"):
        kinds = ["number", "string"]
    else:
        kinds = ["number", "string", "bool"]
    # mostly the attribute's home kind, so that conjunctions are often satisfiable
    home = HOME_KIND.get(attr)
    at_home = home in kinds and draw(st.integers(0, 3)) < 3
    kind = home if at_home else draw(st.sampled_from(kinds))
    if op == "in":
        return Constraint(
            attr, op, tuple(draw(st.lists(values(kind, numbers), min_size=1, max_size=3)))
        )
    return Constraint(attr, op, draw(values(kind, numbers)))


def conjunctions(numbers: list, max_size: int = 4):
    return st.lists(constraints(numbers), max_size=max_size).map(Conjunction)


def _kind_pool(value, numbers):
    if type(value) is str:
        return sorted({value, "", "a", "b", "a\x00", "ab", "b" + TOP, TOP, value + "a", value[:-1]})
    if type(value) is bool:
        return [False, True]
    return numbers


def weaker(draw, c: Constraint, numbers: list) -> list[Constraint]:
    """Constraints implied by ``c`` (each matches every value ``c`` matches), ``c`` among them."""
    attr, op, v = c.attr, c.op, c.value
    out = [c, Constraint(attr, "exists")]
    if op == "exists" or op == "ne":
        return out
    if op == "topic":
        return [*out, Constraint(attr, "topic", generalized(draw, v))]
    sample = v[0] if op == "in" else v
    pool = _kind_pool(sample, numbers)
    ordered = type(sample) is not bool and attr != TOPIC_ATTR

    def one(choices):
        return draw(st.sampled_from(choices)) if choices else None

    if op in ("eq", "in"):
        vs = (v,) if op == "eq" else v
        extra = draw(st.lists(st.sampled_from(pool), max_size=2))
        out.append(Constraint(attr, "in", (*vs, *extra)))
        if (w := one([w for w in pool if w not in vs])) is not None:
            out.append(Constraint(attr, "ne", w))
        if ordered:
            hi, lo = max(vs), min(vs)
            if (w := one([w for w in pool if w >= hi])) is not None:
                out.append(Constraint(attr, "le", w))
            if (w := one([w for w in pool if w > hi])) is not None:
                out.append(Constraint(attr, "lt", w))
            if (w := one([w for w in pool if w <= lo])) is not None:
                out.append(Constraint(attr, "ge", w))
            if (w := one([w for w in pool if w < lo])) is not None:
                out.append(Constraint(attr, "gt", w))
        if type(sample) is str and attr == TOPIC_ATTR and op == "eq" and not check_topic(v):
            out.append(Constraint(attr, "topic", generalized(draw, v)))
        elif type(sample) is str and attr != TOPIC_ATTR:
            common = _common_prefix(vs)
            out.append(Constraint(attr, "prefix", common[: draw(st.integers(0, len(common)))]))
    elif op in ("lt", "le"):
        if (w := one([w for w in pool if w >= v])) is not None:
            out.append(Constraint(attr, "le", w))
            if w > v or op == "lt":
                out += [Constraint(attr, "lt", w), Constraint(attr, "ne", w)]
    elif op in ("gt", "ge"):
        if (w := one([w for w in pool if w <= v])) is not None:
            out.append(Constraint(attr, "ge", w))
            if w < v or op == "gt":
                out += [Constraint(attr, "gt", w), Constraint(attr, "ne", w)]
    elif op == "prefix":
        shorter = v[: draw(st.integers(0, len(v)))]
        out += [Constraint(attr, "prefix", shorter), Constraint(attr, "ge", shorter)]
        if (w := one([w for w in pool if not w.startswith(v)])) is not None:
            out.append(Constraint(attr, "ne", w))
    return out


def generalized(draw, topic_filter: str) -> str:
    """A topic filter matching every topic ``topic_filter`` (a filter or a topic) matches:
    some literal levels made '+', maybe the rest made '#' ('$' first levels stay)."""
    levels = topic_filter.split("/")
    if levels[-1] == "#":
        levels = levels[:-1]
    out = []
    for i, level in enumerate(levels):
        fixed = i == 0 and level.startswith("$")
        out.append("+" if not fixed and draw(st.integers(0, 2)) == 0 else level)
    cut = draw(st.integers(0, len(out)))
    if out == [""]:
        out = ["+"]
    if topic_filter.endswith("#") or cut < len(out):
        if cut == 0 and levels and levels[0].startswith("$"):
            cut = 1
        out = [*out[:cut], "#"]
    return "/".join(out)


def _common_prefix(strings) -> str:
    first, last = min(strings), max(strings)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def weaken(draw, c2: Conjunction, numbers: list) -> Conjunction:
    """A conjunction covering ``c2`` by construction: drop constraints, weaken the others."""
    out = []
    for c in c2.constraints:
        if draw(st.integers(0, 3)) == 0:
            continue  # dropped
        out.append(draw(st.sampled_from(weaker(draw, c, numbers))))
    return Conjunction(out)


def perturb(draw, c: Conjunction, numbers: list) -> Conjunction:
    """``c``, or ``c`` with a random constraint added or substituted (covering or not)."""
    constraints_ = list(c.constraints)
    how = draw(st.integers(0, 2))
    if how == 1:
        constraints_.append(draw(constraints(numbers)))
    elif how == 2 and constraints_:
        constraints_[draw(st.integers(0, len(constraints_) - 1))] = draw(constraints(numbers))
    return Conjunction(constraints_)


@st.composite
def pairs(draw, numbers: list):
    """(c1, c2), c1 often derived from c2 so that covering holds in a good share of pairs."""
    c2 = draw(conjunctions(numbers))
    how = draw(st.integers(0, 3))
    if how == 0:
        c1 = draw(conjunctions(numbers))
    elif how == 1:
        c1 = weaken(draw, c2, numbers)
    else:
        c1 = perturb(draw, weaken(draw, c2, numbers), numbers)
    return c1, c2


# -- events near the constraints' values ----------------------------------------------------------


def _near(value) -> list:
    """Event values equal or adjacent to a constraint value."""
    if type(value) is bool:
        return [value, not value]
    if type(value) is str:
        out = [value, value + "\x00", value + "a", value + TOP, value[:-1]]
        if value and value[-1] != TOP:
            out.append(value[:-1] + chr(ord(value[-1]) + 1))
            if value[-1] != "\x00":
                out.append(value[:-1] + chr(ord(value[-1]) - 1) + TOP)
        return out
    out = [value, value + 1, value - 1]
    try:
        f = float(value)
    except OverflowError:
        return out
    return [*out, f, f + 0.5, f - 0.5, math.nextafter(f, INF), math.nextafter(f, -INF)]


def event_values(c1: Conjunction, c2: Conjunction) -> list:
    out = [NAN, INF, -INF, 0, 1.5, -(10**400), "", "zz", True, False]
    for c in (*c1.constraints, *c2.constraints):
        if c.op == "topic":  # topics it matches, and topics near them
            for t in topics.candidates(c.value, None, 2):
                out += [t, t + "/a", t.rpartition("/")[0] or "$" + t]
        elif c.op == "in":
            for v in c.value:
                out += _near(v)
        elif c.value is not None:
            out += _near(c.value)
    return out


@st.composite
def events_for(draw, c1: Conjunction, c2: Conjunction):
    """Events over the conjunctions' attributes; most take, per attribute, values that satisfy
    c2's constraints on it (found with the reference evaluator), so many events match c2."""
    pool = event_values(c1, c2)
    attrs = sorted({c.attr for c in (*c1.constraints, *c2.constraints)} | {"x"})
    fitting = {
        a: [
            v
            for v in pool
            if all(reference_test(c.op, c.value, v) for c in c2.constraints if c.attr == a)
        ]
        or pool
        for a in attrs
    }
    evs = []
    for _ in range(draw(st.integers(1, 25))):
        choose = fitting if draw(st.integers(0, 3)) < 3 else {a: pool for a in attrs}
        evs.append(
            {a: draw(st.sampled_from(choose[a])) for a in attrs if draw(st.integers(0, 9)) < 9}
        )
    return evs


# -- properties ---------------------------------------------------------------------------------

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_sound():
    """covers(c1, c2) and c2.matches(e) imply c1.matches(e), on events near the values."""
    stats = Counter()

    @FAST
    @given(st.data())
    def run(data):
        c1, c2 = data.draw(pairs(WILD))
        result = covers(c1, c2)
        event("covers" if result else "does not cover")
        stats["pairs"] += 1
        if not result:
            return
        stats["covering"] += 1
        matched = False
        for e in data.draw(events_for(c1, c2)):
            if c2.matches(e):
                matched = True
                assert c1.matches(e), (str(c1), str(c2), e)
        stats["checked"] += matched

    run()
    # not vacuous: covering is common, and covering pairs meet events matching c2
    assert stats["covering"] >= stats["pairs"] // 4, stats
    # (about half the covering pairs meet one in a typical run; a third leaves room for chance)
    assert stats["checked"] >= stats["covering"] // 3, stats


@pytest.mark.parametrize("numbers", [NICE, WILD], ids=["nice", "wild"])
def test_complete(numbers):
    """When covers(c1, c2) is False, witness(c1, c2) matches c2 and not c1 (and conversely)."""
    stats = Counter()

    @FAST
    @given(pairs(numbers))
    def run(pair):
        c1, c2 = pair
        result = covers(c1, c2)
        w = witness(c1, c2)
        stats[result] += 1
        assert (w is None) == result, (str(c1), str(c2), w)
        if w is not None:
            assert c2.matches(w), (str(c1), str(c2), w)
            assert not c1.matches(w), (str(c1), str(c2), w)

    run()
    assert stats[False] >= 40 and stats[True] >= 40, stats


@FAST
@given(st.data())
def test_weakening_is_covered(data):
    """A conjunction weakened constraint by constraint covers the original: completeness where
    the answer is known to be True."""
    c2 = data.draw(conjunctions(WILD))
    c1 = weaken(data.draw, c2, WILD)
    assert covers(c1, c2), (str(c1), str(c2))
    assert covers(Conjunction(), c2)


@FAST
@given(conjunctions(WILD, max_size=6))
def test_reflexive(c):
    assert covers(c, c)
    assert witness(c, c) is None


def test_transitive():
    stats = Counter()

    @FAST
    @given(st.data())
    def run(data):
        c3 = data.draw(conjunctions(NICE))
        c2 = perturb(data.draw, weaken(data.draw, c3, NICE), NICE)
        c1 = perturb(data.draw, weaken(data.draw, c2, NICE), NICE)
        if covers(c1, c2) and covers(c2, c3):
            stats["chains"] += 1
            assert covers(c1, c3), (str(c1), str(c2), str(c3))
        stats["triples"] += 1

    run()
    assert stats["chains"] >= stats["triples"] // 5, stats
