"""``ges publish`` and ``ges subscribe`` as a user runs them, through what used to lose,
duplicate or cut (issue 17): a publisher killed mid-stream and run again, the publishing broker
killed mid-stream, events near the frame limit, and a subscriber's broker cut off for three
seconds during a stream of 1 KB events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from tests.conftest import CHAIN3, on_free_ports
from tests.e2e.test_up_e2e import GES, ROOT, Up, ges, start_subscriber


def chain(tmp_path: Path) -> Path:
    path = tmp_path / "chain3.yaml"
    path.write_text(yaml.safe_dump(on_free_ports(CHAIN3)))
    return path


def publisher(topology: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*GES, "publish", str(topology), "--broker", "b1", "--json", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def received(sub: subprocess.Popen, timeout: float = 90) -> list[dict]:
    out, err = sub.communicate(timeout=timeout)
    assert sub.returncode == 0, err[-2000:]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def once_each(records: list[dict], n: int) -> None:
    ns = [r["attributes"]["n"] for r in records]
    assert len(ns) == n and sorted(ns) == list(range(n)), f"missing {set(range(n)) - set(ns)}"


def test_a_publisher_killed_mid_stream_sends_again_and_nothing_is_delivered_twice(tmp_path):
    topology = chain(tmp_path)
    up = Up(topology, tmp_path / "data")
    try:
        sub = start_subscriber(topology, "b3", "--count", "6000", "--timeout", "90")
        first = publisher(topology, "--client", "P", "--count", "6000", "--rate", "3000")
        time.sleep(1.0)
        first.kill()  # mid-stream: it never learns what was acknowledged
        first.wait()
        again = ges(
            "publish", topology, "--broker", "b1", "--client", "P", "--count", "6000", "--json"
        )
        assert again.returncode == 0, again.stderr
        summary = json.loads(again.stdout)
        assert summary["acknowledged"] == 6000
        assert 0 < summary["duplicates"] < 6000
        assert summary["published"] + summary["duplicates"] == 6000
        records = received(sub)
        once_each(records, 6000)
        ticks = [r["tick"] for r in records]
        assert ticks == sorted(ticks)  # one pubend: in order
    finally:
        up.stop()


def test_the_publishing_broker_killed_mid_stream_says_what_was_acknowledged(tmp_path):
    """b1 is killed while ``ges publish --client P`` streams into it: the command exits 1 with
    one line and a JSON summary of what b1 acknowledged; once ``ges up`` has restarted b1 the
    same command publishes the rest — what b1 had logged before the kill is not published
    again (its pubend log keeps P's numbers across the restart)."""
    topology = chain(tmp_path)
    up = Up(topology, tmp_path / "data", "--processes")
    try:
        pid = {b["id"]: b["pid"] for b in up.run_json()["brokers"]}
        sub = start_subscriber(topology, "b3", "--count", "8000", "--timeout", "120")
        first = publisher(topology, "--client", "P", "--count", "8000", "--rate", "3000")
        time.sleep(1.2)
        os.kill(pid["b1"], signal.SIGKILL)
        out, err = first.communicate(timeout=60)
        assert first.returncode == 1
        (line,) = [ln for ln in err.splitlines() if ln.strip()]
        summary = json.loads(out)
        acked = summary["acknowledged"]
        assert 0 < acked < 8000 and summary["first_unacknowledged"] == acked
        assert line.startswith("error: ") and f"{acked} of 8000 events acknowledged" in line
        assert "run the same command again" in line
        deadline = time.monotonic() + 60
        while True:  # ges up restarts b1
            again = ges(
                "publish", topology, "--broker", "b1", "--client", "P", "--count", "8000", "--json"
            )
            if again.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert again.returncode == 0, again.stderr
        summary = json.loads(again.stdout)
        assert summary["duplicates"] >= acked
        once_each(received(sub, timeout=120), 8000)
    finally:
        up.stop()


def test_events_near_the_frame_limit_are_published_in_frames_that_fit(tmp_path):
    topology = chain(tmp_path)
    up = Up(topology, tmp_path / "data")
    try:
        sub = start_subscriber(topology, "b3", "--count", "3", "--timeout", "60")
        # 18 MB in one call: three frames (each event alone is within the event limit)
        done = ges("publish", topology, "--broker", "b1", "--size", "6000000", "--count", "3")
        assert done.returncode == 0, done.stderr
        records = received(sub)
        assert sorted(r["attributes"]["n"] for r in records) == [0, 1, 2]
        assert {len(r["payload"]) for r in records} == {6_000_000}
        # one event over the limit is refused before anything is sent
        big = ges("publish", topology, "--broker", "b1", "--size", "17000000")
        assert big.returncode == 2
        assert big.stderr.startswith("error: ") and "over the" in big.stderr
        assert len(big.stderr.strip().splitlines()) == 1
    finally:
        up.stop()


def test_a_three_second_cut_on_a_1kb_stream_is_recovered_without_cutting_the_subscriber(
    tmp_path,
):
    """b3 (the subscriber's broker) is cut off from b2 for 3 s while b1 streams 1 KB events:
    when the link is back b3 recovers what it missed from b1's log — in frames within the
    limit, paced within the subscriber's bounds — and the subscriber gets every event once
    (before, the recovery went out in 37 and 67 MB frames and the subscriber dropped)."""
    topology = chain(tmp_path)
    up = Up(topology, tmp_path / "data")
    try:
        n = 60_000
        sub = start_subscriber(topology, "b3", "--count", str(n), "--timeout", "120")
        pub = publisher(topology, "--count", str(n), "--rate", "10000", "--size", "1000")
        time.sleep(1.0)
        cut = ges("link", "down", topology, "b2", "b3")
        assert cut.returncode == 0, cut.stderr
        time.sleep(3.0)
        back = ges("link", "up", topology, "b2", "b3")
        assert back.returncode == 0, back.stderr
        out, err = pub.communicate(timeout=60)
        assert pub.returncode == 0, err
        records = received(sub, timeout=120)
        once_each(records, n)
        assert [r["tick"] for r in records] == list(range(1, n + 1))
    finally:
        up.stop()
