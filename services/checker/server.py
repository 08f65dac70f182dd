"""Builds the checker process: the CheckerService, registration with every name server,
the broker directory with a claim loop and a reporter per broker, and the timeout sweep."""

from __future__ import annotations

import logging

from txmq.v1 import broker_pb2, checker_pb2, checker_pb2_grpc, nameserver_pb2

from services.common.registration import Heartbeat
from services.common.server import ServiceApp

from .brokers import BrokerDirectory, OnError
from .config import CheckerConfig
from .dispatcher import Dispatcher
from .metrics import CheckerMetrics
from .resolver import Resolver
from .service import CheckerServicer

log = logging.getLogger(__name__)

SERVICE_NAME = checker_pb2.DESCRIPTOR.services_by_name["CheckerService"].full_name
#: The checker's own per-principal limit (``txmq_quota_refusals_total{setting}``).
PENDING_PER_PRINCIPAL = "max_pending_checks_per_principal"


class _LateBoundReporter:
    """The dispatcher reports through the directory, built after it."""

    directory: BrokerDirectory | None = None

    def report(self, broker: str, report: broker_pb2.CheckReport, on_error: OnError = None) -> None:
        if self.directory is not None:
            self.directory.report(broker, report, on_error)


async def create_server(config: CheckerConfig) -> tuple[ServiceApp, int]:
    metrics = CheckerMetrics()
    reporter = _LateBoundReporter()
    dispatcher = Dispatcher(checker_name=config.checker_name, reporter=reporter,
                            answer_timeout_seconds=config.answer_timeout_seconds,
                            lease_seconds=config.lease_seconds, queue_size=config.stream_queue_size,
                            default_credit=config.default_check_credit, metrics=metrics)
    directory = BrokerDirectory(config, dispatcher)
    reporter.directory = directory
    resolver = Resolver(config, dispatcher, directory, metrics)
    servicer = CheckerServicer(dispatcher, max_groups_per_stream=config.max_groups_per_stream,
                               max_pending_checks_per_connection=config.max_pending_checks_per_connection,
                               max_pending_checks_per_principal=config.max_pending_checks_per_principal,
                               refused=metrics.quota_refusals((PENDING_PER_PRINCIPAL,))[PENDING_PER_PRINCIPAL])
    app = ServiceApp("checker", config, metrics,
                     [(checker_pb2_grpc.add_CheckerServiceServicer_to_server, servicer)], [SERVICE_NAME])
    address = config.advertise_address or f"{'127.0.0.1' if config.host in ('0.0.0.0', '') else config.host}:{app.port}"
    app.dispatcher = dispatcher  # type: ignore[attr-defined]  # tests and tools reach the domain

    heartbeat = Heartbeat(
        config.nameserver_addresses, config.heartbeat_interval_seconds,
        register=lambda stub: stub.RegisterChecker(nameserver_pb2.RegisterCheckerRequest(
            checker=nameserver_pb2.CheckerInfo(name=config.checker_name, address=address))),
        unregister=lambda stub: stub.UnregisterChecker(
            nameserver_pb2.UnregisterCheckerRequest(name=config.checker_name)))
    async def sweep() -> None:
        dispatcher.expire()
        servicer.standing.revise()  # a revoked check right ends the streams it opened, idle or not

    async def start() -> None:
        await directory.start()
        await resolver.refresh()
        await heartbeat.start()

    async def stop() -> None:
        # Producers learn from the name servers first that this checker is leaving.
        await heartbeat.stop()
        # Checks not yet acknowledged go back to their brokers (due again at once).
        await resolver.close()
        dispatcher.close()
        await directory.stop(flush_seconds=min(config.shutdown_grace_seconds, 2.0))

    app.every("sweep", min(config.answer_timeout_seconds / 5, 0.1), sweep)
    if resolver.groups:
        app.every("resolver", 0.2, resolver.refresh)
        app.every("resolver-sweep", config.resolver_sweep_interval_seconds, resolver.sweep)
    app.on_start.append(start)
    app.on_stop.append(stop)
    return app, app.port
