"""The operator RPCs of issue 32 (``ResetGroupOffsets``, ``LookupMessages``,
``DescribeGroupClients``), ``DeleteGroupState`` and the last reset shown by ``DescribeConsumerGroups``:
proto ⇄ domain for ``service.BrokerServicer``, which delegates to these functions (the
domain is ``resets.py``, ``lookups.py``, ``receivers.py``)."""

from __future__ import annotations

from typing import Callable

from txmq.errors import InvalidFieldError
from txmq.v1 import broker_pb2, common_pb2

from services.common.auth.quota import relayed_subject

from . import groupdelete, lookups, producerdelete, resets
from .bridge import StoreBridge
from .core import BrokerCore
from .quotas import Quotas
from .model import STATE_COMMITTED, STATE_DISCARDED, STATE_PREPARED, STATE_ROLLED_BACK
from .store.codec import LogRecord

_STATES: dict[int, common_pb2.TransactionState.ValueType] = {
    STATE_PREPARED: common_pb2.TRANSACTION_STATE_PREPARED,
    STATE_COMMITTED: common_pb2.TRANSACTION_STATE_COMMITTED,
    STATE_ROLLED_BACK: common_pb2.TRANSACTION_STATE_ROLLED_BACK,
    STATE_DISCARDED: common_pb2.TRANSACTION_STATE_DISCARDED,
}


async def reset_group_offsets(core: BrokerCore, bridge: StoreBridge, request: broker_pb2.ResetGroupOffsetsRequest,
                              quotas: Quotas) -> broker_pb2.ResetGroupOffsetsResponse:
    """A reset (or its dry run) that would give a group its first cursor in the topic here is
    held to the quotas of the principal the name server relays it for (its ``operator``)."""
    offsets: dict[int, int] = {}
    for entry in request.offsets:
        if entry.queue_id in offsets:
            raise InvalidFieldError("offsets", f"queue {entry.queue_id} named twice")
        offsets[entry.queue_id] = entry.offset
    op = resets.reset_op(core, request.consumer_group, request.topic, request.target,
                         timestamp_ms=request.timestamp_ms, offsets=offsets, shift=request.shift,
                         dry_run=request.dry_run, force=request.force, operator=request.operator,
                         reason=request.reason)
    op = quotas.subscribing(relayed_subject(request.operator), request.consumer_group, request.topic, op)
    result: resets.ResetResult = await bridge.run(op, sync=not request.dry_run)
    if request.dry_run:
        await bridge.settled()
    return broker_pb2.ResetGroupOffsetsResponse(
        applied=result.applied,
        queues=[broker_pb2.QueueReset(
            broker_name=core.name, queue_id=q.queue_id, current_offset=q.current_offset, new_offset=q.new_offset,
            min_offset=q.min_offset, max_offset=q.max_offset, lag_before=q.max_offset - q.current_offset,
            lag_after=q.max_offset - q.new_offset, inflight_invalidated=q.inflight_invalidated)
            for q in result.queues],
        live_consumers=[broker_pb2.GroupClient(
            client_id=c.client_id, address=c.address, kind="consumer", group=request.consumer_group,
            topics=[request.topic], last_seen_ms=c.last_seen_ms, waiting=c.waiting, broker_name=core.name)
            for c in result.live])


async def delete_group_state(core: BrokerCore, bridge: StoreBridge,
                             request: broker_pb2.DeleteGroupStateRequest) -> broker_pb2.DeleteGroupStateResponse:
    op = groupdelete.delete_group_op(core, request.consumer_group, dry_run=request.dry_run, force=request.force,
                                     dead_letters=request.dead_letters, operator=request.operator,
                                     reason=request.reason)
    result: groupdelete.GroupDeletion = await bridge.run(op, sync=not request.dry_run)
    if request.dry_run:
        await bridge.settled()
    return broker_pb2.DeleteGroupStateResponse(
        applied=result.applied,
        deletion=broker_pb2.GroupDeletion(
            broker_name=core.name, topics=result.topics, cursors=result.cursors, inflight=result.inflight,
            resets=result.resets, clients=result.clients, dead_letters=result.dead_letters,
            dead_letter_topic_deleted=result.dead_letter_topic_deleted),
        live_consumers=[broker_pb2.GroupClient(
            client_id=r.client_id, address=r.address, kind="consumer", group=r.group, topics=sorted(r.topics),
            last_seen_ms=r.last_seen_ms(), waiting=bool(r.waiting), broker_name=core.name) for r in result.live])


