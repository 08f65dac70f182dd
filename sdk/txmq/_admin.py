"""``txmq.Admin``: the operator's API (topics, consumer groups, dead letters, transactions,
brokers, checkers), spoken to the name servers' AdminService and NameServerService, so it
needs only the name server address list, like every other client.

Every method makes one call on the first name server that answers (the next one on
UNAVAILABLE) and returns the ``txmq.v1`` response message; a refusal raises the
:class:`txmq.TxmqError` it stands for. A listing that fans out to the brokers names the
brokers that did not answer in ``unreachable_brokers`` (the listing is then partial).

With ``namespace=`` every topic and group named is in that namespace (``txmq.names``),
and :meth:`Admin.list_topics` lists only that namespace's topics, named without it.

    with txmq.Admin("127.0.0.1:9876") as admin:
        admin.create_topic("orders", queue_count=8)
        for q in admin.consumer_groups("billing").queues:
            print(q.topic, q.queue_id, q.lag_messages)
"""

from __future__ import annotations

import threading
import datetime as _dt
from typing import Any, Mapping, Sequence

import grpc

from ._administering import SERVICES, AdminCall, AdminRequests, AdminRpc, call_steps
from ._auth import BearerToken, with_token
from ._calling import CHANNEL_OPTIONS, parse_nameservers, positive
from ._errors import InvalidFieldError, NotANameServerError, TopicExistsError, error_from_rpc
from ._resets import OffsetKey, ResetResult
from ._sending import run
from ._tls import TLS, ChannelTLS, sync_channel
from .v1 import admin_pb2, admin_pb2_grpc, broker_pb2, common_pb2, nameserver_pb2, nameserver_pb2_grpc


