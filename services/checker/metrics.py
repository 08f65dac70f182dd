"""Checker metrics: check lag (due → started by a producer), checks by result, producers
connected, checks in flight, free producer credit, late answers accepted, answers
refused (by reason) and the resolver's answers (by why), per group. Labels are groups,
results, reasons and sources only."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import BaseMetrics

from .reports import REFUSED_REASONS

#: Results only a check claimed from a broker is counted with (the dispatcher's).
_CLAIMED = frozenset({"delivered", "undelivered", "timeout", "revoked"})
#: Check lag buckets, seconds: sub-second resolution where the target (p99 ≤ 1 s) lies.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60, 300)


class CheckerMetrics(BaseMetrics):
    def __init__(self) -> None:
        super().__init__("checker")
        self.lag = Histogram(
            "txmq_check_lag_seconds", "From when a check was due (broker clock) to when a producer "
            "started it, by producer group", ["group"], buckets=LAG_BUCKETS, registry=self.registry)
        self.checks = Counter(
            "txmq_checks_total", "Checks by producer group and result: delivered (started by a producer), "
            "commit, rollback, unknown, in_progress (answers), undelivered (no live producer took it), "
            "timeout (not started or not answered in answer_timeout_seconds), revoked (handed back: the "
            "stream's principal lost its check right on the group)",
            ["group", "result"], registry=self.registry)
        self.producers_connected = Gauge(
            "txmq_producers_connected", "Producer streams subscribed, by producer group", ["group"],
            registry=self.registry)
        self.checks_in_flight = Gauge(
            "txmq_checks_in_flight", "Checks sent to producers and not yet answered or timed out, by "
            "producer group", ["group"], registry=self.registry)
        self.credit_free = Gauge(
            "txmq_check_credit_free", "Checks the group's producers can take now (credit they granted "
            "and this checker has not used), by producer group", ["group"], registry=self.registry)
        self.late_answers = Counter(
            "txmq_check_answers_late_total", "Answers accepted after their check's answer timeout, "
            "re-claim or checker restart (they still decide the transaction), by producer group",
            ["group"], registry=self.registry)
        self.answers_refused = Counter(
            "txmq_check_answers_refused_total", "Producer answers refused, by producer group and reason: "
            "conflict (against the transaction's decision), stale (a claim no longer current), "
            "not_outstanding (a check id this stream does not hold), invalid, unavailable (the broker "
            "could not be reached), revoked (a group the stream lost when its check right was revoked)",
            ["group", "reason"], registry=self.registry)
        self.resolver_answers = Counter(
            "txmq_resolver_answers_total", "Checks the resolver answered from a group's decisions table, "
            "by producer group and why: committed (a COMMIT row lists the half), not_listed, fenced (it "
            "inserted the fence: rollback), fence_found, stale (its fence met a half the broker had "
            "committed and went again), locked (in progress), unavailable (the database failed), "
            "no_key, not_anchored (a message the table does not decide: unknown)",
            ["group", "source"], registry=self.registry)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        #: Groups a check claimed from a broker was counted for: their series stay. (Answers,
        #: late ones, and refusals are not enough: a stream sends those for any group it names.)
        self._counted: set[str] = set()
        self._gauges = (self.producers_connected, self.checks_in_flight, self.credit_free)

    def _child(self, metric: Any, *labels: str) -> Any:
        # ``labels()`` costs microseconds; these run several times per check.
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def group_gone(self, group: str) -> None:
        """The group's last producer stream left: its gauges go, and its other series too
        unless a check claimed from a broker was counted for it. Group names are what the
        producers subscribe (any name a prefix right allows): kept, every name ever
        subscribed stayed a dozen series for good."""
        for key in [k for k in self._children if k[1][:1] == (group,)]:
            metric, labels = key
            if metric in self._gauges or group not in self._counted:
                del self._children[key]
                metric.remove(*labels)

    # The dispatcher's Metrics protocol.
    def check_result(self, group: str, result: str) -> None:
        if result in _CLAIMED:
            self._counted.add(group)
        self._child(self.checks, group, result).inc()

    def check_lag(self, group: str, seconds: float) -> None:
        self._counted.add(group)
        self._child(self.lag, group).observe(seconds)

    def producers(self, group: str, count: int) -> None:
        self._child(self.producers_connected, group).set(count)
        if (self.late_answers, (group,)) not in self._children:
            # Every series of the group from its first producer on, at 0 until it counts.
            self._child(self.late_answers, group)
            for reason in REFUSED_REASONS:
                self._child(self.answers_refused, group, reason)

    def in_flight(self, group: str, count: int) -> None:
        self._child(self.checks_in_flight, group).set(count)

    def credit(self, group: str, free: int) -> None:
        self._child(self.credit_free, group).set(free)

    def late_answer(self, group: str) -> None:
        self._child(self.late_answers, group).inc()

    def answer_refused(self, group: str, reason: str) -> None:
        self._child(self.answers_refused, group, reason).inc()

    def resolver_answer(self, group: str, source: str) -> None:
        self._counted.add(group)  # the resolver's groups are the operator's configuration
        self._child(self.resolver_answers, group, source).inc()
