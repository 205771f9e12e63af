"""The value model and the naive reference evaluator (ges.matching.model): kinds never cross, NaN,
every operator, validation and bounds, the wire constructors, event types and ``str()``."""

from __future__ import annotations

import math
import re

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ges.matching.model import (
    BOOLEAN,
    MAX_CONJUNCTIONS,
    MAX_CONSTRAINTS,
    MAX_IN_VALUES,
    MAX_NAME,
    MAX_STRING,
    NUMBER,
    OPS,
    ORDERED,
    STRING,
    TOPIC_ATTR,
    TYPE_ATTR,
    Conjunction,
    Constraint,
    Profile,
    conjunction_from_wire,
    kind,
    profile_from_wire,
)
from ges.matching.model import test as reference_test
from ges.wire import messages as m

NAN = math.nan
INF = math.inf


def C(attr, op, value=None):
    return Constraint(attr, op, value)


def J(*constraints) -> Conjunction:
    return Conjunction(constraints)


# -- kinds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", STRING),
        ("x", STRING),
        (0, NUMBER),
        (-3, NUMBER),
        (1.5, NUMBER),
        (NAN, NUMBER),
        (INF, NUMBER),
        (True, BOOLEAN),
        (False, BOOLEAN),
        (None, None),
        (b"x", None),
        ([1], None),
        ((1,), None),
    ],
)
def test_kind(value, expected):
    assert kind(value) == expected


def test_constraint_kind_property():
    assert C("a", "eq", 1).kind == NUMBER
    assert C("a", "prefix", "x").kind == STRING
    assert C("a", "ne", False).kind == BOOLEAN
    assert C("a", "in", ("x", "y")).kind == STRING
    assert C("a", "in", (1.5,)).kind == NUMBER
    assert C("a", "exists").kind is None


# -- operators and their spellings --------------------------------------------------------------


def test_the_operator_set():
    assert set(OPS) == {"eq", "ne", "lt", "le", "gt", "ge", "prefix", "exists", "in", "topic"}
    assert set(ORDERED) == {"lt", "le", "gt", "ge"}


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("=", "eq"),
        ("==", "eq"),
        ("!=", "ne"),
        ("<", "lt"),
        ("<=", "le"),
        (">", "gt"),
        (">=", "ge"),
        *((op, op) for op in ("eq", "ne", "lt", "le", "gt", "ge")),
    ],
)
def test_symbol_spellings_are_canonicalised(spelling, canonical):
    c = C("a", spelling, 1)
    assert c.op == canonical
    assert c == C("a", canonical, 1)
    assert hash(c) == hash(C("a", canonical, 1))


@pytest.mark.parametrize("op", ["~", "like", "EQ", "<>", "=<", "", "contains"])
def test_unknown_operator_is_refused(op):
    with pytest.raises(ValueError, match="unknown operator"):
        C("a", op, 1)


