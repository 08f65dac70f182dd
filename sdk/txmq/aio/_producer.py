"""asyncio producers: :class:`AsyncProducer` and :class:`AsyncTransactionProducer`, the
twins of ``txmq.Producer`` and ``txmq.TransactionProducer`` with the same routing, retries,
ids, errors and check answering (see their docstrings), for one event loop.

Every coroutine of the process shares one Produce stream per broker: many concurrent
transactions travel in few stream messages (see ``_stream.py``).
"""

from __future__ import annotations

import abc
import asyncio
import inspect
import logging
import math
import time
from typing import Any, Awaitable, Callable, Sequence

from .. import _tracing as tracing
from .._calling import QueueRoute, positive
from .._checking import InProgress
from .._decisions import Address, Decisions, end_by_id
from .._errors import InvalidFieldError, NoLeaderError, TxmqError
from .._faults import RoutingStats
from .._global import GlobalTransactionResult, send_global_async
from .._producing import (DEFAULT_MAX_BODY_BYTES, HOST, Ask, ExplicitTransaction, HalfAttempts, OpenTransactions,
                          check_transaction_options, executed, half_message, keyed, new_client_id, normal_builder,
                          receipt, transaction_key, transaction_result, who_answers)
from .._sending import (Pick, Rebind, Request, SenderOptions, Sleep, Step, configure, end_transaction, finished, half_builder,
                        pick_other, pick_queue, run_async, send_new, validate)
from .._tls import TLS
from .._types import (LocalTransactionState, Message, SendReceipt, TransactionMessage, TransactionResult,
                      TransactionState)
from ..v1 import broker_pb2, common_pb2
from ._anchored import AsyncAnchoredTransaction, AsyncDecisionStore
from ._checks import AsyncCheckResponder
from ._client import AsyncClient

log = logging.getLogger(__name__)


