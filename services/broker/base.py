"""What every part of the broker's domain shares: its in-memory state, its identifiers and
the small helpers each part stages writes with.

``BrokerCore`` (``core.py``) is assembled from parts, one module each, all over this
base: ``delivery.py`` (consumers), ``retention.py``, ``queries.py``, the checks stacked in
layers — ``schedule.py`` (the due index) under ``transactions.py`` (end, decide, discard)
under ``checks.py`` (claims, reports) — and ``core.py`` itself (start-up, sends, topics).
A part imports this module, ``model.py`` and only the layer below it, so there are no
import cycles; ``core.py`` sets the state declared here when it opens the store.

Helpers that stage writes take the operation's ``OpWrites`` (see ``store/db.py``) and
change in-memory state only as the operation commits to them (see ``core.py``).
"""

from __future__ import annotations

import random
from typing import Callable

from txmq.errors import QueueNotFoundError, TopicNotFoundError
from txmq.ids import ReceiptHandle
from txmq.names import validate_receive_topic

from .config import BrokerConfig
from .consumers import ConsumerGroups
from .idauth import IdAuthority
from .store import codec
from .store.codec import TxnRow
from .store.db import Database, OpWrites


class BrokerBase:
    """The broker's shared state (set by ``BrokerCore.__init__`` and ``_open``)."""

    config: BrokerConfig
    #: The broker (shard) name: the first part of every id it issues.
    name: str
    clock: Callable[[], int]
    db: Database
    #: Chosen when the store is created; ids of an earlier store are refused.
    store_id: int
    #: Issues and checks this store's ids (their MACs: ``idauth.py``).
    ids: IdAuthority
    #: A replicated shard's leader epoch this domain serves in (0: unreplicated). Every
    #: delivery records it and its receipt handle carries it.
    leader_epoch: int = 0
    #: The commit-log sequence the next record gets.
    next_seq: int
    consumers: ConsumerGroups
    #: Topic → queue count.
    topics: dict[str, int]
    #: The FIFO topics among them.
    fifo_topics: set[str]
    #: (topic, queue) → the offset its next entry gets.
    queue_next: dict[tuple[str, int], int]
    #: Producer group → [pending, discarded].
    counters: dict[str, list[int]]
    disk_full: bool
    free_disk_bytes: int
    visible_listeners: list[Callable[[str], None]]
    topic_listeners: list[Callable[[str], None]]
    end_listeners: list[Callable[[str, int, int], None]]
    discard_listeners: list[Callable[[str], None]]
    stored_listeners: list[Callable[[str, int], None]]
    _random: random.Random
    #: Per group, a time below which the due index holds no key (kept by the checks).
    _due_floor: dict[str, int]
    #: Per group, a time below which the pending index holds no key.
    _pending_floor: dict[str, int]

    # --- identifiers ---------------------------------------------------------------------

    def txn_id(self, seq: int) -> str:
        return self.ids.txn_id(seq)

    def parse_txn_id(self, text: str, *, cursor: bool = False) -> int:
        """The sequence of a transaction id this store issued (its MAC checked: ``idauth``);
        ``cursor``: a page token, where the MAC is not needed."""
        return self.ids.parse_txn_id(text, cursor=cursor)

    def receipt(self, topic: str, queue_id: int, offset: int, attempt: int, epoch: int = 0, *, group: str) -> str:
        return self.ids.receipt(group, topic, queue_id, offset, attempt, epoch)

    def parse_receipt(self, text: str, group: str) -> ReceiptHandle:
        """The delivery a receipt handle this store issued to ``group`` names."""
        return self.ids.parse_receipt(group, text)

    # --- reading -------------------------------------------------------------------------

    def _read_txn(self, seq: int) -> TxnRow | None:
        value = self.db.get("txn", codec.txn_key(seq))
        return codec.decode_txn(value, codec.txn_key(seq)) if value is not None else None

    def _queue_count(self, topic: str, queue_id: int | None = None) -> int:
        """The queue count of a topic consumers may read (and ``queue_id``'s check)."""
        validate_receive_topic(topic)
        count = self.topics.get(topic)
        if count is None:
            raise TopicNotFoundError(topic)
        if queue_id is not None and not 0 <= queue_id < count:
            raise QueueNotFoundError(topic, queue_id)
        return count

    def _first_time(self, cf: str, group: str, floor: int) -> int | None:
        """The earliest time in a (group, time, seq) index at or after ``floor``."""
        start = codec.group_time_key(group, floor, 0)
        for key, _ in self.db.scan(cf, start, codec.group_time_key(group, 2**63, 0)):
            return codec.split_group_time_key(key)[1]
        return None

    # --- staging -------------------------------------------------------------------------

    def _count(self, w: OpWrites, group: str, pending: int = 0, discarded: int = 0) -> None:
        counts = self.counters.setdefault(group, [0, 0])
        counts[0] += pending
        counts[1] += discarded
        w.put("counters", group.encode(), codec.encode_counters(counts[0], counts[1]))

    def _ensure_topic(self, w: OpWrites, topic: str, queue_count: int) -> bool:
        if self.topics.get(topic, 0) >= queue_count:
            return False
        old = self.topics.get(topic, 0)
        self.topics[topic] = queue_count
        for q in range(old, queue_count):
            self.queue_next.setdefault((topic, q), 0)
        w.put("topics", topic.encode(), codec.encode_u64(queue_count))
        w.on_durable(lambda: [fn(topic) for fn in self.topic_listeners])
        return True

    # --- listeners (called once the write is durable) ------------------------------------

    def _notify_stored(self, topic: str, kind: int) -> None:
        for fn in self.stored_listeners:
            fn(topic, kind)

    def _notify_visible(self, topic: str) -> None:
        for fn in self.visible_listeners:
            fn(topic)
