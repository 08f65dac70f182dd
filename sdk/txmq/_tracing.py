"""Tracing: W3C trace context carried in message properties and OpenTelemetry spans, written
once for both flavours of the SDK (and the proxy), a no-op unless ``opentelemetry-api`` is
installed (``pip install txmq[tracing]``) — and costing one attribute read then.

A message carries the context of the span that sent it in its properties ``traceparent``
and ``tracestate`` (W3C Trace Context; a message that already has a ``traceparent`` keeps
it). The broker stores the properties with the message, so they reach whoever asks about it
or receives it: a check of the half message in another process, and every consumer group
once it commits. So one trace shows the whole life of a transactional message::

    send {topic}            PRODUCER  the half message (its context goes in the properties);
      execute_local_transaction  INTERNAL  the listener (current while it runs)
      end {topic}           CLIENT    the EndTransaction
    check {topic}           CONSUMER  a check answered, in any process (child of send)
    receive {topic}         CLIENT    a receive, linked to each message's send
    process {topic}         CONSUMER  a push consumer's listener (child of send)
    ack {topic}             CLIENT    an acknowledgement, linked to each message's send

Attributes follow OpenTelemetry's messaging semantic conventions (``messaging.system``
"txmq", ``messaging.operation.type``/``name``, ``messaging.destination.name``,
``messaging.destination.partition.id`` (the queue), ``messaging.message.id``,
``messaging.consumer.group.name``, ``messaging.batch.message_count``), with
``txmq.transaction_id``, ``txmq.check.attempt``/``result`` and ``txmq.delivery_attempt``.

Spans never become the current span inside the SDK except where application code runs
(the listener, the checker, a push consumer's listener), so they nest the application's own
spans and work alike on threads and in coroutines. A :class:`SimpleConsumer` user continues
a message's trace with :func:`context_of` (``txmq.tracing.context_of(message)``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, Iterator, Mapping

from ._types import Message

try:  # the optional extra: without it every span below is the no-op one
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Link, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _trace = None  # type: ignore[assignment]

#: Whether OpenTelemetry's API is installed (spans are recorded once an SDK is configured).
ENABLED = _trace is not None
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SYSTEM = "txmq"
_PROPAGATOR = TraceContextTextMapPropagator() if ENABLED else None


class Operation:
    """One traced operation: its span, or nothing (the no-op :data:`NOOP`). Use it as a
    context manager (an exception ends it as an error) or call :meth:`end`."""

    __slots__ = ("span",)

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def __bool__(self) -> bool:
        return self.span is not None

    def context(self) -> Any:
        """An OpenTelemetry context whose current span is this one (None when not traced)."""
        return _trace.set_span_in_context(self.span) if self.span is not None else None

    def inject(self, message: Message) -> Message:
        """``message`` carrying this span's context in ``traceparent``/``tracestate`` (unless it
        has a ``traceparent`` already)."""
        if self.span is None or TRACEPARENT in message.properties or not self.span.get_span_context().is_valid:
            return message
        properties = dict(message.properties)
        _PROPAGATOR.inject(properties, context=self.context())  # type: ignore[union-attr]
        return Message(message.topic, message.body, tag=message.tag, keys=message.keys, properties=properties,
                       check_immunity_seconds=message.check_immunity_seconds, delivery_time=message.delivery_time,
                       delay_seconds=message.delay_seconds, message_group=message.message_group)

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Sets the attributes given (by their semantic-convention names), but empty ones."""
        if self.span is not None:
            for key, value in attributes.items():
                if value is not None and value != "":
                    self.span.set_attribute(key, value)

    def fail(self, error: BaseException) -> None:
        if self.span is not None:
            self.span.record_exception(error)
            self.span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
            self.span.set_attribute("error.type", type(error).__name__)

    def end(self) -> None:
        if self.span is not None:
            self.span.end()

    @contextlib.contextmanager
    def current(self) -> Iterator["Operation"]:
        """This span as the current one while application code runs (not ended after)."""
        if self.span is None:
            yield self
            return
        with _trace.use_span(self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield self

    def __enter__(self) -> "Operation":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.fail(exc)
        self.end()


NOOP = Operation()
#: The SDK's tracer: a proxy until the application installs a tracer provider, then its tracer.
_TRACER = _trace.get_tracer("txmq") if ENABLED else None


def _start(name: str, kind: Any, parent: Any, attributes: Mapping[str, Any],
           links: Iterable[Any] = (), start_time: int | None = None) -> Operation:
    span = _TRACER.start_span(name, context=parent, kind=kind, attributes=dict(attributes),  # type: ignore[union-attr]
                              links=list(links), start_time=start_time)
    if not span.is_recording() and not span.get_span_context().is_valid:
        return NOOP  # no tracer provider, and no trace to continue: nothing to record or carry
    return Operation(span)


def _idle(parent: Any = None) -> bool:
    """No tracer provider installed and no trace to continue (in ``parent``, else the current
    context): nothing to record or carry, so nothing is built."""
    if not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        return False
    return not _trace.get_current_span(parent).get_span_context().is_valid


def context_of(message: Any) -> Any:
    """The OpenTelemetry context a message was sent in (from its ``traceparent``), to start a
    span of its processing in: ``tracer.start_as_current_span("work", context=context_of(m))``.
    None without OpenTelemetry or a ``traceparent``."""
    properties = getattr(message, "properties", None) or {}
    if not ENABLED or TRACEPARENT not in properties:
        return None
    return _PROPAGATOR.extract(dict(properties))  # type: ignore[union-attr]


def _link_to(message: Any) -> Any:
    context = context_of(message)
    if context is None:
        return None
    span_context = _trace.get_current_span(context).get_span_context()
    return Link(span_context) if span_context.is_valid else None


def _base(operation: str, kind_name: str, destination: str) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.operation.name": operation,
            "messaging.operation.type": kind_name, "messaging.destination.name": destination}


