from txmq.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SetDrainingRequest(_message.Message):
    __slots__ = ("draining",)
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    def __init__(self, draining: _Optional[bool] = ...) -> None: ...

class SetDrainingResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: DrainStatus
    def __init__(self, status: _Optional[_Union[DrainStatus, _Mapping]] = ...) -> None: ...

class GetDrainStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetDrainStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: DrainStatus
    def __init__(self, status: _Optional[_Union[DrainStatus, _Mapping]] = ...) -> None: ...

class DrainStatus(_message.Message):
    __slots__ = ("shard", "draining", "pending_transactions", "discarded_transactions", "backlog", "unread_topics", "topics", "empty")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    PENDING_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    UNREAD_TOPICS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELD_NUMBER: _ClassVar[int]
    shard: str
    draining: bool
    pending_transactions: int
    discarded_transactions: int
    backlog: _containers.RepeatedCompositeFieldContainer[ConsumerBacklog]
    unread_topics: _containers.RepeatedScalarFieldContainer[str]
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicQueues]
    empty: bool
    def __init__(self, shard: _Optional[str] = ..., draining: _Optional[bool] = ..., pending_transactions: _Optional[int] = ..., discarded_transactions: _Optional[int] = ..., backlog: _Optional[_Iterable[_Union[ConsumerBacklog, _Mapping]]] = ..., unread_topics: _Optional[_Iterable[str]] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicQueues, _Mapping]]] = ..., empty: _Optional[bool] = ...) -> None: ...

class ConsumerBacklog(_message.Message):
    __slots__ = ("consumer_group", "topic", "unacknowledged")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    UNACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    unacknowledged: int
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., unacknowledged: _Optional[int] = ...) -> None: ...

class BackupStoreRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupStoreResponse(_message.Message):
    __slots__ = ("chunk", "manifest")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    chunk: BackupFileChunk
    manifest: BackupManifest
    def __init__(self, chunk: _Optional[_Union[BackupFileChunk, _Mapping]] = ..., manifest: _Optional[_Union[BackupManifest, _Mapping]] = ...) -> None: ...

class BackupFileChunk(_message.Message):
    __slots__ = ("file_name", "file_size", "data")
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    file_name: str
    file_size: int
    data: bytes
    def __init__(self, file_name: _Optional[str] = ..., file_size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class BackupManifest(_message.Message):
    __slots__ = ("shard", "replica_id", "replication_factor", "last_log_sequence", "log_end", "created_at_ms", "files")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    shard: str
    replica_id: int
    replication_factor: int
    last_log_sequence: int
    log_end: int
    created_at_ms: int
    files: _containers.RepeatedCompositeFieldContainer[BackupFile]
    def __init__(self, shard: _Optional[str] = ..., replica_id: _Optional[int] = ..., replication_factor: _Optional[int] = ..., last_log_sequence: _Optional[int] = ..., log_end: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., files: _Optional[_Iterable[_Union[BackupFile, _Mapping]]] = ...) -> None: ...

class BackupFile(_message.Message):
    __slots__ = ("name", "size", "sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    sha256: str
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...
