"""Durable sessions end to end over real processes: a subscriber roams, its session is handed
over to the replicator of the unit it settles in, its broker and that replicator are killed, it
is away for a while and resumes elsewhere — and has every event once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import yaml

from tests.conftest import CHAIN3, on_free_ports
from tests.e2e.test_up_e2e import (
    GES,
    ROOT,
    LineReader,
    Up,
    demo_on_free_ports,
    ges,
    wait_gone,
)

#: events published (250 a second: the faults below come well before the end, on a busy machine too)
N = 8_000


def _record(line: str) -> dict:
    assert line.endswith("\n"), f"a line cut short: {line[-80:]!r}"
    return json.loads(line)


class Subscriber:
    """A ``ges subscribe --client alice`` process, its stdout and stderr read in threads."""

    def __init__(self, topology, broker: str, auth, *extra: str):
        self.proc = subprocess.Popen(
            [
                *GES,
                "subscribe",
                str(topology),
                "--broker",
                broker,
                "--client",
                "alice",
                "--format",
                "jsonl",
                *extra,
                *auth,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out = LineReader(self.proc.stdout)
        self.err = LineReader(self.proc.stderr)

    def wait_err(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.err.lines:
                if needle in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} on stderr: {''.join(self.err.lines)[-2000:]}")

    def then(self, count: int) -> None:
        self.out.wait_for(len(self.out.lines) + count)


def test_a_durable_subscriber_roams_survives_kills_and_resumes_with_every_event_once(tmp_path):
    """The must-show of issue 20, with delegation: the session follows its client to the
    replicator of the unit it settles in (``handover_after: 2s`` here), so the replicator
    killed is the one serving the session then."""
    path = demo_on_free_ports(tmp_path)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "sessions": {"handover_after": "2s"}}))
    topology = path
    up = Up(topology, tmp_path / "run", "--processes")
    pub = first = second = None
    try:
        pid = {b["id"]: b["pid"] for b in up.run_json()["brokers"]}
        first = Subscriber(topology, "b20", up.auth, "--where", "n exists")
        first.wait_err("opened durable session at b20")  # homed at b18, SSC-B/SC-4's
        pub = subprocess.Popen(
            [*GES, "publish", str(topology), "--broker", "b10", "--client", "P",
             "--count", str(N), "--rate", "250", *up.auth],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

        def roam(to: str, frm: str) -> None:
            result = ges("roam", topology, "alice", "--to", to, *up.auth, timeout=60)
            assert result.returncode == 0, result.stderr
            first.wait_err(f"roamed {frm} -> {to}")

        def kill(broker: str) -> None:
            os.kill(pid[broker], signal.SIGKILL)
            assert wait_gone([pid[broker]]) == []

        first.then(200)
        roam("b19", "b20")  # same cluster, same replicator
        first.then(200)
        roam("b3", "b19")  # another super-super-cluster: handed over to SSC-A/SC-1's b1
        first.wait_err("handed over to replicator b1")
        first.then(200)
        kill("b3")  # the broker it is on: the library fails over to b3's cluster
        first.wait_err("roamed b3 -> ")
        first.then(200)
        # its replicator now (and the broker it failed over to): restarted by ges up, it reads
        # back what it missed; the library fails over again meanwhile
        kill("b1")
        first.then(200)
        first.proc.send_signal(signal.SIGINT)  # away for a while (a clean disconnect)
        assert first.proc.wait(timeout=30) in (0, 1, 130), "".join(first.err.lines)
        got_first = [json.loads(line) for line in first.out.all() if line.strip()]
        time.sleep(2)  # published meanwhile is kept for it
        second = Subscriber(
            topology, "b12", up.auth, "--count", str(N - len(got_first)), "--timeout", "120"
        )
        second.wait_err("resumed durable session at b12")
        assert pub.wait(timeout=120) == 0, pub.stderr.read()
        assert len(got_first) <= N - 200, "the publisher finished before the last fault"
        assert second.proc.wait(timeout=150) == 0, "".join(second.err.lines)[-3000:]
        got = got_first + [json.loads(line) for line in second.out.all() if line.strip()]
        ns = [r["attributes"]["n"] for r in got]
        assert sorted(ns) == list(range(N)), (
            f"missing {sorted(set(range(N)) - set(ns))[:20]}, "
            f"twice {sorted(n for n in set(ns) if ns.count(n) > 1)[:20]}"
        )
        per_pubend: dict[str, list[int]] = {}
        for r in got:
            per_pubend.setdefault(r["pubend"], []).append(r["tick"])
        assert all(t == sorted(t) for t in per_pubend.values()), "out of order per publisher"
        # epochs are a replicator's: they rise within each replicator's stream, and start
        # afresh at each hand-over the subscribers said
        handed = [
            line for sub in (first, second) for line in sub.err.lines if "handed over" in line
        ]
        epochs = [r["epoch"] for r in got]
        runs = [[epochs[0]]]
        for e in epochs[1:]:
            if e > runs[-1][-1]:
                runs[-1].append(e)
            else:
                runs.append([e])
        assert 1 <= len(runs) - 1 <= len(handed), (handed, [(r[0], r[-1]) for r in runs])
        listed = ges("clients", topology, "--json", *up.auth)
        assert listed.returncode == 0, listed.stderr
        (alice,) = json.loads(listed.stdout)["sessions"]
        last = handed[-1].split("handed over to replicator ")[1].split()[0]
        assert alice["name"] == "alice" and alice["replicator"] == last
    finally:
        for proc in (pub, first and first.proc, second and second.proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
        # kept beside the brokers' logs, to read a failure
        for i, sub in enumerate((first, second)):
            if sub is not None:
                (tmp_path / f"alice-{i}.out").write_text("".join(sub.out.lines))
                (tmp_path / f"alice-{i}.err").write_text("".join(sub.err.lines))
        code = up.stop()
    assert code == 0


def test_session_commands_refuse_bad_input_in_one_line(tmp_path):
    topology = demo_on_free_ports(tmp_path)
    up = Up(topology, tmp_path / "run")
    try:
        cases = [
            (("roam", topology, "nobody", "--to", "b19"), 2, "no durable session 'nobody'"),
            (("roam", topology, "alice", "--to", "b99"), 2, "unknown broker 'b99'"),
            (("roam", topology, "bad name", "--to", "b19"), 2, "session name"),
            (("clients", "end", topology, "nobody"), 2, "no durable session 'nobody'"),
            (("subscribe", topology, "-b", "b1", "--client", "-x"), 2, "session name"),
            (("subscribe", topology, "-b", "b99", "--client", "fresh"), 2, "unknown broker 'b99'"),
            (("subscribe", topology, "-b", "b1", "--client", "x", "--max-age", "soon"), 2,
             "--max-age 'soon'"),
        ]  # fmt: skip
        for args, code, needle in cases:
            result = ges(*args, *up.auth, timeout=60)
            lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
            assert result.returncode == code and len(lines) == 1, (args, result.stderr)
            assert needle in lines[0] and "Traceback" not in result.stderr, (args, lines[0])
    finally:
        assert up.stop() == 0


def test_a_subscriber_interrupted_in_its_catch_up_acknowledges_only_what_it_printed(tmp_path):
    """^C lands anywhere in a subscriber catching up a backlog (mostly while it formats a batch):
    what it printed is acknowledged, and nothing else — each resume starts right after it."""
    topology = tmp_path / "chain3.yaml"
    topology.write_text(yaml.safe_dump(on_free_ports(CHAIN3)))
    up = Up(topology, tmp_path / "run", "--insecure")
    total, subs = 14_000, []
    try:
        up.run_json()
        sub = Subscriber(topology, "b3", up.auth, "--where", "n exists")
        sub.wait_err("opened durable session at b3")
        sub.proc.send_signal(signal.SIGINT)
        assert sub.proc.wait(timeout=30) in (0, 130)
        published = ges(
            "publish", topology, "--broker", "b1", "--count", str(total), *up.auth, timeout=120
        )
        assert published.returncode == 0, published.stderr
        got: list[dict] = []
        for _ in range(6):  # each one interrupted part way through the backlog
            sub = Subscriber(topology, "b3", up.auth)
            subs.append(sub)
            sub.wait_err("resumed durable session at b3")
            sub.out.wait_for(1)
            sub.proc.send_signal(signal.SIGINT)
            assert sub.proc.wait(timeout=30) in (0, 130), "".join(sub.err.lines)
            got += [_record(line) for line in sub.out.all() if line.strip()]
            if len(got) >= total:  # a fast machine: it printed the rest before its ^C
                break
        if len(got) < total:
            rest = Subscriber(
                topology, "b3", up.auth, "--count", str(total - len(got)), "--timeout", "60"
            )
            subs.append(rest)
            assert rest.proc.wait(timeout=90) == 0, "".join(rest.err.lines)
            got += [_record(line) for line in rest.out.all() if line.strip()]
        ns = [r["attributes"]["n"] for r in got]
        assert ns == list(range(total)), (
            f"{len(ns)} printed; missing {sorted(set(range(total)) - set(ns))[:10]}, "
            f"twice {sorted(n for n in set(ns) if ns.count(n) > 1)[:10]}"
        )
    finally:
        for i, s in enumerate(subs):
            if s.proc.poll() is None:
                s.proc.kill()
            (tmp_path / f"alice-{i}.out").write_text("".join(s.out.lines))
            (tmp_path / f"alice-{i}.err").write_text("".join(s.err.lines))
        code = up.stop()
    assert code == 0