# --- the producer's side ------------------------------------------------------------------

def send(message: Message, *, transactional: bool, client_id: str = "") -> Operation:
    """The send of ``message`` (for a transaction: the half message, the local transaction
    and the EndTransaction are its children). Inject its context with :meth:`Operation.inject`."""
    if not ENABLED or _idle():
        return NOOP
    attributes = _base("send", "send", message.topic)
    attributes["messaging.message.body.size"] = len(message.body)
    attributes["messaging.rocketmq.message.type"] = ("transaction" if transactional else "fifo" if message.message_group
                                                     else "delay" if message.delay_seconds or message.delivery_time
                                                     else "normal")
    if message.tag:
        attributes["messaging.rocketmq.message.tag"] = message.tag
    if message.message_group:
        attributes["messaging.rocketmq.message.group"] = message.message_group
    if client_id:
        attributes["messaging.client.id"] = client_id
    return _start(f"send {message.topic}", SpanKind.PRODUCER, None, attributes)


def sent(operation: Operation, *, message_id: str, queue_id: int, broker_name: str, transaction_id: str = "") -> None:
    """What the broker answered the send."""
    if operation:
        operation.set({"messaging.message.id": message_id, "messaging.destination.partition.id": str(queue_id),
                       "txmq.broker_name": broker_name, "txmq.transaction_id": transaction_id})


def local_transaction(parent: Operation, half: Any) -> Operation:
    """``execute_local_transaction`` of ``half``: make it current while the listener runs."""
    if not parent:
        return NOOP
    return _start("execute_local_transaction", SpanKind.INTERNAL, parent.context(),
                  {"messaging.system": SYSTEM, "txmq.transaction_id": half.transaction_id,
                   "messaging.message.id": half.message_id})


