"""asyncio waits that a stop can always interrupt, and stop steps with a deadline.

Python 3.11's ``asyncio.wait_for`` swallows a cancellation that arrives while the awaited
future has just completed (it returns the result instead: CPython gh-86296, fixed by 3.12's
rewrite over ``asyncio.timeout``). A service loop of the form ``while True: await
wait_for(event.wait(), t)`` whose event is set right before its task is cancelled then
runs on, and the ``await task`` of its ``stop()`` never returns: a broker whose leadership
ended as it stopped (the step-down wakes the heartbeat) hung there until it was killed.
:func:`wait_event` is the same wait over ``asyncio.timeout``, which keeps the cancellation.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable

log = logging.getLogger(__name__)


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Waits until ``event`` is set or ``timeout`` seconds passed (None: no limit); returns
    whether it is set. A cancellation is never lost, whatever else happens at that moment."""
    if event.is_set():
        await asyncio.sleep(0)  # as a wait would: the loop's other tasks run between rounds
        return True
    if timeout is None:
        await event.wait()
        return True
    try:
        async with asyncio.timeout(max(timeout, 0.0)):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()


async def step_within(what: str, seconds: float, step: Awaitable[object]) -> bool:
    """Runs one stop step for at most ``seconds``; past that it is cancelled and logged, and
    the stop goes on (a process that stops must stop). Returns whether it finished in time."""
    try:
        async with asyncio.timeout(seconds):
            await step
        return True
    except TimeoutError:
        log.error("stop step did not finish in time: cancelled", extra={"fields": {"step": what,
                                                                                   "seconds": seconds}})
        return False
