"""The values of the connectivity protocol: graph nodes, link reports, edges, updates.

Seed 004 §2 (the connectivity graph): "The nodes within the connectivity graph are organized as
nodes at various levels" — the vertex's own cluster's brokers are level-0 nodes, the other clusters
of its super-cluster level-1 nodes, the other super-clusters of its super-super-cluster level-2
nodes, and so on. :func:`express` is that rule as a pure function of the vertex's unit path.

Connection information travels as :class:`LinkReport` values. A report always names both
endpoints with their *full* unit paths, and every receiver re-expresses the link in its own
terms. The paper instead rewrites the connection in transit: "Depending on the kind of link this
information is being sent over, the information contained in the connection is modified" (node 5 –
SC-2 becomes cluster c – SC-2 at gatekeeper 4). Both give the same graph, because the paper's
rewritten form at any receiver is exactly the child of lcu(receiver, endpoint) that holds the
endpoint, which is what :func:`express` computes. Carrying full paths is more robust: a report
that reaches a broker by an unexpected route (a detour after a failure, a re-sync from a neighbour
in another unit, a duplicate) still means the same thing, no gatekeeper has to rewrite anything
correctly, and the visibility constraint can be checked by any broker on any report.

Everything here is a frozen value.
"""

from __future__ import annotations

import functools

import attrs

from ges.topology import UnitPath, broker_order_key, unit_name

LinkKey = tuple[str, str]


class ConnectivityError(ValueError):
    """A report that this graph cannot accept: wrong depth, or outside its dissemination scope.

    A peer that sends one has broken the dissemination constraint (seed 004 §2: connection
    information is disseminated only within the lowest unit containing both endpoints).
    """


def shared_prefix(a: UnitPath, b: UnitPath) -> int:
    """How many leading unit names two unit paths share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


#: Sort keys of node paths, shared by every graph in the process: a broker's graph has at most a
#: few hundred distinct nodes, a simulator with hundreds of graphs a few thousand distinct paths.
_SORT_KEY_CACHE = 65536


@functools.lru_cache(maxsize=_SORT_KEY_CACHE)
def _natural_path(path: tuple[str, ...]) -> tuple:
    return tuple(broker_order_key(p) for p in path)


@attrs.frozen(cache_hash=True, repr=False, order=False)
class GraphNode:
    """A node of a connectivity graph (seed 004 §2: "a graph node k at level ℓ").

    A level-0 node is a broker of the vertex's own cluster; its ``path`` is the cluster path plus
    the broker id. A level-ℓ node (ℓ ≥ 1) is a unit; its ``path`` is the unit path. ``str`` gives
    the short name the paper uses in its figures ("5", "c", "SC-2"); ``full`` the whole path.
    """

    level: int = attrs.field(validator=attrs.validators.ge(0))
    path: tuple[str, ...] = attrs.field(converter=tuple)
    #: Natural order (level, then path with ``b2`` < ``b10``); used for canonical pairs and
    #: deterministic tie-breaks. Not part of equality.
    sort_key: tuple = attrs.field(init=False, eq=False, repr=False)

    @path.validator
    def _check_path(self, _attribute, value) -> None:
        if not value or not all(isinstance(p, str) and p for p in value):
            raise ValueError(f"graph node path must be non-empty names, got {value!r}")

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "sort_key", (self.level, _natural_path(self.path)))

    @property
    def broker(self) -> str | None:
        """The broker id of a level-0 node, else None."""
        return self.path[-1] if self.level == 0 else None

    @property
    def full(self) -> str:
        return unit_name(self.path)

    def __str__(self) -> str:
        return self.path[-1]

    def __repr__(self) -> str:
        return f"GraphNode({self.level}, {self.full!r})"


def express(vertex_unit: UnitPath, broker_id: str, broker_unit: UnitPath) -> GraphNode:
    """How the vertex in ``vertex_unit`` sees broker ``broker_id`` (seed 004 §2, Figure 3).

    A broker of the vertex's own cluster is a level-0 node; any other broker is seen as the child
    of lcu(vertex, broker) that contains it, a unit one level below that lowest common unit.
    """
    depth = len(vertex_unit)
    if len(broker_unit) != depth:
        raise ConnectivityError(
            f"broker {broker_id} at {unit_name(broker_unit)} has depth {len(broker_unit)}, "
            f"expected {depth}"
        )
    k = shared_prefix(vertex_unit, broker_unit)
    if k == depth:
        return GraphNode(0, (*broker_unit, broker_id))
    return GraphNode(depth - k, broker_unit[: k + 1])


def express_unit(vertex_unit: UnitPath, unit: UnitPath) -> GraphNode | None:
    """How the vertex sees a unit: None if the unit contains the vertex, else the graph node."""
    k = shared_prefix(vertex_unit, unit)
    if k == len(unit):
        return None
    return GraphNode(len(vertex_unit) - k, unit[: k + 1])


def _unit_path(value) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.strip("/").split("/"))
    return tuple(value)


def _version(value) -> tuple[int, int]:
    return tuple(value)  # type: ignore[return-value]


def _cost(value) -> float | None:
    return None if value is None else float(value)


@attrs.frozen
class LinkReport:
    """One endpoint's observation of one link: the unit of connection information.

    ``a`` < ``b`` in natural broker order; ``a_unit``/``b_unit`` are their full unit paths.
    ``reporter`` is the endpoint that observed the link; ``version`` = (incarnation, seq) orders
    that reporter's reports (a restarted broker must use a higher incarnation). ``cost`` is the
    link's cost override, or None to use the link cost matrix.
    """

    a: str
    b: str
    a_unit: UnitPath = attrs.field(converter=_unit_path)
    b_unit: UnitPath = attrs.field(converter=_unit_path)
    cost: float | None = attrs.field(converter=_cost)
    reporter: str
    version: tuple[int, int] = attrs.field(converter=_version)
    up: bool

    def __attrs_post_init__(self) -> None:
        if self.a == self.b:
            raise ValueError(f"link report: self-link {self.a}")
        if broker_order_key(self.a) > broker_order_key(self.b):
            raise ValueError(f"link report: endpoints out of order ({self.a}, {self.b})")
        if self.reporter not in (self.a, self.b):
            raise ValueError(f"link report: reporter {self.reporter} is not an endpoint")
        if not self.a_unit or len(self.a_unit) != len(self.b_unit):
            raise ValueError(
                f"link report: unit paths {unit_name(self.a_unit)} and {unit_name(self.b_unit)} "
                "must be non-empty and of the same depth"
            )
        if len(self.version) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in self.version
        ):
            raise ValueError(f"link report: version must be (incarnation, seq), got {self.version}")
        if self.cost is not None and not self.cost > 0:
            raise ValueError(f"link report: cost must be positive, got {self.cost}")

    @classmethod
    def observe(
        cls,
        reporter: str,
        reporter_unit: UnitPath,
        peer: str,
        peer_unit: UnitPath,
        *,
        up: bool,
        version: tuple[int, int],
        cost: float | None = None,
    ) -> LinkReport:
        """The report ``reporter`` makes about its link to ``peer`` (orders the endpoints)."""
        if broker_order_key(reporter) <= broker_order_key(peer):
            a, a_unit, b, b_unit = reporter, reporter_unit, peer, peer_unit
        else:
            a, a_unit, b, b_unit = peer, peer_unit, reporter, reporter_unit
        return cls(a, b, a_unit, b_unit, cost, reporter, version, up)

    @property
    def key(self) -> LinkKey:
        return (self.a, self.b)

    @functools.cached_property
    def lcu(self) -> UnitPath:
        """The lowest common unit of the endpoints: the scope the report may travel in."""
        return self.a_unit[: shared_prefix(self.a_unit, self.b_unit)]

    @property
    def level(self) -> int:
        """The link level: ℓ when the endpoints' lowest common unit is level ℓ+1."""
        return len(self.a_unit) - len(self.lcu)


