"""Free ports for tests and benchmarks (ges.runtime.ports): distinct, free, and — where the
kernel says which ports its outgoing connections draw from — outside that range, so a client's
connect cannot take one before its broker listens."""

from __future__ import annotations

import socket

import pytest

from ges.runtime import ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    if not ports._below_ephemeral():
        pytest.skip("the kernel's ephemeral range is not known here (not Linux)")
    got = ports.free_ports(60)
    assert len(set(got)) == 60
    low = int(ports.EPHEMERAL.read_text().split()[0])
    assert all(ports.LOWEST <= p < low for p in got)
    assert all(_bindable(p) for p in got)


def test_a_process_hands_out_no_port_twice_until_it_has_gone_round():
    first, second = ports.free_ports(30), ports.free_ports(30)
    assert not set(first) & set(second)


def test_a_port_in_use_is_never_handed_out(monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    busy = held.getsockname()[1]
    try:
        monkeypatch.setattr(ports, "_below_ephemeral", lambda: range(busy, busy + 3))
        got = ports.free_ports(2)
        assert busy not in got and len(set(got)) == 2
    finally:
        held.close()


def test_without_the_kernels_range_the_kernel_picks(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "EPHEMERAL", tmp_path / "nowhere")
    assert ports._below_ephemeral() == range(0)
    got = ports.free_ports(5)
    assert len(set(got)) == 5 and all(_bindable(p) for p in got)
