"""The check-stream protocol without I/O: the producer's side of
``CheckerService.CheckTransactionState``, shared by the thread driver (``txmq._checks``),
the asyncio driver (``txmq.aio._checks``) and, for the stream itself, the proxy's check
relay (``services.proxy.checks``), in the manner of ``_sending``.

The drivers own the I/O — gRPC calls, threads or tasks, the queue each stream's requests
wait in (its *outbox*) — and tell the core what happened; the core says what to send
and keeps every decision::

    driver                                  core
    ListCheckers answered        ──▶  CheckAnswering.refreshed(live) → streams to open, to close
    stream opening               ──▶  CheckStream.open(put) → the Subscribe to send first
    a response read              ──▶  CheckStream.classify(response) → Check / Subscribed / Refused
    Subscribed                   ──▶  CheckStream.subscribed(name) (+ the late answers, queued)
    a worker starts a check      ──▶  CheckAnswering.started(...) (CheckReceived, this session only)
    check_local_transaction done ──▶  CheckAnswering.answered(...) (the answer, or a late answer)
    the stream ended             ──▶  CheckAnswering.ended(stream) → the pause before reopening

**Flow control.** Each stream grants ``CHECK_CREDIT_PER_THREAD ×`` the workers (threads or
concurrent coroutines) at subscribe and one more with every answer, so a checker never
sends more checks than the workers can start soon; the rest stay due in the broker.

**What counts as received.** A check counts against the broker's ``check_max`` (and its
answer timeout runs) from when a worker *starts* it: CheckReceived is sent then, and only
on the stream (the *session*) that brought it — a check of an earlier session was handed
back by the checker when that stream ended.

**Late answers.** An answer whose stream ended meanwhile names its transaction, broker and
group and goes, as a late answer (no credit), on the next subscribed stream to any
checker, where it still decides the transaction if nobody did; undecided answers (UNKNOWN,
IN_PROGRESS) of an ended stream are dropped (the check comes again). Until a stream is
subscribed, up to ``MAX_UNSENT_ANSWERS`` late answers wait (the oldest goes first past it).

**The resend window.** gRPC says nothing of what reached the checker, so whenever a stream
ends — it failed, the checker left the list, or the producer is closing — the decisions
queued on it in the last ``RESEND_WINDOW_SECONDS`` go again as late answers: a repeated
decision changes nothing. (The asyncio driver used not to resend when the stream ended
because its checker left; both now do, since the checker that left may have read none of
them.)

**Orphans and open transactions.** :func:`answer_locally` is what a producer answers
without asking the application: ROLLBACK for an orphan of a send it gave up on (its local
transaction never ran), IN_PROGRESS for a transaction still open in this process.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Container, Mapping, Sequence

from ._errors import InvalidFieldError, TxmqError, error_from_entry
from ._types import LocalTransactionState, Message, TransactionMessage, message_from_pb
from .v1 import checker_pb2, common_pb2

log = logging.getLogger(__name__)

Request = checker_pb2.CheckTransactionStateRequest
#: Queues a request on a stream's outbox (never blocks).
Put = Callable[[Request], None]

_RESULTS = {
    LocalTransactionState.COMMIT: common_pb2.CHECK_RESULT_COMMIT,
    LocalTransactionState.ROLLBACK: common_pb2.CHECK_RESULT_ROLLBACK,
    LocalTransactionState.UNKNOWN: common_pb2.CHECK_RESULT_UNKNOWN,
}
#: First and longest pause before opening a failed checker stream again.
RECONNECT_BACKOFF_SECONDS = 0.1
RECONNECT_BACKOFF_MAX_SECONDS = 5.0
#: Credit per check worker each checker stream grants: the running checks plus a short
#: queue, so a worker that frees up finds the next check waiting while more are claimed.
CHECK_CREDIT_PER_THREAD = 8
#: Answers kept while no checker stream is subscribed (the oldest goes first past it).
MAX_UNSENT_ANSWERS = 10_000
#: Decisions queued this long before their stream ended are sent again on the next one.
RESEND_WINDOW_SECONDS = 10.0
DECISIONS = (common_pb2.CHECK_RESULT_COMMIT, common_pb2.CHECK_RESULT_ROLLBACK)


# --- values -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class InProgress:
    """A check answer: the local transaction is still running; ask again after
    ``retry_after_seconds``. Spends none of the check budget (the broker caps the wait by
    its ``max_transaction_lifetime_seconds``, then discards the transaction)."""

    retry_after_seconds: float

    def __post_init__(self) -> None:
        value = self.retry_after_seconds
        if not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
            raise InvalidFieldError("retry_after_seconds", f"must be a positive number, got {value!r}")


@dataclass(frozen=True, slots=True)
class CheckMessage(TransactionMessage):
    """The half message a check asks about, as ``check_local_transaction`` receives it:
    a :class:`TransactionMessage` plus which check this is."""

    #: 1 for the first check of the transaction; a check that is repeated because its
    #: answer was lost keeps its number.
    attempt: int = 1
    #: The checker that asked.
    checker_name: str = ""


def answer_for(outcome: Any) -> tuple[common_pb2.CheckResult.ValueType, float]:
    """``check_local_transaction``'s return value → (CheckResult, retry_after_seconds)."""
    if isinstance(outcome, InProgress):
        return common_pb2.CHECK_RESULT_IN_PROGRESS, float(outcome.retry_after_seconds)
    if isinstance(outcome, LocalTransactionState):
        return _RESULTS[outcome], 0.0
    return common_pb2.CHECK_RESULT_UNKNOWN, 0.0