# -- matching: every operator --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "attributes", "expected"),
    [
        (C("p", "eq", 10), {"p": 10}, True),
        (C("p", "eq", 10), {"p": 10.0}, True),  # int and float compare as numbers
        (C("p", "eq", 10), {"p": 11}, False),
        (C("p", "ne", 10), {"p": 11}, True),
        (C("p", "ne", 10), {"p": 10}, False),
        (C("p", "ne", 10), {"p": 10.0}, False),
        (C("p", "lt", 10), {"p": 9.5}, True),
        (C("p", "lt", 10), {"p": 10}, False),
        (C("p", "le", 10), {"p": 10}, True),
        (C("p", "le", 10), {"p": 10.5}, False),
        (C("p", "gt", 10), {"p": 10}, False),
        (C("p", "gt", 10), {"p": 10.5}, True),
        (C("p", "ge", 10), {"p": 10}, True),
        (C("p", "ge", 10), {"p": 9}, False),
        (C("p", "lt", INF), {"p": 1e308}, True),
        (C("p", "lt", INF), {"p": INF}, False),
        (C("p", "gt", -INF), {"p": -1e308}, True),
        (C("p", "eq", -0.0), {"p": 0}, True),
        (C("s", "eq", "IBM"), {"s": "IBM"}, True),
        (C("s", "eq", "IBM"), {"s": "ibm"}, False),
        (C("s", "lt", "b"), {"s": "a"}, True),  # strings order lexically
        (C("s", "ge", "b"), {"s": "a"}, False),
        (C("s", "le", "ab"), {"s": "a"}, True),
        (C("s", "gt", ""), {"s": "a"}, True),
        (C("s", "prefix", "IB"), {"s": "IBM"}, True),
        (C("s", "prefix", "IB"), {"s": "IB"}, True),
        (C("s", "prefix", "IB"), {"s": "I"}, False),
        (C("s", "prefix", "IB"), {"s": "XIBM"}, False),
        (C("s", "prefix", ""), {"s": "anything"}, True),
        (C("s", "prefix", ""), {"s": ""}, True),
        (C("s", "prefix", "10"), {"s": "1000"}, True),
        (C("s", "prefix", "10"), {"s": 1000}, False),
        (C("s", "exists"), {"s": 0}, True),
        (C("s", "exists"), {"s": False}, True),
        (C("s", "exists"), {"s": ""}, True),
        (C("s", "exists"), {"s": NAN}, True),
        (C("s", "exists"), {"t": 1}, False),
        (C("s", "eq", "42"), {"s": "42"}, True),
        (C("s", "eq", "42"), {"s": 42}, False),
        (C("s", "eq", 42), {"s": "42"}, False),
        (C("b", "eq", True), {"b": True}, True),
        (C("b", "ne", True), {"b": False}, True),
        (C("b", "ne", True), {"b": True}, False),
        (C("s", "in", ("IBM", "HPQ")), {"s": "HPQ"}, True),
        (C("s", "in", ("IBM", "HPQ")), {"s": "SUN"}, False),
        (C("n", "in", (1, 2.5)), {"n": 1.0}, True),
        (C("n", "in", (1, 2.5)), {"n": 2.5}, True),
        (C("n", "in", (1, 2.5)), {"n": 2}, False),
        (C("n", "in", (1, 2)), {"n": "1"}, False),
        (C("n", "in", (1, 0)), {"n": True}, False),
        (C("n", "in", (1, 0)), {"n": False}, False),
        (C("b", "in", (True,)), {"b": 1}, False),
        (C("b", "in", (True,)), {"b": True}, True),
        (C("s", "in", ("1",)), {"s": 1}, False),
    ],
)
def test_matches(c, attributes, expected):
    assert c.matches(attributes) is expected
    assert J(c).matches(attributes) is expected
    if c.attr in attributes:
        assert reference_test(c.op, c.value, attributes[c.attr]) is expected


VALID_BY_OP = {
    "eq": 1,
    "ne": 1,
    "lt": 1,
    "le": 1,
    "gt": 1,
    "ge": 1,
    "prefix": "",
    "exists": None,
    "in": (1,),
    "topic": "a/+",
}


@pytest.mark.parametrize("op", OPS)
def test_missing_attribute_never_matches(op):
    c = C(TOPIC_ATTR if op == "topic" else "a", op, VALID_BY_OP[op])
    assert not c.matches({"b": 1})
    assert not c.matches({})
    assert not J(c).matches({})
    assert not Profile("p", (J(c),)).matches({"b": 1})


# -- kinds never cross -----------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
@pytest.mark.parametrize(
    ("have", "want"),
    [(10, "10"), ("10", 10), (1.5, "a"), ("a", 0), ("", 0), (0, ""), (INF, "inf")],
)
def test_number_and_string_never_match(op, have, want):
    # not even ``ne``: a constraint of another kind than the attribute never matches
    assert not C("a", op, want).matches({"a": have})
    assert not reference_test(op, want, have)


@pytest.mark.parametrize("op", ["eq", "ne"])
@pytest.mark.parametrize(
    ("have", "want"),
    [(True, 1), (1, True), (False, 0), (0, False), (1.0, True), ("True", True), (True, "True")],
)
def test_booleans_never_meet_numbers_or_strings(op, have, want):
    assert not C("a", op, want).matches({"a": have})


