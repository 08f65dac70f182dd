"""The simple consumers' receive logic without I/O, shared by ``txmq.SimpleConsumer`` and
``txmq.aio.AsyncSimpleConsumer`` (same passes, long polls and errors), in the manner of
``_sending``: :func:`receive_steps` yields ``Receive`` (one ReceiveMessages) and ``LongPoll``
(the concurrent long polls) steps that the consumer performs, blocking or awaiting, and
:func:`settle` sorts the long polls that ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Protocol, Sequence, TypeVar

from ._errors import InternalError, InvalidFieldError, TxmqError, error_from_entry
from .v1 import broker_pb2

T = TypeVar("T")


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
        return (yield Receive(targets[0], max_messages, wait_seconds))
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
    return (yield LongPoll([t for t in rotated if usable(t)] or rotated))


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


def ack_results(broker_name: str, response: broker_pb2.AckMessagesResponse, count: int) -> list[TxmqError | None]:
    """Per receipt handle None (acknowledged) or its error, from an AckMessages answer."""
    if len(response.entries) != count:
        error = InternalError(f"broker {broker_name} answered {len(response.entries)} entries "
                              f"for {count} receipt handles")
        return [error] * count
    return [error_from_entry(e) if e.code else None for e in response.entries]
