"""BrokerService: translates proto ⇄ domain (``convert``) and nothing else. Domain errors
become status codes in the shared interceptor (unary) or in ``EntryStatus`` (batches and the
stream)."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, AsyncIterator, Callable

import grpc

from txmq.errors import InvalidFieldError, TxmqError
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2

from services.common.auth import may, may_see
from services.common.auth.acl import ADMIN_READ, CLUSTER, PRODUCER_GROUP, TOPIC
from services.common.auth.quota import caller_subject
from services.common.errors import OK, entry_status
from services.common.limits import Admission, caller_limit

from . import adminrpc, failpoints, groups, topics
from .bridge import StoreBridge
from .checkerrpc import CheckerRpc
from .consumerrpc import ConsumerRpc
from .convert import (RESOLUTIONS, SOURCES_FROM_PROTO, STATES_FROM_PROTO, delivered_to_proto, message_to_proto,
                      record_from_proto, source_to_proto, state_from_proto, state_to_proto, topic_queues,
                      txn_to_proto)
from .core import BrokerCore
from .drain import guard_send
from .metrics import BrokerMetrics
from .model import EndResult, SendResult, Source
from .quotas import SETTINGS as QUOTA_SETTINGS, Quotas
from .store import codec
from .store.db import Op

log = logging.getLogger(__name__)


def broker_stats(core: BrokerCore, store_bytes: int) -> broker_pb2.GetBrokerStatsResponse:
    """GetBrokerStats' answer for the caller of the call being served. Open to every principal
    (the limits are for clients and proxies), so it lists only the topics and groups the caller
    holds a right on, and the newest transaction id (the end of QueryTransactions over every
    group) only to an operator of the cluster."""
    response = broker_pb2.GetBrokerStatsResponse(
        broker_name=core.name, store_bytes=store_bytes,
        free_disk_bytes=core.free_disk_bytes, max_body_bytes=core.config.max_body_bytes,
        max_delivery_attempts=core.config.max_delivery_attempts,
        last_transaction_id=core.last_txn_id() if may(ADMIN_READ, CLUSTER, "") else "")
    for topic, count in sorted(core.topics.items()):
        if may_see(TOPIC, topic):
            response.topics.append(topic_queues(core, topic, count))
    for group, (pending, discarded) in sorted(core.counters.items()):
        if may_see(PRODUCER_GROUP, group):
            response.groups.append(broker_pb2.GroupTransactionStats(
                producer_group=group, pending=pending, discarded=discarded,
                oldest_pending_prepared_at_ms=core.oldest_pending_ms(group) or 0))
    return response


class BrokerServicer(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self, core: BrokerCore, bridge: StoreBridge, metrics: BrokerMetrics) -> None:
        self.core = core
        self.bridge = bridge
        self.metrics = metrics
        self.config = core.config
        #: Long polls: consumers' receives that wait, and checkers' claims held on the broker.
        self.long_polls = caller_limit(self.config, metrics, "max_long_polls_per_connection",
                                       "max_long_polls_per_principal")
        #: Sends on Produce streams applied and not yet answered (see ``_produce``).
        self.produce_pending = Admission(self.config.max_pending_produce_entries, "max_pending_produce_entries")
        self.quotas = Quotas(self.config, core.consumers.names, core.counters,
                             lambda: core.transactions.groups_removed, metrics.quota_refusals(QUOTA_SETTINGS))
        self.consumer_rpc = ConsumerRpc(core, bridge, metrics, self.quotas, self.long_polls)
        # A checker's claims held on the broker are its long polls (a service identity: per connection only).
        self.checker_rpc = CheckerRpc(core, bridge, self.long_polls.per_connection)

    # --- producing -----------------------------------------------------------------------

    def _send_op(self, request: broker_pb2.SendMessageRequest) -> Op:
        record = self.core.validate_message(record_from_proto(request.message))
        if record.kind == codec.KIND_HALF:  # its producer is live (a deletion of the group waits for it)
            self.core.receivers.produced(record.producer_group, record.producer_client_id, self.core.clock())
        subject = caller_subject()
        send = self.core.global_send_op(record, begin=request.begin_global,
                                        participants=list(request.global_participants),
                                        global_id=request.global_transaction_id)
        return guard_send(self.core.db, self.core.name, self.quotas.producing(subject, record, send),
                          request.message.message_id)

    def _send_response(self, result: SendResult) -> broker_pb2.SendMessageResponse:
        return broker_pb2.SendMessageResponse(
            message_id=result.message_id, transaction_id=result.transaction_id, queue_id=result.queue_id,
            queue_offset=result.queue_offset, transaction_state=state_to_proto(result.state),
            duplicate=result.duplicate, broker_name=self.core.name)

    def _end_op(self, request: broker_pb2.EndTransactionRequest) -> Op:
        resolution = RESOLUTIONS.get(request.resolution)
        if resolution is None:
            raise InvalidFieldError("resolution", "must be COMMIT, ROLLBACK or UNKNOWN")
        source = SOURCES_FROM_PROTO.get(request.source, Source.NONE)  # NONE is refused
        return self.core.end_op(request.transaction_id, resolution, source,
                                message_id=request.message_id, producer_group=request.producer_group,
                                operator=request.operator, reason=request.reason)

    @staticmethod
    def _end_response(result: EndResult) -> broker_pb2.EndTransactionResponse:
        return broker_pb2.EndTransactionResponse(
            transaction_id=result.transaction_id, state=state_to_proto(result.state),
            resolution_source=source_to_proto(result.source), ended_at_ms=result.ended_ms,
            queue_offset=result.queue_offset)

    async def SendMessage(self, request: broker_pb2.SendMessageRequest, context: Any) -> Any:
        return self._send_response(await self.bridge.run(self._send_op(request)))

    async def EndTransaction(self, request: broker_pb2.EndTransactionRequest, context: Any) -> Any:
        return self._end_response(await self.bridge.run(self._end_op(request)))

    # A grpc.aio stream answered through context.write(): the generated base declares only
    # handlers that return an iterator.
    async def Produce(  # type: ignore[override]
            self, request_iterator: AsyncIterator[broker_pb2.ProduceRequest], context: Any) -> None:
        await ProduceStream(context, self.bridge, self.metrics, self.produce_pending,
                            send=lambda r: self._send_response(self.bridge.apply(self._send_op(r))[0]),
                            end=lambda r: self._end_response(self.bridge.apply(self._end_op(r))[0])).run()

    # --- consuming -----------------------------------------------------------------------

    async def ReceiveMessages(self, request: broker_pb2.ReceiveMessagesRequest, context: Any) -> Any:
        return await self.consumer_rpc.receive(request, context)

    async def AckMessages(self, request: broker_pb2.AckMessagesRequest, context: Any) -> Any:
        return await self.consumer_rpc.ack(request)

    async def ChangeInvisibleDuration(self, request: broker_pb2.ChangeInvisibleDurationRequest,
                                      context: Any) -> Any:
        return await self.consumer_rpc.change_invisible(request)

    async def DeadLetterMessage(self, request: broker_pb2.DeadLetterMessageRequest, context: Any) -> Any:
        return await self.consumer_rpc.dead_letter(request)

    # --- reading queues ------------------------------------------------------------------

    async def ReadQueue(self, request: broker_pb2.ReadQueueRequest, context: Any) -> Any:
        entries, next_offset = self.core.read_queue(request.topic, request.queue_id, request.start_offset,
                                                    request.end_offset, request.max_messages or 256)
        response = broker_pb2.ReadQueueResponse(next_offset=next_offset)
        for q, low, high in self.core.queue_offsets(request.topic):
            if q == request.queue_id:
                response.min_offset, response.max_offset = low, high
        for offset, entry in entries:
            record = self.core.read_message(entry.log_seq)
            if record is None:
                continue  # removed by retention between the scan and the read
            response.messages.append(delivered_to_proto(self.core, request.topic, request.queue_id, offset,
                                                        entry.log_seq, entry.visible_ms, record))
        await self.bridge.settled()
        return response

    async def GetQueueOffsets(self, request: broker_pb2.GetQueueOffsetsRequest, context: Any) -> Any:
        response = broker_pb2.GetQueueOffsetsResponse(
            topic=request.topic, broker_name=self.core.name,
            queues=[broker_pb2.QueueOffsets(queue_id=q, min_offset=low, max_offset=high)
                    for q, low, high in self.core.queue_offsets(request.topic)])
        await self.bridge.settled()
        return response

    # --- administration ------------------------------------------------------------------

    async def CreateTopicQueues(self, request: broker_pb2.CreateTopicQueuesRequest, context: Any) -> Any:
        fifo = None if request.topic_type == common_pb2.TOPIC_TYPE_UNSPECIFIED else (
            request.topic_type == common_pb2.TOPIC_TYPE_FIFO)
        count = await self.bridge.run(self.core.create_topic_op(request.topic, request.queue_count, fifo))
        return broker_pb2.CreateTopicQueuesResponse(topic=topic_queues(self.core, request.topic, count))

    async def ClaimChecks(self, request: broker_pb2.ClaimChecksRequest, context: Any) -> Any:
        return await self.checker_rpc.claim(request, context)

    async def ReportChecks(self, request: broker_pb2.ReportChecksRequest, context: Any) -> Any:
        return await self.checker_rpc.report(request)

    async def QueryTransactions(self, request: broker_pb2.QueryTransactionsRequest, context: Any) -> Any:
        if request.limit < 0:
            raise InvalidFieldError("limit", f"{request.limit} is negative (0: the default page size)")
        rows, token = self.core.query_txns(request.producer_group, state_from_proto(request.state),
                                           request.older_than_seconds, request.limit, request.page_token,
                                           namespace=request.namespace, key=request.key)
        await self.bridge.settled()
        response = broker_pb2.QueryTransactionsResponse(next_page_token=token)
        for row in rows:
            t = response.transactions.add()
            t.CopyFrom(txn_to_proto(self.core, row))
            record = self.core.read_message(row.seq)
            if record is not None:
                t.keys.extend(record.keys)
        return response

    async def GetTransaction(self, request: broker_pb2.GetTransactionRequest, context: Any) -> Any:
        row = self.core.get_txn(request.transaction_id)
        record = self.core.read_message(row.seq)
        await self.bridge.settled()
        response = broker_pb2.GetTransactionResponse(transaction=txn_to_proto(self.core, row))
        if record is not None:
            response.message.CopyFrom(message_to_proto(record))
        return response

    async def GetBrokerStats(self, request: broker_pb2.GetBrokerStatsRequest, context: Any) -> Any:
        response = broker_stats(self.core, self.metrics.store_bytes_value)
        await self.bridge.settled()
        return response

    async def DescribeConsumerGroups(self, request: broker_pb2.DescribeConsumerGroupsRequest, context: Any) -> Any:
        queues, dead = groups.describe_groups(self.core, request.consumer_group, request.topic)
        await self.bridge.settled()
        name = self.core.name
        return broker_pb2.DescribeConsumerGroupsResponse(
            queues=[adminrpc.with_last_reset(self.core, broker_pb2.ConsumerQueueStatus(
                consumer_group=q.group, topic=q.topic, broker_name=name, queue_id=q.queue_id,
                ack_offset=q.ack_offset, next_offset=q.next_offset, max_offset=q.max_offset,
                lag_messages=q.lag_messages, lag_seconds=q.lag_seconds, inflight=q.inflight,
                retrying=q.retrying)) for q in queues],
            dead_letters=[broker_pb2.GroupDeadLetters(consumer_group=g, broker_name=name, dead_lettered=n)
                          for g, n in sorted(dead.items())])

    async def ResetGroupOffsets(self, request: broker_pb2.ResetGroupOffsetsRequest, context: Any) -> Any:
        return await adminrpc.reset_group_offsets(self.core, self.bridge, request, self.quotas)

    async def LookupMessages(self, request: broker_pb2.LookupMessagesRequest, context: Any) -> Any:
        return await adminrpc.lookup_messages(self.core, self.bridge, request, message_to_proto)

    async def DescribeGroupClients(self, request: broker_pb2.DescribeGroupClientsRequest, context: Any) -> Any:
        return await adminrpc.describe_group_clients(self.core, self.bridge, request)

    async def DeleteGroupState(self, request: broker_pb2.DeleteGroupStateRequest, context: Any) -> Any:
        return await adminrpc.delete_group_state(self.core, self.bridge, request)

    async def DeleteProducerGroupState(self, request: broker_pb2.DeleteProducerGroupStateRequest,
                                       context: Any) -> Any:
        return await adminrpc.delete_producer_group_state(self.core, self.bridge, request)

    async def ReturnDeadLetters(self, request: broker_pb2.ReturnDeadLettersRequest, context: Any) -> Any:
        if not request.all and not request.message_ids:
            raise InvalidFieldError("message_ids", "name the messages to re-drive, or set all")
        result = await self.bridge.run(groups.return_dead_letters_op(
            self.core, request.consumer_group, list(request.message_ids), request.all))
        return broker_pb2.ReturnDeadLettersResponse(redriven=result.redriven, not_found=result.not_found,
                                                    expired=result.expired)

    async def DeleteTopicQueues(self, request: broker_pb2.DeleteTopicQueuesRequest, context: Any) -> Any:
        deleted = await self.bridge.run(topics.delete_topic_op(self.core, request.topic, request.force))
        return broker_pb2.DeleteTopicQueuesResponse(entries_deleted=deleted.entries, consumer_groups=deleted.groups)

    # --- multi-message (global) transactions (globaltx.py) -------------------------------

    async def ApplyGlobalTransaction(self, request: broker_pb2.ApplyGlobalTransactionRequest, context: Any) -> Any:
        state = STATES_FROM_PROTO.get(request.state, 0)
        source = SOURCES_FROM_PROTO.get(request.source, Source.NONE)
        decided = await self.bridge.run(self.core.apply_global_op(request.global_transaction_id, state, source,
                                                                  request.producer_group))
        return broker_pb2.ApplyGlobalTransactionResponse(parts_decided=decided)

    async def ResolveGlobalTransaction(self, request: broker_pb2.ResolveGlobalTransactionRequest, context: Any) -> Any:
        failpoints.hit("resolve.before")
        row = await self.bridge.run(self.core.resolve_global_op(request.global_transaction_id,
                                                                request.participant))
        await self.bridge.settled()  # answer only a durable state
        return broker_pb2.ResolveGlobalTransactionResponse(
            state=state_to_proto(row.state), source=source_to_proto(row.source), producer_group=row.producer_group)

    async def GetGlobalTransaction(self, request: broker_pb2.GetGlobalTransactionRequest, context: Any) -> Any:
        row, participants, pending, parts = self.core.describe_global(request.global_transaction_id)
        await self.bridge.settled()
        response = broker_pb2.GetGlobalTransactionResponse(
            participants=participants, participants_pending=pending,
            parts=[txn_to_proto(self.core, p) for p in parts])
        if row is not None:
            response.transaction.CopyFrom(txn_to_proto(self.core, row))
        return response

    async def ListGlobalTransactions(self, request: broker_pb2.ListGlobalTransactionsRequest, context: Any) -> Any:
        if request.limit < 0:
            raise InvalidFieldError("limit", f"{request.limit} is negative (0: 100)")
        found = self.core.list_globals(request.limit or 100)
        await self.bridge.settled()
        return broker_pb2.ListGlobalTransactionsResponse(transactions=[
            broker_pb2.GlobalTransactionSummary(global_transaction_id=gid, coordinator=coordinator,
                                                open_parts=open_parts, participants_pending=pending)
            for gid, coordinator, open_parts, pending in found])


class ProduceStream:
    """One Produce stream: applies each stream message's entries at once, in order, and
    answers them in one stream message once their writes (and what they read) are durable.
    Reading goes on meanwhile, so the entries that arrive during one WAL sync share the
    next. Sends and ends are the servicer's (the same operations as SendMessage and
    EndTransaction)."""

    def __init__(self, context: Any, bridge: StoreBridge, metrics: BrokerMetrics, pending: Admission, *,
                 send: Callable[[broker_pb2.SendMessageRequest], broker_pb2.SendMessageResponse],
                 end: Callable[[broker_pb2.EndTransactionRequest], broker_pb2.EndTransactionResponse]) -> None:
        self.context = context
        self.bridge = bridge
        self.metrics = metrics
        #: Sends on Produce streams applied and not yet answered (see ``_produce``).
        self.pending = pending
        #: Apply one entry (inside the stream message's write group) and answer it.
        self.send = send
        self.end = end

    async def run(self) -> None:
        context = self.context
        # Each request's answers, built in one ProduceResponse as it is applied (no copy of
        # every result into a response at write time); those ready together go out as one.
        ready: list[broker_pb2.ProduceResponse] = []
        wake = asyncio.Event()
        waiting = 0
        reading = True

        def release(results: broker_pb2.ProduceResponse, admitted: int) -> None:
            nonlocal waiting
            waiting -= 1
            self.pending.in_flight -= admitted
            ready.append(results)
            wake.set()

        def release_failed(results: broker_pb2.ProduceResponse, admitted: int, exc: BaseException) -> None:
            release(broker_pb2.ProduceResponse(
                results=[self._produce_error(x.request_id, exc) for x in results.results]), admitted)

        async def read() -> None:
            nonlocal waiting, reading
            try:
                # context.read() rather than ``async for`` over the iterator: one async
                # generator step less per message.
                while (request := await context.read()) is not grpc.aio.EOF:
                    results, ticket, admitted = self._produce(request)
                    waiting += 1
                    self.bridge.when_durable(
                        ticket, functools.partial(release, results, admitted),
                        # Leadership lost before the replicas had them: each entry fails
                        # retryably (its outcome is unknown; the same ids deduplicate).
                        functools.partial(release_failed, results, admitted))
            finally:
                reading = False
                wake.set()

        reader = asyncio.ensure_future(read())
        try:
            while reading or waiting or ready:
                await wake.wait()
                wake.clear()
                if ready:
                    response = ready[0]
                    for more in ready[1:]:
                        response.MergeFrom(more)  # appends its results
                    ready.clear()
                    await context.write(response)
                    self.metrics.produce_out.inc()
            if not reader.cancelled() and (failure := reader.exception()) is not None:
                raise failure
        finally:
            reader.cancel()

    def _produce(self, request: broker_pb2.ProduceRequest) -> tuple[broker_pb2.ProduceResponse, int, int]:
        """Applies one stream message's entries; returns their results, the ticket that
        must be durable before any is told, and how many sends it admitted (counted in
        ``produce_pending`` until they are answered). A send beyond
        ``max_pending_produce_entries`` is shed in its own entry: OVERLOADED, nothing applied."""
        response = broker_pb2.ProduceResponse()
        add = response.results.add
        admitted = 0
        pending = self.pending
        self.metrics.produce_in.inc()
        self.metrics.produce_entries.inc(len(request.entries))
        # One write for the whole message; its ticket covers every entry's writes and
        # reads, refusals included (a refusal is told only once what it saw is durable).
        with self.bridge.grouped() as group:
            for entry in request.entries:
                kind = entry.WhichOneof("request")
                try:
                    if kind == "send_message":
                        pending.enter()  # OverloadedError beyond the limit: this entry only
                        admitted += 1
                        add(request_id=entry.request_id, status=OK, send_message=self.send(entry.send_message))
                    elif kind == "end_transaction":
                        add(request_id=entry.request_id, status=OK, end_transaction=self.end(entry.end_transaction))
                    else:
                        raise InvalidFieldError("request", "set send_message or end_transaction")
                except Exception as exc:  # noqa: BLE001 - answered in the entry's result
                    response.results.append(self._produce_error(entry.request_id, exc))
        if pending.shed:
            self.metrics.produce_shed.inc(pending.shed)
            pending.shed = 0
        return response, group.ticket, admitted

    def _produce_error(self, request_id: int, error: BaseException) -> broker_pb2.ProduceResult:
        if not isinstance(error, TxmqError):
            log.error("produce request failed", exc_info=error)
            error = TxmqError(f"internal error: {type(error).__name__}")
            error.code = grpc.StatusCode.INTERNAL  # type: ignore[misc]  # this one's: the class's is a ClassVar
        return broker_pb2.ProduceResult(request_id=request_id, status=entry_status(error))