class Admin:
    """The Admin API of a txmq cluster (see the module docstring). Thread-safe; close it
    (or use it as a context manager)."""

    def __init__(self, nameservers: str | Sequence[str], *, request_timeout_seconds: float = 10.0,
                 tls: TLS | None = None, token: str | None = None, namespace: str = "") -> None:
        """``tls``: the name servers are dialed with TLS (see :class:`txmq.TLS`); ``token``:
        sent as a bearer token on every call (a cluster with auth on); ``namespace``: the
        namespace of every topic and group named."""
        #: The operations as calls (``txmq._administering``), shared with ``txmq.aio.AsyncAdmin``.
        self.requests = AdminRequests(namespace)
        self.namespace = self.requests.namespace
        self.addresses = parse_nameservers(nameservers)
        if tls is not None and not isinstance(tls, TLS):
            raise InvalidFieldError("tls", f"must be a txmq.TLS, got {type(tls).__name__}")
        if token is not None:
            BearerToken(token)  # refuses a malformed token here
        self._tls = ChannelTLS(tls) if tls is not None else None
        self._token = token
        self.request_timeout_seconds = positive("request_timeout_seconds", request_timeout_seconds)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    # --- topics ---------------------------------------------------------------------------

    def create_topic(self, topic: str, *, queue_count: int = 0, fifo: bool = False,
                     exist_ok: bool = False) -> admin_pb2.CreateTopicResponse:
        """Spreads ``queue_count`` queues (0: the name server's default) over the brokers;
        ``fifo`` makes it a FIFO topic (every message carries a message group).

        ``exist_ok`` (as ``txmq topic create --exist-ok``): a topic that exists already with
        this type is not an error — the answer then lists the queues it has; one of the
        other type still raises TopicTypeMismatchError (a topic's type cannot change)."""
        try:
            return self._run(self.requests.create_topic(topic, queue_count=queue_count, fifo=fifo))
        except TopicExistsError:
            if not exist_ok:
                raise
        return self._run(self.requests.existing_topic(topic, fifo=fifo))

    def list_topics(self) -> admin_pb2.ListTopicsResponse:
        """Every topic; with a namespace, that namespace's topics, named without it."""
        return self._run(self.requests.list_topics())

    def in_scope(self, name: str) -> bool:
        """Whether a listed resource's ``name`` (as stored) is in this client's namespace
        (every name is, without one)."""
        return self.requests.in_scope(name)

    def delete_topic(self, topic: str, *, force: bool = False) -> admin_pb2.DeleteTopicResponse:
        """Deletes a user topic on every broker. Refused (TopicInUseError) while consumer
        groups still read it, unless ``force``, and while transactions of it are undecided."""
        return self._run(self.requests.delete_topic(topic, force=force))

    def describe_topic(self, topic: str) -> admin_pb2.DescribeTopicResponse:
        """The topic's queues (offsets per broker) and every consumer group's position in them."""
        return self._run(self.requests.describe_topic(topic))

    # --- consumer groups and dead letters -------------------------------------------------

    def consumer_groups(self, consumer_group: str = "", *, topic: str = "") -> admin_pb2.ListConsumerGroupsResponse:
        """Per (group, topic, broker, queue): acknowledged offset, lag in messages and
        seconds, in-flight and retrying deliveries; per group and broker its dead letters.
        A named group no broker knows raises ConsumerGroupNotFoundError. With a namespace,
        the groups of that namespace alone."""
        return self._run(self.requests.consumer_groups(consumer_group, topic=topic))

    def dead_letters(self, consumer_group: str, *, limit: int = 100) -> admin_pb2.ListDeadLettersResponse:
        """The group's dead letters (up to ``limit`` per broker), oldest first."""
        return self._run(self.requests.dead_letters(consumer_group, limit=limit))

    def redrive_dead_letters(self, consumer_group: str, message_ids: Sequence[str] = (), *,
                             all: bool = False) -> admin_pb2.RedriveDeadLettersResponse:
        """Gives dead letters back to their group alone (the next receive delivers them,
        attempt 1): the named message ids, or every one with ``all=True``."""
        return self._run(self.requests.redrive_dead_letters(consumer_group, message_ids, all=all))

    def reset_offsets(self, consumer_group: str, topic: str, *, to_earliest: bool = False, to_latest: bool = False,
                      to_time: _dt.datetime | None = None, to_offsets: Mapping[OffsetKey, int] | None = None,
                      shift: int | None = None, dry_run: bool = True, force: bool = False, reason: str = "",
                      operator: str = "") -> ResetResult:
        """Moves the group's position in ``topic`` on every broker holding it (Kafka's
        ``--reset-offsets``): exactly one of ``to_earliest``, ``to_latest``, ``to_time``,
        ``to_offsets`` (``{queue: offset}``, or ``{(broker, queue): offset}`` when the topic
        spans brokers) or ``shift``. ``dry_run`` (the default) only answers what would
        change. Refused with ConsumersLiveError while the group has live consumers of the
        topic, unless ``force`` (their deliveries in flight are then invalidated). The reset
        is recorded with the caller's principal (auth on) or ``operator``, and ``reason``."""
        result: ResetResult = self._run(self.requests.reset_offsets(
            consumer_group, topic, to_earliest=to_earliest, to_latest=to_latest, to_time=to_time,
            to_offsets=to_offsets, shift=shift, dry_run=dry_run, force=force, reason=reason, operator=operator))
        return result

    def delete_consumer_group(self, consumer_group: str, *, force: bool = False, dry_run: bool = False,
                              dead_letters: bool = False, reason: str = "",
                              operator: str = "") -> admin_pb2.DeleteConsumerGroupResponse:
        """Deletes the group on every live broker (Kafka's ``deleteConsumerGroups``): its
        positions, deliveries in flight (their receipt handles then acknowledge nothing:
        ReceiptHandleNotFoundError), offset-reset records, remembered clients and metric
        series; a later receive starts it as a new group. Its ``%DLQ%`` topic and dead letters
        are kept unless ``dead_letters``. Refused with GroupNotEmptyError while the group has
        live consumers, unless ``force``; ConsumerGroupNotFoundError when no broker knows it.
        ``dry_run`` answers what would go. The answer lists per broker what went, and the
        brokers that did not answer (``unreachable_brokers``: delete again once they are
        back). Logged with the caller's principal (auth on) or ``operator``, and ``reason``."""
        response: admin_pb2.DeleteConsumerGroupResponse = self._run(self.requests.delete_consumer_group(
            consumer_group, force=force, dry_run=dry_run, dead_letters=dead_letters, reason=reason,
            operator=operator))
        return response

    def delete_producer_group(self, producer_group: str, *, force: bool = False, dry_run: bool = False,
                              discard_topic: bool = False, reason: str = "",
                              operator: str = "") -> admin_pb2.DeleteProducerGroupResponse:
        """Deletes the producer group on every live broker: its counters row, its metric series
        and its place in ``max_producer_groups_per_principal``; a later half message makes it
        anew. Its ended transactions stay (lookups by id, ``transactions``), and its
        ``%DISCARD%`` topic is kept unless ``discard_topic``. Refused with
        TransactionsOpenError while any broker holds a transaction of the group not ended
        (PREPARED, DISCARDED and undecided, a global decision still being pushed), ``force`` or
        not; with ProducersLiveError while its producers are live (half messages, checkers'
        claims within the brokers' ``consumer_session_seconds`` or held by a broker now), unless ``force``;
        ProducerGroupNotFoundError when no broker knows it. ``dry_run`` answers what would go
        and what blocks it. Logged with the caller's principal (auth on) or ``operator``."""
        response: admin_pb2.DeleteProducerGroupResponse = self._run(self.requests.delete_producer_group(
            producer_group, force=force, dry_run=dry_run, discard_topic=discard_topic, reason=reason,
            operator=operator))
        return response

    def group_clients(self, group: str) -> admin_pb2.ListGroupClientsResponse:
        """The clients every live broker sees of ``group``: a consumer group's receivers
        (live within the brokers' ``consumer_session_seconds``), a producer group's checkers
        (each serving its producers' check streams, with their free credit)."""
        return self._run(self.requests.group_clients(group))

    # --- messages -------------------------------------------------------------------------

    def get_message(self, message_id: str) -> broker_pb2.FoundMessage:
        """One message by its id (a half message: with its transaction's state)."""
        return self._run(self.requests.get_message(message_id))

    def find_messages(self, topic: str, key: str, *, limit: int = 32, begin: _dt.datetime | None = None,
                      end: _dt.datetime | None = None) -> admin_pb2.FindMessagesResponse:
        """The topic's messages carrying ``key`` (committed ones: a half message is found by
        the txn tools), newest first, up to ``limit`` per broker, stored in [begin, end)."""
        return self._run(self.requests.find_messages(topic, key, limit=limit, begin=begin, end=end))

    def read_messages(self, topic: str, queue_id: int, offset: int, *, broker: str = "",
                      limit: int = 1) -> admin_pb2.ReadMessagesResponse:
        """Messages of one queue from ``offset`` (``broker`` names the queue's broker when
        the topic spans several); nothing is delivered to anyone."""
        return self._run(self.requests.read_messages(topic, queue_id, offset, broker=broker, limit=limit))

    # --- transactions ---------------------------------------------------------------------

    def list_transactions(self, *, producer_group: str = "",
                          state: common_pb2.TransactionState.ValueType = common_pb2.TRANSACTION_STATE_UNSPECIFIED,
                          older_than_seconds: float = 0.0, limit: int = 100,
                          key: str = "") -> admin_pb2.ListTransactionsResponse:
        """``state`` is a ``txmq.v1.common_pb2.TRANSACTION_STATE_*`` (0: any); ``limit`` is per
        broker; ``key``: only transactions whose message carries that key. With a namespace,
        the transactions of its producer groups alone — filtered on each broker before its
        limit. ``truncated`` (and ``truncated_brokers``) say when a broker had more than
        ``limit``: the list is cut."""
        return self._run(self.requests.list_transactions(producer_group=producer_group, state=state,
                                                         older_than_seconds=older_than_seconds, limit=limit, key=key))

    def describe_transaction(self, transaction_id: str) -> admin_pb2.DescribeTransactionResponse:
        """The transaction and its message as sent (keys, tag, properties, body)."""
        return self._run(self.requests.describe_transaction(transaction_id))

    def resolve_transaction(self, transaction_id: str, resolution: str, *, operator: str,
                            reason: str) -> admin_pb2.ResolveTransactionResponse:
        """An operator's ``"commit"`` or ``"rollback"`` of a pending or discarded transaction."""
        return self._run(self.requests.resolve_transaction(transaction_id, resolution, operator=operator,
                                                           reason=reason))

    # --- brokers and checkers -------------------------------------------------------------

    def list_brokers(self, *, include_followers: bool = True) -> nameserver_pb2.ListBrokersResponse:
        """Live brokers, and with ``include_followers`` every replica of replicated shards."""
        return self._run(self.requests.list_brokers(include_followers=include_followers))

    def broker_stats(self) -> admin_pb2.DescribeBrokersResponse:
        """Every live broker's store and free disk, limits and per-group transaction counters."""
        return self._run(self.requests.broker_stats())

    def elect_leader(self, shard: str, replica_id: int) -> admin_pb2.ElectLeaderResponse:
        return self._run(self.requests.elect_leader(shard, replica_id))

    def list_checkers(self) -> nameserver_pb2.ListCheckersResponse:
        return self._run(self.requests.list_checkers())

    # --- the calls ------------------------------------------------------------------------

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = with_token(sync_channel(address, CHANNEL_OPTIONS, self._tls),
                                                               self._token)
            return channel

    def channel_to(self, address: str, max_message_bytes: int | None = None) -> grpc.Channel:
        """A channel of its own (its caller closes it) to another service, a broker, with this
        client's TLS material and token; ``max_message_bytes`` raises the receive limit."""
        options = CHANNEL_OPTIONS if max_message_bytes is None else (
            *[(k, v) for k, v in CHANNEL_OPTIONS if k != "grpc.max_receive_message_length"],
            ("grpc.max_receive_message_length", max_message_bytes))
        return with_token(sync_channel(address, options, self._tls), self._token)

    def call(self, service: str, method: str, request: Any) -> Any:
        """``service`` is ``"admin"`` or ``"nameserver"``; tries the name servers in turn."""
        return self._run(AdminCall(service, method, request))

    def _run(self, call: AdminCall) -> Any:
        return run(call_steps(self.addresses, call), self._perform)

    def _perform(self, rpc: AdminRpc) -> Any:
        channel = self._channel(rpc.address)
        call = rpc.call
        stub: Any = (admin_pb2_grpc.AdminServiceStub(channel) if call.service == "admin"
                     else nameserver_pb2_grpc.NameServerServiceStub(channel))
        try:
            return getattr(stub, call.method)(call.request, timeout=self.request_timeout_seconds)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotANameServerError(rpc.address, f"txmq.v1.{SERVICES[call.service]}/{call.method}") from None
            raise error_from_rpc(exc) from None
