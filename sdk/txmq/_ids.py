"""Self-describing identifiers: message ids, transaction ids and receipt handles.

Each names the broker that holds the record and carries a CRC-32, so any client, proxy or
checker replica routes an EndTransaction, an Ack or a check answer without shared state,
and a mangled id is refused instead of being looked up.

Text form: one kind letter followed by the unpadded URL-safe base64 of::

    +---------+----------+--------------+------------------+---------+
    | version | name_len | broker name  | kind payload     | crc32   |
    |   u8    |    u8    | name_len B   | (see each kind)  | u32 BE  |
    +---------+----------+--------------+------------------+---------+

payloads (big-endian):
    M  message id      queue_id u32 | unique 16 B                         (client-chosen)
    T  transaction id  store_id u32 | sequence u64                        (broker-chosen)
    R  receipt handle  store_id u32 | queue_id u32 | offset u64 | attempt u32 | topic_len u8 | topic
"""

from __future__ import annotations

import base64
import os
import struct
import zlib
from dataclasses import dataclass

from ._errors import InvalidIdError

_VERSION = 1
_CRC = struct.Struct(">I")
_HEAD = struct.Struct(">BB")
_MSG = struct.Struct(">I16s")
_TXN = struct.Struct(">IQ")
_RCPT = struct.Struct(">IIQIB")
_EPOCH = struct.Struct(">Q")


def _pack(kind: str, broker: str, payload: bytes) -> str:
    name = broker.encode()
    if not 0 < len(name) <= 255:
        raise InvalidIdError(kind, broker, "broker name must be 1-255 bytes")
    raw = _HEAD.pack(_VERSION, len(name)) + name + payload
    raw += _CRC.pack(zlib.crc32(raw))
    return kind + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unpack(kind: str, label: str, text: str) -> tuple[str, bytes]:
    if not isinstance(text, str) or len(text) < 2 or text[0] != kind:
        raise InvalidIdError(label, str(text), f"does not start with {kind!r}")
    try:
        raw = base64.urlsafe_b64decode(text[1:] + "=" * (-len(text[1:]) % 4))
    except (ValueError, TypeError):
        raise InvalidIdError(label, text, "not base64") from None
    if len(raw) < _HEAD.size + _CRC.size:
        raise InvalidIdError(label, text, "too short")
    body, (crc,) = raw[:-_CRC.size], _CRC.unpack(raw[-_CRC.size:])
    if zlib.crc32(body) != crc:
        raise InvalidIdError(label, text, "checksum mismatch")
    version, name_len = _HEAD.unpack_from(body)
    if version != _VERSION:
        raise InvalidIdError(label, text, f"unknown version {version}")
    start = _HEAD.size
    try:
        broker = body[start:start + name_len].decode()
    except UnicodeDecodeError:
        raise InvalidIdError(label, text, "broker name is not UTF-8") from None
    if len(broker.encode()) != name_len:
        raise InvalidIdError(label, text, "truncated")
    return broker, body[start + name_len:]


@dataclass(frozen=True, slots=True)
class MessageId:
    """Chosen by the producer: the broker and queue it is bound to and 16 unique bytes.
    A retried send keeps its id and therefore its broker, where it is deduplicated."""

    broker: str
    queue_id: int
    unique: bytes

    KIND = "M"

    @classmethod
    def new(cls, broker: str, queue_id: int) -> "MessageId":
        return cls(broker, queue_id, os.urandom(16))

    def encode(self) -> str:
        return _pack(self.KIND, self.broker, _MSG.pack(self.queue_id, self.unique))

    @classmethod
    def decode(cls, text: str) -> "MessageId":
        broker, payload = _unpack(cls.KIND, "message id", text)
        if len(payload) != _MSG.size:
            raise InvalidIdError("message id", text, "wrong length")
        queue_id, unique = _MSG.unpack(payload)
        return cls(broker, queue_id, unique)

    @staticmethod
    def looks_like(text: str) -> bool:
        return text.startswith(MessageId.KIND)


@dataclass(frozen=True, slots=True)
class TransactionId:
    """Chosen by the broker: its name, its store's identity and the half record's sequence."""

    broker: str
    store_id: int
    sequence: int

    KIND = "T"

    def encode(self) -> str:
        return _pack(self.KIND, self.broker, _TXN.pack(self.store_id, self.sequence))

    @classmethod
    def decode(cls, text: str) -> "TransactionId":
        broker, payload = _unpack(cls.KIND, "transaction id", text)
        if len(payload) != _TXN.size:
            raise InvalidIdError("transaction id", text, "wrong length")
        store_id, sequence = _TXN.unpack(payload)
        return cls(broker, store_id, sequence)


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    """One delivery of one message to one consumer group."""

    broker: str
    store_id: int
    topic: str
    queue_id: int
    offset: int
    attempt: int
    #: The leader epoch of a replicated shard's leadership that made the delivery (0: an
    #: unreplicated broker, or a handle from before epochs were carried). A delivery made
    #: again by a later leader with the same attempt number (the first one's write had not
    #: reached the replicas) is another delivery: the old holder's handle does not settle it.
    #: Encoded after the topic only when set, so handles without it read as before.
    epoch: int = 0

    KIND = "R"

    def encode(self) -> str:
        topic = self.topic.encode()
        return _pack(self.KIND, self.broker,
                     _RCPT.pack(self.store_id, self.queue_id, self.offset, self.attempt, len(topic)) + topic
                     + (_EPOCH.pack(self.epoch) if self.epoch else b""))

    @classmethod
    def decode(cls, text: str) -> "ReceiptHandle":
        broker, payload = _unpack(cls.KIND, "receipt handle", text)
        if len(payload) < _RCPT.size:
            raise InvalidIdError("receipt handle", text, "wrong length")
        store_id, queue_id, offset, attempt, topic_len = _RCPT.unpack_from(payload)
        rest = payload[_RCPT.size:]
        epoch = 0
        if len(rest) == topic_len + _EPOCH.size:
            (epoch,) = _EPOCH.unpack_from(rest, topic_len)
            if epoch == 0:
                raise InvalidIdError("receipt handle", text, "epoch 0 is never encoded")
        elif len(rest) != topic_len:
            raise InvalidIdError("receipt handle", text, "wrong length")
        return cls(broker, store_id, rest[:topic_len].decode(), queue_id, offset, attempt, epoch)
