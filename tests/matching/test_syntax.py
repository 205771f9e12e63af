"""The CLI's one-line syntax (ges.matching.syntax): ``--where`` constraints, ``--attr`` values."""

from __future__ import annotations

import math

import pytest

from ges.errors import GesError, UserInputError
from ges.matching.model import MAX_IN_VALUES, MAX_NAME, MAX_STRING, Conjunction, Constraint
from ges.matching.syntax import parse_attr, parse_value, parse_where


def C(attr, op, value=None):
    return Constraint(attr, op, value)


def same_types(got, expected) -> bool:
    if isinstance(expected, tuple):
        return type(got) is tuple and [type(v) for v in got] == [type(v) for v in expected]
    return type(got) is type(expected)


def one_line_error(parse, text, flag):
    with pytest.raises(UserInputError) as info:
        parse(text)
    msg = str(info.value)
    assert msg.startswith(f"{flag} ")
    assert "\n" not in msg
    assert isinstance(info.value, GesError)
    assert info.value.exit_code == 2
    return msg


# -- parse_where -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("price = 10", C("price", "eq", 10)),
        ("price == 10", C("price", "eq", 10)),
        ("price != 10", C("price", "ne", 10)),
        ("price < 10", C("price", "lt", 10)),
        ("price <= 10", C("price", "le", 10)),
        ("price > 10", C("price", "gt", 10)),
        ("price >= 10", C("price", "ge", 10)),
        ("sym prefix IB", C("sym", "prefix", "IB")),
        ("sym exists", C("sym", "exists")),
        ("  sym   exists  ", C("sym", "exists")),
        ("price>10", C("price", "gt", 10)),
        ("price>=10", C("price", "ge", 10)),
        ("price!=10", C("price", "ne", 10)),
        ("price==10", C("price", "eq", 10)),
        ("price<=-3", C("price", "le", -3)),
        ("  price   >   10  ", C("price", "gt", 10)),
        ("ratio < 0.5", C("ratio", "lt", 0.5)),
        ("ratio < 1e3", C("ratio", "lt", 1000.0)),
        ("ratio < inf", C("ratio", "lt", math.inf)),
        ("ratio > -inf", C("ratio", "gt", -math.inf)),
        ("sym = IBM", C("sym", "eq", "IBM")),
        ("a.b-c_d = x", C("a.b-c_d", "eq", "x")),
        ("_x = 1", C("_x", "eq", 1)),
        ("sym = IBM Corp", C("sym", "eq", "IBM Corp")),
        ("sym = '42'", C("sym", "eq", "42")),
        ('sym = "42"', C("sym", "eq", "42")),
        ("sym = ''", C("sym", "eq", "")),
        ("sym = 'a b'", C("sym", "eq", "a b")),
        ("sym = ' a '", C("sym", "eq", " a ")),
        ("sym = 'it''s'", C("sym", "eq", "it''s")),  # only the outer pair is removed
        ("sym = 'x\"", C("sym", "eq", "'x\"")),  # mismatched quotes are kept
        ("sym = '", C("sym", "eq", "'")),
        ("sym prefix '10'", C("sym", "prefix", "10")),
        ("code prefix 10", C("code", "prefix", "10")),  # a prefix is always a string
        ("code prefix 1.5", C("code", "prefix", "1.5")),
        ("x = nan", C("x", "eq", "nan")),
        ("x = true", C("x", "eq", True)),
        ("x = false", C("x", "eq", False)),
        ("x = 'true'", C("x", "eq", "true")),  # quoted: the string
        ("x = True", C("x", "eq", "True")),  # only lowercase true/false are booleans
        ("exists exists", C("exists", "exists")),
        ("prefix prefix p", C("prefix", "prefix", "p")),
        ("x = exists", C("x", "eq", "exists")),
        # in: comma-separated, each value typed on its own
        ("sym in IBM,HPQ", C("sym", "in", ("IBM", "HPQ"))),
        ("sym in IBM", C("sym", "in", ("IBM",))),
        ("n in 1, 2 ,3", C("n", "in", (1, 2, 3))),
        ("n in 1.5,2", C("n", "in", (1.5, 2))),
        ("n in 2,2.0,3", C("n", "in", (2, 3))),  # duplicates go, the first spelling stays
        ("sym in IBM,IBM", C("sym", "in", ("IBM",))),
        ("sym in '1','2'", C("sym", "in", ("1", "2"))),
        ('sym in "1", 2x', C("sym", "in", ("1", "2x"))),
        ("sym in 'a b',c", C("sym", "in", ("a b", "c"))),
        ("sym in nan", C("sym", "in", ("nan",))),
        ("in in 1", C("in", "in", (1,))),
        ("  n   in   1  ", C("n", "in", (1,))),
    ],
)
def test_parse_where(text, expected):
    got = parse_where(text)
    assert got == expected
    assert same_types(got.value, expected.value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "price",
        "price 10",
        "price ~ 10",
        "price =",
        "price >=   ",
        "= 10",
        "1price = 10",
        "sym exists now",
        "sym prefixIB",
        "sym inIBM",
        "sym in",
        "sym in   ",
        "sym prefix",
        "priceexists",  # once read as "pric exists" (the name pattern backtracked)
        "x = a\nb",
        "@type = T",
        "a b = 1",
        "é = 1",
    ],
)
def test_parse_where_rejects_bad_input_with_one_line(text):
    one_line_error(parse_where, text, "--where")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("price ~ 10", "expected 'name OP value'"),
        ("price =", "missing value after '='"),
        ("sym in", "missing value after 'in'"),
        ("sym in  ", "missing value after 'in'"),
        ("sym prefix  ", "missing value after 'prefix'"),
        # errors of the model come through as UserInputError naming the input
        ("n in 1,'2'", "one type"),
        ("n in 1,,2", "empty value in the list"),
        ("x in a,", "empty value in the list"),
        ("price => 10", "starts with an operator"),
        ("n in 1, x", "one type"),
        ("a" * (MAX_NAME + 1) + " = 1", "attribute name"),
        ("s = " + "x" * (MAX_STRING + 1), str(MAX_STRING)),
        ("s prefix " + "x" * (MAX_STRING + 1), str(MAX_STRING)),
        ("n in " + ",".join(map(str, range(MAX_IN_VALUES + 1))), f"over {MAX_IN_VALUES}"),
    ],
)
def test_parse_where_error_messages(text, fragment):
    msg = one_line_error(parse_where, text, "--where")
    assert fragment in msg
    assert repr(text)[:20] in msg  # names the input