def check_answer(check: checker_pb2.CheckRequest, outcome: Any, producer_group: str) -> checker_pb2.CheckAnswer:
    """The answer to ``check`` for what ``check_local_transaction`` returned (anything but a
    LocalTransactionState or InProgress is UNKNOWN, and logged), granting one credit back."""
    if outcome is not None and not isinstance(outcome, (LocalTransactionState, InProgress)):
        log.warning("check_local_transaction returned %r for transaction %s, neither a "
                    "LocalTransactionState nor txmq.InProgress: answering UNKNOWN", outcome, check.transaction_id)
    result, retry_after = answer_for(outcome)
    return checker_pb2.CheckAnswer(
        check_id=check.check_id, result=result, retry_after_seconds=retry_after,
        transaction_id=check.transaction_id, broker_name=check.broker_name,
        producer_group=check.message.producer_group or producer_group, credit=1)


def check_message(check: checker_pb2.CheckRequest, checker_name: str) -> CheckMessage:
    message: Message = message_from_pb(check.message)
    return CheckMessage(message=message, message_id=check.message.message_id,
                        transaction_id=check.transaction_id, broker_name=check.broker_name,
                        queue_id=check.message.queue_id, attempt=check.attempt, checker_name=checker_name)


def answer_locally(message: TransactionMessage, abandoned: Container[str], open_here: Container[str],
                   open_retry_seconds: float) -> "LocalTransactionState | InProgress | None":
    """What a producer answers a check without asking the application, or None to ask it:
    ROLLBACK for the orphan of a send attempt it gave up on (its local transaction never
    ran), IN_PROGRESS while the transaction is still open in this process (a half being
    sent, an explicit transaction, a listener's local transaction running, a multi-message
    one being sent)."""
    if message.message_id in abandoned:
        log.info("check of transaction %s: its half message %s was an attempt given up on, "
                 "the local transaction never ran: ROLLBACK", message.transaction_id, message.message_id)
        return LocalTransactionState.ROLLBACK
    if message.message_id in open_here:
        return InProgress(retry_after_seconds=open_retry_seconds)
    return None


# --- one stream ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Check:
    """A check the checker sent on session ``session``."""
    check: checker_pb2.CheckRequest
    session: int


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The checker accepted the subscription; ``checker_name`` is its own name for itself."""
    checker_name: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The checker refused a request on the stream (logged at ``level``)."""
    error: TxmqError
    level: int


Event = Check | Subscribed | Refused


