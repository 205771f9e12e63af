"""TLS contexts from a network's certificate directory, and who the other end of one is.

One port of a broker serves its neighbours and its clients, so the server side asks for a
certificate without requiring one (a client may come with a token instead); what a connection
may do is decided after the handshake from the identity its certificate names
(:func:`peer_identity`), against what its ``Hello`` claims. The dialling side requires the
other end's certificate, signed by the network's CA. Host names are not checked: a broker is
known by the identity in its certificate (``ges://broker/<id>``), not by where it listens.
TLS 1.3 only.
"""

from __future__ import annotations

import ssl

from ges.errors import OperationError
from ges.security.certs import CertDir, Identity, identity_of_der


def context(certs: CertDir, me: Identity | None, *, server: bool) -> ssl.SSLContext:
    """A TLS context for ``me`` (None: a client without a certificate) trusting only the
    network's CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    files = [certs.ca_cert]
    if me is not None:
        files += [certs.cert(me.kind, me.name), certs.key(me.kind, me.name)]
    for path in files:
        if not path.exists():
            raise OperationError(
                f"{path}: missing (make the network's certificates with `ges certs init`)"
            )
    try:
        ctx.load_verify_locations(files[0])
        if me is not None:
            ctx.load_cert_chain(files[1], files[2])
    except (OSError, ssl.SSLError) as exc:
        raise OperationError(f"certificates in {certs.root}: {exc}") from None
    if server:
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def peer_identity(ssl_object) -> Identity | None:
    """Who the other end of a finished handshake proved to be (None: no certificate)."""
    der = ssl_object.getpeercert(binary_form=True)
    return None if der is None else identity_of_der(der)
