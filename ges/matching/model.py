"""Profiles and their constraints: the value model and the naive reference evaluator.

A *profile* (DESIGN "Words") is a disjunction of *conjunctions*; a conjunction is a list of
*constraints*, each ``attribute OP value``. An event matches a conjunction when it satisfies every
constraint, and a profile when it matches any conjunction. The empty conjunction matches every
event.

Values have one of three kinds — strings, numbers (int and float together) and booleans — and
compare only within their kind: a constraint whose value is of another kind than the event's
attribute never matches, not even ``ne``, and never raises. ``NaN`` is allowed in events (it
satisfies only ``ne`` and ``exists``, like the IEEE comparisons) but never as a constraint value.

Operators: ``eq ne lt le gt ge`` (ordered ones on strings and numbers), ``prefix`` (strings),
``exists`` (no value), ``in`` (a non-empty set of values of one kind) and ``topic`` (an MQTT topic
filter, ges.matching.topics). An event's type travels as the reserved attribute ``@type``
(attribute names can never start with ``@``), so a profile's ``event_type`` is one more equality
constraint and the matchers need no special case. An MQTT PUBLISH's topic travels as the reserved
attribute ``@topic``; ``topic`` tests only it, and it takes no ordered test and no ``prefix``
(``a/#`` says what a prefix would), which keeps covering exact (ges.matching.covering).

``Conjunction.matches`` / ``Profile.matches`` evaluate every constraint: this is the naive
evaluator the profile graph (``ges.matching.graph``) is checked against and benchmarked beside.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

from ges.matching import topics
from ges.wire import messages as wire

Value = str | int | float | bool

#: The reserved attribute carrying an event's type.
TYPE_ATTR = "@type"
#: The reserved attribute carrying an MQTT topic (ges.mqtt), the one the ``topic`` operator tests.
TOPIC_ATTR = "@topic"
#: The reserved attribute marking an MQTT retained message (1: ges.durable.retained).
RETAIN_ATTR = "@retain"
RESERVED = frozenset((TYPE_ATTR, TOPIC_ATTR, RETAIN_ATTR))

OPS = ("eq", "ne", "lt", "le", "gt", "ge", "prefix", "exists", "in", "topic")
ORDERED = frozenset(("lt", "le", "gt", "ge"))
#: How each operator is written in ``--where`` text and in ``str()``.
SYMBOLS = {"eq": "=", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
#: Symbol (and alias) spellings accepted on the wire and in ``--where``.
ALIASES = {"=": "eq", "==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}

STRING, NUMBER, BOOLEAN = "string", "number", "bool"
#: What ``@topic`` may not be tested with.
_NOT_TOPIC = ORDERED | {"prefix"}

#: Bounds on one profile (a broker admits nothing larger). A profile's *weight* — its
#: constraints plus the values of its ``in`` tests (plus a unit per kilobyte of strings),
#: summed over its conjunctions — is what
#: storing, matching and covering it cost; it is bounded per conjunction and per profile, and a
#: broker bounds the total weight of each client's subscriptions (``ges.core``).
MAX_CONJUNCTIONS = 16_384
MAX_CONSTRAINTS = 256
MAX_IN_VALUES = 4096
MAX_CONJUNCTION_WEIGHT = 4_352
MAX_PROFILE_WEIGHT = 32_768
#: Characters of attribute names and string values that weigh as much as a constraint: a
#: conjunction is bounded in bytes too (at most about 4 MiB: always within a frame).
BYTES_PER_WEIGHT = 1024
MAX_NAME = 256
MAX_STRING = 65536
#: Integers are signed 64-bit, as on the wire.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

NAME = re.compile(r"[A-Za-z_][\w.\-]*")


def kind(value) -> str | None:
    """The comparison kind of a value (bool is not a number here), or None for anything else."""
    t = type(value)
    if t is str:
        return STRING
    if t is bool:
        return BOOLEAN
    if t is int or t is float:
        return NUMBER
    return None


def _check_value(value, op: str) -> str:
    k = kind(value)
    if k is None:
        raise ValueError(f"{op}: value {value!r} is not a string, number or boolean")
    if k is NUMBER and value != value:
        raise ValueError(f"{op}: NaN is not a constraint value")
    if k is STRING and len(value) > MAX_STRING:
        raise ValueError(f"{op}: string value over {MAX_STRING} characters")
    if type(value) is int and not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"{op}: integer {value} is outside the signed 64-bit range")
    return k


def _canonical_op(op) -> str:
    op = ALIASES.get(op, op)
    if op not in OPS:
        raise ValueError(f"unknown operator {op!r} (use one of {', '.join(OPS)})")
    return op


def _in_values(value) -> tuple:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError("in: needs a list of values")
    seen: dict = {}
    for v in value:
        k = kind(v)
        if k is None:
            raise ValueError(f"in: value {v!r} is not a string, number or boolean")
        # dedupe by (kind, value) so 1 and True never collapse; keep the first spelling
        seen.setdefault((k, v), v)
    return tuple(seen.values())


def _value_key(value):
    """Equality of constraint values by kind too: ``1`` and ``True`` are different values."""
    if type(value) is tuple:
        return tuple((kind(v), v) for v in value)
    return (kind(value), value)


@attrs.frozen(cache_hash=True)
class Constraint:
    """``attr op value``; ``in`` takes a tuple of values, ``exists`` none. Validated on creation."""

    attr: str
    op: str = attrs.field(converter=_canonical_op)
    value: Value | tuple[Value, ...] | None = attrs.field(default=None, eq=_value_key)

    def __attrs_post_init__(self) -> None:
        if self.attr not in RESERVED and (
            len(self.attr) > MAX_NAME or not NAME.fullmatch(self.attr)
        ):
            raise ValueError(f"attribute name {self.attr!r} must match [A-Za-z_][\\w.-]*")
        op, value = self.op, self.value
        if op == "topic" and self.attr != TOPIC_ATTR:
            raise ValueError(f"topic: tests only {TOPIC_ATTR}")
        if op in _NOT_TOPIC and self.attr == TOPIC_ATTR:
            raise ValueError(f"{op}: {TOPIC_ATTR} takes topic, eq, ne, in and exists")
        if op == "exists":
            if value is not None:
                raise ValueError("exists: takes no value")
            return
        if op == "in":
            values = _in_values(value)
            if not values:
                raise ValueError("in: needs at least one value")
            if len(values) > MAX_IN_VALUES:
                raise ValueError(f"in: over {MAX_IN_VALUES} values")
            kinds = {_check_value(v, op) for v in values}
            if len(kinds) > 1:
                raise ValueError("in: values must all be of one type")
            object.__setattr__(self, "value", values)
            return
        k = _check_value(value, op)
        if op in ORDERED and k is BOOLEAN:
            raise ValueError(f"{op}: booleans are not ordered")
        if op == "prefix" and k is not STRING:
            raise ValueError("prefix: needs a string value")
        if op == "topic":
            why = "topic: needs a string value" if k is not STRING else topics.check_filter(value)
            if why is not None:
                raise ValueError(why if why.startswith("topic") else f"topic: {why}")

    @property
    def kind(self) -> str | None:
        """The kind of value this constraint accepts (None: any, for ``exists``)."""
        if self.op == "exists":
            return None
        return kind(self.value[0] if self.op == "in" else self.value)

    def matches(self, attributes: Mapping[str, Value]) -> bool:
        have = attributes.get(self.attr)
        if have is None:
            return False
        return test(self.op, self.value, have)

    def __str__(self) -> str:
        if self.op == "exists":
            return f"{self.attr} exists"
        if self.op == "in":
            return f"{self.attr} in ({', '.join(map(repr, self.value))})"
        return f"{self.attr} {SYMBOLS.get(self.op, self.op)} {self.value!r}"


def test(op: str, want, have) -> bool:
    """Does an attribute value ``have`` satisfy ``op want``? (The reference semantics.)"""
    if op == "exists":
        return True
    hk = kind(have)
    if op == "in":
        return any(kind(w) is hk and have == w for w in want)
    if kind(want) is not hk:
        return False
    if op == "eq":
        return have == want
    if op == "ne":
        return have != want
    if op == "prefix":
        return have.startswith(want)
    if op == "topic":
        return topics.matches(want, have)
    if hk is BOOLEAN:
        return False
    if op == "lt":
        return have < want
    if op == "le":
        return have <= want
    if op == "gt":
        return have > want
    if op == "ge":
        return have >= want
    raise AssertionError(op)


def weight(conj: Conjunction) -> int:
    """A conjunction's size (worked out when it is made): one per constraint, one per value
    of an ``in`` test, and one per BYTES_PER_WEIGHT characters of its names and strings."""
    return conj._weight


def constraint_weight(op: str, attr: str, value) -> int:
    """One constraint's part of :func:`weight` (``value`` as in a Constraint, or a list on the
    wire)."""
    if op == "in":
        chars = sum(len(v) for v in value if type(v) is str)
        return 1 + len(value) + (len(attr) + chars) // BYTES_PER_WEIGHT
    chars = len(value) if type(value) is str else 0
    return 1 + (len(attr) + chars) // BYTES_PER_WEIGHT


@attrs.frozen(cache_hash=True)
class Conjunction:
    """Constraints that must all hold; the empty conjunction matches every event."""

    constraints: tuple[Constraint, ...] = attrs.field(default=(), converter=tuple)
    #: its weight (see :func:`weight`)
    _weight: int = attrs.field(default=0, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if len(self.constraints) > MAX_CONSTRAINTS:
            raise ValueError(f"conjunction of over {MAX_CONSTRAINTS} constraints")
        total = sum(constraint_weight(c.op, c.attr, c.value) for c in self.constraints)
        object.__setattr__(self, "_weight", total)
        if total > MAX_CONJUNCTION_WEIGHT:
            raise ValueError(
                f"conjunction of weight {total} (constraints, in-values and kilobytes of "
                f"strings) over {MAX_CONJUNCTION_WEIGHT}"
            )

    def matches(self, attributes: Mapping[str, Value]) -> bool:
        get = attributes.get
        for c in self.constraints:
            have = get(c.attr)
            if have is None or not test(c.op, c.value, have):
                return False
        return True

    def __str__(self) -> str:
        return " and ".join(map(str, self.constraints)) or "everything"


@attrs.frozen
class Profile:
    """A client's interest: a disjunction of conjunctions, optionally for one event type."""

    id: str
    conjunctions: tuple[Conjunction, ...] = attrs.field(default=(Conjunction(),), converter=tuple)
    event_type: str | None = None
    #: the weight, worked out once
    _weight: int | None = attrs.field(default=None, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.conjunctions:
            raise ValueError(f"profile {self.id!r}: needs at least one conjunction")
        if self.event_type is not None and not self.event_type:
            raise ValueError(f"profile {self.id!r}: an event type must not be empty")
        if len(self.conjunctions) > MAX_CONJUNCTIONS:
            raise ValueError(f"profile {self.id!r}: over {MAX_CONJUNCTIONS} conjunctions")
        total = sum(map(weight, self.conjunctions))
        object.__setattr__(self, "_weight", total)
        if total > MAX_PROFILE_WEIGHT:
            raise ValueError(
                f"profile {self.id!r}: weight {total} (constraints plus in-values) over "
                f"{MAX_PROFILE_WEIGHT}"
            )

    @property
    def weight(self) -> int:
        """Constraints plus ``in`` values over every conjunction (see MAX_PROFILE_WEIGHT)."""
        total = self._weight
        if total is None:
            total = sum(map(weight, self.conjunctions))
            object.__setattr__(self, "_weight", total)
        return total

    @classmethod
    def parsed(
        cls, profile_id: str, conjunctions: tuple[Conjunction, ...], total_weight: int
    ) -> Profile:
        """A profile whose conjunctions were checked one by one as they were parsed (their
        count and ``total_weight`` within the bounds): made without going over them again,
        which for the largest profiles would take longer than a broker may spend at once."""
        if len(conjunctions) > MAX_CONJUNCTIONS or total_weight > MAX_PROFILE_WEIGHT:
            raise ValueError(f"profile {profile_id!r}: over the bounds")
        profile = object.__new__(cls)
        object.__setattr__(profile, "id", profile_id)
        object.__setattr__(profile, "conjunctions", conjunctions)
        object.__setattr__(profile, "event_type", None)
        object.__setattr__(profile, "_weight", total_weight)
        return profile

    @property
    def effective(self) -> tuple[Conjunction, ...]:
        """The conjunctions with the event-type test folded in: what matchers store."""
        if self.event_type is None:
            return self.conjunctions
        t = Constraint(TYPE_ATTR, "eq", self.event_type)
        return tuple(Conjunction((t, *c.constraints)) for c in self.conjunctions)

    def matches(self, attributes: Mapping[str, Value]) -> bool:
        return any(c.matches(attributes) for c in self.effective)

    def __str__(self) -> str:
        body = " or ".join(
            f"({c})" if len(self.conjunctions) > 1 else str(c) for c in self.conjunctions
        )
        return f"{self.event_type} where {body}" if self.event_type else body


def conjunction_from_wire(items) -> Conjunction:
    """From wire ``Constraint`` structs (attr, op, value); anything invalid raises ValueError."""
    out = []
    for item in items:
        value = item.value
        if isinstance(value, list):
            value = tuple(value)
        out.append(Constraint(item.attr, item.op, value))
    return Conjunction(out)


def conjunction_to_wire(conj: Conjunction) -> list[wire.Constraint]:
    """To wire ``Constraint`` structs (an ``in`` tuple travels as a list)."""
    return [
        wire.Constraint(c.attr, c.op, list(c.value) if c.op == "in" else c.value)
        for c in conj.constraints
    ]


def profile_to_wire(profile: Profile) -> list[list[wire.Constraint]]:
    """A profile's effective conjunctions as a wire ``Subscribe`` carries them."""
    return [conjunction_to_wire(conj) for conj in profile.effective]


def profile_from_wire(profile_id: str, conjunctions, event_type: str | None = None) -> Profile:
    """From a wire ``Subscribe``'s conjunction lists; anything invalid raises ValueError."""
    if len(conjunctions) > MAX_CONJUNCTIONS:
        raise ValueError(f"over {MAX_CONJUNCTIONS} conjunctions")
    return Profile(
        profile_id,
        tuple(conjunction_from_wire(c) for c in conjunctions) or (Conjunction(),),
        event_type,
    )
