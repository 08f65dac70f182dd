"""Answering checks: the producer's side of ``CheckerService.CheckTransactionState``.

A :class:`TransactionProducer` serves its producer group to every checker registered with
the name servers (RocketMQ's broker dials the producer; here the producer dials the
checkers, so the broker never needs a route to it)::

    discovery thread ── ListCheckers every checker_refresh_seconds ──▶ one connection per checker
    connection thread ── Subscribe(check_credit) ──▶ checker
                      ◀── CheckRequest ──  (never more than the credit granted)
    worker pool (check_threads) ── CheckReceived when it starts a check ──▶
                                   runs listener.check_local_transaction
                                   CheckAnswer (+1 credit) ──▶

Flow control: each stream grants ``CHECK_CREDIT_PER_THREAD × check_threads`` credit at
subscribe and one more with every answer, so a checker never sends more checks than the
workers can start soon; the rest stay due in the broker. A check counts against the
broker's ``check_max`` (and its answer timeout runs) from when a worker starts it, not from
when it arrived.

No answer is thrown away: an answer whose stream ended meanwhile (the checker restarted or
left) names its transaction, broker and group and goes out on the next subscribed stream
to any checker, where it still decides the transaction if nobody did. So do the decisions
queued on a stream in the ``RESEND_WINDOW_SECONDS`` before it failed (gRPC says nothing of
what reached the checker; a decision repeated changes nothing).

A connection that fails is opened again with exponential backoff (with jitter) for as long
as the checker is listed; a checker that leaves the list is disconnected.

What ``check_local_transaction`` may return:

- ``LocalTransactionState.COMMIT`` / ``ROLLBACK``: the transaction is decided (source CHECK).
- ``LocalTransactionState.UNKNOWN`` (also ``None``, or an exception, which is logged):
  the check counts against the broker's ``check_max``; the checker asks again later.
- :class:`InProgress` ``(retry_after_seconds=...)``: the local transaction is still running;
  nothing is spent and the next check comes after ``retry_after_seconds`` (capped by the
  broker's ``max_transaction_lifetime_seconds``). RocketMQ has no such answer.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import grpc

from ._client import Client
from ._errors import InvalidFieldError, TxmqError, error_from_entry
from ._types import LocalTransactionState, TransactionMessage, message_from_pb
from .v1 import checker_pb2, checker_pb2_grpc, common_pb2, nameserver_pb2

log = logging.getLogger(__name__)

_RESULTS = {
    LocalTransactionState.COMMIT: common_pb2.CHECK_RESULT_COMMIT,
    LocalTransactionState.ROLLBACK: common_pb2.CHECK_RESULT_ROLLBACK,
    LocalTransactionState.UNKNOWN: common_pb2.CHECK_RESULT_UNKNOWN,
}
#: First and longest pause before opening a failed checker stream again.
RECONNECT_BACKOFF_SECONDS = 0.1
RECONNECT_BACKOFF_MAX_SECONDS = 5.0
#: Credit per check thread each checker stream grants: the running checks plus a short
#: queue, so a worker that frees up finds the next check waiting while more are claimed.
CHECK_CREDIT_PER_THREAD = 8
#: Answers kept while no checker stream is subscribed (the oldest goes first past it).
MAX_UNSENT_ANSWERS = 10_000
#: Decisions queued this long before their stream failed are sent again on the next one.
RESEND_WINDOW_SECONDS = 10.0
_DECISIONS = (common_pb2.CHECK_RESULT_COMMIT, common_pb2.CHECK_RESULT_ROLLBACK)


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


CheckFn = Callable[[TransactionMessage], Any]


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
    return CheckMessage(message=message_from_pb(check.message), message_id=check.message.message_id,
                        transaction_id=check.transaction_id, broker_name=check.broker_name,
                        queue_id=check.message.queue_id, attempt=check.attempt, checker_name=checker_name)


Request = checker_pb2.CheckTransactionStateRequest


class CheckResponder:
    """Keeps a stream open to every live checker and answers its checks."""

    def __init__(self, client: Client, *, producer_group: str, client_id: str, check: CheckFn,
                 check_threads: int, refresh_seconds: float) -> None:
        self._client = client
        self.client = client
        self.producer_group = producer_group
        self.client_id = client_id
        self._check = check
        self.refresh_seconds = refresh_seconds
        #: Credit each checker stream grants at subscribe (see the module's docstring).
        self.check_credit = CHECK_CREDIT_PER_THREAD * check_threads
        self._executor = ThreadPoolExecutor(max_workers=check_threads, thread_name_prefix="txmq-check")
        self._lock = threading.Lock()
        self._connections: dict[str, _CheckerConnection] = {}
        #: Answers whose stream ended, waiting for any subscribed stream.
        self._unsent: collections.deque[Request] = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._discover, name="txmq-checker-discovery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def connected(self) -> list[str]:
        """Names of the checkers this producer is subscribed with now."""
        with self._lock:
            connections = list(self._connections.values())
        return sorted(c.checker_name for c in connections if c.subscribed.is_set())

    def _discover(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.refresh()
                failing = False
            except TxmqError as err:
                if self._stop.is_set():
                    return
                if not failing:
                    log.warning("cannot list the checkers (checks are answered once they can be "
                                "listed): %s", err)
                failing = True
            self._stop.wait(self.refresh_seconds)

    def refresh(self) -> None:
        response = self._client._nameserver_call("ListCheckers", nameserver_pb2.ListCheckersRequest())
        live = {c.address: c.name for c in response.checkers}
        with self._lock:
            if self._stop.is_set():
                return
            gone = [c for a, c in self._connections.items() if a not in live]
            for connection in gone:
                del self._connections[connection.address]
            for address, name in live.items():
                if address not in self._connections:
                    connection = _CheckerConnection(address, name, self)
                    self._connections[address] = connection
                    connection.start()
        for connection in gone:
            log.info("checker %s (%s) left: disconnecting", connection.checker_name, connection.address)
            connection.close()

    def submit(self, check: checker_pb2.CheckRequest, connection: "_CheckerConnection", session: int) -> None:
        try:
            self._executor.submit(self._run_check, check, connection, session)
        except RuntimeError:  # shut down: the checker hands the check to another producer
            pass

    def _run_check(self, check: checker_pb2.CheckRequest, connection: "_CheckerConnection", session: int) -> None:
        if self._stop.is_set():
            return  # closing: not started, so the checker hands it to another producer
        # Started now: the check counts against the budget and its answer timeout runs.
        connection.send(Request(received=checker_pb2.CheckReceived(check_id=check.check_id)), session)
        message = check_message(check, connection.checker_name)
        try:
            outcome = self._check(message)
        except Exception:  # the user's failure is an answer: UNKNOWN
            log.exception("check_local_transaction raised for transaction %s: answering UNKNOWN",
                          check.transaction_id)
            outcome = None
        answer = check_answer(check, outcome, self.producer_group)
        if connection.send(Request(answer=answer), session):
            return
        # The stream that sent the check ended; a new one started with fresh credit.
        if answer.result in _DECISIONS:
            answer.credit = 0
            self._send_late(Request(answer=answer))

    def _send_late(self, request: Request) -> None:
        """On any subscribed stream, or kept until one is."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            if connection.send_any(request):
                return
        with self._lock:
            self._unsent.append(request)
            while len(self._unsent) > MAX_UNSENT_ANSWERS:
                dropped = self._unsent.popleft()
                log.warning("no checker reachable: check answer for transaction %s dropped (it is "
                            "asked for again)", dropped.answer.transaction_id)

    def take_unsent(self) -> list[Request]:
        with self._lock:
            unsent, self._unsent = list(self._unsent), collections.deque()
        return unsent

    def close(self) -> None:
        """Unsubscribes from every checker; checks being answered finish, later ones are
        dropped (the checkers hand them to other producers of the group)."""
        self._stop.set()
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


