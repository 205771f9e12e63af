"""The profile graph: Gryphon's matching structure as GES uses it (seed 004 §3.1, after Aguilera et
al., "Matching events in a content-based subscription system", PODC 1999).

Attributes are kept in a global order (the order in which they first appear, with the event type
first). Every conjunction of a stored profile is written as its constraints in that order, and the
conjunctions share prefixes: each constraint is a node, two successive constraints of a
conjunction form an edge, and conjunctions with the same leading constraints share their nodes and
edges (seed 004 Figure 4). Along every edge the graph keeps the destinations interested in
traversing it and, per destination, the number of predicates (conjunctions) that want it: adding a
profile increments the counts along its paths, removing it decrements them, and a destination whose
count reaches zero is dropped, as is an edge nobody wants any more.

A node's outgoing edges are grouped by the next attribute they test. A conjunction that does not
constrain the attributes in between passes them on a *don't-care* edge; a run of don't-care edges
is not materialised — the edge from a node goes straight to the next constrained attribute — which
is Aguilera's tree with its chains of ``*`` edges collapsed.

Two refinements keep the walk short. A conjunction's lower and upper bound on one attribute
(``price >= 10 and price < 20``) form one *range* node, so an event inside the range is one hit
instead of a hop per bound. An ``in`` test with few values is stored as one equality path per
value (a conjunction containing a disjunction is a disjunction of conjunctions), so its remaining
constraints share the subtrees of the equality profiles on those values instead of growing a
subtree that every event with one of the values must walk too; long lists stay one hashed node.

Matching walks the graph from the root. At a node, each tested attribute the event carries is
looked up by operator: equality and ``in`` tests in hash tables (keyed by kind, so ``1`` never
meets ``True``), ordered tests in sorted threshold lists searched by bisection (every threshold
returned is satisfied), ranges in lists sorted by lower bound (a bisection yields those whose
lower bound holds, each then checked against its upper bound), prefixes by probing the event's
value at each stored prefix length, ``ne`` by scanning its (all but one satisfied) tests,
``exists`` directly. So the work of a match grows
with the constraints the event satisfies, not with the number of stored profiles. Along the way a
node whose destinations are all already matched is not entered: its edges can add nothing.

Destinations are opaque hashable ids: a subscription at a broker, or a sub-unit at a gatekeeper.
The graph is sans-I/O and knows nothing of XML.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterator, Mapping

from ges.matching.model import (
    STRING,
    TYPE_ATTR,
    Conjunction,
    Constraint,
    Profile,
    kind,
)

# -- keys --------------------------------------------------------------------------------------

# A value's hash key: strings and numbers are their own keys (1 and 1.0 are one key, which is the
# number semantics); booleans get singletons so they never meet 1 and 0.
_TRUE = ("bool", True)
_FALSE = ("bool", False)

#: The order of operators inside one attribute: the most selective first.
_OP_ORDER = {
    op: i
    for i, op in enumerate(("eq", "in", "prefix", "range", "lt", "le", "gt", "ge", "ne", "exists"))
}


#: An ``in`` test is expanded into equality paths while a conjunction has at most this many.
IN_EXPANSION = 16


def _key(value):
    t = type(value)
    if t is bool:
        return _TRUE if value else _FALSE
    return value


class _Range:
    """``lo <(=) attr <(=) hi``: a conjunction's lower and upper bound on one attribute, kept
    as one node so that an event inside the range is one hit instead of a hop per bound."""

    __slots__ = ("attr", "value")
    op = "range"

    def __init__(self, attr: str, lower: Constraint, upper: Constraint):
        self.attr = attr
        # (lo, lo_open, hi, hi_closed)
        self.value = (lower.value, lower.op == "gt", upper.value, upper.op == "le")


class _Eq:
    """One value of an expanded ``in`` test."""

    __slots__ = ("attr", "value")
    op = "eq"

    def __init__(self, attr: str, value):
        self.attr = attr
        self.value = value


def _merge_ranges(keyed: dict) -> dict:
    """Replace each attribute's single lower and single upper bound of one kind by a _Range
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
        r = _Range(attr, lo, hi)
        out[(attr, _ckey(r))] = r
    return out


