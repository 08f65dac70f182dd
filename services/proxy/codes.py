"""txmq errors → RocketMQ ``Status`` codes: the proxy's one error mapping.

The official clients read errors in band (``Status{code, message}`` in every response); a
gRPC-level failure is a transport error to them. So every handler of the servicer turns a
``TxmqError`` into a status with :func:`code_for` and answers normally.

Which code the clients treat how (rocketmq-clients ``StatusChecker``): 20000 OK; 40401
MESSAGE_NOT_FOUND is "no data"; 40000-40020 raise BadRequest; 40402 TOPIC_NOT_FOUND raises
NotFound; 41301 MESSAGE_BODY_TOO_LARGE PayloadTooLarge; 42900 TOO_MANY_REQUESTS stops send
retries; 50000-50002 are internal (retried by some); 50100 NOT_IMPLEMENTED is Unsupported.
Every gRPC status a native call can end with has its code here (``_BY_GRPC``), and its
message names the cause.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import grpc

from txmq.errors import TxmqError, error_from_rpc

from .protocol import Code, definition_pb2

log = logging.getLogger(__name__)


class ProxyError(TxmqError):
    """An error the proxy itself raises, carrying the RocketMQ code to answer with."""

    def __init__(self, rmq_code: int, message: str) -> None:
        super().__init__(message)
        self.rmq_code = rmq_code


def unsupported(what: str) -> ProxyError:
    return ProxyError(Code.NOT_IMPLEMENTED, f"{what} is not supported by txmq")


#: (reason, kind or field) → code; the first match wins, then reason alone, then the gRPC code.
_BY_REASON_AND_KIND = {
    ("INVALID_ID", "transaction id"): Code.INVALID_TRANSACTION_ID,
    ("WRONG_BROKER", "transaction id"): Code.INVALID_TRANSACTION_ID,
    ("INVALID_ID", "receipt handle"): Code.INVALID_RECEIPT_HANDLE,
    ("WRONG_BROKER", "receipt handle"): Code.INVALID_RECEIPT_HANDLE,
    ("INVALID_ID", "message id"): Code.ILLEGAL_MESSAGE_ID,
    ("WRONG_BROKER", "message id"): Code.ILLEGAL_MESSAGE_ID,
    ("INVALID_NAME", "consumer_group"): Code.ILLEGAL_CONSUMER_GROUP,
    ("INVALID_NAME", "producer_group"): Code.ILLEGAL_TOPIC,
    ("INVALID_NAME", "topic"): Code.ILLEGAL_TOPIC,
    ("INVALID_FIELD", "tag"): Code.ILLEGAL_MESSAGE_TAG,
    ("INVALID_FIELD", "filter_expression"): Code.ILLEGAL_FILTER_EXPRESSION,
    ("INVALID_FIELD", "deliver_at_ms"): Code.ILLEGAL_DELIVERY_TIME,
    ("INVALID_FIELD", "message_group"): Code.ILLEGAL_MESSAGE_GROUP,
    ("INVALID_FIELD", "invisible_duration_seconds"): Code.ILLEGAL_INVISIBLE_TIME,
    ("INVALID_FIELD", "properties"): Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
    ("INVALID_FIELD", "message_id"): Code.INVALID_TRANSACTION_ID,
}
_BY_REASON = {
    "MESSAGE_TOO_LARGE": Code.MESSAGE_BODY_TOO_LARGE,
    "SYSTEM_TOPIC": Code.ILLEGAL_TOPIC,
    "INVALID_NAME": Code.BAD_REQUEST,
    "PROPERTIES_TOO_LARGE": Code.MESSAGE_PROPERTIES_TOO_LARGE,
    "INVALID_FIELD": Code.BAD_REQUEST,
    "INVALID_ID": Code.BAD_REQUEST,
    "TOPIC_NOT_FOUND": Code.TOPIC_NOT_FOUND,
    "QUEUE_NOT_FOUND": Code.NOT_FOUND,
    "TRANSACTION_NOT_FOUND": Code.INVALID_TRANSACTION_ID,
    "RECEIPT_HANDLE_EXPIRED": Code.INVALID_RECEIPT_HANDLE,
    "BROKER_NOT_FOUND": Code.HA_NOT_AVAILABLE,
    # COMMIT after ROLLBACK (or the reverse): the first decision stands.
    "TRANSACTION_STATE_CONFLICT": Code.INVALID_TRANSACTION_ID,
    "DISK_FULL": Code.TOO_MANY_REQUESTS,
    "NO_BROKER": Code.HA_NOT_AVAILABLE,
    # The topic's shards are between leaders (a fail-over): retried by the clients.
    "NO_LEADER": Code.HA_NOT_AVAILABLE,
}
#: Every gRPC status a native call can end with → the RocketMQ code, and the cause to name
#: (None: the status also comes from txmq's own refusals, whose messages say what was wrong).
#: The official clients retry a send on any code but 42900 (Java and Node.js after a backoff,
#: Python gives up; none retries a transactional send) and a consumer polls again after any
#: error: so a transient failure must not read as a bug (50001) nor as "slow down" (42900)
#: unless it is one. Transient ones (CANCELLED, ABORTED, UNAVAILABLE: the call did not run
#: or may run again) answer HA_NOT_AVAILABLE, a timeout PROXY_TIMEOUT.
_BY_GRPC: dict[grpc.StatusCode, tuple[int, str | None]] = {
    grpc.StatusCode.CANCELLED: (Code.HA_NOT_AVAILABLE, "the call was cancelled upstream before it was answered "
                                                       "(e.g. a service's request queue was full): retry"),
    grpc.StatusCode.UNKNOWN: (Code.INTERNAL_SERVER_ERROR, "an upstream service failed without saying why"),
    grpc.StatusCode.INVALID_ARGUMENT: (Code.BAD_REQUEST, None),
    grpc.StatusCode.DEADLINE_EXCEEDED: (Code.PROXY_TIMEOUT, "an upstream service did not answer in time: retry"),
    grpc.StatusCode.NOT_FOUND: (Code.NOT_FOUND, None),
    grpc.StatusCode.ALREADY_EXISTS: (Code.BAD_REQUEST, None),
    grpc.StatusCode.PERMISSION_DENIED: (Code.FORBIDDEN, None),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (Code.TOO_MANY_REQUESTS, None),
    grpc.StatusCode.FAILED_PRECONDITION: (Code.PRECONDITION_FAILED, None),
    grpc.StatusCode.ABORTED: (Code.HA_NOT_AVAILABLE, "the call was aborted upstream (a conflict): retry"),
    grpc.StatusCode.OUT_OF_RANGE: (Code.BAD_REQUEST, "a value is out of range upstream"),
    grpc.StatusCode.UNIMPLEMENTED: (Code.NOT_IMPLEMENTED, "an upstream service does not implement the call "
                                                          "(an older version?)"),
    grpc.StatusCode.INTERNAL: (Code.INTERNAL_SERVER_ERROR, "an upstream service failed"),
    grpc.StatusCode.UNAVAILABLE: (Code.HA_NOT_AVAILABLE, "an upstream service is unavailable: retry"),
    grpc.StatusCode.DATA_LOSS: (Code.INTERNAL_SERVER_ERROR, "an upstream service reported data loss"),
    grpc.StatusCode.UNAUTHENTICATED: (Code.UNAUTHORIZED, None),
}


def _as_txmq(error: BaseException) -> BaseException:
    """A native call's failure that was not turned into a ``TxmqError`` yet, turned."""
    if isinstance(error, grpc.RpcError) and not isinstance(error, TxmqError):
        return error_from_rpc(error)
    return error


