"""Answering checks from an event loop: the producer's side of
``CheckerService.CheckTransactionState``, as ``txmq._checks`` does it with threads (same
protocol, same flow control, same late answers; read that module's docstring first)::

    discovery task ── ListCheckers every refresh_seconds ──▶ one connection task per checker
    connection task ── Subscribe(check_credit) ──▶ checker ── CheckRequest ──▶ a task per check:
        (at most check_concurrency run the listener at once) CheckReceived when it starts,
        await listener.check_local_transaction, CheckAnswer (+1 credit)

Credit: ``CHECK_CREDIT_PER_THREAD × check_concurrency`` at subscribe, one more with every
answer. An answer whose stream ended goes out on the next subscribed stream (to any
checker) as a late answer, and so do the decisions sent on a stream in the
``RESEND_WINDOW_SECONDS`` before it failed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from typing import Any, Awaitable, Callable

import grpc

from .._checks import (CHECK_CREDIT_PER_THREAD, MAX_UNSENT_ANSWERS, RECONNECT_BACKOFF_MAX_SECONDS,
                       RECONNECT_BACKOFF_SECONDS, RESEND_WINDOW_SECONDS, check_answer, check_message)
from .._errors import TxmqError, error_from_entry
from .._types import TransactionMessage
from ..v1 import checker_pb2, checker_pb2_grpc, common_pb2, nameserver_pb2
from ._client import AsyncClient

log = logging.getLogger(__name__)

Request = checker_pb2.CheckTransactionStateRequest
CheckFn = Callable[[TransactionMessage], Awaitable[Any]]
_DECISIONS = (common_pb2.CHECK_RESULT_COMMIT, common_pb2.CHECK_RESULT_ROLLBACK)


class AsyncCheckResponder:
    """Keeps a stream open to every live checker and answers its checks."""

    def __init__(self, client: AsyncClient, *, producer_group: str, client_id: str, check: CheckFn,
                 check_concurrency: int, refresh_seconds: float) -> None:
        self.client = client
        self._client = client
        self.producer_group = producer_group
        self.client_id = client_id
        self._check = check
        self.refresh_seconds = refresh_seconds
        self.check_credit = CHECK_CREDIT_PER_THREAD * check_concurrency
        self._running: asyncio.Semaphore | None = None
        self._check_concurrency = check_concurrency
        self._connections: dict[str, _CheckerConnection] = {}
        self._unsent: collections.deque[Request] = collections.deque()
        self._checks: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._running = asyncio.Semaphore(self._check_concurrency)
            self._task = asyncio.ensure_future(self._discover())

    @property
    def connected(self) -> list[str]:
        return sorted(c.checker_name for c in self._connections.values() if c.subscribed)

    async def _discover(self) -> None:
        failing = False
        while not self._stopped:
            try:
                await self.refresh()
                failing = False
            except TxmqError as err:
                if not failing:
                    log.warning("cannot list the checkers (checks are answered once they can be listed): %s", err)
                failing = True
            await asyncio.sleep(self.refresh_seconds)

    async def refresh(self) -> None:
        response = await self._client.nameserver_call("ListCheckers", nameserver_pb2.ListCheckersRequest())
        live = {c.address: c.name for c in response.checkers}
        if self._stopped:
            return
        for address in [a for a in self._connections if a not in live]:
            connection = self._connections.pop(address)
            log.info("checker %s (%s) left: disconnecting", connection.checker_name, address)
            await connection.close()
        for address, name in live.items():
            if address not in self._connections:
                connection = self._connections[address] = _CheckerConnection(address, name, self)
                connection.start()

    def submit(self, check: checker_pb2.CheckRequest, connection: "_CheckerConnection", session: int) -> None:
        task = asyncio.ensure_future(self._run_check(check, connection, session))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _run_check(self, check: checker_pb2.CheckRequest, connection: "_CheckerConnection",
                         session: int) -> None:
        assert self._running is not None
        async with self._running:
            if self._stopped:
                return  # not started: the checker hands it to another producer
            connection.send(Request(received=checker_pb2.CheckReceived(check_id=check.check_id)), session)
            message = check_message(check, connection.checker_name)
            try:
                outcome = await self._check(message)
            except asyncio.CancelledError:
                raise
            except Exception:  # the user's failure is an answer: UNKNOWN
                log.exception("check_local_transaction raised for transaction %s: answering UNKNOWN",
                              check.transaction_id)
                outcome = None
        answer = check_answer(check, outcome, self.producer_group)
        if connection.send(Request(answer=answer), session):
            return
        if answer.result in _DECISIONS:
            answer.credit = 0
            self.send_late(Request(answer=answer))

    def send_late(self, request: Request) -> None:
        """On any subscribed stream, or kept until one is."""
        for connection in list(self._connections.values()):
            if connection.send_any(request):
                return
        self._unsent.append(request)
        while len(self._unsent) > MAX_UNSENT_ANSWERS:
            dropped = self._unsent.popleft()
            log.warning("no checker reachable: check answer for transaction %s dropped (it is asked for again)",
                        dropped.answer.transaction_id)

    def take_unsent(self) -> list[Request]:
        unsent, self._unsent = list(self._unsent), collections.deque()
        return unsent

    async def close(self) -> None:
        """Unsubscribes from every checker; checks not started are handed back."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)