class AsyncProducer(SenderOptions):
    """Sends normal messages from coroutines. Use it as ``async with`` (or call
    :meth:`close`). Routing and retries are those of :class:`txmq.Producer`: a send that
    fails transiently before anything was acknowledged moves to another shard with a new
    id when one is usable, else is retried on its shard with the same id (deduplicated)."""

    def __init__(self, nameservers: str | Sequence[str], *, producer_group: str = "",
                 send_timeout_seconds: float = 3.0, max_attempts: int = 3, retry_backoff_seconds: float = 0.1,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, request_timeout_seconds: float = 3.0,
                 route_refresh_seconds: float = 30.0, tls: TLS | None = None, token: str | None = None,
                 namespace: str = "") -> None:
        configure(self, producer_group=producer_group, send_timeout_seconds=send_timeout_seconds,
                  max_attempts=max_attempts, retry_backoff_seconds=retry_backoff_seconds, max_body_bytes=max_body_bytes,
                  namespace=namespace)
        self._client = AsyncClient(nameservers, request_timeout_seconds=request_timeout_seconds,
                                   route_refresh_seconds=route_refresh_seconds, what="producer", tls=tls,
                                   token=token)

    async def close(self) -> None:
        """Closes the connections; sends in flight fail with ClientClosedError."""
        await self._client.close()

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def routing_stats(self) -> RoutingStats:
        return self._client.faults.stats()

    def stream_stats(self) -> tuple[int, int]:
        """(stream messages sent, requests they carried) over every broker's stream: how
        well concurrent calls batch."""
        streams = list(self._client._streams.values())
        return sum(s.messages_sent for s in streams), sum(s.requests_sent for s in streams)

    async def send(self, message: Message) -> SendReceipt:
        """Stores a normal message, visible to consumers at once."""
        message = self._validate(message)
        with tracing.send(message, transactional=False) as traced:
            message = traced.inject(message)
            route, pb, response = await self._send_new(message.topic, normal_builder(message),
                                                       message_group=message.message_group)
            sent = receipt(message, route, pb, response)
            tracing.sent(traced, message_id=sent.message_id, queue_id=sent.queue_id, broker_name=sent.broker_name)
        return sent

    def _validate(self, message: Message) -> Message:
        """The message as it is sent (its topic in the producer's namespace), once valid."""
        return validate(self, message)

    async def _pick_queue(self, topic: str, exclude: frozenset[str] | set[str] = frozenset(),
                          message_group: str = "") -> QueueRoute:
        return pick_queue(self, await self._client.route(topic), topic, exclude, message_group)

    async def _rebind(self, topic: str, route: QueueRoute, address: str) -> str:
        self._client.invalidate_route(topic)
        try:
            await self._client.route(topic, refresh=True)
            return await self._client.broker_address(route.broker_name)
        except NoLeaderError:
            raise  # the shard is between leaders: the send waits for one (``_sending.rebind``)
        except TxmqError as err:
            log.debug("cannot refresh the route of %s: %s", topic, err)
            return address

    async def _request(self, shard: str, address: str, entry: broker_pb2.ProduceEntry,
                       *, send: bool = False, stream: bool = False) -> broker_pb2.ProduceResult:
        started = time.monotonic()
        try:
            result = await self._client.produce_stream(address).request(entry, self.send_timeout_seconds,
                                                                        stream=stream)
        except TxmqError as err:
            finished(self._client.faults, shard, err)
            raise
        finished(self._client.faults, shard, None, time.monotonic() - started if send else None)
        return result

    async def _perform(self, step: Step) -> Any:
        """One step of a send (see ``txmq._sending``), awaited."""
        if type(step) is Request:
            return await self._request(step.shard, step.address, step.entry, send=step.send)
        if type(step) is Pick:
            if step.moving:
                return pick_other(self, await self._client.route(step.topic), step.exclude)
            return await self._pick_queue(step.topic, step.exclude, step.message_group)
        if type(step) is Sleep:
            await asyncio.sleep(step.seconds)
            return None
        assert type(step) is Rebind
        return await self._rebind(step.topic, step.route, step.address)

    async def _send_new(self, topic: str, build: Callable[[QueueRoute, str], common_pb2.Message],
                        message_group: str = "") -> tuple[QueueRoute, common_pb2.Message, broker_pb2.SendMessageResponse]:
        """As ``txmq.Producer._send_new`` (the same steps, ``txmq._sending.send_new``)."""
        return await run_async(send_new(self, topic, build, message_group), self._perform)


class AsyncTransactionListener(abc.ABC):
    """The application's side of a transaction, as coroutines (see
    :class:`txmq.TransactionListener` for the contract)."""

    @abc.abstractmethod
    async def execute_local_transaction(self, message: TransactionMessage, arg: Any) -> LocalTransactionState:
        """Runs the local transaction. Returning None or raising counts as UNKNOWN."""

    @abc.abstractmethod
    async def check_local_transaction(self, message: TransactionMessage) -> "LocalTransactionState | InProgress":
        """The state of the local transaction of ``message`` (a :class:`txmq.CheckMessage`),
        for the checker: COMMIT, ROLLBACK, UNKNOWN (spends a check) or
        ``txmq.InProgress(retry_after_seconds=...)`` (spends nothing)."""


#: A checker: ``(message) -> LocalTransactionState | InProgress``, a coroutine function or a
#: plain function (called on the event loop).
AsyncChecker = Callable[[TransactionMessage],
                        "Awaitable[LocalTransactionState | InProgress] | LocalTransactionState | InProgress"]


