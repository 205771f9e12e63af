"""VT vectors (seed 000 §3–5): leaf clocks, the V_m a pubend stamps, and their digests.

Theory of operation
-------------------
**Gryphon's tree on GES units.** Seed 000 §2 routes over a redundant tree whose nodes hold one
or more brokers. In GES a node is a unit — a cluster, super-cluster, … — and its brokers are
the unit's keepers (its gatekeepers, :mod:`ges.routing.hierarchy`); the leaves are single
brokers. An event climbs from its pubend's broker to a keeper of each enclosing unit, and each
keeper sends it down to the children of its unit that want it (seed 004 §3.3): a unit with
several keepers is a tree node with several brokers, and two events of one stream may pass
through different ones.

**Leaf clocks** (§3.3). A broker's clock is ``(incarnation, seq)`` of its newest exported add
(:mod:`ges.routing.export` — the covering-reduced DAG roots). It advances when an add changes
the broker's exported roots. Incarnations grow across restarts (the runtime's is its start time
in ns, the simulator counts), so the clock never goes back across a crash (§4). A
subscription's *vst* is the clock of the adds it waits for: its own, or the covering ones (a
covered conjunction starts where its cover did, §3.3).

**V_b** (§3.4) is kept by :class:`~ges.routing.table.ContentRouter`: per origin, the highest
clock up to which every add of the origin is applied or known gone. Keepers pass changes on
unaggregated, so the constraint vector of an incremental change is just ``(origin: v − 1)``:
changes that arrive out of order wait, and V_b advances only over a complete prefix.

**V_m** (§3.5). The clocks are flooded (:class:`~ges.wire.messages.Clocks`); each broker's
table of them is the V_m its pubend stamps on every event and silence it sends, as a digest
(§5.1): a counter that grows with every change of the table. The first frame of a pubend with a
new digest on a link is preceded by a :class:`~ges.wire.messages.Vector`. A receiver keeps the
newest vector of each pubend it has heard of: for a frame with a digest up to that one the
vector is an upper bound of its V_m (enough for the sufficiency test: a keeper passing it for
the larger vector passes it for the smaller), and for a frame with that digest or a larger one
it is a lower bound (enough for a starting point: V_m never shrinks along a stream). A vector
also says, per clock, the first tick the pubend stamped with it, so a subscriber's broker
knows its starting point exactly from any frame that reaches it — the frames before may have
been lost — and asks for the ticks it has not seen. A pubend's table survives a restart with
its log when the stream goes on (a log that keeps one epoch), so its V_m never shrinks; a new
epoch — each restart's, in the runtime and the simulator — is a new stream.

**Which clocks travel.** GES starts a subscription from its keepers' acknowledgements
(:mod:`ges.routing.table`): everything published after its complete ``SubAck`` arrives, a
stronger start than §3.6 gives. The V_m start is needed only on the levels where a keeper was
given up (it did not acknowledge through its resend rounds). So a leaf floods its clock when
it starts a subscription on such a level, and only then: where every keeper answers, V_m stays
empty and frames carry digest 0 at no cost.
"""

from __future__ import annotations

from collections import OrderedDict

from ges.wire import messages as m

#: Other pubends whose newest vector a broker keeps.
MAX_VECTORS = 16_384
#: (peer, pubend) pairs whose last vector sent is remembered (beyond it, vectors go again).
MAX_SENT = 65_536

Clock = tuple[int, int]
NO_CLOCK: Clock = (0, 0)


