"""The broker's domain, assembled: ``BrokerCore`` opens the store, checks its identity and
builds the components over one shared :class:`~services.broker.base.BrokerContext`,
each handed the components it needs:

- ``queues.py`` — :class:`Queues`: topics, queue offsets, the one append into a queue;
- ``schedule.py`` — :class:`CheckSchedule`: the due index of the checks and its floors;
- ``timers.py`` — :class:`Timers`: delay / timer messages (over the queues);
- ``transactions.py`` — :class:`Transactions`: prepare, end, decide, discard, counters
  (over the queues, the schedule and the timers), with hooks for what decisions and
  discards must also do;
- ``sends.py`` — :class:`Sends`: validation, deduplication, normal and half messages;
- ``checks.py`` — :class:`Claims`: check claims and reports, late answers;
- ``globaltx.py`` — :class:`Globals`: multi-message transactions, hooked into the
  transactions' decisions and discards; ``globalviews.py`` reads them back;
- ``delivery.py`` — :class:`Deliveries`: receive, redelivery, DLQ, ack, change-invisible;
- ``retention.py`` — :class:`Retention`; ``queries.py`` — :class:`Queries`;
- ``receivers.py`` — :class:`Receivers`: the groups' live consumers and checkers (in memory).

``BrokerCore`` is a façade over them: the service, the tools and the tests call its
operations, each the owning component's method (listed in ``__init__``).

Request methods validate their input (raising ``TxmqError`` before anything runs) and
return an *operation*, which the store applies on the thread that owns it (the event
loop). An operation first reads and decides, raising if it refuses, and only then stages
its writes and changes in-memory state, so a refused request changes nothing and an
accepted one is one WriteBatch (see ``store/db.py``). Operations run one at a time, each
seeing every earlier one's writes.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Callable

from . import idauth
from .base import BrokerContext, Listeners, Sequence
from .checks import Claims
from .config import BrokerConfig
from .consumers import ConsumerGroups, Position
from .delivery import Deliveries
from .globaltx import Globals
from .globalviews import GlobalStats, GlobalViews
from .model import Delivery, EndResult, ReceiveResult, SendResult
from .queries import Queries
from .queues import Queues
from .receivers import Receivers
from .retention import Retention
from .schedule import CheckSchedule
from .sends import Sends
from .store import codec
from .store.db import Database, OpWrites, now_ms
from .timers import Timers
from .transactions import Transactions
from .validation import parse_tag_filter

# Where they were before the split (tools and tests import them from here).
__all__ = ["BrokerCore", "Delivery", "EndResult", "ReceiveResult", "SendResult", "StateSnapshot",
           "StoreIdentityError", "open_database", "parse_tag_filter"]

log = logging.getLogger(__name__)


class StoreIdentityError(Exception):
    """The data directory belongs to another broker name."""


def open_database(config: BrokerConfig, on_fatal: Callable[[BaseException], None] | None = None) -> Database:
    """The broker's store as its configuration says (replicated when the shard has more
    than one replica)."""
    synced = config.flush == "sync"
    return Database(config.data_dir, sync=synced, on_fatal=on_fatal,
                    wal_prefill_bytes=config.wal_prefill_bytes if synced else 0,
                    max_wal_bytes=config.max_wal_bytes, replicated=config.replication_factor > 1,
                    replog_keep_entries=config.replication_log_entries)


def store_identity(db: Database, config: BrokerConfig) -> int:
    """The store's identity, chosen and written when it is new; raises
    :class:`StoreIdentityError` (closing it) when it belongs to another broker name."""
    name = db.get("meta", b"broker_name")
    if name is None:
        store_id = random.getrandbits(32) or 1

        def create(w: OpWrites) -> None:
            w.put("meta", b"broker_name", codec.frame(config.broker_name.encode()))
            w.put("meta", b"store_id", codec.encode_u64(store_id))
        db.call(create)
        return store_id
    stored_name = codec.unframe(name, "meta", b"broker_name").decode()
    if stored_name != config.broker_name:
        db.close()
        raise StoreIdentityError(
            f"data dir {config.data_dir} belongs to broker {stored_name!r}, not {config.broker_name!r}")
    return codec.decode_u64(db.get("meta", b"store_id") or b"", "meta", b"store_id")


@dataclass(frozen=True)
class StateSnapshot:
    """The domain's in-memory state as the metrics show it, copied on the event loop
    (:meth:`BrokerCore.snapshot`) so another thread never reads (or writes) it live. What
    the store holds the reader may scan itself, starting from the floors copied here."""

    now_ms: int
    #: Producer group → (pending, discarded).
    counters: dict[str, tuple[int, int]]
    #: Producer group → when its oldest PREPARED transaction was prepared (None: none).
    oldest_pending_ms: dict[str, int | None]
    #: Producer group → its due floor (time, seq): no due key below it.
    due_floors: dict[str, tuple[int, int]]
    topics: dict[str, int]
    queue_next: dict[tuple[str, int], int]
    positions: list[Position]
    globals: GlobalStats
    free_disk_bytes: int


class BrokerCore:
    """The broker's domain over one store: the components (built here, in dependency
    order) and, as attributes, each operation and read the service, tools and tests call."""

    def __init__(self, config: BrokerConfig, clock: Callable[[], int] = now_ms,
                 on_fatal: Callable[[BaseException], None] | None = None, db: Database | None = None) -> None:
        #: The store: handed in by the server (which also gives it to the bridge and, on a
        #: replicated shard, to replication), or opened here (tools and tests).
        db = db if db is not None else open_database(config, on_fatal)
        self.listeners = Listeners()
        self.ctx = ctx = BrokerContext(config=config, name=config.broker_name, store_id=store_identity(db, config),
                                       clock=clock, db=db, sequence=Sequence(db), listeners=self.listeners)
        self.config, self.name, self.clock, self.db, self.store_id = config, ctx.name, clock, db, ctx.store_id
        # The components, each over the ones it needs (no other wiring exists).
        self.queues = Queues(ctx)
        self.consumers = ConsumerGroups()
        self.consumers.load(list(db.scan("consumers")), list(db.scan("inflight")))
        ctx.ids = idauth.open_authority(
            db, ctx.name, ctx.store_id, ctx.sequence.next,
            [(g, t, q, o, e.attempt, e.epoch) for (g, t, q), c in self.consumers.cursors.items()
             for o, e in c.inflight.items()], clock, self._still_in_flight)
        #: Issues and checks this store's ids (``idauth.py``).
        self.ids = ctx.ids
        self.schedule = CheckSchedule(ctx)
        self.timers = Timers(ctx, self.queues)
        self.transactions = Transactions(ctx, self.queues, self.schedule, self.timers)
        self.sends = Sends(ctx, self.queues, self.transactions, self.timers)
        self.claims = Claims(ctx, self.schedule, self.transactions)
        self.globals = Globals(ctx, self.transactions, self.sends)
        self.global_views = GlobalViews(ctx, self.globals.state)
        self.deliveries = Deliveries(ctx, self.queues, self.consumers)
        self.retention = Retention(ctx, self.queues, self.consumers)
        self.queries = Queries(ctx, self.transactions)
        #: The groups' consumers and checkers as this broker sees them (in memory).
        self.receivers = Receivers(int(config.consumer_session_seconds * 1000), config.max_tracked_clients)
        # The operations and reads, each its owner's: what the service, tools and tests call.
        self.txn_id = ctx.txn_id
        self.parse_txn_id = ctx.parse_txn_id
        self.receipt = ctx.receipt
        self.parse_receipt = ctx.parse_receipt
        self.read_txn = ctx.read_txn
        self._read_txn = ctx.read_txn  # its name before the split (tools and tests read rows so)
        self.read_message = ctx.read_message
        self.create_topic_op = self.queues.create_topic_op
        self.queue_offsets = self.queues.queue_offsets
        self.read_queue = self.queues.read_queue
        self.validate_message = self.sends.validate_message
        self.check_disk = self.sends.check_disk
        self.send_op = self.sends.send_op
        self.end_op = self.transactions.end_op
        self.oldest_pending_ms = self.transactions.oldest_pending_ms
        self.checks_waiting = self.schedule.checks_waiting
        self.oldest_due_ms = self.schedule.oldest_due_ms
        self.claim_op = self.claims.claim_op
        self.session_claim_op = self.claims.session_claim_op
        self.report_op = self.claims.report_op
        self.timer_op = self.timers.timer_op
        self.timer_next_ms = self.timers.timer_next_ms
        self.receive_op = self.deliveries.receive_op
        self.ack_op = self.deliveries.ack_op
        self.change_invisible_op = self.deliveries.change_invisible_op
        self.dead_letter_op = self.deliveries.dead_letter_op
        self.retention_op = self.retention.retention_op
        self.get_txn = self.queries.get_txn
        self.query_txns = self.queries.query_txns
        self.recount = self.queries.recount
        self.last_txn_id = self.queries.last_txn_id
        self.global_send_op = self.globals.global_send_op
        self.apply_global_op = self.globals.apply_global_op
        self.resolve_global_op = self.globals.resolve_global_op
        self.resolve_global = self.globals.resolve_global
        self.pushes = self.globals.pushes
        self.push_done_op = self.globals.push_done_op
        self.pull_later = self.globals.pull_later
        self.due_pulls = self.globals.due_pulls
        self.next_pull_ms = self.globals.next_pull_ms
        self.describe_global = self.global_views.describe_global
        self.list_globals = self.global_views.list_globals
        self.global_stats = self.global_views.global_stats
        self.global_problems = self.global_views.global_problems
        # Where the state lives, by the names tools and tests have always used.
        self.topics = self.queues.topics
        self.fifo_topics = self.queues.fifo_topics
        self.queue_next = self.queues.queue_next
        self.counters = self.transactions.counters
        log.info("store opened", extra={"fields": {
            "data_dir": config.data_dir, "next_seq": ctx.sequence.next, "topics": len(self.topics),
            "store_id": ctx.store_id}})

    def _still_in_flight(self, d: idauth.Delivery) -> bool:
        group, topic, queue, offset, attempt, epoch = d
        cursor = self.consumers.get(group, topic, queue)
        entry = cursor.inflight.get(offset) if cursor else None
        return entry is not None and (entry.attempt, entry.epoch) == (attempt, epoch)

    def close(self) -> None:
        self.db.close()

    # --- state the server and tools set ----------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The commit-log sequence the next record gets."""
        return self.ctx.sequence.next

    @next_seq.setter
    def next_seq(self, value: int) -> None:  # tools that seed a store by hand (bench/audit.py)
        self.ctx.sequence.next = value

    @property
    def leader_epoch(self) -> int:
        """A replicated shard's leader epoch this domain serves in (0: unreplicated)."""
        return self.deliveries.leader_epoch

    @leader_epoch.setter
    def leader_epoch(self, epoch: int) -> None:
        self.deliveries.leader_epoch = epoch

    @property
    def disk_full(self) -> bool:
        return self.sends.disk_full

    @disk_full.setter
    def disk_full(self, full: bool) -> None:
        self.sends.disk_full = full

    @property
    def free_disk_bytes(self) -> int:
        return self.sends.free_disk_bytes

    @free_disk_bytes.setter
    def free_disk_bytes(self, free: int) -> None:
        self.sends.free_disk_bytes = free

    @property
    def stored_listeners(self) -> list[Callable[[str, int], None]]:
        """``listeners.stored`` by its name before the split."""
        return self.listeners.stored

    # --- the metrics' view -----------------------------------------------------------------

    def snapshot(self) -> StateSnapshot:
        """What the metrics show, copied now (on the event loop: it also moves each group's
        pending floor up to its oldest PREPARED transaction, as any read of it does)."""
        counters = {g: (c[0], c[1]) for g, c in self.counters.items()}
        return StateSnapshot(
            now_ms=self.clock(), counters=counters,
            oldest_pending_ms={g: self.transactions.oldest_pending_ms(g) for g in counters},
            due_floors=dict(self.schedule.floors), topics=dict(self.topics), queue_next=dict(self.queue_next),
            positions=self.consumers.positions(), globals=self.global_views.global_stats(),
            free_disk_bytes=self.sends.free_disk_bytes)

