"""The authenticators of the ids a broker issues: every transaction id and receipt handle
carries a MAC (HMAC-SHA256 truncated to 128 bits, ``txmq.ids.TAG_BYTES``) keyed by a
secret of the store, checked before anything is looked up. An id the broker did not issue
(a sequence number counted up, a handle with another offset, topic or attempt, a handle of
another consumer group, bytes re-checksummed) is refused with INVALID_ARGUMENT
(``InvalidIdError``); ids still name their broker in clear, so everyone routes them.

What the MAC covers: the kind letter and the id's bytes up to the tag (broker name, store
id and sequence; or broker, store id, queue, offset, attempt, topic and epoch), and for a
receipt handle the consumer group it was issued to, so a handle is good only with its group.

**The secret** is 32 random bytes in the store's ``meta`` family (``id_secret``), written
in the store's first write (or, for a store from before ids were authenticated, at its first
open since) through the same replicated write path as everything else: every replica of a
shard holds the same secret, and ids survive a fail-over. A restore from a backup keeps it.

**Ids issued before the secret existed** (version-1 ids, without a tag) keep working until
they expire, without opening the door to minted ones:

- an untagged transaction id is accepted only for a transaction whose sequence is below
  ``legacy_below_seq``, the first sequence of the store after the secret was created (a
  fresh store: 1, so none); every transaction since has a tagged id;
- an untagged receipt handle is accepted only for a delivery that was in flight when the
  secret was created (its group, topic, queue, offset, attempt and epoch were recorded then,
  ``id_legacy_receipts``) and is still that delivery. Every delivery since has a tagged handle.

Page tokens of QueryTransactions are transaction ids used as cursors (where to continue a
listing the caller may read anyway): they are read without the MAC (``cursor=True``), as
the pipeline mints them from sequences.
"""

from __future__ import annotations

import hmac
import logging
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from txmq.errors import InvalidIdError, ReceiptHandleNotFoundError, WrongBrokerError
from txmq.ids import ReceiptHandle, TransactionId

from .store import codec

if TYPE_CHECKING:  # the store imports this module
    from .store.db import Database, OpWrites

log = logging.getLogger(__name__)

SECRET_KEY = b"id_secret"
LEGACY_RECEIPTS_KEY = b"id_legacy_receipts"
SECRET_BYTES = 32
TAG_BYTES = 16
#: Domain separation: these MACs are ids' and nothing else's.
_DOMAIN = b"txmq-id-v2\x00"

#: meta/id_secret: secret 32 B | legacy_below_seq u64 | created_ms u64 (framed: version, CRC).
_SECRET = struct.Struct(">32sQQ")
#: One legacy delivery: queue u32 | offset u64 | attempt u32 | epoch u64, after the group
#: and topic (each u8 length + bytes).
_LEGACY = struct.Struct(">IQIQ")

#: (group, topic, queue, offset, attempt, epoch) of a delivery.
Delivery = tuple[str, str, int, int, int, int]


@dataclass(frozen=True)
class IdSecret:
    secret: bytes
    #: Transactions below this sequence existed before the secret: their untagged ids count.
    legacy_below_seq: int
    created_ms: int


def encode_secret(s: IdSecret) -> bytes:
    return codec.frame(_SECRET.pack(s.secret, s.legacy_below_seq, s.created_ms))


def decode_secret(value: bytes) -> IdSecret:
    payload = codec.unframe(value, "id secret", SECRET_KEY)
    if len(payload) != _SECRET.size:
        raise codec.CorruptRecordError("id secret", SECRET_KEY, "wrong length")
    secret, below, created = _SECRET.unpack(payload)
    return IdSecret(secret, below, created)


def encode_legacy(deliveries: Iterable[Delivery]) -> bytes:
    out = bytearray()
    for group, topic, queue, offset, attempt, epoch in sorted(deliveries):
        for name in (group, topic):
            raw = name.encode()
            out += bytes([len(raw)]) + raw
        out += _LEGACY.pack(queue, offset, attempt, epoch)
    return codec.frame(bytes(out))


def decode_legacy(value: bytes) -> frozenset[Delivery]:
    payload = codec.unframe(value, "legacy receipts", LEGACY_RECEIPTS_KEY)
    found: set[Delivery] = set()
    at = 0
    try:
        while at < len(payload):
            names = []
            for _ in range(2):
                n = payload[at]
                names.append(payload[at + 1:at + 1 + n].decode())
                at += 1 + n
            queue, offset, attempt, epoch = _LEGACY.unpack_from(payload, at)
            at += _LEGACY.size
            found.add((names[0], names[1], queue, offset, attempt, epoch))
    except (IndexError, struct.error, UnicodeDecodeError):
        raise codec.CorruptRecordError("legacy receipts", LEGACY_RECEIPTS_KEY, "truncated") from None
    return frozenset(found)