@pytest.mark.parametrize("op", sorted(ORDERED))
@pytest.mark.parametrize("want", [0, 1, 0.5, "", "a"])
@pytest.mark.parametrize("have", [True, False])
def test_booleans_are_never_ordered(op, want, have):
    assert not C("a", op, want).matches({"a": have})


@pytest.mark.parametrize("have", [1, 1.5, True, None, [1], b"IB"])
def test_prefix_only_matches_strings(have):
    assert not reference_test("prefix", "", have)
    assert not C("a", "prefix", "").matches({"a": have})


@pytest.mark.parametrize(
    ("have", "want", "expected"),
    [
        (True, True, True),
        (False, False, True),
        (True, False, False),
        (True, 1, False),
        (1, True, False),
        (False, 0, False),
        (0, False, False),
        (1.0, True, False),
        ("True", True, False),
    ],
)
def test_bool_equality_is_strict(have, want, expected):
    assert C("a", "eq", want).matches({"a": have}) is expected
    # ne compares within a kind only: a bool against a number or a string never matches
    same_kind = isinstance(have, bool) == isinstance(want, bool)
    assert C("a", "ne", want).matches({"a": have}) is (same_kind and not expected)


@pytest.mark.parametrize("have", [None, [1], (1,), b"x", {"a": 1}])
def test_values_of_no_kind_only_satisfy_exists(have):
    for op in OPS:
        want = VALID_BY_OP[op]
        assert reference_test(op, want, have) is (op == "exists")


# -- NaN -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "expected"),
    [
        (C("x", "eq", 1), False),
        (C("x", "ne", 1), True),
        (C("x", "ne", INF), True),
        (C("x", "lt", 1), False),
        (C("x", "le", 1), False),
        (C("x", "gt", 1), False),
        (C("x", "ge", 1), False),
        (C("x", "lt", INF), False),
        (C("x", "gt", -INF), False),
        (C("x", "in", (1, 2, INF)), False),
        (C("x", "exists"), True),
        # kinds still never cross
        (C("x", "ne", "nan"), False),
        (C("x", "ne", True), False),
    ],
)
def test_nan_in_an_event_satisfies_only_ne_and_exists(c, expected):
    assert c.matches({"x": NAN}) is expected
    assert c.matches({"x": float("-nan")}) is expected


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_nan_is_never_a_constraint_value(op):
    with pytest.raises(ValueError, match="NaN"):
        C("x", op, NAN)
    with pytest.raises(ValueError, match="NaN"):
        C("x", "in", (1, NAN))
    with pytest.raises(ValueError, match="NaN"):
        C("x", "in", (NAN,))


def test_infinities_are_constraint_values():
    assert C("x", "lt", INF).value == INF
    assert C("x", "in", (-INF, 0)).value == (-INF, 0)


# -- `in` ------------------------------------------------------------------------------------------


def test_in_takes_any_iterable_and_stores_a_tuple():
    assert C("a", "in", ["x", "y"]).value == ("x", "y")
    assert C("a", "in", iter([1, 2])).value == (1, 2)
    assert C("a", "in", range(3)).value == (0, 1, 2)
    assert C("a", "in", ["x"]) == C("a", "in", ("x",))


def test_in_dedupes_keeping_the_first_spelling():
    assert C("a", "in", ("x", "y", "x")).value == ("x", "y")
    c = C("a", "in", (1, 1.0, 2))
    assert c.value == (1, 2)
    assert type(c.value[0]) is int
    c = C("a", "in", (2.0, 2))
    assert c.value == (2.0,)
    assert type(c.value[0]) is float
    assert C("a", "in", (True, True, False)).value == (True, False)
    # duplicates do not count against the bound
    assert C("a", "in", [0] * (MAX_IN_VALUES + 10)).value == (0,)


def test_in_never_collapses_one_and_true():
    # 1 and True are different values (of different kinds): dedupe keeps both, then refuses the mix
    with pytest.raises(ValueError, match="one type"):
        C("a", "in", (1, True))
    with pytest.raises(ValueError, match="one type"):
        C("a", "in", (False, 0))


