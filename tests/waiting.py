"""Waiting for an event instead of for the clock.

A test that sleeps and then asserts depends on the machine being fast enough; one that asserts
"within N seconds" measures speed, which is the benchmarks' business (DESIGN: tests assert
behaviour, not speed). These helpers poll a condition until it holds. Their timeout is only a
guard that keeps a broken build from hanging: generous enough that a loaded machine never
reaches it, and when it is reached the failure names what never happened.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

#: Seconds a wait may take before the test fails. A working build takes milliseconds to a few
#: seconds; this is only there so that a broken one fails instead of hanging.
WAIT = 30.0
#: Seconds between two looks at the condition.
POLL = 0.02


async def wait_until(
    predicate: Callable[[], Any | Awaitable[Any]],
    what: str,
    *,
    timeout: float = WAIT,
    poll: float = POLL,
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something true, and return that.

    Raises:
        AssertionError: it did not hold within ``timeout`` seconds; the message says ``what``
            was waited for.
    """
    with trio.move_on_after(timeout):
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            await trio.sleep(poll)
    raise AssertionError(f"waited {timeout:g}s for {what}, in vain")


def wait_until_sync(
    predicate: Callable[[], Any], what: str, *, timeout: float = WAIT, poll: float = 0.1
) -> Any:
    """:func:`wait_until` for tests that are not async (processes, threads)."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g}s for {what}, in vain")
        time.sleep(poll)
    return result