class Backoff:
    """Exponential reconnect pauses with jitter, reset once a stream is subscribed."""

    def __init__(self, first: float = RECONNECT_BACKOFF_SECONDS, most: float = RECONNECT_BACKOFF_MAX_SECONDS,
                 jitter: Callable[[], float] = random.random) -> None:
        self.first, self.most, self._jitter = first, most, jitter
        self._next = first

    def reset(self) -> None:
        self._next = self.first

    def pause(self) -> float:
        """The pause before the next attempt (half to one and a half times the current
        step), doubling the step up to ``most``."""
        pause = self._next * (0.5 + self._jitter())
        self._next = min(self._next * 2, self.most)
        return pause


class CheckStream:
    """One subscription at one checker: the stream's session, its outbox while open, whether
    it is subscribed, its reconnect backoff and whether it is failing (so a driver logs a
    failure once and its recovery once). Thread-safe."""

    def __init__(self, address: str, checker_name: str, *, producer_groups: Sequence[str], client_id: str,
                 credit: int) -> None:
        self.address = address
        self.checker_name = checker_name
        self.producer_groups = tuple(producer_groups)
        self.client_id = client_id
        self.credit = credit
        self.backoff = Backoff()
        #: Counts the streams opened: a check's CheckReceived and credit go only to its own.
        self.session = 0
        self.failing = False
        self._subscribed = False
        self._put: Put | None = None
        self._lock = threading.Lock()

    @property
    def is_subscribed(self) -> bool:
        return self._subscribed

    def subscribe_request(self) -> Request:
        return Request(subscribe=checker_pb2.Subscribe(producer_groups=list(self.producer_groups),
                                                       client_id=self.client_id, check_credit=self.credit))

    def open(self, put: Put) -> tuple[int, Request]:
        """A new stream whose requests go to ``put``: (its session, the Subscribe to send
        first)."""
        with self._lock:
            self.session += 1
            self._put, self._subscribed = put, False
            return self.session, self.subscribe_request()

    def classify(self, response: checker_pb2.CheckTransactionStateResponse, session: int) -> Event | None:
        kind = response.WhichOneof("command")
        if kind == "check":
            return Check(response.check, session)
        if kind == "subscribed":
            return Subscribed(response.subscribed.checker_name or self.checker_name)
        if kind == "error":
            error = error_from_entry(response.error)
            # A check the checker handed back before a worker started it: expected.
            level = logging.DEBUG if getattr(error, "field", "") == "check_id" else logging.WARNING
            return Refused(error, level)
        return None

    def subscribed(self, checker_name: str) -> bool:
        """The stream is subscribed; True when it had been failing (log its recovery)."""
        with self._lock:
            self.checker_name = checker_name
            self._subscribed = True
        self.backoff.reset()
        was, self.failing = self.failing, False
        return was

    def failed(self) -> bool:
        """The stream failed; True for the first failure of a run (log it)."""
        was, self.failing = self.failing, True
        return not was

    def send(self, request: Request, session: int | None = None) -> bool:
        """Queues ``request`` on the open stream (of ``session``, when given); False when
        that stream ended."""
        with self._lock:
            if self._put is None or (session is not None and session != self.session):
                return False
            self._put(request)
            return True

    def send_subscribed(self, request: Request) -> bool:
        """Queues ``request`` on the stream if it is open and subscribed."""
        with self._lock:
            if self._put is None or not self._subscribed:
                return False
            self._put(request)
            return True

    def end(self) -> None:
        """The stream ended: nothing more is queued on it."""
        with self._lock:
            self._put, self._subscribed = None, False


# --- a producer's answering ---------------------------------------------------------------

