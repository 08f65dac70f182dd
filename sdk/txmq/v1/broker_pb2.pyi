from txmq.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FilterType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILTER_TYPE_UNSPECIFIED: _ClassVar[FilterType]
    FILTER_TYPE_TAG: _ClassVar[FilterType]
    FILTER_TYPE_SQL92: _ClassVar[FilterType]

class CheckOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECK_OUTCOME_UNSPECIFIED: _ClassVar[CheckOutcome]
    CHECK_OUTCOME_DELIVERED: _ClassVar[CheckOutcome]
    CHECK_OUTCOME_ANSWERED: _ClassVar[CheckOutcome]
    CHECK_OUTCOME_UNDELIVERED: _ClassVar[CheckOutcome]

class ResetTarget(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESET_TARGET_UNSPECIFIED: _ClassVar[ResetTarget]
    RESET_TARGET_EARLIEST: _ClassVar[ResetTarget]
    RESET_TARGET_LATEST: _ClassVar[ResetTarget]
    RESET_TARGET_TIME: _ClassVar[ResetTarget]
    RESET_TARGET_OFFSET: _ClassVar[ResetTarget]
    RESET_TARGET_SHIFT: _ClassVar[ResetTarget]
FILTER_TYPE_UNSPECIFIED: FilterType
FILTER_TYPE_TAG: FilterType
FILTER_TYPE_SQL92: FilterType
CHECK_OUTCOME_UNSPECIFIED: CheckOutcome
CHECK_OUTCOME_DELIVERED: CheckOutcome
CHECK_OUTCOME_ANSWERED: CheckOutcome
CHECK_OUTCOME_UNDELIVERED: CheckOutcome
RESET_TARGET_UNSPECIFIED: ResetTarget
RESET_TARGET_EARLIEST: ResetTarget
RESET_TARGET_LATEST: ResetTarget
RESET_TARGET_TIME: ResetTarget
RESET_TARGET_OFFSET: ResetTarget
RESET_TARGET_SHIFT: ResetTarget

class SendMessageRequest(_message.Message):
    __slots__ = ("message", "begin_global", "global_participants", "global_transaction_id")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_GLOBAL_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    message: _common_pb2.Message
    begin_global: bool
    global_participants: _containers.RepeatedScalarFieldContainer[str]
    global_transaction_id: str
    def __init__(self, message: _Optional[_Union[_common_pb2.Message, _Mapping]] = ..., begin_global: _Optional[bool] = ..., global_participants: _Optional[_Iterable[str]] = ..., global_transaction_id: _Optional[str] = ...) -> None: ...

class SendMessageResponse(_message.Message):
    __slots__ = ("message_id", "transaction_id", "queue_id", "queue_offset", "transaction_state", "duplicate", "broker_name")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_STATE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    transaction_id: str
    queue_id: int
    queue_offset: int
    transaction_state: _common_pb2.TransactionState
    duplicate: bool
    broker_name: str
    def __init__(self, message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., transaction_state: _Optional[_Union[_common_pb2.TransactionState, str]] = ..., duplicate: _Optional[bool] = ..., broker_name: _Optional[str] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("transaction_id", "message_id", "resolution", "source", "operator", "reason", "producer_group")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    message_id: str
    resolution: _common_pb2.TransactionResolution
    source: _common_pb2.TransactionSource
    operator: str
    reason: str
    producer_group: str
    def __init__(self, transaction_id: _Optional[str] = ..., message_id: _Optional[str] = ..., resolution: _Optional[_Union[_common_pb2.TransactionResolution, str]] = ..., source: _Optional[_Union[_common_pb2.TransactionSource, str]] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ..., producer_group: _Optional[str] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ("transaction_id", "state", "resolution_source", "ended_at_ms", "queue_offset")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    state: _common_pb2.TransactionState
    resolution_source: _common_pb2.TransactionSource
    ended_at_ms: int
    queue_offset: int
    def __init__(self, transaction_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.TransactionState, str]] = ..., resolution_source: _Optional[_Union[_common_pb2.TransactionSource, str]] = ..., ended_at_ms: _Optional[int] = ..., queue_offset: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ProduceEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[ProduceEntry, _Mapping]]] = ...) -> None: ...

