"""Claims held on the broker: a checker's claim that finds nothing due for its session's
groups waits here (``ClaimChecksRequest.wait_ms``) instead of the checker asking again
every ``claim_interval_seconds``, and is answered as soon as one of them may fall due.

An idle checker then costs each broker about one claim per wait instead of five a second.
Nothing is held while a check of the session's groups is due, even one waiting for a
producer's free capacity: the checker claims again as its credit frees, as before.
"""

from __future__ import annotations

import asyncio
from typing import Callable

#: The longest a claim is held, whatever it asks (broker.proto).
MAX_CLAIM_WAIT_MS = 60_000


def hold_until(now_ms: int, wait_ms: int, earliest_ms: int) -> int | None:
    """Until when (broker clock) an empty claim is held: its wait's end, or sooner the
    earliest floor of the session's groups (no key of theirs is due before it); None —
    answered at once — when it asks for no wait or a check of theirs is due already."""
    if wait_ms <= 0 or earliest_ms <= now_ms:
        return None
    return min(now_ms + min(wait_ms, MAX_CLAIM_WAIT_MS), earliest_ms)


class ClaimWaits:
    """The claims held now, each until a time; a floor lowered before that time (a new half
    message's first check, a check rescheduled sooner: ``CheckSchedule.on_lowered``) ends
    their wait, and each claims again."""

    def __init__(self) -> None:
        self._held: dict[asyncio.Future[None], int] = {}

    @property
    def held(self) -> int:
        return len(self._held)

    def lowered(self, due_ms: int) -> None:
        if not self._held:  # the common case, on every half message: nothing to look at
            return
        for waiter, until in self._held.items():
            if due_ms < until and not waiter.done():
                waiter.set_result(None)

    async def hold(self, until_ms: int, clock: Callable[[], int]) -> None:
        """Returns at ``until_ms`` on ``clock`` (milliseconds), or sooner once a floor is
        lowered before it."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held[waiter] = until_ms
        try:
            await asyncio.wait_for(waiter, max(until_ms - clock(), 0) / 1000)
        except TimeoutError:
            pass
        finally:
            del self._held[waiter]
