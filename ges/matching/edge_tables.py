"""The profile graph's nodes and the edge tables that index them by operator (seed 004 §3.1).

``ges.matching.graph`` owns the graph: the global attribute order, writing a conjunction as paths,
the predicate counts along them, and the match walk. This module owns what one node holds, and
the keys it is looked up by:

* A value's *key* makes kinds never meet: strings and numbers are their own keys (1 and 1.0 are
  one key, which is the number semantics), booleans get singletons. A constraint's key
  (:func:`constraint_key`) is its identity among a node's edges: equal keys, equal semantics.
* A :class:`Node` is a constraint in the graph, carrying the counts of the edge into it, the
  destinations whose conjunctions end there, and its outgoing edges grouped by the attribute
  they test (:class:`Tests`).
* :class:`Tests` indexes the edges that test one attribute by operator, each in the structure
  that answers "which of these does this value satisfy" without scanning: a hash table for
  ``eq`` and ``in``, sorted thresholds (:class:`Sorted`) for ``lt``/``le``/``gt``/``ge`` per kind,
  ranges sorted by lower bound (:class:`Intervals`), prefixes by length, topic filters by their
  levels (ges.matching.topics.TopicTree), ``ne`` per kind, and ``exists``. A table is created on first use and dropped when emptied.
* :meth:`Tests.probes` flattens the non-empty tables into ``(attribute, probe code, table)``
  tuples; ``ProfileGraph.match`` dispatches on the code (``EQ`` … ``RANGE``; an ordered code + 1
  is the same test on strings) in one inlined loop, so the codes and the shape of each table are
  the contract between this module and the walk.

:class:`Range` and :class:`Eq` stand in for constraints when a conjunction is written as paths: a
lower and an upper bound on one attribute merged into one range node (:func:`merge_ranges`), and
one value of an expanded ``in`` test.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable

from ges.matching.model import STRING, Constraint, kind
from ges.matching.topics import TopicTree

# -- keys --------------------------------------------------------------------------------------

# A value's hash key: strings and numbers are their own keys (1 and 1.0 are one key, which is the
# number semantics); booleans get singletons so they never meet 1 and 0.
TRUE_KEY = ("bool", True)
FALSE_KEY = ("bool", False)

#: The order of operators inside one attribute: the most selective first.
_OP_ORDER = {
    op: i
    for i, op in enumerate(
        ("eq", "in", "prefix", "topic", "range", "lt", "le", "gt", "ge", "ne", "exists")
    )
}


def value_key(value):
    t = type(value)
    if t is bool:
        return TRUE_KEY if value else FALSE_KEY
    return value


class Range:
    """``lo <(=) attr <(=) hi``: a conjunction's lower and upper bound on one attribute, kept
    as one node so that an event inside the range is one hit instead of a hop per bound."""

    __slots__ = ("attr", "value")
    op = "range"

    def __init__(self, attr: str, lower: Constraint, upper: Constraint):
        self.attr = attr
        # (lo, lo_open, hi, hi_closed)
        self.value = (lower.value, lower.op == "gt", upper.value, upper.op == "le")


class Eq:
    """One value of an expanded ``in`` test."""

    __slots__ = ("attr", "value")
    op = "eq"

    def __init__(self, attr: str, value):
        self.attr = attr
        self.value = value


def merge_ranges(keyed: dict) -> dict:
    """Replace each attribute's single lower and single upper bound of one kind by a Range
    (``keyed``: {(attr, constraint key): constraint}; returned as is when nothing merges)."""
    bounds: dict[str, list] = {}
    for c in keyed.values():
        if c.op in ("gt", "ge", "lt", "le"):
            bounds.setdefault(c.attr, []).append(c)
    merged = {}
    for attr, cs in bounds.items():
        lower = [c for c in cs if c.op in ("gt", "ge")]
        upper = [c for c in cs if c.op in ("lt", "le")]
        if len(lower) == 1 and len(upper) == 1 and kind(lower[0].value) is kind(upper[0].value):
            merged[attr] = (lower[0], upper[0])
    if not merged:
        return keyed
    out = {
        k: c
        for k, c in keyed.items()
        if not (c.attr in merged and (c is merged[c.attr][0] or c is merged[c.attr][1]))
    }
    for attr, (lo, hi) in merged.items():
        r = Range(attr, lo, hi)
        out[(attr, constraint_key(r))] = r
    return out


def constraint_key(c: Constraint):
    """A constraint's identity among a node's edges (equal keys ⇒ equal semantics)."""
    if c.op == "range":
        return ("range", kind(c.value[0]), *c.value)
    if c.op == "in":
        return ("in", frozenset(value_key(v) for v in c.value))
    if c.op == "exists":
        return ("exists", None)
    return (c.op, kind(c.value), value_key(c.value))


def sort_key(c: Constraint, rank: int):
    v = c.value
    return (rank, _OP_ORDER[c.op], repr(sorted(map(repr, v))) if c.op == "in" else repr(v))


# -- structure ---------------------------------------------------------------------------------


class Node:
    """A constraint in the graph; its counts are those of the edge that leads into it."""

    __slots__ = ("dests", "ends", "probes", "tests")

    def __init__(self) -> None:
        #: destination -> conjunctions that traverse the edge into this node (predicate counts)
        self.dests: dict[Hashable, int] = {}
        #: destination -> conjunctions that end at this node (None: none do)
        self.ends: dict[Hashable, int] | None = None
        #: next constrained attribute -> its tests (None: a leaf)
        self.tests: dict[str, Tests] | None = None
        #: the tests flattened for matching: (attr, probe code, table), rebuilt on change
        self.probes: tuple = ()


class Sorted:
    """Thresholds of one ordered operator and kind, sorted, with their nodes."""

    __slots__ = ("keys", "nodes")

    def __init__(self) -> None:
        self.keys: list = []
        self.nodes: list[Node] = []

    def insert(self, key, node: Node) -> None:
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.nodes.insert(i, node)

    def delete(self, key) -> None:
        i = bisect_left(self.keys, key)
        del self.keys[i]
        del self.nodes[i]


class Intervals:
    """Ranges of one kind sorted by lower bound: an event value's candidates are the ranges
    whose lower bound it passes (a bisection); each is then checked against its upper bound."""

    __slots__ = ("items", "los")

    def __init__(self) -> None:
        self.los: list = []
        self.items: list[tuple] = []  # (lo, lo_open, hi, hi_closed, node), parallel to los

    def insert(self, value: tuple, node: Node) -> None:
        lo = value[0]
        i = bisect_right(self.los, lo)
        self.los.insert(i, lo)
        self.items.insert(i, (*value, node))

    def delete(self, node: Node) -> None:
        for i, item in enumerate(self.items):
            if item[4] is node:
                del self.los[i]
                del self.items[i]
                return
        raise KeyError(node)


class Tests:
    """The edges from one node that test one attribute, indexed by operator."""

    __slots__ = (
        "by_key",
        "eq",
        "exists",
        "inn",
        "lt",
        "le",
        "gt",
        "ge",
        "ne",
        "plens",
        "prefix",
        "rng",
        "topic",
    )

    # Tables are created on first use: most nodes test one attribute with one operator, and the
    # graph holds a node per distinct constraint prefix.
    def __init__(self) -> None:
        self.by_key: dict = {}  # constraint key -> node (for add and remove)
        self.eq: dict | None = None  # value key -> node
        self.inn: dict | None = None  # value key -> [nodes]
        self.ne: dict | None = None  # kind -> {value key -> node}
        self.prefix: dict[str, Node] | None = None
        self.plens: dict[int, int] | None = None  # prefix length -> prefixes of that length
        self.lt: dict[str, Sorted] | None = None  # kind -> thresholds
        self.le: dict[str, Sorted] | None = None
        self.gt: dict[str, Sorted] | None = None
        self.ge: dict[str, Sorted] | None = None
        self.exists: Node | None = None
        self.rng: dict[str, Intervals] | None = None  # kind -> ranges by lower bound
        self.topic: TopicTree | None = None  # topic filters (ges.matching.topics)

    def add(self, ckey, c: Constraint) -> tuple[Node, bool]:
        """A node for a new constraint; True if that needed a new table (a new probe)."""
        node = self.by_key[ckey] = Node()
        op = c.op
        if op == "eq":
            new = self.eq is None
            if new:
                self.eq = {}
            self.eq[value_key(c.value)] = node
        elif op == "in":
            new = self.inn is None
            if new:
                self.inn = {}
            for k in ckey[1]:
                self.inn.setdefault(k, []).append(node)
        elif op == "ne":
            if self.ne is None:
                self.ne = {}
            new = ckey[1] not in self.ne
            self.ne.setdefault(ckey[1], {})[ckey[2]] = node
        elif op == "prefix":
            new = self.prefix is None
            if new:
                self.prefix, self.plens = {}, {}
            self.prefix[c.value] = node
            n = len(c.value)
            self.plens[n] = self.plens.get(n, 0) + 1
        elif op == "exists":
            new = True
            self.exists = node
        elif op == "topic":
            new = self.topic is None
            if new:
                self.topic = TopicTree()
            self.topic.add(c.value, node)
        elif op == "range":
            if self.rng is None:
                self.rng = {}
            s = self.rng.get(ckey[1])
            new = s is None
            if new:
                s = self.rng[ckey[1]] = Intervals()
            s.insert(c.value, node)
        else:
            table = getattr(self, op)
            if table is None:
                table = {}
                setattr(self, op, table)
            s = table.get(ckey[1])
            new = s is None
            if new:
                s = table[ckey[1]] = Sorted()
            s.insert(c.value, node)
        return node, new

    def drop(self, ckey, c: Constraint) -> None:
        """Remove a constraint's node; a table left empty goes back to None, so that the next
        ``add`` reports it as new and the owner rebuilds its probes (the caller always does
        after a drop)."""
        node = self.by_key.pop(ckey)
        op = c.op
        if op == "eq":
            del self.eq[value_key(c.value)]
            if not self.eq:
                self.eq = None
        elif op == "in":
            for k in ckey[1]:
                nodes = self.inn[k]
                nodes.remove(node)
                if not nodes:
                    del self.inn[k]
            if not self.inn:
                self.inn = None
        elif op == "ne":
            table = self.ne[ckey[1]]
            del table[ckey[2]]
            if not table:
                del self.ne[ckey[1]]
            if not self.ne:
                self.ne = None
        elif op == "prefix":
            del self.prefix[c.value]
            n = len(c.value)
            if self.plens[n] == 1:
                del self.plens[n]
            else:
                self.plens[n] -= 1
            if not self.prefix:
                self.prefix = self.plens = None
        elif op == "range":
            s = self.rng[ckey[1]]
            s.delete(node)
            if not s.los:
                del self.rng[ckey[1]]
            if not self.rng:
                self.rng = None
        elif op == "exists":
            self.exists = None
        elif op == "topic":
            self.topic.remove(c.value)
            if not self.topic:
                self.topic = None
        else:
            table = getattr(self, op)
            s = table[ckey[1]]
            s.delete(c.value)
            if not s.keys:
                del table[ckey[1]]
            if not table:
                setattr(self, op, None)

    def probes(self, attr: str) -> list[tuple]:
        """This attribute's non-empty tables as ``(attr, code, table)`` for the match loop."""
        out = []
        if self.eq:
            out.append((attr, EQ, self.eq))
        if self.inn:
            out.append((attr, IN, self.inn))
        for code, op in ((GT, "gt"), (GE, "ge"), (LT, "lt"), (LE, "le")):
            table = getattr(self, op)
            if table:
                for k, s in table.items():
                    out.append((attr, code + (k is STRING), s))
        if self.rng:
            for k, s in self.rng.items():
                out.append((attr, RANGE + (k is STRING), s))
        if self.prefix:
            out.append((attr, PREFIX, (self.prefix, self.plens)))
        if self.topic:
            out.append((attr, TOPIC, self.topic))
        if self.ne:
            for k, table in self.ne.items():
                out.append((attr, NE, (k, table)))
        if self.exists is not None:
            out.append((attr, EXISTS, self.exists))
        return out


# Probe codes; an ordered code + 1 is the same test on strings.
EQ, IN, GT, GE, LT, LE, PREFIX, NE, EXISTS, RANGE, TOPIC = 0, 1, 2, 4, 6, 8, 10, 11, 12, 13, 15


def node_probes(node: Node) -> tuple:
    """A node's tests flattened for the match loop (``Node.probes``), rebuilt on change."""
    if not node.tests:
        return ()
    return tuple(p for attr, tests in node.tests.items() for p in tests.probes(attr))


def describe_key(ckey) -> tuple:
    """(op, value) from a constraint key; ``in`` values as a frozenset (for ``edges()``)."""
    op = ckey[0]
    if op == "exists":
        return (op, None)
    if op == "in":
        return (op, frozenset(k[1] if isinstance(k, tuple) else k for k in ckey[1]))
    if op == "range":
        return (op, ckey[2:])
    value = ckey[2]
    return (op, value[1] if isinstance(value, tuple) else value)
