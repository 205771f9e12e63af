"""Warnings that can repeat without end — a connection refused at the cap, ``accept`` failing
while the process is out of descriptors, garbage before a handshake — logged once per cause and
then summarised, so an attacker cannot fill the log or the disk with them."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

#: Seconds between two lines about the same cause; what happens in between is counted.
EVERY = 60.0
#: Causes remembered (the least recently seen is forgotten first).
MAX_CAUSES = 256


class RateLimitedLog:
    """``warning(cause, text)``: the first of each cause is logged as it is; later ones at most
    once per :data:`EVERY` seconds, with how many were left out since."""

    def __init__(self, log: logging.Logger, *, every: float = EVERY, clock=time.monotonic):
        self.log = log
        self.every = every
        self.clock = clock
        #: cause -> [when last logged, left out since]
        self._causes: OrderedDict[str, list] = OrderedDict()

    def warning(self, cause: str, text: str, *args) -> None:
        self._note(logging.WARNING, cause, text, args)

    def info(self, cause: str, text: str, *args) -> None:
        self._note(logging.INFO, cause, text, args)

    def _note(self, level: int, cause: str, text: str, args: tuple) -> None:
        now = self.clock()
        seen = self._causes.get(cause)
        if seen is not None:
            self._causes.move_to_end(cause)
            if now - seen[0] < self.every:
                seen[1] += 1
                return
            left_out, elapsed = seen[1], now - seen[0]
            seen[:] = [now, 0]
            if left_out:
                text += f" (and {left_out} more like it in the last {elapsed:.0f}s)"
        else:
            self._causes[cause] = [now, 0]
            if len(self._causes) > MAX_CAUSES:
                self._causes.popitem(last=False)
        self.log.log(level, text, *args)
