"""The access policy (ges.security.access): who a client is, and what its roles let it do."""

from __future__ import annotations

import pytest

from ges.errors import UserInputError
from ges.matching.model import Conjunction, conjunction_to_wire
from ges.security.access import Grant, Policy, _constraint, hash_secret, verify_secret
from ges.security.certs import Identity
from ges.wire import messages as m

SALT = bytes(range(16))

POLICY = {
    "roles": {
        "sensor": {"publish": ["@type = reading"], "subscribe": "none"},
        "dashboard": {
            "publish": "none",
            "subscribe": [["@type = reading", "site = north"], "alarm exists"],
        },
    },
    "users": {
        "alice": {"roles": ["dashboard"], "secret": hash_secret("s3cret", SALT)},
        "bob": {"roles": ["sensor"]},
    },
}


def where(*constraints: str) -> list[m.Constraint]:
    return conjunction_to_wire(Conjunction(tuple(map(_constraint, constraints))))


@pytest.fixture
def policy() -> Policy:
    return Policy.from_dict(POLICY, "access.yaml")


def test_a_secret_verifies_only_against_its_own_hash():
    stored = hash_secret("s3cret", SALT)
    assert stored.startswith("scrypt$16384$8$1$") and "s3cret" not in stored
    assert verify_secret("s3cret", stored)
    assert not verify_secret("s3cret!", stored)
    assert not verify_secret("s3cret", hash_secret("s3cret", bytes(16)).replace("scrypt", "md5"))
    assert not verify_secret("s3cret", "garbage")


def test_who_a_client_is(policy):
    bob = policy.admit("bob", Identity("client", "bob", ()), token_ok=False)
    assert isinstance(bob, Grant) and bob.roles == ("sensor",)  # from the file
    carol = policy.admit("x", Identity("client", "carol", ("operator",)), token_ok=False)
    assert carol.operator and carol.who == "carol"  # the certificate's name and roles
    dave = policy.admit("dave", Identity("client", "dave"), token_ok=False)
    assert dave.roles == ("client",) and dave.publish.every and not dave.operator
    alice = policy.admit("alice", None, token_ok=True)
    assert alice.roles == ("dashboard",)
    # a token for a user the file does not have, a broker's certificate, nobody at all
    assert "no user 'zed'" in policy.admit("zed", None, token_ok=True)
    assert "not a client's" in policy.admit("b1", Identity("broker", "b1"), token_ok=False)
    assert "prove who they are" in policy.admit("anon", None, token_ok=False)


def test_the_anonymous_get_what_an_anonymous_role_allows():
    policy = Policy.from_dict({"roles": {"anonymous": {"subscribe": "any"}}}, "a.yaml")
    grant = policy.admit("anon", None, token_ok=False)
    assert grant.subscribe_refusal([]) is None
    assert "may not publish" in grant.publish_refusal([m.Event({"n": 1})])
    # an anonymous client names itself: it may not publish idempotently, under any name
    generous = Policy.from_dict({"roles": {"anonymous": {"publish": "any"}}}, "a.yaml")
    anon = generous.admit("alice", None, token_ok=False)
    assert anon.publish_refusal([m.Event({"n": 1})]) is None
    assert "anonymous client may not publish idempotently" in anon.publish_refusal(
        [m.Event({"n": 1})], publisher="alice"
    )


def test_publish_needs_an_event_each_grant_allows(policy):
    bob = policy.admit("bob", Identity("client", "bob"), token_ok=False)
    assert bob.publish_refusal([m.Event({"@type": "reading", "v": 1})]) is None
    why = bob.publish_refusal([m.Event({"@type": "reading"}), m.Event({"@type": "quote"})])
    assert "client bob (roles: sensor) may not publish this event (number 2" in why
    assert "@type = 'reading'" in why
    alice = policy.admit("alice", None, token_ok=True)
    assert alice.publish_refusal([m.Event({})]) == "client alice (roles: dashboard) may not publish"