def _mapped(error: BaseException) -> tuple[int, str | None]:
    """The RocketMQ code, and the cause to name when only the gRPC status decided it."""
    error = _as_txmq(error)
    if isinstance(error, ProxyError):
        return error.rmq_code, None
    if not isinstance(error, TxmqError):
        return Code.INTERNAL_SERVER_ERROR, None
    details = error.details
    kind = details.get("kind") or details.get("field")
    if isinstance(kind, str):
        code = _BY_REASON_AND_KIND.get((error.reason, kind))
        if code is not None:
            return code, None
    code = _BY_REASON.get(error.reason)
    if code is not None:
        return code, None
    return _BY_GRPC.get(error.code, (Code.INTERNAL_SERVER_ERROR, "an upstream service failed"))


def code_for(error: BaseException) -> int:
    """The RocketMQ code a failed request answers with."""
    return _mapped(error)[0]


def message_for(error: BaseException) -> str:
    """The status message: the error's own, after the status and its cause for a failure
    only its gRPC status describes (``CANCELLED: the call was cancelled upstream ...: ...``)."""
    error = _as_txmq(error)
    if not isinstance(error, TxmqError):
        return f"internal error: {type(error).__name__}"
    _, cause = _mapped(error)
    return error.message if cause is None else f"{error.code.name}: {cause}: {error.message}"


def status(error: BaseException | None = None, message: str = "OK") -> "definition_pb2.Status":
    """A ``Status``: OK without an error, else the mapped code and message."""
    if error is None:
        return definition_pb2.Status(code=Code.OK, message=message)
    return definition_pb2.Status(code=code_for(error), message=message_for(error))


def failure(response_cls: Callable[..., Any], exc: BaseException, method: str) -> Any:
    """``method``'s response carrying ``exc`` in band; an error not the domain's is logged."""
    if not isinstance(exc, TxmqError):
        log.exception("unexpected error in %s", method, exc_info=exc)
    return response_cls(status=status(exc))
