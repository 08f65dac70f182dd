"""The values the SDK hands to and takes from its users, and their wire conversions.

Everything here is immutable. Times are timezone-aware ``datetime`` objects in UTC, taken
from the broker's clock; durations are float seconds.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ._errors import InvalidFieldError
from ._names import GLOBAL_PARTS_PROPERTY, GLOBAL_TRANSACTION_PROPERTY, qualify
from .v1 import common_pb2

if TYPE_CHECKING:
    from ._errors import TxmqError

__all__ = [
    "ConsumeResult",
    "LocalTransactionState",
    "Message",
    "ReceivedMessage",
    "SendReceipt",
    "SqlFilter",
    "TransactionMessage",
    "TransactionResult",
    "TransactionState",
]


class LocalTransactionState(enum.Enum):
    """What a producer's local transaction decided (RocketMQ's ``LocalTransactionState``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    #: Not known yet: the transaction stays PREPARED and the checker asks the group later.
    UNKNOWN = "UNKNOWN"


class TransactionState(enum.Enum):
    """The state of a transaction on its broker."""

    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"


class ConsumeResult(enum.Enum):
    """What a push consumer's listener says about one message."""

    SUCCESS = "SUCCESS"
    #: Redeliver later (with ``delivery_attempt`` + 1), up to the broker's max_delivery_attempts.
    FAILURE = "FAILURE"


@dataclass(frozen=True, slots=True)
class Message:
    """A message to send. ``keys`` become a tuple and ``properties`` a private dict copy."""

    topic: str
    body: bytes
    tag: str = ""
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Transactional messages only: delay of the first check instead of the broker's
    #: transaction_timeout_seconds (RocketMQ's CHECK_IMMUNITY_TIME_IN_SECONDS).
    check_immunity_seconds: float | None = None
    #: A delay / timer message: invisible to consumers until this time (timezone-aware; the
    #: broker's clock decides), then delivered as normal. A transactional message committed
    #: earlier becomes visible then. At most the broker's max_delivery_delay_seconds ahead.
    delivery_time: _dt.datetime | None = None
    #: The same as a delay from when the broker stores the message (not with delivery_time).
    delay_seconds: float | None = None
    #: FIFO topics: the message group. Its messages go to one queue in send order (commit
    #: order for transactional ones) and each consumer group gets them one at a time.
    #: Required on a FIFO topic, refused on a normal one.
    message_group: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.body, (bytearray, memoryview)):
            object.__setattr__(self, "body", bytes(self.body))
        elif not isinstance(self.body, bytes):
            raise InvalidFieldError("body", f"must be bytes, got {type(self.body).__name__}")
        if isinstance(self.keys, str):
            object.__setattr__(self, "keys", (self.keys,))
        else:
            object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "properties", dict(self.properties))
        if self.check_immunity_seconds is not None and not self.check_immunity_seconds > 0:
            raise InvalidFieldError("check_immunity_seconds",
                                    f"must be positive or None, got {self.check_immunity_seconds!r}")
        if self.delivery_time is not None and self.delay_seconds is not None:
            raise InvalidFieldError("delivery_time/delay_seconds", "set one of them, not both")
        if self.delivery_time is not None and (not isinstance(self.delivery_time, _dt.datetime)
                                               or self.delivery_time.tzinfo is None):
            raise InvalidFieldError("delivery_time", "must be a timezone-aware datetime")
        if self.delay_seconds is not None and not self.delay_seconds > 0:
            raise InvalidFieldError("delay_seconds", f"must be positive or None, got {self.delay_seconds!r}")


