"""A broker's access control at run time: the access file, reloaded when it changes; tokens
checked off the event loop; each client's grant, and each message held against it.

The policy itself — roles, users, what a grant allows — is ``ges.security.access``; this is
where it meets files, threads and time. The file is looked at (one ``stat``) once a second,
and read again (in a worker thread) only when its size, modification time or inode changed; a file that no longer parses leaves the policy as it was, with one log line. A
client's grant is worked out again after a reload, so taking a role away takes effect on
connections already open, at their next request. A token's scrypt check takes tens of
milliseconds, so it runs in a worker thread, one at a time (the handshake timeout bounds how
long a connection may wait for its turn); a token checked once is remembered (a bounded
cache keyed by a fast hash of user, stored hash and token) so a client that reconnects costs
one hash, not another scrypt.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from pathlib import Path

import attrs
import trio

from ges.errors import UserInputError
from ges.security.access import MAX_SECRET, Grant, Policy, verify_secret
from ges.security.certs import Identity
from ges.topology import parse_yaml

#: Seconds between looks at the access file.
RELOAD_EVERY = 1.0
#: The largest access file read, in bytes.
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Tokens remembered as checked.
MAX_VERIFIED = 4_096
#: Subscription checks that take more covering tests than this (~20 µs each), and publish
#: checks that take more conjunction matches than this (~0.4 µs each), run in a worker thread.
INLINE_COVER_TESTS = 64
INLINE_MATCHES = 4_096

log = logging.getLogger("ges.access")
#: What a token of a user that does not exist is checked against (never matches).
_DUMMY = "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43


def load_policy(path: Path) -> Policy:
    """The policy in an access file (a missing file: the built-in roles)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return Policy()
    except OSError as exc:
        raise UserInputError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise UserInputError(f"{path}: over {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return Policy.from_dict(parse_yaml(text, str(path)), str(path))


@attrs.define
class Admitted:
    """How a client proved who it is, and the grant that gives it under a policy version."""

    client_id: str
    cert: Identity | None
    token_ok: bool
    grant: Grant | str
    version: int
    #: the stored hash a token matched (a new token in the file ends the old one's grant)
    stored: str | None = None


class AccessControl:
    """One broker's access control: ``path`` is the access file (it need not exist)."""

    def __init__(self, path: Path | None, log_: logging.Logger | None = None):
        self.path = path
        self.log = log_ or log
        self.policy = Policy() if path is None else load_policy(path)
        self.version = 0
        self._seen = self._signature()
        self._next_look = 0.0
        self._verified: OrderedDict[bytes, bool] = OrderedDict()
        self._hashing = trio.CapacityLimiter(1)
        self._clients: dict[int, Admitted] = {}
        #: clients whose grant a reload changed, with why: the broker disconnects them
        self._changed: list[tuple[int, str]] = []

    def _signature(self):
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    async def reload_if_changed(self) -> None:
        now = trio.current_time()
        if self.path is None or now < self._next_look:
            return
        self._next_look = now + RELOAD_EVERY
        seen = self._signature()
        if seen == self._seen:
            return
        self._seen = seen
        try:
            policy = await trio.to_thread.run_sync(load_policy, self.path)
        except UserInputError as exc:
            self.log.error("access file not reloaded, the previous policy stays: %s", exc)
            return
        self.policy = policy
        self.version += 1
        self._verified.clear()
        # a client whose grant this changes is told so and disconnected (by the broker): a
        # subscription its new roles would not allow must not go on delivering
        for conn_id, admitted in self._clients.items():
            before = admitted.grant
            if self.grant(conn_id) != before:
                self._changed.append(
                    (conn_id, f"the permissions of {self.who(conn_id)} changed; connect again")
                )
        self.log.warning(
            "access file %s reloaded: %d roles, %d users",
            self.path,
            len(policy.roles),
            len(policy.users),
        )

    def take_changed(self) -> list[tuple[int, str]]:
        """The clients whose grant the last reloads changed (see :meth:`reload_if_changed`)."""
        changed, self._changed = self._changed, []
        return changed

    async def admit(self, client_id: str, cert: Identity | None, secret: str) -> Admitted:
        """Decide on a client's Hello: its grant, or in ``grant`` why it is refused."""
        await self.reload_if_changed()
        token_ok = False
        stored = None
        version = self.version
        if cert is None and secret:
            stored = self.policy.secret_of(client_id)
            token_ok = await self._check_token(client_id, stored, secret)
            if not token_ok:
                return Admitted(
                    client_id, None, False, f"no user {client_id!r} with that token", self.version
                )
            if self.version != version:  # reloaded meanwhile: the token may have been replaced
                return Admitted(
                    client_id, None, False, "the access file changed meanwhile; try again", version
                )
        grant = self.policy.admit(client_id, cert, token_ok)
        return Admitted(client_id, cert, token_ok, grant, self.version, stored)

    async def _check_token(self, name: str, stored: str | None, secret: str) -> bool:
        if len(secret) > MAX_SECRET:
            return False
        if stored is None:  # no such user: hash anyway, so the time taken does not say so
            await trio.to_thread.run_sync(verify_secret, secret, _DUMMY, limiter=self._hashing)
            return False
        key = hashlib.sha256(f"{name}\0{stored}\0{secret}".encode()).digest()
        known = self._verified.get(key)
        if known is not None:
            self._verified.move_to_end(key)
            return known
        ok = await trio.to_thread.run_sync(verify_secret, secret, stored, limiter=self._hashing)
        self._verified[key] = ok
        while len(self._verified) > MAX_VERIFIED:
            self._verified.popitem(last=False)
        return ok

    # -- connections ---------------------------------------------------------------------------

    def opened(self, conn_id: int, admitted: Admitted) -> None:
        self._clients[conn_id] = admitted

    def closed(self, conn_id: int) -> None:
        self._clients.pop(conn_id, None)

    def grant(self, conn_id: int) -> Grant | str:
        """A connection's grant under the current policy (a string: it no longer has one)."""
        admitted = self._clients.get(conn_id)
        if admitted is None:  # never happens: every client is admitted before it is served
            return "this connection was not admitted"
        if admitted.version != self.version:
            admitted.version = self.version
            if admitted.token_ok and self.policy.secret_of(admitted.client_id) != admitted.stored:
                admitted.grant = f"the token of client {admitted.client_id} was replaced"
            else:
                admitted.grant = self.policy.admit(
                    admitted.client_id, admitted.cert, admitted.token_ok
                )
        return admitted.grant

    def who(self, conn_id: int) -> str:
        admitted = self._clients.get(conn_id)
        if admitted is None:
            return "?"
        if admitted.cert is not None:
            return f"{admitted.cert} (certificate)"
        return f"client {admitted.client_id} ({'token' if admitted.token_ok else 'anonymous'})"
