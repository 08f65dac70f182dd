"""Finding messages on this broker, as an operator does (``mqadmin queryMsgById /
queryMsgByKey``, Kafka's console consumer with ``--partition --offset``): by message id, by
key, and by queue and offset. Reads only; nothing is delivered to anyone.

- **By message id**: the deduplication entry names the message's record, so an id is found
  for as long as it is deduplicated (``dedup_retention_seconds`` after its send or its
  transaction's decision, 24 h by default) and its record is retained. A half message is
  answered with its transaction's state (and its queue position once committed): a
  committed one is a message of its topic, an undecided one is for the ``txn`` tools.
- **By key**: the key index (``keys`` family, written in the batch that puts a message into
  its topic's queue: a send, a commit, a delay coming due; removed with its queue entry).
  So a transactional message is found by key once committed, never as a half message.
- **By queue and offset**: the queue itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from txmq.errors import InvalidFieldError, NotFoundError
from txmq.names import validate_receive_topic

from .core import BrokerCore
from .model import KIND_HALF, MAX_KEY_BYTES, STATE_COMMITTED
from .store import codec
from .store.codec import LogRecord

#: Most messages one lookup answers.
MAX_LOOKUP = 1000
DEFAULT_LOOKUP = 32
#: Key-index entries one lookup by key reads at most (newest first is a sort of these).
MAX_KEY_SCAN = 100_000


@dataclass(frozen=True, slots=True)
class Found:
    record: LogRecord
    topic: str
    queue_id: int
    #: -1: not in its queue (a half message not committed, or a delay not yet due).
    queue_offset: int
    visible_ms: int
    #: Transactional messages: the transaction id and state (0 for a normal message).
    transaction_id: str = ""
    state: int = 0
    scheduled: bool = False


class MessageGoneError(NotFoundError):
    reason = "MESSAGE_NOT_FOUND"

    def __init__(self, message_id: str, why: str) -> None:
        super().__init__(f"message {message_id!r}: {why}", message_id=message_id)


def _limit(limit: int) -> int:
    if limit < 0:
        raise InvalidFieldError("limit", f"must not be negative, got {limit}")
    if limit > MAX_LOOKUP:
        raise InvalidFieldError("limit", f"at most {MAX_LOOKUP}, got {limit}")
    return limit or DEFAULT_LOOKUP


def by_message_id(core: BrokerCore, message_id: str) -> Found:
    if not message_id:
        raise InvalidFieldError("message_id", "required")
    value = core.db.get("dedup", message_id.encode())
    if value is None:
        raise MessageGoneError(message_id, f"not known to {core.name} (never sent here, or older than its "
                                           "deduplication window, dedup_retention_seconds)")
    entry = codec.decode_dedup(value, message_id.encode())
    record = core.read_message(entry.seq)
    if record is None:
        raise MessageGoneError(message_id, "removed by retention")
    if record.kind == KIND_HALF:
        row = core.read_txn(entry.seq)
        if row is None:
            raise MessageGoneError(message_id, "its transaction was removed by retention")
        offset = row.queue_offset if row.state == STATE_COMMITTED else -1
        return Found(record, row.topic, row.queue_id, offset, _visible(core, row.topic, row.queue_id, offset),
                     core.txn_id(entry.seq), row.state,
                     scheduled=row.state == STATE_COMMITTED and offset < 0)
    offset = record.queue_offset
    return Found(record, record.topic, record.queue_id, offset, _visible(core, record.topic, record.queue_id, offset),
                 scheduled=offset < 0)


def _visible(core: BrokerCore, topic: str, q: int, offset: int) -> int:
    if offset < 0:
        return 0
    value = core.db.get("cq", codec.cq_key(topic, q, offset))
    return codec.decode_cq_entry(value).visible_ms if value is not None else 0


def by_key(core: BrokerCore, topic: str, key: str, limit: int, begin_ms: int = 0,
           end_ms: int = 0) -> tuple[list[Found], bool]:
    """The topic's messages carrying ``key``, stored in [begin_ms, end_ms) (0: unbounded),
    newest first; and whether more matched than ``limit``."""
    validate_receive_topic(topic)
    core.queues.count(topic)  # TopicNotFoundError for a topic this broker does not hold
    if not key:
        raise InvalidFieldError("key", "required")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidFieldError("key", f"at most {MAX_KEY_BYTES} bytes (no stored key is longer)")
    if begin_ms < 0 or end_ms < 0 or (end_ms and begin_ms >= end_ms):
        raise InvalidFieldError("begin_ms/end_ms", "a time range [begin, end) with begin < end, or 0 for unbounded")
    limit = _limit(limit)
    prefix = codec.key_index_prefix(topic, key)
    found: list[Found] = []
    for index_key, _value in core.db.scan("keys", prefix, prefix[:-1] + b"\x01"):
        if len(index_key) != len(prefix) + 12:
            continue  # a longer key that starts with this one and a 0x00
        q, offset = codec.split_key_index_key(index_key, prefix)
        value = core.db.get("cq", codec.cq_key(topic, q, offset))
        if value is None:
            continue
        cq = codec.decode_cq_entry(value)
        record = core.read_message(cq.log_seq)
        if record is None or key not in record.keys:
            continue
        if (begin_ms and record.stored_ms < begin_ms) or (end_ms and record.stored_ms >= end_ms):
            continue
        txn = core.txn_id(cq.log_seq) if record.kind == KIND_HALF else ""
        found.append(Found(record, topic, q, offset, cq.visible_ms, txn, STATE_COMMITTED if txn else 0))
        if len(found) >= MAX_KEY_SCAN:
            break
    found.sort(key=lambda f: (f.visible_ms, f.queue_id, f.queue_offset), reverse=True)
    return found[:limit], len(found) > limit


def by_offset(core: BrokerCore, topic: str, queue_id: int, offset: int, limit: int) -> list[Found]:
    """Up to ``limit`` messages of one queue from ``offset`` (below the oldest retained one:
    from there)."""
    if offset < 0:
        raise InvalidFieldError("offset", f"must not be negative, got {offset}")
    entries, _next = core.read_queue(topic, queue_id, offset, 0, _limit(limit))
    out = []
    for o, cq in entries:
        record = core.read_message(cq.log_seq)
        if record is None:
            continue
        txn = core.txn_id(cq.log_seq) if record.kind == KIND_HALF else ""
        out.append(Found(record, topic, queue_id, o, cq.visible_ms, txn, STATE_COMMITTED if txn else 0))
    return out
