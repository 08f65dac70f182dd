""":class:`AsyncSimpleConsumer`: ``txmq.SimpleConsumer`` for an event loop (same
subscriptions, receive passes and long polls, acks and invisibility changes)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

from .._calling import positive
from .. import _tracing as tracing
from .._errors import ClientClosedError, TxmqError
from .._names import in_namespace, validate_group
from .._producing import new_client_id
from .._receiving import (AckOutcome, LongPoll, Receive, Target, ack_groups, ack_request, ack_results, check_receive,
                          deferred_acks, invisibility_request, receive_request, receive_steps, received,
                          report_deferred, settle, subscriptions_of, target_steps, with_invisibility)
from .._sending import run_async
from .._tls import TLS
from .._types import ReceivedMessage, SqlFilter, received_from_pb
from ._client import AsyncClient

log = logging.getLogger(__name__)


class AsyncSimpleConsumer:
    """Receives messages for a consumer group from coroutines. Use it as ``async with``.

    ``subscriptions`` maps each topic to a tag filter (``"*"`` or ``"TagA || TagB"``) or a
    :class:`txmq.SqlFilter`. Deferred acks (:meth:`ack_later`) as in
    :class:`txmq.SimpleConsumer` (``max_ack_delay_seconds``, ``on_ack_error``, a plain
    function called on the event loop)."""

    def __init__(self, nameservers: str | Sequence[str], *, consumer_group: str,
                 subscriptions: Mapping[str, "str | SqlFilter"], await_duration_seconds: float = 20.0,
                 request_timeout_seconds: float = 3.0, route_refresh_seconds: float = 30.0,
                 tls: TLS | None = None, token: str | None = None, namespace: str = "",
                 max_ack_delay_seconds: float = 1.0,
                 on_ack_error: Callable[[ReceivedMessage, TxmqError], None] | None = None) -> None:
        # A namespace qualifies the group and every subscribed topic (txmq.names.qualify).
        consumer_group = in_namespace(namespace, "consumer_group", consumer_group)
        validate_group("consumer_group", consumer_group)
        deferred = deferred_acks(max_ack_delay_seconds, on_ack_error)
        self.namespace = namespace
        self.consumer_group = consumer_group
        self.subscriptions = subscriptions_of(subscriptions, namespace)
        self.await_duration_seconds = positive("await_duration_seconds", await_duration_seconds)
        self.client_id = new_client_id()  # how the brokers name this consumer (txmq group clients)
        self._client = AsyncClient(nameservers, request_timeout_seconds=request_timeout_seconds,
                                   route_refresh_seconds=route_refresh_seconds, what="consumer", tls=tls, token=token)
        self._round_robin = itertools.count()
        # Long polls still running after a receive returned; what they brought since comes first.
        self._polls: dict[Target, asyncio.Task[list[ReceivedMessage]]] = {}
        self._buffer: list[ReceivedMessage] = []
        # Whether a receive long-polls the only target itself now (one at a time).
        self._polling_inline = False
        self.on_ack_error = on_ack_error
        # ack_later's queue, and the task that sends what is due when no receive carried it.
        self._deferred = deferred
        self._deferred_changed: asyncio.Event | None = None
        self._deferred_timer: asyncio.Task[None] | None = None
        self._closing = False

    async def close(self) -> None:
        """Sends the deferred acks (:meth:`flush_acks`), then closes the connections;
        messages received and not acknowledged are redelivered after their invisible
        duration."""
        self._closing = True
        timer, self._deferred_timer = self._deferred_timer, None
        if timer is not None:
            assert self._deferred_changed is not None
            self._deferred_changed.set()
            await timer  # it ends after the send it is making, if any
        if not self._client.closed:
            await self.flush_acks()
        polls, self._polls = list(self._polls.values()), {}
        for task in polls:
            task.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        self._buffer.clear()
        await self._client.close()

    async def __aenter__(self) -> "AsyncSimpleConsumer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        """``async for message in consumer``: :meth:`messages` with its defaults."""
        return self.messages()

    async def messages(self, max_messages: int = 16,
                       invisible_duration_seconds: float = 30.0) -> AsyncIterator[ReceivedMessage]:
        """Every message as it arrives, one at a time, until the consumer is closed (see
        :meth:`txmq.SimpleConsumer.messages`)."""
        while not self._closing:
            try:
                batch = await self.receive(max_messages, invisible_duration_seconds)
            except ClientClosedError:
                return
            for message in batch:
                yield message

    # --- receive --------------------------------------------------------------------------

    async def receive(self, max_messages: int = 16, invisible_duration_seconds: float = 30.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, or ``[]`` if none arrived within
        ``await_duration_seconds`` (see :meth:`txmq.SimpleConsumer.receive`)."""
        started = tracing.now_ns()
        out = await self._receive(max_messages, invisible_duration_seconds)
        tracing.received(self.consumer_group, out, started)
        return out

    async def _receive(self, max_messages: int, invisible_duration_seconds: float) -> list[ReceivedMessage]:
        check_receive(max_messages)
        positive("invisible_duration_seconds", invisible_duration_seconds)
        self._client.check_open()
        if self._buffer:
            out, self._buffer = self._buffer[:max_messages], self._buffer[max_messages:]
            return out
        targets = await self._targets()
        faults = self._client.faults
        alone = len(targets) == 1 and not self._polls and not self._polling_inline
        self._polling_inline = self._polling_inline or alone

        async def perform(step: Receive | LongPoll) -> list[ReceivedMessage]:
            if isinstance(step, Receive):
                return await self._receive_from(step.target, step.max_messages, invisible_duration_seconds,
                                                step.wait_seconds)
            return await self._long_poll(step.targets, max_messages, invisible_duration_seconds)

        try:
            return await run_async(receive_steps(targets, next(self._round_robin), max_messages,
                                                 self.await_duration_seconds, self._polls.__contains__,
                                                 lambda t: faults.usable(t.broker_name), alone), perform)
        finally:
            if alone:
                self._polling_inline = False

    async def _long_poll(self, targets: list[Target], max_messages: int,
                         invisible_duration_seconds: float) -> list[ReceivedMessage]:
        for target in targets:
            if target not in self._polls:
                self._polls[target] = asyncio.ensure_future(self._receive_from(
                    target, max_messages, invisible_duration_seconds, self.await_duration_seconds))
        polls = dict(self._polls)
        deadline = asyncio.get_running_loop().time() + self.await_duration_seconds + self._client.request_timeout_seconds
        running = set(polls.values())
        while running:
            timeout = max(0.0, deadline - asyncio.get_running_loop().time())
            done, running = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done or any(not t.cancelled() and t.exception() is None for t in done):
                break
        ended = [(target, task) for target, task in polls.items()
                 if task.done() and self._polls.get(target) is task]
        for target, _task in ended:
            del self._polls[target]
        out, rest = settle([task for _target, task in ended], max_messages)
        self._buffer.extend(rest)
        return out

    async def _targets(self, *, lenient: bool = False) -> list[Target]:
        """(topic, broker) pairs of every subscription (``txmq._receiving.target_steps``)."""
        async def routes(step: Any) -> Any:
            return await self._client.route(step.topic, for_send=False)

        return await run_async(target_steps(self.subscriptions, lenient=lenient), routes)

    async def _receive_from(self, target: Target, max_messages: int, invisible_duration_seconds: float,
                            wait_seconds: float) -> list[ReceivedMessage]:
        carried: list[ReceivedMessage] = []
        try:
            address = await self._client.broker_address(target.broker_name)
            carried = self._deferred.take(target.broker_name, target.topic)
            request = receive_request(self.consumer_group, target, max_messages, invisible_duration_seconds,
                                      wait_seconds, carried, self.client_id)
            response = await self._client.call(self._client.broker(address).ReceiveMessages, request,
                                               timeout=wait_seconds + self._client.request_timeout_seconds)
        except (TxmqError, asyncio.CancelledError) as exc:
            if isinstance(exc, TxmqError):
                received(self._client.faults, target, exc)
                self._client.invalidate_route(target.topic)
            if carried:
                error = exc if isinstance(exc, TxmqError) else ClientClosedError("consumer")
                report_deferred(self.consumer_group, carried, [error] * len(carried), self.on_ack_error)
            raise
        received(self._client.faults, target, None)
        if carried:
            report_deferred(self.consumer_group, carried,
                            ack_results(target.broker_name, response.ack_entries, len(carried)), self.on_ack_error)
        return [received_from_pb(m, self.consumer_group) for m in response.messages]

    # --- acknowledge ----------------------------------------------------------------------

    async def ack(self, message: ReceivedMessage) -> None:
        """Acknowledges one delivery (see :meth:`txmq.SimpleConsumer.ack`)."""
        error = (await self._ack_group(message.broker_name, message.topic, [message]))[0]
        if error is not None:
            raise error

    async def ack_many(self, messages: Iterable[ReceivedMessage]) -> list[TxmqError | None]:
        """One AckMessages per (broker, topic) and 1,024 deliveries, concurrently; per message
        None or its error."""
        messages = list(messages)
        self._client.check_open()
        groups = ack_groups(messages)
        results: list[TxmqError | None] = [None] * len(messages)
        answers = await asyncio.gather(*(self._ack_group(b, t, [messages[i] for i in idx])
                                         for b, t, idx in groups))
        for (_, _, indexes), errors in zip(groups, answers):
            for index, error in zip(indexes, errors):
                results[index] = error
        return results

    async def _ack_group(self, broker_name: str, topic: str, messages: list[ReceivedMessage]) -> list[TxmqError | None]:
        request = ack_request(self.consumer_group, topic, messages)
        started = tracing.now_ns()
        try:
            response = await self._client.call_bound(broker_name, lambda stub: stub.AckMessages, request)
        except ClientClosedError:
            raise
        except TxmqError as err:
            results: list[TxmqError | None] = [err] * len(messages)
        else:
            results = ack_results(broker_name, response.entries, len(messages))
        tracing.acked(self.consumer_group, messages, results, started)
        return results

    def ack_later(self, message: ReceivedMessage) -> None:
        """Queues the ack of one delivery for this consumer's next receive from the
        message's broker and topic (see :meth:`txmq.SimpleConsumer.ack_later`). Call it
        on the consumer's event loop; it returns at once."""
        self._client.check_open()
        if self._closing:
            raise ClientClosedError("consumer")
        self._deferred.add(message)
        if self._deferred_timer is None:
            self._deferred_changed = asyncio.Event()
            self._deferred_timer = asyncio.ensure_future(self._send_when_due())
        else:
            assert self._deferred_changed is not None
            self._deferred_changed.set()

    async def flush_acks(self) -> list[AckOutcome]:
        """Sends every deferred ack still queued now; their outcomes (see
        :meth:`txmq.SimpleConsumer.flush_acks`)."""
        return await self._send_deferred(self._deferred.take_all())

    async def _send_deferred(self, messages: list[ReceivedMessage]) -> list[AckOutcome]:
        if not messages:
            return []
        try:
            errors = await self.ack_many(messages)
        except ClientClosedError as err:
            errors = [err] * len(messages)
        return report_deferred(self.consumer_group, messages, errors, self.on_ack_error)

    async def _send_when_due(self) -> None:
        """The deferred acks' timer: sends every queued ack once the earliest is due."""
        changed = self._deferred_changed
        assert changed is not None
        while not self._closing:
            changed.clear()
            due = self._deferred.next_due()
            left = None if due is None else due - time.monotonic()
            if left is None or left > 0:
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except TimeoutError:
                    pass
                continue
            await self._send_deferred(self._deferred.take_all())

    async def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> ReceivedMessage:
        """See :meth:`txmq.SimpleConsumer.change_invisible_duration`."""
        positive("seconds", seconds)
        response = await self._client.call_bound(message.broker_name, lambda stub: stub.ChangeInvisibleDuration,
                                                 invisibility_request(self.consumer_group, message, seconds))
        return with_invisibility(message, response)
