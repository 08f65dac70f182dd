"""The Admin API's operator work of issue 32, over the registry and the broker calls
(:class:`~services.nameserver.brokercalls.BrokerCalls`): resetting a consumer group's offsets on every broker
holding the topic, deleting a consumer group on every broker, finding messages (by id, key,
queue and offset), and a group's clients.

A reset is all or nothing across brokers as far as the name server can make it: it first
asks every broker holding the topic for a dry run (which also reports live consumers), and
only when every one answered and none has live consumers (or ``force``) does it ask each to
apply. A broker failing between the two is reported, with what the others applied.

A deletion asks every live broker the same way (a dry run first: live consumers on any
broker refuse it, unless ``force``), then each to delete. Deleting is idempotent, so a
broker that did not answer is listed (``unreachable_brokers``) and the others delete: the
operator runs it again once it is back (its state of the group survives until then).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from txmq.errors import (ConsumerGroupNotFoundError, ConsumersLiveError, GroupNotEmptyError, InvalidFieldError, InvalidIdError, NoLeaderError, NotFoundError,
                         ProducerGroupNotFoundError, ProducersLiveError, TransactionsOpenError,
                         TopicNotFoundError,
                         TxmqError, UnavailableError, error_from_status)
from txmq.ids import MessageId
from txmq.names import validate_group, validate_name, validate_receive_topic
from txmq.v1 import admin_pb2, broker_pb2

from .brokercalls import BrokerCalls
from .registry import Registry

log = logging.getLogger(__name__)


class GroupOps:
    def __init__(self, registry: Registry, calls: BrokerCalls) -> None:
        self.registry = registry
        self.calls = calls

    def _holders(self, topic: str) -> set[str]:
        validate_receive_topic(topic)
        holders = {b.name for b in self.registry.live_brokers() if topic in b.topics}
        if not holders:
            raise TopicNotFoundError(topic)
        return holders

    # --- resets ------------------------------------------------------------------------------

    async def reset_offsets(self, request: admin_pb2.ResetOffsetsRequest, operator: str) -> admin_pb2.ResetOffsetsResponse:
        validate_group("consumer_group", request.consumer_group)
        leaderless = self.registry.leaderless_shards(request.topic) if request.topic else []
        if leaderless and not request.dry_run:
            # Its queues would keep the old position: all or nothing, once it leads again.
            raise NoLeaderError(request.topic, leaderless)
        holders = self._holders(request.topic)
        per_broker: dict[str, list[broker_pb2.QueueOffset]] = defaultdict(list)
        if request.target == broker_pb2.RESET_TARGET_OFFSET:
            for entry in request.offsets:
                broker = entry.broker_name
                if not broker:
                    if len(holders) != 1:
                        raise InvalidFieldError("offsets", f"name the broker of queue {entry.queue_id} "
                                                f"(BROKER/QUEUE:OFFSET): {request.topic!r} has queues on "
                                                f"{', '.join(sorted(holders))}")
                    broker = next(iter(holders))
                if broker not in holders:
                    raise InvalidFieldError("offsets", f"broker {broker!r} holds no queue of {request.topic!r} "
                                                       f"(it is on {', '.join(sorted(holders))})")
                per_broker[broker].append(broker_pb2.QueueOffset(queue_id=entry.queue_id, offset=entry.offset))
            targets = set(per_broker)
        else:
            targets = holders
        if not request.dry_run and not operator:
            raise InvalidFieldError("operator", "required: who resets the offsets (recorded with the reset)")

        def ask(broker: str, dry_run: bool) -> broker_pb2.ResetGroupOffsetsRequest:
            return broker_pb2.ResetGroupOffsetsRequest(
                consumer_group=request.consumer_group, topic=request.topic, target=request.target,
                timestamp_ms=request.timestamp_ms, offsets=per_broker.get(broker, []), shift=request.shift,
                dry_run=dry_run, force=request.force, operator=operator, reason=request.reason)

        planned = await self._each(targets, lambda b: ask(b, True))
        response = admin_pb2.ResetOffsetsResponse()
        for answer in planned.values():
            if not isinstance(answer, BaseException):
                response.live_consumers.extend(answer.live_consumers)
        failed = sorted(b for b, a in planned.items() if isinstance(a, BaseException))
        if request.dry_run:
            response.unreachable_brokers.extend(sorted(set(failed) | set(leaderless)))
            for b in sorted(planned):
                if not isinstance(planned[b], BaseException):
                    response.queues.extend(planned[b].queues)
            return response
        if failed:
            raise UnavailableError(f"broker(s) {', '.join(failed)} did not answer: nothing was reset (a reset moves "
                                   "the group on every broker holding the topic, or on none)")
        if response.live_consumers and not request.force:
            raise ConsumersLiveError(request.consumer_group, request.topic,
                                     sorted({f"{c.client_id}@{c.broker_name}" for c in response.live_consumers}))
        applied = await self._each(targets, lambda b: ask(b, False))
        errors = {b: a for b, a in applied.items() if isinstance(a, TxmqError)}
        for b in sorted(applied):
            if b not in errors:
                response.queues.extend(applied[b].queues)
        log.warning("consumer group offsets reset", extra={"fields": {
            "consumer_group": request.consumer_group, "topic": request.topic, "operator": operator,
            "reason": request.reason, "target": broker_pb2.ResetTarget.Name(request.target),
            "brokers": sorted(set(applied) - set(errors)), "failed": sorted(errors), "forced": request.force}})
        if errors:
            first = next(iter(errors.values()))
            raise error_from_status(first.code, f"the reset was applied on "
                                    f"{', '.join(sorted(set(applied) - set(errors))) or 'no broker'} but failed on "
                                    f"{', '.join(sorted(errors))} ({first.message}): run it again")
        response.applied = True
        response.operator = operator
        return response

    # --- deleting a group --------------------------------------------------------------------

    async def delete_group(self, request: admin_pb2.DeleteConsumerGroupRequest,
                           operator: str) -> admin_pb2.DeleteConsumerGroupResponse:
        group = request.consumer_group
        validate_group("consumer_group", group)
        if not request.dry_run and not operator:
            raise InvalidFieldError("operator", "required: who deletes the group (logged with the deletion)")

        def ask(dry_run: bool) -> broker_pb2.DeleteGroupStateRequest:
            return broker_pb2.DeleteGroupStateRequest(consumer_group=group, dry_run=dry_run, force=request.force,
                                                      dead_letters=request.dead_letters, operator=operator,
                                                      reason=request.reason)

        planned, unreachable = await self.calls.fan_out("DeleteGroupState", ask(True))
        response = admin_pb2.DeleteConsumerGroupResponse(consumer_group=group, unreachable_brokers=unreachable)
        for _b, answer in planned:
            response.live_consumers.extend(answer.live_consumers)
        known = [a for _b, a in planned if group_known(a.deletion)]
        if not known and not unreachable:
            raise ConsumerGroupNotFoundError(group)
        if request.dry_run:
            response.brokers.extend(sorted((a.deletion for a in known), key=lambda d: d.broker_name))
            return response
        if response.live_consumers and not request.force:
            raise GroupNotEmptyError(group, sorted({f"{c.client_id}@{c.broker_name}"
                                                    for c in response.live_consumers}))
        targets = {b.name for b, a in planned if group_known(a.deletion) or a.live_consumers}
        applied = await self._apply("DeleteGroupState", ask(False), targets, response, unreachable, operator)
        log.warning("consumer group deleted", extra={"fields": {
            "consumer_group": group, "operator": operator, "reason": request.reason, "forced": request.force,
            "dead_letters": request.dead_letters, "brokers": sorted(b.name for b, _a in applied),
            "unreachable": list(response.unreachable_brokers)}})
        return response

    async def delete_producer_group(self, request: admin_pb2.DeleteProducerGroupRequest,
                                    operator: str) -> admin_pb2.DeleteProducerGroupResponse:
        """Like :meth:`delete_group`: a dry run on every live broker first; a transaction not
        ended on any refuses it (force or not), live producers on any refuse it unless
        ``force``; then each broker that knows the group deletes it (and refuses again, in
        its own batch, should a transaction have begun since)."""
        group = request.producer_group
        validate_name("producer_group", group)
        if not request.dry_run and not operator:
            raise InvalidFieldError("operator", "required: who deletes the group (logged with the deletion)")

        def ask(dry_run: bool) -> broker_pb2.DeleteProducerGroupStateRequest:
            return broker_pb2.DeleteProducerGroupStateRequest(
                producer_group=group, dry_run=dry_run, force=request.force, discard_topic=request.discard_topic,
                operator=operator, reason=request.reason)

        planned, unreachable = await self.calls.fan_out("DeleteProducerGroupState", ask(True))
        response = admin_pb2.DeleteProducerGroupResponse(producer_group=group, unreachable_brokers=unreachable)
        for _b, answer in planned:
            response.live_producers.extend(answer.live_producers)
        known = [a for _b, a in planned if producer_group_known(a)]
        if not known and not unreachable:
            raise ProducerGroupNotFoundError(group)
        if request.dry_run:
            response.brokers.extend(sorted((a.deletion for a in known), key=lambda d: d.broker_name))
            return response
        for a in known:
            d = a.deletion
            if d.pending or d.discarded or d.global_pushes:
                raise TransactionsOpenError(group, d.broker_name, d.pending, d.discarded, d.global_pushes)
        if response.live_producers and not request.force:
            raise ProducersLiveError(group, sorted({f"{c.client_id}@{c.broker_name}"
                                                    for c in response.live_producers}))
        targets = {b.name for b, a in planned if producer_group_known(a)}
        applied = await self._apply("DeleteProducerGroupState", ask(False), targets, response, unreachable,
                                    operator)
        log.warning("producer group deleted", extra={"fields": {
            "producer_group": group, "operator": operator, "reason": request.reason, "forced": request.force,
            "discard_topic": request.discard_topic, "brokers": sorted(b.name for b, _a in applied),
            "unreachable": list(response.unreachable_brokers)}})
        return response

    async def _apply(self, method: str, request: Any, targets: set[str], response: Any,
                     unreachable: list[str], operator: str) -> list[Any]:
        """A group deletion's second step: ``method`` on the brokers that know the group, their
        deletions (by broker name) and every broker not reached into ``response``."""
        applied, gone = await self.calls.fan_out(method, request, only=targets)
        response.brokers.extend(sorted((a.deletion for _b, a in applied), key=lambda d: d.broker_name))
        del response.unreachable_brokers[:]
        response.unreachable_brokers.extend(sorted(set(unreachable) | set(gone)))
        response.applied = True
        response.operator = operator
        return applied

    async def _each(self, brokers: set[str], request_of: Any) -> dict[str, Any]:
        """ResetGroupOffsets on each broker: its answer, or the error it failed with."""
        out: dict[str, Any] = {}
        for name in sorted(brokers):
            try:
                broker = self.registry.live_broker(name)
                out[name] = await self.calls.call(broker.address, "ResetGroupOffsets", request_of(name))
            except TxmqError as exc:
                if not self.calls.is_down(exc):
                    raise
                out[name] = exc
        return out

    # --- finding messages --------------------------------------------------------------------

    async def get_message(self, message_id: str) -> broker_pb2.FoundMessage:
        if not message_id:
            raise InvalidFieldError("message_id", "required")
        request = broker_pb2.LookupMessagesRequest(message_id=message_id)
        try:
            broker = MessageId.decode(message_id).broker
        except InvalidIdError:
            broker = ""  # a message id the client chose: any broker may hold it
        if broker:
            record = self.registry.live_broker(broker)
            answer = await self.calls.call(record.address, "LookupMessages", request)
            return answer.messages[0]
        answers, unreachable = await self.calls.fan_out("LookupMessages", request, tolerate=(NotFoundError,))
        for _b, answer in answers:
            if answer.messages:
                return answer.messages[0]
        raise NotFoundError(f"message {message_id!r}: no broker holds it" + (
            f" (unreachable: {', '.join(unreachable)})" if unreachable else ""), message_id=message_id)

    async def find_messages(self, request: admin_pb2.FindMessagesRequest) -> admin_pb2.FindMessagesResponse:
        if not request.key:
            raise InvalidFieldError("key", "required")
        holders = self._holders(request.topic)
        answers, unreachable = await self.calls.fan_out("LookupMessages", broker_pb2.LookupMessagesRequest(
            topic=request.topic, key=request.key, limit=request.limit, begin_ms=request.begin_ms,
            end_ms=request.end_ms), only=holders)
        found = [m for _b, a in answers for m in a.messages]
        found.sort(key=lambda m: (m.message.visible_at_ms, m.message.broker_name, m.message.queue_offset),
                   reverse=True)
        return admin_pb2.FindMessagesResponse(messages=found, truncated=any(a.truncated for _b, a in answers),
                                              unreachable_brokers=unreachable)

    async def read_messages(self, request: admin_pb2.ReadMessagesRequest) -> admin_pb2.ReadMessagesResponse:
        holders = self._holders(request.topic)
        broker = request.broker_name
        if not broker:
            if len(holders) != 1:
                raise InvalidFieldError("broker_name", f"required: {request.topic!r} has queues on "
                                                       f"{', '.join(sorted(holders))}")
            broker = next(iter(holders))
        if broker not in holders:
            raise InvalidFieldError("broker_name", f"{broker!r} holds no queue of {request.topic!r}")
        address = self.registry.live_broker(broker).address
        answer = await self.calls.call(address, "LookupMessages", broker_pb2.LookupMessagesRequest(
            topic=request.topic, by_offset=True, queue_id=request.queue_id, offset=request.offset,
            limit=request.limit or 1))
        offsets = await self.calls.call(address, "GetQueueOffsets",
                                               broker_pb2.GetQueueOffsetsRequest(topic=request.topic))
        response = admin_pb2.ReadMessagesResponse(messages=answer.messages)
        for q in offsets.queues:
            if q.queue_id == request.queue_id:
                response.min_offset, response.max_offset = q.min_offset, q.max_offset
        return response

    # --- a group's clients -------------------------------------------------------------------

    async def group_clients(self, group: str) -> admin_pb2.ListGroupClientsResponse:
        validate_group("group", group)
        answers, unreachable = await self.calls.fan_out("DescribeGroupClients",
                                                        broker_pb2.DescribeGroupClientsRequest(group=group))
        clients = sorted((c for _b, a in answers for c in a.clients),
                         key=lambda c: (c.kind, c.client_id, c.broker_name))
        return admin_pb2.ListGroupClientsResponse(clients=clients, unreachable_brokers=unreachable)


def group_known(deletion: broker_pb2.GroupDeletion) -> bool:
    """Whether a broker holds anything of the group (what a deletion there would remove or
    report: cursors, reset records, clients, dead letters)."""
    return bool(deletion.cursors or deletion.resets or deletion.clients or deletion.dead_letters
                or deletion.dead_letter_topic_deleted)


def producer_group_known(answer: broker_pb2.DeleteProducerGroupStateResponse) -> bool:
    """Whether a broker holds anything of the producer group (its counters row, its
    %DISCARD% topic, live producers or checkers)."""
    d = answer.deletion
    return bool(d.counters or d.discard_topic or answer.live_producers)