def test_in_with_one_value_is_eq():
    for have in ["x", "y", 1, True, NAN]:
        assert C("a", "in", ("x",)).matches({"a": have}) == C("a", "eq", "x").matches({"a": have})


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("a", "exists", 1), "takes no value"),
        (("a", "exists", ""), "takes no value"),
        (("a", "exists", ()), "takes no value"),
        (("a", "eq", None), "not a string, number or boolean"),
        (("a", "eq"), "not a string, number or boolean"),
        (("a", "ne", [1]), "not a string, number or boolean"),
        (("a", "eq", (1,)), "not a string, number or boolean"),
        (("a", "eq", b"x"), "not a string, number or boolean"),
        (("a", "lt", True), "booleans are not ordered"),
        (("a", "le", False), "booleans are not ordered"),
        (("a", "gt", True), "booleans are not ordered"),
        (("a", "ge", False), "booleans are not ordered"),
        (("a", "prefix", 1), "prefix: needs a string"),
        (("a", "prefix", True), "prefix: needs a string"),
        (("a", "prefix", None), "not a string, number or boolean"),
        (("a", "in", "ab"), "needs a list"),
        (("a", "in", b"ab"), "needs a list"),
        (("a", "in", 5), "needs a list"),
        (("a", "in", None), "needs a list"),
        (("a", "in", ()), "at least one value"),
        (("a", "in", []), "at least one value"),
        (("a", "in", (1, "1")), "one type"),
        (("a", "in", ("x", True)), "one type"),
        (("a", "in", (None,)), "not a string, number or boolean"),
        (("a", "in", (1, b"x")), "not a string, number or boolean"),
    ],
)
def test_invalid_constraints_raise_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        C(*args)


def test_in_refuses_a_list_inside_its_values_with_value_error():
    with pytest.raises(ValueError):
        C("a", "in", ([1],))
    with pytest.raises(ValueError):
        C("a", "in", ("x", {"y": 1}))


@pytest.mark.parametrize(
    "name",
    [
        "",
        "1a",
        "-a",
        ".a",
        "a b",
        " a",
        "a ",
        "a\n",
        "a/b",
        "a*",
        "a:b",
        "a=b",
        "@foo",
        "@",
        "@type2",
        "@Type",
    ],
)
def test_bad_attribute_names_are_refused(name):
    with pytest.raises(ValueError, match="attribute name"):
        C(name, "eq", 1)
    with pytest.raises(ValueError, match="attribute name"):
        C(name, "exists")


@pytest.mark.parametrize("name", ["a", "_", "_x", "A.b-c_d", "a1", "exists", "in", "type"])
def test_good_attribute_names(name):
    assert C(name, "eq", 1).attr == name


def test_the_type_attribute_is_the_only_name_starting_with_at():
    assert C(TYPE_ATTR, "eq", "Trade").attr == "@type"
    assert C(TYPE_ATTR, "in", ("Trade", "Quote")).matches({TYPE_ATTR: "Quote"})


def test_bounds_on_names_and_strings():
    assert C("a" * MAX_NAME, "eq", 1).attr == "a" * MAX_NAME
    with pytest.raises(ValueError, match="attribute name"):
        C("a" * (MAX_NAME + 1), "eq", 1)
    assert C("a", "eq", "x" * MAX_STRING).value == "x" * MAX_STRING
    assert C("a", "prefix", "x" * MAX_STRING)
    with pytest.raises(ValueError, match=str(MAX_STRING)):
        C("a", "eq", "x" * (MAX_STRING + 1))
    with pytest.raises(ValueError, match=str(MAX_STRING)):
        C("a", "prefix", "x" * (MAX_STRING + 1))
    with pytest.raises(ValueError, match=str(MAX_STRING)):
        C("a", "in", ("x", "x" * (MAX_STRING + 1)))


def test_bound_on_in_values():
    assert len(C("a", "in", range(MAX_IN_VALUES)).value) == MAX_IN_VALUES
    with pytest.raises(ValueError, match=f"over {MAX_IN_VALUES}"):
        C("a", "in", range(MAX_IN_VALUES + 1))