def namespaced(message: "Message", namespace: str) -> "Message":
    """``message`` with its topic in ``namespace`` (itself without one)."""
    if not namespace or not isinstance(message, Message):
        return message
    return dataclasses.replace(message, topic=qualify(namespace, "topic", message.topic))


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A SQL92 property filter for a subscription, in RocketMQ's syntax (its
    ``MessageSelector.bySql``): ``{"orders": txmq.SqlFilter("region = 'eu' AND amount > 100")}``.

    Comparisons (``= <> > >= < <=``), ``BETWEEN``, ``IN``, ``IS [NOT] NULL``,
    ``[NOT] CONTAINS/STARTSWITH/ENDSWITH``, ``AND``/``OR``/``NOT`` over the message's
    properties, ``TAGS`` (its tag) and ``KEYS``. The broker evaluates it, so messages it
    rejects are never sent to the consumer; a message missing a property the expression
    needs does not match (SQL's NULL). A malformed expression is refused by the broker at
    the first receive with :class:`InvalidFieldError` naming the column."""

    expression: str

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str) or not self.expression.strip():
            raise InvalidFieldError("subscriptions", "a SqlFilter needs a non-empty expression")


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """Where a sent message was stored. ``message_id`` names the broker and queue."""

    message_id: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int


#: The property an explicit transaction (``TransactionProducer.begin_transaction``) stamps
#: on each of its messages: its key, by which a check finds the local transaction.
TRANSACTION_KEY_PROPERTY = "__TXMQ_TRANSACTION_KEY"


@dataclass(frozen=True, slots=True)
class TransactionMessage:
    """A half message as a :class:`TransactionListener` sees it: the message plus the ids
    the broker gave its transaction (the key to record the local transaction under)."""

    message: Message
    message_id: str
    transaction_id: str
    broker_name: str
    queue_id: int

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def tag(self) -> str:
        return self.message.tag

    @property
    def keys(self) -> tuple[str, ...]:
        return self.message.keys

    @property
    def properties(self) -> Mapping[str, str]:
        return self.message.properties

    @property
    def transaction_key(self) -> str:
        """The key of the explicit transaction that sent it (``begin_transaction(key=...)``);
        empty for a message of ``send_in_transaction``."""
        return self.message.properties.get(TRANSACTION_KEY_PROPERTY, "")

    @property
    def global_transaction_id(self) -> str:
        """The multi-message transaction it belongs to (``send_in_transaction([...])``);
        empty for a transaction of one message. A check of it answers for all its messages."""
        return self.message.properties.get(GLOBAL_TRANSACTION_PROPERTY, "")


@dataclass(frozen=True, slots=True)
class TransactionResult:
    """The outcome of :meth:`TransactionProducer.send_in_transaction`.

    ``state`` is the broker's state after the EndTransaction: COMMITTED, ROLLED_BACK, or
    PREPARED after UNKNOWN. It is ``None`` when the EndTransaction could not be delivered
    after its retries (``end_error`` says why): the transaction is then PREPARED on the
    broker and the checker will resolve it by asking the producer group.

    ``local_error`` is the exception ``execute_local_transaction`` raised (its outcome is then
    UNKNOWN, and it is logged), None when it returned.
    """

    message_id: str
    transaction_id: str
    local_state: LocalTransactionState
    state: TransactionState | None
    topic: str = ""
    broker_name: str = ""
    queue_id: int = -1
    end_error: "TxmqError | None" = None
    local_error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """One delivery of a committed message to a consumer group."""

    #: The topic it was received from: the real topic, or ``%DLQ%<group>`` / ``%DISCARD%<group>``.
    topic: str
    body: bytes
    tag: str
    keys: tuple[str, ...]
    properties: Mapping[str, str] = field(hash=False)
    message_id: str
    #: Empty for normal messages.
    transaction_id: str
    broker_name: str
    queue_id: int
    queue_offset: int
    #: 1 for the first delivery to this group, +1 on each redelivery.
    delivery_attempt: int
    #: Valid for this delivery only; :meth:`SimpleConsumer.ack` and
    #: :meth:`SimpleConsumer.change_invisible_duration` use it.
    receipt_handle: str
    stored_at: _dt.datetime
    #: When it became visible (the commit time of a transactional message).
    visible_at: _dt.datetime
    #: When it becomes visible to the group again unless acknowledged.
    invisible_until: _dt.datetime
    #: The topic it was sent to (differs from ``topic`` for dead-letter and discard topics).
    original_topic: str
    consumer_group: str = ""
    #: FIFO topics: the message group ('' otherwise).
    message_group: str = ""

    @property
    def global_transaction_id(self) -> str:
        """The multi-message transaction it was committed with (empty for other messages):
        every message of it carries the same id, whatever its topic or shard."""
        return self.properties.get(GLOBAL_TRANSACTION_PROPERTY, "")

    @property
    def global_parts(self) -> int:
        """How many messages that multi-message transaction holds (0 for other messages)."""
        value = self.properties.get(GLOBAL_PARTS_PROPERTY, "")
        return int(value) if value.isdigit() else 0


_STATE_FROM_PB = {
    common_pb2.TRANSACTION_STATE_PREPARED: TransactionState.PREPARED,
    common_pb2.TRANSACTION_STATE_COMMITTED: TransactionState.COMMITTED,
    common_pb2.TRANSACTION_STATE_ROLLED_BACK: TransactionState.ROLLED_BACK,
    common_pb2.TRANSACTION_STATE_DISCARDED: TransactionState.DISCARDED,
}

RESOLUTION_TO_PB = {
    LocalTransactionState.COMMIT: common_pb2.TRANSACTION_RESOLUTION_COMMIT,
    LocalTransactionState.ROLLBACK: common_pb2.TRANSACTION_RESOLUTION_ROLLBACK,
    LocalTransactionState.UNKNOWN: common_pb2.TRANSACTION_RESOLUTION_UNKNOWN,
}


def state_from_pb(value: common_pb2.TransactionState.ValueType) -> TransactionState | None:
    return _STATE_FROM_PB.get(value)


def state_from_name(name: object) -> TransactionState | None:
    """``"COMMITTED"`` or ``"TRANSACTION_STATE_COMMITTED"`` (as errors carry it) → enum."""
    if not isinstance(name, str):
        return None
    try:
        return TransactionState[name.removeprefix("TRANSACTION_STATE_")]
    except KeyError:
        return None


def ms_to_datetime(ms: int) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(ms / 1000.0, tz=_dt.UTC)


def message_to_pb(message: Message, message_id: str, queue_id: int, type_: common_pb2.MessageType.ValueType,
                  born_timestamp_ms: int, born_host: str) -> common_pb2.Message:
    return common_pb2.Message(
        topic=message.topic, body=message.body, tag=message.tag, keys=message.keys,
        properties=message.properties, message_id=message_id, type=type_,
        born_timestamp_ms=born_timestamp_ms, born_host=born_host, queue_id=queue_id,
        deliver_at_ms=round(message.delivery_time.timestamp() * 1000) if message.delivery_time else 0,
        delay_seconds=message.delay_seconds or 0.0, message_group=message.message_group)


def message_from_pb(pb: common_pb2.Message) -> Message:
    return Message(topic=pb.topic, body=pb.body, tag=pb.tag, keys=tuple(pb.keys),
                   properties=dict(pb.properties),
                   check_immunity_seconds=pb.check_immunity_seconds or None,
                   delivery_time=ms_to_datetime(pb.deliver_at_ms) if pb.deliver_at_ms else None,
                   message_group=pb.message_group)


def received_from_pb(pb: common_pb2.DeliveredMessage, consumer_group: str) -> ReceivedMessage:
    m = pb.message
    return ReceivedMessage(
        topic=pb.topic, body=m.body, tag=m.tag, keys=tuple(m.keys), properties=dict(m.properties),
        message_id=m.message_id, transaction_id=pb.transaction_id, broker_name=pb.broker_name,
        queue_id=pb.queue_id, queue_offset=pb.queue_offset, delivery_attempt=pb.delivery_attempt,
        receipt_handle=pb.receipt_handle, stored_at=ms_to_datetime(pb.stored_at_ms),
        visible_at=ms_to_datetime(pb.visible_at_ms),
        invisible_until=ms_to_datetime(pb.invisible_until_ms),
        original_topic=m.topic or pb.topic, consumer_group=consumer_group, message_group=m.message_group)
