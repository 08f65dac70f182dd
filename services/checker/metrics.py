"""Checker metrics: check lag (due → acknowledged by a producer), checks by result,
producers connected per group and checks in flight. Labels are groups and results only."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import BaseMetrics

#: Check lag buckets, seconds: sub-second resolution where the target (p99 ≤ 1 s) lies.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60, 300)


class CheckerMetrics(BaseMetrics):
    def __init__(self) -> None:
        super().__init__("checker")
        self.lag = Histogram(
            "txmq_check_lag_seconds", "From when a check was due (broker clock) to its acknowledgement "
            "by a producer, by producer group", ["group"], buckets=LAG_BUCKETS, registry=self.registry)
        self.checks = Counter(
            "txmq_checks_total", "Checks by producer group and result: delivered (acknowledged), "
            "commit, rollback, unknown, in_progress (answers), undelivered (no live producer took it), "
            "timeout (not acknowledged or not answered in answer_timeout_seconds)",
            ["group", "result"], registry=self.registry)
        self.producers_connected = Gauge(
            "txmq_producers_connected", "Producer streams subscribed, by producer group", ["group"],
            registry=self.registry)
        self.checks_in_flight = Gauge(
            "txmq_checks_in_flight", "Checks sent to producers and not yet answered or timed out",
            registry=self.registry)

    # The dispatcher's Metrics protocol.
    def check_result(self, group: str, result: str) -> None:
        self.checks.labels(group, result).inc()

    def check_lag(self, group: str, seconds: float) -> None:
        self.lag.labels(group).observe(seconds)

    def producers(self, group: str, count: int) -> None:
        self.producers_connected.labels(group).set(count)

    def in_flight(self, count: int) -> None:
        self.checks_in_flight.set(count)
