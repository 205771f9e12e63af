"""A heartbeat failure detector for broker links (sans-I/O: time is passed in).

Each up link is expected to carry a frame at least every ``interval`` seconds; when this side
has sent nothing for ``interval`` it owes the peer a heartbeat. A link from which nothing has
been heard for ``timeout`` seconds is suspected: the core reports it down, the runtime closes
the connection and the dialling side reconnects with backoff.
"""

from __future__ import annotations

#: Seconds between heartbeats on an idle link.
HEARTBEAT_INTERVAL = 0.5
#: Seconds of silence before a link is suspected: four missed heartbeats, so one delayed
#: frame on a busy machine does not flap the link.
SUSPECT_AFTER = 2.0


class FailureDetector:
    def __init__(self, *, interval: float = HEARTBEAT_INTERVAL, timeout: float = SUSPECT_AFTER):
        if not 0 < interval < timeout:
            raise ValueError("need 0 < interval < timeout")
        self.interval = interval
        self.timeout = timeout
        self._heard: dict[str, float] = {}
        self._sent: dict[str, float] = {}

    def up(self, peer: str, now: float) -> None:
        self._heard[peer] = now
        self._sent[peer] = now

    def down(self, peer: str) -> None:
        self._heard.pop(peer, None)
        self._sent.pop(peer, None)

    def heard(self, peer: str, now: float) -> None:
        if peer in self._heard:
            self._heard[peer] = now

    def sent(self, peer: str, now: float) -> None:
        if peer in self._sent:
            self._sent[peer] = now

    def poll(self, now: float) -> tuple[list[str], list[str]]:
        """(peers owed a heartbeat now, peers suspected now). Suspected peers are forgotten."""
        # the same sums next_deadline makes: ``now - t >= interval`` can be false at the very
        # deadline it returned (rounding), and a driver on simulated time would spin there
        suspected = [p for p, t in self._heard.items() if now >= t + self.timeout]
        for p in suspected:
            self.down(p)
        owed = [p for p, t in self._sent.items() if now >= t + self.interval]
        for p in owed:
            self._sent[p] = now
        return owed, suspected

    def next_deadline(self) -> float:
        """The earliest time ``poll`` has something to do (inf with no links)."""
        sends = [t + self.interval for t in self._sent.values()]
        hears = [t + self.timeout for t in self._heard.values()]
        return min(sends + hears, default=float("inf"))
