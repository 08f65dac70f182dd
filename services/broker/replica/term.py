"""One leadership as clients see it: the :class:`Term` serving them (domain, bridge,
servicer), and the :class:`Gate` between its bridge and the term's
:class:`~.state.Leadership` — what is asked before every write, what answers wait for
(the commit point), and what fails them once the commit point cannot reach them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from txmq.errors import NotEnoughReplicasError, TxmqError

from ..bridge import StoreBridge
from ..store.db import Database
from .state import Leadership, Progress


@dataclass
class Term:
    """One leadership: the domain, the bridge and the servicer serving clients in it."""

    epoch: int
    servicer: Any
    bridge: Any
    core: Any
    close: Callable[[], Awaitable[None]] = field(default=lambda: asyncio.sleep(0))


class Gate:
    """Binds ``bridge`` to ``lead``: every write asks ``lead`` first (a refusal applies
    nothing), answers wait for its commit point, which moves with the local syncs and the
    followers' acks, and :meth:`tick` (once an election round) fails the answers waiting
    above a commit point that cannot move (``Leadership.uncommittable``)."""

    def __init__(self, lead: Leadership, bridge: StoreBridge, db: Callable[[], Database], *,
                 clock: Callable[[], float] = time.monotonic, on_refused: Callable[[], None] = lambda: None) -> None:
        self.lead = lead
        self.bridge = bridge
        self._db = db
        self._clock = clock
        #: Called for every write refused with NOT_ENOUGH_REPLICAS.
        self._on_refused = on_refused
        bridge.commit_gate = lambda: lead.commit
        bridge.write_guard = lambda: self._refuse(lead.refuse_write(clock()))
        bridge.handover_guard = lambda: self._refuse(lead.refuse_any_write(clock(), db().read_ticket))
        bridge.sync_listeners.append(lambda _durable: self.advance())

    def _refuse(self, refusal: TxmqError | None) -> None:
        if refusal is not None:
            if isinstance(refusal, NotEnoughReplicasError):
                self._on_refused()
            raise refusal

    def advance(self) -> None:
        """The commit point may move (a local sync, an ack, a new in-sync set): answers up
        to it are told."""
        if self.lead.advance_commit(self.bridge.durable):
            self._db().replication.note_commit(self.lead.commit)
            self.bridge.release()

    def acked(self, progress: Progress, durable: int) -> None:
        self.lead.ack(progress, durable, self._db().written, self._clock())
        self.advance()

    def tick(self) -> None:
        stalled = self.lead.uncommittable(self._clock())
        if stalled is not None:
            self.bridge.fail_waiting(stalled, above=self.lead.commit)
