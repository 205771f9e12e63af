"""MQTT topic filters as a profile operator: ``@topic topic 'sensors/+/temp'``.

Theory of operation
-------------------
An MQTT topic is a string of *levels* separated by ``/``; a topic *filter* is one whose levels
may be ``+`` (any one level) or, as its last level, ``#`` (any number of levels, none
included: ``a/#`` matches ``a`` too). A filter whose first level is a wildcard matches no topic
whose first level starts with ``$`` (MQTT 3.1.1 §4.7, 5.0 §4.7.2). GES carries a PUBLISH's
topic as the reserved attribute :data:`ges.matching.model.TOPIC_ATTR`, and the ``topic``
operator tests it against a filter, so that an MQTT subscription is one constraint the matcher,
covering and content routing handle like any other (not a scan of every filter per event).

Here are the operator's semantics on any string (:func:`matches`), what covering needs — the
intersection of two filters, itself a filter (:func:`intersect`), and topics that lie inside a
filter but outside another (:func:`candidates`) — and :class:`TopicTree`, the index the profile
graph keeps for the filters on one node: a tree of levels walked by the topic's levels, so an
event's cost grows with its topic's depth and the wildcards that match it, not with the number
of filters (the shape of mosquitto's subscription tree).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

SEPARATOR = "/"
ONE, MANY = "+", "#"
#: Levels of a topic filter: covering two filters costs the square of their depth.
MAX_LEVELS = 128


def check_filter(text: str) -> str | None:
    """Why ``text`` is not a topic filter (None: it is one)."""
    if not text:
        return "a topic filter must not be empty"
    if "\x00" in text:
        return "a topic filter must not hold U+0000"
    levels = text.split(SEPARATOR)
    if len(levels) > MAX_LEVELS:
        return f"a topic filter of over {MAX_LEVELS} levels"
    for i, level in enumerate(levels):
        if level in (ONE, MANY):
            if level == MANY and i != len(levels) - 1:
                return f"'#' must be the last level of a topic filter, not in {text!r}"
        elif ONE in level or MANY in level:
            return f"'+' and '#' must fill a whole level of a topic filter, not in {text!r}"
    return None


def check_topic(text: str) -> str | None:
    """Why ``text`` is not a topic a client may publish to (None: it is one)."""
    if not text:
        return "a topic must not be empty"
    if "\x00" in text:
        return "a topic must not hold U+0000"
    if ONE in text or MANY in text:
        return f"a topic must not hold wildcards: {text!r}"
    return None


def matches(topic_filter: str, topic: str) -> bool:
    """Does ``topic`` (any string) match ``topic_filter`` (a valid filter)?"""
    return levels_match(topic_filter.split(SEPARATOR), topic.split(SEPARATOR))


def levels_match(f: list[str], t: list[str]) -> bool:
    if f[0] in (ONE, MANY) and t[0].startswith("$"):
        return False
    n = len(t)
    for i, level in enumerate(f):
        if level == MANY:
            return True
        if i >= n or (level != ONE and level != t[i]):
            return False
    return n == len(f)


def intersect(a: str, b: str) -> str | None:
    """The filter matching exactly the topics both ``a`` and ``b`` match (None: there are none)."""
    fa, fb = a.split(SEPARATOR), b.split(SEPARATOR)
    for x, y in ((fa[0], fb[0]), (fb[0], fa[0])):
        if x in (ONE, MANY) and y not in (ONE, MANY) and y.startswith("$"):
            return None
    out: list[str] = []
    i = 0
    while True:
        x = fa[i] if i < len(fa) else None
        y = fb[i] if i < len(fb) else None
        if x == MANY:
            out += fb[i:]
            break
        if y == MANY:
            out += fa[i:]
            break
        if x is None or y is None:
            if x is not None or y is not None:
                return None  # one wants more levels, the other none
            break
        if x == ONE:
            out.append(y)
        elif y == ONE or x == y:
            out.append(x)
        else:
            return None
        i += 1
    return SEPARATOR.join(out)


def candidates(within: str | None, escape: str | None, variants: int) -> Iterator[str]:
    """Topics in ``within`` (None: any string) that lie outside ``escape`` if any does.

    Complete for covering (ges.matching.covering): if some string matches ``within`` and not
    ``escape`` and is none of ``variants - 1`` excluded strings, one of these is such a string.
    A topic outside ``escape`` stays outside when each level a wildcard of ``within`` filled is
    replaced by a fresh level (no literal of ``escape``), and when ``#`` filled more levels than
    ``escape`` has, by one more than it has; ``variants`` fresh names give that many distinct
    topics of each shape, so excluded strings cannot hide all of them."""
    esc = escape.split(SEPARATOR) if escape is not None else []
    literals = set(esc)
    fresh: list[str] = []
    j = 0
    while len(fresh) < max(variants, 1):
        name = f"w{j}"
        if name not in literals:
            fresh.append(name)
        j += 1
    depth = len(esc) + 1
    if within is None:  # any string: topics of every length up to depth, and $-topics
        for k in range(1, depth + 1):
            for name in fresh:
                yield SEPARATOR.join([name] * k)
                yield SEPARATOR.join(["$" + name] + [name] * (k - 1))
        return
    f = within.split(SEPARATOR)
    shapes = [f]
    if f[-1] == MANY:
        base = f[:-1]
        shapes = [base + [ONE] * k for k in range(0 if base else 1, depth + 1)]
    for shape in shapes:
        for name in fresh:
            yield SEPARATOR.join(name if level == ONE else level for level in shape)
            if ONE not in shape:
                break  # one topic only: the variants would be the same


#: What topic filter trees matched is remembered for topics of at most MATCHED_CHARS
#: characters, as many as make MATCHED topics and values together in the whole process (every
#: tree's together): about 2 MiB for ASCII topics, 10 MiB at the most (a topic of 256
#: characters of 4 bytes with its key, or a reference to a value a tree holds anyway).
MATCHED_CHARS = 256
MATCHED = 8192
#: the trees that remember what topics matched (weakly: a tree let go goes, its count with
#: it at the next forgetting), and how many topics and values they hold
_remembering: weakref.WeakSet[TopicTree] = weakref.WeakSet()
_matched_size = 0


def _forget_matched() -> None:
    """Every tree forgets what topics matched (the bound was reached)."""
    global _matched_size
    for tree in _remembering:
        tree._matched.clear()
        tree._matched_size = 0
    _remembering.clear()
    _matched_size = 0


class _Levels:
    """A tree of levels, each node holding a value where a string of levels ends."""

    __slots__ = ("_root", "_size")

    def __init__(self) -> None:
        self._root = _Level()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @staticmethod
    def _prune(path: list, levels: list[str]) -> None:
        """Let go of the levels left with nothing below them (``path[i]`` is reached by
        ``levels[i - 1]``)."""
        for i in range(len(path) - 1, 0, -1):
            node = path[i]
            if node.end is not None or node.many is not None or node.children:
                break
            del path[i - 1].children[levels[i - 1]]


class TopicTree(_Levels):
    """Filters indexed by their levels, each with a value (the graph's node); ``match`` finds
    the values of the filters a topic matches. What short topics matched is remembered until
    the filters change (a topic published again and again is matched once; see MATCHED)."""

    __slots__ = ("_matched", "_matched_size", "_remember", "__weakref__")

    def __init__(self, remember: bool = True) -> None:
        super().__init__()
        #: topic -> the values it matched, and how many topics and values that is (a tree
        #: matched once and let go need not remember)
        self._matched: dict[str, tuple] = {}
        self._matched_size = 0
        self._remember = remember

    def _forget(self) -> None:
        global _matched_size
        if self._matched:
            _matched_size -= self._matched_size
            self._matched.clear()
            self._matched_size = 0
            _remembering.discard(self)

    def add(self, topic_filter: str, value) -> None:
        self._forget()
        node = self._root
        levels = topic_filter.split(SEPARATOR)
        for level in levels[:-1]:
            node = node.child(level)
        last = levels[-1]
        if last == MANY:
            node.many = value
        else:
            node.child(last).end = value
        self._size += 1

    def remove(self, topic_filter: str) -> None:
        self._forget()
        path = [self._root]
        levels = topic_filter.split(SEPARATOR)
        for level in levels[:-1]:
            path.append(path[-1].children[level])
        last = levels[-1]
        if last == MANY:
            path[-1].many = None
        else:
            node = path[-1].children[last]
            node.end = None
            path.append(node)
        self._size -= 1
        self._prune(path, levels)

    def match(self, topic: str, out: list) -> None:
        """Append to ``out`` the value of every filter ``topic`` matches."""
        global _matched_size
        matched = self._matched.get(topic)
        if matched is None:
            found: list = []
            self._match(topic, found)
            matched = tuple(found)
            if self._remember and len(topic) <= MATCHED_CHARS:
                size = 1 + len(matched)
                if _matched_size + size > MATCHED:
                    _forget_matched()  # (a new set of topics: made again as they come)
                if size <= MATCHED:
                    _remembering.add(self)
                    self._matched[topic] = matched
                    self._matched_size += size
                    _matched_size += size
        out.extend(matched)

    def _match(self, topic: str, out: list) -> None:
        t = topic.split(SEPARATOR)
        n = len(t)
        root = self._root
        stack = [(0, root)]
        dollar = t[0].startswith("$")
        while stack:
            i, node = stack.pop()
            if node.many is not None and not (dollar and node is root):
                out.append(node.many)
            if i == n:
                if node.end is not None:
                    out.append(node.end)
                continue
            children = node.children
            if not children:
                continue
            child = children.get(t[i])
            if child is not None:
                stack.append((i + 1, child))
            child = children.get(ONE)
            if child is not None and not (dollar and node is root):
                stack.append((i + 1, child))


class _Level:
    __slots__ = ("children", "end", "many")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = {}
        self.end = None  # the value of the filter ending at this level
        self.many = None  # the value of the filter ending with '#' below this level

    def child(self, level: str) -> _Level:
        node = self.children.get(level)
        if node is None:
            node = self.children[level] = _Level()
        return node


class TopicIndex(_Levels):
    """Topics (not filters) indexed by their levels, each with a value; ``find`` walks a
    filter's levels down the index, so its cost grows with the topics it matches (and the
    levels its wildcards pass), not with every topic held — the retained messages' index."""

    __slots__ = ()

    def get(self, topic: str):
        node = self._root
        for level in topic.split(SEPARATOR):
            node = node.children.get(level)
            if node is None:
                return None
        return node.end

    def set(self, topic: str, value) -> None:
        node = self._root
        for level in topic.split(SEPARATOR):
            node = node.child(level)
        if node.end is None:
            self._size += 1
        node.end = value

    def pop(self, topic: str):
        path = [self._root]
        levels = topic.split(SEPARATOR)
        for level in levels:
            node = path[-1].children.get(level)
            if node is None:
                return None
            path.append(node)
        value, path[-1].end = path[-1].end, None
        if value is not None:
            self._size -= 1
        self._prune(path, levels)
        return value

    def find(self, topic_filter: str, budget: list[int] | None = None, pause: int = 0) -> Iterator:
        """The values of the topics ``topic_filter`` (a valid filter) matches, depth first;
        ``budget``: ``[levels]`` the walk may visit, counted down (it stops at 0). ``pause``:
        it also yields None each time about that many levels were visited, so that a caller
        can do a long walk in pieces (one that matches little yields nothing else).

        The walk keeps, per level it is in, the list of nodes it has still to visit there
        (their parent's children as it found them), one at a time: a node of 100,000 children
        is walked in pieces too. The index may change between pieces: a node added since is
        not seen, one removed is (its value gone: nothing)."""
        f = topic_filter.split(SEPARATOR)
        n = len(f)
        root = self._root
        stack: list[list] = [[0, [root], 0]]  # [level of f (-1: below a '#'), nodes, next]
        if budget is None:
            budget = [1 << 62]
        due = budget[0] - pause if pause else -(1 << 62)
        while stack:
            top = stack[-1]
            i, nodes, at = top
            if at == len(nodes):
                stack.pop()
                continue
            top[2] = at + 1
            node = nodes[at]
            budget[0] -= 1
            if budget[0] < 0:
                return
            if budget[0] <= due:
                yield None
                due = budget[0] - pause
            if i < 0:  # below a '#': every topic
                if node.end is not None:
                    yield node.end
                if node.children:
                    stack.append([-1, list(node.children.values()), 0])
                continue
            if i == n:
                if node.end is not None:
                    yield node.end
                continue
            level = f[i]
            if level in (MANY, ONE):
                if level == MANY and i and node.end is not None:  # 'a/#' matches 'a'
                    yield node.end
                budget[0] -= len(node.children)
                if budget[0] < 0:
                    return
                if node is root:  # '$' topics are not matched by wildcards there
                    children = [c for k, c in node.children.items() if not k.startswith("$")]
                else:
                    children = list(node.children.values())
                if children:
                    stack.append([-1 if level == MANY else i + 1, children, 0])
            else:
                child = node.children.get(level)
                if child is not None:
                    stack.append([i + 1, [child], 0])
