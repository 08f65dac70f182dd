"""Builds the name server: NameServerService and AdminService on one grpc.aio server."""

from __future__ import annotations

from services.common.server import ServiceApp
from txmq.v1 import admin_pb2, admin_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

from .admin import Admin
from .brokercalls import BrokerCalls, BrokerClients
from .config import NameServerConfig
from .groupops import GroupOps
from .metrics import NameServerMetrics
from .registry import Registry
from .service import AdminServicer, NameServerServicer
from .topics import Topics

SERVICE_NAMES = (nameserver_pb2.DESCRIPTOR.services_by_name["NameServerService"].full_name,
                 admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name)


async def create_server(config: NameServerConfig) -> tuple[ServiceApp, int]:
    registry = Registry(broker_expiry_seconds=config.broker_expiry_seconds,
                        checker_expiry_seconds=config.checker_expiry_seconds)
    clients = BrokerClients(config.max_grpc_message_bytes)
    calls = BrokerCalls(registry, clients, timeout_seconds=config.broker_rpc_timeout_seconds)
    metrics = NameServerMetrics()
    topics = Topics(registry, calls, default_queue_count=config.default_queue_count,
                    auto_create_topics=config.auto_create_topics, expected_brokers=config.expected_brokers,
                    registration_grace_seconds=config.registration_grace_seconds,
                    max_topics_per_principal=config.max_topics_per_principal,
                    quota_refusals=metrics.quota_refusals(("max_topics_per_principal",))["max_topics_per_principal"])
    metrics.observe_registry(registry.live_broker_count, registry.live_checker_count)
    app = ServiceApp(
        "nameserver", config, metrics,
        register=[
            (nameserver_pb2_grpc.add_NameServerServiceServicer_to_server,
             NameServerServicer(registry, topics, heartbeat_interval_seconds=config.heartbeat_interval_seconds)),
            (admin_pb2_grpc.add_AdminServiceServicer_to_server,
             AdminServicer(Admin(registry, calls), topics, GroupOps(registry, calls))),
        ],
        service_names=SERVICE_NAMES)
    app.on_stop.append(clients.close)
    return app, app.port
