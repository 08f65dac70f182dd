from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransactionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_STATE_UNSPECIFIED: _ClassVar[TransactionState]
    TRANSACTION_STATE_PREPARED: _ClassVar[TransactionState]
    TRANSACTION_STATE_COMMITTED: _ClassVar[TransactionState]
    TRANSACTION_STATE_ROLLED_BACK: _ClassVar[TransactionState]
    TRANSACTION_STATE_DISCARDED: _ClassVar[TransactionState]

class TransactionResolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_RESOLUTION_UNSPECIFIED: _ClassVar[TransactionResolution]
    TRANSACTION_RESOLUTION_COMMIT: _ClassVar[TransactionResolution]
    TRANSACTION_RESOLUTION_ROLLBACK: _ClassVar[TransactionResolution]
    TRANSACTION_RESOLUTION_UNKNOWN: _ClassVar[TransactionResolution]

class TransactionSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_SOURCE_UNSPECIFIED: _ClassVar[TransactionSource]
    TRANSACTION_SOURCE_CLIENT: _ClassVar[TransactionSource]
    TRANSACTION_SOURCE_CHECK: _ClassVar[TransactionSource]
    TRANSACTION_SOURCE_OPERATOR: _ClassVar[TransactionSource]
    TRANSACTION_SOURCE_BROKER: _ClassVar[TransactionSource]

class CheckResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECK_RESULT_UNSPECIFIED: _ClassVar[CheckResult]
    CHECK_RESULT_COMMIT: _ClassVar[CheckResult]
    CHECK_RESULT_ROLLBACK: _ClassVar[CheckResult]
    CHECK_RESULT_UNKNOWN: _ClassVar[CheckResult]
    CHECK_RESULT_IN_PROGRESS: _ClassVar[CheckResult]

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_TYPE_UNSPECIFIED: _ClassVar[MessageType]
    MESSAGE_TYPE_NORMAL: _ClassVar[MessageType]
    MESSAGE_TYPE_TRANSACTION: _ClassVar[MessageType]

class TopicType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPIC_TYPE_UNSPECIFIED: _ClassVar[TopicType]
    TOPIC_TYPE_NORMAL: _ClassVar[TopicType]
    TOPIC_TYPE_FIFO: _ClassVar[TopicType]
TRANSACTION_STATE_UNSPECIFIED: TransactionState
TRANSACTION_STATE_PREPARED: TransactionState
TRANSACTION_STATE_COMMITTED: TransactionState
TRANSACTION_STATE_ROLLED_BACK: TransactionState
TRANSACTION_STATE_DISCARDED: TransactionState
TRANSACTION_RESOLUTION_UNSPECIFIED: TransactionResolution
TRANSACTION_RESOLUTION_COMMIT: TransactionResolution
TRANSACTION_RESOLUTION_ROLLBACK: TransactionResolution
TRANSACTION_RESOLUTION_UNKNOWN: TransactionResolution
TRANSACTION_SOURCE_UNSPECIFIED: TransactionSource
TRANSACTION_SOURCE_CLIENT: TransactionSource
TRANSACTION_SOURCE_CHECK: TransactionSource
TRANSACTION_SOURCE_OPERATOR: TransactionSource
TRANSACTION_SOURCE_BROKER: TransactionSource
CHECK_RESULT_UNSPECIFIED: CheckResult
CHECK_RESULT_COMMIT: CheckResult
CHECK_RESULT_ROLLBACK: CheckResult
CHECK_RESULT_UNKNOWN: CheckResult
CHECK_RESULT_IN_PROGRESS: CheckResult
MESSAGE_TYPE_UNSPECIFIED: MessageType
MESSAGE_TYPE_NORMAL: MessageType
MESSAGE_TYPE_TRANSACTION: MessageType
TOPIC_TYPE_UNSPECIFIED: TopicType
TOPIC_TYPE_NORMAL: TopicType
TOPIC_TYPE_FIFO: TopicType

