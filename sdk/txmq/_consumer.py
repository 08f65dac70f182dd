"""Consumers: :class:`SimpleConsumer` (the application calls receive/ack) and
:class:`PushConsumer` (a listener called on a thread pool, acks and retries handled).

A consumer group receives every committed message of its topics at least once. A received
message stays invisible to the group for ``invisible_duration_seconds``; unless it is
acknowledged by then it is redelivered with ``delivery_attempt`` + 1, and after the
broker's ``max_delivery_attempts`` it moves to the group's dead-letter topic
``%DLQ%<group>``, which a consumer may subscribe to explicitly.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import queue
import threading
import time
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import grpc

from . import _tracing as tracing
from ._calling import positive
from ._client import Client
from ._errors import ClientClosedError, InvalidFieldError, ReceiptHandleNotFoundError, TxmqError, error_from_rpc
from ._names import in_namespace, validate_group
from ._producing import new_client_id
from ._receiving import (AckOutcome, GroupQueues, Receive, Target, ack_groups, ack_request, ack_results, check_receive,
                         consumed, deferred_acks, invisibility_request, receive_request, receive_steps, received,
                         report_deferred, retry_delay, settle, subscriptions_of, target_steps, with_invisibility)
from ._sending import run
from ._tls import TLS
from ._types import ConsumeResult, ReceivedMessage, SqlFilter, received_from_pb
from .v1 import broker_pb2

log = logging.getLogger(__name__)


class SimpleConsumer:
    """Receives messages for a consumer group on the caller's schedule. Thread-safe.

    ``subscriptions`` maps each topic to a tag filter: ``"*"`` for every message, or
    ``"TagA || TagB"``; or to a :class:`SqlFilter` (a SQL92 property filter). A dead-letter topic (``%DLQ%<group>``) may be subscribed explicitly.

    Deferred acks (:meth:`ack_later`) ride the next receive from the message's broker
    instead of a call of their own; each is sent at the latest ``max_ack_delay_seconds``
    after it was queued (sooner when half its message's remaining invisibility is less),
    and by :meth:`flush_acks` and :meth:`close`. A deferred ack that fails (a stale handle,
    or the failed call that carried it) is logged and given to ``on_ack_error(message,
    error)``, which may be called on any of the consumer's threads (the caller's, a long
    poll's, the deferred acks' timer).
    """

    def __init__(self, nameservers: str | Sequence[str], *, consumer_group: str,
                 subscriptions: Mapping[str, str | SqlFilter], await_duration_seconds: float = 20.0,
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
        #: ``host@pid@random``: how the brokers name this consumer (``txmq group clients``).
        self.client_id = new_client_id()
        self._client = Client(nameservers, request_timeout_seconds=request_timeout_seconds,
                              route_refresh_seconds=route_refresh_seconds, what="consumer", tls=tls, token=token)
        self._round_robin = itertools.count()
        self._lock = threading.Lock()
        # Long polls still running after a receive() returned, and what they brought since:
        # the next receive() returns it first.
        self._polls: dict[Target, cf.Future[list[ReceivedMessage]]] = {}
        self._buffer: list[ReceivedMessage] = []
        self._pool: cf.ThreadPoolExecutor | None = None
        # Whether a receive() long-polls its only target on its own thread now.
        self._polling_inline = False
        self.on_ack_error = on_ack_error
        # ack_later's queue, and the thread that sends what is due when no receive carried it.
        self._deferred = deferred
        self._deferred_changed = threading.Condition(self._lock)
        self._deferred_timer: threading.Thread | None = None
        self._closing = False

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Sends the deferred acks (:meth:`flush_acks`), then closes the connections.
        Messages received but not acknowledged are redelivered after their invisible
        duration."""
        with self._lock:
            self._closing = True
            timer, self._deferred_timer = self._deferred_timer, None
            self._deferred_changed.notify_all()
        if timer is not None:
            timer.join()  # it ends after the send it is making, if any
        if not self._client.closed:
            self.flush_acks()
        self._client.close()
        with self._lock:
            pool, self._pool = self._pool, None
            self._buffer.clear()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "SimpleConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[ReceivedMessage]:
        """``for message in consumer``: :meth:`messages` with its defaults."""
        return self.messages()

    def messages(self, max_messages: int = 16, invisible_duration_seconds: float = 30.0) -> Iterator[ReceivedMessage]:
        """Every message as it arrives, one at a time, until the consumer is closed (from
        another thread): :meth:`receive` in a loop. Acknowledge each (``ack`` or
        ``ack_later``); the messages of one receive are invisible for
        ``invisible_duration_seconds`` from when they came, so keep ``max_messages`` small
        when each takes long."""
        while not self._closing and not self._client.closed:
            try:
                batch = self.receive(max_messages, invisible_duration_seconds)
            except ClientClosedError:
                return
            yield from batch

    # --- receive --------------------------------------------------------------------------

    def receive(self, max_messages: int = 16, invisible_duration_seconds: float = 30.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, or ``[]`` if none arrived within
        ``await_duration_seconds``.

        First a pass over every (subscribed topic, broker) that returns at once, starting
        at a different one each call; if that finds nothing, the brokers are long-polled
        concurrently and the call returns as soon as one of them answers with messages or
        its poll ends. Long polls still running then keep going: what they bring is returned
        by the next ``receive`` (and is redelivered after its invisible duration if there is
        no next call). A broker that failed lately (the client's fault table) is skipped
        until its next probe, so a shard that is down costs the others no latency. With a
        single (topic, broker) the receive is that one long poll, on the calling thread.
        """
        started = tracing.now_ns()
        out = self._receive(max_messages, invisible_duration_seconds)
        tracing.received(self.consumer_group, out, started)
        return out

    def _receive(self, max_messages: int, invisible_duration_seconds: float) -> list[ReceivedMessage]:
        check_receive(max_messages)
        positive("invisible_duration_seconds", invisible_duration_seconds)
        self._client.check_open()
        out = self._take_buffered(max_messages)
        if out:
            return out
        targets = self._targets()
        faults = self._client.faults
        # One inline long poll at a time (the broker limits long polls per connection).
        with self._lock:
            polled = set(self._polls)
            alone = len(targets) == 1 and not polled and not self._polling_inline
            self._polling_inline = self._polling_inline or alone
        steps = receive_steps(targets, next(self._round_robin), max_messages, self.await_duration_seconds,
                              polled.__contains__, lambda t: faults.usable(t.broker_name), alone)
        try:
            return run(steps, lambda step: self._receive_from(
                step.target, step.max_messages, invisible_duration_seconds, step.wait_seconds)
                if isinstance(step, Receive) else self._long_poll(step.targets, max_messages, invisible_duration_seconds))
        finally:
            if alone:
                self._polling_inline = False

    def _take_buffered(self, max_messages: int) -> list[ReceivedMessage]:
        with self._lock:
            if not self._buffer:
                return []
            out, self._buffer = self._buffer[:max_messages], self._buffer[max_messages:]
        return out

    def _long_poll(self, targets: list[Target], max_messages: int,
                   invisible_duration_seconds: float) -> list[ReceivedMessage]:
        with self._lock:
            if self._pool is None:
                self._client.check_open()
                self._pool = cf.ThreadPoolExecutor(max_workers=64, thread_name_prefix="txmq-receive")
            for target in targets:
                if target not in self._polls:
                    self._polls[target] = self._pool.submit(
                        self._receive_from, target, max_messages, invisible_duration_seconds,
                        self.await_duration_seconds)
            polls = dict(self._polls)
        # Until a poll answers (a failed one does not count while others still run).
        deadline = time.monotonic() + self.await_duration_seconds + self._client.request_timeout_seconds
        running = set(polls.values())
        while running:
            done, running = cf.wait(running, timeout=max(0.0, deadline - time.monotonic()),
                                    return_when=cf.FIRST_COMPLETED)
            if not done or any(not f.cancelled() and f.exception() is None for f in done):
                break
        with self._lock:
            ended = [f for target, f in polls.items() if f.done() and self._polls.get(target) is f]
            for target in [t for t, f in polls.items() if f in ended]:
                del self._polls[target]
            out, rest = settle(ended, max_messages)  # raises only when nothing came: rest is empty
            self._buffer.extend(rest)
        return out

    def _targets(self, *, lenient: bool = False) -> list[Target]:
        """(topic, broker) pairs of every subscription (``_receiving.target_steps``)."""
        return run(target_steps(self.subscriptions, lenient=lenient),
                   lambda step: self._client.route(step.topic, for_send=False))

    def _receive_request(self, target: Target, max_messages: int, invisible_duration_seconds: float,
                         wait_seconds: float) -> broker_pb2.ReceiveMessagesRequest:
        return receive_request(self.consumer_group, target, max_messages, invisible_duration_seconds, wait_seconds,
                               client_id=self.client_id)

    def _receive_from(self, target: Target, max_messages: int, invisible_duration_seconds: float,
                      wait_seconds: float) -> list[ReceivedMessage]:
        carried: list[ReceivedMessage] = []
        try:
            address = self._client.broker_address(target.broker_name)
            with self._lock:
                carried = self._deferred.take(target.broker_name, target.topic)
            request = receive_request(self.consumer_group, target, max_messages, invisible_duration_seconds,
                                      wait_seconds, carried, self.client_id)
            response = self._client.call(self._client.broker(address).ReceiveMessages, request,
                                         timeout=wait_seconds + self._client.request_timeout_seconds)
        except TxmqError as err:
            received(self._client.faults, target, err)
            self._client.invalidate_route(target.topic)
            if not isinstance(err, ClientClosedError):
                log.debug("receive %s from %s failed: %s", target.topic, target.broker_name, err)
            if carried:
                report_deferred(self.consumer_group, carried, [err] * len(carried), self.on_ack_error)
            raise
        received(self._client.faults, target, None)
        if carried:
            report_deferred(self.consumer_group, carried,
                            ack_results(target.broker_name, response.ack_entries, len(carried)), self.on_ack_error)
        return [received_from_pb(m, self.consumer_group) for m in response.messages]

    # --- acknowledge ----------------------------------------------------------------------

    def ack(self, message: ReceivedMessage) -> None:
        """Acknowledges one delivery: the group will not receive the message again. Raises
        ReceiptHandleNotFoundError (or another NotFound/FailedPrecondition error) when the
        handle is stale: the message was redelivered since, or already acknowledged."""
        error = self._ack_group(message.broker_name, message.topic, [message])[0]
        if error is not None:
            raise error

    def ack_many(self, messages: Iterable[ReceivedMessage]) -> list[TxmqError | None]:
        """Acknowledges many deliveries with one AckMessages per (broker, topic) and 1,024
        deliveries (``txmq.client.MAX_ENTRIES_PER_REQUEST``).

        Does not raise for a failed entry: returns one result per message, in order, None
        where it was acknowledged and the TxmqError where not (a stale handle, or the
        error of the whole call to that broker). Raises only ClientClosedError.
        """
        messages = list(messages)
        self._client.check_open()
        groups = ack_groups(messages)
        results: list[TxmqError | None] = [None] * len(messages)
        for broker_name, topic, indexes in groups:
            errors = self._ack_group(broker_name, topic, [messages[i] for i in indexes])
            for index, error in zip(indexes, errors):
                results[index] = error
        return results

    def _ack_group(self, broker_name: str, topic: str,
                   messages: list[ReceivedMessage]) -> list[TxmqError | None]:
        request = ack_request(self.consumer_group, topic, messages)
        started = tracing.now_ns()
        try:
            response = self._client.call_bound(broker_name, lambda stub: stub.AckMessages, request)
        except ClientClosedError:
            raise
        except TxmqError as err:
            results: list[TxmqError | None] = [err] * len(messages)
        else:
            results = ack_results(broker_name, response.entries, len(messages))
        tracing.acked(self.consumer_group, messages, results, started)
        return results

    def ack_later(self, message: ReceivedMessage) -> None:
        """Acknowledges one delivery on this consumer's next receive from the message's broker
        and topic, instead of a call of its own (a deferred ack: the broker applies it before
        it looks for messages, so it is never held by that receive's long poll). Returns at
        once; the outcome comes later: a failure (a stale handle, or the error of the call
        that carried it) is logged and given to ``on_ack_error``. Sent at the latest
        ``max_ack_delay_seconds`` after this call (sooner when half the message's remaining
        invisibility is less), or by :meth:`flush_acks` / :meth:`close`. Use :meth:`ack`
        where the caller must know the outcome before it goes on. If the process dies first,
        the message is redelivered (at least once)."""
        self._client.check_open()
        with self._lock:
            if self._closing:
                raise ClientClosedError("consumer")
            self._deferred.add(message)
            if self._deferred_timer is None:
                self._deferred_timer = threading.Thread(target=self._send_when_due, daemon=True,
                                                        name="txmq-deferred-acks")
                self._deferred_timer.start()
            self._deferred_changed.notify()

    def flush_acks(self) -> list[AckOutcome]:
        """Sends every deferred ack still queued now (one AckMessages per broker and topic)
        and returns their outcomes, in the order they were queued per broker and topic:
        (message, None) when acknowledged, (message, TxmqError) when not. Failures are also
        logged and given to ``on_ack_error``. Acks already carried by a receive are not
        here (their outcomes went to ``on_ack_error``)."""
        with self._lock:
            messages = self._deferred.take_all()
        return self._send_deferred(messages)

    def _send_deferred(self, messages: list[ReceivedMessage]) -> list[AckOutcome]:
        if not messages:
            return []
        try:
            errors = self.ack_many(messages)
        except ClientClosedError as err:
            errors = [err] * len(messages)
        return report_deferred(self.consumer_group, messages, errors, self.on_ack_error)

    def _send_when_due(self) -> None:
        """The deferred acks' timer: sends every queued ack once the earliest is due."""
        while True:
            with self._lock:
                while not self._closing:
                    due = self._deferred.next_due()
                    left = None if due is None else due - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._deferred_changed.wait(left)
                if self._closing:
                    return
                messages = self._deferred.take_all()
            self._send_deferred(messages)

    def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> ReceivedMessage:
        """Makes the message invisible for ``seconds`` from now instead (0 < seconds): longer
        to keep working on it, shorter to have it redelivered sooner (with
        ``delivery_attempt`` + 1). Returns the message with the receipt handle to use from now
        on (the broker may have issued a new one: the old one may no longer be valid)."""
        positive("seconds", seconds)
        response = self._client.call_bound(message.broker_name, lambda stub: stub.ChangeInvisibleDuration,
                                           invisibility_request(self.consumer_group, message, seconds))
        return with_invisibility(message, response)


class PushConsumer:
    """Calls ``listener`` for each message of the subscriptions on a pool of
    ``consume_threads`` threads.

    The listener returns :attr:`ConsumeResult.SUCCESS` (the message is acknowledged, in
    batches) or :attr:`ConsumeResult.FAILURE`; FAILURE, None or an exception (logged) has the
    message redelivered after ``min(retry_backoff_seconds * 2 ** (attempt - 1),
    max_retry_backoff_seconds)`` with ``delivery_attempt`` + 1, until the broker moves it to
    ``%DLQ%<group>`` after its ``max_delivery_attempts``.

    One background thread long-polls each (subscribed topic, broker); it receives only
    while fewer than ``2 * consume_threads`` messages are waiting or being consumed, so a
    slow listener does not pile up invisible messages. New brokers of a topic are found by
    refreshing the routes every ``route_refresh_seconds``. Use :meth:`start` and
    :meth:`shutdown`, or a ``with`` block.

    FIFO topics: the broker delivers a message group's next message only once the previous
    one is acknowledged (or dead-lettered); here the messages of one group also run one
    after another (a redelivery never overlaps a consumption of the same group still
    running), while different groups run in parallel on the pool. A message waiting here
    behind its group's running one (a redelivery of a consumption slower than the invisible
    duration) has its invisibility renewed while it waits, so it is not redelivered again and
    again, spending its delivery attempts towards the dead-letter queue; a waiting copy the
    broker no longer knows (redelivered or settled meanwhile) is dropped.
    """

    def __init__(self, nameservers: str | Sequence[str], *, consumer_group: str,
                 subscriptions: Mapping[str, str | SqlFilter], listener: Callable[[ReceivedMessage], ConsumeResult],
                 consume_threads: int = 4, invisible_duration_seconds: float = 30.0,
                 await_duration_seconds: float = 20.0, retry_backoff_seconds: float = 1.0,
                 max_retry_backoff_seconds: float = 60.0, request_timeout_seconds: float = 3.0,
                 route_refresh_seconds: float = 30.0, tls: TLS | None = None, token: str | None = None,
                 namespace: str = "") -> None:
        if not callable(listener):
            raise InvalidFieldError("listener", "must be callable: (ReceivedMessage) -> ConsumeResult")
        if not isinstance(consume_threads, int) or consume_threads < 1:
            raise InvalidFieldError("consume_threads", f"must be an integer >= 1, got {consume_threads!r}")
        self.listener = listener
        self.consume_threads = consume_threads
        self.invisible_duration_seconds = positive("invisible_duration_seconds", invisible_duration_seconds)
        self.retry_backoff_seconds = positive("retry_backoff_seconds", retry_backoff_seconds)
        self.max_retry_backoff_seconds = positive("max_retry_backoff_seconds", max_retry_backoff_seconds)
        self._consumer = SimpleConsumer(nameservers, consumer_group=consumer_group,
                                        subscriptions=subscriptions,
                                        await_duration_seconds=await_duration_seconds,
                                        request_timeout_seconds=request_timeout_seconds,
                                        route_refresh_seconds=route_refresh_seconds, tls=tls, token=token,
                                        namespace=namespace)
        self.namespace = namespace
        self.consumer_group = self._consumer.consumer_group
        self._max_inflight = 2 * consume_threads
        self._inflight = 0
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = False
        self._supervisor: threading.Thread | None = None
        self._acker: threading.Thread | None = None
        self._renewer: threading.Thread | None = None
        self._pollers: dict[Target, threading.Thread] = {}
        self._polls: dict[Target, grpc.Future] = {}  # type: ignore[type-arg]  # generic in the stubs only: pdoc evaluates it
        self._acks: queue.SimpleQueue[ReceivedMessage | None] = queue.SimpleQueue()
        self._executor: cf.ThreadPoolExecutor | None = None
        # Message groups' messages waiting behind the one being consumed.
        self._groups = GroupQueues()

    def __enter__(self) -> "PushConsumer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> None:
        """Starts polling and consuming. Idempotent; a consumer shut down cannot restart."""
        with self._lock:
            if self._started:
                return
            if self._stop.is_set():
                raise ClientClosedError("push consumer")
            self._started = True
            self._executor = cf.ThreadPoolExecutor(self.consume_threads, thread_name_prefix="txmq-consume")
            self._supervisor = threading.Thread(target=self._supervise, name="txmq-routes", daemon=True)
            self._acker = threading.Thread(target=self._ack_loop, name="txmq-ack", daemon=True)
            self._renewer = threading.Thread(target=self._renew_loop, name="txmq-renew", daemon=True)
            self._supervisor.start()
            self._acker.start()
            self._renewer.start()

    def shutdown(self, timeout_seconds: float | None = None) -> None:
        """Stops polling (long polls in flight are cancelled), waits for the messages being
        consumed, sends their acknowledgements, then closes the connections."""
        with self._lock:
            self._stop.set()
            for future in self._polls.values():
                future.cancel()
            started, self._started = self._started, False
            pollers = [self._supervisor, self._renewer, *self._pollers.values()]
        if started:
            with self._cond:
                self._cond.notify_all()
            for thread in pollers:
                assert thread is not None
                thread.join(timeout_seconds)
            assert self._executor is not None and self._acker is not None
            self._executor.shutdown(wait=True)
            self._acks.put(None)  # the acker sends what was consumed, then ends
            self._acker.join(timeout_seconds)
        self._consumer.close()

    # --- polling --------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Starts a poller for each (topic, broker), again as routes change."""
        while not self._stop.is_set():
            try:
                targets = self._consumer._targets(lenient=True)
            except TxmqError as err:
                log.warning("push consumer %s: cannot find routes: %s", self.consumer_group, err)
                targets = []
            with self._lock:
                for target in targets:
                    if target not in self._pollers and not self._stop.is_set():
                        thread = threading.Thread(target=self._poll, args=(target,), daemon=True,
                                                  name=f"txmq-poll-{target.topic}-{target.broker_name}")
                        self._pollers[target] = thread
                        thread.start()
            wanted = len(self._consumer.subscriptions)
            found = len({t.topic for t in targets})
            self._stop.wait(self._consumer._client.route_refresh_seconds if found == wanted else 1.0)

    def _poll(self, target: Target) -> None:
        client = self._consumer._client
        failures = 0
        while not self._stop.is_set():
            with self._cond:
                while self._inflight >= self._max_inflight and not self._stop.is_set():
                    self._cond.wait(0.5)
                room = min(16, self._max_inflight - self._inflight)
            if self._stop.is_set():
                return
            request = self._consumer._receive_request(target, room, self.invisible_duration_seconds,
                                                      self._consumer.await_duration_seconds)
            try:
                address = client.broker_address(target.broker_name)
                with self._lock:
                    if self._stop.is_set():
                        return
                    future = client.broker(address).ReceiveMessages.future(
                        request, timeout=self._consumer.await_duration_seconds + client.request_timeout_seconds)
                    self._polls[target] = future
                response = future.result()
            except (grpc.RpcError, grpc.FutureCancelledError, TxmqError) as exc:
                if self._stop.is_set():
                    return
                error = error_from_rpc(exc) if isinstance(exc, grpc.RpcError) else exc
                if isinstance(error, ClientClosedError):
                    return
                failures += 1
                client.invalidate_route(target.topic)
                log.warning("push consumer %s: receive %s from %s failed: %s", self.consumer_group,
                            target.topic, target.broker_name, error)
                self._stop.wait(min(0.2 * 2 ** min(failures, 5), 5.0))
                continue
            finally:
                with self._lock:
                    self._polls.pop(target, None)
            failures = 0
            if not response.messages:
                continue
            messages = [received_from_pb(m, self.consumer_group) for m in response.messages]
            with self._cond:
                self._inflight += len(messages)
            assert self._executor is not None
            for message in messages:
                self._dispatch(message)

    def _dispatch(self, message: ReceivedMessage) -> None:
        """Hands a message to the pool, behind a message of its group being consumed."""
        assert self._executor is not None
        if not self._groups.admit(message):
            return
        if message.message_group:
            self._executor.submit(self._consume_group, message.message_group, message)
        else:
            self._executor.submit(self._consume, message)

    def _consume_group(self, group: str, message: ReceivedMessage) -> None:
        """Consumes ``message`` and then the messages of its group that arrived meanwhile."""
        following: ReceivedMessage | None = message
        while following is not None:
            try:
                self._consume(following)
            except Exception:  # the group goes on whatever became of this one
                log.exception("push consumer %s: consuming %s failed", self.consumer_group, following.message_id)
            following = self._groups.next(group)

    def _renew_loop(self) -> None:
        """Keeps the messages waiting behind their group's running one invisible: each whose
        invisibility has less than half of ``invisible_duration_seconds`` left gets the whole
        of it again (ChangeInvisibleDuration: the same delivery, no new attempt)."""
        every = min(max(self.invisible_duration_seconds / 4, 0.05), 5.0)
        while not self._stop.wait(every):
            for group, message in self._groups.due(time.time() + self.invisible_duration_seconds / 2):
                try:
                    renewed: ReceivedMessage | None = self._consumer.change_invisible_duration(
                        message, self.invisible_duration_seconds)
                except ReceiptHandleNotFoundError:
                    renewed = None  # redelivered or settled meanwhile: this copy is of no use
                except TxmqError as err:
                    if self._stop.is_set():
                        return
                    log.warning("push consumer %s: cannot renew the invisibility of %s waiting behind its "
                                "group: %s", self.consumer_group, message.message_id, err)
                    continue
                if self._groups.renewed(group, message, renewed):
                    with self._cond:
                        self._inflight -= 1
                        self._cond.notify()

    # --- consuming ------------------------------------------------------------------------

    def _consume(self, message: ReceivedMessage) -> None:
        try:
            with tracing.process(self.consumer_group, message) as traced, traced.current():
                try:
                    outcome = consumed(self.consumer_group, message, self.listener(message))
                except Exception as exc:  # noqa: BLE001 - a failed consumption is redelivered, not fatal
                    traced.fail(exc)
                    outcome = consumed(self.consumer_group, message, None, exc)
            if outcome is ConsumeResult.SUCCESS:
                self._acks.put(message)
                return
            delay = retry_delay(message, self.retry_backoff_seconds, self.max_retry_backoff_seconds)
            try:
                self._consumer.change_invisible_duration(message, delay)
            except TxmqError as err:
                log.warning("push consumer %s: cannot schedule the retry of %s (it is redelivered "
                            "after its invisible duration): %s", self.consumer_group, message.message_id, err)
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify()

    def _ack_loop(self) -> None:
        """Acknowledges consumed messages, batching what accumulated while the last call ran."""
        done = False
        while not done:
            item = self._acks.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < 256:
                try:
                    item = self._acks.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    done = True
                    break
                batch.append(item)
            try:
                errors = self._consumer.ack_many(batch)
            except ClientClosedError:
                return
            for message, error in zip(batch, errors):
                if error is not None:
                    log.warning("push consumer %s: ack of %s failed (it will be redelivered): %s",
                                self.consumer_group, message.message_id, error)