def test_idempotent_publishing_only_under_ones_own_name(policy):
    dave = policy.admit("dave", Identity("client", "dave"), token_ok=False)
    assert dave.publish_refusal([m.Event({})], publisher="dave") is None
    assert "only as 'dave', not as 'P'" in dave.publish_refusal([m.Event({})], publisher="P")
    admin = policy.admit("admin", Identity("client", "admin", ("operator",)), token_ok=False)
    assert admin.publish_refusal([m.Event({})], publisher="P") is None


def test_subscribe_needs_every_conjunction_covered(policy):
    alice = policy.admit("alice", None, token_ok=True)
    ok = [where("@type = reading", "site = north", "v > 3"), where("alarm = fire")]
    assert alice.subscribe_refusal(ok) is None
    wider = [where("@type = reading")]  # every site: not covered by site = north
    why = alice.subscribe_refusal(wider)
    assert "may not subscribe to @type = 'reading' (conjunction 1)" in why
    assert "its roles allow only" in why
    assert "subscribe to everything" in alice.subscribe_refusal([])  # the empty profile matches all
    bob = policy.admit("bob", Identity("client", "bob"), token_ok=False)
    assert bob.subscribe_refusal(ok) == "client bob (roles: sensor) may not subscribe"
    # a conjunction that matches nothing reveals nothing: anyone may hold it (a persistent
    # MQTT session of a publisher holds one), alongside what they may not
    nothing = [where("x = 1", "x = 2")]
    assert bob.subscribe_refusal(nothing) is None and alice.subscribe_refusal(nothing) is None
    assert bob.subscribe_refusal(nothing + ok) == "client bob (roles: sensor) may not subscribe"
    assert alice.subscribe_cost(ok) == 4 and policy.grant("x", ["client"]).subscribe_cost(ok) == 0


def test_operator_actions(policy):
    bob = policy.admit("bob", Identity("client", "bob"), token_ok=False)
    assert "may not cut a link: that needs the operator role" in bob.operator_refusal("cut a link")
    admin = policy.admit("admin", Identity("client", "admin", ("operator",)), token_ok=False)
    assert admin.operator_refusal("cut a link") is None


@pytest.mark.parametrize(
    "data, needle",
    [
        ([], "expected a mapping"),
        ({"groups": {}}, "unknown key 'groups'"),
        ({"roles": {"r": {"publish": "all"}}}, "role r: publish: expected any, none"),
        ({"roles": {"r": {"publish": ["price >"]}}}, "role r: publish:"),
        ({"roles": {"r": {"operator": "yes"}}}, "operator: expected true or false"),
        ({"roles": {"r": {"write": "any"}}}, "unknown key 'write'"),
        ({"users": {"u": {"roles": ["nope"]}}}, "role 'nope' is not defined"),
        ({"users": {"u": {"secret": "plain"}}}, "not a secret's hash"),
        ({"users": {"u": {"secret": "scrypt$1048576$8$1$AAAAAAAAAAA$" + "A" * 43}}}, "hash"),
        ({"users": {"u": {"secret": "scrypt$65536$16$1$AAAAAAAAAAA$" + "A" * 43}}}, "32 MiB"),
        ({"users": {"bad name": {}}}, "is not a name"),
    ],
)
def test_a_bad_access_file_is_one_line_naming_it(data, needle):
    with pytest.raises(UserInputError) as info:
        Policy.from_dict(data, "access.yaml")
    assert str(info.value).startswith("access.yaml") and needle in str(info.value)


def test_many_allowed_conjunctions_are_looked_up_in_a_covering_index():
    allowed = [[f"sym = S{i}", "price >= 0"] for i in range(200)] + [["@type = alarm"]]
    policy = Policy.from_dict({"roles": {"r": {"subscribe": allowed}}}, "a.yaml")
    grant = policy.grant("u", ["r"])
    assert grant.subscribe.cover_cost < 50  # bounded per query, not 201 comparisons
    assert grant.subscribe_refusal([where("sym = S150", "price > 3")]) is None
    assert grant.subscribe_refusal([where("@type = alarm", "zone = 4")]) is None
    assert "S999" in grant.subscribe_refusal([where("sym = S999", "price > 3")])
    assert "conjunction 2" in grant.subscribe_refusal(
        [where("sym = S1", "price > 1"), where("sym = S2", "price > -5")]
    )
