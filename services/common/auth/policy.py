"""What each RPC needs, read from its request: the one table the interceptor enforces.

A policy maps the full method name to either ``INTERNAL`` (service identities only),
``ANY`` (any authenticated principal), ``OPEN`` (no credentials: health checks), or a
function from the request to the rights it needs — ``Need(actions, kind, name)``, one of
``actions`` on that resource. For a stream of requests the function is applied to every
message the client sends; for one request, to it alone. A method missing from the table is
refused to all but service identities (default deny).

A policy also lists the ids its request carries (``ids``: ``IdRef``s — a transaction id and
the producer group the request names for it, a receipt handle, the consumer group it is
presented for and the topic the request names). The interceptor has the service resolve each
to what it names in its store and authorizes that (``ownership``), in the same place.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Union

from txmq.v1 import common_pb2

from .acl import (ADMIN_READ, ADMIN_WRITE, CHECK, CLUSTER, CONSUMER_GROUP, PRODUCER_GROUP,
                  PUBLISH, SUBSCRIBE, TOPIC)

#: A pseudo-action only service identities hold.
INTERNAL_ACTION = "internal"


@dataclasses.dataclass(frozen=True)
class Need:
    actions: tuple[str, ...]
    kind: str
    name: str = ""
    #: Why, when the resource alone does not say it (shown in the refusal).
    why: str = ""
    #: On a stream: a right its first message was granted too, that the handler decides again
    #: itself once the credentials are reloaded (the checker's ``standing``). Revoked since,
    #: the message is not refused here but goes to the handler, which refuses it in band and
    #: goes on for the rest of the stream; a right the stream never held refuses it here.
    in_band: bool = False


INTERNAL = "internal"
ANY = "any"
OPEN = "open"

Rights = Callable[[Any], list[Need]]

#: The kinds of id a request carries (``IdRef.kind``).
TRANSACTION_ID = "transaction id"
RECEIPT_HANDLE = "receipt handle"


@dataclasses.dataclass(frozen=True)
class IdRef:
    """An id a request carries, to be resolved in the service's store and authorized."""

    kind: str
    text: str
    #: The name the request gives the resource the id belongs to ("": none), and its field.
    named: str
    field: str
    #: A receipt handle's consumer group (the one it must have been issued to).
    scope: str = ""


Ids = Callable[[Any], list[IdRef]]


@dataclasses.dataclass(frozen=True)
class Policy:
    rights: Union[str, Rights]
    #: The ids a request carries (None: none).
    ids: Ids | None = None


def internal(why: str) -> Need:
    return Need((INTERNAL_ACTION,), CLUSTER, why=why)


def _topic(actions: tuple[str, ...], name: str) -> Need:
    return Need(actions, TOPIC, name)


def _admin_group(action: str, group: str) -> list[Need]:
    return [Need((action,), PRODUCER_GROUP, group) if group else Need((action,), CLUSTER)]


def _admin_consumers(action: str, group: str) -> list[Need]:
    """An operator action on a consumer group (the whole cluster when none is named)."""
    return [Need((action,), CONSUMER_GROUP, group) if group else Need((action,), CLUSTER)]


def _reset_offsets(request: Any) -> list[Need]:
    """admin-write on the consumer group, and a reading right on the topic it is moved in: the
    reset reads that topic's offsets (and says whether it exists), which a group's operator
    holding no right on another's topic must not learn."""
    return [*_admin_consumers(ADMIN_WRITE, request.consumer_group),
            _topic((SUBSCRIBE, ADMIN_READ, ADMIN_WRITE), request.topic)]


# --- txmq.v1 ------------------------------------------------------------------------------
_TRANSACTION = common_pb2.MESSAGE_TYPE_TRANSACTION
_OPERATOR = common_pb2.TRANSACTION_SOURCE_OPERATOR


def send_needs(message: Any) -> list[Need]:
    needs = [_topic((PUBLISH,), message.topic)]
    if message.type == _TRANSACTION:
        needs.append(Need((CHECK,), PRODUCER_GROUP, message.producer_group))
    return needs


def end_needs(request: Any) -> list[Need]:
    if request.source == _OPERATOR:
        return [internal("an operator's resolution goes through AdminService.ResolveTransaction")]
    if not request.producer_group:
        return [internal("an EndTransaction that names no producer_group")]
    return [Need((CHECK,), PRODUCER_GROUP, request.producer_group)]


def end_ids(request: Any) -> list[IdRef]:
    return [IdRef(TRANSACTION_ID, request.transaction_id, request.producer_group, "producer_group")]


