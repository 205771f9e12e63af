"""``--record DIR`` on a broker: a delivery record for every event it hands a local client."""

from __future__ import annotations

import json
import time

import trio
from typer.testing import CliRunner

from cli.main import app
from ges.client import connect
from ges.records import FIELD_NAMES
from ges.runtime import BrokerServer
from ges.runtime.up import wait_ready
from ges.wire import messages as m
from tests.conftest import receive


async def test_a_broker_records_what_it_hands_its_local_clients(chain3, tmp_path):
    records = tmp_path / "records"
    async with trio.open_nursery() as nursery:
        for bid in chain3.brokers:
            server = BrokerServer(
                chain3, bid, record_dir=records, record_tags={"rate": "100", "run": "a"}
            )
            await nursery.start(server.run)
        await wait_ready(chain3, timeout=10)
        s1, s3 = chain3.brokers["b1"], chain3.brokers["b3"]
        async with (
            connect(s3.host, s3.port, topology="chain3", client_id="watcher") as sub_client,
            connect(s1.host, s1.port, topology="chain3") as pub_client,
        ):
            sub = await sub_client.subscribe([m.Constraint("n", "<", 15)])
            sent = time.time_ns()
            # no publish time given: the client library stamps its clock
            await pub_client.publish([m.Event({"n": i}, b"x" * i) for i in range(20)])
            await receive(sub, 15, within=5)
        nursery.cancel_scope.cancel()
    lines = (records / "b3.records.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["tick"] for r in rows] == list(range(1, 16))
    assert all(tuple(r) == FIELD_NAMES for r in rows)
    r = rows[4]
    assert (r["pubend"], r["publisher_broker"], r["subscriber_broker"]) == (
        r["event_id"].rpartition(":")[0],
        "b1",
        "b3",
    )
    assert r["client"] == "watcher" and r["size"] == 4 and r["hops"] == 2
    assert r["tags"] == {"rate": "100", "run": "a"}
    assert sent <= r["published_at"] <= r["received_at"] <= time.time_ns()
    # brokers with no local subscriber record nothing
    assert not (records / "b2.records.jsonl").exists()


def test_a_tag_without_a_value_is_one_error_line(tmp_path):
    result = CliRunner().invoke(
        app, ["up", "topologies/demo.yaml", "--record", str(tmp_path), "--tag", "rate"]
    )
    assert result.exit_code == 2
    assert "--tag 'rate': expected KEY=VALUE" in result.output
    assert "Traceback" not in result.output
