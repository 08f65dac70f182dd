from txmq.v1 import broker_pb2 as _broker_pb2
from txmq.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResetOffsetsRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "target", "timestamp_ms", "offsets", "shift", "dry_run", "force", "reason", "operator")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    target: _broker_pb2.ResetTarget
    timestamp_ms: int
    offsets: _containers.RepeatedCompositeFieldContainer[BrokerQueueOffset]
    shift: int
    dry_run: bool
    force: bool
    reason: str
    operator: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., target: _Optional[_Union[_broker_pb2.ResetTarget, str]] = ..., timestamp_ms: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[BrokerQueueOffset, _Mapping]]] = ..., shift: _Optional[int] = ..., dry_run: _Optional[bool] = ..., force: _Optional[bool] = ..., reason: _Optional[str] = ..., operator: _Optional[str] = ...) -> None: ...

class BrokerQueueOffset(_message.Message):
    __slots__ = ("broker_name", "queue_id", "offset")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    queue_id: int
    offset: int
    def __init__(self, broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ResetOffsetsResponse(_message.Message):
    __slots__ = ("queues", "live_consumers", "applied", "operator", "unreachable_brokers")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    LIVE_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[_broker_pb2.QueueReset]
    live_consumers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.GroupClient]
    applied: bool
    operator: str
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[_Union[_broker_pb2.QueueReset, _Mapping]]] = ..., live_consumers: _Optional[_Iterable[_Union[_broker_pb2.GroupClient, _Mapping]]] = ..., applied: _Optional[bool] = ..., operator: _Optional[str] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class GetMessageRequest(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class GetMessageResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: _broker_pb2.FoundMessage
    def __init__(self, message: _Optional[_Union[_broker_pb2.FoundMessage, _Mapping]] = ...) -> None: ...

class FindMessagesRequest(_message.Message):
    __slots__ = ("topic", "key", "limit", "begin_ms", "end_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEGIN_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    limit: int
    begin_ms: int
    end_ms: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., limit: _Optional[int] = ..., begin_ms: _Optional[int] = ..., end_ms: _Optional[int] = ...) -> None: ...

class FindMessagesResponse(_message.Message):
    __slots__ = ("messages", "truncated", "unreachable_brokers")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_broker_pb2.FoundMessage]
    truncated: bool
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, messages: _Optional[_Iterable[_Union[_broker_pb2.FoundMessage, _Mapping]]] = ..., truncated: _Optional[bool] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadMessagesRequest(_message.Message):
    __slots__ = ("topic", "broker_name", "queue_id", "offset", "limit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    broker_name: str
    queue_id: int
    offset: int
    limit: int
    def __init__(self, topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ReadMessagesResponse(_message.Message):
    __slots__ = ("messages", "min_offset", "max_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_broker_pb2.FoundMessage]
    min_offset: int
    max_offset: int
    def __init__(self, messages: _Optional[_Iterable[_Union[_broker_pb2.FoundMessage, _Mapping]]] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class ListGroupClientsRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class ListGroupClientsResponse(_message.Message):
    __slots__ = ("clients", "unreachable_brokers")
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    clients: _containers.RepeatedCompositeFieldContainer[_broker_pb2.GroupClient]
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, clients: _Optional[_Iterable[_Union[_broker_pb2.GroupClient, _Mapping]]] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class ExpandTopicRequest(_message.Message):
    __slots__ = ("topic", "broker_name", "queue_count")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    broker_name: str
    queue_count: int
    def __init__(self, topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., queue_count: _Optional[int] = ...) -> None: ...

class ExpandTopicResponse(_message.Message):
    __slots__ = ("topic", "brokers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerQueues]
    def __init__(self, topic: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerQueues, _Mapping]]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "queue_count", "topic_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    topic_type: _common_pb2.TopicType
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ..., topic_type: _Optional[_Union[_common_pb2.TopicType, str]] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("topic", "brokers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerQueues]
    def __init__(self, topic: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerQueues, _Mapping]]] = ...) -> None: ...

class BrokerQueues(_message.Message):
    __slots__ = ("broker_name", "queue_count")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    queue_count: int
    def __init__(self, broker_name: _Optional[str] = ..., queue_count: _Optional[int] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("topic", "brokers", "topic_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerQueues]
    topic_type: _common_pb2.TopicType
    def __init__(self, topic: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerQueues, _Mapping]]] = ..., topic_type: _Optional[_Union[_common_pb2.TopicType, str]] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("producer_group", "state", "older_than_seconds", "limit", "namespace", "key")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    state: _common_pb2.TransactionState
    older_than_seconds: float
    limit: int
    namespace: str
    key: str
    def __init__(self, producer_group: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.TransactionState, str]] = ..., older_than_seconds: _Optional[float] = ..., limit: _Optional[int] = ..., namespace: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("transactions", "unreachable_brokers", "truncated", "truncated_brokers")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_BROKERS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Transaction]
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    truncated: bool
    truncated_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, transactions: _Optional[_Iterable[_Union[_common_pb2.Transaction, _Mapping]]] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ..., truncated: _Optional[bool] = ..., truncated_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeTransactionRequest(_message.Message):
    __slots__ = ("transaction_id",)
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    def __init__(self, transaction_id: _Optional[str] = ...) -> None: ...

