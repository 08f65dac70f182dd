"""What the ids of a BrokerService request name in this broker's store, authorized for the
caller before the request runs (``services.common.auth.ownership`` decides; this module
only looks up).

- A transaction id (EndTransaction, alone or in a Produce stream; the global transaction a
  further part names) resolves to its transaction's producer group: the caller needs
  ``check`` on that group, and a producer group it names must be that one.
- A message id a send repeats (deduplication) answers what the first send stored only to
  the same sender: the same topic, and for a half message the same producer group.
- A receipt handle (AckMessages, the acks a ReceiveMessages carries,
  ChangeInvisibleDuration, DeadLetterMessage) resolves to its delivery's topic: the caller
  needs ``subscribe`` on it, and a topic it names must be that one. Its consumer group is
  the one its authenticator was issued to (``idauth``), which the policy table checked.

An id that does not parse, or whose authenticator does not verify, is left to the request
itself, which refuses it naming the id (per entry where the request has entries). With auth
off there is nobody to authorize: the lookups are skipped, and a name that is not what the
id names is refused by the operation itself (INVALID_ARGUMENT, ``transactions.end_op``,
``delivery._parse_receipt_for``). A
transaction id that names no transaction is likewise left to the request (not found).
The lookups read immutable facts (a transaction's group, a delivery's topic), so deciding
before the request's operation runs cannot race it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from txmq.errors import InvalidFieldError, TxmqError
from txmq.ids import TransactionId

from services.common.auth.acl import CHECK, PRODUCER_GROUP, SUBSCRIBE, TOPIC
from services.common.auth.ownership import Owned, authorize_owned, deciding

if TYPE_CHECKING:
    from .core import BrokerCore
    from .store.codec import LogRecord, TxnRow


def _transaction(core: "BrokerCore", transaction_id: str, named_group: str, field: str) -> list[Owned]:
    try:
        row = core.get_txn(transaction_id)
    except TxmqError:
        return []  # an id this store did not issue, or naming nothing: the request says so
    return [Owned(CHECK, PRODUCER_GROUP, row.producer_group, named_group, field, transaction_id, "transaction id")]


def end_transaction(core: "BrokerCore", transaction_id: str, producer_group: str) -> None:
    """EndTransaction (and a Produce stream's end_transaction entry)."""
    if deciding():
        authorize_owned(_transaction(core, transaction_id, producer_group, "producer_group"))


def global_part(core: "BrokerCore", global_transaction_id: str, producer_group: str) -> None:
    """A further part of a global transaction this broker coordinates: the global
    transaction's group must be the part's."""
    if not global_transaction_id or not deciding():
        return
    try:
        local = TransactionId.decode(global_transaction_id).broker == core.name
    except TxmqError:
        return  # the send refuses it
    if local:  # another coordinator checks its own (a part of another group is rolled back there)
        authorize_owned(_transaction(core, global_transaction_id, producer_group, "message.producer_group"))


def receipts(core: "BrokerCore", consumer_group: str, topic: str, handles: Sequence[str]) -> None:
    """The topics of ``handles`` (issued to ``consumer_group``)."""
    if not deciding():
        return
    owned = []
    for text in handles:
        try:
            handle = core.parse_receipt(text, consumer_group)
        except TxmqError:
            continue  # refused by the request itself (per handle)
        owned.append(Owned(SUBSCRIBE, TOPIC, handle.topic, topic, "topic", text, "receipt handle"))
    authorize_owned(owned)


def same_message(record: "LogRecord", stored: "LogRecord | None", row: "TxnRow | None") -> None:
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