def test_bound_on_constraints_per_conjunction():
    many = [C(f"a{i}", "exists") for i in range(MAX_CONSTRAINTS + 1)]
    assert len(Conjunction(many[:-1]).constraints) == MAX_CONSTRAINTS
    with pytest.raises(ValueError, match=f"over {MAX_CONSTRAINTS}"):
        Conjunction(many)


def test_bound_on_conjunctions_per_profile():
    conjs = [J(C("a", "eq", i)) for i in range(MAX_CONJUNCTIONS + 1)]
    assert len(Profile("p", conjs[:-1]).conjunctions) == MAX_CONJUNCTIONS
    with pytest.raises(ValueError, match=f"over {MAX_CONJUNCTIONS}"):
        Profile("p", conjs)


def test_a_profile_needs_a_conjunction():
    with pytest.raises(ValueError, match="at least one conjunction"):
        Profile("p", ())
    with pytest.raises(ValueError, match="at least one conjunction"):
        Profile("p", [])


# -- conjunctions and profiles ---------------------------------------------------------------------


def test_empty_conjunction_matches_everything():
    assert Conjunction().matches({})
    assert Conjunction().matches({"a": 1})
    assert Conjunction().matches({"a": NAN})
    assert str(Conjunction()) == "everything"


def test_conjunction():
    f = J(C("sym", "eq", "IBM"), C("price", "gt", 100))
    assert f.matches({"sym": "IBM", "price": 101})
    assert not f.matches({"sym": "IBM", "price": 100})
    assert not f.matches({"sym": "HP", "price": 101})
    assert not f.matches({"sym": "IBM"})
    assert str(f) == "sym = 'IBM' and price > 100"


def test_conjunction_converts_to_a_tuple():
    c = C("a", "eq", 1)
    assert Conjunction([c]).constraints == (c,)
    assert Conjunction(iter([c])) == Conjunction((c,))


def test_profile_is_the_disjunction_of_its_conjunctions():
    p = Profile("p", (J(C("a", "eq", 1)), J(C("b", "exists"), C("c", "lt", 0))))
    assert p.matches({"a": 1})
    assert p.matches({"b": "x", "c": -1})
    assert p.matches({"a": 1, "b": "x", "c": 5})
    assert not p.matches({"a": 2, "b": "x", "c": 0})
    assert not p.matches({})


def test_default_profile_matches_everything():
    p = Profile("p")
    assert p.conjunctions == (Conjunction(),)
    assert p.event_type is None
    assert p.matches({})
    assert p.matches({TYPE_ATTR: "T", "a": 1})


def test_values_are_frozen_and_hashable():
    f = J(C("a", "eq", 1))
    assert f == J(C("a", "=", 1))
    assert hash(f) == hash(J(C("a", "==", 1)))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        f.constraints = ()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        C("a", "eq", 1).value = 2
    p = Profile("p", (f,), "T")
    assert p == Profile("p", [f], "T")
    assert hash(p) == hash(Profile("p", (f,), "T"))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        p.event_type = None


def test_constraints_of_different_kinds_are_different_values():
    assert C("a", "eq", 1) != C("a", "eq", True)
    assert C("a", "ne", 0) != C("a", "ne", False)
    assert C("a", "in", (1, 0)) != C("a", "in", (True, False))
    assert len({J(C("a", "eq", 1)), J(C("a", "eq", True))}) == 2
    assert Profile("p", (J(C("a", "eq", 1)),)) != Profile("p", (J(C("a", "eq", True)),))


# -- event types -----------------------------------------------------------------------------------


def test_effective_without_an_event_type_is_the_conjunctions():
    conjs = (J(C("a", "eq", 1)), J())
    assert Profile("p", conjs).effective == conjs


def test_effective_folds_the_event_type_into_every_conjunction():
    t = C(TYPE_ATTR, "eq", "Trade")
    p = Profile("p", (J(C("a", "eq", 1)), J()), "Trade")
    assert p.conjunctions == (J(C("a", "eq", 1)), J())  # stored as given
    assert p.effective == (J(t, C("a", "eq", 1)), J(t))


