"""Free TCP ports on loopback, and a topology moved onto them (tests and benchmarks use this to
run several networks side by side without clashing with a user's running ``ges up``).

The ports come from below the kernel's ephemeral range where there is room (Linux:
``/proc/sys/net/ipv4/ip_local_port_range``, 32768–60999 by default): a port that was free a
moment ago inside that range may be taken meanwhile as the local port of any outgoing
connection — a test's own clients make thousands — and a broker started on it then fails with
"address already in use". Below it, only another process using this module could pick the
same port before its broker listens: each process goes through the range in order from a
block of its own (by its pid), never handing out a port twice until it has gone round, and
tries each port by binding it first. (Random picks clash: two test workers each taking 40
ports at once from 12,768 would share one about one time in ten; one CI run met it.)"""

from __future__ import annotations

import os
import socket
from pathlib import Path

#: The lowest port handed out (above the registered services most hosts run).
LOWEST = 20_000
#: The kernel's ephemeral range (Linux).
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _below_ephemeral() -> range:
    """The ports between LOWEST and the kernel's ephemeral range (empty where it is unknown
    or leaves too little room)."""
    try:
        low = int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST, low) if low - LOWEST >= 1_000 else range(0)


#: Ports a process's first block spans; where this process's next port is in the range.
BLOCK = 1_000
_next: int | None = None


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago on ``host``."""
    global _next
    socks = []
    candidates = _below_ephemeral()
    if candidates and _next is None:
        _next = os.getpid() % max(1, len(candidates) // BLOCK) * BLOCK
    try:
        for _ in range(min(len(candidates), n * 20)):
            if len(socks) == n:
                break
            port = candidates[_next % len(candidates)]
            _next += 1
            s = socket.socket()
            try:
                s.bind((host, port))
            except OSError:  # taken
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # what the kernel picks, where the range has no room
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def on_free_ports(data: dict, host: str = "127.0.0.1") -> dict:
    """A copy of a topology mapping (the YAML form) with every broker on a free port of ``host``."""
    data = {**data, "brokers": {k: dict(v) for k, v in data["brokers"].items()}}
    specs = list(data["brokers"].values())
    # an MQTT port too (plain or over WebSocket): another one each
    mqtt = [(spec, k) for k in ("mqtt_port", "mqtt_ws_port") for spec in specs if k in spec]
    ports = free_ports(len(specs) + len(mqtt), host)
    for spec, port in zip(specs, ports, strict=False):
        spec["port"] = port
        spec["host"] = host
    for (spec, key), port in zip(mqtt, ports[len(specs) :], strict=True):
        spec[key] = port
    return data
