"""``ges link down|up`` in-process against brokers running in a thread of the test."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest
import trio
import yaml
from typer.testing import CliRunner

from cli.main import app
from ges.runtime import BrokerServer
from ges.runtime.up import wait_ready
from ges.topology import Topology


def ges(*args):
    """Run ``ges ARGS…`` in-process; stdout and stderr apart."""
    return CliRunner().invoke(app, [str(a) for a in args])


class Brokers:
    """Some brokers of a topology on trio in a background thread."""

    def __init__(self, servers, token):
        self.servers = servers
        self._token = token

    def links_up(self, bid: str) -> set[str]:
        return trio.from_thread.run_sync(
            lambda: set(self.servers[bid].core.links_up), trio_token=self._token
        )

    def cut(self, bid: str) -> set[str]:
        return trio.from_thread.run_sync(
            lambda: set(self.servers[bid]._cut), trio_token=self._token
        )

    def wait_links(self, bid: str, want: set[str], timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while self.links_up(bid) != want:
            assert time.monotonic() < end, f"{bid}: links {self.links_up(bid)}, want {want}"
            time.sleep(0.02)


@contextmanager
def running(path, only=None):
    topology = Topology.from_yaml(path)
    started = threading.Event()
    state: dict = {}

    async def main():
        async with trio.open_nursery() as nursery:
            servers = {}
            for bid in only or topology.brokers:
                servers[bid] = await nursery.start(BrokerServer(topology, bid).run)
            if only is None:
                await wait_ready(topology, timeout=10)
            state["brokers"] = Brokers(servers, trio.lowlevel.current_trio_token())
            state["scope"] = nursery.cancel_scope
            started.set()

    def thread():
        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            state["error"] = exc
            started.set()

    t = threading.Thread(target=thread, daemon=True)
    t.start()
    assert started.wait(20), "brokers did not start"
    if "error" in state:
        raise state["error"]
    try:
        yield state["brokers"]
    finally:
        trio.from_thread.run_sync(state["scope"].cancel, trio_token=state["brokers"]._token)
        t.join(10)


def one_error_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


def test_down_cuts_both_ends_and_up_restores_them(diamond_file):
    with running(diamond_file) as brokers:
        result = ges("link", "down", diamond_file, "c", "a", "--insecure")
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() == "link c–a down: cut at a, cut at c"
        assert brokers.cut("a") == {"c"} and brokers.cut("c") == {"a"}
        # down in both cores by the time the command returns (each end answers after it)
        assert brokers.links_up("a") == {"b"} and brokers.links_up("c") == {"d"}

        again = ges("link", "down", diamond_file, "a", "c", "--insecure")
        assert again.exit_code == 0, again.stderr
        assert again.stdout.strip() == "link a–c down: already cut at a, already cut at c"

        restored = ges("link", "up", diamond_file, "a", "c", "--insecure")
        assert restored.exit_code == 0, restored.stderr
        # the accepting end first, so the dialler's first try gets in
        assert restored.stdout.strip() == "link a–c up: restored at c, restored at a"
        brokers.wait_links("a", {"b", "c"})
        brokers.wait_links("c", {"a", "d"})
        assert brokers.cut("a") == set() and brokers.cut("c") == set()


def test_one_end_not_running_is_a_warning_and_the_other_end_still_acts(diamond_file):
    with running(diamond_file, only=["a", "b"]) as brokers:
        result = ges("link", "down", diamond_file, "a", "c", "--insecure")
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() == "link a–c down: cut at a"
        (warning,) = result.stderr.splitlines()
        assert warning.startswith("warning: c: cannot reach broker at 127.0.0.1:")
        assert warning.endswith("cut at a only, which neither dials c nor accepts it")
        assert brokers.cut("a") == {"c"}

        result = ges("link", "up", diamond_file, "a", "c", "--insecure")
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() == "link a–c up: restored at a"
        assert "restored at a only (c forgets a cut when it restarts)" in result.stderr
        assert brokers.cut("a") == set()


def test_neither_end_running_fails_with_exit_1(diamond_file):
    result = ges("link", "down", diamond_file, "a", "c", "--insecure")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert line.startswith("error: link a–c: cut at neither end (a: cannot reach broker at ")
    assert "; c: cannot reach broker at " in line


def test_a_command_given_another_network_of_the_same_name_is_refused(diamond_file, tmp_path):
    """The brokers run one topology, the command is given another of the same name (a link a–d
    they lack): they refuse it as another network, naming both files (issue 17, finding 6: a
    file that only shared the name could cut a running network's links)."""
    data = yaml.safe_load(diamond_file.read_text())
    data["links"].append(["a", "d"])
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(data))
    with running(diamond_file) as brokers:
        result = ges("link", "down", other, "a", "d", "--insecure")
        assert result.exit_code == 1
        line = one_error_line(result)
        assert "not the same network" in line
        assert str(other) in line and str(diamond_file) in line
        assert brokers.cut("a") == set() and brokers.cut("d") == set()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["down", "{t}", "a", "zz"], "unknown broker 'zz'"),
        (["up", "{t}", "nope", "a"], "unknown broker 'nope'"),
        (["down", "{t}", "a", "d"], "a and d are not neighbours (no link a–d in diamond)"),
        (["down", "{t}", "a", "a"], "a and a are not neighbours"),
        (["down", "{t}", "a", "c", "--timeout", "0"], "--timeout 0.0: must be > 0"),
        (["down", "{t}", "a"], "Missing argument 'B'"),
        (["sideways", "{t}", "a", "c"], "No such command 'sideways'"),
        (["down", "{m}", "a", "c"], "no such topology file"),
    ],
)
def test_bad_input_is_one_line_with_exit_2(diamond_file, tmp_path, args, needle):
    missing = tmp_path / "missing.yaml"
    args = [a.format(t=diamond_file, m=missing) for a in args]
    result = ges("link", *args, "--insecure")
    assert result.exit_code == 2, result.output
    assert needle in one_error_line(result)


@pytest.mark.parametrize("command", ["down", "up"])
def test_link_commands_have_help(command):
    result = ges("link", command, "--help")
    assert result.exit_code == 0
    assert "Usage" in result.stdout and "TOPOLOGY" in result.stdout


def test_an_end_that_accepts_but_never_answers_fails_the_command(diamond_file):
    """Only an end nobody answers at counts as unreachable; a silent listener is a failure."""
    port = Topology.from_yaml(diamond_file).brokers["c"].port
    with socket.socket() as silent, running(diamond_file, only=["a"]) as brokers:
        silent.bind(("127.0.0.1", port))
        silent.listen()
        result = ges("link", "down", diamond_file, "a", "c", "--timeout", "1", "--insecure")
        assert result.exit_code == 1
        line = one_error_line(result)
        assert line.startswith("error: link a–c: cut at a, but c failed: broker at 127.0.0.1:")
        assert "did not complete the handshake" in line
        assert brokers.cut("a") == {"c"}
