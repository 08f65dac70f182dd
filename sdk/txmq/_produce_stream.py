"""The pipelined producer path: one bidirectional ``Produce`` stream per broker carrying many
requests in flight.

A unary call per message costs a round trip and a gRPC call object each (a few thousand a
second from Python); a stream carries tens of thousands. The design::

    caller threads ──request─▶ SimpleQueue ──request iterator (batches)──▶ gRPC ──▶ broker
          ▲                                                                                │
          └──── _Reply.set_result ◀── reader thread: pending.pop(request_id) ◀── responses ─┘

- ``request`` assigns a request id, registers a reply slot under it and puts the request
  on the queue; then the caller's thread waits for the reply.
- One stream message is in flight at a time (Nagle without a timer): the requests that
  arrive while the broker answers it leave together in the next. An idle stream sends a
  request at once; a busy one sends fewer, larger messages, which is what both sides pay
  for (a gRPC message costs about as much as applying a request on the broker, and the
  broker syncs its WAL once per message). A message whose answer is late by more than
  ``HOLD_SECONDS`` stops holding the next. A hint (``request(stream=True)``: an entry
  nobody's critical path waits on, as an anchored transaction's end) holds nothing and is
  lingered for by nobody; a caller alone while one is unanswered still takes the stream.
- A message of hints alone waits up to ``HINT_LINGER_SECONDS`` for a request to share it:
  the next transaction's half message follows an anchored end within a millisecond or so,
  and one message carries both (one gRPC message and one WAL sync instead of two; hints
  arriving meanwhile join too). The request never waits: it joins the hints' message and
  that message leaves at once. Nobody joining, the hints leave alone once the linger is
  over; ``close`` sends them at once and waits for their answers.
- Once a message of several requests is answered, the next one waits up to
  ``LINGER_SECONDS`` for the callers that answer woke and that will send here again: a
  commit follows its half message on the same broker, and on a client's only stream
  every caller comes back. Without the wait the first caller back would leave alone and
  the others would wait for its round trip, and the callers would split into groups, each
  waiting for the others' round trips. A stream expecting one caller back sends at once.
- Measured with 8 producer threads on one stream (``bench.transactions``): all 8 requests
  in every message instead of ~2, producer CPU −40 %, broker CPU −25 %, txn/s +35–45 %.
- Lanes: with one message in flight, each round trip is a relay in which nothing
  overlaps. The callers an answer wakes run one after another (they share the GIL; ~50 µs
  each on a 2-vCPU VM, mostly the cross-CPU wake-up), then the broker applies their
  requests one after another, then syncs. Once ``SPLIT_AT`` callers wait at the same time,
  the stream spreads them over two lanes, two gRPC calls each with its own message in
  flight, so one lane's callers wake while the broker serves the other's (a caller thread
  keeps its lane, so each lane's linger knows whom to wait for). Measured with
  ``bench.transactions`` on 2 vCPUs: 6 producers +9 %, 8 +15 %, 12 +17 %, 32 +7 %; with 2
  or 4 a second lane costs more than it overlaps (−22 %, −8 %: twice the messages and the
  syncs), hence the threshold. It goes back to one lane once ``MERGE_AT`` or fewer wait.
- One reader thread per stream matches responses to reply slots by request id (the broker
  answers out of order). A request's own error comes back in its response's EntryStatus
  and is raised by :meth:`ProduceStream.request` on the caller's thread.
- When the stream fails (transport error, broker restart, server closing it), every
  request in flight on it fails with :class:`UnavailableError` (retryable: callers retry
  with the same message id, which the broker deduplicates) and the stream is reopened
  lazily by the next request.
- A request that gets no answer within its timeout while the stream has answered nothing
  since it was sent marks the stream dead (a half-open connection): it is cancelled so the
  next request opens a fresh one.
- A caller alone (no other caller waiting on this stream, nothing submitted unanswered) goes
  **direct**: a unary ``SendMessage`` / ``EndTransaction`` on the caller's own thread, no
  queue, no sender and reader threads, no request id, nothing to batch with anyway. The
  broker applies and syncs it exactly as a stream entry, with the same errors. Measured
  with one caller per process (``bench.outbox``, ``bench.transactions --producers 1``): the
  stream's two thread hand-offs per request cost more CPU than its batching saves when
  there is nothing to batch. A second caller arriving meanwhile takes the stream, so
  concurrent callers still batch.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import grpc

from ._errors import ClientClosedError, DeadlineExceededError, UnavailableError, error_from_entry, error_from_rpc
from .v1 import broker_pb2

log = logging.getLogger(__name__)


class _Reply:
    """One request's answer: set once by the reader thread, waited for by the caller. A
    bare lock: a ``concurrent.futures.Future`` (condition, waiter list, callbacks) costs
    several times more, and the reader thread sets the reply of every request in turn."""

    __slots__ = ("_done", "result_", "error", "waited")

    def __init__(self, waited: bool) -> None:
        # Whether a caller's thread blocks on this reply (``request``), so that it sends
        # again once answered; ``submit`` callers collect replies later.
        self.waited = waited
        self._done = threading.Lock()
        self._done.acquire()
        self.result_: broker_pb2.ProduceResult | None = None
        self.error: BaseException | None = None

    def set_result(self, result: broker_pb2.ProduceResult) -> None:
        self.result_ = result
        self._done.release()

    def set_exception(self, error: BaseException) -> None:
        self.error = error
        self._done.release()

    def wait(self, timeout: float) -> bool:
        """Whether the reply came within ``timeout`` seconds (it stays come)."""
        if not self._done.acquire(timeout=timeout):
            return False
        self._done.release()
        return True

    def result(self, timeout: float) -> broker_pb2.ProduceResult:
        """The response whatever its status; raises the stream's failure, or
        DeadlineExceededError when nothing came within ``timeout`` seconds."""
        if not self.wait(timeout):
            raise DeadlineExceededError(f"no answer within {timeout}s")
        if self.error is not None:
            raise self.error
        assert self.result_ is not None
        return self.result_


class _Session:
    """One opened Produce call and the requests in flight on it."""

    __slots__ = ("queue", "pending", "call", "dead", "last_response", "unanswered", "answered",
                 "returning", "lingering", "linger_seconds", "hints")

    def __init__(self, linger_seconds: float | None = None) -> None:
        # None: the module's LINGER_SECONDS, read when lingering.
        self.linger_seconds = linger_seconds
        self.queue: queue.SimpleQueue[broker_pb2.ProduceEntry | None] = queue.SimpleQueue()
        # Requests sent and not yet answered, hints aside; ``answered`` is notified when it
        # drops to 0. The request ids of the hints queued or in flight.
        self.unanswered = 0
        self.hints: set[int] = set()
        self.answered = threading.Condition(threading.Lock())
        # Callers the last response answered that will send here again (``_returning``);
        # whether the sender lingers for that many requests.
        self.returning = 0
        self.lingering = False
        self.pending: dict[int, _Reply] = {}
        self.call: Any = None
        self.dead = False
        self.last_response = time.monotonic()

    def put(self, request: broker_pb2.ProduceEntry) -> None:
        """Queues ``request`` for the sender (waking it if it lingers for this one)."""
        self.queue.put(request)
        if self.lingering and self.queue.qsize() + 1 >= self.returning:
            with self.answered:
                self.answered.notify()


#: Most requests folded into one stream message.
MAX_BATCH = 128
#: Longest a request waits for the message in flight to be answered before it leaves
#: anyway (the broker answers within one WAL sync; this bounds a stalled answer's effect).
HOLD_SECONDS = 0.05
#: Longest a message waits for the callers the previous answer woke (the producers'
#: ``linger_seconds`` default).
LINGER_SECONDS = 0.002
#: A stream spreads its callers over two lanes once this many wait on it at once ...
SPLIT_AT = 6
#: ... and goes back to one once no more than this many did for a whole window.
MERGE_AT = 4
#: The window over which the most callers waiting at once is taken.
LANE_WINDOW_SECONDS = 0.25
#: Longest a message of hints alone waits for a request to share it (a hint nobody waits
#: on costs the broker a gRPC message and a WAL sync of its own when it leaves alone).
HINT_LINGER_SECONDS = 0.003
#: Longest ``close`` waits for the hints on a stream to be answered.
CLOSE_FLUSH_SECONDS = 1.0


def hints_only(entries: "Sequence[broker_pb2.ProduceEntry]", hints: "set[int]") -> bool:
    """Whether a message of ``entries`` would carry hints alone (``hints``: their request
    ids), and so waits up to ``HINT_LINGER_SECONDS`` for a request to share it."""
    return bool(entries) and all(entry.request_id in hints for entry in entries)


def _requests(session: _Session) -> Iterator[broker_pb2.ProduceRequest]:
    """Everything queued once the message in flight is answered (and its callers had a
    moment to send again) leaves in one message: a request alone when the stream is idle,
    many together under load."""
    get, queued = session.queue.get, session.queue.qsize
    answered = session.answered
    while True:
        item = get()
        if item is None:
            return
        if session.unanswered > 0 or session.returning > 1:
            with answered:
                answered.wait_for(lambda: session.unanswered <= 0 or session.dead, HOLD_SECONDS)
                # ``item`` is out of the queue: it counts as one of the returning callers.
                session.lingering = True
                linger = LINGER_SECONDS if session.linger_seconds is None else session.linger_seconds
                answered.wait_for(lambda: queued() + 1 >= session.returning or session.dead, linger)
                session.lingering = False
                session.returning = 0
        batch = [item]
        ended = _take_queued(session, batch)
        if not ended and hints_only(batch, session.hints):
            ended = _linger_for_request(session, batch)
        hints = session.hints
        with answered:
            session.unanswered += sum(1 for entry in batch if entry.request_id not in hints)
        yield broker_pb2.ProduceRequest(entries=batch)
        if ended:
            return


def _take_queued(session: _Session, batch: list[broker_pb2.ProduceEntry]) -> bool:
    """Adds what is queued to ``batch``, up to ``MAX_BATCH``; whether the stream ended
    (its ``None`` was taken)."""
    get_nowait = session.queue.get_nowait
    while len(batch) < MAX_BATCH:
        try:
            item = get_nowait()
        except queue.Empty:
            return False
        if item is None:
            return True
        batch.append(item)
    return False


def _linger_for_request(session: _Session, batch: list[broker_pb2.ProduceEntry]) -> bool:
    """``batch`` (hints alone) waits up to ``HINT_LINGER_SECONDS`` for a request, which
    joins it and sends it at once (hints arriving meanwhile join it too); whether the
    stream ended (closing: the hints leave now)."""
    get, hints = session.queue.get, session.hints
    deadline = time.monotonic() + HINT_LINGER_SECONDS
    while len(batch) < MAX_BATCH:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            item = get(timeout=remaining)
        except queue.Empty:
            return False
        if item is None:
            return True
        batch.append(item)
        if item.request_id not in hints:
            return _take_queued(session, batch)
    return False


def direct_call(stub: Any, entry: broker_pb2.ProduceEntry) -> tuple[Callable[..., Any], Any, str]:
    """The unary method of ``stub`` a Produce entry stands for, its request, and the
    ProduceResult field its response goes in (a caller alone sends it so, see above)."""
    kind = entry.WhichOneof("request")
    if kind == "send_message":
        return stub.SendMessage, entry.send_message, kind
    if kind == "end_transaction":
        return stub.EndTransaction, entry.end_transaction, kind
    raise ValueError(f"not a Produce request: {kind!r}")


def _returning(results: "Sequence[broker_pb2.ProduceResult]", replies: "Sequence[_Reply | None]",
               sole: bool) -> int:
    """How many of the callers ``results`` answer will send their next request on the same
    stream. Only callers blocked on their reply count (``request``, not ``submit``); of
    those, all on a client's only stream, otherwise those whose half message was stored
    (their EndTransaction goes to the same broker; the others may go elsewhere)."""
    return sum(1 for r, reply in zip(results, replies) if reply is not None and reply.waited and (
        sole or (not r.status.code and r.WhichOneof("response") == "send_message"
                 and r.send_message.transaction_id)))


class _Lanes:
    """How many lanes (Produce calls) a stream spreads its callers over: one, or two once
    ``SPLIT_AT`` callers wait on it at the same time, and one again once no more than
    ``MERGE_AT`` did for a whole window of ``LANE_WINDOW_SECONDS``. Not thread-safe: the
    stream calls it under its lock."""

    __slots__ = ("count", "waiting", "peak", "window_ends")

    def __init__(self) -> None:
        self.count = 1
        # Callers waiting for a reply now, and the most there were in this window.
        self.waiting = 0
        self.peak = 0
        self.window_ends = 0.0

    def enter(self, now: float) -> None:
        """A caller starts waiting (``now``: time.monotonic())."""
        self.waiting += 1
        if self.waiting > self.peak:
            self.peak = self.waiting
        if now >= self.window_ends:
            if self.peak >= SPLIT_AT:
                self.count = 2
            elif self.peak <= MERGE_AT:
                self.count = 1
            self.peak = self.waiting
            self.window_ends = now + LANE_WINDOW_SECONDS

    def leave(self) -> None:
        self.waiting -= 1


class ProduceStream:
    """The Produce stream to one broker address: one or two lanes (see ``_Lanes``), each a
    gRPC call of its own. Thread-safe; a failed lane reopens itself."""

    def __init__(self, method: Callable[..., Any], address: str,
                 sole: Callable[[], bool] = lambda: True, linger_seconds: float | None = None,
                 stub: Any = None) -> None:
        self._method = method
        # The broker's unary SendMessage / EndTransaction, for a caller alone (None: always
        # the stream).
        self._stub = stub
        self.address = address
        self._linger_seconds = linger_seconds
        # Whether this is its client's only Produce stream (then every caller it answers
        # sends its next request here too).
        self._sole = sole
        self._lock = threading.Lock()
        self._sessions: list[_Session | None] = [None, None]
        self._lanes = _Lanes()
        # A caller thread's place in the order threads first used this stream; with two
        # lanes, even places use the first and odd ones the second, so a caller always
        # comes back to the lane that answered it.
        self._local = threading.local()
        self._places = itertools.count()
        self._ids = itertools.count(1)
        self._closed = False

    def submit(self, request: broker_pb2.ProduceEntry) -> _Reply:
        """Sends ``request`` without waiting (its request_id is assigned here): many can be
        in flight; ``reply.result(timeout)`` gives each response whatever its status.
        Submitted requests travel in the first lane."""
        return self._submit(request, waited=False)[0]

    def _submit(self, request: broker_pb2.ProduceEntry, waited: bool,
                now: float = 0.0, hint: bool = False) -> tuple[_Reply, _Session, int]:
        """Queues ``request`` (its request_id is assigned here); the reply gets the response
        whatever its status, or UnavailableError if the stream fails. A ``waited`` caller
        counts as waiting (``_Lanes``) until it calls ``_Lanes.leave``; a ``hint`` holds
        no later message (see the module's docstring)."""
        reply = _Reply(waited)
        lane = 0
        if waited:
            place: int = getattr(self._local, "place", -1)
            if place < 0:
                place = self._local.place = next(self._places)
        with self._lock:
            if self._closed:
                raise ClientClosedError("producer")
            if waited:
                self._lanes.enter(now)
                lane = place % self._lanes.count
            session = self._sessions[lane]
            if session is None:
                session = self._open_locked(lane)
            request_id = next(self._ids)
            request.request_id = request_id
            session.pending[request_id] = reply
            if hint:
                session.hints.add(request_id)
            session.put(request)
        return reply, session, request_id

    def request(self, request: broker_pb2.ProduceEntry, timeout: float, *,
                stream: bool = False) -> broker_pb2.ProduceResult:
        """Sends ``request`` and waits for its response; a non-OK status raises the TxmqError
        it stands for, no answer within ``timeout`` raises DeadlineExceededError. ``stream``:
        on the stream even when alone, as a hint (a request nobody's critical path waits
        on, as an anchored transaction's end: a stream message costs the broker less than a
        unary call)."""
        sent_at = time.monotonic()
        if stream:
            reply, session, request_id = self._submit(request, waited=False, hint=True)
            return self._answer(reply, session, request_id, reply.wait(timeout), timeout, sent_at)
        if not stream and self._stub is not None and self._lanes.waiting == 0:
            with self._lock:
                direct = self._lanes.waiting == 0 and not self._submitted_locked()
                if direct:
                    if self._closed:
                        raise ClientClosedError("producer")
                    self._lanes.enter(sent_at)  # a caller arriving meanwhile takes the stream
            if direct:
                try:
                    return self._direct(request, timeout)
                finally:
                    with self._lock:
                        self._lanes.leave()
        reply, session, request_id = self._submit(request, waited=True, now=sent_at)
        try:
            answered = reply.wait(timeout)
        finally:
            with self._lock:
                self._lanes.leave()
        return self._answer(reply, session, request_id, answered, timeout, sent_at)

    def _answer(self, reply: _Reply, session: _Session, request_id: int, answered: bool, timeout: float,
                sent_at: float) -> broker_pb2.ProduceResult:
        """The response ``reply`` got (``answered``: within ``timeout``), or what it raises."""
        if not answered:
            session.pending.pop(request_id, None)
            session.hints.discard(request_id)
            if session.last_response < sent_at and not session.dead:
                log.warning("produce stream to %s answered nothing for %.1fs: reconnecting",
                            self.address, timeout)
                session.call.cancel()
            raise DeadlineExceededError(
                f"no answer from broker {self.address} within {timeout}s")
        if reply.error is not None:
            raise reply.error
        response = reply.result_
        assert response is not None
        status = response.status
        if status.code:
            raise error_from_entry(status)
        return response

    def _submitted_locked(self) -> bool:
        """Whether requests are on the stream unanswered (then a lone caller joins them)."""
        return any(s is not None and s.pending for s in self._sessions)

    def _direct(self, request: broker_pb2.ProduceEntry, timeout: float) -> broker_pb2.ProduceResult:
        """``request`` as the unary call it stands for, answered as a stream entry would be."""
        method, unary, kind = direct_call(self._stub, request)
        try:
            return broker_pb2.ProduceResult(**{kind: method(unary, timeout=timeout)})
        except grpc.RpcError as exc:
            if self._closed:
                raise ClientClosedError("producer") from None
            raise error_from_rpc(exc) from None
        except ValueError:  # "Cannot invoke RPC on closed channel!"
            if self._closed:
                raise ClientClosedError("producer") from None
            raise

    @property
    def lanes(self) -> int:
        """How many lanes callers are spread over now (1 or 2)."""
        return self._lanes.count

    def close(self) -> None:
        """Sends the hints still lingering and waits up to ``CLOSE_FLUSH_SECONDS`` for every
        hint on the stream to be answered (a clean close drops no anchored end), then fails
        every request still in flight with ClientClosedError. Idempotent."""
        with self._lock:
            self._closed = True
            sessions = [s for s in self._sessions if s is not None]
        hinted = [(s, s.hints.copy()) for s in sessions]
        for session, hints in hinted:
            if hints:
                session.queue.put(None)  # the requests end: the lingering hints leave now
        deadline = time.monotonic() + CLOSE_FLUSH_SECONDS
        for session, hints in hinted:
            for request_id in hints:
                reply = session.pending.get(request_id)
                if reply is not None:
                    reply.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._sessions = [None, None]
        for session in sessions:
            session.call.cancel()

    # --- the stream -----------------------------------------------------------------------

    def _open_locked(self, lane: int) -> _Session:
        session = _Session(self._linger_seconds)
        session.call = self._method(_requests(session))
        self._sessions[lane] = session
        threading.Thread(target=self._read, args=(session,), daemon=True,
                         name=f"txmq-produce-{self.address}-{lane}").start()
        log.debug("produce stream to %s opened (lane %d)", self.address, lane)
        return session

    def _read(self, session: _Session) -> None:
        detail = "the broker closed the stream"
        pending = session.pending
        try:
            answered = session.answered
            for response in session.call:
                session.last_response = time.monotonic()
                results = response.results
                replies = [pending.pop(result.request_id, None) for result in results]
                returning = _returning(results, replies, self._sole())
                hints = session.hints
                answered_hints = 0
                for result in results:
                    if result.request_id in hints:
                        hints.discard(result.request_id)
                        answered_hints += 1
                with answered:
                    # (Floored at 0: a hint whose caller gave up waiting counts as a request.)
                    session.unanswered = max(0, session.unanswered - (len(results) - answered_hints))
                    session.returning = returning
                    if session.unanswered <= 0:
                        answered.notify()
                for result, reply in zip(results, replies):
                    if reply is not None:
                        reply.set_result(result)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = f"{getattr(code, 'name', code)}: {exc.details() if hasattr(exc, 'details') else exc}"
        except Exception:  # never leave callers waiting
            log.exception("produce stream to %s: reader failed", self.address)
            detail = "reader failed"
        self._fail(session, detail)

    def _fail(self, session: _Session, detail: str) -> None:
        with self._lock:
            session.dead = True
            self._sessions = [None if s is session else s for s in self._sessions]
            failed, session.pending = session.pending, {}
            session.hints.clear()
            closed = self._closed
        with session.answered:
            session.answered.notify()
        session.queue.put(None)  # ends the request iterator, and gRPC's thread consuming it
        if failed:
            log.debug("produce stream to %s failed with %d in flight: %s", self.address, len(failed), detail)
        for reply in failed.values():
            if closed:
                reply.set_exception(ClientClosedError("producer"))
            else:
                reply.set_exception(UnavailableError(
                    f"produce stream to {self.address} failed ({detail})", address=self.address))
