"""cli._common.write_out: a signal during a blocking write to a full pipe loses nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.e2e.test_up_e2e import ROOT

#: a process that writes 2,000 lines (about 280 KiB, over a pipe's 64 KiB) in one go, with a
#: SIGINT handler that returns (as trio's does while a signal receiver is open)
WRITER = """
import signal, sys
signal.signal(signal.SIGINT, lambda *a: None)
from cli._common import write_out
lines = "".join(f"{i:06d} {'x' * 130}\\n" for i in range(2000))
write_out(sys.stdout, lines)
"""


def _interrupted_output(writer: str) -> bytes:
    proc = subprocess.Popen(
        [sys.executable, "-c", writer],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    time.sleep(0.5)  # imported, and blocked on the full pipe (nobody reads it yet)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    assert proc.returncode == 0, err.decode()
    return out


def test_a_signal_in_a_blocked_write_loses_nothing():
    out = _interrupted_output(WRITER).decode()
    numbers = [int(line.split()[0]) for line in out.splitlines()]
    assert numbers == list(range(2000)) and out.endswith("\n")


def test_text_without_a_binary_layer_is_written_as_is():
    import io

    from cli._common import write_out

    stream = io.StringIO()
    write_out(stream, "a\nb\n")
    assert stream.getvalue() == "a\nb\n"
