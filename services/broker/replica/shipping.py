"""The leader's side of the replication stream: the newest entries kept in memory, and one
session per follower shipping them as it acknowledges (docs/replication.md, "The write
path" and "The replication stream").

A session answers the follower's hello with where its log must end (Kafka's
OffsetsForLeaderEpoch over the epoch history), then ships entries in order, at most
:data:`SHIP_WINDOW` frames in flight, as the very bytes the store wrote: from the in-memory
tail, or from the store's ``replog``/``undo`` column families for a follower catching up.
What it learns (acks, the session's end) goes to :class:`~.state.Leadership` through the
node's callbacks.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Callable

from ..config import BrokerConfig
from ..store import replog
from ..store.db import Database
from ..transport import Connection
from .state import Leadership, Progress
from .term import Gate

log = logging.getLogger(__name__)

#: Recent entries kept in memory for shipping (older ones are read back from the store).
TAIL_BYTES = 16 * 1024 * 1024
#: Replication messages a leader has in flight to one follower (sent, not yet covered by
#: the follower's durable position). One, as on the Produce stream: what is written while
#: the follower appends, syncs and acknowledges a message travels in the next, so each of
#: its syncs and acks covers more entries under load. Measured (docs/performance.md): 2 or
#: 4 sent 20-30 % more messages per transaction for no more throughput where the replicas
#: share the CPUs; each message costs a write and a read on both sides, which is most of a
#: replica's CPU per transaction.
SHIP_WINDOW = 1

Entry = tuple[int, bytes, bytes]


class Shipper:
    def __init__(self, config: BrokerConfig) -> None:
        self.batch_bytes = config.replication_batch_bytes
        #: Without a frame for this long a session sends a heartbeat (with the commit point).
        self.idle = config.election_poll_seconds
        #: (lsn, entry, undo record) of the newest entries, as the store wrote them.
        self._tail: collections.deque[Entry] = collections.deque()
        self._tail_bytes = 0
        self._keeping = False
        #: Every session's wake-up (a step-down or a newer session wakes them all).
        self._wake: set[asyncio.Event] = set()
        #: The sessions waiting for new entries with room to send them: only these are
        #: woken by a write (one whose message is in flight waits for its ack, which wakes it).
        self._hungry: set[asyncio.Event] = set()
        #: Replication stream messages with entries shipped (as leader).
        self.messages_shipped = 0

    def lead(self) -> None:
        """A term begins: keep what the store appends from now on."""
        self._clear()
        self._keeping = True

    def stop_leading(self) -> None:
        """The term ended: a truncation may rewrite these lsns before this replica leads
        again. Every session sees its term is over."""
        self._keeping = False
        self._clear()
        self.wake_all()

    def wake_all(self) -> None:
        for event in list(self._wake):
            event.set()

    def appended(self, entries: list[Entry]) -> None:
        """``ReplicationLog.append_listeners``: entries the store just wrote."""
        if not self._keeping:
            return
        tail = self._tail
        for entry in entries:
            if tail and tail[-1][0] != entry[0] - 1:
                self._clear()
            tail.append(entry)
            self._tail_bytes += len(entry[1]) + len(entry[2])
        while self._tail_bytes > TAIL_BYTES and tail:
            _lsn, data, undo = tail.popleft()
            self._tail_bytes -= len(data) + len(undo)
        hungry = self._hungry
        if hungry:
            for event in hungry:
                event.set()
            hungry.clear()

    def _clear(self) -> None:
        self._tail.clear()
        self._tail_bytes = 0

    def entries_from(self, db: Database, first: int) -> list[Entry]:
        """Entries from lsn ``first`` on, up to ``replication_batch_bytes``."""
        tail = self._tail
        if tail and tail[0][0] <= first <= tail[-1][0]:
            out = []
            size = 0
            i = first - tail[0][0]
            while i < len(tail) and size < self.batch_bytes:
                entry = tail[i]
                out.append(entry)
                size += len(entry[1]) + len(entry[2])
                i += 1
            return out
        return db.replication.read_entries(first, self.batch_bytes)

    async def session(self, conn: Connection, hello: tuple[str, int, int, int, int, str], db: Database,
                      lead: Leadership, gate: Gate, *, leading: Callable[[], bool],
                      on_end: Callable[[], None]) -> None:
        """A follower's session, its hello accepted by ``lead`` (``refuse_session``): the
        truncation point, then entries as it acknowledges them, while ``leading()``.
        ``on_end()`` runs when it ends, if it was the follower's newest session."""
        _shard, replica_id, _epoch, log_end, last_epoch, _token = hello
        end_epoch, end = replog.epoch_end(db.replication.epochs, last_epoch, db.written)
        truncate_to = min(log_end, end) if log_end else 0
        progress = lead.connect(replica_id, time.monotonic(), db.written)
        log.info("follower connected", extra={"fields": {
            "replica_id": replica_id, "log_end": log_end, "last_epoch": last_epoch,
            "truncate_to": truncate_to, "epoch": lead.epoch, "peer": conn.peer()}})
        try:
            await self._serve(conn, db, lead, progress, truncate_to, end_epoch, on_ack=gate.acked,
                              serving=lambda: leading() and lead.current(progress))
        finally:
            if lead.disconnect(progress, time.monotonic()):
                on_end()
            log.info("follower disconnected", extra={"fields": {"replica_id": replica_id, "durable": progress.durable}})

    async def _serve(self, conn: Connection, db: Database, lead: Leadership, progress: Progress, truncate_to: int,
                     end_epoch: int, *, serving: Callable[[], bool], on_ack: Callable[[Progress, int], None]) -> None:
        """The session after its hello: the truncation point, then entries as the follower
        acknowledges them, until ``serving()`` is false (the term ended, a newer session of
        the follower replaced this one), the follower goes, or it sends something wrong
        (``replog.FrameError``, raised: the listener refuses it)."""
        epoch = lead.epoch
        wake = asyncio.Event()
        self.wake_all()  # an older session of this replica sees it is replaced
        self._wake.add(wake)
        # At most SHIP_WINDOW messages of entries in flight, acknowledged cumulatively (the
        # follower reports its durable log end).
        acked = truncate_to  # where the follower's log ends once it has truncated
        next_lsn = truncate_to + 1
        in_flight: collections.deque[int] = collections.deque()  # each message's last lsn

        async def acks() -> None:
            nonlocal acked
            while True:
                kind, body = await conn.read()
                if kind != replog.ACK:
                    raise replog.FrameError(f"a follower sends acks, not {replog.KIND_NAMES.get(kind, kind)}")
                durable = replog.decode_ack(body)
                if durable > next_lsn - 1:
                    # Durable past what this session shipped: no follower can be; taking it
                    # would move the commit point over entries a replica may not hold.
                    raise replog.FrameError(f"ack of lsn {durable}, beyond the last shipped ({next_lsn - 1})")
                acked = max(acked, durable)
                if lead.current(progress):
                    on_ack(progress, durable)
                wake.set()

        reader: asyncio.Task[None] | None = None
        ticker: asyncio.Task[None] | None = None
        try:
            if truncate_to + 1 < db.replication.first and truncate_to < db.written:
                conn.send(replog.encode_checkpoint_needed(epoch, lead.commit))
                await conn.drain()
                return
            conn.send(replog.encode_start(epoch, lead.commit, truncate_to, end_epoch))
            reader = asyncio.ensure_future(acks())
            reader.add_done_callback(lambda _: wake.set())
            ticker = asyncio.ensure_future(_tick(wake, self.idle / 2))
            loop = asyncio.get_running_loop()
            last_sent = loop.time()
            while serving() and not reader.done():
                while in_flight and in_flight[0] <= acked:
                    in_flight.popleft()
                if next_lsn <= db.written and len(in_flight) < SHIP_WINDOW:
                    entries = self.entries_from(db, next_lsn)
                    if not entries or entries[0][0] != next_lsn:
                        conn.send(replog.encode_checkpoint_needed(epoch, lead.commit))
                        await conn.drain()
                        return
                    commit = lead.commit
                    if entries[0][0] <= commit:
                        # A follower catching up: committed entries need no undo record.
                        entries = [(lsn, data, b"" if lsn <= commit else undo) for lsn, data, undo in entries]
                    conn.send(replog.encode_entries(epoch, commit, entries))
                    await conn.drain()
                    next_lsn = entries[-1][0] + 1
                    in_flight.append(entries[-1][0])
                    self.messages_shipped += 1
                    last_sent = loop.time()
                    continue
                if loop.time() - last_sent >= self.idle:
                    # Nothing sent for a while: a heartbeat, so the follower knows its leader
                    # is alive, with the commit point. A new commit point alone is not worth
                    # a message of its own (under load that doubled the messages): it
                    # travels with the next entries, or with this heartbeat once writes pause.
                    conn.send(replog.encode_heartbeat(epoch, lead.commit))
                    await conn.drain()
                    last_sent = loop.time()
                    continue
                wake.clear()
                if len(in_flight) < SHIP_WINDOW:
                    self._hungry.add(wake)
                await wake.wait()  # new entries, an ack, the ticker, or the session's end
                self._hungry.discard(wake)
            if reader.done() and not reader.cancelled():
                error = reader.exception()
                if isinstance(error, replog.FrameError):
                    raise error
        finally:
            self._wake.discard(wake)
            self._hungry.discard(wake)
            for task in (reader, ticker):
                if task is not None:
                    task.cancel()


async def _tick(event: asyncio.Event, every: float) -> None:
    """Sets ``event`` every ``every`` seconds (a session's heartbeat clock: one timer per
    session rather than one per wait)."""
    while True:
        await asyncio.sleep(every)
        event.set()
