"""The producers' send and retry logic without I/O, shared by the sync SDK (``_producer``) and
the asyncio SDK (``aio/_producer``), so both route, retry, back off and give up alike.

A send is a generator of *steps* (``Pick``, ``Request``, ``Sleep``, ``Rebind``): the producer
performs each (blocking, or awaiting) and sends its result back into the generator, or
throws the TxmqError it raised; the generator's return value is the send's outcome. The
generator touches only the producer's synchronous state (its fault table, cached routes,
the attempts it gave up on)::

    steps = send_new(producer, topic, build)
    result = None / error = None
    loop: step = steps.send(result) or steps.throw(error)   (StopIteration: the outcome)
          result = perform(step)                             (or error = the TxmqError)
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator, Protocol, Sequence, TypeVar

from ._calling import QueueRoute, positive
from ._errors import (ClientClosedError, InvalidFieldError, MessageTooLargeError, NoLeaderError, QueueNotFoundError,
                      TopicNotFoundError, TransactionStateError, TxmqError, WrongBrokerError)
from ._faults import Abandoned, FaultTable, OverloadBackoff, RetryAction, retry_action
from ._fifo import group_queue_index, group_route
from ._ids import MessageId
from ._names import in_namespace, validate_group, validate_send_topic
from ._types import (RESOLUTION_TO_PB, LocalTransactionState, Message, TransactionMessage, TransactionState,
                     message_to_pb, namespaced, state_from_name, state_from_pb)
from .v1 import broker_pb2, common_pb2

log = logging.getLogger(__name__)

#: Refusals meaning the cached route is out of date: the next send asks a name server again.
STALE_ROUTE = (QueueNotFoundError, TopicNotFoundError, WrongBrokerError)


@dataclass(frozen=True, slots=True)
class Pick:
    """Perform: the producer's next queue of ``topic`` outside ``exclude`` (a QueueRoute);
    with a ``message_group``, that group's queue (``pick_queue``). ``moving``: a send that
    failed on the shards in ``exclude`` asks where to go: a queue of a usable shard, or
    None when there is none (``pick_other``)."""
    topic: str
    exclude: frozenset[str]
    message_group: str = ""
    moving: bool = False


@dataclass(frozen=True, slots=True)
class Request:
    """Perform: ``entry`` on the Produce path of ``address``, recorded against ``shard`` (a
    ProduceResult; a send's latency is recorded when ``send``)."""
    shard: str
    address: str
    entry: broker_pb2.ProduceEntry
    send: bool


@dataclass(frozen=True, slots=True)
class Sleep:
    """Perform: wait ``seconds``."""
    seconds: float


@dataclass(frozen=True, slots=True)
class Rebind:
    """Perform: the current address of ``route``'s broker (its route of ``topic`` asked again;
    ``address`` when that fails, except NoLeaderError, raised: the shard is between leaders)."""
    topic: str
    route: QueueRoute
    address: str


Step = Pick | Request | Sleep | Rebind
Steps = Generator[Step, Any, Any]
S = TypeVar("S")
R = TypeVar("R")


class _Client(Protocol):
    faults: FaultTable

    def invalidate_route(self, topic: str) -> None: ...

    def check_open(self) -> None: ...


class Sender(Protocol):
    """What the steps read and record on a producer (sync or asyncio)."""
    _abandoned: Abandoned[str]
    _group_routes: dict[str, Sequence[QueueRoute]]
    _next_queue: Iterator[int]
    producer_group: str
    namespace: str
    max_attempts: int
    send_timeout_seconds: float
    retry_backoff_seconds: float
    max_body_bytes: int

    @property
    def _client(self) -> _Client: ...


class SenderOptions:
    """The options and state :func:`configure` sets on a producer (sync or asyncio): the
    producers derive from this for their declarations only."""
    _abandoned: Abandoned[str]
    _group_routes: dict[str, Sequence[QueueRoute]]
    _next_queue: Iterator[int]
    producer_group: str
    namespace: str
    max_attempts: int
    send_timeout_seconds: float
    retry_backoff_seconds: float
    max_body_bytes: int


def configure(sender: SenderOptions, *, producer_group: str, send_timeout_seconds: float, max_attempts: int,
              retry_backoff_seconds: float, max_body_bytes: int, namespace: str = "") -> None:
    """Checks a producer's sending options (sync or asyncio alike) and sets them on it,
    with its round-robin turn, the attempts it gave up on and the queues its FIFO topics'
    groups are placed over. A namespace qualifies the group and every topic sent to
    (txmq.names.qualify)."""
    producer_group = in_namespace(namespace, "producer_group", producer_group)
    sender.namespace = namespace
    if producer_group:
        validate_group("producer_group", producer_group)
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidFieldError("max_attempts", f"must be an integer >= 1, got {max_attempts!r}")
    if not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise InvalidFieldError("max_body_bytes", f"must be a positive integer, got {max_body_bytes!r}")
    sender.producer_group = producer_group
    sender.send_timeout_seconds = positive("send_timeout_seconds", send_timeout_seconds)
    sender.retry_backoff_seconds = positive("retry_backoff_seconds", retry_backoff_seconds)
    sender.max_attempts = max_attempts
    sender.max_body_bytes = max_body_bytes
    sender._next_queue = itertools.count(int.from_bytes(os.urandom(2), "big"))
    sender._abandoned = Abandoned()
    sender._group_routes = {}  # FIFO topic -> the queues its groups are placed over (txmq.fifo.group_route)


def backoff_seconds(sender: Sender, attempt: int) -> float:
    """The pause before attempt ``attempt + 1``: exponential, at most 2 s."""
    pause: float = min(sender.retry_backoff_seconds * 2 ** (attempt - 1), 2.0)
    return pause


def leader_deadline(sender: Sender) -> float:
    """Until when (``time.monotonic()``) a send waits for a route of its topic while the name
    servers answer NoLeaderError or none answers: ``send_timeout_seconds`` from its start."""
    return time.monotonic() + sender.send_timeout_seconds


def awaiting_leader(sender: Sender, step: Pick | Rebind, deadline: float) -> Steps:
    """Performs ``step`` (a route lookup); while the topic's shards are between leaders
    (NoLeaderError, a fail-over under way) or no name server answers and the topic has no
    route to fall back on (a name server restarting: its clients' channels reconnect within
    about a second), asks again after a short backoff, until ``deadline``, then raises the
    last error (retryable). Spends no attempt: nothing was sent."""
    waits = 1
    while True:
        try:
            return (yield step)
        except TxmqError as err:
            if not err.retryable:
                raise
            pause = min(backoff_seconds(sender, waits), deadline - time.monotonic())
            if pause <= 0:
                raise
            log.debug("%s: asking its route again in %.2f s: %s", step.topic, pause, err)
            yield Sleep(pause)
            waits += 1


def validate(sender: Sender, message: Message) -> Message:
    """What the broker would refuse anyway, refused before a round trip, with the same
    error; returns the message as it is sent (its topic in the producer's namespace)."""
    if not isinstance(message, Message):
        raise InvalidFieldError("message", f"must be a txmq.Message, got {type(message).__name__}")
    sender._client.check_open()
    message = namespaced(message, sender.namespace)
    validate_send_topic(message.topic)
    if len(message.body) > sender.max_body_bytes:
        raise MessageTooLargeError(len(message.body), sender.max_body_bytes)
    return message


def choose_queue(faults: FaultTable, routes: Sequence[QueueRoute], turn: int,
                 exclude: frozenset[str] | set[str]) -> QueueRoute:
    """The queue of ``routes`` for round-robin turn ``turn`` whose shard the fault table
    does not avoid (and not in ``exclude``: the shards this send failed on). Queues of
    draining shards only when the topic has no other."""
    routes = tuple(r for r in routes if not r.draining) or routes
    return faults.choose(routes, _shard_of, turn, exclude)


def pick_other(sender: Sender, routes: Sequence[QueueRoute], exclude: frozenset[str] | set[str]) -> QueueRoute | None:
    """Where a send that failed on the shards in ``exclude`` moves: the producer's next
    queue of a shard the fault table lets take traffic now (queues of draining shards only
    when the topic has no other), or None when no shard is usable — every one is failing,
    and the send stays on its own (same id, backed off, waiting for its leader)."""
    routes = tuple(r for r in routes if not r.draining) or routes
    return sender._client.faults.choose_usable(routes, _shard_of, next(sender._next_queue), exclude)


def pick_queue(sender: Sender, routes: Sequence[QueueRoute], topic: str, exclude: frozenset[str] | set[str],
               message_group: str = "") -> QueueRoute:
    """``choose_queue`` for the producer's next turn; a message group's queue is fixed instead:
    hash(group) mod the queue count of the largest route seen while the current one only
    lacks queues (``txmq.fifo.group_route``), whatever the faults."""
    if message_group:
        routes = sender._group_routes[topic] = group_route(sender._group_routes.get(topic), routes, queue_key)
        return routes[group_queue_index(message_group, len(routes))]
    return choose_queue(sender._client.faults, routes, next(sender._next_queue), exclude)


def queue_key(route: QueueRoute) -> tuple[str, int]:
    """A queue's identity across route refreshes (its shard and number)."""
    return route.broker_name, route.queue_id


def _shard_of(route: QueueRoute) -> str:
    return route.broker_name


def finished(faults: FaultTable, shard: str, error: TxmqError | None, latency: float | None = None) -> None:
    """Records a request's outcome against ``shard``: a transient failure counts against it,
    any answer clears it (a refusal is an answer: the shard is up; a closed client says
    nothing about the shard)."""
    if error is None:
        faults.succeeded(shard, latency)
    elif error.retryable:
        faults.failed(shard)
    elif not isinstance(error, ClientClosedError):
        faults.succeeded(shard, None)


def abandon(sender: Sender, pb: common_pb2.Message) -> None:
    """A half message attempt given up on: its orphan, if stored, is answered ROLLBACK."""
    if pb.type == common_pb2.MESSAGE_TYPE_TRANSACTION:
        sender._abandoned.add(pb.message_id)


def half_builder(message: Message, producer_group: str, client_id: str, host: str,
                 ) -> Callable[[QueueRoute, str], common_pb2.Message]:
    """``build(queue, message_id)`` of ``message`` as a half message of ``producer_group``
    (born now, on ``host``)."""

    def build(route: QueueRoute, message_id: str) -> common_pb2.Message:
        pb = message_to_pb(message, message_id, route.queue_id, common_pb2.MESSAGE_TYPE_TRANSACTION,
                           int(time.time() * 1000), host)
        pb.producer_group = producer_group
        pb.producer_client_id = client_id
        if message.check_immunity_seconds:
            pb.check_immunity_seconds = message.check_immunity_seconds
        return pb

    return build


def outcome_of(returned: object, transaction_id: str) -> LocalTransactionState:
    """What ``execute_local_transaction`` returned, as the decision to send: None or anything
    but a LocalTransactionState is UNKNOWN."""
    if returned is None:
        return LocalTransactionState.UNKNOWN
    if not isinstance(returned, LocalTransactionState):
        log.warning("execute_local_transaction returned %r for transaction %s, not a "
                    "LocalTransactionState: ending it as UNKNOWN", returned, transaction_id)
        return LocalTransactionState.UNKNOWN
    return returned


def send_new(sender: Sender, topic: str, build: Callable[[QueueRoute, str], common_pb2.Message],
             message_group: str = "") -> Generator[Step, Any, tuple[QueueRoute, common_pb2.Message,
                                                                       broker_pb2.SendMessageResponse]]:
    """Sends a new message built by ``build(queue, message_id)`` on a queue the fault table
    picks; a transient failure moves it to another shard with a new id, or, with no other
    shard usable (none outside those it failed on that the fault table does not avoid),
    retries it on the same one with the same id (see ``txmq.Producer``); an
    overloaded broker (nothing applied) is asked again with the same id after its pause.
    A message of a message group always goes to its group's queue and is never moved (that
    would break the group's order): it is retried there with the same id.
    Returns (queue, message it was stored as, SendMessageResponse)."""
    client = sender._client
    deadline = leader_deadline(sender)
    route = yield from awaiting_leader(sender, Pick(topic, frozenset(), message_group), deadline)
    pb = build(route, MessageId.new(route.broker_name, route.queue_id).encode())
    address = route.broker_address
    failed_on: set[str] = set()
    attempt = 1
    overload = OverloadBackoff()
    while True:
        entry = broker_pb2.ProduceEntry(send_message=broker_pb2.SendMessageRequest(message=pb))
        try:
            result = yield Request(route.broker_name, address, entry, True)
            return route, pb, result.send_message
        except TxmqError as err:
            pause = overload.delay(err)
            if pause is not None:  # nothing applied: the same message (same id) again, later
                yield Sleep(pause)
                continue
            action = retry_action(err, bound=False)
            if action is not RetryAction.FAIL or isinstance(err, STALE_ROUTE):
                client.invalidate_route(topic)
            if action is RetryAction.FAIL or attempt >= sender.max_attempts:
                if action is not RetryAction.FAIL:
                    abandon(sender, pb)
                raise
            moved = route  # SAME_SHARD: the shard must keep it (same id): only its address is asked again
            if action is not RetryAction.SAME_SHARD and not message_group:
                failed_on.add(route.broker_name)
                try:
                    # None when no other shard is usable: every one is failing (both leaders
                    # of two shards lost at once), and bouncing between them would spend the
                    # attempts in milliseconds; staying waits for this shard's next leader.
                    moved = (yield Pick(topic, frozenset(failed_on), moving=True)) or route
                except TxmqError as refresh_error:  # no route now: stay where it was
                    log.debug("cannot refresh the route of %s: %s", topic, refresh_error)
            log.debug("send of %s to %s failed (attempt %d of %d), retrying on %s: %s",
                      pb.message_id, route.broker_name, attempt, sender.max_attempts, moved.broker_name, err)
        if moved.broker_name != route.broker_name:
            client.faults.rerouted()
            abandon(sender, pb)
            route, address = moved, moved.broker_address
            pb = build(route, MessageId.new(route.broker_name, route.queue_id).encode())
        else:
            yield Sleep(backoff_seconds(sender, attempt))
            address = yield from rebind(sender, topic, route, address, deadline)
        attempt += 1


def send_bound(sender: Sender, route: QueueRoute, topic: str,
               entry: broker_pb2.ProduceEntry) -> Generator[Step, Any, broker_pb2.SendMessageResponse]:
    """A half message (a part of a multi-message transaction) on the shard ``route`` names,
    retried only there with the same id; an overloaded broker is asked again after its
    pause. Returns the SendMessageResponse."""
    address = route.broker_address
    deadline = leader_deadline(sender)
    attempt = 1
    overload = OverloadBackoff()
    while True:
        try:
            result = yield Request(route.broker_name, address, entry, True)
            response: broker_pb2.SendMessageResponse = result.send_message
            return response
        except TxmqError as err:
            pause = overload.delay(err)
            if pause is not None:  # shed by the broker: nothing applied, the same part again later
                yield Sleep(pause)
                continue
            if retry_action(err, bound=True) is RetryAction.FAIL or attempt >= sender.max_attempts:
                raise
        yield Sleep(backoff_seconds(sender, attempt))
        address = yield from rebind(sender, topic, route, address, deadline)
        attempt += 1


def end_transaction(sender: Sender, route: QueueRoute, topic: str, half: TransactionMessage,
                    decision: LocalTransactionState, producer_group: str
                    ) -> Generator[Step, Any, tuple[TransactionState | None, TxmqError | None]]:
    """EndTransaction of ``half`` with ``decision``, retried on its shard (bound by its id)
    on transient errors. Returns (the broker's state or None, the error or None): never
    raises, a transaction not ended stays PREPARED and the checker resolves it."""
    end = broker_pb2.EndTransactionRequest(
        transaction_id=half.transaction_id, message_id=half.message_id,
        resolution=RESOLUTION_TO_PB[decision], source=common_pb2.TRANSACTION_SOURCE_CLIENT,
        producer_group=producer_group)
    address = route.broker_address
    deadline = leader_deadline(sender)
    attempt = 1
    while True:
        try:
            response = yield Request(half.broker_name, address, broker_pb2.ProduceEntry(end_transaction=end), False)
            state: TransactionState | None = state_from_pb(response.end_transaction.state)
            return state, None
        except TransactionStateError as err:
            state = state_from_name(getattr(err, "state", None))
            log.warning("EndTransaction %s of transaction %s refused, it is already %s: %s",
                        decision.name, half.transaction_id, state.name if state else "decided", err)
            return state, err
        except TxmqError as err:
            # Bound to the shard its transaction id names: retried there, never elsewhere.
            if retry_action(err, bound=True) is RetryAction.FAIL or attempt >= sender.max_attempts:
                log.warning("EndTransaction %s of transaction %s failed after %d attempt(s): %s; "
                            "it stays PREPARED until the checker resolves it",
                            decision.name, half.transaction_id, attempt, err)
                return None, err
            log.debug("EndTransaction of %s failed (attempt %d of %d), retrying: %s",
                      half.transaction_id, attempt, sender.max_attempts, err)
        yield Sleep(backoff_seconds(sender, attempt))
        address = yield from rebind(sender, topic, route, address, deadline)
        attempt += 1


def rebind(sender: Sender, topic: str, route: QueueRoute, address: str, deadline: float) -> Steps:
    """The address to retry ``route``'s shard at: asked again, waiting (until ``deadline``)
    while the shard is between leaders; the last known ``address`` when none came."""
    try:
        return (yield from awaiting_leader(sender, Rebind(topic, route, address), deadline))
    except NoLeaderError:
        return address


def run(steps: Generator[S, Any, R], perform: Callable[[S], Any]) -> R:
    """Drives ``steps`` with a blocking ``perform``; returns their outcome."""
    value: Any = None
    error: TxmqError | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            outcome: R = done.value
            return outcome
        value = error = None
        try:
            value = perform(step)
        except TxmqError as err:
            error = err


async def run_async(steps: Generator[S, Any, R], perform: Callable[[S], Any]) -> R:
    """Drives ``steps`` with a coroutine ``perform``; returns their outcome."""
    value: Any = None
    error: TxmqError | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            outcome: R = done.value
            return outcome
        value = error = None
        try:
            value = await perform(step)
        except TxmqError as err:
            error = err
