"""End to end over TLS, as a user runs it: ``ges certs init``, ``ges up --certs`` (processes,
so each ``ges broker`` gets ``--certs`` too), ``ges subscribe``/``ges publish``/``ges link``
with ``--certs`` (issue 19, first step: TLS is opt-in)."""

from __future__ import annotations

import subprocess

import yaml

from tests.conftest import CHAIN3, on_free_ports
from tests.e2e.test_up_e2e import GES, ROOT, Up, exactly_once, ges


def test_a_network_over_tls_from_the_cli(tmp_path):
    topology = tmp_path / "chain3.yaml"
    topology.write_text(yaml.safe_dump(on_free_ports(CHAIN3)))
    certs = tmp_path / "certs"
    made = ges("certs", "init", topology, "--out", certs)
    assert made.returncode == 0, made.stderr
    up = Up(topology, tmp_path / "run", "--processes", "--certs", str(certs))
    try:
        sub = subprocess.Popen(
            [*GES, "subscribe", str(topology), "-b", "b3", "--format", "jsonl", "--count", "50",
             "--timeout", "60", "--certs", str(certs)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = sub.stderr.readline()
        assert line.startswith("subscribed at"), line + sub.stderr.read()
        pub = ges("publish", topology, "-b", "b1", "--count", "50", "--certs", certs)
        assert pub.returncode == 0, pub.stderr
        stdout, stderr = sub.communicate(timeout=90)
        assert sub.returncode == 0, stderr
        exactly_once(stdout.splitlines(), range(50))
        # without the certificates, a command gets nowhere: one line, exit 1
        plain = ges("publish", topology, "-b", "b1")
        assert plain.returncode == 1 and plain.stderr.count("\n") == 1, plain.stderr
        cut = ges("link", "down", topology, "b1", "b2", "--certs", certs)
        assert cut.returncode == 0, cut.stderr
        back = ges("link", "up", topology, "b1", "b2", "--certs", certs)
        assert back.returncode == 0, back.stderr
    finally:
        code = up.stop()
    assert code == 0


def test_ges_up_with_certs_makes_them_on_first_start(tmp_path):
    topology = tmp_path / "chain3.yaml"
    topology.write_text(yaml.safe_dump(on_free_ports(CHAIN3)))
    certs = tmp_path / "fresh"
    up = Up(topology, tmp_path / "run", "--certs", str(certs))
    try:
        assert sorted(p.name for p in (certs / "brokers").glob("*.crt")) == [
            "b1.crt",
            "b2.crt",
            "b3.crt",
        ]
        pub = ges("publish", topology, "-b", "b1", "--certs", certs)
        assert pub.returncode == 0, pub.stderr
    finally:
        code = up.stop()
    assert code == 0