def _ckey(c: Constraint):
    """A constraint's identity among a node's edges (equal keys ⇒ equal semantics)."""
    if c.op == "range":
        return ("range", kind(c.value[0]), *c.value)
    if c.op == "in":
        return ("in", frozenset(_key(v) for v in c.value))
    if c.op == "exists":
        return ("exists", None)
    return (c.op, kind(c.value), _key(c.value))


def _sort_key(c: Constraint, rank: int):
    v = c.value
    return (rank, _OP_ORDER[c.op], repr(sorted(map(repr, v))) if c.op == "in" else repr(v))


# -- structure ---------------------------------------------------------------------------------


class _Node:
    """A constraint in the graph; its counts are those of the edge that leads into it."""

    __slots__ = ("dests", "ends", "probes", "tests")

    def __init__(self) -> None:
        #: destination -> conjunctions that traverse the edge into this node (predicate counts)
        self.dests: dict[Hashable, int] = {}
        #: destination -> conjunctions that end at this node (None: none do)
        self.ends: dict[Hashable, int] | None = None
        #: next constrained attribute -> its tests (None: a leaf)
        self.tests: dict[str, _Tests] | None = None
        #: the tests flattened for matching: (attr, probe code, table), rebuilt on change
        self.probes: tuple = ()


class _Sorted:
    """Thresholds of one ordered operator and kind, sorted, with their nodes."""

    __slots__ = ("keys", "nodes")

    def __init__(self) -> None:
        self.keys: list = []
        self.nodes: list[_Node] = []

    def insert(self, key, node: _Node) -> None:
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.nodes.insert(i, node)

    def delete(self, key) -> None:
        i = bisect_left(self.keys, key)
        del self.keys[i]
        del self.nodes[i]


class _Intervals:
    """Ranges of one kind sorted by lower bound: an event value's candidates are the ranges
    whose lower bound it passes (a bisection); each is then checked against its upper bound."""

    __slots__ = ("items", "los")

    def __init__(self) -> None:
        self.los: list = []
        self.items: list[tuple] = []  # (lo, lo_open, hi, hi_closed, node), parallel to los

    def insert(self, value: tuple, node: _Node) -> None:
        lo = value[0]
        i = bisect_right(self.los, lo)
        self.los.insert(i, lo)
        self.items.insert(i, (*value, node))

    def delete(self, node: _Node) -> None:
        for i, item in enumerate(self.items):
            if item[4] is node:
                del self.los[i]
                del self.items[i]
                return
        raise KeyError(node)


class _Tests:
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
    )

    # Tables are created on first use: most nodes test one attribute with one operator, and the
    # graph holds a node per distinct constraint prefix.
    def __init__(self) -> None:
        self.by_key: dict = {}  # constraint key -> node (for add and remove)
        self.eq: dict | None = None  # value key -> node
        self.inn: dict | None = None  # value key -> [nodes]
        self.ne: dict | None = None  # kind -> {value key -> node}
        self.prefix: dict[str, _Node] | None = None
        self.plens: dict[int, int] | None = None  # prefix length -> prefixes of that length
        self.lt: dict[str, _Sorted] | None = None  # kind -> thresholds
        self.le: dict[str, _Sorted] | None = None
        self.gt: dict[str, _Sorted] | None = None
        self.ge: dict[str, _Sorted] | None = None
        self.exists: _Node | None = None
        self.rng: dict[str, _Intervals] | None = None  # kind -> ranges by lower bound

    def add(self, ckey, c: Constraint) -> tuple[_Node, bool]:
        """A node for a new constraint; True if that needed a new table (a new probe)."""
        node = self.by_key[ckey] = _Node()
        op = c.op
        if op == "eq":
            new = self.eq is None
            if new:
                self.eq = {}
            self.eq[_key(c.value)] = node
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
        elif op == "range":
            if self.rng is None:
                self.rng = {}
            s = self.rng.get(ckey[1])
            new = s is None
            if new:
                s = self.rng[ckey[1]] = _Intervals()
            s.insert(c.value, node)
        else:
            table = getattr(self, op)
            if table is None:
                table = {}
                setattr(self, op, table)
            s = table.get(ckey[1])
            new = s is None
            if new:
                s = table[ckey[1]] = _Sorted()
            s.insert(c.value, node)
        return node, new

    def drop(self, ckey, c: Constraint) -> None:
        """Remove a constraint's node; a table left empty goes back to None, so that the next
        ``add`` reports it as new and the owner rebuilds its probes (the caller always does
        after a drop)."""
        node = self.by_key.pop(ckey)
        op = c.op
        if op == "eq":
            del self.eq[_key(c.value)]
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
            out.append((attr, _EQ, self.eq))
        if self.inn:
            out.append((attr, _IN, self.inn))
        for code, op in ((_GT, "gt"), (_GE, "ge"), (_LT, "lt"), (_LE, "le")):
            table = getattr(self, op)
            if table:
                for k, s in table.items():
                    out.append((attr, code + (k is STRING), s))
        if self.rng:
            for k, s in self.rng.items():
                out.append((attr, _RANGE + (k is STRING), s))
        if self.prefix:
            out.append((attr, _PREFIX, (self.prefix, self.plens)))
        if self.ne:
            for k, table in self.ne.items():
                out.append((attr, _NE, (k, table)))
        if self.exists is not None:
            out.append((attr, _EXISTS, self.exists))
        return out


