"""A planned hand-over (``txmq broker elect``, ``TransferLeadership``): the leader refuses
every write, waits until the replica taking over holds the whole log and the commit point
covers it, then deletes its leader key naming that replica as the one to campaign (the
others hold back while the ``handover`` key lives) and steps down."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from ..coordination import ShardCoordinator
from ..store.db import Database
from .errors import ReplicaNotInSyncError
from .state import Leadership
from .term import Term


async def hand_over(lead: Leadership, term: Term, db: Database, coord: ShardCoordinator, to: int, *,
                    wait_seconds: float, handover_ttl: int, leading: Callable[[], bool],
                    step_down: Callable[[str], Awaitable[None]]) -> int:
    """Hands ``lead``'s shard to replica ``to``; returns the log end it held. Raises
    :class:`ReplicaNotInSyncError` (nothing moved) when ``to`` is not in sync, does not
    hold the log within ``wait_seconds``, or the term ends meanwhile."""
    refused = lead.refuse_transfer(to)
    if refused is not None:
        raise refused
    lead.handing_over = to  # from now on every write is refused
    try:
        deadline = time.monotonic() + wait_seconds
        # The log may end in writes that needed no sync (receives, acks): nothing syncs
        # them while writes are refused, and the commit point waits for this replica's
        # own sync too. Ask for one.
        term.bridge.when_durable(db.written, lambda: None)
        while not lead.holds_log(to, db.written):
            if time.monotonic() > deadline or not leading() or lead.refuse_transfer(to) is not None:
                raise ReplicaNotInSyncError(lead.rules.shard, to, list(lead.isr.members))
            await asyncio.sleep(0.01)
        log_end = db.written
        if not await coord.hand_over(lead.epoch, to, handover_ttl):
            raise ReplicaNotInSyncError(lead.rules.shard, to, list(lead.isr.members))
        await step_down(f"leadership handed to replica {to}")
        return log_end
    finally:
        lead.handing_over = None