class ProduceEntry(_message.Message):
    __slots__ = ("request_id", "send_message", "end_transaction")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SEND_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    END_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    send_message: SendMessageRequest
    end_transaction: EndTransactionRequest
    def __init__(self, request_id: _Optional[int] = ..., send_message: _Optional[_Union[SendMessageRequest, _Mapping]] = ..., end_transaction: _Optional[_Union[EndTransactionRequest, _Mapping]] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ProduceResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ProduceResult, _Mapping]]] = ...) -> None: ...

class ProduceResult(_message.Message):
    __slots__ = ("request_id", "status", "send_message", "end_transaction")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SEND_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    END_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: _common_pb2.EntryStatus
    send_message: SendMessageResponse
    end_transaction: EndTransactionResponse
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[_Union[_common_pb2.EntryStatus, _Mapping]] = ..., send_message: _Optional[_Union[SendMessageResponse, _Mapping]] = ..., end_transaction: _Optional[_Union[EndTransactionResponse, _Mapping]] = ...) -> None: ...

class ReceiveMessagesRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "filter_expression", "max_messages", "invisible_duration_seconds", "long_polling_timeout_seconds", "filter_type", "client_id", "ack_receipt_handles")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FILTER_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LONG_POLLING_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FILTER_TYPE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACK_RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    filter_expression: str
    max_messages: int
    invisible_duration_seconds: float
    long_polling_timeout_seconds: float
    filter_type: FilterType
    client_id: str
    ack_receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., filter_expression: _Optional[str] = ..., max_messages: _Optional[int] = ..., invisible_duration_seconds: _Optional[float] = ..., long_polling_timeout_seconds: _Optional[float] = ..., filter_type: _Optional[_Union[FilterType, str]] = ..., client_id: _Optional[str] = ..., ack_receipt_handles: _Optional[_Iterable[str]] = ...) -> None: ...

class ReceiveMessagesResponse(_message.Message):
    __slots__ = ("messages", "ack_entries")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ACK_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeliveredMessage]
    ack_entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EntryStatus]
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.DeliveredMessage, _Mapping]]] = ..., ack_entries: _Optional[_Iterable[_Union[_common_pb2.EntryStatus, _Mapping]]] = ...) -> None: ...

class AckMessagesRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "receipt_handles")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ...) -> None: ...

class AckMessagesResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EntryStatus]
    def __init__(self, entries: _Optional[_Iterable[_Union[_common_pb2.EntryStatus, _Mapping]]] = ...) -> None: ...

class ChangeInvisibleDurationRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "receipt_handle", "invisible_duration_seconds")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    receipt_handle: str
    invisible_duration_seconds: float
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., invisible_duration_seconds: _Optional[float] = ...) -> None: ...

class ChangeInvisibleDurationResponse(_message.Message):
    __slots__ = ("receipt_handle", "invisible_until_ms")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    invisible_until_ms: int
    def __init__(self, receipt_handle: _Optional[str] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class ReadQueueRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "start_offset", "end_offset", "max_messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    start_offset: int
    end_offset: int
    max_messages: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., max_messages: _Optional[int] = ...) -> None: ...

class ReadQueueResponse(_message.Message):
    __slots__ = ("messages", "next_offset", "min_offset", "max_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeliveredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.DeliveredMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class GetQueueOffsetsRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class QueueOffsets(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class GetQueueOffsetsResponse(_message.Message):
    __slots__ = ("topic", "broker_name", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    broker_name: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueOffsets]
    def __init__(self, topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueOffsets, _Mapping]]] = ...) -> None: ...

class DeadLetterMessageRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "receipt_handle")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    receipt_handle: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class DeadLetterMessageResponse(_message.Message):
    __slots__ = ("dead_letter_topic", "queue_offset")
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    dead_letter_topic: str
    queue_offset: int
    def __init__(self, dead_letter_topic: _Optional[str] = ..., queue_offset: _Optional[int] = ...) -> None: ...

class CreateTopicQueuesRequest(_message.Message):
    __slots__ = ("topic", "queue_count", "topic_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    topic_type: _common_pb2.TopicType
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ..., topic_type: _Optional[_Union[_common_pb2.TopicType, str]] = ...) -> None: ...

