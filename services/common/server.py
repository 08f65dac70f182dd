"""What every service's ``create_server`` builds: a ``grpc.aio`` server behind the shared
interceptor chain, the stock health and reflection services, /metrics, and the service's
own start/stop hooks."""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import socket
from typing import Any, Awaitable, Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from .aio import Deadline, step_within
from .auth import server_interceptor
from .config import ServiceConfig
from .interceptors import InBand, Registrar, ServerInterceptor
from .limits import Admission, ConnectionLimit, PrincipalLimit, PrincipalShares
from .metrics import BaseMetrics
from .runtime import STOP_SECONDS, StartupError
from .tls import server_credentials

log = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]
#: The gRPC server's stop past its grace (it cancels the calls still running, then ends).
SERVER_STOP_SLACK_SECONDS = 1.0
#: Cancelled periodic jobs end within this.
PERIODIC_STOP_SECONDS = 1.0
#: The per-principal limits every service has (``txmq_quota_refusals_total{setting}``).
PRINCIPAL_SETTINGS = ("max_streams_per_principal", "max_concurrent_rpcs_per_principal")


def check_port_free(host: str, port: int, setting: str) -> None:
    """Raises :class:`StartupError` naming ``setting`` when ``host:port`` cannot be bound
    (gRPC would only say "failed to bind", or bind one of two wildcard addresses)."""
    if port <= 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(f"{setting}: port {port} on {host or '0.0.0.0'} is already in use") from exc
            if exc.errno == errno.EACCES:
                raise StartupError(f"{setting}: binding port {port} on {host or '0.0.0.0'} is not permitted") from exc
            # An address this IPv4 check cannot take (IPv6, a name): gRPC decides.


