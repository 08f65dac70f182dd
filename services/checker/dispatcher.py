"""The checker's domain: which producer streams serve which groups, where each claimed
check goes, and what to report to its broker about it.

Everything here runs on the checker's event loop and never blocks: a check is handed to a
stream's bounded outbox (a full outbox means that stream is skipped, so a slow producer
never holds up the others), and reports go to the broker's reporter, which batches them.

A check's life, from the claim to the broker's report:

    claimed ──no live stream with room──────────────────────────────▶ UNDELIVERED
       │
       ▼ queued on a stream  ──stream closed / no CheckReceived in answer_timeout──▶ UNDELIVERED
    SENT
       │ CheckReceived                                 (DELIVERED: one unit of check_max spent)
       ▼
    RECEIVED ──CheckAnswer──▶ ANSWERED (COMMIT / ROLLBACK / UNKNOWN / IN_PROGRESS)
       │ no answer in answer_timeout
       ▼
    LATE (counted as a timeout; a late answer is still reported until lease_seconds more)

A CheckAnswer without a CheckReceived counts as both (DELIVERED, then ANSWERED).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence, TypeVar

from txmq._errors import InvalidFieldError, TxmqError
from txmq.v1 import broker_pb2, checker_pb2, common_pb2

from services.common.errors import entry_status

log = logging.getLogger(__name__)

#: Longest IN_PROGRESS retry-after accepted (the broker caps it by the transaction's lifetime).
MAX_RETRY_AFTER_SECONDS = 365 * 24 * 3600.0

RESULT_NAMES = {
    common_pb2.CHECK_RESULT_COMMIT: "commit",
    common_pb2.CHECK_RESULT_ROLLBACK: "rollback",
    common_pb2.CHECK_RESULT_UNKNOWN: "unknown",
    common_pb2.CHECK_RESULT_IN_PROGRESS: "in_progress",
}

SENT, RECEIVED, LATE = "sent", "received", "late"


class Reporter(Protocol):
    """Where reports about a broker's checks go (batched per broker, in order)."""

    def report(self, broker: str, report: broker_pb2.CheckReport,
               on_error: Callable[[TxmqError], None] | None = None) -> None: ...


class Metrics(Protocol):
    def check_result(self, group: str, result: str) -> None: ...
    def check_lag(self, group: str, seconds: float) -> None: ...
    def producers(self, group: str, count: int) -> None: ...
    def in_flight(self, count: int) -> None: ...


class NullMetrics:
    def check_result(self, group: str, result: str) -> None:
        pass

    def check_lag(self, group: str, seconds: float) -> None:
        pass

    def producers(self, group: str, count: int) -> None:
        pass

    def in_flight(self, count: int) -> None:
        pass


Response = checker_pb2.CheckTransactionStateResponse


class ProducerStream:
    """One subscribed CheckTransactionState stream: its producer instance, its groups and
    the responses waiting to be written. Checks are bounded by ``queue_size``; errors and
    the Subscribed reply are not (they are one per request the producer sent)."""

    def __init__(self, stream_id: int, client_id: str, groups: tuple[str, ...], queue_size: int) -> None:
        self.id = stream_id
        self.client_id = client_id
        self.groups = groups
        self.queue_size = queue_size
        self.closed = False
        #: Check ids sent on this stream and not finished.
        self.checks: set[str] = set()
        self._outbox: collections.deque[Response] = collections.deque()
        self._queued_checks = 0
        self._waiter: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"<ProducerStream {self.id} {self.client_id!r} {list(self.groups)}>"

    @property
    def has_room(self) -> bool:
        return not self.closed and self._queued_checks < self.queue_size

    def offer_check(self, response: Response) -> bool:
        """Queues a check unless the stream is closed or its queue is full."""
        if not self.has_room:
            return False
        self._queued_checks += 1
        self._push(response)
        return True

    def push(self, response: Response) -> None:
        """Queues a reply (not bounded: one per request the producer sent)."""
        if not self.closed:
            self._push(response)

    def _push(self, response: Response) -> None:
        self._outbox.append(response)
        if self._waiter is not None:
            self._waiter()

    def pop(self) -> Response | None:
        """The next response to write, or None when nothing is queued."""
        if not self._outbox:
            return None
        response = self._outbox.popleft()
        if response.WhichOneof("command") == "check":
            self._queued_checks -= 1
        return response

    def set_waiter(self, wake: Callable[[], None] | None) -> None:
        self._waiter = wake

    def close(self) -> None:
        self.closed = True
        self._outbox.clear()
        self._queued_checks = 0
        if self._waiter is not None:
            self._waiter()


S = TypeVar("S")


