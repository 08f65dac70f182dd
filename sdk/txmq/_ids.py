"""Self-describing identifiers: message ids, transaction ids and receipt handles.

Each names the broker that holds the record and carries a CRC-32, so any client, proxy or
checker replica routes an EndTransaction, an Ack or a check answer without shared state,
and a mangled id is refused instead of being looked up. Transaction ids and receipt
handles also carry an *authenticator* (``tag``): a MAC the broker computes over the id
with a secret of its store (``services/broker/idauth.py``), so an id the broker did not
issue — minted, or altered and re-checksummed — is refused before anything is looked up.
Only the broker can check the tag; everyone else reads the broker name and routes.

Text form: one kind letter followed by the unpadded URL-safe base64 of::

    +---------+----------+--------------+------------------+-----------+---------+
    | version | name_len | broker name  | kind payload     | tag       | crc32   |
    |   u8    |    u8    | name_len B   | (see each kind)  | 16 B (v2) | u32 BE  |
    +---------+----------+--------------+------------------+-----------+---------+

version 1: no tag (message ids always; transaction ids and receipt handles issued before
their broker's store had an id secret). version 2: the 16-byte tag before the CRC.

payloads (big-endian):
    M  message id      queue_id u32 | unique 16 B                         (client-chosen)
    T  transaction id  store_id u32 | sequence u64                        (broker-chosen)
    R  receipt handle  store_id u32 | queue_id u32 | offset u64 | attempt u32 | topic_len u8 | topic
                       [| epoch u64, only when not 0]

Decoding any string (or any other value) either returns the id or raises
:class:`InvalidIdError` naming the problem: no other exception escapes a ``decode``.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
import zlib
from dataclasses import dataclass

from ._errors import InvalidIdError

_VERSION = 1
#: Ids with an authenticator (``tag``).
_VERSION_TAGGED = 2
#: Bytes of the authenticator (a truncated HMAC-SHA256: 128 bits).
TAG_BYTES = 16
_CRC = struct.Struct(">I")
_HEAD = struct.Struct(">BB")
_MSG = struct.Struct(">I16s")
_TXN = struct.Struct(">IQ")
_RCPT = struct.Struct(">IIQIB")
_EPOCH = struct.Struct(">Q")
#: Longest id text decoded at all (the longest receipt handle is under 800 characters).
MAX_ID_CHARS = 2048
#: Characters of a refused id quoted in its error.
_SHOWN_CHARS = 80


def _shown(text: object) -> str:
    value = text if isinstance(text, str) else repr(text)
    return value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "..."


def _pack(kind: str, broker: str, payload: bytes, tag: bytes = b"") -> str:
    name = broker.encode()
    if not 0 < len(name) <= 255:
        raise InvalidIdError(kind, _shown(broker), "broker name must be 1-255 bytes")
    if tag and len(tag) != TAG_BYTES:
        raise InvalidIdError(kind, _shown(broker), f"an authenticator is {TAG_BYTES} bytes")
    raw = _HEAD.pack(_VERSION_TAGGED if tag else _VERSION, len(name)) + name + payload + tag
    raw += _CRC.pack(zlib.crc32(raw))
    return kind + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unpack(kind: str, label: str, text: object, tagged: bool) -> tuple[str, bytes, bytes]:
    """(broker, payload, tag) of an id of ``kind``; ``tagged``: version 2 is allowed
    (message ids are never tagged). Only the canonical text of an id is accepted: one id
    has one text (proxies and checkers key their state by it)."""
    if not isinstance(text, str):
        raise InvalidIdError(label, _shown(text), "not a string")
    if len(text) < 2 or text[0] != kind:
        raise InvalidIdError(label, _shown(text), f"does not start with {kind!r}")
    if len(text) > MAX_ID_CHARS:
        raise InvalidIdError(label, _shown(text), f"longer than {MAX_ID_CHARS} characters")
    body64 = text[1:]
    if not body64.isascii() or len(body64) % 4 == 1:
        raise InvalidIdError(label, _shown(text), "not base64")
    try:
        raw = base64.urlsafe_b64decode(body64 + "=" * (-len(body64) % 4))
    except (ValueError, TypeError, binascii.Error):
        raise InvalidIdError(label, _shown(text), "not base64") from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != body64:
        raise InvalidIdError(label, _shown(text), "not in canonical form (unpadded URL-safe base64)")
    if len(raw) < _HEAD.size + _CRC.size:
        raise InvalidIdError(label, _shown(text), "too short")
    body, (crc,) = raw[:-_CRC.size], _CRC.unpack(raw[-_CRC.size:])
    if zlib.crc32(body) != crc:
        raise InvalidIdError(label, _shown(text), "checksum mismatch")
    version, name_len = _HEAD.unpack_from(body)
    if version == _VERSION_TAGGED and tagged:
        if len(body) < _HEAD.size + name_len + TAG_BYTES:
            raise InvalidIdError(label, _shown(text), "truncated")
        body, tag = body[:-TAG_BYTES], body[-TAG_BYTES:]
    elif version == _VERSION:
        tag = b""
    else:
        raise InvalidIdError(label, _shown(text), f"unknown version {version}")
    start = _HEAD.size
    if name_len == 0 or len(body) < start + name_len:
        raise InvalidIdError(label, _shown(text), "truncated")
    try:
        broker = body[start:start + name_len].decode()
    except UnicodeDecodeError:
        raise InvalidIdError(label, _shown(text), "broker name is not UTF-8") from None
    return broker, body[start + name_len:], tag


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
        broker, payload, _tag = _unpack(cls.KIND, "message id", text, tagged=False)
        if len(payload) != _MSG.size:
            raise InvalidIdError("message id", _shown(text), "wrong length")
        queue_id, unique = _MSG.unpack(payload)
        return cls(broker, queue_id, unique)

    @staticmethod
    def looks_like(text: str) -> bool:
        return text.startswith(MessageId.KIND)


@dataclass(frozen=True, slots=True)
class TransactionId:
    """Chosen by the broker: its name, its store's identity, the half record's sequence and
    (from brokers whose store has an id secret) the authenticator over them."""

    broker: str
    store_id: int
    sequence: int
    #: The broker's MAC over the id (``signed``); empty in a version-1 id.
    tag: bytes = b""

    KIND = "T"

    def _payload(self) -> bytes:
        try:
            return _TXN.pack(self.store_id, self.sequence)
        except struct.error:
            raise InvalidIdError("transaction id", _shown(self.broker),
                                 "store id or sequence out of range") from None

    def encode(self) -> str:
        return _pack(self.KIND, self.broker, self._payload(), self.tag)

    def signed(self) -> bytes:
        """What the tag covers (as in the tagged text form, without tag and CRC)."""
        name = self.broker.encode()
        return self.KIND.encode() + _HEAD.pack(_VERSION_TAGGED, len(name)) + name + self._payload()

    @classmethod
    def decode(cls, text: str) -> "TransactionId":
        broker, payload, tag = _unpack(cls.KIND, "transaction id", text, tagged=True)
        if len(payload) != _TXN.size:
            raise InvalidIdError("transaction id", _shown(text), "wrong length")
        store_id, sequence = _TXN.unpack(payload)
        return cls(broker, store_id, sequence, tag)


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
    #: The broker's MAC over the handle and the consumer group it was issued to (empty in a
    #: version-1 handle).
    tag: bytes = b""

    KIND = "R"

    def _payload(self) -> bytes:
        topic = self.topic.encode()
        if len(topic) > 255:
            raise InvalidIdError("receipt handle", _shown(self.topic), "topic longer than 255 bytes")
        try:
            return (_RCPT.pack(self.store_id, self.queue_id, self.offset, self.attempt, len(topic)) + topic
                    + (_EPOCH.pack(self.epoch) if self.epoch else b""))
        except struct.error:
            raise InvalidIdError("receipt handle", _shown(self.topic), "a number out of range") from None

    def encode(self) -> str:
        return _pack(self.KIND, self.broker, self._payload(), self.tag)

    def signed(self) -> bytes:
        """What the tag covers besides the consumer group (see ``TransactionId.signed``)."""
        name = self.broker.encode()
        return self.KIND.encode() + _HEAD.pack(_VERSION_TAGGED, len(name)) + name + self._payload()

    @classmethod
    def decode(cls, text: str) -> "ReceiptHandle":
        broker, payload, tag = _unpack(cls.KIND, "receipt handle", text, tagged=True)
        if len(payload) < _RCPT.size:
            raise InvalidIdError("receipt handle", _shown(text), "wrong length")
        store_id, queue_id, offset, attempt, topic_len = _RCPT.unpack_from(payload)
        rest = payload[_RCPT.size:]
        epoch = 0
        if len(rest) == topic_len + _EPOCH.size:
            (epoch,) = _EPOCH.unpack_from(rest, topic_len)
            if epoch == 0:
                raise InvalidIdError("receipt handle", _shown(text), "epoch 0 is never encoded")
        elif len(rest) != topic_len:
            raise InvalidIdError("receipt handle", _shown(text), "wrong length")
        try:
            topic = rest[:topic_len].decode()
        except UnicodeDecodeError:
            raise InvalidIdError("receipt handle", _shown(text), "topic is not UTF-8") from None
        return cls(broker, store_id, topic, queue_id, offset, attempt, epoch, tag)
