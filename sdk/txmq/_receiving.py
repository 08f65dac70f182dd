"""The simple consumers' receive logic without I/O, shared by ``txmq.SimpleConsumer`` and
``txmq.aio.AsyncSimpleConsumer`` (same passes, long polls and errors), in the manner of
``_sending``: :func:`receive_steps` yields ``Receive`` (one ReceiveMessages) and ``LongPoll``
(the concurrent long polls) steps that the consumer performs, blocking or awaiting, and
:func:`settle` sorts the long polls that ended. :class:`DeferredAcks` holds the acks of
``ack_later`` until a receive of their (broker, topic) carries them, or their deadline.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Protocol, Sequence, TypeVar

from ._errors import InternalError, InvalidFieldError, TxmqError, error_from_entry
from .v1 import broker_pb2

T = TypeVar("T")

log = logging.getLogger(__name__)

#: A deferred ack's outcome: (the message, None when acknowledged or the TxmqError).
AckOutcome = tuple[Any, "TxmqError | None"]


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


def ack_groups(messages: Sequence[Any]) -> dict[tuple[str, str], list[int]]:
    """The indexes of ``messages`` per (broker, topic): one AckMessages each."""
    groups: dict[tuple[str, str], list[int]] = {}
    for index, message in enumerate(messages):
        groups.setdefault((message.broker_name, message.topic), []).append(index)
    return groups


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
        """The acks a receive of (broker, topic) carries now (removed from the queue)."""
        messages = self._queued.pop((broker_name, topic), None)
        if messages is None:
            return []
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
