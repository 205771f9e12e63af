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
    specs = list(data["brokers"].values())
    mqtt = [spec for spec in specs if "mqtt_port" in spec]  # an MQTT port too: another one
    ports = free_ports(len(specs) + len(mqtt), host)
    for spec, port in zip(specs, ports, strict=False):
        spec["port"] = port
        spec["host"] = host
    for spec, port in zip(mqtt, ports[len(specs) :], strict=True):
        spec["mqtt_port"] = port
    return data
