"""asyncio producers: :class:`AsyncProducer` and :class:`AsyncTransactionProducer`, the
twins of ``txmq.Producer`` and ``txmq.TransactionProducer`` with the same routing, retries,
ids, errors and check answering (see their docstrings), for one event loop.

Every coroutine of the process shares one Produce stream per broker: many concurrent
transactions travel in few stream messages (see ``_stream.py``).
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import os
import time
from typing import Any, Callable, Sequence

from .._errors import (ClientClosedError, InvalidFieldError, MessageTooLargeError, QueueNotFoundError,
                       TopicNotFoundError, TransactionStateError, TxmqError, WrongBrokerError)
from .._client import QueueRoute, positive
from .._checks import InProgress
from .._faults import Abandoned, OverloadBackoff, RetryAction, RoutingStats, retry_action
from .._fifo import group_queue_index, group_route
from .._global import OPEN_GLOBAL_RETRY_SECONDS, GlobalTransactionResult, send_global_async
from .._ids import MessageId
from .._names import in_namespace, validate_group, validate_send_topic
from .._producer import _HOST, DEFAULT_MAX_BODY_BYTES, _queue_key, new_client_id
from .._tls import TLS
from .._types import (RESOLUTION_TO_PB, LocalTransactionState, Message, SendReceipt, TransactionMessage, namespaced,
                      TransactionResult, TransactionState, message_to_pb, state_from_name, state_from_pb)
from ..v1 import broker_pb2, common_pb2
from ._checks import AsyncCheckResponder
from ._client import AsyncClient

log = logging.getLogger(__name__)

_STALE_ROUTE = (QueueNotFoundError, TopicNotFoundError, WrongBrokerError)


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
        # A namespace qualifies the group and every topic sent to (txmq.names.qualify).
        producer_group = in_namespace(namespace, "producer_group", producer_group)
        self.namespace = namespace
        if producer_group:
            validate_group("producer_group", producer_group)
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidFieldError("max_attempts", f"must be an integer >= 1, got {max_attempts!r}")
        if not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise InvalidFieldError("max_body_bytes", f"must be a positive integer, got {max_body_bytes!r}")
        self.producer_group = producer_group
        self.send_timeout_seconds = positive("send_timeout_seconds", send_timeout_seconds)
        self.retry_backoff_seconds = positive("retry_backoff_seconds", retry_backoff_seconds)
        self.max_attempts = max_attempts
        self.max_body_bytes = max_body_bytes
        self._client = AsyncClient(nameservers, request_timeout_seconds=request_timeout_seconds,
                                   route_refresh_seconds=route_refresh_seconds, what="producer", tls=tls,
                                   token=token)
        self._next_queue = itertools.count(int.from_bytes(os.urandom(2), "big"))
        self._group_routes: dict[str, Sequence[QueueRoute]] = {}  # as txmq.Producer
        self._abandoned: Abandoned[str] = Abandoned()
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
        if not isinstance(message, Message):
            raise InvalidFieldError("message", f"must be a txmq.Message, got {type(message).__name__}")
        self._client.check_open()
        message = namespaced(message, self.namespace)
        validate_send_topic(message.topic)
        if len(message.body) > self.max_body_bytes:
            raise MessageTooLargeError(len(message.body), self.max_body_bytes)
        return message

    async def _pick_queue(self, topic: str, exclude: frozenset[str] | set[str] = frozenset(),
                          message_group: str = "") -> QueueRoute:
        routes = await self._client.route(topic)
        if message_group:  # as txmq.Producer._pick_queue
            routes = self._group_routes[topic] = group_route(self._group_routes.get(topic), routes, _queue_key)
            return routes[group_queue_index(message_group, len(routes))]
        return self._client.faults.choose(routes, lambda r: r.broker_name, next(self._next_queue), exclude)

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(min(self.retry_backoff_seconds * 2 ** (attempt - 1), 2.0))

    async def _rebind(self, topic: str, route: QueueRoute, address: str) -> str:
        self._client.invalidate_route(topic)
        try:
            await self._client.route(topic, refresh=True)
            return await self._client.broker_address(route.broker_name)
        except TxmqError as err:
            log.debug("cannot refresh the route of %s: %s", topic, err)
            return address

    async def _request(self, shard: str, address: str, entry: broker_pb2.ProduceEntry,
                       *, send: bool = False) -> broker_pb2.ProduceResult:
        started = time.monotonic()
        try:
            result = await self._client.produce_stream(address).request(entry, self.send_timeout_seconds)
        except TxmqError as err:
            if err.retryable:
                self._client.faults.failed(shard)
            elif not isinstance(err, ClientClosedError):
                self._client.faults.succeeded(shard, None)
            raise
        self._client.faults.succeeded(shard, time.monotonic() - started if send else None)
        return result

    async def _send_new(self, topic: str, build: Callable[[QueueRoute, str], common_pb2.Message],
                        message_group: str = "") -> tuple[QueueRoute, common_pb2.Message, broker_pb2.SendMessageResponse]:
        """As ``txmq.Producer._send_new``."""
        route = await self._pick_queue(topic, message_group=message_group)
        pb = build(route, MessageId.new(route.broker_name, route.queue_id).encode())
        address = route.broker_address
        failed_on: set[str] = set()
        attempt = 1
        overload = OverloadBackoff()
        while True:
            entry = broker_pb2.ProduceEntry(send_message=broker_pb2.SendMessageRequest(message=pb))
            try:
                return route, pb, (await self._request(route.broker_name, address, entry, send=True)).send_message
            except TxmqError as err:
                pause = overload.delay(err)
                if pause is not None:  # nothing applied: the same message (same id) again, later
                    await asyncio.sleep(pause)
                    continue
                action = retry_action(err, bound=False)
                if action is not RetryAction.FAIL or isinstance(err, _STALE_ROUTE):
                    self._client.invalidate_route(topic)
                if action is RetryAction.FAIL or attempt >= self.max_attempts:
                    if action is not RetryAction.FAIL:
                        self._abandon(pb)
                    raise
                moved = route
                if action is not RetryAction.SAME_SHARD and not message_group:
                    failed_on.add(route.broker_name)
                    try:
                        moved = await self._pick_queue(topic, failed_on)
                    except TxmqError as refresh_error:
                        log.debug("cannot refresh the route of %s: %s", topic, refresh_error)
                log.debug("send of %s to %s failed (attempt %d of %d), retrying on %s: %s",
                          pb.message_id, route.broker_name, attempt, self.max_attempts, moved.broker_name, err)
            if moved.broker_name != route.broker_name:
                self._client.faults.rerouted()
                self._abandon(pb)
                route, address = moved, moved.broker_address
                pb = build(route, MessageId.new(route.broker_name, route.queue_id).encode())
            else:
                await self._backoff(attempt)
                address = await self._rebind(topic, route, address)
            attempt += 1

    def _abandon(self, pb: common_pb2.Message) -> None:
        if pb.type == common_pb2.MESSAGE_TYPE_TRANSACTION:
            self._abandoned.add(pb.message_id)


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
    """

    def __init__(self, nameservers: str | Sequence[str], *, producer_group: str,
                 listener: AsyncTransactionListener, client_id: str | None = None,
                 send_timeout_seconds: float = 3.0, max_attempts: int = 3, retry_backoff_seconds: float = 0.1,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, request_timeout_seconds: float = 3.0,
                 route_refresh_seconds: float = 30.0, answer_checks: bool = True, check_concurrency: int = 16,
                 checker_refresh_seconds: float = 5.0, tls: TLS | None = None, token: str | None = None,
                 namespace: str = "") -> None:
        validate_group("producer_group", in_namespace(namespace, "producer_group", producer_group))
        for method in ("execute_local_transaction", "check_local_transaction"):
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
        self._checks: AsyncCheckResponder | None = None
        if answer_checks:
            self._checks = AsyncCheckResponder(self._client, producer_group=self.producer_group,
                                               client_id=self.client_id, check=self._check_local_transaction,
                                               check_concurrency=check_concurrency,
                                               refresh_seconds=float(checker_refresh_seconds))

    async def start(self) -> "AsyncTransactionProducer":
        """Starts answering checks (idempotent)."""
        if self._checks is not None:
            self._checks.start()
        return self

    async def __aenter__(self) -> "AsyncTransactionProducer":
        return await self.start()

    async def close(self) -> None:
        """Unsubscribes from the checkers, then closes the connections."""
        if self._checks is not None:
            await self._checks.close()
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
        return await self.listener.check_local_transaction(message)

    async def send_in_transaction(self, message: "Message | Sequence[Message]",
                                  arg: Any = None) -> "TransactionResult | GlobalTransactionResult":
        """As :meth:`txmq.TransactionProducer.send_in_transaction`, awaiting the listener
        (several messages: one multi-message transaction, its parts sent concurrently)."""
        if isinstance(message, (list, tuple)):
            return await send_global_async(self, message, arg, _HOST)
        message = self._validate(message)

        def build(route: QueueRoute, message_id: str) -> common_pb2.Message:
            pb = message_to_pb(message, message_id, route.queue_id, common_pb2.MESSAGE_TYPE_TRANSACTION,
                               int(time.time() * 1000), _HOST)
            pb.producer_group = self.producer_group
            pb.producer_client_id = self.client_id
            if message.check_immunity_seconds:
                pb.check_immunity_seconds = message.check_immunity_seconds
            return pb

        route, pb, sent = await self._send_new(message.topic, build, message_group=message.message_group)
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
        if state is None:
            return LocalTransactionState.UNKNOWN
        if not isinstance(state, LocalTransactionState):
            log.warning("execute_local_transaction returned %r for transaction %s, not a "
                        "LocalTransactionState: ending it as UNKNOWN", state, half.transaction_id)
            return LocalTransactionState.UNKNOWN
        return state

    async def _end(self, route: QueueRoute, topic: str, half: TransactionMessage,
                   local_state: LocalTransactionState) -> tuple[TransactionState | None, TxmqError | None]:
        end = broker_pb2.EndTransactionRequest(
            transaction_id=half.transaction_id, message_id=half.message_id,
            resolution=RESOLUTION_TO_PB[local_state], source=common_pb2.TRANSACTION_SOURCE_CLIENT,
            producer_group=self.producer_group)
        address = route.broker_address
        attempt = 1
        while True:
            try:
                response = await self._request(half.broker_name, address, broker_pb2.ProduceEntry(end_transaction=end))
                return state_from_pb(response.end_transaction.state), None
            except TransactionStateError as err:
                state = state_from_name(getattr(err, "state", None))
                log.warning("EndTransaction %s of transaction %s refused, it is already %s: %s",
                            local_state.name, half.transaction_id, state.name if state else "decided", err)
                return state, err
            except TxmqError as err:
                if retry_action(err, bound=True) is RetryAction.FAIL or attempt >= self.max_attempts:
                    log.warning("EndTransaction %s of transaction %s failed after %d attempt(s): %s; "
                                "it stays PREPARED until the checker resolves it",
                                local_state.name, half.transaction_id, attempt, err)
                    return None, err
            await self._backoff(attempt)
            address = await self._rebind(topic, route, address)
            attempt += 1

