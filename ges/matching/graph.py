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

This module owns the graph: the attribute order, conjunctions written as paths, the counts along
them, and the walk. What one node holds — its edges indexed by operator, the keys they are found
by, and the probe codes the walk dispatches on — is ``ges.matching.edge_tables``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterator, Mapping

from ges.matching.edge_tables import (
    EQ,
    FALSE_KEY,
    GE,
    IN,
    LE,
    LT,
    NE,
    PREFIX,
    RANGE,
    TOPIC,
    TRUE_KEY,
    Eq,
    Node,
    Tests,
    constraint_key,
    describe_key,
    merge_ranges,
    node_probes,
    sort_key,
)
from ges.matching.model import TYPE_ATTR, Conjunction, Profile, kind

#: An ``in`` test is expanded into equality paths while a conjunction has at most this many.
IN_EXPANSION = 16


# -- the graph ---------------------------------------------------------------------------------


class ProfileGraph:
    """Profiles of many destinations, matched together (seed 004 §3.1).

    ``add(profile, destination)`` / ``remove(profile, destination)`` take a ``Profile`` or a single
    ``Conjunction``; ``match(attributes)`` returns the set of destinations with a matching profile.
    Adding the same profile twice for a destination counts twice; each ``remove`` undoes one add.
    """

    def __init__(self) -> None:
        self._root = Node()
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
        stack: list[tuple[tuple, Node]] = [((), self._root)]
        while stack:
            path, node = stack.pop()
            if path:
                yield path, dict(node.dests), dict(node.ends or {})
            for attr, tests in (node.tests or {}).items():
                for ckey, child in tests.by_key.items():
                    stack.append(((*path, (attr, *describe_key(ckey))), child))

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
                alternatives = [[*alt, Eq(c.attr, v)] for alt in alternatives for v in c.value]
            else:
                for alt in alternatives:
                    alt.append(c)
        out = {}
        for alt in alternatives:
            unique = {(c.attr, constraint_key(c)): c for c in alt}
            if len(unique) > 1:
                unique = merge_ranges(unique)
            ordered = sorted(unique.items(), key=lambda kc: sort_key(kc[1], rank[kc[0][0]]))
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
                        tests = node.tests[c.attr] = Tests()
                    child, new_table = tests.add(ckey, c)
                    if new_table:
                        node.probes = node_probes(node)
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
                parent.probes = node_probes(parent)
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
        found: list[Node] = []
        get = attributes.get
        while stack:
            # One loop with the operator dispatch inlined: this is the hot path.
            for attr, code, table in stack.pop().probes:
                v = get(attr)
                if v is None:
                    continue
                t = type(v)
                if code == EQ:
                    node = table.get((TRUE_KEY if v else FALSE_KEY) if t is bool else v)
                    if node is not None:
                        found.append(node)
                elif code >= RANGE:
                    if code == TOPIC:
                        if t is str:
                            table.match(v, found)
                    elif (code == RANGE and (t is int or t is float) and v == v) or (
                        code > RANGE and t is str
                    ):
                        for lo, lo_open, hi, hi_closed, node in table.items[
                            : bisect_right(table.los, v)
                        ]:
                            if (v < hi or (hi_closed and v == hi)) and not (lo_open and v == lo):
                                found.append(node)
                elif code < PREFIX:
                    if code == IN:
                        nodes = table.get((TRUE_KEY if v else FALSE_KEY) if t is bool else v)
                        if nodes:
                            found.extend(nodes)
                    elif (code & 1 and t is str) or (
                        not code & 1 and (t is int or t is float) and v == v
                    ):
                        # thresholds satisfied by v: a prefix (gt, ge) or suffix (lt, le)
                        if code < LT:
                            if code < GE:
                                found.extend(table.nodes[: bisect_left(table.keys, v)])
                            else:
                                found.extend(table.nodes[: bisect_right(table.keys, v)])
                        elif code < LE:
                            found.extend(table.nodes[bisect_right(table.keys, v) :])
                        else:
                            found.extend(table.nodes[bisect_left(table.keys, v) :])
                elif code == PREFIX:
                    if t is str:
                        prefixes, lengths = table
                        n = len(v)
                        for length in lengths:
                            if length <= n:
                                node = prefixes.get(v[:length])
                                if node is not None:
                                    found.append(node)
                elif code == NE:
                    ne_kind, nodes = table
                    if ne_kind is kind(v):
                        key = (TRUE_KEY if v else FALSE_KEY) if t is bool else v
                        for k, node in nodes.items():
                            if k != key:
                                found.append(node)
                else:  # EXISTS
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
