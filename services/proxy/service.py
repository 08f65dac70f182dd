"""``apache.rocketmq.v2.MessagingService``: RocketMQ protocol ⇄ the proxy's domain, and
domain errors → in-band ``Status`` (``codes.code_for``), nothing else.

Every response carries a status: the official clients read errors in band and treat a
gRPC-level failure as a transport error. RPCs txmq does not serve (Pull/offset RPCs,
RecallMessage, lite topics) answer NOT_IMPLEMENTED. The consumers' RPCs (receives, acks,
nacks, dead-lettering) are delegated to ``consumerrpc.ConsumerRpc``, with the push consumers'
deliveries (``auto_renew``) it keeps invisible through ``renew.Renewer``. The call order
and field requirements of the clients are described in docs/rocketmq-compat.md.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from txmq.errors import TxmqError
from txmq.v1 import common_pb2

from services.common.auth import CALLER, may, recheck
from services.common.auth.acl import PUBLISH, TOPIC

from . import settings as settings_mod
from .checks import CheckManager
from .clients import CLIENT_ID_HEADER, ClientRegistry, TelemetryStream, client_id_of, client_of
from .codes import ProxyError, code_for, failure, status, unsupported
from .config import ProxyConfig
from .consumerrpc import ConsumerRpc
from .convert import resource_name, to_native, to_resource
from .metrics import ProxyMetrics
from .protocol import Code, service_pb2_grpc
from .protocol import definition_pb2 as pb
from .protocol import service_pb2 as spb
from .relay import Relay
from .renew import Renewer
from .upstream import Upstream

log = logging.getLogger(__name__)


#: Message types every topic accepts (txmq topics take normal and transactional messages).
ACCEPTED_TYPES = (pb.NORMAL, pb.DELAY, pb.TRANSACTION)
#: ... and FIFO topics: FIFO messages (a message group each).
FIFO_TYPES = (pb.FIFO,)

_RESOLUTIONS = {
    pb.COMMIT: (common_pb2.TRANSACTION_RESOLUTION_COMMIT, common_pb2.CHECK_RESULT_COMMIT, "commit"),
    pb.ROLLBACK: (common_pb2.TRANSACTION_RESOLUTION_ROLLBACK, common_pb2.CHECK_RESULT_ROLLBACK, "rollback"),
}
_UNKNOWN = (common_pb2.TRANSACTION_RESOLUTION_UNKNOWN, common_pb2.CHECK_RESULT_UNKNOWN, "unknown")


def open_telemetry(registry: ClientRegistry, context: Any) -> TelemetryStream:
    """The calling client's new Telemetry stream; refused without a client id
    (CLIENT_ID_REQUIRED) or for a new live client of a principal that has
    ``max_live_clients_per_principal`` already (``ClientRegistry.open_stream``)."""
    client = client_of(context)
    if not client.client_id:
        raise ProxyError(Code.CLIENT_ID_REQUIRED, f"the {CLIENT_ID_HEADER} header is required")
    return registry.open_stream(client, context.peer(), CALLER.get())


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, config: ProxyConfig, upstream: Upstream, relay: Relay, registry: ClientRegistry,
                 checks: CheckManager, metrics: ProxyMetrics, bound_port: int = 0,
                 renewer: Renewer | None = None) -> None:
        self.config = config
        self.upstream = upstream
        self.relay = relay
        self.registry = registry
        self.checks = checks
        self.metrics = metrics
        self.bound_port = bound_port
        #: EndTransactions carried on past their caller's cancellation (see EndTransaction).
        self._ending: set[asyncio.Task[spb.EndTransactionResponse]] = set()
        self.renewer = renewer or Renewer(config, relay, metrics)
        registry.on_gone.append(self.renewer.client_gone)
        self.consumer_rpc = ConsumerRpc(config, relay, self.renewer, metrics)

    # --- routes --------------------------------------------------------------------------

    def _queue(self, topic: str, queue_id: int, broker: str, endpoints: pb.Endpoints,
               draining: bool = False) -> pb.MessageQueue:
        return pb.MessageQueue(
            topic=to_resource(topic), id=queue_id, permission=pb.READ if draining else pb.READ_WRITE,
            broker=pb.Broker(name=broker, id=0, endpoints=endpoints),
            accept_message_types=FIFO_TYPES if topic in self.upstream.fifo_topics else ACCEPTED_TYPES)

    async def QueryRoute(self, request: spb.QueryRouteRequest, context: Any) -> spb.QueryRouteResponse:
        try:
            topic = resource_name(request.topic, "topic")
            endpoints = settings_mod.advertised(self.config, request.endpoints, self.bound_port)
            # The name servers create a missing topic (auto_create_topics) for the proxy's
            # own identity: only for a client that may publish to it.
            queues = await self.upstream.route(topic, for_send=may(PUBLISH, TOPIC, topic))
            return spb.QueryRouteResponse(status=status(), message_queues=[
                self._queue(topic, q.queue_id, q.broker_name, endpoints, q.draining) for q in queues])
        except Exception as exc:  # noqa: BLE001 - answered in band
            return failure(spb.QueryRouteResponse, exc, "QueryRoute")

    async def QueryAssignment(self, request: spb.QueryAssignmentRequest,
                              context: Any) -> spb.QueryAssignmentResponse:
        """One assignment per broker holding the topic, queue id -1 (any queue of it)."""
        try:
            topic = resource_name(request.topic, "topic")
            resource_name(request.group, "group")
            endpoints = settings_mod.advertised(self.config, request.endpoints, self.bound_port)
            brokers = await self.relay.brokers_of(topic)
            return spb.QueryAssignmentResponse(status=status(), assignments=[
                pb.Assignment(message_queue=self._queue(topic, -1, name, endpoints)) for name in brokers])
        except Exception as exc:  # noqa: BLE001 - answered in band, as each RPC below
            return failure(spb.QueryAssignmentResponse, exc, "QueryAssignment")

    # --- liveness ------------------------------------------------------------------------

    async def Heartbeat(self, request: spb.HeartbeatRequest, context: Any) -> spb.HeartbeatResponse:
        return spb.HeartbeatResponse(status=status())

    async def NotifyClientTermination(self, request: spb.NotifyClientTerminationRequest,
                                      context: Any) -> spb.NotifyClientTerminationResponse:
        client = client_of(context)
        if client.client_id:
            self.registry.terminate(client)
        return spb.NotifyClientTerminationResponse(status=status())

    # --- producing -----------------------------------------------------------------------

    async def SendMessage(self, request: spb.SendMessageRequest, context: Any) -> spb.SendMessageResponse:
        if not request.messages:
            return spb.SendMessageResponse(status=status(ProxyError(Code.BAD_REQUEST, "no message to send")))
        client_id = client_id_of(context)
        response = spb.SendMessageResponse()
        first_error: pb.Status | None = None
        for message in request.messages:
            message_id = message.system_properties.message_id
            try:
                native = to_native(message, client_id=client_id,
                                   max_body_bytes=self.upstream.limits.max_body_bytes)
                result = await self.relay.send(native)
            except Exception as exc:  # noqa: BLE001 - per entry, and at the top (Python reads only that)
                failed = failure(spb.SendResultEntry, exc, "SendMessage")
                failed.message_id = message_id
                response.entries.append(failed)
                first_error = first_error or failed.status
                continue
            self.metrics.messages_in.labels(native.topic).inc()
            response.entries.append(spb.SendResultEntry(
                status=status(), message_id=result.message_id, transaction_id=result.transaction_id,
                offset=max(result.queue_offset, 0)))
        response.status.CopyFrom(first_error or status())
        return response

    async def EndTransaction(self, request: spb.EndTransactionRequest, context: Any) -> spb.EndTransactionResponse:
        """COMMIT / ROLLBACK from the producer (SOURCE_CLIENT) or its TransactionChecker
        (SOURCE_SERVER_CHECK, source CHECK on the broker). Any replica applies it on the
        broker the transaction id names; a check sent from this replica is also answered
        to its checker (see ``checks``). UNSPECIFIED keeps the transaction pending.

        A decision that reached the proxy is carried through even if the client cancels the
        call: the official clients shut down (closing their channel) while their check
        thread's EndTransaction is in flight, and a handler cancelled between the broker's
        commit and the checker's answer left the check unanswered (a timeout at the checker,
        its link draining until forgotten)."""
        ending = asyncio.create_task(self._end_transaction(request), name="end-transaction")
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)
        return await asyncio.shield(ending)

    async def _end_transaction(self, request: spb.EndTransactionRequest) -> spb.EndTransactionResponse:
        from_check = request.source == pb.SOURCE_SERVER_CHECK
        resolution, check_result, label = _RESOLUTIONS.get(request.resolution, _UNKNOWN)
        source_label = "server_check" if from_check else "client"
        try:
            # The client's producer group is its topic (see convert): the broker decides
            # whether this transaction is that group's, and whether the client may end it.
            producer_group = resource_name(request.topic, "topic")
            if not request.transaction_id:
                raise ProxyError(Code.INVALID_TRANSACTION_ID, "transaction_id is required")
            ended = await self.relay.end(request.transaction_id, request.message_id, resolution,
                                         common_pb2.TRANSACTION_SOURCE_CHECK if from_check
                                         else common_pb2.TRANSACTION_SOURCE_CLIENT, producer_group)
        except Exception as exc:  # noqa: BLE001 - answered in band
            self.metrics.end_transactions.labels(label, source_label, Code.Name(code_for(exc))).inc()
            return failure(spb.EndTransactionResponse, exc, "EndTransaction")
        if ended is None:  # its shard is down: the check decides (see Relay.end)
            self.metrics.end_transactions.labels(label, source_label, "deferred").inc()
            return spb.EndTransactionResponse(status=status())
        self.metrics.end_transactions.labels(label, source_label, "ok").inc()
        if from_check and self.checks.answered(request.transaction_id, check_result):
            self.metrics.checks.labels("answered").inc()
        return spb.EndTransactionResponse(status=status())

    async def RecallMessage(self, request: spb.RecallMessageRequest, context: Any) -> spb.RecallMessageResponse:
        return spb.RecallMessageResponse(status=status(unsupported("RecallMessage (delay messages)")))

    # --- consuming -----------------------------------------------------------------------

    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest, context: Any) -> None:
        await self.consumer_rpc.receive(request, context)

    async def AckMessage(self, request: spb.AckMessageRequest, context: Any) -> spb.AckMessageResponse:
        return await self.consumer_rpc.ack(request, context)

    async def ChangeInvisibleDuration(self, request: spb.ChangeInvisibleDurationRequest,
                                      context: Any) -> spb.ChangeInvisibleDurationResponse:
        return await self.consumer_rpc.change_invisible(request, context)

    async def ForwardMessageToDeadLetterQueue(self, request: spb.ForwardMessageToDeadLetterQueueRequest,
                                              context: Any) -> spb.ForwardMessageToDeadLetterQueueResponse:
        return await self.consumer_rpc.dead_letter(request, context)

    # --- unused by the clients -----------------------------------------------------------

    async def PullMessage(self, request: spb.PullMessageRequest, context: Any) -> None:
        await context.write(spb.PullMessageResponse(status=status(unsupported("PullMessage"))))

    async def UpdateOffset(self, request: spb.UpdateOffsetRequest, context: Any) -> spb.UpdateOffsetResponse:
        return spb.UpdateOffsetResponse(status=status(unsupported("UpdateOffset")))

    async def GetOffset(self, request: spb.GetOffsetRequest, context: Any) -> spb.GetOffsetResponse:
        return spb.GetOffsetResponse(status=status(unsupported("GetOffset")))

    async def QueryOffset(self, request: spb.QueryOffsetRequest, context: Any) -> spb.QueryOffsetResponse:
        return spb.QueryOffsetResponse(status=status(unsupported("QueryOffset")))

    async def SyncLiteSubscription(self, request: spb.SyncLiteSubscriptionRequest,
                                   context: Any) -> spb.SyncLiteSubscriptionResponse:
        return spb.SyncLiteSubscriptionResponse(status=status(unsupported("lite topics")))

    # --- telemetry -----------------------------------------------------------------------

    async def Telemetry(self, request_iterator: AsyncIterator[spb.TelemetryCommand], context: Any) -> None:
        """Replies to every Settings with the proxy's settings (status OK), and carries
        orphan checks to producers. Bound to the client by its ``x-mq-client-id`` (and its principal)."""
        try:
            stream = open_telemetry(self.registry, context)
        except TxmqError as exc:  # no client id, or max_live_clients_per_principal reached
            await context.write(spb.TelemetryCommand(status=status(exc)))
            return
        reader = asyncio.ensure_future(self._read_telemetry(request_iterator, stream))
        try:
            while True:
                item = await stream.next()
                if item is None:
                    break
                command, on_writing, on_written = item
                recheck()  # its credentials revoked: it ends UNAUTHENTICATED, this unwritten
                if on_writing is not None:
                    on_writing()
                await context.write(command)
                if on_written is not None:
                    on_written()
            # A command that did not decode ends the stream with its status (INVALID_ARGUMENT).
            if reader.done() and not reader.cancelled() and (refused := reader.result()) is not None:
                raise refused
            if stream.refusal is not None:
                raise stream.refusal
        finally:
            reader.cancel()
            self.registry.close_stream(stream)

    async def _subscribes_fifo(self, settings: pb.Settings) -> bool:
        """Whether a consumer's subscriptions are to FIFO topics (its Settings then say
        ``subscription.fifo``: the clients consume a message group in order and forward a
        message they give up on to the dead-letter queue)."""
        if settings.WhichOneof("pub_sub") != "subscription":
            return False
        fifo = False
        for entry in settings.subscription.subscriptions:
            # The topic as the policy authorized it (``<namespace>%<name>``): the bare name
            # is another topic, maybe another tenant's, which this lookup (the proxy's own,
            # on the name servers) must not tell the client about.
            try:
                topic = resource_name(entry.topic, "topic")
                await self.upstream.route(topic, for_send=False)
            except TxmqError:
                continue  # a missing or bad topic: the receive reports it
            fifo = fifo or topic in self.upstream.fifo_topics
        return fifo

    async def _read_telemetry(self, requests: AsyncIterator[spb.TelemetryCommand],
                              stream: TelemetryStream) -> TxmqError | None:
        refused: TxmqError | None = None
        try:
            async for command in requests:
                if command.WhichOneof("command") == "settings":
                    self.registry.update_settings(stream, command.settings)
                    fifo = await self._subscribes_fifo(command.settings)
                    stream.offer(spb.TelemetryCommand(status=status(),
                                                      settings=settings_mod.reply(command.settings, self.config,
                                                                                  self.upstream.limits, fifo=fifo)))
                # Other commands (thread stack traces, verify results, statuses) need no reply.
        except asyncio.CancelledError:
            raise
        except TxmqError as exc:
            refused = exc
        except Exception as exc:  # noqa: BLE001 - the client went away mid-read
            log.debug("telemetry read ended", extra={"fields": {"client_id": stream.client_id,
                                                                 "error": str(exc)[:200]}})
        self.registry.close_stream(stream)
        return refused
