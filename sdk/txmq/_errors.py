"""The one error model of txmq, shared by the services and the SDK.

Every error is a ``TxmqError`` with a gRPC ``code``, a stable ``reason`` (as in
google.rpc.ErrorInfo) and its data as attributes. Services raise these from their domain
code and map them to a status in one place (``services.common.errors``); the SDK maps a
status back to the same class in one place (:func:`error_from_status`), so a caller catches
``MessageTooLargeError`` and reads ``.size`` and ``.limit`` whichever side raised it.

On the wire the reason and the data travel in the trailing metadata of a failed unary call
(``txmq-reason``, ``txmq-details``) and in ``EntryStatus.reason``/``details`` for one entry of a
batch or one request on a stream.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Iterable, Mapping, cast

import grpc

REASON_METADATA_KEY = "txmq-reason"
DETAILS_METADATA_KEY = "txmq-details"


class TxmqError(Exception):
    """Root of every txmq error. ``code`` is the gRPC status code it maps to."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
    reason: ClassVar[str] = "UNKNOWN"
    #: Whether repeating the same request may succeed (transport and availability errors).
    retryable: ClassVar[bool] = False

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message or self.reason)
        self.message = message or self.reason
        self.details: dict[str, Any] = details
        for key, value in details.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


# --- INVALID_ARGUMENT -------------------------------------------------------------------

class InvalidArgumentError(TxmqError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"


class MessageTooLargeError(InvalidArgumentError):
    reason = "MESSAGE_TOO_LARGE"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"message body is {size} bytes, above the limit max_body_bytes={limit}",
            size=size, limit=limit)


class InvalidNameError(InvalidArgumentError):
    reason = "INVALID_NAME"

    def __init__(self, field: str, value: str, rule: str) -> None:
        super().__init__(f"{field} {value!r} is invalid: {rule}", field=field, value=value, rule=rule)


class SystemTopicError(InvalidArgumentError):
    reason = "SYSTEM_TOPIC"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} is a system topic: clients cannot send to it", topic=topic)


class PropertiesTooLargeError(InvalidArgumentError):
    reason = "PROPERTIES_TOO_LARGE"

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size}, above the limit {limit}", what=what, size=size, limit=limit)


class InvalidFieldError(InvalidArgumentError):
    reason = "INVALID_FIELD"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}", field=field, problem=problem)


class InvalidIdError(InvalidArgumentError):
    reason = "INVALID_ID"

    def __init__(self, kind: str, value: str, problem: str) -> None:
        super().__init__(f"{kind} {value!r} is invalid: {problem}", kind=kind, value=value, problem=problem)


class WrongBrokerError(InvalidArgumentError):
    reason = "WRONG_BROKER"

    def __init__(self, kind: str, value: str, named: str, broker: str) -> None:
        super().__init__(f"{kind} {value!r} names broker {named!r}, this is {broker!r}",
                         kind=kind, value=value, named=named, broker=broker)


class UndecodableRequestError(InvalidArgumentError):
    """A request body that is not the method's message (refused before any code ran)."""

    reason = "UNDECODABLE_REQUEST"

    def __init__(self, method: str, problem: str) -> None:
        super().__init__(f"{method}: the request body does not decode: {problem}", method=method, problem=problem)


# --- NOT_FOUND / ALREADY_EXISTS ---------------------------------------------------------

class NotFoundError(TxmqError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "NOT_FOUND"


class TopicNotFoundError(NotFoundError):
    reason = "TOPIC_NOT_FOUND"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist", topic=topic)


class QueueNotFoundError(NotFoundError):
    reason = "QUEUE_NOT_FOUND"

    def __init__(self, topic: str, queue_id: int) -> None:
        super().__init__(f"topic {topic!r} has no queue {queue_id} on this broker",
                         topic=topic, queue_id=queue_id)


class TransactionNotFoundError(NotFoundError):
    reason = "TRANSACTION_NOT_FOUND"

    def __init__(self, transaction_id: str) -> None:
        super().__init__(f"transaction {transaction_id!r} does not exist", transaction_id=transaction_id)


class ReceiptHandleNotFoundError(NotFoundError):
    reason = "RECEIPT_HANDLE_EXPIRED"

    def __init__(self, receipt_handle: str) -> None:
        super().__init__("receipt handle is no longer valid: the message was acknowledged or "
                         "redelivered since", receipt_handle=receipt_handle)


class BrokerNotFoundError(NotFoundError):
    reason = "BROKER_NOT_FOUND"

    def __init__(self, broker: str) -> None:
        super().__init__(f"broker {broker!r} is not registered", broker=broker)


class ConsumerGroupNotFoundError(NotFoundError):
    reason = "CONSUMER_GROUP_NOT_FOUND"

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} has received nothing from any live broker",
                         consumer_group=group)


