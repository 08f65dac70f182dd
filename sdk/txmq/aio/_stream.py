"""The pipelined Produce stream for asyncio: one bidirectional call per broker carrying every
request of the process's coroutines (the design of ``txmq._produce_stream``, without threads).

- ``request`` gives the entry a request id, registers a future under it, queues the entry
  and awaits the future.
- One writer task sends: one stream message in flight at a time; what the coroutines
  queue meanwhile leaves together in the next. Once an answer comes, the writer lets the
  event loop run the coroutines it woke (``LINGER_TURNS`` loop turns, no timer) before it
  sends, so a caller whose next request follows at once (a commit after its half message)
  joins the next message instead of waiting for a round trip. A message whose answer is
  later than ``HOLD_SECONDS`` stops holding the next. A hint (``stream=True``: an entry
  nobody's critical path waits on, as an anchored transaction's end) holds nothing: the
  half message of the caller's next transaction leaves at once, not one WAL sync later.
- A message of hints alone waits up to ``HINT_LINGER_SECONDS`` (``txmq._produce_stream``)
  for a request to share it; the request never waits, its arrival sends both at once (one
  gRPC message and one WAL sync for the end and the next half). Nobody joining, the hints
  leave alone once the linger is over; ``close`` sends them at once and waits for their
  answers.
- One reader task resolves the futures by request id (the broker answers out of order).
- When the call fails, every request in flight fails with :class:`UnavailableError`
  (retryable: the caller retries with the same message id, which the broker
  deduplicates); the next request opens a new call.
- A request with no answer within its timeout while the call answered nothing since it
  was sent marks the call dead (a half-open connection): it is cancelled.
- A coroutine alone (no other in ``request``, hints aside) goes direct: the unary call its
  entry stands for, no writer or reader task, as ``txmq._produce_stream`` does for a
  thread alone; but with a hint lingering unsent it takes the stream, to share its message.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Callable

import grpc

from .._errors import ClientClosedError, DeadlineExceededError, UnavailableError, error_from_entry, error_from_rpc
from .. import _produce_stream
from .._produce_stream import HOLD_SECONDS, MAX_BATCH, direct_call, hints_only
from ..v1 import broker_pb2

log = logging.getLogger(__name__)

#: Event-loop turns the writer yields after an answer, for the coroutines it woke to queue
#: their next request (each turn runs every callback ready then).
LINGER_TURNS = 2


class _Session:
    """One opened Produce call, its writer and reader, and the requests in flight on it."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.queue: list[broker_pb2.ProduceEntry] = []
        self.pending: dict[int, asyncio.Future[broker_pb2.ProduceResult]] = {}
        self.queued = asyncio.Event()
        #: Set when an entry someone waits on is queued (what a message of hints alone
        #: lingers for), or when closing (the hints leave now).
        self.requested = asyncio.Event()
        self.closing = False
        self.answered = asyncio.Event()
        self.answered.set()
        #: Entries sent and not answered that someone waits on (hints aside), and the
        #: request ids of the hints in flight.
        self.unanswered = 0
        self.hints: set[int] = set()
        self.dead = False
        self.last_response = time.monotonic()
        self.tasks: list[asyncio.Task[None]] = []


