"""Answering checks from an event loop: the asyncio driver of the check-stream core
(``txmq._checking``: the same protocol, flow control, late answers and resend window as
the thread driver ``txmq._checks``)::

    discovery task ── ListCheckers every refresh_seconds ──▶ one connection task per checker
    connection task ── Subscribe(check_credit) ──▶ checker ── CheckRequest ──▶ a task per check:
        (at most check_concurrency run the listener at once) CheckReceived when it starts,
        await listener.check_local_transaction, CheckAnswer (+1 credit)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from .._checking import Check, CheckAnswering, CheckStream, Refused, Request, Subscribed, check_message
from .. import _tracing as tracing
from .._errors import TxmqError
from .._types import TransactionMessage
from ..v1 import checker_pb2, checker_pb2_grpc, nameserver_pb2
from ._client import AsyncClient

log = logging.getLogger(__name__)

CheckFn = Callable[[TransactionMessage], Awaitable[Any]]


class AsyncCheckResponder:
    """Keeps a stream open to every live checker and answers its checks."""

    def __init__(self, client: AsyncClient, *, producer_group: str, client_id: str, check: CheckFn,
                 check_concurrency: int, refresh_seconds: float) -> None:
        self.client = client
        self.producer_group = producer_group
        self.client_id = client_id
        self._check = check
        self.refresh_seconds = refresh_seconds
        self.core = CheckAnswering(producer_group=producer_group, client_id=client_id, workers=check_concurrency)
        self.check_credit = self.core.credit
        self._running: asyncio.Semaphore | None = None
        self._check_concurrency = check_concurrency
        self._connections: dict[CheckStream, _CheckerConnection] = {}
        self._checks: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and not self.core.closing:
            self._running = asyncio.Semaphore(self._check_concurrency)
            self._task = asyncio.ensure_future(self._discover())

    @property
    def connected(self) -> list[str]:
        return self.core.connected

    async def _discover(self) -> None:
        failing = False
        while not self.core.closing:
            try:
                await self.refresh()
                failing = False
            except TxmqError as err:
                if not failing:
                    log.warning("cannot list the checkers (checks are answered once they can be listed): %s", err)
                failing = True
            await asyncio.sleep(self.refresh_seconds)

    async def refresh(self) -> None:
        response = await self.client.nameserver_call("ListCheckers", nameserver_pb2.ListCheckersRequest())
        new, gone = self.core.refreshed({c.address: c.name for c in response.checkers})
        for stream in gone:
            connection = self._connections.pop(stream, None)
            if connection is not None:
                log.info("checker %s (%s) left: disconnecting", stream.checker_name, stream.address)
                await connection.close()
        for stream in new:
            self._connections[stream] = connection = _CheckerConnection(stream, self)
            connection.start()

    def submit(self, check: checker_pb2.CheckRequest, stream: CheckStream, session: int) -> None:
        task = asyncio.ensure_future(self._run_check(check, stream, session))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _run_check(self, check: checker_pb2.CheckRequest, stream: CheckStream, session: int) -> None:
        assert self._running is not None
        async with self._running:
            if self.core.closing:
                return  # not started: the checker hands it to another producer
            self.core.started(stream, check, session)
            message = check_message(check, stream.checker_name)
            with tracing.check(message, self.producer_group) as traced, traced.current():
                try:
                    outcome = await self._check(message)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the user's failure is an answer: UNKNOWN
                    log.exception("check_local_transaction raised for transaction %s: answering UNKNOWN",
                                  check.transaction_id)
                    traced.fail(exc)
                    outcome = None
                tracing.checked(traced, outcome)
        self.core.answered(stream, check, outcome, session)

    async def close(self) -> None:
        """Unsubscribes from every checker; checks not started are handed back."""
        self.core.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)


async def _requests(outbox: "asyncio.Queue[Request | None]") -> AsyncIterator[Request]:
    while True:
        item = await outbox.get()
        if item is None:
            return
        yield item


class _CheckerConnection:
    """One checker: its stream as a task, opened again with backoff when it fails."""

    def __init__(self, stream: CheckStream, responder: AsyncCheckResponder) -> None:
        self.stream = stream
        self.responder = responder
        self._stopped = False
        self._call: Any = None
        self._outbox: asyncio.Queue[Request | None] | None = None
        self._client = responder.client
        self._tls_generation = self._client.tls_generation()
        self._channel = self._client.new_channel(stream.address)
        self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _open(self) -> tuple[Any, int, "asyncio.Queue[Request | None]"]:
        outbox: asyncio.Queue[Request | None] = asyncio.Queue()
        generation = self._client.tls_generation()
        if generation != self._tls_generation:  # rotated TLS files: a new channel
            await self._channel.close()
            self._tls_generation = generation
            self._channel = self._client.new_channel(self.stream.address)
            self._stub = checker_pb2_grpc.CheckerServiceStub(self._channel)
        session, subscribe = self.stream.open(outbox.put_nowait)
        outbox.put_nowait(subscribe)
        call = self._stub.CheckTransactionState(_requests(outbox))
        self._call, self._outbox = call, outbox
        return call, session, outbox

    async def _run(self) -> None:
        stream, core = self.stream, self.responder.core
        while not self._stopped:
            call, session, outbox = await self._open()
            try:
                async for response in call:
                    event = stream.classify(response, session)
                    if type(event) is Check:
                        self.responder.submit(event.check, stream, session)
                    elif type(event) is Subscribed:
                        if core.subscribed(stream, event.checker_name):
                            log.info("checker %s (%s) reachable again", stream.checker_name, stream.address)
                    elif type(event) is Refused:
                        log.log(event.level, "checker %s refused a request: %s", stream.checker_name, event.error)
            except grpc.RpcError as exc:
                if not self._stopped and stream.failed():
                    code = exc.code() if hasattr(exc, "code") else None
                    log.warning("check stream to checker %s (%s) failed (%s), reconnecting: %s", stream.checker_name,
                                stream.address, code, exc.details() if hasattr(exc, "details") else exc)
            finally:
                self._outbox = None
                pause = core.ended(stream)
                outbox.put_nowait(None)
            if self._stopped:
                return
            await asyncio.sleep(pause)

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