def test_event_type_restricts_matching():
    p = Profile("p", (J(C("a", "eq", 1)),), "Trade")
    assert p.matches({TYPE_ATTR: "Trade", "a": 1})
    assert not p.matches({TYPE_ATTR: "Quote", "a": 1})
    assert not p.matches({"a": 1})
    everything = Profile("p", event_type="Trade")
    assert everything.matches({TYPE_ATTR: "Trade"})
    assert not everything.matches({})
    assert not everything.matches({TYPE_ATTR: "trade"})


def test_an_event_type_is_an_equality_on_type_attr():
    # the matchers need no special case: the same test written by hand gives the same profile
    by_hand = Profile("p", (J(C(TYPE_ATTR, "eq", "Trade"), C("a", "gt", 0)),))
    folded = Profile("p", (J(C("a", "gt", 0)),), "Trade")
    assert by_hand.effective == folded.effective
    for event in [{TYPE_ATTR: "Trade", "a": 1}, {TYPE_ATTR: "Trade", "a": 0}, {"a": 1}]:
        assert by_hand.matches(event) == folded.matches(event)


# -- str() -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "text"),
    [
        (C("price", "eq", 10), "price = 10"),
        (C("price", "==", 10), "price = 10"),
        (C("price", "ne", 10), "price != 10"),
        (C("price", "lt", 1.5), "price < 1.5"),
        (C("price", "le", -3), "price <= -3"),
        (C("price", "gt", INF), "price > inf"),
        (C("price", "ge", 0), "price >= 0"),
        (C("sym", "eq", "10"), "sym = '10'"),
        (C("sym", "prefix", "IB"), "sym prefix 'IB'"),
        (C("sym", "exists"), "sym exists"),
        (C("sym", "in", ("IBM", "HPQ")), "sym in ('IBM', 'HPQ')"),
        (C("n", "in", [1]), "n in (1)"),
        (C("b", "eq", True), "b = True"),
        (C(TYPE_ATTR, "eq", "Trade"), "@type = 'Trade'"),
    ],
)
def test_constraint_str(c, text):
    assert str(c) == text


def test_conjunction_and_profile_str():
    a, b = C("a", "eq", 1), C("b", "exists")
    assert str(J(a, b)) == "a = 1 and b exists"
    assert str(Profile("p")) == "everything"
    assert str(Profile("p", (J(a, b),))) == "a = 1 and b exists"
    assert str(Profile("p", (J(a), J(b, a)))) == "(a = 1) or (b exists and a = 1)"
    assert str(Profile("p", (J(a), J()))) == "(a = 1) or (everything)"
    assert str(Profile("p", event_type="Trade")) == "Trade where everything"
    assert str(Profile("p", (J(a), J(b)), "Trade")) == "Trade where (a = 1) or (b exists)"


# -- from the wire -------------------------------------------------------------------------------


def test_conjunction_from_wire():
    f = conjunction_from_wire(
        [
            m.Constraint("a", "==", 1),
            m.Constraint("b", "exists"),
            m.Constraint("c", "prefix", "x"),
            m.Constraint("d", "in", ["x", "y"]),
            m.Constraint("e", ">=", 2.5),
        ]
    )
    assert f == J(
        C("a", "eq", 1),
        C("b", "exists"),
        C("c", "prefix", "x"),
        C("d", "in", ("x", "y")),
        C("e", "ge", 2.5),
    )
    assert type(f.constraints[3].value) is tuple
    assert conjunction_from_wire([]) == Conjunction()


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (m.Constraint("a", "like", 1), "unknown operator"),
        (m.Constraint("a", "eq", [1, 2]), "not a string, number or boolean"),
        (m.Constraint("a", "exists", []), "takes no value"),
        (m.Constraint("a", "in", []), "at least one value"),
        (m.Constraint("a", "in", "x"), "needs a list"),
        (m.Constraint("a", "in", [1, "1"]), "one type"),
        (m.Constraint("a", "lt", True), "not ordered"),
        (m.Constraint("a", "eq", NAN), "NaN"),
        (m.Constraint("1a", "eq", 1), "attribute name"),
        (m.Constraint("@x", "eq", 1), "attribute name"),
    ],
)
def test_conjunction_from_wire_refuses_invalid_constraints(item, message):
    with pytest.raises(ValueError, match=message):
        conjunction_from_wire([m.Constraint("ok", "exists"), item])
    with pytest.raises(ValueError, match=message):
        profile_from_wire("p", [[], [item]])