class AsyncProduceStream:
    """The Produce stream to one broker address."""

    def __init__(self, method: Callable[..., Any], address: str, stub: Any = None) -> None:
        self._method = method
        # The broker's unary SendMessage / EndTransaction, for a coroutine alone (None: the
        # stream always); and how many coroutines are in ``request`` now, hints aside.
        self._stub = stub
        self._callers = 0
        self.address = address
        self._session: _Session | None = None
        self._ids = itertools.count(1)
        self._closed = False
        #: Stream messages sent and requests they carried (how well calls batch).
        self.messages_sent = 0
        self.requests_sent = 0
        #: Requests sent direct (unary), by a coroutine alone.
        self.direct_sent = 0

    async def request(self, entry: broker_pb2.ProduceEntry, timeout: float, *,
                      stream: bool = False) -> broker_pb2.ProduceResult:
        """Sends ``entry`` and awaits its response; a non-OK status raises the TxmqError it
        stands for, no answer within ``timeout`` raises DeadlineExceededError. ``stream``: on
        the stream even when alone, as a hint: nobody's critical path waits on it, so it
        neither holds the next message nor counts as a caller. (The sync stream's hints
        hold nothing either, but there a caller alone still joins them: measured, each
        way, in docs/performance.md.)"""
        if self._closed:
            raise ClientClosedError("producer")
        if stream:
            return await self._stream(entry, timeout, hint=True)
        alone = self._callers == 0 and self._stub is not None and not self._hint_lingering()
        self._callers += 1
        try:
            if alone:
                return await self._direct(entry, timeout)
            return await self._stream(entry, timeout, hint=False)
        finally:
            self._callers -= 1

    def _hint_lingering(self) -> bool:
        """Whether hints wait unsent for a request to share their message (then a coroutine
        alone joins them instead of going direct: one message and one WAL sync for both)."""
        session = self._session
        return session is not None and not session.dead and bool(session.queue)

    async def _direct(self, entry: broker_pb2.ProduceEntry, timeout: float) -> broker_pb2.ProduceResult:
        method, unary, kind = direct_call(self._stub, entry)
        self.direct_sent += 1
        try:
            return broker_pb2.ProduceResult(**{kind: await method(unary, timeout=timeout)})
        except grpc.RpcError as exc:
            if self._closed:
                raise ClientClosedError("producer") from None
            raise error_from_rpc(exc) from None
        except asyncio.CancelledError:
            if self._closed:
                raise ClientClosedError("producer") from None
            raise

    async def _stream(self, entry: broker_pb2.ProduceEntry, timeout: float, *,
                      hint: bool) -> broker_pb2.ProduceResult:
        session = self._session if self._session is not None and not self._session.dead else self._open()
        request_id = next(self._ids)
        entry.request_id = request_id
        if hint:
            session.hints.add(request_id)
        future: asyncio.Future[broker_pb2.ProduceResult] = asyncio.get_running_loop().create_future()
        session.pending[request_id] = future
        session.queue.append(entry)
        session.queued.set()
        if not hint:
            session.requested.set()
        sent_at = time.monotonic()
        try:
            result = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            session.pending.pop(request_id, None)
            session.hints.discard(request_id)
            if session.last_response < sent_at and not session.dead:
                log.warning("produce stream to %s answered nothing for %.1fs: reconnecting", self.address, timeout)
                self._fail(session, "no answer")
                session.call.cancel()
            raise DeadlineExceededError(f"no answer from broker {self.address} within {timeout}s") from None
        if result.status.code:
            raise error_from_entry(result.status)
        return result

    async def close(self) -> None:
        """Sends the hints still lingering and waits up to ``CLOSE_FLUSH_SECONDS`` for every
        hint on the call to be answered (a clean close drops no anchored end), then fails
        every request still in flight with ClientClosedError. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            hinted = [f for i, f in session.pending.items() if i in session.hints]
            if hinted and not session.dead:
                session.closing = True
                session.requested.set()
                await asyncio.wait(hinted, timeout=_produce_stream.CLOSE_FLUSH_SECONDS)
            self._fail(session, "closed")
            session.call.cancel()
            for task in session.tasks:
                task.cancel()
            await asyncio.gather(*session.tasks, return_exceptions=True)

    # --- the call -------------------------------------------------------------------------

    def _open(self) -> _Session:
        session = self._session = _Session(self._method())
        session.tasks = [asyncio.ensure_future(self._write(session)), asyncio.ensure_future(self._read(session))]
        log.debug("produce stream to %s opened", self.address)
        return session

    async def _write(self, session: _Session) -> None:
        try:
            while not session.dead:
                await session.queued.wait()
                if session.unanswered > 0:
                    try:
                        await asyncio.wait_for(session.answered.wait(), HOLD_SECONDS)
                    except TimeoutError:
                        pass
                    for _ in range(LINGER_TURNS):
                        await asyncio.sleep(0)
                if hints_only(session.queue, session.hints) and not session.closing:
                    await self._linger_for_request(session)
                if session.dead:
                    return
                batch, session.queue = session.queue[:MAX_BATCH], session.queue[MAX_BATCH:]
                if not session.queue:
                    session.queued.clear()
                if not batch:
                    continue
                waited = sum(1 for e in batch if e.request_id not in session.hints)
                if waited:
                    session.unanswered += waited
                    session.answered.clear()
                self.messages_sent += 1
                self.requests_sent += len(batch)
                await session.call.write(broker_pb2.ProduceRequest(entries=batch))
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            self._fail(session, f"write failed: {exc}")
        except asyncio.CancelledError:
            raise
        except Exception:  # never leave callers waiting
            log.exception("produce stream to %s: writer failed", self.address)
            self._fail(session, "writer failed")

    @staticmethod
    async def _linger_for_request(session: _Session) -> None:
        """Hints alone wait up to ``HINT_LINGER_SECONDS`` for a request to share their
        message; one queued (or the call closing) sends them at once."""
        session.requested.clear()
        timer = asyncio.get_running_loop().call_later(_produce_stream.HINT_LINGER_SECONDS, session.requested.set)
        try:
            await session.requested.wait()
        finally:
            timer.cancel()

    async def _read(self, session: _Session) -> None:
        detail = "the broker closed the stream"
        try:
            while True:
                response = await session.call.read()
                if response is grpc.aio.EOF:
                    break
                session.last_response = time.monotonic()
                hints = session.hints
                for result in response.results:
                    if result.request_id in hints:
                        hints.discard(result.request_id)
                    else:
                        session.unanswered -= 1
                if session.unanswered <= 0:
                    session.unanswered = 0
                    session.answered.set()
                for result in response.results:
                    future = session.pending.pop(result.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(result)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = f"{getattr(code, 'name', code)}: {exc.details() if hasattr(exc, 'details') else exc}"
        except asyncio.CancelledError:
            detail = "cancelled"
        except Exception:  # never leave callers waiting
            log.exception("produce stream to %s: reader failed", self.address)
            detail = "reader failed"
        self._fail(session, detail)

    def _fail(self, session: _Session, detail: str) -> None:
        if session.dead:
            return
        session.dead = True
        if self._session is session:
            self._session = None
        session.queued.set()
        session.answered.set()
        session.requested.set()
        failed, session.pending = session.pending, {}
        if failed:
            log.debug("produce stream to %s failed with %d in flight: %s", self.address, len(failed), detail)
        for future in failed.values():
            if future.done():
                continue
            if self._closed:
                future.set_exception(ClientClosedError("producer"))
            else:
                future.set_exception(UnavailableError(f"produce stream to {self.address} failed ({detail})",
                                                      address=self.address))