async def delete_producer_group_state(core: BrokerCore, bridge: StoreBridge,
                                     request: broker_pb2.DeleteProducerGroupStateRequest,
                                     ) -> broker_pb2.DeleteProducerGroupStateResponse:
    op = producerdelete.delete_producer_group_op(
        core, request.producer_group, dry_run=request.dry_run, force=request.force,
        discard=request.discard_topic, operator=request.operator, reason=request.reason)
    result: producerdelete.ProducerGroupDeletion = await bridge.run(op, sync=not request.dry_run)
    if request.dry_run:
        await bridge.settled()
    group = request.producer_group
    return broker_pb2.DeleteProducerGroupStateResponse(
        applied=result.applied,
        deletion=broker_pb2.ProducerGroupDeletion(
            broker_name=core.name, counters=result.counters, pending=result.pending, discarded=result.discarded,
            global_pushes=result.global_pushes, discard_topic=result.discard_topic,
            discard_topic_deleted=result.discard_topic_deleted),
        live_producers=[
            *(broker_pb2.GroupClient(client_id=who, kind="producer", group=group, last_seen_ms=at,
                                     broker_name=core.name) for who, at in result.producers),
            *(broker_pb2.GroupClient(client_id=c.checker_id, kind="checker", group=group, waiting=c.held,
                                     last_seen_ms=c.last_seen_ms, capacity=c.capacity, broker_name=core.name)
              for c in result.checkers)])


def found_to_proto(core: BrokerCore, f: lookups.Found, message: common_pb2.Message) -> broker_pb2.FoundMessage:
    return broker_pb2.FoundMessage(
        message=common_pb2.DeliveredMessage(
            topic=f.topic, message=message, broker_name=core.name, queue_id=f.queue_id, queue_offset=f.queue_offset,
            transaction_id=f.transaction_id, stored_at_ms=f.record.stored_ms, visible_at_ms=f.visible_ms),
        transaction_state=_STATES.get(f.state, common_pb2.TRANSACTION_STATE_UNSPECIFIED), scheduled=f.scheduled)


async def lookup_messages(core: BrokerCore, bridge: StoreBridge, request: broker_pb2.LookupMessagesRequest,
                          to_proto: Callable[[LogRecord], common_pb2.Message]) -> broker_pb2.LookupMessagesResponse:
    """``to_proto``: the servicer's record → message."""
    ways = sum([bool(request.message_id), bool(request.key), request.by_offset])
    if ways != 1:
        raise InvalidFieldError("message_id/key/by_offset", "look up by exactly one of: a message id, a key (with "
                                                            "its topic), a queue and offset (by_offset)")
    truncated = False
    if request.message_id:
        found = [lookups.by_message_id(core, request.message_id)]
    elif request.key:
        found, truncated = lookups.by_key(core, request.topic, request.key, request.limit, request.begin_ms,
                                          request.end_ms)
    else:
        found = lookups.by_offset(core, request.topic, request.queue_id, request.offset, request.limit)
    await bridge.settled()
    return broker_pb2.LookupMessagesResponse(
        messages=[found_to_proto(core, f, to_proto(f.record)) for f in found], truncated=truncated)


async def describe_group_clients(core: BrokerCore, bridge: StoreBridge,
                                 request: broker_pb2.DescribeGroupClientsRequest,
                                 ) -> broker_pb2.DescribeGroupClientsResponse:
    if not request.group:
        raise InvalidFieldError("group", "required: a consumer group or a producer group")
    now = core.clock()
    response = broker_pb2.DescribeGroupClientsResponse()
    for r in core.receivers.of_group(request.group, now):
        response.clients.append(broker_pb2.GroupClient(
            client_id=r.client_id, address=r.address, kind="consumer", group=r.group, topics=sorted(r.topics),
            last_seen_ms=r.last_seen_ms(), waiting=bool(r.waiting), broker_name=core.name))
    for c in core.receivers.checkers_of(request.group, now):
        response.clients.append(broker_pb2.GroupClient(
            client_id=c.checker_id, kind="checker", group=c.producer_group, last_seen_ms=c.last_seen_ms,
            waiting=c.held, capacity=c.capacity, broker_name=core.name))
    return response


def with_last_reset(core: BrokerCore, status: broker_pb2.ConsumerQueueStatus) -> broker_pb2.ConsumerQueueStatus:
    """``status`` with the last reset of its group in its topic (when there was one)."""
    last = resets.last_reset(core, status.consumer_group, status.topic)
    if last is not None:
        status.last_reset_operator = last.operator
        status.last_reset_at_ms = last.at_ms
        status.last_reset_reason = last.reason
        status.last_reset_target = resets.TARGET_NAMES.get(last.target, "")
    return status
