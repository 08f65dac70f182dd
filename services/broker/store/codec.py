"""Byte layouts of everything the broker stores. Pure functions: no I/O.

Every value is framed::

    +---------+---------+----------------------+
    | version | crc32   | payload              |
    |   u8    | u32 BE  | (layout per value)   |
    +---------+---------+----------------------+

The CRC covers the payload; :func:`unframe` raises :class:`CorruptRecordError` for a wrong
version, a short value or a checksum mismatch, so a torn or corrupt record is reported,
never served. Integers are big-endian; ``s16`` is a u16 length + UTF-8, ``b32`` a u32
length + bytes.

Keys sort the way they are scanned: sequences and offsets big-endian, names followed by a
0x00 separator (names never contain 0x00).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

# The kinds, states and sources stored here are the domain's named values (one byte each),
# re-exported.
from ..model import KIND_HALF as KIND_HALF
from ..model import KIND_NORMAL as KIND_NORMAL
from ..model import SOURCE_BROKER as SOURCE_BROKER
from ..model import SOURCE_CHECK as SOURCE_CHECK
from ..model import SOURCE_CLIENT as SOURCE_CLIENT
from ..model import SOURCE_NONE as SOURCE_NONE
from ..model import SOURCE_OPERATOR as SOURCE_OPERATOR
from ..model import STATE_COMMITTED as STATE_COMMITTED
from ..model import STATE_DISCARDED as STATE_DISCARDED
from ..model import STATE_NAMES as STATE_NAMES
from ..model import STATE_PREPARED as STATE_PREPARED
from ..model import STATE_ROLLED_BACK as STATE_ROLLED_BACK

VERSION = 1
_FRAME = struct.Struct(">BI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
SEP = b"\x00"


class CorruptRecordError(Exception):
    """A stored value failed its version or checksum test."""

    def __init__(self, what: str, key: bytes, problem: str) -> None:
        super().__init__(f"corrupt {what} at key {key.hex()}: {problem}")
        self.what = what
        self.key = key
        self.problem = problem


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(VERSION, zlib.crc32(payload)) + payload


def unframe(value: bytes, what: str = "record", key: bytes = b"") -> bytes:
    if len(value) < _FRAME.size:
        raise CorruptRecordError(what, key, f"{len(value)} bytes is shorter than the frame header")
    version, crc = _FRAME.unpack_from(value)
    if version != VERSION:
        raise CorruptRecordError(what, key, f"unknown version {version}")
    payload = value[_FRAME.size:]
    if zlib.crc32(payload) != crc:
        raise CorruptRecordError(what, key, "checksum mismatch")
    return payload


# --- variable-length fields --------------------------------------------------------------

class Writer:
    """Builds the variable-length part of a record (this module's and ``globalcodec.py``'s)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def raw(self, data: bytes) -> None:
        self.parts.append(data)

    def s16(self, text: str) -> None:
        data = text.encode()
        self.parts.append(_U16.pack(len(data)))
        self.parts.append(data)

    def b32(self, data: bytes) -> None:
        self.parts.append(_U32.pack(len(data)))
        self.parts.append(data)

    def s32(self, text: str) -> None:
        self.b32(text.encode())

    def bytes(self) -> bytes:
        return b"".join(self.parts)


