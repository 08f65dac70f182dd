"""Proto ⇄ domain for the broker's servicer and the RPC parts it delegates to: the proto
enums ⇄ the domain's types (model.py), here and nowhere else — their numbers are not
assumed equal — and messages, transactions and topics ⇄ the store's records (store/codec.py)."""

from __future__ import annotations

from txmq.errors import InvalidFieldError
from txmq.v1 import broker_pb2, common_pb2

from .core import BrokerCore
from .model import CheckAnswer, CheckOutcome, Resolution, Source, TxnState
from .store import codec
from .store.codec import LogRecord, TxnRow

RESOLUTIONS = {
    common_pb2.TRANSACTION_RESOLUTION_COMMIT: Resolution.COMMIT,
    common_pb2.TRANSACTION_RESOLUTION_ROLLBACK: Resolution.ROLLBACK,
    common_pb2.TRANSACTION_RESOLUTION_UNKNOWN: Resolution.UNKNOWN,
}
# Keyed by the stored state and source (ints, TxnState and Source the named ones).
_STATES_TO_PROTO: dict[int, common_pb2.TransactionState.ValueType] = {
    TxnState.PREPARED: common_pb2.TRANSACTION_STATE_PREPARED,
    TxnState.COMMITTED: common_pb2.TRANSACTION_STATE_COMMITTED,
    TxnState.ROLLED_BACK: common_pb2.TRANSACTION_STATE_ROLLED_BACK,
    TxnState.DISCARDED: common_pb2.TRANSACTION_STATE_DISCARDED,
}
STATES_FROM_PROTO = {v: k for k, v in _STATES_TO_PROTO.items()}
_SOURCES_TO_PROTO: dict[int, common_pb2.TransactionSource.ValueType] = {
    Source.NONE: common_pb2.TRANSACTION_SOURCE_UNSPECIFIED,
    Source.CLIENT: common_pb2.TRANSACTION_SOURCE_CLIENT,
    Source.CHECK: common_pb2.TRANSACTION_SOURCE_CHECK,
    Source.OPERATOR: common_pb2.TRANSACTION_SOURCE_OPERATOR,
    Source.BROKER: common_pb2.TRANSACTION_SOURCE_BROKER,
}
SOURCES_FROM_PROTO = {v: k for k, v in _SOURCES_TO_PROTO.items()}
OUTCOMES_FROM_PROTO = {
    broker_pb2.CHECK_OUTCOME_DELIVERED: CheckOutcome.DELIVERED,
    broker_pb2.CHECK_OUTCOME_ANSWERED: CheckOutcome.ANSWERED,
    broker_pb2.CHECK_OUTCOME_UNDELIVERED: CheckOutcome.UNDELIVERED,
}
ANSWERS_FROM_PROTO = {
    common_pb2.CHECK_RESULT_COMMIT: CheckAnswer.COMMIT,
    common_pb2.CHECK_RESULT_ROLLBACK: CheckAnswer.ROLLBACK,
    common_pb2.CHECK_RESULT_UNKNOWN: CheckAnswer.UNKNOWN,
    common_pb2.CHECK_RESULT_IN_PROGRESS: CheckAnswer.IN_PROGRESS,
}


def state_to_proto(state: int) -> common_pb2.TransactionState.ValueType:
    """A transaction state as TransactionState (UNSPECIFIED for none: a normal message)."""
    return _STATES_TO_PROTO.get(state, common_pb2.TRANSACTION_STATE_UNSPECIFIED)


def source_to_proto(source: int) -> common_pb2.TransactionSource.ValueType:
    return _SOURCES_TO_PROTO.get(source, common_pb2.TRANSACTION_SOURCE_UNSPECIFIED)


def state_from_proto(state: common_pb2.TransactionState.ValueType) -> int:
    """A TransactionState filter as the domain's state (0: any)."""
    if state == common_pb2.TRANSACTION_STATE_UNSPECIFIED:
        return 0
    found = STATES_FROM_PROTO.get(state)
    if found is None:
        raise InvalidFieldError("state", f"{state} is not a TransactionState")
    return found


