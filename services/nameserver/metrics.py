"""Name server metrics: the shared RPC histogram plus the live registrations."""

from __future__ import annotations

from typing import Callable

from prometheus_client import Gauge

from services.common.metrics import BaseMetrics


class NameServerMetrics(BaseMetrics):
    def __init__(self) -> None:
        super().__init__("nameserver")
        self.brokers_registered = Gauge(
            "txmq_nameserver_brokers", "Brokers registered and not expired", registry=self.registry)
        self.checkers_registered = Gauge(
            "txmq_nameserver_checkers", "Checkers registered and not expired", registry=self.registry)

    def observe_registry(self, live_brokers: Callable[[], int], live_checkers: Callable[[], int]) -> None:
        """Reads the counts at scrape time, so expiry shows without a registry read."""
        self.brokers_registered.set_function(live_brokers)
        self.checkers_registered.set_function(live_checkers)
