"""End to end over TLS, as a user runs it: ``ges certs init``, ``ges up --certs`` (processes,
so each ``ges broker`` gets ``--certs`` too), ``ges subscribe``/``ges publish``/``ges link``
with ``--certs`` (issue 19). The other e2e tests run secure by default too."""

from __future__ import annotations

import os
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
        # without TLS, a command gets nowhere: one line, exit 1
        plain = ges("publish", topology, "-b", "b1", "--insecure")
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


ACCESS = """\
roles:
  sensor: {publish: ["@type = reading"], subscribe: none}
  dashboard: {subscribe: [["@type = reading", "site = north"]]}
"""


def test_identities_and_permissions_from_the_cli(tmp_path):
    """Secure by default (no --certs: ges up makes them in its data directory); a client
    certificate with a role, a token user; each refusal is one line and exit 1."""
    topology = tmp_path / "chain3.yaml"
    topology.write_text(yaml.safe_dump(on_free_ports(CHAIN3)))
    up = Up(topology, tmp_path / "run")
    try:
        certs = ("--certs", str(up.certs))
        made = ges("certs", "client", topology, "bob", "--role", "sensor", "--out", up.certs)
        assert made.returncode == 0, made.stderr
        (up.certs / "access.yaml").write_text(ACCESS)
        added = ges("users", "add", topology, "alice", "--role", "dashboard", *certs)
        assert added.returncode == 0, added.stderr
        token = added.stdout.splitlines()[-1].removeprefix("GES_TOKEN=")
        stored = (up.certs / "access.yaml").read_text()
        assert token not in stored and "scrypt$" in stored

        def refused(result, needle: str) -> None:
            lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
            assert result.returncode == 1 and len(lines) == 1, result.stderr
            assert needle in lines[0] and "Traceback" not in result.stderr, lines[0]

        bob = ("--client", "bob", *certs)
        refused(
            ges("publish", topology, "-b", "b1", "--type", "quote", *bob),
            "broker b1 refused: client bob (roles: sensor) may not publish this event",
        )
        ok = ges("publish", topology, "-b", "b1", "--type", "reading", *bob)
        assert ok.returncode == 0, ok.stderr
        refused(
            ges("subscribe", topology, "-b", "b3", "--count", "1", "--timeout", "5", *bob),
            "client bob (roles: sensor) may not subscribe",
        )
        refused(
            ges("link", "down", topology, "b1", "b2", *bob),
            "may not cut a link: that needs the operator role",
        )
        alice = ("--client", "alice", *certs)
        env = {**os.environ, "GES_TOKEN": token}
        refused(
            ges("subscribe", topology, "-b", "b3", "--where", "site = north", *alice, env=env),
            "client alice (roles: dashboard) may not subscribe to site = 'north'",
        )
        wrong = {**os.environ, "GES_TOKEN": "not-it"}
        refused(
            ges("subscribe", topology, "-b", "b3", *alice, env=wrong),
            "refused the connection: broker b3: no user 'alice' with that token",
        )
        # the admin certificate ges up made cuts and restores links
        assert ges("link", "down", topology, "b1", "b2", *certs).returncode == 0
        assert ges("link", "up", topology, "b1", "b2", *certs).returncode == 0
    finally:
        assert up.stop() == 0
