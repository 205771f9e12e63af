"""Simple attribute filters: a conjunction of ``name OP value`` constraints.

This is the first, naive matcher (every subscription's filter is evaluated against every event);
the profile-graph matcher of seed 004 §3 (after Aguilera et al.) replaces it for routing. It is
kept as the reference evaluator the faster structures are checked against.

Value typing follows the CLI rule: a value is an int if it parses as one, else a float if it
parses as one, else a string; ``name:str=value`` (for attributes) or a quoted value (for filters)
forces a string. Values compare only within their kind — numbers (int and float together),
strings, booleans — so a constraint between kinds never matches (not even ``!=``), never raises.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence

import attrs

from ges.errors import UserInputError

Value = str | int | float | bool

_NUMERIC = (int, float)


def _kind(value) -> type | None:
    """The comparison class of a value: bool, number or str (bool is not a number here)."""
    if isinstance(value, bool):
        return bool
    if isinstance(value, _NUMERIC):
        return float
    if isinstance(value, str):
        return str
    return None


def _ordered(op: Callable[[object, object], bool]) -> Callable[[object, object], bool]:
    def test(have, want) -> bool:
        kind = _kind(have)
        return kind in (str, float) and kind is _kind(want) and op(have, want)

    return test


def _eq(have, want) -> bool:
    return _kind(have) is _kind(want) and have == want


def _ne(have, want) -> bool:
    return _kind(have) is _kind(want) and have != want


def _prefix(have, want) -> bool:
    return isinstance(have, str) and isinstance(want, str) and have.startswith(want)


#: Operator spelling → test(have, want). ``exists`` ignores ``want``.
OPERATORS: dict[str, Callable[[object, object], bool]] = {
    "=": _eq,
    "==": _eq,
    "!=": _ne,
    "<": _ordered(operator.lt),
    "<=": _ordered(operator.le),
    ">": _ordered(operator.gt),
    ">=": _ordered(operator.ge),
    "prefix": _prefix,
    "exists": lambda have, want: True,
}
CANONICAL = {"==": "="}


@attrs.frozen
class Constraint:
    attr: str
    op: str = attrs.field(validator=attrs.validators.in_(OPERATORS))
    value: Value | None = None

    def matches(self, attributes: Mapping[str, Value]) -> bool:
        if self.attr not in attributes:
            return False
        return OPERATORS[self.op](attributes[self.attr], self.value)

    def __str__(self) -> str:
        if self.op == "exists":
            return f"{self.attr} exists"
        return f"{self.attr} {self.op} {self.value!r}"


@attrs.frozen
class Filter:
    """A conjunction of constraints; the empty filter matches every event."""

    constraints: tuple[Constraint, ...] = ()

    @classmethod
    def from_wire(cls, items: Sequence) -> Filter:
        """From wire ``Constraint`` structs (attr, op, value); bad operators raise ValueError."""
        out = []
        for item in items:
            op = CANONICAL.get(item.op, item.op)
            if op not in OPERATORS:
                raise ValueError(f"unknown operator {item.op!r}")
            out.append(Constraint(item.attr, op, item.value))
        return cls(tuple(out))

    def matches(self, attributes: Mapping[str, Value]) -> bool:
        for c in self.constraints:
            if c.attr not in attributes or not OPERATORS[c.op](attributes[c.attr], c.value):
                return False
        return True

    def __str__(self) -> str:
        return " and ".join(map(str, self.constraints)) or "everything"


def parse_value(text: str) -> Value:
    """int if it parses as one, else float if it parses as one, else the string itself."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if value == value else text  # keep "nan" a string: it never compares equal


def parse_attr(text: str) -> tuple[str, Value]:
    """``name=value`` or ``name:str=value`` → (name, typed value); raises UserInputError."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise UserInputError(f"--attr {text!r}: expected name=value (or name:str=value)")
    name = name.strip()
    force_str = False
    if ":" in name:
        name, _, kind = name.partition(":")
        if kind not in ("str", "int", "float"):
            raise UserInputError(f"--attr {text!r}: unknown type {kind!r} (use str, int or float)")
        force_str = kind == "str"
        if not _NAME.fullmatch(name):
            raise UserInputError(
                f"--attr {text!r}: attribute name must be a word ([A-Za-z_][\\w.-]*)"
            )
        if kind in ("int", "float"):
            try:
                return name, int(raw) if kind == "int" else float(raw)
            except ValueError:
                raise UserInputError(f"--attr {text!r}: {raw!r} is not an {kind}") from None
    if not _NAME.fullmatch(name):
        raise UserInputError(f"--attr {text!r}: attribute name must be a word ([A-Za-z_][\\w.-]*)")
    return name, raw if force_str else parse_value(raw)


_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_WHERE = re.compile(
    r"\s*(?P<attr>[A-Za-z_][\w.\-]*)"
    r"(?:\s+(?P<exists>exists)\s*$"
    r"|(?:\s*(?P<op>==|!=|<=|>=|=|<|>)|\s+(?P<word>prefix)\b)\s*(?P<value>.*?)\s*$)"
)


def parse_where(text: str) -> Constraint:
    """``'price > 10'``, ``'sym = IBM'``, ``"sym = '42'"`` (quoted: string), ``'sym exists'``."""
    m = _WHERE.fullmatch(text)
    if not m:
        raise UserInputError(
            f"--where {text!r}: expected 'name OP value' with OP one of "
            "= != < <= > >= prefix, or 'name exists'"
        )
    if m["exists"]:
        return Constraint(m["attr"], "exists")
    raw = m["value"]
    op = m["op"] or m["word"]
    if not raw:
        raise UserInputError(f"--where {text!r}: missing value after {op!r}")
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        value: Value = raw[1:-1]
    elif op == "prefix":
        value = raw  # a prefix is always a string: 'code prefix 10' means "10…"
    else:
        value = parse_value(raw)
    op = CANONICAL.get(op, op)
    return Constraint(m["attr"], op, value)
