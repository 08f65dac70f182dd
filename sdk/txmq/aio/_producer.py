"""asyncio producers: :class:`AsyncProducer` and :class:`AsyncTransactionProducer`, the
twins of ``txmq.Producer`` and ``txmq.TransactionProducer`` with the same routing, retries,
ids, errors and check answering (see their docstrings), for one event loop.

Every coroutine of the process shares one Produce stream per broker: many concurrent
transactions travel in few stream messages (see ``_stream.py``).
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import time
from typing import Any, Callable, Sequence

from .._errors import InvalidFieldError, NoLeaderError, TxmqError
from .._client import QueueRoute, positive
from .._checks import InProgress
from .._faults import RoutingStats
from .._global import OPEN_GLOBAL_RETRY_SECONDS, GlobalTransactionResult, send_global_async
from .._names import in_namespace, validate_group
from .._producer import _HOST, DEFAULT_MAX_BODY_BYTES, new_client_id
from .._tls import TLS
from .._sending import (Pick, Rebind, Request, Sleep, Step, configure, end_transaction, finished, half_builder,
                        outcome_of, pick_queue, run_async, send_new, validate)
from .._types import (LocalTransactionState, Message, SendReceipt, TransactionMessage, TransactionResult,
                      TransactionState, message_to_pb)
from ..v1 import broker_pb2, common_pb2
from .._decisions import Address, Decisions, end_by_id, is_anchored
from ._anchored import AsyncAnchoredTransaction, AsyncDecisionStore
from ._checks import AsyncCheckResponder
from ._client import AsyncClient

log = logging.getLogger(__name__)


class AsyncProducer:
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
        #: First messages of multi-message transactions being sent now (checks: IN_PROGRESS).
        self._open_globals: set[str] = set()

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
        route, pb, response = await self._send_new(message.topic, lambda route, message_id: message_to_pb(
            message, message_id, route.queue_id, common_pb2.MESSAGE_TYPE_NORMAL, int(time.time() * 1000), _HOST),
            message_group=message.message_group)
        return SendReceipt(message_id=response.message_id or pb.message_id, topic=message.topic,
                           broker_name=response.broker_name or route.broker_name,
                           queue_id=response.queue_id, queue_offset=response.queue_offset)

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


class AsyncTransactionProducer(AsyncProducer):
    """Sends messages in transactions from coroutines: half message, ``await
    listener.execute_local_transaction``, EndTransaction — :class:`txmq.TransactionProducer`
    for asyncio. Answers its group's checks for as long as it is open, running at most
    ``check_concurrency`` ``check_local_transaction`` coroutines at once (and taking no more
    checks than it can start soon: flow control, as the sync producer).

    Start it with ``async with`` (or ``await producer.start()``) inside the event loop that
    will use it.

    Anchored transactions (``decisions=txmq.anchored.Decisions(...)``, then
    ``async with producer.transaction(conn)``): no listener needed (docs/anchored-transactions.md).
    """

    def __init__(self, nameservers: str | Sequence[str], *, producer_group: str,
                 listener: AsyncTransactionListener | None = None, client_id: str | None = None,
                 send_timeout_seconds: float = 3.0, max_attempts: int = 3, retry_backoff_seconds: float = 0.1,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, request_timeout_seconds: float = 3.0,
                 route_refresh_seconds: float = 30.0, answer_checks: bool = True, check_concurrency: int = 16,
                 checker_refresh_seconds: float = 5.0, tls: TLS | None = None, token: str | None = None,
                 namespace: str = "", decisions: Decisions | None = None) -> None:
        validate_group("producer_group", in_namespace(namespace, "producer_group", producer_group))
        if listener is None and decisions is None:
            raise InvalidFieldError("listener", "give a listener (send_in_transaction) or decisions "
                                                "(transaction): something must answer checks")
        if decisions is not None and not isinstance(decisions, Decisions):
            raise InvalidFieldError("decisions", f"must be a txmq.anchored.Decisions, got {type(decisions).__name__}")
        for method in ("execute_local_transaction", "check_local_transaction") if listener is not None else ():
            if not asyncio.iscoroutinefunction(getattr(listener, method, None)):
                raise InvalidFieldError("listener", f"{method}() must be a coroutine function (async def)")
        if not isinstance(check_concurrency, int) or check_concurrency < 1:
            raise InvalidFieldError("check_concurrency", f"must be an integer >= 1, got {check_concurrency!r}")
        positive("checker_refresh_seconds", checker_refresh_seconds)
        if client_id is not None and not 0 < len(client_id.encode()) <= 255:
            raise InvalidFieldError("client_id", "must be 1-255 bytes")
        super().__init__(nameservers, producer_group=producer_group, send_timeout_seconds=send_timeout_seconds,
                         max_attempts=max_attempts, retry_backoff_seconds=retry_backoff_seconds,
                         max_body_bytes=max_body_bytes, request_timeout_seconds=request_timeout_seconds,
                         route_refresh_seconds=route_refresh_seconds, tls=tls, token=token, namespace=namespace)
        self.listener = listener
        self.client_id = client_id or new_client_id()
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
        return self._checks.connected if self._checks is not None else []

    async def _check_local_transaction(self, message: TransactionMessage) -> "LocalTransactionState | InProgress":
        if message.message_id in self._abandoned:
            log.info("check of transaction %s: its half message %s was an attempt given up on, "
                     "the local transaction never ran: ROLLBACK", message.transaction_id, message.message_id)
            return LocalTransactionState.ROLLBACK
        if message.message_id in self._open_globals:  # a multi-message transaction still being sent here
            return InProgress(retry_after_seconds=OPEN_GLOBAL_RETRY_SECONDS)
        if self._decision_store is not None and is_anchored(message.properties):
            return await self._decision_store.check(message)
        if self.listener is None:
            log.warning("check of transaction %s: not an anchored transaction and this producer has no "
                        "listener: UNKNOWN", message.transaction_id)
            return LocalTransactionState.UNKNOWN
        return await self.listener.check_local_transaction(message)

    # --- anchored transactions ------------------------------------------------------------

    def transaction(self, connection: Any, *, end: str = "hint") -> AsyncAnchoredTransaction:
        """An anchored transaction on ``connection`` (a psycopg ``AsyncConnection`` or a
        SQLAlchemy ``AsyncSession``): :meth:`txmq.TransactionProducer.transaction` for
        asyncio, used as ``async with producer.transaction(conn) as tx:``."""
        return AsyncAnchoredTransaction(self, connection, end)

    async def _send_half(self, message: Message) -> TransactionMessage:
        route, pb, sent = await self._send_new(message.topic, half_builder(message, self.producer_group,
                                                                           self.client_id, _HOST),
                                               message_group=message.message_group)
        return TransactionMessage(message=message, message_id=sent.message_id or pb.message_id,
                                  transaction_id=sent.transaction_id, broker_name=sent.broker_name or route.broker_name,
                                  queue_id=route.queue_id)

    async def _end_by_id(self, transaction_id: str, decision: LocalTransactionState,
                         deadline: float) -> tuple[TransactionState | None, TxmqError | None]:
        async def perform(step: Step) -> Any:  # as the sync producer's: on the stream
            if type(step) is Address:
                return await self._client.broker_address(step.broker, refresh=step.refresh)
            if type(step) is Request:
                return await self._request(step.shard, step.address, step.entry, stream=True)
            return await self._perform(step)

        store = self._decision_store

        def clock() -> float:  # once the producer is closing, no more retries
            return math.inf if store is not None and store.closing else time.monotonic()

        return await run_async(end_by_id(transaction_id, decision, self.producer_group, deadline, clock,
                                         self.retry_backoff_seconds), perform)

    async def send_in_transaction(self, message: "Message | Sequence[Message]",
                                  arg: Any = None) -> "TransactionResult | GlobalTransactionResult":
        """As :meth:`txmq.TransactionProducer.send_in_transaction`, awaiting the listener
        (several messages: one multi-message transaction, its parts sent concurrently)."""
        if self.listener is None:
            raise InvalidFieldError("listener", "send_in_transaction needs an AsyncTransactionListener; "
                                    "with only decisions use transaction()")
        if isinstance(message, (list, tuple)):
            return await send_global_async(self, message, arg, _HOST)
        message = self._validate(message)

        route, pb, sent = await self._send_new(message.topic, half_builder(message, self.producer_group,
                                                                           self.client_id, _HOST),
                                               message_group=message.message_group)
        broker_name = sent.broker_name or route.broker_name
        half = TransactionMessage(message=message, message_id=sent.message_id or pb.message_id,
                                  transaction_id=sent.transaction_id, broker_name=broker_name,
                                  queue_id=route.queue_id)
        local_state = await self._execute(half, arg)
        state, end_error = await self._end(route, message.topic, half, local_state)
        return TransactionResult(message_id=half.message_id, transaction_id=half.transaction_id,
                                 local_state=local_state, state=state, topic=message.topic,
                                 broker_name=broker_name, queue_id=route.queue_id, end_error=end_error)

    async def _execute(self, half: TransactionMessage, arg: Any) -> LocalTransactionState:
        try:
            state = await self.listener.execute_local_transaction(half, arg)
        except asyncio.CancelledError:
            raise  # the caller gave up: the transaction stays PREPARED and the check decides
        except Exception:  # noqa: BLE001 - the local transaction's failure is an answer: UNKNOWN
            log.exception("execute_local_transaction raised for transaction %s: ending it as UNKNOWN",
                          half.transaction_id)
            return LocalTransactionState.UNKNOWN
        return outcome_of(state, half.transaction_id)

    async def _end(self, route: QueueRoute, topic: str, half: TransactionMessage,
                   local_state: LocalTransactionState) -> tuple[TransactionState | None, TxmqError | None]:
        return await run_async(end_transaction(self, route, topic, half, local_state, self.producer_group),
                               self._perform)
