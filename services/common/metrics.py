"""Prometheus plumbing shared by every service: a registry per server, the RPC histogram,
and the /metrics HTTP endpoint beside the gRPC server."""

from __future__ import annotations

from typing import Any, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class BaseMetrics:
    """Owns a registry (so several servers can live in one test process) and the metrics
    every service exports. Services subclass it and add their own."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        self.rpc_duration = Histogram(
            "txmq_rpc_duration_seconds", "Server-side duration of gRPC calls, by method and status code",
            ["service", "method", "code"], buckets=RPC_BUCKETS, registry=self.registry)
        self._quota_refusals = Counter(
            "txmq_quota_refusals_total", "Calls refused at a per-principal quota or limit (nothing created or "
            "held), by the setting that refused them", ["setting"], registry=self.registry)
        self._http: WSGIServer | None = None

    def quota_refusals(self, settings: Iterable[str]) -> dict[str, Any]:
        """``txmq_quota_refusals_total{setting}``: calls refused at a per-principal quota
        (``services.common.auth.quota``) or limit (``services.common.limits``: streams, unary
        calls in flight, long polls, pending checks, live clients), one series per setting of
        this service, exported at 0 from the start (no principal label: the names are the
        tenants' choice, the series would be unbounded). Returns each setting's counter; asked
        again (a replicated broker's servicer is made anew at each leadership it takes), the
        same ones."""
        return {setting: self._quota_refusals.labels(setting) for setting in settings}

    def serve(self, host: str, port: int) -> int:
        """Starts /metrics on ``port`` (0 = ephemeral); returns the bound port, -1 if disabled."""
        if port < 0:
            return -1
        self._http, _thread = start_http_server(port, addr=host, registry=self.registry)
        return self._http.server_port

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