def end(parent: Operation | None, half: Any, decision: Any) -> Operation:
    """The EndTransaction of ``half`` (a child of its send when ``parent``, else of the
    context the half message carries)."""
    if not ENABLED:
        return NOOP
    context = parent.context() if parent else context_of(half)
    if _idle(context):
        return NOOP
    attributes = _base("end_transaction", "settle", half.topic)
    attributes.update({"txmq.transaction_id": half.transaction_id, "messaging.message.id": half.message_id,
                       "txmq.decision": getattr(decision, "name", str(decision))})
    return _start(f"end {half.topic}", SpanKind.CLIENT, context, attributes)


def ended(operation: Operation, state: Any, error: BaseException | None) -> None:
    if operation:
        operation.set({"txmq.state": getattr(state, "name", None)})
        if error is not None:
            operation.fail(error)


def check(message: Any, producer_group: str) -> Operation:
    """A check of ``message`` (a CheckMessage) answered here: a child of the half message's
    send, wherever it was sent from. Make it current while the checker runs."""
    if not ENABLED:
        return NOOP
    parent = context_of(message)
    if _idle(parent):
        return NOOP
    attributes = _base("check", "process", message.topic)
    attributes.update({"txmq.transaction_id": message.transaction_id, "messaging.message.id": message.message_id,
                       "messaging.consumer.group.name": producer_group,
                       "txmq.check.attempt": getattr(message, "attempt", 1)})
    return _start(f"check {message.topic}", SpanKind.CONSUMER, parent, attributes)


def checked(operation: Operation, outcome: Any) -> None:
    if operation:
        result = getattr(outcome, "name", None) or ("IN_PROGRESS" if outcome is not None else "UNKNOWN")
        operation.set({"txmq.check.result": result})


# --- the consumer's side ------------------------------------------------------------------

def _topic_of(messages: list[Any]) -> str:
    topics = {m.topic for m in messages}
    return topics.pop() if len(topics) == 1 else ""


def received(consumer_group: str, messages: list[Any], started_ns: int) -> None:
    """A receive that brought ``messages`` (begun at ``started_ns``, ``time.time_ns()``):
    one span linked to each message's send."""
    if not ENABLED or not messages or _idle():
        return
    topic = _topic_of(messages)
    attributes = _base("receive", "receive", topic)
    attributes.update({"messaging.consumer.group.name": consumer_group,
                       "messaging.batch.message_count": len(messages)})
    links = [link for link in map(_link_to, messages) if link is not None]
    _start(f"receive {topic}".rstrip(), SpanKind.CLIENT, None, attributes, links, started_ns).end()


def process(consumer_group: str, message: Any) -> Operation:
    """A push consumer's listener on ``message``: a child of its send. Make it current while
    the listener runs."""
    if not ENABLED:
        return NOOP
    parent = context_of(message)
    if _idle(parent):
        return NOOP
    attributes = _base("process", "process", message.topic)
    attributes.update({"messaging.consumer.group.name": consumer_group, "messaging.message.id": message.message_id,
                       "messaging.destination.partition.id": str(message.queue_id),
                       "txmq.delivery_attempt": message.delivery_attempt})
    return _start(f"process {message.topic}", SpanKind.CONSUMER, parent, attributes)


def acked(consumer_group: str, messages: list[Any], errors: list[Any], started_ns: int) -> None:
    """An AckMessages of ``messages`` (their errors, None where acknowledged): one span linked
    to each message's send."""
    if not ENABLED or not messages or _idle():
        return
    topic = _topic_of(messages)
    attributes = _base("ack", "settle", topic)
    attributes.update({"messaging.consumer.group.name": consumer_group,
                       "messaging.batch.message_count": len(messages)})
    links = [link for link in map(_link_to, messages) if link is not None]
    operation = _start(f"ack {topic}".rstrip(), SpanKind.CLIENT, None, attributes, links, started_ns)
    failed = [e for e in errors if e is not None]
    if failed:
        operation.fail(failed[0])
        operation.set({"txmq.ack.failed_count": len(failed)})
    operation.end()


def now_ns() -> int:
    """Where a receive or an ack begins (only read when tracing)."""
    return time.time_ns() if ENABLED else 0