def test_conjunction_from_wire_refuses_too_many_constraints():
    items = [m.Constraint(f"a{i}", "exists") for i in range(MAX_CONSTRAINTS + 1)]
    with pytest.raises(ValueError, match=f"over {MAX_CONSTRAINTS}"):
        conjunction_from_wire(items)


def test_profile_from_wire():
    p = profile_from_wire(
        "p1",
        [
            [m.Constraint("a", "=", 1)],
            [m.Constraint(TYPE_ATTR, "eq", "T"), m.Constraint("b", "exists")],
        ],
    )
    assert p == Profile("p1", (J(C("a", "eq", 1)), J(C(TYPE_ATTR, "eq", "T"), C("b", "exists"))))
    assert p.event_type is None
    assert p.matches({"a": 1})
    assert p.matches({TYPE_ATTR: "T", "b": 0})
    assert not p.matches({"b": 0})


def test_profile_from_wire_with_no_conjunctions_matches_everything():
    p = profile_from_wire("p", [])
    assert p == Profile("p")
    assert p.matches({})
    # an empty conjunction list on the wire is the empty conjunction: also everything
    assert profile_from_wire("p", [[]]) == Profile("p")


def test_profile_from_wire_with_an_event_type():
    p = profile_from_wire("p", [[m.Constraint("a", "gt", 0)]], "Trade")
    assert p.event_type == "Trade"
    assert p.effective == (J(C(TYPE_ATTR, "eq", "Trade"), C("a", "gt", 0)),)
    assert profile_from_wire("p", [], "Trade").effective == (J(C(TYPE_ATTR, "eq", "Trade")),)


def test_profile_from_wire_bounds_the_conjunctions():
    ok = [[m.Constraint("a", "eq", i)] for i in range(MAX_CONJUNCTIONS)]
    assert len(profile_from_wire("p", ok).conjunctions) == MAX_CONJUNCTIONS
    with pytest.raises(ValueError, match=f"over {MAX_CONJUNCTIONS}"):
        profile_from_wire("p", [*ok, []])


def test_profile_from_a_decoded_subscribe():
    import msgspec

    sub = m.Subscribe(
        7, [[m.Constraint("sym", "in", ["IBM", "HPQ"]), m.Constraint("px", "<", 10)]], "pid"
    )
    raw = msgspec.msgpack.encode(sub)
    back = msgspec.msgpack.decode(raw, type=m.Subscribe)
    p = profile_from_wire(back.profile_id, back.conjunctions)
    assert p == Profile("pid", (J(C("sym", "in", ("IBM", "HPQ")), C("px", "lt", 10)),))
    assert p.matches({"sym": "HPQ", "px": 9.5})


# -- properties ------------------------------------------------------------------------------------

NAMES = ["a", "b", "c"]
strings = st.sampled_from(["", "a", "ab", "b", "1"])
numbers = st.one_of(st.integers(-3, 3), st.floats(-3, 3, allow_nan=False), st.just(INF))
scalars = st.one_of(st.booleans(), numbers, strings)
event_values = st.one_of(scalars, st.just(NAN))


@st.composite
def constraints(draw):
    attr = draw(st.sampled_from(NAMES))
    op = draw(st.sampled_from(OPS))
    if op == "exists":
        return Constraint(attr, op)
    if op == "topic":
        return Constraint(TOPIC_ATTR, op, draw(st.sampled_from(["a/+", "#", "+/b/#", "$s/+"])))
    if op == "prefix":
        return Constraint(attr, op, draw(strings))
    if op in ORDERED:
        return Constraint(attr, op, draw(st.one_of(numbers, strings)))
    if op == "in":
        one_kind = draw(st.sampled_from([st.booleans(), numbers, strings]))
        return Constraint(attr, op, draw(st.lists(one_kind, min_size=1, max_size=4)))
    return Constraint(attr, op, draw(scalars))


