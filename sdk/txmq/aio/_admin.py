""":class:`AsyncAdmin`: ``txmq.Admin`` for an event loop — the same operations (the shared
request/response core ``txmq._administering``), the same namespace rules, errors and name
server failover, over ``grpc.aio`` channels.

    async with AsyncAdmin("127.0.0.1:9876") as admin:
        await admin.create_topic("orders", queue_count=8)
        groups = await admin.consumer_groups("billing")
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping, Sequence

import grpc

from .._administering import SERVICES, AdminCall, AdminRequests, AdminRpc, call_steps
from .._auth import BearerToken, aio_bearer_interceptors
from .._calling import CHANNEL_OPTIONS, parse_nameservers, positive
from .._errors import InvalidFieldError, NotANameServerError, TopicExistsError, error_from_rpc
from .._resets import OffsetKey, ResetResult
from .._sending import run_async
from .._tls import TLS, ChannelTLS
from ..v1 import admin_pb2, admin_pb2_grpc, broker_pb2, common_pb2, nameserver_pb2, nameserver_pb2_grpc


class AsyncAdmin:
    """The Admin API of a txmq cluster from coroutines (see :class:`txmq.Admin`). Use it as
    ``async with`` (or call :meth:`close`), on one event loop."""

    def __init__(self, nameservers: str | Sequence[str], *, request_timeout_seconds: float = 10.0,
                 tls: TLS | None = None, token: str | None = None, namespace: str = "") -> None:
        #: The operations as calls (``txmq._administering``), shared with ``txmq.Admin``.
        self.requests = AdminRequests(namespace)
        self.namespace = self.requests.namespace
        self.addresses = parse_nameservers(nameservers)
        if tls is not None and not isinstance(tls, TLS):
            raise InvalidFieldError("tls", f"must be a txmq.TLS, got {type(tls).__name__}")
        if token is not None:
            BearerToken(token)  # refuses a malformed token here
        self._tls = ChannelTLS(tls) if tls is not None else None
        self._interceptors = aio_bearer_interceptors(lambda: token.strip()) if token else None
        self.request_timeout_seconds = positive("request_timeout_seconds", request_timeout_seconds)
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def __aenter__(self) -> "AsyncAdmin":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    def in_scope(self, name: str) -> bool:
        """Whether a listed resource's ``name`` (as stored) is in this client's namespace."""
        return self.requests.in_scope(name)

    async def create_topic(self, topic: str, *, queue_count: int = 0, fifo: bool = False,
                           exist_ok: bool = False) -> admin_pb2.CreateTopicResponse:
        """See :meth:`txmq.Admin.create_topic`."""
        try:
            return await self._run(self.requests.create_topic(topic, queue_count=queue_count, fifo=fifo))
        except TopicExistsError:
            if not exist_ok:
                raise
        return await self._run(self.requests.existing_topic(topic, fifo=fifo))

    async def list_topics(self) -> admin_pb2.ListTopicsResponse:
        """See :meth:`txmq.Admin.list_topics`."""
        return await self._run(self.requests.list_topics())

    async def delete_topic(self, topic: str, *, force: bool = False) -> admin_pb2.DeleteTopicResponse:
        """See :meth:`txmq.Admin.delete_topic`."""
        return await self._run(self.requests.delete_topic(topic, force=force))

    async def describe_topic(self, topic: str) -> admin_pb2.DescribeTopicResponse:
        """See :meth:`txmq.Admin.describe_topic`."""
        return await self._run(self.requests.describe_topic(topic))

    async def consumer_groups(self, consumer_group: str = "", *,
                              topic: str = "") -> admin_pb2.ListConsumerGroupsResponse:
        """See :meth:`txmq.Admin.consumer_groups`."""
        return await self._run(self.requests.consumer_groups(consumer_group, topic=topic))

    async def dead_letters(self, consumer_group: str, *, limit: int = 100) -> admin_pb2.ListDeadLettersResponse:
        """See :meth:`txmq.Admin.dead_letters`."""
        return await self._run(self.requests.dead_letters(consumer_group, limit=limit))

    async def redrive_dead_letters(self, consumer_group: str, message_ids: Sequence[str] = (), *,
                             all: bool = False) -> admin_pb2.RedriveDeadLettersResponse:
        """See :meth:`txmq.Admin.redrive_dead_letters`."""
        return await self._run(self.requests.redrive_dead_letters(consumer_group, message_ids, all=all))

    async def reset_offsets(self, consumer_group: str, topic: str, *, to_earliest: bool = False,
                            to_latest: bool = False, to_time: _dt.datetime | None = None,
                            to_offsets: Mapping[OffsetKey, int] | None = None, shift: int | None = None,
                            dry_run: bool = True, force: bool = False, reason: str = "",
                            operator: str = "") -> ResetResult:
        """See :meth:`txmq.Admin.reset_offsets`."""
        result: ResetResult = await self._run(self.requests.reset_offsets(
            consumer_group, topic, to_earliest=to_earliest, to_latest=to_latest, to_time=to_time,
            to_offsets=to_offsets, shift=shift, dry_run=dry_run, force=force, reason=reason, operator=operator))
        return result

    async def delete_consumer_group(self, consumer_group: str, *, force: bool = False, dry_run: bool = False,
                                    dead_letters: bool = False, reason: str = "",
                                    operator: str = "") -> admin_pb2.DeleteConsumerGroupResponse:
        """See :meth:`txmq.Admin.delete_consumer_group`."""
        response: admin_pb2.DeleteConsumerGroupResponse = await self._run(self.requests.delete_consumer_group(
            consumer_group, force=force, dry_run=dry_run, dead_letters=dead_letters, reason=reason,
            operator=operator))
        return response

    async def delete_producer_group(self, producer_group: str, *, force: bool = False, dry_run: bool = False,
                                    discard_topic: bool = False, reason: str = "",
                                    operator: str = "") -> admin_pb2.DeleteProducerGroupResponse:
        """See :meth:`txmq.Admin.delete_producer_group`."""
        response: admin_pb2.DeleteProducerGroupResponse = await self._run(self.requests.delete_producer_group(
            producer_group, force=force, dry_run=dry_run, discard_topic=discard_topic, reason=reason,
            operator=operator))
        return response

    async def group_clients(self, group: str) -> admin_pb2.ListGroupClientsResponse:
        """See :meth:`txmq.Admin.group_clients`."""
        return await self._run(self.requests.group_clients(group))

    async def get_message(self, message_id: str) -> broker_pb2.FoundMessage:
        """See :meth:`txmq.Admin.get_message`."""
        return await self._run(self.requests.get_message(message_id))

    async def find_messages(self, topic: str, key: str, *, limit: int = 32, begin: _dt.datetime | None = None,
                            end: _dt.datetime | None = None) -> admin_pb2.FindMessagesResponse:
        """See :meth:`txmq.Admin.find_messages`."""
        return await self._run(self.requests.find_messages(topic, key, limit=limit, begin=begin, end=end))

    async def read_messages(self, topic: str, queue_id: int, offset: int, *, broker: str = "",
                            limit: int = 1) -> admin_pb2.ReadMessagesResponse:
        """See :meth:`txmq.Admin.read_messages`."""
        return await self._run(self.requests.read_messages(topic, queue_id, offset, broker=broker, limit=limit))

    async def list_transactions(self, *, producer_group: str = "",
                                state: common_pb2.TransactionState.ValueType = common_pb2.TRANSACTION_STATE_UNSPECIFIED,
                                older_than_seconds: float = 0.0, limit: int = 100,
                                key: str = "") -> admin_pb2.ListTransactionsResponse:
        """See :meth:`txmq.Admin.list_transactions`."""
        return await self._run(self.requests.list_transactions(producer_group=producer_group, state=state,
                                                               older_than_seconds=older_than_seconds, limit=limit,
                                                               key=key))

    async def describe_transaction(self, transaction_id: str) -> admin_pb2.DescribeTransactionResponse:
        """See :meth:`txmq.Admin.describe_transaction`."""
        return await self._run(self.requests.describe_transaction(transaction_id))

    async def resolve_transaction(self, transaction_id: str, resolution: str, *, operator: str,
                            reason: str) -> admin_pb2.ResolveTransactionResponse:
        """See :meth:`txmq.Admin.resolve_transaction`."""
        return await self._run(self.requests.resolve_transaction(transaction_id, resolution, operator=operator,
                                                                 reason=reason))

    async def list_brokers(self, *, include_followers: bool = True) -> nameserver_pb2.ListBrokersResponse:
        """See :meth:`txmq.Admin.list_brokers`."""
        return await self._run(self.requests.list_brokers(include_followers=include_followers))

    async def broker_stats(self) -> admin_pb2.DescribeBrokersResponse:
        """See :meth:`txmq.Admin.broker_stats`."""
        return await self._run(self.requests.broker_stats())

    async def elect_leader(self, shard: str, replica_id: int) -> admin_pb2.ElectLeaderResponse:
        """See :meth:`txmq.Admin.elect_leader`."""
        return await self._run(self.requests.elect_leader(shard, replica_id))

    async def list_checkers(self) -> nameserver_pb2.ListCheckersResponse:
        """See :meth:`txmq.Admin.list_checkers`."""
        return await self._run(self.requests.list_checkers())

    # --- the calls ------------------------------------------------------------------------

    def channel_to(self, address: str, max_message_bytes: int | None = None) -> grpc.aio.Channel:
        """A channel of its own (its caller closes it) to another service, a broker, with this
        client's TLS material and token; ``max_message_bytes`` raises the receive limit."""
        options = CHANNEL_OPTIONS if max_message_bytes is None else (
            *[(k, v) for k, v in CHANNEL_OPTIONS if k != "grpc.max_receive_message_length"],
            ("grpc.max_receive_message_length", max_message_bytes))
        if self._tls is None:
            return grpc.aio.insecure_channel(address, options=options, interceptors=self._interceptors)
        self._tls.current()
        return self._tls.aio_channel(address, options, self._interceptors)

    async def call(self, service: str, method: str, request: Any) -> Any:
        """``service`` is ``"admin"`` or ``"nameserver"``; tries the name servers in turn."""
        return await self._run(AdminCall(service, method, request))

    async def _run(self, call: AdminCall) -> Any:
        return await run_async(call_steps(self.addresses, call), self._perform)

    async def _perform(self, rpc: AdminRpc) -> Any:
        channel = self._channels.get(rpc.address)
        if channel is None:
            channel = self._channels[rpc.address] = self.channel_to(rpc.address)
        call = rpc.call
        stub: Any = (admin_pb2_grpc.AdminServiceStub(channel) if call.service == "admin"
                     else nameserver_pb2_grpc.NameServerServiceStub(channel))
        try:
            return await getattr(stub, call.method)(call.request, timeout=self.request_timeout_seconds)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotANameServerError(rpc.address, f"txmq.v1.{SERVICES[call.service]}/{call.method}") from None
            raise error_from_rpc(exc) from None
