"""What every component of the broker's domain shares, and nothing more: the configuration,
the shard's name and store identity, the clock, the store, the commit-log sequence, the
identifiers built from them, and the listeners told of durable changes.

Each component (``queues.py``, ``schedule.py``, ``transactions.py``, ...) is built from one
:class:`BrokerContext` and the components it needs, handed to it explicitly; none reaches
into another's state. ``core.py`` builds them in order when it opens the store.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from txmq.ids import ReceiptHandle

from .config import BrokerConfig
from .idauth import IdAuthority
from .store import codec
from .store.codec import TxnRow
from .store.db import Database, OpWrites


class Sequence:
    """The commit-log sequence: every record stored takes the next number, once an
    operation has decided to stage it (a refused one takes none)."""

    def __init__(self, db: Database) -> None:
        last = db.last_key("log")
        floor = db.get("meta", b"seq_floor")
        #: The sequence the next record gets.
        self.next = max(codec.log_seq(last) + 1 if last else 1, codec.decode_u64(floor, "meta") if floor else 1)

    def take(self) -> int:
        seq = self.next
        self.next = seq + 1
        return seq


@dataclass
class Listeners:
    """Who hears of a change once it is durable (the server wires them; each list is
    called in order from the event loop)."""

    #: Messages became visible in a topic: (topic,). The service wakes long polls.
    visible: list[Callable[[str], None]] = field(default_factory=list)
    #: A topic was created or deleted: (topic,). The broker registers again.
    topic: list[Callable[[str], None]] = field(default_factory=list)
    #: A transaction was decided: (group, state, source).
    end: list[Callable[[str, int, int], None]] = field(default_factory=list)
    #: A transaction was discarded: (group,).
    discard: list[Callable[[str], None]] = field(default_factory=list)
    #: A producer group was deleted: (group,).
    producer_group_gone: list[Callable[[str], None]] = field(default_factory=list)
    #: A message was stored: (topic, kind).
    stored: list[Callable[[str, int], None]] = field(default_factory=list)
    #: A global transaction's push or pull may be due (the pump wakes).
    global_due: list[Callable[[], None]] = field(default_factory=list)
    #: A global transaction coordinated here ended: ("committed" | "rolled_back" | "discarded",).
    global_outcome: list[Callable[[str], None]] = field(default_factory=list)
    #: A timer became due earlier than the pump knew: (due_ms,).
    timer: list[Callable[[int], None]] = field(default_factory=list)
    #: Timer messages were moved into their queues: (lateness in ms of each,).
    timer_moved: list[Callable[[list[int]], None]] = field(default_factory=list)

    def notify_visible(self, topic: str) -> None:
        for fn in self.visible:
            fn(topic)

    def notify_topic(self, topic: str) -> None:
        for fn in self.topic:
            fn(topic)

    def notify_stored(self, topic: str, kind: int) -> None:
        for fn in self.stored:
            fn(topic, kind)

    def notify_end(self, group: str, state: int, source: int) -> None:
        for fn in self.end:
            fn(group, state, source)

    def notify_discard(self, group: str) -> None:
        for fn in self.discard:
            fn(group)

    def notify_producer_group_gone(self, group: str) -> None:
        for fn in self.producer_group_gone:
            fn(group)

    def notify_global_due(self) -> None:
        for fn in self.global_due:
            fn()

    def notify_global_outcome(self, result: str) -> None:
        for fn in self.global_outcome:
            fn(result)

    def notify_timer(self, due_ms: int) -> None:
        for fn in self.timer:
            fn(due_ms)

    def notify_timer_moved(self, lateness_ms: list[int]) -> None:
        for fn in self.timer_moved:
            fn(lateness_ms)


@dataclass
class BrokerContext:
    """What one domain's components share (one context per store opened: a term on a
    replicated shard builds a new one)."""

    config: BrokerConfig
    #: The broker (shard) name: the first part of every id it issues.
    name: str
    #: Chosen when the store is created; ids of an earlier store are refused.
    store_id: int
    clock: Callable[[], int]
    db: Database
    sequence: Sequence
    listeners: Listeners
    #: Check jitter and the queue a receive of every queue starts at.
    random: random.Random = field(default_factory=random.Random)
    #: Issues and checks this store's ids (their MACs: ``idauth.py``); set by ``core.py``
    #: once the deliveries in flight are loaded, before any id is issued or read.
    ids: IdAuthority | None = None

    # --- identifiers ---------------------------------------------------------------------

    def _authority(self) -> IdAuthority:
        assert self.ids is not None, "the id authority is opened with the store (core.py)"
        return self.ids

    def txn_id(self, seq: int) -> str:
        return self._authority().txn_id(seq)

    def parse_txn_id(self, text: str, *, cursor: bool = False) -> int:
        """The sequence of a transaction id this store issued (its MAC checked: ``idauth``);
        ``cursor``: a page token, where the MAC is not needed."""
        return self._authority().parse_txn_id(text, cursor=cursor)

    def receipt(self, topic: str, queue_id: int, offset: int, attempt: int, epoch: int = 0, *, group: str) -> str:
        return self._authority().receipt(group, topic, queue_id, offset, attempt, epoch)

    def parse_receipt(self, text: str, group: str) -> ReceiptHandle:
        """The delivery a receipt handle this store issued to ``group`` names."""
        return self._authority().parse_receipt(group, text)

    # --- reading the store -----------------------------------------------------------------

    def read_txn(self, seq: int) -> TxnRow | None:
        value = self.db.get("txn", codec.txn_key(seq))
        return codec.decode_txn(value, codec.txn_key(seq)) if value is not None else None

    def read_message(self, seq: int) -> codec.LogRecord | None:
        value = self.db.get("log", codec.log_key(seq))
        return codec.decode_log_record(value, codec.log_key(seq)) if value is not None else None

    def dedup_retention_ms(self) -> int:
        return int(self.config.dedup_retention_seconds * 1000)

    def expire_dedup(self, w: OpWrites, now: int, message_id: str) -> None:
        """Stages when the message id's dedup entry may go (``dedup_retention_seconds`` on)."""
        w.put("dedup_exp", codec.expiry_key(now + self.dedup_retention_ms(), message_id), b"")


def first_time(db: Database, cf: str, group: str, floor: int) -> int | None:
    """The earliest time in a (group, time, seq) index at or after ``floor``."""
    start = codec.group_time_key(group, floor, 0)
    for key, _ in db.scan(cf, start, codec.group_time_key(group, 2**63, 0)):
        return codec.split_group_time_key(key)[1]
    return None