class CreateTopicQueuesResponse(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: _common_pb2.TopicQueues
    def __init__(self, topic: _Optional[_Union[_common_pb2.TopicQueues, _Mapping]] = ...) -> None: ...

class ClaimGroup(_message.Message):
    __slots__ = ("producer_group", "max_checks")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_CHECKS_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    max_checks: int
    def __init__(self, producer_group: _Optional[str] = ..., max_checks: _Optional[int] = ...) -> None: ...

class ClaimChecksRequest(_message.Message):
    __slots__ = ("producer_groups", "max_checks", "lease_seconds", "checker_id", "session_id", "groups_version", "groups", "limits")
    PRODUCER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHECKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHECKER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    producer_groups: _containers.RepeatedScalarFieldContainer[str]
    max_checks: int
    lease_seconds: float
    checker_id: str
    session_id: str
    groups_version: int
    groups: _containers.RepeatedCompositeFieldContainer[ClaimGroup]
    limits: _containers.RepeatedCompositeFieldContainer[ClaimGroup]
    def __init__(self, producer_groups: _Optional[_Iterable[str]] = ..., max_checks: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., checker_id: _Optional[str] = ..., session_id: _Optional[str] = ..., groups_version: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[ClaimGroup, _Mapping]]] = ..., limits: _Optional[_Iterable[_Union[ClaimGroup, _Mapping]]] = ...) -> None: ...

class CheckTask(_message.Message):
    __slots__ = ("transaction_id", "message", "due_at_ms", "attempt", "broker_name", "claim_token", "prepared_at_ms")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREPARED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    message: _common_pb2.Message
    due_at_ms: int
    attempt: int
    broker_name: str
    claim_token: str
    prepared_at_ms: int
    def __init__(self, transaction_id: _Optional[str] = ..., message: _Optional[_Union[_common_pb2.Message, _Mapping]] = ..., due_at_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., broker_name: _Optional[str] = ..., claim_token: _Optional[str] = ..., prepared_at_ms: _Optional[int] = ...) -> None: ...

class ClaimChecksResponse(_message.Message):
    __slots__ = ("tasks", "groups_needed", "more_due")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    MORE_DUE_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[CheckTask]
    groups_needed: bool
    more_due: bool
    def __init__(self, tasks: _Optional[_Iterable[_Union[CheckTask, _Mapping]]] = ..., groups_needed: _Optional[bool] = ..., more_due: _Optional[bool] = ...) -> None: ...

class CheckReport(_message.Message):
    __slots__ = ("transaction_id", "claim_token", "outcome", "result", "retry_after_seconds", "producer_client_id", "answer_timeout_seconds", "producer_group")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    claim_token: str
    outcome: CheckOutcome
    result: _common_pb2.CheckResult
    retry_after_seconds: float
    producer_client_id: str
    answer_timeout_seconds: float
    producer_group: str
    def __init__(self, transaction_id: _Optional[str] = ..., claim_token: _Optional[str] = ..., outcome: _Optional[_Union[CheckOutcome, str]] = ..., result: _Optional[_Union[_common_pb2.CheckResult, str]] = ..., retry_after_seconds: _Optional[float] = ..., producer_client_id: _Optional[str] = ..., answer_timeout_seconds: _Optional[float] = ..., producer_group: _Optional[str] = ...) -> None: ...

class ReportChecksRequest(_message.Message):
    __slots__ = ("reports", "checker_id")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    CHECKER_ID_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[CheckReport]
    checker_id: str
    def __init__(self, reports: _Optional[_Iterable[_Union[CheckReport, _Mapping]]] = ..., checker_id: _Optional[str] = ...) -> None: ...

class ReportChecksResponse(_message.Message):
    __slots__ = ("entries", "states", "late")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    LATE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EntryStatus]
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.TransactionState]
    late: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, entries: _Optional[_Iterable[_Union[_common_pb2.EntryStatus, _Mapping]]] = ..., states: _Optional[_Iterable[_Union[_common_pb2.TransactionState, str]]] = ..., late: _Optional[_Iterable[bool]] = ...) -> None: ...

