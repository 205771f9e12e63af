"""``wait_ready`` counts a broker only when it answers from the process that was started for it."""

from __future__ import annotations

import os

import pytest
import trio

from ges.errors import OperationError
from ges.runtime import BrokerServer
from ges.runtime.up import wait_ready


async def start_all(nursery, topology) -> None:
    for bid in topology.brokers:
        await nursery.start(BrokerServer(topology, bid).run)


async def test_ready_when_every_broker_answers_from_its_pid(chain3):
    async with trio.open_nursery() as nursery:
        await start_all(nursery, chain3)
        reports = []
        pids = dict.fromkeys(chain3.brokers, os.getpid())
        await wait_ready(chain3, pids=pids, timeout=10, report=lambda *a: reports.append(a))
        assert reports == []
        nursery.cancel_scope.cancel()


async def test_brokers_of_another_process_do_not_count(chain3):
    """Another network on the ports: reported once per broker, never ready, named in the error."""
    other = os.getpid() + 1  # what this "ges up" started; the brokers answer with os.getpid()
    async with trio.open_nursery() as nursery:
        await start_all(nursery, chain3)
        reports: list[tuple[str, str]] = []
        with pytest.raises(OperationError) as caught:
            await wait_ready(
                chain3,
                pids=dict.fromkeys(chain3.brokers, other),
                timeout=1,
                report=lambda bid, line: reports.append((bid, line)),
            )
        nursery.cancel_scope.cancel()
    # several polls in a second, one report per broker
    assert sorted(bid for bid, _ in reports) == ["b1", "b2", "b3"]
    b1 = chain3.brokers["b1"]
    first = (
        f"broker b1 at {b1.host}:{b1.port} answers with pid {os.getpid()}, not the process "
        "this ges up started (another network on the same ports?)"
    )
    assert first in [line for _, line in reports]
    message = str(caught.value)
    assert message.startswith(first + ", and so do 2 more brokers; ")
    assert "topology chain3 not ready after 1s: brokers b1, b2, b3" in message


async def test_a_failed_check_is_reported_with_the_other_network(chain3):
    def check() -> None:
        raise OperationError("broker b2: cannot listen on …: address already in use")

    async with trio.open_nursery() as nursery:
        await start_all(nursery, chain3)
        pids = dict.fromkeys(chain3.brokers, os.getpid())
        pids["b2"] = os.getpid() + 1
        calls = 0

        def check_after_a_poll() -> None:
            nonlocal calls
            calls += 1
            if calls > 1:
                check()

        with pytest.raises(OperationError) as caught:
            await wait_ready(chain3, pids=pids, timeout=10, check=check_after_a_poll)
        nursery.cancel_scope.cancel()
    b2 = chain3.brokers["b2"]
    assert str(caught.value) == (
        f"broker b2 at {b2.host}:{b2.port} answers with pid {os.getpid()}, not the process this "
        "ges up started (another network on the same ports?); broker b2: cannot listen on …: "
        "address already in use"
    )


async def test_without_pids_any_answer_counts(chain3):
    async with trio.open_nursery() as nursery:
        await start_all(nursery, chain3)
        await wait_ready(chain3, timeout=10)
        nursery.cancel_scope.cancel()
