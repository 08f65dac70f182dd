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
import time
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


#: A stop step that takes longer than this is logged with its time (one line per slow step).
SLOW_STEP_SECONDS = 0.5


class Deadline:
    """A moment the steps of a stop share: each runs for at most its own bound and at most
    what is left, so the whole stop ends by it whatever each step waits on."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.at - time.monotonic(), 0.0)


async def step_within(what: str, seconds: float, step: Awaitable[object], deadline: Deadline | None = None) -> bool:
    """Runs one stop step for at most ``seconds`` (and at most what is left of
    ``deadline``); past that it is cancelled and logged, and the stop goes on (a process
    that stops must stop). Returns whether it finished in time. A step slower than
    :data:`SLOW_STEP_SECONDS` is logged with how long it took."""
    bound = seconds if deadline is None else min(seconds, deadline.left())
    started = time.monotonic()
    try:
        async with asyncio.timeout(bound):
            await step
    except TimeoutError:
        log.error("stop step did not finish in time: cancelled", extra={"fields": {
            "step": what, "bound_seconds": round(bound, 3), "took_seconds": round(time.monotonic() - started, 3)}})
        return False
    note_slow_step(what, started, bound)
    return True


def note_slow_step(what: str, started: float, bound: float | None = None) -> None:
    """Logs a stop step begun at ``started`` (time.monotonic) if it took
    :data:`SLOW_STEP_SECONDS` or more (``bound``: its deadline, None for one no deadline can
    cut, such as a synchronous store close)."""
    took = time.monotonic() - started
    if took >= SLOW_STEP_SECONDS:
        log.warning("slow stop step", extra={"fields": {
            "step": what, "took_seconds": round(took, 3), "bound_seconds": None if bound is None else round(bound, 3)}})