class QueryTransactionsRequest(_message.Message):
    __slots__ = ("producer_group", "state", "older_than_seconds", "limit", "page_token", "namespace", "key")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    state: _common_pb2.TransactionState
    older_than_seconds: float
    limit: int
    page_token: str
    namespace: str
    key: str
    def __init__(self, producer_group: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.TransactionState, str]] = ..., older_than_seconds: _Optional[float] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., namespace: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class QueryTransactionsResponse(_message.Message):
    __slots__ = ("transactions", "next_page_token")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Transaction]
    next_page_token: str
    def __init__(self, transactions: _Optional[_Iterable[_Union[_common_pb2.Transaction, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetTransactionRequest(_message.Message):
    __slots__ = ("transaction_id",)
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    def __init__(self, transaction_id: _Optional[str] = ...) -> None: ...

class GetTransactionResponse(_message.Message):
    __slots__ = ("transaction", "message")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    transaction: _common_pb2.Transaction
    message: _common_pb2.Message
    def __init__(self, transaction: _Optional[_Union[_common_pb2.Transaction, _Mapping]] = ..., message: _Optional[_Union[_common_pb2.Message, _Mapping]] = ...) -> None: ...

class GetBrokerStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupTransactionStats(_message.Message):
    __slots__ = ("producer_group", "pending", "discarded", "oldest_pending_prepared_at_ms")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_PREPARED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    pending: int
    discarded: int
    oldest_pending_prepared_at_ms: int
    def __init__(self, producer_group: _Optional[str] = ..., pending: _Optional[int] = ..., discarded: _Optional[int] = ..., oldest_pending_prepared_at_ms: _Optional[int] = ...) -> None: ...

class GetBrokerStatsResponse(_message.Message):
    __slots__ = ("broker_name", "topics", "groups", "store_bytes", "free_disk_bytes", "max_body_bytes", "max_delivery_attempts", "last_transaction_id")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    STORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BODY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERY_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicQueues]
    groups: _containers.RepeatedCompositeFieldContainer[GroupTransactionStats]
    store_bytes: int
    free_disk_bytes: int
    max_body_bytes: int
    max_delivery_attempts: int
    last_transaction_id: str
    def __init__(self, broker_name: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicQueues, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupTransactionStats, _Mapping]]] = ..., store_bytes: _Optional[int] = ..., free_disk_bytes: _Optional[int] = ..., max_body_bytes: _Optional[int] = ..., max_delivery_attempts: _Optional[int] = ..., last_transaction_id: _Optional[str] = ...) -> None: ...

class DescribeConsumerGroupsRequest(_message.Message):
    __slots__ = ("consumer_group", "topic")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class ConsumerQueueStatus(_message.Message):
    __slots__ = ("consumer_group", "topic", "broker_name", "queue_id", "ack_offset", "next_offset", "max_offset", "lag_messages", "lag_seconds", "inflight", "retrying", "last_reset_operator", "last_reset_at_ms", "last_reset_reason", "last_reset_target")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    ACK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    RETRYING_FIELD_NUMBER: _ClassVar[int]
    LAST_RESET_OPERATOR_FIELD_NUMBER: _ClassVar[int]
    LAST_RESET_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_RESET_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_RESET_TARGET_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    broker_name: str
    queue_id: int
    ack_offset: int
    next_offset: int
    max_offset: int
    lag_messages: int
    lag_seconds: float
    inflight: int
    retrying: int
    last_reset_operator: str
    last_reset_at_ms: int
    last_reset_reason: str
    last_reset_target: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ..., ack_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag_messages: _Optional[int] = ..., lag_seconds: _Optional[float] = ..., inflight: _Optional[int] = ..., retrying: _Optional[int] = ..., last_reset_operator: _Optional[str] = ..., last_reset_at_ms: _Optional[int] = ..., last_reset_reason: _Optional[str] = ..., last_reset_target: _Optional[str] = ...) -> None: ...

class GroupDeadLetters(_message.Message):
    __slots__ = ("consumer_group", "broker_name", "dead_lettered")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    broker_name: str
    dead_lettered: int
    def __init__(self, consumer_group: _Optional[str] = ..., broker_name: _Optional[str] = ..., dead_lettered: _Optional[int] = ...) -> None: ...

class DescribeConsumerGroupsResponse(_message.Message):
    __slots__ = ("queues", "dead_letters")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[ConsumerQueueStatus]
    dead_letters: _containers.RepeatedCompositeFieldContainer[GroupDeadLetters]
    def __init__(self, queues: _Optional[_Iterable[_Union[ConsumerQueueStatus, _Mapping]]] = ..., dead_letters: _Optional[_Iterable[_Union[GroupDeadLetters, _Mapping]]] = ...) -> None: ...