# Probe codes; an ordered code + 1 is the same test on strings.
_EQ, _IN, _GT, _GE, _LT, _LE, _PREFIX, _NE, _EXISTS, _RANGE = 0, 1, 2, 4, 6, 8, 10, 11, 12, 13


# -- the graph ---------------------------------------------------------------------------------


class ProfileGraph:
    """Profiles of many destinations, matched together (seed 004 §3.1).

    ``add(profile, destination)`` / ``remove(profile, destination)`` take a ``Profile`` or a single
    ``Conjunction``; ``match(attributes)`` returns the set of destinations with a matching profile.
    Adding the same profile twice for a destination counts twice; each ``remove`` undoes one add.
    """

    def __init__(self) -> None:
        self._root = _Node()
        self._rank: dict[str, int] = {TYPE_ATTR: -1}
        self._uses: dict[str, int] = {}
        self._next_rank = 0
        self._nodes = 1
        #: destination -> stored conjunctions (all paths of all its profiles)
        self._dests: dict[Hashable, int] = {}
        #: (destination, conjunction as its path or set of paths) -> times stored: what remove
        #: checks, so that only what was added can be removed
        self._stored: dict[tuple, int] = {}

    # -- inspection -------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Stored conjunctions, counted with multiplicity."""
        return sum(self._dests.values())

    def __bool__(self) -> bool:
        return bool(self._dests)

    @property
    def destinations(self) -> Mapping[Hashable, int]:
        """Destination → number of stored conjunctions (predicates) it has."""
        return self._dests

    @property
    def node_count(self) -> int:
        return self._nodes

    def edges(self) -> Iterator[tuple[tuple[tuple, ...], dict, dict]]:
        """Every node: (path of (attr, op, value) from the root, edge dests, ending dests)."""
        stack: list[tuple[tuple, _Node]] = [((), self._root)]
        while stack:
            path, node = stack.pop()
            if path:
                yield path, dict(node.dests), dict(node.ends or {})
            for attr, tests in (node.tests or {}).items():
                for ckey, child in tests.by_key.items():
                    stack.append(((*path, (attr, *_describe(ckey))), child))

    # -- changes ----------------------------------------------------------------------------------

    def add(self, profile: Profile | Conjunction, destination: Hashable) -> None:
        for conj in _conjunctions(profile):
            self._add(conj, destination)

    def remove(self, profile: Profile | Conjunction, destination: Hashable) -> None:
        """Undo one ``add``; raises KeyError (changing nothing) if it was never added."""
        conjs = _conjunctions(profile)
        # verify first, so a bad remove leaves the graph untouched: every path of every
        # conjunction must be stored for this destination as often as the profile needs it
        stored = self._stored
        need: dict = {}
        for conj in conjs:
            orderings = self._orderings(conj, create=False)
            key = (destination, _conj_key(orderings) if orderings is not None else None)
            need[key] = need.get(key, 0) + 1
            if stored.get(key, 0) < need[key]:
                raise KeyError(f"{destination!r} has no stored {conj}")
        for conj in conjs:
            self._remove(conj, destination)

    def clear(self) -> None:
        self.__init__()

    def _orderings(self, conj: Conjunction, *, create: bool) -> dict[tuple, list] | None:
        """The conjunction's paths: {path key: [(constraint key, constraint)]} in global order.

        An ``in`` test whose alternatives are few is written as one equality path per value
        (the conjunction with a disjunction inside is the disjunction of conjunctions), so its
        remaining constraints share the subtrees of the equality profiles on the same values
        instead of growing a subtree of their own that every matching event must also walk.
        """
        rank = self._rank
        for c in conj.constraints:
            if c.attr not in rank:
                if not create:
                    return None
                rank[c.attr] = self._next_rank
                self._next_rank += 1
        alternatives: list[list] = [[]]
        for c in conj.constraints:
            if c.op == "in" and len(alternatives) * len(c.value) <= IN_EXPANSION:
                alternatives = [[*alt, _Eq(c.attr, v)] for alt in alternatives for v in c.value]
            else:
                for alt in alternatives:
                    alt.append(c)
        out = {}
        for alt in alternatives:
            unique = {(c.attr, _ckey(c)): c for c in alt}
            if len(unique) > 1:
                unique = _merge_ranges(unique)
            ordered = sorted(unique.items(), key=lambda kc: _sort_key(kc[1], rank[kc[0][0]]))
            out.setdefault(tuple(k for k, _ in ordered), [(k[1], c) for k, c in ordered])
        return out

    def _paths(self, orderings: dict, *, create: bool):
        """Per ordering, [(tests, ckey, node, constraint)] along its path (None if absent)."""
        paths = []
        for ordered in orderings.values():
            node = self._root
            path = []
            for ckey, c in ordered:
                tests = node.tests.get(c.attr) if node.tests is not None else None
                child = tests.by_key.get(ckey) if tests is not None else None
                if child is None:
                    if not create:
                        return None
                    if tests is None:
                        if node.tests is None:
                            node.tests = {}
                        tests = node.tests[c.attr] = _Tests()
                    child, new_table = tests.add(ckey, c)
                    if new_table:
                        node.probes = _probes(node)
                    self._nodes += 1
                path.append((tests, ckey, child, c))
                node = child
            paths.append(path)
        return paths

    def _add(self, conj: Conjunction, dest: Hashable) -> None:
        orderings = self._orderings(conj, create=True)
        key = (dest, _conj_key(orderings))
        self._stored[key] = self._stored.get(key, 0) + 1
        for path in self._paths(orderings, create=True):
            for _, _, node, _ in path:
                node.dests[dest] = node.dests.get(dest, 0) + 1
            last = path[-1][2] if path else self._root
            if last.ends is None:
                last.ends = {}
            last.ends[dest] = last.ends.get(dest, 0) + 1
            self._root.dests[dest] = self._root.dests.get(dest, 0) + 1
        self._dests[dest] = self._dests.get(dest, 0) + 1
        for attr in {c.attr for c in conj.constraints}:
            self._uses[attr] = self._uses.get(attr, 0) + 1

    def _remove(self, conj: Conjunction, dest: Hashable) -> None:
        orderings = self._orderings(conj, create=False)
        _decrement(self._stored, (dest, _conj_key(orderings)))
        for path in self._paths(orderings, create=False):
            last = path[-1][2] if path else self._root
            _decrement(last.ends, dest)
            if not last.ends:
                last.ends = None
            _decrement(self._root.dests, dest)
            nodes = [node for _, _, node, _ in path]
            parents = [self._root, *nodes][: len(nodes)]
            for node in nodes:
                _decrement(node.dests, dest)
            # prune nodes nobody traverses any more, deepest first
            for (tests, ckey, node, c), parent in zip(
                reversed(path), reversed(parents), strict=True
            ):
                if node.dests:
                    break
                tests.drop(ckey, c)
                self._nodes -= 1
                if not tests.by_key:
                    del parent.tests[c.attr]
                    if not parent.tests:
                        parent.tests = None
                parent.probes = _probes(parent)
        _decrement(self._dests, dest)
        for attr in {c.attr for c in conj.constraints}:
            if self._uses[attr] == 1:
                del self._uses[attr]
                if attr != TYPE_ATTR:
                    del self._rank[attr]
            else:
                self._uses[attr] -= 1

    # -- matching ---------------------------------------------------------------------------------

    def match(self, attributes: Mapping) -> set:
        """The destinations with a profile the event's attributes satisfy."""
        root = self._root
        result = set(root.ends) if root.ends else set()
        if not root.probes:
            return result
        stack = [root]
        found: list[_Node] = []
        get = attributes.get
        while stack:
            # One loop with the operator dispatch inlined: this is the hot path.
            for attr, code, table in stack.pop().probes:
                v = get(attr)
                if v is None:
                    continue
                t = type(v)
                if code == _EQ:
                    node = table.get((_TRUE if v else _FALSE) if t is bool else v)
                    if node is not None:
                        found.append(node)
                elif code >= _RANGE:
                    if (code == _RANGE and (t is int or t is float) and v == v) or (
                        code > _RANGE and t is str
                    ):
                        for lo, lo_open, hi, hi_closed, node in table.items[
                            : bisect_right(table.los, v)
                        ]:
                            if (v < hi or (hi_closed and v == hi)) and not (lo_open and v == lo):
                                found.append(node)
                elif code < _PREFIX:
                    if code == _IN:
                        nodes = table.get((_TRUE if v else _FALSE) if t is bool else v)
                        if nodes:
                            found.extend(nodes)
                    elif (code & 1 and t is str) or (
                        not code & 1 and (t is int or t is float) and v == v
                    ):
                        # thresholds satisfied by v: a prefix (gt, ge) or suffix (lt, le)
                        if code < _LT:
                            if code < _GE:
                                found.extend(table.nodes[: bisect_left(table.keys, v)])
                            else:
                                found.extend(table.nodes[: bisect_right(table.keys, v)])
                        elif code < _LE:
                            found.extend(table.nodes[bisect_right(table.keys, v) :])
                        else:
                            found.extend(table.nodes[bisect_left(table.keys, v) :])
                elif code == _PREFIX:
                    if t is str:
                        prefixes, lengths = table
                        n = len(v)
                        for length in lengths:
                            if length <= n:
                                node = prefixes.get(v[:length])
                                if node is not None:
                                    found.append(node)
                elif code == _NE:
                    ne_kind, nodes = table
                    if ne_kind is kind(v):
                        key = (_TRUE if v else _FALSE) if t is bool else v
                        for k, node in nodes.items():
                            if k != key:
                                found.append(node)
                else:  # _EXISTS
                    found.append(table)
            if found:
                for child in found:
                    if child.ends:
                        result.update(child.ends)
                    if child.probes:
                        # enter only if something below is not matched yet (seed 004: the
                        # destinations along an edge); the length test keeps that cheap
                        dests = child.dests
                        if len(dests) > len(result) or not dests.keys() <= result:
                            stack.append(child)
                found.clear()
        return result


def _probes(node: _Node) -> tuple:
    if not node.tests:
        return ()
    return tuple(p for attr, tests in node.tests.items() for p in tests.probes(attr))


def _conj_key(orderings: dict):
    """A stored conjunction's identity: its path, or the set of its paths (an expanded ``in``)."""
    if len(orderings) == 1:
        return next(iter(orderings))
    return frozenset(orderings)


def _decrement(counts: dict, key) -> None:
    n = counts[key]
    if n == 1:
        del counts[key]
    else:
        counts[key] = n - 1


def _conjunctions(profile: Profile | Conjunction) -> tuple[Conjunction, ...]:
    if isinstance(profile, Conjunction):
        return (profile,)
    if isinstance(profile, Profile):
        return profile.effective
    raise TypeError(f"expected a Profile or Conjunction, not {type(profile).__name__}")


def _describe(ckey) -> tuple:
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
