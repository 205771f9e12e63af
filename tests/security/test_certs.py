"""The network's certificates: made once, naming who holds them, and trusted only from its CA.

The handshakes are real TLS 1.3 (the standard library's ``ssl`` over trio streams in memory):
what a broker and a client will do over their sockets once the runtime uses these contexts.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from pathlib import Path

import pytest
import trio
import trio.testing
from typer.testing import CliRunner

from cli.main import app
from ges.errors import OperationError, UserInputError
from ges.security.certs import CertDir, Identity, identity_of, issue, new_ca
from ges.security.tls import context, peer_identity
from ges.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "topologies" / "demo.yaml"


@pytest.fixture(scope="module")
def demo_certs(tmp_path_factory) -> CertDir:
    certs = CertDir(tmp_path_factory.mktemp("certs"))
    topology = Topology.from_yaml(DEMO)
    certs.init("demo", {b: (s.host,) for b, s in topology.brokers.items()})
    certs.add(Identity("client", "alice", ("ops",)))
    return certs


async def handshake(server_ctx, client_ctx):
    """A TLS handshake between the two contexts; (what the server saw of the client, what the
    client saw of the server) — or the exception either side raised."""
    left, right = trio.testing.memory_stream_pair()
    server = trio.SSLStream(left, server_ctx, server_side=True)
    client = trio.SSLStream(right, client_ctx, server_side=False)
    seen: dict = {}

    async def side(name, stream):
        try:
            await stream.do_handshake()
            seen[name] = peer_identity(stream)
        except trio.BrokenResourceError as exc:
            seen[name] = exc.__cause__ or exc
            await trio.aclose_forcefully(stream.transport_stream)  # the other end sees it go

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(side, "server", server)
            nursery.start_soon(side, "client", client)
    return seen["server"], seen["client"]


def test_init_makes_a_ca_and_one_certificate_per_broker_naming_it(demo_certs):
    topology = Topology.from_yaml(DEMO)
    from cryptography import x509

    for b in topology.brokers:
        cert = x509.load_pem_x509_certificate(demo_certs.cert("broker", b).read_bytes())
        assert identity_of(cert) == Identity("broker", b)
        assert os.stat(demo_certs.key("broker", b)).st_mode & 0o777 == 0o600
    assert os.stat(demo_certs.ca_key).st_mode & 0o777 == 0o600
    assert demo_certs.network() == "demo"


def test_init_again_replaces_nothing(demo_certs):
    before = {p: p.read_bytes() for p in demo_certs.root.rglob("*") if p.is_file()}
    assert demo_certs.init("demo", {"b1": ("127.0.0.1",)}) == []
    after = {p: p.read_bytes() for p in demo_certs.root.rglob("*") if p.is_file()}
    assert after == before


def test_a_directory_of_another_network_is_refused(demo_certs):
    with pytest.raises(OperationError, match="the CA of network 'demo', not 'other'"):
        demo_certs.init("other", {})


async def test_brokers_and_clients_prove_who_they_are(demo_certs):
    b1 = context(demo_certs, Identity("broker", "b1"), server=True)
    b2 = context(demo_certs, Identity("broker", "b2"), server=False)
    assert await handshake(b1, b2) == (Identity("broker", "b2"), Identity("broker", "b1"))
    alice = context(demo_certs, Identity("client", "alice", ("ops",)), server=False)
    assert await handshake(b1, alice) == (
        Identity("client", "alice", ("ops",)),
        Identity("broker", "b1"),
    )
    # a client without a certificate still gets TLS (it may come with a token): no identity
    anonymous = context(demo_certs, None, server=False)
    assert await handshake(b1, anonymous) == (None, Identity("broker", "b1"))


def _write(certs: CertDir, identity: Identity, key, cert) -> None:
    from cryptography.hazmat.primitives import serialization

    path = certs.cert(identity.kind, identity.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key(identity.kind, identity.name).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


async def test_a_certificate_from_another_ca_is_refused_both_ways(demo_certs, tmp_path):
    # another network's CA issues a certificate naming b2: same names, wrong CA
    ca_key, ca_cert = new_ca("demo")  # even one named like ours
    forged = CertDir(tmp_path / "forged")
    forged.root.mkdir()
    from cryptography.hazmat.primitives import serialization

    forged.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    key, cert = issue(ca_key, ca_cert, Identity("broker", "b2"))
    _write(forged, Identity("broker", "b2"), key, cert)
    b1_server = context(demo_certs, Identity("broker", "b1"), server=True)
    liar = context(forged, Identity("broker", "b2"), server=False)
    server_saw, _ = await handshake(b1_server, liar)
    assert isinstance(server_saw, ssl.SSLError)  # b1 refuses it
    # and a broker dialling the forger's server refuses it too
    liar_server = context(forged, Identity("broker", "b2"), server=True)
    b1_dialling = context(demo_certs, Identity("broker", "b1"), server=False)
    _, client_saw = await handshake(liar_server, b1_dialling)
    assert isinstance(client_saw, ssl.SSLCertVerificationError)


async def test_an_expired_certificate_is_refused(demo_certs, tmp_path):
    from cryptography.hazmat.primitives import serialization

    ca_key = serialization.load_pem_private_key(demo_certs.ca_key.read_bytes(), None)
    _, ca_cert = demo_certs.load_ca()
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired = Identity("broker", "b2")
    key, cert = issue(ca_key, ca_cert, expired, now=old, days=10)
    stale = CertDir(tmp_path / "stale")
    stale.root.mkdir()
    stale.ca_cert.write_bytes(demo_certs.ca_cert.read_bytes())
    _write(stale, expired, key, cert)
    b1 = context(demo_certs, Identity("broker", "b1"), server=True)
    server_saw, _ = await handshake(b1, context(stale, expired, server=False))
    assert isinstance(server_saw, ssl.SSLError) and "expired" in str(server_saw)


def test_names_are_checked(tmp_path):
    certs = CertDir(tmp_path)
    with pytest.raises(UserInputError, match="letters, digits"):
        certs.init("demo", {"../b1": ()})
    with pytest.raises(OperationError, match="no CA here"):
        CertDir(tmp_path / "empty").add(Identity("client", "bob"))


def test_a_directory_that_cannot_be_written_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(OperationError, match=r"file/ca\.key: cannot write it"):
        CertDir(tmp_path / "file").init("demo", {})


def test_missing_certificates_are_one_clear_error(tmp_path):
    certs = CertDir(tmp_path)
    certs.init("demo", {})
    with pytest.raises(OperationError, match=r"b9\.crt: missing"):
        context(certs, Identity("broker", "b9"), server=True)


# -- the command line -------------------------------------------------------------------------------


def test_ges_certs_init_client_and_show(tmp_path):
    runner = CliRunner()
    out = str(tmp_path / "certs")
    done = runner.invoke(app, ["certs", "init", str(DEMO), "--out", out])
    assert done.exit_code == 0, done.output
    assert "CA made; 20 broker certificate(s) made" in done.output
    again = runner.invoke(app, ["certs", "init", str(DEMO), "--out", out])
    assert "CA kept; 0 broker certificate(s) made, 20 already there" in again.output
    done = runner.invoke(app, ["certs", "client", str(DEMO), "carol", "-r", "ops", "--out", out])
    assert done.exit_code == 0 and "client carol, roles ops" in done.output
    twice = runner.invoke(app, ["certs", "client", str(DEMO), "carol", "--out", out])
    assert twice.exit_code == 2 and "has a certificate already" in twice.output
    shown = runner.invoke(app, ["certs", "show", f"{out}/clients/carol.crt"])
    assert "client carol, roles ops; issued by CN=GES CA demo" in shown.output
    assert "expires in 82" in shown.output
    bad = runner.invoke(app, ["certs", "show", str(DEMO)])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "not a PEM" in bad.output
    odd = runner.invoke(app, ["certs", "client", str(DEMO), "no/slash", "--out", out])
    assert odd.exit_code == 2 and odd.output.count("\n") == 1


def test_ges_up_makes_certificates_first_and_adds_those_of_brokers_added_later(tmp_path):
    """What ``ges up`` does before starting (cli._common.network_certs): everything on the first
    start, then only what brokers added to the topology lack; a client command finds nothing
    to make and says how to get certificates."""
    from cli._common import network_certs

    data = {
        "name": "grow",
        "brokers": {"b1": {"unit": "A/c", "port": 7001}, "b2": {"unit": "A/c", "port": 7002}},
        "links": [["b1", "b2"]],
    }
    small = Topology.from_dict(data, source="<test>")
    with pytest.raises(UserInputError, match="no certificates of network grow"):
        network_certs(small, None, False, data_dir=tmp_path)
    certs = network_certs(small, None, False, data_dir=tmp_path, make=True)
    assert certs.root == tmp_path / "certs"
    assert sorted(p.name for p in certs.root.glob("*/*.crt")) == ["admin.crt", "b1.crt", "b2.crt"]
    data["brokers"]["b3"] = {"unit": "A/c", "port": 7003}
    data["links"].append(["b2", "b3"])
    grown = Topology.from_dict(data, source="<test>")
    before = certs.cert("broker", "b1").read_bytes()
    network_certs(grown, None, False, data_dir=tmp_path, make=True)
    assert certs.cert("broker", "b3").exists()
    assert certs.cert("broker", "b1").read_bytes() == before  # nothing replaced
    assert network_certs(grown, None, True) is None  # --insecure
    with pytest.raises(UserInputError, match="one or the other"):
        network_certs(grown, certs.root, True)
