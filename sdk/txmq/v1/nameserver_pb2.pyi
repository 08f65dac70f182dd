from txmq.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BrokerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BROKER_ROLE_UNSPECIFIED: _ClassVar[BrokerRole]
    BROKER_ROLE_LEADER: _ClassVar[BrokerRole]
    BROKER_ROLE_FOLLOWER: _ClassVar[BrokerRole]
BROKER_ROLE_UNSPECIFIED: BrokerRole
BROKER_ROLE_LEADER: BrokerRole
BROKER_ROLE_FOLLOWER: BrokerRole

class BrokerInfo(_message.Message):
    __slots__ = ("name", "address", "topics", "last_heartbeat_ms", "replica_id", "role", "leader_epoch", "replication", "draining")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicQueues]
    last_heartbeat_ms: int
    replica_id: int
    role: BrokerRole
    leader_epoch: int
    replication: ReplicationStatus
    draining: bool
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicQueues, _Mapping]]] = ..., last_heartbeat_ms: _Optional[int] = ..., replica_id: _Optional[int] = ..., role: _Optional[_Union[BrokerRole, str]] = ..., leader_epoch: _Optional[int] = ..., replication: _Optional[_Union[ReplicationStatus, _Mapping]] = ..., draining: _Optional[bool] = ...) -> None: ...

class ReplicationStatus(_message.Message):
    __slots__ = ("replication_factor", "min_insync_replicas", "in_sync_replicas", "log_end", "commit_lsn", "followers", "complete")
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LSN_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    replication_factor: int
    min_insync_replicas: int
    in_sync_replicas: _containers.RepeatedScalarFieldContainer[int]
    log_end: int
    commit_lsn: int
    followers: _containers.RepeatedCompositeFieldContainer[FollowerStatus]
    complete: bool
    def __init__(self, replication_factor: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ..., in_sync_replicas: _Optional[_Iterable[int]] = ..., log_end: _Optional[int] = ..., commit_lsn: _Optional[int] = ..., followers: _Optional[_Iterable[_Union[FollowerStatus, _Mapping]]] = ..., complete: _Optional[bool] = ...) -> None: ...

class FollowerStatus(_message.Message):
    __slots__ = ("replica_id", "connected", "in_sync", "durable_lsn", "lag_records", "lag_seconds")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    DURABLE_LSN_FIELD_NUMBER: _ClassVar[int]
    LAG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    connected: bool
    in_sync: bool
    durable_lsn: int
    lag_records: int
    lag_seconds: float
    def __init__(self, replica_id: _Optional[int] = ..., connected: _Optional[bool] = ..., in_sync: _Optional[bool] = ..., durable_lsn: _Optional[int] = ..., lag_records: _Optional[int] = ..., lag_seconds: _Optional[float] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("broker",)
    BROKER_FIELD_NUMBER: _ClassVar[int]
    broker: BrokerInfo
    def __init__(self, broker: _Optional[_Union[BrokerInfo, _Mapping]] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("heartbeat_interval_seconds", "expiry_seconds")
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_seconds: float
    expiry_seconds: float
    def __init__(self, heartbeat_interval_seconds: _Optional[float] = ..., expiry_seconds: _Optional[float] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("name", "replica_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    replica_id: int
    def __init__(self, name: _Optional[str] = ..., replica_id: _Optional[int] = ...) -> None: ...

class UnregisterBrokerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckerInfo(_message.Message):
    __slots__ = ("name", "address", "last_heartbeat_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    last_heartbeat_ms: int
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., last_heartbeat_ms: _Optional[int] = ...) -> None: ...

class RegisterCheckerRequest(_message.Message):
    __slots__ = ("checker",)
    CHECKER_FIELD_NUMBER: _ClassVar[int]
    checker: CheckerInfo
    def __init__(self, checker: _Optional[_Union[CheckerInfo, _Mapping]] = ...) -> None: ...

class RegisterCheckerResponse(_message.Message):
    __slots__ = ("heartbeat_interval_seconds", "expiry_seconds")
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_seconds: float
    expiry_seconds: float
    def __init__(self, heartbeat_interval_seconds: _Optional[float] = ..., expiry_seconds: _Optional[float] = ...) -> None: ...

class UnregisterCheckerRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnregisterCheckerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryRouteRequest(_message.Message):
    __slots__ = ("topic", "for_send")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FOR_SEND_FIELD_NUMBER: _ClassVar[int]
    topic: str
    for_send: bool
    def __init__(self, topic: _Optional[str] = ..., for_send: _Optional[bool] = ...) -> None: ...

class QueueRoute(_message.Message):
    __slots__ = ("broker_name", "broker_address", "queue_id", "draining")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_address: str
    queue_id: int
    draining: bool
    def __init__(self, broker_name: _Optional[str] = ..., broker_address: _Optional[str] = ..., queue_id: _Optional[int] = ..., draining: _Optional[bool] = ...) -> None: ...

class QueryRouteResponse(_message.Message):
    __slots__ = ("topic", "queues", "topic_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TOPIC_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueRoute]
    topic_type: _common_pb2.TopicType
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueRoute, _Mapping]]] = ..., topic_type: _Optional[_Union[_common_pb2.TopicType, str]] = ...) -> None: ...

class ListBrokersRequest(_message.Message):
    __slots__ = ("include_followers",)
    INCLUDE_FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    include_followers: bool
    def __init__(self, include_followers: _Optional[bool] = ...) -> None: ...

class ListBrokersResponse(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ...) -> None: ...

class ListCheckersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCheckersResponse(_message.Message):
    __slots__ = ("checkers",)
    CHECKERS_FIELD_NUMBER: _ClassVar[int]
    checkers: _containers.RepeatedCompositeFieldContainer[CheckerInfo]
    def __init__(self, checkers: _Optional[_Iterable[_Union[CheckerInfo, _Mapping]]] = ...) -> None: ...
