"""Prometheus plumbing shared by every service: a registry per server, the RPC histogram,
and the /metrics HTTP endpoint beside the gRPC server."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, start_http_server

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
        self._http: WSGIServer | None = None

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
