"""Provenance: only a pubend's own broker originates its ticks (issue 19, item 4).

Theory of operation
-------------------
A pubend is named after the broker that owns it (``<broker>~<epoch>``), and every frame that
carries its data says how far it has come: an event copy lists the brokers it has passed through
(``EventItem.path``, content routing) and counts the links it crossed (``hops``); silence and
answers from the pubend's log count their links too. Over mutual TLS the peer a frame arrives
from is proven (ges.runtime.admission), so a receiving broker can check a frame against what
must hold for one that really left the owner:

- event copies (content routing): the path starts at the owner, ends at the peer that sent it,
  steps only along links of the topology, and is as long as the copy's hop count (a path may
  pass through this broker already: a keeper can route an event back down the way it came);
- flooded events and silence: at least one hop, exactly one only if the peer *is* the owner,
  and never fewer than the topology's distance from the owner to the peer plus one;
- answers to nacks: they name the broker that made them (``Recovered.by``: the pubend's, from
  its log, or a keeper of the unit the answer is whole for, from its cache), which must be one
  of those, and the same distance rule holds from it (a broker on the way that shares an
  answer with other nacking brokers sends its copies on with the hops counted so far).

Frames about this broker's own pubend pass (what comes back of it is dropped later as an
echo).

A frame that fails is dropped whole — before the duplicate filter, the subend or the log's
knowledge see it, so it cannot shadow the real tick that comes later — counted
(``forged``), and noticed in the log (the first time for each peer, then every 1,000th).

What this does not stop: a broker of the network that holds its own certificate and lies
about data it relays along a consistent path, or, as a keeper, about what its cache holds. Checking that would take the owner's signature
on every event (or on every frame, with the events' digests, which relays would have to carry
whole when they split a frame): an ECDSA P-256 verification costs ~115 us here per frame and
hop, more than a hop's whole budget. The threat model in the README says who is trusted for
what. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from itertools import pairwise

from ges.core.outputs import Notice

#: Forged frames from one peer between two notices after the first.
NOTICE_EVERY = 1_000


class Provenance:
    """Checks a broker core applies to frames that claim to come from a pubend's owner."""

    def __init__(self, topology, me: str, counters: dict, kept_by=None):
        self.me = me
        self.neighbours = topology.neighbours
        #: broker -> the units it keeps (content routing; who may answer from a cache)
        self.kept_by = kept_by or {}
        self.counters = counters
        counters.setdefault("forged", 0)
        self._distances: dict[str, dict[str, int]] = {}
        self._forged_by: dict[str, int] = {}

    @staticmethod
    def owner(pubend: str) -> str:
        return pubend.partition("~")[0]

    def distance(self, a: str, b: str) -> int | None:
        """Links between ``a`` and ``b`` in the topology (None: not connected, or unknown)."""
        table = self._distances.get(a)
        if table is None:
            table = {a: 0}
            if a in self.neighbours:
                todo = deque([a])
                while todo:
                    x = todo.popleft()
                    for y in self.neighbours[x]:
                        if y not in table:
                            table[y] = table[x] + 1
                            todo.append(y)
            self._distances[a] = table
        return table.get(b)

    def origin_refusal(self, peer: str, owner: str, hops: int) -> str | None:
        """Why a frame that left ``owner`` and crossed ``hops`` links cannot have come from
        ``peer`` (None: it can)."""
        if owner == self.me:  # routes may lead back through here: the echo is dropped later
            return None
        if owner not in self.neighbours:
            return f"its pubend's broker {owner!r} is not in the topology"
        if hops == 1 and peer != owner:
            return f"it claims to come straight from {owner}"
        least = self.distance(owner, peer)
        if least is None or hops < least + 1:
            return f"it claims {hops} hop(s) from {owner}, and {peer} is {least} away from it"
        return None

    def answer_refusal(self, peer: str, msg) -> str | None:
        """Why an answer to a nack cannot have come from ``peer``: it must name the broker
        that made it — the pubend's, or a keeper of the unit the answer is whole for — and be
        at least as far from that broker as the topology puts ``peer``, plus one."""
        by = msg.by
        if not by:
            return "it does not say which broker answered"
        if by != self.owner(msg.pubend) and msg.unit not in self.kept_by.get(by, ()):
            unit = "/".join(msg.unit) or "the whole system"
            return f"{by} is neither the pubend's broker nor a keeper of {unit}"
        return self.origin_refusal(peer, by, msg.hops)

    def path_refusal(self, peer: str, owner: str, path: tuple, hops: int) -> str | None:
        """Why an event copy with this path cannot have come from ``peer`` (None: it can)."""
        if not path or path[0] != owner:
            return f"its path {list(path)} does not start at the pubend's broker {owner}"
        if path[-1] != peer:
            return f"its path {list(path)} does not end at {peer}, which sent it"
        if len(path) != hops:
            return f"its path {list(path)} does not fit its {hops} hop(s)"
        neighbours = self.neighbours
        for a, b in pairwise(path):
            if b not in neighbours.get(a, ()):
                return f"its path {list(path)} steps from {a} to {b}, which are not linked"
        return None

    def events_refusal(self, peer: str, pubend: str, items: list, routed: bool) -> str | None:
        owner = self.owner(pubend)
        last_hops = last_path = None  # the items of a frame mostly share both: checked once
        for it in items:
            if it.hops == last_hops and it.path == last_path:
                continue
            if routed:
                why = self.path_refusal(peer, owner, it.path, it.hops)
            else:
                why = self.origin_refusal(peer, owner, it.hops)
            if why is not None:
                return f"tick {it.tick}: {why}"
            last_hops, last_path = it.hops, it.path
        return None

    def dropped(self, peer: str, msg, why: str) -> list:
        """Count a forged frame; a notice the first time for ``peer``, then every
        NOTICE_EVERY-th."""
        self.counters["forged"] += 1
        n = self._forged_by.get(peer, 0) + 1
        self._forged_by[peer] = n
        if n != 1 and n % NOTICE_EVERY:
            return []
        times = "" if n == 1 else f" ({n} from {peer} so far)"
        return [
            Notice(
                "warning",
                f"dropped a forged {type(msg).__name__} of pubend {msg.pubend} from {peer}: "
                f"{why}{times}",
            )
        ]
