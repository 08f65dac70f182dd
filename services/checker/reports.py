"""What the checker tells a check's broker, and counts, as the check goes (``dispatcher``):
UNDELIVERED (no stream took it, it was not started in time, or it went back), DELIVERED (its
producer started it: one unit of check_max spent, and its lag counted), ANSWERED, and late
answers (one for a check no stream holds that names its transaction: reported without a
claim). Each result is counted (txmq_checks_total), and every answer refused — by the broker,
or here before it was reported — under its reason (txmq_check_answers_refused_total).

Which answers are valid is decided here too, purely (``answer_name``, ``refused_reason``).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Protocol

from txmq.errors import InvalidFieldError, TxmqError
from txmq.v1 import broker_pb2, common_pb2

from .streams import ProducerStream, error_response

#: Longest IN_PROGRESS retry-after accepted (the broker caps it by the transaction's lifetime).
MAX_RETRY_AFTER_SECONDS = 365 * 24 * 3600.0

RESULT_NAMES = {
    common_pb2.CHECK_RESULT_COMMIT: "commit",
    common_pb2.CHECK_RESULT_ROLLBACK: "rollback",
    common_pb2.CHECK_RESULT_UNKNOWN: "unknown",
    common_pb2.CHECK_RESULT_IN_PROGRESS: "in_progress",
}

#: Why an answer was refused (the ``reason`` label of txmq_check_answers_refused_total):
#: ``revoked`` names a group the stream lost when its check right was revoked (``standing``).
REFUSED_REASONS = ("conflict", "stale", "not_outstanding", "invalid", "unavailable", "revoked")


class Reporter(Protocol):
    """Where reports about a broker's checks go (batched per broker, in order)."""

    def report(self, broker: str, report: broker_pb2.CheckReport,
               on_error: Callable[[TxmqError], None] | None = None) -> None: ...


class ReportMetrics(Protocol):
    def check_result(self, group: str, result: str) -> None: ...
    def check_lag(self, group: str, seconds: float) -> None: ...
    def answer_refused(self, group: str, reason: str) -> None: ...


def answer_name(result: common_pb2.CheckResult.ValueType, retry_after_seconds: float) -> str:
    """The result of a valid CheckAnswer as txmq_checks_total names it; raises an
    InvalidFieldError for an unknown result, an IN_PROGRESS without a retry-after in range,
    or a retry-after on another result."""
    name = RESULT_NAMES.get(result)
    if name is None:
        raise InvalidFieldError("result", f"must be COMMIT, ROLLBACK, UNKNOWN or IN_PROGRESS, got {result}")
    if result == common_pb2.CHECK_RESULT_IN_PROGRESS:
        if not (math.isfinite(retry_after_seconds) and 0 < retry_after_seconds <= MAX_RETRY_AFTER_SECONDS):
            raise InvalidFieldError("retry_after_seconds",
                                    f"IN_PROGRESS needs a retry-after in (0, {MAX_RETRY_AFTER_SECONDS:.0f}] "
                                    f"seconds, got {retry_after_seconds}")
    elif retry_after_seconds:
        raise InvalidFieldError("retry_after_seconds", "only IN_PROGRESS carries a retry-after")
    return name


def refused_reason(error: TxmqError) -> str:
    """The txmq_check_answers_refused_total reason of a broker's refusal of an answer."""
    if error.reason == "TRANSACTION_STATE_CONFLICT":
        return "conflict"
    if error.reason == "STALE_CLAIM":
        return "stale"
    if error.retryable or error.reason == "BROKER_NOT_FOUND":
        return "unavailable"
    return "invalid"