class Reader:
    """Reads what :class:`Writer` built (ValueError for a truncated field)."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def fixed(self, st: struct.Struct) -> tuple[Any, ...]:
        if self.pos + st.size > len(self.data):
            raise ValueError("truncated fixed field")
        out = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return out

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated variable field")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def s16(self) -> str:
        (n,) = _U16.unpack_from(self.data, self.pos)
        self.pos += 2
        return self._take(n).decode()

    def b32(self) -> bytes:
        (n,) = _U32.unpack_from(self.data, self.pos)
        self.pos += 4
        return self._take(n)

    def s32(self) -> str:
        return self.b32().decode()


# --- the commit log ----------------------------------------------------------------------

# kind u8 | born_ms i64 | stored_ms i64 | queue_id i32 | queue_offset i64 |
# check_immunity_seconds f64 | n_keys u16 | n_props u16, then
# topic s16 | message_id s16 | producer_group s16 | producer_client_id s16 | tag s16 |
# born_host s16 | keys s16 × n_keys | (name s16, value s32) × n_props | body b32
# [ | deliver_at_ms i64 [ | message_group s16 ] ]
#   -- the trailer: a delay / timer message has deliver_at_ms (> 0); a message of a FIFO
#      topic has both (deliver_at_ms 0 when at once) and its message group
_MSG_HEAD = struct.Struct(">BqqiqdHH")
_I64 = struct.Struct(">q")


@dataclass(slots=True)
class LogRecord:
    """One message in the commit log: a normal message (already in its queue at
    ``queue_offset``) or a half message (offset -1; the transaction row says the rest)."""

    kind: int
    topic: str
    body: bytes
    message_id: str
    queue_id: int
    stored_ms: int
    queue_offset: int = -1
    tag: str = ""
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    producer_group: str = ""
    producer_client_id: str = ""
    check_immunity_seconds: float = 0.0
    born_ms: int = 0
    born_host: str = ""
    #: A delay / timer message: invisible until then (broker clock, ms); 0 = at once.
    deliver_at_ms: int = 0
    #: Request only (never stored): validation turns a delay into ``deliver_at_ms``.
    delay_seconds: float = 0.0
    #: A FIFO topic's message group ('' on a normal topic).
    message_group: str = ""


def encode_log_record(r: LogRecord) -> bytes:
    w = Writer()
    w.raw(_MSG_HEAD.pack(r.kind, r.born_ms, r.stored_ms, r.queue_id, r.queue_offset,
                         r.check_immunity_seconds, len(r.keys), len(r.properties)))
    w.s16(r.topic)
    w.s16(r.message_id)
    w.s16(r.producer_group)
    w.s16(r.producer_client_id)
    w.s16(r.tag)
    w.s16(r.born_host)
    for key in r.keys:
        w.s16(key)
    for name, value in r.properties.items():
        w.s16(name)
        w.s32(value)
    w.b32(r.body)
    if r.deliver_at_ms or r.message_group:
        w.raw(_I64.pack(r.deliver_at_ms))
    if r.message_group:
        w.s16(r.message_group)
    return frame(w.bytes())


def decode_log_record(value: bytes, key: bytes = b"") -> LogRecord:
    payload = unframe(value, "log record", key)
    try:
        rd = Reader(payload)
        kind, born, stored, queue_id, offset, immunity, n_keys, n_props = rd.fixed(_MSG_HEAD)
        topic, message_id, group, client_id, tag, born_host = (rd.s16() for _ in range(6))
        keys = tuple(rd.s16() for _ in range(n_keys))
        props = {}
        for _ in range(n_props):
            name = rd.s16()
            props[name] = rd.s32()
        body = rd.b32()
        deliver_at, message_group = _trailer(rd, payload)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("log record", key, str(exc)) from None
    return LogRecord(kind=kind, topic=topic, body=body, message_id=message_id, queue_id=queue_id,
                     stored_ms=stored, queue_offset=offset, tag=tag, keys=keys, properties=props,
                     producer_group=group, producer_client_id=client_id,
                     check_immunity_seconds=immunity, born_ms=born, born_host=born_host,
                     deliver_at_ms=deliver_at, message_group=message_group)


def _trailer(rd: Reader, payload: bytes) -> tuple[int, str]:
    """The optional deliver_at_ms and message group after the body (0 and '' when absent)."""
    rest = len(payload) - rd.pos
    if rest == 0:
        return 0, ""
    if rest < _I64.size:
        raise ValueError(f"{rest} trailing bytes")
    (deliver_at,) = rd.fixed(_I64)
    if rest == _I64.size:
        if deliver_at <= 0:
            raise ValueError(f"deliver_at_ms {deliver_at} in the trailer")
        return deliver_at, ""
    if deliver_at < 0:
        raise ValueError(f"deliver_at_ms {deliver_at} in the trailer")
    message_group = rd.s16()
    if not message_group or rd.pos != len(payload):
        raise ValueError("malformed message group trailer")
    return deliver_at, message_group


def decode_log_visibility(value: bytes, key: bytes = b"") -> tuple[str, int]:
    """Only the tag and deliver_at_ms of a log record (a commit needs them for the queue
    entry or the timer; decoding the whole record would copy the body)."""
    tag, deliver_at, _group = decode_log_routing(value, key)
    return tag, deliver_at


def decode_log_routing(value: bytes, key: bytes = b"") -> tuple[str, int, str]:
    """The tag, deliver_at_ms and message group of a log record, without copying the body."""
    tag, deliver_at, group, _keys = decode_log_routing_keys(value, key)
    return tag, deliver_at, group


def decode_log_routing_keys(value: bytes, key: bytes = b"") -> tuple[str, int, str, tuple[str, ...]]:
    """:func:`decode_log_routing` and the record's keys (a commit indexes them)."""
    payload = unframe(value, "log record", key)
    try:
        rd = Reader(payload)
        head = rd.fixed(_MSG_HEAD)
        n_keys, n_props = head[6], head[7]
        for _ in range(4):  # topic, message id, producer group, producer client id
            (n,) = _U16.unpack_from(payload, rd.pos)
            rd.pos += 2 + n
        tag = rd.s16()
        (n,) = _U16.unpack_from(payload, rd.pos)  # born host
        rd.pos += 2 + n
        keys = tuple(rd.s16() for _ in range(n_keys))
        for _ in range(n_props):
            (n,) = _U16.unpack_from(payload, rd.pos)
            rd.pos += 2 + n
            (n,) = _U32.unpack_from(payload, rd.pos)
            rd.pos += 4 + n
        (n,) = _U32.unpack_from(payload, rd.pos)
        rd.pos += 4 + n
        return (tag, *_trailer(rd, payload), keys)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("log record", key, str(exc)) from None