def route_order(candidates: Sequence[S], client_id_of: Callable[[S], str], preferred_client_id: str,
                start: int) -> list[S]:
    """The order in which to offer a check to the streams of its group: the streams of the
    instance that sent the half message first (in their order), then the others in
    round-robin order from ``start``. Pure, so the routing is testable on its own."""
    preferred = [s for s in candidates if preferred_client_id and client_id_of(s) == preferred_client_id]
    others = [s for s in candidates if not (preferred_client_id and client_id_of(s) == preferred_client_id)]
    if others:
        k = start % len(others)
        others = others[k:] + others[:k]
    return preferred + others


@dataclass(slots=True)
class Delivery:
    check_id: str
    broker: str
    task: broker_pb2.CheckTask
    group: str
    stream: ProducerStream
    #: Monotonic deadline of the current step (acknowledgement, then answer, then forget).
    deadline: float
    state: str = SENT


def _new_check_id() -> str:
    # Random, so a producer cannot name another stream's check by guessing.
    return os.urandom(12).hex()


class Dispatcher:
    def __init__(self, *, checker_name: str, reporter: Reporter, answer_timeout_seconds: float,
                 lease_seconds: float, queue_size: int, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.checker_name = checker_name
        self.reporter = reporter
        self.answer_timeout = answer_timeout_seconds
        self.lease = lease_seconds
        self.queue_size = queue_size
        self.metrics: Metrics = metrics or NullMetrics()
        self.clock = clock
        self.monotonic = monotonic
        self._ids = itertools.count(1)
        self.streams: dict[int, ProducerStream] = {}
        #: group → stream id → stream, in subscription order.
        self.by_group: dict[str, dict[int, ProducerStream]] = {}
        self._rr: dict[str, int] = {}
        self.deliveries: dict[str, Delivery] = {}
        #: Called when a group gains its first stream (claim loops wake up).
        self.on_groups_changed: list[Callable[[], None]] = []

    # --- subscriptions -------------------------------------------------------------------

    def subscribe(self, client_id: str, groups: Iterable[str]) -> ProducerStream:
        stream = ProducerStream(next(self._ids), client_id, tuple(dict.fromkeys(groups)), self.queue_size)
        self.streams[stream.id] = stream
        new_group = False
        for group in stream.groups:
            members = self.by_group.setdefault(group, {})
            new_group = new_group or not members
            members[stream.id] = stream
            self.metrics.producers(group, len(members))
        log.info("producer subscribed", extra={"fields": {"client_id": client_id, "groups": list(stream.groups),
                                                           "stream": stream.id}})
        if new_group:
            for wake in self.on_groups_changed:
                wake()
        return stream

    def unsubscribe(self, stream: ProducerStream) -> None:
        """The stream ended: checks it had not acknowledged are reported UNDELIVERED (due
        again at once, nothing spent); acknowledged ones were already reported."""
        if self.streams.pop(stream.id, None) is None:
            return
        stream.close()
        for group in stream.groups:
            members = self.by_group.get(group)
            if members is not None:
                members.pop(stream.id, None)
                self.metrics.producers(group, len(members))
                if not members:
                    del self.by_group[group]
                    self._rr.pop(group, None)
        for check_id in list(stream.checks):
            delivery = self.deliveries.pop(check_id)
            if delivery.state == SENT:
                self._undelivered(delivery.broker, delivery.task, delivery.group)
        stream.checks.clear()
        self._count_in_flight()
        log.info("producer unsubscribed", extra={"fields": {"client_id": stream.client_id, "stream": stream.id}})

    def claimable_groups(self) -> list[str]:
        """Groups with at least one live stream that has room for a check."""
        return sorted(g for g, members in self.by_group.items() if any(s.has_room for s in members.values()))

    # --- dispatch ------------------------------------------------------------------------

    def dispatch(self, broker: str, tasks: Iterable[broker_pb2.CheckTask]) -> int:
        """Offers each claimed check to a stream of its group; returns how many were queued.
        A check no stream takes is reported UNDELIVERED at once."""
        queued = 0
        now = self.monotonic()
        for task in tasks:
            group = task.message.producer_group
            members = list(self.by_group.get(group, {}).values())
            start = self._rr.get(group, 0)
            self._rr[group] = start + 1
            check_id = _new_check_id()
            request = checker_pb2.CheckTransactionStateResponse(check=checker_pb2.CheckRequest(
                check_id=check_id, transaction_id=task.transaction_id, message=task.message,
                attempt=task.attempt, broker_name=task.broker_name or broker,
                answer_timeout_seconds=self.answer_timeout))
            for stream in route_order(members, lambda s: s.client_id, task.message.producer_client_id, start):
                if stream.offer_check(request):
                    self.deliveries[check_id] = Delivery(check_id, broker, task, group, stream,
                                                         deadline=now + self.answer_timeout)
                    stream.checks.add(check_id)
                    queued += 1
                    break
            else:
                self._undelivered(broker, task, group)
        self._count_in_flight()
        return queued

    def _undelivered(self, broker: str, task: broker_pb2.CheckTask, group: str, result: str = "undelivered") -> None:
        self.metrics.check_result(group, result)
        self.reporter.report(broker, broker_pb2.CheckReport(
            transaction_id=task.transaction_id, claim_token=task.claim_token,
            outcome=broker_pb2.CHECK_OUTCOME_UNDELIVERED))

    # --- the producer's side -------------------------------------------------------------

    def _outstanding(self, stream: ProducerStream, check_id: str) -> Delivery:
        if not check_id:
            raise InvalidFieldError("check_id", "required")
        delivery = self.deliveries.get(check_id)
        if delivery is None or delivery.stream is not stream:
            raise InvalidFieldError("check_id", f"{check_id!r} is not a check outstanding on this stream "
                                                "(never sent here, already answered, or expired)")
        return delivery

    def received(self, stream: ProducerStream, check_id: str) -> None:
        """CheckReceived: reported DELIVERED (spends one unit of check_max). Repeating it is
        harmless. Raises a TxmqError (and changes nothing) for a check not outstanding here."""
        delivery = self._outstanding(stream, check_id)
        if delivery.state == SENT:
            self._delivered(delivery)

    def _delivered(self, d: Delivery) -> None:
        d.state = RECEIVED
        d.deadline = self.monotonic() + self.answer_timeout
        self.metrics.check_result(d.group, "delivered")
        self.metrics.check_lag(d.group, max(self.clock() * 1000 - d.task.due_at_ms, 0) / 1000)
        self.reporter.report(d.broker, broker_pb2.CheckReport(
            transaction_id=d.task.transaction_id, claim_token=d.task.claim_token,
            outcome=broker_pb2.CHECK_OUTCOME_DELIVERED, producer_client_id=d.stream.client_id,
            answer_timeout_seconds=self.answer_timeout))

    def answered(self, stream: ProducerStream, check_id: str, result: int, retry_after_seconds: float) -> None:
        """CheckAnswer: reported ANSWERED. A refusal by the broker (a stale claim, a decision
        against the first one) comes back on the stream as an error."""
        delivery = self._outstanding(stream, check_id)
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
        if delivery.state == SENT:
            self._delivered(delivery)
        self._finish(delivery)
        self.metrics.check_result(delivery.group, name)

        def refused(error: TxmqError, stream: ProducerStream = stream) -> None:
            stream.push(error_response(error, check_id))

        self.reporter.report(delivery.broker, broker_pb2.CheckReport(
            transaction_id=delivery.task.transaction_id, claim_token=delivery.task.claim_token,
            outcome=broker_pb2.CHECK_OUTCOME_ANSWERED, result=result,
            retry_after_seconds=retry_after_seconds, producer_client_id=stream.client_id), refused)

    def _finish(self, d: Delivery) -> None:
        self.deliveries.pop(d.check_id, None)
        d.stream.checks.discard(d.check_id)
        self._count_in_flight()

    # --- time ----------------------------------------------------------------------------

    def expire(self) -> None:
        """Checks past their deadline: unacknowledged ones are reported UNDELIVERED (the
        stream is too slow or gone), unanswered ones count as timeouts and are forgotten
        ``lease_seconds`` later."""
        now = self.monotonic()
        for d in [d for d in self.deliveries.values() if d.deadline <= now]:
            if d.state == SENT:
                self._finish(d)
                self._undelivered(d.broker, d.task, d.group, "timeout")
            elif d.state == RECEIVED:
                d.state = LATE
                d.deadline = now + self.lease
                self.metrics.check_result(d.group, "timeout")
                self._count_in_flight()
            else:
                self._finish(d)

    def next_deadline(self) -> float | None:
        return min((d.deadline for d in self.deliveries.values()), default=None)

    def close(self) -> None:
        """Shutdown: every stream ends and its unacknowledged checks are reported UNDELIVERED."""
        for stream in list(self.streams.values()):
            self.unsubscribe(stream)

    def _count_in_flight(self) -> None:
        self.metrics.in_flight(sum(1 for d in self.deliveries.values() if d.state != LATE))


def error_response(error: TxmqError, check_id: str = "") -> Response:
    """A refused request on the stream; names the check it was about."""
    status = entry_status(error)
    if check_id:
        status.details["check_id"] = json.dumps(check_id)
    return checker_pb2.CheckTransactionStateResponse(error=status)
