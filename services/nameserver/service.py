"""The name server's gRPC servicers: proto ⇄ domain, nothing else. Errors are txmq errors
raised by the domain and mapped to a status by the shared interceptor."""

from __future__ import annotations

from typing import Any

from services.common.auth import current_principal, may, may_see
from services.common.auth.acl import PUBLISH, TOPIC
from services.common.auth.quota import caller_subject
from txmq.v1 import admin_pb2, admin_pb2_grpc, common_pb2, nameserver_pb2, nameserver_pb2_grpc

from .admin import Admin
from .groupops import GroupOps
from .registry import BrokerRecord, CheckerRecord, Registry
from .topics import Topics


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def broker_info(record: BrokerRecord) -> nameserver_pb2.BrokerInfo:
    """A broker as ListBrokers shows it: open to every principal (clients route with the
    addresses), so with only the topics the caller holds a right on (``may_see``; all of them
    for a service identity, an operator of the cluster, or with auth off)."""
    info = nameserver_pb2.BrokerInfo(
        name=record.name, address=record.address, last_heartbeat_ms=_ms(record.last_heartbeat),
        topics=[common_pb2.TopicQueues(topic=t, queue_count=n, topic_type=topic_type(t in record.fifo_topics))
                for t, n in sorted(record.topics.items()) if may_see(TOPIC, t)],
        replica_id=record.replica_id, role=nameserver_pb2.BrokerRole.ValueType(record.role), leader_epoch=record.epoch, draining=record.draining)
    if record.replication is not None:
        info.replication.CopyFrom(record.replication)
    return info


def topic_type(fifo: bool) -> common_pb2.TopicType.ValueType:
    return common_pb2.TOPIC_TYPE_FIFO if fifo else common_pb2.TOPIC_TYPE_NORMAL


def checker_info(record: CheckerRecord) -> nameserver_pb2.CheckerInfo:
    return nameserver_pb2.CheckerInfo(name=record.name, address=record.address,
                                      last_heartbeat_ms=_ms(record.last_heartbeat))


def broker_queues(brokers: list[tuple[str, int]]) -> list[admin_pb2.BrokerQueues]:
    return [admin_pb2.BrokerQueues(broker_name=name, queue_count=count) for name, count in brokers]


