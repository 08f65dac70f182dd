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

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Mapping, Sequence

from ._errors import InvalidFieldError, TopicTypeMismatchError, TxmqError
from ._names import in_namespace, namespace_of, unqualify, validate_namespace
from ._resets import OffsetKey, reset_request, reset_result
from .v1 import admin_pb2, common_pb2, nameserver_pb2

_RESOLUTIONS = {"commit": common_pb2.TRANSACTION_RESOLUTION_COMMIT,
                "rollback": common_pb2.TRANSACTION_RESOLUTION_ROLLBACK}
#: The gRPC service each AdminCall names.
SERVICES = {"admin": "AdminService", "nameserver": "NameServerService"}
_TYPE_NAMES = {common_pb2.TOPIC_TYPE_UNSPECIFIED: "NORMAL", common_pb2.TOPIC_TYPE_NORMAL: "NORMAL",
               common_pb2.TOPIC_TYPE_FIFO: "FIFO"}


def _ms_of(field_name: str, when: _dt.datetime | None) -> int:
    if when is None:
        return 0
    if not isinstance(when, _dt.datetime) or when.tzinfo is None:
        raise InvalidFieldError(field_name, "must be a timezone-aware datetime")
    return round(when.timestamp() * 1000)


def cut_per_broker(response: admin_pb2.ListTransactionsResponse,
                   limit: int) -> admin_pb2.ListTransactionsResponse:
    """A listing asked with ``limit + 1`` per broker, cut to ``limit`` per broker, with
    ``truncated`` / ``truncated_brokers`` naming the brokers that had more."""
    seen: dict[str, int] = {}
    kept = []
    cut: set[str] = set()
    for t in response.transactions:
        seen[t.broker_name] = seen.get(t.broker_name, 0) + 1
        if seen[t.broker_name] > limit:
            cut.add(t.broker_name)
        else:
            kept.append(t)
    del response.transactions[:]
    response.transactions.extend(kept)
    del response.truncated_brokers[:]
    response.truncated_brokers.extend(sorted(cut))
    response.truncated = bool(cut)
    return response


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

    def existing_topic(self, topic: str, *, fifo: bool = False) -> AdminCall:
        """``create_topic(..., exist_ok=True)`` after TopicExistsError: the topic as a
        CreateTopicResponse (its queues per broker), TopicTypeMismatchError when it is of
        the other type (a topic's type cannot change)."""
        wanted = common_pb2.TOPIC_TYPE_FIFO if fifo else common_pb2.TOPIC_TYPE_NORMAL
        name = self.in_ns("topic", topic)

        def finish(described: Any) -> Any:
            if described.topic_type != wanted:
                raise TopicTypeMismatchError(topic, _TYPE_NAMES.get(described.topic_type, "NORMAL"),
                                             _TYPE_NAMES[wanted])
            counts: dict[str, int] = {}
            for q in described.queues:
                counts[q.broker_name] = counts.get(q.broker_name, 0) + 1
            return admin_pb2.CreateTopicResponse(topic=name, brokers=[
                admin_pb2.BrokerQueues(broker_name=b, queue_count=n) for b, n in sorted(counts.items())])
        return AdminCall("admin", "DescribeTopic", admin_pb2.DescribeTopicRequest(topic=name), finish)

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

    def reset_offsets(self, consumer_group: str, topic: str, *, to_earliest: bool = False, to_latest: bool = False,
                      to_time: _dt.datetime | None = None, to_offsets: Mapping[OffsetKey, int] | None = None,
                      shift: int | None = None, dry_run: bool = True, force: bool = False, reason: str = "",
                      operator: str = "") -> AdminCall:
        """Its result is a :class:`txmq._resets.ResetResult`."""
        request = reset_request(self.in_ns("consumer_group", consumer_group), self.in_ns("topic", topic),
                                to_earliest=to_earliest, to_latest=to_latest, to_time=to_time, to_offsets=to_offsets,
                                shift=shift, dry_run=dry_run, force=force, reason=reason, operator=operator)
        return AdminCall("admin", "ResetOffsets", request, lambda response: reset_result(request, response))

    def delete_consumer_group(self, consumer_group: str, *, force: bool = False, dry_run: bool = False,
                              dead_letters: bool = False, reason: str = "", operator: str = "") -> AdminCall:
        return AdminCall("admin", "DeleteConsumerGroup", admin_pb2.DeleteConsumerGroupRequest(
            consumer_group=self.in_ns("consumer_group", consumer_group), force=force, dry_run=dry_run,
            dead_letters=dead_letters, reason=reason, operator=operator))

    def delete_producer_group(self, producer_group: str, *, force: bool = False, dry_run: bool = False,
                              discard_topic: bool = False, reason: str = "", operator: str = "") -> AdminCall:
        return AdminCall("admin", "DeleteProducerGroup", admin_pb2.DeleteProducerGroupRequest(
            producer_group=self.in_ns("producer_group", producer_group), force=force, dry_run=dry_run,
            discard_topic=discard_topic, reason=reason, operator=operator))

    def group_clients(self, group: str) -> AdminCall:
        return AdminCall("admin", "ListGroupClients", admin_pb2.ListGroupClientsRequest(group=self.in_ns("group", group)))

    # --- messages -------------------------------------------------------------------------

    def get_message(self, message_id: str) -> AdminCall:
        return AdminCall("admin", "GetMessage", admin_pb2.GetMessageRequest(message_id=message_id),
                         lambda response: response.message)

    def find_messages(self, topic: str, key: str, *, limit: int = 32, begin: _dt.datetime | None = None,
                      end: _dt.datetime | None = None) -> AdminCall:
        return AdminCall("admin", "FindMessages", admin_pb2.FindMessagesRequest(
            topic=self.in_ns("topic", topic), key=key, limit=limit, begin_ms=_ms_of("begin", begin),
            end_ms=_ms_of("end", end)))

    def read_messages(self, topic: str, queue_id: int, offset: int, *, broker: str = "", limit: int = 1) -> AdminCall:
        return AdminCall("admin", "ReadMessages", admin_pb2.ReadMessagesRequest(
            topic=self.in_ns("topic", topic), broker_name=broker, queue_id=queue_id, offset=offset, limit=limit))

    # --- transactions ---------------------------------------------------------------------

    def list_transactions(self, *, producer_group: str = "",
                          state: common_pb2.TransactionState.ValueType = common_pb2.TRANSACTION_STATE_UNSPECIFIED,
                          older_than_seconds: float = 0.0, limit: int = 100, key: str = "") -> AdminCall:
        """The namespace and ``key`` are filtered on each broker before its ``limit``; one
        more than asked per broker tells a cut listing (``truncated``) from one that ended."""
        if limit < 1:
            raise InvalidFieldError("limit", f"must be at least 1, got {limit}")

        def finish(response: Any) -> Any:
            self.mine(response.transactions, lambda t: t.producer_group)  # a broker from before the field
            return cut_per_broker(response, limit)
        return AdminCall("admin", "ListTransactions", admin_pb2.ListTransactionsRequest(
            producer_group=self.in_ns("producer_group", producer_group), state=state,
            older_than_seconds=older_than_seconds, limit=limit + 1, namespace=self.namespace, key=key), finish)

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