def send_ids(request: Any) -> list[IdRef]:
    """A further part of a global transaction names the global transaction (the broker that
    coordinates it authorizes it: a part of another group is rolled back elsewhere)."""
    if not request.global_transaction_id:
        return []
    return [IdRef(TRANSACTION_ID, request.global_transaction_id, request.message.producer_group,
                  "message.producer_group")]


def _produce_ids(request: Any) -> list[IdRef]:
    ids: list[IdRef] = []
    for entry in request.entries:
        which = entry.WhichOneof("request")
        if which == "end_transaction":
            ids.extend(end_ids(entry.end_transaction))
        elif which == "send_message":
            ids.extend(send_ids(entry.send_message))
    return ids


def _handles(group: str, topic: str, handles: Any) -> list[IdRef]:
    return [IdRef(RECEIPT_HANDLE, h, topic, "topic", group) for h in handles]


def _produce(request: Any) -> list[Need]:
    needs: list[Need] = []
    for entry in request.entries:
        which = entry.WhichOneof("request")
        if which == "send_message":
            needs.extend(send_needs(entry.send_message.message))
        elif which == "end_transaction":
            needs.extend(end_needs(entry.end_transaction))
    return needs


def _consume(request: Any) -> list[Need]:
    return [Need((SUBSCRIBE,), CONSUMER_GROUP, request.consumer_group), _topic((SUBSCRIBE,), request.topic)]


def _ack(request: Any) -> list[Need]:
    """AckMessages: the rights of a consumer of that group and topic."""
    return _consume(request)


def _receive(request: Any) -> list[Need]:
    """ReceiveMessages; one carrying acks (ack_receipt_handles, of the request's group and
    topic) needs what AckMessages needs for them as well."""
    needs = _consume(request)
    if request.ack_receipt_handles:
        needs.extend(n for n in _ack(request) if n not in needs)
    return needs


def _check_stream(request: Any) -> list[Need]:
    which = request.WhichOneof("command")
    if which == "subscribe":
        return [Need((CHECK,), PRODUCER_GROUP, g) for g in request.subscribe.producer_groups]
    if which == "answer" and request.answer.producer_group:
        # A group the stream subscribed and lost since (a revoke) is refused in band by the
        # checker: the stream goes on for its other groups (``in_band``). One it never held
        # (someone else's checks) ends it here.
        return [Need((CHECK,), PRODUCER_GROUP, request.answer.producer_group, in_band=True)]
    # Receipts, credit, and answers naming no group: the checker accepts an answer only for
    # a check it sent on this stream, so for a group the opening message was allowed (and
    # still is: a revoke finishes the group's checks there, ``Dispatcher.revoke``).
    return []


_NS = "/txmq.v1.NameServerService/"
_ADMIN = "/txmq.v1.AdminService/"
_BROKER = "/txmq.v1.BrokerService/"
_CHECKER = "/txmq.v1.CheckerService/"
_REPLICATION = "/txmq.v1.ReplicationService/"
_OPERATIONS = "/txmq.v1.OperationsService/"

