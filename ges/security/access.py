"""Who a client is and what it may do: a network's access policy (issue 19).

Theory of operation
-------------------
A client proves who it is in one of two ways: by a certificate of the network (``ges certs
client NAME``; its roles are in the certificate, ``ges.security.certs``) or by a token — a
secret its ``Hello`` carries over TLS, checked against a hash in the access file (``ges users
add``). A client that proves nothing is *anonymous*. What a client may do comes from its roles:

- ``publish``: which events it may publish — ``any``, ``none``, or a list of conjunctions
  (each a ``where`` string such as ``"@type = quote"``, or a list of them that must all
  hold); an event is allowed if it matches one of them.
- ``subscribe``: which profiles it may subscribe with — ``any``, ``none``, or conjunctions
  again; a subscription is allowed if each of its conjunctions is *covered* by an allowed one
  (every event it could match, an allowed conjunction matches too: seed 000 §3.3's covering
  relation, the same the routing tables use).
- ``operator``: operator actions (``ges link`` today; moving and ending other clients'
  sessions when they exist).

A client publishes idempotently (``Publish.publisher``) only under its own name, unless it is
an operator: a pubend de-duplicates by that id, so another's would suppress their events.

Two roles are built in and may be redefined in the access file: ``operator`` (everything) and
``client`` (publish and subscribe anything), which every client that proves who it is but
has no role holds. The anonymous are refused unless the file defines an ``anonymous`` role.
With no access file at all, the built-in roles are the policy: every client of the network
with a certificate publishes and subscribes; only the ``operator`` role (``ges certs init``
makes the certificate ``clients/admin`` with it) cuts links.

The access file (``access.yaml`` in the certificate directory unless named otherwise)::

    roles:
      sensor:    {publish: ["@type = reading"], subscribe: none}
      dashboard: {publish: none, subscribe: [["@type = reading", "site = north"]]}
    users:
      alice: {roles: [dashboard], secret: "scrypt$16384$8$1$<salt>$<hash>"}
      bob:   {roles: [sensor]}        # proves who he is by his certificate

Secrets are stored as scrypt hashes (RFC 7914) with a random salt; checking one costs tens of
milliseconds on purpose, so the runtime checks them off its event loop. This module is pure:
it parses, decides and hashes, and reads no file and no clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence

import attrs

from ges.errors import UserInputError
from ges.matching.cover_index import MAX_VERIFY, CoverIndex
from ges.matching.covering import Analysis, analyse, covers_analysed
from ges.matching.model import TYPE_ATTR, Conjunction, Constraint, conjunction_from_wire
from ges.matching.syntax import parse_where
from ges.security.certs import NAME, Identity

#: scrypt's cost: 2**14 rounds of 8-block mixing, 16 MiB and ~50 ms per check here.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
#: The memory a check may use (OpenSSL's default, 32 MiB, refuses N = 2**15 with r = 8).
SCRYPT_MAXMEM = 64 * 1024 * 1024
#: A secret a Hello may carry, in characters (a token ``ges users add`` makes is 43).
MAX_SECRET = 256
#: Conjunctions in one role's publish or subscribe list.
MAX_GRANTS = 1_000
#: Roles and users an access file may define.
MAX_ENTRIES = 100_000
BUILT_IN = ("operator", "client")
#: Combinations of roles whose merged permissions a policy remembers.
MAX_MERGED = 1_024
ANONYMOUS = "anonymous"


# -- secrets -----------------------------------------------------------------------------------


def hash_secret(secret: str, salt: bytes) -> str:
    """The stored form of ``secret`` (``salt``: 16 random bytes the caller draws)."""
    digest = hashlib.scrypt(
        secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32
    )
    return "$".join(
        ["scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(salt), _b64(digest)]
    )


def verify_secret(secret: str, stored: str) -> bool:
    """Does ``secret`` hash to ``stored`` (as :func:`hash_secret` wrote it)? Slow on purpose."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        want = _unb64(digest)
        got = hashlib.scrypt(
            secret.encode(),
            salt=_unb64(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(want),
            maxmem=SCRYPT_MAXMEM,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, want)


def _check_stored(stored: str, where: str) -> None:
    """Refuse a hash a broker could not check, or whose cost would hold it up."""
    parts = stored.split("$") if isinstance(stored, str) else []
    try:
        ok = (
            len(parts) == 6
            and parts[0] == "scrypt"
            and 2**10 <= int(parts[1]) <= 2**16
            and int(parts[1]) & (int(parts[1]) - 1) == 0
            and 1 <= int(parts[2]) <= 16
            and 1 <= int(parts[3]) <= 4
            and 128 * int(parts[1]) * int(parts[2]) * int(parts[3]) <= SCRYPT_MAXMEM // 2
            and 8 <= len(_unb64(parts[4])) <= 64
            and 16 <= len(_unb64(parts[5])) <= 64
        )
    except ValueError:
        ok = False
    if not ok:
        raise UserInputError(
            f"{where}: not a secret's hash as `ges users add` writes it "
            "(scrypt$N$r$p$salt$hash, N a power of two, at most 32 MiB of memory)"
        )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- grants ------------------------------------------------------------------------------------


#: Allowed conjunctions past which a subscription's are looked up in a covering index
#: (bounded work per query) rather than compared with each.
INDEX_FROM = 16


@attrs.frozen
class Allowed:
    """What a list of conjunctions allows: everything (``every``), or events matching one of
    ``conjunctions`` (none: nothing)."""

    every: bool = False
    conjunctions: tuple[Conjunction, ...] = ()
    _analysed: tuple[Analysis, ...] = attrs.field(default=(), eq=False, repr=False)
    #: many conjunctions: the indexable ones in a covering index, the heavy ones beside it
    _index: CoverIndex | None = attrs.field(default=None, eq=False, repr=False)
    _heavy: tuple[Analysis, ...] = attrs.field(default=(), eq=False, repr=False)

    @classmethod
    def of(cls, conjunctions: Iterable[Conjunction]) -> Allowed:
        conjunctions = tuple(dict.fromkeys(conjunctions))
        analysed = tuple(map(analyse, conjunctions))
        if len(analysed) < INDEX_FROM:
            return cls(False, conjunctions, analysed)
        index = CoverIndex()
        heavy = []
        for a in analysed:
            if CoverIndex.indexable(a):
                index.add(a)
            else:
                heavy.append(a)
        return cls(False, conjunctions, analysed, index, tuple(heavy))

    def __or__(self, other: Allowed) -> Allowed:
        if self.every or other.every:
            return ALL
        if not other.conjunctions:
            return self
        if not self.conjunctions:
            return other
        return Allowed.of(self.conjunctions + other.conjunctions)

    @property
    def nothing(self) -> bool:
        return not self.every and not self.conjunctions

    @property
    def cover_cost(self) -> int:
        """Full covering comparisons one query may take."""
        if self._index is None:
            return len(self._analysed)
        return MAX_VERIFY + len(self._heavy)

    def matches(self, attributes: Mapping) -> bool:
        return self.every or any(c.matches(attributes) for c in self.conjunctions)

    def covers(self, conj: Conjunction) -> bool:
        """Is every event ``conj`` matches allowed? (Sound: a True is always right; with the
        index, a cover beyond its bounds may be missed, and the subscription refused.)"""
        if self.every:
            return True
        mine = analyse(conj)
        if self._index is not None:
            if self._index.coverer(mine) is not None:
                return True
            return any(covers_analysed(a, mine) for a in self._heavy)
        return any(covers_analysed(a, mine) for a in self._analysed)

    def __str__(self) -> str:
        if self.every:
            return "any"
        if not self.conjunctions:
            return "nothing"
        shown = "; ".join(str(c) for c in self.conjunctions[:3])
        more = len(self.conjunctions) - 3
        return shown + (f"; … ({more} more)" if more > 0 else "")


ALL = Allowed(True)
NOTHING = Allowed()


@attrs.frozen
class Grant:
    """What one client may do: the union of its roles' permissions."""

    who: str
    roles: tuple[str, ...]
    publish: Allowed = NOTHING
    subscribe: Allowed = NOTHING
    operator: bool = False

    @property
    def _holder(self) -> str:
        roles = ", ".join(self.roles) or "none"
        return f"client {self.who} (roles: {roles})"

    def publish_refusal(self, events: Sequence, publisher: str = "") -> str | None:
        """Why the events of a Publish may not be published (None: they may). ``publisher``:
        the id it publishes idempotently under — the client's own name, unless an operator
        publishes for another (an id is what a pubend de-duplicates by: another's would
        suppress their events)."""
        if publisher and ANONYMOUS in self.roles:
            return "an anonymous client may not publish idempotently (it has no name of its own)"
        if publisher and publisher != self.who and not self.operator:
            return (
                f"{self._holder} may publish idempotently only as {self.who!r}, not as "
                f"{publisher!r}"
            )
        allowed = self.publish
        if allowed.every:
            return None
        for i, event in enumerate(events):
            if not allowed.matches(event.attributes):
                if allowed.nothing:
                    return f"{self._holder} may not publish"
                return (
                    f"{self._holder} may not publish this event (number {i + 1} of the batch): "
                    f"it matches none of what its roles allow ({allowed})"
                )
        return None

    def publish_cost(self, events: Sequence) -> int:
        """Conjunction matches a publish check may take (a large one runs off the loop)."""
        return 0 if self.publish.every else len(events) * len(self.publish.conjunctions)

    def subscribe_cost(self, conjunctions: Sequence) -> int:
        """Covering tests a subscription check may take (the runtime runs a large one off its
        event loop)."""
        return 0 if self.subscribe.every else max(1, len(conjunctions)) * self.subscribe.cover_cost

    def subscribe_refusal(self, conjunctions: Sequence) -> str | None:
        """Why a subscription with these wire conjunctions is not allowed (None: it is)."""
        allowed = self.subscribe
        if allowed.every:
            return None
        for i, items in enumerate(conjunctions or [[]]):
            try:
                conj = conjunction_from_wire(items)
            except ValueError:
                return None  # not a valid profile: the broker says so itself
            if not allowed.nothing and allowed.covers(conj):
                continue
            if analyse(conj).members is None:
                continue  # matches nothing, so reveals nothing (an MQTT session's placeholder)
            if allowed.nothing:
                return f"{self._holder} may not subscribe"
            return (
                f"{self._holder} may not subscribe to {conj} "
                f"(conjunction {i + 1}): its roles allow only ({allowed})"
            )
        return None

    def operator_refusal(self, action: str) -> str | None:
        if self.operator:
            return None
        return f"{self._holder} may not {action}: that needs the operator role"


# -- the policy --------------------------------------------------------------------------------


@attrs.frozen
class Role:
    publish: Allowed = NOTHING
    subscribe: Allowed = NOTHING
    operator: bool = False


@attrs.frozen
class User:
    roles: tuple[str, ...] = ()
    secret: str | None = None


DEFAULT_ROLES = {
    "operator": Role(ALL, ALL, True),
    "client": Role(ALL, ALL, False),
}


@attrs.frozen
class Policy:
    """Roles and users (see the module docstring); :meth:`from_dict` parses an access file."""

    roles: Mapping[str, Role] = attrs.field(factory=lambda: dict(DEFAULT_ROLES))
    users: Mapping[str, User] = attrs.field(factory=dict)
    #: the permissions of each combination of roles asked for, merged once
    _merged: dict = attrs.field(factory=dict, init=False, eq=False, repr=False)

    @classmethod
    def from_dict(cls, data, where: str) -> Policy:
        """Parse an access file's content; anything wrong is one UserInputError naming it."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise UserInputError(f"{where}: expected a mapping with roles: and users:")
        unknown = set(data) - {"roles", "users"}
        if unknown:
            raise UserInputError(f"{where}: unknown key {sorted(unknown)[0]!r} (roles, users)")
        roles = dict(DEFAULT_ROLES)
        raw_roles = _mapping(data.get("roles"), f"{where}: roles")
        for name, spec in raw_roles.items():
            roles[_name(name, f"{where}: roles")] = _role(spec, f"{where}: role {name}")
        users = {}
        raw_users = _mapping(data.get("users"), f"{where}: users")
        for name, spec in raw_users.items():
            here = f"{where}: user {name}"
            _name(name, f"{where}: users")
            spec = _mapping(spec, here)
            bad = set(spec) - {"roles", "secret"}
            if bad:
                raise UserInputError(f"{here}: unknown key {sorted(bad)[0]!r} (roles, secret)")
            user_roles = spec.get("roles") or []
            if not isinstance(user_roles, list) or not all(isinstance(r, str) for r in user_roles):
                raise UserInputError(f"{here}: roles: expected a list of role names")
            for role in user_roles:
                if role not in roles:
                    raise UserInputError(f"{here}: role {role!r} is not defined under roles:")
            secret = spec.get("secret")
            if secret is not None:
                _check_stored(secret, f"{here}: secret")
            users[name] = User(tuple(user_roles), secret)
        if len(roles) + len(users) > MAX_ENTRIES:
            raise UserInputError(f"{where}: over {MAX_ENTRIES} roles and users")
        return cls(roles, users)

    def to_dict(self) -> dict:
        """The users part as an access file stores it (for ``ges users add``)."""
        return {
            name: {
                k: v
                for k, v in (("roles", list(u.roles)), ("secret", u.secret))
                if v or k == "roles"
            }
            for name, u in self.users.items()
        }

    def secret_of(self, name: str) -> str | None:
        user = self.users.get(name)
        return None if user is None else user.secret

    def admit(self, client_id: str, cert: Identity | None, token_ok: bool) -> Grant | str:
        """The grant of a client that says it is ``client_id``, proved by ``cert`` (its
        certificate's identity, None without one) or by a token (``token_ok``: its secret
        matched ``client_id``'s hash); or why it is refused."""
        if cert is not None and cert.kind != "client":
            return f"the certificate of {cert} is not a client's"
        if cert is not None:
            name, roles = cert.name, list(cert.roles)
        elif token_ok:
            if self.secret_of(client_id) is None:  # the file no longer has that user's token
                return f"no user {client_id!r} with a token"
            name, roles = client_id, []
        elif ANONYMOUS in self.roles:
            return self.grant(client_id, [ANONYMOUS])
        else:
            return (
                "this broker admits only clients that prove who they are: a certificate of "
                "the network (ges certs client) or a token (GES_TOKEN, ges users add)"
            )
        user = self.users.get(name)
        if user is not None:
            roles += [r for r in user.roles if r not in roles]
        return self.grant(name, roles or ["client"])

    def grant(self, who: str, roles: Sequence[str]) -> Grant:
        roles = tuple(roles)
        merged = self._merged.get(roles)
        if merged is None:  # merging roles can rebuild a covering index: once per policy
            publish = subscribe = NOTHING
            operator = False
            for name in roles:
                role = self.roles.get(name)
                if role is None:  # a role in a certificate that the policy does not define
                    continue
                publish |= role.publish
                subscribe |= role.subscribe
                operator = operator or role.operator
            merged = (publish, subscribe, operator)
            if len(self._merged) < MAX_MERGED:
                self._merged[roles] = merged
        return Grant(who, roles, *merged)


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserInputError(f"{where}: expected a mapping")
    return value


def _name(name, where: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UserInputError(f"{where}: {name!r} is not a name (letters, digits, . _ -)")
    return name


def _role(spec, where: str) -> Role:
    spec = _mapping(spec, where)
    bad = set(spec) - {"publish", "subscribe", "operator"}
    if bad:
        raise UserInputError(
            f"{where}: unknown key {sorted(bad)[0]!r} (publish, subscribe, operator)"
        )
    operator = spec.get("operator", False)
    if not isinstance(operator, bool):
        raise UserInputError(f"{where}: operator: expected true or false")
    return Role(
        _allowed(spec.get("publish", "none"), f"{where}: publish"),
        _allowed(spec.get("subscribe", "none"), f"{where}: subscribe"),
        operator,
    )


def _constraint(text: str) -> Constraint:
    """A ``where`` string, or one on the event type (``@type = quote``, which ``--where``
    leaves to ``--type``)."""
    head = text.lstrip()
    if not head.startswith(TYPE_ATTR):
        return parse_where(text)
    c = parse_where("t" + head[len(TYPE_ATTR) :])
    return Constraint(TYPE_ATTR, c.op, c.value)


def _allowed(spec, where: str) -> Allowed:
    if spec == "any":
        return ALL
    if spec == "none" or spec is None:
        return NOTHING
    if not isinstance(spec, list):
        raise UserInputError(f"{where}: expected any, none, or a list of conjunctions")
    if len(spec) > MAX_GRANTS:
        raise UserInputError(f"{where}: over {MAX_GRANTS} conjunctions")
    out = []
    for item in spec:
        parts = [item] if isinstance(item, str) else item
        if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
            raise UserInputError(
                f'{where}: {item!r}: expected a constraint such as "@type = quote", or a '
                "list of them"
            )
        try:
            out.append(Conjunction(tuple(map(_constraint, parts))))
        except (UserInputError, ValueError) as exc:
            raise UserInputError(f"{where}: {exc}") from None
    return Allowed.of(out)