class ReturnDeadLettersRequest(_message.Message):
    __slots__ = ("consumer_group", "message_ids", "all")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, consumer_group: _Optional[str] = ..., message_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class ReturnDeadLettersResponse(_message.Message):
    __slots__ = ("redriven", "not_found", "expired")
    REDRIVEN_FIELD_NUMBER: _ClassVar[int]
    NOT_FOUND_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    redriven: _containers.RepeatedScalarFieldContainer[str]
    not_found: _containers.RepeatedScalarFieldContainer[str]
    expired: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, redriven: _Optional[_Iterable[str]] = ..., not_found: _Optional[_Iterable[str]] = ..., expired: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteTopicQueuesRequest(_message.Message):
    __slots__ = ("topic", "force")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    force: bool
    def __init__(self, topic: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteTopicQueuesResponse(_message.Message):
    __slots__ = ("entries_deleted", "consumer_groups")
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    entries_deleted: int
    consumer_groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entries_deleted: _Optional[int] = ..., consumer_groups: _Optional[_Iterable[str]] = ...) -> None: ...

class ApplyGlobalTransactionRequest(_message.Message):
    __slots__ = ("global_transaction_id", "state", "source", "producer_group")
    GLOBAL_TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    global_transaction_id: str
    state: _common_pb2.TransactionState
    source: _common_pb2.TransactionSource
    producer_group: str
    def __init__(self, global_transaction_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.TransactionState, str]] = ..., source: _Optional[_Union[_common_pb2.TransactionSource, str]] = ..., producer_group: _Optional[str] = ...) -> None: ...

class ApplyGlobalTransactionResponse(_message.Message):
    __slots__ = ("parts_decided",)
    PARTS_DECIDED_FIELD_NUMBER: _ClassVar[int]
    parts_decided: int
    def __init__(self, parts_decided: _Optional[int] = ...) -> None: ...

class ResolveGlobalTransactionRequest(_message.Message):
    __slots__ = ("global_transaction_id", "participant")
    GLOBAL_TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_FIELD_NUMBER: _ClassVar[int]
    global_transaction_id: str
    participant: str
    def __init__(self, global_transaction_id: _Optional[str] = ..., participant: _Optional[str] = ...) -> None: ...

class ResolveGlobalTransactionResponse(_message.Message):
    __slots__ = ("state", "source", "producer_group")
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.TransactionState
    source: _common_pb2.TransactionSource
    producer_group: str
    def __init__(self, state: _Optional[_Union[_common_pb2.TransactionState, str]] = ..., source: _Optional[_Union[_common_pb2.TransactionSource, str]] = ..., producer_group: _Optional[str] = ...) -> None: ...

class GetGlobalTransactionRequest(_message.Message):
    __slots__ = ("global_transaction_id",)
    GLOBAL_TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    global_transaction_id: str
    def __init__(self, global_transaction_id: _Optional[str] = ...) -> None: ...

class GetGlobalTransactionResponse(_message.Message):
    __slots__ = ("transaction", "participants", "participants_pending", "parts")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    transaction: _common_pb2.Transaction
    participants: _containers.RepeatedScalarFieldContainer[str]
    participants_pending: _containers.RepeatedScalarFieldContainer[str]
    parts: _containers.RepeatedCompositeFieldContainer[_common_pb2.Transaction]
    def __init__(self, transaction: _Optional[_Union[_common_pb2.Transaction, _Mapping]] = ..., participants: _Optional[_Iterable[str]] = ..., participants_pending: _Optional[_Iterable[str]] = ..., parts: _Optional[_Iterable[_Union[_common_pb2.Transaction, _Mapping]]] = ...) -> None: ...

class ListGlobalTransactionsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class GlobalTransactionSummary(_message.Message):
    __slots__ = ("global_transaction_id", "coordinator", "open_parts", "participants_pending")
    GLOBAL_TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    OPEN_PARTS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    global_transaction_id: str
    coordinator: bool
    open_parts: int
    participants_pending: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, global_transaction_id: _Optional[str] = ..., coordinator: _Optional[bool] = ..., open_parts: _Optional[int] = ..., participants_pending: _Optional[_Iterable[str]] = ...) -> None: ...