def decode_log_tag(value: bytes, key: bytes = b"") -> str:
    """Only the tag of a log record (a commit needs it for the queue entry; decoding the
    whole record would copy the body). Checks the frame like :func:`decode_log_record`."""
    payload = unframe(value, "log record", key)
    try:
        rd = Reader(payload, _MSG_HEAD.size)
        for _ in range(4):  # topic, message id, producer group, producer client id
            (n,) = _U16.unpack_from(payload, rd.pos)
            rd.pos += 2 + n
        return rd.s16()
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("log record", key, str(exc)) from None


def log_key(seq: int) -> bytes:
    return _U64.pack(seq)


def log_seq(key: bytes) -> int:
    decoded: int = _U64.unpack(key)[0]
    return decoded


# --- consume queues ----------------------------------------------------------------------

# log_seq u64 | visible_ms i64 | tag s16 [ | group_hash u64 ]
#   -- group_hash only on a FIFO topic's entries (never 0): the delivery scan knows a
#      message's group without reading the log
_CQ = struct.Struct(">Qq")
_QUEUE_POS = struct.Struct(">IQ")


@dataclass(slots=True, frozen=True)
class CqEntry:
    log_seq: int
    visible_ms: int
    tag: str
    #: ``txmq.fifo.message_group_hash`` of the message group on a FIFO topic, else 0.
    group_hash: int = 0


def encode_cq_entry(e: CqEntry) -> bytes:
    tag = e.tag.encode()
    tail = _U64.pack(e.group_hash) if e.group_hash else b""
    return frame(_CQ.pack(e.log_seq, e.visible_ms) + _U16.pack(len(tag)) + tag + tail)


def decode_cq_entry(value: bytes, key: bytes = b"") -> CqEntry:
    payload = unframe(value, "consume queue entry", key)
    try:
        seq, visible = _CQ.unpack_from(payload)
        (n,) = _U16.unpack_from(payload, _CQ.size)
        end = _CQ.size + 2 + n
        tag = payload[_CQ.size + 2:end].decode()
        group = 0
        if len(payload) == end + _U64.size:
            (group,) = _U64.unpack_from(payload, end)
            if not group:
                raise ValueError("group hash 0")
        elif end != len(payload):
            raise ValueError("length mismatch")
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("consume queue entry", key, str(exc)) from None
    return CqEntry(seq, visible, tag, group)


def queue_prefix(topic: str, queue_id: int | None = None) -> bytes:
    base = topic.encode() + SEP
    return base if queue_id is None else base + _U32.pack(queue_id)


def cq_key(topic: str, queue_id: int, offset: int) -> bytes:
    return topic.encode() + SEP + _QUEUE_POS.pack(queue_id, offset)