class DescribeTransactionResponse(_message.Message):
    __slots__ = ("transaction", "message")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    transaction: _common_pb2.Transaction
    message: _common_pb2.Message
    def __init__(self, transaction: _Optional[_Union[_common_pb2.Transaction, _Mapping]] = ..., message: _Optional[_Union[_common_pb2.Message, _Mapping]] = ...) -> None: ...

class ResolveTransactionRequest(_message.Message):
    __slots__ = ("transaction_id", "resolution", "operator", "reason")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    resolution: _common_pb2.TransactionResolution
    operator: str
    reason: str
    def __init__(self, transaction_id: _Optional[str] = ..., resolution: _Optional[_Union[_common_pb2.TransactionResolution, str]] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResolveTransactionResponse(_message.Message):
    __slots__ = ("transaction",)
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    transaction: _common_pb2.Transaction
    def __init__(self, transaction: _Optional[_Union[_common_pb2.Transaction, _Mapping]] = ...) -> None: ...

class ElectLeaderRequest(_message.Message):
    __slots__ = ("shard", "replica_id")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    shard: str
    replica_id: int
    def __init__(self, shard: _Optional[str] = ..., replica_id: _Optional[int] = ...) -> None: ...

class ElectLeaderResponse(_message.Message):
    __slots__ = ("previous_replica_id", "log_end")
    PREVIOUS_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    previous_replica_id: int
    log_end: int
    def __init__(self, previous_replica_id: _Optional[int] = ..., log_end: _Optional[int] = ...) -> None: ...

class DescribeBrokersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeBrokersResponse(_message.Message):
    __slots__ = ("brokers", "unreachable_brokers")
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.GetBrokerStatsResponse]
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, brokers: _Optional[_Iterable[_Union[_broker_pb2.GetBrokerStatsResponse, _Mapping]]] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class TopicQueue(_message.Message):
    __slots__ = ("broker_name", "queue_id", "min_offset", "max_offset")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class DescribeTopicResponse(_message.Message):
    __slots__ = ("topic", "queues", "consumers", "unreachable_brokers", "topic_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: _containers.RepeatedCompositeFieldContainer[TopicQueue]
    consumers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.ConsumerQueueStatus]
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    topic_type: _common_pb2.TopicType
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[TopicQueue, _Mapping]]] = ..., consumers: _Optional[_Iterable[_Union[_broker_pb2.ConsumerQueueStatus, _Mapping]]] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ..., topic_type: _Optional[_Union[_common_pb2.TopicType, str]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("consumer_group", "limit")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    limit: int
    def __init__(self, consumer_group: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("messages", "unreachable_brokers", "truncated")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeliveredMessage]
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    truncated: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.DeliveredMessage, _Mapping]]] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class ListConsumerGroupsRequest(_message.Message):
    __slots__ = ("consumer_group", "topic")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class ListConsumerGroupsResponse(_message.Message):
    __slots__ = ("queues", "dead_letters", "unreachable_brokers")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[_broker_pb2.ConsumerQueueStatus]
    dead_letters: _containers.RepeatedCompositeFieldContainer[_broker_pb2.GroupDeadLetters]
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[_Union[_broker_pb2.ConsumerQueueStatus, _Mapping]]] = ..., dead_letters: _Optional[_Iterable[_Union[_broker_pb2.GroupDeadLetters, _Mapping]]] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class RedriveDeadLettersRequest(_message.Message):
    __slots__ = ("consumer_group", "message_ids", "all")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, consumer_group: _Optional[str] = ..., message_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class RedriveDeadLettersResponse(_message.Message):
    __slots__ = ("redriven", "not_found", "expired", "unreachable_brokers")
    REDRIVEN_FIELD_NUMBER: _ClassVar[int]
    NOT_FOUND_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    redriven: _containers.RepeatedScalarFieldContainer[str]
    not_found: _containers.RepeatedScalarFieldContainer[str]
    expired: _containers.RepeatedScalarFieldContainer[str]
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, redriven: _Optional[_Iterable[str]] = ..., not_found: _Optional[_Iterable[str]] = ..., expired: _Optional[_Iterable[str]] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic", "force")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    force: bool
    def __init__(self, topic: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("topic", "brokers", "entries_deleted", "consumer_groups")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    brokers: _containers.RepeatedScalarFieldContainer[str]
    entries_deleted: int
    consumer_groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., brokers: _Optional[_Iterable[str]] = ..., entries_deleted: _Optional[int] = ..., consumer_groups: _Optional[_Iterable[str]] = ...) -> None: ...
