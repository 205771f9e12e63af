"""Client identities and permissions over real TLS sockets (issue 19): a client proves who it
is by its certificate or a token; a request its roles do not allow is refused with one clear
line to the client and one log line at the broker; the access file is read again when it
changes, also for connections already open."""

from __future__ import annotations

import logging
import math
import os

import pytest
import trio
import yaml

from ges.client import connect
from ges.errors import OperationError, PermissionDenied
from ges.matching.model import Conjunction, Constraint, Profile
from ges.runtime.broker import BrokerServer
from ges.security.access import hash_secret
from ges.security.certs import CertDir, Identity
from ges.security.tls import context
from ges.wire import messages as m
from tests.conftest import receive

TOKEN = "correct-horse-battery-staple"
READING = Constraint("@type", "eq", "reading")
NORTH = Constraint("site", "eq", "north")

ACCESS = {
    "roles": {
        "sensor": {"publish": ["@type = reading"], "subscribe": "none"},
        "dashboard": {"publish": "none", "subscribe": [["@type = reading", "site = north"]]},
    },
    "users": {
        "bob": {"roles": ["sensor"]},
        "alice": {"roles": ["dashboard"], "secret": hash_secret(TOKEN, os.urandom(16))},
    },
}


@pytest.fixture
def certs(chain3, tmp_path) -> CertDir:
    where = CertDir(tmp_path / "certs")
    where.init(chain3.name, {b: () for b in chain3.brokers})
    where.add(Identity("client", "admin", ("operator",)))
    where.add(Identity("client", "bob"))  # his roles come from the access file
    where.add(Identity("client", "carol"))  # no roles anywhere: the built-in client role
    (where.root / "access.yaml").write_text(yaml.safe_dump(ACCESS))
    return where


def tls(certs: CertDir, name: str | None):
    return context(certs, None if name is None else Identity("client", name), server=False)


async def serve(nursery, topology, certs, bid="b1") -> BrokerServer:
    server = BrokerServer(topology, bid, certs=certs)
    await nursery.start(server.run)
    return server


def at(topology, bid="b1"):
    spec = topology.brokers[bid]
    return spec.host, spec.port


async def test_who_cannot_prove_anything_is_refused_and_a_token_is_checked(chain3, certs):
    async with trio.open_nursery() as nursery:
        await serve(nursery, chain3, certs)
        with pytest.raises(OperationError, match="admits only clients that prove who they are"):
            async with connect(*at(chain3), topology=chain3, tls=tls(certs, None)):
                pass
        with pytest.raises(OperationError, match="no user 'alice' with that token"):
            async with connect(
                *at(chain3), topology=chain3, client_id="alice", tls=tls(certs, None), token="no"
            ):
                pass
        async with connect(
            *at(chain3), topology=chain3, client_id="alice", tls=tls(certs, None), token=TOKEN
        ) as alice:
            await alice.subscribe(
                [m.Constraint("@type", "=", "reading"), m.Constraint("site", "=", "north")]
            )
        with pytest.raises(ValueError, match="only over TLS"):
            async with connect(*at(chain3), client_id="alice", token=TOKEN):
                pass
        nursery.cancel_scope.cancel()


async def test_publishing_what_the_roles_do_not_allow_is_refused_in_one_line(chain3, certs, caplog):
    caplog.set_level(logging.WARNING, logger="ges.broker.b1")
    async with trio.open_nursery() as nursery:
        server = await serve(nursery, chain3, certs)
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "admin")) as watcher:
            sub = await watcher.subscribe()
            async with connect(*at(chain3), topology=chain3, tls=tls(certs, "bob")) as bob:
                await bob.publish([m.Event({"@type": "reading", "v": 1})])
                with pytest.raises(OperationError) as info:
                    await bob.publish([m.Event({"@type": "quote", "v": 2})])
            why = str(info.value)
            assert "broker b1 refused: client bob (roles: sensor) may not publish this event" in why
            assert "@type = 'reading'" in why
            (got,) = await receive(sub, 1)
            assert got.event.attributes["v"] == 1  # the quote was not published
            assert server.core.counters["published"] == 1
            assert (await watcher.stats()).requests_refused == 1
        logged = [r.getMessage() for r in caplog.records if "refused a Publish" in r.getMessage()]
        assert len(logged) == 1 and "refused a Publish of client bob (certificate)" in logged[0]
        nursery.cancel_scope.cancel()


async def test_publishing_idempotently_under_another_name_is_refused(chain3, certs):
    async with trio.open_nursery() as nursery:
        await serve(nursery, chain3, certs)
        async with connect(
            *at(chain3), topology=chain3, client_id="P", tls=tls(certs, "carol")
        ) as carol:
            with pytest.raises(OperationError, match="idempotently only as 'carol', not as 'P'"):
                await carol.publish([m.Event({"n": 1})], first=1)
        async with connect(
            *at(chain3), topology=chain3, client_id="P", tls=tls(certs, "admin")
        ) as admin:  # an operator may publish for another
            await admin.publish([m.Event({"n": 1})], first=1)
        nursery.cancel_scope.cancel()


async def test_subscribing_beyond_what_is_allowed_is_refused(chain3, certs):
    north = [m.Constraint("@type", "=", "reading"), m.Constraint("site", "=", "north")]
    async with trio.open_nursery() as nursery:
        await serve(nursery, chain3, certs)
        async with connect(
            *at(chain3), topology=chain3, client_id="alice", tls=tls(certs, None), token=TOKEN
        ) as alice:
            await alice.subscribe([*north, m.Constraint("v", ">", 3)])  # narrower: covered
            with pytest.raises(OperationError, match="may not subscribe to @type = 'reading'"):
                await alice.subscribe([m.Constraint("@type", "=", "reading")])  # every site
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "bob")) as bob:
            with pytest.raises(
                OperationError, match=r"client bob \(roles: sensor\) may not subscribe"
            ):
                await bob.subscribe(north)
        nursery.cancel_scope.cancel()