def split_cq_key(key: bytes) -> tuple[str, int, int]:
    topic, rest = key.split(SEP, 1)
    queue_id, offset = _QUEUE_POS.unpack(rest)
    return topic.decode(), queue_id, offset


# --- transactions ------------------------------------------------------------------------

# state u8 | source u8 | checks_delivered u16 | checks_answered u16 | queue_id i32 |
# prepared_ms i64 | ended_ms i64 | next_due_ms i64 | queue_offset i64 | body_size i64 |
# discarded_ms i64 | unknown_answers u16 | in_progress_until_ms i64
_TXN_HEAD = struct.Struct(">BBHHiqqqqqqHq")


@dataclass(slots=True)
class TxnRow:
    """The small row a transaction is: a check or a decision rewrites this, never the
    message (RocketMQ rewrites the whole half message on every check)."""

    seq: int
    state: int
    producer_group: str
    producer_client_id: str
    topic: str
    queue_id: int
    message_id: str
    prepared_ms: int
    next_due_ms: int
    body_size: int
    source: int = SOURCE_NONE
    ended_ms: int = 0
    queue_offset: int = -1
    checks_delivered: int = 0
    checks_answered: int = 0
    discarded_ms: int = 0
    discard_reason: str = ""
    operator: str = ""
    reason: str = ""
    claim_token: str = ""
    unknown_answers: int = 0
    in_progress_until_ms: int = 0


def encode_txn(t: TxnRow) -> bytes:
    w = Writer()
    w.raw(_U64.pack(t.seq))
    w.raw(_TXN_HEAD.pack(t.state, t.source, t.checks_delivered, t.checks_answered, t.queue_id,
                         t.prepared_ms, t.ended_ms, t.next_due_ms, t.queue_offset, t.body_size,
                         t.discarded_ms, t.unknown_answers, t.in_progress_until_ms))
    for text in (t.producer_group, t.producer_client_id, t.topic, t.message_id,
                 t.discard_reason, t.operator, t.reason, t.claim_token):
        w.s16(text)
    return frame(w.bytes())


def decode_txn(value: bytes, key: bytes = b"") -> TxnRow:
    payload = unframe(value, "transaction row", key)
    try:
        rd = Reader(payload)
        (seq,) = rd.fixed(_U64)
        (state, source, delivered, answered, queue_id, prepared, ended, due, offset, size,
         discarded, unknown, in_progress) = rd.fixed(_TXN_HEAD)
        group, client, topic, mid, dreason, operator, reason, token = (rd.s16() for _ in range(8))
        if rd.pos != len(payload):
            raise ValueError("trailing bytes")
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("transaction row", key, str(exc)) from None
    return TxnRow(seq=seq, state=state, producer_group=group, producer_client_id=client,
                  topic=topic, queue_id=queue_id, message_id=mid, prepared_ms=prepared,
                  next_due_ms=due, body_size=size, source=source, ended_ms=ended,
                  queue_offset=offset, checks_delivered=delivered, checks_answered=answered,
                  discarded_ms=discarded, discard_reason=dreason, operator=operator,
                  reason=reason, claim_token=token, unknown_answers=unknown,
                  in_progress_until_ms=in_progress)


def txn_key(seq: int) -> bytes:
    return _U64.pack(seq)


def group_time_key(group: str, time_ms: int, seq: int) -> bytes:
    """``due`` and ``pending`` index keys: group | 0x00 | time_ms u64 | seq u64."""
    return group.encode() + SEP + _U64.pack(max(time_ms, 0)) + _U64.pack(seq)


def split_group_time_key(key: bytes) -> tuple[str, int, int]:
    group, rest = key.split(SEP, 1)
    time_ms, seq = struct.unpack(">QQ", rest)
    return group.decode(), time_ms, seq


def group_prefix(group: str) -> bytes:
    return group.encode() + SEP


# --- deduplication -----------------------------------------------------------------------

DEDUP_NORMAL = 1
DEDUP_TXN = 2
# kind u8 | seq u64 | queue_id i32 | queue_offset i64
_DEDUP = struct.Struct(">BQiq")


@dataclass(slots=True, frozen=True)
class DedupEntry:
    kind: int
    seq: int
    queue_id: int = 0
    queue_offset: int = -1


