"""``ges up`` on a terminal, as a user runs it: a real subprocess on a pseudo-terminal shows the
interactive view of its network, and a key in the view stops the network cleanly (no broker
process left, exit 0)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import yaml

from tests.conftest import CHAIN3, on_free_ports

ROOT = Path(__file__).resolve().parents[2]
#: Textual's escape sequences, for reading what the screen says
ANSI = re.compile(rb"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[PX^_].*?\x1b\\|.)")


class Terminal:
    """``ges ARGS`` on a pseudo-terminal of 100 × 30; what it printed, as text."""

    def __init__(self, *args: str):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            cwd=ROOT,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        self.raw = b""

    def read_until(self, what: str, within: float) -> str:
        end = time.monotonic() + within
        while what not in self.text:
            left = end - time.monotonic()
            assert left > 0, f"not within {within}s: {what!r}; the screen: {self.text[-2000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.raw += os.read(self.master, 65536)
                except OSError:  # the process ended and closed the terminal
                    break
        return self.text

    @property
    def text(self) -> str:
        return ANSI.sub(b"", self.raw).decode("utf-8", "replace")

    def press(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_up_on_a_terminal_shows_the_view_and_q_stops_the_network(tmp_path):
    path = tmp_path / "chain3.yaml"
    path.write_text(yaml.safe_dump(on_free_ports(CHAIN3)))
    term = Terminal("up", str(path), "--insecure", "--processes", "--data-dir", str(tmp_path))
    try:
        term.read_until("ready:", within=60)
        # the interactive view: the unit tree, every broker heard through one
        term.read_until("watching through b1", within=30)
        term.read_until("b3", within=10)
        brokers = children(term.proc.pid)
        assert len(brokers) == 3  # one process per broker, children of ges up
        term.press(b"q")
        term.read_until("stopped", within=30)
        term.read_until(f"the brokers' log: {tmp_path / 'logs' / 'up.log'}", within=10)
        assert term.proc.wait(timeout=30) == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in brokers)
    finally:
        term.close()