NATIVE: Mapping[str, Policy] = {
    _NS + "RegisterBroker": Policy(INTERNAL),
    _NS + "UnregisterBroker": Policy(INTERNAL),
    _NS + "RegisterChecker": Policy(INTERNAL),
    _NS + "UnregisterChecker": Policy(INTERNAL),
    _NS + "QueryRoute": Policy(lambda r: [_topic((PUBLISH, SUBSCRIBE), r.topic)]),
    _NS + "ListBrokers": Policy(ANY),
    _NS + "ListCheckers": Policy(ANY),
    _ADMIN + "CreateTopic": Policy(lambda r: [_topic((ADMIN_WRITE,), r.topic)]),
    _ADMIN + "ListTopics": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _ADMIN + "ListTransactions": Policy(lambda r: _admin_group(ADMIN_READ, r.producer_group)),
    _ADMIN + "DescribeTransaction": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _ADMIN + "ResolveTransaction": Policy(lambda r: [Need((ADMIN_WRITE,), CLUSTER)]),
    _ADMIN + "ElectLeader": Policy(lambda r: [Need((ADMIN_WRITE,), CLUSTER)]),
    _ADMIN + "DescribeBrokers": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _ADMIN + "DescribeTopic": Policy(lambda r: [_topic((ADMIN_READ,), r.topic)]),
    _ADMIN + "DeleteTopic": Policy(lambda r: [_topic((ADMIN_WRITE,), r.topic)]),
    _ADMIN + "ListConsumerGroups": Policy(lambda r: _admin_consumers(ADMIN_READ, r.consumer_group)),
    _ADMIN + "ListDeadLetters": Policy(lambda r: _admin_consumers(ADMIN_READ, r.consumer_group)),
    _ADMIN + "RedriveDeadLetters": Policy(lambda r: _admin_consumers(ADMIN_WRITE, r.consumer_group)),
    _BROKER + "SendMessage": Policy(lambda r: send_needs(r.message), send_ids),
    _BROKER + "EndTransaction": Policy(end_needs, end_ids),
    _BROKER + "Produce": Policy(_produce, _produce_ids),
    _BROKER + "ReceiveMessages": Policy(_receive, lambda r: _handles(r.consumer_group, r.topic,
                                                                     r.ack_receipt_handles)),
    _BROKER + "AckMessages": Policy(_ack, lambda r: _handles(r.consumer_group, r.topic, r.receipt_handles)),
    _BROKER + "ChangeInvisibleDuration": Policy(_consume, lambda r: _handles(r.consumer_group, r.topic,
                                                                             [r.receipt_handle])),
    _BROKER + "DeadLetterMessage": Policy(_consume, lambda r: _handles(r.consumer_group, r.topic,
                                                                       [r.receipt_handle])),
    _BROKER + "ReadQueue": Policy(lambda r: [_topic((SUBSCRIBE,), r.topic)]),
    _BROKER + "GetQueueOffsets": Policy(lambda r: [_topic((SUBSCRIBE,), r.topic)]),
    _BROKER + "CreateTopicQueues": Policy(INTERNAL),
    # The name server's fan-outs of the operator calls above (it checked the operator).
    _BROKER + "DeleteTopicQueues": Policy(INTERNAL),
    _BROKER + "DescribeConsumerGroups": Policy(INTERNAL),
    _BROKER + "ReturnDeadLetters": Policy(INTERNAL),
    _BROKER + "ClaimChecks": Policy(INTERNAL),
    _BROKER + "ReportChecks": Policy(INTERNAL),
    _BROKER + "QueryTransactions": Policy(lambda r: _admin_group(ADMIN_READ, r.producer_group)),
    _BROKER + "GetTransaction": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _BROKER + "GetBrokerStats": Policy(ANY),
    # Multi-message transactions: the producer-facing steps are SendMessage / Produce /
    # EndTransaction (the producer group's rights); these are broker to broker or operators'.
    _BROKER + "ApplyGlobalTransaction": Policy(INTERNAL),
    _BROKER + "ResolveGlobalTransaction": Policy(INTERNAL),
    _BROKER + "GetGlobalTransaction": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _BROKER + "ListGlobalTransactions": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _CHECKER + "CheckTransactionState": Policy(_check_stream),
    # A backup holds every message and transaction of the shard; draining changes where
    # every producer sends.
    _OPERATIONS + "BackupStore": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _OPERATIONS + "SetDraining": Policy(lambda r: [Need((ADMIN_WRITE,), CLUSTER)]),
    _OPERATIONS + "GetDrainStatus": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _ADMIN + "ExpandTopic": Policy(lambda r: [_topic((ADMIN_WRITE,), r.topic)]),
    # Issue 32: resetting a group's position, finding messages, a group's clients.
    _ADMIN + "ResetOffsets": Policy(_reset_offsets),
    _ADMIN + "GetMessage": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _ADMIN + "FindMessages": Policy(lambda r: [_topic((ADMIN_READ,), r.topic)]),
    _ADMIN + "ReadMessages": Policy(lambda r: [_topic((ADMIN_READ,), r.topic)]),
    _ADMIN + "ListGroupClients": Policy(lambda r: [Need((ADMIN_READ,), CLUSTER)]),
    _BROKER + "ResetGroupOffsets": Policy(INTERNAL),
    _BROKER + "LookupMessages": Policy(INTERNAL),
    _BROKER + "DescribeGroupClients": Policy(INTERNAL),
    _ADMIN + "DeleteConsumerGroup": Policy(lambda r: _admin_consumers(ADMIN_WRITE, r.consumer_group)),
    _BROKER + "DeleteGroupState": Policy(INTERNAL),
    _ADMIN + "DeleteProducerGroup": Policy(lambda r: _admin_group(ADMIN_WRITE, r.producer_group)),
    _BROKER + "DeleteProducerGroupState": Policy(INTERNAL),
    _REPLICATION + "FetchCheckpoint": Policy(INTERNAL),
    _REPLICATION + "TransferLeadership": Policy(INTERNAL),
    "/grpc.health.v1.Health/Check": Policy(OPEN),
    "/grpc.health.v1.Health/Watch": Policy(OPEN),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": Policy(ANY),
}
