"""Builds the proxy process: the MessagingService, the native directory (name servers,
brokers, checkers), the check subscriptions for connected producers, the renewal of push
consumers' deliveries."""

from __future__ import annotations

import logging
from typing import Any

from google.protobuf import message_factory

from txmq.errors import TxmqError

from services.common.server import ServiceApp

from .access import AUTH_OPTIONS
from .checks import CheckManager
from .clients import ClientRegistry
from .config import ProxyConfig
from .metrics import ProxyMetrics
from .namespaces import NamespaceInterceptor
from .codes import status
from .protocol import SERVICE_NAME, service_pb2, service_pb2_grpc
from .relay import Relay
from .renew import Renewer
from .service import MessagingServicer
from .upstream import Upstream

log = logging.getLogger(__name__)

_METHODS = service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name
#: The proxy's own per-principal limit of its clients (``txmq_quota_refusals_total{setting}``).
LIVE_PER_PRINCIPAL = "max_live_clients_per_principal"


def refusal_in_band(method: str, error: TxmqError) -> Any:
    """A refusal before a method ran (OVERLOADED → 42900 TOO_MANY_REQUESTS, a bad number →
    40000 BAD_REQUEST) as the method's response: the official clients read errors in band."""
    response_cls = message_factory.GetMessageClass(_METHODS[method].output_type)
    return response_cls(status=status(error))


async def create_server(config: ProxyConfig) -> tuple[ServiceApp, int]:
    metrics = ProxyMetrics()
    upstream = Upstream(config)
    metrics.watch_faults(upstream.faults)
    relay = Relay(config, upstream)
    registry = ClientRegistry(config.client_idle_expiry_seconds,
                              max_departed_per_principal=config.max_departed_clients_per_principal,
                              max_live_per_principal=config.max_live_clients_per_principal,
                              refused=metrics.quota_refusals((LIVE_PER_PRINCIPAL,))[LIVE_PER_PRINCIPAL])
    metrics.watch_clients(registry.counts)
    checks = CheckManager(config, upstream, registry, metrics)
    renewer = Renewer(config, relay, metrics)
    servicer = MessagingServicer(config, upstream, relay, registry, checks, metrics, renewer=renewer)
    app = ServiceApp("proxy", config, metrics,
                     [(service_pb2_grpc.add_MessagingServiceServicer_to_server, servicer)], [SERVICE_NAME],
                     in_band=refusal_in_band, auth_options=AUTH_OPTIONS,
                     interceptors=[NamespaceInterceptor()])
    servicer.bound_port = app.port  # routes fall back to it when a client names no access point
    # Clients' check topics and streams are decided again when the credentials are reloaded.
    registry.store = app.auth.store if app.auth is not None else None
    app.servicer = servicer  # type: ignore[attr-defined]  # tests and tools reach the domain

    async def start() -> None:
        await upstream.start()
        checks.start()
        renewer.start()

    async def stop() -> None:
        registry.close()
        await renewer.stop()
        await checks.stop()
        await upstream.stop()

    app.on_start.append(start)
    app.on_stop.append(stop)
    return app, app.port