def _requests(outbox: "queue.SimpleQueue[checker_pb2.CheckTransactionStateRequest | None]",
              ) -> Iterator[checker_pb2.CheckTransactionStateRequest]:
    while True:
        item = outbox.get()
        if item is None:
            return
        yield item


class _CheckerConnection:
    """One checker: its stream, opened again with backoff when it fails."""

    def __init__(self, address: str, checker_name: str, responder: CheckResponder) -> None:
        self.address = address
        self.checker_name = checker_name
        self.responder = responder
        self.subscribed = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self._outbox: queue.SimpleQueue[checker_pb2.CheckTransactionStateRequest | None] | None = None
        #: Counts the streams opened: a check's CheckReceived and credit go only to its own.
        self._session = 0
        #: Decisions queued on the current stream lately: (monotonic time, request).
        self._recent: collections.deque[tuple[float, Request]] = collections.deque()
        self._client = responder.client
        self._tls_generation = self._client.tls_generation()
        self._channel = self._client.new_channel(address)
        self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
        self._thread = threading.Thread(target=self._run, name=f"txmq-checker-{checker_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, request: Request, session: int) -> bool:
        """Queues ``request`` on the stream ``session`` (False when that stream ended)."""
        with self._lock:
            if self._outbox is None or session != self._session:
                return False
            self._outbox.put(request)
            if request.answer.result in _DECISIONS:
                now = time.monotonic()
                self._recent.append((now, request))
                while self._recent and self._recent[0][0] < now - RESEND_WINDOW_SECONDS:
                    self._recent.popleft()
            return True

    def _resend_recent(self) -> None:
        """The stream ended: decisions queued on it lately may not have reached the checker
        (gRPC gives no receipt), so they go again, as late answers, on the next stream. A
        repeated decision changes nothing."""
        with self._lock:
            recent, self._recent = list(self._recent), collections.deque()
        horizon = time.monotonic() - RESEND_WINDOW_SECONDS
        for at, request in recent:
            if at >= horizon:
                again = Request()
                again.CopyFrom(request)
                again.answer.credit = 0
                self.responder._send_late(again)

    def send_any(self, request: Request) -> bool:
        """Queues ``request`` on the current stream if it is subscribed."""
        with self._lock:
            if self._outbox is None or not self.subscribed.is_set():
                return False
            self._outbox.put(request)
            return True

    def _run(self) -> None:
        backoff = RECONNECT_BACKOFF_SECONDS
        failing = False
        responder = self.responder
        while not self._stop.is_set():
            outbox: queue.SimpleQueue[checker_pb2.CheckTransactionStateRequest | None] = queue.SimpleQueue()
            outbox.put(checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
                producer_groups=[responder.producer_group], client_id=responder.client_id,
                check_credit=responder.check_credit)))
            with self._lock:
                if self._stop.is_set():
                    return
                generation = self._client.tls_generation()
                if generation != self._tls_generation:  # rotated TLS files: a new channel
                    self._channel.close()
                    self._tls_generation = generation
                    self._channel = self._client.new_channel(self.address)
                    self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
                call = self._stub.CheckTransactionState(_requests(outbox))
                self._session += 1
                session = self._session
                self._call, self._outbox = call, outbox
            try:
                for response in call:
                    kind = response.WhichOneof("command")
                    if kind == "check":
                        responder.submit(response.check, self, session)
                    elif kind == "subscribed":
                        self.checker_name = response.subscribed.checker_name or self.checker_name
                        self.subscribed.set()
                        for late in responder.take_unsent():
                            outbox.put(late)
                        backoff = RECONNECT_BACKOFF_SECONDS
                        if failing:
                            log.info("checker %s (%s) reachable again", self.checker_name, self.address)
                        failing = False
                    elif kind == "error":
                        error = error_from_entry(response.error)
                        if getattr(error, "field", "") == "check_id":
                            # A check the checker handed back before a worker started it.
                            log.debug("checker %s refused a request: %s", self.checker_name, error)
                        else:
                            log.warning("checker %s refused a request: %s", self.checker_name, error)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                code = exc.code() if hasattr(exc, "code") else None
                if not failing:
                    log.warning("check stream to checker %s (%s) failed (%s), reconnecting: %s",
                                self.checker_name, self.address, code, exc.details() if hasattr(exc, "details") else exc)
                failing = True
            finally:
                with self._lock:
                    self.subscribed.clear()
                    self._outbox = None
                outbox.put(None)
                self._resend_recent()
            self._stop.wait(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_SECONDS)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            call, outbox = self._call, self._outbox
        if outbox is not None:
            outbox.put(None)  # half-close: the checker hands unacknowledged checks back at once
        if call is not None:
            # Give the checker a moment to see the half-close, then cut the stream.
            self._thread.join(timeout=0.5)
            call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._channel.close()
