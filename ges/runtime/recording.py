"""``ges up --record DIR``: delivery records for every broker's local clients.

Each broker appends one record per event it hands to a local subscription to
``DIR/<broker>.records.jsonl`` (made at its first record), in the format of :mod:`ges.records` (what ``ges
subscribe --record`` writes), with ``received_at`` the broker's clock when it handed the event to
the client's connection (read before the broker writes that batch) — so the latency it records
leaves out the last hop to the client, which ``ges subscribe --record`` includes. Writes go through the file's buffer and are flushed after
each batch the broker sends; a write that fails (a full disk) is logged once and recording
stops, the broker goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import deque
from pathlib import Path

from ges.errors import OperationError
from ges.records import Delivery, delivery_record
from ges.wire import messages as m

#: Deliveries whose latency ``latency_us`` summarises (the latest; sorting them for a report
#: takes well under a millisecond).
LATENCIES_KEPT = 4096


class BrokerRecorder:
    """Appends the delivery records of one broker's local clients (see the module docstring)."""

    def __init__(self, directory: Path, broker: str, *, tags: dict | None = None):
        self.path = Path(directory) / f"{broker}.records.jsonl"
        self.broker = broker
        self.tags = dict(tags or {})
        self.log = logging.getLogger(f"ges.broker.{broker}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            where = self.path.parent
            raise OperationError(f"--record {where}: cannot make it: {exc.strerror}") from None
        self._file = None
        self._stopped = False
        self._dirty = False
        #: one-way latencies of the latest deliveries, in ns (for Stats: ges monitor)
        self._latencies: deque[int] = deque(maxlen=LATENCIES_KEPT)

    def deliver(self, client: str, msg: m.Deliver, now_ns: int) -> None:
        """Record ``msg``'s events, handed to ``client`` at ``now_ns`` (the broker's clock)."""
        if self._stopped:
            return
        if self._file is None:
            try:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - see close()
            except OSError as exc:
                self._failed(exc)
                return
        self._latencies.extend(
            now_ns - it.event.published_at for it in msg.items if it.event.published_at
        )
        lines = [
            json.dumps(
                delivery_record(
                    Delivery(msg.pubend, it.tick, it.hops, it.event, now_ns),
                    subscriber_broker=self.broker,
                    client=client,
                    tags=self.tags,
                ),
                separators=(",", ":"),
            )
            for it in msg.items
        ]
        self._write("\n".join(lines) + "\n")

    def latency_us(self) -> tuple[int, int]:
        """p50 and p99 of the latest deliveries' one-way latency, in µs ((0, 0): none yet)."""
        if not self._latencies:
            return 0, 0
        ordered = sorted(self._latencies)
        n = len(ordered)
        return ordered[n // 2] // 1000, ordered[min(n - 1, n * 99 // 100)] // 1000

    def flush(self) -> None:
        if self._dirty and self._file is not None:
            self._dirty = False
            try:
                self._file.flush()
            except OSError as exc:
                self._failed(exc)

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            if self._file is not None:
                self._file.close()
                self._file = None

    def _write(self, text: str) -> None:
        try:
            self._file.write(text)
            self._dirty = True
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.log.error("recording to %s stopped: %s", self.path, exc.strerror or exc)
        self._stopped = True
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        self._file = None