class IdAuthority:
    """Issues and checks one store's ids (``BrokerBase.txn_id`` and friends call it)."""

    def __init__(self, broker: str, store_id: int, secret: IdSecret | None,
                 legacy_receipts: frozenset[Delivery] = frozenset()) -> None:
        #: None: a tool opened a replica's store that has no secret yet (its leader writes it
        #: for the whole shard): ids read and written untagged, as before the secret.
        self.broker = broker
        self.store_id = store_id
        self.secret = secret
        self.legacy_receipts = legacy_receipts

    def _tag(self, signed: bytes, context: bytes = b"") -> bytes:
        if self.secret is None:
            return b""
        return hmac.digest(self.secret.secret, _DOMAIN + signed + context, "sha256")[:TAG_BYTES]

    @staticmethod
    def _group_context(group: str) -> bytes:
        raw = group.encode()
        return struct.pack(">H", len(raw)) + raw

    # --- transaction ids -------------------------------------------------------------------

    def txn_id(self, seq: int) -> str:
        tid = TransactionId(self.broker, self.store_id, seq)
        return TransactionId(self.broker, self.store_id, seq, self._tag(tid.signed())).encode()

    def parse_txn_id(self, text: str, *, cursor: bool = False) -> int:
        """The sequence an id of this store names; raises InvalidIdError for an id this
        store did not issue (WrongBrokerError for another broker's). ``cursor``: a page
        token, read without its MAC (see the module docstring)."""
        tid = TransactionId.decode(text)
        if tid.broker != self.broker:
            raise WrongBrokerError("transaction id", text, tid.broker, self.broker)
        if tid.store_id != self.store_id:
            raise InvalidIdError("transaction id", text, "issued by an earlier store of this broker")
        if cursor:
            return tid.sequence
        if not tid.tag:
            if self.secret is not None and tid.sequence >= self.secret.legacy_below_seq:
                raise InvalidIdError("transaction id", text, "carries no authenticator: not an id this broker issued")
            return tid.sequence  # a transaction from before the store had an id secret
        if self.secret is None or not hmac.compare_digest(tid.tag, self._tag(tid.signed())):
            raise InvalidIdError("transaction id", text, "authenticator mismatch: not an id this broker issued")
        return tid.sequence

    # --- receipt handles -------------------------------------------------------------------

    def receipt(self, group: str, topic: str, queue_id: int, offset: int, attempt: int, epoch: int = 0) -> str:
        handle = ReceiptHandle(self.broker, self.store_id, topic, queue_id, offset, attempt, epoch)
        tag = self._tag(handle.signed(), self._group_context(group))
        return ReceiptHandle(self.broker, self.store_id, topic, queue_id, offset, attempt, epoch, tag).encode()

    def parse_receipt(self, group: str, text: str) -> ReceiptHandle:
        """The delivery a handle this store issued to ``group`` names; InvalidIdError for a
        handle it did not issue to that group."""
        handle = ReceiptHandle.decode(text)
        if handle.broker != self.broker:
            raise WrongBrokerError("receipt handle", text, handle.broker, self.broker)
        if handle.store_id != self.store_id:
            raise ReceiptHandleNotFoundError(text)
        if not handle.tag:
            delivery = (group, handle.topic, handle.queue_id, handle.offset, handle.attempt, handle.epoch)
            if self.secret is not None and delivery not in self.legacy_receipts:
                raise InvalidIdError("receipt handle", text, "carries no authenticator: not a handle this broker "
                                                             "issued")
            return handle
        if self.secret is None or not hmac.compare_digest(handle.tag, self._tag(handle.signed(),
                                                                                 self._group_context(group))):
            raise InvalidIdError("receipt handle", text, f"authenticator mismatch: not a handle this broker issued "
                                                         f"to consumer group {group!r}")
        return handle


def open_authority(db: Database, broker: str, store_id: int, next_seq: int, inflight: Iterable[Delivery],
                   clock: Callable[[], int], still_in_flight: Callable[[Delivery], bool]) -> IdAuthority:
    """The store's authority: its secret read from ``meta``, or created now (with the
    deliveries in flight recorded as legacy ones) and written in one batch. Legacy
    deliveries that are over are forgotten (the key deleted once none is left).

    A replica's store opened without replication (a tool: fsck) never creates the secret:
    only its shard's leader does, in a replicated write, or the replicas would differ."""
    value = db.get("meta", SECRET_KEY)
    if value is None and not db.replicated and db.first_key("replica") is not None:
        return IdAuthority(broker, store_id, None)
    if value is None:
        secret = IdSecret(os.urandom(SECRET_BYTES), next_seq, clock())
        legacy = frozenset(inflight)

        def create(w: OpWrites) -> None:
            w.put("meta", SECRET_KEY, encode_secret(secret))
            if legacy:
                w.put("meta", LEGACY_RECEIPTS_KEY, encode_legacy(legacy))
        db.call(create)
        log.info("id secret created", extra={"fields": {
            "legacy_transactions_below_seq": next_seq, "legacy_receipts": len(legacy)}})
        return IdAuthority(broker, store_id, secret, legacy)
    secret = decode_secret(value)
    stored = db.get("meta", LEGACY_RECEIPTS_KEY)
    legacy = decode_legacy(stored) if stored is not None else frozenset()
    live = frozenset(d for d in legacy if still_in_flight(d))
    if stored is not None and not live and (db.replicated or db.first_key("replica") is None):
        db.call(lambda w: w.delete("meta", LEGACY_RECEIPTS_KEY))
    return IdAuthority(broker, store_id, secret, live)
