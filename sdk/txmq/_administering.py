"""The Admin API without I/O, shared by ``txmq.Admin`` (``_admin``) and
``txmq.aio.AsyncAdmin`` (``aio/_admin``): each operation is an :class:`AdminCall` (which
service, which method, the request with the client's namespace applied, and what is done
to the answer), and :func:`call_steps` tries the name servers in turn, in the manner of
``_sending``::

    call = requests.create_topic("orders", queue_count=8)     # AdminCall, no I/O
    response = run(call_steps(addresses, call), perform)      # perform: one AdminRpc

An operation is added once here, then as one line in each flavour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Sequence

from ._errors import InvalidFieldError, TxmqError
from ._names import in_namespace, namespace_of, unqualify, validate_namespace
from .v1 import admin_pb2, common_pb2, nameserver_pb2

_RESOLUTIONS = {"commit": common_pb2.TRANSACTION_RESOLUTION_COMMIT,
                "rollback": common_pb2.TRANSACTION_RESOLUTION_ROLLBACK}
#: The gRPC service each AdminCall names.
SERVICES = {"admin": "AdminService", "nameserver": "NameServerService"}


def _same(response: Any) -> Any:
    return response


@dataclass(frozen=True, slots=True)
class AdminCall:
    """One operation: ``method`` of ``service`` (``"admin"`` or ``"nameserver"``) with
    ``request``; its result is ``finish(response)``."""
    service: str
    method: str
    request: Any
    finish: Callable[[Any], Any] = field(default=_same)


@dataclass(frozen=True, slots=True)
class AdminRpc:
    """Perform: ``call`` on the name server at ``address`` (the response, or the TxmqError
    it failed with: NotANameServerError when the address serves no such service)."""
    address: str
    call: AdminCall


def call_steps(addresses: Sequence[str], call: AdminCall) -> Generator[AdminRpc, Any, Any]:
    """``call`` on the name servers in turn: a transient error moves to the next one, any
    other is the answer; every one failing raises the last error."""
    error: TxmqError | None = None
    for address in addresses:
        try:
            response = yield AdminRpc(address, call)
        except TxmqError as err:
            if not err.retryable:
                raise
            error = err
            continue
        return call.finish(response)
    assert error is not None
    raise error


class AdminRequests:
    """The operations of the Admin API as :class:`AdminCall` values, every topic and group
    named in ``namespace`` (``txmq.names``), listings kept to it."""

    def __init__(self, namespace: str = "") -> None:
        self.namespace = validate_namespace(namespace)

    # --- names ----------------------------------------------------------------------------

    def in_ns(self, field_name: str, name: str) -> str:
        return in_namespace(self.namespace, field_name, name)

    def in_scope(self, name: str) -> bool:
        """Whether a listed resource's ``name`` (as stored) is in this namespace (every name
        is, without one)."""
        return not self.namespace or namespace_of(name) == self.namespace

    def mine(self, rows: Any, name: Callable[[Any], str]) -> None:
        """Keeps the listed ``rows`` whose ``name(row)`` is in scope."""
        if self.namespace:
            kept = [r for r in rows if self.in_scope(name(r))]
            del rows[:]
            rows.extend(kept)

    # --- topics ---------------------------------------------------------------------------

    def create_topic(self, topic: str, *, queue_count: int = 0, fifo: bool = False) -> AdminCall:
        return AdminCall("admin", "CreateTopic", admin_pb2.CreateTopicRequest(
            topic=self.in_ns("topic", topic), queue_count=queue_count,
            topic_type=common_pb2.TOPIC_TYPE_FIFO if fifo else common_pb2.TOPIC_TYPE_NORMAL))

    def list_topics(self) -> AdminCall:
        def finish(response: Any) -> Any:
            self.mine(response.topics, lambda t: t.topic)
            for t in response.topics:
                t.topic = unqualify(self.namespace, t.topic)
            return response
        return AdminCall("admin", "ListTopics", admin_pb2.ListTopicsRequest(), finish)

    def delete_topic(self, topic: str, *, force: bool = False) -> AdminCall:
        return AdminCall("admin", "DeleteTopic", admin_pb2.DeleteTopicRequest(topic=self.in_ns("topic", topic),
                                                                              force=force))

    def describe_topic(self, topic: str) -> AdminCall:
        return AdminCall("admin", "DescribeTopic", admin_pb2.DescribeTopicRequest(topic=self.in_ns("topic", topic)))

    # --- consumer groups and dead letters -------------------------------------------------

    def consumer_groups(self, consumer_group: str = "", *, topic: str = "") -> AdminCall:
        def finish(response: Any) -> Any:
            self.mine(response.queues, lambda q: q.consumer_group)
            self.mine(response.dead_letters, lambda d: d.consumer_group)
            return response
        return AdminCall("admin", "ListConsumerGroups", admin_pb2.ListConsumerGroupsRequest(
            consumer_group=self.in_ns("consumer_group", consumer_group), topic=self.in_ns("topic", topic)), finish)

    def dead_letters(self, consumer_group: str, *, limit: int = 100) -> AdminCall:
        return AdminCall("admin", "ListDeadLetters", admin_pb2.ListDeadLettersRequest(
            consumer_group=self.in_ns("consumer_group", consumer_group), limit=limit))

    def redrive_dead_letters(self, consumer_group: str, message_ids: Sequence[str] = (), *,
                             all: bool = False) -> AdminCall:
        if all == bool(message_ids):
            raise InvalidFieldError("message_ids", "name the messages to re-drive, or pass all=True (not both)")
        return AdminCall("admin", "RedriveDeadLetters", admin_pb2.RedriveDeadLettersRequest(
            consumer_group=self.in_ns("consumer_group", consumer_group), message_ids=list(message_ids), all=all))

    # --- transactions ---------------------------------------------------------------------

    def list_transactions(self, *, producer_group: str = "",
                          state: common_pb2.TransactionState.ValueType = common_pb2.TRANSACTION_STATE_UNSPECIFIED,
                          older_than_seconds: float = 0.0, limit: int = 100) -> AdminCall:
        def finish(response: Any) -> Any:
            self.mine(response.transactions, lambda t: t.producer_group)
            return response
        return AdminCall("admin", "ListTransactions", admin_pb2.ListTransactionsRequest(
            producer_group=self.in_ns("producer_group", producer_group), state=state,
            older_than_seconds=older_than_seconds, limit=limit), finish)

    def describe_transaction(self, transaction_id: str) -> AdminCall:
        return AdminCall("admin", "DescribeTransaction",
                         admin_pb2.DescribeTransactionRequest(transaction_id=transaction_id))

    def resolve_transaction(self, transaction_id: str, resolution: str, *, operator: str, reason: str) -> AdminCall:
        if resolution not in _RESOLUTIONS:
            raise InvalidFieldError("resolution", f"must be 'commit' or 'rollback', got {resolution!r}")
        return AdminCall("admin", "ResolveTransaction", admin_pb2.ResolveTransactionRequest(
            transaction_id=transaction_id, resolution=_RESOLUTIONS[resolution], operator=operator, reason=reason))

    # --- brokers and checkers -------------------------------------------------------------

    def list_brokers(self, *, include_followers: bool = True) -> AdminCall:
        return AdminCall("nameserver", "ListBrokers",
                         nameserver_pb2.ListBrokersRequest(include_followers=include_followers))

    def broker_stats(self) -> AdminCall:
        return AdminCall("admin", "DescribeBrokers", admin_pb2.DescribeBrokersRequest())

    def elect_leader(self, shard: str, replica_id: int) -> AdminCall:
        return AdminCall("admin", "ElectLeader", admin_pb2.ElectLeaderRequest(shard=shard, replica_id=replica_id))

    def list_checkers(self) -> AdminCall:
        return AdminCall("nameserver", "ListCheckers", nameserver_pb2.ListCheckersRequest())