def visible_to(report: LinkReport, receiver_unit: UnitPath) -> bool:
    """The dissemination constraint: a report reaches only brokers inside lcu(a, b).

    Seed 004 §2: "the super cluster connection (SC-1,SC-2) information is disseminated only within
    the super-super-cluster SSC-A".
    """
    if len(receiver_unit) != len(report.a_unit):
        return False
    return tuple(receiver_unit[: len(report.lcu)]) == report.lcu


@attrs.frozen
class Edge:
    """A live edge of a connectivity graph as the vertex sees it.

    ``links`` are the live underlying broker links (the link count is their number, seed 004 §2:
    the count is "incremented by one every time a new connection is established between two units
    that were already connected"). Traversal cost is directional: ``cost_u`` from ``u`` to ``w``,
    ``cost_w`` back; each is the minimum over the live links. Suspicion does not hide an edge.
    """

    u: GraphNode
    w: GraphNode
    level: int
    links: tuple[LinkKey, ...]
    cost_u: float
    cost_w: float

    @property
    def count(self) -> int:
        return len(self.links)

    @property
    def pair(self) -> tuple[GraphNode, GraphNode]:
        return (self.u, self.w)

    def cost_from(self, node: GraphNode) -> float:
        if node == self.u:
            return self.cost_u
        if node == self.w:
            return self.cost_w
        raise ValueError(f"{node!r} is not an end of edge {self.u}—{self.w}")

    def __str__(self) -> str:
        return f"{self.u}—{self.w}"


@attrs.frozen
class Gateway:
    """A level-ℓ gateway out of the vertex's level-ℓ unit, as the vertex sees it.

    ``inner`` is the gatekeeper's end inside C(vertex, ℓ) (a broker node when it is in the
    vertex's own cluster, else the unit holding it), ``outer`` the unit on the other side.
    """

    level: int
    inner: GraphNode
    outer: GraphNode
    links: tuple[LinkKey, ...]

    @property
    def count(self) -> int:
        return len(self.links)

    def __str__(self) -> str:
        return f"{self.inner}—{self.outer}"


@attrs.frozen
class Partition:
    """The last live link of an edge went down (seed 004 §2: the link count "plays an important
    role in determining if a connection loss would lead to partitions").

    ``unreachable`` are the nodes the vertex could reach before and cannot now; empty when a
    detour exists.
    """

    pair: tuple[GraphNode, GraphNode]
    unreachable: frozenset[GraphNode]


@attrs.frozen
class Healed:
    """An edge that had lost all its links has a live link again; ``reachable`` became reachable."""

    pair: tuple[GraphNode, GraphNode]
    reachable: frozenset[GraphNode]


@attrs.frozen
class Update:
    """What one report did to a graph.

    ``new``: the report was newer than what the graph held from that reporter for that link, so
    the caller should pass it on (to neighbours it is visible to). ``changed``: the graph's live
    edges or costs changed, so routes may have changed.
    """

    new: bool
    changed: bool = False
    partitions: tuple[Partition, ...] = ()
    healed: tuple[Healed, ...] = ()


STALE = Update(new=False)
