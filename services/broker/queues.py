"""Topics and their consume queues: each topic's queue count and type, each queue's next
offset, and the one way an entry enters a queue (:meth:`Queues.append`), which every path
that makes a message visible takes — a send, a commit, a discard, a dead letter, a timer
coming due.

Queue entries (``cq`` column family, keyed topic | queue | offset) name a commit-log
record; offsets are contiguous per queue, and a queue's next offset is its newest entry's
plus one, so it survives a restart (retention never removes a queue's newest entry).
"""

from __future__ import annotations

from typing import Callable, Iterable

from txmq.errors import InvalidFieldError, QueueNotFoundError, TopicNotFoundError
from txmq.names import validate_receive_topic, validate_send_topic

from .base import BrokerContext
from .store import codec
from .store.codec import CqEntry
from .store.db import OpWrites


class Queues:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        db = ctx.db
        #: Topic → queue count.
        self.topics: dict[str, int] = {}
        #: The FIFO topics among them.
        self.fifo_topics: set[str] = set()
        #: (topic, queue) → the offset its next entry gets.
        self.queue_next: dict[tuple[str, int], int] = {}
        #: (topic, queue) → the first offset consumers may not read yet (a replicated
        #: leader whose commit point is stalled sets it at its first entry above the commit
        #: point: see :meth:`readable_end`); empty: every entry is readable.
        self.read_caps: dict[tuple[str, int], int] = {}
        for key, value in db.scan("topics"):
            self.topics[key.decode()] = codec.decode_u64(value, "topic", key)
        for key, _value in db.scan("meta", codec.TOPIC_TYPE_PREFIX, codec.TOPIC_TYPE_END):
            self.fifo_topics.add(key[len(codec.TOPIC_TYPE_PREFIX):].decode())
        for topic, count in self.topics.items():
            for q in range(count):
                last = db.last_key("cq", codec.queue_prefix(topic, q))
                self.queue_next[(topic, q)] = codec.split_cq_key(last)[2] + 1 if last else 0

    # --- writing ---------------------------------------------------------------------------

    def append(self, w: OpWrites, topic: str, queue_id: int, entry: CqEntry, keys: Iterable[str] = ()) -> int:
        """Stages ``entry`` at the queue's next offset, moves the offset on, returns it. The
        message's ``keys`` go into the key index in the same batch (user topics: a message
        put into its own topic; dead letters and discards are found by their original)."""
        offset = self.queue_next[(topic, queue_id)]
        w.put("cq", codec.cq_key(topic, queue_id, offset), codec.encode_cq_entry(entry))
        self.queue_next[(topic, queue_id)] = offset + 1
        for key in set(keys):
            w.put("keys", codec.key_index_key(topic, key, queue_id, offset), codec.KEY_INDEX_VALUE)
        return offset

    def unindex(self, w: OpWrites, topic: str, queue_id: int, offset: int, keys: Iterable[str]) -> None:
        """Stages the removal of a queue entry's key-index entries (its queue entry goes)."""
        for key in set(keys):
            w.delete("keys", codec.key_index_key(topic, key, queue_id, offset))

    def ensure_topic(self, w: OpWrites, topic: str, queue_count: int) -> bool:
        """Creates ``topic`` or grows it to ``queue_count`` queues; False when it has them."""
        old = self.topics.get(topic, 0)
        if old >= queue_count:
            return False
        self.topics[topic] = queue_count
        for q in range(old, queue_count):
            self.queue_next.setdefault((topic, q), 0)
        w.put("topics", topic.encode(), codec.encode_u64(queue_count))
        w.on_durable(lambda: self.ctx.listeners.notify_topic(topic))
        return True

    def create_topic_op(self, topic: str, queue_count: int, fifo: bool | None = None) -> Callable[[OpWrites], int]:
        """Creates (or grows) ``topic``; ``fifo`` None keeps the type of an existing topic
        (NORMAL for a new one), and a type other than the existing one is refused."""
        validate_send_topic(topic)
        if not 0 < queue_count <= 1024:
            raise InvalidFieldError("queue_count", f"{queue_count} is outside 1..1024")

        def op(w: OpWrites) -> int:
            exists = topic in self.topics
            if exists and fifo is not None and fifo != (topic in self.fifo_topics):
                raise InvalidFieldError("topic_type", f"topic {topic!r} exists as "
                                        f"{'FIFO' if topic in self.fifo_topics else 'NORMAL'}")
            if not exists and fifo:
                self.fifo_topics.add(topic)
                w.put("meta", codec.topic_type_key(topic), b"")
            self.ensure_topic(w, topic, queue_count)
            return self.topics[topic]
        return op

    def remove_topic(self, w: OpWrites, topic: str) -> int:
        """Stages the removal of ``topic``: its row, type and every queue entry (the records
        stay in the log for retention); returns how many entries went."""
        entries = 0
        for q in range(self.topics.pop(topic)):
            for key, _value in self.ctx.db.scan("cq", codec.queue_prefix(topic, q), codec.cq_key(topic, q, 2**63 - 1)):
                w.delete("cq", key)
                entries += 1
            self.queue_next.pop((topic, q), None)
        prefix = codec.topic_key_prefix(topic)
        for key, _value in self.ctx.db.scan("keys", prefix, prefix[:-1] + b"\x01"):
            w.delete("keys", key)
        if topic in self.fifo_topics:
            self.fifo_topics.discard(topic)
            w.delete("meta", codec.topic_type_key(topic))
        w.delete("topics", topic.encode())
        w.on_durable(lambda: self.ctx.listeners.notify_topic(topic))
        return entries

    # --- reading ---------------------------------------------------------------------------

    def count(self, topic: str, queue_id: int | None = None) -> int:
        """The queue count of a topic consumers may read (and ``queue_id``'s check)."""
        validate_receive_topic(topic)
        count = self.topics.get(topic)
        if count is None:
            raise TopicNotFoundError(topic)
        if queue_id is not None and not 0 <= queue_id < count:
            raise QueueNotFoundError(topic, queue_id)
        return count

    def next_offset(self, topic: str, queue_id: int) -> int:
        return self.queue_next.get((topic, queue_id), 0)

    def readable_end(self, topic: str, queue_id: int) -> int:
        """Where deliveries stop reading a queue: its next offset, or the cap a replicated
        leader set while its commit point is stalled (entries from there on may not be on
        enough replicas yet, so no consumer may see them: Kafka's high watermark)."""
        end = self.queue_next.get((topic, queue_id), 0)
        cap = self.read_caps.get((topic, queue_id))
        return end if cap is None else min(end, cap)

    def cap_reads(self, caps: dict[tuple[str, int], int] | None) -> None:
        """Sets (None: lifts) the read caps of :meth:`readable_end`."""
        self.read_caps = dict(caps or {})

    def first_offset(self, topic: str, queue_id: int) -> int:
        """The oldest retained entry's offset (the next offset when the queue is empty)."""
        first = self.ctx.db.first_key("cq", codec.queue_prefix(topic, queue_id))
        return codec.split_cq_key(first)[2] if first else self.next_offset(topic, queue_id)

    def queue_offsets(self, topic: str) -> list[tuple[int, int, int]]:
        """(queue, oldest retained offset, next offset) for each queue of ``topic``."""
        return [(q, self.first_offset(topic, q), self.next_offset(topic, q)) for q in range(self.count(topic))]

    def read_queue(self, topic: str, queue_id: int, start: int, end: int, limit: int,
                   ) -> tuple[list[tuple[int, CqEntry]], int]:
        """Committed entries of one queue from ``start`` (by offset, touching no group);
        returns them and the offset to continue from."""
        self.count(topic, queue_id)
        if start < 0 or end < 0:
            raise InvalidFieldError("start_offset/end_offset", "must not be negative")
        if limit <= 0:
            raise InvalidFieldError("max_messages", "must be positive")
        limit = min(limit, self.ctx.config.max_receive_batch * 4)
        stop = self.next_offset(topic, queue_id)
        if end:
            stop = min(stop, end)
        entries: list[tuple[int, CqEntry]] = []
        next_offset = start
        if start < stop:
            for key, value in self.ctx.db.scan("cq", codec.cq_key(topic, queue_id, start),
                                               codec.cq_key(topic, queue_id, stop)):
                if len(entries) >= limit:
                    break
                offset = codec.split_cq_key(key)[2]
                entries.append((offset, codec.decode_cq_entry(value, key)))
                next_offset = offset + 1
            else:
                next_offset = max(next_offset, stop)
        return entries, next_offset
