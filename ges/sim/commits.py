"""A pubend log that commits a group at a time, later, as the runtime's log task does.

The trio runtime appends a publish to its log at once and commits everything appended since
the last group in one transaction (``ges.runtime.commits``); only then does the core
acknowledge the publishes and match them (``BrokerCore.on_logged``). Meanwhile the world goes
on: frames arrive, the same client's next requests are read. :class:`GroupLog` gives the
simulator that window. The simulator commits the group after a delay it draws and then tells
the core.

A broker that crashes with a group in flight has it written just before it died. The core's
``on_logged`` never ran for it, so its publishers were never acknowledged. This is one of the
runtime's outcomes of a ``kill -9``: the transaction finished, the acknowledgement did not go.
"""

from __future__ import annotations

from ges.reliable.log import MemoryLog


class GroupLog(MemoryLog):
    """A :class:`MemoryLog` whose appends are durable only once :meth:`commit` is called."""

    def __init__(self, epoch: int = 1):
        super().__init__(epoch)
        self._committed = 0

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def pending(self) -> bool:
        """Appends wait for a commit."""
        return self._committed < self.last

    def commit(self) -> None:
        """Everything appended so far is durable."""
        self._committed = self.last