def encode_dedup(e: DedupEntry) -> bytes:
    return frame(_DEDUP.pack(e.kind, e.seq, e.queue_id, e.queue_offset))


def decode_dedup(value: bytes, key: bytes = b"") -> DedupEntry:
    payload = unframe(value, "dedup entry", key)
    try:
        return DedupEntry(*_DEDUP.unpack(payload))
    except struct.error as exc:
        raise CorruptRecordError("dedup entry", key, str(exc)) from None


def expiry_key(expire_ms: int, message_id: str) -> bytes:
    return _U64.pack(max(expire_ms, 0)) + message_id.encode()


def split_expiry_key(key: bytes) -> tuple[int, str]:
    return _U64.unpack_from(key)[0], key[8:].decode()


# --- the timer (delay / timer messages) --------------------------------------------------

def timer_key(due_ms: int, seq: int) -> bytes:
    """``timer`` index keys: due_ms u64 | seq u64 (the value is empty: the log record at
    ``seq`` says where the message goes)."""
    return _U64.pack(max(due_ms, 0)) + _U64.pack(seq)


def split_timer_key(key: bytes) -> tuple[int, int]:
    due, seq = struct.unpack(">QQ", key)
    return due, seq


# --- small fixed values ------------------------------------------------------------------

_COUNTERS = struct.Struct(">qq")
_ATTEMPT = struct.Struct(">Iq")


def encode_counters(pending: int, discarded: int) -> bytes:
    return frame(_COUNTERS.pack(pending, discarded))


def decode_counters(value: bytes, key: bytes = b"") -> tuple[int, int]:
    return _COUNTERS.unpack(unframe(value, "counters", key))


def encode_u64(n: int) -> bytes:
    return frame(_U64.pack(n))


def decode_u64(value: bytes, what: str, key: bytes = b"") -> int:
    payload = unframe(value, what, key)
    if len(payload) != 8:
        raise CorruptRecordError(what, key, "wrong length")
    decoded: int = _U64.unpack(payload)[0]
    return decoded


def consumer_key(group: str, topic: str, queue_id: int) -> bytes:
    return group.encode() + SEP + topic.encode() + SEP + _U32.pack(queue_id)


#: meta keys ``topic_type/<topic>`` (value empty): the topic is FIFO (a normal topic has none).
TOPIC_TYPE_PREFIX = b"topic_type/"
TOPIC_TYPE_END = b"topic_type0"


def topic_type_key(topic: str) -> bytes:
    return TOPIC_TYPE_PREFIX + topic.encode()


def split_consumer_key(key: bytes) -> tuple[str, str, int]:
    group, topic, rest = key.split(SEP, 2)
    return group.decode(), topic.decode(), _U32.unpack(rest[:4])[0]


def inflight_key(group: str, topic: str, queue_id: int, offset: int) -> bytes:
    return consumer_key(group, topic, queue_id) + _U64.pack(offset)


def split_inflight_key(key: bytes) -> tuple[str, str, int, int]:
    group, topic, rest = key.split(SEP, 2)
    queue_id, offset = _QUEUE_POS.unpack(rest)
    return group.decode(), topic.decode(), queue_id, offset


#: An in-flight row's (attempt, deadline) that marks a FIFO topic's delivery settled
#: (acknowledged or dead-lettered) past the group's cursor (see ``consumers.Cursor``).
SETTLED_PAST_CURSOR = (0, -1)


def encode_inflight(attempt: int, deadline_ms: int, epoch: int = 0) -> bytes:
    """``attempt u32 | deadline_ms i64 [| epoch u64]``: the epoch (of the leadership that
    made the delivery, replicated shards only) is written only when set, so rows without
    it read as epoch 0."""
    return frame(_ATTEMPT.pack(attempt, deadline_ms) + (_U64.pack(epoch) if epoch else b""))


def decode_inflight(value: bytes, key: bytes = b"") -> tuple[int, int, int]:
    """(attempt, deadline_ms, epoch)."""
    payload = unframe(value, "in-flight entry", key)
    try:
        if len(payload) == _ATTEMPT.size + _U64.size:
            return (*_ATTEMPT.unpack_from(payload), _U64.unpack_from(payload, _ATTEMPT.size)[0])
        return (*_ATTEMPT.unpack(payload), 0)
    except struct.error as exc:
        raise CorruptRecordError("in-flight entry", key, str(exc)) from None




