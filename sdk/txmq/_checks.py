"""Answering checks with threads: the thread driver of the check-stream core
(``txmq._checking``, whose docstring says the protocol: flow control, what counts as
received, late answers, the resend window). A :class:`TransactionProducer` serves its
producer group to every checker registered with the name servers (RocketMQ's broker dials
the producer; here the producer dials the checkers, so the broker never needs a route to
it)::

    discovery thread ── ListCheckers every checker_refresh_seconds ──▶ one connection per checker
    connection thread ── Subscribe(check_credit) ──▶ checker
                      ◀── CheckRequest ──  (never more than the credit granted)
    worker pool (check_threads) ── CheckReceived when it starts a check ──▶
                                   runs listener.check_local_transaction
                                   CheckAnswer (+1 credit) ──▶

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

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import grpc

from ._checking import (CHECK_CREDIT_PER_THREAD, MAX_UNSENT_ANSWERS, RECONNECT_BACKOFF_MAX_SECONDS,  # noqa: F401
                        RECONNECT_BACKOFF_SECONDS, RESEND_WINDOW_SECONDS, Check, CheckAnswering, CheckMessage,
                        CheckStream, InProgress, Refused, Request, Subscribed, answer_for, check_answer,
                        check_message)
from . import _tracing as tracing
from ._client import Client
from ._errors import TxmqError
from ._types import TransactionMessage
from .v1 import checker_pb2, checker_pb2_grpc, nameserver_pb2

log = logging.getLogger(__name__)

__all__ = ["CheckMessage", "CheckResponder", "InProgress", "answer_for", "check_answer", "check_message"]

CheckFn = Callable[[TransactionMessage], Any]


class CheckResponder:
    """Keeps a stream open to every live checker and answers its checks on a thread pool."""

    def __init__(self, client: Client, *, producer_group: str, client_id: str, check: CheckFn,
                 check_threads: int, refresh_seconds: float) -> None:
        self.client = client
        self.producer_group = producer_group
        self.client_id = client_id
        self._check = check
        self.refresh_seconds = refresh_seconds
        self.core = CheckAnswering(producer_group=producer_group, client_id=client_id, workers=check_threads)
        #: Credit each checker stream grants at subscribe.
        self.check_credit = self.core.credit
        self._executor = ThreadPoolExecutor(max_workers=check_threads, thread_name_prefix="txmq-check")
        self._connections: dict[CheckStream, _CheckerConnection] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._discover, name="txmq-checker-discovery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def connected(self) -> list[str]:
        """Names of the checkers this producer is subscribed with now."""
        return self.core.connected

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
        response = self.client.nameserver_call("ListCheckers", nameserver_pb2.ListCheckersRequest())
        with self._lock:
            new, gone = self.core.refreshed({c.address: c.name for c in response.checkers})
            for stream in new:
                self._connections[stream] = connection = _CheckerConnection(stream, self)
                connection.start()
            left = [self._connections.pop(stream) for stream in gone if stream in self._connections]
        for connection in left:
            log.info("checker %s (%s) left: disconnecting", connection.stream.checker_name, connection.stream.address)
            connection.close()

    def submit(self, check: checker_pb2.CheckRequest, stream: CheckStream, session: int) -> None:
        try:
            self._executor.submit(self._run_check, check, stream, session)
        except RuntimeError:  # shut down: the checker hands the check to another producer
            pass

    def _run_check(self, check: checker_pb2.CheckRequest, stream: CheckStream, session: int) -> None:
        if self.core.closing:
            return  # closing: not started, so the checker hands it to another producer
        self.core.started(stream, check, session)
        message = check_message(check, stream.checker_name)
        with tracing.check(message, self.producer_group) as traced, traced.current():
            try:
                outcome = self._check(message)
            except Exception as exc:  # the user's failure is an answer: UNKNOWN
                log.exception("check_local_transaction raised for transaction %s: answering UNKNOWN",
                              check.transaction_id)
                traced.fail(exc)
                outcome = None
            tracing.checked(traced, outcome)
        self.core.answered(stream, check, outcome, session)

    def close(self) -> None:
        """Unsubscribes from every checker; checks being answered finish, later ones are
        dropped (the checkers hand them to other producers of the group)."""
        self._stop.set()
        self.core.close()
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


def _requests(outbox: "queue.SimpleQueue[Request | None]") -> Iterator[Request]:
    while True:
        item = outbox.get()
        if item is None:
            return
        yield item


class _CheckerConnection:
    """One checker: its stream on a thread, opened again with backoff when it fails."""

    def __init__(self, stream: CheckStream, responder: CheckResponder) -> None:
        self.stream = stream
        self.responder = responder
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self._outbox: queue.SimpleQueue[Request | None] | None = None
        self._client = responder.client
        self._tls_generation = self._client.tls_generation()
        self._channel = self._client.new_channel(stream.address)
        self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
        self._thread = threading.Thread(target=self._run, name=f"txmq-checker-{stream.checker_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _open(self) -> tuple[Any, int, "queue.SimpleQueue[Request | None]"] | None:
        outbox: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        with self._lock:
            if self._stop.is_set():
                return None
            generation = self._client.tls_generation()
            if generation != self._tls_generation:  # rotated TLS files: a new channel
                self._channel.close()
                self._tls_generation = generation
                self._channel = self._client.new_channel(self.stream.address)
                self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
            session, subscribe = self.stream.open(outbox.put)
            outbox.put(subscribe)
            call = self._stub.CheckTransactionState(_requests(outbox))
            self._call, self._outbox = call, outbox
        return call, session, outbox

    def _run(self) -> None:
        stream, core = self.stream, self.responder.core
        while not self._stop.is_set():
            opened = self._open()
            if opened is None:
                return
            call, session, outbox = opened
            try:
                for response in call:
                    event = stream.classify(response, session)
                    if type(event) is Check:
                        self.responder.submit(event.check, stream, session)
                    elif type(event) is Subscribed:
                        if core.subscribed(stream, event.checker_name):
                            log.info("checker %s (%s) reachable again", stream.checker_name, stream.address)
                    elif type(event) is Refused:
                        log.log(event.level, "checker %s refused a request: %s", stream.checker_name, event.error)
            except grpc.RpcError as exc:
                if not self._stop.is_set() and stream.failed():
                    code = exc.code() if hasattr(exc, "code") else None
                    log.warning("check stream to checker %s (%s) failed (%s), reconnecting: %s",
                                stream.checker_name, stream.address, code,
                                exc.details() if hasattr(exc, "details") else exc)
            finally:
                with self._lock:
                    self._outbox = None
                pause = core.ended(stream)
                outbox.put(None)
            self._stop.wait(pause)

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