class NameServerServicer(nameserver_pb2_grpc.NameServerServiceServicer):
    def __init__(self, registry: Registry, topics: Topics, *, heartbeat_interval_seconds: float) -> None:
        self.registry = registry
        self.topics = topics
        self.heartbeat_interval_seconds = heartbeat_interval_seconds

    async def RegisterBroker(self, request: nameserver_pb2.RegisterBrokerRequest,
                             context: Any) -> nameserver_pb2.RegisterBrokerResponse:
        broker = request.broker
        self.registry.register_broker(broker.name, broker.address,
                                      [(t.topic, t.queue_count) for t in broker.topics],
                                      replica_id=broker.replica_id, role=broker.role, epoch=broker.leader_epoch,
                                      replication=broker.replication if broker.HasField("replication") else None,
                                      draining=broker.draining,
                                      fifo_topics=[t.topic for t in broker.topics
                                                   if t.topic_type == common_pb2.TOPIC_TYPE_FIFO])
        return nameserver_pb2.RegisterBrokerResponse(
            heartbeat_interval_seconds=self.heartbeat_interval_seconds,
            expiry_seconds=self.registry.broker_expiry_seconds)

    async def UnregisterBroker(self, request: nameserver_pb2.UnregisterBrokerRequest,
                               context: Any) -> nameserver_pb2.UnregisterBrokerResponse:
        self.registry.unregister_broker(request.name, request.replica_id)
        return nameserver_pb2.UnregisterBrokerResponse()

    async def RegisterChecker(self, request: nameserver_pb2.RegisterCheckerRequest,
                              context: Any) -> nameserver_pb2.RegisterCheckerResponse:
        self.registry.register_checker(request.checker.name, request.checker.address)
        return nameserver_pb2.RegisterCheckerResponse(
            heartbeat_interval_seconds=self.heartbeat_interval_seconds,
            expiry_seconds=self.registry.checker_expiry_seconds)

    async def UnregisterChecker(self, request: nameserver_pb2.UnregisterCheckerRequest,
                                context: Any) -> nameserver_pb2.UnregisterCheckerResponse:
        self.registry.unregister_checker(request.name)
        return nameserver_pb2.UnregisterCheckerResponse()

    async def QueryRoute(self, request: nameserver_pb2.QueryRouteRequest,
                         context: Any) -> nameserver_pb2.QueryRouteResponse:
        # Creating a missing topic (auto_create_topics) is a producer's doing: a caller that
        # may only subscribe to it is answered TOPIC_NOT_FOUND, as without the setting.
        for_send = request.for_send and may(PUBLISH, TOPIC, request.topic)
        queues = await self.topics.route(request.topic, for_send=for_send, subject=caller_subject())
        return nameserver_pb2.QueryRouteResponse(topic=request.topic, queues=[
            nameserver_pb2.QueueRoute(broker_name=q.broker_name, broker_address=q.broker_address,
                                      queue_id=q.queue_id, draining=q.draining) for q in queues],
            topic_type=topic_type(self.registry.is_fifo(request.topic)))

    async def ListBrokers(self, request: nameserver_pb2.ListBrokersRequest,
                          context: Any) -> nameserver_pb2.ListBrokersResponse:
        return nameserver_pb2.ListBrokersResponse(
            brokers=[broker_info(b) for b in (self.registry.all_replicas() if request.include_followers
                                              else self.registry.live_brokers())])

    async def ListCheckers(self, request: nameserver_pb2.ListCheckersRequest,
                           context: Any) -> nameserver_pb2.ListCheckersResponse:
        return nameserver_pb2.ListCheckersResponse(
            checkers=[checker_info(c) for c in self.registry.live_checkers()])


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, admin: Admin, topics: Topics, groups: GroupOps) -> None:
        self.admin = admin
        self.topics = topics
        self.groups = groups

    async def ResetOffsets(self, request: admin_pb2.ResetOffsetsRequest, context: Any) -> admin_pb2.ResetOffsetsResponse:
        # With auth on, the authenticated principal is the operator on record, not a free text.
        principal = current_principal()
        operator = principal.name if principal is not None else request.operator.strip()
        return await self.groups.reset_offsets(request, operator)

    async def DeleteConsumerGroup(self, request: admin_pb2.DeleteConsumerGroupRequest,
                                  context: Any) -> admin_pb2.DeleteConsumerGroupResponse:
        principal = current_principal()
        operator = principal.name if principal is not None else request.operator.strip()
        return await self.groups.delete_group(request, operator)

    async def DeleteProducerGroup(self, request: admin_pb2.DeleteProducerGroupRequest,
                                  context: Any) -> admin_pb2.DeleteProducerGroupResponse:
        principal = current_principal()
        operator = principal.name if principal is not None else request.operator.strip()
        return await self.groups.delete_producer_group(request, operator)

    async def GetMessage(self, request: admin_pb2.GetMessageRequest, context: Any) -> admin_pb2.GetMessageResponse:
        return admin_pb2.GetMessageResponse(message=await self.groups.get_message(request.message_id))

    async def FindMessages(self, request: admin_pb2.FindMessagesRequest,
                           context: Any) -> admin_pb2.FindMessagesResponse:
        return await self.groups.find_messages(request)

    async def ReadMessages(self, request: admin_pb2.ReadMessagesRequest,
                           context: Any) -> admin_pb2.ReadMessagesResponse:
        return await self.groups.read_messages(request)

    async def ListGroupClients(self, request: admin_pb2.ListGroupClientsRequest,
                               context: Any) -> admin_pb2.ListGroupClientsResponse:
        return await self.groups.group_clients(request.group)

    async def CreateTopic(self, request: admin_pb2.CreateTopicRequest,
                          context: Any) -> admin_pb2.CreateTopicResponse:
        creation = await self.topics.create_topic(request.topic, request.queue_count,
                                                 fifo=request.topic_type == common_pb2.TOPIC_TYPE_FIFO,
                                                 subject=caller_subject())
        return admin_pb2.CreateTopicResponse(topic=creation.topic, brokers=broker_queues(creation.brokers))

    async def ExpandTopic(self, request: admin_pb2.ExpandTopicRequest,
                          context: Any) -> admin_pb2.ExpandTopicResponse:
        expansion = await self.topics.expand_topic(request.topic, request.broker_name, request.queue_count)
        return admin_pb2.ExpandTopicResponse(topic=expansion.topic, brokers=broker_queues(expansion.brokers))

    async def ListTopics(self, request: admin_pb2.ListTopicsRequest,
                         context: Any) -> admin_pb2.ListTopicsResponse:
        return admin_pb2.ListTopicsResponse(topics=[
            admin_pb2.TopicInfo(topic=topic, brokers=broker_queues(brokers),
                                topic_type=topic_type(self.topics.registry.is_fifo(topic)))
            for topic, brokers in self.topics.list_topics()])

    async def ListTransactions(self, request: admin_pb2.ListTransactionsRequest,
                               context: Any) -> admin_pb2.ListTransactionsResponse:
        rows, unreachable, truncated = await self.admin.list_transactions(
            request.producer_group, request.state, request.older_than_seconds, request.limit,
            request.namespace, request.key)
        return admin_pb2.ListTransactionsResponse(transactions=rows, unreachable_brokers=unreachable,
                                                  truncated=bool(truncated), truncated_brokers=truncated)

    async def DescribeTransaction(self, request: admin_pb2.DescribeTransactionRequest,
                                  context: Any) -> admin_pb2.DescribeTransactionResponse:
        found = await self.admin.describe_transaction(request.transaction_id)
        response = admin_pb2.DescribeTransactionResponse(transaction=found.transaction)
        if found.HasField("message"):
            response.message.CopyFrom(found.message)
        return response

    async def ResolveTransaction(self, request: admin_pb2.ResolveTransactionRequest,
                                 context: Any) -> admin_pb2.ResolveTransactionResponse:
        # With auth on, the authenticated principal is the operator on record, not a free text.
        principal = current_principal()
        operator = principal.name if principal is not None else request.operator
        row = await self.admin.resolve_transaction(request.transaction_id, request.resolution, operator,
                                                   request.reason)
        return admin_pb2.ResolveTransactionResponse(transaction=row)

    async def ElectLeader(self, request: admin_pb2.ElectLeaderRequest, context: Any) -> admin_pb2.ElectLeaderResponse:
        previous, log_end = await self.admin.elect_leader(request.shard, request.replica_id)
        return admin_pb2.ElectLeaderResponse(previous_replica_id=previous, log_end=log_end)

    async def DescribeBrokers(self, request: admin_pb2.DescribeBrokersRequest,
                              context: Any) -> admin_pb2.DescribeBrokersResponse:
        stats, unreachable = await self.admin.describe_brokers()
        return admin_pb2.DescribeBrokersResponse(brokers=stats, unreachable_brokers=unreachable)

    async def DescribeTopic(self, request: admin_pb2.DescribeTopicRequest,
                            context: Any) -> admin_pb2.DescribeTopicResponse:
        queues, consumers, unreachable = await self.admin.describe_topic(request.topic)
        return admin_pb2.DescribeTopicResponse(
            topic=request.topic, consumers=consumers, unreachable_brokers=unreachable,
            topic_type=topic_type(self.topics.registry.is_fifo(request.topic)),
            queues=[admin_pb2.TopicQueue(broker_name=broker, queue_id=q.queue_id, min_offset=q.min_offset,
                                         max_offset=q.max_offset) for broker, q in queues])

    async def ListConsumerGroups(self, request: admin_pb2.ListConsumerGroupsRequest,
                                 context: Any) -> admin_pb2.ListConsumerGroupsResponse:
        queues, dead, unreachable = await self.admin.consumer_groups(request.consumer_group, request.topic)
        return admin_pb2.ListConsumerGroupsResponse(queues=queues, dead_letters=dead, unreachable_brokers=unreachable)

    async def ListDeadLetters(self, request: admin_pb2.ListDeadLettersRequest,
                              context: Any) -> admin_pb2.ListDeadLettersResponse:
        messages, unreachable, truncated = await self.admin.list_dead_letters(request.consumer_group, request.limit)
        return admin_pb2.ListDeadLettersResponse(messages=messages, unreachable_brokers=unreachable,
                                                 truncated=truncated)

    async def RedriveDeadLetters(self, request: admin_pb2.RedriveDeadLettersRequest,
                                 context: Any) -> admin_pb2.RedriveDeadLettersResponse:
        redriven, missing, expired, unreachable = await self.admin.redrive_dead_letters(
            request.consumer_group, list(request.message_ids), request.all)
        return admin_pb2.RedriveDeadLettersResponse(redriven=redriven, not_found=missing, expired=expired,
                                                    unreachable_brokers=unreachable)

    async def DeleteTopic(self, request: admin_pb2.DeleteTopicRequest, context: Any) -> admin_pb2.DeleteTopicResponse:
        brokers, entries, groups = await self.topics.delete_topic(request.topic, request.force)
        return admin_pb2.DeleteTopicResponse(topic=request.topic, brokers=brokers, entries_deleted=entries,
                                             consumer_groups=groups)