class EntryStatus(_message.Message):
    __slots__ = ("code", "message", "transaction_state", "reason", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    transaction_state: TransactionState
    reason: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., transaction_state: _Optional[_Union[TransactionState, str]] = ..., reason: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("topic", "body", "tag", "keys", "properties", "message_id", "type", "producer_group", "producer_client_id", "check_immunity_seconds", "born_timestamp_ms", "born_host", "queue_id", "deliver_at_ms", "delay_seconds", "message_group")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_IMMUNITY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    body: bytes
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    message_id: str
    type: MessageType
    producer_group: str
    producer_client_id: str
    check_immunity_seconds: float
    born_timestamp_ms: int
    born_host: str
    queue_id: int
    deliver_at_ms: int
    delay_seconds: float
    message_group: str
    def __init__(self, topic: _Optional[str] = ..., body: _Optional[bytes] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., message_id: _Optional[str] = ..., type: _Optional[_Union[MessageType, str]] = ..., producer_group: _Optional[str] = ..., producer_client_id: _Optional[str] = ..., check_immunity_seconds: _Optional[float] = ..., born_timestamp_ms: _Optional[int] = ..., born_host: _Optional[str] = ..., queue_id: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ..., delay_seconds: _Optional[float] = ..., message_group: _Optional[str] = ...) -> None: ...

class DeliveredMessage(_message.Message):
    __slots__ = ("topic", "message", "broker_name", "queue_id", "queue_offset", "transaction_id", "stored_at_ms", "visible_at_ms", "delivery_attempt", "receipt_handle", "invisible_until_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message: Message
    broker_name: str
    queue_id: int
    queue_offset: int
    transaction_id: str
    stored_at_ms: int
    visible_at_ms: int
    delivery_attempt: int
    receipt_handle: str
    invisible_until_ms: int
    def __init__(self, topic: _Optional[str] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., transaction_id: _Optional[str] = ..., stored_at_ms: _Optional[int] = ..., visible_at_ms: _Optional[int] = ..., delivery_attempt: _Optional[int] = ..., receipt_handle: _Optional[str] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("transaction_id", "message_id", "producer_group", "producer_client_id", "topic", "queue_id", "state", "prepared_at_ms", "ended_at_ms", "resolution_source", "checks_delivered", "checks_answered", "next_check_at_ms", "discard_reason", "operator", "reason", "queue_offset", "broker_name", "body_size_bytes", "discarded_at_ms", "keys")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREPARED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    CHECKS_DELIVERED_FIELD_NUMBER: _ClassVar[int]
    CHECKS_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    NEXT_CHECK_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DISCARD_REASON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    message_id: str
    producer_group: str
    producer_client_id: str
    topic: str
    queue_id: int
    state: TransactionState
    prepared_at_ms: int
    ended_at_ms: int
    resolution_source: TransactionSource
    checks_delivered: int
    checks_answered: int
    next_check_at_ms: int
    discard_reason: str
    operator: str
    reason: str
    queue_offset: int
    broker_name: str
    body_size_bytes: int
    discarded_at_ms: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, transaction_id: _Optional[str] = ..., message_id: _Optional[str] = ..., producer_group: _Optional[str] = ..., producer_client_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., state: _Optional[_Union[TransactionState, str]] = ..., prepared_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., resolution_source: _Optional[_Union[TransactionSource, str]] = ..., checks_delivered: _Optional[int] = ..., checks_answered: _Optional[int] = ..., next_check_at_ms: _Optional[int] = ..., discard_reason: _Optional[str] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ..., queue_offset: _Optional[int] = ..., broker_name: _Optional[str] = ..., body_size_bytes: _Optional[int] = ..., discarded_at_ms: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicQueues(_message.Message):
    __slots__ = ("topic", "queue_count", "topic_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    topic_type: TopicType
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ..., topic_type: _Optional[_Union[TopicType, str]] = ...) -> None: ...