class ProducerGroupNotFoundError(NotFoundError):
    reason = "PRODUCER_GROUP_NOT_FOUND"

    def __init__(self, group: str) -> None:
        super().__init__(f"producer group {group!r} has no state on any live broker", producer_group=group)


class AlreadyExistsError(TxmqError):
    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class TopicExistsError(AlreadyExistsError):
    reason = "TOPIC_EXISTS"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists", topic=topic)


# --- FAILED_PRECONDITION ----------------------------------------------------------------

class FailedPreconditionError(TxmqError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class TopicTypeMismatchError(FailedPreconditionError):
    """A topic exists with the other type (``Admin.create_topic(..., exist_ok=True)``)."""

    reason = "TOPIC_TYPE_MISMATCH"

    def __init__(self, topic: str, existing: str, wanted: str) -> None:
        super().__init__(f"topic {topic!r} exists as a {existing} topic, not {wanted}: a topic's type cannot change "
                         "(delete it and create it again)", topic=topic, existing=existing, wanted=wanted)


class ConsumersLiveError(FailedPreconditionError):
    """A consumer group's offsets cannot be reset while it has live consumers of the topic
    (Kafka's rule): stop them, or force the reset."""

    reason = "CONSUMERS_LIVE"

    def __init__(self, group: str, topic: str, consumers: list[str]) -> None:
        super().__init__(f"consumer group {group!r} has {len(consumers)} live consumer(s) of topic {topic!r} "
                         f"({', '.join(consumers[:5])}{', ...' if len(consumers) > 5 else ''}): stop them first, "
                         "or force the reset (their deliveries in flight are then invalidated)",
                         group=group, topic=topic, consumers=consumers)


class GroupNotEmptyError(FailedPreconditionError):
    """A consumer group cannot be deleted while it has live consumers (Kafka's
    GROUP_NOT_EMPTY): stop them, or force the deletion."""

    reason = "GROUP_NOT_EMPTY"

    def __init__(self, group: str, consumers: list[str]) -> None:
        super().__init__(f"consumer group {group!r} has {len(consumers)} live consumer(s) "
                         f"({', '.join(consumers[:5])}{', ...' if len(consumers) > 5 else ''}): stop them first, "
                         "or force the deletion (their deliveries in flight are then invalidated)",
                         group=group, consumers=consumers)


class TransactionsOpenError(FailedPreconditionError):
    """A producer group cannot be deleted while it has transactions not ended (PREPARED,
    DISCARDED and undecided, or a global transaction's decision still being pushed): their
    checks and late answers need the group. Decide them first (``txmq txn resolve``); no
    force goes past them."""

    reason = "TRANSACTIONS_OPEN"

    def __init__(self, group: str, broker: str, pending: int, discarded: int, pushes: int) -> None:
        super().__init__(f"producer group {group!r} has transactions not ended on {broker}: {pending} prepared, "
                         f"{discarded} discarded and undecided, {pushes} global decision(s) still being pushed; "
                         "decide them first (txmq txn resolve), the deletion never goes past them",
                         group=group, broker=broker, pending=pending, discarded=discarded, global_pushes=pushes)


class ProducersLiveError(FailedPreconditionError):
    """A producer group cannot be deleted while its producers are live (half messages or
    checkers' claims within the brokers' ``consumer_session_seconds`` or held by a broker now): stop them, or force
    the deletion (a producer that sends again makes the group anew)."""

    reason = "PRODUCERS_LIVE"

    def __init__(self, group: str, producers: list[str]) -> None:
        super().__init__(f"producer group {group!r} has {len(producers)} live producer(s) or checker(s) "
                         f"({', '.join(producers[:5])}{', ...' if len(producers) > 5 else ''}): stop them first, "
                         "or force the deletion (a producer that sends again makes the group anew)",
                         group=group, producers=producers)


class TransactionStateError(FailedPreconditionError):
    """A decision conflicting with the transaction's final state (the first decision wins)."""

    reason = "TRANSACTION_STATE_CONFLICT"

    def __init__(self, transaction_id: str, state: str, requested: str) -> None:
        super().__init__(f"transaction {transaction_id!r} is {state}: {requested} refused",
                         transaction_id=transaction_id, state=state, requested=requested)


class StaleClaimError(FailedPreconditionError):
    """A check report or answer for a claim that is not the transaction's current one
    (a check never sent, or superseded by a later claim)."""

    reason = "STALE_CLAIM"

    def __init__(self, transaction_id: str, problem: str) -> None:
        super().__init__(f"check of transaction {transaction_id!r} refused: {problem}",
                         transaction_id=transaction_id, problem=problem)




class TopicInUseError(FailedPreconditionError):
    """A topic deletion refused: consumer groups still read it (unless forced), or
    transactions still wait to be decided into it (always)."""

    reason = "TOPIC_IN_USE"

    def __init__(self, topic: str, groups: list[str], undecided: int) -> None:
        parts = []
        if groups:
            parts.append(f"consumer groups still read it: {', '.join(groups)} (force to delete anyway)")
        if undecided:
            parts.append(f"{undecided} transaction(s) of it are pending or discarded: decide them first "
                         "(txmq txn list)")
        super().__init__(f"topic {topic!r} is in use: {'; '.join(parts)}", topic=topic, groups=groups,
                         undecided=undecided)


# --- RESOURCE_EXHAUSTED / UNAVAILABLE / DEADLINE ----------------------------------------

class ResourceExhaustedError(TxmqError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"


class DiskFullError(ResourceExhaustedError):
    reason = "DISK_FULL"

    def __init__(self, free_bytes: int, floor_bytes: int) -> None:
        super().__init__(f"free disk {free_bytes} bytes is below min_free_disk_bytes={floor_bytes}: "
                         "sends are refused until space is freed", free_bytes=free_bytes,
                         floor_bytes=floor_bytes)


class OverloadedError(ResourceExhaustedError):
    """The server had ``limit`` calls in flight and refused this one before running it
    (nothing applied): retry after a backoff with the same request (same ids). With
    ``principal``, the calls in flight were that principal's own, all its connections together
    (``max_concurrent_rpcs_per_principal``: its fair share of the server), not everyone's."""

    reason = "OVERLOADED"
    retryable = True

    def __init__(self, setting: str, limit: int, principal: str = "") -> None:
        whose = f"principal {principal!r} has {setting}={limit}" if principal else f"{setting}={limit}"
        super().__init__(f"server overloaded: {whose} calls in flight; nothing applied, retry later",
                         setting=setting, limit=limit, **({"principal": principal} if principal else {}))


class ConnectionLimitError(ResourceExhaustedError):
    """One connection holds ``limit`` streams, long polls or pending checks already
    (``setting`` names the limit): close some, or spread the load over connections."""

    reason = "CONNECTION_LIMIT"

    def __init__(self, setting: str, limit: int, held: int) -> None:
        super().__init__(f"this connection holds {held} already: {setting}={limit} reached",
                         setting=setting, limit=limit, held=held)


class PrincipalLimitError(ResourceExhaustedError):
    """One principal holds ``limit`` streams, long polls, pending checks or live clients on
    this service already, all its connections together (``setting`` names the limit): more
    connections do not help; close some, or have the operator raise the setting."""

    reason = "PRINCIPAL_LIMIT"

    def __init__(self, setting: str, limit: int, principal: str, held: int) -> None:
        super().__init__(f"principal {principal!r} holds {held} already over all its connections: "
                         f"{setting}={limit} reached", setting=setting, limit=limit, principal=principal, held=held)


class QuotaExceededError(ResourceExhaustedError):
    """Creating ``what`` (a new consumer group, subscription, producer group or topic) would
    make more than ``limit`` of its ``kind`` whose names the principal's rights cover on this
    service (``setting`` names the quota). Nothing was created, and the existing ones keep
    working: reuse a name, delete some (a topic), or have the operator raise the setting."""

    reason = "QUOTA_EXCEEDED"

    def __init__(self, setting: str, limit: int, principal: str, kind: str, what: str) -> None:
        super().__init__(f"principal {principal!r} may not create {what}: its rights cover {limit} {kind} here "
                         f"already, {setting}={limit} reached (nothing was created)",
                         setting=setting, limit=limit, principal=principal, kind=kind, what=what)


class UnavailableError(TxmqError):
    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"
    retryable = True


class NotLeaderError(UnavailableError):
    """A follower of a replicated shard was asked to serve: retry on the shard's leader
    (``leader_address``, empty while an election is under way) with the same request."""

    reason = "NOT_LEADER"

    def __init__(self, shard: str, replica_id: int, leader_address: str = "", leader_replica: int = -1) -> None:
        where = (f"the leader is replica {leader_replica} at {leader_address}" if leader_address
                 else "no leader is known yet (an election is under way)")
        super().__init__(f"replica {replica_id} of {shard!r} is not its leader: {where}; retry there",
                         shard=shard, replica_id=replica_id, leader_address=leader_address,
                         leader_replica=leader_replica)


class NoBrokerError(UnavailableError):
    """The name server has no live broker to route or create on: every broker is down, or
    none has registered yet since the name server (re)started — they do within a heartbeat;
    or a topic no live broker holds while shards of the cluster (the name server's
    ``expected_brokers``) have not all registered since it started: it may be on one of
    them. Retryable: a send asks the route again until its timeout."""

    reason = "NO_BROKER"

    def __init__(self, what: str, *, waiting: str = "") -> None:
        """``waiting``: why the brokers that are live do not settle it yet (shards of the
        cluster not heard from since the name server started)."""
        super().__init__(f"{what}: {waiting}" if waiting else f"no live broker: {what}", what=what)


class NoLeaderError(UnavailableError):
    """The name server knows ``topic``, but the replicated shard(s) holding it (``shards``)
    have no leader right now (a fail-over is under way): retry the route shortly; nothing
    was sent. Never answered for a topic a live shard also holds (that one is routed)."""

    reason = "NO_LEADER"

    def __init__(self, topic: str, shards: list[str]) -> None:
        super().__init__(f"topic {topic!r} is held by shard(s) {', '.join(shards)} with no leader right now "
                         "(a fail-over is under way): retry shortly", topic=topic, shards=shards)


class NotEnoughReplicasError(UnavailableError):
    """A replicated shard refused a write it could not make durable on enough replicas;
    nothing of it was applied. Retry (with the same message id) once replicas are back."""

    reason = "NOT_ENOUGH_REPLICAS"

    def __init__(self, shard: str, in_sync: int, required: int) -> None:
        super().__init__(f"{shard!r} has {in_sync} in-sync replicas able to acknowledge, fewer than "
                         f"min_insync_replicas={required}: write refused, nothing applied; retry later",
                         shard=shard, in_sync=in_sync, required=required)


class LeadershipLostError(UnavailableError):
    """The replica lost its shard's leadership while the request waited for replicas: its
    outcome is unknown. Retry on the new leader with the same message id (deduplicated)."""

    reason = "LEADERSHIP_LOST"

    def __init__(self, shard: str, replica_id: int) -> None:
        super().__init__(f"replica {replica_id} of {shard!r} lost its leadership before the write was "
                         "acknowledged by its replicas; outcome unknown: retry with the same ids",
                         shard=shard, replica_id=replica_id)


class ShardDrainingError(UnavailableError):
    """The shard is draining (``txmq broker drain``): it takes no new sends or half
    messages. Retryable: a new send goes to another shard of the topic."""

    reason = "SHARD_DRAINING"

    def __init__(self, shard: str) -> None:
        super().__init__(f"shard {shard!r} is draining: it takes no new messages; send to another shard",
                         shard=shard)


class DeadlineExceededError(TxmqError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = "DEADLINE_EXCEEDED"
    retryable = True


class CancelledError(TxmqError):
    code = grpc.StatusCode.CANCELLED
    reason = "CANCELLED"


class InternalError(TxmqError):
    code = grpc.StatusCode.INTERNAL
    reason = "INTERNAL"


class NotANameServerError(TxmqError):
    """The address answers gRPC but not the name server's services: a broker, a checker, a
    proxy, or a name server older than the call."""

    code = grpc.StatusCode.UNIMPLEMENTED
    reason = "NOT_A_NAMESERVER"

    def __init__(self, address: str, method: str) -> None:
        super().__init__(f"{address} does not serve {method}: it is not a txmq name server (a broker, checker "
                         f"or proxy?) or an older one; give the name server's address (port 9876 by default)",
                         address=address, method=method)


class ClientClosedError(TxmqError):
    code = grpc.StatusCode.CANCELLED
    reason = "CLIENT_CLOSED"

    def __init__(self, what: str = "client") -> None:
        super().__init__(f"{what} is closed", what=what)


# --- UNAUTHENTICATED / PERMISSION_DENIED -------------------------------------------------

class UnauthenticatedError(TxmqError):
    """No credentials, or credentials no principal has (a wrong token, a bad signature)."""

    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDeniedError(TxmqError):
    """A known ``principal`` without the right: ``action`` on ``resource``."""

    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"

    def __init__(self, principal: str, action: str, resource: str) -> None:
        super().__init__(f"principal {principal!r} may not {action} {resource}",
                         principal=principal, action=action, resource=resource)


# --- status <-> error -------------------------------------------------------------------

def _all_subclasses(cls: type[TxmqError]) -> list[type[TxmqError]]:
    out: list[type[TxmqError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


_ERROR_CLASSES: list[type[TxmqError]] = [TxmqError, *_all_subclasses(TxmqError)]
_BY_REASON: dict[str, type[TxmqError]] = {c.reason: c for c in _ERROR_CLASSES}
# The generic class for a code, used when the reason is unknown (another server version).
_BY_CODE: dict[grpc.StatusCode, type[TxmqError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}
_CODE_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def encode_details(error: TxmqError) -> dict[str, str]:
    return {k: json.dumps(v) for k, v in error.details.items()}


def status_code_from_int(value: int) -> grpc.StatusCode:
    return _CODE_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)


def error_from_status(code: grpc.StatusCode, message: str, reason: str = "",
                      details: Mapping[str, str] | None = None) -> TxmqError:
    """The one status → exception mapping of the SDK."""
    cls = _BY_REASON.get(reason)
    if cls is not None and cls.code == code:
        try:
            fields = {k: json.loads(v) for k, v in (details or {}).items()}
        except ValueError:
            fields = {}
        # Rebuild with the server's message and data, without re-deriving the message.
        err = cls.__new__(cls)
        TxmqError.__init__(err, message, **fields)
        return err
    generic = _BY_CODE.get(code, TxmqError)
    err = generic.__new__(generic)  # as above: a class that builds its message from data
    TxmqError.__init__(err, message)  # (PermissionDeniedError) gets the server's as it is
    if generic is TxmqError:
        err.code = code  # type: ignore[misc]  # keep what the server said
    return err


def error_from_rpc(exc: grpc.RpcError) -> TxmqError:
    """Maps a failed gRPC call (sync or asyncio) to the txmq exception it stands for."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = exc.details() if hasattr(exc, "details") else str(exc)
    reason = ""
    details: dict[str, str] | None = None
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    # (key, value) pairs at run time: a namedtuple (sync) or a tuple (grpc.aio); the stubs
    # declare an object with attributes instead.
    for key, value in cast("Iterable[tuple[str, Any]]", trailing or ()):
        if key == REASON_METADATA_KEY:
            reason = value
        elif key == DETAILS_METADATA_KEY:
            try:
                details = json.loads(value)
            except ValueError:
                details = None
    return error_from_status(code or grpc.StatusCode.UNKNOWN, message or "", reason, details)


def error_from_entry(status: Any) -> TxmqError:
    """Maps an ``EntryStatus`` (one entry of a batch, one request on a stream)."""
    return error_from_status(status_code_from_int(status.code), status.message, status.reason,
                             dict(status.details))
