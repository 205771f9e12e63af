"""What a broker logs at info and above, kept for the network's watchers (ges.core.watch).

A broker's lines are its log: links going down and up, links cut, restarts of sessions' clients
elsewhere, slow consumers, keepers given up, gaps, refusals. ``BrokerLog`` is the broker's
logger with every such line also kept in a :class:`Lines` ring — whatever level the process
logs at, so a broker started with ``--log-level warning`` still tells its watchers that a link
came up. The ring holds at most :data:`MAX_KEPT` lines; what the watchers had not taken when
it overflowed is counted as missed.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from ges.wire import messages as m

#: Lines kept between two reports.
MAX_KEPT = 256


class Lines:
    """The lines logged since they were last taken (at most MAX_KEPT, the rest counted)."""

    def __init__(self, bound: int = MAX_KEPT):
        self._kept: deque[m.LogLine] = deque(maxlen=bound)
        self._missed = 0

    def add(self, level: int, text: str) -> None:
        if len(self._kept) == self._kept.maxlen:
            self._missed += 1
        name = "warning" if level >= logging.WARNING else "info"
        self._kept.append(m.LogLine(time.time(), name, text))

    def take(self) -> tuple[list[m.LogLine], int]:
        """The lines since the last take, and how many more there were."""
        lines, missed = list(self._kept), self._missed
        self._kept.clear()
        self._missed = 0
        return lines, missed


class BrokerLog(logging.LoggerAdapter):
    """A broker's logger that also keeps its info and warning lines in ``lines``."""

    def __init__(self, logger: logging.Logger, lines: Lines):
        super().__init__(logger, {})
        self.lines = lines

    def log(self, level, msg, *args, **kwargs) -> None:
        if level >= logging.INFO:
            try:
                text = str(msg) % args if args else str(msg)
            except (TypeError, ValueError):
                text = f"{msg} {args}"
            self.lines.add(level, text)
        # the record names the broker's code that logged, not this frame
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
        super().log(level, msg, *args, **kwargs)