class VirtualTime:
    """One broker's clock table (its pubend's V_m) and the vectors of other pubends."""

    def __init__(self, me: str, pubend: str, brokers, kept: tuple[int, dict] | None = None):
        self.me = me
        self.pubend = pubend
        self._brokers = brokers
        digest, table = kept if kept else (0, {})
        #: every leaf clock heard of: this pubend's V_m
        self.table: dict[str, Clock] = {b: (inc, seq) for b, (inc, seq, _) in table.items()}
        #: per clock in :attr:`table`, the first tick of this pubend stamped with it
        self.since: dict[str, int] = {b: since for b, (_, _, since) in table.items()}
        #: the digest of :attr:`table` (0: empty)
        self.digest = digest
        self._known: OrderedDict[str, tuple[int, dict[str, Clock], dict[str, int]]] = OrderedDict()
        self._sent: dict[tuple[str, str], int] = {}

    def snapshot(self) -> tuple[int, dict]:
        """What a log keeps so that a restarted pubend's V_m does not shrink."""
        since = self.since
        return self.digest, {b: (inc, seq, since[b]) for b, (inc, seq) in self.table.items()}

    # -- the clock table (flooded) --------------------------------------------------------------

    def merge(self, clocks, since: int = 0) -> list[tuple[str, int, int]]:
        """Clocks heard, stamped from tick ``since`` of this pubend on; returns those that were
        news (to pass on). An unknown broker or a malformed entry raises ValueError."""
        for entry in clocks:  # all checked before any is taken
            _check(self._brokers, entry[0], entry[1:])
        news = []
        table = self.table
        for broker, inc, seq in clocks:
            if table.get(broker, NO_CLOCK) < (inc, seq):
                table[broker] = (inc, seq)
                self.since[broker] = since
                news.append((broker, inc, seq))
        if news:
            self.digest += 1
        return news

    def entries(self) -> list[tuple[str, int, int]]:
        return [(b, inc, seq) for b, (inc, seq) in self.table.items()]

    # -- other pubends' vectors -------------------------------------------------------------------

    def learn(self, msg: m.Vector) -> None:
        """A vector of another pubend arrived: kept if newer than the one held."""
        if msg.pubend == self.pubend:
            return
        if msg.digest < 1 or msg.digest >= 1 << 63:
            raise ValueError(f"bad digest {msg.digest}")
        got = self._known.get(msg.pubend)
        if got is not None and got[0] >= msg.digest:
            return
        vector: dict[str, Clock] = {}
        since: dict[str, int] = {}
        for broker, inc, seq, first in msg.clocks:
            _check(self._brokers, broker, (inc, seq, first))
            vector[broker] = (inc, seq)
            since[broker] = first
        self._known[msg.pubend] = (msg.digest, vector, since)
        self._known.move_to_end(msg.pubend)
        if len(self._known) > MAX_VECTORS:
            self._known.popitem(last=False)

    def _held(self, pubend: str) -> tuple[int, dict[str, Clock], dict[str, int]] | None:
        if pubend == self.pubend:
            return self.digest, self.table, self.since
        got = self._known.get(pubend)
        if got is not None:
            self._known.move_to_end(pubend)  # the least recently used goes first
        return got

    def upper(self, pubend: str, digest: int) -> tuple[int, dict[str, Clock]] | None:
        """``(key, vector)``: a vector no smaller than the V_m of ``digest`` (for the sufficiency
        test; ``key`` names it for caching); None when no such vector is known."""
        if digest == 0:
            return 0, {}
        got = self._held(pubend)
        if got is None or got[0] < digest:
            return None
        return got[0], got[1]

    def lower(self, pubend: str, digest: int, broker: str) -> tuple[Clock, int] | None:
        """From a vector no larger than the V_m of ``digest`` (for starting points):
        ``broker``'s clock and the first tick stamped with it (None: not known)."""
        got = self._held(pubend)
        if got is None or digest == 0 or got[0] > digest or broker not in got[1]:
            return None
        return got[1][broker], got[2][broker]

    # -- per link -----------------------------------------------------------------------------------

    def before(self, peer: str, pubend: str, digest: int) -> m.Vector | None:
        """The :class:`Vector` to send ``peer`` ahead of a frame of ``pubend`` with ``digest``,
        if it has not had one that new on this link (None: nothing to send, or not known
        here — the receiver then floods, the safe side)."""
        if digest == 0:
            return None
        key = (peer, pubend)
        if self._sent.get(key, 0) >= digest:
            return None
        got = self._held(pubend)
        if got is None or got[0] < digest:
            return None
        if len(self._sent) >= MAX_SENT:
            self._sent.clear()
        self._sent[key] = got[0]
        since = got[2]
        return m.Vector(pubend, got[0], [(b, i, s, since[b]) for b, (i, s) in got[1].items()])

    def link_down(self, peer: str) -> None:
        for key in [k for k in self._sent if k[0] == peer]:
            del self._sent[key]


def _check(brokers, broker: str, values) -> None:
    if broker not in brokers:
        raise ValueError(f"clock of unknown broker {broker!r}")
    if any(not isinstance(v, int) or v < 0 or v >= 1 << 63 for v in values):
        raise ValueError(f"bad clock {broker!r} {tuple(values)!r}")
