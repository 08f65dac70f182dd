from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

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