events = st.dictionaries(
    st.sampled_from([*NAMES, TOPIC_ATTR]),
    st.one_of(event_values, st.sampled_from(["a/b", "$s/b", "a"])),
)


@given(st.lists(constraints(), max_size=5), events)
def test_conjunction_is_the_conjunction_of_its_constraints(cs, attributes):
    f = Conjunction(cs)
    expected = all(c.matches(attributes) for c in cs)
    assert f.matches(attributes) is expected
    assert Conjunction(reversed(cs)).matches(attributes) is expected
    assert all(J(c).matches(attributes) for c in cs) is expected


@given(st.lists(st.lists(constraints(), max_size=3), min_size=1, max_size=3), events)
def test_profile_is_the_disjunction_of_its_conjunctions_property(conjs, attributes):
    p = Profile("p", [Conjunction(c) for c in conjs])
    assert p.matches(attributes) is any(Conjunction(c).matches(attributes) for c in conjs)
    typed = Profile("p", p.conjunctions, "T")
    assert not typed.matches(attributes)
    assert typed.matches({**attributes, TYPE_ATTR: "T"}) is p.matches(attributes)


def _same_kind(x, y) -> bool:
    def k(v):
        return "b" if isinstance(v, bool) else "s" if isinstance(v, str) else "n"

    return k(x) == k(y)


def _topic_regex(topic_filter: str, topic: str) -> bool:
    """MQTT's filter rules stated as a regular expression: ``+`` one level, a final ``#`` any
    levels (none included), no wildcard first level for a ``$`` topic."""
    if topic_filter[0] in "+#" and topic.startswith("$"):
        return False
    parts = topic_filter.split("/")
    tail = ""
    if parts[-1] == "#":
        parts, tail = parts[:-1], "(/.*)?" if len(parts) > 1 else ".*"
    pattern = "/".join("[^/]*" if x == "+" else re.escape(x) for x in parts) + tail
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


@given(constraints(), events)
def test_constraint_semantics_model(c, attributes):
    """An independent statement of the rules in the module docstring."""
    got = c.matches(attributes)
    if c.attr not in attributes:
        assert not got
        return
    have, want = attributes[c.attr], c.value
    if c.op == "exists":
        assert got
    elif c.op == "in":
        assert got == any(_same_kind(have, w) and have == w for w in want)
    elif not _same_kind(have, want):
        assert not got  # different kinds never match, whatever the operator
    elif isinstance(have, float) and math.isnan(have):
        assert got == (c.op == "ne")
    elif c.op == "prefix":
        assert got == have.startswith(want)
    elif c.op == "topic":
        assert got == _topic_regex(want, have)
    else:
        # same kind, and validation keeps booleans out of the ordered operators
        python = {
            "eq": lambda: have == want,
            "ne": lambda: have != want,
            "lt": lambda: have < want,
            "le": lambda: have <= want,
            "gt": lambda: have > want,
            "ge": lambda: have >= want,
        }
        assert got == python[c.op]()


def test_a_conjunction_weighs_its_constraints_in_values_and_kilobytes_of_strings():
    from ges.matching.model import BYTES_PER_WEIGHT, MAX_CONJUNCTION_WEIGHT, weight

    assert weight(J(C("a", "eq", 1), C("b", "in", (1, 2, 3)))) == 1 + 4
    assert weight(J(C("a", "eq", "x" * (3 * BYTES_PER_WEIGHT)))) == 1 + 3
    many = [C(f"a{i}", "eq", "y" * 60_000) for i in range(80)]  # 4.8 MB of strings
    with pytest.raises(ValueError, match=f"over {MAX_CONJUNCTION_WEIGHT}"):
        Conjunction(many)
