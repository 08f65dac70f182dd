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
from ..store import codec, replog
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
    above a commit point that cannot move (``Leadership.uncommittable``).

    **Reads while the commit point is stalled** (a lone leader: its in-sync set names a
    dead replica it cannot drop). With ``cap_reads`` (the domain's ``Queues.cap_reads``)
    :meth:`tick` caps every queue's reads at its first entry above the commit point (read
    from the replication log: what this leader inherited or wrote since), so deliveries
    show only committed messages, and while the cap is in force a write that needs no sync
    (a receive, an ack) is admitted and answered once the commit point covers what it read
    — at once — instead of refused: Kafka's consumers read up to the high watermark. Writes
    that need a sync are still refused. When the commit point can move again (a replica is
    back) the caps are lifted and such answers wait for the commit point as before. Without
    ``cap_reads`` nothing is capped and those writes are refused while stalled."""

    def __init__(self, lead: Leadership, bridge: StoreBridge, db: Callable[[], Database], *,
                 clock: Callable[[], float] = time.monotonic, on_refused: Callable[[], None] = lambda: None,
                 cap_reads: Callable[[dict[tuple[str, int], int] | None], None] | None = None) -> None:
        self.lead = lead
        self.bridge = bridge
        self._db = db
        self._clock = clock
        #: Called for every write refused with NOT_ENOUGH_REPLICAS.
        self._on_refused = on_refused
        self._cap_reads = cap_reads
        #: The read caps in force ((topic, queue) → first offset above the commit point) and
        #: the log end they were read up to (None: not capped).
        self.caps: dict[tuple[str, int], int] = {}
        self._capped_to: int | None = None
        bridge.commit_gate = lambda: lead.commit
        bridge.write_guard = lambda: self._refuse(lead.refuse_write(clock()))
        bridge.handover_guard = lambda: self._refuse(lead.refuse_any_write(
            clock(), db().read_ticket, capped=self._capped_to is not None))
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
            self._cap()
        elif self._capped_to is not None:
            self._uncap()

    @property
    def capped(self) -> bool:
        return self._capped_to is not None

    def _cap(self) -> None:
        """Caps the queues' reads at the entries above the commit point (those written
        since the last cap included) and has the bridge answer unsynced writes at it."""
        if self._cap_reads is None:
            return
        db = self._db()
        start = max(self.lead.commit, self._capped_to or 0) + 1
        if self._capped_to is not None and start > db.written:
            return
        for lsn, entry, _undo in _entries(db, start):
            for cf, key, value in replog.decode_entry(entry, replog.lsn_key(lsn))[1]:
                if cf == "cq" and value is not None:
                    topic, q, offset = codec.split_cq_key(key)
                    if offset < self.caps.get((topic, q), offset + 1):
                        self.caps[(topic, q)] = offset
        self._capped_to = db.written
        self._cap_reads(self.caps)
        self.bridge.unsynced_ceiling = lambda: self.lead.commit

    def _uncap(self) -> None:
        self.caps = {}
        self._capped_to = None
        self.bridge.unsynced_ceiling = None
        if self._cap_reads is not None:
            self._cap_reads(None)


def _entries(db: Database, first: int) -> list[tuple[int, bytes, bytes]]:
    """Every replication log entry from ``first`` on."""
    out: list[tuple[int, bytes, bytes]] = []
    while first <= db.written:
        batch = db.replication.read_entries(first, 1 << 20)
        if not batch:
            break
        out.extend(batch)
        first = batch[-1][0] + 1
    return out
