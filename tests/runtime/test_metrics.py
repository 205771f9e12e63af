"""Prometheus metrics (ges.runtime.metrics): real brokers over TCP, scraped over HTTP and parsed
by prometheus-client's own parser; the HTTP side's answers and bounds; ``ges broker
--metrics-port`` as a process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import trio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ges.runtime import BrokerServer
from ges.runtime import metrics as metrics_module
from ges.runtime.metrics import start_metrics
from ges.runtime.ports import free_ports
from tests.conftest import CHAIN3, on_free_ports, ten_events_through

ROOT = Path(__file__).resolve().parents[2]


async def http(port: int, request: bytes) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def samples(text: str) -> dict[tuple, float]:
    """(name, broker, other labels…) -> value, of every sample."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            key = (s.name, labels.pop("broker"), labels.pop("unit"), *sorted(labels.items()))
            out[key] = s.value
    return out


async def test_a_scrape_has_every_brokers_counters_and_gauges_labelled_by_broker_and_unit(
    chain3, tmp_path
):
    (port,) = free_ports(1)
    async with trio.open_nursery() as nursery:
        async with ten_events_through(chain3, nursery, data_dir=tmp_path) as servers:
            assert await start_metrics(nursery, servers, port) == [port]
            status, text = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        nursery.cancel_scope.cancel()
    assert status == 200
    got = samples(text)
    assert got[("ges_events_in_total", "b1", "S/c1")] == 10
    assert got[("ges_delivered_total", "b3", "S/c2")] == 10
    assert got[("ges_clients", "b1", "S/c1")] == 1 and got[("ges_subscriptions", "b3", "S/c2")] == 1
    assert got[("ges_link_up", "b2", "S/c1", ("cut", "0"), ("peer", "b3"))] == 1
    assert got[("ges_links_expected", "b2", "S/c1")] == 2
    assert got[("ges_log_held", "b1", "S/c1")] == 10  # reliable: the pubend log holds them
    assert got[("ges_log_earlier_epochs", "b1", "S/c1")] == 0  # its first start: none
    assert got[("ges_log_bytes", "b1", "S/c1", ("what", "on_disk"))] > 0
    assert ("ges_queued_bytes", "b3", "S/c2", ("to", "clients")) in got
    assert got[("ges_start_time_seconds", "b1", "S/c1")] == pytest.approx(time.time(), abs=120)


async def test_a_scrape_has_the_event_loops_longest_stretch_busy_time_and_histogram(chain3):
    (port,) = free_ports(1)
    async with trio.open_nursery() as nursery:
        servers = [await nursery.start(BrokerServer(chain3, b).run) for b in ("b1", "b2")]
        await start_metrics(nursery, servers, port)
        await trio.sleep(0)
        time.sleep(0.03)  # holds the loop of both brokers' process
        await trio.sleep(0)
        status, text = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        nursery.cancel_scope.cancel()
    assert status == 200
    got = samples(text)
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["ges_loop_longest_seconds"] == "gauge"
    assert families["ges_loop_busy_seconds"] == "counter"
    assert families["ges_loop_busy_stretch_seconds"] == "histogram"
    for b in ("b1", "b2"):  # the process's loop: the same for each broker of it
        at = (b, "S/c1")
        assert got[("ges_loop_longest_seconds", *at)] >= 0.03
        assert got[("ges_loop_busy_seconds_total", *at)] >= 0.03
        buckets = {
            le: got[("ges_loop_busy_stretch_seconds_bucket", *at, ("le", le))]
            for le in ("0.001", "0.005", "0.01", "0.05", "0.1", "1.0", "+Inf")
        }
        assert list(buckets.values()) == sorted(buckets.values())  # cumulative
        assert buckets["+Inf"] - buckets["0.01"] >= 1  # the 30 ms stretch
        assert buckets["+Inf"] == got[("ges_loop_busy_stretch_seconds_count", *at)]
        assert got[("ges_loop_busy_stretch_seconds_sum", *at)] >= 0.03


async def test_the_http_side_answers_only_a_get_of_metrics_and_bounds_what_it_reads(
    chain3, monkeypatch
):
    monkeypatch.setattr(metrics_module, "REQUEST_SECONDS", 0.3)
    (port,) = free_ports(1)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(BrokerServer(chain3, "b1").run)
        await start_metrics(nursery, [server], port)
        assert (await http(port, b"GET / HTTP/1.0\r\n\r\n"))[0] == 200
        assert (await http(port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"))[0] == 200
        assert (await http(port, b"GET /other HTTP/1.0\r\n\r\n"))[0] == 404
        assert (await http(port, b"POST /metrics HTTP/1.0\r\n\r\n"))[0] == 405
        status, _ = await http(port, b"GET /metrics HTTP/1.0\r\nX: " + b"y" * 20_000 + b"\r\n")
        assert status == 431  # a head over 8 KiB: refused, not read on
        # a scraper that says nothing is closed within the request deadline
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(3):
            assert await stream.receive_some(100) == b""
        await stream.aclose()
        nursery.cancel_scope.cancel()


def test_ges_broker_serves_its_metrics_on_the_port_the_topology_gives(tmp_path):
    data = on_free_ports(CHAIN3)
    (metrics_port,) = free_ports(1)
    data["brokers"]["b1"]["metrics_port"] = metrics_port
    path = tmp_path / "chain3.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "broker", str(path), "--id", "b1", "--insecure"]
        + ["--data-dir", str(tmp_path / "data")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    text = r.read().decode()
                    kind = r.headers["Content-Type"]
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "no metrics within 30 s"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert kind.startswith("text/plain; version=0.0.4")
    got = samples(text)
    assert got[("ges_links_expected", "b1", "S/c1")] == 1
    assert got[("ges_link_up", "b1", "S/c1", ("cut", "0"), ("peer", "b2"))] == 0  # b2 not running


async def test_a_scrape_reads_one_broker_at_a_time_and_makes_its_text_off_the_loop(
    chain3, monkeypatch
):
    """Other tasks run between two brokers' reads, and while the text is made (a worker
    thread): a scrape of the many brokers of one ``ges up`` does not hold their loop."""
    order: list[str] = []
    read = metrics_module.Snapshot.__init__
    make = metrics_module.generate_latest

    def reading(self, server):
        order.append(f"read {server.id}")
        read(self, server)

    def making(registry):
        order.append("text" if threading.current_thread() is not threading.main_thread() else "!")
        return make(registry)

    monkeypatch.setattr(metrics_module.Snapshot, "__init__", reading)
    monkeypatch.setattr(metrics_module, "generate_latest", making)
    (port,) = free_ports(1)
    async with trio.open_nursery() as nursery:
        servers = [await nursery.start(BrokerServer(chain3, b).run) for b in ("b1", "b2", "b3")]
        await start_metrics(nursery, servers, port)

        async def ticking():
            while True:
                order.append("tick")
                await trio.sleep(0)

        nursery.start_soon(ticking)
        status, text = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        nursery.cancel_scope.cancel()
    assert status == 200 and ("ges_clients", "b3", "S/c2") in samples(text)
    work = [i for i, what in enumerate(order) if what != "tick"]
    assert [order[i] for i in work] == ["read b1", "read b2", "read b3", "text"]
    assert "tick" in order[work[0] : work[2]]  # the loop ran while the brokers were read
