"""What the ids of a BrokerService request name in this broker's store: the lookup the auth
interceptor calls for the ids the policy table lists (``services.common.auth.policy``), whose
decision (``services.common.auth.ownership``) it then applies, before the request runs.

- A transaction id (EndTransaction, alone or in a Produce stream; the global transaction a
  further part names, when this broker coordinates it) resolves to its transaction's
  producer group: the caller needs ``check`` on that group, and a producer group it names
  must be that one.
- A receipt handle (AckMessages, the acks a ReceiveMessages carries,
  ChangeInvisibleDuration, DeadLetterMessage) resolves to its delivery's topic: the caller
  needs ``subscribe`` on it, and a topic it names must be that one. Its consumer group is
  the one its authenticator was issued to (``idauth``); the policy table checked that one.
- A message id a send repeats (deduplication) answers what the first send stored only to
  the same sender (:func:`same_message`, in the send's own operation).

An id that does not parse, whose authenticator does not verify, or that names nothing
resolves to nothing: the request itself refuses it naming the id (per entry where the
request has entries). The lookups read immutable facts (a transaction's group, a delivery's
topic), so deciding before the request's operation runs cannot race it. With auth off there
is no interceptor: a name that is not what the id names is refused by the operation itself
(INVALID_ARGUMENT, ``transactions.end_op``, ``delivery._parse_receipt_for``).
"""

from __future__ import annotations

from typing import Callable, Protocol

from txmq.errors import InvalidFieldError, TxmqError
from txmq.ids import ReceiptHandle, TransactionId

from services.common.auth.acl import CHECK, PRODUCER_GROUP, SUBSCRIBE, TOPIC
from services.common.auth.ownership import Owned, Resolve
from services.common.auth.policy import RECEIPT_HANDLE, TRANSACTION_ID, IdRef

from .store.codec import LogRecord, TxnRow


class IdStore(Protocol):
    """What the lookups read of the domain serving now (``BrokerCore``)."""

    name: str

    def get_txn(self, transaction_id: str) -> TxnRow: ...

    def parse_receipt(self, text: str, group: str) -> ReceiptHandle: ...


def resolve(core: IdStore, ref: IdRef) -> Owned | None:
    """What ``ref`` names in ``core``'s store (None: nothing to authorize)."""
    try:
        if ref.kind == TRANSACTION_ID:
            if TransactionId.decode(ref.text).broker != core.name:
                return None  # another shard's (a global transaction it coordinates): it decides
            row = core.get_txn(ref.text)
            return Owned(CHECK, PRODUCER_GROUP, row.producer_group, ref.named, ref.field, ref.text, ref.kind)
        if ref.kind == RECEIPT_HANDLE:
            handle = core.parse_receipt(ref.text, ref.scope)
            return Owned(SUBSCRIBE, TOPIC, handle.topic, ref.named, ref.field, ref.text, ref.kind)
    except TxmqError:
        return None  # not an id this store issued (to that group), or naming nothing
    raise ValueError(f"no lookup for {ref.kind!r}")


def resolver(current: Callable[[], IdStore | None]) -> Resolve:
    """The lookup over the store serving now (None on a replica that does not lead: the
    request is refused there anyway)."""
    def lookup(ref: IdRef) -> Owned | None:
        core = current()
        return resolve(core, ref) if core is not None else None
    return lookup


def same_message(record: LogRecord, stored: LogRecord | None, row: TxnRow | None) -> None:
    """A send whose message id the store has already (a retry): the stored message must be
    the same sender's — its topic, and a half message's producer group — or the answer would
    tell this sender another's transaction id, state and position. Refused naming the field
    whatever the caller's rights (a retry never changes topic or group)."""
    if stored is not None and stored.topic != record.topic:
        raise InvalidFieldError("message_id", f"{record.message_id!r} is already the id of a message of another "
                                "topic: message ids are unique, choose a new one")
    if row is not None and row.producer_group != record.producer_group:
        raise InvalidFieldError("message_id", f"{record.message_id!r} is already the id of another producer "
                                "group's message: message ids are unique, choose a new one")
