from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
