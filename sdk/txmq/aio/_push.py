""":class:`AsyncPushConsumer`: ``txmq.PushConsumer`` for an event loop — a listener (a
coroutine function, or a plain function) called for each message of the subscriptions,
acknowledgements batched, failures retried with backoff, FIFO groups one message at a time
(the same rules, from ``txmq._receiving``: ``consumed``, ``retry_delay``, ``GroupQueues``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Awaitable, Callable, Mapping, Sequence

from .. import _tracing as tracing
from .._calling import positive
from .._errors import ClientClosedError, InvalidFieldError, ReceiptHandleNotFoundError, TxmqError
from .._receiving import GroupQueues, Target, consumed, receive_request, retry_delay
from .._tls import TLS
from .._types import ConsumeResult, ReceivedMessage, SqlFilter, received_from_pb
from ._consumer import AsyncSimpleConsumer

log = logging.getLogger(__name__)

#: ``(message) -> ConsumeResult``: a coroutine function, or a plain function (called on the loop).
AsyncListener = Callable[[ReceivedMessage], "Awaitable[ConsumeResult] | ConsumeResult"]
#: Most acknowledgements one AckMessages carries.
ACK_BATCH = 256


class AsyncPushConsumer:
    """Calls ``listener`` for each message of the subscriptions, at most
    ``consume_concurrency`` at once (see :class:`txmq.PushConsumer` for the contract:
    SUCCESS acknowledges; FAILURE, None or an exception retries after ``min(
    retry_backoff_seconds * 2 ** (attempt - 1), max_retry_backoff_seconds)``; messages of
    one message group run one after another). One task long-polls each (topic, broker) while
    fewer than ``2 * consume_concurrency`` messages wait or run. Use ``async with`` (or
    :meth:`start` and :meth:`shutdown`) on one event loop."""

    def __init__(self, nameservers: str | Sequence[str], *, consumer_group: str,
                 subscriptions: Mapping[str, "str | SqlFilter"], listener: AsyncListener,
                 consume_concurrency: int = 4, invisible_duration_seconds: float = 30.0,
                 await_duration_seconds: float = 20.0, retry_backoff_seconds: float = 1.0,
                 max_retry_backoff_seconds: float = 60.0, request_timeout_seconds: float = 3.0,
                 route_refresh_seconds: float = 30.0, tls: TLS | None = None, token: str | None = None,
                 namespace: str = "") -> None:
        if not callable(listener):
            raise InvalidFieldError("listener", "must be callable: (ReceivedMessage) -> ConsumeResult")
        if not isinstance(consume_concurrency, int) or isinstance(consume_concurrency, bool) or consume_concurrency < 1:
            raise InvalidFieldError("consume_concurrency", f"must be an integer >= 1, got {consume_concurrency!r}")
        self.listener = listener
        self.consume_concurrency = consume_concurrency
        self.invisible_duration_seconds = positive("invisible_duration_seconds", invisible_duration_seconds)
        self.retry_backoff_seconds = positive("retry_backoff_seconds", retry_backoff_seconds)
        self.max_retry_backoff_seconds = positive("max_retry_backoff_seconds", max_retry_backoff_seconds)
        self._consumer = AsyncSimpleConsumer(nameservers, consumer_group=consumer_group, subscriptions=subscriptions,
                                             await_duration_seconds=await_duration_seconds,
                                             request_timeout_seconds=request_timeout_seconds,
                                             route_refresh_seconds=route_refresh_seconds, tls=tls, token=token,
                                             namespace=namespace)
        self.namespace = namespace
        self.consumer_group = self._consumer.consumer_group
        self._max_inflight = 2 * consume_concurrency
        self._inflight = 0
        self._room: asyncio.Event | None = None
        self._running: asyncio.Semaphore | None = None
        self._acks: asyncio.Queue[ReceivedMessage | None] | None = None
        self._groups = GroupQueues()
        self._pollers: dict[Target, asyncio.Task[None]] = {}
        self._consuming: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._acker: asyncio.Task[None] | None = None
        self._started = False
        self._stopped = False

    async def __aenter__(self) -> "AsyncPushConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        """Starts polling and consuming. Idempotent; a consumer shut down cannot restart."""
        if self._started:
            return
        if self._stopped:
            raise ClientClosedError("push consumer")
        self._started = True
        self._room = asyncio.Event()
        self._running = asyncio.Semaphore(self.consume_concurrency)
        self._acks = asyncio.Queue()
        self._background = [asyncio.ensure_future(self._supervise()), asyncio.ensure_future(self._renew_loop())]
        self._acker = asyncio.ensure_future(self._ack_loop())

    async def shutdown(self, timeout_seconds: float | None = None) -> None:
        """Stops polling (long polls in flight are cancelled), waits for the messages being
        consumed, sends their acknowledgements, then closes the connections."""
        self._stopped = True
        if self._started:
            self._started = False
            tasks = [*self._background, *self._pollers.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._consuming:
                await asyncio.wait(set(self._consuming), timeout=timeout_seconds)
            assert self._acks is not None and self._acker is not None
            self._acks.put_nowait(None)  # the acker sends what was consumed, then ends
            await asyncio.wait({self._acker}, timeout=timeout_seconds)
        await self._consumer.close()

    # --- polling --------------------------------------------------------------------------

    async def _supervise(self) -> None:
        """Starts a poller for each (topic, broker), again as routes change."""
        while not self._stopped:
            try:
                targets = await self._consumer._targets(lenient=True)  # its own consumer
            except TxmqError as err:
                log.warning("push consumer %s: cannot find routes: %s", self.consumer_group, err)
                targets = []
            for target in targets:
                if target not in self._pollers and not self._stopped:
                    self._pollers[target] = asyncio.ensure_future(self._poll(target))
            found = len({t.topic for t in targets})
            client = self._consumer._client
            await asyncio.sleep(client.route_refresh_seconds if found == len(self._consumer.subscriptions) else 1.0)

    async def _poll(self, target: Target) -> None:
        client = self._consumer._client
        wait = self._consumer.await_duration_seconds
        failures = 0
        assert self._room is not None
        while not self._stopped:
            while self._inflight >= self._max_inflight:
                self._room.clear()
                await self._room.wait()
            room = min(16, self._max_inflight - self._inflight)
            request = receive_request(self.consumer_group, target, room, self.invisible_duration_seconds, wait)
            try:
                address = await client.broker_address(target.broker_name)
                response = await client.call(client.broker(address).ReceiveMessages, request,
                                             timeout=wait + client.request_timeout_seconds)
            except TxmqError as err:
                if self._stopped or isinstance(err, ClientClosedError):
                    return
                failures += 1
                client.invalidate_route(target.topic)
                log.warning("push consumer %s: receive %s from %s failed: %s", self.consumer_group, target.topic,
                            target.broker_name, err)
                await asyncio.sleep(min(0.2 * 2 ** min(failures, 5), 5.0))
                continue
            failures = 0
            messages = [received_from_pb(m, self.consumer_group) for m in response.messages]
            self._inflight += len(messages)
            for message in messages:
                self._dispatch(message)

    def _dispatch(self, message: ReceivedMessage) -> None:
        """Starts consuming ``message``, or queues it behind a message of its group."""
        if not self._groups.admit(message):
            return
        task = asyncio.ensure_future(self._consume_group(message.message_group, message) if message.message_group
                                     else self._consume(message))
        self._consuming.add(task)
        task.add_done_callback(self._consuming.discard)

    async def _consume_group(self, group: str, message: ReceivedMessage) -> None:
        following: ReceivedMessage | None = message
        while following is not None:
            try:
                await self._consume(following)
            except Exception:  # the group goes on whatever became of this one
                log.exception("push consumer %s: consuming %s failed", self.consumer_group, following.message_id)
            following = self._groups.next(group)

    async def _consume(self, message: ReceivedMessage) -> None:
        assert self._running is not None and self._acks is not None
        try:
            async with self._running:
                with tracing.process(self.consumer_group, message) as traced, traced.current():
                    try:
                        returned = self.listener(message)
                        if inspect.isawaitable(returned):
                            returned = await returned
                        outcome = consumed(self.consumer_group, message, returned)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - a failed consumption is redelivered, not fatal
                        traced.fail(exc)
                        outcome = consumed(self.consumer_group, message, None, exc)
            if outcome is ConsumeResult.SUCCESS:
                self._acks.put_nowait(message)
                return
            delay = retry_delay(message, self.retry_backoff_seconds, self.max_retry_backoff_seconds)
            try:
                await self._consumer.change_invisible_duration(message, delay)
            except TxmqError as err:
                log.warning("push consumer %s: cannot schedule the retry of %s (it is redelivered "
                            "after its invisible duration): %s", self.consumer_group, message.message_id, err)
        finally:
            self._gone(1)

    def _gone(self, count: int) -> None:
        self._inflight -= count
        assert self._room is not None
        self._room.set()

    async def _renew_loop(self) -> None:
        """Keeps the messages waiting behind their group's running one invisible (as
        :meth:`txmq.PushConsumer._renew_loop`)."""
        every = min(max(self.invisible_duration_seconds / 4, 0.05), 5.0)
        while not self._stopped:
            await asyncio.sleep(every)
            for group, message in self._groups.due(time.time() + self.invisible_duration_seconds / 2):
                try:
                    renewed: ReceivedMessage | None = await self._consumer.change_invisible_duration(
                        message, self.invisible_duration_seconds)
                except ReceiptHandleNotFoundError:
                    renewed = None
                except TxmqError as err:
                    log.warning("push consumer %s: cannot renew the invisibility of %s waiting behind its "
                                "group: %s", self.consumer_group, message.message_id, err)
                    continue
                if self._groups.renewed(group, message, renewed):
                    self._gone(1)

    async def _ack_loop(self) -> None:
        """Acknowledges consumed messages, batching what accumulated while the last call ran."""
        assert self._acks is not None
        done = False
        while not done:
            item = await self._acks.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < ACK_BATCH and not self._acks.empty():
                item = self._acks.get_nowait()
                if item is None:
                    done = True
                    break
                batch.append(item)
            try:
                errors = await self._consumer.ack_many(batch)
            except ClientClosedError:
                return
            for message, error in zip(batch, errors):
                if error is not None:
                    log.warning("push consumer %s: ack of %s failed (it will be redelivered): %s",
                                self.consumer_group, message.message_id, error)
