"""A GES network's certificates: one CA, one certificate per broker, one per client (issue 19).

Theory of operation
-------------------
Every connection of a secure network is TLS, and every end proves who it is with a certificate
the network's own CA issued: brokers to each other (mutual TLS — a link is accepted only from
the broker the topology puts at its other end), clients to brokers. A certificate names its
holder in its subject alternative names as a URI — ``ges://broker/<id>`` or
``ges://client/<name>`` — so an identity never depends on a host name or address, and a
client's roles (what its permissions are looked up by) come as ``ges://role/<role>``. The CA's
subject names the topology, so a certificate of another network is refused even when it is
well formed.

The files live in one directory (``ges certs init``; ``ges up`` makes them in its data
directory on first start)::

    DIR/ca.crt  DIR/ca.key                    the network's CA (the key only where certificates
                                              are issued)
    DIR/brokers/<id>.crt  DIR/brokers/<id>.key
    DIR/clients/<name>.crt  DIR/clients/<name>.key

Private keys are written unencrypted with mode 0600 — the file's permissions are what protect
them, as with mosquitto's and NATS's key files. Keys are ECDSA P-256: small, and fast to sign
and verify in the handshake. Nothing existing is overwritten: a CA or a certificate already
there is kept, so ``init`` run again only adds what is missing.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ges.errors import OperationError, UserInputError

#: Days a CA, and a broker's or client's certificate, is valid from when it is made.
CA_DAYS = 3_650
LEAF_DAYS = 825
#: Who a certificate names: a broker id or client name (the topology's ids are of this form).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
KINDS = ("broker", "client")


@attrs.frozen
class Identity:
    """Who a certificate says its holder is."""

    kind: str  # "broker" or "client"
    name: str
    roles: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def _check_name(what: str, name: str) -> None:
    if not NAME.fullmatch(name):
        raise UserInputError(
            f"{what} {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_ca(network: str, *, now: dt.datetime | None = None, days: int = CA_DAYS):
    """A CA for the network named ``network``: ``(key, certificate)``."""
    _check_name("network", network)
    now = now or _now()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"GES network {network}"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"GES CA {network}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(
    ca_key,
    ca_cert: x509.Certificate,
    identity: Identity,
    *,
    hosts: tuple[str, ...] = (),
    now: dt.datetime | None = None,
    days: int = LEAF_DAYS,
):
    """A certificate for ``identity`` signed by the CA: ``(key, certificate)``. ``hosts`` (a
    broker's host names or addresses) go in too, for tools that check them; GES checks the
    identity URI."""
    if identity.kind not in KINDS:
        raise ValueError(f"unknown kind {identity.kind!r}")
    _check_name(identity.kind, identity.name)
    for role in identity.roles:
        _check_name("role", role)
    now = now or _now()
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(f"ges://{identity.kind}/{identity.name}")
    ]
    names += [x509.UniformResourceIdentifier(f"ges://role/{r}") for r in identity.roles]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if identity.kind == "broker":  # a broker both accepts links and dials them
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    *ca_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME),
                    x509.NameAttribute(NameOID.COMMON_NAME, f"{identity.kind} {identity.name}"),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def identity_of(cert: x509.Certificate) -> Identity | None:
    """The identity a certificate names (None if it names none)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    who = None
    roles = []
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        kind, _, name = uri.removeprefix("ges://").partition("/")
        if not uri.startswith("ges://") or not NAME.fullmatch(name):
            continue
        if kind in KINDS and who is None:
            who = (kind, name)
        elif kind == "role":
            roles.append(name)
    return None if who is None else Identity(who[0], who[1], tuple(roles))


def identity_of_der(der: bytes) -> Identity | None:
    """:func:`identity_of` a DER certificate (what ``SSLObject.getpeercert(True)`` gives)."""
    return identity_of(x509.load_der_x509_certificate(der))


# -- the directory ---------------------------------------------------------------------------------


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_new(path: Path, data: bytes, *, private: bool) -> None:
    """Write a file that must not exist yet (0600 for a key), all or nothing."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails if the file appeared meanwhile: nothing is overwritten
        tmp.unlink()
    except OSError as exc:
        raise OperationError(f"{path}: cannot write it: {exc.strerror or exc}") from None


@attrs.frozen
class CertDir:
    """A network's certificate directory (see the module docstring)."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    def cert(self, kind: str, name: str) -> Path:
        return self.root / f"{kind}s" / f"{name}.crt"

    def key(self, kind: str, name: str) -> Path:
        return self.root / f"{kind}s" / f"{name}.key"

    def load_ca(self):
        """``(key, certificate)`` of the CA (the key None if this directory lacks it)."""
        try:
            cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        except FileNotFoundError:
            raise OperationError(
                f"{self.ca_cert}: no CA here (make one with `ges certs init`)"
            ) from None
        except (OSError, ValueError) as exc:
            raise OperationError(f"{self.ca_cert}: not a readable certificate: {exc}") from None
        try:
            key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        except FileNotFoundError:
            key = None
        except (OSError, ValueError, TypeError) as exc:
            raise OperationError(f"{self.ca_key}: not a readable key: {exc}") from None
        return key, cert

    def network(self) -> str:
        """The network the CA here was made for."""
        _, cert = self.load_ca()
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        return str(cn).removeprefix("GES CA ")

    def init(self, network: str, brokers: dict[str, tuple[str, ...]]) -> list[Path]:
        """Make the CA (unless there is one, for this network) and a certificate for every
        broker in ``brokers`` (id -> hosts) that has none; returns the files written."""
        written: list[Path] = []
        if self.ca_cert.exists():
            if self.network() != network:
                raise OperationError(
                    f"{self.ca_cert}: the CA of network {self.network()!r}, not {network!r} "
                    "(use another directory)"
                )
        else:
            key, cert = new_ca(network)
            _write_new(self.ca_key, _key_pem(key), private=True)
            _write_new(self.ca_cert, _pem(cert), private=False)
            written += [self.ca_key, self.ca_cert]
        for broker, hosts in brokers.items():
            written += self.add(Identity("broker", broker), hosts=hosts)
        return written

    def add(self, identity: Identity, *, hosts: tuple[str, ...] = ()) -> list[Path]:
        """A certificate for ``identity`` unless it has one; returns the files written."""
        cert_path = self.cert(identity.kind, identity.name)
        if cert_path.exists():
            return []
        ca_key, ca_cert = self.load_ca()
        if ca_key is None:
            raise OperationError(f"{self.ca_key}: missing; certificates are issued where it is")
        key, cert = issue(ca_key, ca_cert, identity, hosts=hosts)
        key_path = self.key(identity.kind, identity.name)
        key_path.unlink(missing_ok=True)  # a key without its certificate is of no use
        _write_new(key_path, _key_pem(key), private=True)
        _write_new(cert_path, _pem(cert), private=False)
        return [key_path, cert_path]
