"""The checker's domain: where each claimed check goes, and what becomes of it. Which
producer streams serve which groups, and how many checks each can take (its credit), is
``streams``'s; the groups' credit sums, which the claims read, ``credit``'s; what each
check's broker is told, and what is counted of it, ``reports``'s.

Everything here runs on the checker's event loop and never blocks. A producer stream is
sent no more checks than the credit it granted (``Subscribe.check_credit`` plus every
``CheckCredit`` since): the claim loops ask the broker for no more than a group's free
credit, so checks a group's producers cannot start soon stay due in the broker, unclaimed.
A stream without flow control (``check_credit`` 0, an older SDK) gets ``default_credit``,
given back as its checks end here (answered, handed back or forgotten).

A check's life, from the claim to the broker's report:

    claimed ──no live stream with credit────────────────────────────▶ UNDELIVERED
       │
       ▼ sent on a stream   ──stream closed / not started in answer_timeout──▶ UNDELIVERED
    SENT
       │ CheckReceived: the producer started it     (DELIVERED: one unit of check_max spent)
       ▼
    RECEIVED ──CheckAnswer──▶ ANSWERED (COMMIT / ROLLBACK / UNKNOWN / IN_PROGRESS)
       │ no answer in answer_timeout (from the start)
       ▼
    LATE (counted as a timeout; forgotten lease_seconds later)

A CheckAnswer without a CheckReceived counts as both (DELIVERED, then ANSWERED). An answer
for a check this stream no longer holds (LATE and forgotten, handed back, sent by a checker
that restarted) that names its transaction, broker and group is a late answer: reported
without a claim, it decides the transaction if nobody did (broker.proto CheckOutcome).
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence, TypeVar

from txmq.errors import InvalidFieldError, TxmqError
from txmq.v1 import broker_pb2, checker_pb2, common_pb2

from .credit import GroupCredit
from .reports import CheckReports, Reporter, answer_name
from .streams import Membership, ProducerStream, error_response

log = logging.getLogger(__name__)

SENT, RECEIVED, LATE = "sent", "received", "late"


class Metrics(Protocol):
    def check_result(self, group: str, result: str) -> None: ...
    def check_lag(self, group: str, seconds: float) -> None: ...
    def producers(self, group: str, count: int) -> None: ...
    def in_flight(self, group: str, count: int) -> None: ...
    def credit(self, group: str, free: int) -> None: ...
    def late_answer(self, group: str) -> None: ...
    def answer_refused(self, group: str, reason: str) -> None: ...
    def group_gone(self, group: str) -> None: ...


class NullMetrics:
    def check_result(self, group: str, result: str) -> None:
        pass

    def check_lag(self, group: str, seconds: float) -> None:
        pass

    def producers(self, group: str, count: int) -> None:
        pass

    def in_flight(self, group: str, count: int) -> None:
        pass

    def credit(self, group: str, free: int) -> None:
        pass

    def late_answer(self, group: str) -> None:
        pass

    def answer_refused(self, group: str, reason: str) -> None:
        pass

    def group_gone(self, group: str) -> None:
        pass


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
    #: Monotonic deadline of the current step (start, then answer, then forget).
    deadline: float
    state: str = SENT


def _new_check_id() -> str:
    # Random, so a producer cannot name another stream's check by guessing.
    return os.urandom(12).hex()


class Dispatcher:
    def __init__(self, *, checker_name: str, reporter: Reporter, answer_timeout_seconds: float,
                 lease_seconds: float, queue_size: int, default_credit: int = 64,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.checker_name = checker_name
        self.answer_timeout = answer_timeout_seconds
        self.lease = lease_seconds
        #: Most credit one stream may hold (bounds what is queued for it).
        self.queue_size = queue_size
        self.default_credit = min(default_credit, queue_size)
        self.metrics: Metrics = metrics or NullMetrics()
        self.monotonic = monotonic
        #: What the brokers are told of each check, and what is counted of it.
        self.reports = CheckReports(reporter, self.metrics, answer_timeout_seconds, clock)
        self._ids = itertools.count(1)
        self.streams: dict[int, ProducerStream] = {}
        self.deliveries: dict[str, Delivery] = {}
        #: Per group: the credit its streams announced and what of it is free (the claims').
        self.credit = GroupCredit(self.metrics)
        #: Which streams serve each group (their routing, their credit in the groups' sums).
        self.membership = Membership(self.metrics, self.credit)
        self._flight: collections.Counter[str] = collections.Counter()

    # --- subscriptions and credit --------------------------------------------------------

    def subscribe(self, client_id: str, groups: Iterable[str], credit: int = 0) -> ProducerStream:
        """``credit`` 0: a producer without flow control (the default credit)."""
        if credit < 0:
            raise InvalidFieldError("check_credit", f"must not be negative, got {credit}")
        legacy = credit == 0
        stream = ProducerStream(next(self._ids), client_id, tuple(dict.fromkeys(groups)),
                                self.default_credit if legacy else credit, self.queue_size, legacy)
        self.streams[stream.id] = stream
        self.membership.join(stream, stream.groups)
        log.info("producer subscribed", extra={"fields": {"client_id": client_id, "groups": list(stream.groups),
                                                           "stream": stream.id, "credit": stream.capacity,
                                                           "flow_control": not legacy}})
        self.membership.wake()
        return stream

    def unsubscribe(self, stream: ProducerStream) -> None:
        """The stream ended: checks it had not started are reported UNDELIVERED (due again
        at once, nothing spent); started ones were already reported."""
        if self.streams.pop(stream.id, None) is None:
            return
        stream.close()
        for check_id in list(stream.checks):
            delivery = self.deliveries.pop(check_id)
            if delivery.state != LATE:
                self._flight_change(delivery, -1)
            if delivery.state == SENT:
                self.reports.undelivered(delivery.broker, delivery.task, delivery.group)
        stream.checks.clear()
        if not stream.draining:
            self.membership.leave(stream)
        log.info("producer unsubscribed", extra={"fields": {"client_id": stream.client_id, "stream": stream.id}})

    def drain(self, stream: ProducerStream) -> None:
        """CheckDrain (the producer is leaving but owes answers): the stream gets no more
        checks, the ones it has not started are reported UNDELIVERED at once (nothing
        spent), and the started ones stay outstanding here until answered or expired, so
        their answers still count as answers to them. Repeating it is harmless."""
        if stream.closed or stream.draining:
            return
        for check_id in list(stream.checks):
            delivery = self.deliveries[check_id]
            if delivery.state == SENT:
                self._finish(delivery)
                self.reports.undelivered(delivery.broker, delivery.task, delivery.group)
        self.membership.leave(stream)
        stream.draining = True
        log.info("producer draining", extra={"fields": {"client_id": stream.client_id, "stream": stream.id,
                                                         "answers_owed": len(stream.checks)}})

    def revoke(self, stream: ProducerStream, groups: Iterable[str], refusal: TxmqError) -> int:
        """The stream's principal may check ``groups`` no more (a right revoked: ``standing``).
        It serves them no more; its checks of them — queued, written, started — go back to
        their brokers at once (UNDELIVERED: due now for the group's other producers; a started
        one's unit of check_max stays spent, its producer had it) and their answers are
        refused (not outstanding here); ``refusal`` is sent on it, and ends it once no group is
        left. Returns how many checks went back."""
        lost = set(groups).intersection(stream.groups)
        if not lost or stream.closed:
            return 0
        if not stream.draining:
            self.membership.leave(stream, lost)
        stream.lose(lost, refusal)
        taken = [d for d in map(self.deliveries.__getitem__, stream.checks) if d.group in lost]
        stream.withdraw({d.check_id for d in taken}, error_response(refusal))
        for d in taken:
            if d.state != LATE:
                self.reports.undelivered(d.broker, d.task, d.group, "revoked")
            self._finish(d)
        if not stream.groups:
            stream.refusal = refusal
            self.unsubscribe(stream)
        return len(taken)

    def readmit(self, stream: ProducerStream, groups: Iterable[str]) -> tuple[str, ...]:
        """The stream's principal may check ``groups`` again (a right granted again:
        ``standing``): those of them it subscribed to and lost by a revoke serve it again, as
        if it had subscribed again — its checks routed to it within its credit, its capacity
        and free credit in the groups' sums, answers naming them accepted. Never a group it
        did not subscribe to (so never more than ``max_groups_per_stream``); nothing for a
        stream ended or draining. Returns the groups brought back."""
        back = tuple(g for g in dict.fromkeys(groups) if g in stream.lost)
        if not back or stream.closed or stream.draining:
            return ()
        stream.regain(back)
        self.membership.join(stream, back)
        self.membership.wake()
        return back

    def grant(self, stream: ProducerStream, checks: int) -> None:
        """More credit for the stream (CheckCredit); raises InvalidFieldError when not positive."""
        if checks <= 0:
            raise InvalidFieldError("credit", f"must be positive, got {checks}")
        self.membership.give_back(stream, checks)

    # --- dispatch ------------------------------------------------------------------------

    def dispatch(self, broker: str, tasks: Iterable[broker_pb2.CheckTask]) -> int:
        """Sends each claimed check to a stream of its group with credit; returns how many
        were sent. A check no stream can take is reported UNDELIVERED at once."""
        queued = 0
        now = self.monotonic()
        for task in tasks:
            group = task.message.producer_group
            members, start = self.membership.route(group)
            check_id = _new_check_id()
            request = checker_pb2.CheckTransactionStateResponse(check=checker_pb2.CheckRequest(
                check_id=check_id, transaction_id=task.transaction_id, message=task.message,
                attempt=task.attempt, broker_name=task.broker_name or broker,
                answer_timeout_seconds=self.answer_timeout))
            for stream in route_order(members, lambda s: s.client_id, task.message.producer_client_id, start):
                if stream.offer_check(request):
                    self.membership.took(stream)
                    delivery = Delivery(check_id, broker, task, group, stream, deadline=now + self.answer_timeout)
                    self.deliveries[check_id] = delivery
                    self._flight_change(delivery, +1)
                    stream.checks.add(check_id)
                    queued += 1
                    break
            else:
                self.reports.undelivered(broker, task, group)
        return queued

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
        """CheckReceived (the producer started the check): reported DELIVERED (spends one
        unit of check_max); the answer timeout starts. Repeating it is harmless. Raises a
        TxmqError (and changes nothing) for a check not outstanding here."""
        delivery = self._outstanding(stream, check_id)
        if delivery.state == SENT:
            self._delivered(delivery)

    def _delivered(self, d: Delivery) -> None:
        d.state = RECEIVED
        d.deadline = self.monotonic() + self.answer_timeout
        self.reports.delivered(d.broker, d.task, d.group, d.stream.client_id)

    def answered(self, stream: ProducerStream, check_id: str, result: common_pb2.CheckResult.ValueType,
                 retry_after_seconds: float, *,
                 transaction_id: str = "", broker_name: str = "", producer_group: str = "") -> None:
        """CheckAnswer: reported ANSWERED. An answer for a check this stream does not hold
        that names its transaction, broker and group goes to the broker as a late answer.
        A refusal by the broker (a decision against the first one) comes back on the
        stream as an error. One naming a group revoked from the stream raises what the
        stream was told of the revoke; one naming another group than its check's, an
        InvalidFieldError."""
        answer_name(result, retry_after_seconds)  # raises for an invalid answer
        delivery = self.deliveries.get(check_id) if check_id else None
        if delivery is None or delivery.stream is not stream:
            if producer_group in stream.lost:
                raise stream.lost[producer_group]  # revoked: its checks here were finished
            if not transaction_id:
                self._outstanding(stream, check_id)  # raises: not outstanding here
            self.reports.late_answer(stream, check_id, result, transaction_id, broker_name, producer_group)
            return
        if producer_group and producer_group != delivery.group:
            raise InvalidFieldError("producer_group", f"{producer_group!r} is not the group of check {check_id!r}")
        if delivery.state == SENT:
            self._delivered(delivery)
        self._finish(delivery)
        self.reports.answered(delivery.broker, delivery.task, delivery.group, stream, check_id, result,
                              retry_after_seconds)

    def refused(self, stream: ProducerStream, check_id: str, error: TxmqError, *, answer: bool = False,
                producer_group: str = "") -> None:
        """A request on the stream refused here (not outstanding, invalid, naming a group
        the stream lost by a revoke); an answer among them is counted, under the group it
        names (``producer_group``) when the stream lost that group."""
        if answer:
            delivery = self.deliveries.get(check_id) if check_id else None
            self.reports.answer_refused(stream, error, delivery.group if delivery is not None else None,
                                        producer_group)
        stream.push(error_response(error, check_id))

    def _finish(self, d: Delivery) -> None:
        if self.deliveries.pop(d.check_id, None) is None:
            return
        d.stream.checks.discard(d.check_id)
        if d.state != LATE:
            self._flight_change(d, -1)
        if d.stream.legacy:
            self.membership.give_back(d.stream, 1)  # no flow control: its credit comes back here

    def _flight_change(self, d: Delivery, delta: int) -> None:
        self._flight[d.group] += delta
        self.metrics.in_flight(d.group, self._flight[d.group])

    # --- time ----------------------------------------------------------------------------

    def expire(self) -> None:
        """Checks past their deadline: ones not started are reported UNDELIVERED (the
        producer is stuck or gone; another one of the group gets them), unanswered ones
        count as timeouts and are forgotten ``lease_seconds`` later (a later answer that
        names its transaction still counts)."""
        now = self.monotonic()
        for d in [d for d in self.deliveries.values() if d.deadline <= now]:
            if d.state == SENT:
                self._finish(d)
                self.reports.undelivered(d.broker, d.task, d.group, "timeout")
            elif d.state == RECEIVED:
                d.state = LATE
                d.deadline = now + self.lease
                self.metrics.check_result(d.group, "timeout")
                self._flight_change(d, -1)
            else:
                self._finish(d)

    def next_deadline(self) -> float | None:
        return min((d.deadline for d in self.deliveries.values()), default=None)

    def close(self) -> None:
        """Shutdown: every stream ends and its unstarted checks are reported UNDELIVERED."""
        for stream in list(self.streams.values()):
            self.unsubscribe(stream)