class AsyncTransactionProducer(AsyncProducer):
    """Sends messages in transactions from coroutines: half message, ``await
    listener.execute_local_transaction``, EndTransaction — :class:`txmq.TransactionProducer`
    for asyncio. Answers its group's checks for as long as it is open, running at most
    ``check_concurrency`` checks at once (and taking no more checks than it can start
    soon: flow control, as the sync producer).

    Three forms, as the sync producer's: ``send_in_transaction`` with a ``listener``;
    ``async with producer.begin_transaction(key=...) as tx`` (the explicit form) with a
    ``checker``; ``async with producer.transaction(conn)`` (anchored) with ``decisions``.

    Start it with ``async with`` (or ``await producer.start()``) inside the event loop that
    will use it.
    """

    def __init__(self, nameservers: str | Sequence[str], *, producer_group: str,
                 listener: AsyncTransactionListener | None = None, checker: AsyncChecker | None = None,
                 client_id: str | None = None,
                 send_timeout_seconds: float = 3.0, max_attempts: int = 3, retry_backoff_seconds: float = 0.1,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, request_timeout_seconds: float = 3.0,
                 route_refresh_seconds: float = 30.0, answer_checks: bool = True, check_concurrency: int = 16,
                 checker_refresh_seconds: float = 5.0, tls: TLS | None = None, token: str | None = None,
                 open_transaction_retry_seconds: float = 5.0, namespace: str = "",
                 decisions: Decisions | None = None) -> None:
        check_transaction_options(namespace=namespace, producer_group=producer_group, listener=listener,
                                  checker=checker, decisions=decisions, client_id=client_id,
                                  checker_refresh_seconds=checker_refresh_seconds, workers_name="check_concurrency",
                                  workers=check_concurrency, listener_method_ok=inspect.iscoroutinefunction,
                                  listener_problem=lambda m: f"{m}() must be a coroutine function (async def)")
        super().__init__(nameservers, producer_group=producer_group, send_timeout_seconds=send_timeout_seconds,
                         max_attempts=max_attempts, retry_backoff_seconds=retry_backoff_seconds,
                         max_body_bytes=max_body_bytes, request_timeout_seconds=request_timeout_seconds,
                         route_refresh_seconds=route_refresh_seconds, tls=tls, token=token, namespace=namespace)
        self.listener = listener
        self.checker: AsyncChecker | None = (
            checker if checker is not None else listener.check_local_transaction if listener is not None else None)
        self.open_transaction_retry_seconds = positive("open_transaction_retry_seconds",
                                                       open_transaction_retry_seconds)
        self.client_id = client_id or new_client_id()
        # Half messages of transactions still open here (explicit, multi-message): IN_PROGRESS.
        self._open = OpenTransactions()
        #: Anchored transactions (``transaction()``): the group's decisions table.
        self._decision_store = AsyncDecisionStore(self, decisions) if decisions is not None else None
        self._checks: AsyncCheckResponder | None = None
        if answer_checks:
            self._checks = AsyncCheckResponder(self._client, producer_group=self.producer_group,
                                               client_id=self.client_id, check=self._check_local_transaction,
                                               check_concurrency=check_concurrency,
                                               refresh_seconds=float(checker_refresh_seconds))

    async def start(self) -> "AsyncTransactionProducer":
        """Starts answering checks (idempotent)."""
        if self._decision_store is not None:
            self._decision_store.start()
        if self._checks is not None:
            self._checks.start()
        return self

    async def __aenter__(self) -> "AsyncTransactionProducer":
        return await self.start()

    async def close(self) -> None:
        """Unsubscribes from the checkers, then closes the connections."""
        if self._checks is not None:
            await self._checks.close()
        if self._decision_store is not None:
            await self._decision_store.close()
        await super().close()

    def connected_checkers(self) -> list[str]:
        """Names of the checkers whose stream is open and subscribed now (empty with
        ``answer_checks=False``)."""
        return self._checks.connected if self._checks is not None else []

    async def _check_local_transaction(self, message: TransactionMessage) -> "LocalTransactionState | InProgress":
        """As :meth:`txmq.TransactionProducer._check_local_transaction` (``txmq._producing.who_answers``)."""
        answer = who_answers(self, message, self.checker is not None)
        if answer is Ask.DECISIONS:
            assert self._decision_store is not None
            return await self._decision_store.check(message)
        if answer is Ask.CHECKER:
            assert self.checker is not None
            outcome = self.checker(message)
            return await outcome if inspect.isawaitable(outcome) else outcome
        return answer

    # --- anchored transactions ------------------------------------------------------------

    def transaction(self, connection: Any, *, end: str = "hint") -> AsyncAnchoredTransaction:
        """An anchored transaction on ``connection`` (a psycopg ``AsyncConnection`` or a
        SQLAlchemy ``AsyncSession``): :meth:`txmq.TransactionProducer.transaction` for
        asyncio, used as ``async with producer.transaction(conn) as tx:``."""
        return AsyncAnchoredTransaction(self, connection, end)

    async def _send_half(self, message: Message) -> TransactionMessage:
        half, _route = await self._send_half_routed(message)
        return half

    async def _send_half_routed(self, message: Message, *, keep_open: bool = False,
                                ) -> tuple[TransactionMessage, QueueRoute]:
        """As the sync producer's ``_send_half``: each attempt open here while the send
        runs (:class:`HalfAttempts`); with ``keep_open`` the stored one stays open."""
        with HalfAttempts(self._open, half_builder(message, self.producer_group, self.client_id, HOST)) as attempts:
            route, pb, sent = await self._send_new(message.topic, attempts.build, message_group=message.message_group)
            if keep_open:
                attempts.keep(pb.message_id)
            return half_message(message, route, pb, sent), route

    async def _end_by_id(self, transaction_id: str, decision: LocalTransactionState, deadline: float,
                         *, hint: bool = True) -> tuple[TransactionState | None, TxmqError | None]:
        async def perform(step: Step | Address) -> Any:  # as the sync producer's (hint: on the stream)
            if isinstance(step, Address):
                return await self._client.broker_address(step.broker, refresh=step.refresh)
            if type(step) is Request:
                return await self._request(step.shard, step.address, step.entry, stream=hint)
            return await self._perform(step)

        store = self._decision_store

        def clock() -> float:  # once the producer is closing, no more retries
            return math.inf if store is not None and store.closing else time.monotonic()

        return await run_async(end_by_id(transaction_id, decision, self.producer_group, deadline, clock,
                                         self.retry_backoff_seconds), perform)

    # --- the explicit form ----------------------------------------------------------------

    def begin_transaction(self, *, key: str | None = None) -> "AsyncTransaction":
        """Starts an explicit transaction (:meth:`txmq.TransactionProducer.begin_transaction`
        for asyncio)::

            async with producer.begin_transaction(key=order_id) as tx:
                await producer.send(txmq.Message("orders", body), tx)   # half message: invisible
                await db.commit_order(order_id)                          # your local transaction
            # committed at the end of the block, rolled back if it raised

        or ``await tx.commit()`` / ``await tx.rollback()``. Record ``key`` with your work, so
        the ``checker`` answers a check by it; while the transaction is open here its checks
        are answered IN_PROGRESS (retried after ``open_transaction_retry_seconds``)."""
        key = transaction_key(key)
        self._client.check_open()
        return AsyncTransaction(self, key)

    async def send(self, message: Message,
                   transaction: "AsyncTransaction | None" = None) -> SendReceipt:
        """A normal message, or with ``transaction`` a half message of that transaction
        (invisible until it commits)."""
        if transaction is None:
            return await super().send(message)
        if not isinstance(transaction, AsyncTransaction) or transaction.producer is not self:
            raise InvalidFieldError("transaction", "must come from this producer's begin_transaction()")
        transaction._check_open()
        message = self._validate(message)
        with tracing.send(message, transactional=True, client_id=self.client_id) as traced:
            half, route = await self._send_half_routed(keyed(traced.inject(message), transaction.key),
                                                       keep_open=True)
            tracing.sent(traced, message_id=half.message_id, queue_id=route.queue_id, broker_name=half.broker_name,
                         transaction_id=half.transaction_id)
        transaction._add(half, route)
        return SendReceipt(message_id=half.message_id, topic=message.topic, broker_name=half.broker_name,
                           queue_id=route.queue_id, queue_offset=-1)

    def _close_transaction(self, halves: list[TransactionMessage]) -> None:
        self._open.discard(*(half.message_id for half in halves))

    # --- with a listener ------------------------------------------------------------------

    async def send_in_transaction(self, message: Message | list[Message] | tuple[Message, ...],
                                  arg: Any = None) -> TransactionResult | GlobalTransactionResult:
        """As :meth:`txmq.TransactionProducer.send_in_transaction`, awaiting the listener
        (several messages: one multi-message transaction, its parts sent concurrently)."""
        if self.listener is None:
            raise InvalidFieldError("listener", "send_in_transaction needs an AsyncTransactionListener; "
                                    "with only a checker use begin_transaction()")
        if isinstance(message, (list, tuple)):
            return await send_global_async(self, message, arg, HOST)
        message = self._validate(message)
        with tracing.send(message, transactional=True, client_id=self.client_id) as traced:
            # Open here until its end is sent (as the sync producer's).
            half, route = await self._send_half_routed(traced.inject(message), keep_open=True)
            try:
                tracing.sent(traced, message_id=half.message_id, queue_id=route.queue_id,
                             broker_name=half.broker_name, transaction_id=half.transaction_id)
                local_state, local_error = await self._execute(half, arg, traced)
                state, end_error = await self._end(route, message.topic, half, local_state, traced)
            finally:
                self._open.discard(half.message_id)
        return transaction_result(half, route, local_state, state, end_error, local_error)

    async def _execute(self, half: TransactionMessage, arg: Any,
                       traced: tracing.Operation = tracing.NOOP) -> tuple[LocalTransactionState, Exception | None]:
        assert self.listener is not None
        with tracing.local_transaction(traced, half) as local, local.current():
            try:
                returned = await self.listener.execute_local_transaction(half, arg)
            except asyncio.CancelledError:
                raise  # the caller gave up: the transaction stays PREPARED and the check decides
            except Exception as exc:  # noqa: BLE001 - the local transaction's failure is an answer: UNKNOWN
                local.fail(exc)
                return executed(None, exc, half.transaction_id), exc
        return executed(returned, None, half.transaction_id), None

    async def _end(self, route: QueueRoute, topic: str, half: TransactionMessage, local_state: LocalTransactionState,
                   traced: tracing.Operation | None = None) -> tuple[TransactionState | None, TxmqError | None]:
        with tracing.end(traced, half, local_state) as ending:
            state, error = await run_async(end_transaction(self, route, topic, half, local_state,
                                                           self.producer_group), self._perform)
            tracing.ended(ending, state, error)
        return state, error