class ServiceApp:
    def __init__(self, name: str, config: ServiceConfig, metrics: BaseMetrics,
                 register: Iterable[tuple[Callable[[Any, Any], None], Any]],
                 service_names: Iterable[str], *, unmetered: Iterable[str] = (),
                 in_band: InBand | None = None, auth_options: dict[str, Any] | None = None,
                 interceptors: Iterable[grpc.aio.ServerInterceptor] = ()) -> None:
        """``unmetered``: methods that wait by design (long polls), not counted against
        ``max_concurrent_rpcs``; ``in_band``: answers a refusal as the method's response;
        ``auth_options``: the proxy's authentication options; ``interceptors``: the
        service's own, innermost (a request deserializer they replace serves the others)."""
        self.name = name
        refused = metrics.quota_refusals(PRINCIPAL_SETTINGS)
        #: Each principal's open streams and unary calls in flight (counted with auth on).
        self.shares = PrincipalShares(
            PrincipalLimit("max_streams_per_principal", config.max_streams_per_principal,
                           refused["max_streams_per_principal"]),
            PrincipalLimit("max_concurrent_rpcs_per_principal", config.max_concurrent_rpcs_per_principal,
                           refused["max_concurrent_rpcs_per_principal"], fair_share=True), frozenset(unmetered))
        # Authentication and ACLs (None unless config.auth_files); auth_options: the proxy's.
        self.auth = server_interceptor(config, **(auth_options or {}), shares=self.shares)
        self.config = config
        self.metrics = metrics
        self.admission = Admission(config.max_concurrent_rpcs)
        chain = ServerInterceptor(
            metrics, self.admission, ConnectionLimit("max_streams_per_connection", config.max_streams_per_connection),
            frozenset(unmetered), in_band, delegated=self.auth is not None)
        inner = [*([self.auth] if self.auth else []), *interceptors]
        self.server = grpc.aio.server(
            # The shared chain alone (auth off, no service interceptors): its wrapping is
            # applied as handlers register (``Registrar``), sparing grpc.aio's interceptor
            # coroutines on every call; otherwise it is the outermost interceptor.
            interceptors=[chain, *inner] if inner else None,
            options=[("grpc.max_receive_message_length", config.max_grpc_message_bytes),
                     ("grpc.max_send_message_length", config.max_grpc_message_bytes),
                     ("grpc.so_reuseport", 0),
                     # gRPC cancels calls queued beyond its pending cap (1,000 by default):
                     # the queue is sized here and the excess shed by the interceptor.
                     ("grpc.server.max_pending_requests", config.max_pending_rpcs),
                     ("grpc.server.max_pending_requests_hard_limit", config.max_pending_rpcs)])
        registrar: Any = self.server if inner else Registrar(self.server, chain)
        for add, servicer in register:
            add(servicer, registrar)
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, registrar)
        self.service_names = list(service_names)
        # (enable_server_reflection picks the asyncio servicer only for a grpc.aio.Server.)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection.aio.ReflectionServicer(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]), registrar)
        check_port_free(config.host, config.port, "port (TXMQ_PORT)")
        check_port_free(config.host, config.metrics_port, "metrics_port (TXMQ_METRICS_PORT)")
        check_port_free(config.host, config.health_port, "health_port (TXMQ_HEALTH_PORT)")
        secure = server_credentials(config)
        #: The TLS certificates of the port (None: plaintext).
        self.certificates = secure[1] if secure is not None else None
        try:
            if secure is None:
                self.port = self.server.add_insecure_port(f"{config.host}:{config.port}")
            else:
                self.port = self.server.add_secure_port(f"{config.host}:{config.port}", secure[0])
        except RuntimeError as exc:
            raise StartupError(f"port (TXMQ_PORT): cannot bind {config.host}:{config.port}") from exc
        if self.port == 0:
            raise StartupError(f"port (TXMQ_PORT): cannot bind {config.host}:{config.port}")
        #: The plaintext health-only server (None unless health_port is set).
        self.health_server: grpc.aio.Server | None = None
        self.health_port = -1
        if config.health_port >= 0:
            self.health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
            try:
                self.health_port = self.health_server.add_insecure_port(f"{config.host}:{config.health_port}")
            except RuntimeError as exc:
                raise StartupError(f"health_port (TXMQ_HEALTH_PORT): cannot bind {config.host}:{config.health_port}") \
                    from exc
        self.metrics_port = -1
        self.on_start: list[Hook] = []
        self.on_stop: list[Hook] = []
        #: Of STOP_SECONDS, what the stop hooks keep: the gRPC grace is cut to leave it.
        self.stop_reserve_seconds = 1.0
        #: Set as the stop begins: the moment the stop hooks' steps share (STOP_SECONDS).
        self.stop_deadline: Deadline | None = None
        self._periodic: list[tuple[str, float, Hook]] = []
        self._tasks: list[asyncio.Task[None]] = []

    def every(self, name: str, interval_seconds: float, job: Hook) -> None:
        """Runs ``job`` every ``interval_seconds`` while the service runs (started after the
        start hooks, cancelled before the stop hooks). A failing round is logged and the
        next one runs."""
        self._periodic.append((name, interval_seconds, job))

    async def _repeat(self, name: str, interval: float, job: Hook) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:  # one failed round must not end the loop
                log.exception("periodic job %s failed", name)

    async def _set_health(self, status: int) -> None:
        for service in ["", *self.service_names]:
            result = self.health.set(service, status)
            if inspect.isawaitable(result):  # the asyncio servicer's
                await result

    async def start(self) -> None:
        await self.server.start()
        if self.health_server is not None:
            await self.health_server.start()
        self.metrics_port = self.metrics.serve(self.config.host, self.config.metrics_port)
        for hook in self.on_start:
            await hook()
        self._tasks = [asyncio.create_task(self._repeat(name, interval, job), name=name)
                       for name, interval, job in self._periodic]
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra={"fields": {"port": self.port, "metrics_port": self.metrics_port,
                                              "health_port": self.health_port,
                                              "tls": self.certificates is not None}})

    async def stop(self, grace: float | None = None) -> None:
        """NOT_SERVING first (load balancers stop sending), then the server with a grace
        period for calls in flight, then the service's own hooks: within STOP_SECONDS of
        the start (:attr:`stop_deadline`, which the hooks' steps share), the grace cut to
        leave the hooks :attr:`stop_reserve_seconds`."""
        deadline = self.stop_deadline = Deadline(STOP_SECONDS)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        grace = min(grace, max(STOP_SECONDS - self.stop_reserve_seconds, 0.0))
        await step_within("grpc server", grace + SERVER_STOP_SLACK_SECONDS, self.server.stop(grace), deadline)
        if self.health_server is not None:
            await step_within("health server", SERVER_STOP_SLACK_SECONDS, self.health_server.stop(0), deadline)
        for task in self._tasks:
            task.cancel()
        await step_within("periodic jobs", PERIODIC_STOP_SECONDS,
                          asyncio.gather(*self._tasks, return_exceptions=True), deadline)
        for hook in reversed(self.on_stop):
            try:
                await hook()
            except Exception:  # keep stopping the rest
                log.exception("stop hook failed")
        self.metrics.close()

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()