class ListGlobalTransactionsResponse(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[GlobalTransactionSummary]
    def __init__(self, transactions: _Optional[_Iterable[_Union[GlobalTransactionSummary, _Mapping]]] = ...) -> None: ...

class QueueOffset(_message.Message):
    __slots__ = ("queue_id", "offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    offset: int
    def __init__(self, queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ResetGroupOffsetsRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "target", "timestamp_ms", "offsets", "shift", "dry_run", "force", "operator", "reason")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    target: ResetTarget
    timestamp_ms: int
    offsets: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    shift: int
    dry_run: bool
    force: bool
    operator: str
    reason: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., target: _Optional[_Union[ResetTarget, str]] = ..., timestamp_ms: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ..., shift: _Optional[int] = ..., dry_run: _Optional[bool] = ..., force: _Optional[bool] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class QueueReset(_message.Message):
    __slots__ = ("broker_name", "queue_id", "current_offset", "new_offset", "min_offset", "max_offset", "lag_before", "lag_after", "inflight_invalidated")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEW_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_BEFORE_FIELD_NUMBER: _ClassVar[int]
    LAG_AFTER_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    queue_id: int
    current_offset: int
    new_offset: int
    min_offset: int
    max_offset: int
    lag_before: int
    lag_after: int
    inflight_invalidated: int
    def __init__(self, broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ..., current_offset: _Optional[int] = ..., new_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag_before: _Optional[int] = ..., lag_after: _Optional[int] = ..., inflight_invalidated: _Optional[int] = ...) -> None: ...

class GroupClient(_message.Message):
    __slots__ = ("client_id", "address", "kind", "group", "topics", "last_seen_ms", "waiting", "capacity", "broker_name")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    address: str
    kind: str
    group: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    last_seen_ms: int
    waiting: bool
    capacity: int
    broker_name: str
    def __init__(self, client_id: _Optional[str] = ..., address: _Optional[str] = ..., kind: _Optional[str] = ..., group: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., last_seen_ms: _Optional[int] = ..., waiting: _Optional[bool] = ..., capacity: _Optional[int] = ..., broker_name: _Optional[str] = ...) -> None: ...

class ResetGroupOffsetsResponse(_message.Message):
    __slots__ = ("queues", "live_consumers", "applied")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    LIVE_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueReset]
    live_consumers: _containers.RepeatedCompositeFieldContainer[GroupClient]
    applied: bool
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueReset, _Mapping]]] = ..., live_consumers: _Optional[_Iterable[_Union[GroupClient, _Mapping]]] = ..., applied: _Optional[bool] = ...) -> None: ...

class LookupMessagesRequest(_message.Message):
    __slots__ = ("message_id", "topic", "key", "by_offset", "queue_id", "offset", "limit", "begin_ms", "end_ms")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEGIN_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    key: str
    by_offset: bool
    queue_id: int
    offset: int
    limit: int
    begin_ms: int
    end_ms: int
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ..., key: _Optional[str] = ..., by_offset: _Optional[bool] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ..., begin_ms: _Optional[int] = ..., end_ms: _Optional[int] = ...) -> None: ...

class FoundMessage(_message.Message):
    __slots__ = ("message", "transaction_state", "scheduled")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_STATE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    message: _common_pb2.DeliveredMessage
    transaction_state: _common_pb2.TransactionState
    scheduled: bool
    def __init__(self, message: _Optional[_Union[_common_pb2.DeliveredMessage, _Mapping]] = ..., transaction_state: _Optional[_Union[_common_pb2.TransactionState, str]] = ..., scheduled: _Optional[bool] = ...) -> None: ...

class LookupMessagesResponse(_message.Message):
    __slots__ = ("messages", "truncated")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[FoundMessage]
    truncated: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[FoundMessage, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class DescribeGroupClientsRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class DescribeGroupClientsResponse(_message.Message):
    __slots__ = ("clients",)
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    clients: _containers.RepeatedCompositeFieldContainer[GroupClient]
    def __init__(self, clients: _Optional[_Iterable[_Union[GroupClient, _Mapping]]] = ...) -> None: ...