class AsyncTransaction:
    """An explicit transaction of an :class:`AsyncTransactionProducer`
    (:meth:`AsyncTransactionProducer.begin_transaction`): :class:`txmq.Transaction` for
    asyncio. Its messages are half messages until :meth:`commit` or :meth:`rollback` ends
    them all; ``async with`` commits at the end of the block (rolls back if it raised)."""

    def __init__(self, producer: AsyncTransactionProducer, key: str) -> None:
        self.producer = producer
        self._state = ExplicitTransaction(key)
        #: Stamped on each message (``message.transaction_key`` in checks).
        self.key = key

    @property
    def messages(self) -> list[TransactionMessage]:
        """The half messages sent so far, with their transaction ids."""
        return [h for h, _r in self._state.halves]

    def _check_open(self) -> None:
        self._state.check_open()

    def _add(self, half: TransactionMessage, route: QueueRoute) -> None:
        self._state.halves.append((half, route))

    async def commit(self) -> list[TransactionResult]:
        """Makes every message of the transaction visible (see :meth:`txmq.Transaction.commit`;
        the EndTransactions go concurrently)."""
        return await self._end(LocalTransactionState.COMMIT)

    async def rollback(self) -> list[TransactionResult]:
        """Discards every message of the transaction (none is ever delivered)."""
        return await self._end(LocalTransactionState.ROLLBACK)

    async def _end(self, decision: LocalTransactionState) -> list[TransactionResult]:
        halves = self._state.end(decision)
        try:
            ended = await asyncio.gather(*(self.producer._end(route, half.topic, half, decision)
                                           for half, route in halves))
        finally:
            self.producer._close_transaction(self.messages)
        return [transaction_result(half, route, decision, state, error)
                for (half, route), (state, error) in zip(halves, ended)]

    async def __aenter__(self) -> "AsyncTransaction":
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        decision = self._state.on_exit(exc_type is not None)
        if decision is not None:
            await self._end(decision)
