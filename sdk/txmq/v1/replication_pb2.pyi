from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicateRequest(_message.Message):
    __slots__ = ("hello", "durable_lsn")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    DURABLE_LSN_FIELD_NUMBER: _ClassVar[int]
    hello: ReplicaHello
    durable_lsn: int
    def __init__(self, hello: _Optional[_Union[ReplicaHello, _Mapping]] = ..., durable_lsn: _Optional[int] = ...) -> None: ...

class ReplicaHello(_message.Message):
    __slots__ = ("shard", "replica_id", "leader_epoch", "log_end", "last_epoch")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    shard: str
    replica_id: int
    leader_epoch: int
    log_end: int
    last_epoch: int
    def __init__(self, shard: _Optional[str] = ..., replica_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., log_end: _Optional[int] = ..., last_epoch: _Optional[int] = ...) -> None: ...

class ReplicateResponse(_message.Message):
    __slots__ = ("leader_epoch", "commit_lsn", "truncate_to", "entries", "checkpoint_needed")
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LSN_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TO_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NEEDED_FIELD_NUMBER: _ClassVar[int]
    leader_epoch: int
    commit_lsn: int
    truncate_to: int
    entries: bytes
    checkpoint_needed: bool
    def __init__(self, leader_epoch: _Optional[int] = ..., commit_lsn: _Optional[int] = ..., truncate_to: _Optional[int] = ..., entries: _Optional[bytes] = ..., checkpoint_needed: _Optional[bool] = ...) -> None: ...

class FetchCheckpointRequest(_message.Message):
    __slots__ = ("shard", "replica_id", "leader_epoch")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    shard: str
    replica_id: int
    leader_epoch: int
    def __init__(self, shard: _Optional[str] = ..., replica_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class FetchCheckpointResponse(_message.Message):
    __slots__ = ("file_name", "file_size", "data", "log_end")
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    file_name: str
    file_size: int
    data: bytes
    log_end: int
    def __init__(self, file_name: _Optional[str] = ..., file_size: _Optional[int] = ..., data: _Optional[bytes] = ..., log_end: _Optional[int] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("shard", "replica_id")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    shard: str
    replica_id: int
    def __init__(self, shard: _Optional[str] = ..., replica_id: _Optional[int] = ...) -> None: ...

class TransferLeadershipResponse(_message.Message):
    __slots__ = ("previous_replica_id", "log_end")
    PREVIOUS_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    previous_replica_id: int
    log_end: int
    def __init__(self, previous_replica_id: _Optional[int] = ..., log_end: _Optional[int] = ...) -> None: ...