def test_parse_where_bounds_are_the_models():
    assert parse_where("a" * MAX_NAME + " exists").attr == "a" * MAX_NAME
    n = parse_where("n in " + ",".join(map(str, range(MAX_IN_VALUES))))
    assert len(n.value) == MAX_IN_VALUES


def test_parse_where_in_keeps_commas_inside_quotes():
    assert parse_where("sym in 'a,b',c") == C("sym", "in", ("a,b", "c"))
    assert parse_where('sym in "1,5"') == C("sym", "in", ("1,5",))


def test_parsed_constraint_str():
    assert str(parse_where("sym exists")) == "sym exists"
    assert str(parse_where("price >= 10")) == "price >= 10"
    assert str(parse_where("price == 10")) == "price = 10"
    assert str(parse_where("sym = '10'")) == "sym = '10'"
    assert str(parse_where("sym in IBM, HPQ")) == "sym in ('IBM', 'HPQ')"
    assert str(parse_where("code prefix 10")) == "code prefix '10'"


@pytest.mark.parametrize(
    "text", ["price = 10", "price != 1.5", "s < b", "s >= 'a b'", "sym = '42'", "x > -3"]
)
def test_str_of_a_parsed_symbol_constraint_parses_back(text):
    c = parse_where(text)
    assert parse_where(str(c)) == c