async def test_a_large_profile_is_checked_off_the_event_loop(chain3, certs):
    """4,000 conjunctions against the role's one (a worker thread runs the covering tests):
    allowed when each is covered, refused naming the first that is not."""

    def profile(last: Constraint) -> Profile:
        conjs = [Conjunction((READING, NORTH, Constraint("v", "eq", i))) for i in range(3_999)]
        return Profile("wide", (*conjs, Conjunction((READING, last))))

    async with trio.open_nursery() as nursery:
        await serve(nursery, chain3, certs)
        async with connect(
            *at(chain3), topology=chain3, client_id="alice", tls=tls(certs, None), token=TOKEN
        ) as alice:
            await alice.subscribe(profile(NORTH))
            with pytest.raises(OperationError, match=r"\(conjunction 4000\)"):
                await alice.subscribe(profile(Constraint("site", "eq", "south")))
        nursery.cancel_scope.cancel()


async def test_cutting_a_link_needs_the_operator_role(chain3, certs):
    async with trio.open_nursery() as nursery:
        await serve(nursery, chain3, certs)
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "carol")) as carol:
            with pytest.raises(OperationError, match="may not cut a link: that needs the operator"):
                await carol.link("b2", up=False)
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "admin")) as admin:
            assert await admin.link("b2", up=False) is True
        nursery.cancel_scope.cancel()


async def test_watching_the_network_needs_the_operator_role(chain3, certs):
    async with trio.open_nursery() as nursery:
        await serve(nursery, chain3, certs)
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "carol")) as carol:
            reports = await carol.watch(0.2)
            assert [r async for r in reports] == []  # ended with the connection: refused
            assert "may not watch the network: that needs the operator" in carol.closed_reason
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "admin")) as admin:
            reports = await admin.watch(0.2)
            with trio.fail_after(5):  # b1 runs alone here: its own reports, each interval
                got = [await reports.receive() for _ in range(2)]
            assert [m.opened(item).stats.broker for r in got for item in r.items] == ["b1", "b1"]
        nursery.cancel_scope.cancel()


async def test_a_changed_access_file_applies_to_open_connections(chain3, certs, caplog):
    """A client whose permissions a reload changes is told so and disconnected (a subscription
    its new roles would not allow must not go on delivering); the others stay."""
    async with trio.open_nursery() as nursery:
        await serve(nursery, chain3, certs)
        async with (
            connect(*at(chain3), topology=chain3, tls=tls(certs, "bob")) as bob,
            connect(*at(chain3), topology=chain3, tls=tls(certs, "carol")) as carol,
        ):
            await bob.publish([m.Event({"@type": "reading"})])
            sub = await carol.subscribe()
            changed = dict(ACCESS, roles=dict(ACCESS["roles"], sensor={"publish": "none"}))
            path = certs.root / "access.yaml"
            path.write_text(yaml.safe_dump(changed))
            with trio.fail_after(5):  # within about a second
                while bob.closed_reason is None:
                    await trio.sleep(0.05)
            assert "the permissions of client bob (certificate) changed" in bob.closed_reason
            with pytest.raises(PermissionDenied, match="changed; connect again"):
                await bob.publish([m.Event({"@type": "reading"})])
            await carol.publish([m.Event({"n": 7})])  # carol's grant did not change
            (got,) = await receive(sub, 1)
            assert got.event.attributes["n"] == 7
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "bob")) as bob:
            with pytest.raises(PermissionDenied, match=r"client bob \(roles: sensor\) may not"):
                await bob.publish([m.Event({"@type": "reading"})])
        # a file that no longer parses leaves the policy as it was, with one log line
        path.write_text("roles: [")
        await trio.sleep(1.5)
        assert any("access file not reloaded" in r.getMessage() for r in caplog.records)
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "carol")) as carol:
            await carol.publish([m.Event({"n": 1})])
        nursery.cancel_scope.cancel()


async def test_a_clients_own_session_leave_changes_nothing(chain3, certs):
    """A session leave with a will, an expiry or an end is the broker's to send for an MQTT
    client (its will checked as a publish first): a GES client that sends one itself publishes
    nothing through it and changes nothing of its session."""
    access = {**ACCESS, "roles": {**ACCESS["roles"], "sensor": {"publish": ["@type = reading"], "subscribe": ["@type = reading"]}}}  # fmt: skip
    (certs.root / "access.yaml").write_text(yaml.safe_dump(access))
    async with trio.open_nursery() as nursery:
        server = await serve(nursery, chain3, certs)
        async with connect(*at(chain3), topology=chain3, tls=tls(certs, "admin")) as watcher:
            sub = await watcher.subscribe()
            async with connect(*at(chain3), topology=chain3, tls=tls(certs, "bob")) as bob:
                subs = [m.SessionSub(1, "p", [[m.Constraint("@type", "=", "reading")]])]
                await bob.open_session("bobs", subs)
                quote = m.Event({"@type": "quote", "v": 666})
                await bob._send(m.SessionLeave("bobs", expiry=math.nan, will=quote))
                await bob._send(m.SessionLeave("bobs", end=True))
                await bob.publish([m.Event({"@type": "reading", "v": 1})])
                (got,) = await receive(sub, 1)
                assert got.event.attributes == {"@type": "reading", "v": 1}
                live = server.core.replicator.sessions["bobs"]
                assert live.follower is not None and live.state.expiry == 0.0
                assert live.state.will is None
        nursery.cancel_scope.cancel()