class _CheckerConnection:
    """One checker: its stream, opened again with backoff when it fails."""

    def __init__(self, address: str, checker_name: str, responder: AsyncCheckResponder) -> None:
        self.address = address
        self.checker_name = checker_name
        self.responder = responder
        self.subscribed = False
        self._stopped = False
        self._call: Any = None
        self._outbox: asyncio.Queue[Request | None] | None = None
        self._session = 0
        self._recent: collections.deque[tuple[float, Request]] = collections.deque()
        self._client = responder.client
        self._tls_generation = self._client.tls_generation()
        self._channel = self._client.new_channel(address)
        self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def send(self, request: Request, session: int) -> bool:
        """Queues ``request`` on the stream ``session`` (False when that stream ended)."""
        if self._outbox is None or session != self._session:
            return False
        self._outbox.put_nowait(request)
        if request.answer.result in _DECISIONS:
            now = time.monotonic()
            self._recent.append((now, request))
            while self._recent and self._recent[0][0] < now - RESEND_WINDOW_SECONDS:
                self._recent.popleft()
        return True

    def send_any(self, request: Request) -> bool:
        if self._outbox is None or not self.subscribed:
            return False
        self._outbox.put_nowait(request)
        return True

    def _resend_recent(self) -> None:
        recent, self._recent = list(self._recent), collections.deque()
        horizon = time.monotonic() - RESEND_WINDOW_SECONDS
        for at, request in recent:
            if at >= horizon:
                again = Request()
                again.CopyFrom(request)
                again.answer.credit = 0
                self.responder.send_late(again)

    async def _requests(self, outbox: "asyncio.Queue[Request | None]") -> Any:
        while True:
            item = await outbox.get()
            if item is None:
                return
            yield item

    async def _run(self) -> None:
        backoff = RECONNECT_BACKOFF_SECONDS
        failing = False
        responder = self.responder
        while not self._stopped:
            outbox: asyncio.Queue[Request | None] = asyncio.Queue()
            outbox.put_nowait(Request(subscribe=checker_pb2.Subscribe(
                producer_groups=[responder.producer_group], client_id=responder.client_id,
                check_credit=responder.check_credit)))
            generation = self._client.tls_generation()
            if generation != self._tls_generation:  # rotated TLS files: a new channel
                await self._channel.close()
                self._tls_generation = generation
                self._channel = self._client.new_channel(self.address)
                self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
            call = self._stub.CheckTransactionState(self._requests(outbox))
            self._session += 1
            session = self._session
            self._call, self._outbox = call, outbox
            try:
                async for response in call:
                    kind = response.WhichOneof("command")
                    if kind == "check":
                        responder.submit(response.check, self, session)
                    elif kind == "subscribed":
                        self.checker_name = response.subscribed.checker_name or self.checker_name
                        self.subscribed = True
                        for late in responder.take_unsent():
                            outbox.put_nowait(late)
                        backoff = RECONNECT_BACKOFF_SECONDS
                        if failing:
                            log.info("checker %s (%s) reachable again", self.checker_name, self.address)
                        failing = False
                    elif kind == "error":
                        error = error_from_entry(response.error)
                        level = logging.DEBUG if getattr(error, "field", "") == "check_id" else logging.WARNING
                        log.log(level, "checker %s refused a request: %s", self.checker_name, error)
            except grpc.RpcError as exc:
                if self._stopped:
                    return
                if not failing:
                    code = exc.code() if hasattr(exc, "code") else None
                    log.warning("check stream to checker %s (%s) failed (%s), reconnecting: %s", self.checker_name,
                                self.address, code, exc.details() if hasattr(exc, "details") else exc)
                failing = True
            finally:
                self.subscribed = False
                self._outbox = None
                outbox.put_nowait(None)
                if not self._stopped:
                    self._resend_recent()
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_SECONDS)

    async def close(self) -> None:
        self._stopped = True
        outbox, call = self._outbox, self._call
        if outbox is not None:
            outbox.put_nowait(None)  # half-close: the checker hands unacknowledged checks back at once
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 0.5)
            except (TimeoutError, Exception):  # noqa: BLE001 - cut below
                pass
        if call is not None:
            call.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._channel.close()
