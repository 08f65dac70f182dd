from txmq.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Subscribe(_message.Message):
    __slots__ = ("producer_groups", "client_id", "check_credit")
    PRODUCER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_CREDIT_FIELD_NUMBER: _ClassVar[int]
    producer_groups: _containers.RepeatedScalarFieldContainer[str]
    client_id: str
    check_credit: int
    def __init__(self, producer_groups: _Optional[_Iterable[str]] = ..., client_id: _Optional[str] = ..., check_credit: _Optional[int] = ...) -> None: ...

class CheckCredit(_message.Message):
    __slots__ = ("checks",)
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    checks: int
    def __init__(self, checks: _Optional[int] = ...) -> None: ...

class CheckReceived(_message.Message):
    __slots__ = ("check_id",)
    CHECK_ID_FIELD_NUMBER: _ClassVar[int]
    check_id: str
    def __init__(self, check_id: _Optional[str] = ...) -> None: ...

class CheckDrain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckAnswer(_message.Message):
    __slots__ = ("check_id", "result", "retry_after_seconds", "transaction_id", "broker_name", "producer_group", "credit")
    CHECK_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    check_id: str
    result: _common_pb2.CheckResult
    retry_after_seconds: float
    transaction_id: str
    broker_name: str
    producer_group: str
    credit: int
    def __init__(self, check_id: _Optional[str] = ..., result: _Optional[_Union[_common_pb2.CheckResult, str]] = ..., retry_after_seconds: _Optional[float] = ..., transaction_id: _Optional[str] = ..., broker_name: _Optional[str] = ..., producer_group: _Optional[str] = ..., credit: _Optional[int] = ...) -> None: ...

class CheckTransactionStateRequest(_message.Message):
    __slots__ = ("subscribe", "received", "answer", "credit", "drain")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    subscribe: Subscribe
    received: CheckReceived
    answer: CheckAnswer
    credit: CheckCredit
    drain: CheckDrain
    def __init__(self, subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., received: _Optional[_Union[CheckReceived, _Mapping]] = ..., answer: _Optional[_Union[CheckAnswer, _Mapping]] = ..., credit: _Optional[_Union[CheckCredit, _Mapping]] = ..., drain: _Optional[_Union[CheckDrain, _Mapping]] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("checker_name", "producer_groups")
    CHECKER_NAME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    checker_name: str
    producer_groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checker_name: _Optional[str] = ..., producer_groups: _Optional[_Iterable[str]] = ...) -> None: ...

class CheckRequest(_message.Message):
    __slots__ = ("check_id", "transaction_id", "message", "attempt", "broker_name", "answer_timeout_seconds")
    CHECK_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    check_id: str
    transaction_id: str
    message: _common_pb2.Message
    attempt: int
    broker_name: str
    answer_timeout_seconds: float
    def __init__(self, check_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., message: _Optional[_Union[_common_pb2.Message, _Mapping]] = ..., attempt: _Optional[int] = ..., broker_name: _Optional[str] = ..., answer_timeout_seconds: _Optional[float] = ...) -> None: ...

class CheckTransactionStateResponse(_message.Message):
    __slots__ = ("subscribed", "check", "error")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    check: CheckRequest
    error: _common_pb2.EntryStatus
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., check: _Optional[_Union[CheckRequest, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.EntryStatus, _Mapping]] = ...) -> None: ...