class CheckReports:
    def __init__(self, reporter: Reporter, metrics: ReportMetrics, answer_timeout_seconds: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.reporter = reporter
        self.metrics = metrics
        #: Told to the broker with each DELIVERED (how long the producer has to answer).
        self.answer_timeout = answer_timeout_seconds
        self.clock = clock

    def undelivered(self, broker: str, task: broker_pb2.CheckTask, group: str, result: str = "undelivered") -> None:
        self.metrics.check_result(group, result)
        self.reporter.report(broker, broker_pb2.CheckReport(
            transaction_id=task.transaction_id, claim_token=task.claim_token,
            outcome=broker_pb2.CHECK_OUTCOME_UNDELIVERED))

    def delivered(self, broker: str, task: broker_pb2.CheckTask, group: str, client_id: str) -> None:
        self.metrics.check_result(group, "delivered")
        self.metrics.check_lag(group, max(self.clock() * 1000 - task.due_at_ms, 0) / 1000)
        self.reporter.report(broker, broker_pb2.CheckReport(
            transaction_id=task.transaction_id, claim_token=task.claim_token,
            outcome=broker_pb2.CHECK_OUTCOME_DELIVERED, producer_client_id=client_id,
            answer_timeout_seconds=self.answer_timeout))

    def answered(self, broker: str, task: broker_pb2.CheckTask, group: str, stream: ProducerStream,
                 check_id: str, result: common_pb2.CheckResult.ValueType, retry_after_seconds: float) -> None:
        """The answer to a check the stream held (``answer_name`` its result's name)."""
        self.metrics.check_result(group, RESULT_NAMES[result])
        self.reporter.report(broker, broker_pb2.CheckReport(
            transaction_id=task.transaction_id, claim_token=task.claim_token,
            outcome=broker_pb2.CHECK_OUTCOME_ANSWERED, result=result,
            retry_after_seconds=retry_after_seconds, producer_client_id=stream.client_id,
            producer_group=group), self._refusal_to(stream, check_id, group))

    def late_answer(self, stream: ProducerStream, check_id: str, result: common_pb2.CheckResult.ValueType,
                    transaction_id: str, broker_name: str, producer_group: str) -> None:
        """An answer for a check the stream does not hold, naming its transaction: a COMMIT or
        ROLLBACK goes to the broker it names without a claim; raises an InvalidFieldError for
        a group the stream does not serve or a broker not named."""
        if producer_group not in stream.groups:
            raise InvalidFieldError("producer_group", f"{producer_group!r} is not a group this stream serves")
        if not broker_name:
            raise InvalidFieldError("broker_name", "required with transaction_id")
        if result not in (common_pb2.CHECK_RESULT_COMMIT, common_pb2.CHECK_RESULT_ROLLBACK):
            return  # a late UNKNOWN or IN_PROGRESS changes nothing
        self.metrics.check_result(producer_group, RESULT_NAMES[result])
        self.reporter.report(broker_name, broker_pb2.CheckReport(
            transaction_id=transaction_id, outcome=broker_pb2.CHECK_OUTCOME_ANSWERED, result=result,
            producer_client_id=stream.client_id, producer_group=producer_group),
            self._refusal_to(stream, check_id, producer_group))

    def _refusal_to(self, stream: ProducerStream, check_id: str, group: str) -> Callable[[TxmqError], None]:
        def refused(error: TxmqError) -> None:
            self.metrics.answer_refused(group, refused_reason(error))
            stream.push(error_response(error, check_id))
        return refused

    def answer_refused(self, stream: ProducerStream, error: TxmqError, check_group: str | None,
                       producer_group: str) -> None:
        """An answer refused here (not outstanding, invalid, naming a group the stream lost by
        a revoke), counted under the group it names (``producer_group``) when the stream lost
        that group, else under its check's group, else the stream's first."""
        if producer_group and stream.lost.get(producer_group) is error:
            group, reason = producer_group, "revoked"
        else:
            group = check_group if check_group is not None else (stream.groups[0] if stream.groups else "")
            field = getattr(error, "field", "")
            reason = "not_outstanding" if field == "check_id" else "invalid"
        self.metrics.answer_refused(group, reason)