#: An in-flight row's deadline marking a delivery revoked by an offset reset
#: (``resets.py``): its attempt is kept so the offset's next delivery counts on from it, and
#: a receipt handle of the revoked delivery never names a live one.
REVOKED_DEADLINE = -2


# --- offset resets -----------------------------------------------------------------------

#: meta keys ``group_reset/<group> 0x00 <topic>``: the last reset of the group's offsets in
#: the topic on this broker (who, when, why, to what).
RESET_PREFIX = b"group_reset/"


def reset_key(group: str, topic: str) -> bytes:
    return RESET_PREFIX + group.encode() + SEP + topic.encode()


def split_reset_key(key: bytes) -> tuple[str, str]:
    group, topic = key[len(RESET_PREFIX):].split(SEP, 1)
    return group.decode(), topic.decode()


@dataclass(frozen=True, slots=True)
class ResetRecord:
    at_ms: int
    operator: str
    reason: str
    #: ``ResetTarget`` number (broker.proto) and what it was given (time, shift).
    target: int
    argument: int


_RESET = struct.Struct(">qBq")


# at_ms i64 | target u8 | argument i64 | operator s16 | reason s16
def encode_reset(r: ResetRecord) -> bytes:
    w = Writer()
    w.raw(_RESET.pack(r.at_ms, r.target, r.argument))
    w.s16(r.operator)
    w.s16(r.reason)
    return frame(w.bytes())


def decode_reset(value: bytes, key: bytes = b"") -> ResetRecord:
    payload = unframe(value, "offset reset", key)
    try:
        reader = Reader(payload)
        at_ms, target, argument = reader.fixed(_RESET)
        return ResetRecord(at_ms, reader.s16(), reader.s16(), target, argument)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("offset reset", key, str(exc)) from None


# --- deleted groups' revoked deliveries ----------------------------------------------------

#: meta keys ``group_revoked/<group> 0x00 <topic> 0x00 | queue u32``: the deliveries of a
#: deleted consumer group that were in flight (or revoked) in one queue, offset → attempt
#: (``groupdelete.py``). The group's next first cursor there takes them as revoked
#: deliveries, so a receipt handle from before the deletion never names a delivery after it.
REVOKED_PREFIX = b"group_revoked/"
_REVOKED = struct.Struct(">QI")


def revoked_key(group: str, topic: str, queue_id: int) -> bytes:
    return REVOKED_PREFIX + group.encode() + SEP + topic.encode() + SEP + struct.pack(">I", queue_id)


# (offset u64 | attempt u32) * n
def encode_revoked(revoked: dict[int, int]) -> bytes:
    return frame(b"".join(_REVOKED.pack(o, a) for o, a in sorted(revoked.items())))


def decode_revoked(value: bytes, key: bytes = b"") -> dict[int, int]:
    payload = unframe(value, "revoked deliveries", key)
    if len(payload) % _REVOKED.size:
        raise CorruptRecordError("revoked deliveries", key, f"{len(payload)} bytes")
    return {o: a for o, a in _REVOKED.iter_unpack(payload)}


# --- the key index -----------------------------------------------------------------------

#: ``keys`` family: topic 0x00 key 0x00 | queue u32 | offset u64 → b"" (framed): one entry
#: per key of every message in a user topic's queue, written in the batch that puts the
#: message into its queue, removed with its queue entry (retention, topic deletion).
#: Keys may hold any character but 0x00 (refused at send).
def key_index_prefix(topic: str, key: str) -> bytes:
    return topic.encode() + SEP + key.encode() + SEP


def key_index_key(topic: str, key: str, queue_id: int, offset: int) -> bytes:
    return key_index_prefix(topic, key) + _QUEUE_POS.pack(queue_id, offset)


def split_key_index_key(key: bytes, prefix: bytes) -> tuple[int, int]:
    """(queue, offset) of an entry under ``prefix`` (:func:`key_index_prefix`)."""
    return _QUEUE_POS.unpack(key[len(prefix):])


def topic_key_prefix(topic: str) -> bytes:
    """Every key-index entry of ``topic``."""
    return topic.encode() + SEP


KEY_INDEX_VALUE = frame(b"")
