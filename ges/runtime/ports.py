"""Free TCP ports on loopback, and a topology moved onto them (tests and benchmarks use this to
run several networks side by side without clashing with a user's running ``ges up``)."""

from __future__ import annotations

import socket


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago on ``host``."""
    socks = []
    try:
        for _ in range(n):
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
    for spec, port in zip(
        data["brokers"].values(), free_ports(len(data["brokers"]), host), strict=True
    ):
        spec["port"] = port
        spec["host"] = host
    return data