@pytest.mark.parametrize(
    ("text", "attributes", "expected"),
    [
        ("sym = '42'", {"sym": "42"}, True),
        ("sym = '42'", {"sym": 42}, False),
        ("sym = 42", {"sym": "42"}, False),
        ("sym = 42", {"sym": 42.0}, True),
        ("code prefix 10", {"code": "1000"}, True),
        ("code prefix 10", {"code": 1000}, False),
        ("n in 1,2", {"n": 2.0}, True),
        ("n in 1,2", {"n": "2"}, False),
        ("sym in IBM,HPQ", {"sym": "HPQ"}, True),
        ("sym in IBM,HPQ", {"sym": "SUN"}, False),
        ("x exists", {"x": False}, True),
        ("x = true", {"x": True}, True),
        ("x = true", {"x": "true"}, False),
    ],
)
def test_parsed_constraints_match(text, attributes, expected):
    assert Conjunction((parse_where(text),)).matches(attributes) is expected


# -- parse_value -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10", 10),
        ("-7", -7),
        ("+7", 7),
        ("1.5", 1.5),
        ("1e2", 100.0),
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("abc", "abc"),
        ("", ""),
        ("nan", "nan"),  # NaN never compares equal: it stays a string
        ("-nan", "-nan"),
        ("NaN", "NaN"),
        ("true", True),
        ("false", False),
        ("False", "False"),
        ("10x", "10x"),
        ("0x10", "0x10"),
    ],
)
def test_parse_value(text, expected):
    got = parse_value(text)
    assert got == expected
    assert type(got) is type(expected)


# -- parse_attr ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n=10", ("n", 10)),
        ("n=-3", ("n", -3)),
        ("x=2.5", ("x", 2.5)),
        ("x=1e-3", ("x", 0.001)),
        ("s=IBM", ("s", "IBM")),
        ("s=", ("s", "")),
        ("s=a=b", ("s", "a=b")),
        (" s =IBM", ("s", "IBM")),
        ("s=nan", ("s", "nan")),
        ("s=true", ("s", True)),
        ("s:bool=false", ("s", False)),
        ("s:str=true", ("s", "true")),
        ("s='42'", ("s", "'42'")),  # quotes are kept: use name:str=value
        ("s:str=10", ("s", "10")),
        ("s:str=", ("s", "")),
        ("s:str=nan", ("s", "nan")),
        ("n:int=10", ("n", 10)),
        ("n:int=-10", ("n", -10)),
        ("x:float=10", ("x", 10.0)),
        ("x:float=1.5", ("x", 1.5)),
        ("x:float=inf", ("x", math.inf)),
        ("a.b-c=1", ("a.b-c", 1)),
        ("_=1", ("_", 1)),
    ],
)
def test_parse_attr(text, expected):
    got = parse_attr(text)
    assert got == expected
    assert type(got[1]) is type(expected[1])


@pytest.mark.parametrize(
    "text",
    [
        "",
        "n",
        "=10",
        "  =10",
        "1n=10",
        "a b=1",
        "n:bool=1",
        "n:=1",
        "n:int=abc",
        "n:int=1.5",
        "n:int=",
        "x:float=abc",
        "@type=T",
        "n: int=1",
        # typed numbers check the name too (once returned before the check)
        ":int=5",
        "1bad:int=5",
        "a b:float=1",
        ":str=x",
        "1bad:str=x",
    ],
)
def test_parse_attr_rejects_bad_input_with_one_line(text):
    one_line_error(parse_attr, text, "--attr")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("n", "expected name=value"),
        ("n:bool=1", "is not true or false"),
        ("n:int=abc", "'abc' is not an int"),
        ("x:float=abc", "'abc' is not a"),
        ("1n=10", "attribute name must be a word"),
        ("1n:int=10", "attribute name must be a word"),
    ],
)
def test_parse_attr_error_messages(text, fragment):
    assert fragment in one_line_error(parse_attr, text, "--attr")
