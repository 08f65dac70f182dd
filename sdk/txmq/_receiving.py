"""The consumers' receive logic without I/O, shared by ``txmq.SimpleConsumer``,
``txmq.PushConsumer`` and their asyncio twins (same subscriptions, passes, long polls,
requests and errors), in the manner of ``_sending``: :func:`target_steps` yields ``Routes``
steps (a subscribed topic's queues) and returns what a receive asks (:class:`Target`: a
topic on one broker); :func:`receive_steps` yields ``Receive`` (one ReceiveMessages) and
``LongPoll`` (the concurrent long polls) steps that the consumer performs, blocking or
awaiting, and :func:`settle` sorts the long polls that ended. :class:`DeferredAcks` holds
the acks of ``ack_later`` until a receive of their (broker, topic) carries them, or their
deadline. A push consumer's listener outcome (:func:`consumed`) and retry delay
(:func:`retry_delay`) are decided here too.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Mapping, Protocol, Sequence, TypeVar

from ._calling import MAX_ENTRIES_PER_REQUEST
from ._errors import (InternalError, InvalidFieldError, NoLeaderError, TopicNotFoundError, TxmqError,
                      error_from_entry)
from ._names import in_namespace, validate_receive_topic
from ._types import ConsumeResult, ReceivedMessage, SqlFilter, ms_to_datetime
from .v1 import broker_pb2

T = TypeVar("T")

log = logging.getLogger(__name__)

#: A deferred ack's outcome: (the message, None when acknowledged or the TxmqError).
AckOutcome = tuple[Any, "TxmqError | None"]


@dataclass(frozen=True, slots=True)
class Target:
    """What one receive call asks: a subscribed topic on one broker (any of its queues)."""

    topic: str
    filter_expression: str | SqlFilter
    broker_name: str


@dataclass(frozen=True, slots=True)
class Routes:
    """Perform: the queues of ``topic`` for receiving (a tuple of QueueRoute; a subscription
    never creates a topic)."""
    topic: str


def subscriptions_of(subscriptions: Mapping[str, str | SqlFilter], namespace: str = "") -> dict[str, str | SqlFilter]:
    """The subscriptions as they are sent: each topic in ``namespace``, each filter checked."""
    if not isinstance(subscriptions, Mapping) or not subscriptions:
        raise InvalidFieldError("subscriptions", "must map at least one topic to a filter expression")
    out: dict[str, str | SqlFilter] = {}
    for topic, expression in subscriptions.items():
        topic = in_namespace(namespace, "subscriptions", topic)
        validate_receive_topic(topic)
        if expression is None:
            expression = "*"
        if isinstance(expression, SqlFilter):
            out[topic] = expression
            continue
        if not isinstance(expression, str):
            raise InvalidFieldError("subscriptions", f"filter expression of {topic!r} must be a str or SqlFilter")
        out[topic] = expression.strip() or "*"
    return out


def target_steps(subscriptions: Mapping[str, str | SqlFilter], *, lenient: bool = False,
                 ) -> Generator[Routes, Any, list[Target]]:
    """(topic, broker) pairs of every subscription. Topics without a route are skipped while
    others have one; with none at all TopicNotFoundError is raised (unless ``lenient``), or
    NoLeaderError (retryable) when a topic is only between leaders."""
    targets: list[Target] = []
    missing: TopicNotFoundError | NoLeaderError | None = None
    for topic, expression in subscriptions.items():
        try:
            routes = yield Routes(topic)
        except (TopicNotFoundError, NoLeaderError) as err:  # between leaders: retryable, raised first
            log.debug("subscribed topic %s has no route yet", topic)
            missing = missing if isinstance(missing, NoLeaderError) else err
            continue
        for broker in dict.fromkeys(r.broker_name for r in routes):
            targets.append(Target(topic, expression, broker))
    if not targets and missing is not None and not lenient:
        raise missing
    return targets


def receive_request(consumer_group: str, target: Target, max_messages: int, invisible_duration_seconds: float,
                    wait_seconds: float, acks: Sequence[Any] = (),
                    client_id: str = "") -> broker_pb2.ReceiveMessagesRequest:
    """The ReceiveMessages of one (topic, broker) target, its filter a tag expression or SQL92,
    carrying the deferred acks ``acks`` (of that target); ``client_id`` names the consumer
    instance to the broker (``txmq group clients``, an offset reset's live consumers)."""
    expression = target.filter_expression
    sql = isinstance(expression, SqlFilter)
    return broker_pb2.ReceiveMessagesRequest(
        consumer_group=consumer_group, topic=target.topic, queue_id=-1,
        filter_expression=expression.expression if isinstance(expression, SqlFilter) else expression,
        filter_type=broker_pb2.FILTER_TYPE_SQL92 if sql else broker_pb2.FILTER_TYPE_TAG,
        max_messages=max_messages, invisible_duration_seconds=invisible_duration_seconds,
        long_polling_timeout_seconds=wait_seconds, ack_receipt_handles=[m.receipt_handle for m in acks],
        client_id=client_id)


def invisibility_request(consumer_group: str, message: ReceivedMessage,
                         seconds: float) -> broker_pb2.ChangeInvisibleDurationRequest:
    return broker_pb2.ChangeInvisibleDurationRequest(
        consumer_group=consumer_group, topic=message.topic, receipt_handle=message.receipt_handle,
        invisible_duration_seconds=seconds)


def with_invisibility(message: ReceivedMessage, response: broker_pb2.ChangeInvisibleDurationResponse,
                      ) -> ReceivedMessage:
    """``message`` with the receipt handle (and invisibility) a ChangeInvisibleDuration gave."""
    return dataclasses.replace(message, receipt_handle=response.receipt_handle,
                               invisible_until=ms_to_datetime(response.invisible_until_ms))


@dataclass(frozen=True, slots=True)
class Receive:
    """Perform: one ReceiveMessages of ``target`` for up to ``max_messages``, waiting up to
    ``wait_seconds`` for messages (a list of ReceivedMessage, or the TxmqError raised)."""
    target: Any
    max_messages: int
    wait_seconds: float


@dataclass(frozen=True, slots=True)
class LongPoll:
    """Perform: long-poll ``targets`` at once (those not polled already), return what the
    first to answer brought (see :func:`settle`)."""
    targets: list[Any]


def check_receive(max_messages: object) -> None:
    if not isinstance(max_messages, int) or max_messages < 1:
        raise InvalidFieldError("max_messages", f"must be an integer >= 1, got {max_messages!r}")


def receive_steps(targets: Sequence[T], turn: int, max_messages: int, wait_seconds: float,
                  polled: Callable[[T], bool], usable: Callable[[T], bool], alone: bool,
                  ) -> Generator[Receive | LongPoll, Any, list[Any]]:
    """One ``receive``: with a single target and ``alone`` (no other receive long-polls it
    now), its long poll alone; else a pass over every target not ``polled`` already and
    ``usable`` (the fault table), starting at ``turn``, that returns at once, and when it
    finds nothing, the long polls. A pass that failed on every target raises the last error;
    an error that is not transient is raised at once."""
    if alone and len(targets) == 1:
        received: list[Any] = yield Receive(targets[0], max_messages, wait_seconds)
        return received
    start = turn % len(targets)
    rotated = [*targets[start:], *targets[:start]]
    out: list[Any] = []
    errors: list[TxmqError] = []
    for target in rotated:
        if polled(target) or not usable(target):
            continue
        try:
            out.extend((yield Receive(target, max_messages - len(out), 0.0)))
        except TxmqError as err:
            if not err.retryable:
                raise
            errors.append(err)
            continue
        if len(out) >= max_messages:
            return out
    if out:
        return out
    if errors and len(errors) == len(rotated):
        raise errors[-1]
    polled_out: list[Any] = yield LongPoll([t for t in rotated if usable(t)] or rotated)
    return polled_out


class _Outcome(Protocol):
    """A long poll that ended: a concurrent.futures.Future or an asyncio.Task."""

    def cancelled(self) -> bool: ...

    def exception(self) -> BaseException | None: ...

    def result(self) -> list[Any]: ...


def settle(ended: Sequence[_Outcome], max_messages: int) -> tuple[list[Any], list[Any]]:
    """What the long polls that ended brought: (up to ``max_messages`` to return, the rest to
    keep for the next receive). Raises the last failure when none answered."""
    out: list[Any] = []
    errors: list[TxmqError] = []
    answered = False
    for poll in ended:
        if poll.cancelled():
            continue
        error = poll.exception()
        if error is None:
            answered = True
            out.extend(poll.result())
        elif isinstance(error, TxmqError):
            errors.append(error)
        else:
            errors.append(InternalError(f"receive failed: {error!r}"))
    if not out and errors and not answered:
        raise errors[-1]
    return out[:max_messages], out[max_messages:]


def received(faults: Any, target: Any, error: TxmqError | None) -> None:
    """Records a receive's outcome against its broker: a transient failure counts against
    it, an answer clears it."""
    if error is None:
        faults.succeeded(target.broker_name)
    elif error.retryable:
        faults.failed(target.broker_name)


def ack_groups(messages: Sequence[Any]) -> list[tuple[str, str, list[int]]]:
    """The indexes of ``messages`` per (broker, topic), in runs of at most
    ``MAX_ENTRIES_PER_REQUEST`` (the most receipt handles a broker takes in one request): one
    AckMessages each."""
    groups: dict[tuple[str, str], list[int]] = {}
    for index, message in enumerate(messages):
        groups.setdefault((message.broker_name, message.topic), []).append(index)
    return [(broker_name, topic, indexes[start:start + MAX_ENTRIES_PER_REQUEST])
            for (broker_name, topic), indexes in groups.items()
            for start in range(0, len(indexes), MAX_ENTRIES_PER_REQUEST)]


def ack_request(consumer_group: str, topic: str, messages: Sequence[Any]) -> broker_pb2.AckMessagesRequest:
    return broker_pb2.AckMessagesRequest(consumer_group=consumer_group, topic=topic,
                                         receipt_handles=[m.receipt_handle for m in messages])


def ack_results(broker_name: str, entries: Sequence[Any], count: int) -> list[TxmqError | None]:
    """Per receipt handle None (acknowledged) or its error, from the entries of an
    AckMessages answer (or the ack_entries of a ReceiveMessages that carried acks)."""
    if len(entries) != count:
        error = InternalError(f"broker {broker_name} answered {len(entries)} entries "
                              f"for {count} receipt handles")
        return [error] * count
    return [error_from_entry(e) if e.code else None for e in entries]


class DeferredAcks:
    """The acks ``ack_later`` queued, per (broker, topic), until a receive of that target
    carries them (:meth:`take`) or a flush sends them all (:meth:`take_all`). Each is due
    by ``min(max_delay_seconds, half its message's remaining invisibility)`` after it was
    queued (:meth:`next_due`, ``time.monotonic``), so it reaches the broker well before the
    message would be redelivered. Not thread-safe: the consumer holds its lock."""

    def __init__(self, max_delay_seconds: float) -> None:
        self.max_delay_seconds = max_delay_seconds
        self._queued: dict[tuple[str, str], list[Any]] = {}
        self._due: float | None = None

    def __len__(self) -> int:
        return sum(len(messages) for messages in self._queued.values())

    def add(self, message: Any) -> float:
        """Queues ``message``'s ack; returns when it is due (monotonic seconds)."""
        remaining: float = message.invisible_until.timestamp() - time.time()
        due = time.monotonic() + max(0.0, min(self.max_delay_seconds, remaining / 2))
        self._queued.setdefault((message.broker_name, message.topic), []).append(message)
        if self._due is None or due < self._due:
            self._due = due
        return due

    def take(self, broker_name: str, topic: str) -> list[Any]:
        """The acks a receive of (broker, topic) carries now (removed from the queue): the
        oldest ``MAX_ENTRIES_PER_REQUEST``, the most a receive may carry; the rest wait for
        the next receive or their due time."""
        messages = self._queued.pop((broker_name, topic), None)
        if messages is None:
            return []
        if len(messages) > MAX_ENTRIES_PER_REQUEST:
            messages, self._queued[(broker_name, topic)] = (messages[:MAX_ENTRIES_PER_REQUEST],
                                                            messages[MAX_ENTRIES_PER_REQUEST:])
        if not self._queued:
            self._due = None
        return messages

    def take_all(self) -> list[Any]:
        """Every queued ack, for a flush (removed from the queue)."""
        messages = [m for queued in self._queued.values() for m in queued]
        self._queued.clear()
        self._due = None
        return messages

    def next_due(self) -> float | None:
        """When the earliest queued ack is due (monotonic seconds; it may have passed), or
        None when nothing is queued. Conservative: an ack carried meanwhile does not move it."""
        return self._due


def deferred_acks(max_ack_delay_seconds: object, on_ack_error: object) -> DeferredAcks:
    """A consumer's deferred-ack queue, its options checked."""
    seconds = max_ack_delay_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 60:
        raise InvalidFieldError("max_ack_delay_seconds", f"must be a number in (0, 60], got {seconds!r}")
    if on_ack_error is not None and not callable(on_ack_error):
        raise InvalidFieldError("on_ack_error", "must be callable: (ReceivedMessage, TxmqError) -> None")
    return DeferredAcks(float(seconds))


def report_deferred(consumer_group: str, messages: Sequence[Any], errors: Sequence[TxmqError | None],
                    on_ack_error: Callable[[Any, TxmqError], None] | None) -> list[AckOutcome]:
    """The outcomes of deferred acks that reached a broker (or whose call failed): each
    failure is logged and given to ``on_ack_error`` (whose own exceptions are logged)."""
    outcomes = list(zip(messages, errors))
    for message, error in outcomes:
        if error is None:
            continue
        log.warning("consumer %s: deferred ack of %s failed (it is redelivered unless it was acknowledged "
                    "before): %s", consumer_group, message.message_id, error)
        if on_ack_error is not None:
            try:
                on_ack_error(message, error)
            except Exception:  # the application's callback must not stop the others
                log.exception("consumer %s: on_ack_error raised", consumer_group)
    return outcomes


# --- push consumers ---------------------------------------------------------------------

def consumed(consumer_group: str, message: ReceivedMessage, result: object,
             error: BaseException | None = None) -> ConsumeResult:
    """A push consumer's listener outcome: SUCCESS acknowledges; FAILURE, None, anything else
    (logged) or an exception (``error``, logged with its traceback) retries."""
    if error is not None:
        log.error("push consumer %s: listener raised for message %s (attempt %d)", consumer_group,
                  message.message_id, message.delivery_attempt, exc_info=error)
        return ConsumeResult.FAILURE
    if result is ConsumeResult.SUCCESS:
        return ConsumeResult.SUCCESS
    if result is not ConsumeResult.FAILURE and result is not None:
        log.warning("push consumer %s: listener returned %r, not a ConsumeResult: retrying", consumer_group, result)
    return ConsumeResult.FAILURE


def retry_delay(message: ReceivedMessage, retry_backoff_seconds: float, max_retry_backoff_seconds: float) -> float:
    """How long a failed consumption's message stays invisible before its redelivery."""
    return min(retry_backoff_seconds * 2.0 ** max(message.delivery_attempt - 1, 0), max_retry_backoff_seconds)


class GroupQueues:
    """A push consumer's FIFO rule: the messages of one message group run one after another
    (a redelivery never overlaps a consumption of its group still running); those that
    arrive meanwhile wait here, their invisibility renewed (:meth:`due`). Thread-safe."""

    def __init__(self) -> None:
        self._waiting: dict[str, collections.deque[ReceivedMessage]] = {}
        self._lock = threading.Lock()

    def admit(self, message: ReceivedMessage) -> bool:
        """True: consume ``message`` now (then call :meth:`next`); False: it waits behind
        its group's running message."""
        group = message.message_group
        if not group:
            return True
        with self._lock:
            waiting = self._waiting.get(group)
            if waiting is not None:
                waiting.append(message)
                return False
            self._waiting[group] = collections.deque()
            return True

    def next(self, group: str) -> ReceivedMessage | None:
        """The group's running message ended: its next one to consume, or None (idle)."""
        with self._lock:
            waiting = self._waiting[group]
            if not waiting:
                del self._waiting[group]
                return None
            return waiting.popleft()

    def due(self, before: float) -> list[tuple[str, ReceivedMessage]]:
        """The waiting messages whose invisibility ends before ``before`` (epoch seconds)."""
        with self._lock:
            return [(group, m) for group, waiting in self._waiting.items() for m in waiting
                    if m.invisible_until.timestamp() < before]

    def renewed(self, group: str, message: ReceivedMessage, renewed: ReceivedMessage | None) -> bool:
        """``message`` (waiting) got a new invisibility (``renewed``), or its handle was gone
        (None: dropped, it was redelivered or settled meanwhile). True when it was dropped
        here (one message fewer in flight)."""
        with self._lock:
            waiting = self._waiting.get(group)
            at = next((i for i, m in enumerate(waiting or ()) if m is message), None)
            if waiting is None or at is None:
                return False  # it started meanwhile (with a handle still valid: the same delivery)
            if renewed is None:
                del waiting[at]
                return True
            waiting[at] = renewed
            return False