class CheckAnswering:
    """A producer's answering of checks over every checker: which checkers it keeps a
    stream to, what CheckReceived and answers go where, late answers and the resend
    window. Thread-safe; ``clock`` is monotonic seconds."""

    def __init__(self, *, producer_group: str, client_id: str, workers: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.producer_group = producer_group
        self.client_id = client_id
        #: Credit each checker stream grants at subscribe (see the module's docstring).
        self.credit = CHECK_CREDIT_PER_THREAD * workers
        self._clock = clock
        self._lock = threading.Lock()
        self._streams: dict[str, CheckStream] = {}
        #: Per stream, the decisions queued on its current session: (clock time, request).
        self._recent: dict[CheckStream, collections.deque[tuple[float, Request]]] = {}
        #: Late answers waiting for any subscribed stream.
        self._unsent: collections.deque[Request] = collections.deque()
        self.closing = False

    # --- the checkers ----------------------------------------------------------------------

    def refreshed(self, live: Mapping[str, str]) -> tuple[list[CheckStream], list[CheckStream]]:
        """The checkers listed now (address → name): (streams to open, streams to close).
        Nothing opens once closing."""
        with self._lock:
            if self.closing:
                return [], []
            gone = [self._streams.pop(a) for a in [a for a in self._streams if a not in live]]
            new = []
            for address, name in live.items():
                if address not in self._streams:
                    stream = CheckStream(address, name, producer_groups=[self.producer_group],
                                         client_id=self.client_id, credit=self.credit)
                    self._streams[address] = stream
                    new.append(stream)
        return new, gone

    def close(self) -> list[CheckStream]:
        """Closing: every stream, to close."""
        with self._lock:
            self.closing = True
            streams, self._streams = list(self._streams.values()), {}
        return streams

    @property
    def connected(self) -> list[str]:
        """Names of the checkers subscribed with now."""
        with self._lock:
            streams = list(self._streams.values())
        return sorted(s.checker_name for s in streams if s.is_subscribed)

    # --- one stream's life -----------------------------------------------------------------

    def subscribed(self, stream: CheckStream, checker_name: str) -> bool:
        """``stream`` is subscribed: the late answers waiting go on it. True when it had been
        failing (log its recovery)."""
        recovered = stream.subscribed(checker_name)
        with self._lock:
            unsent, self._unsent = list(self._unsent), collections.deque()
        for late in unsent:
            if not stream.send(late):
                self.send_late(late)
        return recovered

    def ended(self, stream: CheckStream) -> float:
        """``stream`` ended (failed, its checker left, or closing): the decisions queued on it
        within the resend window go again as late answers. Returns the pause before it
        opens again."""
        with self._lock:  # with answered(): a decision is either recorded here or sent late
            stream.end()
            recent = self._recent.pop(stream, ())
        horizon = self._clock() - RESEND_WINDOW_SECONDS
        for at, request in recent:
            if at >= horizon:
                again = Request()
                again.CopyFrom(request)
                again.answer.credit = 0
                self.send_late(again)
        return stream.backoff.pause()

    # --- checks ----------------------------------------------------------------------------

    def started(self, stream: CheckStream, check: checker_pb2.CheckRequest, session: int) -> bool:
        """A worker starts ``check``: CheckReceived on its own session (False when that
        stream ended: the checker handed the check back, but the worker still answers it,
        a decision as a late answer)."""
        return stream.send(Request(received=checker_pb2.CheckReceived(check_id=check.check_id)), session)

    def answered(self, stream: CheckStream, check: checker_pb2.CheckRequest, outcome: Any, session: int) -> None:
        """``check_local_transaction`` returned ``outcome``: the answer on the check's own
        session, or, that stream having ended, as a late answer when it decides."""
        answer = check_answer(check, outcome, self.producer_group)
        request = Request(answer=answer)
        decision = answer.result in DECISIONS
        with self._lock:
            sent = stream.send(request, session)
            if sent and decision:
                now = self._clock()
                recent = self._recent.setdefault(stream, collections.deque())
                recent.append((now, request))
                while recent and recent[0][0] < now - RESEND_WINDOW_SECONDS:
                    recent.popleft()
        if sent:
            return
        if decision:  # the stream that sent the check ended; a new one started with fresh credit
            request.answer.credit = 0
            self.send_late(request)

    def send_late(self, request: Request) -> None:
        """On any subscribed stream, or kept until one is."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            if stream.send_subscribed(request):
                return
        with self._lock:
            self._unsent.append(request)
            while len(self._unsent) > MAX_UNSENT_ANSWERS:
                dropped = self._unsent.popleft()
                log.warning("no checker reachable: check answer for transaction %s dropped (it is "
                            "asked for again)", dropped.answer.transaction_id)

    @property
    def unsent(self) -> int:
        """Late answers waiting for a subscribed stream."""
        return len(self._unsent)