def record_from_proto(m: common_pb2.Message) -> LogRecord:
    kind = codec.KIND_HALF if m.type == common_pb2.MESSAGE_TYPE_TRANSACTION else codec.KIND_NORMAL
    return LogRecord(kind=kind, topic=m.topic, body=m.body, message_id=m.message_id, queue_id=m.queue_id,
                     stored_ms=0, tag=m.tag, keys=tuple(m.keys), properties=dict(m.properties),
                     producer_group=m.producer_group, producer_client_id=m.producer_client_id,
                     check_immunity_seconds=m.check_immunity_seconds, born_ms=m.born_timestamp_ms,
                     born_host=m.born_host, deliver_at_ms=m.deliver_at_ms, delay_seconds=m.delay_seconds,
                     message_group=m.message_group)


def message_to_proto(r: LogRecord) -> common_pb2.Message:
    return common_pb2.Message(
        topic=r.topic, body=r.body, tag=r.tag, keys=r.keys, properties=r.properties,
        message_id=r.message_id,
        type=common_pb2.MESSAGE_TYPE_TRANSACTION if r.kind == codec.KIND_HALF else common_pb2.MESSAGE_TYPE_NORMAL,
        producer_group=r.producer_group, producer_client_id=r.producer_client_id,
        check_immunity_seconds=r.check_immunity_seconds, born_timestamp_ms=r.born_ms,
        born_host=r.born_host, queue_id=r.queue_id, deliver_at_ms=r.deliver_at_ms, message_group=r.message_group)


def delivered_to_proto(core: BrokerCore, topic: str, queue_id: int, offset: int, log_seq: int, visible_ms: int,
                       record: LogRecord, *, attempt: int = 0, receipt_handle: str = "",
                       invisible_until_ms: int = 0) -> common_pb2.DeliveredMessage:
    """A message of a queue, as ReadQueue returns it, or as ReceiveMessages does with its
    delivery (``attempt``, ``receipt_handle``, ``invisible_until_ms``)."""
    return common_pb2.DeliveredMessage(
        topic=topic, message=message_to_proto(record), broker_name=core.name, queue_id=queue_id,
        queue_offset=offset, transaction_id=core.txn_id(log_seq) if record.kind == codec.KIND_HALF else "",
        stored_at_ms=record.stored_ms, visible_at_ms=visible_ms, delivery_attempt=attempt,
        receipt_handle=receipt_handle, invisible_until_ms=invisible_until_ms)


def topic_queues(core: BrokerCore, topic: str, count: int) -> common_pb2.TopicQueues:
    """A topic this broker holds, with its type, as it registers and reports it."""
    return common_pb2.TopicQueues(topic=topic, queue_count=count, topic_type=(
        common_pb2.TOPIC_TYPE_FIFO if topic in core.fifo_topics else common_pb2.TOPIC_TYPE_NORMAL))


def txn_to_proto(core: BrokerCore, t: TxnRow) -> common_pb2.Transaction:
    return common_pb2.Transaction(
        transaction_id=core.txn_id(t.seq), message_id=t.message_id, producer_group=t.producer_group,
        producer_client_id=t.producer_client_id, topic=t.topic, queue_id=t.queue_id,
        state=state_to_proto(t.state), prepared_at_ms=t.prepared_ms, ended_at_ms=t.ended_ms,
        resolution_source=source_to_proto(t.source),
        checks_delivered=t.checks_delivered, checks_answered=t.checks_answered,
        next_check_at_ms=t.next_due_ms, discard_reason=t.discard_reason, operator=t.operator,
        reason=t.reason, queue_offset=t.queue_offset, broker_name=core.name,
        body_size_bytes=t.body_size, discarded_at_ms=t.discarded_ms)

